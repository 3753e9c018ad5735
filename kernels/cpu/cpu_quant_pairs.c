/*
 * Pair multipliers (an activation mode, cpu_quant.h's nalar_xqp): x's
 * codes, and the products that read them.
 *
 * Per group of 256 values of x (what one K-quant weight block reads), one
 * float step D, and per pair of values (x[2p], x[2p + 1]) an integer n_p
 * in [1, 64] and two int8 codes c in [-127, 127], x ~ D * n_p * c.  The
 * products read x' = n * c (|x'| <= 8128) as the 16-bit mode's codes
 * with D as their scale, so every 16-bit kernel (cpu_quant_x16.c's
 * contract) computes them: the same bits as the 16-bit kernels give for
 * codes x' (Q6_K: the pairs' own contract, cpu_quant_pairs_k6.c, where x'
 * keeps its lanes in int32).  One token's Q4_K, Q5_K and Q6_K rows read c
 * and n themselves (cpu_quant_rows.c): fewer multiplies than x''s planes.
 *
 * Per 32 (Q8_0 and Q4_0) the mode takes the 16-bit mode's own codes
 * (nalar_quant_x16_groups): their kernels multiply x's two planes either
 * way, so pair codes there would buy nothing but error (and cost several
 * times the 16-bit codes' time to make).
 *
 * The rule, in float32 operations only (no double, no fma; the scalar
 * reference and the AVX2 path perform exactly these, the AVX-512 path
 * the same but for two steps whose results are provably the same, said
 * where it takes them; so every path gives the same bytes):
 *   amax = max |x| over the group: m = 0, then m = |x_i| > m ? |x_i| : m
 *     (a NaN never enters; the order is free, max being exact);
 *   D  = amax / 8128.0f                           (a division; 8128 =
 *                                                  127 * 64)
 *   iD = amax > 0 ? 8128.0f / amax : 0            (a division)
 *   per value: u = x * iD                         (x in units of D)
 *   per pair:  a = |u0| > 0 ? |u0| : 0;  a = |u1| > a ? |u1| : a
 *              f = ceilf(a / 127.0f)              (a division)
 *              f = f > 1 ? f : 1;  f = f < 64 ? f : 64     (n0, in float)
 *   candidates k = n0, n0 + 1, .. n0 + 7, those <= 64, in that order:
 *              r = R[k], the table R[k] = 1.0f / (float) k (a reciprocal:
 *                  one correctly rounded division each, made by the
 *                  compiler; every path reads the same table)
 *              q = rintf(u * r)                   (to nearest even)
 *              q = q > -127 ? q : -127;  q = q < 127 ? q : 127
 *                                                 (a NaN's code: -127)
 *              e = u - k * q                      (k * q exact)
 *              err = e0 * e0 + e1 * e1            (two products, a sum)
 *     the first candidate is taken; a later one replaces it when its
 *     err < the taken one's (so ties go to the smallest n, and a NaN's
 *     pair keeps n0);
 *   x' = n * c, an exact integer.
 * An all-zero group: D = 0, u = 0, n = 1, codes 0.  NaN and Inf behave as
 * the 16-bit codes' maker's (cpu_quant_x16.c): a NaN never enters amax,
 * its code is the clamp's lowest (-127, so x' = -127 n); an Inf makes
 * amax and D infinite and iD 0 (the group's products are then Inf or
 * NaN, as the 16-bit mode's).  A group whose amax is under 8128 /
 * FLT_MAX (about 2.4e-35) has an infinite iD, as the 16-bit codes' maker
 * has under 32639 / FLT_MAX: its u are infinities and NaNs (codes +-127,
 * a zero's -127), weighed by D < 3e-39, so its products stay as tiny as
 * its values.
 *
 * x16's planes are laid out exactly as nalar_quant_x16 lays them out:
 * per 256 hi = (x' + 128) >> 8 (arithmetic), lo = x' - 256 * hi (qk,
 * bs: each plane's sums of 16 codes, dk); ck and nk hold the 256-groups'
 * c and n; per 32 (q, d) nalar_quant_x16's bytes.
 * nalar_quant_xpairs_groups makes one grouping alone (the backend makes
 * those its matrices read).
 *
 * Paths: the scalar reference, AVX2 (8 pairs at a time) and AVX-512
 * (16 pairs at a time), chosen by nalar_quant_q8_isa (AVX-512 where it
 * says VNNI).  Cost: 8 trial roundings per pair, several times the
 * 16-bit codes' (bench/xcodes.c measures both).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_pairs_k6.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"

#define XP_K     64           /* the largest multiplier */
#define XP_NCAND 8            /* candidates per pair */
#define XP_STEPS 8128.0f      /* 127 * XP_K: amax in units of D */

