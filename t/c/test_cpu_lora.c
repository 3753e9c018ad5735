/*
 * LoRA adapters on the CPU backend, built by hand (random A and B in a
 * nalar_lora this test fills in, for every matrix an adapter may adapt;
 * phi3's fused q | k | v and gate | up as one A and row views of one B):
 *
 * - applied at run time they equal the merged model: the same model
 *   loaded again with each adapted matrix replaced in memory by the F32
 *   array W + scale * B A (logits within 1e-4 of the largest, greedy ids
 *   equal), for llama, qwen2, gemma2 and phi3, with F32 and F16 adapters
 *   (and one whose A are of both types, stacked as F32), in both ways of
 *   a pass (by weight rows and by tokens);
 * - the adapter changes the logits (the check above could not pass with
 *   the adapter left out), and with batch.adapter NULL or all 0 the
 *   backend's logits are the base model's, bit for bit;
 * - mixed: sixteen sequences over four adapters (ranks 4 to 16, F32 and
 *   F16) and the base in one pass -- prefill and decode -- give each
 *   sequence the logits it gets run alone, bit for bit, in both ways of a
 *   pass (the prefill's groups of 36 tokens taken 32 at a time), with F16
 *   weights (llama; phi3's fused views) and with Q8_0 weights and 16- and
 *   8-bit activations;
 * - an adapter whose shapes do not fit, and a batch naming an adapter not
 *   attached, get errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_backend.h"
#include "cpu_matmul.h"
#include "fp16.h"
#include "kv.h"
#include "lora.h"
#include "mkmodel.h"
#include "model.h"
#include "tap.h"

#define N_SEQ    16
#define PROMPT   12
#define STEPS    6
#define MAXT     (N_SEQ * PROMPT)

enum { WAY_AUTO = -1, WAY_BY_ROWS = 0, WAY_BY_TOKENS = 1 };


/* --- adapters made by hand --- */

typedef struct {
    nalar_lora  l;
    void      **mem;       /* every array made, to free */
    int         n_mem;
} test_lora;

static uint64_t rng_state;
static int      mix_types;  /* make_lora: k's and up's A in F32 whatever
                               the type asked for (a family's A then
                               stacks as F32) */


static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float) ((rng_state >> 40) & 0xffffff) / 16777216.0f * 2 - 1;
}


/* a (rows, cols) matrix of random values times amp, in type t */
static nalar_mat
rand_mat(test_lora *T, ggml_type t, int64_t rows, int64_t cols, float amp)
{
    size_t     n = (size_t) (rows * cols);
    nalar_mat  M = { t, rows, cols, NULL };
    void      *p = malloc(n * (t == GGML_F32 ? 4 : 2));

    for (size_t i = 0; i < n && p != NULL; i++) {
        float f = frand() * amp;

        if (t == GGML_F32) {
            ((float *) p)[i] = f;
        } else {
            ((uint16_t *) p)[i] = nalar_f32_to_f16(f);
        }
    }
    T->mem[T->n_mem++] = p;
    M.data = p;
    return M;
}


/* the rows [r0, r0 + rows) of B */
static nalar_mat
rows_of(nalar_mat B, int64_t r0, int64_t rows)
{
    nalar_mat v = B;

    v.rows = rows;
    v.data = (const uint8_t *) B.data
             + r0 * B.cols * (B.type == GGML_F32 ? 4 : 2);
    return v;
}


static nalar_lora_mat
pair(nalar_mat a, nalar_mat b, float s)
{
    nalar_lora_mat m = { a, b, s };

    return m;
}


/*
 * An adapter of every matrix of m, rank r, A and B in type t.  A's
 * entries are about 1 / sqrt(cols) (u = A x about 1 for normalised x), B's
 * small enough that the model stays in range but its logits move.
 */
