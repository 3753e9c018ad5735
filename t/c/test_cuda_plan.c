/*
 * The CUDA backend's host side, checked without a GPU: batch flattening
 * into the staging array (layout, dedup of block tables, tiles, padding,
 * validation of hostile batches), split-K choice, buckets, Q8_0 repacking;
 * and that asking for the "cuda" backend fails cleanly when this binary
 * does not link it.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_plan.h"
#include "fp16.h"
#include "tap.h"


static void
test_bucket(void)
{
    is_int(nalar_cuda_bucket(1), 1, "bucket(1)");
    is_int(nalar_cuda_bucket(3), 4, "bucket(3)");
    is_int(nalar_cuda_bucket(128), 128, "bucket(128)");
    is_int(nalar_cuda_bucket(129), 256, "bucket(129)");
    is_int(nalar_cuda_bucket(NALAR_CUDA_MAX_BUCKET + 1),
           NALAR_CUDA_MAX_BUCKET + 1, "no padding above the largest bucket");
}


static void
test_splits(void)
{
    /* 132 SMs, 8 KV heads, one token: enough blocks for ~4 per SM */
    int32_t s = nalar_cuda_attn_splits(1, 8, 132, 0);

    ok(s >= 60 && s <= 64, "one token, 8 heads: %d splits", s);
    is_int(nalar_cuda_attn_splits(128, 8, 132, 0), 1,
           "128 tokens fill the device without splitting");
    is_int(nalar_cuda_attn_splits(1, 8, 132, 20), 1,
           "a 20-position context is not split below 64 positions");
    is_int(nalar_cuda_attn_splits(0, 8, 132, 0), 1, "no tokens: 1");
    ok(nalar_cuda_attn_splits(1, 8, 0, 0) >= 1, "unknown SM count: >= 1");
}


