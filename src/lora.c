/*
 * LoRA adapters (lora.h): read an adapter GGUF as llama.cpp writes it,
 * check every tensor against the base model, point the views into the
 * mapping, and compute the adapter's digest.  Nothing is copied here
 * (the backend keeps its own copies, lora.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "lora.h"


/* The matrices an adapter may adapt, as the tensors are named in GGUF.
 * SLOT_QKV is phi3's fused q|k|v; phi3's ffn_up is its fused gate|up. */
enum {
    SLOT_Q, SLOT_K, SLOT_V, SLOT_O, SLOT_GATE, SLOT_UP, SLOT_DOWN, SLOT_QKV,
    SLOT_N
};

static const char *const slot_names[SLOT_N] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
    "ffn_down", "attn_qkv"
};

#define LORA_MATRICES "attn_q, attn_k, attn_v, attn_output, ffn_gate, " \
                      "ffn_up, ffn_down (phi3: attn_qkv, attn_output, "    \
                      "ffn_up, ffn_down)"

/* One adapted matrix as the file holds it: A and B, not yet checked
 * against each other (scan fills them, check_pair checks them). */
typedef struct {
    const gguf_tensor *a;
    const gguf_tensor *b;
} lora_pair;

typedef struct {
    const char        *path;
    const nalar_model *m;
    const gguf_file   *f;
    lora_pair         *pairs;    /* (n_layers * SLOT_N) */
    float              alpha;
    int32_t            rank;     /* the largest */
} lora_scan;


int
nalar_lora_type_ok(ggml_type t)
{
    return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16
           || t == GGML_Q8_0;
}


/* The base's matrix in slot s of layer l (a fused tensor whole): 0 and its
 * shape, or -1 when the base has no such tensor. */
static int
base_shape(const nalar_model *m, int32_t l, int s, int64_t *rows,
           int64_t *cols)
{
    const nalar_layer *L = &m->layers[l];
    int                phi3 = m->cfg.arch == ARCH_PHI3;
    const nalar_mat   *W;

    switch (s) {
    case SLOT_Q:    W = phi3 ? NULL : &L->wq; break;
    case SLOT_K:    W = phi3 ? NULL : &L->wk; break;
    case SLOT_V:    W = phi3 ? NULL : &L->wv; break;
    case SLOT_O:    W = &L->wo; break;
    case SLOT_GATE: W = phi3 ? NULL : &L->w_gate; break;
    case SLOT_UP:   W = &L->w_up; break;
    case SLOT_DOWN: W = &L->w_down; break;
    case SLOT_QKV:  W = phi3 ? &L->wq : NULL; break;
    default:        W = NULL; break;
    }
    if (W == NULL) {
        return -1;
    }
    *rows = W->rows;
    *cols = W->cols;
    if (phi3 && s == SLOT_QKV) {
        *rows = L->wq.rows + L->wk.rows + L->wv.rows;
    } else if (phi3 && s == SLOT_UP) {
        *rows = L->w_gate.rows + L->w_up.rows;
    }
    return 0;
}


/* "blk.N.<matrix>.weight.lora_a" / "..lora_b": 0 with layer, slot and
 * which (0: A, 1: B); -1 for any other name. */
static int
parse_name(const gguf_str *name, int64_t *layer, int *slot, int *which)
{
    char        buf[128];
    const char *p;
    char       *end;
    size_t      n;

    if (name->len >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, name->ptr, name->len);
    buf[name->len] = '\0';
    if (strlen(buf) != name->len || strncmp(buf, "blk.", 4) != 0
        || buf[4] < '0' || buf[4] > '9')
    {
        return -1;
    }
    *layer = strtoll(buf + 4, &end, 10);
    if (*end != '.' || end - (buf + 4) > 9) {
        return -1;
    }
    p = end + 1;
    for (int s = 0; s < SLOT_N; s++) {
        n = strlen(slot_names[s]);
        if (strncmp(p, slot_names[s], n) != 0) {
            continue;
        }
        if (strcmp(p + n, ".weight.lora_a") == 0) {
            *slot = s;
            *which = 0;
            return 0;
        }
        if (strcmp(p + n, ".weight.lora_b") == 0) {
            *slot = s;
            *which = 1;
            return 0;
        }
    }
    return -1;
}