static test_lora *
make_lora(const nalar_model *m, int rank, ggml_type t, float scale,
          uint64_t seed)
{
    const nalar_config *c = &m->cfg;
    test_lora          *T = calloc(1, sizeof(*T));
    int64_t             qd = (int64_t) c->n_heads * c->head_dim;
    int64_t             kd = (int64_t) c->n_kv_heads * c->head_dim;
    float               ad = 1.0f / sqrtf((float) c->dim);
    float               aq = 1.0f / sqrtf((float) qd);
    float               af = 1.0f / sqrtf((float) c->ffn_dim);
    float               bs = 0.3f / sqrtf((float) rank);

    T->mem = calloc((size_t) c->n_layers * 14 + 1, sizeof(void *));
    rng_state = seed;
    T->l.name = "test";
    T->l.rank = rank;
    T->l.scale = 1;
    T->l.n_layers = c->n_layers;
    T->l.layers = calloc((size_t) c->n_layers, sizeof(nalar_lora_layer));
    T->mem[T->n_mem++] = T->l.layers;
    for (int l = 0; l < c->n_layers; l++) {
        nalar_lora_layer *L = &T->l.layers[l];

        if (c->arch == ARCH_PHI3) {
            /* the fused tensors' adapters: one A, B's rows per view */
            nalar_mat a = rand_mat(T, t, rank, c->dim, ad);
            nalar_mat b = rand_mat(T, t, qd + 2 * kd, rank, bs);
            nalar_mat g = rand_mat(T, t, rank, c->dim, ad);
            nalar_mat u = rand_mat(T, t, 2 * c->ffn_dim, rank, bs);

            L->wq = pair(a, rows_of(b, 0, qd), scale);
            L->wk = pair(a, rows_of(b, qd, kd), scale);
            L->wv = pair(a, rows_of(b, qd + kd, kd), scale);
            L->w_gate = pair(g, rows_of(u, 0, c->ffn_dim), scale);
            L->w_up = pair(g, rows_of(u, c->ffn_dim, c->ffn_dim), scale);
        } else {
            L->wq = pair(rand_mat(T, t, rank, c->dim, ad),
                         rand_mat(T, t, qd, rank, bs), scale);
            L->wk = pair(rand_mat(T, mix_types ? GGML_F32 : t, rank,
                                  c->dim, ad),
                         rand_mat(T, t, kd, rank, bs), scale);
            L->wv = pair(rand_mat(T, t, rank, c->dim, ad),
                         rand_mat(T, t, kd, rank, bs), scale);
            L->w_gate = pair(rand_mat(T, t, rank, c->dim, ad),
                             rand_mat(T, t, c->ffn_dim, rank, bs), scale);
            L->w_up = pair(rand_mat(T, mix_types ? GGML_F32 : t, rank,
                                    c->dim, ad),
                           rand_mat(T, t, c->ffn_dim, rank, bs), scale);
        }
        L->wo = pair(rand_mat(T, t, rank, qd, aq),
                     rand_mat(T, t, c->dim, rank, bs), scale);
        L->w_down = pair(rand_mat(T, t, rank, c->ffn_dim, af),
                         rand_mat(T, t, c->dim, rank, bs), scale);
    }
    return T;
}


static void
free_lora(test_lora *T)
{
    for (int i = 0; i < T->n_mem; i++) {
        free(T->mem[i]);
    }
    free(T->mem);
    free(T);
}


static float
at(const nalar_mat *M, int64_t r, int64_t c)
{
    if (M->type == GGML_F32) {
        return ((const float *) M->data)[r * M->cols + c];
    }
    return nalar_f16_to_f32(((const uint16_t *) M->data)[r * M->cols + c]);
}


/* W + scale * B A as a new F32 array (the merged model's matrix) */
static float *
merge(const nalar_mat *W, const nalar_lora_mat *A)
{
    float *w = malloc((size_t) (W->rows * W->cols) * sizeof(float));
    int    rank = (int) A->a.rows;

    for (int64_t r = 0; r < W->rows && w != NULL; r++) {
        nalar_cpu_get_row(W, r, w + r * W->cols);
        for (int64_t c = 0; c < W->cols; c++) {
            double s = 0;

            for (int k = 0; k < rank; k++) {
                s += (double) at(&A->b, r, k) * at(&A->a, k, c);
            }
            w[r * W->cols + c] = (float) (w[r * W->cols + c]
                                          + (double) A->scale * s);
        }
    }
    return w;
}


