/*
 * `nalar bench --backend cuda` / `--synthetic SHAPE`: what the GPU does.
 *
 *   HBM copy bandwidth    cudaMemcpy device to device of 2 GiB, counted as
 *                         bytes read + written per second
 *   prefill               one prompt of `prefill` tokens in one pass
 *   decode, batch 1       continuing that prompt; the achieved bandwidth is
 *                         (weight bytes + KV bytes read) per token x tokens/s
 *   decode, batch B       B sequences of 128 tokens stepping together
 *   launches per step     kernel nodes of the captured graph of each
 *                         decode step measured (one launch each)
 *   verify curve          passes of k + 1 = 2..9 tokens of one sequence
 *                         (speculative verification: every row's greedy
 *                         token), as a ratio to a 1-token decode step at
 *                         the same position
 *   paged attention       the decode kernel alone on one layer at attn_ctx
 *                         positions (shuffled blocks, one token, all heads)
 *
 * Timings are wall-clock around a step, which returns once its results
 * are on the host, so they include the per-step host work the engine pays.
 * Decode steps run as the engine runs greedy ones: forward_argmax (token
 * ids from the device), then again with forward() bringing the logits to
 * the host (what a step costs when a request in it samples on the CPU).
 *
 * NVTX ranges name one step of each measure for a profiler ("decode-b1",
 * "decode-b8", ..., "attn-8192": the last step of each), e.g.
 *   ncu --nvtx --nvtx-include "decode-b1/" nalar bench --synthetic ...
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nvtx3/nvToolsExt.h>

#include "attention.cuh"
#include "common.cuh"
#include "gemv_mma.cuh"
#include "kv.cuh"
#include "matmul.cuh"

extern "C" {
#include "cuda_backend.h"
#include "cuda_plan.h"
#include "clock.h"
#include "sampler.h"
}


/* an NVTX range named by a format (closed by nvtxRangePop) */
static void
range_push(const char *fmt, ...)
{
    char    name[64];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    nvtxRangePushA(name);
}


/* bytes read + written per second by cudaMemcpy D2D */
static int
copy_bandwidth(int device, double *gbs, nalar_err *err)
{
    size_t      bytes = (size_t) 1 << 31;
    void       *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    float       ms = 0;

    CUDA_CHECK(err, cudaSetDevice(device));
    CUDA_CHECK(err, cudaMalloc(&a, bytes));
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return nalar_fail(err, "bench: no room for a 2 GiB copy");
    }
    CUDA_CHECK(err, cudaMemset(a, 1, bytes));
    CUDA_CHECK(err, cudaEventCreate(&e0));
    CUDA_CHECK(err, cudaEventCreate(&e1));
    CUDA_CHECK(err, cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(err, cudaEventRecord(e0, 0));
    for (int i = 0; i < 10; i++) {
        CUDA_CHECK(err, cudaMemcpyAsync(b, a, bytes,
                                        cudaMemcpyDeviceToDevice, 0));
    }
    CUDA_CHECK(err, cudaEventRecord(e1, 0));
    CUDA_CHECK(err, cudaEventSynchronize(e1));
    CUDA_CHECK(err, cudaEventElapsedTime(&ms, e0, e1));
    *gbs = 2.0 * 10 * (double) bytes / (ms * 1e-3) / 1e9;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 0;
}


/* The decode attention kernel alone: one token at ctx positions, one
 * layer, the model's heads, in `want` splits (0: as many as the engine
 * would use, returned in *used), prefetching or not (pf; -1: the default),
 * K/V in F32 or (bf16) BF16; returns bytes of K/V read per second. */
