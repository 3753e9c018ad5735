/*
 * The CUDA backend: a Llama forward pass over a batch of tokens from many
 * sequences, reading K/V from the paged pool in device memory.  The pass
 * mirrors kernels/cpu/cpu_backend.c step for step:
 *
 *   x = embed(tokens)
 *   per layer:  xb = rmsnorm(x) * attn_norm
 *               q|k|v = xb [Wq|Wk|Wv]^T (+ biases), RoPE on q and k
 *               (qwen3: each q and k head RMS-normalised first)
 *               K/V of every token -> its sequence's blocks
 *               att = paged attention (decode: split-K; chunks: tiles;
 *                     gemma2: soft-capped scores, sliding window)
 *               x += att Wo^T  (gemma2: x += rmsnorm(att Wo^T) * post)
 *               xb = rmsnorm(x) * ffn_norm
 *               g|u = xb [Wg|Wu]^T;  g = silu(g) * u (gemma2: gelu);
 *               x += g Wd^T  (gemma2: post-normed, as above)
 *   logits = (rmsnorm(x[rows wanting logits]) * out_norm) Wout^T
 *            (gemma2: embeddings scaled on input, logits soft-capped)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act.cuh"
#include "argmax.cuh"
#include "attention.cuh"
#include "common.cuh"
#include "embed.cuh"
#include "gemv_kq.cuh"
#include "kv.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "rope.cuh"

extern "C" {
#include "cuda_backend.h"
#include "cuda_plan.h"
}

#define N_GRAPHS 10                   /* buckets 1, 2, 4, ... 512 */

/* one output row space computed by up to three matrices (q|k|v, g|u):
 * part i writes output columns [off[i], off[i] + part[i].rows) */
typedef struct {
    nalar_cuda_mat part[3];
    int64_t        off[3];
    int            n;
} fused_mat;

typedef struct {
    float         *attn_norm;   /* (dim) */
    float         *ffn_norm;    /* (dim) */
    float         *bqkv;        /* (q_dim + 2 kv_dim) qwen2 biases or NULL */
    float         *q_norm;      /* (head_dim) qwen3 per-head norms or NULL */
    float         *k_norm;
    float         *post_attn;   /* (dim) gemma2 post-norms or NULL */
    float         *post_ffn;
    fused_mat      qkv;         /* (q_dim + 2 kv_dim, dim) */
    fused_mat      gu;          /* (2 ffn, dim): gate rows, then up rows */
    nalar_cuda_mat wo;          /* (dim, q_dim) */
    nalar_cuda_mat down;        /* (dim, ffn) */
} cu_layer;

typedef struct {
    nalar_model    *m;
    nalar_model    *stub;        /* synthetic: owned */
    nalar_cuda_ctx  c;
    int             have_ctx;
    cu_layer       *L;           /* (n_layers) */
    nalar_cuda_mat  tok_embd;    /* (n_vocab, dim) */
    nalar_cuda_mat  output;      /* (n_vocab, dim); may share tok_embd */
    float          *out_norm;    /* (dim) */
    float          *inv_freq;    /* (head_dim / 2) */
    void          **allocs;      /* every device allocation of weights */
    int             n_allocs, cap_allocs;
    int64_t         weight_bytes;
    int32_t         q_dim, kv_dim, ldqkv, tile_q, n_chunks;
    /* activations for cap_tok tokens (device) */
    int32_t         cap_tok;
    float          *x;           /* (cap_tok, dim) residual stream */
    float          *xb;          /* (cap_tok, dim) normalised */
    float          *qkv;         /* (cap_tok, ldqkv) */
    float          *att;         /* (cap_tok, q_dim) */
    float          *hgu;         /* (cap_tok, 2 ffn) gate|up */
    float          *logits_d;    /* (cap_logits, n_vocab) */
    float          *part;        /* attention partials */
    int64_t         part_cap;    /* floats */
    /* batch staging: pinned host ints -> device ints, one copy */
    int32_t        *in_h, *in_d;
    int64_t         in_cap;      /* ints */
    float          *logits_h;    /* pinned (cap_logits, n_vocab) */
    int32_t        *ids_d;       /* (cap_logits) argmax of each row */
    int32_t        *ids_h;       /* pinned (cap_logits) */
    int32_t         cap_logits;
    /* the pool this backend allocated */
    nalar_kv_pool  *pool;
    nalar_cuda_kv   kv;
    /* decode graphs, by log2 of the padded token count */
    cudaGraphExec_t graph[N_GRAPHS];
    int             seen[N_GRAPHS];   /* eager runs; -1: not capturable */
    int32_t         graph_kernels[N_GRAPHS]; /* kernel nodes of each */
    /* an error in the copy-on-write callback (which cannot return one) */
    int             copy_failed;
    nalar_err       copy_err;
} cuda_backend;


/* --- device memory --- */

static int
track(cuda_backend *be, void *p, nalar_err *err)
{
    if (be->n_allocs == be->cap_allocs) {
        int    cap = be->cap_allocs ? 2 * be->cap_allocs : 64;
        void **a = (void **) realloc(be->allocs, (size_t) cap
                                                 * sizeof(void *));

        if (a == NULL) {
            cudaFree(p);
            return nalar_fail(err, "cuda backend: out of host memory");
        }
        be->allocs = a;
        be->cap_allocs = cap;
    }
    be->allocs[be->n_allocs++] = p;
    return 0;
}


static int
dev_alloc(cuda_backend *be, size_t bytes, void **p, nalar_err *err)
{
    cudaError_t e = cudaMalloc(p, bytes);

    if (e != cudaSuccess) {
        *p = NULL;
        return nalar_fail(err, "cuda backend: cannot allocate %zu MiB of "
                          "device memory: %s", bytes >> 20,
                          cudaGetErrorString(e));
    }
    return track(be, *p, err);
}


static size_t
elem_size(ggml_type t)
{
    return t == GGML_F32 ? 4 : t == GGML_Q8_0 ? 1 : 2;
}


static int
upload_f32(cuda_backend *be, const float *src, int64_t n, float **dst,
           nalar_err *err)
{
    if (src == NULL) {
        *dst = NULL;
        return 0;
    }
    if (dev_alloc(be, (size_t) n * sizeof(float), (void **) dst, err) != 0) {
        return -1;
    }
    CUDA_CHECK(err, cudaMemcpy(*dst, src, (size_t) n * sizeof(float),
                               cudaMemcpyHostToDevice));
    return 0;
}


