/*
 * Half-precision conversions: IEEE binary16 (F16) and bfloat16 (BF16).
 *
 * Both narrowings round to nearest, ties to even, as ggml and PyTorch do, so
 * a model converted here matches one converted there bit for bit.  The bit
 * patterns are moved through memcpy (never pointer casts) to stay within
 * C11 aliasing rules; compilers turn them into plain register moves.
 */
#ifndef NALAR_FP16_H
#define NALAR_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t
nalar_f32_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}


static inline float
nalar_bits_f32(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}


/* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline float
nalar_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;

    if (exp == 0x1f) {                      /* inf / nan keep the payload */
        return nalar_bits_f32(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24, exact in f32 */
        float v = (float) man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return nalar_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}


static inline uint16_t
nalar_f32_to_f16(float f)
{
    uint32_t x = nalar_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    uint32_t exp, man, r;

    if (absx >= 0x7f800000u) {              /* inf, or nan kept quiet */
        return (uint16_t) (sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    }
    if (absx >= 0x477ff000u) {              /* rounds to >= 65520: inf */
        return (uint16_t) (sign | 0x7c00);
    }
    if (absx < 0x38800000u) {
        /*
         * Below the smallest normal half (2^-14): the result is a subnormal
         * man * 2^-24.  Shift the full 24-bit significand right and round
         * to nearest even on the bits shifted out.
         */
        uint32_t shift;

        if (absx < 0x33000000u) {           /* < 2^-25: rounds to zero */
            return (uint16_t) sign;
        }
        exp = absx >> 23;
        man = (absx & 0x7fffff) | 0x800000;
        shift = 126 - exp;                  /* 14 .. 24 */
        r = man >> shift;
        {
            uint32_t rem = man & ((1u << shift) - 1);
            uint32_t half = 1u << (shift - 1);
            if (rem > half || (rem == half && (r & 1))) {
                r++;
            }
        }
        return (uint16_t) (sign | r);
    }
    /* normal: rebias the exponent, round 13 dropped mantissa bits (RNE);
     * a carry out of the mantissa correctly bumps the exponent */
    r = absx - ((127u - 15u) << 23);
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t) (sign | (r >> 13));
}


/* bfloat16 is the top half of an f32. */
static inline float
nalar_bf16_to_f32(uint16_t b)
{
    return nalar_bits_f32((uint32_t) b << 16);
}


static inline uint16_t
nalar_f32_to_bf16(float f)
{
    uint32_t x = nalar_f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u) {  /* nan: keep it a quiet nan */
        return (uint16_t) ((x >> 16) | 0x40);
    }
    x += 0x7fff + ((x >> 16) & 1);          /* round to nearest even */
    return (uint16_t) (x >> 16);
}

#endif
