/*
 * The 8-bit activations' products of two tokens or more, in tiles
 * (cpu_quant_q8_tiles.c), for nalar_quant_matmul_x8 (cpu_quant_q8.c).
 * Internal to those two files and their tests.
 *
 * Each (row, token) output is the row kernel's bits for that token (the
 * exactness contract at the top of cpu_quant_q8.c: the same integers
 * L[0..7] and I per block, the same float operations in the same order),
 * whatever the tile a token falls in.
 */
#ifndef NALAR_CPU_QUANT_Q8_TILES_H
#define NALAR_CPU_QUANT_Q8_TILES_H

#include <stdint.h>

#include "cpu_quant.h"

/* the most tokens of one tile on isa (NALAR_ISA_AVX2, _AVXVNNI or
 * _VNNI) */
int nalar_quant_x8_tile_max(int isa);

/* the rows of W (type t, rows of cols weights) that one pass of the
 * tiles keeps in cache while every tile of tokens goes over them */
int64_t nalar_quant_x8_tile_rows(ggml_type t, int64_t cols);

/* nalar_quant_matmul_x8's product on isa for any n_tok >= 1, in tiles of
 * up to nalar_quant_x8_tile_max(isa) tokens: 0, or -1 when it cannot
 * (a scalar isa, a build without x86 vectors, no memory for the tiles'
 * scales), and then nothing was written */
int nalar_quant_x8_tiles(ggml_type t, int isa, const uint8_t *w,
                         int64_t wstride, int il, int64_t cols,
                         const nalar_xq8 *x8, int n_tok, float *y, int ldy,
                         int64_t r0, int64_t r1, int accumulate);

#endif
