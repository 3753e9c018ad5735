/*
 * The queues a request passes through before it runs: submission into the
 * intake queue (e->in_head), intake (tokenizing and checking, engine.h),
 * the waiting queue (e->wait_head) and FCFS admission into the running
 * set, preemption back to the waiting queue's head, and failing what
 * waits.
 *
 * Threads: nalar_engine_submit runs on any
 * thread (the queues under e->mu); the rest on the engine thread, which
 * takes e->mu only to move a request between queues, never while it
 * tokenizes.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "engine_internal.h"
#include "kv.h"
#include "tokenizer.h"


/* Takes e->mu for a few checks and the link into the intake queue: what
 * grows with the request (its text's size) is counted before. */
int
nalar_engine_submit(nalar_engine *e, nalar_request *r, nalar_err *err)
{
    size_t bytes = 0;

    if (nalar_engine_state(e, NULL) != 1) {
        nalar_fail(err, "the model is still loading");
        return NALAR_SUBMIT_BUSY;
    }
    if (engine_lora_check(e, r, err) != 0) {
        return NALAR_SUBMIT_INVALID;
    }
    for (int32_t i = 0; r->pieces != NULL && i < r->n_pieces; i++) {
        bytes += r->pieces[i].len;
    }
    for (int32_t i = 0; r->pred_pieces != NULL && i < r->n_pred_pieces; i++)
    {
        bytes += r->pred_pieces[i].len;
    }
    bytes += prompt_pending_bytes(r->shared_text);

    pthread_mutex_lock(&e->mu);
    if (e->n_waiting >= e->opts.max_queue) {
        pthread_mutex_unlock(&e->mu);
        nalar_fail(err, "the queue is full (%d waiting)", e->n_waiting);
        return NALAR_SUBMIT_BUSY;
    }
    if (r->state != REQ_NEW) {
        pthread_mutex_unlock(&e->mu);
        nalar_fail(err, "request submitted twice");
        return NALAR_SUBMIT_INVALID;
    }
    r->intake_bytes = bytes;
    r->overtaken = 0;
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


/*
 * Intake of a request's prediction: its pieces tokenized, cut to the
 * context (only so much of one can ever be verified).  Adds the tokens it
 * made to *work.  0, or -1 with why the request is refused.
 */
static int
intake_prediction(nalar_engine *e, nalar_request *r, int32_t *work,
                  nalar_failure *no)
{
    /* the prediction continues the answer: no BOS, and a leading
     * space is the dummy-prefix space SentencePiece puts there.  The
     * pieces are the shared copy's (r->params): read, never changed;
     * the one piece that loses its space is a local copy. */
    const nalar_tok_text  *pcs = r->pred_pieces;
    nalar_tok_text        *own = NULL;
    const nalar_tokenizer *tok = e->model->tok;
    int32_t               *ids, i;
    int                    n, more = 0;

    for (i = 0; i < r->n_pred_pieces; i++) {
        const nalar_tok_text *pc = &pcs[i];

        if (pc->len == 0) {
            continue;
        }
        if (pc->text[0] == ' ' && nalar_tok_kind_of(tok) == TOK_SPM
            && nalar_tok_add_space_prefix(tok))
        {
            own = malloc((size_t) r->n_pred_pieces * sizeof(*own));
            if (own == NULL) {
                return nalar_failure_set(no, 500, NALAR_SERVER_ERROR, NULL,
                                         NULL, "out of memory");
            }
            memcpy(own, pcs, (size_t) r->n_pred_pieces * sizeof(*own));
            own[i].text++;
            own[i].len--;
            pcs = own;
        }
        break;
    }
    n = nalar_tokenize_bounded(tok, pcs, (size_t) r->n_pred_pieces, 0,
                               e->model->cfg.n_ctx, &ids, &more);
    free(own);
    if (n < 0) {
        return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST,
                                 "prediction", NULL,
                                 "prediction could not be tokenized");
    }
    *work += n;
    r->pred_pieces = NULL;
    r->pred_ids = ids;
    r->pred = ids;
    r->n_pred = n;
    r->p.prediction = ids;
    r->p.n_prediction = n;
    return 0;
}


