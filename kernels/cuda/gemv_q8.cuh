/*
 * Q8_0 weights (repacked: int8 quants (rows, cols), f16 scales
 * (rows, cols / 32)) times F32 activations.
 *   gemv_q8:    y[t][r] (+)= sum_c d[r][c/32] * q[r][c] * x[t][c]
 *               x: (n_tok, ldx), y: (n_tok, ldy); any n_tok (weights are
 *               re-read every 8 tokens: meant for decode)
 *   dequant_f16: out (rows, cols) F16 = d * q, for cuBLAS on large batches
 */
#ifndef NALAR_CUDA_GEMV_Q8_CUH
#define NALAR_CUDA_GEMV_Q8_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_gemv_q8(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                       const float *x, int64_t ldx, int32_t n_tok, float *y,
                       int64_t ldy, int accumulate, nalar_err *err);
int nalar_cuda_q8_dequant_f16(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                              uint16_t *out, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