/* Rows of several host matrices of one ggml-blocked type (Q4_0, Q4_K,
 * Q5_K, Q6_K) and width, stacked into one device matrix of blocks as the
 * file stores them. */
static int
upload_blocks(cuda_backend *be, const nalar_mat *const *src, int n,
              int64_t rows, nalar_cuda_mat *dst, nalar_err *err)
{
    ggml_type t = src[0]->type;
    int64_t   cols = src[0]->cols, r0 = 0;
    size_t    rs = (size_t) ggml_row_size(t, (uint64_t) cols);

    if (cols % (t == GGML_Q4_0 ? 32 : QK_K) != 0) {
        return nalar_fail(err, "cuda backend: %s rows of %lld",
                          ggml_type_name(t), (long long) cols);
    }
    memset(dst, 0, sizeof(*dst));
    dst->type = t;
    dst->rows = rows;
    dst->cols = cols;
    if (dev_alloc(be, rs * (size_t) rows, &dst->data, err) != 0) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        CUDA_CHECK(err, cudaMemcpy((char *) dst->data + rs * (size_t) r0,
                                   src[i]->data,
                                   rs * (size_t) src[i]->rows,
                                   cudaMemcpyHostToDevice));
        r0 += src[i]->rows;
    }
    be->weight_bytes += (int64_t) (rs * (size_t) rows);
    return 0;
}


/* Rows of several host matrices of one type and width, stacked into one
 * device matrix. */
static int
upload_stack(cuda_backend *be, const nalar_mat *const *src, int n,
             nalar_cuda_mat *dst, nalar_err *err)
{
    ggml_type t = src[0]->type;
    int64_t   cols = src[0]->cols, rows = 0, r0 = 0;

    for (int i = 0; i < n; i++) {
        if (src[i]->type != t || src[i]->cols != cols) {
            return nalar_fail(err, "cuda backend: stacked matrices differ");
        }
        rows += src[i]->rows;
    }
    if (nalar_cuda_kq_type(t)) {
        return upload_blocks(be, src, n, rows, dst, err);
    }
    if (t != GGML_F32 && t != GGML_F16 && t != GGML_BF16 && t != GGML_Q8_0) {
        return nalar_fail(err, "cuda backend: weights of type %s are not "
                          "supported (" GGML_TYPES_SUPPORTED ")",
                          ggml_type_name(t));
    }
    memset(dst, 0, sizeof(*dst));
    dst->type = t;
    dst->rows = rows;
    dst->cols = cols;
    if (dev_alloc(be, (size_t) (rows * cols) * elem_size(t), &dst->data,
                  err) != 0)
    {
        return -1;
    }
    if (t == GGML_Q8_0) {
        if (cols % QK8_0 != 0
            || dev_alloc(be, (size_t) (rows * (cols / QK8_0)) * 2,
                         (void **) &dst->scales, err) != 0)
        {
            return cols % QK8_0 != 0
                   ? nalar_fail(err, "cuda backend: Q8_0 rows of %lld",
                                (long long) cols)
                   : -1;
        }
    }
    for (int i = 0; i < n; i++) {
        int64_t r = src[i]->rows;

        if (t == GGML_Q8_0) {
            int8_t   *qs = (int8_t *) malloc((size_t) (r * cols));
            uint16_t *sc = (uint16_t *) malloc((size_t) (r * (cols / QK8_0))
                                               * 2);
            int       rc;

            rc = qs != NULL && sc != NULL
                 ? nalar_q8_0_repack(src[i]->data, r, cols, qs, sc, err)
                 : nalar_fail(err, "cuda backend: out of host memory");
            if (rc == 0
                && (cudaMemcpy((int8_t *) dst->data + r0 * cols, qs,
                               (size_t) (r * cols), cudaMemcpyHostToDevice)
                        != cudaSuccess
                    || cudaMemcpy(dst->scales + r0 * (cols / QK8_0), sc,
                                  (size_t) (r * (cols / QK8_0)) * 2,
                                  cudaMemcpyHostToDevice) != cudaSuccess))
            {
                rc = nalar_fail(err, "cuda backend: uploading Q8_0 weights "
                                "failed");
            }
            free(qs);
            free(sc);
            if (rc != 0) {
                return -1;
            }
        } else {
            CUDA_CHECK(err, cudaMemcpy((char *) dst->data
                                       + (size_t) (r0 * cols) * elem_size(t),
                                       src[i]->data,
                                       (size_t) (r * cols) * elem_size(t),
                                       cudaMemcpyHostToDevice));
        }
        r0 += r;
    }
    be->weight_bytes += (int64_t) rows * cols * (int64_t) elem_size(t)
                        + (t == GGML_Q8_0 ? rows * (cols / QK8_0) * 2 : 0);
    return 0;
}


/* q|k|v or gate|up: one matrix when the types agree, else one per part */
static int
upload_fused(cuda_backend *be, const nalar_mat *const *src, int n,
             fused_mat *f, nalar_err *err)
{
    int same = 1;

    memset(f, 0, sizeof(*f));
    for (int i = 1; i < n; i++) {
        same &= src[i]->type == src[0]->type && src[i]->cols == src[0]->cols;
    }
    if (same) {
        f->n = 1;
        return upload_stack(be, src, n, &f->part[0], err);
    }
    for (int i = 0; i < n; i++) {
        f->off[i] = i == 0 ? 0 : f->off[i - 1] + src[i - 1]->rows;
        if (upload_stack(be, &src[i], 1, &f->part[i], err) != 0) {
            return -1;
        }
    }
    f->n = n;
    return 0;
}


/* --- activations and staging --- */

static void
drop_graphs(cuda_backend *be)
{
    for (int i = 0; i < N_GRAPHS; i++) {
        if (be->graph[i] != NULL) {
            cudaGraphExecDestroy(be->graph[i]);
            be->graph[i] = NULL;
        }
        be->seen[i] = 0;
    }
}


static void
free_acts(cuda_backend *be)
{
    cudaFree(be->x);
    cudaFree(be->xb);
    cudaFree(be->qkv);
    cudaFree(be->att);
    cudaFree(be->hgu);
    be->x = be->xb = be->qkv = be->att = be->hgu = NULL;
    be->cap_tok = 0;
}


