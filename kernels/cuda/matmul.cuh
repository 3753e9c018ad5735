/*
 * Projections: y[t][r] (+)= sum_c W[r][c] * x[t][c]
 *   W: (rows, cols) device matrix, F32/F16/BF16/Q8_0
 *   x: (n_tok, ldx) F32 activations, y: (n_tok, ldy) F32
 *   accumulate: 1 adds into y (the residual stream), 0 overwrites
 *
 * n_tok <= c->gemv_max: our GEMV kernels, FP32 activations and FP32
 * accumulation (decode; bandwidth-bound, every weight byte read once per 8
 * tokens).  Larger batches: cuBLAS with FP32 accumulation -- cublasSgemm for
 * F32 weights, cublasGemmEx for F16/BF16 with the activations rounded to the
 * weight type, and for Q8_0 the weights dequantised to F16 first.
 *
 * matmul_scratch_bytes: device scratch the call will need (the backend
 * grows it before capturing a graph, where allocation is not allowed).
 */
#ifndef NALAR_CUDA_MATMUL_CUH
#define NALAR_CUDA_MATMUL_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_matmul(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                      const float *x, int64_t ldx, int32_t n_tok, float *y,
                      int64_t ldy, int accumulate, nalar_err *err);

/* The GEMV path whatever n_tok (the check program tests both paths). */
int nalar_cuda_gemv(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                    const float *x, int64_t ldx, int32_t n_tok, float *y,
                    int64_t ldy, int accumulate, nalar_err *err);

/* The same with rows_per_warp (1, 2 or 4; 0: the default for the shape)
 * forced: the results are identical whatever it is (the check program
 * holds it to that, the bench times each). */
int nalar_cuda_gemv_rows(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                         const float *x, int64_t ldx, int32_t n_tok, float *y,
                         int64_t ldy, int accumulate, int rows_per_warp,
                         nalar_err *err);

size_t nalar_cuda_matmul_scratch_bytes(const nalar_cuda_ctx *c,
                                       const nalar_cuda_mat *W,
                                       int32_t n_tok);

#ifdef __cplusplus
}
#endif

#endif
