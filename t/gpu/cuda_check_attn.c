/*
 * nalar-cuda-check: the paged KV pool (stores, block copies, F32 and BF16)
 * and attention (decode and prefill kernels) against a CPU reference.
 */
#include "cuda_check.h"


/* --- paged KV and attention --- */

/* f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as
 * __float2bfloat16_rn stores them */
static uint16_t
to_bf16(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t) (u >> 16);
}


static float
from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t) b << 16;
    float    f;

    memcpy(&f, &u, sizeof(f));
    return f;
}


/* a host pool's n values as the device keeps them: with kv_bf16 the
 * floats are rounded in place and a BF16 copy uploaded */
static float *
kv_to_dev(float *h, int64_t n)
{
    uint16_t *b;
    float    *d;

    if (!kv_bf16) {
        return dup_to_dev(h, (size_t) n * sizeof(float));
    }
    b = xmalloc((size_t) n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) {
        b[i] = to_bf16(h[i]);
        h[i] = from_bf16(b[i]);
    }
    d = dup_to_dev(b, (size_t) n * sizeof(uint16_t));
    free(b);
    return d;
}


typedef struct {
    int32_t n_heads, n_kv, hd;
} att_cfg;

typedef struct {
    nalar_kv_pool  pool;      /* bookkeeping + host copy of K/V */
    nalar_cuda_kv  dkv;
    nalar_seq_kv  *seqs;
    int            n_seqs;
} att_world;


/* A pool of n_layers 2 whose sequences hold ctx[i] positions in shuffled
 * blocks; written slots random, every other slot NaN (a kernel that reads
 * past a sequence's end, or multiplies a masked weight by it, fails). */
