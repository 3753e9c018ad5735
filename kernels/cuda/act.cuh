/*
 * Element-wise ops over rows of floats.
 *   swiglu:   g[t][i] = silu(g[t][i]) * u[t][i], i < n; g and u rows at
 *             stride ld (the fused gate|up product: u = g + n)
 *   add_bias: y[t][i] += bias[i], i < n
 *   add:      y[t][i] += x[t][i], i < n (residual)
 *   geglu:    g[t][i] = gelu_tanh(g[t][i]) * u[t][i], as swiglu
 *   map:      y[t][i] = a * y[t][i] (op 0), or
 *             a * tanh(y[t][i] / a) (op 1: soft-cap), i < n
 *   to_half:  out (n_tok, cols) F16 or BF16, dense, from x (n_tok, ldx)
 *             F32, round to nearest even (cuBLAS inputs)
 */
#ifndef NALAR_CUDA_ACT_CUH
#define NALAR_CUDA_ACT_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_swiglu(nalar_cuda_ctx *c, float *g, const float *u,
                      int64_t ld, int32_t n_tok, int32_t n, nalar_err *err);
int nalar_cuda_geglu(nalar_cuda_ctx *c, float *g, const float *u,
                     int64_t ld, int32_t n_tok, int32_t n, nalar_err *err);
int nalar_cuda_map(nalar_cuda_ctx *c, float *y, int64_t ld, int32_t n_tok,
                   int32_t n, int op, float a, nalar_err *err);
int nalar_cuda_add_bias(nalar_cuda_ctx *c, float *y, int64_t ld,
                        int32_t n_tok, const float *bias, int32_t n,
                        nalar_err *err);
int nalar_cuda_add(nalar_cuda_ctx *c, float *y, int64_t ldy, const float *x,
                   int64_t ldx, int32_t n_tok, int32_t n, nalar_err *err);
int nalar_cuda_to_half(nalar_cuda_ctx *c, ggml_type type, void *out,
                       const float *x, int64_t ldx, int32_t n_tok,
                       int64_t cols, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
