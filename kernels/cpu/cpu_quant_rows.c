/*
 * One token's products, four rows at a time (cpu_quant_rows.h): decode's
 * kernels, one family for the 8-bit activations (one plane of codes, P
 * 1), the 16-bit ones (two planes, hi and lo, P 2) and the pair
 * multipliers (P 3: one plane of codes c, each pair's n); Q8_0 and Q4_0
 * P 1 only (the 16-bit mode's and the pairs' products over those are
 * cpu_quant_p32.c's, on the weights in panels).  Per block, x's
 * planes are loaded once for the four rows, each row's codes are decoded
 * once and multiplied with every plane, and the rows' blocks are read as
 * one stream where the matrix is interleaved (nalar_quant_interleave:
 * the four rows' blocks of a turn lie side by side).  The prefetch, the
 * scales and the float steps are cpu_quant_rows_simd.h's.
 *
 * Exactness: each (row, token) output takes its contract's operations
 * (8-bit: the top of cpu_quant_q8.c; 16-bit: the top of
 * cpu_quant_x16.c), the scalar reference's bits: per block the
 * contract's eight int32 lanes L[m] (integers, exact, so the order in
 * which a kernel sums them is free), then acc = fma(s, (float) L, acc)
 * in 8 lanes and mn = fma(s', (float) I, mn) over the blocks in order,
 * y = hsum8(acc) - mn.  Four rows' mn are the four lanes of one vector,
 * each lane the scalar chain's fma.  Per type:
 *   Q4_K, Q5_K: each plane's lanes (vpmaddubsw, then vpdpwssd by the
 *     groups' scales, or vpmaddwd and an add), then, P 2, L = 256 * L_hi
 *     + L_lo in integer; the min term likewise from each plane's sums.
 *   Q6_K: the same lanes; P 2 keeps L_hi and L_lo apart, t = fma(256,
 *     (float) L_hi, (float) L_lo) lane by lane as the contract's fmaf,
 *     the min terms likewise.
 *   Q8_0, Q4_0 (P 1; VNNI): the weights as unsigned bytes u (Q8_0: w +
 *     128, Q4_0: the nibble, w + 8), so that one vpdpbusd takes either
 *     sign of x: L = (u . x) - k * (the sums of four codes), k = 128 or
 *     8, the last made once per block for the four rows.  Q4_0's s of a
 *     turn's eight blocks are made at once (their f16 scales picked from
 *     the blocks' bytes by vpermt2w, times x's scales: the same
 *     products).  (AVX2: vpsignb and vpmaddubsw.)
 * AVX-512 VNNI takes the K-quants' codes in 64-byte vectors, two groups
 * of 32 weights each, with the groups' scales picked by vpermw; AVX2
 * 32-byte vectors.
 *
 * Pair multipliers (P 3, nalar_quant_pairs_rows; cpu_quant.h's nalar_xqp:
 * per 256 values a step D, per pair (x[2p], x[2p + 1]) an n_p in [1, 64]
 * and two codes c in [-127, 127]; x16 the 16-bit planes of x' = n c,
 * |x'| <= 8128).  The contract is the pairs mode's (its scalar
 * reference nalar_quant_pairs_scalar on xp->x16: its bits; for Q4_K and
 * Q5_K the 16-bit one on x', nalar_quant_x16_scalar's), computed from c
 * and n:
 *   Q4_K, Q5_K: L[m] = sum_G sum_{p: lane m's two pairs of group G}
 *     (sc_G n_p) (w c + w c)_p = sum sc_G w x' = 256 L_hi + L_lo, the
 *     16-bit contract's integer (x' = 256 hi + lo), so (float) L is its
 *     lane.  vpmaddubsw's pair sums |w c + w c| <= 2 * 31 * 127 = 7874
 *     (no saturation), the int16 scale sc n <= 63 * 64 = 4032 (vpmullw,
 *     exact), each vpdpwssd product <= 7874 * 4032; |L| <= 32 * 63 * 31
 *     * 8128 = 507,961,344 < 2^31, and every partial sum is a sum of
 *     some of the same terms, so below it too.  The min term I = 256 I_hi
 *     + I_lo from x16's planes' sums of 16 (k4_min4 as P 2), s, s' and
 *     the float steps as P 1 and P 2 (rows_float).  Per block and row,
 *     VNNI: 4 vpmaddubsw + 4 vpmullw + 4 vpdpwssd + 4 vpermw (P 2: 8 +
 *     8 + 4 vpermw; P 1: 4 + 4 + 4), x's n (int16, the pair codes'
 *     picks) loaded once per block for the four rows; AVX2, per group:
 *     vpshufb, vpmullw, vpmaddubsw, vpmaddwd.
 *   Q6_K: the pairs' own contract (cpu_quant_pairs_k6.c's top; the
 *     16-bit one's t = fmaf(256, (float) L_hi, (float) L_lo) is not
 *     (float) L there: |L_lo| reaches 32 * 128 * 63 * 128 = 33,030,144 >
 *     2^24, and an odd L_lo past 2^24 is rounded before the fma.  A lane
 *     where they differ (test_quant_pairs_rows.c): scales 127, codes 63,
 *     x' pairs 7 x (128, 128), 8 x (-128, -128), (132, 129): L = 40005,
 *     L_hi = 128016, L_lo = -32732091, t = 40004): per block the lanes
 *     L[m] = sum sc_j w x' of the unsigned 6-bit codes w in [0, 63],
 *     exact in int32 (|L| <= 32 * 128 * 63 * 8128 = 2,097,414,144 <
 *     2^31), acc = fma(s, (float) L, acc); the min term's J = sum_j sc_j
 *     (sum of sub-block j's 16 x') = 256 J_hi + J_lo from x16's planes'
 *     sums of 16 (|J| <= 16 * 128 * 16 * 8128 = 266,338,304: int32),
 *     mn = fma(s, 32 * (float) J, mn).  The lanes as P 1's with the pair
 *     codes c: vpmaddubsw's pair sums |w c + w c| <= 2 * 63 * 127 =
 *     16002, the scale sc n as int16 (|sc n| <= 128 * 64 = 8192, vpmullw
 *     exact), so per block and row, VNNI: 4 vpmaddubsw + 4 vpmullw + 4
 *     vpdpwssd + 4 vpermw (P 2: 8 + 8 + 4 vpermw), x's codes and n
 *     loaded once per block for the four rows; AVX2, per group of 32:
 *     vpmaddubsw, vpmullw, vpmaddwd.
 * AVX-VNNI runs the AVX2 kernels with each vpmaddwd-and-add in one VEX
 * vpdpwssd, and Q8_0's/Q4_0's vpmaddubsw-and-vpmaddwd in one vpdpbusd
 * (q8_vex_dpbusd): the same integers, so the same bits.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_rows_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROWS_X86 1
#endif


#if defined(ROWS_X86)

#define T_AVX2 Q8_T_AVX2
#define T_VNNI Q8_T_VNNI
#define INL    Q8_INL

/* AVX2 and AVX-VNNI: acc + vpmaddwd(a, b), in one VEX vpdpwssd where VX
 * (the same integers) */
