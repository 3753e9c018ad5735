/*
 * The serving engine: continuous batching over one model.  See engine.h for
 * the request lifecycle.
 *
 * Threads: the engine thread (or the caller of nalar_engine_run_sync) owns
 * the model, backend, KV pool, the running set and every request's engine
 * state.  Other threads touch only: the waiting queue (under e->mu), a
 * request's output buffer (under r->mu), the cancel flag and counters
 * (atomics).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "engine.h"
#include "engine_test.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "prefix_cache.h"
#include "stop.h"
#include "tokenizer.h"

const double nalar_hist_bounds[NALAR_HIST_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, INFINITY
};

typedef enum {
    REQ_NEW = 0,
    REQ_WAITING,     /* in e->waiting (also after preemption) */
    REQ_RUNNING,     /* in e->running; feeding tokens[n_computed..] */
    REQ_FINISHED
} req_state;

struct nalar_request {
    int              refs;            /* atomic */
    int              cancelled;       /* atomic */
    nalar_engine    *engine;          /* set at submit */
    nalar_notify_fn  notify;
    void            *notify_ctx;
    nalar_request   *next;            /* waiting-queue link (under e->mu) */

    /* parameters (owned copies) */
    nalar_request_params p;
    int32_t         *prompt;          /* (n_prompt); NULL until intake
                                         tokenizes `pieces` */
    /* text for intake to tokenize, NULL once tokenized or when ids came */
    nalar_tok_text  *pieces;          /* (n_pieces) into `text` */
    int32_t          n_pieces;
    char            *text;
    nalar_tok_text  *pred_pieces;     /* (n_pred_pieces) into pred_text */
    int32_t          n_pred_pieces;
    char            *pred_text;
    int32_t         *shared;          /* (p.n_shared_ids) or NULL */
    char             param[16];       /* the field prompt errors name */
    char           **stops;           /* (n_stop) */
    char            *scope;           /* cache scope ("" = global) */
    int32_t         *stop_ids;        /* (n_stop_ids) */
    char            *schema;          /* p.json_schema's copy */
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
    int32_t         *pred;            /* (n_pred) predicted output */
    int32_t          n_pred;
    int32_t          pred_off;        /* prediction index - output index */
    uint32_t         since_spec;      /* steps without speculation */
    uint32_t         probes;          /* speculation probes so far */
    uint32_t         spec_steps;      /* steps it chose to speculate */
    int32_t          spec_proposed, spec_accepted;   /* under mu */
    int32_t          pred_accepted, pred_rejected;   /* under mu */

    /* output handed to the consumer (under mu) */
    pthread_mutex_t  mu;
    char            *out_text;
    size_t           out_len, out_cap;
    int32_t         *out_ids;
    int32_t          out_n, out_idcap;
    nalar_logprob   *out_lp;          /* (out_idcap, 1 + n_logprobs) */
    nalar_finish     finish;
    int              finish_taken;
    char             error[256];
    int              err_status;      /* a refusal: HTTP status, code */
    char             err_code[32];
    char             err_param[16];
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

    /* tests only (engine_test.h) */
    int               fault[NALAR_FAULT_COUNT];
    void            (*idle_fn)(void *arg);
    void             *idle_arg;
};


static void
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


/* --- requests --- */

/* An owned copy of text pieces, their texts back to back in *text. */
static nalar_tok_text *
pieces_copy(const nalar_tok_text *src, int32_t n, char **text)
{
    nalar_tok_text *dst;
    size_t          total = 0, off = 0;

    for (int32_t i = 0; i < n; i++) {
        total += src[i].len;
    }
    dst = malloc(((size_t) (n > 0 ? n : 0) + 1) * sizeof(*dst));
    *text = malloc(total + 1);
    if (dst == NULL || *text == NULL) {
        free(dst);
        free(*text);
        *text = NULL;
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        if (src[i].len > 0) {
            memcpy(*text + off, src[i].text, src[i].len);
        }
        dst[i].text = *text + off;
        dst[i].len = src[i].len;
        dst[i].special = src[i].special;
        off += src[i].len;
    }
    return dst;
}


nalar_request *
nalar_request_create(const nalar_request_params *p, nalar_notify_fn notify,
                     void *notify_ctx, nalar_err *err)
{
    nalar_request *r;

    if (p->n_prompt <= 0 && p->prompt_text == NULL) {
        nalar_fail(err, "the prompt is empty");
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        nalar_fail(err, "out of memory");
        return NULL;
    }
    r->refs = 1;
    r->notify = notify;
    r->notify_ctx = notify_ctx;
    r->p = *p;
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->param, sizeof(r->param), "%s",
             p->prompt_param != NULL ? p->prompt_param : "prompt");
    r->p.prompt_param = NULL;
    r->p.json_schema = NULL;
    r->p.prompt_text = NULL;
    r->p.prediction_text = NULL;
    r->p.shared_prefix = NULL;
    if (p->prompt_text != NULL) {
        r->p.n_prompt = 0;
        r->n_pieces = p->n_prompt_text > 0 ? p->n_prompt_text : 0;
        r->pieces = pieces_copy(p->prompt_text, r->n_pieces, &r->text);
        if (r->pieces == NULL) {
            goto oom;
        }
    } else {
        r->prompt = malloc((size_t) p->n_prompt * sizeof(int32_t));
        if (r->prompt == NULL) {
            goto oom;
        }
        memcpy(r->prompt, p->prompt, (size_t) p->n_prompt * sizeof(int32_t));
    }
    r->stops = calloc((size_t) p->n_stop + 1, sizeof(char *));
    r->stop_ids = malloc(((size_t) p->n_stop_ids + 1) * sizeof(int32_t));
    if (r->stops == NULL || r->stop_ids == NULL) {
        goto oom;
    }
    for (int i = 0; i < p->n_stop; i++) {
        r->stops[i] = strdup(p->stop[i]);
        if (r->stops[i] == NULL) {
            goto oom;
        }
    }
    if (p->n_stop_ids > 0) {
        memcpy(r->stop_ids, p->stop_ids,
               (size_t) p->n_stop_ids * sizeof(int32_t));
    }
    if (p->prediction_text != NULL) {
        r->p.n_prediction = 0;
        r->n_pred_pieces = p->n_prediction_text > 0 ? p->n_prediction_text
                                                    : 0;
        r->pred_pieces = pieces_copy(p->prediction_text, r->n_pred_pieces,
                                     &r->pred_text);
        if (r->pred_pieces == NULL) {
            goto oom;
        }
    } else if (p->n_prediction > 0) {
        r->pred = malloc((size_t) p->n_prediction * sizeof(int32_t));
        if (r->pred == NULL) {
            goto oom;
        }
        memcpy(r->pred, p->prediction,
               (size_t) p->n_prediction * sizeof(int32_t));
        r->n_pred = p->n_prediction;
    }
    r->p.prediction = r->pred;
    if (p->shared_prefix != NULL && p->n_shared_ids > 0) {
        r->shared = malloc((size_t) p->n_shared_ids * sizeof(int32_t));
        if (r->shared == NULL) {
            goto oom;
        }
        memcpy(r->shared, p->shared_prefix,
               (size_t) p->n_shared_ids * sizeof(int32_t));
    } else {
        r->p.n_shared_ids = 0;
    }
    if (p->grammar == NALAR_GRAMMAR_JSON_SCHEMA) {
        r->schema = strdup(p->json_schema != NULL ? p->json_schema : "{}");
        if (r->schema == NULL) {
            goto oom;
        }
        r->p.json_schema = r->schema;
    }
    nalar_seq_kv_init(&r->dkv);
    r->scope = strdup(p->cache_scope != NULL ? p->cache_scope : "");
    if (r->scope == NULL) {
        goto oom;
    }
    r->p.cache_scope = r->scope;
    r->p.prompt = r->prompt;
    r->p.stop = (const char **) r->stops;
    r->p.stop_ids = r->stop_ids;
    if (r->p.sampling.n_logprobs < 0) {
        r->p.sampling.n_logprobs = 0;
    }
    if (r->p.sampling.n_logprobs > 20) {
        r->p.sampling.n_logprobs = 20;
    }
    r->stop = nalar_stop_create((const char **) r->stops, p->n_stop);
    if (r->stop == NULL) {
        goto oom;
    }
    nalar_seq_kv_init(&r->kv);
    r->ttft_ms = -1;
    return r;

oom:
    nalar_fail(err, "out of memory");
    nalar_request_unref(r);
    return NULL;
}


void
nalar_request_ref(nalar_request *r)
{
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
}


void
nalar_request_unref(nalar_request *r)
{
    if (r == NULL || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) {
        return;
    }
    /* the KV was released by the engine when the request finished */
    if (r->stops != NULL) {
        for (int i = 0; i < r->p.n_stop; i++) {
            free(r->stops[i]);
        }
    }
    if (r->stop != NULL) {
        nalar_stop_destroy(r->stop);
    }
    if (r->sampler_ready) {
        nalar_sampler_free(&r->sampler);
    }
    free(r->kv.blocks);
    free(r->dkv.blocks);
    free(r->pred);
    free(r->digests);
    free(r->scope);
    free(r->schema);
    nalar_gmatcher_destroy(r->gm);
    free(r->stops);
    free(r->stop_ids);
    free(r->prompt);
    free(r->pieces);
    free(r->text);
    free(r->pred_pieces);
    free(r->pred_text);
    free(r->shared);
    free(r->tokens);
    free(r->out_text);
    free(r->out_ids);
    free(r->out_lp);
    pthread_mutex_destroy(&r->mu);
    free(r);
}


void
nalar_request_cancel(nalar_request *r)
{
    nalar_engine *e;

    __atomic_store_n(&r->cancelled, 1, __ATOMIC_RELEASE);
    e = __atomic_load_n(&r->engine, __ATOMIC_ACQUIRE);
    if (e != NULL) {
        pthread_mutex_lock(&e->mu);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
}


int
nalar_request_take(nalar_request *r, nalar_output *out)
{
    int any;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&r->mu);
    out->text = r->out_text != NULL ? r->out_text : strdup("");
    out->text_len = r->out_len;
    out->ids = r->out_ids;
    out->n_ids = r->out_n;
    out->logprobs = r->out_lp;
    r->out_text = NULL;
    r->out_len = r->out_cap = 0;
    r->out_ids = NULL;
    r->out_lp = NULL;
    r->out_n = r->out_idcap = 0;
    if (r->finish != NALAR_FINISH_NONE && !r->finish_taken) {
        out->finish = r->finish;
        r->finish_taken = 1;
        memcpy(out->error, r->error, sizeof(out->error));
        out->err_status = r->err_status;
        memcpy(out->err_code, r->err_code, sizeof(out->err_code));
        memcpy(out->err_param, r->err_param, sizeof(out->err_param));
    }
    out->accepted = r->accepted;
    any = r->accepted && !r->accept_taken;
    r->accept_taken = r->accepted;
    out->n_prompt = r->p.n_prompt;
    out->n_cached = r->n_cached;
    out->n_completion = r->n_generated;
    out->queue_ms = r->queue_ms;
    out->ttft_ms = r->ttft_ms;
    out->spec_proposed = r->spec_proposed;
    out->spec_accepted = r->spec_accepted;
    out->pred_accepted = r->pred_accepted;
    out->pred_rejected = r->pred_rejected;
    any = any || out->text_len > 0 || out->n_ids > 0
          || out->finish != NALAR_FINISH_NONE;
    pthread_mutex_unlock(&r->mu);
    return any;
}


void
nalar_output_free(nalar_output *out)
{
    free(out->text);
    free(out->ids);
    free(out->logprobs);
    memset(out, 0, sizeof(*out));
}


