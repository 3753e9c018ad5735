/*
 * Backend interface: where a model's forward pass runs.
 *
 * A backend instance is bound to one model: it prepares the weights (the
 * CPU backend uses the mmapped file in place; a GPU backend uploads them),
 * allocates the KV pool's storage, and runs forward passes over batches.
 * The engine above it owns scheduling, sampling and KV bookkeeping; the
 * backend owns arithmetic and memory placement.
 */
#ifndef NALAR_BACKEND_H
#define NALAR_BACKEND_H

#include <stdlib.h>

#include "kv.h"
#include "model.h"
#include "nalar_err.h"

typedef struct nalar_backend nalar_backend;
struct nalar_lora;

/*
 * Memory that threads fill by rows (activations, logits, the KV pool)
 * starts on a cache line, so no 64-byte line straddles two threads' rows:
 * every row length and split here is a multiple of 16 floats, and malloc
 * returns 16-byte-aligned memory, which put one line of every row on both
 * sides of each split (measured: the line at the q | k boundary of the
 * q/k/v rows doubled the RoPE phase of a 9-token pass).  Contents are
 * undefined; free() releases it; NULL when out of memory.
 */
#define NALAR_LINE 64

static inline void *
nalar_alloc_lines(size_t bytes)
{
    size_t n = (bytes + NALAR_LINE - 1) & ~(size_t) (NALAR_LINE - 1);

    return aligned_alloc(NALAR_LINE, n > 0 ? n : NALAR_LINE);
}

typedef struct {
    const char *name;
    int         n_threads;   /* CPU worker threads; <=0: one per core */
    /* GPU: device index; < 0: `worker` mod the number of visible devices
     * (nginx worker i on GPU i mod count) */
    int         device;
    int         worker;
    /* GPU: matrix products of up to this many tokens through the GEMV
     * kernels with FP32 activations, larger ones through the vendor
     * library; <= 0: the backend's default */
    int32_t     gemv_max;
    /* the KV cache's element type: GGML_F32 (0, every backend) or
     * GGML_BF16 (GPU backends; the CPU backend refuses it) */
    ggml_type   kv_type;
    /* the CPU backend's activations for its products over quantized
     * weights: NALAR_ACT_F32 (0), NALAR_ACT_I16 (1: rounded to 16-bit
     * codes, two 8-bit products per block, nalar_quant_matmul_i16) or
     * NALAR_ACT_Q8 (2: rounded to int8 codes, integer dot products,
     * nalar_quant_matmul_q8) or NALAR_ACT_PAIRS (3: int8 codes with a
     * multiplier per pair of values, nalar_quant_matmul_xpairs).  GPU
     * backends refuse all but F32. */
    int         act_i16;
} nalar_backend_opts;

struct nalar_backend {
    const char  *name;
    nalar_model *model;
    /* attach storage for `pool` (already initialised with its counts) */
    int  (*kv_alloc)(nalar_backend *be, nalar_kv_pool *pool, nalar_err *err);
    void (*kv_free)(nalar_backend *be, nalar_kv_pool *pool);
    /* logits: (batch->n_logits, n_vocab) host floats; the CPU backend's
     * threads split each row, so give it memory from nalar_alloc_lines
     * (any alignment works, misaligned rows cost a shared line each) */
    int  (*forward)(nalar_backend *be, nalar_kv_pool *pool,
                    const nalar_batch *batch, float *logits, nalar_err *err);
    /* Optional (NULL: the engine takes logits): the same pass, but each
     * logit row reduced to its argmax token id, as nalar_argmax picks it
     * (ties to the lowest id, NaN never wins), in ids (batch->n_logits).
     * For steps whose every row is decoded greedily with nothing that
     * needs the distribution (no penalties, no logprobs): a GPU then sends
     * back n ints instead of n x n_vocab floats.  scratch: room for the
     * logits, (batch->n_logits, n_vocab) floats laid out as forward's,
     * that the backend may overwrite: the CPU backend computes them there
     * (the caller's own logits buffer, so a greedy step holds no second
     * copy); a GPU leaves it alone, and may be given NULL. */
    int  (*forward_argmax)(nalar_backend *be, nalar_kv_pool *pool,
                           const nalar_batch *batch, int32_t *ids,
                           float *scratch, nalar_err *err);
    /* Optional (NULL: the backend serves no adapters): make adapter `a`
     * (lora.h, an adapter of be->model, which outlives the backend) the
     * one batches name by `id` (1, 2, ... in order) in batch->adapter.
     * forward and forward_argmax then add each token's adapter product to
     * the matrices it adapts. */
    int  (*lora_attach)(nalar_backend *be, int32_t id,
                        const struct nalar_lora *a, nalar_err *err);
    void (*destroy)(nalar_backend *be);
    /* device backends: free device memory in bytes now (for sizing the KV
     * pool after the weights are in place); NULL on the CPU */
    int64_t (*free_memory)(nalar_backend *be);
    int   device;        /* GPU index; -1 on the CPU */
    /* KV element type kv_alloc gives the pools it attaches: GGML_F32 (0)
     * or, on a GPU, GGML_BF16; set before kv_alloc */
    ggml_type kv_type;
    void *impl;
};

/* "cpu" or "cuda" (when built with CUDA): src/backend.c, the one place
 * that knows which backends exist. */
nalar_backend *nalar_backend_create(nalar_model *m,
                                    const nalar_backend_opts *o,
                                    nalar_err *err);

/* the activations' modes of nalar_backend_opts.act_i16 (the CPU
 * backend's: kernels/cpu/cpu_backend.h) */
#define NALAR_ACT_F32 0
#define NALAR_ACT_I16 1
#define NALAR_ACT_Q8  2
#define NALAR_ACT_PAIRS 3

/* a mode's name as nalar_cpu_activations and --cpu-activations spell it
 * ("f32", "i16", "q8", "pairs") */
static inline const char *
nalar_act_name(int mode)
{
    return mode == NALAR_ACT_PAIRS ? "pairs" : mode == NALAR_ACT_Q8 ? "q8"
           : mode == NALAR_ACT_I16 ? "i16" : "f32";
}

/* The CPU backend's mode when none is named (nginx's
 * nalar_cpu_activations, the CLI's --cpu-activations): the fastest exact
 * one, exact meaning within the conformance kit's tolerances and at least
 * as close as llama.cpp on every file (t/c/test_conformance.c), fastest as
 * bench/README.md measures the modes.  The one place it is chosen; a GPU
 * backend, which has only F32, takes F32 when none is named. */
#define NALAR_ACT_DEFAULT NALAR_ACT_PAIRS

/* A second backend of the same kind (a draft model) that runs on the
 * first one's workers (CPU) or device and stream (CUDA): the two never
 * run at once. */
nalar_backend *nalar_backend_create_sharing(nalar_model *m,
                                            nalar_backend *other,
                                            nalar_err *err);

/* The GPU a backend runs on: `device` when >= 0, else worker mod count;
 * -1 with err when no device is visible or `device` is not one of them. */
int nalar_backend_pick_device(int device, int worker, int count,
                              const char *kind, nalar_err *err);

#endif
