/*
 * CPU kernels over block-quantized weights with 16-bit activations (an
 * engine's opt-in mode, cpu_quant.h), on the 8-bit kernels' machinery
 * (cpu_quant_q8.c): each 16-bit code of x split into two signed bytes,
 * so that every product is two 8-bit products sharing the weights'
 * decode.  Here: x's codes, the K-quants' scalar reference and the
 * dispatch; the K-quants' kernels for one token four rows at a time
 * (cpu_quant_rows.c) and for tiles of tokens (cpu_quant_x16_tiles.c),
 * for AVX-512 VNNI and AVX2, chosen at run time as the 8-bit kernels are
 * (nalar_quant_q8_isa).  Q8_0 and Q4_0 follow cpu_quant_p32.c's contract
 * (its scalar reference, its kernels on the weights in panels of 16
 * rows), on the codes per 32 made here.
 *
 * x's codes: the 8-bit codes' groups (per 32 for Q8_0 and Q4_0, per 256
 * for the K-quants), d = amax / 32639 per group (amax = max |x|), code =
 * round-to-nearest-even(x * (32639 / amax)) clamped to [-32639, 32639]
 * (0 codes and d = 0 for an all-zero group).  Split:
 *   hi = (code + 128) >> 8 (arithmetic),  lo = code - 256 * hi,
 * so hi is in [-127, 127], lo in [-128, 127].  The two planes are laid
 * out exactly as the 8-bit codes (nalar_xq16: two nalar_xq8 sharing d
 * and dk), each with its own sums of 16 codes, so an 8-bit kernel's x
 * loads read either plane.
 *
 * Exactness, the K-quants.  Per block, L_p[m] is the 8-bit contract's
 * lane m (cpu_quant_q8.c's header) computed with plane p's codes, and:
 *   Q4_K, Q5_K:  L[m] = 256 * L_hi[m] + L_lo[m], exact in int32 (Q5_K,
 *     the larger: |L| <= 32 * 63 * 31 * (127 * 256 + 128) < 2^31), so a
 *     kernel may fold the planes in integer in any order;
 *   Q6_K (|L| can pass 2^31):  t[m] = fmaf(256.0f, (float) L_hi[m],
 *     (float) L_lo[m]), in place of (float) L[m] below.
 * Then acc[m] = fma(s, (float) L[m], acc[m]) over the blocks in order,
 * from 0, s = d_w * d_x, as the 8-bit contract.  The min terms:
 *   Q4_K, Q5_K:  I = sum_j m_j * (sum of sub-block j's 32 16-bit codes)
 *     = 256 * I_hi + I_lo (I_p the 8-bit min term of plane p), exact in
 *     int32 (|I| <= 8 * 63 * 32 * 32639 < 2^31); mn = fma(dmin * d_x,
 *     (float) I, mn);
 *   Q6_K:  I_p = 32 * sum_j sc_j * (sum of plane p's 16 codes of
 *     sub-block j), mn = fma(s, fmaf(256.0f, (float) I_hi,
 *     (float) I_lo), mn);
 * over the blocks in order, from 0; y = hsum8(acc) - mn, hsum8 the 8-bit
 * contract's.  So every path (the scalar reference, AVX2, VNNI; rows and
 * tiles) gives the same bits, and each (row, token) output is one
 * function of that row and that token's codes: bit-identical whatever
 * the batch, its chunking, the threads' split of the rows or the
 * instruction set.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_p32.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_x16.h"
#include "cpu_quant_x16_tiles.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define X16_MAX 32639   /* the largest code: 127 * 256 + 127 */

/* ------------------------------------------------------------------ */
/* x's codes                                                            */


/* a 16-bit code's two bytes */
static inline void
x16_split(int32_t c, int8_t *hi, int8_t *lo)
{
    int32_t h = (c + 128) >> 8;

    *hi = (int8_t) h;
    *lo = (int8_t) (c - 256 * h);
}


/* n floats as 16-bit codes per g (32 or 256), split into the planes hi
 * and lo: d = amax / 32639 per group, codes round(x * (32639 / amax)) to
 * nearest even, clamped to [-32639, 32639] (with AVX2 the same values,
 * eight at a time: vcvtps2dq rounds as lrintf does, a NaN's code is the
 * clamp's -32639 either way, and the packs see only bytes' values) */
