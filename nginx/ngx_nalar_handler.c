
/*
 * The content handler: a request in a nalar_api location is routed by its
 * endpoint (completions, chat completions, models, health) or answered as
 * a CORS preflight; a completion's body is read, parsed (inline when
 * small, else by a parse thread) and its result handed to the submit.
 * While a request waits for its parse or the engine, a client that leaves
 * is noticed.
 *
 * Event loop only.  It takes no lock itself; the submit it hands to
 * (ngx_nalar_done.c) takes the engine's queue mutex briefly, as said
 * there.
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_nalar_preflight(ngx_http_request_t *r);
static void ngx_http_nalar_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_nalar_start(ngx_http_request_t *r);
static ngx_int_t ngx_http_nalar_parsed(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_api_request *req);
static void ngx_http_nalar_watch(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx);


/* content handlers */


/*
 * Request steps return a status; an error one of them recorded with
 * ngx_http_nalar_error() is sent by ngx_http_nalar_send_error(), here and
 * where the request body or the engine's output finishes a request.
 */

ngx_int_t
ngx_http_nalar_content_handler(ngx_http_request_t *r)
{
    return ngx_http_nalar_send_error(r, ngx_http_nalar_handler(r));
}


static ngx_int_t
ngx_http_nalar_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_uint_t                 ep;
    ngx_http_nalar_ctx_t      *ctx;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_nalar_loc_conf_t *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if (nlcf->handler == NGX_HTTP_NALAR_METRICS) {
        return ngx_http_nalar_metrics_handler(r);
    }

    ep = ngx_http_nalar_endpoint(&r->uri);

    if (r->method == NGX_HTTP_OPTIONS && ep != NGX_HTTP_NALAR_EP_NONE) {
        return ngx_http_nalar_preflight(r);
    }

    switch (ep) {

    case NGX_HTTP_NALAR_EP_NONE:
        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_nalar_error(r, NGX_HTTP_NOT_FOUND,
                                    "invalid_request_error", NULL,
                                    "unknown_url", "Invalid URL (%V %V)",
                                    &r->method_name, &r->uri);

    case NGX_HTTP_NALAR_EP_MODELS:
    case NGX_HTTP_NALAR_EP_MODEL:
    case NGX_HTTP_NALAR_EP_HEALTH:
        if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
            break;
        }

        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ep == NGX_HTTP_NALAR_EP_HEALTH) {
            return ngx_http_nalar_health(r);
        }

        /* the models need the token completions need, even where
         * `satisfy any` let the request past the access phase */

        ctx = ngx_http_nalar_tenant(r);
        if (ctx == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_MISSING
            || ctx->tenant_state == NGX_HTTP_NALAR_TENANT_INVALID)
        {
            return ngx_http_nalar_unauthorized(r, ctx);
        }

        if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_REFUSED) {
            return NGX_HTTP_FORBIDDEN;
        }

        return ngx_http_nalar_models(r);

    default:
        if (!(r->method & NGX_HTTP_POST)) {
            break;
        }

        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

        if (clcf->client_max_body_size
            && r->headers_in.content_length_n > clcf->client_max_body_size)
        {
            r->keepalive = 0;

            if (ngx_http_discard_request_body(r) != NGX_OK) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            return ngx_http_nalar_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                        "invalid_request_error", NULL,
                                        "request_too_large",
                                        "Request body of %O bytes is larger "
                                        "than client_max_body_size (%O)",
                                        r->headers_in.content_length_n,
                                        clcf->client_max_body_size);
        }

        r->request_body_in_single_buf = 1;

        rc = ngx_http_read_client_request_body(r,
                                               ngx_http_nalar_body_handler);

        if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
            if (rc == NGX_HTTP_REQUEST_ENTITY_TOO_LARGE) {
                r->keepalive = 0;
                return ngx_http_nalar_error(r, rc, "invalid_request_error",
                                            NULL, "request_too_large",
                                            "Request body is larger than "
                                            "client_max_body_size (%O)",
                                            clcf->client_max_body_size);
            }

            return rc;
        }

        return NGX_DONE;
    }

    /* a known endpoint, the wrong method */

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_nalar_add_header(r, "Allow",
                                  (ep == NGX_HTTP_NALAR_EP_MODELS
                                   || ep == NGX_HTTP_NALAR_EP_MODEL
                                   || ep == NGX_HTTP_NALAR_EP_HEALTH)
                                  ? "GET, HEAD, OPTIONS" : "POST, OPTIONS")
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_nalar_error(r, NGX_HTTP_NOT_ALLOWED,
                                "invalid_request_error", NULL,
                                "method_not_allowed",
                                "Method %V is not allowed for %V",
                                &r->method_name, &r->uri);
}


