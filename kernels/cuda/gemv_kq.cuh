/*
 * Block-quantized weights on the device (Q4_0, Q4_K, Q5_K, Q6_K), held in
 * ggml's blocks as the file stores them: data = rows * row_size bytes.
 *   gemv_kq:        y[t][r] (+)= sum_c W[r][c] x[t][c], each weight
 *                   dequantized exactly (a_j * q - b_j in float) and
 *                   accumulated in float; meant for decode and short
 *                   batches (weights are re-read every 8 tokens)
 *   kq_dequant_bf16: out (rows, cols) BF16, for cuBLAS on large batches
 *   kq_embed:       embedding rows widened to F32
 */
#ifndef NALAR_CUDA_GEMV_KQ_CUH
#define NALAR_CUDA_GEMV_KQ_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 for the types these kernels read */
int nalar_cuda_kq_type(ggml_type t);
int nalar_cuda_gemv_kq(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                       const float *x, int64_t ldx, int32_t n_tok, float *y,
                       int64_t ldy, int accumulate, nalar_err *err);
/* embedding gather from a blocked matrix (see embed.cuh) */
int nalar_cuda_kq_embed(nalar_cuda_ctx *c, const nalar_cuda_mat *E,
                        const int32_t *tokens, int32_t n, float *out,
                        int64_t ld_out, nalar_err *err);
int nalar_cuda_kq_dequant_bf16(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                               uint16_t *out, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