#define R1(k)  (1.0f / (float) (k))
#define R8(k)  R1(k), R1(k + 1), R1(k + 2), R1(k + 3), R1(k + 4),     \
               R1(k + 5), R1(k + 6), R1(k + 7)

/* R[k - 1] = 1 / k for k = 1 .. 72 (past 64: lanes a SIMD path masks
 * out, so that its look-up never leaves the table) */
static const float xp_recip[72] __attribute__((aligned(64))) = {
    R8(1), R8(9), R8(17), R8(25), R8(33), R8(41), R8(49), R8(57), R8(65)
};


/* a value x' = n * c into the planes: hi = (x' + 128) >> 8, lo = x' -
 * 256 hi */
static inline void
xp_split(int32_t v, int8_t *hi, int8_t *lo)
{
    int32_t h = (v + 128) >> 8;

    *hi = (int8_t) h;
    *lo = (int8_t) (v - 256 * h);
}


/* one group's amax, as the rule says */
static float
xp_amax(const float *x, int g)
{
    float m = 0;

    for (int i = 0; i < g; i++) {
        float a = fabsf(x[i]);

        m = a > m ? a : m;
    }
    return m;
}


/* ------------------------------------------------------------------ */
/* one group: its amax (returned), and per pair n (g / 2), c (g) and     */
/* x' = n c's planes hi and lo (g); three paths                         */


static float
xp_pairs_scalar(const float *x, int g, int8_t *c, int16_t *n, int8_t *hi,
                int8_t *lo)
{
    float amax = xp_amax(x, g), iD = amax > 0 ? XP_STEPS / amax : 0;

    for (int p = 0; p < g / 2; p++) {
        float u0 = x[2 * p] * iD, u1 = x[2 * p + 1] * iD;
        float a = fabsf(u0) > 0 ? fabsf(u0) : 0;
        float f, best = 0, bq0 = 0, bq1 = 0, bk = 1;

        a = fabsf(u1) > a ? fabsf(u1) : a;
        f = ceilf(a / 127.0f);
        f = f > 1 ? f : 1;
        f = f < (float) XP_K ? f : (float) XP_K;
        for (int j = 0; j < XP_NCAND && f + (float) j <= (float) XP_K; j++) {
            float k = f + (float) j, r = xp_recip[(int) k - 1];
            float q0 = rintf(u0 * r), q1 = rintf(u1 * r), e0, e1, err;

            q0 = q0 > -127.0f ? q0 : -127.0f;
            q0 = q0 < 127.0f ? q0 : 127.0f;
            q1 = q1 > -127.0f ? q1 : -127.0f;
            q1 = q1 < 127.0f ? q1 : 127.0f;
            e0 = u0 - k * q0;
            e1 = u1 - k * q1;
            err = e0 * e0 + e1 * e1;
            if (j == 0 || err < best) {
                best = err;
                bq0 = q0;
                bq1 = q1;
                bk = k;
            }
        }
        c[2 * p] = (int8_t) bq0;
        c[2 * p + 1] = (int8_t) bq1;
        n[p] = (int16_t) bk;
        xp_split((int32_t) bk * (int32_t) bq0, hi + 2 * p, lo + 2 * p);
        xp_split((int32_t) bk * (int32_t) bq1, hi + 2 * p + 1, lo + 2 * p + 1);
    }
    return amax;
}


#if defined(__x86_64__) && defined(__GNUC__)

/* AVX2: 8 pairs at a time, the lanes' pairs deinterleaved (even values
 * in one vector, odd in the other), the same operations per lane */
