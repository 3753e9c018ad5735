/*
 * Model loading: read the configuration from GGUF metadata, check every
 * tensor's shape and type against it, and carve the weights out of the
 * mapping.  Nothing is copied except norm vectors stored in half precision.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "model.h"


static const struct { const char *name; nalar_arch arch; } archs[] = {
    { "llama", ARCH_LLAMA }, { "qwen2", ARCH_QWEN2 }, { "qwen3", ARCH_QWEN3 },
    { "gemma2", ARCH_GEMMA2 }, { "phi3", ARCH_PHI3 },
};

#define ARCH_LIST "llama (Llama, Mistral), qwen2, qwen3, gemma2, phi3"


static int
arch_of(const char *s, nalar_arch *arch)
{
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        if (strcmp(s, archs[i].name) == 0) {
            *arch = archs[i].arch;
            return 0;
        }
    }
    return -1;
}


const char *
nalar_arch_name(nalar_arch a)
{
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        if (archs[i].arch == a) {
            return archs[i].name;
        }
    }
    return "?";
}


static int64_t
arch_int(const gguf_file *f, const char *arch, const char *key, int64_t dflt)
{
    char k[128];

    snprintf(k, sizeof(k), "%s.%s", arch, key);
    return gguf_get_int(f, k, dflt);
}


static double
arch_float(const gguf_file *f, const char *arch, const char *key, double dflt)
{
    char k[128];

    snprintf(k, sizeof(k), "%s.%s", arch, key);
    return gguf_get_float(f, k, dflt);
}


/* What each architecture adds to the Llama computation, and the keys that
 * change it (llama.cpp's names and defaults). */
static int
read_hparams(nalar_model *m, const char *a, nalar_err *err)
{
    const gguf_file *f = m->gguf;
    nalar_config    *c = &m->cfg;
    char            *st;
    char             k[128];
    double           factor;
    int64_t          n_rot, v_len;

    n_rot = arch_int(f, a, "rope.dimension_count", c->head_dim);
    v_len = arch_int(f, a, "attention.value_length", c->head_dim);
    if (n_rot != c->head_dim || v_len != c->head_dim) {
        return nalar_fail(err, "%s: rope over %lld of %d head dimensions, or "
                          "value heads of %lld: the engine rotates whole "
                          "heads and needs key_length = value_length",
                          m->path, (long long) n_rot, c->head_dim,
                          (long long) v_len);
    }

    /* linear RoPE scaling: positions times 1 / factor */
    c->rope_scale = 1.0f;
    snprintf(k, sizeof(k), "%s.rope.scaling.type", a);
    st = gguf_get_str(f, k);
    if (st != NULL && strcmp(st, "linear") != 0 && strcmp(st, "none") != 0) {
        nalar_fail(err, "%s: rope scaling '%s' is not supported (only "
                   "linear)", m->path, st);
        free(st);
        return -1;
    }
    factor = arch_float(f, a, "rope.scaling.factor",
                        arch_float(f, a, "rope.scale_linear", 0.0));
    if ((st == NULL || strcmp(st, "linear") == 0) && factor != 0.0) {
        if (!(factor > 0.0 && factor < 1e6)) {
            free(st);
            return nalar_fail(err, "%s: rope scaling factor %g", m->path,
                              factor);
        }
        c->rope_scale = (float) (1.0 / factor);
    }
    free(st);
    if (gguf_tensor_find(f, "rope_factors_long.weight") != NULL
        || gguf_tensor_find(f, "rope_factors_short.weight") != NULL)
    {
        return nalar_fail(err, "%s: LongRoPE factors (rope_factors_long/"
                          "short) are not supported", m->path);
    }

    c->attn_scale = 1.0f / sqrtf((float) c->head_dim);
    c->embd_scale = 1.0f;
    switch (c->arch) {
    case ARCH_QWEN3:
        c->qk_norm = 1;
        break;
    case ARCH_GEMMA2:
        c->ffn_gelu = 1;
        c->post_norms = 1;
        c->embd_scale = sqrtf((float) c->dim);
        c->attn_softcap = (float) arch_float(f, a, "attn_logit_softcapping",
                                             50.0);
        c->final_softcap = (float) arch_float(f, a,
                                              "final_logit_softcapping",
                                              30.0);
        c->swa_window = (int32_t) arch_int(f, a, "attention.sliding_window",
                                           4096);
        c->swa_layers = 2;
        /* query_pre_attn_scalar is not in the file: 27B (46 layers)
         * scales by dim / n_heads, the others by head_dim */
        if (c->n_layers == 46 && c->n_heads > 0) {
            c->attn_scale = 1.0f / sqrtf((float) c->dim / (float) c->n_heads);
        }
        break;
    case ARCH_PHI3:
        c->swa_window = (int32_t) arch_int(f, a, "attention.sliding_window",
                                           0);
        c->swa_layers = c->swa_window > 0;
        break;
    default:
        break;
    }
    if (c->swa_window < 0 || c->attn_softcap < 0 || c->final_softcap < 0
        || !isfinite(c->attn_softcap) || !isfinite(c->final_softcap))
    {
        return nalar_fail(err, "%s: negative sliding window or soft-cap",
                          m->path);
    }
    return 0;
}


