/*
 * Host-side planning for the CUDA backend, in plain C so that it is built
 * and tested (under ASan) on machines without a GPU.
 *
 * A batch is flattened into one int32 staging array that a single async
 * copy moves to the device.  Its layout depends only on the padded token
 * count P, so a CUDA graph captured for P finds every array at the same
 * device address on the next step:
 *
 *   [0,  P)      tokens      (P)  padding: token 0
 *   [P,  2P)     pos         (P)  padding: -1 (kernels skip the token)
 *   [2P, 3P)     tbl_off     (P)  offset of the token's block table in
 *                                 `tables`; padding: 0
 *   [3P, 4P)     logit_rows  (P)  batch rows whose logits are wanted,
 *                                 first n_logits valid (padding: identity)
 *   [4P, 6P)     tiles       (P, 2) (first row, count): runs of consecutive
 *                                 tokens of one sequence, at most tile_q each
 *   [6P, ...)    tables      block ids of each distinct sequence run
 */
#ifndef NALAR_CUDA_PLAN_H
#define NALAR_CUDA_PLAN_H

#include <stdint.h>

#include "model.h"
#include "nalar_err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t n_tok;       /* real tokens */
    int32_t n_pad;       /* P: n_tok rounded up to the bucket, or n_tok */
    int32_t n_logits;    /* real logit rows */
    int32_t n_tiles;
    int32_t max_tile;    /* longest tile (1: a pure decode step) */
    int32_t max_pos;
    int32_t n_table;     /* ints used in `tables` */
    int64_t n_ints;      /* total ints used in the staging array */
} nalar_cuda_plan;

#define NALAR_CUDA_PLAN_TOKENS(P)  0
#define NALAR_CUDA_PLAN_POS(P)     ((int64_t) (P))
#define NALAR_CUDA_PLAN_TBLOFF(P)  ((int64_t) 2 * (P))
#define NALAR_CUDA_PLAN_LOGITS(P)  ((int64_t) 3 * (P))
#define NALAR_CUDA_PLAN_TILES(P)   ((int64_t) 4 * (P))
#define NALAR_CUDA_PLAN_TABLES(P)  ((int64_t) 6 * (P))

/* Largest bucket a decode step is padded to (and captured as a graph). */
#define NALAR_CUDA_MAX_BUCKET 512

/* Smallest power of two >= n (n >= 1), or n itself above the largest
 * bucket. */
int32_t nalar_cuda_bucket(int32_t n);

/* Upper bound of the staging ints plan_fill needs for this batch padded to
 * n_pad (>= b->n_tokens). */
int64_t nalar_cuda_plan_ints(const nalar_batch *b, int32_t n_pad);

/*
 * Validate the batch (token ids in the vocabulary, positions inside the
 * sequence's reserved blocks, want_logits consistent with n_logits, n_pad
 * large enough) and lay it out in `buf` (cap ints).  Returns 0, or -1 with
 * err naming the offending token.
 */
int nalar_cuda_plan_fill(const nalar_batch *b, int32_t n_vocab,
                         int32_t tile_q, int32_t n_pad, int32_t *buf,
                         int64_t cap, nalar_cuda_plan *plan, nalar_err *err);

/*
 * Which kernel a projection of n_tok tokens runs on:
 *   GEMV  the FP32-activation GEMV (one warp per weight row);
 *   MMA   BF16 weights only, with `mma` on and cols a multiple of 8:
 *         tensor cores over activations split into two BF16 halves
 *         (gemv_mma.cu), every weight read once for all of the pass's
 *         tokens, for passes of 1..NALAR_CUDA_MMA_MAX tokens: one kernel
 *         for every size of a speculative verification and for plain
 *         decoding, so their results do not depend on the pass's size;
 *   BLAS  cuBLAS (activations rounded to the weights' type).
 * Passes of up to gemv_max tokens not taken by MMA go to the GEMV, larger
 * ones to cuBLAS.
 */
#define NALAR_CUDA_MMA_MAX 16

enum { NALAR_CUDA_MM_GEMV = 0, NALAR_CUDA_MM_MMA, NALAR_CUDA_MM_BLAS };

int nalar_cuda_mm_path(int type, int64_t cols, int32_t n_tok,
                       int32_t gemv_max, int mma);

/*
 * Warps that split the columns of one 16-row tile in the MMA kernel: about
 * 16 warps per SM over the matrix's row tiles, a power of two up to 8,
 * no more than its 32-column chunks.  A function of the shape and device
 * only (never of n_tok), so a row's sums run in the same order whatever
 * the pass's size.
 */
int32_t nalar_cuda_mma_splits(int64_t rows, int64_t cols, int32_t sm_count);

/*
 * Split-K factor for paged decode attention: enough blocks to fill the
 * device (about four blocks per SM of `sm_count`) over n_tok * n_head_groups
 * (token, KV head chunk) pairs, each split covering at least 16 positions
 * of an n_ctx_max context.  Depends on n_tok (not on contexts) when
 * n_ctx_max <= 0, so that a captured graph stays valid as contexts grow.
 */
int32_t nalar_cuda_attn_splits(int32_t n_tok, int32_t n_head_groups,
                               int32_t sm_count, int32_t n_ctx_max);

/*
 * Repack Q8_0 rows (blocks of f16 scale + 32 int8) into separate quants
 * (rows, cols) and scales (rows, cols / 32) for aligned device loads.
 * cols must be a multiple of 32.
 */
int nalar_q8_0_repack(const void *src, int64_t rows, int64_t cols,
                      int8_t *qs, uint16_t *scales, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