static INL T_AVX2 __m256i
rows_madd(const int VX, __m256i acc, __m256i a, __m256i b)
{
    return VX ? q8_vex_dpwssd(acc, a, b)
              : _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

/* one token's codes as the kernels of a type read them: P planes (the
 * 8-bit codes, or the 16-bit codes' hi and lo bytes), per 32 (P 1 alone)
 * or per 256 */
typedef struct {
    const int8_t  *q[2];    /* the planes' codes (q[1]: P 2 only); P 3:
                               q[0] the pair codes c */
    const int32_t *bs[2];   /* per 256: each plane's sums of 16 (P 3: the
                               16-bit planes' of x' = n * c) */
    const int16_t *n;       /* P 3: the pairs' multipliers, per 256 */
    const float   *d;       /* the codes' scales */
} rows_x;

/* a kernel: R rows (row[0 .. R-1]) of one token, nb blocks each; pfo the
 * bytes from a block to the one it asks for (0: none) */
typedef void rows_fn(const uint8_t *const *row, int il, int64_t nb,
                     const rows_x *x, ptrdiff_t pfo, float *out);


/* two 32-byte pieces of a plane's block as one 64-byte vector */
static INL T_VNNI __m512i
load2(const int8_t *p, int a, int b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(
               _mm256_loadu_si256((const __m256i *) (p + a))),
               _mm256_loadu_si256((const __m256i *) (p + b)), 1);
}


/* the min term of a row's Q4_K/Q5_K mins (the 8 int16 mins) against the
 * planes' sums of 32 codes: four lanes whose sum is I (P 2: 256 * I_hi
 * + I_lo) */
static INL T_AVX2 __m128i
k4_min4(const int P, __m128i mins, __m128i xsh, __m128i xsl)
{
    __m128i h = _mm_madd_epi16(mins, xsh);

    return P == 1 ? h : _mm_add_epi32(_mm_slli_epi32(h, 8),
                                      _mm_madd_epi16(mins, xsl));
}


/* s and s' of four rows (sv[i]: row i's s, s', -, -) as one vector of
 * the s' */
static INL T_AVX2 __m128
k4_s2(const __m128 *sv)
{
    __m128 u01 = _mm_unpacklo_ps(sv[0], sv[1]);
    __m128 u23 = _mm_unpacklo_ps(sv[2], sv[3]);

    return _mm_movehl_ps(u23, u01);
}


/* ------------------------------------------------------------------ */
/* Q4_K and Q5_K                                                       */


/* VNNI: Q4_K (Q5 0) or Q5_K (Q5 1), P planes (P 3: the pair codes c
 * with their multipliers n, the min term from the 16-bit planes' sums
 * as P 2), R rows */
static INL T_VNNI void
k4_rows_vnni(const int Q5, const int P, const int R,
             const uint8_t *const *row, int il, int64_t nb, const rows_x *x,
             ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q5 ? QK5_K_BYTES : QK4_K_BYTES;
    const __m512i F = _mm512_set1_epi8(0x0F), z = _mm512_setzero_si512();
    /* vpermw's picks of the scales of each 64-byte vector's two groups:
     * [0 | 2], [1 | 3], [4 | 6], [5 | 7] */
    const __m512i I0 = _mm512_inserti64x4(_mm512_set1_epi16(0),
                                          _mm256_set1_epi16(2), 1);
    const __m512i I1 = _mm512_inserti64x4(_mm512_set1_epi16(1),
                                          _mm256_set1_epi16(3), 1);
    const __m512i I2 = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(6), 1);
    const __m512i I3 = _mm512_inserti64x4(_mm512_set1_epi16(5),
                                          _mm256_set1_epi16(7), 1);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, bytes, b);
        const int8_t *xh = x->q[0] + b * QK_K;
        const int8_t *xl = P == 2 ? x->q[1] + b * QK_K : xh;
        /* x's groups as the codes' vectors hold them, each plane (P 3:
         * L0 .. L3 the pairs' n, the int16 of group G at byte 32 G, so
         * the same picks) */
        __m512i       H0 = load2(xh, 0, 64), H1 = load2(xh, 32, 96);
        __m512i       H2 = load2(xh, 128, 192), H3 = load2(xh, 160, 224);
        __m512i       L0 = z, L1 = z, L2 = z, L3 = z;
        __m128i       xsh = rows_k4_xsums(x->bs[0] + 16 * b), M[4];
        __m128i       xsl = P != 1 ? rows_k4_xsums(x->bs[1] + 16 * b) : xsh;
        __m128        dx = _mm_set1_ps(x->d[b]), sv[4];
        __m256i       L8[4];
        float         s[4];

        if (P != 1) {
            xl = P == 3 ? (const int8_t *) (x->n + b * (QK_K / 2)) : xl;
            L0 = load2(xl, 0, 64);
            L1 = load2(xl, 32, 96);
            L2 = load2(xl, 128, 192);
            L3 = load2(xl, 160, 224);
        }
        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            sv[i] = _mm_setzero_ps();
        }
        rows_pf_step(R, row, il, QK_K, bytes, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            const uint8_t *qs = p + (Q5 ? 48 : 16);
            __m128i        h = _mm_loadu_si128((const __m128i *) p);
            __m128i        sm = rows_k4_sm(h);
            __m512i        S = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(sm));
            __m512i        q0 = _mm512_loadu_si512((const void *) qs);
            __m512i        q1 = _mm512_loadu_si512((const void *) (qs + 64));
            __m512i        c0 = _mm512_and_si512(q0, F);
            __m512i        c1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), F);
            __m512i        c2 = _mm512_and_si512(q1, F);
            __m512i        c3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), F);
            __m512i        L, Lh = z, Ll = z, Sk, Sp[4];

            if (Q5) {
                /* the fifth bit: bit G of qh[l] for weight l of group G */
                __m512i qh = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *) (p + 16)));
                __m512i k16 = _mm512_set1_epi8(16);

