/*
 * A request (engine.h): its owned copy of the parameters, its reference
 * count, cancelling it, the output buffer the engine thread fills
 * (push_output) and the consumer drains (nalar_request_take), and how the
 * engine finishes it (request_finish).
 *
 * Threads: nalar_request_create, _ref, _unref, _cancel and _take run on any
 * thread; the output buffer and what _take reads are under r->mu; the
 * reference count and the cancel flag are atomics.  push_output,
 * request_finish and finish_unref run on the engine thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h"
#include "kv.h"
#include "stop.h"


/* An owned copy of text pieces, their texts back to back in *text. */
nalar_tok_text *
nalar_pieces_copy(const nalar_tok_text *src, int32_t n, char **text)
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


/* A prompt's text, copied once, immutable, shared by the requests made
 * with it (nalar_request_params.prompt_shared).  A deferred one
 * (nalar_prompt_deferred) has no pieces until intake renders them: `state`
 * goes once from PROMPT_PENDING to PROMPT_READY or PROMPT_REFUSED, on the
 * engine thread; pieces, text, add_bos, status and msg are written then
 * and never after (intake of the prompt's requests is on that thread). */
enum { PROMPT_READY = 0, PROMPT_PENDING, PROMPT_REFUSED };

struct nalar_prompt {
    int                  refs;        /* atomic */
    nalar_tok_text      *pieces;      /* (n) into text */
    int32_t              n;
    char                *text;
    int                  state;       /* PROMPT_* */
    int                  add_bos;     /* 1 the model's BOS first */
    int                  status;      /* PROMPT_REFUSED: the HTTP status */
    char                 msg[256];    /* ... and why */
    nalar_prompt_source  src;         /* deferred: released at the end */
};

#ifdef NALAR_TEST_HOOKS
static uint64_t  prompt_copies;       /* atomic: engine_test.h */
#define count_copy()  __atomic_add_fetch(&prompt_copies, 1, __ATOMIC_RELAXED)
#else
#define count_copy()
#endif


nalar_prompt *
nalar_prompt_create(const nalar_tok_text *pieces, int32_t n, nalar_err *err)
{
    nalar_prompt *pr = calloc(1, sizeof(*pr));

    if (pr == NULL) {
        nalar_fail(err, "out of memory");
        return NULL;
    }
    pr->refs = 1;
    pr->add_bos = 1;
    pr->n = n > 0 ? n : 0;
    pr->pieces = nalar_pieces_copy(pieces, pr->n, &pr->text);
    if (pr->pieces == NULL) {
        free(pr);
        nalar_fail(err, "out of memory");
        return NULL;
    }
    count_copy();
    return pr;
}


nalar_prompt *
nalar_prompt_deferred(const nalar_prompt_source *src, nalar_err *err)
{
    nalar_prompt *pr = calloc(1, sizeof(*pr));

    if (pr == NULL) {
        nalar_fail(err, "out of memory");
        return NULL;
    }
    pr->refs = 1;
    pr->state = PROMPT_PENDING;
    pr->src = *src;
    return pr;
}


/* The bytes intake will read for a deferred prompt (0 for a copy: its
 * pieces are counted).  Any thread: src is never written after create. */
size_t
prompt_pending_bytes(const nalar_prompt *pr)
{
    return pr != NULL && pr->src.render != NULL ? pr->src.bytes : 0;
}


/*
 * Intake's view of r's prompt text (engine thread): a deferred prompt is
 * rendered by the first request that asks, and every request sharing it
 * gets the pieces (r->pieces, r->n_pieces, *add_bos) or the same refusal
 * (-1 with the status, 0 for the server's own failure, and msg).
 */
int
request_prompt_pieces(nalar_request *r, int *add_bos, int *status, char *msg,
                      size_t cap)
{
    nalar_prompt *pr = r->shared_text;
    int           rc;

    *add_bos = 1;
    if (pr == NULL) {
        return 0;
    }
    if (pr->state == PROMPT_PENDING) {
        pr->msg[0] = '\0';
        rc = pr->src.render(pr->src.ctx, &pr->pieces, &pr->n, &pr->text,
                            &pr->add_bos, pr->msg, sizeof(pr->msg));
        if (rc != 0) {
            free(pr->pieces);
            free(pr->text);
            pr->pieces = NULL;
            pr->text = NULL;
            pr->n = 0;
            pr->status = rc;
            pr->state = PROMPT_REFUSED;
        } else {
            pr->state = PROMPT_READY;
        }
    }
    if (pr->state == PROMPT_REFUSED) {
        *status = pr->status == 400 ? 400 : 0;
        snprintf(msg, cap, "%s", pr->msg[0] ? pr->msg
                                            : "the prompt could not be made");
        return -1;
    }
    *add_bos = pr->add_bos;
    r->pieces = pr->pieces;
    r->n_pieces = pr->n;
    r->text = pr->text;
    return 0;
}


