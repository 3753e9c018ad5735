/*
 * One token's products, four rows at a time (cpu_quant_rows.c): the
 * row kernels of the 8-bit (cpu_quant_q8.c) and 16-bit (cpu_quant_x16.c)
 * activations and of the pair multipliers for a pass of one token
 * (decode), one family over the planes of x's codes, with each
 * contract's integers and float operations per (row, token), so its
 * bits.  Internal to the CPU kernels and their tests.
 */
#ifndef NALAR_CPU_QUANT_ROWS_H
#define NALAR_CPU_QUANT_ROWS_H

#include <stdint.h>

#include "cpu_quant.h"

/*
 * y[r] (+)= W[r, :] . x for r in [r0, r1), x token 0 of x8, on isa
 * (NALAR_ISA_AVX2, _AVXVNNI or _VNNI); W as nalar_quant_matmul_x8 takes
 * it.  Returns 0, or -1 (nothing written) when there is no such kernel
 * for t and isa, or this CPU lacks isa: the caller then runs its row kernels.
 */
int nalar_quant_q8_rows(ggml_type t, int isa, const uint8_t *w,
                        int64_t wstride, int il, int64_t cols,
                        const nalar_xq8 *x8, float *y, int64_t r0,
                        int64_t r1, int accumulate);

/* the same with x token 0 of x16's 16-bit codes, for Q4_K, Q5_K and
 * Q6_K (W as nalar_quant_matmul_x16 takes it): the scalar reference's
 * bits (nalar_quant_x16_scalar); -1 (nothing written) when there is no
 * such kernel for t and isa (Q8_0, Q4_0: cpu_quant_p32.c's products) */
int nalar_quant_x16_rows(ggml_type t, int isa, const uint8_t *w,
                         int64_t wstride, int il, int64_t cols,
                         const nalar_xq16 *x16, float *y, int64_t r0,
                         int64_t r1, int accumulate);

/* the same with x token 0 of xp's pair codes, for Q4_K, Q5_K and Q6_K:
 * the pairs mode's scalar reference's bits for xp->x16
 * (nalar_quant_pairs_scalar: for Q4_K and Q5_K the 16-bit contract's on
 * x', for Q6_K the pairs' own, cpu_quant_pairs_k6.c), its integers made
 * from ck and nk; -1 (nothing written) when there is no such kernel for
 * t and isa (other types; scalar; xp->ck NULL) */
int nalar_quant_pairs_rows(ggml_type t, int isa, const uint8_t *w,
                           int64_t wstride, int il, int64_t cols,
                           const nalar_xqp *xp, float *y, int64_t r0,
                           int64_t r1, int accumulate);

#endif