#define Q5_BIT(c, lo, hi)                                                   \
                c = _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(qh,       \
                        _mm512_inserti64x4(_mm512_set1_epi8(lo),            \
                                           _mm256_set1_epi8(hi), 1)),       \
                        c, k16)
                Q5_BIT(c0, 1, 4);
                Q5_BIT(c1, 2, 8);
                Q5_BIT(c2, 16, 64);
                Q5_BIT(c3, 32, (char) 128);
#undef Q5_BIT
            }
            /* each plane by sc; P 2: L = 256 * L_hi + L_lo; P 3: the
             * pair codes by sc * n (vpmullw: |sc n| <= 63 * 64), L =
             * sum sc w x' as P 2's.  The scales' picks: P 1 where they
             * are used (fewer vectors live), P 2 all at first (faster
             * so, in a loop of the product alone) */
            if (P == 2) {
                Sp[0] = _mm512_permutexvar_epi16(I0, S);
                Sp[1] = _mm512_permutexvar_epi16(I1, S);
                Sp[2] = _mm512_permutexvar_epi16(I2, S);
                Sp[3] = _mm512_permutexvar_epi16(I3, S);
            }
#define K4_STEP(c, XH, XL, Ik, k)                                           \
            Sk = P == 2 ? Sp[k] : _mm512_permutexvar_epi16(Ik, S);          \
            Sk = P == 3 ? _mm512_mullo_epi16(Sk, XL) : Sk;                  \
            Lh = _mm512_dpwssd_epi32(Lh, _mm512_maddubs_epi16(c, XH), Sk);  \
            if (P == 2) {                                                   \
                Ll = _mm512_dpwssd_epi32(Ll, _mm512_maddubs_epi16(c, XL),   \
                                         Sk);                               \
            }
            K4_STEP(c0, H0, L0, I0, 0);
            K4_STEP(c1, H1, L1, I1, 1);
            K4_STEP(c2, H2, L2, I2, 2);
            K4_STEP(c3, H3, L3, I3, 3);
#undef K4_STEP
            L = P != 2 ? Lh : _mm512_add_epi32(_mm512_slli_epi32(Lh, 8), Ll);
            L8[i] = _mm256_add_epi32(_mm512_castsi512_si256(L),
                                     _mm512_extracti64x4_epi64(L, 1));
            M[i] = k4_min4(P == 1 ? 1 : 2,
                           _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), xsh,
                           xsl);
            sv[i] = _mm_mul_ps(_mm_cvtph_ps(h), dx);    /* s, s', -, - */
            s[i] = _mm_cvtss_f32(sv[i]);
        }
        rows_float(R, s, L8, k4_s2(sv),
                   rows_hsum4x4(M[0], M[1], M[2], M[3]), acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* AVX2 (AVX-VNNI where VX): Q4_K (Q5 0) or Q5_K (Q5 1), P planes (P 3:
 * pairs, as the VNNI kernel's), R rows */
static INL T_AVX2 void
k4_rows_avx2(const int VX, const int Q5, const int P, const int R,
             const uint8_t *const *row, int il, int64_t nb, const rows_x *x,
             ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q5 ? QK5_K_BYTES : QK4_K_BYTES;
    const __m256i F = _mm256_set1_epi8(0x0F);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, bytes, b);
        const int8_t *xh = x->q[0] + b * QK_K;
        const int8_t *xl = P == 2 ? x->q[1] + b * QK_K : xh;
        const int16_t *xn = P == 3 ? x->n + b * (QK_K / 2) : NULL;
        __m128i       xsh = rows_k4_xsums(x->bs[0] + 16 * b), M[4];
        __m128i       xsl = P != 1 ? rows_k4_xsums(x->bs[1] + 16 * b) : xsh;
        __m128        dx = _mm_set1_ps(x->d[b]), sv[4];
        __m256i       L8[4];
        float         s[4];

        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            sv[i] = _mm_setzero_ps();
        }
        rows_pf_step(R, row, il, QK_K, bytes, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            const uint8_t *qs = p + (Q5 ? 48 : 16);
            __m128i        h = _mm_loadu_si128((const __m128i *) p);
            __m128i        sm = rows_k4_sm(h);
            __m256i        S = _mm256_broadcastsi128_si256(
                                   _mm_cvtepu8_epi16(sm));
            __m256i        qh = _mm256_setzero_si256(), Lh = qh, Ll = qh;

            if (Q5) {
                qh = _mm256_loadu_si256((const __m256i *) (p + 16));
            }
            for (int G = 0; G < 8; G++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)
                                               (qs + 32 * (G / 2)));
                __m256i c = (G & 1) ? _mm256_and_si256(
                                          _mm256_srli_epi16(q, 4), F)
                                    : _mm256_and_si256(q, F);
                __m256i sc = _mm256_shuffle_epi8(S, _mm256_set1_epi16(
                                 (short) (0x0100 + 0x0202 * G)));

                if (Q5) {
                    __m256i bit = _mm256_set1_epi8((char) (1 << G));

                    c = _mm256_or_si256(c, _mm256_and_si256(
                            _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                            _mm256_set1_epi8(16)));
                }
                if (P == 3) {
                    /* sc * n of the group's 16 pairs */
                    sc = _mm256_mullo_epi16(sc, _mm256_loadu_si256(
                             (const __m256i *) (xn + 16 * G)));
                }
                Lh = rows_madd(VX, Lh, _mm256_maddubs_epi16(
                         c, _mm256_loadu_si256(
                             (const __m256i *) (xh + 32 * G))), sc);
                if (P == 2) {
                    Ll = rows_madd(VX, Ll, _mm256_maddubs_epi16(
                             c, _mm256_loadu_si256(
                                 (const __m256i *) (xl + 32 * G))), sc);
                }
            }
            L8[i] = P != 2 ? Lh
                           : _mm256_add_epi32(_mm256_slli_epi32(Lh, 8), Ll);
            M[i] = k4_min4(P == 1 ? 1 : 2,
                           _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), xsh,
                           xsl);
            sv[i] = _mm_mul_ps(_mm_cvtph_ps(h), dx);
            s[i] = _mm_cvtss_f32(sv[i]);
        }
        rows_float(R, s, L8, k4_s2(sv),
                   rows_hsum4x4(M[0], M[1], M[2], M[3]), acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* ------------------------------------------------------------------ */
/* Q6_K                                                                 */


/* Q6_K's per-block float steps of R rows: P 1, rows_float's with s' = s
 * and I = 32 * Ih; P 2, acc[i] = fma(s_i, fma(256, (float) Lh[i],
 * (float) Ll[i]), acc[i]) and mn = fma(s, fma(256, (float) (32 * Ih),
 * (float) (32 * Il)), mn) lane by lane (Ih, Il: the four rows' sums of
 * sc_j times the plane's sums of 16); P 3 (the pairs' contract, Lh the
 * lanes L of x'), acc[i] = fma(s_i, (float) L[i], acc[i]) and mn = fma(s,
 * 32 * (float) J, mn), J = 256 Ih + Il exact in int32 */
static INL T_AVX2 void
k6_float(const int P, const int R, const float *s, const __m256i *Lh,
         const __m256i *Ll, __m128i Ih, __m128i Il, __m256 *acc, __m128 *mn)
{
    const __m256 k = _mm256_set1_ps(256.0f);

    if (P == 1) {
        rows_float(R, s, Lh, _mm_loadu_ps(s), _mm_slli_epi32(Ih, 5), acc,
                   mn);
        return;
    }
    if (P == 3) {
        __m128i J = _mm_add_epi32(_mm_slli_epi32(Ih, 8), Il);

        for (int i = 0; i < R; i++) {
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i]),
                                     _mm256_cvtepi32_ps(Lh[i]), acc[i]);
        }
        *mn = _mm_fmadd_ps(_mm_loadu_ps(s),
                           _mm_mul_ps(_mm_cvtepi32_ps(J),
                                      _mm_set1_ps(32.0f)), *mn);
        return;
    }
    for (int i = 0; i < R; i++) {
        __m256 t = _mm256_fmadd_ps(k, _mm256_cvtepi32_ps(Lh[i]),
                                   _mm256_cvtepi32_ps(Ll[i]));

        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i]), t, acc[i]);
    }
    *mn = _mm_fmadd_ps(_mm_loadu_ps(s), _mm_fmadd_ps(
              _mm256_castps256_ps128(k),
              _mm_cvtepi32_ps(_mm_slli_epi32(Ih, 5)),
              _mm_cvtepi32_ps(_mm_slli_epi32(Il, 5))), *mn);
}


