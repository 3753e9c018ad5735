/*
 * The 16-bit activations' products of two tokens or more over the
 * K-quants (Q4_K, Q5_K, Q6_K), in tiles (cpu_quant_x16_tiles.c), for
 * nalar_quant_matmul_x16 (cpu_quant_x16.c; Q8_0 and Q4_0 go to
 * cpu_quant_p32.c).  Internal to those two files and their tests.
 *
 * Each (row, token) output is the scalar reference's bits for that token
 * (the exactness contract at the top of cpu_quant_x16.c: the same
 * integers per block, the same float operations in the same order),
 * whatever the tile a token falls in.
 */
#ifndef NALAR_CPU_QUANT_X16_TILES_H
#define NALAR_CPU_QUANT_X16_TILES_H

#include <stdint.h>

#include "cpu_quant.h"


/* the most tokens of one tile of K-quant t on isa (NALAR_ISA_AVX2,
 * _AVXVNNI or _VNNI) */
int nalar_quant_x16_tile_max(ggml_type t, int isa);

/* the 16-bit mode's product on isa for any n_tok >= 1, in tiles of up to
 * nalar_quant_x16_tile_max(t, isa) tokens: 0, or -1 when it cannot (a
 * type other than the K-quants, a scalar isa, a build without x86
 * vectors, no memory for the tiles' codes and scales), and then nothing
 * was written */
int nalar_quant_x16_tiles(ggml_type t, int isa, const uint8_t *w,
                          int64_t wstride, int il, int64_t cols,
                          const nalar_xq16 *x, int n_tok, float *y, int ldy,
                          int64_t r0, int64_t r1, int accumulate);

/* the pairs mode's tiles (x: nalar_xqp's x16, the codes x' = n * c):
 * for Q6_K the pairs' own contract (cpu_quant_pairs_k6.c: the lanes of
 * x' in int32, the planes folded), the reference nalar_quant_pairs_scalar's
 * bits; Q4_K and Q5_K as nalar_quant_x16_tiles; 0 or -1 as it */
int nalar_quant_pairs_tiles(ggml_type t, int isa, const uint8_t *w,
                            int64_t wstride, int il, int64_t cols,
                            const nalar_xq16 *x, int n_tok, float *y,
                            int ldy, int64_t r0, int64_t r1, int accumulate);

/* the most tokens of one of those tiles */
int nalar_quant_pairs_tile_max(ggml_type t, int isa);

#endif