static void
test_plan(void)
{
    nalar_kv_pool   pool;
    nalar_seq_kv    a, b;
    nalar_err       err;
    nalar_cuda_plan plan;
    int32_t         tok[12], pos[12], buf[4096];
    nalar_seq_kv   *seq[12];
    int8_t          want[12];
    nalar_batch     bt = { 0, tok, pos, seq, want, 0, NULL };
    int             rc;

    ok(nalar_kv_pool_init(&pool, 64, 2, 8, &err) == 0, "pool");
    nalar_seq_kv_init(&a);
    nalar_seq_kv_init(&b);
    ok(nalar_seq_kv_reserve(&pool, &a, 40) == 0
       && nalar_seq_kv_reserve(&pool, &b, 9) == 0, "reserve");

    /* a prefill chunk of 10 tokens of a (positions 30..39), then b's
     * decode token at 8: runs of one sequence become tiles of <= 4 */
    for (int i = 0; i < 10; i++) {
        tok[i] = 100 + i;
        pos[i] = 30 + i;
        seq[i] = &a;
        want[i] = i == 9;
    }
    tok[10] = 7;
    pos[10] = 8;
    seq[10] = &b;
    want[10] = 1;
    bt.n_tokens = 11;
    bt.n_logits = 2;
    memset(buf, 0x55, sizeof(buf));
    rc = nalar_cuda_plan_fill(&bt, 1000, 4, 11, buf, 4096, &plan, &err);
    is_int(rc, 0, "plan of a mixed batch");
    is_int(plan.n_tiles, 4, "tiles 4 + 4 + 2 + 1");
    is_int(plan.max_tile, 4, "longest tile");
    is_int(plan.n_logits, 2, "two logit rows");
    is_int(plan.max_pos, 39, "max pos");
    is_int(plan.n_table, a.n_blocks + b.n_blocks,
           "each sequence's table copied once");
    is_int(buf[NALAR_CUDA_PLAN_TOKENS(11) + 10], 7, "tokens");
    is_int(buf[NALAR_CUDA_PLAN_POS(11) + 3], 33, "positions");
    is_int(buf[NALAR_CUDA_PLAN_LOGITS(11) + 0], 9, "first logit row");
    is_int(buf[NALAR_CUDA_PLAN_LOGITS(11) + 1], 10, "second logit row");
    is_int(buf[NALAR_CUDA_PLAN_TILES(11) + 4], 8, "third tile starts at 8");
    is_int(buf[NALAR_CUDA_PLAN_TILES(11) + 5], 2, "and has 2 tokens");
    is_int(buf[NALAR_CUDA_PLAN_TILES(11) + 6], 10, "b's tile");
    {
        int32_t *tables = buf + NALAR_CUDA_PLAN_TABLES(11);
        int32_t  ta = buf[NALAR_CUDA_PLAN_TBLOFF(11) + 5];
        int32_t  tb = buf[NALAR_CUDA_PLAN_TBLOFF(11) + 10];

        is_int(tables[ta + 39 / 16], a.blocks[39 / 16],
               "a's token finds its block through its table");
        is_int(tables[tb + 0], b.blocks[0], "b's table");
        is_int(buf[NALAR_CUDA_PLAN_TBLOFF(11) + 0], ta,
               "tokens of one run share one table");
    }
    is_int(plan.n_ints, NALAR_CUDA_PLAN_TABLES(11) + plan.n_table,
           "ints to copy");
    ok(plan.n_ints <= nalar_cuda_plan_ints(&bt, 11), "within the bound");

    /* a decode step of 3 tokens padded to 4: padding skipped by kernels */
    tok[0] = 5; pos[0] = 39; seq[0] = &a; want[0] = 1;
    tok[1] = 6; pos[1] = 8; seq[1] = &b; want[1] = 1;
    tok[2] = 9; pos[2] = 20; seq[2] = &a; want[2] = 1;
    bt.n_tokens = 3;
    bt.n_logits = 3;
    rc = nalar_cuda_plan_fill(&bt, 1000, 16, 4, buf, 4096, &plan, &err);
    is_int(rc, 0, "padded decode plan");
    is_int(plan.max_tile, 1, "one token per tile");
    is_int(buf[NALAR_CUDA_PLAN_POS(4) + 3], -1, "padding has no position");
    is_int(buf[NALAR_CUDA_PLAN_TOKENS(4) + 3], 0, "padding token 0");
    is_int(buf[NALAR_CUDA_PLAN_LOGITS(4) + 3], 3,
           "padding logit row is the identity");

    /* hostile batches are refused, naming the token */
    pos[1] = 9 + 16 * b.n_blocks;
    rc = nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 4096, &plan, &err);
    ok(rc == -1 && strstr(err.msg, "token 1") != NULL,
       "position outside the reserved blocks: %s", err.msg);
    pos[1] = -2;
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 4096, &plan, &err) == -1,
       "negative position refused");
    pos[1] = 8;
    tok[2] = 1000;
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 4096, &plan, &err) == -1,
       "token outside the vocabulary refused");
    tok[2] = 9;
    bt.n_logits = 2;
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 4096, &plan, &err) == -1
       && strstr(err.msg, "logits") != NULL, "n_logits mismatch refused");
    bt.n_logits = 3;
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 2, buf, 4096, &plan, &err) == -1,
       "padding below the token count refused");
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 20, &plan, &err) == -1
       && strstr(err.msg, "staging") != NULL, "a short staging buffer");
    seq[1] = NULL;
    ok(nalar_cuda_plan_fill(&bt, 1000, 16, 3, buf, 4096, &plan, &err) == -1,
       "a token without a sequence refused");
    seq[1] = &b;

    nalar_seq_kv_release(&pool, &a);
    nalar_seq_kv_release(&pool, &b);
    nalar_kv_pool_free(&pool);
}