static void
x16_groups(const float *x, int64_t n, int g, int8_t *hi, int8_t *lo,
           float *d)
{
    for (int64_t b = 0; b < n / g; b++) {
        const float *xb = x + b * g;
        float        amax = 0, id;
        int64_t      i0 = b * g;
        int          i = 0;

#if defined(__AVX2__)
        {
            __m256 sgn = _mm256_set1_ps(-0.0f), m8 = _mm256_setzero_ps();
            __m128 h;

            for (int k = 0; k < g; k += 8) {
                /* a > m ? a : m, as the scalar loop: a NaN never enters */
                m8 = _mm256_max_ps(_mm256_andnot_ps(sgn,
                                                    _mm256_loadu_ps(xb + k)),
                                   m8);
            }
            h = _mm_max_ps(_mm256_castps256_ps128(m8),
                           _mm256_extractf128_ps(m8, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
            amax = _mm_cvtss_f32(h);
        }
#else
        for (int k = 0; k < g; k++) {
            float a = fabsf(xb[k]);

            amax = a > amax ? a : amax;
        }
#endif
        d[b] = amax / (float) X16_MAX;
        id = amax > 0 ? (float) X16_MAX / amax : 0;
#if defined(__AVX2__)
        {
            const __m256  vi = _mm256_set1_ps(id);
            const __m256i mx = _mm256_set1_epi32(X16_MAX);
            const __m256i mn = _mm256_set1_epi32(-X16_MAX);
            const __m256i h8 = _mm256_set1_epi32(128);
            const __m256i pm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);

            for (; i < g; i += 32) {
                __m256i h[4], l[4], ph, pl;

                for (int k = 0; k < 4; k++) {
                    __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(
                                    _mm256_loadu_ps(xb + i + 8 * k), vi));

                    c = _mm256_min_epi32(_mm256_max_epi32(c, mn), mx);
                    h[k] = _mm256_srai_epi32(_mm256_add_epi32(c, h8), 8);
                    l[k] = _mm256_sub_epi32(c, _mm256_slli_epi32(h[k], 8));
                }
                ph = _mm256_packs_epi16(_mm256_packs_epi32(h[0], h[1]),
                                        _mm256_packs_epi32(h[2], h[3]));
                pl = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]),
                                        _mm256_packs_epi32(l[2], l[3]));
                _mm256_storeu_si256((__m256i *) (hi + i0 + i),
                                    _mm256_permutevar8x32_epi32(ph, pm));
                _mm256_storeu_si256((__m256i *) (lo + i0 + i),
                                    _mm256_permutevar8x32_epi32(pl, pm));
            }
        }
#endif
        for (; i < g; i++) {
            long v = lrintf(xb[i] * id);

            /* a NaN's lrintf is outside the range, as vcvtps2dq's */
            if (!(v >= -X16_MAX && v <= X16_MAX)) {
                v = v > 0 ? X16_MAX : -X16_MAX;
            }
            x16_split((int32_t) v, hi + i0 + i, lo + i0 + i);
        }
    }
}


void
nalar_quant_x16_groups(const float *x, int64_t n, int g, int8_t *hi,
                       int8_t *lo, float *d)
{
    x16_groups(x, n, g, hi, lo, d);
}


int64_t
nalar_quant_x16_bytes(int n_tok, int64_t cols)
{
    /* per plane: codes per 32, codes per 256, the sums of 16; the scales
     * per 32 and per 256 once; alignment */
    return (int64_t) n_tok * (2 * (cols + cols + cols / 16 * 4)
                              + cols / 32 * 4 + cols / QK_K * 4) + 8 * 32;
}


static uint8_t *
align32(uint8_t *p)
{
    return (uint8_t *) (((uintptr_t) p + 31) & ~(uintptr_t) 31);
}


uint8_t *
nalar_quant_x16_layout(void *buf, int n_tok, int64_t cols, int k,
                       nalar_xq16 *x16)
{
    uint8_t  *p = align32(buf);
    int64_t   nc = (int64_t) n_tok * cols;

    for (int pl = 0; pl < 2; pl++) {
        nalar_xq8 *v = pl ? &x16->lo : &x16->hi;

        v->q = (int8_t *) p;
        p = align32(p + nc);
        v->qk = NULL;
        v->bs = NULL;
        v->dk = NULL;
        v->cols = cols;
    }
    x16->hi.d = x16->lo.d = (float *) p;
    p = align32(p + (int64_t) n_tok * (cols / 32) * 4);
    if (k) {
        for (int pl = 0; pl < 2; pl++) {
            nalar_xq8 *v = pl ? &x16->lo : &x16->hi;

            v->qk = (int8_t *) p;
            p = align32(p + nc);
            v->bs = (int32_t *) p;
            p = align32(p + (int64_t) n_tok * (cols / 16) * 4);
        }
        x16->hi.dk = x16->lo.dk = (float *) p;
        p = align32(p + (int64_t) n_tok * (cols / QK_K) * 4);
    }
    return p;
}