static void
world_make(att_world *w, const att_cfg *a, const int32_t *ctx, int n)
{
    int32_t   need = 8;
    int32_t  *perm;
    int64_t   nf;
    nalar_err err;
    float     qnan = nanf("");

    memset(w, 0, sizeof(*w));
    for (int i = 0; i < n; i++) {
        need += (ctx[i] + 16 + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
    }
    op(nalar_kv_pool_init(&w->pool, need, 2, a->n_kv * a->hd, &err), &err);
    /* shuffle the free list so tables are scattered */
    perm = w->pool.free_list;
    for (int32_t i = need - 1; i > 0; i--) {
        int32_t j = (int32_t) (rnd() % (uint64_t) (i + 1)), t = perm[i];

        perm[i] = perm[j];
        perm[j] = t;
    }
    nf = (int64_t) need * 2 * NALAR_KV_BLOCK * w->pool.kv_dim;
    w->pool.k = xmalloc((size_t) nf * sizeof(float));
    w->pool.v = xmalloc((size_t) nf * sizeof(float));
    for (int64_t i = 0; i < nf; i++) {
        w->pool.k[i] = qnan;
        w->pool.v[i] = qnan;
    }
    w->seqs = calloc((size_t) n, sizeof(nalar_seq_kv));
    w->n_seqs = n;
    for (int i = 0; i < n; i++) {
        nalar_seq_kv_init(&w->seqs[i]);
        if (nalar_seq_kv_reserve(&w->pool, &w->seqs[i], ctx[i] + 16) != 0) {
            die("world", "pool too small");
        }
        w->seqs[i].n_pos = ctx[i];
        for (int32_t p = 0; p < ctx[i]; p++) {
            for (int l = 0; l < 2; l++) {
                int64_t off = nalar_kv_offset(&w->pool,
                                              w->seqs[i].blocks[p / 16], l,
                                              p % 16);

                for (int k = 0; k < w->pool.kv_dim; k++) {
                    w->pool.k[off + k] = frand();
                    w->pool.v[off + k] = frand();
                }
            }
        }
    }
    w->dkv.k = kv_to_dev(w->pool.k, nf);
    w->dkv.v = kv_to_dev(w->pool.v, nf);
    w->dkv.n_blocks = need;
    w->dkv.n_layers = 2;
    w->dkv.kv_dim = w->pool.kv_dim;
    w->dkv.bf16 = kv_bf16;
}


static void
world_free(att_world *w)
{
    for (int i = 0; i < w->n_seqs; i++) {
        nalar_seq_kv_release(&w->pool, &w->seqs[i]);
    }
    free(w->seqs);
    cudaFree(w->dkv.k);
    cudaFree(w->dkv.v);
    free(w->pool.k);
    free(w->pool.v);
    w->pool.k = w->pool.v = NULL;
    nalar_kv_pool_free(&w->pool);
}


/* reference: layer 1, token at pos of seq s, head h */
static void
att_ref(const att_world *w, const att_cfg *a, const nalar_seq_kv *s,
        int32_t pos, const float *q, double *out)
{
    int     group = a->n_heads / a->n_kv, hd = a->hd;
    double *sc = xmalloc((size_t) (pos + 1) * sizeof(double));

    for (int h = 0; h < a->n_heads; h++) {
        int64_t col = (int64_t) (h / group) * hd;
        double  mx = -INFINITY, sum = 0;

        for (int32_t j = 0; j <= pos; j++) {
            const float *k = w->pool.k + nalar_kv_offset(&w->pool,
                                 s->blocks[j / 16], 1, j % 16) + col;
            double       d = 0;

            for (int e = 0; e < hd; e++) d += (double) q[h * hd + e] * k[e];
            sc[j] = d / sqrt((double) hd);
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int32_t j = 0; j <= pos; j++) {
            sc[j] = exp(sc[j] - mx);
            sum += sc[j];
        }
        for (int e = 0; e < hd; e++) {
            double o = 0;

            for (int32_t j = 0; j <= pos; j++) {
                o += sc[j] * w->pool.v[nalar_kv_offset(&w->pool,
                                 s->blocks[j / 16], 1, j % 16) + col + e];
            }
            out[h * hd + e] = o / sum;
        }
    }
    free(sc);
}


/* decode: one token per sequence at its last position, plus a second
 * token of sequence 0 at an earlier position; then prefill tiles: a run of
 * `run` tokens at the end of the longest sequence */
static void
check_attention_cfg(const att_cfg *a, const int32_t *ctx, int n, int run)
{
    att_world     w;
    int           qd = a->n_heads * a->hd, ldq = qd + 7;
    int           T = n + 1;
    int32_t      *tok, *pos;
    nalar_seq_kv **seq;
    int8_t       *want;
    nalar_batch   b;
    nalar_cuda_plan plan;
    int32_t      *stage;
    int64_t       cap;
    float        *q, *got, *dq, *dout, *dpart;
    double       *ref;
    int32_t      *dstage;
    nalar_err     err;
    char          shape[128];
    int           splits[3], longest = 0;
    int           tile_q = nalar_cuda_attn_tile_q(a->hd, a->n_heads / a->n_kv);

    world_make(&w, a, ctx, n);
    for (int i = 1; i < n; i++) {
        longest = ctx[i] > ctx[longest] ? i : longest;
    }
    if (run > ctx[longest]) {
        run = ctx[longest];
    }
    T = n + 1 > run + 1 ? n + 1 : run + 1;
    tok = calloc((size_t) T, sizeof(int32_t));
    pos = calloc((size_t) T, sizeof(int32_t));
    seq = calloc((size_t) T, sizeof(*seq));
    want = calloc((size_t) T, 1);
    q = xmalloc((size_t) T * ldq * sizeof(float));
    got = xmalloc((size_t) T * qd * sizeof(float));
    ref = xmalloc((size_t) T * qd * sizeof(double));
    for (int i = 0; i < T * ldq; i++) q[i] = frand() * 2.0f;
    dq = dup_to_dev(q, (size_t) T * ldq * sizeof(float));
    dout = dnew((size_t) T * qd * sizeof(float));

    /* decode batch */
    for (int i = 0; i < n; i++) {
        seq[i] = &w.seqs[i];
        pos[i] = ctx[i] - 1;
    }
    seq[n] = &w.seqs[0];
    pos[n] = ctx[0] / 2;
    b.n_tokens = n + 1;
    b.tokens = tok;
    b.pos = pos;
    b.seq = seq;
    b.want_logits = want;
    b.n_logits = 0;
    b.adapter = NULL;
    cap = nalar_cuda_plan_ints(&b, T) + 16;
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, tile_q, n + 1, stage, cap, &plan, &err),
       &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    for (int t = 0; t < n + 1; t++) {
        att_ref(&w, a, seq[t], pos[t], q + (int64_t) t * ldq,
                ref + (int64_t) t * qd);
    }
    splits[0] = 1;
    splits[1] = 3;
    splits[2] = nalar_cuda_attn_splits(n + 1, a->n_kv
                    * nalar_cuda_attn_head_chunks(a->n_heads, a->n_kv),
                    C.sm_count, 0);
    for (int si = 0; si < 3; si++) {
        int64_t pf = nalar_cuda_attn_part_floats(n + 1, a->n_heads, a->hd,
                                                 splits[si]);

        dpart = pf > 0 ? dnew((size_t) pf * sizeof(float)) : NULL;
        if (dpart != NULL) {
            poison(dpart, (size_t) pf * sizeof(float));
        }
        poison(dout, (size_t) T * qd * sizeof(float));
        op(nalar_cuda_attn_decode(&C, dout, qd, dq, ldq, &w.dkv, 1,
                                  dstage + NALAR_CUDA_PLAN_POS(n + 1),
                                  dstage + NALAR_CUDA_PLAN_TBLOFF(n + 1),
                                  dstage + NALAR_CUDA_PLAN_TABLES(n + 1),
                                  n + 1, a->n_heads, a->n_kv, a->hd,
                                  splits[si], dpart, &err), &err);
        fetch(got, dout, (size_t) (n + 1) * qd * sizeof(float));
        snprintf(shape, sizeof(shape),
                 "decode h%d/%d hd%d ctx<=%d split %d%s%s", a->n_heads,
                 a->n_kv, a->hd, ctx[longest], splits[si],
                 C.attn_prefetch ? "" : " no-prefetch",
                 kv_bf16 ? " kv bf16" : "");
        report("attention", shape, nerr(got, ref, (int64_t) (n + 1) * qd),
               THR_F32);
        cudaFree(dpart);
    }
    cudaFree(dstage);
    free(stage);

    /* prefill tiles: `run` tokens of the longest sequence ending at its end,
     * then one decode token of another sequence (a mixed batch) */
    for (int t = 0; t < run; t++) {
        seq[t] = &w.seqs[longest];
        pos[t] = ctx[longest] - run + t;
    }
    b.n_tokens = run;
    if (n > 1) {
        int other = longest == 0 ? 1 : 0;

        seq[run] = &w.seqs[other];
        pos[run] = ctx[other] - 1;
        b.n_tokens = run + 1;
    }
    cap = nalar_cuda_plan_ints(&b, b.n_tokens) + 16;
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, tile_q, b.n_tokens, stage, cap, &plan,
                            &err), &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    for (int t = 0; t < b.n_tokens; t++) {
        att_ref(&w, a, seq[t], pos[t], q + (int64_t) t * ldq,
                ref + (int64_t) t * qd);
    }
    poison(dout, (size_t) T * qd * sizeof(float));
    {
        int32_t P = b.n_tokens;

        op(nalar_cuda_attn_prefill(&C, dout, qd, dq, ldq, &w.dkv, 1,
                                   dstage + NALAR_CUDA_PLAN_POS(P),
                                   dstage + NALAR_CUDA_PLAN_TBLOFF(P),
                                   dstage + NALAR_CUDA_PLAN_TABLES(P),
                                   dstage + NALAR_CUDA_PLAN_TILES(P),
                                   plan.n_tiles, a->n_heads, a->n_kv, a->hd,
                                   &err), &err);
    }
    fetch(got, dout, (size_t) b.n_tokens * qd * sizeof(float));
    snprintf(shape, sizeof(shape), "prefill h%d/%d hd%d run %d, %d tiles%s",
             a->n_heads, a->n_kv, a->hd, run, plan.n_tiles,
             kv_bf16 ? " kv bf16" : "");
    report("attention", shape, nerr(got, ref, (int64_t) b.n_tokens * qd),
           THR_F32);
    cudaFree(dstage);
    free(stage);

    cudaFree(dq); cudaFree(dout);
    free(tok); free(pos); free(seq); free(want); free(q); free(got);
    free(ref);
    world_free(&w);
}