/*
 * Intake of one request (engine thread, no lock held): the prompt's ids,
 * tokenized from text at most up to the context, and checked; the
 * prediction's ids; the shared prefix.  Adds the tokens it made to *work.
 * 0, or -1 with why the request is refused, filled in *no.
 */
static int
intake_one(nalar_engine *e, nalar_request *r, int32_t *work,
           nalar_failure *no)
{
    const nalar_config    *c = &e->model->cfg;
    const nalar_tokenizer *tok = e->model->tok;
    int32_t               *ids, i;
    int                    n, more = 0, add_bos, status;
    char                   msg[256];

    /* a deferred prompt is rendered here, by its first request */
    if (request_prompt_pieces(r, &add_bos, &status, msg, sizeof(msg)) != 0) {
        return status == 400
               ? nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, r->param,
                                   NULL, "%s", msg)
               : nalar_failure_set(no, 500, NALAR_SERVER_ERROR, NULL, NULL,
                                   "%s", msg);
    }
    if (r->pieces != NULL) {
        n = nalar_tokenize_bounded(tok, r->pieces, (size_t) r->n_pieces,
                                   add_bos && nalar_tok_add_bos(tok),
                                   c->n_ctx, &ids, &more);
        if (n < 0) {
            return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, r->param,
                                     NULL, "%s could not be tokenized",
                                     r->param);
        }
        *work += n;
        request_text_free(r);
        pthread_mutex_lock(&r->mu);
        r->prompt = ids;
        r->p.prompt = ids;
        /* where counting stopped, one more token is known to be there */
        r->p.n_prompt = more ? n + 1 : n;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->p.n_prompt <= 0) {
        return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, r->param,
                                 NULL, "the prompt is empty");
    }
    if (nalar_engine_check_prompt(e, r->p.n_prompt, more,
                                  r->p.max_tokens_fit ? r->p.max_tokens : 0,
                                  msg, sizeof(msg)) != 0)
    {
        return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, r->param,
                                 "context_length_exceeded", "%s", msg);
    }
    /* a sequence must fit the pool alone (others are preempted for it,
     * choices of one prompt and speculation's proposals included: they
     * wait or give way); without max_tokens, the pool bounds it as the
     * context does (request_start) */
    if (e->kv_ready && r->p.max_tokens > 0
        && r->p.n_prompt + (int64_t) r->p.max_tokens
           > (int64_t) e->kv.n_blocks * NALAR_KV_BLOCK)
    {
        return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, "max_tokens",
                                 "context_length_exceeded", "the KV cache "
                                 "holds %d tokens but %lld tokens were "
                                 "requested (%d in the prompt, %d in the "
                                 "completion)",
                                 e->kv.n_blocks * NALAR_KV_BLOCK,
                                 (long long) r->p.n_prompt + r->p.max_tokens,
                                 r->p.n_prompt, r->p.max_tokens);
    }
    for (i = 0; i < r->p.n_prompt; i++) {
        if (r->prompt[i] < 0 || r->prompt[i] >= c->n_vocab) {
            return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST, r->param,
                                     NULL, "prompt token %d is outside the "
                                     "vocabulary (0..%d)", r->prompt[i],
                                     c->n_vocab - 1);
        }
    }
    if (r->pred_pieces != NULL && intake_prediction(e, r, work, no) != 0) {
        return -1;
    }
    if (r->p.grammar != NALAR_GRAMMAR_NONE && r->gm == NULL) {
        /* structured output: the compiled grammar from the cache */
        double         cs;
        nalar_grammar *g;

        g = nalar_grammar_get(e->grammars, r->p.grammar, r->schema,
                              r->schema ? strlen(r->schema) : 0, &cs,
                              msg, sizeof(msg));
        if (g != NULL) {
            r->gm = nalar_gmatcher_create(g);
            nalar_grammar_release(g);
        }
        pthread_mutex_lock(&e->mu);
        e->m.grammar_compile_seconds_total += cs;
        e->m.grammar_compiles_total += cs > 0;
        e->m.grammar_requests_total++;
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&r->mu);
        r->g_compile_ms = cs * 1e3;
        pthread_mutex_unlock(&r->mu);
        if (r->gm == NULL) {
            return nalar_failure_set(no, 400, NALAR_INVALID_REQUEST,
                                     "response_format", NULL, "%s",
                                     g != NULL ? "out of memory" : msg);
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
 * The next request intake takes, unlinked from the intake queue (under
 * e->mu): the first in submission order whose text is shorter than
 * INTAKE_BIG_BYTES, so that a short request never waits while long
 * prompts ahead of it are tokenized (up to the context each, as many
 * milliseconds); a long one is taken when no short one waits or once
 * INTAKE_OVERTAKE requests have gone before it.  Among short requests,
 * and among long ones, the order is the order of submission.
 */
#define INTAKE_BIG_BYTES  (64 * 1024)
#define INTAKE_OVERTAKE   16

static nalar_request *
intake_next(nalar_engine *e)
{
    nalar_request *r, *prev = NULL, *before = NULL, *pick = NULL;

    for (r = e->in_head; r != NULL; prev = r, r = r->next) {
        if (r->intake_bytes >= INTAKE_BIG_BYTES
            && r->overtaken >= INTAKE_OVERTAKE)
        {
            break;
        }
        if (r->intake_bytes < INTAKE_BIG_BYTES) {
            pick = r;
            before = prev;
            break;
        }
    }
    if (pick == NULL) {
        pick = e->in_head;
        before = NULL;
    }
    for (r = e->in_head; r != pick; r = r->next) {
        r->overtaken++;
    }
    if (before != NULL) {
        before->next = pick->next;
    } else {
        e->in_head = pick->next;
    }
    if (e->in_tail == pick) {
        e->in_tail = before;
    }
    pick->next = NULL;
    return pick;
}


/* A tokenize-only request after intake: its prompt's ids are its output,
 * and it is done. */
static void
intake_tokens(nalar_engine *e, nalar_request *r)
{
    const char *error = NULL;

    pthread_mutex_lock(&e->mu);
    e->n_waiting--;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&r->mu);
    r->accepted = 1;
    pthread_mutex_unlock(&r->mu);
    for (int32_t i = 0; i < r->p.n_prompt; i++) {
        if (push_output(r, NULL, 0, r->prompt[i], NULL) != 0) {
            error = "out of memory for the output";
            break;
        }
    }
    finish_unref(e, r, error != NULL ? NALAR_FINISH_ERROR : NALAR_FINISH_STOP,
                 error);
}