static void
free_logits(cuda_backend *be)
{
    cudaFree(be->logits_d);
    cudaFreeHost(be->logits_h);
    cudaFree(be->ids_d);
    cudaFreeHost(be->ids_h);
    be->logits_d = be->logits_h = NULL;
    be->ids_d = be->ids_h = NULL;
    be->cap_logits = 0;
}


/* Room for n tokens, n_rows rows of logits, `ints` staging ints and
 * `part` partial floats, and the matmul scratch for n tokens; anything
 * reallocated invalidates the captured graphs (they hold the old
 * addresses). */
static int
reserve(cuda_backend *be, int32_t n, int32_t n_rows, int64_t ints,
        int64_t part, nalar_err *err)
{
    const nalar_config *c = &be->m->cfg;
    size_t              need = 0;

    if (n > be->cap_tok) {
        int32_t cap = be->cap_tok ? be->cap_tok : 16;

        while (cap < n) {
            cap *= 2;
        }
        drop_graphs(be);
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        free_acts(be);
#define DALLOC(p, count) CUDA_CHECK(err, cudaMalloc((void **) &(p),          \
                                    (size_t) (count) * sizeof(*(p))))
        DALLOC(be->x, (int64_t) cap * c->dim);
        DALLOC(be->xb, (int64_t) cap * c->dim);
        DALLOC(be->qkv, (int64_t) cap * be->ldqkv);
        DALLOC(be->att, (int64_t) cap * be->q_dim);
        DALLOC(be->hgu, (int64_t) cap * 2 * c->ffn_dim);
        be->cap_tok = cap;
    }
    if (n_rows > be->cap_logits) {
        int32_t cap = be->cap_logits ? be->cap_logits : 8;

        while (cap < n_rows) {
            cap *= 2;
        }
        drop_graphs(be);
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        free_logits(be);
        DALLOC(be->logits_d, (int64_t) cap * c->n_vocab);
        DALLOC(be->ids_d, cap);
        CUDA_CHECK(err, cudaMallocHost((void **) &be->logits_h,
                                       (size_t) cap * c->n_vocab
                                       * sizeof(float)));
        CUDA_CHECK(err, cudaMallocHost((void **) &be->ids_h,
                                       (size_t) cap * sizeof(int32_t)));
        be->cap_logits = cap;
    }
    if (ints > be->in_cap) {
        int64_t cap = be->in_cap ? be->in_cap : 4096;

        while (cap < ints) {
            cap *= 2;
        }
        drop_graphs(be);
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        cudaFree(be->in_d);
        cudaFreeHost(be->in_h);
        be->in_d = be->in_h = NULL;
        be->in_cap = 0;
        DALLOC(be->in_d, cap);
        CUDA_CHECK(err, cudaMallocHost((void **) &be->in_h,
                                       (size_t) cap * sizeof(int32_t)));
        be->in_cap = cap;
    }
    if (part > be->part_cap) {
        drop_graphs(be);
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        cudaFree(be->part);
        be->part = NULL;
        be->part_cap = 0;
        DALLOC(be->part, part);
        be->part_cap = part;
#undef DALLOC
    }
    /* matmul scratch: the largest any product of this step asks for */
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer *L = &be->L[l];
        size_t          s;

        for (int i = 0; i < L->qkv.n; i++) {
            s = nalar_cuda_matmul_scratch_bytes(&be->c, &L->qkv.part[i], n);
            need = s > need ? s : need;
        }
        for (int i = 0; i < L->gu.n; i++) {
            s = nalar_cuda_matmul_scratch_bytes(&be->c, &L->gu.part[i], n);
            need = s > need ? s : need;
        }
        s = nalar_cuda_matmul_scratch_bytes(&be->c, &L->wo, n);
        need = s > need ? s : need;
        s = nalar_cuda_matmul_scratch_bytes(&be->c, &L->down, n);
        need = s > need ? s : need;
    }
    need = nalar_cuda_matmul_scratch_bytes(&be->c, &be->output, n) > need
           ? nalar_cuda_matmul_scratch_bytes(&be->c, &be->output, n) : need;
    if (need > be->c.scratch_bytes) {
        void *p;

        drop_graphs(be);
        if (nalar_cuda_scratch(&be->c, need, &p, err) != 0) {
            return -1;
        }
    }
    return 0;
}


/* --- the forward pass --- */

static int
matmul_fused(cuda_backend *be, const fused_mat *f, const float *x,
             int64_t ldx, int32_t n, float *y, int64_t ldy, nalar_err *err)
{
    for (int i = 0; i < f->n; i++) {
        if (nalar_cuda_matmul(&be->c, &f->part[i], x, ldx, n, y + f->off[i],
                              ldy, 0, err) != 0)
        {
            return -1;
        }
    }
    return 0;
}


/* Every launch of one pass over n (possibly padded) tokens whose staging
 * ints are on the device; n_logits rows of logits come out.  Launches
 * only: this is what a graph captures. */
