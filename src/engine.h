/*
 * The serving engine: one model, one backend, one KV pool, and an engine
 * thread that runs continuous batching.
 *
 * Request lifecycle (nalar_req_state):
 *   QUEUED -> PREFILL -> DECODE -> FINISHED
 *                ^          |
 *                +- PREEMPTED (KV ran out: blocks freed, recomputed later)
 * A request is refcounted: the submitter holds one reference, the engine
 * holds one while the request is queued or running.  Output accumulates in
 * the request under its mutex; the engine calls `notify` (from the engine
 * thread) whenever new output or the finish is there, and the consumer
 * drains it with nalar_request_take() on its own thread.
 *
 * Each step: every running sequence contributes its next token (decode), and
 * waiting prompts contribute prefill chunks while the step's token budget
 * (max_batch_tokens) lasts; admission is FCFS.
 *
 * Intake: a submitted request is checked on the engine thread, not by the
 * submitter.  A prompt given as text (prompt_text) is tokenized there,
 * bounded by the context: tokenizing stops once the prompt cannot fit
 * (nalar_tokenize_bounded), so what a request costs the engine does not
 * grow with its body, and a step spends at most about one context's worth
 * of tokenizing while other requests run.  Short texts are taken in before
 * long ones submitted earlier (a long one waits for 16 at most).  A prompt that does not fit the
 * context with its max_tokens, or the KV pool, finishes the request with
 * NALAR_FINISH_ERROR and an HTTP status and OpenAI error code in the
 * output (error.status 400, error.code "context_length_exceeded"); a prompt
 * that passes is `accepted` (one notify says so) and queued.
 */
#ifndef NALAR_ENGINE_H
#define NALAR_ENGINE_H

#include <stdint.h>

#include "grammar.h"
#include "nalar_err.h"
#include "sampler.h"
#include "spec.h"
#include "tokenizer.h"

typedef struct nalar_engine  nalar_engine;
typedef struct nalar_request nalar_request;
typedef struct nalar_model   nalar_model;
typedef struct nalar_prompt  nalar_prompt;
typedef struct nalar_params  nalar_params;

/* One adapter an engine serves: its name, file and scale (> 0; 0: 1). */
typedef struct nalar_engine_lora {
    const char *name;
    const char *path;
    double      scale;
} nalar_engine_lora;

typedef struct {
    const char *model_path;
    const char *model_name;      /* public name; NULL = from the file */
    const char *backend;         /* "cpu" (default) or "cuda" */
    int         n_threads;       /* backend worker threads; <=0: cores */
    int64_t     kv_bytes;        /* KV pool size; <=0: enough for 16 full
                                    contexts, capped at 1 GiB (CPU); on a
                                    GPU, > 0 caps the gpu_memory budget */
    /* GPU backends */
    int         device;          /* GPU index; < 0: worker mod count */
    int         worker;          /* nginx worker index (for device < 0) */
    double      gpu_memory;      /* KV pool in device memory (target and
                                    draft together): (0, 1] a fraction of
                                    the free memory once the weights are
                                    in place, > 1 bytes; <= 0: 0.9 */
    int         kv_type;         /* the KV cache's element type: GGML_F32
                                    (0) or GGML_BF16 (GPU backends) */
    int         act_i16;         /* the CPU backend's activations for
                                    its products over quantized weights:
                                    NALAR_ACT_F32 (0, exact), _I16 (1:
                                    int16 per 32), _Q8 (2: int8 codes)
                                    or _PAIRS (3: int8 codes with a
                                    multiplier per pair, cpu_quant.h).
                                    Part of the prefix cache's
                                    identity. */
    int32_t     gpu_gemv_max;    /* passes of up to this many tokens use
                                    the FP32-activation GEMV kernels, whose
                                    results do not depend on the pass's
                                    size; larger ones cuBLAS, which rounds
                                    activations to the weights' type;
                                    <= 0: 8 */
    int32_t     max_batch_tokens;/* per-step token budget; <=0: 512.  With
                                    itl_target, the most a step carries */
    double      itl_target;      /* seconds; > 0: each step carries only
                                    the prompt tokens that the measured
                                    cost of steps says fit this beside its
                                    decodes (at least 16 while a prompt
                                    waits; max_batch_tokens in a step
                                    with no decode); <= 0: the budget is
                                    fixed */
    int32_t     max_queue;       /* waiting requests; <=0: 1024 */
    int32_t     max_running;     /* running sequences; <=0: 64 */
    int         load_async;      /* 1: load on the engine thread */
    int         prefix_cache;    /* 1: reuse published KV blocks */
    /* speculative decoding */
    const char *draft_path;      /* draft model sharing the vocabulary */
    int         spec_mode;       /* nalar_spec_mode; DEFAULT here = OFF */
    int         spec_max_k;      /* most proposals per step; <=0: 4 */
    int         spec_fixed_k;    /* >0: always propose this many (bench);
                                    0: choose k by the cost model */
    /* LoRA adapters of the model (lora.h), loaded with it and checked
     * against it; a request names one by its index + 1 (adapter) */
    const struct nalar_engine_lora *loras;
    int32_t     n_loras;
} nalar_engine_opts;