/* a row's Q6_K scales W (16 int16) against a plane's sums of 16 codes
 * xs: four lanes whose sum is sum_j sc_j * xs_j */
static INL T_AVX2 __m128i
k6_min4(__m256i W, __m256i xs)
{
    __m256i m = _mm256_madd_epi16(W, xs);

    return _mm_add_epi32(_mm256_castsi256_si128(m),
                         _mm256_extracti128_si256(m, 1));
}


/* VNNI: Q6_K, P planes (P 3: the pair codes c with their multipliers n,
 * the pairs' contract: sc * n by vpmullw, one plane), R rows */
static INL T_VNNI void
k6_rows_vnni(const int P, const int R, const uint8_t *const *row, int il,
             int64_t nb, const rows_x *x, ptrdiff_t pfo, float *out)
{
    const __m512i F = _mm512_set1_epi8(0x0F), H = _mm512_set1_epi8(0x30);
    /* qh's shifts bringing group 4h + k's two bits to bits 4, 5: left 4
     * (k 0) | left 2 (k 1); right 0 (k 2) | right 2 (k 3) */
    const __m512i SL = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(2), 1);
    const __m512i SR = _mm512_inserti64x4(_mm512_set1_epi16(0),
                                          _mm256_set1_epi16(2), 1);
    __m512i       IW[4];
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    /* vpermw's picks of the 16-weight sub-blocks' scales: 128-bit lane j
     * of vector v holds sub-block 4v + j */
    for (int v = 0; v < 4; v++) {
        IW[v] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16((short) (4 * v + 1)),
                _mm_set1_epi16((short) (4 * v)))),
            _mm256_set_m128i(_mm_set1_epi16((short) (4 * v + 3)),
                             _mm_set1_epi16((short) (4 * v + 2))), 1);
    }
    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, QK6_K_BYTES, b);
        const int8_t *xh = x->q[0] + b * QK_K;
        /* P 3: the pairs' n, 32 int16 per 64 codes, as XL */
        const int8_t *xl = P == 2 ? x->q[1] + b * QK_K
                           : P == 3 ? (const int8_t *) (x->n + b * (QK_K / 2))
                           : xh;
        __m512i       XH[4], XL[4];
        __m256i       xsh = rows_k6_xsums(x->bs[0] + 16 * b);
        __m256i       xsl = P != 1 ? rows_k6_xsums(x->bs[1] + 16 * b) : xsh;
        __m256i       Lh8[4], Ll8[4];
        __m128i       Mh[4], Ml[4];
        float         s[4], dx = x->d[b];

        /* P 2, 3: x's vectors held for the four rows; P 1 reads them in
         * each row's steps (fewer vectors live) */
        for (int v = 0; v < 4 && P != 1; v++) {
            XH[v] = _mm512_loadu_si512((const void *) (xh + 64 * v));
            XL[v] = _mm512_loadu_si512((const void *) (xl + 64 * v));
        }
        for (int i = 0; i < 4; i++) {
            Mh[i] = Ml[i] = _mm_setzero_si128();
            s[i] = 0;
        }
        rows_pf_step(R, row, il, QK_K, QK6_K_BYTES, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            __m256i        W = _mm256_cvtepi8_epi16(
                                   _mm_loadu_si128((const __m128i *)
                                                   (p + 192)));
            __m512i        S = _mm512_zextsi256_si512(W);
            __m512i        Lh = _mm512_setzero_si512(), Ll = Lh;

            for (int h = 0; h < 2; h++) {
                __m512i ql = _mm512_loadu_si512((const void *) (p + 64 * h));
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                 (const __m256i *) (p + 128 + 32 * h)));
                __m512i c01 = _mm512_or_si512(
                    _mm512_and_si512(ql, F),
                    _mm512_and_si512(_mm512_sllv_epi16(qh, SL), H));
                __m512i c23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(ql, 4), F),
                    _mm512_and_si512(_mm512_srlv_epi16(qh, SR), H));
                __m512i S01 = _mm512_permutexvar_epi16(IW[2 * h], S);
                __m512i S23 = _mm512_permutexvar_epi16(IW[2 * h + 1], S);

                if (P == 3) {
                    /* sc * n (|sc n| <= 128 * 64: int16) */
                    S01 = _mm512_mullo_epi16(S01, XL[2 * h]);
                    S23 = _mm512_mullo_epi16(S23, XL[2 * h + 1]);
                }
                Lh = _mm512_dpwssd_epi32(Lh, _mm512_maddubs_epi16(
                         c01, P != 1 ? XH[2 * h] : _mm512_loadu_si512(
                             (const void *) (xh + 128 * h))), S01);
                Lh = _mm512_dpwssd_epi32(Lh, _mm512_maddubs_epi16(
                         c23, P != 1 ? XH[2 * h + 1] : _mm512_loadu_si512(
                             (const void *) (xh + 128 * h + 64))), S23);
                if (P == 2) {
                    Ll = _mm512_dpwssd_epi32(Ll, _mm512_maddubs_epi16(
                             c01, XL[2 * h]), S01);
                    Ll = _mm512_dpwssd_epi32(Ll, _mm512_maddubs_epi16(
                             c23, XL[2 * h + 1]), S23);
                }
            }
            Lh8[i] = _mm256_add_epi32(_mm512_castsi512_si256(Lh),
                                      _mm512_extracti64x4_epi64(Lh, 1));
            Mh[i] = k6_min4(W, xsh);
            if (P == 2) {
                Ll8[i] = _mm256_add_epi32(_mm512_castsi512_si256(Ll),
                                          _mm512_extracti64x4_epi64(Ll, 1));
            }
            if (P != 1) {
                Ml[i] = k6_min4(W, xsl);
            }
            s[i] = f16_at(p + 208) * dx;
        }
        k6_float(P, R, s, Lh8, Ll8,
                 rows_hsum4x4(Mh[0], Mh[1], Mh[2], Mh[3]),
                 rows_hsum4x4(Ml[0], Ml[1], Ml[2], Ml[3]), acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* AVX2 (AVX-VNNI where VX): Q6_K, P planes (P 3: pairs, as the VNNI
 * kernel's), R rows */
static INL T_AVX2 void
k6_rows_avx2(const int VX, const int P, const int R,
             const uint8_t *const *row, int il, int64_t nb, const rows_x *x,
             ptrdiff_t pfo, float *out)
{
    const __m256i F = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, QK6_K_BYTES, b);
        const int8_t *xh = x->q[0] + b * QK_K;
        const int8_t *xl = P == 2 ? x->q[1] + b * QK_K : xh;
        const int16_t *xn = P == 3 ? x->n + b * (QK_K / 2) : NULL;
        __m256i       xsh = rows_k6_xsums(x->bs[0] + 16 * b);
        __m256i       xsl = P != 1 ? rows_k6_xsums(x->bs[1] + 16 * b) : xsh;
        __m256i       Lh8[4], Ll8[4];
        __m128i       Mh[4], Ml[4];
        float         s[4], dx = x->d[b];

        for (int i = 0; i < 4; i++) {
            Mh[i] = Ml[i] = _mm_setzero_si128();
            s[i] = 0;
        }
        rows_pf_step(R, row, il, QK_K, QK6_K_BYTES, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            __m256i        W = _mm256_cvtepi8_epi16(
                                   _mm_loadu_si128((const __m128i *)
                                                   (p + 192)));
            __m256i        Wl = _mm256_permute2x128_si256(W, W, 0x00);
            __m256i        Wh = _mm256_permute2x128_si256(W, W, 0x11);
            __m256i        Lh = _mm256_setzero_si256(), Ll = Lh;

            for (int G = 0; G < 8; G++) {
                int            hh = G / 4, k = G % 4;
                const uint8_t *ql = p + 64 * hh + (k & 1) * 32;
                __m256i        a = _mm256_loadu_si256((const __m256i *) ql);
                __m256i        e = _mm256_loadu_si256((const __m256i *)
                                                      (p + 128 + 32 * hh));
                __m256i        lo = (k & 2) ? _mm256_and_si256(
                                                  _mm256_srli_epi16(a, 4), F)
                                            : _mm256_and_si256(a, F);
                __m256i        hi = _mm256_and_si256(
                                        _mm256_srli_epi16(e, 2 * k), three);
                /* [sub-block 2G's scale | 2G + 1's], as int16 */
                int            j = 2 * G % 8;
                __m256i        sc = _mm256_shuffle_epi8(
                                        G < 4 ? Wl : Wh,
                                        _mm256_set_m128i(
                                            _mm_set1_epi16((short)
                                                (0x0202 * (j + 1) + 0x0100)),
                                            _mm_set1_epi16((short)
                                                (0x0202 * j + 0x0100))));
                __m256i        c = _mm256_or_si256(lo,
                                                   _mm256_slli_epi16(hi, 4));

                if (P == 3) {
                    /* sc * n of the group's 16 pairs */
                    sc = _mm256_mullo_epi16(sc, _mm256_loadu_si256(
                             (const __m256i *) (xn + 16 * G)));
                }
                Lh = rows_madd(VX, Lh, _mm256_maddubs_epi16(
                         c, _mm256_loadu_si256(
                             (const __m256i *) (xh + 32 * G))), sc);
                if (P == 2) {
                    Ll = rows_madd(VX, Ll, _mm256_maddubs_epi16(
                             c, _mm256_loadu_si256(
                                 (const __m256i *) (xl + 32 * G))), sc);
                }
            }
            Lh8[i] = Lh;
            Ll8[i] = Ll;
            Mh[i] = k6_min4(W, xsh);
            if (P != 1) {
                Ml[i] = k6_min4(W, xsl);
            }
            s[i] = f16_at(p + 208) * dx;
        }
        k6_float(P, R, s, Lh8, Ll8,
                 rows_hsum4x4(Mh[0], Mh[1], Mh[2], Mh[3]),
                 rows_hsum4x4(Ml[0], Ml[1], Ml[2], Ml[3]), acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* ------------------------------------------------------------------ */
/* Q8_0 and Q4_0                                                        */


/* VNNI: the 32 weights of the block at p as unsigned bytes u in the
 * weights' order: Q8_0 (Q4 0) w + 128, Q4_0 (Q4 1) the nibbles, w + 8 */
static INL T_VNNI __m256i
s_u(const int Q4, const uint8_t *p)
{
    __m256i n;

    if (!Q4) {
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)
                                                   (p + 2)),
                                _mm256_set1_epi8((char) 0x80));
    }
    /* the 16 bytes twice: the low nibbles (weights 0 .. 15), then the
     * high ones (16 .. 31) */
    n = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)
                                                    (p + 2)));
    return _mm256_and_si256(_mm256_mask_srli_epi16(n, 0xFF00, n, 4),
                            _mm256_set1_epi8(0x0F));
}