static Q8_T_AVX2 float
xp_pairs_avx2(const float *x, int g, int8_t *c, int16_t *n, int8_t *hi8,
              int8_t *lo8)
{
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 one = _mm256_set1_ps(1.0f), kmax = _mm256_set1_ps(64.0f);
    __m256       vi, m8 = _mm256_setzero_ps();
    __m128       h4;
    float        amax;

    for (int i = 0; i < g; i += 8) {
        /* a > m ? a : m: a NaN never enters */
        m8 = _mm256_max_ps(_mm256_andnot_ps(sgn, _mm256_loadu_ps(x + i)), m8);
    }
    h4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
    h4 = _mm_max_ss(h4, _mm_shuffle_ps(h4, h4, 1));
    amax = _mm_cvtss_f32(h4);
    vi = _mm256_set1_ps(amax > 0 ? XP_STEPS / amax : 0);

    for (int i = 0; i < g; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        /* [a0 a2 b0 b2 a4 a6 b4 b6] -> [a0 a2 a4 a6 b0 b2 b4 b6] */
        __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(
                        _mm256_shuffle_ps(a, b, 0x88)), 0xd8));
        __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(
                        _mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
        __m256 u0 = _mm256_mul_ps(ev, vi), u1 = _mm256_mul_ps(od, vi);
        __m256 m, f, best, bq0, bq1, bk;
        int32_t q0[8], q1[8], kk[8];

        m = _mm256_max_ps(_mm256_andnot_ps(sgn, u0), _mm256_setzero_ps());
        m = _mm256_max_ps(_mm256_andnot_ps(sgn, u1), m);
        f = _mm256_round_ps(_mm256_div_ps(m, hi),
                            _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
        f = _mm256_min_ps(_mm256_max_ps(f, one), kmax);
        best = bq0 = bq1 = _mm256_setzero_ps();
        bk = f;
        for (int j = 0; j < XP_NCAND; j++) {
            __m256  k = _mm256_add_ps(f, _mm256_set1_ps((float) j));
            __m256i ix = _mm256_sub_epi32(_mm256_cvtps_epi32(k),
                                          _mm256_set1_epi32(1));
            __m256  r = _mm256_i32gather_ps(xp_recip, ix, 4);
            __m256  p0 = _mm256_round_ps(_mm256_mul_ps(u0, r),
                                         _MM_FROUND_TO_NEAREST_INT
                                         | _MM_FROUND_NO_EXC);
            __m256  p1 = _mm256_round_ps(_mm256_mul_ps(u1, r),
                                         _MM_FROUND_TO_NEAREST_INT
                                         | _MM_FROUND_NO_EXC);
            __m256  e0, e1, err, take;

            p0 = _mm256_min_ps(_mm256_max_ps(p0, lo), hi);
            p1 = _mm256_min_ps(_mm256_max_ps(p1, lo), hi);
            e0 = _mm256_sub_ps(u0, _mm256_mul_ps(k, p0));
            e1 = _mm256_sub_ps(u1, _mm256_mul_ps(k, p1));
            err = _mm256_add_ps(_mm256_mul_ps(e0, e0), _mm256_mul_ps(e1, e1));
            if (j == 0) {
                best = err;
                bq0 = p0;
                bq1 = p1;
                continue;
            }
            take = _mm256_and_ps(_mm256_cmp_ps(err, best, _CMP_LT_OQ),
                                 _mm256_cmp_ps(k, kmax, _CMP_LE_OQ));
            best = _mm256_blendv_ps(best, err, take);
            bq0 = _mm256_blendv_ps(bq0, p0, take);
            bq1 = _mm256_blendv_ps(bq1, p1, take);
            bk = _mm256_blendv_ps(bk, k, take);
        }
        _mm256_storeu_si256((__m256i *) q0, _mm256_cvtps_epi32(bq0));
        _mm256_storeu_si256((__m256i *) q1, _mm256_cvtps_epi32(bq1));
        _mm256_storeu_si256((__m256i *) kk, _mm256_cvtps_epi32(bk));
        for (int l = 0; l < 8; l++) {
            c[i + 2 * l] = (int8_t) q0[l];
            c[i + 2 * l + 1] = (int8_t) q1[l];
            n[i / 2 + l] = (int16_t) kk[l];
            xp_split(kk[l] * q0[l], hi8 + i + 2 * l, lo8 + i + 2 * l);
            xp_split(kk[l] * q1[l], hi8 + i + 2 * l + 1, lo8 + i + 2 * l + 1);
        }
    }
    return amax;
}


/* AVX-512: 16 pairs at a time, as AVX2's lanes; 1 / k from the table
 * in four registers */