/* general.type, adapter.type, general.architecture, adapter.lora.alpha */
static int
check_meta(lora_scan *sc, nalar_err *err)
{
    const gguf_kv *kv;
    const char    *arch = nalar_arch_name(sc->m->cfg.arch);
    static const struct { const char *key, *want; } strs[] = {
        { "general.type", "adapter" }, { "adapter.type", "lora" },
    };

    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        kv = gguf_find(sc->f, strs[i].key);
        if (kv == NULL || kv->type != GGUF_T_STRING) {
            return nalar_fail(err, "%s: %s is %s; a LoRA adapter file says "
                              "\"%s\"", sc->path, strs[i].key,
                              kv == NULL ? "absent" : "not a string",
                              strs[i].want);
        }
        if (kv->v.s.len != strlen(strs[i].want)
            || memcmp(kv->v.s.ptr, strs[i].want, kv->v.s.len) != 0)
        {
            return nalar_fail(err, "%s: %s is \"%.*s\", not \"%s\": not a "
                              "LoRA adapter", sc->path, strs[i].key,
                              (int) (kv->v.s.len > 64 ? 64 : kv->v.s.len),
                              kv->v.s.ptr, strs[i].want);
        }
    }
    kv = gguf_find(sc->f, "general.architecture");
    if (kv != NULL
        && (kv->type != GGUF_T_STRING || kv->v.s.len != strlen(arch)
            || memcmp(kv->v.s.ptr, arch, kv->v.s.len) != 0))
    {
        return nalar_fail(err, "%s: adapter of architecture \"%.*s\", but "
                          "the base model %s is %s", sc->path,
                          kv->type == GGUF_T_STRING
                          ? (int) (kv->v.s.len > 64 ? 64 : kv->v.s.len) : 1,
                          kv->type == GGUF_T_STRING ? kv->v.s.ptr : "?",
                          sc->m->path, arch);
    }
    kv = gguf_find(sc->f, "adapter.lora.alpha");
    sc->alpha = 0;
    if (kv != NULL) {
        if (kv->type != GGUF_T_FLOAT32 && kv->type != GGUF_T_FLOAT64) {
            return nalar_fail(err, "%s: adapter.lora.alpha is not a float",
                              sc->path);
        }
        if (!isfinite(kv->v.f) || kv->v.f < 0 || kv->v.f > 1e6) {
            return nalar_fail(err, "%s: adapter.lora.alpha is %g (a "
                              "finite value in [0, 1e6])", sc->path,
                              kv->v.f);
        }
        sc->alpha = (float) kv->v.f;
    }
    return 0;
}