/*
 * Intake (see engine.h): each submitted request, in the order intake_next
 * gives, is checked and queued for admission, or refused.  While requests
 * run, a step tokenizes about one context's worth, at least one request.
 */
void
step_intake(nalar_engine *e)
{
    int32_t        work = 0;
    nalar_request *r;
    nalar_failure  no;

    for ( ;; ) {
        pthread_mutex_lock(&e->mu);
        r = e->in_head;
        if (r == NULL
            || (work >= e->model->cfg.n_ctx && e->n_running > 0))
        {
            pthread_mutex_unlock(&e->mu);
            return;
        }
        r = intake_next(e);
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
            r->error = no;
            pthread_mutex_unlock(&r->mu);
            finish_unref(e, r, NALAR_FINISH_ERROR, NULL);
            continue;
        }

        if (r->p.tokenize_only) {
            intake_tokens(e, r);
            continue;
        }

        pthread_mutex_lock(&r->mu);
        r->accepted = 1;
        pthread_mutex_unlock(&r->mu);
        if (r->notify != NULL) {
            r->notify(r, r->notify_ctx);
        }

        pthread_mutex_lock(&e->mu);
        e->lora_m[r->p.adapter].requests_total++;
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


/* Engine-side setup the first time a request is scheduled. */
static int
request_start(nalar_engine *e, nalar_request *r)
{
    const nalar_config *c = &e->model->cfg;

    if (test_fault(e, NALAR_FAULT_START)) {
        return -1;
    }
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


/* Admission, FCFS: the head waits until its whole context fits. */
void
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
        if (cache_match(e, r) != 0) {
            /* finishing gives back what the match took */
            finish_unref(e, r, NALAR_FINISH_ERROR,
                         "out of memory for the prefix cache");
            continue;
        }
        r->admitted_once = 1;
        r->state = REQ_RUNNING;
        e->running[e->n_running++] = r;
    }
}


/* Preempt the most recently admitted running request: free its KV and put
 * it back at the head of the queue; it recomputes its context later. */
void
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


void
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