static int
run_pass(cuda_backend *be, const nalar_cuda_plan *plan, int32_t n,
         int32_t n_logits, nalar_err *err)
{
    const nalar_config *c = &be->m->cfg;
    nalar_cuda_ctx     *cx = &be->c;
    int32_t             P = plan->n_pad;
    const int32_t      *tokens = be->in_d + NALAR_CUDA_PLAN_TOKENS(P);
    const int32_t      *pos = be->in_d + NALAR_CUDA_PLAN_POS(P);
    const int32_t      *tbl_off = be->in_d + NALAR_CUDA_PLAN_TBLOFF(P);
    const int32_t      *logit_rows = be->in_d + NALAR_CUDA_PLAN_LOGITS(P);
    const int32_t      *tiles = be->in_d + NALAR_CUDA_PLAN_TILES(P);
    const int32_t      *tables = be->in_d + NALAR_CUDA_PLAN_TABLES(P);
    int                 decode = plan->max_tile <= 1;
    int32_t             dim = c->dim, ffn = c->ffn_dim, hd = c->head_dim;
    int32_t             splits = nalar_cuda_attn_splits(
                            n, c->n_kv_heads * be->n_chunks, cx->sm_count, 0);

#define RUN(call) do { if ((call) != 0) return -1; } while (0)
    RUN(nalar_cuda_embed(cx, &be->tok_embd, tokens, n, be->x, dim, err));
    if (c->embd_scale != 1.0f) {
        RUN(nalar_cuda_map(cx, be->x, dim, n, dim, 0, c->embd_scale, err));
    }
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer      *L = &be->L[l];
        nalar_cuda_attn_opts ao;

        ao.scale = c->attn_scale;
        ao.softcap = c->attn_softcap;
        ao.window = nalar_layer_window(c, l);

        RUN(nalar_cuda_rmsnorm(cx, be->xb, dim, be->x, dim, NULL, n,
                               L->attn_norm, dim, c->norm_eps, err));
        RUN(matmul_fused(be, &L->qkv, be->xb, dim, n, be->qkv, be->ldqkv,
                         err));
        if (L->bqkv != NULL) {
            RUN(nalar_cuda_add_bias(cx, be->qkv, be->ldqkv, n, L->bqkv,
                                    be->ldqkv, err));
        }
        for (int32_t h = 0; L->q_norm != NULL
                            && h < c->n_heads + c->n_kv_heads; h++)
        {
            float *qh = be->qkv + (int64_t) h * hd;

            RUN(nalar_cuda_rmsnorm(cx, qh, be->ldqkv, qh, be->ldqkv, NULL, n,
                                   h < c->n_heads ? L->q_norm : L->k_norm,
                                   hd, c->norm_eps, err));
        }
        /* q heads then k heads are adjacent: one launch rotates both */
        RUN(nalar_cuda_rope(cx, be->qkv, be->ldqkv, pos, n,
                            c->n_heads + c->n_kv_heads, hd, be->inv_freq,
                            c->rope_neox, err));
        RUN(nalar_cuda_kv_append(cx, &be->kv, l, be->qkv, be->ldqkv,
                                 be->q_dim, be->q_dim + be->kv_dim, pos,
                                 tbl_off, tables, n, err));
        if (decode) {
            RUN(nalar_cuda_attn_decode_opts(cx, be->att, be->q_dim, be->qkv,
                                            be->ldqkv, &be->kv, l, pos,
                                            tbl_off, tables, n, c->n_heads,
                                            c->n_kv_heads, hd, splits,
                                            be->part, &ao, err));
        } else {
            RUN(nalar_cuda_attn_prefill_opts(cx, be->att, be->q_dim,
                                             be->qkv, be->ldqkv, &be->kv, l,
                                             pos, tbl_off, tables, tiles,
                                             plan->n_tiles, c->n_heads,
                                             c->n_kv_heads, hd, &ao, err));
        }
        if (L->post_attn != NULL) {
            RUN(nalar_cuda_matmul(cx, &L->wo, be->att, be->q_dim, n, be->xb,
                                  dim, 0, err));
            RUN(nalar_cuda_rmsnorm(cx, be->xb, dim, be->xb, dim, NULL, n,
                                   L->post_attn, dim, c->norm_eps, err));
            RUN(nalar_cuda_add(cx, be->x, dim, be->xb, dim, n, dim, err));
        } else {
            RUN(nalar_cuda_matmul(cx, &L->wo, be->att, be->q_dim, n, be->x,
                                  dim, 1, err));
        }
        RUN(nalar_cuda_rmsnorm(cx, be->xb, dim, be->x, dim, NULL, n,
                               L->ffn_norm, dim, c->norm_eps, err));
        RUN(matmul_fused(be, &L->gu, be->xb, dim, n, be->hgu, 2 * ffn, err));
        if (c->ffn_gelu) {
            RUN(nalar_cuda_geglu(cx, be->hgu, be->hgu + ffn, 2 * ffn, n, ffn,
                                 err));
        } else {
            RUN(nalar_cuda_swiglu(cx, be->hgu, be->hgu + ffn, 2 * ffn, n,
                                  ffn, err));
        }
        if (L->post_ffn != NULL) {
            RUN(nalar_cuda_matmul(cx, &L->down, be->hgu, 2 * ffn, n, be->xb,
                                  dim, 0, err));
            RUN(nalar_cuda_rmsnorm(cx, be->xb, dim, be->xb, dim, NULL, n,
                                   L->post_ffn, dim, c->norm_eps, err));
            RUN(nalar_cuda_add(cx, be->x, dim, be->xb, dim, n, dim, err));
        } else {
            RUN(nalar_cuda_matmul(cx, &L->down, be->hgu, 2 * ffn, n, be->x,
                                  dim, 1, err));
        }
    }
    RUN(nalar_cuda_rmsnorm(cx, be->xb, dim, be->x, dim, logit_rows, n_logits,
                           be->out_norm, dim, c->norm_eps, err));
    RUN(nalar_cuda_matmul(cx, &be->output, be->xb, dim, n_logits,
                          be->logits_d, c->n_vocab, 0, err));
    if (c->final_softcap > 0.0f) {
        RUN(nalar_cuda_map(cx, be->logits_d, c->n_vocab, n_logits,
                           c->n_vocab, 1, c->final_softcap, err));
    }
#undef RUN
    return 0;
}


/* The kernel launches a captured graph replays (-1: cannot tell). */
static int32_t
graph_kernel_nodes(cudaGraph_t g)
{
    size_t             n = 0;
    int32_t            k = 0;
    cudaGraphNode_t   *nodes;
    cudaGraphNodeType  t;

    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) {
        return -1;
    }
    nodes = (cudaGraphNode_t *) malloc((n > 0 ? n : 1) * sizeof(*nodes));
    if (nodes == NULL || cudaGraphGetNodes(g, nodes, &n) != cudaSuccess) {
        free(nodes);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        k += cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess
             && t == cudaGraphNodeTypeKernel;
    }
    free(nodes);
    return k;
}


void
nalar_cuda_backend_gemv_mma(nalar_backend *b, int on)
{
    cuda_backend *be = (cuda_backend *) b->impl;

    if (be->c.gemv_mma != (on != 0)) {
        cudaSetDevice(be->c.device);
        if (be->c.stream != NULL) {
            cudaStreamSynchronize(be->c.stream);
        }
        drop_graphs(be);
        be->c.gemv_mma = on != 0;
    }
}


