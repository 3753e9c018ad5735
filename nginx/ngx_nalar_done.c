
/*
 * The way to the engine and back: a request's choices are submitted as
 * engine requests, each linked to a slot; the engine's notify callback
 * (on an engine thread) queues the slot on the done queue under the mutex
 * and writes the eventfd; the eventfd's handler, on the event loop, hands
 * each slot's output to the response (through the request's write event
 * handler) and each finished parse to the function its job names.  The
 * cleanup cancels what a request that goes away left with the engine.
 *
 * ngx_http_nalar_notify runs on engine threads: it touches only the slot,
 * the done queue and the eventfd, never a request, connection or pool.
 * Everything else here runs on the event loop.  It takes the done queue's
 * mutex for a queue operation, and one engine lock through the engine's
 * calls: nalar_engine_submit and nalar_request_cancel take the engine's
 * queue mutex (e->mu) to link a request into the intake queue or to wake
 * the engine thread.  That wait is short: the engine thread holds e->mu
 * only to move requests between its queues (a walk of the intake queue at
 * most, max_queue long) and to update counters, never while it tokenizes,
 * compiles a grammar or runs a forward pass (src/engine_internal.h).
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_submit_choices(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_request_params *p);
static void ngx_http_nalar_cleanup(void *data);
static ngx_http_nalar_slot_t *ngx_http_nalar_slot_get(void);
static void ngx_http_nalar_notify(nalar_request *req, void *data);


/*
 * One engine request per choice, the choices sharing one copy of a text
 * prompt and one copy of the large parameters (stop strings, prediction,
 * schema: nalar_params); the engine frees each when the last choice lets
 * go.  Out of memory is a 500 in OpenAI's shape.
 */

ngx_int_t
ngx_http_nalar_submit(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    nalar_request_params *p)
{
    ngx_int_t              rc;
    nalar_err              err;
    nalar_params          *params;
    nalar_prompt          *prompt;
    const nalar_tok_text  *text;

    prompt = NULL;

    if (p->prompt_text != NULL) {
        prompt = nalar_prompt_create(p->prompt_text, p->n_prompt_text, &err);
        if (prompt == NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "nalar: %s", err.msg);
            return ngx_http_nalar_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                        "server_error", NULL,
                                        "out_of_memory",
                                        "The server is out of memory");
        }
    }

    params = nalar_params_create(p, &err);
    if (params == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "nalar: %s", err.msg);
        nalar_prompt_unref(prompt);
        return ngx_http_nalar_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                    "server_error", NULL, "out_of_memory",
                                    "The server is out of memory");
    }

    text = p->prompt_text;
    p->params_shared = params;

    if (prompt != NULL) {
        p->prompt_shared = prompt;
        p->prompt_text = NULL;
    }

    rc = ngx_http_nalar_submit_choices(r, ctx, p);

    p->params_shared = NULL;
    p->prompt_shared = NULL;
    p->prompt_text = text;
    nalar_params_unref(params);
    nalar_prompt_unref(prompt);

    return rc;
}


/*
 * The cleanup is registered first so that whatever happens to the request
 * later, its sequences are cancelled.
 */

