/*
 * The 16-bit activations' products over Q8_0 and Q4_0 weights (the
 * `i16` mode's, and the `pairs` mode's, which takes i16's codes per 32),
 * on the weights laid out in panels of 16 rows (cpu_quant_p32.c: the
 * contract, the layout, the scalar reference and the kernels).
 * Internal to the CPU kernels and their tests.
 */
#ifndef NALAR_CPU_QUANT_P32_H
#define NALAR_CPU_QUANT_P32_H

#include <stdint.h>

#include "cpu_quant.h"

#define P32_ROWS 16     /* rows of a panel */
#define P32_IL   2      /* the layout's il, beside 0 and 1 (cpu_quant.h) */

/* 1 when t is a type these products take (Q8_0, Q4_0) */
int nalar_quant_p32_type(ggml_type t);

/* bytes of a matrix of rows x cols of t laid out in panels (rows
 * rounded up to a multiple of P32_ROWS) */
int64_t nalar_quant_p32_bytes(ggml_type t, int64_t rows, int64_t cols);

/* the matrix at src (layout il 0 or 1, rows wstride bytes apart) into
 * dst in panels; a last panel's missing rows get zero scales and codes */
void nalar_quant_p32_pack(ggml_type t, const uint8_t *src, int64_t wstride,
                          int il, int64_t rows, int64_t cols, uint8_t *dst);

/* the panels at src back into dst in layout il (0 or 1; wstride a row's
 * bytes), as nalar_quant_interleave or the file lays them out */
void nalar_quant_p32_unpack(ggml_type t, const uint8_t *src, int64_t rows,
                            int64_t cols, int il, int64_t wstride,
                            uint8_t *dst);

/* row r's block b of the panels at w, as the file holds it (bytes of
 * one block into blk) */
void nalar_quant_p32_block(ggml_type t, const uint8_t *w, int64_t cols,
                           int64_t r, int64_t b, uint8_t *blk);

/* y[tk * ldy + r] (+)= W[r, :] . x_tk for r in [r0, r1), by the
 * contract (cpu_quant_p32.c), W in layout il (0, 1, or P32_IL: then
 * wstride is not read); the kernels of the CPU's instruction set where
 * W is in panels, else the scalar reference */
void nalar_quant_p32_matmul(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const nalar_xq16 *x16,
                            int n_tok, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* the scalar reference, any layout */
void nalar_quant_p32_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const nalar_xq16 *x16,
                            int n_tok, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* the kernels of one instruction set (NALAR_ISA_VNNI, NALAR_ISA_AVX2) on
 * panels: 0, or -1 with nothing written where it cannot run (the CPU
 * lacks it) */
int nalar_quant_p32_kernel(int isa, ggml_type t, const uint8_t *w,
                           int64_t cols, const nalar_xq16 *x16, int n_tok,
                           float *y, int ldy, int64_t r0, int64_t r1,
                           int accumulate);

#endif
