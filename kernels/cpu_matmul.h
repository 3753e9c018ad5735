/*
 * CPU matrix products over F32/F16/BF16/Q8_0 weights with F32 activations.
 *
 * y[t, r] = sum_c W[r, c] * x[t, c]  (+ y[t, r] when accumulate)
 * for rows r in [r0, r1) and tokens t in [0, n_tok).
 *   W: nalar_mat (rows, cols), rows contiguous
 *   x: (n_tok, ldx) floats, y: (n_tok, ldy) floats
 *
 * Batch invariance: every output element is computed by the same sequence
 * of operations (16-lane FMA accumulation over columns in order, masked
 * tail, then one fixed horizontal reduction), whatever tile it falls in.
 * So a sequence's numbers do not depend on what else is in the batch or on
 * how its prompt was chunked.
 */
#ifndef NALAR_CPU_MATMUL_H
#define NALAR_CPU_MATMUL_H

#include <stdint.h>

#include "model.h"

void nalar_cpu_matmul(const nalar_mat *W, const float *x, int n_tok, int ldx,
                      float *y, int ldy, int64_t r0, int64_t r1,
                      int accumulate);

/* out[c] = W[row, c] as float (embedding lookup), c in [0, cols) */
void nalar_cpu_get_row(const nalar_mat *W, int64_t row, float *out);

#endif