/* VNNI: block b of R rows at offset off of each row; Q4_0: s[i * ls]
 * row i's s (Q8_0: made here, f16_at(p) * d_x) */
static INL T_VNNI void
s_step_vnni(const int Q4, const int R, const uint8_t *const *row, int il,
            int64_t b, int64_t off, const rows_x *x, ptrdiff_t pfo,
            const float *s, int ls, __m256 *acc)
{
    const int64_t bytes = Q4 ? 2 + QK4_0 / 2 : 2 + QK8_0;
    const __m256i one = _mm256_set1_epi8(1), z = _mm256_setzero_si256();
    __m256i       xh = _mm256_loadu_si256((const __m256i *)
                                          (x->q[0] + 32 * b));
    /* the sums of four codes, times -128 (Q8_0) or -8 */
    __m256i       s4 = _mm256_dpbusd_epi32(z, one, xh);
    __m256i       K = _mm256_sub_epi32(z, _mm256_slli_epi32(s4, Q4 ? 3 : 7));

    rows_pf_step(R, row, il, 32, bytes, b, off, pfo);
    for (int i = 0; i < R; i++) {
        __m256i u = s_u(Q4, row[i] + off);
        __m256i L = _mm256_dpbusd_epi32(K, u, xh);

        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(
                                     Q4 ? s[i * ls]
                                        : f16_at(row[i] + off) * x->d[b]),
                                 _mm256_cvtepi32_ps(L), acc[i]);
    }
}


