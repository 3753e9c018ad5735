/*
 * A loaded Llama-family model: configuration from GGUF metadata, weights
 * carved out of the mmapped file (never copied), and its tokenizer.
 *
 * Matrices follow GGUF/ggml layout: a weight `W` applied as y = W x has
 * rows = output features, cols = input features, and each row is contiguous
 * (ggml ne[0] = cols).
 */
#ifndef NALAR_MODEL_H
#define NALAR_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "kv.h"
#include "nalar_err.h"
#include "tokenizer.h"

typedef enum {
    ARCH_LLAMA = 1, ARCH_QWEN2 = 2, ARCH_QWEN3 = 3, ARCH_GEMMA2 = 4,
    ARCH_PHI3 = 5
} nalar_arch;

/* "llama", "qwen2", ... as general.architecture names it */
const char *nalar_arch_name(nalar_arch a);

typedef struct {
    nalar_arch arch;
    int32_t dim;          /* embedding width */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;   /* GQA: n_heads % n_kv_heads == 0 */
    int32_t head_dim;     /* dim / n_heads unless the file says otherwise */
    int32_t ffn_dim;
    int32_t n_vocab;
    int32_t n_ctx;        /* training context length */
    float   norm_eps;
    float   rope_base;
    int     rope_neox;    /* 0: pairs (x[2i], x[2i+1]); 1: (x[i], x[i+d/2]) */
    /* every rotation angle is pos * base^(-2i/head_dim) * rope_scale
     * / rope_freqs[i] (rope_freqs: the model's, or 1) */
    float   rope_scale;   /* linear rope.scaling: 1 / factor; 1 if none */
    float   attn_scale;   /* score = q.k * attn_scale */
    float   attn_softcap; /* > 0: score = cap * tanh(score / cap) */
    float   final_softcap;/* > 0: logit = cap * tanh(logit / cap) */
    float   embd_scale;   /* input embeddings multiplied by it (gemma2) */
    int32_t swa_window;   /* > 0: a sliding layer's query at p sees keys
                             at p - swa_window < k <= p */
    int     swa_layers;   /* which layers slide: 0 none, 1 all, 2 even */
    int     ffn_gelu;     /* FFN gate: 1 GELU (tanh), 0 SiLU */
    int     qk_norm;      /* per-head RMSNorm of q and k before RoPE */
    int     post_norms;   /* RMSNorm of attention and FFN outputs */
} nalar_config;

/* The window of layer l: swa_window when it slides, else 0. */
static inline int32_t
nalar_layer_window(const nalar_config *c, int l)
{
    if (c->swa_window <= 0 || c->swa_layers == 0) {
        return 0;
    }
    return c->swa_layers == 1 || l % 2 == 0 ? c->swa_window : 0;
}

typedef struct {
    ggml_type   type;
    int64_t     rows;     /* output features */
    int64_t     cols;     /* input features (contiguous) */
    const void *data;     /* rows * row_size(type, cols) bytes */
} nalar_mat;

typedef struct {
    const float *attn_norm;  /* (dim) */
    nalar_mat    wq;         /* (n_heads * head_dim, dim); phi3: rows of
                                the fused attn_qkv, as are wk and wv */
    nalar_mat    wk;         /* (n_kv_heads * head_dim, dim) */
    nalar_mat    wv;         /* (n_kv_heads * head_dim, dim) */
    const float *bq, *bk, *bv; /* qwen2 biases or NULL */
    const float *q_norm;     /* (head_dim) qwen3 per-head norms or NULL */
    const float *k_norm;
    const float *post_attn_norm; /* (dim) gemma2, or NULL */
    const float *post_ffn_norm;  /* (dim) gemma2, or NULL */
    nalar_mat    wo;         /* (dim, n_heads * head_dim) */
    const float *ffn_norm;   /* (dim) */
    nalar_mat    w_gate;     /* (ffn_dim, dim)  "w1"; phi3: the first
                                half of the fused ffn_up, w_up the second */
    nalar_mat    w_up;       /* (ffn_dim, dim)  "w3" */
    nalar_mat    w_down;     /* (dim, ffn_dim)  "w2" */
} nalar_layer;