static ngx_int_t
ngx_http_nalar_submit_choices(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_request_params *p)
{
    int                       rc;
    u_char                   *id;
    ngx_uint_t                i;
    nalar_err                 err;
    nalar_request            *req;
    ngx_http_nalar_slot_t    *slot;
    ngx_http_nalar_choice_t  *ch;
    ngx_http_nalar_worker_t  *w;

    static u_char  alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "abcdefghijklmnopqrstuvwxyz0123456789";

    w = ngx_http_nalar_worker();

    id = ngx_cpymem(ctx->id, ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
                             ? "chatcmpl-" : "cmpl-",
                    ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT ? 9 : 5);

    for (i = 0; i < 24; i++) {
        *id++ = alnum[ngx_random() % (sizeof(alnum) - 1)];
    }

    *id = '\0';

    ctx->choices = ngx_pcalloc(r->pool,
                               ctx->n * sizeof(ngx_http_nalar_choice_t));
    if (ctx->choices == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_nalar_add_cleanup(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    for (i = 0; i < ctx->n; i++) {
        ch = &ctx->choices[i];
        ch->usage.grammar_compile_ms = -1;

        if (!ctx->stream) {
            ch->text = ngx_array_create(r->pool, 256, 1);
            if (ch->text == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
        }

        slot = ngx_http_nalar_slot_get();
        if (slot == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        slot->ctx = ctx;
        ch->slot = slot;

        req = nalar_request_create(p, ngx_http_nalar_notify, slot, &err);
        if (req == NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "nalar: %s", err.msg);

            /* the cleanup cancels the choices already submitted */

            return ngx_http_nalar_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                        "server_error", NULL,
                                        "out_of_memory",
                                        "The server could not start the "
                                        "request: %s", err.msg);
        }

        pthread_mutex_lock(&w->mutex);
        slot->req = req;
        pthread_mutex_unlock(&w->mutex);

        rc = nalar_engine_submit(ctx->model->engine, req, &err);

        if (rc == NALAR_SUBMIT_INVALID) {

            /* the glue's own mistake (an adapter id its engine does not
             * have): no retry will do */

            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "nalar: model \"%V\": %s", &ctx->model->name,
                          err.msg);

            /* the cleanup cancels the choices already submitted */

            return ngx_http_nalar_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                        "server_error", NULL, NULL,
                                        "The server could not start the "
                                        "request");
        }

        if (rc != 0) {
            ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                          "nalar: model \"%V\": %s", &ctx->model->name,
                          err.msg);

            /* the cleanup cancels the choices already submitted */

            if (ngx_http_nalar_add_header(r, "Retry-After", "1") != NGX_OK) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            return ngx_http_nalar_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                        "server_error", NULL, "queue_full",
                                        "The server is busy: %s", err.msg);
        }

        ch->submitted = 1;

        /* different seeds for n > 1 so that sampled choices differ */
        p->sampling.seed += 0x9e3779b97f4a7c15ULL;
    }

    return NGX_OK;
}


/* Runs when the request is freed or terminated (a disconnect). */

