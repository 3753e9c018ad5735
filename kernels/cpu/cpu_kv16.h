/*
 * The CPU backend's KV elements: F32, or 16 bits (F16, BF16) to halve the
 * bytes attention reads and the pool holds.  Each element is rounded once,
 * when it is stored (to nearest, ties to even, as src/fp16.h narrows), and
 * widened exactly to F32 whenever attention reads it, so a 16-bit pool's
 * arithmetic is the F32 pool's over the rounded keys and values: the dot
 * products, the softmax and the weighted sums are F32 in the same order,
 * and a result depends on the batch no more than with F32 (not at all).
 *
 * The kind is a constant in each inlined copy of the attention loops
 * (cpu_attention.c), so its branches fold away.  Loads: AVX-512 (16
 * elements), AVX2 with F16C (8; without F16C an F16 load widens one at a
 * time), and one at a time (the scalar path).  Every path widens to the
 * same floats; the narrowing on store is one function for all passes.
 */
#ifndef NALAR_CPU_KV16_H
#define NALAR_CPU_KV16_H

#include <stdint.h>

#include "fp16.h"
#include "kv.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

/* the element kinds, as the attention loops are specialised for them */
enum {
    KV_F32,
    KV_F16,
    KV_BF16
};


/* the kind of a pool's elements (its ggml_type; 2-byte elements with no
 * type set are BF16, as nalar_kv_type_name reads them) */
static inline int
cpu_kv_kind(const nalar_kv_pool *p)
{
    if (p->type == GGML_F16) {
        return KV_F16;
    }
    return p->type == GGML_BF16 || p->elem_bytes == 2 ? KV_BF16 : KV_F32;
}


/* element i of a pool's K or V storage, widened to F32 */
static ALWAYS_INLINE float
kv_get(const void *base, int64_t i, int kind)
{
    if (kind == KV_F16) {
        return nalar_f16_to_f32(((const uint16_t *) base)[i]);
    }
    if (kind == KV_BF16) {
        return nalar_bf16_to_f32(((const uint16_t *) base)[i]);
    }
    return ((const float *) base)[i];
}


#if defined(__AVX512F__)
/* elements i .. i + 15, widened */
static ALWAYS_INLINE __m512
kv_load16(const void *base, int64_t i, int kind)
{
    if (kind == KV_F16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(
            (const __m256i *) ((const uint16_t *) base + i)));
    }
    if (kind == KV_BF16) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                (const __m256i *) ((const uint16_t *) base + i))), 16));
    }
    return _mm512_loadu_ps((const float *) base + i);
}
#endif


#if defined(__AVX2__)
/* elements i .. i + 7, widened */
static ALWAYS_INLINE __m256
kv_load8(const void *base, int64_t i, int kind)
{
    if (kind == KV_F16) {
#if defined(__F16C__)
        return _mm256_cvtph_ps(_mm_loadu_si128(
            (const __m128i *) ((const uint16_t *) base + i)));
#else
        float f[8];

        for (int k = 0; k < 8; k++) {
            f[k] = kv_get(base, i + k, KV_F16);
        }
        return _mm256_loadu_ps(f);
#endif
    }
    if (kind == KV_BF16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(
                (const __m128i *) ((const uint16_t *) base + i))), 16));
    }
    return _mm256_loadu_ps((const float *) base + i);
}
#endif


/*
 * x[0 .. n) rounded to 16-bit elements of `kind` (KV_F16 or KV_BF16) in
 * dst: the vector conversions round to nearest even as nalar_f32_to_f16
 * and nalar_f32_to_bf16 do, to the same bits for every number (a NaN
 * stays a NaN, its payload aside; t/c/test_cpu_backend.c checks them
 * against each other), so a stored element is the same whichever pass or
 * thread stores it.
 */
static inline void
kv16_narrow(uint16_t *dst, const float *x, int n, int kind)
{
    int i = 0;

#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m512  v = _mm512_loadu_ps(x + i);
        __m256i h;

        if (kind == KV_F16) {
            h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT
                                   | _MM_FROUND_NO_EXC);
        } else {
            /* bf16 = (x + 0x7fff + bit 16 of x) >> 16; a NaN's top half
             * with the quiet bit set */
            __m512i   b = _mm512_castps_si512(v);
            __m512i   hi = _mm512_srli_epi32(b, 16);
            __m512i   r = _mm512_srli_epi32(_mm512_add_epi32(
                              b, _mm512_add_epi32(
                                     _mm512_set1_epi32(0x7fff),
                                     _mm512_and_si512(
                                         hi, _mm512_set1_epi32(1)))), 16);
            __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);

            r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
            h = _mm512_cvtepi32_epi16(r);
        }
        _mm256_storeu_si256((__m256i *) (dst + i), h);
    }
#elif defined(__AVX2__) && defined(__F16C__)
    if (kind == KV_F16) {
        for (; i + 8 <= n; i += 8) {
            _mm_storeu_si128((__m128i *) (dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                             _MM_FROUND_TO_NEAREST_INT
                                             | _MM_FROUND_NO_EXC));
        }
    }
#endif
    for (; i < n; i++) {
        dst[i] = kind == KV_F16 ? nalar_f32_to_f16(x[i])
                                : nalar_f32_to_bf16(x[i]);
    }
}

#endif