static int
read_config(nalar_model *m, nalar_err *err)
{
    const gguf_file *f = m->gguf;
    nalar_config    *c = &m->cfg;
    const gguf_kv   *toks;
    char            *a;
    int              rc;

    a = gguf_get_str(f, "general.architecture");
    if (a == NULL) {
        return nalar_fail(err, "%s: no general.architecture", m->path);
    }
    if (arch_of(a, &c->arch) != 0) {
        nalar_fail(err, "%s: unsupported architecture '%s' (supported: "
                   ARCH_LIST ")", m->path, a);
        free(a);
        return -1;
    }
    c->dim = (int32_t) arch_int(f, a, "embedding_length", 0);
    c->n_layers = (int32_t) arch_int(f, a, "block_count", 0);
    c->n_heads = (int32_t) arch_int(f, a, "attention.head_count", 0);
    c->n_kv_heads = (int32_t) arch_int(f, a, "attention.head_count_kv",
                                       c->n_heads);
    c->ffn_dim = (int32_t) arch_int(f, a, "feed_forward_length", 0);
    c->n_ctx = (int32_t) arch_int(f, a, "context_length", 2048);
    c->norm_eps = (float) arch_float(f, a, "attention.layer_norm_rms_epsilon",
                                     1e-5);
    c->rope_base = (float) arch_float(f, a, "rope.freq_base", 10000.0);
    c->rope_neox = c->arch != ARCH_LLAMA;
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    c->head_dim = (int32_t) arch_int(f, a, "attention.key_length",
                                     c->head_dim);

    toks = gguf_find(f, "tokenizer.ggml.tokens");
    c->n_vocab = toks != NULL && toks->type == GGUF_T_ARRAY
                 ? (int32_t) toks->arr_len : 0;

    if (c->dim <= 0 || c->dim > 65536 || c->n_layers <= 0
        || c->n_layers > 1024 || c->n_heads <= 0 || c->n_heads > 1024
        || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0
        || c->head_dim <= 0 || c->head_dim % 2 != 0 || c->head_dim > 1024
        || c->ffn_dim <= 0 || c->ffn_dim > 1 << 20 || c->n_ctx <= 0
        || c->n_vocab <= 0 || c->n_vocab > 1 << 22)
    {
        free(a);
        return nalar_fail(err, "%s: implausible model shape (dim %d, layers "
                          "%d, heads %d/%d, head_dim %d, ffn %d, ctx %d, "
                          "vocab %d)", m->path, c->dim, c->n_layers,
                          c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
                          c->n_ctx, c->n_vocab);
    }
    rc = read_hparams(m, a, err);
    free(a);
    return rc;
}


static int
type_ok_for_matrix(ggml_type t)
{
    return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16
           || t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_K
           || t == GGML_Q5_K || t == GGML_Q6_K;
}


