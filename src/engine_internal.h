/*
 * The engine's internals, shared by its files (engine.h is the public API):
 *
 *   engine.c          the engine object: create, load (model, backend, KV
 *                     pools), the engine thread's loop, run_sync, destroy
 *   engine_request.c  a request: its owned parameters, its output buffer
 *                     (handed to the consumer by nalar_request_take) and
 *                     how it finishes
 *   engine_queue.c    the queues: submission, intake (tokenizing and
 *                     checking), FCFS admission, preemption back to the
 *                     waiting queue
 *   engine_cache.c    KV reservation and the prefix-cache glue (block
 *                     digests, matching at admission, publishing)
 *   engine_spec.c     speculative decoding's planning: proposer choice,
 *                     the cost tables, k, the proposals, what a step
 *                     teaches the step gate
 *   engine_step.c     one scheduling step and its phases: batch, forward
 *                     pass, sample or verify, confirm tokens
 *   engine_budget.c   the step's prompt-token budget: fixed, or sized to
 *                     the ITL target by the measured cost of steps
 *
 * Threads: the engine thread (or the caller of nalar_engine_run_sync) owns
 * the model, backend, KV pools, the running set and every request's engine
 * state.  Other threads touch only: the queues and metrics (under e->mu), a
 * request's output buffer (under r->mu), the cancel flag and counters
 * (atomics).  Lock order: e->mu and r->mu are never held together, and
 * neither is held across a forward pass.  The engine thread holds e->mu
 * only to move requests between queues (intake_next walks the intake
 * queue, max_queue at most) and to update counters and gauges, never
 * while it tokenizes, compiles a grammar or runs a pass; it holds r->mu
 * only to append one token's output or set a request's finish.  So the
 * event loop, which takes e->mu in nalar_engine_submit, _cancel and
 * _metrics and r->mu in nalar_request_take, waits on neither for long.
 *
 * Allocation failures: one that a request meets (its output, its prefix
 * digests, its stop matcher, its start) finishes that request with
 * NALAR_FINISH_ERROR and gives its KV back; one that a step meets (the
 * batch, the logit rows, the backend) finishes every running request so
 * (engine_step); none is dropped silently.
 *
 * The functions declared here are the engine's own, not the library's API:
 * they are hidden from the shared objects the library is linked into.
 */
#ifndef NALAR_ENGINE_INTERNAL_H
#define NALAR_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "budget.h"
#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "model.h"
#include "prefix_cache.h"
#include "stop.h"
#include "tokenizer.h"

#pragma GCC visibility push(hidden)

typedef enum {
    REQ_NEW = 0,
    REQ_WAITING,     /* in e->waiting (also after preemption) */
    REQ_RUNNING,     /* in e->running; feeding tokens[n_computed..] */
    REQ_FINISHED
} req_state;


/* engine.h's nalar_params: immutable once created, any thread reads it */
struct nalar_params {
    int              refs;            /* atomic */
    const char     **stops;           /* (n_stop) into stop_text */
    char            *stop_text;
    int32_t          n_stop;
    int32_t         *stop_ids;        /* (n_stop_ids) or NULL */
    int32_t          n_stop_ids;
    nalar_tok_text  *pred_pieces;     /* (n_pred_pieces) into pred_text, */
    int32_t          n_pred_pieces;   /* or NULL */
    char            *pred_text;
    int32_t         *pred;            /* (n_pred) prediction ids or NULL */
    int32_t          n_pred;
    int32_t         *shared_ids;      /* (n_shared_ids) or NULL */
    int32_t          n_shared_ids;
    char            *schema;          /* JSON Schema text or NULL */
};


struct nalar_request {
    int              refs;            /* atomic */
    int              cancelled;       /* atomic */
    nalar_engine    *engine;          /* set at submit */
    nalar_notify_fn  notify;
    void            *notify_ctx;
    nalar_request   *next;            /* waiting-queue link (under e->mu) */
    size_t           intake_bytes;    /* text for intake to tokenize
                                         (prompt and prediction), set at
                                         submit */
    int              overtaken;       /* times intake took a later request
                                         first (under e->mu) */