int32_t
nalar_cuda_graph_kernels(const nalar_backend *b, int32_t n_tokens)
{
    const cuda_backend *be = (const cuda_backend *) b->impl;
    int                 gi = 0;

    while ((1 << gi) < nalar_cuda_bucket(n_tokens)) {
        gi++;
    }
    return gi < N_GRAPHS && be->graph[gi] != NULL ? be->graph_kernels[gi]
                                                  : -1;
}


/* Replay (or capture, the second time a bucket is seen) the graph of a
 * padded decode step; returns 1 when the caller should run eagerly. */
static int
run_graph(cuda_backend *be, const nalar_cuda_plan *plan, nalar_err *err)
{
    int          gi = 0;
    cudaGraph_t  g = NULL;
    cudaError_t  e;
    int          rc;

    while ((1 << gi) < plan->n_pad) {
        gi++;
    }
    if (gi >= N_GRAPHS || be->seen[gi] < 0) {
        return 1;
    }
    if (be->graph[gi] == NULL) {
        if (be->seen[gi]++ == 0) {
            return 1;                  /* first time: shapes still settling */
        }
        CUDA_CHECK(err, cudaStreamBeginCapture(be->c.stream,
                                               cudaStreamCaptureModeThreadLocal));
        rc = run_pass(be, plan, plan->n_pad, plan->n_pad, err);
        e = cudaStreamEndCapture(be->c.stream, &g);
        if (rc != 0) {
            if (g != NULL) {
                cudaGraphDestroy(g);
            }
            return -1;
        }
        if (e != cudaSuccess
            || cudaGraphInstantiate(&be->graph[gi], g, 0) != cudaSuccess)
        {
            /* not capturable here: run this bucket eagerly from now on */
            cudaGetLastError();
            be->graph[gi] = NULL;
            be->seen[gi] = -1;
            if (g != NULL) {
                cudaGraphDestroy(g);
            }
            return 1;
        }
        be->graph_kernels[gi] = graph_kernel_nodes(g);
        cudaGraphDestroy(g);
    }
    CUDA_CHECK(err, cudaGraphLaunch(be->graph[gi], be->c.stream));
    return 0;
}


/* One pass; then either the logit rows to `logits` or, with ids != NULL,
 * each row's argmax (computed on the device: n ints cross the bus, not
 * n x n_vocab floats). */
static int
forward_to(nalar_backend *b, nalar_kv_pool *pool, const nalar_batch *batch,
           float *logits, int32_t *ids, nalar_err *err)
{
    cuda_backend       *be = (cuda_backend *) b->impl;
    const nalar_config *c = &be->m->cfg;
    int32_t             T = batch->n_tokens, P = T;
    int                 decode_step = T > 0 && batch->n_logits == T;
    nalar_cuda_plan     plan;
    int64_t             ints, part;
    int                 rc = 1;

    if (be->copy_failed) {
        *err = be->copy_err;
        return -1;
    }
    if (pool != be->pool || pool->k == NULL) {
        return nalar_fail(err, "cuda backend: forward on a KV pool this "
                          "backend did not allocate");
    }
    if (T < 0 || batch->n_logits < 0 || batch->n_logits > T) {
        return nalar_fail(err, "cuda backend: %d tokens with %d logits", T,
                          batch->n_logits);
    }
    CUDA_CHECK(err, cudaSetDevice(be->c.device));
    /* a decode step: one token per sequence, every token wants logits */
    for (int32_t t = 1; t < T && decode_step; t++) {
        decode_step = batch->seq[t] != batch->seq[t - 1];
    }
    if (decode_step) {
        P = nalar_cuda_bucket(T);
    }
    ints = nalar_cuda_plan_ints(batch, P);
    part = nalar_cuda_attn_part_floats(
               P, c->n_heads, c->head_dim,
               nalar_cuda_attn_splits(P, c->n_kv_heads * be->n_chunks,
                                      be->c.sm_count, 0));
    if (reserve(be, P > 0 ? P : 1, decode_step ? P : batch->n_logits, ints,
                part, err) != 0
        || nalar_cuda_plan_fill(batch, c->n_vocab, be->tile_q, P, be->in_h,
                                be->in_cap, &plan, err) != 0)
    {
        return -1;
    }
    if (T == 0) {
        return 0;
    }
    CUDA_CHECK(err, cudaMemcpyAsync(be->in_d, be->in_h,
                                    (size_t) plan.n_ints * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, be->c.stream));
    if (decode_step && plan.max_tile == 1) {
        rc = run_graph(be, &plan, err);
        if (rc < 0) {
            return -1;
        }
    }
    if (rc == 1
        && run_pass(be, &plan, P, decode_step ? P : plan.n_logits, err) != 0)
    {
        return -1;
    }
    if (plan.n_logits > 0 && ids != NULL) {
        size_t bytes = (size_t) plan.n_logits * sizeof(int32_t);

        if (nalar_cuda_argmax(&be->c, be->logits_d, c->n_vocab,
                              plan.n_logits, c->n_vocab, be->ids_d, err)
            != 0)
        {
            return -1;
        }
        CUDA_CHECK(err, cudaMemcpyAsync(be->ids_h, be->ids_d, bytes,
                                        cudaMemcpyDeviceToHost,
                                        be->c.stream));
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        memcpy(ids, be->ids_h, bytes);
    } else if (plan.n_logits > 0) {
        size_t bytes = (size_t) plan.n_logits * c->n_vocab * sizeof(float);

        CUDA_CHECK(err, cudaMemcpyAsync(be->logits_h, be->logits_d, bytes,
                                        cudaMemcpyDeviceToHost,
                                        be->c.stream));
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
        memcpy(logits, be->logits_h, bytes);
    } else {
        CUDA_CHECK(err, cudaStreamSynchronize(be->c.stream));
    }
    return 0;
}


static int
cuda_forward(nalar_backend *b, nalar_kv_pool *pool, const nalar_batch *batch,
             float *logits, nalar_err *err)
{
    return forward_to(b, pool, batch, logits, NULL, err);
}


static int
cuda_forward_argmax(nalar_backend *b, nalar_kv_pool *pool,
                    const nalar_batch *batch, int32_t *ids, float *scratch,
                    nalar_err *err)
{
    (void) scratch;     /* the logits stay on the device */
    return forward_to(b, pool, batch, NULL, ids, err);
}


/* --- KV pool --- */