/* Find a 2-D weight of shape (rows, cols) [ggml ne = {cols, rows}]. */
static int
bind_mat(nalar_model *m, nalar_mat *mat, const char *name, int64_t rows,
         int64_t cols, int optional, nalar_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(m->gguf, name);

    memset(mat, 0, sizeof(*mat));
    if (t == NULL) {
        if (optional) {
            return 0;
        }
        return nalar_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if (t->n_dims != 2 || (int64_t) t->ne[0] != cols
        || (int64_t) t->ne[1] != rows)
    {
        return nalar_fail(err, "%s: tensor '%s' has shape [%llu, %llu], "
                          "expected [%lld, %lld]", m->path, name,
                          (unsigned long long) t->ne[0],
                          (unsigned long long) (t->n_dims > 1 ? t->ne[1] : 1),
                          (long long) cols, (long long) rows);
    }
    if (!type_ok_for_matrix(t->type)) {
        return nalar_fail(err, "%s: tensor '%s' has type %s, which the "
                          "engine does not compute with (it computes with "
                          GGML_TYPES_SUPPORTED ")", m->path, name,
                          ggml_type_name(t->type));
    }
    mat->type = t->type;
    mat->rows = rows;
    mat->cols = cols;
    mat->data = t->data;
    return 0;
}


/* Bind a vector of n floats; half-precision ones are widened into
 * m->owned_f32 at *owned_off. */
static int
bind_vec(nalar_model *m, const float **out, const char *name, int64_t n,
         int optional, size_t *owned_off, nalar_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(m->gguf, name);
    float             *dst;

    *out = NULL;
    if (t == NULL) {
        if (optional) {
            return 0;
        }
        return nalar_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if (t->n_dims != 1 || (int64_t) t->ne[0] != n) {
        return nalar_fail(err, "%s: tensor '%s' should be a vector of %lld",
                          m->path, name, (long long) n);
    }
    if (t->type == GGML_F32) {
        *out = t->data;
        return 0;
    }
    if (t->type != GGML_F16 && t->type != GGML_BF16) {
        return nalar_fail(err, "%s: vector '%s' has unsupported type %s",
                          m->path, name, ggml_type_name(t->type));
    }
    if (m->owned_f32 == NULL) {
        /* widening happens only during a full load; the check path keeps
         * a NULL pointer */
        return 0;
    }
    dst = m->owned_f32 + *owned_off;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;

        memcpy(&h, (const uint8_t *) t->data + 2 * i, 2);
        dst[i] = t->type == GGML_F16 ? nalar_f16_to_f32(h)
                                     : nalar_bf16_to_f32(h);
    }
    *owned_off += (size_t) n;
    *out = dst;
    return 0;
}


nalar_mat
nalar_mat_rows(const nalar_mat *W, int64_t r0, int64_t n)
{
    nalar_mat dst = *W;

    dst.rows = n;
    dst.data = W->data == NULL
               ? NULL
               : (const uint8_t *) W->data
                 + (size_t) r0 * ggml_row_size(W->type, (uint64_t) W->cols);
    return dst;
}


static int
bind_weights(nalar_model *m, int widen, nalar_err *err)
{
    const nalar_config *c = &m->cfg;
    int64_t  q_dim = (int64_t) c->n_heads * c->head_dim;
    int64_t  kv_dim = (int64_t) c->n_kv_heads * c->head_dim;
    size_t   off = 0;
    char     name[96];

    if (widen) {
        /* upper bound: every norm, bias and factor vector */
        size_t n = (size_t) c->dim * (4 * (size_t) c->n_layers + 1)
                   + (size_t) c->n_layers * (size_t) (q_dim + 2 * kv_dim
                                                      + 2 * c->head_dim)
                   + (size_t) c->head_dim / 2;
        m->owned_f32 = malloc(n * sizeof(float));
        if (m->owned_f32 == NULL) {
            return nalar_fail(err, "%s: out of memory", m->path);
        }
    }

    if (bind_mat(m, &m->tok_embd, "token_embd.weight", c->n_vocab, c->dim, 0,
                 err) != 0
        || bind_vec(m, &m->out_norm, "output_norm.weight", c->dim, 0, &off,
                    err) != 0
        || bind_mat(m, &m->output, "output.weight", c->n_vocab, c->dim, 1,
                    err) != 0)
    {
        return -1;
    }
    if (m->output.data == NULL) {
        m->output = m->tok_embd;  /* tied embeddings */
    }
    if (bind_vec(m, &m->rope_freqs, "rope_freqs.weight", c->head_dim / 2, 1,
                 &off, err) != 0)
    {
        return -1;
    }
    if (m->rope_freqs != NULL) {
        for (int32_t i = 0; i < c->head_dim / 2; i++) {
            if (!(m->rope_freqs[i] > 0) || !isfinite(m->rope_freqs[i])) {
                return nalar_fail(err, "%s: rope_freqs.weight[%d] is %g",
                                  m->path, i, (double) m->rope_freqs[i]);
            }
        }
    }

    m->layers = calloc((size_t) c->n_layers, sizeof(nalar_layer));
    if (m->layers == NULL) {
        return nalar_fail(err, "%s: out of memory", m->path);
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        nalar_layer *L = &m->layers[l];
        int          opt_bias = c->arch != ARCH_QWEN2;
        int          qn = !c->qk_norm, pn = !c->post_norms;

#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, l), name)
        if (bind_vec(m, &L->attn_norm, NAME("attn_norm.weight"), c->dim, 0,
                     &off, err) != 0
            || bind_vec(m, &L->bq, NAME("attn_q.bias"), q_dim, opt_bias, &off,
                        err) != 0
            || bind_vec(m, &L->bk, NAME("attn_k.bias"), kv_dim, opt_bias,
                        &off, err) != 0
            || bind_vec(m, &L->bv, NAME("attn_v.bias"), kv_dim, opt_bias,
                        &off, err) != 0
            || bind_vec(m, &L->q_norm, NAME("attn_q_norm.weight"),
                        c->head_dim, qn, &off, err) != 0
            || bind_vec(m, &L->k_norm, NAME("attn_k_norm.weight"),
                        c->head_dim, qn, &off, err) != 0
            || bind_vec(m, &L->post_attn_norm,
                        NAME("post_attention_norm.weight"), c->dim, pn, &off,
                        err) != 0
            || bind_vec(m, &L->post_ffn_norm, NAME("post_ffw_norm.weight"),
                        c->dim, pn, &off, err) != 0
            || bind_mat(m, &L->wo, NAME("attn_output.weight"), c->dim, q_dim,
                        0, err) != 0
            || bind_vec(m, &L->ffn_norm, NAME("ffn_norm.weight"), c->dim, 0,
                        &off, err) != 0
            || bind_mat(m, &L->w_down, NAME("ffn_down.weight"), c->dim,
                        c->ffn_dim, 0, err) != 0)
        {
            return -1;
        }
        if (c->arch == ARCH_PHI3) {
            nalar_mat qkv, gu;

            if (bind_mat(m, &qkv, NAME("attn_qkv.weight"), q_dim + 2 * kv_dim,
                         c->dim, 0, err) != 0
                || bind_mat(m, &gu, NAME("ffn_up.weight"), 2 * c->ffn_dim,
                            c->dim, 0, err) != 0)
            {
                return -1;
            }
            L->wq = nalar_mat_rows(&qkv, 0, q_dim);
            L->wk = nalar_mat_rows(&qkv, q_dim, kv_dim);
            L->wv = nalar_mat_rows(&qkv, q_dim + kv_dim, kv_dim);
            L->w_gate = nalar_mat_rows(&gu, 0, c->ffn_dim);
            L->w_up = nalar_mat_rows(&gu, c->ffn_dim, c->ffn_dim);
        } else if (bind_mat(m, &L->wq, NAME("attn_q.weight"), q_dim, c->dim,
                            0, err) != 0
                   || bind_mat(m, &L->wk, NAME("attn_k.weight"), kv_dim,
                               c->dim, 0, err) != 0
                   || bind_mat(m, &L->wv, NAME("attn_v.weight"), kv_dim,
                               c->dim, 0, err) != 0
                   || bind_mat(m, &L->w_gate, NAME("ffn_gate.weight"),
                               c->ffn_dim, c->dim, 0, err) != 0
                   || bind_mat(m, &L->w_up, NAME("ffn_up.weight"), c->ffn_dim,
                               c->dim, 0, err) != 0)
        {
            return -1;
        }
#undef NAME
    }
    return 0;
}


/*
 * Identity of the computation: a 256-bit digest (four independent 64-bit
 * multiply-xorshift lanes) over the configuration, every tensor's name,
 * type, shape and bytes, and the tokenizer metadata.  Two files that
 * compute the same thing hash the same; any weight or vocabulary change
 * changes it.  Not cryptographic: it guards against mix-ups, not attacks.
 */
typedef struct { uint64_t h[4]; } ident_hash;

static void
ident_mix(ident_hash *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    size_t         i = 0;

    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; k++) {
            uint64_t w;

            memcpy(&w, p + i + 8 * k, 8);
            s->h[k] = (s->h[k] ^ w) * 0x9E3779B97F4A7C15ull;
            s->h[k] ^= s->h[k] >> 29;
        }
    }
    for (; i < n; i++) {
        s->h[i & 3] = (s->h[i & 3] ^ p[i]) * 0xBF58476D1CE4E5B9ull;
    }
    for (int k = 0; k < 4; k++) {
        s->h[k] = (s->h[k] ^ n) * 0x94D049BB133111EBull;
    }
}