/* replace m's adapted matrices by the merged arrays (kept in keep) */
static void
merge_model(nalar_model *m, const nalar_lora *a, float **keep)
{
    int n = 0;

    for (int l = 0; l < m->cfg.n_layers; l++) {
        nalar_layer            *L = &m->layers[l];
        const nalar_lora_layer *A = &a->layers[l];
        nalar_mat *W[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate,
                            &L->w_up, &L->w_down };
        const nalar_lora_mat *V[7] = { &A->wq, &A->wk, &A->wv, &A->wo,
                                       &A->w_gate, &A->w_up, &A->w_down };

        for (int k = 0; k < 7; k++) {
            float *w = merge(W[k], V[k]);

            keep[n++] = w;
            W[k]->type = GGML_F32;
            W[k]->data = w;
        }
    }
}


/* --- a backend and its passes --- */

typedef struct {
    nalar_model   *m;
    nalar_backend *be;
    nalar_kv_pool  kv;
    int32_t        V;
} rig;


static int
rig_open(rig *g, const char *path, int act)
{
    nalar_err err;

    memset(g, 0, sizeof(*g));
    g->m = nalar_model_load(path, &err);
    if (g->m == NULL) {
        diag("%s", err.msg);
        return -1;
    }
    g->V = g->m->cfg.n_vocab;
    return 0;
}


static int
rig_backend(rig *g, int act)
{
    nalar_err err;

    g->be = nalar_cpu_backend_create(g->m, 2, &err);
    if (g->be == NULL
        || nalar_kv_pool_init(&g->kv, 4 * N_SEQ, g->m->cfg.n_layers,
                              g->m->cfg.n_kv_heads * g->m->cfg.head_dim,
                              &err) != 0
        || g->be->kv_alloc(g->be, &g->kv, &err) != 0)
    {
        diag("%s", err.msg);
        return -1;
    }
    nalar_cpu_backend_act_i16(g->be, act);
    return 0;
}


static void
rig_close(rig *g)
{
    if (g->be != NULL) {
        g->be->kv_free(g->be, &g->kv);
        nalar_kv_pool_free(&g->kv);
        g->be->destroy(g->be);
    }
    nalar_model_destroy(g->m);
}


static int32_t
prompt_token(int s, int i, int32_t V)
{
    return 3 + (s * 131 + i * 37 + 11) % (V - 3);
}


static int32_t
argmax(const float *z, int32_t V)
{
    int32_t best = 0;

    for (int32_t i = 1; i < V; i++) {
        best = z[i] > z[best] ? i : best;
    }
    return best;
}


/*
 * Sequences sel[0 .. n) (of N_SEQ; sequence s under adapter ad[s], or
 * the batch's adapter left NULL when ad is NULL) run together: one pass
 * of every prompt (PROMPT tokens each), then STEPS passes of one greedy
 * token each.  out: (N_SEQ, STEPS + 1, V), the logits after the prompt
 * and after each step.
 */