static void
test_q8_repack(void)
{
    enum { R = 3, K = 64 };
    uint8_t   src[R * (K / 32) * 34];
    int8_t    qs[R * K];
    uint16_t  sc[R * K / 32];
    nalar_err err;
    int       good = 1;

    for (int i = 0; i < (int) sizeof(src); i++) {
        src[i] = (uint8_t) (i * 29 + 3);
    }
    is_int(nalar_q8_0_repack(src, R, K, qs, sc, &err), 0, "repack");
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < K / 32; k++) {
            const uint8_t *blk = src + (r * (K / 32) + k) * 34;

            good &= sc[r * (K / 32) + k] == (uint16_t) (blk[0] | blk[1] << 8);
            good &= memcmp(qs + r * K + k * 32, blk + 2, 32) == 0;
        }
    }
    ok(good, "scales and quants land where the GEMV reads them");
    ok(nalar_q8_0_repack(src, 1, 48, qs, sc, &err) == -1,
       "a row that is not whole blocks is refused");
}


static void
test_dispatch(void)
{
    nalar_backend_opts o = { "cuda", 0, 0, 0, 0, GGML_F32, 0 };
    nalar_backend_opts o16 = { "cuda", 1, 0, 0, 0, GGML_F16, 0 };
    nalar_model        m;
    nalar_err          err;

    /* the unit tests do not link build/libnalar_cuda.a: with NALAR_CUDA the
     * weak reference is NULL and the request fails cleanly */
    memset(&m, 0, sizeof(m));
    err.msg[0] = '\0';
    ok(nalar_backend_create(&m, &o, &err) == NULL,
       "cuda backend not available here: %s", err.msg);
    ok(strstr(err.msg, "cuda") != NULL, "the message names it");

    /* an F16 KV cache: the CPU backend's (which keeps every type); a
     * GPU backend refuses it, naming what it keeps */
    err.msg[0] = '\0';
    ok(nalar_backend_create(&m, &o16, &err) == NULL,
       "cuda backend with an F16 KV cache refused: %s", err.msg);
    ok(strstr(err.msg, "'cuda'") != NULL && strstr(err.msg, "F32 or BF16")
       != NULL && strstr(err.msg, "F16 KV cache is the 'cpu'") != NULL,
       "the message names the backend, what it keeps and who keeps F16");
    o16.kv_type = GGML_Q8_0;
    o16.name = "cpu";
    ok(nalar_backend_create(&m, &o16, &err) == NULL
       && strstr(err.msg, "F32, F16 or BF16") != NULL,
       "another KV type refused on any backend: %s", err.msg);
    o.act_i16 = NALAR_ACT_I16;
    ok(nalar_backend_create(&m, &o, &err) == NULL
       && strstr(err.msg, "16-bit") != NULL,
       "16-bit activations refused on a GPU backend: %s", err.msg);
    o.act_i16 = NALAR_ACT_Q8;
    ok(nalar_backend_create(&m, &o, &err) == NULL
       && strstr(err.msg, "8-bit") != NULL,
       "8-bit activations refused on a GPU backend: %s", err.msg);
    o.act_i16 = NALAR_ACT_PAIRS;
    ok(nalar_backend_create(&m, &o, &err) == NULL
       && strstr(err.msg, "pair-multiplier") != NULL,
       "pair-multiplier activations refused on a GPU backend: %s",
       err.msg);
    o.act_i16 = NALAR_ACT_F32;

    /* which GPU: nalar_device N, else nginx worker i on GPU i mod count */
    is_int(nalar_backend_pick_device(-1, 0, 2, "cuda", &err), 0,
           "worker 0 of 2 GPUs: GPU 0");
    is_int(nalar_backend_pick_device(-1, 1, 2, "cuda", &err), 1,
           "worker 1: GPU 1");
    is_int(nalar_backend_pick_device(-1, 5, 2, "cuda", &err), 1,
           "worker 5: GPU 1");
    is_int(nalar_backend_pick_device(-1, 7, 8, "cuda", &err), 7,
           "worker 7 of 8 GPUs: GPU 7");
    is_int(nalar_backend_pick_device(3, 5, 8, "cuda", &err), 3,
           "nalar_device 3: GPU 3 for every worker");
    is_int(nalar_backend_pick_device(2, 0, 2, "cuda", &err), -1,
           "nalar_device 2 with 2 GPUs: refused");
    ok(strstr(err.msg, "device 2") != NULL && strstr(err.msg, "2 devices")
       != NULL, "saying what was asked and what is there: %s", err.msg);
    is_int(nalar_backend_pick_device(-1, 0, 0, "cuda", &err), -1,
           "no GPU: refused");
    ok(strstr(err.msg, "no device is visible") != NULL, "%s", err.msg);
}