/* A (rank, cols) and B (rows, rank) against the base's (rows, cols). */
static int
check_pair(lora_scan *sc, int32_t l, int s, nalar_err *err)
{
    const lora_pair   *p = &sc->pairs[(size_t) l * SLOT_N + s];
    const gguf_tensor *t[2] = { p->a, p->b };
    int64_t            rows, cols;

    if (p->a == NULL || p->b == NULL) {
        return nalar_fail(err, "%s: blk.%d.%s.weight.lora_%s has no "
                          "lora_%s to pair with", sc->path, l, slot_names[s],
                          p->a != NULL ? "a" : "b", p->a != NULL ? "b" : "a");
    }
    (void) base_shape(sc->m, l, s, &rows, &cols);
    for (int i = 0; i < 2; i++) {
        if (!nalar_lora_type_ok(t[i]->type)) {
            return nalar_fail(err, "%s: tensor 'blk.%d.%s.weight.lora_%c' "
                              "has type %s (adapters: F32, F16, BF16, "
                              "Q8_0)", sc->path, l, slot_names[s], "ab"[i],
                              ggml_type_name(t[i]->type));
        }
        if (t[i]->n_dims != 2 || t[i]->ne[0] == 0 || t[i]->ne[1] == 0) {
            return nalar_fail(err, "%s: tensor 'blk.%d.%s.weight.lora_%c' "
                              "is not a matrix", sc->path, l, slot_names[s],
                              "ab"[i]);
        }
    }
    if ((int64_t) p->a->ne[0] != cols || (int64_t) p->b->ne[1] != rows) {
        return nalar_fail(err, "%s: blk.%d.%s.weight: lora_a is [%llu, "
                          "%llu] and lora_b [%llu, %llu], but the base "
                          "matrix is %lld x %lld (lora_a [%lld, rank], "
                          "lora_b [rank, %lld])", sc->path, l,
                          slot_names[s], (unsigned long long) p->a->ne[0],
                          (unsigned long long) p->a->ne[1],
                          (unsigned long long) p->b->ne[0],
                          (unsigned long long) p->b->ne[1], (long long) rows,
                          (long long) cols, (long long) cols,
                          (long long) rows);
    }
    if (p->a->ne[1] != p->b->ne[0]) {
        return nalar_fail(err, "%s: blk.%d.%s.weight: lora_a has rank "
                          "%llu but lora_b rank %llu", sc->path, l,
                          slot_names[s], (unsigned long long) p->a->ne[1],
                          (unsigned long long) p->b->ne[0]);
    }
    if (p->a->ne[1] > (uint64_t) (rows < cols ? rows : cols)) {
        return nalar_fail(err, "%s: blk.%d.%s.weight: rank %llu exceeds "
                          "the matrix's %lld x %lld", sc->path, l,
                          slot_names[s], (unsigned long long) p->a->ne[1],
                          (long long) rows, (long long) cols);
    }
    /* the backend's scratch grows with the rank (every thread holds A x
     * of a pass's tokens); published adapters stay far below this */
    if (p->a->ne[1] > NALAR_LORA_MAX_RANK) {
        return nalar_fail(err, "%s: blk.%d.%s.weight: rank %llu (at most "
                          "%d)", sc->path, l, slot_names[s],
                          (unsigned long long) p->a->ne[1],
                          NALAR_LORA_MAX_RANK);
    }
    if ((int32_t) p->a->ne[1] > sc->rank) {
        sc->rank = (int32_t) p->a->ne[1];
    }
    return 0;
}


/* Every check of lora.h; on success sc->pairs holds each adapted matrix
 * (the caller frees it). */
static int
lora_scan_file(lora_scan *sc, nalar_err *err)
{
    const nalar_config *c = &sc->m->cfg;
    int32_t             n_pairs = 0;

    if (check_meta(sc, err) != 0) {
        return -1;
    }
    sc->pairs = calloc((size_t) c->n_layers * SLOT_N, sizeof(lora_pair));
    if (sc->pairs == NULL) {
        return nalar_fail(err, "%s: out of memory", sc->path);
    }
    for (uint64_t i = 0; i < sc->f->n_tensors; i++) {
        const gguf_tensor *t = &sc->f->tensors[i];
        int64_t            l, rows, cols;
        int                s, which;
        lora_pair         *p;

        if (parse_name(&t->name, &l, &s, &which) != 0) {
            return nalar_fail(err, "%s: tensor '%.*s' is not the lora_a or "
                              "lora_b of a matrix the engine adapts (blk.N."
                              "M.weight.lora_a/_b, M one of " LORA_MATRICES
                              ")", sc->path,
                              (int) (t->name.len > 96 ? 96 : t->name.len),
                              t->name.ptr);
        }
        if (l >= c->n_layers) {
            return nalar_fail(err, "%s: tensor 'blk.%lld.%s.weight.lora_%c' "
                              "names layer %lld, but the base model %s has "
                              "%d layers", sc->path, (long long) l,
                              slot_names[s], "ab"[which], (long long) l,
                              sc->m->path, c->n_layers);
        }
        if (base_shape(sc->m, (int32_t) l, s, &rows, &cols) != 0) {
            return nalar_fail(err, "%s: tensor 'blk.%lld.%s.weight.lora_%c' "
                              "adapts a matrix the %s base model %s does "
                              "not have", sc->path, (long long) l,
                              slot_names[s], "ab"[which],
                              nalar_arch_name(c->arch), sc->m->path);
        }
        p = &sc->pairs[(size_t) l * SLOT_N + s];
        /* two spellings of one layer number (blk.1 and blk.01) */
        if ((which == 0 ? p->a : p->b) != NULL) {
            return nalar_fail(err, "%s: tensor 'blk.%lld.%s.weight.lora_%c' "
                              "is given twice", sc->path, (long long) l,
                              slot_names[s], "ab"[which]);
        }
        if (which == 0) {
            p->a = t;
        } else {
            p->b = t;
        }
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        for (int s = 0; s < SLOT_N; s++) {
            const lora_pair *p = &sc->pairs[(size_t) l * SLOT_N + s];

            if (p->a == NULL && p->b == NULL) {
                continue;
            }
            if (check_pair(sc, l, s, err) != 0) {
                return -1;
            }
            n_pairs++;
        }
    }
    if (n_pairs == 0) {
        return nalar_fail(err, "%s: the adapter adapts no matrix (no "
                          "lora_a/lora_b tensors)", sc->path);
    }
    return 0;
}