void
nalar_quant_x16(const float *x, int n_tok, int ldx, int64_t cols, void *buf,
                nalar_xq16 *x16)
{
    int       k = cols % QK_K == 0;
    int8_t   *q[2], *qk[2];
    int32_t  *bs[2];
    float    *d, *dk;

    (void) nalar_quant_x16_layout(buf, n_tok, cols, k, x16);
    /* the arrays just laid out in buf, written through */
    q[0] = (int8_t *) x16->hi.q;
    q[1] = (int8_t *) x16->lo.q;
    qk[0] = (int8_t *) x16->hi.qk;
    qk[1] = (int8_t *) x16->lo.qk;
    bs[0] = (int32_t *) x16->hi.bs;
    bs[1] = (int32_t *) x16->lo.bs;
    d = (float *) x16->hi.d;
    dk = (float *) x16->hi.dk;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (int64_t) t * ldx;
        int64_t      o = (int64_t) t * cols;

        x16_groups(xt, cols, 32, q[0] + o, q[1] + o, d + t * (cols / 32));
        if (k) {
            x16_groups(xt, cols, QK_K, qk[0] + o, qk[1] + o,
                       dk + t * (cols / QK_K));
            for (int pl = 0; pl < 2; pl++) {
                q8_sums16(qk[pl] + o, cols, bs[pl] + t * (cols / 16));
            }
        }
    }
}


/* ------------------------------------------------------------------ */
/* scalar reference                                                     */


/* one token's planes of codes per 256, as the K-quants read them */
typedef struct {
    const int8_t  *q[2];    /* hi, lo */
    const int32_t *bs[2];   /* each plane's sums of 16 */
    const float   *d;       /* the codes' scales */
} x16_tok;


static x16_tok
x16_token(const nalar_xq16 *x16, int64_t cols, int64_t tk)
{
    x16_tok x;

    for (int pl = 0; pl < 2; pl++) {
        const nalar_xq8 *v = pl ? &x16->lo : &x16->hi;

        x.q[pl] = v->qk + tk * cols;
        x.bs[pl] = v->bs + tk * (cols / 16);
    }
    x.d = x16->hi.dk + tk * (cols / QK_K);
    return x;
}


/* one row of a K-quant against one token's codes, by the contract (the
 * file's top) */
static float
row_scalar(ggml_type t, const uint8_t *row, int il, int64_t nb,
           const x16_tok *x)
{
    qinfo qi = { 0, 0, 0, 0 };
    float acc[8] = { 0 }, mn = 0;
    int   w[QK_K], sc[64];

    (void) qinfo_of(t, &qi);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + qoff_at(il, qi.qk, qi.bytes, b);
        int32_t        Lh[8], Ll[8];
        float          s, lane[8];

        q8_scalar_codes(t, p, w, sc);
        q8_scalar_lanes((int) qi.qk, w, sc, x->q[0] + b * qi.qk, Lh);
        q8_scalar_lanes((int) qi.qk, w, sc, x->q[1] + b * qi.qk, Ll);
        for (int m = 0; m < 8; m++) {
            lane[m] = t == GGML_Q6_K
                      ? fmaf(256.0f, (float) Lh[m], (float) Ll[m])
                      : (float) (256 * Lh[m] + Ll[m]);
        }
        switch (t) {
        case GGML_Q4_K:
        case GGML_Q5_K: {
            int32_t I = 256 * q8_k4_min_term(p, x->bs[0] + 16 * b)
                        + q8_k4_min_term(p, x->bs[1] + 16 * b);

            s = f16_at(p) * x->d[b];
            mn = fmaf(f16_at(p + 2) * x->d[b], (float) I, mn);
            break;
        }
        default: {   /* GGML_Q6_K */
            float Ih = (float) q8_k6_min_term(p, x->bs[0] + 16 * b);
            float Il = (float) q8_k6_min_term(p, x->bs[1] + 16 * b);

            s = f16_at(p + 208) * x->d[b];
            mn = fmaf(s, fmaf(256.0f, Ih, Il), mn);
            break;
        }
        }
        for (int m = 0; m < 8; m++) {
            acc[m] = fmaf(s, lane[m], acc[m]);
        }
    }
    return q8_hsum8_s(acc) - mn;
}