static Q8_T_VNNI float
xp_pairs_avx512(const float *x, int g, int8_t *c, int16_t *n, int8_t *hi8,
                int8_t *lo8)
{
    const __m512  lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512  one = _mm512_set1_ps(1.0f), kmax = _mm512_set1_ps(64.0f);
    const __m512  t0 = _mm512_load_ps(xp_recip), t1 = _mm512_load_ps(
                                                      xp_recip + 16);
    const __m512  t2 = _mm512_load_ps(xp_recip + 32), t3 = _mm512_load_ps(
                                                           xp_recip + 48);
    const __m512i iev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18,
                                          20, 22, 24, 26, 28, 30);
    const __m512i iod = _mm512_add_epi32(iev, _mm512_set1_epi32(1));
    const __m512i il0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20,
                                          5, 21, 6, 22, 7, 23);
    const __m512i il1 = _mm512_add_epi32(il0, _mm512_set1_epi32(8));
    __m512        vi, m16 = _mm512_setzero_ps();
    float         amax;

    for (int i = 0; i < g; i += 16) {
        /* a > m ? a : m: a NaN never enters, so the reduction's order is
         * free */
        m16 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m16);
    }
    amax = _mm512_reduce_max_ps(m16);
    vi = _mm512_set1_ps(amax > 0 ? XP_STEPS / amax : 0);
    for (int i = 0; i < g; i += 32) {
        __m512    a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        __m512    u0 = _mm512_mul_ps(_mm512_permutex2var_ps(a, iev, b), vi);
        __m512    u1 = _mm512_mul_ps(_mm512_permutex2var_ps(a, iod, b), vi);
        __m512    m, f, best, bq0, bq1, bk;
        __m512i   c0, c1, v[2], ix0;

        m = _mm512_max_ps(_mm512_abs_ps(u0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_abs_ps(u1), m);
        f = _mm512_roundscale_ps(_mm512_div_ps(m, hi),
                                 _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
        f = _mm512_min_ps(_mm512_max_ps(f, one), kmax);
        best = bq0 = bq1 = _mm512_setzero_ps();
        bk = f;
        ix0 = _mm512_sub_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(1));
        for (int j = 0; j < XP_NCAND; j++) {
            __m512    k = _mm512_add_ps(f, _mm512_set1_ps((float) j));
            __m512i   ix = _mm512_add_epi32(ix0, _mm512_set1_epi32(j));
            __mmask16 up = _mm512_test_epi32_mask(ix, _mm512_set1_epi32(32));
            __m512    r = _mm512_mask_blend_ps(
                              up, _mm512_permutex2var_ps(t0, ix, t1),
                              _mm512_permutex2var_ps(t2, ix, t3));
            __m512    p0 = _mm512_roundscale_ps(_mm512_mul_ps(u0, r),
                                                _MM_FROUND_TO_NEAREST_INT
                                                | _MM_FROUND_NO_EXC);
            __m512    p1 = _mm512_roundscale_ps(_mm512_mul_ps(u1, r),
                                                _MM_FROUND_TO_NEAREST_INT
                                                | _MM_FROUND_NO_EXC);
            __m512    e0, e1, err;
            __mmask16 take;

            /* the clamp comes after the choice: for a finite u, k >= n0
             * keeps |u / k| <= 127 (to a few ulps), so it changes no code
             * and no residual; for a NaN or infinite u, every candidate's
             * err is NaN or Inf either way, and the first is kept.  And
             * k * p is exact, so the fnmadd is the reference's product
             * and difference. */
            e0 = _mm512_fnmadd_ps(k, p0, u0);
            e1 = _mm512_fnmadd_ps(k, p1, u1);
            err = _mm512_add_ps(_mm512_mul_ps(e0, e0), _mm512_mul_ps(e1, e1));
            if (j == 0) {
                best = err;
                bq0 = p0;
                bq1 = p1;
                continue;
            }
            take = _mm512_mask_cmp_ps_mask(
                       _mm512_cmp_ps_mask(k, kmax, _CMP_LE_OQ), err, best,
                       _CMP_LT_OQ);
            best = _mm512_mask_mov_ps(best, take, err);
            bq0 = _mm512_mask_mov_ps(bq0, take, p0);
            bq1 = _mm512_mask_mov_ps(bq1, take, p1);
            bk = _mm512_mask_mov_ps(bk, take, k);
        }
        bq0 = _mm512_min_ps(_mm512_max_ps(bq0, lo), hi);
        bq1 = _mm512_min_ps(_mm512_max_ps(bq1, lo), hi);
        c0 = _mm512_cvtps_epi32(bq0);
        c1 = _mm512_cvtps_epi32(bq1);
        _mm_storeu_si128((__m128i *) (c + i), _mm512_cvtepi32_epi8(
                             _mm512_permutex2var_epi32(c0, il0, c1)));
        _mm_storeu_si128((__m128i *) (c + i + 16), _mm512_cvtepi32_epi8(
                             _mm512_permutex2var_epi32(c0, il1, c1)));
        _mm256_storeu_si256((__m256i *) (n + i / 2), _mm512_cvtepi32_epi16(
                                _mm512_cvtps_epi32(bk)));
        /* x' = n c (exact in float), interleaved back, into the planes */
        c0 = _mm512_cvtps_epi32(_mm512_mul_ps(bk, bq0));
        c1 = _mm512_cvtps_epi32(_mm512_mul_ps(bk, bq1));
        v[0] = _mm512_permutex2var_epi32(c0, il0, c1);
        v[1] = _mm512_permutex2var_epi32(c0, il1, c1);
        for (int h = 0; h < 2; h++) {
            __m512i hv = _mm512_srai_epi32(_mm512_add_epi32(
                             v[h], _mm512_set1_epi32(128)), 8);
            __m512i lv = _mm512_sub_epi32(v[h], _mm512_slli_epi32(hv, 8));

            _mm_storeu_si128((__m128i *) (hi8 + i + 16 * h),
                             _mm512_cvtepi32_epi8(hv));
            _mm_storeu_si128((__m128i *) (lo8 + i + 16 * h),
                             _mm512_cvtepi32_epi8(lv));
        }
    }
    return amax;
}