int
nalar_lora_check_gguf(const nalar_model *m, const gguf_file *f,
                      nalar_err *err)
{
    lora_scan sc;
    int       rc;

    memset(&sc, 0, sizeof(sc));
    sc.path = f->path;
    sc.m = m;
    sc.f = f;
    rc = lora_scan_file(&sc, err);
    free(sc.pairs);
    return rc;
}


int
nalar_lora_check_model(const nalar_model *m, const char *path,
                       nalar_err *err)
{
    gguf_file *f = gguf_open(path, err);
    int        rc;

    if (f == NULL) {
        return -1;
    }
    rc = nalar_lora_check_gguf(m, f, err);
    gguf_close(f);
    return rc;
}


int
nalar_lora_check(const char *path, const char *base_path, nalar_err *err)
{
    nalar_model *m;
    int          rc;

    m = nalar_model_open_meta(base_path, err);
    if (m == NULL) {
        return -1;
    }
    rc = nalar_lora_check_model(m, path, err);
    nalar_model_destroy(m);
    return rc;
}


static nalar_mat
mat_of(const gguf_tensor *t)
{
    nalar_mat x;

    x.type = t->type;
    x.rows = (int64_t) t->ne[1];
    x.cols = (int64_t) t->ne[0];
    x.data = t->data;
    return x;
}


/* The views of one pair: rows [r0, r0 + n) of B, all of A. */
static void
view(nalar_lora_mat *dst, const lora_pair *p, int64_t r0, int64_t n,
     float scale)
{
    nalar_mat b = mat_of(p->b);

    dst->a = mat_of(p->a);
    dst->b = nalar_mat_rows(&b, r0, n);
    dst->scale = scale;
}


static void
bind_views(nalar_lora *a, const nalar_model *m, const lora_pair *pairs)
{
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        nalar_lora_layer  *Y = &a->layers[l];
        nalar_lora_mat    *dst[SLOT_N] = {
            &Y->wq, &Y->wk, &Y->wv, &Y->wo, &Y->w_gate, &Y->w_up, &Y->w_down,
            NULL
        };

        for (int s = 0; s < SLOT_N; s++) {
            const lora_pair *p = &pairs[(size_t) l * SLOT_N + s];
            float            sc;

            if (p->a == NULL) {
                continue;
            }
            /* llama.cpp: alpha / rank of this matrix, 1 without alpha */
            sc = (a->alpha > 0 ? a->alpha / (float) p->a->ne[1] : 1.0f)
                 * a->scale;
            if (s == SLOT_QKV) {
                view(&Y->wq, p, 0, L->wq.rows, sc);
                view(&Y->wk, p, L->wq.rows, L->wk.rows, sc);
                view(&Y->wv, p, L->wq.rows + L->wk.rows, L->wv.rows, sc);
            } else if (s == SLOT_UP && m->cfg.arch == ARCH_PHI3) {
                view(&Y->w_gate, p, 0, L->w_gate.rows, sc);
                view(&Y->w_up, p, L->w_gate.rows, L->w_up.rows, sc);
            } else {
                view(dst[s], p, 0, (int64_t) p->b->ne[1], sc);
            }
        }
    }
}


