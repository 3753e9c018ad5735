/*
 * Embedding gather: out[t][:] = E[tokens[t]][:] widened to F32.
 *   E: (n_vocab, dim) device matrix (F32/F16/BF16/Q8_0)
 *   tokens: (n) device ids; an id outside the vocabulary (never produced by
 *           the validated plan) yields a NaN row rather than a wild read
 *   out: (n, ld_out) floats
 */
#ifndef NALAR_CUDA_EMBED_CUH
#define NALAR_CUDA_EMBED_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_embed(nalar_cuda_ctx *c, const nalar_cuda_mat *E,
                     const int32_t *tokens, int32_t n, float *out,
                     int64_t ld_out, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
