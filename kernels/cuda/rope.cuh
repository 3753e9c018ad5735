/*
 * Rotary position embedding, in place, on the first n_heads heads of each
 * row of x (q heads then k heads are adjacent in the fused qkv row):
 *   theta_i = pos[t] * inv_freq[i],  i < head_dim / 2
 *   normal pairing (neox 0): (x[2i], x[2i+1]); NeoX (neox 1): (x[i], x[i+hd/2])
 *   x: (n_tok, ld) floats; pos: (n_tok) device positions (< 0: skipped)
 *   inv_freq: (head_dim / 2) device floats, base^(-2i/head_dim)
 */
#ifndef NALAR_CUDA_ROPE_CUH
#define NALAR_CUDA_ROPE_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_rope(nalar_cuda_ctx *c, float *x, int64_t ld,
                    const int32_t *pos, int32_t n_tok, int32_t n_heads,
                    int32_t head_dim, const float *inv_freq, int neox,
                    nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