    /* parameters: the small ones copied into p; the large ones borrowed
     * from `params`, shared with the request's other choices (p's
     * pointers to them point there) */
    nalar_request_params p;
    nalar_params    *params;          /* a reference */
    int32_t         *prompt;          /* (n_prompt); NULL until intake
                                         tokenizes `pieces` */
    /* text for intake to tokenize, NULL once tokenized or when ids came */
    nalar_tok_text  *pieces;          /* (n_pieces) into `text` */
    int32_t          n_pieces;
    char            *text;
    nalar_prompt    *shared_text;     /* holds `pieces` and `text` when the
                                         prompt came as a shared copy */
    const nalar_tok_text *pred_pieces; /* params' prediction text until
                                          intake tokenized it, then NULL */
    int32_t          n_pred_pieces;
    const int32_t   *shared;          /* (p.n_shared_ids) or NULL: params' */
    char             param[16];       /* the field prompt errors name */
    const char     **stops;           /* (p.n_stop): params' */
    char            *scope;           /* cache scope ("" = global) */
    const int32_t   *stop_ids;        /* (p.n_stop_ids): params' */
    const char      *schema;          /* params' schema text or NULL */
    nalar_gmatcher  *gm;              /* structured output, from intake */
    int32_t          n_forced;        /* of this step's proposals, the
                                         ones the grammar forced */

    /* engine state (engine thread only) */
    req_state        state;
    nalar_seq_kv     kv;
    int32_t         *tokens;          /* (cap_tokens) prompt + generated */
    int32_t          n_tokens;
    int32_t          cap_tokens;
    int32_t          n_computed;      /* positions with KV: [0, n_computed) */
    int32_t          n_generated;
    int32_t          max_tokens;
    nalar_sampler    sampler;
    int              sampler_ready;
    nalar_detok      detok;
    nalar_stop      *stop;
    double           t_submit, t_sched, t_first, t_last;
    /* prefix cache: digests[i] identifies block i with everything before
     * it; blocks [0, n_published) are published or were checked */
    uint8_t        (*digests)[NALAR_DIGEST];   /* (cap_tokens / BLOCK) */
    int32_t          n_digests;
    int32_t          n_published;
    int              admitted_once;

    /* speculative decoding (engine thread).  Positions >= n_computed of
     * r->kv written during a verification are provisional: truncated away
     * before the step ends, never published. */
    nalar_proposer   prop;            /* NONE: no speculation */
    /* auto with a draft: n-gram lookup may stand in (prefer_ngram) */
    int              ngram_fallback;
    nalar_proposer   prop_now;        /* this step's proposer */
    int32_t          spec_k_max;
    int32_t          n_prop;          /* proposals this step */
    int32_t          props[NALAR_SPEC_MAX_K];
    nalar_seq_kv     dkv;             /* draft KV */
    int32_t          d_computed;      /* draft positions with KV */
    nalar_accept_stats acc;           /* of prop */
    nalar_accept_stats acc_ngram;     /* of the n-gram fallback */
    const int32_t   *pred;            /* (n_pred) predicted output: params'
                                         ids, or pred_ids */
    int32_t         *pred_ids;        /* owned: the prediction's text
                                         tokenized at intake */
    int32_t          n_pred;
    int32_t          pred_off;        /* prediction index - output index */
    uint32_t         since_spec;      /* steps without speculation */
    uint32_t         probes;          /* speculation probes so far */
    uint32_t         spec_steps;      /* steps it chose to speculate */
    int32_t          spec_proposed, spec_accepted;   /* under mu */
    int32_t          pred_accepted, pred_rejected;   /* under mu */
    double           g_compile_ms, g_mask_ms;         /* under mu */
    int32_t          g_forced, g_forced_accepted;     /* under mu */

    /* output handed to the consumer (under mu) */
    pthread_mutex_t  mu;
    char            *out_text;
    size_t           out_len, out_cap;
    int32_t         *out_ids;
    int32_t          out_n, out_idcap;
    nalar_logprob   *out_lp;          /* (out_idcap, 1 + n_logprobs) */
    nalar_finish     finish;
    int              finish_taken;
    nalar_failure    error;           /* what the client is told: set once,
                                         by intake (a refusal) or
                                         request_finish */
    int              accepted;        /* passed intake */
    int              accept_taken;
    int32_t          n_cached;
    double           queue_ms, ttft_ms;
};


struct nalar_engine {
    nalar_engine_opts opts;
    char             *model_path;
    char             *model_name;
    char             *backend_name;

    nalar_model      *model;
    nalar_backend    *be;
    nalar_kv_pool     kv;
    int               kv_ready;
    nalar_prefix_cache *cache;        /* NULL when off */
    nalar_grammar_cache *grammars;    /* compiled response formats */