/*
 * A CORS preflight: the methods and the headers asked for are allowed; the
 * origin policy (Access-Control-Allow-Origin) is the operator's, set with
 * add_header ... always.
 */

static ngx_int_t
ngx_http_nalar_preflight(ngx_http_request_t *r)
{
    ngx_int_t         rc;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h, *allow;

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_nalar_add_header(r, "Allow", "GET, HEAD, POST, OPTIONS")
        != NGX_OK
        || ngx_http_nalar_add_header(r, "Access-Control-Allow-Methods",
                                     "GET, HEAD, POST, OPTIONS")
           != NGX_OK
        || ngx_http_nalar_add_header(r, "Access-Control-Max-Age", "86400")
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == sizeof("Access-Control-Request-Headers") - 1
            && ngx_strncasecmp(h[i].key.data,
                               (u_char *) "Access-Control-Request-Headers",
                               h[i].key.len)
               == 0)
        {
            allow = ngx_list_push(&r->headers_out.headers);
            if (allow == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            allow->hash = 1;
            ngx_str_set(&allow->key, "Access-Control-Allow-Headers");
            allow->value = h[i].value;
            allow->lowcase_key = NULL;
        }
    }

    r->headers_out.status = NGX_HTTP_NO_CONTENT;
    r->headers_out.content_length_n = 0;
    r->header_only = 1;

    rc = ngx_http_send_header(r);

    return rc;
}


/* completions */


static void
ngx_http_nalar_body_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    rc = ngx_http_nalar_start(r);

    if (rc == NGX_DONE) {
        return;
    }

    ngx_http_finalize_request(r, ngx_http_nalar_send_error(r, rc));
}


/*
 * The request body becomes engine parameters (api/request.c): a
 * small body on the event loop, a larger one on the worker's parse thread,
 * whose result comes back through the done queue's eventfd.  Then one
 * engine request per choice is submitted (the engine tokenizes and checks
 * the prompt).  NGX_DONE: parsing or submitted, the response follows from
 * the done queue; anything else is what to finalize the request with.
 */