/* SHA-256 over "nalar-lora-v1", alpha, the operator's scale, and each
 * tensor's name, type, shape and bytes in file order. */
static int
lora_digest(nalar_lora *a)
{
    EVP_MD_CTX  *ctx = EVP_MD_CTX_new();
    unsigned int len = 0;
    uint8_t      d[EVP_MAX_MD_SIZE];
    int          ok;

    if (ctx == NULL) {
        return -1;
    }
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1
         && EVP_DigestUpdate(ctx, "nalar-lora-v1", 13) == 1
         && EVP_DigestUpdate(ctx, &a->alpha, sizeof(a->alpha)) == 1
         && EVP_DigestUpdate(ctx, &a->scale, sizeof(a->scale)) == 1;
    for (uint64_t i = 0; ok && i < a->gguf->n_tensors; i++) {
        const gguf_tensor *t = &a->gguf->tensors[i];
        uint32_t           type = (uint32_t) t->type;

        ok = EVP_DigestUpdate(ctx, &t->name.len, sizeof(t->name.len)) == 1
             && EVP_DigestUpdate(ctx, t->name.ptr, t->name.len) == 1
             && EVP_DigestUpdate(ctx, &type, sizeof(type)) == 1
             && EVP_DigestUpdate(ctx, t->ne, sizeof(t->ne)) == 1
             && EVP_DigestUpdate(ctx, t->data, t->nbytes) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, d, &len) == 1 && len == 32;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        return -1;
    }
    memcpy(a->digest, d, sizeof(a->digest));
    return 0;
}


nalar_lora *
nalar_lora_load(const nalar_model *m, const char *name, const char *path,
                float scale, nalar_err *err)
{
    gguf_file *f = gguf_open(path, err);

    return f != NULL ? nalar_lora_load_gguf(m, name, f, scale, err) : NULL;
}


nalar_lora *
nalar_lora_load_gguf(const nalar_model *m, const char *name, gguf_file *f,
                     float scale, nalar_err *err)
{
    nalar_lora *a;
    lora_scan   sc;

    if (!(scale > 0) || !isfinite(scale)) {
        nalar_fail(err, "%s: scale %g (a finite value > 0)", f->path,
                   (double) scale);
        gguf_close(f);
        return NULL;
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL) {
        nalar_fail(err, "%s: out of memory", f->path);
        gguf_close(f);
        return NULL;
    }
    /* from here on a owns f: nalar_lora_destroy closes it */
    a->gguf = f;
    a->name = strdup(name != NULL ? name : f->path);
    a->path = strdup(f->path);
    a->layers = calloc((size_t) m->cfg.n_layers, sizeof(nalar_lora_layer));
    if (a->name == NULL || a->path == NULL || a->layers == NULL) {
        nalar_fail(err, "%s: out of memory", f->path);
        nalar_lora_destroy(a);
        return NULL;
    }
    a->n_layers = m->cfg.n_layers;
    a->scale = scale;
    memset(&sc, 0, sizeof(sc));
    sc.path = a->path;
    sc.m = m;
    sc.f = f;
    if (lora_scan_file(&sc, err) != 0) {
        free(sc.pairs);
        nalar_lora_destroy(a);
        return NULL;
    }
    a->alpha = sc.alpha;
    a->rank = sc.rank;
    bind_views(a, m, sc.pairs);
    free(sc.pairs);
    if (lora_digest(a) != 0) {
        nalar_fail(err, "%s: out of memory (digest)", a->path);
        nalar_lora_destroy(a);
        return NULL;
    }
    return a;
}


void
nalar_lora_destroy(nalar_lora *a)
{
    if (a == NULL) {
        return;
    }
    if (a->gguf != NULL) {
        gguf_close(a->gguf);
    }
    free(a->layers);
    free(a->name);
    free(a->path);
    free(a);
}