static int
attention_bandwidth(int device, const nalar_config *cfg, int32_t ctx,
                    int32_t want, int pf, int bf16, double *gbs, double *us,
                    int32_t *used, nalar_err *err)
{
    nalar_cuda_ctx c;
    nalar_cuda_kv  kv;
    int32_t        n_blocks = (ctx + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
    int32_t        kv_dim = cfg->n_kv_heads * cfg->head_dim;
    int32_t        qd = cfg->n_heads * cfg->head_dim;
    int32_t       *h = (int32_t *) malloc((size_t) (n_blocks + 3)
                                          * sizeof(int32_t));
    int32_t       *d = NULL;
    float         *q = NULL, *out = NULL, *part = NULL;
    int32_t        splits;
    size_t         elem = bf16 ? 2 : sizeof(float);
    size_t         bytes = (size_t) n_blocks * NALAR_KV_BLOCK * kv_dim
                           * elem;
    cudaEvent_t    e0, e1;
    float          ms = 0;
    int            rc = -1, reps = 50;

    if (h == NULL) {
        return nalar_fail(err, "bench: out of memory");
    }
    if (nalar_cuda_ctx_init(&c, device, err) != 0) {
        free(h);
        return -1;
    }
    if (pf >= 0) {
        c.attn_prefetch = pf;
    }
    memset(&kv, 0, sizeof(kv));
    /* pos, tbl_off, then a shuffled table */
    h[0] = ctx - 1;
    h[1] = 0;
    for (int32_t i = 0; i < n_blocks; i++) {
        h[2 + i] = i;
    }
    srand(7);
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = rand() % (i + 1), t = h[2 + i];

        h[2 + i] = h[2 + j];
        h[2 + j] = t;
    }
    splits = want > 0 ? want
             : nalar_cuda_attn_splits(1, cfg->n_kv_heads
                                      * nalar_cuda_attn_head_chunks(
                                            cfg->n_heads, cfg->n_kv_heads),
                                      c.sm_count, 0);
    *used = splits;
    if (cudaMalloc((void **) &kv.k, bytes) != cudaSuccess
        || cudaMalloc((void **) &kv.v, bytes) != cudaSuccess
        || cudaMalloc((void **) &d, (size_t) (n_blocks + 2) * 4)
           != cudaSuccess
        || cudaMalloc((void **) &q, (size_t) qd * 4) != cudaSuccess
        || cudaMalloc((void **) &out, (size_t) qd * 4) != cudaSuccess
        || cudaMalloc((void **) &part,
                      (size_t) nalar_cuda_attn_part_floats(
                          1, cfg->n_heads, cfg->head_dim, splits) * 4 + 4)
           != cudaSuccess)
    {
        nalar_fail(err, "bench: no device memory for the attention test");
        goto done;
    }
    kv.n_blocks = n_blocks;
    kv.n_layers = 1;
    kv.kv_dim = kv_dim;
    kv.bf16 = bf16;
    if (cudaMemset(kv.k, 0, bytes) != cudaSuccess
        || cudaMemset(kv.v, 0, bytes) != cudaSuccess
        || cudaMemset(q, 0, (size_t) qd * 4) != cudaSuccess
        || cudaMemcpy(d, h, (size_t) (n_blocks + 2) * 4,
                      cudaMemcpyHostToDevice) != cudaSuccess
        || cudaEventCreate(&e0) != cudaSuccess
        || cudaEventCreate(&e1) != cudaSuccess)
    {
        nalar_fail(err, "bench: attention test setup failed");
        goto done;
    }
    for (int i = 0; i < reps + 5; i++) {
        if (i == 5 && cudaEventRecord(e0, c.stream) != cudaSuccess) {
            goto done;
        }
        if (i == reps + 4) {
            range_push(bf16 ? "attn-%d-bf16" : "attn-%d", ctx);
        }
        if (nalar_cuda_attn_decode(&c, out, qd, q, qd, &kv, 0, d, d + 1,
                                   d + 2, 1, cfg->n_heads, cfg->n_kv_heads,
                                   cfg->head_dim, splits, part, err) != 0)
        {
            goto done;
        }
        if (i == reps + 4) {
            nvtxRangePop();
        }
    }
    if (cudaEventRecord(e1, c.stream) != cudaSuccess
        || cudaEventSynchronize(e1) != cudaSuccess
        || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
    {
        nalar_fail(err, "bench: attention test failed: %s",
                   cudaGetErrorString(cudaGetLastError()));
        goto done;
    }
    *us = ms * 1e3 / reps;
    *gbs = 2.0 * (double) ctx * kv_dim * elem / (*us * 1e-6) / 1e9;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    rc = 0;
done:
    cudaFree(kv.k);
    cudaFree(kv.v);
    cudaFree(d);
    cudaFree(q);
    cudaFree(out);
    cudaFree(part);
    nalar_cuda_ctx_free(&c);
    free(h);
    return rc;
}


/* a line on stderr as each measure lands, so a run cut short (a timeout,
 * a device fault) still shows how far it got and what it had measured */
static void
progress(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}


/* The GEMV alone on (rows, cols) random BF16 weights, n_tok tokens, each
 * rows-per-warp choice: weight bytes read per second, on stderr (for
 * choosing the defaults; the backend's own are in the decode numbers). */
static int
gemv_sweep(int device, int64_t rows, int64_t cols, nalar_err *err)
{
    nalar_cuda_ctx c;
    nalar_cuda_mat W;
    float         *x = NULL, *y = NULL;
    cudaEvent_t    e0 = NULL, e1 = NULL;
    int            rc = -1, reps = 20;

    memset(&W, 0, sizeof(W));
    if (nalar_cuda_ctx_init(&c, device, err) != 0) {
        return -1;
    }
    W.type = GGML_BF16;
    W.rows = rows;
    W.cols = cols;
    if (cudaMalloc(&W.data, (size_t) rows * cols * 2) != cudaSuccess
        || cudaMalloc((void **) &x, (size_t) 16 * cols * 4) != cudaSuccess
        || cudaMalloc((void **) &y, (size_t) 16 * rows * 4) != cudaSuccess
        || cudaEventCreate(&e0) != cudaSuccess
        || cudaEventCreate(&e1) != cudaSuccess
        || cudaMemset(x, 0, (size_t) 16 * cols * 4) != cudaSuccess)
    {
        nalar_fail(err, "bench: no device memory for the GEMV sweep");
        goto done;
    }
    if (nalar_cuda_fill_random(&c, &W, 0.01f, 3, err) != 0) {
        goto done;
    }
    /* each rows-per-warp choice; 0: the default for the shape (after one
     * untimed product, so the first measure starts warm too) */
    if (nalar_cuda_gemv_rows(&c, &W, x, cols, 1, y, rows, 0, 0, err) != 0) {
        goto done;
    }
    for (int nt = 1; nt <= 8; nt *= 2) {
        for (int R = 0; R <= 4; R = R == 0 ? 1 : 2 * R) {
            float ms = 0;

            for (int i = 0; i < reps + 3; i++) {
                if (i == 3 && cudaEventRecord(e0, c.stream) != cudaSuccess) {
                    goto done;
                }
                if (nalar_cuda_gemv_rows(&c, &W, x, cols, nt, y, rows, 0, R,
                                         err) != 0)
                {
                    goto done;
                }
            }
            if (cudaEventRecord(e1, c.stream) != cudaSuccess
                || cudaEventSynchronize(e1) != cudaSuccess
                || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            {
                nalar_fail(err, "bench: GEMV sweep failed");
                goto done;
            }
            progress("  gemv %lldx%lld, %d tokens, %s: %.1f us, %.1f GB/s "
                     "of weights", (long long) rows, (long long) cols, nt,
                     R == 0 ? "default rows/warp" : R == 1 ? "1 row/warp"
                     : R == 2 ? "2 rows/warp" : "4 rows/warp",
                     ms * 1e3 / reps,
                     (double) rows * cols * 2 / (ms * 1e-3 / reps) / 1e9);
        }
    }
    /* the tensor-core kernel: 1..16 tokens reading each weight once */
    {
        double one = 0;

        for (int nt = 1; nt <= 16; nt *= 2) {
            float ms = 0;

            for (int i = 0; i < reps + 3; i++) {
                if (i == 3 && cudaEventRecord(e0, c.stream) != cudaSuccess) {
                    goto done;
                }
                if (nalar_cuda_gemv_mma(&c, &W, x, cols, nt, y, rows, 0,
                                        err) != 0)
                {
                    goto done;
                }
            }
            if (cudaEventRecord(e1, c.stream) != cudaSuccess
                || cudaEventSynchronize(e1) != cudaSuccess
                || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            {
                nalar_fail(err, "bench: MMA sweep failed");
                goto done;
            }
            one = nt == 1 ? ms : one;
            progress("  mma %lldx%lld, %d tokens: %.1f us, %.1f GB/s of "
                     "weights, %.2fx 1 token", (long long) rows,
                     (long long) cols, nt, ms * 1e3 / reps,
                     (double) rows * cols * 2 / (ms * 1e-3 / reps) / 1e9,
                     ms / one);
        }
    }
    rc = 0;
done:
    if (e0 != NULL) cudaEventDestroy(e0);
    if (e1 != NULL) cudaEventDestroy(e1);
    cudaFree(W.data);
    cudaFree(x);
    cudaFree(y);
    nalar_cuda_ctx_free(&c);
    return rc;
}


typedef struct {
    nalar_backend *be;
    nalar_kv_pool  kv;
    nalar_batch    b;
    float         *logits;
    int32_t       *ids;
    int32_t        vocab;
    int            use_ids;   /* steps end in forward_argmax's token ids */
} bench_run;


static int
step(bench_run *r, int32_t n, nalar_err *err)
{
    int32_t nl = 0;

    for (int32_t i = 0; i < n; i++) {
        nl += r->b.want_logits[i] != 0;
    }
    r->b.n_tokens = n;
    r->b.n_logits = nl;
    if (r->use_ids) {
        return r->be->forward_argmax(r->be, &r->kv, &r->b, r->ids, NULL,
                                     err);
    }
    return r->be->forward(r->be, &r->kv, &r->b, r->logits, err);
}


/* the greedy next token of logit row i of the last step */
static int32_t
next_token(const bench_run *r, int32_t i)
{
    return r->use_ids ? r->ids[i]
                      : nalar_argmax(r->logits + (size_t) i * r->vocab,
                                   r->vocab);
}


/*
 * Passes of n = 1..NALAR_BENCH_VERIFY tokens of one sequence at positions
 * pos0.. (a verification of k = n - 1 proposals), every row wanting its
 * token, as greedy verification runs; sec[n]: seconds per pass (n = 1 is a
 * decode step, replayed as a graph).  The passes rewrite the same
 * positions, so the context is the same for every n.
 */
#define NALAR_BENCH_VERIFY 9

static int
verify_curve(bench_run *r, nalar_seq_kv *seq, int32_t pos0,
             double sec[NALAR_BENCH_VERIFY + 1], nalar_err *err)
{
    int reps = 20;

    r->use_ids = r->be->forward_argmax != NULL;
    for (int32_t n = 1; n <= NALAR_BENCH_VERIFY; n++) {
        double t0 = 0;

        for (int i = 0; i < reps + 3; i++) {
            if (i == 3) {
                t0 = nalar_now_s();
            }
            for (int32_t j = 0; j < n; j++) {
                r->b.tokens[j] = (int32_t) ((j * 131 + 17) % r->vocab);
                r->b.pos[j] = pos0 + j;
                r->b.seq[j] = seq;
                r->b.want_logits[j] = 1;
            }
            if (i == reps + 2) {
                range_push("verify-%d", n);
            }
            if (step(r, n, err) != 0) {
                r->use_ids = 0;
                return -1;
            }
            if (i == reps + 2) {
                nvtxRangePop();
            }
        }
        sec[n] = (nalar_now_s() - t0) / reps;
        progress("verify pass of %d tokens of one sequence: %.3f ms, %.2fx "
                 "one token", n, sec[n] * 1e3, sec[n] / sec[1]);
    }
    r->use_ids = 0;
    return 0;
}


/*
 * Greedy decode steps of B sequences, seqs[0..B), from position pos0:
 * `warm` untimed steps (the first feeds first[s], each later one the last
 * step's greedy tokens), then `timed` ones.  Twice over the same
 * positions: as the engine's greedy steps run (the backend's argmax, when
 * it has one), then with the logits brought to the host.  tps[0] and
 * tps[1]: tokens/s each way (tps[1] left alone without an argmax).  The
 * last timed step of the first way is the NVTX range "decode-bB".
 */
static int
timed_decode(bench_run *r, nalar_seq_kv *seqs, int32_t B,
             const int32_t *first, int32_t pos0, int32_t warm, int32_t timed,
             double tps[2], nalar_err *err)
{
    for (int mode = 0; mode < 2; mode++) {
        int32_t n = warm + timed;
        double  t0 = 0;

        r->use_ids = mode == 0 && r->be->forward_argmax != NULL;
        if (mode == 1 && r->be->forward_argmax == NULL) {
            break;
        }
        for (int32_t i = 0; i < n; i++) {
            if (i == warm) {
                t0 = nalar_now_s();
            }
            for (int32_t s = 0; s < B; s++) {
                r->b.tokens[s] = i == 0 ? first[s] : next_token(r, s);
                r->b.pos[s] = pos0 + i;
                r->b.seq[s] = &seqs[s];
                r->b.want_logits[s] = 1;
            }
            if (i == n - 1 && mode == 0) {
                range_push("decode-b%d", B);
            }
            if (step(r, B, err) != 0) {
                r->use_ids = 0;
                return -1;
            }
            if (i == n - 1 && mode == 0) {
                nvtxRangePop();
            }
        }
        tps[mode] = (double) B * timed / (nalar_now_s() - t0);
        progress("decode batch %d, %s: %.2f tok/s", B,
                 r->use_ids ? "argmax on the device" : "logits to the host",
                 tps[mode]);
    }
    r->use_ids = 0;
    return 0;
}


/* what nalar_cuda_bench measures, and the shapes it measures at */
typedef struct {
    const char    *name;          /* the model's path or the shape's name */
    nalar_config   cfg;
    const int32_t *batches;
    int32_t        n_batches;     /* <= 16 */
    int32_t        P, N;          /* prompt tokens, decode steps */
    int32_t        actx;          /* the attention measure's context */
    int32_t        ctx_b;         /* each batched stream's context */
    int32_t        max_b;         /* the widest batch */
    int64_t        wbytes;        /* weight bytes read per token */
    double         bw, prefill_tps;
    double         dec_tps, dec_logits_tps, dec_gbs, dec_mma_tps;
    int32_t        dec_launch;
    double         ver[NALAR_BENCH_VERIFY + 1];
    double         ver_mma[NALAR_BENCH_VERIFY + 1];
    double         bat_tps[16], bat_logits_tps[16], bat_mma_tps[16];
    int32_t        bat_launch[16];
    double         att_gbs, att_us, att16_gbs, att16_us;
    int32_t        att_splits, att16_splits;
} bench_res;


/* The backend (a model's or a synthetic shape's) on o->device; *m the
 * model it loaded, if any.  0, or -1 with err. */
static int
bench_backend(const nalar_cuda_bench_opts *o, bench_run *r, bench_res *R,
              nalar_model **m, nalar_err *err)
{
    if (o->synthetic != NULL) {
        if (nalar_cuda_synthetic_config(o->synthetic, &R->cfg, err) != 0) {
            return -1;
        }
        r->be = nalar_cuda_backend_create_synthetic(&R->cfg,
                    o->type != 0 ? o->type : GGML_BF16, 42, o->device,
                    o->gemv_max, err);
        R->name = o->synthetic;
    } else {
        if (o->model_path == NULL) {
            return nalar_fail(err, "bench: a model (-m) or --synthetic SHAPE");
        }
        *m = nalar_model_load(o->model_path, err);
        if (*m == NULL) {
            return -1;
        }
        R->cfg = (*m)->cfg;
        r->be = nalar_cuda_backend_create(*m, o->device, o->gemv_max, err);
        R->name = o->model_path;
    }
    return r->be != NULL ? 0 : -1;
}


/* The KV pool and the host buffers of every measure: seqs and first
 * (max_b each).  0, or -1 with err. */
static int
bench_buffers(bench_run *r, const bench_res *R, nalar_seq_kv **seqs,
              int32_t **first, nalar_err *err)
{
    const nalar_config *cfg = &R->cfg;
    int32_t             n_blocks, cap_tok, rows;
    int32_t             P = R->P, N = R->N, ctx_b = R->ctx_b;
    int32_t             max_b = R->max_b;

    /* blocks for the longest of: the prompt and its decode, or every
     * batched stream with its context and decode */
    n_blocks = (P + N + 32) / NALAR_KV_BLOCK + 2;
    if (max_b * ((ctx_b + N + 32) / NALAR_KV_BLOCK + 2) > n_blocks) {
        n_blocks = max_b * ((ctx_b + N + 32) / NALAR_KV_BLOCK + 2);
    }
    if (nalar_kv_pool_init(&r->kv, n_blocks, cfg->n_layers,
                           cfg->n_kv_heads * cfg->head_dim, err) != 0)
    {
        return -1;
    }
    if (r->be->kv_alloc(r->be, &r->kv, err) != 0) {
        nalar_kv_pool_free(&r->kv);
        r->kv.n_blocks = 0;
        return -1;
    }
    cap_tok = P > max_b * ctx_b ? P : max_b * ctx_b;
    cap_tok = cap_tok > 4096 ? cap_tok : 4096;
    r->b.tokens = (int32_t *) calloc((size_t) cap_tok, sizeof(int32_t));
    r->b.pos = (int32_t *) calloc((size_t) cap_tok, sizeof(int32_t));
    r->b.seq = (nalar_seq_kv **) calloc((size_t) cap_tok,
                                        sizeof(nalar_seq_kv *));
    r->b.want_logits = (int8_t *) calloc((size_t) cap_tok, 1);
    /* logit rows: the widest batch, or a verification pass */
    rows = max_b > NALAR_BENCH_VERIFY ? max_b : NALAR_BENCH_VERIFY;
    r->logits = (float *) malloc((size_t) rows * cfg->n_vocab
                                 * sizeof(float));
    r->ids = (int32_t *) malloc((size_t) rows * sizeof(int32_t));
    *seqs = (nalar_seq_kv *) calloc((size_t) max_b, sizeof(nalar_seq_kv));
    *first = (int32_t *) malloc((size_t) max_b * sizeof(int32_t));
    if (r->b.tokens == NULL || r->b.pos == NULL || r->b.seq == NULL
        || r->b.want_logits == NULL || r->logits == NULL || r->ids == NULL
        || *seqs == NULL || *first == NULL)
    {
        return nalar_fail(err, "bench: out of host memory");
    }
    for (int i = 0; i < max_b; i++) {
        nalar_seq_kv_init(&(*seqs)[i]);
    }
    return 0;
}


/* prefill: the whole prompt in one pass, after a warm-up pass; leaves
 * seqs[0] holding it and its last logits.  0, or -1 with err. */
static int
bench_prefill(bench_run *r, bench_res *R, nalar_seq_kv *seqs, nalar_err *err)
{
    int32_t P = R->P;
    double  t0;

    if (nalar_seq_kv_reserve(&r->kv, &seqs[0], P + R->N + 16) != 0) {
        return nalar_fail(err, "bench: KV pool too small");
    }
    for (int rep = 0; rep < 2; rep++) {
        for (int32_t i = 0; i < P; i++) {
            r->b.tokens[i] = (int32_t) ((i * 7919 + 13) % R->cfg.n_vocab);
            r->b.pos[i] = i;
            r->b.seq[i] = &seqs[0];
            r->b.want_logits[i] = i == P - 1;
        }
        t0 = nalar_now_s();
        if (step(r, P, err) != 0) {
            return -1;
        }
        R->prefill_tps = P / (nalar_now_s() - t0);
        progress("prefill of %d tokens, pass %d: %.1f tok/s", P, rep + 1,
                 R->prefill_tps);
    }
    return 0;
}


/* decode at batch 1: 8 warm-up steps (graph capture), then N timed, from
 * the prompt's greedy token; the verify curve over the positions they
 * wrote; the same with BF16 projections on tensor cores (type BF16).
 * 0, or -1 with err. */
static int
bench_decode1(const nalar_cuda_bench_opts *o, bench_run *r, bench_res *R,
              nalar_seq_kv *seqs, int32_t *first, nalar_err *err)
{
    const nalar_config *cfg = &R->cfg;
    double              tps[2] = { 0, 0 }, kv_tok;
    int32_t             P = R->P, N = R->N;

    first[0] = nalar_argmax(r->logits, cfg->n_vocab);
    if (timed_decode(r, seqs, 1, first, P, 8, N, tps, err) != 0) {
        return -1;
    }
    R->dec_tps = tps[0];
    R->dec_logits_tps = tps[1];
    R->dec_launch = nalar_cuda_graph_kernels(r->be, 1);
    progress("decode batch 1: %d kernel launches a step", R->dec_launch);
    if (verify_curve(r, &seqs[0], P, R->ver, err) != 0) {
        return -1;
    }
    if (o->type == 0 || o->type == GGML_BF16) {
        tps[0] = tps[1] = 0;
        nalar_cuda_backend_gemv_mma(r->be, 1);
        if (timed_decode(r, seqs, 1, first, P, 8, N, tps, err) != 0
            || verify_curve(r, &seqs[0], P, R->ver_mma, err) != 0)
        {
            return -1;
        }
        R->dec_mma_tps = tps[0];
        nalar_cuda_backend_gemv_mma(r->be, 0);
    }
    nalar_seq_kv_release(&r->kv, &seqs[0]);
    /* KV read per token at the mean context of the timed steps */
    kv_tok = 2.0 * (P + 8 + N / 2) * cfg->n_kv_heads * cfg->head_dim
             * (double) sizeof(float) * cfg->n_layers;
    R->dec_gbs = ((double) R->wbytes + kv_tok) * R->dec_tps / 1e9;
    return 0;
}


/* batched decode: batches[k] streams with ctx_b-token contexts (written
 * up to 4096 tokens a pass), 4 warm-up steps, then timed ones, as at
 * batch 1 (and on tensor cores where batch 1 was).  0, or -1 with err. */
static int
bench_batched(bench_run *r, bench_res *R, int k, nalar_seq_kv *seqs,
              int32_t *first, nalar_err *err)
{
    int32_t B = R->batches[k], ctx_b = R->ctx_b;
    int32_t steps = R->N / 2 > 8 ? R->N / 2 : 8, V = R->cfg.n_vocab;
    double  tps[2] = { 0, 0 };

    for (int32_t s = 0; s < B; s++) {
        if (nalar_seq_kv_reserve(&r->kv, &seqs[s], ctx_b + steps + 8) != 0) {
            return nalar_fail(err, "bench: KV pool too small for %d streams",
                              B);
        }
    }
    for (int32_t done = 0; done < B * ctx_b;) {
        int32_t n = B * ctx_b - done < 4096 ? B * ctx_b - done : 4096;

        for (int32_t i = 0; i < n; i++) {
            int32_t g = done + i;

            r->b.tokens[i] = (int32_t) ((g * 31 + 7) % V);
            r->b.pos[i] = g % ctx_b;
            r->b.seq[i] = &seqs[g / ctx_b];
            r->b.want_logits[i] = 0;
        }
        if (step(r, n, err) != 0) {
            return -1;
        }
        done += n;
    }
    for (int32_t s = 0; s < B; s++) {
        first[s] = (int32_t) ((s * 17 + 5) % V);
    }
    if (timed_decode(r, seqs, B, first, ctx_b, 4, steps, tps, err) != 0) {
        return -1;
    }
    R->bat_tps[k] = tps[0];
    R->bat_logits_tps[k] = tps[1];
    R->bat_launch[k] = nalar_cuda_graph_kernels(r->be, B);
    progress("decode batch %d: %d kernel launches a step", B,
             R->bat_launch[k]);
    if (R->dec_mma_tps > 0 && B <= NALAR_CUDA_MMA_MAX) {
        nalar_cuda_backend_gemv_mma(r->be, 1);
        if (timed_decode(r, seqs, B, first, ctx_b, 4, steps, tps, err) != 0)
        {
            return -1;
        }
        R->bat_mma_tps[k] = tps[0];
        nalar_cuda_backend_gemv_mma(r->be, 0);
    }
    for (int32_t s = 0; s < B; s++) {
        nalar_seq_kv_release(&r->kv, &seqs[s]);
    }
    return 0;
}


/* the paged attention kernel alone (F32 and BF16 KV), the GEMV sweeps of
 * a synthetic shape's projections, and the split count against context.
 * 0, or -1 with err. */
static int
bench_kernels(const nalar_cuda_bench_opts *o, bench_res *R, nalar_err *err)
{
    const nalar_config *cfg = &R->cfg;
    int32_t             actx = R->actx;

    if (attention_bandwidth(o->device, cfg, actx, 0, -1, 0, &R->att_gbs,
                            &R->att_us, &R->att_splits, err) != 0)
    {
        return -1;
    }
    progress("paged attention, ctx %d, %d splits: %.1f us, %.1f GB/s", actx,
             R->att_splits, R->att_us, R->att_gbs);
    if (attention_bandwidth(o->device, cfg, actx, 0, -1, 1, &R->att16_gbs,
                            &R->att16_us, &R->att16_splits, err) != 0)
    {
        return -1;
    }
    progress("paged attention, ctx %d, BF16 KV, %d splits: %.1f us, %.1f "
             "GB/s", actx, R->att16_splits, R->att16_us, R->att16_gbs);
    if (o->synthetic != NULL
        && (gemv_sweep(o->device, 2 * (int64_t) cfg->ffn_dim, cfg->dim, err)
            != 0
            || gemv_sweep(o->device, cfg->dim, cfg->ffn_dim, err) != 0
            || gemv_sweep(o->device, (int64_t) cfg->dim
                          + 2 * (int64_t) cfg->n_kv_heads * cfg->head_dim,
                          cfg->dim, err) != 0))
    {
        return -1;
    }
    /* the split count against context, for choosing the engine's */
    for (int ci = 0; ci < 4; ci++) {
        static const int32_t sweep[] = { 16, 32, 64, 128, 256 };
        int32_t ctx = ci % 2 == 0 ? 2048 : actx, used;
        int     pf = ci < 2;
        double  g, u;

        for (size_t k = 0; k < sizeof(sweep) / sizeof(sweep[0]); k++) {
            if (attention_bandwidth(o->device, cfg, ctx, sweep[k], pf, 0,
                                    &g, &u, &used, err) != 0)
            {
                return -1;
            }
            progress("  sweep: ctx %d, %d splits, %s: %.1f us, %.1f GB/s",
                     ctx, used, pf ? "prefetch" : "no prefetch", u, g);
        }
    }
    return 0;
}


static void
bench_print_json(const bench_res *R)
{
    printf("{\"model\": \"%s\", \"copy_gbs\": %.1f, "
           "\"prefill_tokens\": %d, \"prefill_tps\": %.1f, "
           "\"decode_tps\": %.2f, \"decode_gbs\": %.1f, "
           "\"decode_bw_fraction\": %.3f, \"batched_tps\": {",
           R->name, R->bw, R->P, R->prefill_tps, R->dec_tps, R->dec_gbs,
           R->dec_gbs / R->bw);
    for (int k = 0; k < R->n_batches; k++) {
        printf("%s\"%d\": %.1f", k ? ", " : "", R->batches[k],
               R->bat_tps[k]);
    }
    printf("}, \"decode_logits_tps\": %.2f, \"batched_logits_tps\": {",
           R->dec_logits_tps);
    for (int k = 0; k < R->n_batches; k++) {
        printf("%s\"%d\": %.1f", k ? ", " : "", R->batches[k],
               R->bat_logits_tps[k]);
    }
    printf("}, \"launches_per_step\": {\"1\": %d", R->dec_launch);
    for (int k = 0; k < R->n_batches; k++) {
        printf(", \"%d\": %d", R->batches[k], R->bat_launch[k]);
    }
    printf("}, \"verify_ratio\": {");
    for (int n = 2; n <= NALAR_BENCH_VERIFY; n++) {
        printf("%s\"%d\": %.3f", n > 2 ? ", " : "", n,
               R->ver[n] / R->ver[1]);
    }
    printf("}, \"attn_ctx\": %d, \"attn_us\": %.1f, \"attn_gbs\": %.1f, "
           "\"attn_bw_fraction\": %.3f, \"attn_bf16_us\": %.1f, "
           "\"attn_bf16_gbs\": %.1f, \"attn_bf16_bw_fraction\": %.3f, "
           "\"weight_bytes\": %lld}\n",
           R->actx, R->att_us, R->att_gbs, R->att_gbs / R->bw, R->att16_us,
           R->att16_gbs, R->att16_gbs / R->bw, (long long) R->wbytes);
}


/* the decode rows of the table: batched, logits to the host (what a step
 * costs when any of its requests samples on the CPU), launches */
static void
bench_print_decode(const bench_res *R)
{
    char what[64];

    printf("%-34s %10.2f tok/s  %.1f GB/s = %.1f%% of copy bandwidth\n",
           "decode batch 1", R->dec_tps, R->dec_gbs,
           100.0 * R->dec_gbs / R->bw);
    for (int k = 0; k < R->n_batches; k++) {
        snprintf(what, sizeof(what), "decode batch %d", R->batches[k]);
        printf("%-34s %10.1f tok/s  %.1fx batch 1\n", what, R->bat_tps[k],
               R->bat_tps[k] / R->dec_tps);
    }
    if (R->dec_logits_tps > 0) {
        printf("%-34s %10.2f tok/s\n", "decode batch 1, logits to host",
               R->dec_logits_tps);
        for (int k = 0; k < R->n_batches; k++) {
            snprintf(what, sizeof(what), "decode batch %d, logits to host",
                     R->batches[k]);
            printf("%-34s %10.1f tok/s  %.1fx batch 1\n", what,
                   R->bat_logits_tps[k],
                   R->bat_logits_tps[k] / R->dec_logits_tps);
        }
    }
    printf("%-34s %10d       %.1f per token\n",
           "launches per step, batch 1", R->dec_launch,
           (double) R->dec_launch);
    for (int k = 0; k < R->n_batches; k++) {
        snprintf(what, sizeof(what), "launches per step, batch %d",
                 R->batches[k]);
        printf("%-34s %10d       %.2f per token\n", what, R->bat_launch[k],
               (double) R->bat_launch[k] / R->batches[k]);
    }
}


/* the verify curve, the tensor-core rows (gemv_mma.cu), attention */
static void
bench_print_rest(const bench_res *R)
{
    char what[64];

    for (int n = 1; n <= NALAR_BENCH_VERIFY; n++) {
        snprintf(what, sizeof(what), "verify pass, k+1 = %d", n);
        printf("%-34s %10.3f ms     %.3fx one token\n", what,
               R->ver[n] * 1e3, R->ver[n] / R->ver[1]);
    }
    if (R->dec_mma_tps > 0) {
        printf("%-34s %10.2f tok/s  %.2fx the GEMV's\n",
               "decode batch 1, mma", R->dec_mma_tps,
               R->dec_mma_tps / R->dec_tps);
        for (int k = 0; k < R->n_batches; k++) {
            if (R->bat_mma_tps[k] <= 0) {
                continue;
            }
            snprintf(what, sizeof(what), "decode batch %d, mma",
                     R->batches[k]);
            printf("%-34s %10.1f tok/s  %.1fx batch 1 (mma)\n", what,
                   R->bat_mma_tps[k], R->bat_mma_tps[k] / R->dec_mma_tps);
        }
        for (int n = 1; n <= NALAR_BENCH_VERIFY; n++) {
            snprintf(what, sizeof(what), "verify pass, k+1 = %d, mma", n);
            printf("%-34s %10.3f ms     %.3fx one token\n", what,
                   R->ver_mma[n] * 1e3, R->ver_mma[n] / R->ver_mma[1]);
        }
    }
    snprintf(what, sizeof(what), "paged attention, ctx %d", R->actx);
    printf("%-34s %10.1f GB/s  %.1f us in %d splits, %.1f%% of "
           "copy bandwidth\n", what, R->att_gbs, R->att_us, R->att_splits,
           100.0 * R->att_gbs / R->bw);
    snprintf(what, sizeof(what), "paged attention, ctx %d, BF16 KV",
             R->actx);
    printf("%-34s %10.1f GB/s  %.1f us in %d splits, %.1f%% of "
           "copy bandwidth\n", what, R->att16_gbs, R->att16_us,
           R->att16_splits, 100.0 * R->att16_gbs / R->bw);
}


static void
bench_print_text(const bench_res *R)
{
    const nalar_config *cfg = &R->cfg;

    printf("model %s: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, "
           "%.2f GB of weights read per token\n", R->name, cfg->dim,
           cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->ffn_dim,
           cfg->n_vocab, R->wbytes / 1e9);
    printf("%-34s %14s  %s\n", "measure", "value", "note");
    printf("%-34s %10.1f GB/s  %s\n", "HBM copy bandwidth (D2D)", R->bw,
           "read + write");
    printf("%-34s %10.1f tok/s\n", "prefill (one prompt)", R->prefill_tps);
    bench_print_decode(R);
    bench_print_rest(R);
}


/* Every measure in turn, once the backend is up. */
static int
bench_all(const nalar_cuda_bench_opts *o, bench_run *r, bench_res *R,
          nalar_seq_kv **seqs, int32_t **first, nalar_err *err)
{
    progress("%s: weights on the device", R->name);
    if (R->P + R->N + 16 > R->cfg.n_ctx && o->synthetic == NULL) {
        R->P = R->cfg.n_ctx - R->N - 16 > 16 ? R->cfg.n_ctx - R->N - 16
                                             : 16;
    }
    r->vocab = R->cfg.n_vocab;
    R->wbytes = nalar_cuda_weight_bytes(r->be);
    if (bench_buffers(r, R, seqs, first, err) != 0
        || bench_prefill(r, R, *seqs, err) != 0
        || bench_decode1(o, r, R, *seqs, *first, err) != 0)
    {
        return -1;
    }
    for (int k = 0; k < R->n_batches; k++) {
        if (bench_batched(r, R, k, *seqs, *first, err) != 0) {
            return -1;
        }
    }
    return bench_kernels(o, R, err);
}


int
nalar_cuda_bench(const nalar_cuda_bench_opts *o, nalar_err *err)
{
    static const int32_t dflt_batches[4] = { 8, 16, 32, 128 };
    bench_res            R;
    nalar_model         *m = NULL;
    bench_run            r;
    nalar_seq_kv        *seqs = NULL;
    int32_t             *first = NULL;   /* (max_b) the first step's tokens */
    int                  rc = -1;

    memset(&r, 0, sizeof(r));
    memset(&R, 0, sizeof(R));
    R.batches = o->n_batches > 0 ? o->batches : dflt_batches;
    R.n_batches = o->n_batches > 0 ? o->n_batches : 4;
    R.P = o->prefill > 0 ? o->prefill : 2048;
    R.N = o->n_decode > 0 ? o->n_decode : 64;
    R.actx = o->attn_ctx > 0 ? o->attn_ctx : 8192;
    R.ctx_b = 128;
    R.max_b = 1;
    R.dec_launch = -1;
    if (nalar_cuda_device_count() <= o->device || o->device < 0) {
        return nalar_fail(err, "bench: no CUDA device %d", o->device);
    }
    for (int i = 0; i < R.n_batches && i < 16; i++) {
        R.max_b = R.batches[i] > R.max_b ? R.batches[i] : R.max_b;
    }
    R.n_batches = R.n_batches < 16 ? R.n_batches : 16;
    if (copy_bandwidth(o->device, &R.bw, err) != 0) {
        return -1;
    }
    progress("HBM copy bandwidth %.1f GB/s", R.bw);
    if (bench_backend(o, &r, &R, &m, err) == 0
        && bench_all(o, &r, &R, &seqs, &first, err) == 0)
    {
        if (o->json) {
            bench_print_json(&R);
        } else {
            bench_print_text(&R);
        }
        rc = 0;
    }
    if (seqs != NULL) {
        for (int i = 0; i < R.max_b; i++) {
            nalar_seq_kv_release(&r.kv, &seqs[i]);
        }
    }
    free(seqs);
    free(first);
    free(r.b.tokens);
    free(r.b.pos);
    free(r.b.seq);
    free(r.b.want_logits);
    free(r.logits);
    free(r.ids);
    if (r.be != NULL) {
        if (r.kv.n_blocks > 0) {
            r.be->kv_free(r.be, &r.kv);
            nalar_kv_pool_free(&r.kv);
        }
        r.be->destroy(r.be);
    }
    if (m != NULL) {
        nalar_model_destroy(m);
    }
    return rc;
}
