/*
 * BF16 projections of 1..NALAR_CUDA_MMA_MAX tokens on tensor cores:
 *   y[t][r] (+)= sum_c W[r][c] * x[t][c]
 * with W BF16 (rows, cols), cols a multiple of 8 and 16-byte-aligned rows,
 * x FP32 (n_tok, ldx) with ldx a multiple of 4 and 16-byte aligned.
 *
 * Each activation is split into two BF16 halves, x = hi + lo (hi = x
 * rounded, lo = the rest rounded), so the products keep about 16
 * significant bits of x where a BF16 activation keeps 8; the weights are
 * exact.  Every weight is read once for all the pass's tokens.  A row's
 * sums run over the same columns in the same order whatever n_tok, so a
 * token's result does not depend on the pass's size (nalar_cuda_mm_path
 * gives every pass of 1..16 tokens to this kernel when it is on).
 * Needs sm_80 or later.
 */
#ifndef NALAR_CUDA_GEMV_MMA_CUH
#define NALAR_CUDA_GEMV_MMA_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_gemv_mma(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                        const float *x, int64_t ldx, int32_t n_tok, float *y,
                        int64_t ldy, int accumulate, nalar_err *err);

/* whether W and x can take the MMA kernel (type, shape, alignment) */
int nalar_cuda_gemv_mma_fits(const nalar_cuda_mat *W, const float *x,
                             int64_t ldx);

#ifdef __cplusplus
}
#endif

#endif