static void
cuda_kv_copy(void *ctx, int32_t dst, int32_t src)
{
    cuda_backend *be = (cuda_backend *) ctx;

    if (be->copy_failed) {
        return;
    }
    if (cudaSetDevice(be->c.device) != cudaSuccess
        || nalar_cuda_kv_copy_block(&be->c, &be->kv, dst, src,
                                    &be->copy_err) != 0)
    {
        if (be->copy_err.msg[0] == '\0') {
            nalar_fail(&be->copy_err, "cuda backend: KV block copy failed");
        }
        be->copy_failed = 1;
    }
}


static int
cuda_kv_alloc(nalar_backend *b, nalar_kv_pool *p, nalar_err *err)
{
    cuda_backend *be = (cuda_backend *) b->impl;
    int           bf16 = b->kv_type == GGML_BF16;
    int32_t       elem = nalar_kv_elem_bytes(b->kv_type);
    size_t        bytes = (size_t) p->n_blocks * p->n_layers * NALAR_KV_BLOCK
                          * p->kv_dim * elem;
    cudaError_t   e;

    if (be->pool != NULL) {
        return nalar_fail(err, "cuda backend: already holds a KV pool");
    }
    if (elem == 0) {
        return nalar_fail(err, "cuda backend: KV cache type %d (F32 or "
                          "BF16)", (int) b->kv_type);
    }
    if (p->n_layers != be->m->cfg.n_layers || p->kv_dim != be->kv_dim
        || p->n_blocks < 1)
    {
        return nalar_fail(err, "cuda backend: KV pool shape (%d layers, "
                          "kv_dim %d) does not fit the model", p->n_layers,
                          p->kv_dim);
    }
    CUDA_CHECK(err, cudaSetDevice(be->c.device));
    p->k = p->v = NULL;
    e = cudaMalloc((void **) &p->k, bytes);
    if (e == cudaSuccess) {
        e = cudaMalloc((void **) &p->v, bytes);
    }
    if (e != cudaSuccess) {
        cudaFree(p->k);
        p->k = p->v = NULL;
        return nalar_fail(err, "cuda backend: cannot allocate %zu MiB of KV "
                          "in device memory: %s", 2 * bytes >> 20,
                          cudaGetErrorString(e));
    }
    /* zeros, as the CPU backend's calloc: no stale NaN ever meets a mask.
     * On the backend's stream: that stream does not wait for the legacy
     * default stream, so a plain cudaMemset could land after the first
     * pass had written K and V */
    CUDA_CHECK(err, cudaMemsetAsync(p->k, 0, bytes, be->c.stream));
    CUDA_CHECK(err, cudaMemsetAsync(p->v, 0, bytes, be->c.stream));
    be->pool = p;
    be->kv.k = p->k;
    be->kv.v = p->v;
    be->kv.n_blocks = p->n_blocks;
    be->kv.n_layers = p->n_layers;
    be->kv.kv_dim = p->kv_dim;
    be->kv.bf16 = bf16;
    p->elem_bytes = elem;
    p->type = b->kv_type;
    p->copy = cuda_kv_copy;
    p->copy_ctx = be;
    drop_graphs(be);
    return 0;
}


static void
cuda_kv_free(nalar_backend *b, nalar_kv_pool *p)
{
    cuda_backend *be = (cuda_backend *) b->impl;

    cudaSetDevice(be->c.device);
    if (be->c.stream != NULL) {
        cudaStreamSynchronize(be->c.stream);
    }
    drop_graphs(be);
    cudaFree(p->k);
    cudaFree(p->v);
    p->k = p->v = NULL;
    if (be->pool == p) {
        be->pool = NULL;
        memset(&be->kv, 0, sizeof(be->kv));
    }
}


static void
cuda_destroy(nalar_backend *b)
{
    cuda_backend *be;

    if (b == NULL) {
        return;
    }
    be = (cuda_backend *) b->impl;
    if (be != NULL) {
        if (be->have_ctx) {
            cudaSetDevice(be->c.device);
            cudaStreamSynchronize(be->c.stream);
        }
        drop_graphs(be);
        free_acts(be);
        free_logits(be);
        cudaFree(be->part);
        cudaFree(be->in_d);
        cudaFreeHost(be->in_h);
        for (int i = 0; i < be->n_allocs; i++) {
            cudaFree(be->allocs[i]);
        }
        free(be->allocs);
        free(be->L);
        if (be->have_ctx) {
            nalar_cuda_ctx_free(&be->c);
        }
        if (be->stub != NULL) {
            free(be->stub->name);
            free(be->stub);
        }
        free(be);
    }
    free(b);
}


/* --- creation --- */

static int
check_config(const nalar_config *c, nalar_err *err)
{
    int32_t group;

    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0
        || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0
        || c->ffn_dim <= 0 || c->n_vocab <= 0)
    {
        return nalar_fail(err, "cuda backend: bad model shape");
    }
    group = c->n_heads / c->n_kv_heads;
    if (nalar_cuda_attn_tile_q(c->head_dim, group) == 0) {
        return nalar_fail(err, "cuda backend: head_dim %d with %d query "
                          "heads per KV head is not supported (head_dim 16, "
                          "32, 64, 128 or 256)", c->head_dim, group);
    }
    return 0;
}


static int64_t
cuda_free_memory(nalar_backend *b)
{
    return nalar_cuda_free_memory(b->device);
}