/* Append output under r->mu; called on the engine thread. */
static int
push_output(nalar_request *r, const char *text, size_t len, int32_t id,
            const nalar_logprob *lp)
{
    int nlp = r->p.logprobs ? 1 + r->p.sampling.n_logprobs : 0;

    pthread_mutex_lock(&r->mu);
    if (r->out_len + len + 1 > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 64;
        char  *t;

        while (cap < r->out_len + len + 1) {
            cap *= 2;
        }
        t = realloc(r->out_text, cap);
        if (t == NULL) {
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        r->out_text = t;
        r->out_cap = cap;
    }
    if (len > 0) {
        memcpy(r->out_text + r->out_len, text, len);
    }
    r->out_len += len;
    r->out_text[r->out_len] = '\0';
    if (id >= 0) {
        if (r->out_n == r->out_idcap) {
            int32_t        cap = r->out_idcap ? r->out_idcap * 2 : 16;
            int32_t       *ids = realloc(r->out_ids,
                                         (size_t) cap * sizeof(int32_t));
            nalar_logprob *lps;

            if (ids == NULL) {
                pthread_mutex_unlock(&r->mu);
                return -1;
            }
            r->out_ids = ids;
            if (nlp > 0) {
                lps = realloc(r->out_lp,
                              (size_t) cap * nlp * sizeof(nalar_logprob));
                if (lps == NULL) {
                    pthread_mutex_unlock(&r->mu);
                    return -1;
                }
                r->out_lp = lps;
            }
            r->out_idcap = cap;
        }
        if (nlp > 0 && lp != NULL) {
            memcpy(r->out_lp + (size_t) r->out_n * nlp, lp,
                   (size_t) nlp * sizeof(nalar_logprob));
        }
        r->out_ids[r->out_n++] = id;
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}


/* --- the engine --- */

void
nalar_engine_test_fault(nalar_engine *e, nalar_fault_site site, int n)
{
    __atomic_store_n(&e->fault[site], n, __ATOMIC_RELAXED);
}


void
nalar_engine_test_idle(nalar_engine *e, void (*fn)(void *arg), void *arg)
{
    e->idle_fn = fn;
    e->idle_arg = arg;
}


/* Is this the armed fault at `site` (engine_test.h)? */
static int
test_fault(nalar_engine *e, nalar_fault_site site)
{
    int n = __atomic_load_n(&e->fault[site], __ATOMIC_RELAXED);

    if (n <= 0) {
        return 0;
    }
    __atomic_store_n(&e->fault[site], n - 1, __ATOMIC_RELAXED);
    return n == 1;
}


static char *
dup_or_null(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}


nalar_engine *
nalar_engine_create(const nalar_engine_opts *o, nalar_err *err)
{
    nalar_engine *e;

    if (o->model_path == NULL) {
        nalar_fail(err, "engine: no model path");
        return NULL;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        nalar_fail(err, "engine: out of memory");
        return NULL;
    }
    e->opts = *o;
    for (int p = 0; p < NALAR_PROP_COUNT; p++) {
        nalar_accept_init(&e->prop_acc[p], p == NALAR_PROP_DRAFT ? 0.7 : 0.5);
    }
    e->model_path = strdup(o->model_path);
    e->model_name = dup_or_null(o->model_name);
    e->backend_name = strdup(o->backend != NULL ? o->backend : "cpu");
    if (e->opts.max_batch_tokens <= 0) {
        e->opts.max_batch_tokens = 512;
    }
    if (e->opts.max_queue <= 0) {
        e->opts.max_queue = 1024;
    }
    if (e->opts.max_running <= 0) {
        e->opts.max_running = 64;
    }
    if (e->opts.max_running > e->opts.max_batch_tokens) {
        e->opts.max_running = e->opts.max_batch_tokens;
    }
    e->opts.model_path = e->model_path;
    e->opts.model_name = e->model_name;
    e->opts.backend = e->backend_name;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->running = calloc((size_t) e->opts.max_running, sizeof(*e->running));
    if (e->model_path == NULL || e->backend_name == NULL
        || e->running == NULL)
    {
        nalar_fail(err, "engine: out of memory");
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/* The comparison nalar_same_vocab makes, of two loaded tokenizers. */
static int
vocab_compare(const nalar_tokenizer *t, const nalar_tokenizer *d,
              const char *target, const char *draft, nalar_err *err)
{
    int32_t n = nalar_tok_n_vocab(t);

    if (nalar_tok_n_vocab(d) != n) {
        return nalar_fail(err, "%s has a vocabulary of %d tokens but the "
                          "target %s has %d: a draft must share the "
                          "target's vocabulary", draft, nalar_tok_n_vocab(d),
                          target, n);
    }
    if (nalar_tok_kind_of(t) != nalar_tok_kind_of(d)
        || nalar_tok_bos(t) != nalar_tok_bos(d)
        || nalar_tok_eos(t) != nalar_tok_eos(d))
    {
        return nalar_fail(err, "%s: the vocabulary's tokenizer kind or "
                          "special tokens (BOS, EOS) differ from the target "
                          "%s", draft, target);
    }
    for (int32_t i = 0; i < n; i++) {
        const char *a = nalar_tok_piece(t, i);
        const char *b = nalar_tok_piece(d, i);

        if (a == NULL || b == NULL || strcmp(a, b) != 0
            || nalar_tok_is_eog(t, i) != nalar_tok_is_eog(d, i))
        {
            return nalar_fail(err, "%s: token %d of the vocabulary is "
                              "\"%s\" but the target's is \"%s\": a draft "
                              "must share the target's vocabulary", draft, i,
                              b != NULL ? b : "", a != NULL ? a : "");
        }
    }
    return 0;
}


int
nalar_same_vocab(const char *target, const char *draft, nalar_err *err)
{
    nalar_tokenizer *t = NULL, *d = NULL;
    gguf_file       *f;
    int              rc = -1;

    f = gguf_open(target, err);
    if (f == NULL) {
        goto done;
    }
    t = nalar_tokenizer_create(f, err);
    gguf_close(f);
    if (t == NULL) {
        goto done;
    }
    f = gguf_open(draft, err);
    if (f == NULL) {
        goto done;
    }
    d = nalar_tokenizer_create(f, err);
    gguf_close(f);
    if (d == NULL) {
        goto done;
    }
    rc = vocab_compare(t, d, target, draft, err);
done:
    nalar_tokenizer_destroy(d);
    nalar_tokenizer_destroy(t);
    return rc;
}


/* The draft model and its backend (on the target's workers or device). */
static int
draft_open(nalar_engine *e, nalar_err *err)
{
    e->draft = nalar_model_load(e->opts.draft_path, err);
    if (e->draft == NULL) {
        return -1;
    }
    if (vocab_compare(e->model->tok, e->draft->tok, e->model->path,
                      e->draft->path, err) != 0)
    {
        return -1;
    }
    e->draft_be = nalar_backend_create_sharing(e->draft, e->be, err);
    return e->draft_be == NULL ? -1 : 0;
}


/*
 * How many KV blocks the pool holds.  CPU: kv_bytes of target KV (the
 * draft, when there is one, gets as many blocks of its own size).  GPU:
 * the target's and the draft's blocks together fit in gpu_memory (a
 * fraction of the device memory still free once the weights are uploaded,
 * or a size), capped by kv_bytes when that is set.
 */
static int32_t
kv_pool_blocks(nalar_engine *e, nalar_err *err)
{
    int64_t block_bytes = nalar_kv_block_bytes(e->model), kv_bytes;

    if (e->be->free_memory != NULL) {
        int64_t free_bytes = e->be->free_memory(e->be);
        double  g = e->opts.gpu_memory > 0 ? e->opts.gpu_memory : 0.9;

        if (e->draft != NULL) {
            block_bytes += nalar_kv_block_bytes(e->draft);
        }
        if (g > 1) {
            kv_bytes = (int64_t) g;
        } else if (free_bytes < 0) {
            nalar_fail(err, "engine: cannot query free memory of %s device "
                       "%d", e->be->name, e->be->device);
            return -1;
        } else {
            kv_bytes = (int64_t) (g * (double) free_bytes);
        }
        if (e->opts.kv_bytes > 0 && e->opts.kv_bytes < kv_bytes) {
            kv_bytes = e->opts.kv_bytes;
        }
        if (free_bytes >= 0 && kv_bytes > free_bytes) {
            nalar_fail(err, "engine: a KV cache of %lld MiB does not fit in "
                       "the %lld MiB free on %s device %d",
                       (long long) (kv_bytes >> 20),
                       (long long) (free_bytes >> 20), e->be->name,
                       e->be->device);
            return -1;
        }
    } else {
        kv_bytes = e->opts.kv_bytes;
        if (kv_bytes <= 0) {
            kv_bytes = 16 * block_bytes
                       * ((e->model->cfg.n_ctx + NALAR_KV_BLOCK - 1)
                          / NALAR_KV_BLOCK);
            if (kv_bytes > (int64_t) 1 << 30) {
                kv_bytes = (int64_t) 1 << 30;
            }
        }
    }
    if (kv_bytes / block_bytes < 1) {
        nalar_fail(err, "engine: KV cache of %lld bytes holds no block (one "
                   "block takes %lld bytes)", (long long) kv_bytes,
                   (long long) block_bytes);
        return -1;
    }
    return kv_bytes / block_bytes > INT32_MAX / 2
           ? INT32_MAX / 2 : (int32_t) (kv_bytes / block_bytes);
}


/* Load the model, the backend (and the draft's) and the KV pools. */
/* cost_seed: passes of one sequence of 1 .. NALAR_SPEC_MAX_K + 1 tokens
 * (the last confirmed token and up to k proposals), after a prompt */
#define SEED_POS     32
#define SEED_ROUNDS  12        /* as many as the CPU backend needs to
                                  settle which way each size runs */
#define SEED_BUDGET  0.5       /* seconds at most (a large model on a CPU
                                  measures what the budget allows) */

/*
 * Seed a cost table with what passes of 1 .. NALAR_SPEC_MAX_K + 1 tokens of
 * one sequence cost on `be`: the fastest of up to SEED_ROUNDS rounds, the
 * sizes interleaved so that a slow spell of the machine falls on all alike.
 * Every size is measured before the cost model first chooses k: the model
 * measures only the sizes it chooses, so a size it has not measured would
 * stand at what interpolation or one slow first pass says, and one such
 * estimate can fix k at a worse size for good (and the step gate, judging
 * the draft by those steps, hold the draft back).
 *
 * The same passes settle what the backend measures of its own passes (the
 * CPU's: which way each size runs, see choose_way), so the first steps
 * that speculate, and the step gate judging them, do not carry that
 * measurement.  The costs recorded are of passes with the model's weights
 * hot in cache, which a serving pass need not have (a draft's, after a
 * target's, runs colder); serving passes correct them.
 * Skipped when the pool cannot spare the scratch sequence's blocks.
 */
static void
cost_seed(nalar_backend *be, nalar_kv_pool *kv, int32_t n_vocab,
          nalar_cost_table *cost)
{
    enum { N = NALAR_SPEC_MAX_K + 1 };
    int32_t       tok[SEED_POS], pos[SEED_POS];
    int8_t        want[SEED_POS];
    nalar_seq_kv  s, *seq[SEED_POS];
    nalar_batch   b = { 0, tok, pos, seq, want, 0 };
    double        best[N + 1], t_end = nalar_now_s() + SEED_BUDGET;
    float        *logits = nalar_alloc_lines((size_t) N * n_vocab
                                             * sizeof(float));
    nalar_err     err;

    nalar_seq_kv_init(&s);
    if (logits == NULL || nalar_seq_kv_reserve(kv, &s, SEED_POS + N) != 0) {
        goto done;
    }
    for (int32_t i = 0; i < SEED_POS; i++) {
        tok[i] = (int32_t) ((i * 7919L + 11) % n_vocab);
        pos[i] = i;
        seq[i] = &s;
        want[i] = i == SEED_POS - 1;
    }
    b.n_tokens = SEED_POS;
    b.n_logits = 1;
    if (be->forward(be, kv, &b, logits, &err) != 0) {
        goto done;
    }
    s.n_pos = SEED_POS;
    for (int n = 0; n <= N; n++) {
        best[n] = -1;
    }
    for (int round = 0; round < SEED_ROUNDS; round++) {
        for (int32_t n = 1; n <= N; n++) {
            double t0;

            if (nalar_now_s() > t_end) {
                goto record;
            }
            for (int32_t i = 0; i < n; i++) {
                pos[i] = SEED_POS + i;
                want[i] = 1;
            }
            b.n_tokens = n;
            b.n_logits = n;
            t0 = nalar_now_s();
            if (be->forward(be, kv, &b, logits, &err) != 0) {
                goto record;
            }
            t0 = nalar_now_s() - t0;
            best[n] = best[n] < 0 || t0 < best[n] ? t0 : best[n];
        }
    }
record:
    for (int32_t n = 1; n <= N; n++) {
        if (best[n] > 0) {
            nalar_cost_record(cost, n, best[n]);
        }
    }
done:
    nalar_seq_kv_release(kv, &s);
    free(logits);
}


static int
engine_load(nalar_engine *e, nalar_err *err)
{
    nalar_backend_opts bo = { e->backend_name, e->opts.n_threads,
                              e->opts.device, e->opts.worker,
                              e->opts.gpu_gemv_max };
    int32_t            n_blocks;

    e->model = nalar_model_load(e->model_path, err);
    if (e->model == NULL) {
        return -1;
    }
    if (e->model_name == NULL) {
        e->model_name = strdup(e->model->name);
        if (e->model_name == NULL) {
            return nalar_fail(err, "engine: out of memory");
        }
    }
    e->be = nalar_backend_create(e->model, &bo, err);
    if (e->be == NULL) {
        return -1;
    }
    if (e->opts.draft_path != NULL && draft_open(e, err) != 0) {
        return -1;
    }
    n_blocks = kv_pool_blocks(e, err);
    if (n_blocks < 0) {
        return -1;
    }
    if (nalar_kv_pool_init(&e->kv, n_blocks, e->model->cfg.n_layers,
                           e->model->cfg.n_kv_heads * e->model->cfg.head_dim,
                           err) != 0)
    {
        return -1;
    }
    if (e->be->kv_alloc(e->be, &e->kv, err) != 0) {
        nalar_kv_pool_free(&e->kv);
        return -1;
    }
    e->kv_ready = 1;
    if (e->draft != NULL) {
        if (nalar_kv_pool_init(&e->dkv, n_blocks, e->draft->cfg.n_layers,
                               e->draft->cfg.n_kv_heads
                               * e->draft->cfg.head_dim, err) != 0)
        {
            return -1;
        }
        if (e->draft_be->kv_alloc(e->draft_be, &e->dkv, err) != 0) {
            nalar_kv_pool_free(&e->dkv);
            return -1;
        }
        e->dkv_ready = 1;
    }
    if (e->opts.prefix_cache) {
        e->cache = nalar_prefix_cache_create(&e->kv, e->model->identity,
                                             e->be->name, err);
        if (e->cache == NULL) {
            return -1;
        }
    }
    e->grammars = nalar_grammar_cache_create(e->model->tok, 0);
    if (e->grammars == NULL) {
        return nalar_fail(err, "engine: out of memory");
    }
    /* what verifying (and drafting) k proposals costs, before the cost
     * model first chooses k; the same passes settle which way the CPU
     * backend runs each size (see cost_seed) */
    cost_seed(e->be, &e->kv, e->model->cfg.n_vocab, &e->target_cost);
    if (e->draft != NULL) {
        cost_seed(e->draft_be, &e->dkv, e->draft->cfg.n_vocab,
                  &e->draft_cost);
    }
    pthread_mutex_lock(&e->mu);
    e->m.kv_blocks_total = n_blocks;
    e->m.kv_blocks_free = n_blocks;
    pthread_mutex_unlock(&e->mu);
    return 0;
}


int
nalar_engine_state(nalar_engine *e, nalar_err *err)
{
    int s = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);

    if (s < 0 && err != NULL) {
        *err = e->load_err;
    }
    return s;
}


nalar_model *
nalar_engine_model(nalar_engine *e)
{
    return nalar_engine_state(e, NULL) == 1 ? e->model : NULL;
}


void
nalar_engine_metrics(nalar_engine *e, nalar_metrics *m)
{
    pthread_mutex_lock(&e->mu);
    *m = e->m;
    m->requests_waiting = e->n_waiting;
    if (e->kv_ready) {
        m->kv_blocks_free = __atomic_load_n(&e->kv.n_free_published,
                                            __ATOMIC_RELAXED)
                            + e->kv_evictable;
    }
    pthread_mutex_unlock(&e->mu);
}


double
nalar_engine_pass_cost(nalar_engine *e, int draft, int32_t n_tokens)
{
    if (draft && e->draft == NULL) {
        return -1;
    }
    return nalar_cost_estimate(draft ? &e->draft_cost : &e->target_cost,
                               n_tokens);
}


int
nalar_engine_submit(nalar_engine *e, nalar_request *r, nalar_err *err)
{
    if (nalar_engine_state(e, NULL) != 1) {
        return nalar_fail(err, "the model is still loading");
    }

    pthread_mutex_lock(&e->mu);
    if (e->n_waiting >= e->opts.max_queue) {
        pthread_mutex_unlock(&e->mu);
        return nalar_fail(err, "the queue is full (%d waiting)",
                          e->n_waiting);
    }
    if (r->state != REQ_NEW) {
        pthread_mutex_unlock(&e->mu);
        return nalar_fail(err, "request submitted twice");
    }
    nalar_request_ref(r);
    __atomic_store_n(&r->engine, e, __ATOMIC_RELEASE);
    r->state = REQ_WAITING;
    r->t_submit = nalar_now_s();
    r->next = NULL;
    if (e->in_tail != NULL) {
        e->in_tail->next = r;
    } else {
        e->in_head = r;
    }
    e->in_tail = r;
    e->n_waiting++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}


int
nalar_engine_check_prompt(nalar_engine *e, int32_t n_prompt, int more,
                          int32_t max_tokens, char *msg, size_t cap)
{
    int32_t     n_ctx = e->model->cfg.n_ctx;
    int32_t     n_gen = max_tokens > 0 ? max_tokens : 1;
    const char *al = more ? "at least " : "";

    if (more || n_prompt >= n_ctx
        || (max_tokens > 0 && (int64_t) n_prompt + max_tokens > n_ctx))
    {
        snprintf(msg, cap, "This model's maximum context length is %d "
                 "tokens. However, you requested %s%lld tokens (%s%d in the "
                 "prompt, %d in the completion). Please reduce the prompt "
                 "or the completion length.", n_ctx, al,
                 (long long) n_prompt + n_gen, al, n_prompt, n_gen);
        return -1;
    }
    /* a prompt the whole KV pool cannot hold is the client's mistake, not
     * a busy server */
    if (e->kv_ready
        && (n_prompt + NALAR_KV_BLOCK) / NALAR_KV_BLOCK > e->kv.n_blocks)
    {
        snprintf(msg, cap, "The prompt has %d tokens but the KV cache holds "
                 "only %d", n_prompt, e->kv.n_blocks * NALAR_KV_BLOCK);
        return -1;
    }
    return 0;
}


static void finish_unref(nalar_engine *e, nalar_request *r, nalar_finish why,
                         const char *error);


/* Why intake refused a request. */
typedef struct {
    int         status;
    const char *code;
    const char *param;
    char        msg[256];
} intake_refusal;


/*
 * Intake of one request (engine thread, no lock held): the prompt's ids,
 * tokenized from text at most up to the context, and checked; the
 * prediction's ids; the shared prefix.  Adds the tokens it made to *work.
 * 0, or -1 with why the request is refused.
 */
static int
intake_one(nalar_engine *e, nalar_request *r, int32_t *work,
           intake_refusal *no)
{
    const nalar_config    *c = &e->model->cfg;
    const nalar_tokenizer *tok = e->model->tok;
    int32_t               *ids, i;
    int                    n, more = 0;

    no->status = 400;
    no->code = NULL;
    no->param = r->param;
    if (r->pieces != NULL) {
        n = nalar_tokenize_bounded(tok, r->pieces, (size_t) r->n_pieces,
                                   nalar_tok_add_bos(tok), c->n_ctx, &ids,
                                   &more);
        if (n < 0) {
            snprintf(no->msg, sizeof(no->msg), "%s could not be tokenized",
                     r->param);
            return -1;
        }
        *work += n;
        free(r->pieces);
        free(r->text);
        r->pieces = NULL;
        r->text = NULL;
        pthread_mutex_lock(&r->mu);
        r->prompt = ids;
        r->p.prompt = ids;
        /* where counting stopped, one more token is known to be there */
        r->p.n_prompt = more ? n + 1 : n;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->p.n_prompt <= 0) {
        snprintf(no->msg, sizeof(no->msg), "the prompt is empty");
        return -1;
    }
    if (nalar_engine_check_prompt(e, r->p.n_prompt, more,
                                  r->p.max_tokens_fit ? r->p.max_tokens : 0,
                                  no->msg, sizeof(no->msg)) != 0)
    {
        no->code = "context_length_exceeded";
        return -1;
    }
    /* a sequence must fit the pool alone (others are preempted for it,
     * choices of one prompt and speculation's proposals included: they
     * wait or give way); without max_tokens, the pool bounds it as the
     * context does (request_start) */
    if (e->kv_ready && r->p.max_tokens > 0
        && r->p.n_prompt + (int64_t) r->p.max_tokens
           > (int64_t) e->kv.n_blocks * NALAR_KV_BLOCK)
    {
        snprintf(no->msg, sizeof(no->msg), "the KV cache holds %d tokens "
                 "but %lld tokens were requested (%d in the prompt, %d in "
                 "the completion)", e->kv.n_blocks * NALAR_KV_BLOCK,
                 (long long) r->p.n_prompt + r->p.max_tokens,
                 r->p.n_prompt, r->p.max_tokens);
        no->code = "context_length_exceeded";
        no->param = "max_tokens";
        return -1;
    }
    for (i = 0; i < r->p.n_prompt; i++) {
        if (r->prompt[i] < 0 || r->prompt[i] >= c->n_vocab) {
            snprintf(no->msg, sizeof(no->msg), "prompt token %d is outside "
                     "the vocabulary (0..%d)", r->prompt[i], c->n_vocab - 1);
            return -1;
        }
    }
    if (r->pred_pieces != NULL) {
        /* the prediction continues the answer: no BOS, and a leading
         * space is the dummy-prefix space SentencePiece puts there */
        for (i = 0; i < r->n_pred_pieces; i++) {
            nalar_tok_text *pc = &r->pred_pieces[i];

            if (pc->len == 0) {
                continue;
            }
            if (pc->text[0] == ' ' && nalar_tok_kind_of(tok) == TOK_SPM
                && nalar_tok_add_space_prefix(tok))
            {
                pc->text++;
                pc->len--;
            }
            break;
        }
        /* predictions longer than the context are cut: only so much of
         * one can ever be verified */
        n = nalar_tokenize_bounded(tok, r->pred_pieces,
                                   (size_t) r->n_pred_pieces, 0, c->n_ctx,
                                   &ids, &more);
        if (n < 0) {
            no->param = "prediction";
            snprintf(no->msg, sizeof(no->msg),
                     "prediction could not be tokenized");
            return -1;
        }
        *work += n;
        free(r->pred_pieces);
        free(r->pred_text);
        r->pred_pieces = NULL;
        r->pred_text = NULL;
        r->pred = ids;
        r->n_pred = n;
        r->p.prediction = ids;
        r->p.n_prediction = n;
    }
    if (r->p.grammar != NALAR_GRAMMAR_NONE && r->gm == NULL) {
        /* structured output: the compiled grammar from the cache */
        double         cs;
        nalar_grammar *g;

        g = nalar_grammar_get(e->grammars, r->p.grammar, r->schema,
                              r->schema ? strlen(r->schema) : 0, &cs,
                              no->msg, sizeof(no->msg));
        if (g != NULL) {
            r->gm = nalar_gmatcher_create(g);
            nalar_grammar_release(g);
        }
        pthread_mutex_lock(&e->mu);
        e->m.grammar_compile_seconds_total += cs;
        e->m.grammar_compiles_total += cs > 0;
        e->m.grammar_requests_total++;
        pthread_mutex_unlock(&e->mu);
        if (r->gm == NULL) {
            if (g != NULL) {
                snprintf(no->msg, sizeof(no->msg), "out of memory");
            }
            no->param = "response_format";
            return -1;
        }
    }
    if (r->shared != NULL) {
        for (i = 0; i < r->p.n_shared_ids && i < r->p.n_prompt; i++) {
            if (r->shared[i] != r->prompt[i]) {
                break;
            }
        }
        /* the engine shares whole blocks only */
        r->p.n_shared_prefix = i / NALAR_KV_BLOCK * NALAR_KV_BLOCK;
    }
    return 0;
}


/*
 * Intake (see engine.h): each submitted request, in submission order, is
 * checked and queued for admission, or refused.  While requests run, a
 * step tokenizes about one context's worth, at least one request.
 */
static void
step_intake(nalar_engine *e)
{
    int32_t        work = 0;
    nalar_request *r;
    intake_refusal no;

    for ( ;; ) {
        pthread_mutex_lock(&e->mu);
        r = e->in_head;
        if (r == NULL
            || (work >= e->model->cfg.n_ctx && e->n_running > 0))
        {
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->in_head = r->next;
        if (e->in_head == NULL) {
            e->in_tail = NULL;
        }
        pthread_mutex_unlock(&e->mu);

        if (__atomic_load_n(&r->cancelled, __ATOMIC_ACQUIRE)) {
            pthread_mutex_lock(&e->mu);
            e->n_waiting--;
            pthread_mutex_unlock(&e->mu);
            finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
            continue;
        }

        if (intake_one(e, r, &work, &no) != 0) {
            pthread_mutex_lock(&e->mu);
            e->n_waiting--;
            pthread_mutex_unlock(&e->mu);
            pthread_mutex_lock(&r->mu);
            r->err_status = no.status;
            snprintf(r->err_code, sizeof(r->err_code), "%s",
                     no.code != NULL ? no.code : "");
            snprintf(r->err_param, sizeof(r->err_param), "%s", no.param);
            pthread_mutex_unlock(&r->mu);
            finish_unref(e, r, NALAR_FINISH_ERROR, no.msg);
            continue;
        }

        pthread_mutex_lock(&r->mu);
        r->accepted = 1;
        pthread_mutex_unlock(&r->mu);
        if (r->notify != NULL) {
            r->notify(r, r->notify_ctx);
        }

        pthread_mutex_lock(&e->mu);
        r->next = NULL;
        if (e->wait_tail != NULL) {
            e->wait_tail->next = r;
        } else {
            e->wait_head = r;
        }
        e->wait_tail = r;
        pthread_mutex_unlock(&e->mu);
    }
}


/* A request's acceptance estimates (but for its own prediction's) are
 * pulled toward its proposer's over all requests, as if by this many
 * observations (nalar_accept_blend). */
#define ACC_PRIOR_WEIGHT 4

/* Pick the request's proposer from its mode, the engine's and what the
 * engine has; prepare draft sampling state. */
static int
spec_setup(nalar_engine *e, nalar_request *r)
{
    int mode = r->p.spec_mode != NALAR_SPEC_DEFAULT ? r->p.spec_mode
                                                    : e->opts.spec_mode;
    int kmax = r->p.spec_max_k > 0 ? r->p.spec_max_k : e->opts.spec_max_k;

    r->spec_k_max = kmax > 0 ? kmax : 4;
    if (r->spec_k_max > NALAR_SPEC_MAX_K) {
        r->spec_k_max = NALAR_SPEC_MAX_K;
    }
    if (e->opts.spec_fixed_k > 0) {
        r->spec_k_max = e->opts.spec_fixed_k < NALAR_SPEC_MAX_K
                        ? e->opts.spec_fixed_k : NALAR_SPEC_MAX_K;
    }
    r->prop = NALAR_PROP_NONE;
    if (r->n_pred > 0) {
        /* the client's own prediction is the best proposal there is */
        r->prop = NALAR_PROP_PREDICTION;
    } else if (mode == NALAR_SPEC_DRAFT || mode == NALAR_SPEC_AUTO) {
        r->prop = e->draft != NULL ? NALAR_PROP_DRAFT
                  : mode == NALAR_SPEC_AUTO ? NALAR_PROP_NGRAM
                  : NALAR_PROP_NONE;
    } else if (mode == NALAR_SPEC_NGRAM) {
        r->prop = NALAR_PROP_NGRAM;
    }
    r->ngram_fallback = mode == NALAR_SPEC_AUTO
                        && r->prop == NALAR_PROP_DRAFT;
    r->prop_now = r->prop;
    nalar_accept_init(&r->acc, r->prop == NALAR_PROP_PREDICTION ? 0.9
                               : r->prop == NALAR_PROP_DRAFT ? 0.7 : 0.5);
    nalar_accept_init(&r->acc_ngram, 0.5);
    return 0;
}


/* Engine-side setup the first time a request is scheduled. */
static int
request_start(nalar_engine *e, nalar_request *r)
{
    const nalar_config *c = &e->model->cfg;

    r->cap_tokens = c->n_ctx;
    r->tokens = malloc((size_t) r->cap_tokens * sizeof(int32_t));
    if (r->tokens == NULL
        || nalar_sampler_init(&r->sampler, &r->p.sampling, c->n_vocab) != 0)
    {
        return -1;
    }
    r->sampler_ready = 1;
    r->digests = malloc(((size_t) r->cap_tokens / NALAR_KV_BLOCK + 1)
                        * NALAR_DIGEST);
    if (r->digests == NULL) {
        return -1;
    }
    memcpy(r->tokens, r->prompt, (size_t) r->p.n_prompt * sizeof(int32_t));
    r->n_tokens = r->p.n_prompt;
    r->max_tokens = c->n_ctx - r->p.n_prompt;
    if (e->kv.n_blocks * NALAR_KV_BLOCK < c->n_ctx) {
        /* the most one sequence can ever hold (nalar_engine_submit) */
        r->max_tokens = e->kv.n_blocks * NALAR_KV_BLOCK - r->p.n_prompt;
    }
    if (r->p.max_tokens > 0 && r->p.max_tokens < r->max_tokens) {
        r->max_tokens = r->p.max_tokens;
    }
    nalar_detok_init(&r->detok, e->model->tok);
    if (spec_setup(e, r) != 0) {
        return -1;
    }
    r->t_sched = nalar_now_s();
    r->queue_ms = (r->t_sched - r->t_submit) * 1e3;
    pthread_mutex_lock(&e->mu);
    hist_add(e->m.queue_buckets, &e->m.queue_sum, &e->m.queue_count,
             r->t_sched - r->t_submit);
    pthread_mutex_unlock(&e->mu);
    return 0;
}


/* Finish: release KV, publish the reason, notify.  The caller drops the
 * engine's reference (finish_unref) once it no longer touches r. */
static void
request_finish(nalar_engine *e, nalar_request *r, nalar_finish why,
               const char *error)
{
    const char *tail;
    size_t      n;

    if (e->kv_ready) {
        nalar_seq_kv_release(&e->kv, &r->kv);
    }
    if (e->dkv_ready) {
        nalar_seq_kv_release(&e->dkv, &r->dkv);
    }
    if (why != NALAR_FINISH_CANCELLED && why != NALAR_FINISH_ERROR
        && r->stop != NULL)
    {
        /* text held back as a possible stop-string prefix is final now */
        n = nalar_stop_flush(r->stop, &tail);
        if (n > 0) {
            push_output(r, tail, n, -1, NULL);
        }
    }
    r->state = REQ_FINISHED;
    pthread_mutex_lock(&r->mu);
    r->finish = why;
    if (error != NULL) {
        size_t n = strlen(error);

        n = n < sizeof(r->error) - 1 ? n : sizeof(r->error) - 1;
        memcpy(r->error, error, n);
        r->error[n] = '\0';
    }
    pthread_mutex_unlock(&r->mu);
    if (r->notify != NULL) {
        r->notify(r, r->notify_ctx);
    }
}


static void
finish_unref(nalar_engine *e, nalar_request *r, nalar_finish why,
             const char *error)
{
    request_finish(e, r, why, error);
    nalar_request_unref(r);
}


static void
running_remove(nalar_engine *e, int32_t i)
{
    memmove(&e->running[i], &e->running[i + 1],
            (size_t) (e->n_running - i - 1) * sizeof(*e->running));
    e->n_running--;
}


/* --- prefix cache glue --- */

/* Digest of block i of r's tokens, computing the chain up to it. */
static const uint8_t *
block_digest(nalar_engine *e, nalar_request *r, int32_t i)
{
    while (r->n_digests <= i) {
        int32_t        k = r->n_digests;
        const int32_t *toks = r->tokens + (int64_t) k * NALAR_KV_BLOCK;
        int            shared_k = (k + 1) * NALAR_KV_BLOCK
                                  <= r->p.n_shared_prefix;
        uint8_t        prev[NALAR_DIGEST], root[NALAR_DIGEST];

        if (k == 0) {
            /* blocks inside the operator's shared prefix live in the
             * global scope; everything else in the request's scope */
            nalar_prefix_root(e->cache, shared_k ? "" : r->scope, prev);
        } else {
            int shared_prev = k * NALAR_KV_BLOCK <= r->p.n_shared_prefix;

            memcpy(prev, r->digests[k - 1], NALAR_DIGEST);
            if (shared_prev && !shared_k && r->scope[0] != '\0') {
                nalar_prefix_root(e->cache, r->scope, root);
                nalar_prefix_rescope(prev, root, prev);
            }
        }
        nalar_prefix_chain(prev, toks, r->digests[k]);
        r->n_digests++;
    }
    return r->digests[i];
}


/* At admission: share the longest published chain of the prompt's full
 * blocks, leaving at least one token to compute (its logits are needed). */
static void
cache_match(nalar_engine *e, nalar_request *r)
{
    int32_t max_blocks, matched;

    if (e->cache == NULL || r->p.no_cache || r->kv.n_blocks != 0) {
        return;
    }
    max_blocks = (r->n_tokens - 1) / NALAR_KV_BLOCK;
    if (max_blocks <= 0) {
        return;
    }
    block_digest(e, r, max_blocks - 1);
    matched = nalar_prefix_match(e->cache, &r->kv,
                                 (const uint8_t (*)[NALAR_DIGEST]) r->digests,
                                 r->tokens, max_blocks);
    r->n_computed = matched * NALAR_KV_BLOCK;
    r->kv.n_pos = r->n_computed;
    if (!r->admitted_once) {
        pthread_mutex_lock(&r->mu);
        r->n_cached = matched * NALAR_KV_BLOCK;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->n_published < matched) {
        r->n_published = matched;
    }
}


/* Publish r's full blocks whose positions are all confirmed and computed
 * (n_confirmed: positions [0, n_confirmed) hold confirmed tokens' KV). */
static void
cache_publish(nalar_engine *e, nalar_request *r, int32_t n_confirmed)
{
    if (e->cache == NULL || r->p.no_cache) {
        return;
    }
    while ((r->n_published + 1) * NALAR_KV_BLOCK <= n_confirmed) {
        int32_t i = r->n_published;

        nalar_prefix_publish(e->cache, block_digest(e, r, i),
                             r->tokens + (int64_t) i * NALAR_KV_BLOCK,
                             r->kv.blocks[i]);
        r->n_published++;
    }
}


/* Blocks that could be handed out now: free plus evictable cached ones. */
static int32_t
kv_available(nalar_engine *e)
{
    nalar_prefix_stats st;

    if (e->cache == NULL) {
        return e->kv.n_free;
    }
    nalar_prefix_stats_get(e->cache, &st);
    return e->kv.n_free + st.evictable;
}


/* Reserve KV for r up to n_pos, evicting unreferenced cached blocks when
 * the free list is short. */
static int
kv_reserve(nalar_engine *e, nalar_request *r, int32_t n_pos)
{
    int32_t need;

    if (nalar_seq_kv_reserve(&e->kv, &r->kv, n_pos) == 0) {
        return 0;
    }
    if (e->cache == NULL) {
        return -1;
    }
    need = nalar_seq_kv_blocks_needed(&e->kv, &r->kv, n_pos) - e->kv.n_free;
    nalar_prefix_evict(e->cache, need);
    return nalar_seq_kv_reserve(&e->kv, &r->kv, n_pos);
}


static void
publish_metrics(nalar_engine *e)
{
    nalar_prefix_stats st;

    memset(&st, 0, sizeof(st));
    if (e->cache != NULL) {
        nalar_prefix_stats_get(e->cache, &st);
    }
    pthread_mutex_lock(&e->mu);
    e->m.requests_running = e->n_running;
    if (e->n_running == 0) {
        e->m.spec_provisional_blocks = 0;
    }
    e->m.prefix_queries_total = st.queries;
    e->m.prefix_hits_total = st.hits;
    e->m.prefix_evictions_total = st.evictions;
    e->m.prefix_blocks = st.blocks;
    e->kv_evictable = st.evictable;
    pthread_mutex_unlock(&e->mu);
}


/* Preempt the most recently admitted running request: free its KV and put
 * it back at the head of the queue; it recomputes its context later. */
static void
preempt_last(nalar_engine *e)
{
    nalar_request *r = e->running[e->n_running - 1];

    e->n_running--;
    nalar_seq_kv_release(&e->kv, &r->kv);
    if (e->dkv_ready) {
        nalar_seq_kv_release(&e->dkv, &r->dkv);
    }
    r->d_computed = 0;
    r->n_computed = 0;
    r->n_published = 0;
    r->state = REQ_WAITING;
    pthread_mutex_lock(&e->mu);
    r->next = e->wait_head;
    e->wait_head = r;
    if (e->wait_tail == NULL) {
        e->wait_tail = r;
    }
    e->n_waiting++;
    e->m.preemptions_total++;
    pthread_mutex_unlock(&e->mu);
}


/* Room for n tokens in a batch and its per-token request table. */
static int
batch_reserve(nalar_batch *b, nalar_request ***req, int32_t *cap, int32_t n)
{
    if (n <= *cap) {
        return 0;
    }
#define GROW(p) do {                                                        \
        void *q_ = realloc(p, (size_t) n * sizeof(*(p)));                   \
        if (q_ == NULL) return -1;                                          \
        p = q_;                                                             \
    } while (0)
    GROW(b->tokens);
    GROW(b->pos);
    GROW(b->seq);
    GROW(b->want_logits);
    GROW(*req);
#undef GROW
    *cap = n;
    return 0;
}


static int
batch_grow(nalar_engine *e, int32_t n)
{
    return batch_reserve(&e->batch, &e->batch_req, &e->batch_cap, n);
}


/*
 * Confirm one token of r: append it, update penalties, metrics and output,
 * and finish r on EOS / stop token / stop string / max_tokens.  Returns 1
 * when r finished.  Every token a client sees went through here.
 */
static int
confirm_token(nalar_engine *e, nalar_request *r, int32_t id,
              const nalar_logprob *lp, double t)
{
    char        piece[256];
    const char *safe;
    int         n, stopped = 0, is_stop = 0;
    size_t      ns;

    nalar_sampler_accept(&r->sampler, id);
    r->tokens[r->n_tokens++] = id;
    r->n_generated++;
    if (r->gm != NULL && nalar_gmatcher_accept(r->gm, id) != 0) {
        /* the mask let it through, so this is a bug; say so */
        request_finish(e, r, NALAR_FINISH_ERROR, "the grammar refused a "
                       "sampled token");
        return 1;
    }

    pthread_mutex_lock(&e->mu);
    e->m.generation_tokens_total++;
    if (r->n_generated == 1) {
        hist_add(e->m.ttft_buckets, &e->m.ttft_sum, &e->m.ttft_count,
                 t - r->t_submit);
    } else {
        hist_add(e->m.itl_buckets, &e->m.itl_sum, &e->m.itl_count,
                 t - r->t_last);
    }
    pthread_mutex_unlock(&e->mu);
    if (r->n_generated == 1) {
        r->t_first = t;
        pthread_mutex_lock(&r->mu);
        r->ttft_ms = (t - r->t_submit) * 1e3;
        pthread_mutex_unlock(&r->mu);
    }
    r->t_last = t;

    if (!r->p.ignore_eos && nalar_tok_is_eog(e->model->tok, id)) {
        is_stop = 1;
    }
    for (int i = 0; i < r->p.n_stop_ids; i++) {
        is_stop |= r->stop_ids[i] == id;
    }
    if (is_stop) {
        /* the stop token itself is confirmed but not shown as text */
        push_output(r, "", 0, id, lp);
        request_finish(e, r, NALAR_FINISH_STOP, NULL);
        return 1;
    }
    n = nalar_detok_feed(&r->detok, id, piece, sizeof(piece));
    if (n < 0) {
        n = 0;
    }
    ns = nalar_stop_feed(r->stop, piece, (size_t) n, &safe, &stopped);
    push_output(r, safe, ns, id, lp);
    if (stopped) {
        request_finish(e, r, NALAR_FINISH_STOP, NULL);
        return 1;
    }
    if (r->n_generated >= r->max_tokens || r->n_tokens >= r->cap_tokens
        || (r->gm != NULL && nalar_gmatcher_done(r->gm)))
    {
        n = nalar_detok_flush(&r->detok, piece, sizeof(piece));
        if (n > 0) {
            ns = nalar_stop_feed(r->stop, piece, (size_t) n, &safe,
                                 &stopped);
            push_output(r, safe, ns, -1, NULL);
        }
        request_finish(e, r, stopped || (r->gm != NULL
                                         && nalar_gmatcher_done(r->gm))
                             ? NALAR_FINISH_STOP : NALAR_FINISH_LENGTH,
                       NULL);
        return 1;
    }
    return 0;
}


static void position_rng(nalar_request *r);


/*
 * Whether r's next tokens are the argmax of its logits and nothing more is
 * wanted of them: greedy, no penalty moving the logits, no logprobs.  (The
 * sampler's greedy pick and nalar_argmax agree on every row of finite
 * logits; on rows holding infinities they may pick different ones of the
 * tied extremes.)
 */
static int
greedy_plain(const nalar_request *r)
{
    const nalar_sampling *s = &r->sampler.p;

    return !(s->temperature > 0.0f) && s->presence_penalty == 0.0f
           && s->frequency_penalty == 0.0f && s->n_bias == 0
           && !r->p.logprobs && r->gm == NULL;
}


/*
 * Structured output: the tokens r's grammar does not allow next get a logit
 * of -inf, so every transform of the sampler (bias, penalties, temperature,
 * top-k/p, min-p) works on the model's distribution restricted to the
 * grammar, renormalised.  -1 (r finished with an error) when the grammar
 * allows nothing.
 */
static int
grammar_mask_row(nalar_engine *e, nalar_request *r, float *row)
{
    const uint32_t *mask;
    double          t0 = nalar_now_s(), ms;
    int32_t         V = e->model->cfg.n_vocab, any = 0;

    mask = nalar_gmatcher_mask(r->gm, &ms);
    if (mask != NULL) {
        for (int32_t w = 0; w * 32 < V; w++) {
            uint32_t m = mask[w];
            int32_t  end = (w + 1) * 32 < V ? (w + 1) * 32 : V;

            any |= m != 0;
            if (m == 0xffffffffu) {
                continue;
            }
            for (int32_t i = w * 32; i < end; i++) {
                if (!(m >> (i & 31) & 1)) {
                    row[i] = -INFINITY;
                }
            }
        }
    }
    pthread_mutex_lock(&e->mu);
    e->m.grammar_mask_seconds_total += nalar_now_s() - t0;
    e->m.grammar_masks_total++;
    e->m.grammar_mask_build_seconds_total += ms;
    pthread_mutex_unlock(&e->mu);
    if (!any) {
        request_finish(e, r, NALAR_FINISH_ERROR, mask == NULL
                       ? "out of memory" : "the grammar allows no token");
        return -1;
    }
    return 0;
}


/* Sample r's next token from its logits row (or take the backend's argmax
 * of it, `given`, for a greedy_plain request) and confirm it. */
static void
emit_token(nalar_engine *e, nalar_request *r, float *row,
           const int32_t *given, double t)
{
    nalar_logprob lp[21];
    int32_t       id;

    if (r->gm != NULL && given == NULL
        && grammar_mask_row(e, r, row) != 0)
    {
        return;
    }
    position_rng(r);
    id = given != NULL ? *given
                       : nalar_sample(&r->sampler, row,
                                      r->p.logprobs ? lp : NULL);
    if (!confirm_token(e, r, id, r->p.logprobs ? lp : NULL, t)
        && r->notify != NULL)
    {
        r->notify(r, r->notify_ctx);
    }
}


/*
 * The randomness of output position i is a function of (seed, i) alone, so
 * a seeded request gives the same tokens however its positions were
 * batched, chunked or speculated.
 */
static void
position_rng(nalar_request *r)
{
    nalar_rng_seed(&r->sampler.rng, r->p.sampling.seed
                   + 0x9E3779B97F4A7C15ull * (uint64_t) (r->n_generated + 1));
}


/*
 * Verify r's proposals against the target's logits rows[0..n_prop] (row i
 * follows the token at position p + i, p = position of the last confirmed
 * token) and confirm what survives.  At each row the target's own token is
 * drawn exactly as plain decoding would draw it (same transforms, same
 * position-keyed randomness; argmax when greedy); the proposal is accepted
 * when it equals that token, and the first differing draw is confirmed in
 * its place.  Proposals are point masses, so this is lossless speculative
 * sampling: acceptance probability p(x) = min(1, p(x)/q(x)) with q(x) = 1,
 * and a rejected position yields a draw from p without x, renormalised --
 * max(0, p - q) normalised.  With `given` (a greedy_plain request whose
 * rows the backend reduced to their argmax) the draws are given[0..n_prop].
 * Returns the number of proposals accepted.
 */
static int32_t
verify(nalar_engine *e, nalar_request *r, float *rows, const int32_t *given,
       double t)
{
    int32_t        V = e->model->cfg.n_vocab, k = r->n_prop, accepted = 0;
    nalar_logprob  lpbuf[21];
    nalar_logprob *lp = r->p.logprobs ? lpbuf : NULL;

    for (int32_t i = 0; i <= k; i++) {
        int32_t id;

        /* the grammar's state follows the tokens confirmed so far, which
         * are the proposals before row i */
        if (r->gm != NULL && given == NULL
            && grammar_mask_row(e, r, rows + (size_t) i * V) != 0)
        {
            break;
        }
        position_rng(r);
        id = given != NULL ? given[i]
                           : nalar_sample(&r->sampler, rows + (size_t) i * V,
                                          lp);
        if (i < k && id == r->props[i]) {
            accepted++;
            if (confirm_token(e, r, id, lp, t)) {
                break;
            }
            continue;
        }
        /* the target's own token: after the last proposal, or in place of
         * the first rejected one */
        confirm_token(e, r, id, lp, t);
        break;
    }
    return accepted;
}


#define PRED_TAIL   3    /* output tokens that re-anchor the alignment */
#define PRED_REACH  32   /* farthest shift a nearby tail match explains,
                            and the longest changed span it outlasts */

/*
 * The client's prediction: the output should run along it.  r->pred_off is
 * the alignment (prediction index - output index); returns the prediction
 * index the next output token should be, or -1 when the output's tail is
 * nowhere in the prediction.
 *
 * Edits the client did not foresee show up as mismatches at the current
 * alignment, newest first:
 *   - fewer than PRED_TAIL in a row: substituted tokens (a renamed
 *     identifier); the alignment holds;
 *   - more: either the text shifted (an insertion or a deletion), and the
 *     output's last PRED_TAIL tokens occur again in the prediction within
 *     PRED_REACH of the alignment -- it moves there -- or a whole phrase
 *     was rewritten: the alignment holds, and once the phrase ends (up to
 *     PRED_REACH tokens) the output runs along the prediction again where
 *     it was.  Where the tail recurs nearby (repetitive text: a rewritten
 *     phrase's own tokens recur a period away), the nearest occurrence
 *     ahead wins: moving back would meet the same edit again, step after
 *     step, where moving ahead skips it;
 *   - more than PRED_REACH: the output left the prediction; the alignment
 *     moves to the tail's nearest occurrence anywhere, or there is none.
 * A move needs PRED_TAIL matching tokens: a shorter tail recurs
 * everywhere.
 */
static int32_t
pred_align(nalar_request *r)
{
    const int32_t *out = r->tokens + r->p.n_prompt, *pred = r->pred;
    int32_t        g = r->n_generated, at = g + r->pred_off;
    int32_t        run = 0, tail = g < PRED_TAIL ? g : PRED_TAIL;
    int32_t        best = -1, ahead = -1;

    /* newest output tokens that differ from the prediction where aligned */
    while (run < g && run <= PRED_REACH
           && (at - 1 - run < 0 || at - 1 - run >= r->n_pred
               || out[g - 1 - run] != pred[at - 1 - run]))
    {
        run++;
    }
    if (run < PRED_TAIL && at >= 0 && at <= r->n_pred) {
        return at;
    }
    /* the tail's occurrences: within PRED_REACH of the alignment (a
     * shift: the nearest one ahead, else the nearest), or anywhere once
     * the output has left the prediction (the nearest) */
    for (int32_t s = 0; tail > 0 && s + tail <= r->n_pred; s++) {
        int32_t to = s + tail;

        if ((run <= PRED_REACH && labs((long) (to - at)) > PRED_REACH)
            || memcmp(pred + s, out + g - tail,
                      (size_t) tail * sizeof(int32_t)) != 0)
        {
            continue;
        }
        if (to > at) {
            ahead = ahead < 0 || to < ahead ? to : ahead;
        }
        if (best < 0 || labs((long) (to - at)) < labs((long) (best - at))) {
            best = to;
        }
    }
    best = run <= PRED_REACH && ahead >= 0 ? ahead : best;
    if (best >= 0) {
        r->pred_off = best - g;
        return best;
    }
    return run <= PRED_REACH && at >= 0 && at <= r->n_pred ? at : -1;
}


/* Context-free proposals: n-gram lookup over the sequence so far, or the
 * client's prediction.  Returns the number proposed (<= k). */
static int32_t
propose_lookup(nalar_request *r, int32_t k)
{
    int32_t at, n;

    if (r->prop_now == NALAR_PROP_NGRAM) {
        return nalar_ngram_propose(r->tokens, r->n_tokens, r->tokens,
                                   r->n_tokens, 1, 3, k, r->props);
    }
    at = pred_align(r);
    if (at < 0) {
        return 0;
    }
    n = r->n_pred - at < k ? r->n_pred - at : k;
    memcpy(r->props, r->pred + at, (size_t) (n > 0 ? n : 0)
                                   * sizeof(int32_t));
    return n > 0 ? n : 0;
}


/* The acceptance estimates of r's proposer this step. */
static nalar_accept_stats *
acc_now(nalar_request *r)
{
    return r->prop_now == r->prop ? &r->acc : &r->acc_ngram;
}


/* The gate's mix of this step: the bits of the decoding requests' current
 * proposers; with `ngram`, as if those that may fall back to n-gram lookup
 * (auto with a draft) did.  Requests at a `fixed` location are left out:
 * they speculate whatever the gate says, and set *any_fixed. */
static unsigned
step_mix(nalar_engine *e, int ngram, int *any_fixed)
{
    unsigned mix = 0;

    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];

        if (r->prop == NALAR_PROP_NONE || r->n_tokens - r->n_computed != 1) {
            continue;
        }
        if (r->p.spec_fixed) {
            *any_fixed = 1;
            continue;
        }
        mix |= ngram && r->ngram_fallback
               ? nalar_spec_gate_bit(NALAR_PROP_NGRAM, 0)
               : nalar_spec_gate_bit(r->prop_now, acc_now(r)->alpha[0]);
    }
    return mix;
}


