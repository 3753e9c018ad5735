/*
 * The 16-bit activations' kernels (cpu_quant_x16.c: x's codes, the
 * scalar reference, the dispatch; cpu_quant_rows.c: one token, four
 * rows at a time, declared in cpu_quant_rows.h).  Each (row, token)
 * output is the scalar reference's bits for that row and token (the
 * contract at the top of cpu_quant_x16.c; Q8_0 and Q4_0 cpu_quant_p32.c's),
 * whichever kernel makes it.  Internal to the CPU kernels and their tests.
 */
#ifndef NALAR_CPU_QUANT_X16_H
#define NALAR_CPU_QUANT_X16_H

#include <stdint.h>

#include "cpu_quant.h"
#include "cpu_quant_rows.h"

/* the scalar reference: y[tk * ldy + r] (+)= W[r, :] . x_tk for r in
 * [r0, r1), tk in [0, n_tok), x_tk token tk of x16's codes; W as
 * nalar_quant_matmul_x16 takes it (cols fitting, nalar_quant_x8_fits);
 * Q8_0 and Q4_0 nalar_quant_p32_scalar's */
void nalar_quant_x16_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const nalar_xq16 *x16,
                            int n_tok, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* one token's n values (a multiple of g) as 16-bit codes per g (32 or
 * 256): the planes hi and lo and the scales d, nalar_quant_x16's bytes
 * for that grouping */
void nalar_quant_x16_groups(const float *x, int64_t n, int g, int8_t *hi,
                            int8_t *lo, float *d);

/* the kernels of one contract over x16's codes (the 16-bit mode's; the
 * pairs' Q6_K, cpu_quant_pairs_k6.c), each the contract's scalar
 * reference's bits: one token's rows (four at a time, cpu_quant_rows.c)
 * and the tiles of two tokens or more (cpu_quant_x16_tiles.c), each 0, or
 * -1 with nothing written where it cannot run; and that reference */
typedef struct {
    int  (*rows)(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                 int il, int64_t cols, const nalar_xqp *xp, float *y,
                 int64_t r0, int64_t r1, int accumulate);
    int  (*tiles)(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                  int il, int64_t cols, const nalar_xq16 *x, int n_tok,
                  float *y, int ldy, int64_t r0, int64_t r1,
                  int accumulate);
    void (*scalar)(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                   int64_t cols, const nalar_xq16 *x16, int n_tok, float *y,
                   int ldy, int64_t r0, int64_t r1, int accumulate);
} x16_kernels;

/* y[tk * ldy + r] (+)= W[r, :] . x_tk as nalar_quant_matmul_x16 makes it,
 * by k's kernels on this CPU's instruction set: one token, k->rows; two
 * or more, k->tiles; where those cannot run, k->rows a token at a time,
 * then k->scalar for the tokens left (xp's x16 the codes, its ck and nk
 * for k->rows only) */
void nalar_quant_x16_dispatch(const x16_kernels *k, ggml_type t,
                              const uint8_t *w, int64_t wstride, int il,
                              int64_t cols, const nalar_xqp *xp, int n_tok,
                              float *y, int ldy, int64_t r0, int64_t r1,
                              int accumulate);

/* nalar_quant_x16's layout of n_tok tokens of cols in buf (its arrays
 * 32-byte aligned, nalar_quant_x16_bytes long; the codes per 256 and their
 * sums only when k), *x16 pointed into it, no code made: the first byte
 * after them.  Shared with the pair codes (cpu_quant_pairs.c), which lay
 * x' = n * c out the same way and add their own arrays after. */
uint8_t *nalar_quant_x16_layout(void *buf, int n_tok, int64_t cols, int k,
                                nalar_xq16 *x16);

#endif
