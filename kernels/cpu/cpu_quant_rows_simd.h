/*
 * What the one-token row kernels of the 8-bit and 16-bit activations
 * (cpu_quant_rows.c, one family over x's planes) share: the prefetch of a
 * step of four rows, a Q4_K/Q5_K block's scales and mins as bytes, x's
 * sums of codes as int16, and the per-block float steps of the
 * contracts (acc = fma(s, (float) L, acc) per row, four rows' mn as one
 * vector's lanes), so that both keep the same float operations.
 * Internal to the CPU kernels.
 */
#ifndef NALAR_CPU_QUANT_ROWS_SIMD_H
#define NALAR_CPU_QUANT_ROWS_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* bytes ahead of the block being read that a step asks for, in an
 * interleaved matrix (one stream; 0: none): rows_pf_ahead().  A
 * row-ordered matrix asks for the rows 16 on instead.  Asked for into
 * L2 (prefetcht1), not L1: with two threads on the Zen 4 VM, 8 KB ahead
 * into L2 brought the products nearer a read loop's rate than any
 * distance into L1 (whose best was 4 KB: L1 holds 32 KB), for Q8_0,
 * Q6_K and Q4_K, Q4_0 the same (bench/README, what bounds decode). */
#define ROWS_PF_AHEAD 8192


/* the sums of a, b, c, d's four int32 lanes, in that order (exact) */
static Q8_INL Q8_T_AVX2 __m128i
rows_hsum4x4(__m128i a, __m128i b, __m128i c, __m128i d)
{
    return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}


/* the n bytes at p, asked for into L2 (a hint: no output depends on it) */
static Q8_INL Q8_T_AVX2 void
rows_pf_bytes(const uint8_t *p, int64_t n)
{
    for (int64_t k = 0; k < n; k += 64) {
        _mm_prefetch((const char *) p + k, _MM_HINT_T1);
    }
}


/* step b's prefetch (block b at offset off of each row): four rows of an
 * interleaved matrix read one stream, 4 * bytes a step on average, and
 * ask for as many bytes pfo ahead of it; otherwise each row's block pfo
 * bytes on (pfo 0: nothing) */
static Q8_INL Q8_T_AVX2 void
rows_pf_step(const int R, const uint8_t *const *row, int il, int64_t qk,
             int64_t bytes, int64_t b, int64_t off, ptrdiff_t pfo)
{
    if (pfo == 0) {
        return;
    }
    if (il && R == 4) {
        int64_t k = b % (QK_K / qk);   /* the step within its turn */

        rows_pf_bytes(row[0] + off + 3 * k * bytes + pfo, 4 * bytes);
    } else {
        for (int i = 0; i < R; i++) {
            rows_pf_bytes(row[i] + off + pfo, bytes);
        }
    }
}


/* a Q4_K/Q5_K block's first 16 bytes (d, dmin, the 12 scale bytes) to
 * the 6-bit scales sc[0..7] and mins m[0..7] as 16 bytes (k4_scale_min's
 * values) */
static Q8_INL Q8_T_AVX2 __m128i
rows_k4_sm(__m128i h)
{
    __m128i a = _mm_shuffle_epi32(h, _MM_SHUFFLE(3, 2, 3, 1));
    __m128i b = _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 2, 1, 1));

    /* a: the scale words w0 w2 w1 w2, b: w0 w0 w1 w1 */
    a = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                     0x0f0f0f0f));
    b = _mm_and_si128(_mm_srli_epi32(b, 2),
                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(a, b);
}


/* x's sums of 32 codes of the block's sub-blocks, as 8 int16 (|.| <=
 * 32 * 128), from its 16 sums of 16 */
static Q8_INL Q8_T_AVX2 __m128i
rows_k4_xsums(const int32_t *bs)
{
    __m256i a = _mm256_loadu_si256((const __m256i *) bs);
    __m256i b = _mm256_loadu_si256((const __m256i *) (bs + 8));
    __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);

    return _mm_packs_epi32(_mm256_castsi256_si128(s),
                           _mm256_extracti128_si256(s, 1));
}


/* x's 16 sums of 16 codes as int16 (|.| <= 16 * 128), in order */
static Q8_INL Q8_T_AVX2 __m256i
rows_k6_xsums(const int32_t *bs)
{
    __m256i a = _mm256_loadu_si256((const __m256i *) bs);
    __m256i b = _mm256_loadu_si256((const __m256i *) (bs + 8));

    return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
}


/* The per-block float steps of R rows: acc[i] = fma(s_i, (float) L[i],
 * acc[i]) and mn = fma(sm, (float) I, mn) lane by lane */
static Q8_INL Q8_T_AVX2 void
rows_float(const int R, const float *s, const __m256i *L, __m128 sm,
           __m128i I, __m256 *acc, __m128 *mn)
{
    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i]),
                                 _mm256_cvtepi32_ps(L[i]), acc[i]);
    }
    *mn = _mm_fmadd_ps(sm, _mm_cvtepi32_ps(I), *mn);
}


static Q8_INL Q8_T_AVX2 void
rows_out(const int R, const __m256 *acc, __m128 mn, float *out)
{
    float m[4];

    _mm_storeu_ps(m, mn);
    for (int i = 0; i < R; i++) {
        out[i] = q8_hsum8(acc[i]) - m[i];
    }
}


/* ROWS_PF_AHEAD, or the environment's NALAR_CPU_PREFETCH (bytes, 0 .. 1
 * MiB: for measuring other distances), read once */
static inline ptrdiff_t
rows_pf_ahead(void)
{
    static int pf = -1;     /* -1: not read yet (a race only writes the
                               same value twice) */
    int        v = __atomic_load_n(&pf, __ATOMIC_RELAXED);

    if (v < 0) {
        const char *e = getenv("NALAR_CPU_PREFETCH");
        long        n = e != NULL ? strtol(e, NULL, 10) : ROWS_PF_AHEAD;

        v = n < 0 || n > (1 << 20) ? ROWS_PF_AHEAD : (int) n;
        __atomic_store_n(&pf, v, __ATOMIC_RELAXED);
    }
    return v;
}


#endif

#endif
