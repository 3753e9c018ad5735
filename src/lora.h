/*
 * LoRA adapters: low-rank fine-tunes of a loaded base model, in the GGUF
 * form llama.cpp writes (general.type = "adapter", adapter.type = "lora",
 * adapter.lora.alpha, and for each adapted weight W "<W's name>.lora_a"
 * and "<W's name>.lora_b").
 *
 * An adapter changes a weight W (rows, cols) to W + scale * B A, where
 *   A = lora_a: (rank, cols)   ggml ne = {cols, rank}
 *   B = lora_b: (rows, rank)   ggml ne = {rank, rows}
 *   scale = adapter.lora.alpha / rank * the operator's scale
 *           (alpha 0 or absent: 1 * the operator's scale)
 * so y = W x + scale * B (A x): the base weights are never changed, and
 * never copied.  The adapter's tensors are views into its mmapped file;
 * a backend keeps its own copies of them, as it does of the base's (the
 * CPU backend: panels per worker).
 *
 * Where the base model fuses matrices (phi3's attn_qkv, and ffn_up holding
 * gate | up), the adapter adapts the fused tensor; the views below then
 * point at the rows of B that belong to each of the model's views (wq,
 * wk, wv; w_gate, w_up), and share A.
 *
 * Identity: `digest` is SHA-256 over the adapter's tensors (names, types,
 * shapes and bytes) and its effective scale.  The prefix cache keys on it,
 * so KV computed under one adapter (or none) never serves another.
 */
#ifndef NALAR_LORA_H
#define NALAR_LORA_H

#include <stdint.h>

#include "gguf.h"
#include "model.h"
#include "nalar_err.h"

/* The largest rank an adapter's matrix may have (nalar_lora_check). */
#define NALAR_LORA_MAX_RANK 512

/* One adapted matrix: a.data == NULL when the adapter leaves it alone. */
typedef struct {
    nalar_mat a;      /* (rank, cols) */
    nalar_mat b;      /* (rows, rank): the rows of the model's view */
    float     scale;  /* the adapter's effective scale */
} nalar_lora_mat;

typedef struct {
    nalar_lora_mat wq, wk, wv, wo, w_gate, w_up, w_down;
} nalar_lora_layer;

typedef struct nalar_lora {
    char             *name;      /* the operator's name for it */
    char             *path;
    gguf_file        *gguf;      /* mmapped; the tensors point into it */
    int32_t           rank;      /* the largest rank of its matrices */
    float             alpha;     /* adapter.lora.alpha (0: absent) */
    float             scale;     /* the operator's scale (1 by default) */
    int32_t           n_layers;
    nalar_lora_layer *layers;    /* (n_layers), the base model's count */
    uint8_t           digest[32];
} nalar_lora;

/*
 * Validate an adapter file against its base model without touching weight
 * bytes (for `nginx -t`): the header, general.type and adapter.type, that
 * every tensor is a .lora_a/.lora_b pair of a matrix the base has and the
 * engine adapts (attention q/k/v/output, or fused qkv, and FFN gate, up,
 * down), that the shapes agree with the base's matrix and with each other
 * (A's rank = B's rank), that the architecture (general.architecture,
 * when the file names one) is the base's, and that the types are ones the
 * CPU kernels read (F32, F16, BF16, Q8_0).  0, or -1 with err naming the
 * file and what is wrong.
 */
int nalar_lora_check(const char *path, const char *base_path,
                     nalar_err *err);

/* The same checks against a base opened once (nalar_model_open_meta or
 * nalar_model_load), for a base with several adapters. */
int nalar_lora_check_model(const nalar_model *m, const char *path,
                           nalar_err *err);

/* The same checks of an adapter already parsed (gguf_open or, from
 * memory, gguf_open_mem); messages name f->path. */
int nalar_lora_check_gguf(const nalar_model *m, const gguf_file *f,
                          nalar_err *err);

/* 1 for the types an adapter's A and B may have (F32, F16, BF16, Q8_0:
 * those the CPU kernels read), else 0 */
int nalar_lora_type_ok(ggml_type t);

/* Load an adapter for a loaded model: the same checks, then the views
 * and the digest.  scale: the operator's (> 0, finite).  NULL with err
 * when the file is refused. */
nalar_lora *nalar_lora_load(const nalar_model *m, const char *name,
                            const char *path, float scale, nalar_err *err);

/* The same from an adapter already parsed, which it takes: the adapter
 * owns f from then on, and f is closed when the load fails. */
nalar_lora *nalar_lora_load_gguf(const nalar_model *m, const char *name,
                                 gguf_file *f, float scale, nalar_err *err);

void nalar_lora_destroy(nalar_lora *a);

#endif
