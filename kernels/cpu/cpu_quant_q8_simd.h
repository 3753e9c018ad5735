/*
 * What the 8-bit activation kernels (cpu_quant_q8.c's row kernels,
 * cpu_quant_q8_rows.c's four-row decode, cpu_quant_q8_tiles.c's tiles)
 * share: their instruction-set attributes, the contract's hsum8, the walk
 * from block to block of a row (plain or interleaved), the prefetch of a
 * block, the signed codes of a Q8_0/Q4_0 block and a Q4_K/Q5_K block's
 * scales.  One definition each, so the three keep the same arithmetic
 * (cpu_quant_q8.c's exactness contract).  Internal to the CPU kernels.
 */
#ifndef NALAR_CPU_QUANT_Q8_SIMD_H
#define NALAR_CPU_QUANT_Q8_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"

#define Q8_INL inline __attribute__((always_inline))


/* the block after block b at p (qk weights, bytes each): the next in the
 * row, or, interleaved (il), the next group's turn after each QK_K
 * weights */
static inline const uint8_t *
q8_next_block(const uint8_t *p, int il, int64_t qk, int64_t bytes, int64_t b)
{
    int64_t per = QK_K / qk;

    p += bytes;
    if (il && (b + 1) % per == 0) {
        p += (QIL - 1) * per * bytes;
    }
    return p;
}


/* a Q4_K/Q5_K block's 6-bit scales (sc[0..7]) and mins (sc[8..15]) as
 * bytes: k4_scale_min's values (cpu_quant_blocks.h), four at a time */
static Q8_INL void
q8_k4_scales(const uint8_t *p, uint8_t *sc)
{
    uint32_t w0, w1, w2, v[4];

    memcpy(&w0, p + 4, 4);
    memcpy(&w1, p + 8, 4);
    memcpy(&w2, p + 12, 4);
    v[0] = w0 & 0x3f3f3f3f;
    v[1] = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
    v[2] = w1 & 0x3f3f3f3f;
    v[3] = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
    memcpy(sc, v, 16);
}


#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define Q8_T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define Q8_T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl," \
                                        "avx512bw,avx512vnni")))


/* the contract's hsum8: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) */
static Q8_INL Q8_T_AVX2 float
q8_hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);

    lo = _mm_add_ps(lo, hi);                   /* v0+v4 v1+v5 v2+v6 v3+v7 */
    hi = _mm_movehl_ps(lo, lo);
    lo = _mm_add_ps(lo, hi);
    hi = _mm_shuffle_ps(lo, lo, 1);
    return _mm_cvtss_f32(_mm_add_ss(lo, hi));
}


/* the block at p + pf fetched ahead, a cache line at a time (pf 0: none) */
static Q8_INL Q8_T_AVX2 void
q8_prefetch_block(const uint8_t *p, ptrdiff_t pf, int64_t bytes)
{
    if (pf != 0) {
        for (int64_t k = 0; k < bytes; k += 64) {
            _mm_prefetch((const char *) p + pf + k, _MM_HINT_T0);
        }
    }
}


/* the 32 signed codes of a Q8_0 block, or of a Q4_0 block (n - 8) */
static Q8_INL Q8_T_AVX2 __m256i
q8_w32_signed(ggml_type t, const uint8_t *p)
{
    __m128i v, f;

    if (t == GGML_Q8_0) {
        return _mm256_loadu_si256((const __m256i *) (p + 2));
    }
    v = _mm_loadu_si128((const __m128i *) (p + 2));
    f = _mm_set1_epi8(0xF);
    return _mm256_sub_epi8(_mm256_set_m128i(
                               _mm_and_si128(_mm_srli_epi16(v, 4), f),
                               _mm_and_si128(v, f)),
                           _mm256_set1_epi8(8));
}


/* pshufb indices: the int16 word at byte i, in each word */
static inline short
q8_b2(int i)
{
    return (short) ((i + 1) << 8 | i);
}


/* the 32 unsigned 6-bit codes of group g (0 .. 3) of a Q6_K half block:
 * the low nibbles of a0 (g 0), a1 (g 1), or their high nibbles (g 2, 3),
 * and bits 2g, 2g + 1 of each byte of e on top */
static Q8_INL Q8_T_AVX2 __m256i
q8_k6_w(__m256i a0, __m256i a1, __m256i e, int g)
{
    __m256i a = g & 1 ? a1 : a0, hi;

    a = g & 2 ? _mm256_srli_epi16(a, 4) : a;
    hi = g == 0 ? _mm256_slli_epi16(e, 4)
         : g == 1 ? _mm256_slli_epi16(e, 2)
         : g == 2 ? e : _mm256_srli_epi16(e, 2);
    return _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi8(0xF)),
                           _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

#endif

#endif
