/*
 * AVX-512 helpers shared by the CPU kernels.
 */
#ifndef NALAR_CPU_SIMD_H
#define NALAR_CPU_SIMD_H

#if defined(__AVX512F__)
#include <immintrin.h>

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

/*
 * Horizontal sums of 16 vectors, returned in one vector (lane k = sum of
 * v[k]).  The additions per source are exactly those of GCC's
 * _mm512_reduce_add_ps: upper 256 + lower 256, then upper 128 + lower 128,
 * then (h0 + h2) + (h1 + h3) -- so tiles reduced here and elements reduced
 * one at a time give bit-identical results (IEEE addition commutes).
 */
static ALWAYS_INLINE __m512
reduce16(const __m512 *v)
{
    __m512 r[8], s[4], x, y, z;
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
                                            2, 6, 10, 14, 3, 7, 11, 15);

    /* r[i]: 256-bit half 0 = source 2i folded to 8, half 1 = source 2i+1 */
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1],
                                                  0xEE),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1],
                                                  0x44));
    }
    /* s[j]: 128-bit lane m = source 4j + m folded to 4 */
    for (int j = 0; j < 4; j++) {
        s[j] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * j], r[2 * j + 1],
                                                  0xDD),
                             _mm512_shuffle_f32x4(r[2 * j], r[2 * j + 1],
                                                  0x88));
    }
    /* within each 128-bit lane: (h0 + h2), (h1 + h3), then their sum */
    x = _mm512_add_ps(_mm512_unpacklo_ps(s[0], s[1]),
                      _mm512_unpackhi_ps(s[0], s[1]));
    y = _mm512_add_ps(_mm512_unpacklo_ps(s[2], s[3]),
                      _mm512_unpackhi_ps(s[2], s[3]));
    z = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x),
                                            _mm512_castps_pd(y))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x),
                                            _mm512_castps_pd(y))));
    /* z lane 4m + q holds source 4q + m: put source k in lane k */
    return _mm512_permutexvar_ps(order, z);
}


#endif

#endif