void
nalar_prompt_unref(nalar_prompt *pr)
{
    if (pr == NULL || __atomic_sub_fetch(&pr->refs, 1, __ATOMIC_ACQ_REL) != 0)
    {
        return;
    }
    if (pr->src.release != NULL) {
        pr->src.release(pr->src.ctx);
    }
    free(pr->pieces);
    free(pr->text);
    free(pr);
}


#ifdef NALAR_TEST_HOOKS

uint64_t
nalar_test_prompt_copies(void)
{
    return __atomic_load_n(&prompt_copies, __ATOMIC_RELAXED);
}

#endif


/* The request's prompt text, given back once tokenized or freed. */
void
request_text_free(nalar_request *r)
{
    if (r->shared_text != NULL) {
        nalar_prompt_unref(r->shared_text);
    } else {
        free(r->pieces);
        free(r->text);
    }
    r->shared_text = NULL;
    r->pieces = NULL;
    r->text = NULL;
}


nalar_request *
nalar_request_create(const nalar_request_params *p, nalar_notify_fn notify,
                     void *notify_ctx, nalar_err *err)
{
    nalar_request *r;

    if (p->n_prompt <= 0 && p->prompt_text == NULL
        && p->prompt_shared == NULL)
    {
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
    r->p.prompt_shared = NULL;
    r->p.prediction_text = NULL;
    r->p.shared_prefix = NULL;
    if (p->prompt_shared != NULL) {
        /* a deferred prompt's pieces come at intake
         * (request_prompt_pieces) */
        r->p.n_prompt = 0;
        __atomic_add_fetch(&p->prompt_shared->refs, 1, __ATOMIC_RELAXED);
        r->shared_text = p->prompt_shared;
        if (p->prompt_shared->src.render == NULL) {
            r->n_pieces = p->prompt_shared->n;
            r->pieces = p->prompt_shared->pieces;
            r->text = p->prompt_shared->text;
        }
    } else if (p->prompt_text != NULL) {
        r->p.n_prompt = 0;
        r->n_pieces = p->n_prompt_text > 0 ? p->n_prompt_text : 0;
        r->pieces = nalar_pieces_copy(p->prompt_text, r->n_pieces, &r->text);
        if (r->pieces == NULL) {
            goto oom;
        }
        count_copy();
    } else {
        r->prompt = malloc((size_t) p->n_prompt * sizeof(int32_t));
        if (r->prompt == NULL) {
            goto oom;
        }
        memcpy(r->prompt, p->prompt, (size_t) p->n_prompt * sizeof(int32_t));
    }
    /* the large parameters: borrowed from the shared copy, or from a
     * copy of this request's own */
    if (p->params_shared != NULL) {
        nalar_params_ref(p->params_shared);
        r->params = p->params_shared;
    } else {
        r->params = nalar_params_create(p, err);
        if (r->params == NULL) {
            nalar_request_unref(r);
            return NULL;
        }
    }
    r->p.params_shared = NULL;
    r->stops = r->params->stops;
    r->p.n_stop = r->params->n_stop;
    r->stop_ids = r->params->stop_ids;
    r->p.n_stop_ids = r->params->n_stop_ids;
    r->pred_pieces = r->params->pred_pieces;
    r->n_pred_pieces = r->params->n_pred_pieces;
    r->pred = r->params->pred;
    r->n_pred = r->params->n_pred;
    r->p.prediction = r->pred;
    r->p.n_prediction = r->n_pred;
    r->shared = r->params->shared_ids;
    r->p.n_shared_ids = r->params->n_shared_ids;
    r->schema = r->params->schema;
    r->p.json_schema = r->schema;
    nalar_seq_kv_init(&r->dkv);
    r->scope = strdup(p->cache_scope != NULL ? p->cache_scope : "");
    if (r->scope == NULL) {
        goto oom;
    }
    r->p.cache_scope = r->scope;
    r->p.prompt = r->prompt;
    r->p.stop = r->stops;
    r->p.stop_ids = r->stop_ids;
    if (r->p.sampling.n_logprobs < 0) {
        r->p.sampling.n_logprobs = 0;
    }
    if (r->p.sampling.n_logprobs > 20) {
        r->p.sampling.n_logprobs = 20;
    }
    /* the matcher borrows the strings, which outlive it (r->params) */
    r->stop = nalar_stop_create(r->stops, r->p.n_stop);
    if (r->stop == NULL) {
        goto oom;
    }
    nalar_seq_kv_init(&r->kv);
    r->ttft_ms = -1;
    r->g_compile_ms = -1;
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
    if (r->stop != NULL) {
        nalar_stop_destroy(r->stop);
    }
    if (r->sampler_ready) {
        nalar_sampler_free(&r->sampler);
    }
    free(r->kv.blocks);
    free(r->dkv.blocks);
    free(r->pred_ids);
    free(r->digests);
    free(r->scope);
    nalar_params_unref(r->params);
    free(r->prompt);
    request_text_free(r);
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


/* A take without text hands this out when even "" cannot be allocated:
 * nalar_output_free knows it. */
static char  take_empty[1];


int
nalar_request_take(nalar_request *r, nalar_output *out)
{
    int any;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&r->mu);
    out->text = r->out_text != NULL ? r->out_text : strdup("");
    if (out->text == NULL) {
        out->text = take_empty;
    }
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
        out->error = r->error;
    }
    out->accepted = r->accepted;
    any = r->accepted && !r->accept_taken;
    r->accept_taken = r->accepted;
    out->usage.n_prompt = r->p.n_prompt;
    out->usage.n_cached = r->n_cached;
    out->usage.n_completion = r->n_generated;
    out->usage.queue_ms = r->queue_ms;
    out->usage.ttft_ms = r->ttft_ms;
    out->usage.spec_proposed = r->spec_proposed;
    out->usage.spec_accepted = r->spec_accepted;
    out->usage.pred_accepted = r->pred_accepted;
    out->usage.pred_rejected = r->pred_rejected;
    out->usage.grammar_compile_ms = r->g_compile_ms;
    out->usage.grammar_mask_ms = r->g_mask_ms;
    out->usage.grammar_forced = r->g_forced;
    out->usage.grammar_forced_accepted = r->g_forced_accepted;
    any = any || out->text_len > 0 || out->n_ids > 0
          || out->finish != NALAR_FINISH_NONE;
    pthread_mutex_unlock(&r->mu);
    return any;
}