/* VNNI: the f16 scales of a row's n (1 .. 8) Q4_0 blocks at p, one
 * after another, as eight words (0 past n): the blocks' bytes read in two
 * 64-byte pieces (none past the n blocks), words 9j picked by vpermt2w.
 * (Q8_0's 34-byte blocks would take four pieces: slower, in a loop of
 * the product alone, than each block's f16 on its own.) */
static INL T_VNNI __m128i
s_scales8(const uint8_t *p, int n)
{
    int64_t len = n * (2 + QK4_0 / 2);
    __m512i v[2];

    for (int j = 0; j < 2; j++) {
        int64_t r = len - 64 * j;

        v[j] = _mm512_maskz_loadu_epi8(r >= 64 ? ~(__mmask64) 0
                                       : r <= 0 ? 0
                                       : ((__mmask64) 1 << r) - 1,
                                       p + 64 * j);
    }
    return _mm512_castsi512_si128(_mm512_permutex2var_epi16(
               v[0], _mm512_castsi128_si512(_mm_setr_epi16(
                         0, 9, 18, 27, 36, 45, 54, 63)), v[1]));
}


/* VNNI: Q8_0 (Q4 0) or Q4_0 (Q4 1), R rows, by turns of eight blocks
 * (or what is left of the row), whose blocks lie one after another in
 * either layout: Q4_0's s of a turn made at once */
static INL T_VNNI void
s_rows_vnni(const int Q4, const int R, const uint8_t *const *row, int il,
            int64_t nb, const rows_x *x, ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q4 ? 2 + QK4_0 / 2 : 2 + QK8_0;
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    /* Q8_0: a block at a time, each with its own s */
    for (int64_t b = 0; b < nb && !Q4; b++) {
        s_step_vnni(Q4, R, row, il, b, qoff_at(il, 32, bytes, b), x, pfo,
                    NULL, 0, acc);
    }
    for (int64_t b0 = 0; b0 < nb && Q4; b0 += QK_K / 32) {
        int       n = nb - b0 < QK_K / 32 ? (int) (nb - b0) : QK_K / 32, k;
        int64_t   off = qoff_at(il, 32, bytes, b0);
        __m256    dx = _mm256_maskz_loadu_ps((__mmask8) ((1u << n) - 1),
                                             x->d + b0);
        /* Q4_0: s = d_w * d_x of each row's blocks of the turn */
        float     s[4][QK_K / 32];

        for (int i = 0; i < R && Q4; i++) {
            _mm256_storeu_ps(s[i], _mm256_mul_ps(_mm256_cvtph_ps(
                                       s_scales8(row[i] + off, n)), dx));
        }
        if (n == QK_K / 32) {
            for (k = 0; k < QK_K / 32; k++) {
                s_step_vnni(Q4, R, row, il, b0 + k, off + k * bytes, x, pfo,
                            &s[0][k], QK_K / 32, acc);
            }
        } else {
            for (k = 0; k < n; k++) {
                s_step_vnni(Q4, R, row, il, b0 + k, off + k * bytes, x, pfo,
                            &s[0][k], QK_K / 32, acc);
            }
        }
    }
    rows_out(R, acc, mn, out);
}


