/*
 * `nalar mkmodel` for adapters: a random LoRA adapter of a given base
 * model, and the merged model file (base + scale * B A, in F32) that the
 * adapter applied at run time must equal.  See mkmodel.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "lora.h"
#include "mkmodel.h"
#include "mkmodel_internal.h"


/* The targets by their short names, and the tensor each adapts; phi3
 * (no attn_q, no ffn_gate) fuses them into attn_qkv and ffn_up. */
static const struct { const char *key, *tensor, *fused; } targets[] = {
    { "q", "attn_q", "attn_qkv" }, { "k", "attn_k", "attn_qkv" },
    { "v", "attn_v", "attn_qkv" }, { "o", "attn_output", NULL },
    { "gate", "ffn_gate", "ffn_up" }, { "up", "ffn_up", NULL },
    { "down", "ffn_down", NULL },
};

#define N_TARGETS (sizeof(targets) / sizeof(targets[0]))
#define TARGET_LIST "q, k, v, o, gate, up, down"


/* want[i] = 1 for each target the comma-separated list names */
static int
parse_targets(const char *list, int *want, const char *path, nalar_err *err)
{
    const char *p = list;

    for (size_t i = 0; i < N_TARGETS; i++) {
        want[i] = list == NULL;
    }
    while (list != NULL && *p != '\0') {
        size_t n = strcspn(p, ",");
        size_t i;

        for (i = 0; i < N_TARGETS; i++) {
            if (strlen(targets[i].key) == n
                && strncmp(p, targets[i].key, n) == 0)
            {
                want[i] = 1;
                break;
            }
        }
        if (i == N_TARGETS) {
            return nalar_fail(err, "%s: unknown target '%.*s' (targets: "
                              TARGET_LIST ")", path, (int) n, p);
        }
        p += n + (p[n] == ',');
    }
    return 0;
}


/* One random matrix (rows, cols) with entries uniform * amp, in `type`. */
static void
add_random(gguf_writer *w, const char *name, int64_t rows, int64_t cols,
           float amp, ggml_type type, uint64_t *rng, float *tmp, void *conv)
{
    size_t   n = (size_t) (rows * cols);
    uint64_t ne[2] = { (uint64_t) cols, (uint64_t) rows };

    for (size_t i = 0; i < n; i++) {
        tmp[i] = nalar_mk_uniform(rng) * amp;
    }
    nalar_mk_convert(tmp, n, type, conv);
    gguf_w_tensor(w, name, type, 2, ne, conv);
}


static int
check_lora_opts(const nalar_mklora_opts *o, const char *path, nalar_err *err)
{
    if (o->base == NULL) {
        return nalar_fail(err, "%s: an adapter needs its base model", path);
    }
    if (o->rank < 1 || o->rank > 4096) {
        return nalar_fail(err, "%s: rank %d (1 .. 4096)", path, o->rank);
    }
    if (o->type != GGML_F32 && o->type != GGML_F16 && o->type != GGML_BF16
        && o->type != GGML_Q8_0)
    {
        return nalar_fail(err, "%s: adapter type %s (f32, f16, bf16, q8_0)",
                          path, ggml_type_name(o->type));
    }
    if (o->type == GGML_Q8_0 && o->rank % QK8_0 != 0) {
        return nalar_fail(err, "%s: a q8_0 adapter needs a rank that is a "
                          "multiple of 32 (lora_b's rows are rank long)",
                          path);
    }
    if (!isfinite(o->alpha) || o->alpha > 1e6) {
        return nalar_fail(err, "%s: alpha %g", path, (double) o->alpha);
    }
    return 0;
}


