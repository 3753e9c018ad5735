/*
 * The CUDA backend: the engine's forward pass on one NVIDIA GPU.
 *
 * Weights are uploaded once (cudaMalloc, never managed memory; Q8_0
 * repacked, q|k|v and gate|up fused into one matrix each when their types
 * agree); the KV pool lives in device memory with the CPU backend's layout;
 * every launch and copy goes to the backend's own stream.  Decode steps
 * (one token per sequence, every token wanting logits) are padded to a
 * power-of-two bucket and, from the second step of a bucket on, replayed
 * as a CUDA graph.
 *
 * Plain C header: the engine and the check program include it.
 */
#ifndef NALAR_CUDA_BACKEND_H
#define NALAR_CUDA_BACKEND_H

#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "nalar_err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gemv_max: matrix products of up to this many tokens go through the
 * FP32-activation GEMV kernels, larger ones through cuBLAS; <= 0: the
 * default (nalar_cuda_ctx_init) */
nalar_backend *nalar_cuda_backend_create(nalar_model *m, int device,
                                         int32_t gemv_max, nalar_err *err);

/*
 * A backend for a model shape with random weights of `type` (F16, BF16 or
 * Q8_0) made directly in device memory: benchmarks of large shapes with no
 * file to write or load.  The backend owns a stub model (cfg and name
 * only: no tokenizer, no host weights).  gemv_max as above.
 */
nalar_backend *nalar_cuda_backend_create_synthetic(const nalar_config *cfg,
                                                   ggml_type type,
                                                   uint64_t seed, int device,
                                                   int32_t gemv_max,
                                                   nalar_err *err);

/* Shapes for --synthetic: "llama3-8b" (dim 4096, 32 layers, 32 heads,
 * 8 KV heads, ffn 14336, vocab 128256), "llama3-1b", "tiny". */
int nalar_cuda_synthetic_config(const char *name, nalar_config *cfg,
                                nalar_err *err);

/* Weight bytes one decode step reads (every projection and the output
 * head; the embedding is gathered, not read). */
int64_t nalar_cuda_weight_bytes(const nalar_backend *be);

/* Kernel launches in the captured graph of a decode step of n_tokens
 * sequences (its bucket); -1 while that bucket has no graph. */
int32_t nalar_cuda_graph_kernels(const nalar_backend *be, int32_t n_tokens);

/* BF16 projections of 1..16 tokens on the tensor-core kernel (on != 0)
 * or the FP32-activation GEMV (0, the default); drops captured graphs. */
void    nalar_cuda_backend_gemv_mma(nalar_backend *be, int on);

/* Devices visible (0 without a GPU or driver). */
int     nalar_cuda_device_count(void);

/* Free device memory in bytes, for sizing the KV pool as a fraction of
 * it; -1 when the device cannot be queried. */
int64_t nalar_cuda_free_memory(int device);

/*
 * `nalar bench --backend cuda` / `--synthetic SHAPE`: HBM copy bandwidth,
 * prefill, batch-1 and batched decode, paged-attention bandwidth; prints a
 * table (or one JSON object).
 */
typedef struct {
    const char *model_path;   /* a GGUF file, or NULL with synthetic */
    const char *synthetic;    /* shape name, or NULL */
    ggml_type   type;         /* synthetic weight type (default BF16) */
    int         device;
    int32_t     prefill;      /* prompt tokens (default 2048) */
    int32_t     n_decode;     /* timed decode steps (default 64) */
    const int32_t *batches;   /* decode streams, e.g. 8, 32, 128 */
    int32_t     n_batches;
    int32_t     attn_ctx;     /* paged-attention context (default 8192) */
    int32_t     gemv_max;     /* the backend's gemv_max (<= 0: default) */
    int         json;
} nalar_cuda_bench_opts;

int nalar_cuda_bench(const nalar_cuda_bench_opts *o, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
