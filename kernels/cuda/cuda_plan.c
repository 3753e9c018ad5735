/*
 * Host-side planning for the CUDA backend: batch flattening into the
 * staging array, split-K choice, Q8_0 repacking.  See cuda_plan.h.
 */
#include <string.h>

#include "cuda_plan.h"


int32_t
nalar_cuda_bucket(int32_t n)
{
    int32_t p = 1;

    if (n > NALAR_CUDA_MAX_BUCKET) {
        return n;
    }
    while (p < n) {
        p *= 2;
    }
    return p;
}


int64_t
nalar_cuda_plan_ints(const nalar_batch *b, int32_t n_pad)
{
    int64_t n = NALAR_CUDA_PLAN_TABLES(n_pad);

    /* every run of one sequence copies that sequence's whole table */
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (t == 0 || b->seq[t] != b->seq[t - 1]) {
            n += b->seq[t] != NULL && b->seq[t]->n_blocks > 0
                 ? b->seq[t]->n_blocks : 0;
        }
    }
    return n;
}


int
nalar_cuda_plan_fill(const nalar_batch *b, int32_t n_vocab, int32_t tile_q,
                     int32_t n_pad, int32_t *buf, int64_t cap,
                     nalar_cuda_plan *plan, nalar_err *err)
{
    int32_t *tokens, *pos, *tbl_off, *logit_rows, *tiles, *tables;
    int32_t  n_logits = 0, run_len = 0, off = 0;
    int64_t  need;

    memset(plan, 0, sizeof(*plan));
    if (b->n_tokens < 0 || n_pad < b->n_tokens || tile_q < 1) {
        return nalar_fail(err, "cuda backend: batch of %d tokens padded to "
                          "%d (tile %d)", b->n_tokens, n_pad, tile_q);
    }
    need = nalar_cuda_plan_ints(b, n_pad);
    if (need > cap) {
        return nalar_fail(err, "cuda backend: staging needs %lld ints, has "
                          "%lld", (long long) need, (long long) cap);
    }
    tokens = buf + NALAR_CUDA_PLAN_TOKENS(n_pad);
    pos = buf + NALAR_CUDA_PLAN_POS(n_pad);
    tbl_off = buf + NALAR_CUDA_PLAN_TBLOFF(n_pad);
    logit_rows = buf + NALAR_CUDA_PLAN_LOGITS(n_pad);
    tiles = buf + NALAR_CUDA_PLAN_TILES(n_pad);
    tables = buf + NALAR_CUDA_PLAN_TABLES(n_pad);

    for (int32_t t = 0; t < b->n_tokens; t++) {
        const nalar_seq_kv *s = b->seq[t];
        int                 new_run = t == 0 || s != b->seq[t - 1];

        if (s == NULL || s->blocks == NULL || s->n_blocks < 0
            || b->pos[t] < 0
            || b->pos[t] / NALAR_KV_BLOCK >= s->n_blocks
            || b->tokens[t] < 0 || b->tokens[t] >= n_vocab)
        {
            return nalar_fail(err, "cuda backend: token %d (id %d, pos %d) "
                              "outside its sequence's reserved KV or the "
                              "vocabulary", t, b->tokens[t], b->pos[t]);
        }
        if (new_run) {
            off = plan->n_table;
            memcpy(tables + off, s->blocks,
                   (size_t) s->n_blocks * sizeof(int32_t));
            plan->n_table += s->n_blocks;
            run_len = 0;
        }
        /* a new tile at each run start and every tile_q tokens of a run */
        if (run_len % tile_q == 0) {
            tiles[2 * plan->n_tiles] = t;
            tiles[2 * plan->n_tiles + 1] = 0;
            plan->n_tiles++;
        }
        tiles[2 * (plan->n_tiles - 1) + 1]++;
        if (tiles[2 * (plan->n_tiles - 1) + 1] > plan->max_tile) {
            plan->max_tile = tiles[2 * (plan->n_tiles - 1) + 1];
        }
        run_len++;
        tokens[t] = b->tokens[t];
        pos[t] = b->pos[t];
        tbl_off[t] = off;
        plan->max_pos = b->pos[t] > plan->max_pos ? b->pos[t]
                                                  : plan->max_pos;
        if (b->want_logits[t]) {
            logit_rows[n_logits++] = t;
        }
    }
    if (n_logits != b->n_logits) {
        return nalar_fail(err, "cuda backend: batch says %d logits but "
                          "marks %d", b->n_logits, n_logits);
    }
    /* padding rows: harmless token 0 at "no position"; a padded decode
     * step keeps the identity of logit rows so its graph is reusable */
    for (int32_t t = b->n_tokens; t < n_pad; t++) {
        tokens[t] = 0;
        pos[t] = -1;
        tbl_off[t] = 0;
    }
    for (int32_t i = n_logits; i < n_pad; i++) {
        logit_rows[i] = i;
    }
    plan->n_tok = b->n_tokens;
    plan->n_pad = n_pad;
    plan->n_logits = n_logits;
    plan->n_ints = NALAR_CUDA_PLAN_TABLES(n_pad) + plan->n_table;
    return 0;
}