/* Every pair of one layer; a fused tensor several targets name, once. */
static int
add_layer(gguf_writer *w, const gguf_file *f, const nalar_mklora_opts *o,
          const int *want, int l, float amp_b, uint64_t *rng, float *tmp,
          void *conv, nalar_err *err)
{
    const char *done[N_TARGETS];
    int         n_done = 0;
    char        name[96];

    for (size_t i = 0; i < N_TARGETS; i++) {
        const gguf_tensor *t;
        const char        *tn = targets[i].tensor;
        int                seen = 0;
        int64_t            rows, cols;

        if (!want[i]) {
            continue;
        }
        snprintf(name, sizeof(name), "blk.%d.%s.weight", l, tn);
        t = gguf_tensor_find(f, name);
        if (t == NULL && targets[i].fused != NULL) {
            tn = targets[i].fused;
            snprintf(name, sizeof(name), "blk.%d.%s.weight", l, tn);
            t = gguf_tensor_find(f, name);
        }
        if (t == NULL || t->n_dims != 2) {
            return nalar_fail(err, "%s: no 2-D tensor %s for target '%s'",
                              o->base, name, targets[i].key);
        }
        for (int k = 0; k < n_done; k++) {
            seen |= strcmp(done[k], tn) == 0;
        }
        if (seen) {
            continue;
        }
        done[n_done++] = tn;
        cols = (int64_t) t->ne[0];
        rows = (int64_t) t->ne[1];
        if (o->rank > rows || o->rank > cols) {
            return nalar_fail(err, "%s: rank %d exceeds %s's %lld x %lld",
                              o->base, o->rank, name, (long long) rows,
                              (long long) cols);
        }
        snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_a", l, tn);
        add_random(w, name, o->rank, cols, 1.0f / sqrtf((float) cols),
                   o->type, rng, tmp, conv);
        snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_b", l, tn);
        add_random(w, name, rows, o->rank, amp_b, o->type, rng, tmp, conv);
    }
    return 0;
}


/* The largest 2-D tensor's element count: the scratch every matrix fits. */
static size_t
largest(const gguf_file *f)
{
    size_t n = 0;

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        size_t             e = (size_t) t->ne[0] * (t->n_dims > 1
                                                    ? t->ne[1] : 1);

        n = e > n ? e : n;
    }
    return n;
}


int
nalar_mkmodel_lora(const nalar_mklora_opts *o, const char *path,
                   nalar_err *err)
{
    int          want[N_TARGETS];
    nalar_model *m;
    gguf_writer *w;
    float       *tmp = NULL, alpha, s_eff, amp_b;
    void        *conv = NULL;
    uint64_t     rng = o->seed;
    size_t       n;
    int          rc = -1;

    if (check_lora_opts(o, path, err) != 0
        || parse_targets(o->targets, want, path, err) != 0)
    {
        return -1;
    }
    m = nalar_model_open_meta(o->base, err);
    if (m == NULL) {
        return -1;
    }
    /*
     * A ~ U[-1, 1) / sqrt(cols) (var 1 / (3 cols)), B ~ U[-1, 1) * amp_b:
     * s_eff * (B A) has var s_eff^2 rank amp_b^2 / (9 cols); a weight has
     * var 1 / (3 cols) (mkmodel.c), so amp_b = sqrt(0.75 / rank) / s_eff
     * makes the change half a weight's spread, whatever alpha is.
     */
    alpha = o->alpha > 0 ? o->alpha : (float) o->rank;
    s_eff = alpha / (float) o->rank;
    amp_b = sqrtf(0.75f / (float) o->rank) / s_eff;
    n = largest(m->gguf) + (size_t) o->rank * 4096;
    tmp = malloc(n * sizeof(float));
    conv = malloc(n * sizeof(float));
    w = gguf_writer_create();
    if (tmp == NULL || conv == NULL || w == NULL) {
        nalar_fail(err, "%s: out of memory", path);
        goto done;
    }
    gguf_w_str(w, "general.type", "adapter");
    gguf_w_str(w, "general.architecture", nalar_arch_name(m->cfg.arch));
    gguf_w_str(w, "general.name", "nalar random LoRA");
    gguf_w_str(w, "adapter.type", "lora");
    gguf_w_f32(w, "adapter.lora.alpha", alpha);
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        if (add_layer(w, m->gguf, o, want, l, amp_b, &rng, tmp, conv, err)
            != 0)
        {
            goto done;
        }
    }
    if (gguf_writer_save(w, path, err) != 0) {
        goto done;
    }
    /* what is written must load: the loader is the judge */
    rc = nalar_lora_check(path, o->base, err);