static void
compute_identity(nalar_model *m)
{
    ident_hash s = { { 1, 2, 3, 4 } };
    const gguf_file *f = m->gguf;

    ident_mix(&s, &m->cfg, sizeof(m->cfg));
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];

        ident_mix(&s, t->name.ptr, t->name.len);
        ident_mix(&s, &t->type, sizeof(t->type));
        ident_mix(&s, t->ne, sizeof(t->ne));
        ident_mix(&s, t->data, t->nbytes);
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];

        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0) {
            continue;
        }
        ident_mix(&s, kv->key.ptr, kv->key.len);
        if (kv->type == GGUF_T_ARRAY && kv->arr_strs != NULL) {
            for (uint64_t j = 0; j < kv->arr_len; j++) {
                ident_mix(&s, kv->arr_strs[j].ptr, kv->arr_strs[j].len);
            }
        } else if (kv->type == GGUF_T_ARRAY && kv->arr_data != NULL) {
            ident_mix(&s, kv->arr_data,
                      kv->arr_len * (kv->arr_type == GGUF_T_FLOAT32
                                     || kv->arr_type == GGUF_T_INT32
                                     || kv->arr_type == GGUF_T_UINT32 ? 4
                                     : kv->arr_type == GGUF_T_UINT64
                                     || kv->arr_type == GGUF_T_INT64
                                     || kv->arr_type == GGUF_T_FLOAT64 ? 8
                                     : kv->arr_type == GGUF_T_UINT16
                                     || kv->arr_type == GGUF_T_INT16 ? 2 : 1));
        } else if (kv->type == GGUF_T_STRING) {
            ident_mix(&s, kv->v.s.ptr, kv->v.s.len);
        } else {
            ident_mix(&s, &kv->v, sizeof(kv->v));
        }
    }
    memcpy(m->identity, s.h, sizeof(m->identity));
}


