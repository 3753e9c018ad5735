/*
 * One token's products with 8-bit activations, four rows at a time
 * (cpu_quant_q8_rows.c): the row kernels of cpu_quant_q8.c for a pass
 * of one token (decode), with the same integers and the same float
 * operations per (row, token), so the same bits.  Internal to the CPU
 * kernels.
 */
#ifndef NALAR_CPU_QUANT_Q8_ROWS_H
#define NALAR_CPU_QUANT_Q8_ROWS_H

#include <stdint.h>

#include "cpu_quant.h"

/*
 * y[r] (+)= W[r, :] . x for r in [r0, r1), x token 0 of x8, on isa
 * (NALAR_ISA_AVX2 or NALAR_ISA_VNNI); W as nalar_quant_matmul_x8 takes
 * it.  Returns 0, or -1 (nothing written) when there is no such kernel
 * for t and isa: the caller then runs its row kernels.
 */
int nalar_quant_q8_rows(ggml_type t, int isa, const uint8_t *w,
                        int64_t wstride, int il, int64_t cols,
                        const nalar_xq8 *x8, float *y, int64_t r0,
                        int64_t r1, int accumulate);

#endif
