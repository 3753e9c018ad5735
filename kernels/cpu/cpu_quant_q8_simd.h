/*
 * What the 8-bit activation kernels (cpu_quant_q8.c's row kernels,
 * cpu_quant_rows.c's four-row decode, cpu_quant_q8_tiles.c's tiles)
 * share: their instruction-set attributes, the contract's hsum8, the walk
 * from block to block of a row (plain or interleaved), the prefetch of a
 * block, the signed codes of a Q8_0/Q4_0 block and a Q4_K/Q5_K block's
 * scales; and the scalar reference's pieces (a block's codes, lanes and
 * integer min terms, hsum8, x's sums of 16 codes), which the 16-bit
 * activations' reference (cpu_quant_x16.c) takes per plane.  One
 * definition each, so the three keep the same arithmetic (cpu_quant_q8.c's
 * exactness contract).  Internal to the CPU kernels.
 */
#ifndef NALAR_CPU_QUANT_Q8_SIMD_H
#define NALAR_CPU_QUANT_Q8_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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


/* the contract's hsum8 of 8 floats */
static inline float
q8_hsum8_s(const float *v)
{
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}


/* Q4_K/Q5_K integer min term of a block: sum_j m_j * (x's 32 codes) */
static inline int32_t
q8_k4_min_term(const uint8_t *p, const int32_t *bs)
{
    int32_t I = 0;

    for (int j = 0; j < 8; j++) {
        int sc, m;

        k4_scale_min(p + 4, j, &sc, &m);
        I += m * (bs[2 * j] + bs[2 * j + 1]);
    }
    return I;
}


/* Q6_K integer min term: 32 * sum_j sc_j * (x's 16 codes) */
static inline int32_t
q8_k6_min_term(const uint8_t *p, const int32_t *bs)
{
    int32_t I = 0;

    for (int j = 0; j < 16; j++) {
        I += (int8_t) p[192 + j] * bs[j];
    }
    return 32 * I;
}


/* the block's codes as the lanes read them: signed for Q8_0/Q4_0,
 * unsigned for the K-quants (decode_q_scalar's, with Q6_K's -32 taken
 * back: the min term q8_k6_min_term subtracts it); and the per-32-group
 * scale of each lane (sc[G * 8 + m]; 1 for Q8_0/Q4_0) */
static inline void
q8_scalar_codes(ggml_type t, const uint8_t *p, int *w, int *sc)
{
    qblock B;
    qinfo  qi = { 0, 0, 0, 0 };
    int    off = t == GGML_Q6_K ? 32 : 0;

    (void) qinfo_of(t, &qi);
    decode_q_scalar(t, p, &B);
    for (int i = 0; i < qi.qk; i++) {
        w[i] = B.q[i] + off;
    }
    switch (t) {
    case GGML_Q8_0:
    case GGML_Q4_0:
        for (int m = 0; m < 8; m++) {
            sc[m] = 1;
        }
        return;
    case GGML_Q4_K:
    case GGML_Q5_K:
        for (int G = 0; G < 8; G++) {
            int s, mn;

            k4_scale_min(p + 4, G, &s, &mn);
            for (int m = 0; m < 8; m++) {
                sc[G * 8 + m] = s;
            }
        }
        return;
    default:    /* GGML_Q6_K */
        for (int G = 0; G < 8; G++) {
            for (int m = 0; m < 8; m++) {
                sc[G * 8 + m] = (int8_t) p[192 + (32 * G + 4 * m) / 16];
            }
        }
        return;
    }
}


/* a block's eight int32 lanes L[m] (the contract's, cpu_quant_q8.c) from
 * its codes w and lane scales sc (q8_scalar_codes) and x's qk codes xq */
static inline void
q8_scalar_lanes(int qk, const int *w, const int *sc, const int8_t *xq,
                int32_t *L)
{
    for (int m = 0; m < 8; m++) {
        L[m] = 0;
    }
    for (int G = 0; G < qk / 32; G++) {
        for (int m = 0; m < 8; m++) {
            int32_t v = 0;

            for (int k = 0; k < 4; k++) {
                v += w[32 * G + 4 * m + k] * xq[32 * G + 4 * m + k];
            }
            L[m] += sc[G * 8 + m] * v;
        }
    }
}


/* the sums of each 16 of n codes */
static inline void
q8_sums16(const int8_t *c, int64_t n, int32_t *s)
{
    int64_t j = 0;

#if defined(__AVX2__)
    for (; 16 * j + 32 <= n; j += 2) {
        __m256i v = _mm256_loadu_si256((const __m256i *) (c + 16 * j));

        v = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v),
                              _mm256_set1_epi16(1));
        v = _mm256_hadd_epi32(v, v);
        v = _mm256_hadd_epi32(v, v);
        s[j] = _mm256_cvtsi256_si32(v);
        s[j + 1] = _mm_cvtsi128_si32(_mm256_extracti128_si256(v, 1));
    }
#endif
    for (; j < n / 16; j++) {
        int32_t sum = 0;

        for (int i = 0; i < 16; i++) {
            sum += c[16 * j + i];
        }
        s[j] = sum;
    }
}



#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define Q8_T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define Q8_T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl," \
                                        "avx512bw,avx512vnni")))


/* AVX-VNNI's vpdpbusd (acc + the sums of four u8 x s8 products, u
 * unsigned, s signed) and vpdpwssd (acc + the sums of two s16 x s16
 * products), VEX-encoded on 256 bits, for the AVX2 kernels' AVX-VNNI
 * forms: written in assembly so that the AVX2 code around them keeps its
 * target (and its 16 vector registers), and run only where
 * nalar_quant_isa_ok(NALAR_ISA_AVXVNNI).  Both sums are exact, as the
 * vpmaddubsw/vpmaddwd steps they replace are in these kernels (no pair
 * reaches 2^15), so the integers and the bits are the AVX2 form's. */
static Q8_INL Q8_T_AVX2 __m256i
q8_vex_dpbusd(__m256i acc, __m256i u, __m256i s)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}

static Q8_INL Q8_T_AVX2 __m256i
q8_vex_dpwssd(__m256i acc, __m256i a, __m256i b)
{
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    return acc;
}


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