static nalar_model *
model_open(const char *path, int full, nalar_err *err)
{
    nalar_model *m;
    const char  *base;
    char        *gname;

    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        nalar_fail(err, "%s: out of memory", path);
        return NULL;
    }
    m->path = strdup(path);
    if (m->path == NULL) {
        free(m);
        nalar_fail(err, "%s: out of memory", path);
        return NULL;
    }
    m->gguf = gguf_open(path, err);
    if (m->gguf == NULL) {
        nalar_model_destroy(m);
        return NULL;
    }
    if (m->gguf->n_tensors == 0) {
        nalar_fail(err, "%s: holds no tensors (a vocabulary-only file "
                   "cannot serve)", path);
        nalar_model_destroy(m);
        return NULL;
    }
    if (read_config(m, err) != 0 || bind_weights(m, full, err) != 0) {
        nalar_model_destroy(m);
        return NULL;
    }
    m->tok = nalar_tokenizer_create(m->gguf, err);
    if (m->tok == NULL) {
        char msg[sizeof(err->msg)];

        snprintf(msg, sizeof(msg), "%s", err->msg);
        nalar_fail(err, "%s: tokenizer: %s", path, msg);
        nalar_model_destroy(m);
        return NULL;
    }
    if (nalar_tok_n_vocab(m->tok) != m->cfg.n_vocab) {
        nalar_fail(err, "%s: vocabulary has %d tokens but the embedding "
                   "has %d rows", path, nalar_tok_n_vocab(m->tok),
                   m->cfg.n_vocab);
        nalar_model_destroy(m);
        return NULL;
    }
    gname = gguf_get_str(m->gguf, "general.name");
    if (gname != NULL) {
        m->name = gname;
    } else {
        base = strrchr(path, '/');
        m->name = strdup(base != NULL ? base + 1 : path);
        if (m->name == NULL) {
            nalar_model_destroy(m);
            nalar_fail(err, "%s: out of memory", path);
            return NULL;
        }
    }
    if (full) {
        compute_identity(m);
    }
    return m;
}


