/*
 * The pair multipliers' Q6_K products (cpu_quant_pairs_k6.c): the pairs
 * mode's own contract for Q6_K, its scalar reference and its dispatch to
 * the kernels (one token: cpu_quant_rows.c; two or more: the tiles,
 * cpu_quant_x16_tiles.c).  Internal to the CPU kernels and their tests.
 */
#ifndef NALAR_CPU_QUANT_PAIRS_K6_H
#define NALAR_CPU_QUANT_PAIRS_K6_H

#include <stdint.h>

#include "cpu_quant.h"

/* the pairs mode's scalar reference: y[tk * ldy + r] (+)= W[r, :] . x_tk
 * for r in [r0, r1), tk in [0, n_tok), x_tk token tk of the codes x' =
 * n * c as x16 holds them (nalar_xqp's x16): Q6_K by the contract at the
 * top of cpu_quant_pairs_k6.c, every other type by the 16-bit one
 * (nalar_quant_x16_scalar); W as nalar_quant_matmul_x16 takes it */
void nalar_quant_pairs_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                              int il, int64_t cols, const nalar_xq16 *x16,
                              int n_tok, float *y, int ldy, int64_t r0,
                              int64_t r1, int accumulate);

/* nalar_quant_matmul_pairs for Q6_K: the reference's bits, through the
 * pair rows (one token), the pairs' tiles (two or more), else the
 * reference */
void nalar_quant_matmul_pairs_k6(const uint8_t *w, int64_t wstride, int il,
                                 int64_t cols, const nalar_xqp *xp,
                                 int n_tok, float *y, int ldy, int64_t r0,
                                 int64_t r1, int accumulate);

#endif