static nalar_backend *
create_common(nalar_model *m, int device, int32_t gemv_max, nalar_err *err)
{
    nalar_backend      *b;
    cuda_backend       *be;
    const nalar_config *c = &m->cfg;
    float              *inv;

    if (check_config(c, err) != 0) {
        return NULL;
    }
    b = (nalar_backend *) calloc(1, sizeof(*b));
    be = (cuda_backend *) calloc(1, sizeof(*be));
    if (b == NULL || be == NULL) {
        free(b);
        free(be);
        nalar_fail(err, "cuda backend: out of host memory");
        return NULL;
    }
    b->name = "cuda";
    b->device = device;
    b->model = m;
    b->free_memory = cuda_free_memory;
    b->kv_alloc = cuda_kv_alloc;
    b->kv_free = cuda_kv_free;
    b->forward = cuda_forward;
    b->forward_argmax = cuda_forward_argmax;
    /* no LoRA adapters on the GPU yet: with lora_attach NULL the engine
     * refuses an adapter on this backend, and batch.adapter is never
     * read here */
    b->lora_attach = NULL;
    b->destroy = cuda_destroy;
    b->impl = be;
    be->m = m;
    be->q_dim = c->n_heads * c->head_dim;
    be->kv_dim = c->n_kv_heads * c->head_dim;
    be->ldqkv = be->q_dim + 2 * be->kv_dim;
    be->tile_q = nalar_cuda_attn_tile_q(c->head_dim,
                                        c->n_heads / c->n_kv_heads);
    be->n_chunks = nalar_cuda_attn_head_chunks(c->n_heads, c->n_kv_heads);
    be->L = (cu_layer *) calloc((size_t) c->n_layers, sizeof(cu_layer));
    inv = (float *) malloc((size_t) (c->head_dim / 2) * sizeof(float));
    if (be->L == NULL || inv == NULL) {
        free(inv);
        cuda_destroy(b);
        nalar_fail(err, "cuda backend: out of host memory");
        return NULL;
    }
    if (nalar_cuda_ctx_init(&be->c, device, err) != 0) {
        nalar_cuda_ctx_free(&be->c);        /* what init got to make */
        free(inv);
        cuda_destroy(b);
        return NULL;
    }
    be->have_ctx = 1;
    if (gemv_max > 0) {
        be->c.gemv_max = gemv_max;
    }
    /* the CPU backend's table, bit for bit */
    for (int i = 0; i < c->head_dim / 2; i++) {
        inv[i] = powf(c->rope_base, -2.0f * (float) i / (float) c->head_dim);
        if (c->rope_scale != 1.0f) {
            inv[i] *= c->rope_scale;
        }
        if (m->rope_freqs != NULL) {
            inv[i] /= m->rope_freqs[i];
        }
    }
    if (upload_f32(be, inv, c->head_dim / 2, &be->inv_freq, err) != 0) {
        free(inv);
        cuda_destroy(b);
        return NULL;
    }
    free(inv);
    return b;
}


nalar_backend *
nalar_cuda_backend_create(nalar_model *m, int device, int32_t gemv_max,
                          nalar_err *err)
{
    nalar_backend      *b;
    cuda_backend       *be;
    const nalar_config *c;

    if (m == NULL) {
        nalar_fail(err, "cuda backend: no model");
        return NULL;
    }
    c = &m->cfg;
    b = create_common(m, device, gemv_max, err);
    if (b == NULL) {
        return NULL;
    }
    be = (cuda_backend *) b->impl;
    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        cu_layer          *D = &be->L[l];
        const nalar_mat   *qkv[3] = { &L->wq, &L->wk, &L->wv };
        const nalar_mat   *gu[2] = { &L->w_gate, &L->w_up };
        const nalar_mat   *wo = &L->wo, *down = &L->w_down;

        if (upload_f32(be, L->attn_norm, c->dim, &D->attn_norm, err) != 0
            || upload_f32(be, L->ffn_norm, c->dim, &D->ffn_norm, err) != 0
            || upload_f32(be, L->q_norm, c->head_dim, &D->q_norm, err) != 0
            || upload_f32(be, L->k_norm, c->head_dim, &D->k_norm, err) != 0
            || upload_f32(be, L->post_attn_norm, c->dim, &D->post_attn,
                          err) != 0
            || upload_f32(be, L->post_ffn_norm, c->dim, &D->post_ffn,
                          err) != 0
            || upload_fused(be, qkv, 3, &D->qkv, err) != 0
            || upload_fused(be, gu, 2, &D->gu, err) != 0
            || upload_stack(be, &wo, 1, &D->wo, err) != 0
            || upload_stack(be, &down, 1, &D->down, err) != 0)
        {
            cuda_destroy(b);
            return NULL;
        }
        if (L->bq != NULL) {
            /* one bias row for the fused q|k|v output */
            float *bias = (float *) malloc((size_t) be->ldqkv
                                           * sizeof(float));
            int    rc;

            if (bias == NULL) {
                cuda_destroy(b);
                nalar_fail(err, "cuda backend: out of host memory");
                return NULL;
            }
            memcpy(bias, L->bq, (size_t) be->q_dim * sizeof(float));
            memcpy(bias + be->q_dim, L->bk,
                   (size_t) be->kv_dim * sizeof(float));
            memcpy(bias + be->q_dim + be->kv_dim, L->bv,
                   (size_t) be->kv_dim * sizeof(float));
            rc = upload_f32(be, bias, be->ldqkv, &D->bqkv, err);
            free(bias);
            if (rc != 0) {
                cuda_destroy(b);
                return NULL;
            }
        }
    }
    {
        const nalar_mat *emb = &m->tok_embd, *out = &m->output;
        int64_t          wb = be->weight_bytes;

        if (upload_stack(be, &emb, 1, &be->tok_embd, err) != 0
            || upload_f32(be, m->out_norm, c->dim, &be->out_norm, err) != 0)
        {
            cuda_destroy(b);
            return NULL;
        }
        /* the gathered embedding is not read per token */
        be->weight_bytes = wb;
        if (m->output.data == m->tok_embd.data) {
            be->output = be->tok_embd;        /* tied: one copy */
            be->weight_bytes += nalar_cuda_kq_type(be->output.type)
                ? (int64_t) ggml_row_size(be->output.type,
                                          (uint64_t) be->output.cols)
                  * be->output.rows
                : (int64_t) (be->output.rows * be->output.cols)
                  * (int64_t) elem_size(be->output.type);
        } else if (upload_stack(be, &out, 1, &be->output, err) != 0) {
            cuda_destroy(b);
            return NULL;
        }
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
        nalar_fail(err, "cuda backend: uploading weights failed: %s",
                   cudaGetErrorString(cudaGetLastError()));
        cuda_destroy(b);
        return NULL;
    }
    return b;
}


/* A device matrix of random values, stddev 1/sqrt(cols) (activations keep
 * unit scale through the layers). */