static int
run(rig *g, const int *sel, int n, const int32_t *ad, float *out)
{
    nalar_seq_kv  s[N_SEQ], *seq[MAXT];
    int32_t       tok[MAXT], pos[MAXT], adt[MAXT], next[N_SEQ];
    int8_t        want[MAXT];
    float        *z = malloc((size_t) N_SEQ * g->V * sizeof(float));
    nalar_err     err;
    int           rc = 0;

    for (int i = 0; i < n; i++) {
        nalar_seq_kv_init(&s[i]);
        if (nalar_seq_kv_reserve(&g->kv, &s[i], PROMPT + STEPS + 1) != 0) {
            rc = -1;
        }
    }
    for (int step = 0; step <= STEPS && rc == 0 && z != NULL; step++) {
        nalar_batch b;
        int         nt = 0;

        for (int i = 0; i < n; i++) {
            int len = step == 0 ? PROMPT : 1;

            for (int k = 0; k < len; k++) {
                tok[nt] = step == 0 ? prompt_token(sel[i], k, g->V)
                                    : next[i];
                pos[nt] = step == 0 ? k : PROMPT + step - 1;
                seq[nt] = &s[i];
                want[nt] = k == len - 1;
                adt[nt] = ad != NULL ? ad[sel[i]] : 0;
                nt++;
            }
        }
        b.n_tokens = nt; b.tokens = tok; b.pos = pos; b.seq = seq;
        b.want_logits = want; b.n_logits = n;
        b.adapter = ad != NULL ? adt : NULL;
        if (g->be->forward(g->be, &g->kv, &b, z, &err) != 0) {
            diag("forward: %s", err.msg);
            rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) {
            memcpy(out + ((size_t) sel[i] * (STEPS + 1) + step) * g->V,
                   z + (size_t) i * g->V, g->V * sizeof(float));
            next[i] = argmax(z + (size_t) i * g->V, g->V);
        }
    }
    for (int i = 0; i < n; i++) {
        nalar_seq_kv_release(&g->kv, &s[i]);
    }
    free(z);
    return z == NULL ? -1 : rc;
}


/* the largest |a - b| over the largest |b|, of n floats */
static double
rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, top = 1e-30;

    for (size_t i = 0; i < n; i++) {
        double e = fabs((double) a[i] - b[i]);

        d = e > d ? e : d;
        top = fabs(b[i]) > top ? fabs(b[i]) : top;
    }
    return d / top;
}


/* the greedy ids of sequence 0's steps in out equal ref's */
static int
same_ids(const float *a, const float *b, int32_t V)
{
    for (int k = 0; k <= STEPS; k++) {
        if (argmax(a + (size_t) k * V, V) != argmax(b + (size_t) k * V, V)) {
            return 0;
        }
    }
    return 1;
}


/*
 * Run time against merged, for one model file and adapter type: sequence
 * 0 alone, adapter 1, each way of a pass.
 */
static void
check_merged(const char *path, const char *name, ggml_type t)
{
    static const int zero[] = { 0 };
    static const int32_t one[N_SEQ] = { 1 };
    rig        g, h;
    test_lora *A;
    float    **keep = NULL, *got, *ref, *base;
    size_t     per;
    int        nk = 0;

    if (rig_open(&g, path, 0) != 0 || rig_open(&h, path, 0) != 0) {
        ok(0, "%s: model", name);
        return;
    }
    per = (size_t) (STEPS + 1) * g.V;
    A = make_lora(g.m, 16, t, 0.75f, 7 + (uint64_t) g.m->cfg.arch);
    keep = calloc((size_t) g.m->cfg.n_layers * 7, sizeof(float *));
    got = calloc(per * N_SEQ, sizeof(float));
    ref = calloc(per * N_SEQ, sizeof(float));
    base = calloc(per * N_SEQ, sizeof(float));
    merge_model(h.m, &A->l, keep);
    nk = g.m->cfg.n_layers * 7;
    if (rig_backend(&g, 0) != 0 || rig_backend(&h, 0) != 0) {
        ok(0, "%s: backends", name);
        goto done;
    }
    {
        nalar_err err;

        ok(g.be->lora_attach != NULL
           && g.be->lora_attach(g.be, 1, &A->l, &err) == 0,
           "%s: adapter attached", name);
    }
    ok(run(&h, zero, 1, NULL, ref) == 0, "%s: merged model runs", name);
    ok(run(&g, zero, 1, NULL, base) == 0, "%s: base runs", name);
    ok(rel_diff(base, ref, per) > 1e-2,
       "%s: the adapter moves the logits (base vs merged: %.3g)", name,
       rel_diff(base, ref, per));
    for (int way = WAY_BY_ROWS; way <= WAY_BY_TOKENS; way++) {
        double d;

        nalar_cpu_backend_test_way(g.be, way);
        ok(run(&g, zero, 1, one, got) == 0, "%s: with the adapter runs",
           name);
        d = rel_diff(got, ref, per);
        ok(d <= 1e-4 && same_ids(got, ref, g.V),
           "%s, %s adapter, by %s: logits within %.2g of the merged "
           "model's (<= 1e-4), greedy ids equal", name,
           ggml_type_name(t), way == WAY_BY_ROWS ? "rows" : "tokens", d);
    }
done:
    for (int i = 0; i < nk; i++) {
        free(keep[i]);
    }
    free(keep);
    free(got);
    free(ref);
    free(base);
    rig_close(&g);
    rig_close(&h);
    free_lora(A);
}