void
nalar_output_free(nalar_output *out)
{
    if (out->text != take_empty) {
        free(out->text);
    }
    free(out->ids);
    free(out->logprobs);
    memset(out, 0, sizeof(*out));
}


/* Append output under r->mu; called on the engine thread.  -1 when out of
 * memory, r's output then as it was or with the text but not the id: the
 * caller finishes r with the error (never drops output silently). */
int
push_output(nalar_request *r, const char *text, size_t len, int32_t id,
            const nalar_logprob *lp)
{
    int nlp = r->p.logprobs ? 1 + r->p.sampling.n_logprobs : 0;

    if (r->engine != NULL && test_fault(r->engine, NALAR_FAULT_OUTPUT)) {
        return -1;
    }
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


/* Finish: release KV, publish the reason, notify.  The caller drops the
 * engine's reference (finish_unref) once it no longer touches r. */
void
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
    /* the matcher holds a reference to a grammar of the engine's cache,
     * which only the engine's thread touches: dropped here, not at the
     * last unref (which may run on the consumer's thread) */
    nalar_gmatcher_destroy(r->gm);
    r->gm = NULL;
    if (why != NALAR_FINISH_CANCELLED && why != NALAR_FINISH_ERROR
        && r->stop != NULL)
    {
        /* text held back as a possible stop-string prefix is final now;
         * when it cannot be kept the request ends with the error */
        n = nalar_stop_flush(r->stop, &tail);
        if (n > 0 && push_output(r, tail, n, -1, NULL) != 0) {
            why = NALAR_FINISH_ERROR;
            error = "out of memory for the output";
        }
    }
    r->state = REQ_FINISHED;
    pthread_mutex_lock(&r->mu);
    r->finish = why;
    /* a refusal filled r->error where it was found (intake); any other
     * error is the engine's */
    if (why == NALAR_FINISH_ERROR && r->error.status == 0) {
        nalar_failure_set(&r->error, 500, NALAR_SERVER_ERROR, NULL, NULL,
                          "%s", error != NULL ? error : "the request failed");
    }
    pthread_mutex_unlock(&r->mu);
    if (r->notify != NULL) {
        r->notify(r, r->notify_ctx);
    }
}


void
finish_unref(nalar_engine *e, nalar_request *r, nalar_finish why,
             const char *error)
{
    request_finish(e, r, why, error);
    nalar_request_unref(r);
}