/* AVX2 (AVX-VNNI where VX): Q8_0 (Q4 0) or Q4_0 (Q4 1), R rows */
static INL T_AVX2 void
s_rows_avx2(const int VX, const int Q4, const int R,
            const uint8_t *const *row, int il, int64_t nb, const rows_x *x,
            ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q4 ? 2 + QK4_0 / 2 : 2 + QK8_0;
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t off = qoff_at(il, 32, bytes, b);
        __m256i xh = _mm256_loadu_si256((const __m256i *) (x->q[0] + 32 * b));
        float   dx = x->d[b];

        rows_pf_step(R, row, il, 32, bytes, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            __m256i        w = q8_w32_signed(Q4 ? GGML_Q4_0 : GGML_Q8_0, p);
            /* |w| against sign(x, w): vpmaddubsw pairs (below 2^15),
             * summed in fours (AVX-VNNI: vpdpbusd, the same sums) */
            __m256i        u = _mm256_abs_epi8(w);
            __m256i        sx = _mm256_sign_epi8(xh, w);
            __m256i        L = VX ? q8_vex_dpbusd(_mm256_setzero_si256(), u,
                                                  sx)
                                  : _mm256_madd_epi16(
                                        _mm256_maddubs_epi16(u, sx),
                                        _mm256_set1_epi16(1));

            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p) * dx),
                                     _mm256_cvtepi32_ps(L), acc[i]);
        }
    }
    rows_out(R, acc, mn, out);
}


/* ------------------------------------------------------------------ */
/* the kernels: four rows and one, each plane count                     */


#define ROWS_KERNELS(NAME, TGT, CALL)                                       \
static TGT void                                                             \
NAME##_4(const uint8_t *const *row, int il, int64_t nb, const rows_x *x,    \
         ptrdiff_t pfo, float *out)                                         \
{                                                                           \
    const int R = 4;                                                        \
    CALL;                                                                   \
}                                                                           \
static TGT void                                                             \
NAME##_1(const uint8_t *const *row, int il, int64_t nb, const rows_x *x,    \
         ptrdiff_t pfo, float *out)                                         \
{                                                                           \
    const int R = 1;                                                        \
    CALL;                                                                   \
}

/* each K-quant's kernels for P planes, on each instruction set */
#define ROWS_PLANES(P)                                                      \
ROWS_KERNELS(q4k_vnni_p##P, T_VNNI,                                         \
             k4_rows_vnni(0, P, R, row, il, nb, x, pfo, out))               \
ROWS_KERNELS(q5k_vnni_p##P, T_VNNI,                                         \
             k4_rows_vnni(1, P, R, row, il, nb, x, pfo, out))               \
ROWS_KERNELS(q6k_vnni_p##P, T_VNNI,                                         \
             k6_rows_vnni(P, R, row, il, nb, x, pfo, out))                  \
ROWS_KERNELS(q4k_avx2_p##P, T_AVX2,                                         \
             k4_rows_avx2(0, 0, P, R, row, il, nb, x, pfo, out))            \
ROWS_KERNELS(q5k_avx2_p##P, T_AVX2,                                         \
             k4_rows_avx2(0, 1, P, R, row, il, nb, x, pfo, out))            \
ROWS_KERNELS(q6k_avx2_p##P, T_AVX2,                                         \
             k6_rows_avx2(0, P, R, row, il, nb, x, pfo, out))               \
ROWS_KERNELS(q4k_avxvnni_p##P, T_AVX2,                                      \
             k4_rows_avx2(1, 0, P, R, row, il, nb, x, pfo, out))            \
ROWS_KERNELS(q5k_avxvnni_p##P, T_AVX2,                                      \
             k4_rows_avx2(1, 1, P, R, row, il, nb, x, pfo, out))            \
ROWS_KERNELS(q6k_avxvnni_p##P, T_AVX2,                                      \
             k6_rows_avx2(1, P, R, row, il, nb, x, pfo, out))

ROWS_PLANES(1)
ROWS_PLANES(2)
ROWS_PLANES(3)

/* Q8_0's and Q4_0's kernels, the 8-bit codes' (P 1) alone */
ROWS_KERNELS(q80_vnni_p1, T_VNNI, s_rows_vnni(0, R, row, il, nb, x, pfo, out))
ROWS_KERNELS(q40_vnni_p1, T_VNNI, s_rows_vnni(1, R, row, il, nb, x, pfo, out))
ROWS_KERNELS(q80_avx2_p1, T_AVX2,
             s_rows_avx2(0, 0, R, row, il, nb, x, pfo, out))
ROWS_KERNELS(q40_avx2_p1, T_AVX2,
             s_rows_avx2(0, 1, R, row, il, nb, x, pfo, out))
ROWS_KERNELS(q80_avxvnni_p1, T_AVX2,
             s_rows_avx2(1, 0, R, row, il, nb, x, pfo, out))
ROWS_KERNELS(q40_avxvnni_p1, T_AVX2,
             s_rows_avx2(1, 1, R, row, il, nb, x, pfo, out))


/* the kernels of t on isa for P planes (3: pair codes): f[0] one row,
 * f[1] four; 0, or -1 for none (Q8_0 and Q4_0 but P 1) */