/* A draft that must first catch up on more tokens than this (decoded
 * while it was not used) is cold: the gate does not count the catch-up
 * (see its record in engine_step), and choose_k weighs it. */
#define DRAFT_WARM 9


/*
 * Would r's cold draft repay its catch-up?  Yes when what is left of the
 * request (at most), decoded at `gain` over plain decoding (plain_tok:
 * r's share of a plain pass), saves more time than the draft takes to
 * catch up.  (For example, 16 streams draining to 5: a step's
 * catch-up of 10.8 ms -- 35 plain steps -- for requests with a few dozen
 * tokens left; catch-ups took 6% of the run.)
 */
static int
catchup_repays(nalar_engine *e, const nalar_request *r, double plain_tok,
               double gain)
{
    int32_t left = r->max_tokens - r->n_generated;
    double  cost = nalar_cost_estimate(&e->draft_cost,
                                       r->n_tokens - r->d_computed);

    return cost < 0 || left * plain_tok * (1 - 1 / gain) > cost;
}


/* How many tokens r should propose this step (0: plain decode); *probe
 * set when that k is a probe's (below), else left alone. */
static int32_t
choose_k(nalar_engine *e, nalar_request *r, int32_t n_decode,
         int32_t n_prefill, int32_t n_draft, int *probe)
{
    int32_t cap = r->spec_k_max, k;
    double  verify[NALAR_SPEC_MAX_K + 1], draft_tok = 0, gain;
    int     known = 1;
    nalar_accept_stats acc;

    /* never propose past max_tokens or the context */
    if (cap > r->max_tokens - r->n_generated - 1) {
        cap = r->max_tokens - r->n_generated - 1;
    }
    if (cap > r->cap_tokens - r->n_tokens) {
        cap = r->cap_tokens - r->n_tokens;
    }
    if (cap <= 0) {
        return 0;
    }
    if (e->opts.spec_fixed_k > 0 || r->p.spec_fixed) {
        return cap;
    }
    /* this request's share of a pass in which each of the n_decode
     * sequences verifies k proposals, next to n_prefill prompt tokens */
    for (int32_t j = 0; j <= cap; j++) {
        double tt = nalar_cost_estimate(&e->target_cost,
                                        n_prefill + n_decode * (1 + j));
        if (tt < 0) {
            known = 0;
            break;
        }
        verify[j] = tt / n_decode;
    }
    if (r->prop_now == NALAR_PROP_DRAFT) {
        double td = nalar_cost_estimate(&e->draft_cost,
                                        n_draft > 0 ? n_draft : 1);
        if (td < 0) {
            known = 0;
        } else {
            draft_tok = td / (n_draft > 0 ? n_draft : 1);
        }
    }
    if (!known) {
        /* measure before deciding: one request a step, as a probe (at 16
         * streams, every request's first draft catching up at once took
         * 3 ms, ten plain steps) */
        if (*probe) {
            return 0;
        }
        *probe = 1;
        return cap < 2 ? cap : 2;
    }
    if (r->prop_now == NALAR_PROP_PREDICTION) {
        acc = *acc_now(r);    /* one client's predictions: its own */
    } else {
        nalar_accept_blend(&acc, acc_now(r), &e->prop_acc[r->prop_now],
                           ACC_PRIOR_WEIGHT);
    }
    k = nalar_spec_choose_k(&acc, cap, verify, draft_tok, 1.03, &gain);
    if (k > 0 && r->prop_now == NALAR_PROP_DRAFT
        && r->n_tokens - r->d_computed > DRAFT_WARM)
    {
        /* a catch-up is repaid by the decode steps after this one, which
         * have no prompt tokens to make verification cheap.  The gain is
         * the larger of the model's and the one the gate measures for the
         * draft at this batch size: the model's alone sits near its
         * margin just when it turns k back on, so it would refuse
         * catch-ups ever longer as the draft fell further behind */
        double  g = gain, gm = nalar_spec_gate_ratio(
                                  &e->gate, n_decode,
                                  nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0));
        double  decode[NALAR_SPEC_MAX_K + 1], *d = verify;

        if (n_prefill > 0) {
            /* the same passes without the prompt tokens */
            for (int32_t j = 0; j <= cap; j++) {
                double tt = nalar_cost_estimate(&e->target_cost,
                                                n_decode * (1 + j));

                decode[j] = (tt > 0 ? tt : 0) / n_decode;
            }
            d = decode;
            nalar_spec_choose_k(&acc, cap, decode, draft_tok, 1.03, &g);
        }
        g = gm > g ? gm : g;
        if (!catchup_repays(e, r, d[0], g)) {
            k = 0;
        }
    }
    if (k == 0 && ++r->since_spec >= 16 && !*probe
        && nalar_probe_allow(&e->probe_pace))
    {
        /* probe now and then, alternating a short and a full proposal, so
         * both the acceptance estimates and the cost of larger passes stay
         * current (a cost measured once on a busy machine would otherwise
         * keep speculation off for good); one request a step, as the
         * engine's probe budget allows */
        r->since_spec = 0;
        r->probes++;
        *probe = 1;
        k = r->probes % 2 ? 1 : cap;
    } else if (k > 0) {
        /* now and then a neighbouring k, to keep its cost measured */
        k = nalar_spec_neighbour_k(k, cap, ++r->spec_steps);
    }
    if (k > 0) {
        r->since_spec = 0;
    }
    return k;
}