static ngx_int_t
ngx_http_nalar_start(ngx_http_request_t *r)
{
    size_t                      len;
    u_char                     *data;
    ngx_int_t                   rc;
    nalar_api_in                in;
    nalar_api_model            *models;
    nalar_api_request           req;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_parse_t     *job;
    ngx_http_nalar_loc_conf_t  *nlcf;
    ngx_http_nalar_worker_t    *w;

    w = ngx_http_nalar_worker();

    if (r->connection->error) {
        return NGX_HTTP_CLIENT_CLOSED_REQUEST;
    }

    /* the tenant first: without a valid token (where one is required; the
     * access phase has normally refused it already) nothing is parsed */

    ctx = ngx_http_nalar_tenant(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_MISSING
        || ctx->tenant_state == NGX_HTTP_NALAR_TENANT_INVALID)
    {
        return ngx_http_nalar_unauthorized(r, ctx);
    }

    if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_REFUSED) {
        return NGX_HTTP_FORBIDDEN;
    }

    ctx->endpoint = ngx_http_nalar_endpoint(&r->uri);
    ctx->logprobs = -1;
    ctx->created = ngx_time();
    ctx->usage.ttft_ms = -1;

    if (w->rt == NULL) {
        return ngx_http_nalar_error(r, NGX_HTTP_NOT_FOUND,
                                    "invalid_request_error", "model",
                                    "model_not_found",
                                    "No model is configured");
    }

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    ngx_memzero(&in, sizeof(nalar_api_in));
    in.chat = (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT);
    in.tokenize = (ctx->endpoint == NGX_HTTP_NALAR_EP_TOKENIZE);
    in.n_models = w->rt->n_models;
    in.chat_style = (int) nlcf->chat_style;
    in.tmpl = nlcf->chat_tmpl;
    in.spec_off = (nlcf->spec_mode == NALAR_SPEC_OFF);
    in.seed = ((uint64_t) ngx_random() << 32) ^ ngx_random()
              ^ (uint64_t) ngx_current_msec;

    /* the adapters it may be served by: the server's choice, or those the
     * body may name (configuration memory, which a parse thread may read) */

    rc = ngx_http_nalar_lora_in(r, &in);
    if (rc != NGX_OK) {
        return rc;
    }

    ctx->loras = in.loras;

    len = 0;

    if (r->request_body) {
        len = ngx_http_nalar_body_size(r->request_body->bufs);
    }

    if (len <= NGX_HTTP_NALAR_PARSE_INLINE || w->parsers == 0) {
        models = ngx_palloc(r->pool, in.n_models * sizeof(nalar_api_model));
        if (models == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_nalar_snapshot(models);
        in.models = models;

        if (ngx_http_nalar_read_body(r, &data, &len) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

#ifdef NALAR_TEST_HOOKS
        ngx_http_nalar_test_hold(len);
#endif

        (void) nalar_api_parse((char *) data, len, &in, &req);

        rc = ngx_http_nalar_parsed(r, ctx, &req);

        nalar_api_request_free(&req);

        return rc;
    }

    /* the parse thread's job: the body (what nginx wrote to a file is
     * read there) and what the parse must know of the models */

    job = ngx_http_nalar_parse_job(r, len, &in, ngx_http_nalar_parsed);
    if (job == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the cleanup forgets the job if the request goes first; the timer
     * holds a gracefully exiting worker until the result is answered */

    if (ngx_http_nalar_add_cleanup(r, ctx) != NGX_OK) {
        ngx_http_nalar_parse_release(job);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    job->ctx = ctx;
    ctx->parse = job;

    ngx_http_nalar_parse_post(job);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "nalar: %uz bytes of body to the parse thread", len);

    ngx_http_nalar_watch(r, ctx);

    return NGX_DONE;
}


/*
 * A parse's result, on the event loop: the request's ctx and engine
 * parameters, then the submission.  NGX_DONE: submitted.
 */

static ngx_int_t
ngx_http_nalar_parsed(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    nalar_api_request *req)
{
    ngx_int_t                   rc;
    nalar_request_params        params;
    ngx_http_nalar_model_rt_t  *model;
    ngx_http_nalar_loc_conf_t  *nlcf;
    ngx_http_nalar_worker_t    *w;

    w = ngx_http_nalar_worker();

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    model = NULL;

    if (req->model >= 0
        && (ngx_uint_t) req->model < w->rt->n_models)
    {
        model = &w->rt->models[req->model];
        ctx->model = model;
        ctx->served = (char *) model->name.data;

        if (req->lora >= 0) {
            ctx->lora = &ctx->loras[req->lora];
            ctx->served = ctx->lora->name;
        }
    }

    ctx->stream = req->stream;
    ctx->include_usage = req->include_usage;
    ctx->token_ids = req->token_ids;
    ctx->logprobs = req->logprobs;
    ctx->n = (ngx_uint_t) req->n;
    ctx->tool_mode = (ngx_uint_t) req->tool_mode;
    ctx->chat_style = (ngx_uint_t) req->chat_style;

    if (req->err.status) {
        if (req->prompt_tokens) {
            ctx->usage.n_prompt = req->prompt_tokens;
        }

        if (req->err.code && ngx_strcmp(req->err.code, "model_loading") == 0
            && ngx_http_nalar_add_header(r, "Retry-After", "1") != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_nalar_failure(r, &req->err);
    }

    if (model == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the engine is per model: the location's speculation travels with
     * the request */

    params = req->params;
    params.spec_mode = (int) nlcf->spec_mode;
    params.spec_max_k = (int) nlcf->spec_max_k;
    params.spec_fixed = (int) nlcf->spec_fixed;

    /* the prefix cache scope: from authentication, never from the body */

    if (ngx_http_nalar_scope(r, ctx, &params) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the prompt's text points into the parse's JSON until the engine's
     * requests have copied it */

    rc = ngx_http_nalar_submit(r, ctx, &params);

    if (rc != NGX_OK) {
        return rc;
    }

    /* from here on the response comes from the done queue */

    r->write_event_handler = ngx_http_nalar_write_handler;

    ngx_http_nalar_watch(r, ctx);

    return NGX_DONE;
}


/*
 * While a request waits for its parse or its engine: a client that leaves
 * is noticed (a client that hung up while its request was read has had
 * its one edge-triggered EOF event already: look again from the event
 * loop), and the timer runs (a stream's keep-alive comments; it is not
 * cancelable, so a gracefully exiting worker waits for the request).
 */

static void
ngx_http_nalar_watch(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx)
{
    ngx_event_t                *rev;
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    r->read_event_handler = ngx_http_test_reading;

    rev = r->connection->read;

    if (r->stream == NULL && (rev->pending_eof || rev->ready)) {
        ngx_post_event(rev, &ngx_posted_events);
    }

    /* a stream's header waits for the engine to accept the prompt: a
     * refused one is answered with its status (ngx_http_nalar_pump) */

    ctx->timer.handler = ngx_http_nalar_timer_handler;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;
    ctx->last_send = ngx_current_msec;

    ngx_add_timer(&ctx->timer, nlcf->keepalive);
}