typedef enum {
    NALAR_FINISH_NONE = 0,
    NALAR_FINISH_STOP,       /* EOS / stop token / stop sequence */
    NALAR_FINISH_LENGTH,     /* max_tokens or context full */
    NALAR_FINISH_CANCELLED,
    NALAR_FINISH_ERROR
} nalar_finish;

typedef struct {
    const int32_t *prompt;       /* copied at create */
    int32_t        n_prompt;
    /* or the prompt as text (when prompt_text is not NULL): pieces copied
     * at create, tokenized at intake with BOS where the model adds one */
    const nalar_tok_text *prompt_text;
    int32_t        n_prompt_text;
    /* or a shared copy of the text (nalar_prompt_create): the request
     * holds a reference to it instead of copying */
    nalar_prompt  *prompt_shared;
    const char    *prompt_param; /* the request field prompt errors name
                                    (copied); NULL: "prompt" */
    nalar_sampling sampling;
    int32_t        max_tokens;   /* <=0: until the context (or a smaller
                                    KV cache) is full; prompt + max_tokens
                                    beyond the KV cache is refused at
                                    intake */
    int            max_tokens_fit; /* 1: a prompt that leaves the context
                                      less room than max_tokens is refused
                                      (OpenAI's rule); 0: generation stops
                                      at the context's end */
    const char   **stop;         /* stop strings, copied */
    int32_t        n_stop;
    const int32_t *stop_ids;     /* extra stop tokens, copied */
    int32_t        n_stop_ids;
    int            ignore_eos;
    int            logprobs;     /* 1: report each token's logprob and
                                    sampling.n_logprobs alternatives */
    /* prefix cache: the scope comes from authentication (tenant), never
     * from the request body; NULL or "" = the single global scope */
    const char    *cache_scope;
    int32_t        n_shared_prefix; /* leading tokens that are an operator-
                                       declared shared prefix (global scope)*/
    const int32_t *shared_prefix;   /* or that prefix's ids (copied): at
                                       intake n_shared_prefix becomes the
                                       whole blocks the prompt begins with */
    int32_t        n_shared_ids;
    int            no_cache;     /* 1: neither look up nor publish */
    int            tokenize_only; /* 1: intake makes and checks the
                                     prompt's ids, hands them over as the
                                     output's ids and finishes the request
                                     (STOP): nothing is computed */
    /* speculative decoding */
    int            spec_mode;    /* nalar_spec_mode; DEFAULT: engine's */
    int            spec_max_k;   /* <=0: engine's */
    int            spec_fixed;   /* 1: always propose spec_max_k (no cost
                                    model, no step gate): for operators who
                                    know speculation pays, and tests */
    const int32_t *prediction;   /* predicted output tokens (copied) */
    int32_t        n_prediction;
    /* or the prediction as text (when prediction_text is not NULL; copied):
     * tokenized at intake without BOS, up to the context's length; where
     * the tokenizer puts a dummy-prefix space before text (SentencePiece),
     * a leading space of the text is that space */
    const nalar_tok_text *prediction_text;
    int32_t        n_prediction_text;
    /* structured output (grammar.h): the output is one JSON value (an
     * object for JSON_OBJECT, one matching json_schema for JSON_SCHEMA);
     * once it is complete and nothing more may follow, the request finishes
     * with NALAR_FINISH_STOP; max_tokens still ends it first (LENGTH, the
     * JSON then incomplete) */
    int            grammar;      /* nalar_grammar_kind */
    const char    *json_schema;  /* JSON Schema text, NUL-terminated,
                                    copied; with NALAR_GRAMMAR_JSON_SCHEMA */
    /* or (when not NULL) the large parameters above as a shared copy
     * (nalar_params_create): stop, stop_ids, prediction, prediction_text,
     * shared_prefix and json_schema, and their counts, are then taken
     * from it, not from these fields; the request holds a reference
     * instead of copying them */
    nalar_params  *params_shared;
    /* LoRA: 0 the base model alone; i > 0 the engine's adapter
     * opts.loras[i - 1] (its digest then keys the prefix cache); any
     * other value is refused at intake (a failure of the caller, not of
     * the prompt) */
    int32_t        adapter;
} nalar_request_params;