    /* speculative decoding: the draft model runs on the target backend's
     * workers with its own KV pool (same block count) */
    nalar_model      *draft;
    nalar_backend    *draft_be;
    nalar_kv_pool     dkv;
    int               dkv_ready;
    nalar_batch       dbatch;
    nalar_request   **dbatch_req;     /* (dbatch_cap) */
    int32_t           dbatch_cap;
    float            *dlogits;        /* (max_running, n_vocab) */
    nalar_cost_table  target_cost;    /* seconds per target pass by size */
    unsigned          fallback_steps; /* steps that chose between a draft
                                         and n-gram lookup */
    nalar_spec_gate   gate;           /* whole-step rates: may a step
                                         speculate at all (spec.h) */
    nalar_cost_table  draft_cost;     /* seconds per draft pass by size */
    nalar_probe_pace  probe_pace;     /* what probes may cost (spec.h) */
    nalar_accept_stats prop_acc[NALAR_PROP_COUNT];  /* acceptance by
                                       position of each proposer over all
                                       requests, which each request's own
                                       estimates are pulled toward
                                       (choose_k) */
    int32_t           kv_evictable;   /* under mu: cached, unreferenced */
    nalar_budget      budget;         /* what a step costs by its batch
                                         tokens, for opts.itl_target */

    pthread_t         thread;
    int               started;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    int               stop;           /* under mu */
    int               state;          /* atomic: 0 loading, 1 ready, -1 */
    nalar_err         load_err;

    /* waiting queue, FIFO (under mu); n_waiting counts the intake queue
     * (submitted, not checked yet) too */
    nalar_request    *wait_head, *wait_tail;
    nalar_request    *in_head, *in_tail;
    int32_t           n_waiting;

    /* running set (engine thread) */
    nalar_request   **running;        /* (max_running) in admission order */
    int32_t           n_running;

    /* batch scratch (engine thread) */
    nalar_batch       batch;
    nalar_request   **batch_req;      /* (max_batch) request of each token */
    int32_t           batch_cap;
    float            *logits;         /* (max_logits, n_vocab) */
    int32_t           logits_cap;
    /* a greedy step's token ids, when the backend reduces its logits
     * (forward_argmax) */
    int32_t          *ids;            /* (ids_cap) */
    int32_t           ids_cap;

    /* metrics (under mu) */
    nalar_metrics     m;

    /* LoRA adapters (engine_lora.c): id i + 1 is lora_opts[i], loras[i] */
    nalar_engine_lora *lora_opts;     /* (n_loras) owned copies */
    struct nalar_lora **loras;        /* (n_loras) loaded and attached */
    int32_t           n_loras;        /* set at create, never changed */
    nalar_lora_metrics *lora_m;       /* (n_loras + 1) under mu; [0]: the
                                         base alone */
    int32_t          *batch_adapter;  /* (batch_adapter_cap) the step's */
    int32_t           batch_adapter_cap;

#ifdef NALAR_TEST_HOOKS
    /* tests only (engine_test.h) */
    int               keep_kv;        /* never give back blocks before a
                                         sliding window */
    int               fault[NALAR_FAULT_COUNT];
    void            (*idle_fn)(void *arg);
    void             *idle_arg;
    int               test_cost_set;  /* steps cost test_cost_a + _b n */
    double            test_cost_a, test_cost_b;
    void            (*step_fn)(void *arg, const nalar_test_step *st);
    void             *step_arg;
#endif
};


/* What one step planned and measured, handed from phase to phase */
typedef struct {
    int32_t  n_decode;      /* sequences with one token to decode */
    int32_t  n_prefill;     /* prompt tokens the step may carry */
    unsigned mix;           /* the gate's proposer mix (step_mix) */
    int      any_fixed;     /* a request at a fixed-k location */
    int      any_probe;     /* a request trying a k its model ruled out */
    double   catchup_s;     /* a cold draft's catch-up (draft_propose) */
    int32_t  n_tok;         /* batch tokens */
    int32_t  n_logits;      /* of them, with logits wanted */
    int32_t  n_spec;        /* requests verifying proposals */
    int32_t  provisional;   /* blocks held for proposals only */
    int32_t  n_unprop;      /* a probe's step: its tokens but proposals */
    int      use_ids;       /* the backend reduced each row to its argmax */
    int32_t  n_confirmed;   /* tokens the step confirmed */
    int32_t  n_fixed;       /* decode and proposal tokens batched */
    int32_t  prefill_allow; /* prompt tokens it could carry beside them */
    int32_t  prefill_pending; /* prompt tokens running requests wanted */
    int32_t  n_prefill_tok; /* prompt tokens batched */
    double   t_start;       /* when the step began */
    double   t_plan;        /* when admission was done */
    double   t_pass;        /* when its forward pass ended */
} step_plan;