ngx_int_t
ngx_http_nalar_add_cleanup(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx)
{
    ngx_http_cleanup_t  *cln;

    if (ctx->cleanup) {
        return NGX_OK;
    }

    cln = ngx_http_cleanup_add(r, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_nalar_cleanup;
    cln->data = ctx;
    ctx->cleanup = 1;

    return NGX_OK;
}


/*
 * The request is going away: forget its parse (the parse thread frees it
 * once it is done), cancel what still runs, release the slots.
 */

static void
ngx_http_nalar_cleanup(void *data)
{
    ngx_http_nalar_ctx_t *ctx = data;

    ngx_uint_t                i;
    ngx_http_nalar_choice_t  *ch;

    ctx->done = 1;

    if (ctx->parse) {
        ctx->parse->ctx = NULL;
        ctx->parse = NULL;
    }

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    for (i = 0; i < ctx->n && ctx->choices; i++) {
        ch = &ctx->choices[i];

        if (ch->slot) {
            if (ch->submitted && ch->slot->req) {
                nalar_request_cancel(ch->slot->req);
            }

            ngx_http_nalar_slot_release(ch->slot);
            ch->slot = NULL;
        }

        if (ch->logprobs) {
            json_decref(ch->logprobs);
            ch->logprobs = NULL;
        }
    }
}


/* slots and the done queue */


static ngx_http_nalar_slot_t *
ngx_http_nalar_slot_get(void)
{
    ngx_queue_t              *q;
    ngx_http_nalar_slot_t    *slot, **sp;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    if (!ngx_queue_empty(&w->free_slots)) {
        q = ngx_queue_head(&w->free_slots);
        ngx_queue_remove(q);
        return ngx_queue_data(q, ngx_http_nalar_slot_t, queue);
    }

    slot = ngx_calloc(sizeof(ngx_http_nalar_slot_t), ngx_cycle->log);
    if (slot == NULL) {
        return NULL;
    }

    sp = ngx_array_push(&w->all_slots);
    if (sp == NULL) {
        ngx_free(slot);
        return NULL;
    }

    *sp = slot;

    return slot;
}


void
ngx_http_nalar_slot_release(ngx_http_nalar_slot_t *slot)
{
    nalar_request            *req;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    pthread_mutex_lock(&w->mutex);

    if (slot->posted) {
        ngx_queue_remove(&slot->queue);
        slot->posted = 0;
    }

    req = slot->req;
    slot->req = NULL;

    pthread_mutex_unlock(&w->mutex);

    if (req) {
        nalar_request_unref(req);
    }

    slot->ctx = NULL;
    ngx_queue_insert_tail(&w->free_slots, &slot->queue);
}


/*
 * Engine thread: new output or the finish is there.  Only the slot is
 * touched, under the mutex, and only while it still serves this request.
 */

static void
ngx_http_nalar_notify(nalar_request *req, void *data)
{
    ngx_http_nalar_slot_t *slot = data;

    int                       wake;
    uint64_t                  one;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    wake = 0;

    pthread_mutex_lock(&w->mutex);

    if (slot->req == req && !slot->posted) {
        /*
         * one wakeup per batch of news: the loop drains the queue until it
         * finds it empty (under this mutex), so only the insert into an
         * empty queue needs to wake it; an engine step that advances 16
         * streams writes the eventfd once, not 16 times
         */
        wake = ngx_queue_empty(&w->done);
        slot->posted = 1;
        ngx_queue_insert_tail(&w->done, &slot->queue);
    }

    pthread_mutex_unlock(&w->mutex);

    if (wake) {
        one = 1;
        if (write(w->efd, &one, sizeof(uint64_t)) < 0) {
            /* EAGAIN: the counter is saturated, the loop is awake anyway */
        }
    }
}


/* Event loop: the eventfd is readable. */

void
ngx_http_nalar_done_handler(ngx_event_t *ev)
{
    uint64_t                  n;
    ngx_int_t                 rc;
    ngx_uint_t                budget;
    ngx_queue_t              *q;
    ngx_connection_t         *c;
    ngx_http_request_t       *r;
    ngx_http_nalar_ctx_t     *ctx;
    ngx_http_nalar_slot_t    *slot;
    ngx_http_nalar_parse_t   *job;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    if (read(w->efd, &n, sizeof(uint64_t)) < 0) {
        /* EAGAIN: a spurious wakeup */
    }

    /* finished parses: each goes on to its engine, or is answered */

    for ( ;; ) {
        pthread_mutex_lock(&w->mutex);

        if (ngx_queue_empty(&w->results)) {
            pthread_mutex_unlock(&w->mutex);
            break;
        }

        q = ngx_queue_head(&w->results);
        ngx_queue_remove(q);

        pthread_mutex_unlock(&w->mutex);

        job = ngx_queue_data(q, ngx_http_nalar_parse_t, queue);
        ctx = job->ctx;

        if (ctx == NULL) {
            ngx_log_error(NGX_LOG_INFO, ev->log, 0,
                          "nalar: a request left while its body of %uz "
                          "bytes was parsed", job->len);
            ngx_http_nalar_parse_release(job);
            continue;
        }

        ctx->parse = NULL;
        r = ctx->request;
        c = r->connection;

        rc = job->parsed(r, ctx, &job->req);

        ngx_http_nalar_parse_release(job);

        if (rc != NGX_DONE) {
            ngx_http_finalize_request(r, ngx_http_nalar_send_error(r, rc));
        }

        ngx_http_run_posted_requests(c);
    }

    /* a bounded number per wakeup, so that a busy engine cannot starve
     * the rest of the loop; the eventfd brings us back for the rest */

    for (budget = 4096; budget; budget--) {

        pthread_mutex_lock(&w->mutex);

        if (ngx_queue_empty(&w->done)) {
            pthread_mutex_unlock(&w->mutex);
            return;
        }

        q = ngx_queue_head(&w->done);
        ngx_queue_remove(q);
        slot = ngx_queue_data(q, ngx_http_nalar_slot_t, queue);
        slot->posted = 0;

        pthread_mutex_unlock(&w->mutex);

        if (slot->ctx == NULL || slot->ctx->done) {
            continue;
        }

        r = slot->ctx->request;
        c = r->connection;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "nalar done: \"%V\"", &r->uri);

        r->write_event_handler(r);
        ngx_http_run_posted_requests(c);
    }

    n = 1;
    if (write(w->efd, &n, sizeof(uint64_t)) < 0) {
        /* the loop is awake anyway */
    }
}