static int
rows_fns(ggml_type t, int isa, int P, rows_fn **f)
{
    int k = isa == NALAR_ISA_VNNI ? 0 : isa == NALAR_ISA_AVX2 ? 1
            : isa == NALAR_ISA_AVXVNNI ? 2 : -1;

    if (k < 0 || P < 1 || P > 3 || !nalar_quant_isa_ok(isa)) {
        return -1;
    }
#define ROWS_PICK(N, PL)                                                    \
    {                                                                       \
        static rows_fn *const one[3] = { N##_vnni_p##PL##_1,                \
                                         N##_avx2_p##PL##_1,                \
                                         N##_avxvnni_p##PL##_1 };           \
        static rows_fn *const four[3] = { N##_vnni_p##PL##_4,               \
                                          N##_avx2_p##PL##_4,               \
                                          N##_avxvnni_p##PL##_4 };          \
                                                                            \
        f[0] = one[k];                                                      \
        f[1] = four[k];                                                     \
        return 0;                                                           \
    }
#define ROWS_PICK_P(N)                                                      \
    if (P == 1) ROWS_PICK(N, 1)                                             \
    if (P == 2) ROWS_PICK(N, 2)                                             \
    ROWS_PICK(N, 3)
    switch (t) {
    case GGML_Q4_K:
        ROWS_PICK_P(q4k)
    case GGML_Q5_K:
        ROWS_PICK_P(q5k)
    case GGML_Q6_K:
        ROWS_PICK_P(q6k)
    case GGML_Q8_0:
        if (P != 1) {
            return -1;
        }
        ROWS_PICK(q80, 1)
    case GGML_Q4_0:
        if (P != 1) {
            return -1;
        }
        ROWS_PICK(q40, 1)
    default:
        return -1;
    }
#undef ROWS_PICK_P
#undef ROWS_PICK
}


/* y[r] (+)= W[r, :] . x for r in [r0, r1) with P planes of codes (3:
 * pair codes) */
static int
rows_run(ggml_type t, int isa, int P, const uint8_t *w, int64_t wstride,
         int il, int64_t cols, const rows_x *x, float *y, int64_t r0,
         int64_t r1, int accumulate)
{
    rows_fn *f[2];
    qinfo    qi;
    int64_t  nb;

    if (rows_fns(t, isa, P, f) != 0 || qinfo_of(t, &qi) != 0) {
        return -1;
    }
    nb = cols / qi.qk;
    /* groups of 4 rows (aligned: an interleaved matrix's groups), the
     * rows before and after one at a time; each row's output is the same
     * whichever kernel makes it */
    for (int64_t r = r0; r < r1;) {
        int            R = r % 4 == 0 && r + 4 <= r1 ? 4 : 1;
        const uint8_t *row[4];
        float          s[4];
        ptrdiff_t      pfo;

        for (int i = 0; i < R; i++) {
            row[i] = qrow_at(w, wstride, il, qi.qk, qi.bytes, r + i);
        }
        if (il) {
            pfo = rows_pf_ahead();
        } else {
            pfo = r + 16 + R <= r1 ? 16 * wstride : 0;
        }
        f[R == 4](row, il, nb, x, pfo, s);
        for (int i = 0; i < R; i++) {
            y[r + i] = accumulate ? y[r + i] + s[i] : s[i];
        }
        r += R;
    }
    return 0;
}

#endif


int
nalar_quant_q8_rows(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                    int il, int64_t cols, const nalar_xq8 *x8, float *y,
                    int64_t r0, int64_t r1, int accumulate)
{
#if defined(ROWS_X86)
    rows_x x = { { NULL, NULL }, { NULL, NULL }, NULL, NULL };
    int    k = nalar_quant_block(t) == QK_K;

    if (!nalar_quant_type(t) || (k && x8->qk == NULL)) {
        return -1;
    }
    x.q[0] = k ? x8->qk : x8->q;
    x.bs[0] = k ? x8->bs : NULL;
    x.d = k ? x8->dk : x8->d;
    return rows_run(t, isa, 1, w, wstride, il, cols, &x, y, r0, r1,
                    accumulate);
#else
    (void) t;
    (void) isa;
    (void) w;
    (void) wstride;
    (void) il;
    (void) cols;
    (void) x8;
    (void) y;
    (void) r0;
    (void) r1;
    (void) accumulate;
    return -1;
#endif
}


int
nalar_quant_x16_rows(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                     int il, int64_t cols, const nalar_xq16 *x16, float *y,
                     int64_t r0, int64_t r1, int accumulate)
{
#if defined(ROWS_X86)
    rows_x x = { { NULL, NULL }, { NULL, NULL }, NULL, NULL };

    /* the K-quants (Q8_0, Q4_0: cpu_quant_p32.c) */
    if (!nalar_quant_type(t) || nalar_quant_block(t) != QK_K
        || !nalar_quant_x8_fits(t, cols) || x16->hi.qk == NULL)
    {
        return -1;
    }
    x.q[0] = x16->hi.qk;
    x.q[1] = x16->lo.qk;
    x.bs[0] = x16->hi.bs;
    x.bs[1] = x16->lo.bs;
    x.d = x16->hi.dk;
    return rows_run(t, isa, 2, w, wstride, il, cols, &x, y, r0, r1,
                    accumulate);
#else
    (void) t;
    (void) isa;
    (void) w;
    (void) wstride;
    (void) il;
    (void) cols;
    (void) x16;
    (void) y;
    (void) r0;
    (void) r1;
    (void) accumulate;
    return -1;
#endif
}


/* Q4_K, Q5_K and Q6_K (the pairs' own contract) on AVX2 and VNNI */
int
nalar_quant_pairs_rows(ggml_type t, int isa, const uint8_t *w,
                       int64_t wstride, int il, int64_t cols,
                       const nalar_xqp *xp, float *y, int64_t r0, int64_t r1,
                       int accumulate)
{
#if defined(ROWS_X86)
    rows_x x = { { NULL, NULL }, { NULL, NULL }, NULL, NULL };

    if ((t != GGML_Q4_K && t != GGML_Q5_K && t != GGML_Q6_K)
        || xp->ck == NULL || xp->nk == NULL || xp->x16.hi.qk == NULL
        || cols % QK_K != 0)
    {
        return -1;
    }
    x.q[0] = xp->ck;
    x.n = xp->nk;
    x.bs[0] = xp->x16.hi.bs;
    x.bs[1] = xp->x16.lo.bs;
    x.d = xp->x16.hi.dk;
    return rows_run(t, isa, 3, w, wstride, il, cols, &x, y, r0, r1,
                    accumulate);
#else
    (void) t;
    (void) isa;
    (void) w;
    (void) wstride;
    (void) il;
    (void) cols;
    (void) xp;
    (void) y;
    (void) r0;
    (void) r1;
    (void) accumulate;
    return -1;
#endif
}
