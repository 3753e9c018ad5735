/*
 * RMSNorm: out[i] = x[r][:] * w / sqrt(mean(x[r]^2) + eps)
 *   x: rows of `dim` floats at stride ld_x; out: stride ld_out
 *   rows: (n) indices of the x rows to normalise (NULL: rows 0..n-1); the
 *         i-th result goes to out row i (the final norm gathers the rows
 *         that want logits this way)
 */
#ifndef NALAR_CUDA_NORM_CUH
#define NALAR_CUDA_NORM_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_rmsnorm(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                       const float *x, int64_t ld_x, const int32_t *rows,
                       int32_t n, const float *w, int32_t dim, float eps,
                       nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
