/*
 * `nalar mkmodel`: write a GGUF with random weights and a synthetic (or
 * copied) vocabulary, for tests and benchmarks at any shape, in any
 * architecture the engine serves: llama, qwen2 (q/k/v biases, tied output),
 * qwen3 (q/k norms, tied), gemma2 (post-norms, soft-caps 50 and 30, sliding
 * window, tied) or phi3 (fused attn_qkv and gate|up ffn_up).
 *
 * The file has the tensor names and metadata llama.cpp uses for the
 * architecture, so other GGUF readers load it too.  Weights are uniform in
 * [-1/sqrt(cols), 1/sqrt(cols)) from a generator seeded with `seed`, drawn
 * in the same order for every type: an F16 file is the F32 file of the same
 * seed rounded to F16.  Norm vectors are 1.0 and always F32.
 */
#ifndef NALAR_MKMODEL_H
#define NALAR_MKMODEL_H

#include <stdint.h>

#include "gguf.h"
#include "nalar_err.h"

typedef struct {
    int         dim;          /* embedding width; n_heads * head_dim */
    int         n_layers;
    int         n_heads;
    int         n_kv_heads;   /* divides n_heads */
    int         ffn_dim;
    int         n_vocab;      /* ignored with vocab_from */
    int         n_ctx;
    ggml_type   type;         /* matrices: F32, F16, BF16, Q8_0, Q4_0,
                                 Q4_K, Q5_K or Q6_K (K-quants need dim
                                 and ffn to be multiples of 256) */
    int         kmix;         /* with type Q4_K or Q5_K: llama.cpp's
                                 Q4_K_M / Q5_K_M mix, whose output head,
                                 and attn_v and ffn_down in the layers
                                 that get more bits (the first and last
                                 eighth, and every third between), are
                                 Q6_K */
    uint64_t    seed;
    int         bpe;          /* 0 = SPM vocab, 1 = byte-level BPE vocab */
    int         chatml;       /* 1: the vocabulary's last two tokens are
                                 ChatML's control tokens <|im_start|> and
                                 <|im_end|> */
    const char *pre;          /* BPE: tokenizer.ggml.pre (NULL: "gpt2") */
    const char *control_tokens; /* optional comma-separated list: control
                                   tokens that end the vocabulary (after
                                   ChatML's), e.g. a chat style's markers */
    const char *vocab_from;   /* optional path: copy tokenizer.* metadata
                                 from this GGUF, or convert Hugging
                                 Face's tokenizer.json (a path ending in
                                 .json; see vocab_hf.h) (n_vocab then
                                 comes from it) */
    const char *chat_template; /* optional Jinja text, stored as
                                  tokenizer.chat_template (replacing one
                                  copied by vocab_from) */
    float       rope_base;
    const char *arch;         /* general.architecture; NULL: "llama" */
    int         window;       /* gemma2/phi3 attention.sliding_window; 0:
                                 gemma2 4096, phi3 none */
} nalar_mkmodel_opts;

/* dim 128, layers 2, heads 4, kv 2, ffn 384, vocab 2048, ctx 512, F32,
 * seed 1, SPM vocab without ChatML tokens, no chat template, rope base
 * 10000 */
void nalar_mkmodel_defaults(nalar_mkmodel_opts *o);

int nalar_mkmodel(const nalar_mkmodel_opts *o, const char *path,
                  nalar_err *err);

/*
 * A random LoRA adapter (lora.h) of the model at `base`, as llama.cpp
 * writes one: general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha, and blk.N.<matrix>.weight.lora_a/lora_b for each
 * target in every layer.  A is uniform / sqrt(cols) like a weight; B is
 * not zero (as a trained adapter's is not) and sized so that scale * B A
 * moves each adapted weight by about half its own spread: greedy output
 * changes visibly, activations stay in range.
 */
typedef struct {
    const char *base;        /* the base model's GGUF */
    int         rank;        /* 1 .. min(rows, cols) */
    float       alpha;       /* adapter.lora.alpha; <= 0: rank */
    uint64_t    seed;
    ggml_type   type;        /* A and B: F32, F16, BF16 or Q8_0 (Q8_0:
                                rank a multiple of 32) */
    const char *targets;     /* comma-separated q,k,v,o,gate,up,down (phi3:
                                any of q, k, v adapts attn_qkv, gate or up
                                its fused ffn_up); NULL: all */
} nalar_mklora_opts;

int nalar_mkmodel_lora(const nalar_mklora_opts *o, const char *path,
                       nalar_err *err);

/*
 * The merged model: `base` with each matrix the adapter adapts replaced by
 * W + scale_eff * B A, computed in double from W, A and B as floats and
 * written in F32 whatever W's type (so a comparison with the adapter
 * applied at run time measures the adapter path, not requantization);
 * every other tensor and all metadata copied as they are.  scale: the
 * operator's (lora.h: scale_eff = alpha / rank * scale).
 */
int nalar_mkmodel_merge(const char *base, const char *adapter, float scale,
                        const char *path, nalar_err *err);

#endif