static int
dbatch_grow(nalar_engine *e, int32_t n)
{
    return batch_reserve(&e->dbatch, &e->dbatch_req, &e->dbatch_cap, n);
}


/*
 * Draft proposals for the requests in reqs[0..n) (each wants n_prop
 * tokens): the first pass brings the draft's KV up to the last confirmed
 * token (catch-up), later passes feed the previous proposal.  A request
 * whose draft KV cannot be reserved proposes nothing this step.  Returns
 * the seconds a cold draft's catch-up took beyond an ordinary pass (its
 * first pass beyond the measured cost of a pass of one token per
 * request), else 0.
 */
static double
draft_propose(nalar_engine *e, nalar_request **reqs, int32_t n)
{
    int32_t     V = e->model->cfg.n_vocab, kmax = 0;
    nalar_batch *b = &e->dbatch;
    nalar_err   err;
    double      t0 = nalar_now_s(), first_s = 0, plain_s;
    int         cold = 0;

    for (int32_t i = 0; i < n; i++) {
        kmax = reqs[i]->n_prop > kmax ? reqs[i]->n_prop : kmax;
        cold |= reqs[i]->n_tokens - reqs[i]->d_computed > DRAFT_WARM;
    }
    if (e->dlogits == NULL) {
        e->dlogits = nalar_alloc_lines((size_t) e->opts.max_running * V
                                       * sizeof(float));
        if (e->dlogits == NULL) {
            for (int32_t i = 0; i < n; i++) reqs[i]->n_prop = 0;
            return 0;
        }
    }
    for (int32_t s = 0; s < kmax; s++) {
        int32_t nt = 0, nl = 0;
        double  ts = nalar_now_s();

        for (int32_t i = 0; i < n; i++) {
            nalar_request *r = reqs[i];
            int32_t        from, to;

            if (s >= r->n_prop) {
                continue;
            }
            /* positions fed: catch-up [d_computed, n_tokens) first, then
             * proposal s-1 at n_tokens - 1 + s */
            from = s == 0 ? r->d_computed : r->n_tokens - 1 + s;
            to = r->n_tokens + s;
            if (dbatch_grow(e, nt + (to - from)) != 0
                || nalar_seq_kv_reserve(&e->dkv, &r->dkv, to) != 0)
            {
                r->n_prop = s;   /* propose what we have */
                continue;
            }
            for (int32_t p = from; p < to; p++) {
                b->tokens[nt] = p < r->n_tokens ? r->tokens[p]
                                                : r->props[p - r->n_tokens];
                b->pos[nt] = p;
                b->seq[nt] = &r->dkv;
                b->want_logits[nt] = p == to - 1;
                e->dbatch_req[nt] = r;
                nt++;
            }
            nl++;
        }
        if (nt == 0) {
            break;
        }
        b->n_tokens = nt;
        b->n_logits = nl;
        if (e->draft_be->forward(e->draft_be, &e->dkv, b, e->dlogits, &err)
            != 0)
        {
            for (int32_t i = 0; i < n; i++) {
                if (reqs[i]->n_prop > s) reqs[i]->n_prop = s;
            }
            break;
        }
        ts = nalar_now_s() - ts;
        nalar_cost_record(&e->draft_cost, nt, ts);
        if (s == 0) {
            first_s = ts;
        }
        for (int32_t k = 0, li = 0; k < nt; k++) {
            nalar_request *r = e->dbatch_req[k];
            float         *row;

            if (!b->want_logits[k]) {
                continue;
            }
            row = e->dlogits + (size_t) li++ * V;
            r->d_computed = b->pos[k] + 1;
            r->dkv.n_pos = r->d_computed;
            /* the draft proposes its most likely token: a point-mass
             * proposal, verified by sampling the target (see verify) */
            r->props[s] = nalar_argmax(row, V);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_draft_seconds_total += nalar_now_s() - t0;
    pthread_mutex_unlock(&e->mu);
    /* a cold draft's first pass beyond an ordinary pass of one token per
     * request (as measured): the catch-up */
    plain_s = nalar_cost_estimate(&e->draft_cost, n);
    return cold && plain_s > 0 && first_s > plain_s ? first_s - plain_s : 0;
}


/*
 * auto with a draft: should this step's draft requests propose by n-gram
 * lookup instead?  Yes where the gate holds the draft back; otherwise by
 * the gate's measured rates of the two mixes: the faster one, the other
 * one step in 64 to keep its rate current (n-gram lookup one step in 8
 * until its rate is known).  A draft still without a rate of its own
 * counts as plain decoding, which the lookup must beat by the gate's
 * margin: a draft whose cost model keeps choosing k = 0 never gets a
 * rate, and its steps are plain ones (otherwise a random-weights draft
 * holds auto to 0.93-0.99x of plain decoding, the lookup standing in one
 * step in 8 and then never, where the lookup alone runs at 1.27x).  Text
 * that repeats itself favours the lookup, free text the draft.
 */
static int
prefer_ngram(nalar_engine *e, int32_t n_decode, unsigned mix,
             int draft_allowed)
{
    unsigned k = e->fallback_steps++;
    double   rd, rn;
    int      any_fixed;

    if (!draft_allowed) {
        return 1;
    }
    rd = nalar_spec_gate_ratio(&e->gate, n_decode, mix);
    rn = nalar_spec_gate_ratio(&e->gate, n_decode,
                               step_mix(e, 1, &any_fixed));
    if (rn < 0) {
        return k % 8 == 0;
    }
    if (rd < 0) {
        rd = NALAR_GATE_MARGIN;     /* plain, which a win must beat by as
                                       much */
    }
    return rn > rd ? k % 64 != 0 : k % 64 == 0;
}


/*
 * A client's prediction the step gate does not veto: its first PRED_FRESH
 * verifications.  The gate's rates are of other requests' predictions, and
 * say nothing of this client's; its own verifications (choose_k prices
 * them by its acceptance alone) decide after that, and their steps feed
 * the gate fresh readings.  Otherwise, with a busy loop on one of 2 cores,
 * a few slow readings could hold every later prediction back for good
 * (exact predictions would then accept nothing).
 */
#define PRED_FRESH 4

static int
pred_fresh(const nalar_request *r)
{
    return r->prop_now == NALAR_PROP_PREDICTION
           && r->acc.seen[0] < PRED_FRESH;
}


/* Count of blocks held only for provisional positions of r. */
static int32_t
provisional_blocks(const nalar_request *r)
{
    int32_t confirmed = (r->n_computed + 1 + NALAR_KV_BLOCK - 1)
                        / NALAR_KV_BLOCK;

    return r->kv.n_blocks > confirmed ? r->kv.n_blocks - confirmed : 0;
}


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
    double   t_start;       /* when the step began */
    double   t_pass;        /* when its forward pass ended */
} step_plan;


/* Cancelled requests leave first: their blocks go back to the pool. */
static void
step_drop_cancelled(nalar_engine *e)
{
    for (int32_t i = 0; i < e->n_running; ) {
        nalar_request *r = e->running[i];

        if (__atomic_load_n(&r->cancelled, __ATOMIC_ACQUIRE)) {
            running_remove(e, i);
            finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
            continue;
        }
        i++;
    }
}


/* Admission, FCFS: the head waits until its whole context fits. */
static void
step_admit(nalar_engine *e)
{
    for ( ;; ) {
        nalar_request *r;
        int32_t        need, reserved = 0;

        pthread_mutex_lock(&e->mu);
        r = e->wait_head;
        if (r != NULL && __atomic_load_n(&r->cancelled, __ATOMIC_ACQUIRE)) {
            e->wait_head = r->next;
            if (e->wait_head == NULL) {
                e->wait_tail = NULL;
            }
            e->n_waiting--;
            pthread_mutex_unlock(&e->mu);
            finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
            continue;
        }
        if (r == NULL || e->n_running >= e->opts.max_running) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        need = ((r->n_tokens > 0 ? r->n_tokens : r->p.n_prompt) + 1
                + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
        /* leave one block per running sequence for its next decode */
        reserved = e->n_running;
        if (need + reserved > kv_available(e) && e->n_running > 0) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        e->wait_head = r->next;
        if (e->wait_head == NULL) {
            e->wait_tail = NULL;
        }
        e->n_waiting--;
        pthread_mutex_unlock(&e->mu);
        if (r->tokens == NULL && request_start(e, r) != 0) {
            finish_unref(e, r, NALAR_FINISH_ERROR, "out of memory");
            continue;
        }
        cache_match(e, r);
        r->admitted_once = 1;
        r->state = REQ_RUNNING;
        e->running[e->n_running++] = r;
    }
}


/*
 * Structured output: where r's grammar allows one continuation only, its
 * tokens (nalar_gmatcher_forced) are this step's proposals, with n-gram
 * lookup's after them where r looks up; they bypass the cost model and the
 * gate (verifying them is one pass for tokens that are all but certain to
 * be accepted).  Verification masks each row with the grammar's state after
 * the tokens confirmed before it (verify), so a proposal the model would
 * not sample is rejected as any other is.  1 when r proposes so.
 */
static int
grammar_propose(nalar_engine *e, nalar_request *r)
{
    int32_t cap = NALAR_SPEC_MAX_K, nf, n;

    if (cap > r->max_tokens - r->n_generated - 1) {
        cap = r->max_tokens - r->n_generated - 1;
    }
    if (cap > r->cap_tokens - r->n_tokens) {
        cap = r->cap_tokens - r->n_tokens;
    }
    if (cap <= 0) {
        return 0;
    }
    nf = nalar_gmatcher_forced(r->gm, r->props, cap);
    if (nf <= 0) {
        return 0;
    }
    n = nf;
    if (nf < cap && (r->prop == NALAR_PROP_NGRAM || r->ngram_fallback)) {
        /* the tokens after the sequence are scratch until confirmed */
        memcpy(r->tokens + r->n_tokens, r->props,
               (size_t) nf * sizeof(int32_t));
        n += nalar_ngram_propose(r->tokens, r->n_tokens + nf, r->tokens,
                                 r->n_tokens + nf, 1, 3, cap - nf,
                                 r->props + nf);
    }
    r->n_prop = n;
    r->n_forced = nf;
    if (r->prop_now == NALAR_PROP_DRAFT) {
        /* the draft's KV catches up when it is next used */
        r->prop_now = NALAR_PROP_NGRAM;
    }
    pthread_mutex_lock(&e->mu);
    e->m.grammar_forced_tokens_total += (uint64_t) nf;
    pthread_mutex_unlock(&e->mu);
    return 1;
}


/*
 * Plan speculation: how many decodes and prompt tokens this step has, then
 * each speculating request's k from the cost model (under the step gate),
 * and the draft's proposals.
 */
static void
step_plan_speculation(nalar_engine *e, step_plan *sp)
{
    int32_t        budget = e->opts.max_batch_tokens, n_dreq = 0;
    int            may_speculate = 1;
    nalar_request *dreqs[256];

    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];
        int32_t        todo = r->n_tokens - r->n_computed;

        r->n_prop = 0;
        if (todo == 1) {
            sp->n_decode++;
        } else {
            sp->n_prefill += todo;
        }
    }
    if (sp->n_prefill > budget - sp->n_decode) {
        sp->n_prefill = budget - sp->n_decode;
    }
    sp->n_prefill = sp->n_prefill > 0 ? sp->n_prefill : 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        e->running[i]->prop_now = e->running[i]->prop;
    }
    sp->mix = step_mix(e, 0, &sp->any_fixed);
    /* the gate vetoes speculation where whole steps measured slower with
     * it; fixed k (benchmarks) bypasses it */
    if (sp->mix != 0 && e->opts.spec_fixed_k <= 0) {
        may_speculate = nalar_spec_gate_allow(&e->gate, sp->n_decode, sp->mix);
        if ((sp->mix & nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0)) != 0
            && prefer_ngram(e, sp->n_decode, sp->mix, may_speculate))
        {
            /* auto with a draft: n-gram lookup (free to propose) stands in
             * for the draft, judged by the gate as a mix of its own; the
             * draft's KV catches up when the draft is next used */
            int any = 0;

            for (int32_t i = 0; i < e->n_running; i++) {
                nalar_request *r = e->running[i];

                if (r->ngram_fallback && !r->p.spec_fixed
                    && r->n_tokens - r->n_computed == 1)
                {
                    r->prop_now = NALAR_PROP_NGRAM;
                    any = 1;
                }
            }
            if (any) {
                sp->mix = step_mix(e, 0, &sp->any_fixed);
                may_speculate = nalar_spec_gate_allow(&e->gate, sp->n_decode,
                                                      sp->mix);
            }
        }
    }
    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];

        r->n_forced = 0;
        if (r->gm != NULL && r->prop != NALAR_PROP_NONE
            && r->n_tokens - r->n_computed == 1 && grammar_propose(e, r))
        {
            /* not a step the gate should learn from */
            sp->any_fixed = 1;
            continue;
        }
        if (r->prop == NALAR_PROP_NONE || r->n_tokens - r->n_computed != 1
            || (!may_speculate && !r->p.spec_fixed && !pred_fresh(r)))
        {
            continue;
        }
        r->n_prop = choose_k(e, r, sp->n_decode, sp->n_prefill,
                             r->prop_now == NALAR_PROP_DRAFT
                             ? sp->n_decode : 0, &sp->any_probe);
        if (r->n_prop > 0 && r->prop_now != NALAR_PROP_DRAFT) {
            r->n_prop = propose_lookup(r, r->n_prop);
        } else if (r->n_prop > 0 && n_dreq < 256) {
            dreqs[n_dreq++] = r;
        } else {
            r->n_prop = 0;
        }
    }
    if (n_dreq > 0) {
        sp->catchup_s = draft_propose(e, dreqs, n_dreq);
    }
}