typedef void (*nalar_notify_fn)(nalar_request *req, void *ctx);

/*
 * A request's usage so far, one struct from the engine to the response:
 * nalar_request_take() hands it over in nalar_output, and the server
 * keeps it per choice as it is.
 */
typedef struct {
    /* n_prompt also when refused: the tokens counted (the context + 1
     * where counting stopped) */
    int32_t        n_prompt;
    int32_t        n_cached;
    int32_t        n_completion;
    double         queue_ms;    /* submit -> first scheduled */
    double         ttft_ms;     /* submit -> first token; <0 if none yet */
    /* speculative decoding */
    int32_t        spec_proposed;   /* proposals verified */
    int32_t        spec_accepted;   /* proposals confirmed */
    int32_t        pred_accepted;   /* of them, from the prediction */
    int32_t        pred_rejected;
    /* structured output; grammar_compile_ms < 0 without a grammar, 0 on
     * a grammar cache hit */
    double         grammar_compile_ms;
    double         grammar_mask_ms;         /* masking logits rows */
    int32_t        grammar_forced;          /* forced tokens proposed */
    int32_t        grammar_forced_accepted; /* of them, confirmed */
} nalar_usage;

/*
 * Why a request finished with NALAR_FINISH_ERROR is a nalar_failure
 * (nalar_err.h), what the client is told: where the request itself was
 * refused (its prompt) 400, invalid_request_error, OpenAI's code and the
 * request field; a failure of the engine 500, server_error, no code.
 */

/* What nalar_request_take() hands over: everything since the last take. */
typedef struct {
    char          *text;        /* complete UTF-8, NUL-terminated; malloc'd */
    size_t         text_len;
    int32_t       *ids;         /* (n_ids) confirmed tokens; malloc'd */
    int32_t        n_ids;
    nalar_logprob *logprobs;    /* (n_ids, 1 + n_logprobs) or NULL */
    nalar_finish   finish;      /* set once, with the last output */
    nalar_failure  error;       /* when finish == NALAR_FINISH_ERROR */
    int            accepted;    /* the prompt passed intake (set from the
                                   take after that on); usage.n_prompt is
                                   its length */
    nalar_usage    usage;       /* so far */
} nalar_output;

typedef struct {
    int32_t  requests_running;
    int32_t  requests_waiting;
    uint64_t prompt_tokens_total;
    uint64_t generation_tokens_total;
    int32_t  kv_blocks_total;
    int32_t  kv_blocks_free;
    uint64_t preemptions_total;
    /* prefix cache */
    uint64_t prefix_queries_total;   /* prompt tokens looked up */
    uint64_t prefix_hits_total;      /* prompt tokens served from cache */
    uint64_t prefix_evictions_total;
    int32_t  prefix_blocks;          /* published blocks held */
    uint64_t steps_total;
    uint64_t argmax_steps_total;     /* of them, greedy steps whose logits
                                        the backend reduced to token ids */
    /* histograms: cumulative counts per bucket (le), sum, count */
#define NALAR_HIST_BUCKETS 14
    uint64_t ttft_buckets[NALAR_HIST_BUCKETS];
    double   ttft_sum;
    uint64_t ttft_count;
    uint64_t itl_buckets[NALAR_HIST_BUCKETS];
    double   itl_sum;
    uint64_t itl_count;
    uint64_t queue_buckets[NALAR_HIST_BUCKETS];
    double   queue_sum;
    uint64_t queue_count;
    /* engine steps (those that ran a pass): their duration, how many that
     * carried decodes took longer than itl_target, and the prompt tokens
     * the last one could carry beside its decodes (gauge) */
    uint64_t step_buckets[NALAR_HIST_BUCKETS];
    double   step_sum;
    uint64_t step_count;
    uint64_t steps_over_target_total;
    int32_t  step_prefill_budget;
    /* speculative decoding */
    uint64_t spec_drafts_total;          /* verification steps */
    uint64_t spec_draft_tokens_total;    /* proposals verified */
    uint64_t spec_accepted_tokens_total;
    uint64_t spec_accepted_per_pos[NALAR_SPEC_MAX_K];
    double   spec_draft_seconds_total;
    double   spec_verify_seconds_total;
    int32_t  spec_provisional_blocks;    /* gauge */
    /* structured output */
    uint64_t grammar_requests_total;     /* requests with a grammar */
    uint64_t grammar_compiles_total;     /* of them, compiled (cache miss) */
    double   grammar_compile_seconds_total;
    uint64_t grammar_masks_total;        /* rows masked */
    double   grammar_mask_seconds_total; /* masking them, mask builds in */
    uint64_t grammar_forced_tokens_total;    /* forced tokens proposed */
    uint64_t grammar_forced_accepted_total;  /* of them, confirmed */
} nalar_metrics;