/* which kernel a projection runs on, and the MMA kernel's split-K */
static void
test_mm_path(void)
{
    int same = 1;

    /* the GEMV and cuBLAS as before when MMA is off */
    is_int(nalar_cuda_mm_path(GGML_BF16, 4096, 1, 8, 0), NALAR_CUDA_MM_GEMV,
           "BF16, 1 token, mma off: GEMV");
    is_int(nalar_cuda_mm_path(GGML_BF16, 4096, 8, 8, 0), NALAR_CUDA_MM_GEMV,
           "BF16, 8 tokens, mma off: GEMV");
    is_int(nalar_cuda_mm_path(GGML_BF16, 4096, 9, 8, 0), NALAR_CUDA_MM_BLAS,
           "BF16, 9 tokens, mma off: cuBLAS");
    /* with MMA on, every BF16 pass of 1..16 tokens takes the one kernel,
     * so a verification of k+1 tokens sums as a 1-token decode step does */
    for (int32_t n = 1; n <= NALAR_CUDA_MMA_MAX; n++) {
        same &= nalar_cuda_mm_path(GGML_BF16, 4096, n, 8, 1)
                == NALAR_CUDA_MM_MMA;
    }
    ok(same, "BF16, mma on: 1..%d tokens all on the MMA kernel",
       NALAR_CUDA_MMA_MAX);
    is_int(nalar_cuda_mm_path(GGML_BF16, 4096, 17, 8, 1), NALAR_CUDA_MM_BLAS,
           "BF16, 17 tokens: cuBLAS");
    is_int(nalar_cuda_mm_path(GGML_BF16, 4096, 17, 1000000, 1),
           NALAR_CUDA_MM_GEMV, "BF16, 17 tokens, gemv_max 1e6: GEMV");
    is_int(nalar_cuda_mm_path(GGML_BF16, 4100, 4, 8, 1), NALAR_CUDA_MM_GEMV,
           "BF16, cols not a multiple of 8: GEMV");
    is_int(nalar_cuda_mm_path(GGML_F16, 4096, 4, 8, 1), NALAR_CUDA_MM_GEMV,
           "F16 with mma on: GEMV");
    is_int(nalar_cuda_mm_path(GGML_F32, 4096, 9, 8, 1), NALAR_CUDA_MM_BLAS,
           "F32, 9 tokens: cuBLAS (Sgemm)");
    is_int(nalar_cuda_mm_path(GGML_Q8_0, 4096, 4, 8, 1), NALAR_CUDA_MM_GEMV,
           "Q8_0 with mma on: its GEMV");

    /* split-K: about 16 warps per SM (132 SMs) over the row tiles */
    is_int(nalar_cuda_mma_splits(28672, 4096, 132), 2,
           "gate|up 28672x4096: 2 warps per tile");
    is_int(nalar_cuda_mma_splits(4096, 14336, 132), 8,
           "down 4096x14336: 8 warps per tile");
    is_int(nalar_cuda_mma_splits(6144, 4096, 132), 8,
           "qkv 6144x4096: 8 warps per tile");
    is_int(nalar_cuda_mma_splits(128256, 4096, 132), 1,
           "output 128256x4096: 1");
    is_int(nalar_cuda_mma_splits(16, 32, 132), 1,
           "one 32-column chunk: 1 (never more warps than chunks)");
    is_int(nalar_cuda_mma_splits(16, 96, 132), 2,
           "three chunks: 2");
}


int
main(void)
{
    test_bucket();
    test_splits();
    test_plan();
    test_q8_repack();
    test_dispatch();
    test_mm_path();
    return done_testing();
}