#endif


typedef float xp_pairs_fn(const float *x, int g, int8_t *c, int16_t *n,
                          int8_t *hi, int8_t *lo);


static xp_pairs_fn *
xp_pairs_of(int isa)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == NALAR_ISA_VNNI) {
        return xp_pairs_avx512;
    }
    if (isa == NALAR_ISA_AVX2 || isa == NALAR_ISA_AVXVNNI) {
        return xp_pairs_avx2;
    }
#else
    (void) isa;
#endif
    return xp_pairs_scalar;
}


/* ------------------------------------------------------------------ */
/* x's codes                                                            */


/* n floats in groups of 256: each group's D, its x' split into the
 * planes hi and lo, its c (cg) and n (ng) */
static void
xp_groups(xp_pairs_fn *fn, const float *x, int64_t n, int8_t *hi,
          int8_t *lo, float *d, int8_t *cg, int16_t *ng)
{
    for (int64_t b = 0; b < n / QK_K; b++) {
        d[b] = fn(x + b * QK_K, QK_K, cg + b * QK_K, ng + b * QK_K / 2,
                  hi + b * QK_K, lo + b * QK_K) / XP_STEPS;
    }
}


int64_t
nalar_quant_xpairs_bytes(int n_tok, int64_t cols)
{
    /* the 16-bit codes' bytes, then c (1 byte) and n (1 byte per value:
     * 2 per pair) of the 256-groups, and alignment */
    return nalar_quant_x16_bytes(n_tok, cols) + (int64_t) n_tok * 2 * cols
           + 2 * 32;
}


static uint8_t *
align32(uint8_t *p)
{
    return (uint8_t *) (((uintptr_t) p + 31) & ~(uintptr_t) 31);
}


int
nalar_quant_xpairs_group(ggml_type t)
{
    return nalar_quant_block(t) == QK_K ? NALAR_XP_G256 : NALAR_XP_G32;
}


void
nalar_quant_xpairs(const float *x, int n_tok, int ldx, int64_t cols,
                   void *buf, nalar_xqp *xp)
{
    nalar_quant_xpairs_groups(x, n_tok, ldx, cols,
                              NALAR_XP_G32 | NALAR_XP_G256, buf, xp);
}


