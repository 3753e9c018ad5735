/*
 * Logits post-processing on the device, over rows of logits (n_rows, ld),
 * n_vocab wide: one block per row, but for argmax.
 *
 * argmax: ids[r] = argmax of row r; the lowest id wins ties and NaN never
 *   wins (an all-NaN row gives 0), as nalar_argmax does.  Blocks of 4096
 *   entries each, merged through the context's argmax_ws (so calls on one
 *   context's stream run one after another, as they do).
 *
 * sample: per row, with that row's parameters (device array):
 *   temperature <= 0: argmax.  Else keep the top_k largest logits (ties at
 *   the k-th value are all kept), weights e = exp((l - max l) / T), keep the
 *   smallest set of largest weights holding >= top_p of the mass (again
 *   ties kept), keep e >= min_p (max e is 1), and draw in id order with
 *   u = uniform(seed, counter):
 *     u = (mix64(seed ^ mix64(counter)) >> 11) * 2^-53
 *   (mix64 = the splitmix64 finaliser), the first id whose running kept
 *   mass exceeds u * total.  Thresholds are exact (radix select on the
 *   float bits), so the kept set is the CPU sampler's up to ties; the draws
 *   are reproducible per (seed, counter), not the CPU sampler's sequence.
 *
 * verify_greedy (speculative decoding): group g owns rows
 *   [row0[g], row0[g] + n[g]); row row0 + i scores proposal
 *   proposals[row0 + i] for i < n - 1.  accepted[g] = leading proposals
 *   equal to their row's argmax; next[g] = argmax of row row0 + accepted
 *   (the correction, or the bonus token when all were accepted).
 *   `ids` (total rows) receives every row's argmax.
 */
#ifndef NALAR_CUDA_SAMPLE_CUH
#define NALAR_CUDA_SAMPLE_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float    temperature;
    int32_t  top_k;          /* <= 0 or >= n_vocab: off */
    float    top_p;          /* >= 1: off */
    float    min_p;          /* <= 0: off */
    uint64_t seed;
    uint64_t counter;        /* e.g. the token's index in its output */
} nalar_cuda_sampling;

int nalar_cuda_argmax(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                      int32_t n_rows, int32_t n_vocab, int32_t *ids,
                      nalar_err *err);

int nalar_cuda_sample(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                      int32_t n_rows, int32_t n_vocab,
                      const nalar_cuda_sampling *params, int32_t *ids,
                      nalar_err *err);

int nalar_cuda_verify_greedy(nalar_cuda_ctx *c, const float *logits,
                             int64_t ld, int32_t n_vocab, const int32_t *row0,
                             const int32_t *n, const int32_t *proposals,
                             int32_t n_groups, int32_t n_rows, int32_t *ids,
                             int32_t *accepted, int32_t *next,
                             nalar_err *err);

/* The u a row draws with (host copy of the device formula, for checks). */
double nalar_cuda_uniform(uint64_t seed, uint64_t counter);

#ifdef __cplusplus
}
#endif

#endif