int
nalar_model_check(const char *path, nalar_err *err)
{
    nalar_model *m = model_open(path, 0, err);

    if (m == NULL) {
        return -1;
    }
    nalar_model_destroy(m);
    return 0;
}


int
nalar_model_check_kv(const char *path, int64_t *kv_block_bytes,
                     nalar_err *err)
{
    nalar_model *m = model_open(path, 0, err);

    if (m == NULL) {
        return -1;
    }
    *kv_block_bytes = nalar_kv_block_bytes(m, GGML_F32);
    nalar_model_destroy(m);
    return 0;
}


int32_t
nalar_kv_elem_bytes(ggml_type kv_type)
{
    switch (kv_type) {
    case GGML_F32:  return (int32_t) sizeof(float);
    case GGML_F16:
    case GGML_BF16: return 2;
    default:        return 0;
    }
}


int64_t
nalar_kv_block_bytes(const nalar_model *m, ggml_type kv_type)
{
    return (int64_t) 2 * m->cfg.n_layers * NALAR_KV_BLOCK
           * m->cfg.n_kv_heads * m->cfg.head_dim
           * nalar_kv_elem_bytes(kv_type);
}


nalar_model *
nalar_model_load(const char *path, nalar_err *err)
{
    return model_open(path, 1, err);
}


nalar_model *
nalar_model_open_meta(const char *path, nalar_err *err)
{
    return model_open(path, 0, err);
}


void
nalar_model_destroy(nalar_model *m)
{
    if (m == NULL) {
        return;
    }
    if (m->tok != NULL) {
        nalar_tokenizer_destroy(m->tok);
    }
    if (m->gguf != NULL) {
        gguf_close(m->gguf);
    }
    free(m->layers);
    free(m->owned_f32);
    free(m->name);
    free(m->path);
    free(m);
}


char *
nalar_model_describe(const nalar_model *m)
{
    const nalar_config *c = &m->cfg;
    const nalar_layer  *L = &m->layers[0];
    char               *s;
    size_t              cap = 4096;
    uint64_t            n_params = 0;

    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        uint64_t           n = 1;

        for (uint32_t d = 0; d < t->n_dims; d++) {
            n *= t->ne[d];
        }
        n_params += n;
    }
    s = malloc(cap);
    if (s == NULL) {
        return NULL;
    }
    snprintf(s, cap,
             "file:          %s\n"
             "name:          %s\n"
             "gguf version:  %u (alignment %llu, %llu tensors, %llu keys)\n"
             "architecture:  %s\n"
             "dim:           %d\n"
             "layers:        %d\n"
             "heads:         %d (kv heads %d, head_dim %d)\n"
             "ffn:           %d\n"
             "vocab:         %d\n"
             "context:       %d\n"
             "rope:          base %g, %s pairing\n"
             "norm eps:      %g\n"
             "parameters:    %llu\n"
             "types:         embedding %s, attn_q %s, ffn_down %s, "
             "output %s%s\n"
             "tokenizer:     %s (bos %d, eos %d, add_bos %s)\n",
             m->path, m->name, m->gguf->version,
             (unsigned long long) m->gguf->alignment,
             (unsigned long long) m->gguf->n_tensors,
             (unsigned long long) m->gguf->n_kv,
             nalar_arch_name(c->arch),
             c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
             c->ffn_dim, c->n_vocab, c->n_ctx, (double) c->rope_base,
             c->rope_neox ? "neox (x[i], x[i+d/2])"
                          : "normal (x[2i], x[2i+1])",
             (double) c->norm_eps, (unsigned long long) n_params,
             ggml_type_name(m->tok_embd.type), ggml_type_name(L->wq.type),
             ggml_type_name(L->w_down.type), ggml_type_name(m->output.type),
             m->output.data == m->tok_embd.data ? " (tied)" : "",
             nalar_tok_kind_of(m->tok) == TOK_SPM
             ? "llama (SentencePiece)" : "gpt2 (byte-level BPE)",
             nalar_tok_bos(m->tok), nalar_tok_eos(m->tok),
             nalar_tok_add_bos(m->tok) ? "yes" : "no");
    return s;
}
