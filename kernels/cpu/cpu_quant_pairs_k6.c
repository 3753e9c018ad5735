/*
 * The pair multipliers' Q6_K contract (cpu_quant_pairs.c makes the
 * codes: per 256 values a step D, per pair of values an n in [1, 64] and
 * two int8 codes c, x' = n * c with |x'| <= 8128), its scalar reference
 * and its dispatch.
 *
 * The 16-bit contract (cpu_quant_x16.c) keeps Q6_K's planes apart, t =
 * fmaf(256, (float) L_hi, (float) L_lo) per lane, because a full 16-bit
 * code's lane can pass 2^31; that t is not (float) L where L_lo passes
 * 2^24 (cpu_quant_rows.c's top), so a kernel from c and n, whose integer
 * is L, could not give it without the planes' products too.  With
 * |x'| <= 8128 the lane fits int32, so the pairs mode has its own Q6_K
 * contract, per block b (w_i in [0, 63] the 6-bit codes, the -32 taken
 * back by the min term; sc_j the int8 scale of sub-block j of 16
 * weights; s = d_w * D_b, d_w the block's f16 scale):
 *   L[m] = sum_G sc_{2G + m / 4} sum_{k < 4} w_i x'_i, i = 32 G + 4 m + k
 *     (the 8-bit contract's lanes, cpu_quant_q8.c, on x'): exact in
 *     int32, |L| <= 8 * 4 * 128 * 63 * 8128 = 2,097,414,144 < 2^31, and
 *     every partial sum a kernel makes is a sum of some of its terms, so
 *     below that too;
 *   I = 32 * sum_j sc_j * S_j, S_j the sum of sub-block j's 16 x': its
 *     float (float) I, I exact (|I| <= 32 * 16 * 128 * 16 * 8128 =
 *     8,522,825,728: int64 here); the kernels make it as 32.0f * (float)
 *     J, J = I / 32 in int32 (|J| <= 266,338,304, from x16's planes'
 *     sums of 16 as 256 J_hi + J_lo), the same float: a product by 2^5
 *     is exact and commutes with rounding to float;
 *   acc[m] = fma(s, (float) L[m], acc[m]), mn = fma(s, (float) I, mn)
 *     over the blocks in order, from 0; y = hsum8(acc) - mn (hsum8 the
 *     8-bit contract's).
 * So the pair rows (cpu_quant_rows.c: the lanes from c with sc * n, one
 * plane), the pairs' tiles (cpu_quant_x16_tiles.c: the lanes from the
 * full codes x' as int16, the planes folded in integer) and the reference
 * give the same bits, and each (row, token) output is one function of
 * that row and that token's codes, whatever the batch, its chunking, the
 * threads' split of the rows or the instruction set.  The other types'
 * pairs contract is the 16-bit one on x'.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_pairs_k6.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "cpu_quant_x16_tiles.h"


/* one row against one token's codes x' (hi, lo: its planes per 256; d:
 * its scales per 256), nb blocks */
static float
k6_row_scalar(const uint8_t *row, int il, int64_t nb, const int8_t *hi,
              const int8_t *lo, const float *d)
{
    float acc[8] = { 0 }, mn = 0;
    int   w[QK_K], sc[64];

    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + qoff_at(il, QK_K, QK6_K_BYTES, b);
        const int8_t  *h = hi + b * QK_K, *l = lo + b * QK_K;
        int64_t        L[8] = { 0 }, I = 0;
        float          s = f16_at(p + 208) * d[b];

        q8_scalar_codes(GGML_Q6_K, p, w, sc);
        for (int i = 0; i < QK_K; i++) {
            int64_t x = 256 * h[i] + l[i];      /* x' */

            L[i % 32 / 4] += (int64_t) sc[i / 32 * 8 + i % 32 / 4] * w[i] * x;
            I += 32 * (int8_t) p[192 + i / 16] * x;
        }
        mn = fmaf(s, (float) I, mn);
        for (int m = 0; m < 8; m++) {
            acc[m] = fmaf(s, (float) L[m], acc[m]);
        }
    }
    return q8_hsum8_s(acc) - mn;
}


void
nalar_quant_pairs_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                         int il, int64_t cols, const nalar_xq16 *x16,
                         int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
                         int accumulate)
{
    if (t != GGML_Q6_K) {
        nalar_quant_x16_scalar(t, w, wstride, il, cols, x16, n_tok, y, ldy,
                               r0, r1, accumulate);
        return;
    }
    if (!nalar_quant_x8_fits(t, cols) || x16->hi.qk == NULL) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = qrow_at(w, wstride, il, QK_K, QK6_K_BYTES, r);

        for (int64_t tk = 0; tk < n_tok; tk++) {
            float  s = k6_row_scalar(row, il, cols / QK_K,
                                     x16->hi.qk + tk * cols,
                                     x16->lo.qk + tk * cols,
                                     x16->hi.dk + tk * (cols / QK_K));
            float *yp = &y[tk * ldy + r];

            *yp = accumulate ? *yp + s : s;
        }
    }
}


void
nalar_quant_matmul_pairs_k6(const uint8_t *w, int64_t wstride, int il,
                            int64_t cols, const nalar_xqp *xp, int n_tok,
                            float *y, int ldy, int64_t r0, int64_t r1,
                            int accumulate)
{
    static const x16_kernels pairs = { nalar_quant_pairs_rows,
                                       nalar_quant_pairs_tiles,
                                       nalar_quant_pairs_scalar };

    if (!nalar_quant_x8_fits(GGML_Q6_K, cols) || xp->x16.hi.qk == NULL) {
        return;
    }
    nalar_quant_x16_dispatch(&pairs, GGML_Q6_K, w, wstride, il, cols, xp,
                             n_tok, y, ldy, r0, r1, accumulate);
}