void
nalar_quant_x16_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                       int il, int64_t cols, const nalar_xq16 *x16,
                       int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    qinfo qi;

    /* Q8_0, Q4_0: cpu_quant_p32.c's contract and reference */
    if (nalar_quant_p32_type(t)) {
        nalar_quant_p32_scalar(t, w, wstride, il, cols, x16, n_tok, y, ldy,
                               r0, r1, accumulate);
        return;
    }
    if (qinfo_of(t, &qi) != 0 || qi.qk != QK_K
        || !nalar_quant_x8_fits(t, cols) || x16->hi.qk == NULL)
    {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = qrow_at(w, wstride, il, qi.qk, qi.bytes, r);

        for (int64_t tk = 0; tk < n_tok; tk++) {
            x16_tok xt = x16_token(x16, cols, tk);
            float   s = row_scalar(t, row, il, cols / qi.qk, &xt);
            float  *yp = &y[tk * ldy + r];

            *yp = accumulate ? *yp + s : s;
        }
    }
}


/* ------------------------------------------------------------------ */
/* dispatch                                                             */


/* tokens s, s + 1, .. of xp's codes, as codes of their own (the arrays
 * a layout lacks, NULL, stay NULL) */
static nalar_xqp
xqp_window(const nalar_xqp *xp, int64_t s, int64_t cols)
{
    nalar_xqp v = *xp;

    for (int pl = 0; pl < 2; pl++) {
        nalar_xq8 *p = pl ? &v.x16.lo : &v.x16.hi;

        if (p->q != NULL) {
            p->q += s * cols;
            p->d += s * (cols / 32);
        }
        if (p->qk != NULL) {
            p->qk += s * cols;
            p->dk += s * (cols / QK_K);
            p->bs += s * (cols / 16);
        }
    }
    if (v.ck != NULL) {
        v.ck += s * cols;
        v.nk += s * (cols / 2);
    }
    return v;
}


void
nalar_quant_x16_dispatch(const x16_kernels *k, ggml_type t,
                         const uint8_t *w, int64_t wstride, int il,
                         int64_t cols, const nalar_xqp *xp, int n_tok,
                         float *y, int ldy, int64_t r0, int64_t r1,
                         int accumulate)
{
    int isa = nalar_quant_q8_isa();
    int tk = 0;

    /* one token: four rows at a time (cpu_quant_rows.c); two or
     * more: the tiles (cpu_quant_x16_tiles.c); else, or where those
     * cannot run, the scalar reference: all the same bits */
    if (n_tok == 1
        && k->rows(t, isa, w, wstride, il, cols, xp, y, r0, r1,
                   accumulate) == 0)
    {
        return;
    }
    if (n_tok > 1
        && k->tiles(t, isa, w, wstride, il, cols, &xp->x16, n_tok, y, ldy,
                    r0, r1, accumulate) == 0)
    {
        return;
    }
    /* where the tiles cannot run: the rows kernels a token at a time
     * (each token's codes seen as one token's), the same bits */
    for (; n_tok > 1 && tk < n_tok; tk++) {
        nalar_xqp v = xqp_window(xp, tk, cols);

        if (k->rows(t, isa, w, wstride, il, cols, &v,
                    y + (int64_t) tk * ldy, r0, r1, accumulate) != 0)
        {
            break;
        }
    }
    if (tk < n_tok) {
        nalar_xqp v = xqp_window(xp, tk, cols);

        k->scalar(t, w, wstride, il, cols, &v.x16, n_tok - tk,
                  y + (int64_t) tk * ldy, ldy, r0, r1, accumulate);
    }
}


/* the 16-bit rows kernels on the codes of xp's x16 */
static int
x16_rows_of(ggml_type t, int isa, const uint8_t *w, int64_t wstride, int il,
            int64_t cols, const nalar_xqp *xp, float *y, int64_t r0,
            int64_t r1, int accumulate)
{
    return nalar_quant_x16_rows(t, isa, w, wstride, il, cols, &xp->x16, y,
                                r0, r1, accumulate);
}


void
nalar_quant_matmul_x16(ggml_type t, const uint8_t *w, int64_t wstride,
                       int il, int64_t cols, const nalar_xq16 *x16,
                       int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    static const x16_kernels own = { x16_rows_of, nalar_quant_x16_tiles,
                                     nalar_quant_x16_scalar };
    nalar_xqp xp = { *x16, NULL, NULL };

    /* Q8_0, Q4_0: cpu_quant_p32.c's products; the K-quants: the rows,
     * the tiles and the reference here */
    if (nalar_quant_p32_type(t)) {
        nalar_quant_p32_matmul(t, w, wstride, il, cols, x16, n_tok, y, ldy,
                               r0, r1, accumulate);
        return;
    }
    nalar_quant_x16_dispatch(&own, t, w, wstride, il, cols, &xp, n_tok, y,
                             ldy, r0, r1, accumulate);
}