/*
 * Sixteen sequences over four adapters and the base: alone, and all in
 * one pass, each way.  act: the backend's activations' mode.
 */
static void
check_mixed(const char *path, const char *name, int act)
{
    static const struct { int rank; ggml_type t; float s; } ad[4] = {
        { 16, GGML_F32, 1.0f }, { 8, GGML_F16, 0.5f },
        { 4, GGML_F32, 2.0f }, { 16, GGML_F16, 1.0f },
    };
    rig        g;
    test_lora *A[4] = { NULL };
    int32_t    id[N_SEQ];
    int        sel[N_SEQ];
    float     *alone, *mixed, *base;
    size_t     per;
    int        rc = 0;

    if (rig_open(&g, path, act) != 0 || rig_backend(&g, act) != 0) {
        ok(0, "%s: model and backend", name);
        return;
    }
    per = (size_t) (STEPS + 1) * g.V;
    alone = calloc(per * N_SEQ, sizeof(float));
    mixed = calloc(per * N_SEQ, sizeof(float));
    base = calloc(per * N_SEQ, sizeof(float));
    for (int i = 0; i < 4; i++) {
        nalar_err err;

        mix_types = i == 1;
        A[i] = make_lora(g.m, ad[i].rank, ad[i].t, ad[i].s, 100 + i);
        mix_types = 0;
        if (g.be->lora_attach(g.be, i + 1, &A[i]->l, &err) != 0) {
            diag("%s", err.msg);
            rc = -1;
        }
    }
    for (int s = 0; s < N_SEQ; s++) {
        id[s] = s % 5;
        sel[s] = s;
    }
    /* each alone, the way the backend picks */
    for (int s = 0; s < N_SEQ && rc == 0; s++) {
        rc = run(&g, &sel[s], 1, id, alone);
    }
    ok(rc == 0, "%s: %d sequences alone", name, N_SEQ);
    for (int way = WAY_BY_ROWS; way <= WAY_BY_TOKENS; way++) {
        int bad = -1;

        nalar_cpu_backend_test_way(g.be, way);
        memset(mixed, 0, per * N_SEQ * sizeof(float));
        ok(run(&g, sel, N_SEQ, id, mixed) == 0, "%s: one batch, by %s",
           name, way == WAY_BY_ROWS ? "rows" : "tokens");
        for (int s = 0; s < N_SEQ && bad < 0; s++) {
            if (memcmp(alone + s * per, mixed + s * per,
                       per * sizeof(float)) != 0)
            {
                bad = s;
            }
        }
        ok(bad < 0, "%s, by %s: 16 sequences over 4 adapters and the "
           "base in one pass: logits bit-identical to each alone%s", name,
           way == WAY_BY_ROWS ? "rows" : "tokens",
           bad >= 0 ? " (not so for a sequence)" : "");
        if (bad >= 0) {
            diag("sequence %d (adapter %d): %.3g", bad, id[bad],
                 rel_diff(mixed + bad * per, alone + bad * per, per));
        }
    }
    nalar_cpu_backend_test_way(g.be, WAY_AUTO);

    /* the base's sequences: batch.adapter NULL, as with no adapter */
    {
        int    base_sel[N_SEQ], nb = 0, same = 1, moved = 1;

        for (int s = 0; s < N_SEQ; s++) {
            if (id[s] == 0) {
                base_sel[nb++] = s;
            }
        }
        ok(run(&g, base_sel, nb, NULL, base) == 0
           && run(&g, sel, N_SEQ, NULL, mixed) == 0,
           "%s: batch.adapter NULL", name);
        for (int i = 0; i < nb; i++) {
            same &= memcmp(base + base_sel[i] * per,
                           alone + base_sel[i] * per,
                           per * sizeof(float)) == 0;
        }
        for (int s = 0; s < N_SEQ; s++) {
            if (id[s] != 0) {
                moved &= memcmp(mixed + s * per, alone + s * per,
                                per * sizeof(float)) != 0;
            }
        }
        ok(same, "%s: the base's sequences among adapted ones equal "
           "batch.adapter NULL bit for bit", name);
        ok(moved, "%s: every adapter changes its sequences' logits", name);
    }
    free(alone);
    free(mixed);
    free(base);
    rig_close(&g);
    for (int i = 0; i < 4; i++) {
        if (A[i] != NULL) {
            free_lora(A[i]);
        }
    }
}


