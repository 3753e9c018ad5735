/*
 * The 16-bit activations' kernels (cpu_quant_x16.c: x's codes, the
 * scalar reference, the dispatch; cpu_quant_rows.c: one token, four
 * rows at a time, declared in cpu_quant_rows.h).  Each (row, token)
 * output is the scalar reference's bits for that row and token (the
 * contract at the top of cpu_quant_x16.c), whichever kernel makes it.  Internal to the CPU
 * kernels and their tests.
 */
#ifndef NALAR_CPU_QUANT_X16_H
#define NALAR_CPU_QUANT_X16_H

#include <stdint.h>

#include "cpu_quant.h"
#include "cpu_quant_rows.h"

/* the scalar reference: y[tk * ldy + r] (+)= W[r, :] . x_tk for r in
 * [r0, r1), tk in [0, n_tok), x_tk token tk of x16's codes; W as
 * nalar_quant_matmul_x16 takes it (cols fitting, nalar_quant_x8_fits) */
void nalar_quant_x16_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const nalar_xq16 *x16,
                            int n_tok, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* one token's n values (a multiple of g) as 16-bit codes per g (32 or
 * 256): the planes hi and lo and the scales d, nalar_quant_x16's bytes
 * for that grouping */
void nalar_quant_x16_groups(const float *x, int64_t n, int g, int8_t *hi,
                            int8_t *lo, float *d);

/* nalar_quant_x16's layout of n_tok tokens of cols in buf (its arrays
 * 32-byte aligned, nalar_quant_x16_bytes long; the codes per 256 and their
 * sums only when k), *x16 pointed into it, no code made: the first byte
 * after them.  Shared with the pair codes (cpu_quant_pairs.c), which lay
 * x' = n * c out the same way and add their own arrays after. */
uint8_t *nalar_quant_x16_layout(void *buf, int n_tok, int64_t cols, int k,
                                nalar_xq16 *x16);

#endif