static int
synth_mat(cuda_backend *be, ggml_type t, int64_t rows, int64_t cols,
          uint64_t seed, nalar_cuda_mat *w, nalar_err *err)
{
    memset(w, 0, sizeof(*w));
    w->type = t;
    w->rows = rows;
    w->cols = cols;
    if (dev_alloc(be, (size_t) (rows * cols) * elem_size(t), &w->data, err)
        != 0
        || (t == GGML_Q8_0
            && dev_alloc(be, (size_t) (rows * cols / QK8_0) * 2,
                         (void **) &w->scales, err) != 0))
    {
        return -1;
    }
    be->weight_bytes += rows * cols * (int64_t) elem_size(t)
                        + (t == GGML_Q8_0 ? rows * cols / QK8_0 * 2 : 0);
    return nalar_cuda_fill_random(&be->c, w, sqrtf(3.0f / (float) cols),
                                  seed, err);
}


static int
synth_ones(cuda_backend *be, int64_t n, float **p, nalar_err *err)
{
    if (dev_alloc(be, (size_t) n * sizeof(float), (void **) p, err) != 0) {
        return -1;
    }
    return nalar_cuda_fill_f32(&be->c, *p, n, 1.0f, err);
}


nalar_backend *
nalar_cuda_backend_create_synthetic(const nalar_config *cfg, ggml_type type,
                                    uint64_t seed, int device,
                                    int32_t gemv_max, nalar_err *err)
{
    nalar_model   *stub;
    nalar_backend *b;
    cuda_backend  *be;
    int            rc = 0;

    if (type != GGML_F16 && type != GGML_BF16 && type != GGML_Q8_0
        && type != GGML_F32)
    {
        nalar_fail(err, "cuda backend: synthetic weights of type %d", type);
        return NULL;
    }
    if (type == GGML_Q8_0
        && (cfg->dim % QK8_0 != 0 || cfg->ffn_dim % QK8_0 != 0
            || (cfg->n_heads * cfg->head_dim) % QK8_0 != 0))
    {
        nalar_fail(err, "cuda backend: Q8_0 needs widths divisible by 32");
        return NULL;
    }
    stub = (nalar_model *) calloc(1, sizeof(*stub));
    if (stub == NULL) {
        nalar_fail(err, "cuda backend: out of host memory");
        return NULL;
    }
    stub->cfg = *cfg;
    stub->name = strdup("synthetic");
    b = create_common(stub, device, gemv_max, err);
    if (b == NULL) {
        free(stub->name);
        free(stub);
        return NULL;
    }
    be = (cuda_backend *) b->impl;
    be->stub = stub;
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        cu_layer *D = &be->L[l];
        uint64_t  s = seed + 16 * (uint64_t) l;

        D->qkv.n = 1;
        D->gu.n = 1;
        rc = synth_ones(be, cfg->dim, &D->attn_norm, err) != 0
             || synth_ones(be, cfg->dim, &D->ffn_norm, err) != 0
             || synth_mat(be, type, be->ldqkv, cfg->dim, s + 1,
                          &D->qkv.part[0], err) != 0
             || synth_mat(be, type, 2 * (int64_t) cfg->ffn_dim, cfg->dim,
                          s + 2, &D->gu.part[0], err) != 0
             || synth_mat(be, type, cfg->dim, be->q_dim, s + 3, &D->wo,
                          err) != 0
             || synth_mat(be, type, cfg->dim, cfg->ffn_dim, s + 4, &D->down,
                          err) != 0 ? -1 : 0;
    }
    if (rc == 0) {
        int64_t wb = be->weight_bytes;

        rc = synth_mat(be, type, cfg->n_vocab, cfg->dim, seed + 7,
                       &be->tok_embd, err) != 0
             || synth_ones(be, cfg->dim, &be->out_norm, err) != 0 ? -1 : 0;
        be->weight_bytes = wb;
        if (rc == 0) {
            rc = synth_mat(be, type, cfg->n_vocab, cfg->dim, seed + 9,
                           &be->output, err);
        }
    }
    if (rc == 0 && cudaStreamSynchronize(be->c.stream) != cudaSuccess) {
        rc = nalar_fail(err, "cuda backend: filling synthetic weights "
                        "failed: %s", cudaGetErrorString(cudaGetLastError()));
    }
    if (rc != 0) {
        cuda_destroy(b);
        return NULL;
    }
    return b;
}


int
nalar_cuda_synthetic_config(const char *name, nalar_config *c,
                            nalar_err *err)
{
    memset(c, 0, sizeof(*c));
    c->arch = ARCH_LLAMA;
    c->norm_eps = 1e-5f;
    c->rope_base = 500000.0f;
    c->rope_neox = 0;
    if (strcmp(name, "llama3-8b") == 0) {
        c->dim = 4096; c->n_layers = 32; c->n_heads = 32; c->n_kv_heads = 8;
        c->ffn_dim = 14336; c->n_vocab = 128256; c->n_ctx = 8192;
    } else if (strcmp(name, "llama3-1b") == 0) {
        c->dim = 2048; c->n_layers = 16; c->n_heads = 32; c->n_kv_heads = 8;
        c->ffn_dim = 8192; c->n_vocab = 128256; c->n_ctx = 8192;
    } else if (strcmp(name, "tiny") == 0) {
        c->dim = 256; c->n_layers = 2; c->n_heads = 4; c->n_kv_heads = 2;
        c->ffn_dim = 768; c->n_vocab = 1000; c->n_ctx = 8192;
    } else {
        return nalar_fail(err, "unknown synthetic shape '%s' (llama3-8b, "
                          "llama3-1b, tiny)", name);
    }
    c->head_dim = c->dim / c->n_heads;
    c->rope_scale = 1.0f;
    c->attn_scale = 1.0f / sqrtf((float) c->head_dim);
    c->embd_scale = 1.0f;
    return 0;
}


int64_t
nalar_cuda_weight_bytes(const nalar_backend *b)
{
    return b != NULL && strcmp(b->name, "cuda") == 0
           ? ((const cuda_backend *) b->impl)->weight_bytes : 0;
}


int
nalar_cuda_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}


int64_t
nalar_cuda_free_memory(int device)
{
    size_t fr = 0, total = 0;
    int    cur = 0;

    if (cudaGetDevice(&cur) != cudaSuccess
        || cudaSetDevice(device) != cudaSuccess
        || cudaMemGetInfo(&fr, &total) != cudaSuccess)
    {
        cudaGetLastError();
        return -1;
    }
    cudaSetDevice(cur);
    return (int64_t) fr;
}