done:
    gguf_writer_destroy(w);
    free(tmp);
    free(conv);
    nalar_model_destroy(m);
    return rc;
}


/* The whole of a 2-D tensor as floats, row by row ((rows, cols)). */
static float *
to_f32(const gguf_tensor *t)
{
    nalar_mat M;
    float    *x;

    M.type = t->type;
    M.cols = (int64_t) t->ne[0];
    M.rows = (int64_t) t->ne[1];
    M.data = t->data;
    x = malloc((size_t) (M.rows * M.cols) * sizeof(float));
    for (int64_t r = 0; x != NULL && r < M.rows; r++) {
        nalar_cpu_get_row(&M, r, x + r * M.cols);
    }
    return x;
}


/* W + s * B A, in place over W's floats (rows, cols); A (rank, cols),
 * B (rows, rank). */
static void
merge_into(float *W, const float *A, const float *B, int64_t rows,
           int64_t cols, int64_t rank, float s)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            double acc = 0;

            for (int64_t k = 0; k < rank; k++) {
                acc += (double) B[r * rank + k] * A[k * cols + c];
            }
            W[r * cols + c] = (float) (W[r * cols + c] + (double) s * acc);
        }
    }
}


/* One tensor of the merged file: merged when the adapter adapts it. */
static int
merge_tensor(gguf_writer *w, const gguf_tensor *t, const nalar_lora *a,
             const char *path, nalar_err *err)
{
    char               name[160];
    const gguf_tensor *ta, *tb;
    float             *W, *A, *B, s;
    int                rc = 0;

    snprintf(name, sizeof(name), "%.*s.lora_a",
             (int) (t->name.len > 128 ? 128 : t->name.len), t->name.ptr);
    ta = gguf_tensor_find(a->gguf, name);
    name[strlen(name) - 1] = 'b';
    tb = gguf_tensor_find(a->gguf, name);
    name[strlen(name) - 7] = '\0';
    if (ta == NULL || tb == NULL) {
        gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        return 0;
    }
    /* lora.h: alpha / this matrix's rank * the operator's scale */
    s = (a->alpha > 0 ? a->alpha / (float) ta->ne[1] : 1.0f) * a->scale;
    W = to_f32(t);
    A = to_f32(ta);
    B = to_f32(tb);
    if (W == NULL || A == NULL || B == NULL) {
        rc = nalar_fail(err, "%s: out of memory", path);
    } else {
        merge_into(W, A, B, (int64_t) t->ne[1], (int64_t) t->ne[0],
                   (int64_t) ta->ne[1], s);
        gguf_w_tensor(w, name, GGML_F32, 2, t->ne, W);
    }
    free(W);
    free(A);
    free(B);
    return rc;
}


int
nalar_mkmodel_merge(const char *base, const char *adapter, float scale,
                    const char *path, nalar_err *err)
{
    nalar_model *m;
    nalar_lora  *a;
    gguf_writer *w;
    int          rc = -1;

    m = nalar_model_open_meta(base, err);
    if (m == NULL) {
        return -1;
    }
    a = nalar_lora_load(m, "merge", adapter, scale, err);
    w = gguf_writer_create();
    if (a == NULL || w == NULL) {
        if (a != NULL) {
            nalar_fail(err, "%s: out of memory", path);
        }
        goto done;
    }
    for (uint64_t i = 0; i < m->gguf->n_kv; i++) {
        gguf_w_kv(w, &m->gguf->kv[i]);
    }
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        if (merge_tensor(w, &m->gguf->tensors[i], a, path, err) != 0) {
            goto done;
        }
    }
    rc = gguf_writer_save(w, path, err);
done:
    gguf_writer_destroy(w);
    nalar_lora_destroy(a);
    nalar_model_destroy(m);
    return rc;
}
