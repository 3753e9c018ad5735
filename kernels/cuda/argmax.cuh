/*
 * Argmax on the device, over rows of logits (n_rows, ld), n_vocab wide:
 * ids[r] = argmax of row r; the lowest id wins ties and NaN never wins (an
 * all-NaN row gives 0), as nalar_argmax does.  Blocks of 4096 entries
 * each, merged through the context's argmax_ws (so calls on one context's
 * stream run one after another, as they do).
 */
#ifndef NALAR_CUDA_ARGMAX_CUH
#define NALAR_CUDA_ARGMAX_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

int nalar_cuda_argmax(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                      int32_t n_rows, int32_t n_vocab, int32_t *ids,
                      nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