void
check_attention(void)
{
    static const att_cfg cfgs[] = {
        { 4, 2, 32 },     /* the kjv target model */
        { 4, 2, 16 },     /* the kjv draft model */
        { 32, 8, 128 },   /* llama3-8b: GQA 4:1 */
        { 8, 8, 64 },     /* MHA */
        { 12, 4, 64 },    /* group 3 */
        { 16, 2, 128 },   /* group 8 */
        { 24, 2, 64 },    /* group 12: two head chunks */
        { 8, 2, 256 }
    };
    static const int32_t small[] = { 1, 15, 16, 17, 100, 1000 };
    static const int32_t large[] = { 1, 17, 300, 8192 };

    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        check_attention_cfg(&cfgs[i], small, 6, 40);
    }
    check_attention_cfg(&cfgs[2], large, 4, 100);
    check_attention_cfg(&cfgs[0], large, 4, 33);
}


void
check_kv(void)
{
    att_cfg    a = { 8, 2, 64 };
    int32_t    ctx[3] = { 5, 40, 33 };
    att_world  w;
    int        kd = a.n_kv * a.hd, ld = 3 * kd + 1, n = 5;
    nalar_seq_kv *seq[5];
    int32_t    tok[5] = { 0 }, pos[5] = { 5, 40, 41, 33, 6 };
    int8_t     want[5] = { 0 };
    nalar_batch b = { 5, tok, pos, seq, want, 0, NULL };
    nalar_cuda_plan plan;
    int32_t   *stage, *dstage;
    int64_t    cap, nf;
    float     *src, *dsrc, *gk, *gv;
    nalar_err  err;
    int        bad = 0;

    world_make(&w, &a, ctx, 3);
    seq[0] = &w.seqs[0]; seq[1] = &w.seqs[1]; seq[2] = &w.seqs[1];
    seq[3] = &w.seqs[2]; seq[4] = &w.seqs[0];
    src = xmalloc((size_t) n * ld * sizeof(float));
    for (int i = 0; i < n * ld; i++) src[i] = frand();
    cap = nalar_cuda_plan_ints(&b, n);
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, 4, n, stage, cap, &plan, &err), &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    dsrc = dup_to_dev(src, (size_t) n * ld * sizeof(float));
    op(nalar_cuda_kv_append(&C, &w.dkv, 1, dsrc, ld, kd, 2 * kd,
                            dstage + NALAR_CUDA_PLAN_POS(n),
                            dstage + NALAR_CUDA_PLAN_TBLOFF(n),
                            dstage + NALAR_CUDA_PLAN_TABLES(n), n, &err),
       &err);
    /* host: the same writes; then a copy-on-write of block b0 -> b1 */
    for (int t = 0; t < n; t++) {
        int64_t off = nalar_kv_offset(&w.pool,
                                      seq[t]->blocks[pos[t] / 16], 1,
                                      pos[t] % 16);

        memcpy(w.pool.k + off, src + (int64_t) t * ld + kd,
               (size_t) kd * sizeof(float));
        memcpy(w.pool.v + off, src + (int64_t) t * ld + 2 * kd,
               (size_t) kd * sizeof(float));
    }
    op(nalar_cuda_kv_copy_block(&C, &w.dkv, w.seqs[2].blocks[0],
                                w.seqs[1].blocks[2], &err), &err);
    nf = (int64_t) w.pool.n_blocks * 2 * 16 * kd;
    memcpy(w.pool.k + nalar_kv_offset(&w.pool, w.seqs[2].blocks[0], 0, 0),
           w.pool.k + nalar_kv_offset(&w.pool, w.seqs[1].blocks[2], 0, 0),
           (size_t) 2 * 16 * kd * sizeof(float));
    memcpy(w.pool.v + nalar_kv_offset(&w.pool, w.seqs[2].blocks[0], 0, 0),
           w.pool.v + nalar_kv_offset(&w.pool, w.seqs[1].blocks[2], 0, 0),
           (size_t) 2 * 16 * kd * sizeof(float));
    gk = xmalloc((size_t) nf * sizeof(float));
    gv = xmalloc((size_t) nf * sizeof(float));
    if (kv_bf16) {
        /* the device rounds what it appends; the host rounds the same
         * values, and compares bits */
        uint16_t *bk = xmalloc((size_t) nf * sizeof(uint16_t)),
                 *bv = xmalloc((size_t) nf * sizeof(uint16_t));

        fetch(bk, w.dkv.k, (size_t) nf * sizeof(uint16_t));
        fetch(bv, w.dkv.v, (size_t) nf * sizeof(uint16_t));
        for (int64_t i = 0; i < nf && !bad; i++) {
            bad = bk[i] != to_bf16(w.pool.k[i])
                  || bv[i] != to_bf16(w.pool.v[i]);
        }
        free(bk);
        free(bv);
    } else {
        fetch(gk, w.dkv.k, (size_t) nf * sizeof(float));
        fetch(gv, w.dkv.v, (size_t) nf * sizeof(float));
        /* bitwise: NaN slots must still be the same NaN */
        bad = memcmp(gk, w.pool.k, (size_t) nf * sizeof(float)) != 0
              || memcmp(gv, w.pool.v, (size_t) nf * sizeof(float)) != 0;
    }
    report_eq("kv_append", kv_bf16 ? "5 tokens, 3 sequences, + block copy, "
              "kv bf16" : "5 tokens, 3 sequences, + block copy", !bad,
              "pool differs from the host's");
    free(gk); free(gv); free(src); free(stage);
    cudaFree(dstage); cudaFree(dsrc);
    world_free(&w);
}