void
nalar_quant_xpairs_groups(const float *x, int n_tok, int ldx, int64_t cols,
                          int groups, void *buf, nalar_xqp *xp)
{
    int          k = cols % QK_K == 0 && (groups & NALAR_XP_G256);
    int          g32 = (groups & NALAR_XP_G32) != 0;
    int64_t      nc = (int64_t) n_tok * cols;
    xp_pairs_fn *fn = xp_pairs_of(nalar_quant_q8_isa());
    uint8_t     *p = nalar_quant_x16_layout(buf, n_tok, cols, k, &xp->x16);
    int8_t      *q[2], *qk[2], *ck = NULL;
    int32_t     *bs[2];
    int16_t     *nk = NULL;
    float       *d, *dk;

    /* nalar_quant_x16's layout (written through here), then ck and nk */
    q[0] = (int8_t *) xp->x16.hi.q;
    q[1] = (int8_t *) xp->x16.lo.q;
    qk[0] = (int8_t *) xp->x16.hi.qk;
    qk[1] = (int8_t *) xp->x16.lo.qk;
    bs[0] = (int32_t *) xp->x16.hi.bs;
    bs[1] = (int32_t *) xp->x16.lo.bs;
    d = (float *) xp->x16.hi.d;
    dk = (float *) xp->x16.hi.dk;
    if (k) {
        ck = (int8_t *) p;
        p = align32(p + nc);
        nk = (int16_t *) p;
    }
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (int64_t) t * ldx;
        int64_t      o = (int64_t) t * cols;

        if (g32) {
            nalar_quant_x16_groups(xt, cols, 32, q[0] + o, q[1] + o,
                                   d + t * (cols / 32));
        }
        if (k) {
            xp_groups(fn, xt, cols, qk[0] + o, qk[1] + o,
                      dk + t * (cols / QK_K), ck + o, nk + o / 2);
            for (int pl = 0; pl < 2; pl++) {
                q8_sums16(qk[pl] + o, cols, bs[pl] + t * (cols / 16));
            }
        }
    }
    if (!g32) {
        xp->x16.hi.q = xp->x16.lo.q = NULL;
        xp->x16.hi.d = xp->x16.lo.d = NULL;
    }
    xp->ck = ck;
    xp->nk = nk;
}


/* ------------------------------------------------------------------ */
/* products                                                             */


void
nalar_quant_matmul_pairs(ggml_type t, const uint8_t *w, int64_t wstride,
                         int il, int64_t cols, const nalar_xqp *xp,
                         int n_tok, float *y, int ldy, int64_t r0,
                         int64_t r1, int accumulate)
{
    /* Q6_K: the pairs mode's own contract (cpu_quant_pairs_k6.c), never
     * the 16-bit one's */
    if (t == GGML_Q6_K) {
        nalar_quant_matmul_pairs_k6(w, wstride, il, cols, xp, n_tok, y, ldy,
                                    r0, r1, accumulate);
        return;
    }
    /* one token of a K-quant: the pair kernels where there is one for
     * t and this instruction set; else, and for everything else, the
     * 16-bit kernels on x': the same bits either way */
    if (n_tok == 1 && nalar_quant_block(t) == QK_K && xp->ck != NULL
        && nalar_quant_pairs_rows(t, nalar_quant_q8_isa(), w, wstride, il,
                                  cols, xp, y, r0, r1, accumulate) == 0)
    {
        return;
    }
    nalar_quant_matmul_x16(t, w, wstride, il, cols, &xp->x16, n_tok, y, ldy,
                           r0, r1, accumulate);
}


void
nalar_quant_matmul_xpairs(ggml_type t, const uint8_t *w, int64_t wstride,
                          int il, int64_t cols, const float *x, int n_tok,
                          int ldx, float *y, int ldy, int64_t r0, int64_t r1,
                          int accumulate)
{
    /* x's codes XP_CHUNK tokens at a time into the scratch (as the 8- and
     * 16-bit modes' own makers do), each token's codes its own: the same
     * as made for the whole batch */
    enum { XP_CHUNK = 32 };
    int    chunk = n_tok < XP_CHUNK ? n_tok : XP_CHUNK;
    float *buf = nalar_quant_scratch(
                     (nalar_quant_xpairs_bytes(chunk, cols) + 3) / 4);

    if (buf == NULL || !nalar_quant_x8_fits(t, cols)) {
        nalar_quant_matmul(t, w, wstride, il, cols, x, n_tok, ldx, y, ldy,
                           r0, r1, accumulate);
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += chunk) {
        int       n = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        nalar_xqp xp;

        nalar_quant_xpairs_groups(x + (int64_t) t0 * ldx, n, ldx, cols,
                                  nalar_quant_xpairs_group(t), buf, &xp);
        nalar_quant_matmul_pairs(t, w, wstride, il, cols, &xp, n,
                                 y + (int64_t) t0 * ldy, ldy, r0, r1,
                                 accumulate);
    }
}