int32_t
nalar_cuda_attn_splits(int32_t n_tok, int32_t n_head_groups,
                       int32_t sm_count, int32_t n_ctx_max)
{
    int64_t pairs = (int64_t) n_tok * n_head_groups;
    /* about four 4-warp blocks per SM keep enough loads in flight */
    int64_t target = 4 * (int64_t) (sm_count > 0 ? sm_count : 1);
    int64_t s;

    if (pairs <= 0) {
        return 1;
    }
    s = (target + pairs - 1) / pairs;
    if (s > 64) {
        s = 64;
    }
    if (n_ctx_max > 0) {
        int64_t most = (n_ctx_max + 4 * NALAR_KV_BLOCK - 1)
                       / (4 * NALAR_KV_BLOCK);

        s = s < most ? s : most;
    }
    return s < 1 ? 1 : (int32_t) s;
}


int
nalar_q8_0_repack(const void *src, int64_t rows, int64_t cols, int8_t *qs,
                  uint16_t *scales, nalar_err *err)
{
    const uint8_t *p = src;
    int64_t        nb = cols / QK8_0;

    if (rows < 0 || cols <= 0 || cols % QK8_0 != 0) {
        return nalar_fail(err, "q8_0 repack: %lld columns is not a positive "
                          "multiple of %d", (long long) cols, QK8_0);
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < nb; k++) {
            const uint8_t *blk = p + (r * nb + k) * (2 + QK8_0);

            /* little-endian f16 scale, then the quants */
            scales[r * nb + k] = (uint16_t) (blk[0] | (blk[1] << 8));
            memcpy(qs + r * cols + k * QK8_0, blk + 2, QK8_0);
        }
    }
    return 0;
}


int
nalar_cuda_mm_path(int type, int64_t cols, int32_t n_tok, int32_t gemv_max,
                   int mma)
{
    if (mma && type == GGML_BF16 && cols % 8 == 0 && n_tok >= 1
        && n_tok <= NALAR_CUDA_MMA_MAX)
    {
        return NALAR_CUDA_MM_MMA;
    }
    return n_tok <= gemv_max ? NALAR_CUDA_MM_GEMV : NALAR_CUDA_MM_BLAS;
}


int32_t
nalar_cuda_mma_splits(int64_t rows, int64_t cols, int32_t sm_count)
{
    int64_t tiles = (rows + 15) / 16, chunks = (cols + 31) / 32;
    int64_t want = tiles > 0 ? (16 * (int64_t) sm_count + tiles - 1) / tiles
                             : 1;
    int32_t sk = 1;

    while (sk < want && sk < 8) {
        sk *= 2;
    }
    while (sk > 1 && sk > chunks) {
        sk /= 2;
    }
    return sk;
}