/* Upper bounds (seconds) of the histogram buckets; the last is +Inf. */
extern const double nalar_hist_bounds[NALAR_HIST_BUCKETS];

nalar_engine *nalar_engine_create(const nalar_engine_opts *o, nalar_err *err);
/* Starts the engine thread (which loads the model when load_async). */
int  nalar_engine_start(nalar_engine *e, nalar_err *err);
/* Cancels everything, joins the thread, frees.  Safe on a never-started
 * engine. */
void nalar_engine_destroy(nalar_engine *e);

/*
 * A draft proposes token ids the target verifies, so both must mean the
 * same by every id: same number of tokens, same pieces and end-of-
 * generation marks, same tokenizer kind and BOS/EOS.  Reads only the two
 * files' tokenizers (no weights): the engine checks a draft with it at
 * load, and nginx at `nginx -t`.  0, or -1 with err naming the first
 * difference.
 */
int  nalar_same_vocab(const char *target, const char *draft, nalar_err *err);

/* 0 loading, 1 ready, -1 failed (message in err) */
int  nalar_engine_state(nalar_engine *e, nalar_err *err);
/* valid once ready */
nalar_model *nalar_engine_model(nalar_engine *e);
void nalar_engine_metrics(nalar_engine *e, nalar_metrics *m);

/* Counters of one adapter (1 .. n_loras) or of the base alone (0). */
typedef struct {
    uint64_t requests_total;          /* requests accepted at intake */
    uint64_t prompt_tokens_total;
    uint64_t generation_tokens_total;
} nalar_lora_metrics;

/* 0, or -1 when i is not an adapter of the engine (any thread). */
int nalar_engine_lora_metrics(nalar_engine *e, int32_t i,
                              nalar_lora_metrics *out);

/*
 * A prompt's text, copied once for the requests that share it (the n
 * choices of one API request).  Immutable; each request made with it as
 * prompt_shared holds a reference until it has tokenized the text or is
 * freed, and the creator lets go of its own with nalar_prompt_unref: the
 * last one frees it.
 */
nalar_prompt *nalar_prompt_create(const nalar_tok_text *pieces, int32_t n,
                                  nalar_err *err);
void nalar_prompt_unref(nalar_prompt *pr);

/*
 * A prompt made on the engine thread, at intake: a chat template's render,
 * which a higher layer hands the engine as a callback (the engine knows
 * nothing of templates).  The first of the prompt's requests that intake
 * takes calls render(ctx, ...) once, on the engine thread; it fills
 * *pieces ((*n) of them, pointing into *text; both malloc'd, then owned by
 * the prompt) and *add_bos (1: the model's BOS goes first, as for any
 * text; 0: the render wrote what the model needs) and returns 0, or an
 * HTTP status with a message in msg: 400 refuses the request as the
 * client's mistake (its param is the request's prompt_param), anything
 * else is the server's.  The other requests sharing the prompt take the
 * same pieces, or the same refusal.  release(ctx) runs once, on whatever
 * thread frees the prompt (the last reference).  bytes: about what the
 * render reads (intake takes short prompts first).  The requests that
 * share a deferred prompt are submitted to one engine: its thread alone
 * renders and reads the pieces, so no lock guards them.
 */