static inline void
hist_add(uint64_t *buckets, double *sum, uint64_t *count, double v)
{
    for (int i = 0; i < NALAR_HIST_BUCKETS; i++) {
        if (v <= nalar_hist_bounds[i]) {
            buckets[i]++;
        }
    }
    *sum += v;
    (*count)++;
}


#ifdef NALAR_TEST_HOOKS

/* Is this the armed fault at `site` (engine_test.h)? */
static inline int
test_fault(nalar_engine *e, nalar_fault_site site)
{
    int n = __atomic_load_n(&e->fault[site], __ATOMIC_RELAXED);

    if (n <= 0) {
        return 0;
    }
    __atomic_store_n(&e->fault[site], n - 1, __ATOMIC_RELAXED);
    return n == 1;
}

/* The engine thread found nothing to run (engine_test.h). */
static inline void
test_idle(nalar_engine *e)
{
    if (e->idle_fn != NULL) {
        e->idle_fn(e->idle_arg);
    }
}

#define test_keep_kv(e)      ((e)->keep_kv)

#else

/* production builds: no hook is ever set, and its sites compile to
 * nothing */
#define test_fault(e, site)  0
#define test_idle(e)         ((void) 0)
#define test_keep_kv(e)      0

#endif


/* The acceptance estimates of r's proposer this step. */
static inline nalar_accept_stats *
acc_now(nalar_request *r)
{
    return r->prop_now == r->prop ? &r->acc : &r->acc_ngram;
}


/* engine_request.c */
nalar_tok_text *nalar_pieces_copy(const nalar_tok_text *src, int32_t n,
                                  char **text);

/* engine_params.c */
void nalar_params_ref(nalar_params *pc);
int  push_output(nalar_request *r, const char *text, size_t len, int32_t id,
                 const nalar_logprob *lp);
void request_finish(nalar_engine *e, nalar_request *r, nalar_finish why,
                    const char *error);
void finish_unref(nalar_engine *e, nalar_request *r, nalar_finish why,
                  const char *error);
void request_text_free(nalar_request *r);
/* a deferred prompt's bytes (any thread); its pieces for intake (engine
 * thread): engine_request.c */
size_t prompt_pending_bytes(const nalar_prompt *pr);
int  request_prompt_pieces(nalar_request *r, int *add_bos, int *status,
                           char *msg, size_t cap);

/* engine_queue.c (engine thread) */
void step_intake(nalar_engine *e);
void step_admit(nalar_engine *e);
void preempt_last(nalar_engine *e);
void fail_all_waiting(nalar_engine *e, nalar_finish why, const char *msg);

/* engine_cache.c (engine thread) */
int     cache_match(nalar_engine *e, nalar_request *r);
int     cache_publish(nalar_engine *e, nalar_request *r, int32_t n_confirmed);
int32_t kv_available(nalar_engine *e);
int     kv_reserve(nalar_engine *e, nalar_request *r, int32_t n_pos);
void    kv_slide(nalar_engine *e, nalar_request *r);

/* engine_spec.c (engine thread) */
void cost_seed(nalar_backend *be, nalar_kv_pool *kv, int32_t n_vocab,
               nalar_cost_table *cost);
int  spec_setup(nalar_engine *e, nalar_request *r);
void step_plan_speculation(nalar_engine *e, step_plan *sp);
void step_learn(nalar_engine *e, const step_plan *sp);

/* engine_budget.c (engine thread) */
void    budget_seed(nalar_engine *e);
int32_t step_prefill_allowance(nalar_engine *e, int32_t n_fixed);
int32_t step_proposal_room(nalar_engine *e, int32_t n_decode,
                           int32_t n_prefill);
void    step_budget_learn(nalar_engine *e, const step_plan *sp);

/* engine_lora.c */
int  engine_lora_copy(nalar_engine *e, const nalar_engine_opts *o,
                      nalar_err *err);
int  engine_lora_load(nalar_engine *e, nalar_err *err);
void engine_lora_destroy(nalar_engine *e);
int  engine_lora_check(nalar_engine *e, const nalar_request *r,
                       nalar_err *err);
const uint8_t *engine_lora_digest(const nalar_engine *e,
                                  const nalar_request *r);
int  engine_lora_batch(nalar_engine *e, nalar_batch *b,
                       nalar_request *const *req);

/* engine_step.c (engine thread) */
int  batch_reserve(nalar_batch *b, nalar_request ***req, int32_t *cap,
                   int32_t n);
int  engine_step(nalar_engine *e, nalar_err *err);

#pragma GCC visibility pop

#endif /* NALAR_ENGINE_INTERNAL_H */