/*
 * Reserve KV for this step's tokens and batch them: decodes (1 token plus
 * proposals, at provisional positions) first, then prefill chunks in
 * admission order while the token budget lasts.  sp->n_tok may come out 0
 * (every request preempted or finished).
 */
static void
step_build_batch(nalar_engine *e, step_plan *sp)
{
    nalar_batch *b = &e->batch;
    int32_t      budget = e->opts.max_batch_tokens;

    sp->n_tok = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < e->n_running; i++) {
            nalar_request *r = e->running[i];
            int32_t        todo = r->n_tokens - r->n_computed;
            int32_t        n;

            if ((pass == 0) != (todo == 1)) {
                continue;
            }
            n = todo + r->n_prop;
            if (pass == 1) {
                if (budget <= 0) {
                    break;
                }
                n = todo < budget ? todo : budget;
            }
            while (kv_reserve(e, r, r->n_computed + n) != 0) {
                if (r->n_prop > 0) {
                    /* speculation is the first thing to give up */
                    n -= r->n_prop;
                    r->n_prop = 0;
                    continue;
                }
                if (e->running[e->n_running - 1] == r) {
                    break;
                }
                preempt_last(e);
            }
            if (r->kv.n_blocks * NALAR_KV_BLOCK < r->n_computed + n) {
                /* r itself is the newest: preempt it unless it is alone */
                if (e->n_running > 1) {
                    preempt_last(e);
                    break;
                }
                running_remove(e, i);
                finish_unref(e, r, NALAR_FINISH_ERROR,
                             "the KV cache is too small for this request");
                break;
            }
            for (int32_t k = 0; k < n; k++) {
                int32_t p = r->n_computed + k;
                int     last = p >= r->n_tokens - 1;

                b->tokens[sp->n_tok] = p < r->n_tokens ? r->tokens[p]
                                   : r->props[p - r->n_tokens];
                b->pos[sp->n_tok] = p;
                b->seq[sp->n_tok] = &r->kv;
                b->want_logits[sp->n_tok] = last;
                e->batch_req[sp->n_tok] = r;
                sp->n_tok++;
            }
            if (r->n_prop > 0) {
                sp->n_spec++;
                sp->provisional += provisional_blocks(r);
            }
            budget -= n;
        }
    }
    /* a preemption may have dropped requests whose tokens are batched */
    {
        int32_t w = 0;

        sp->n_logits = 0;
        for (int32_t k = 0; k < sp->n_tok; k++) {
            nalar_request *r = e->batch_req[k];

            if (r->state != REQ_RUNNING) {
                continue;
            }
            b->tokens[w] = b->tokens[k];
            b->pos[w] = b->pos[k];
            b->seq[w] = b->seq[k];
            b->want_logits[w] = b->want_logits[k];
            sp->n_logits += b->want_logits[k];
            e->batch_req[w++] = r;
        }
        sp->n_tok = w;
    }
    if (sp->n_tok == 0) {
        return;
    }
    /* a probe's step: its tokens but for proposals, what it would have
     * cost without the probe */
    if (sp->any_probe) {
        sp->n_unprop = sp->n_tok;
        for (int32_t i = 0; i < e->n_running; i++) {
            sp->n_unprop -= e->running[i]->n_prop;
        }
    }
    b->n_tokens = sp->n_tok;
    b->n_logits = sp->n_logits;
}