typedef struct {
    int          (*render)(void *ctx, nalar_tok_text **pieces, int32_t *n,
                           char **text, int *add_bos, char *msg,
                           size_t cap);
    void         (*release)(void *ctx);
    void          *ctx;
    size_t         bytes;
} nalar_prompt_source;

/* A prompt whose pieces src renders at intake; the creator holds one
 * reference.  NULL with err (out of memory): src->release is not called. */
nalar_prompt *nalar_prompt_deferred(const nalar_prompt_source *src,
                                    nalar_err *err);

/*
 * A request's large parameters (stop strings and ids, the prediction, the
 * shared prefix's ids, the JSON Schema text: the fields that params_shared
 * stands for), copied once for the requests that share them (the n
 * choices of one API request).  Immutable; each request made with it as
 * params_shared holds a reference until it is freed, and the creator lets
 * go of its own with nalar_params_unref: the last one frees it.  A request
 * made without params_shared makes its own.  NULL with err when out of
 * memory.
 */
nalar_params *nalar_params_create(const nalar_request_params *p,
                                  nalar_err *err);
void nalar_params_unref(nalar_params *pc);

nalar_request *nalar_request_create(const nalar_request_params *p,
                                    nalar_notify_fn notify, void *notify_ctx,
                                    nalar_err *err);
void nalar_request_ref(nalar_request *r);
void nalar_request_unref(nalar_request *r);
/*
 * 0, or a refusal with err: NALAR_SUBMIT_BUSY when the engine is not
 * ready or its queue is full (a later try may be taken: the server is
 * busy), NALAR_SUBMIT_INVALID when the request can never be taken as it
 * is (an adapter the engine does not have, a request submitted twice:
 * the caller's mistake, an internal error to its client).  The prompt is
 * checked at intake (see the top of this file).
 */
#define NALAR_SUBMIT_BUSY     (-1)
#define NALAR_SUBMIT_INVALID  (-2)
int  nalar_engine_submit(nalar_engine *e, nalar_request *r, nalar_err *err);
/*
 * What bounds a request on an engine, as one struct (src/limits.c):
 * nalar_engine_limits() fills it once the engine is ready, and
 * nalar_limits_check() is intake's context check on it, for callers that
 * refuse before submitting (the protocol layer, from a snapshot of the
 * limits, where a token-id array is too long to copy): 0 when a prompt
 * of n_prompt tokens leaves room in the context for max_tokens (<= 0:
 * one) and fits the KV pool, else -1 with OpenAI's
 * context_length_exceeded message in msg.  more: n_prompt is where
 * counting stopped, the prompt has more.  nalar_engine_check_prompt() is
 * the same on the engine's own limits.
 */
typedef struct {
    int32_t  n_ctx;         /* tokens of context */
    int32_t  n_vocab;       /* token ids are 0 .. n_vocab - 1 */
    int32_t  kv_blocks;     /* of NALAR_KV_BLOCK tokens, in the whole KV
                               pool; 0: not known yet */
} nalar_limits;

void nalar_engine_limits(nalar_engine *e, nalar_limits *lim);
int  nalar_limits_check(const nalar_limits *lim, int32_t n_prompt, int more,
                        int32_t max_tokens, char *msg, size_t cap);
int  nalar_engine_check_prompt(nalar_engine *e, int32_t n_prompt, int more,
                               int32_t max_tokens, char *msg, size_t cap);
/* Asynchronous: the engine drops the sequence (and its KV) at the next
 * step boundary and finishes it with NALAR_FINISH_CANCELLED. */
void nalar_request_cancel(nalar_request *r);
/* Moves accumulated output into `out` (free with nalar_output_free).
 * Returns 1 if anything (text, ids or finish) was handed over. */
int  nalar_request_take(nalar_request *r, nalar_output *out);
void nalar_output_free(nalar_output *out);

/*
 * Synchronous helper for the CLI and tests: run the given requests to
 * completion on an engine that is NOT started (the caller's thread runs the
 * steps).  Outputs (one per request) receive all text and ids.
 */
int nalar_engine_run_sync(nalar_engine *e, nalar_request **reqs, int n,
                          nalar_err *err);

#endif