/* an adapter that does not fit, and ids not attached */
static void
check_errors(const char *path)
{
    static const int zero[] = { 0 };
    rig        g;
    test_lora *A;
    nalar_err  err;
    int32_t    bad[N_SEQ] = { 2 };
    float     *out;

    if (rig_open(&g, path, 0) != 0 || rig_backend(&g, 0) != 0) {
        ok(0, "errors: model and backend");
        return;
    }
    out = calloc((size_t) (STEPS + 1) * g.V * N_SEQ, sizeof(float));
    A = make_lora(g.m, 8, GGML_F32, 1, 5);
    A->l.layers[1].wk.b.rows += 1;
    ok(g.be->lora_attach(g.be, 1, &A->l, &err) != 0
       && strstr(err.msg, "do not fit") != NULL,
       "a B with a row too many is refused: %s", err.msg);
    A->l.layers[1].wk.b.rows -= 1;
    ok(g.be->lora_attach(g.be, 2, &A->l, &err) != 0,
       "ids are attached in order: %s", err.msg);
    ok(g.be->lora_attach(g.be, 1, &A->l, &err) == 0
       && g.be->lora_attach(g.be, 1, &A->l, &err) == 0,
       "attached, then replaced");
    ok(run(&g, zero, 1, bad, out) != 0, "a batch naming adapter 2 of 1 is "
       "refused");
    free(out);
    rig_close(&g);
    free_lora(A);
}


int
main(void)
{
    static const char *arch[] = { "llama", "qwen2", "gemma2", "phi3" };
    char               dir[] = "/tmp/nalar-lora-XXXXXX", path[256];
    nalar_mkmodel_opts o;
    nalar_err          err;

    for (size_t i = 0; i < sizeof(arch) / sizeof(arch[0]); i++) {
        char file[128];

        snprintf(file, sizeof(file), "t/data/conformance/%s-F16.gguf",
                 arch[i]);
        check_merged(file, arch[i], i % 2 ? GGML_F16 : GGML_F32);
        check_merged(file, arch[i], i % 2 ? GGML_F32 : GGML_F16);
    }
    mix_types = 1;
    check_merged("t/data/conformance/llama-F16.gguf", "llama, k and up "
                 "F32", GGML_F16);
    mix_types = 0;
    check_mixed("t/data/conformance/llama-F16.gguf", "llama F16", 0);
    check_mixed("t/data/conformance/phi3-F16.gguf", "phi3 F16", 0);
    check_errors("t/data/conformance/llama-F16.gguf");
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    nalar_mkmodel_defaults(&o);
    o.dim = 128;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.ffn_dim = 256;
    o.n_vocab = 300;
    o.type = GGML_Q8_0;
    o.seed = 31;
    snprintf(path, sizeof(path), "%s/q8.gguf", dir);
    if (nalar_mkmodel(&o, path, &err) != 0) {
        ok(0, "mkmodel: %s", err.msg);
    } else {
        check_mixed(path, "Q8_0, 16-bit activations", NALAR_ACT_I16);
        check_mixed(path, "Q8_0, 8-bit activations", NALAR_ACT_Q8);
        check_mixed(path, "Q8_0, pair multipliers", NALAR_ACT_PAIRS);
        unlink(path);
    }
    rmdir(dir);
    return done_testing();
}