typedef struct nalar_model {
    char           *path;
    char           *name;        /* general.name or file name */
    gguf_file      *gguf;
    nalar_config    cfg;
    nalar_tokenizer *tok;
    nalar_mat       tok_embd;    /* (n_vocab, dim) */
    const float    *out_norm;    /* (dim) */
    const float    *rope_freqs;  /* (head_dim / 2) frequency factors, or
                                    NULL (Llama 3.1 rope_freqs.weight) */
    nalar_mat       output;      /* (n_vocab, dim); = tok_embd when tied */
    nalar_layer    *layers;      /* (n_layers) */
    /* norm vectors stored as F16/BF16 in the file are widened here */
    float          *owned_f32;
    /* identity of the computation: hash of shapes, types, weights' bytes
     * and tokenizer; the prefix cache keys on it */
    uint8_t         identity[32];
} nalar_model;

/* Validate header, architecture, tensor table and vocabulary without
 * touching weight bytes (for `nginx -t`). */
int nalar_model_check(const char *path, nalar_err *err);
/* The same, and the bytes one KV block of the model takes in F32. */
int nalar_model_check_kv(const char *path, int64_t *kv_block_bytes,
                         nalar_err *err);

/* Bytes of one K or V element in the KV cache: 4 for GGML_F32, 2 for
 * GGML_F16 and GGML_BF16, 0 for a type no KV cache holds.  The one rule
 * every pool size is computed from. */
int32_t nalar_kv_elem_bytes(ggml_type kv_type);

/* Bytes of KV storage one block takes for this model (K and V of every
 * layer) in elements of kv_type (for sizing pools). */
int64_t nalar_kv_block_bytes(const nalar_model *m, ggml_type kv_type);

nalar_model *nalar_model_load(const char *path, nalar_err *err);
/* The configuration and the matrices' shapes and types, as nginx -t
 * checks them, without touching weight bytes (no identity, no widened
 * norms: only for checks against the model, never for computing). */
nalar_model *nalar_model_open_meta(const char *path, nalar_err *err);
void nalar_model_destroy(nalar_model *m);

/* Rows [r0, r0 + n) of W as a matrix of its own (a fused tensor's part:
 * every type's rows are whole blocks). */
nalar_mat nalar_mat_rows(const nalar_mat *W, int64_t r0, int64_t n);

/* One human-readable description (for `nalar inspect`); malloc'd. */
char *nalar_model_describe(const nalar_model *m);

/*
 * What a loaded model says about itself to the layers above the engine
 * (src/model_info.c), so that they do not reach into nalar_model: its
 * tokenizer, its context length (tokens), and the GGUF's
 * tokenizer.chat_template, malloc'd (free() it), or NULL where it has none.
 */
const nalar_tokenizer *nalar_model_tokenizer(const nalar_model *m);
int32_t nalar_model_n_ctx(const nalar_model *m);
char *nalar_model_chat_template(const nalar_model *m);

/*
 * A batch for one forward pass: tokens from many sequences at arbitrary
 * positions.  Before the pass, each token's sequence must have KV reserved
 * for pos + 1 positions; the pass writes K/V at (seq, pos) for every token
 * and each token attends to positions [0, pos] of its own sequence, so
 * several tokens of one sequence in one batch (a prefill chunk, speculative
 * verification) are causal.  Logits are produced for tokens with
 * want_logits set, in batch order.
 */
typedef struct {
    int32_t        n_tokens;
    int32_t       *tokens;      /* (n_tokens) */
    int32_t       *pos;         /* (n_tokens) */
    nalar_seq_kv **seq;         /* (n_tokens) */
    int8_t        *want_logits; /* (n_tokens) */
    int32_t        n_logits;    /* number of want_logits set */
    /* LoRA: each token's adapter as the backend attached it
     * (lora_attach), 0 for the base alone; NULL: every token 0 */
    const int32_t *adapter;     /* (n_tokens) or NULL */
} nalar_batch;

#endif