/*
 * The forward pass over the batch, timed into the target's cost table.
 * Returns -1 with err when out of memory for the logits, or on a backend
 * failure.
 */
static int
step_forward(nalar_engine *e, step_plan *sp, nalar_err *err)
{
    nalar_batch *b = &e->batch;
    int32_t      V = e->model->cfg.n_vocab;
    double       t, t0;

    if (sp->n_logits > e->logits_cap) {
        /* rows the backend's threads split: on cache lines; a step's
         * logits are written before they are read, so no copy */
        float *l = test_fault(e, NALAR_FAULT_LOGITS) ? NULL
                   : nalar_alloc_lines((size_t) sp->n_logits * V
                                       * sizeof(float));
        if (l == NULL) {
            return nalar_fail(err, "engine: out of memory for %d logit "
                              "rows", sp->n_logits);
        }
        free(e->logits);
        e->logits = l;
        e->logits_cap = sp->n_logits;
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = sp->provisional;
    pthread_mutex_unlock(&e->mu);

    /* every row greedy and plain: the backend's argmax, when it has one */
    sp->use_ids = e->be->forward_argmax != NULL
                  && sp->n_logits > 0;
    for (int32_t k = 0; k < sp->n_tok && sp->use_ids; k++) {
        sp->use_ids = !b->want_logits[k] || greedy_plain(e->batch_req[k]);
    }
    if (sp->use_ids && sp->n_logits > e->ids_cap) {
        int32_t *ids = malloc((size_t) sp->n_logits * sizeof(int32_t));

        if (ids == NULL) {
            sp->use_ids = 0;
        } else {
            free(e->ids);
            e->ids = ids;
            e->ids_cap = sp->n_logits;
        }
    }

    t0 = nalar_now_s();
    if (test_fault(e, NALAR_FAULT_FORWARD)
        ? nalar_fail(err, "backend: injected failure") != 0
        : sp->use_ids
        ? e->be->forward_argmax(e->be, &e->kv, b, e->ids, e->logits, err)
          != 0
        : e->be->forward(e->be, &e->kv, b, e->logits, err) != 0)
    {
        return -1;
    }
    t = nalar_now_s();
    nalar_cost_record(&e->target_cost, sp->n_tok, t - t0);

    pthread_mutex_lock(&e->mu);
    e->m.steps_total++;
    e->m.argmax_steps_total += sp->use_ids != 0;
    if (sp->n_spec > 0) {
        e->m.spec_verify_seconds_total += t - t0;
    }
    pthread_mutex_unlock(&e->mu);
    sp->t_pass = t;
    return 0;
}


/*
 * Advance: KV covers the batched positions; sample or verify where there
 * are logits (a request's rows are consecutive); finished requests leave.
 */
static void
step_advance(nalar_engine *e, step_plan *sp)
{
    nalar_batch *b = &e->batch;
    int32_t      V = e->model->cfg.n_vocab;
    int          use_ids = sp->use_ids;
    double       t = sp->t_pass;
    int32_t      li = 0;

    for (int32_t k = 0; k < sp->n_tok; k++) {
        nalar_request *r = e->batch_req[k];
        int32_t        p0, accepted, kprop;

        if (!b->want_logits[k]) {
            r->n_computed = b->pos[k] + 1;
            r->kv.n_pos = r->n_computed;
            continue;
        }
        if (r->n_generated == 0) {
            pthread_mutex_lock(&e->mu);
            e->m.prompt_tokens_total += (uint64_t) r->p.n_prompt;
            pthread_mutex_unlock(&e->mu);
        }
        if (r->n_prop == 0) {
            r->n_computed = b->pos[k] + 1;
            r->kv.n_pos = r->n_computed;
            /* every computed position holds a confirmed token */
            cache_publish(e, r, r->n_computed);
            emit_token(e, r, use_ids ? NULL : e->logits + (size_t) li * V,
                       use_ids ? e->ids + li : NULL, t);
            li++;
            sp->n_confirmed++;
            continue;
        }

        /* verification: rows li .. li + n_prop */
        kprop = r->n_prop;
        p0 = b->pos[k];
        accepted = verify(e, r,
                          use_ids ? NULL : e->logits + (size_t) li * V,
                          use_ids ? e->ids + li : NULL, t);
        li += kprop + 1;
        k += kprop;   /* skip the proposals' batch entries */
        r->n_prop = 0;

        sp->n_confirmed += accepted + 1;
        if (r->n_forced > 0) {
            /* the grammar's proposals say nothing of the proposer's */
            pthread_mutex_lock(&e->mu);
            e->m.grammar_forced_accepted_total += (uint64_t)
                (accepted < r->n_forced ? accepted : r->n_forced);
            pthread_mutex_unlock(&e->mu);
        } else {
            nalar_accept_update(acc_now(r), kprop, accepted);
        }
        if (r->n_forced == 0 && r->prop_now != NALAR_PROP_PREDICTION) {
            nalar_accept_update(&e->prop_acc[r->prop_now], kprop,
                                accepted);
        }
        pthread_mutex_lock(&e->mu);
        e->m.spec_drafts_total++;
        e->m.spec_draft_tokens_total += (uint64_t) kprop;
        e->m.spec_accepted_tokens_total += (uint64_t) accepted;
        for (int32_t i = 0; i < accepted; i++) {
            e->m.spec_accepted_per_pos[i]++;
        }
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&r->mu);
        r->spec_proposed += kprop;
        r->spec_accepted += accepted;
        if (r->prop == NALAR_PROP_PREDICTION) {
            r->pred_accepted += accepted;
            r->pred_rejected += kprop - accepted;
        }
        pthread_mutex_unlock(&r->mu);

        if (r->state == REQ_FINISHED) {
            continue;   /* finishing released every block */
        }
        /* roll back: keep KV of the last confirmed token and the
         * accepted proposals; provisional blocks go back to the pool */
        r->n_computed = p0 + 1 + accepted;
        nalar_seq_kv_truncate(&e->kv, &r->kv, r->n_computed);
        r->kv.n_pos = r->n_computed;
        cache_publish(e, r, r->n_computed);
        if (r->prop_now == NALAR_PROP_DRAFT) {
            /* the draft computed the last token and proposals
             * 1..kprop-1; those that were confirmed stay valid */
            int32_t keep = p0 + 1 + (accepted < kprop - 1 ? accepted
                                                          : kprop - 1);
            if (r->d_computed > keep) {
                r->d_computed = keep;
            }
            nalar_seq_kv_truncate(&e->dkv, &r->dkv, r->d_computed);
        }
        if (r->notify != NULL) {
            r->notify(r, r->notify_ctx);
        }
    }
    for (int32_t i = 0; i < e->n_running; ) {
        if (e->running[i]->state == REQ_FINISHED) {
            nalar_request *r = e->running[i];

            running_remove(e, i);
            nalar_request_unref(r);
            continue;
        }
        i++;
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = 0;
    pthread_mutex_unlock(&e->mu);
}


/* What the step teaches the step gate and the probe budget. */
static void
step_learn(nalar_engine *e, const step_plan *sp)
{
    if (sp->n_prefill == 0 && sp->n_decode > 0 && sp->mix != 0
        && !sp->any_fixed && !sp->any_probe)
    {
        /* a pure decode step where speculation was possible: its rate,
         * as plain or as this mix of proposers.  A draft that first caught
         * up on many tokens decoded without it paid the price of
         * switching, once: not the rate of drafting, and counting it
         * would keep an exploring gate from ever letting the draft run.
         * A probe (a request trying k its cost model ruled out, see
         * choose_k) is not what speculating does either: a probe at a k
         * the model ruled out may confirm little, and read as the draft's
         * rate (most of all just after the gate has forgotten the old
         * one) it would hold the draft back long after */
        nalar_spec_gate_record(&e->gate, sp->n_decode,
                               sp->n_spec > 0 ? sp->mix : 0, sp->n_confirmed,
                               nalar_now_s() - sp->t_start - sp->catchup_s);
    }
    if (sp->any_probe || !nalar_probe_allow(&e->probe_pace)) {
        /* the probe budget (a full one stays full: no need to look up
         * the gate's best ratio every step).  A probe's cost: its step
         * over the target pass the step would have been without it
         * (bookkeeping counted in: the budget errs toward fewer probes) */
        double step_s = nalar_now_s() - sp->t_start, excess = 0;

        if (sp->any_probe) {
            double plain = nalar_cost_estimate(&e->target_cost, sp->n_unprop);

            excess = step_s - (plain > 0 ? plain : 0);
        }
        nalar_probe_record(&e->probe_pace, step_s, excess,
                           nalar_spec_gate_best(&e->gate, sp->n_decode)
                           >= NALAR_GATE_MARGIN
                           ? NALAR_PROBE_SHARE_WIN : NALAR_PROBE_SHARE);
    }
}


/* A step failed: every running request finishes with its error, and its
 * KV goes back to the pool.  Waiting requests stay: the next step tries
 * them afresh. */
static void
fail_running(nalar_engine *e, const char *msg)
{
    while (e->n_running > 0) {
        nalar_request *r = e->running[--e->n_running];

        finish_unref(e, r, NALAR_FINISH_ERROR, msg);
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = 0;
    pthread_mutex_unlock(&e->mu);
    publish_metrics(e);
}


/*
 * One scheduling step: drop cancelled requests, admit waiting ones, build a
 * batch (decodes first, with speculative proposals where they pay, then
 * prefill chunks within the token budget), run the forward pass, sample or
 * verify.  Returns 1 if work was done, 0 if idle, -1 with err when the step
 * failed (out of memory, or the backend): every request that was running
 * is then finished with that error (fail_running), none is left running.
 */
static int
engine_step(nalar_engine *e, nalar_err *err)
{
    step_plan sp;

    memset(&sp, 0, sizeof(sp));
    sp.t_start = nalar_now_s();
    step_drop_cancelled(e);
    step_intake(e);
    step_admit(e);
    if (e->n_running == 0) {
        /* cancellations may have just emptied the running set */
        publish_metrics(e);
        return 0;
    }
    if (test_fault(e, NALAR_FAULT_BATCH)
        || batch_grow(e, e->opts.max_batch_tokens
                         + e->n_running * (1 + NALAR_SPEC_MAX_K)) != 0)
    {
        nalar_fail(err, "engine: out of memory for the batch");
        fail_running(e, err->msg);
        return -1;
    }
    step_plan_speculation(e, &sp);
    step_build_batch(e, &sp);
    if (sp.n_tok == 0) {
        /* every request finished or was preempted while batching: the
         * gauges must say so even if the engine now goes idle */
        publish_metrics(e);
        return e->n_running > 0;
    }
    if (step_forward(e, &sp, err) != 0) {
        fail_running(e, err->msg);
        return -1;
    }
    step_advance(e, &sp);
    step_learn(e, &sp);
    publish_metrics(e);
    return 1;
}


static void
fail_all_waiting(nalar_engine *e, nalar_finish why, const char *msg)
{
    for ( ;; ) {
        nalar_request *r;

        pthread_mutex_lock(&e->mu);
        r = e->in_head;
        if (r != NULL) {
            e->in_head = r->next;
            if (e->in_head == NULL) {
                e->in_tail = NULL;
            }
            e->n_waiting--;
        } else if ((r = e->wait_head) != NULL) {
            e->wait_head = r->next;
            if (e->wait_head == NULL) {
                e->wait_tail = NULL;
            }
            e->n_waiting--;
        }
        pthread_mutex_unlock(&e->mu);
        if (r == NULL) {
            return;
        }
        finish_unref(e, r, why, msg);
    }
}


static void *
engine_main(void *arg)
{
    nalar_engine *e = arg;

    if (e->model == NULL) {
        if (engine_load(e, &e->load_err) != 0) {
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
        }
    }
    for ( ;; ) {
        nalar_err err;

        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_waiting == 0 && e->n_running == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        pthread_mutex_unlock(&e->mu);
        if (nalar_engine_state(e, NULL) != 1) {
            fail_all_waiting(e, NALAR_FINISH_ERROR, e->load_err.msg);
            continue;
        }
        /* an idle step (0) leaves nothing running, and a failed one (-1)
         * has finished what ran; whatever waits now (a request submitted
         * since step_admit looked, one preempted in the step) the next
         * step admits, since with nothing running step_admit takes the
         * head whatever it needs: nothing waiting is ever unadmittable */
        if (engine_step(e, &err) == 0 && e->idle_fn != NULL) {
            e->idle_fn(e->idle_arg);
        }
    }
    return NULL;
}


int
nalar_engine_start(nalar_engine *e, nalar_err *err)
{
    if (!e->opts.load_async && e->model == NULL) {
        if (engine_load(e, &e->load_err) != 0) {
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
            *err = e->load_err;
            return -1;
        }
        __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        return nalar_fail(err, "engine: cannot start the engine thread");
    }
    e->started = 1;
    return 0;
}


int
nalar_engine_run_sync(nalar_engine *e, nalar_request **reqs, int n,
                      nalar_err *err)
{
    int failed = 0;

    if (e->started) {
        return nalar_fail(err, "engine: run_sync on a started engine");
    }
    if (e->model == NULL) {
        if (engine_load(e, err) != 0) {
            e->load_err = *err;
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
            return -1;
        }
        __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < n; i++) {
        if (nalar_engine_submit(e, reqs[i], err) != 0) {
            /* what was submitted is cancelled and run out, so nothing is
             * left in the engine when the caller frees its requests */
            for (int j = 0; j < i; j++) {
                nalar_request_cancel(reqs[j]);
            }
            failed = 1;
            break;
        }
    }
    /* until nothing runs or waits: a failed step finished what was
     * running, and what waits still runs (as on the engine thread) */
    for ( ;; ) {
        nalar_err step_err;
        int       rc = engine_step(e, &step_err), waiting;

        if (rc < 0 && !failed) {
            *err = step_err;
            failed = 1;
        }
        pthread_mutex_lock(&e->mu);
        waiting = e->n_waiting;
        pthread_mutex_unlock(&e->mu);
        if (rc == 0 && waiting == 0 && e->n_running == 0) {
            return failed ? -1 : 0;
        }
    }
}


void
nalar_engine_destroy(nalar_engine *e)
{
    if (e == NULL) {
        return;
    }
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    while (e->n_running > 0) {
        nalar_request *r = e->running[--e->n_running];

        finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
    }
    fail_all_waiting(e, NALAR_FINISH_CANCELLED, NULL);
    nalar_prefix_cache_destroy(e->cache);
    nalar_grammar_cache_destroy(e->grammars);
    if (e->dkv_ready) {
        e->draft_be->kv_free(e->draft_be, &e->dkv);
        nalar_kv_pool_free(&e->dkv);
    }
    if (e->draft_be != NULL) {
        e->draft_be->destroy(e->draft_be);
    }
    nalar_model_destroy(e->draft);
    free(e->dbatch.tokens);
    free(e->dbatch.pos);
    free(e->dbatch.seq);
    free(e->dbatch.want_logits);
    free(e->dbatch_req);
    free(e->dlogits);
    if (e->kv_ready) {
        e->be->kv_free(e->be, &e->kv);
        nalar_kv_pool_free(&e->kv);
    }
    if (e->be != NULL) {
        e->be->destroy(e->be);
    }
    nalar_model_destroy(e->model);
    free(e->batch.tokens);
    free(e->batch.pos);
    free(e->batch.seq);
    free(e->batch.want_logits);
    free(e->batch_req);
    free(e->logits);
    free(e->ids);
    free(e->running);
    free(e->model_path);
    free(e->model_name);
    free(e->backend_name);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}


nalar_kv_pool *
nalar_engine_kv(nalar_engine *e)
{
    return e->kv_ready ? &e->kv : NULL;
}
