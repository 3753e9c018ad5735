
/*
 * The response: the SSE stream (header, chunks, keepalive comments, the
 * final [DONE]) and the JSON body of a non-streaming request, built from
 * what the engine produced for each choice, and the JSON writers the
 * other files send their bodies with (ngx_http_nalar_send_json).
 *
 * Event loop only.  Reads engine output through each choice's refcounted
 * nalar_request: nalar_request_take takes that request's output mutex to
 * move its buffers out (the engine thread holds it only to append a
 * token's text or set the finish), and cancelling a choice
 * (nalar_request_cancel) takes the engine's queue mutex to wake the engine
 * thread; both are short for the reason ngx_nalar_done.c gives.  No lock
 * is held across a call out of this file.
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_send_stream_header(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx);
static ngx_int_t ngx_http_nalar_take(ngx_http_nalar_ctx_t *ctx,
    ngx_uint_t i, ngx_chain_t ***ll);
static void ngx_http_nalar_cancel_rest(ngx_http_nalar_ctx_t *ctx);
static void ngx_http_nalar_end(ngx_http_nalar_ctx_t *ctx, ngx_chain_t *out,
    ngx_chain_t **ll);
static ngx_int_t ngx_http_nalar_refused(ngx_http_nalar_ctx_t *ctx,
    nalar_output *o);
static ngx_int_t ngx_http_nalar_absorb(ngx_http_nalar_ctx_t *ctx,
    ngx_uint_t i, nalar_output *out, ngx_chain_t ***ll);
static ngx_int_t ngx_http_nalar_keep(ngx_http_nalar_choice_t *ch,
    const char *text, size_t text_len, json_t *lp);
static ngx_int_t ngx_http_nalar_stream_chunks(ngx_http_nalar_ctx_t *ctx,
    ngx_uint_t i, const char *text, size_t text_len, json_t *lp,
    ngx_chain_t ***ll);
static ngx_int_t ngx_http_nalar_stream_finish(ngx_http_nalar_ctx_t *ctx,
    ngx_uint_t i, nalar_output *o, ngx_chain_t ***ll);
static ngx_int_t ngx_http_nalar_absorb_ids(ngx_http_nalar_choice_t *ch,
    nalar_output *o);
static ngx_int_t ngx_http_nalar_tokenize_response(ngx_http_nalar_ctx_t *ctx);
static ngx_int_t ngx_http_nalar_finish_response(ngx_http_nalar_ctx_t *ctx);
static json_t *ngx_http_nalar_logprobs_json(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch, nalar_output *out);
static json_t *ngx_http_nalar_token_json(ngx_http_nalar_ctx_t *ctx,
    const nalar_tokenizer *tok, int32_t id, json_t **bytes);
static json_t *ngx_http_nalar_usage_json(ngx_http_nalar_ctx_t *ctx);
static const char *ngx_http_nalar_finish_reason(nalar_finish f);
static const char *ngx_http_nalar_choice_finish(ngx_http_nalar_choice_t *ch);
static ngx_int_t ngx_http_nalar_send(ngx_http_nalar_ctx_t *ctx,
    ngx_chain_t *out);
static ngx_int_t ngx_http_nalar_output(ngx_http_nalar_ctx_t *ctx,
    ngx_chain_t *out);
static ngx_int_t ngx_http_nalar_append_raw(ngx_http_request_t *r,
    ngx_chain_t ***ll, u_char *data, size_t len);


static ngx_str_t  ngx_http_nalar_sse_type = ngx_string("text/event-stream");


static ngx_int_t
ngx_http_nalar_send_stream_header(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx)
{
    ngx_int_t                  rc;
    ngx_http_core_loc_conf_t  *clcf;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = -1;
    r->headers_out.content_type = ngx_http_nalar_sse_type;
    r->headers_out.content_type_len = ngx_http_nalar_sse_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->allow_ranges = 0;

    if (ngx_http_nalar_add_header(r, "Cache-Control", "no-cache") != NGX_OK
        || ngx_http_nalar_add_header(r, "X-Accel-Buffering", "no") != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* each step is a small write that must leave at once, not wait for
     * the client's ACK of the previous one (Nagle) */

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->tcp_nodelay && ngx_tcp_nodelay(r->connection) != NGX_OK) {
        return NGX_ERROR;
    }

    rc = ngx_http_send_header(r);

    ctx->header_sent = 1;

    if (rc == NGX_ERROR || rc > NGX_OK) {
        return rc;
    }

    /* the header goes out now, before the first token */

    rc = ngx_http_send_special(r, NGX_HTTP_FLUSH);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (r->buffered || r->connection->buffered) {
        ctx->blocked = 1;
    }

    return NGX_OK;
}


/*
 * Called for write events, and by the done queue when output is there:
 * flushes what the client has not taken yet (under send_timeout), then
 * takes more from the engine.
 */

void
ngx_http_nalar_write_handler(ngx_http_request_t *r)
{
    ngx_event_t           *wev;
    ngx_connection_t      *c;
    ngx_http_nalar_ctx_t  *ctx;

    c = r->connection;
    wev = c->write;
    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx == NULL || ctx->done) {
        return;
    }

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "nalar: client timed out");
        c->timedout = 1;
        ctx->done = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (ctx->blocked) {
        if (ngx_http_nalar_send(ctx, NULL) != NGX_OK) {
            return;
        }

        ctx->blocked = 0;

        /*
         * the send_timeout timer; not limit_rate's delay, which the write
         * filter may have just set (wev->delayed): deleting it would leave
         * the connection delayed with nothing to end the delay
         */
        if (wev->timer_set && !wev->delayed) {
            ngx_del_timer(wev);
        }
    }

    ngx_http_nalar_pump(ctx);
}


/* Takes what the engine has produced for every choice and sends it. */

void
ngx_http_nalar_pump(ngx_http_nalar_ctx_t *ctx)
{
    ngx_int_t     rc;
    ngx_uint_t    i;
    ngx_chain_t  *out, **ll, *cl;

    out = NULL;
    ll = &out;

    for (i = 0; i < ctx->n; i++) {
        rc = ngx_http_nalar_take(ctx, i, &ll);

        if (rc == NGX_DONE) {
            return;
        }

        if (rc == NGX_DECLINED) {
            continue;
        }

        if (ctx->failed) {
            break;
        }
    }

    /* a choice that failed mid-stream ends the stream: the others are
     * cancelled, and [DONE] follows its error event */

    if (ctx->failed) {
        ngx_http_nalar_cancel_rest(ctx);
    }

    if (ctx->n_done == ctx->n) {
        ngx_http_nalar_end(ctx, out, ll);
        return;
    }

    if (out == NULL) {
        return;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }
    cl->buf->flush = 1;

    ctx->last_send = ngx_current_msec;

    (void) ngx_http_nalar_send(ctx, out);
}


/*
 * What the engine has for choice i, taken: appended to the stream (or the
 * text) at *ll.  NGX_DECLINED: nothing new; NGX_DONE: the request was
 * finalized (an error, or the stream's header could not go).
 */

static ngx_int_t
ngx_http_nalar_take(ngx_http_nalar_ctx_t *ctx, ngx_uint_t i,
    ngx_chain_t ***ll)
{
    ngx_int_t                 rc;
    nalar_output              o;
    ngx_http_request_t       *r;
    ngx_http_nalar_choice_t  *ch;

    r = ctx->request;
    ch = &ctx->choices[i];

    if (ch->slot == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(&o, sizeof(nalar_output));

    if (!nalar_request_take(ch->slot->req, &o)) {
        nalar_output_free(&o);
        return NGX_DECLINED;
    }

    if (o.finish == NALAR_FINISH_ERROR && !ctx->header_sent
        && !(ctx->stream && o.accepted))
    {
        /* refused, or failed before any part of a response that is
         * not streamed: an error response; the cleanup cancels the
         * other choices.  An accepted stream starts (below) and its
         * failure is an error event. */
        ctx->usage.n_prompt = o.usage.n_prompt;
        rc = ngx_http_nalar_refused(ctx, &o);
        nalar_output_free(&o);
        ctx->done = 1;
        ngx_http_finalize_request(r, ngx_http_nalar_send_error(r, rc));
        return NGX_DONE;
    }

    if (ctx->stream && !ctx->header_sent && o.accepted) {
        rc = ngx_http_nalar_send_stream_header(r, ctx);
        if (rc == NGX_ERROR || rc > NGX_OK) {
            nalar_output_free(&o);
            ctx->done = 1;
            ngx_http_finalize_request(r, rc);
            return NGX_DONE;
        }
    }

    rc = ngx_http_nalar_absorb(ctx, i, &o, ll);

    nalar_output_free(&o);

    if (rc != NGX_OK) {
        ctx->done = 1;
        ngx_http_finalize_request(r, ngx_http_nalar_send_error(r, rc));
        return NGX_DONE;
    }

    if (ch->finish != NALAR_FINISH_NONE) {
        ngx_http_nalar_slot_release(ch->slot);
        ch->slot = NULL;
        ctx->n_done++;
    }

    return NGX_OK;
}


/* The choices still running after one failed mid-stream: cancelled. */

static void
ngx_http_nalar_cancel_rest(ngx_http_nalar_ctx_t *ctx)
{
    ngx_uint_t                i;
    ngx_http_nalar_choice_t  *ch;

    for (i = 0; i < ctx->n; i++) {
        ch = &ctx->choices[i];

        if (ch->slot == NULL) {
            continue;
        }

        if (ch->submitted && ch->slot->req) {
            nalar_request_cancel(ch->slot->req);
        }

        ngx_http_nalar_slot_release(ch->slot);
        ch->slot = NULL;
        ctx->n_done++;
    }
}


/*
 * Every choice has finished: the response, or the stream's end (its usage
 * chunk where asked for, and [DONE]) after what `out` holds; the request
 * is finalized.
 */

static void
ngx_http_nalar_end(ngx_http_nalar_ctx_t *ctx, ngx_chain_t *out,
    ngx_chain_t **ll)
{
    json_t              *u;
    ngx_chain_t         *cl;
    ngx_http_request_t  *r;

    r = ctx->request;
    ctx->done = 1;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    if (!ctx->stream) {
        ngx_http_finalize_request(r, ngx_http_nalar_finish_response(ctx));
        return;
    }

    if (ctx->include_usage && !ctx->failed) {
        u = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}",
                      "id", ctx->id,
                      "object", ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
                                ? "chat.completion.chunk"
                                : "text_completion",
                      "created", (json_int_t) ctx->created,
                      "model", ctx->served,
                      "choices",
                      "usage", ngx_http_nalar_usage_json(ctx));

        if (ngx_http_nalar_append_event(ctx, &ll, u) != NGX_OK) {
            json_decref(u);
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }

        json_decref(u);
    }

    if (ngx_http_nalar_append_raw(r, &ll, (u_char *) "data: [DONE]\n\n",
                                  sizeof("data: [DONE]\n\n") - 1)
        != NGX_OK)
    {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }

    cl->buf->last_buf = (r == r->main) ? 1 : 0;
    cl->buf->last_in_chain = 1;
    cl->buf->flush = 1;

    ngx_http_finalize_request(r, ngx_http_output_filter(r, out));
}


/*
 * The response to a request the engine refused (its prompt: 400 with the
 * error code) or failed before anything was sent: the engine's error as
 * it filled it.
 */

static ngx_int_t
ngx_http_nalar_refused(ngx_http_nalar_ctx_t *ctx, nalar_output *o)
{
    ngx_http_request_t  *r;

    r = ctx->request;

    if (o->error.status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "nalar: model \"%V\": %s", &ctx->model->name,
                      o->error.message);
    }

    return ngx_http_nalar_failure(r, &o->error);
}


/*
 * One take of one choice: usage, and either an SSE chunk appended to the
 * output or the text accumulated for the final response.
 */

static ngx_int_t
ngx_http_nalar_absorb(ngx_http_nalar_ctx_t *ctx, ngx_uint_t i,
    nalar_output *o, ngx_chain_t ***ll)
{
    json_t                   *lp;
    size_t                    text_len;
    const char               *text;
    ngx_http_nalar_choice_t  *ch;

    ch = &ctx->choices[i];

    if (i == 0) {
        ctx->usage = o->usage;
    }

    ch->usage = o->usage;
    ch->finish = o->finish;

    /* /tokenize: the prompt's ids are the output */

    if (ctx->endpoint == NGX_HTTP_NALAR_EP_TOKENIZE) {
        return ngx_http_nalar_absorb_ids(ch, o);
    }

    /* the text: the engine's, or with tools the content part of it */

    text = o->text;
    text_len = o->text_len;

    if (ctx->tool_mode != NALAR_API_TOOLS_NONE
        && ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
        && ngx_http_nalar_tools_take(ctx, ch, o, &text, &text_len) != NGX_OK)
    {
        return NGX_ERROR;
    }

    lp = NULL;

    if (ctx->logprobs >= 0 && o->n_ids > 0) {
        lp = ngx_http_nalar_logprobs_json(ctx, ch, o);
        if (lp == NULL) {
            return NGX_ERROR;
        }
    }

    if (!ctx->stream) {
        return ngx_http_nalar_keep(ch, text, text_len, lp);
    }

    if (ngx_http_nalar_stream_chunks(ctx, i, text, text_len, lp, ll)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_nalar_stream_finish(ctx, i, o, ll);
}


/* Not streamed: the take's text and logprobs (whose reference it takes)
 * kept for the response. */

static ngx_int_t
ngx_http_nalar_keep(ngx_http_nalar_choice_t *ch, const char *text,
    size_t text_len, json_t *lp)
{
    u_char      *p;
    json_t      *val;
    const char  *key;

    if (text_len) {
        p = ngx_array_push_n(ch->text, text_len);
        if (p == NULL) {
            json_decref(lp);
            return NGX_ERROR;
        }

        ngx_memcpy(p, text, text_len);
    }

    if (lp == NULL) {
        return NGX_OK;
    }

    if (ch->logprobs == NULL) {
        ch->logprobs = lp;
        return NGX_OK;
    }

    /* append each list of this take to the accumulated one */

    json_object_foreach(lp, key, val) {
        json_array_extend(json_object_get(ch->logprobs, key), val);
    }

    json_decref(lp);

    return NGX_OK;
}


/*
 * Streaming, in OpenAI's order: for chat a first chunk with the role,
 * then a chunk per take with text (and its logprobs, whose reference this
 * takes), the tool calls' chunks, then (ngx_http_nalar_stream_finish) one
 * with the finish_reason (empty text or delta).  A take with neither text
 * nor finish (a character still incomplete, a control token) says
 * nothing.
 */

static ngx_int_t
ngx_http_nalar_stream_chunks(ngx_http_nalar_ctx_t *ctx, ngx_uint_t i,
    const char *text, size_t text_len, json_t *lp, ngx_chain_t ***ll)
{
    json_t                   *choice;
    ngx_http_nalar_choice_t  *ch;

    ch = &ctx->choices[i];

    if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT && !ch->role_sent) {
        ch->role_sent = 1;

        choice = json_pack("{s:I,s:{s:s,s:s},s:n,s:n}",
                           "index", (json_int_t) i,
                           "delta", "role", "assistant", "content", "",
                           "logprobs", "finish_reason");

        if (ngx_http_nalar_append_chunk(ctx, ll, choice) != NGX_OK) {
            json_decref(lp);
            return NGX_ERROR;
        }
    }

    if (text == NULL) {
        text = "";
    }

    if (text_len || (lp && ch->tools == NULL)) {
        if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT) {
            choice = json_pack("{s:I,s:{s:s%},s:O?,s:n}",
                               "index", (json_int_t) i,
                               "delta", "content", text, text_len,
                               "logprobs", lp,
                               "finish_reason");
        } else {
            choice = json_pack("{s:s%,s:I,s:O?,s:n}",
                               "text", text, text_len,
                               "index", (json_int_t) i,
                               "logprobs", lp,
                               "finish_reason");
        }

        if (ngx_http_nalar_append_chunk(ctx, ll, choice) != NGX_OK) {
            json_decref(lp);
            return NGX_ERROR;
        }

        json_decref(lp);
        lp = NULL;
    }

    if (ch->tools && ngx_http_nalar_call_chunks(ctx, i, ll) != NGX_OK) {
        json_decref(lp);
        return NGX_ERROR;
    }

    if (lp) {
        /* the logprobs of a take that was all call: in a chunk of their
         * own */
        choice = json_pack("{s:I,s:{},s:O,s:n}", "index", (json_int_t) i,
                           "delta", "logprobs", lp, "finish_reason");

        if (ngx_http_nalar_append_chunk(ctx, ll, choice) != NGX_OK) {
            json_decref(lp);
            return NGX_ERROR;
        }
    }

    json_decref(lp);

    return NGX_OK;
}


/* A streamed choice's end: its finish_reason, or an error event. */

static ngx_int_t
ngx_http_nalar_stream_finish(ngx_http_nalar_ctx_t *ctx, ngx_uint_t i,
    nalar_output *o, ngx_chain_t ***ll)
{
    json_t                   *chunk, *choice;
    ngx_http_nalar_choice_t  *ch;

    ch = &ctx->choices[i];

    if (o->finish == NALAR_FINISH_ERROR) {
        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "nalar: model \"%V\": %s", &ctx->model->name,
                      o->error.message);

        /* mid-stream, after the text confirmed before the failure: an
         * error event, then the stream ends as usual (a response that is
         * not streamed fails in ngx_http_nalar_pump()) */

        chunk = nalar_api_error_json(&o->error);
        if (chunk == NULL
            || ngx_http_nalar_append_event(ctx, ll, chunk) != NGX_OK)
        {
            json_decref(chunk);
            return NGX_ERROR;
        }

        json_decref(chunk);
        ctx->failed = 1;
        return NGX_OK;
    }

    if (o->finish == NALAR_FINISH_NONE) {
        return NGX_OK;
    }

    if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT) {
        choice = json_pack("{s:I,s:{},s:n,s:s}",
                           "index", (json_int_t) i,
                           "delta",
                           "logprobs",
                           "finish_reason",
                           ngx_http_nalar_choice_finish(ch));
    } else {
        choice = json_pack("{s:s,s:I,s:n,s:s}",
                           "text", "",
                           "index", (json_int_t) i,
                           "logprobs",
                           "finish_reason",
                           ngx_http_nalar_finish_reason(o->finish));
    }

    return ngx_http_nalar_append_chunk(ctx, ll, choice);
}


/* /tokenize: the ids, as decimal text with a comma after each */

static ngx_int_t
ngx_http_nalar_absorb_ids(ngx_http_nalar_choice_t *ch, nalar_output *o)
{
    u_char      *p, *q;
    int32_t      i;
    ngx_uint_t   at;

    at = ch->text->nelts;

    p = ngx_array_push_n(ch->text, (ngx_uint_t) o->n_ids * NGX_INT32_LEN + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    q = p;

    for (i = 0; i < o->n_ids; i++) {
        q = ngx_sprintf(q, "%D,", o->ids[i]);
    }

    ch->text->nelts = at + (q - p);

    return NGX_OK;
}


/* vLLM's answer: {"count", "max_model_len", "tokens"} */

static ngx_int_t
ngx_http_nalar_tokenize_response(ngx_http_nalar_ctx_t *ctx)
{
    u_char              *p, *ids;
    size_t               len, n;
    ngx_buf_t           *b;
    nalar_model         *m;
    ngx_http_request_t  *r;

    r = ctx->request;
    m = nalar_engine_model(ctx->model->engine);

    ids = ctx->choices[0].text->elts;
    n = ctx->choices[0].text->nelts;

    /* the ids' text without its last comma */
    if (n > 0) {
        n--;
    }

    len = sizeof("{\"tokens\": [], \"count\": , \"max_model_len\": }\n")
          - 1 + n + 2 * NGX_INT32_LEN;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_ERROR;
    }

    p = ngx_sprintf(b->last, "{\"tokens\": [%*s], \"count\": %D, "
                    "\"max_model_len\": %D}", n, ids, ctx->usage.n_prompt,
                    nalar_model_n_ctx(m));
    *p++ = '\n';
    b->last = p;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    return ngx_http_nalar_send_buf(r, NGX_HTTP_OK, b);
}


/* The non-streaming response, once every choice has finished. */

static ngx_int_t
ngx_http_nalar_finish_response(ngx_http_nalar_ctx_t *ctx)
{
    json_t                   *root, *choices, *c;
    ngx_int_t                 rc;
    ngx_uint_t                i;
    const char               *reason;
    ngx_http_request_t       *r;
    ngx_http_nalar_choice_t  *ch;

    r = ctx->request;

    if (ctx->endpoint == NGX_HTTP_NALAR_EP_TOKENIZE) {
        return ngx_http_nalar_tokenize_response(ctx);
    }

    choices = json_array();
    if (choices == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < ctx->n; i++) {
        ch = &ctx->choices[i];
        reason = ngx_http_nalar_choice_finish(ch);

        if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
            && ch->tools && nalar_toolp_n_named(ch->tools) > 0)
        {
            /* calls: content null when there is none besides them */
            c = json_pack("{s:I,s:{s:s,s:s%,s:o},s:O?,s:s}",
                          "index", (json_int_t) i,
                          "message", "role", "assistant",
                          "content", ch->text->elts, ch->text->nelts,
                          "tool_calls",
                          ngx_http_nalar_tool_calls_json(ctx, ch),
                          "logprobs", ch->logprobs,
                          "finish_reason", reason);

            if (c != NULL && ch->text->nelts == 0) {
                json_object_set_new(json_object_get(c, "message"), "content",
                                    json_null());
            }

        } else if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT) {
            c = json_pack("{s:I,s:{s:s,s:s%},s:O?,s:s}",
                          "index", (json_int_t) i,
                          "message", "role", "assistant",
                          "content", ch->text->elts, ch->text->nelts,
                          "logprobs", ch->logprobs,
                          "finish_reason", reason);

        } else {
            c = json_pack("{s:s%,s:I,s:O?,s:s}",
                          "text", ch->text->elts, ch->text->nelts,
                          "index", (json_int_t) i,
                          "logprobs", ch->logprobs,
                          "finish_reason", reason);
        }

        if (c == NULL || json_array_append_new(choices, c) != 0) {
            json_decref(choices);
            return NGX_ERROR;
        }
    }

    root = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}",
                     "id", ctx->id,
                     "object", ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
                               ? "chat.completion" : "text_completion",
                     "created", (json_int_t) ctx->created,
                     "model", ctx->served,
                     "choices", choices,
                     "usage", ngx_http_nalar_usage_json(ctx));
    if (root == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_nalar_send_json(r, NGX_HTTP_OK, root);
    json_decref(root);

    return rc;
}


/*
 * Log probabilities of one take, in the endpoint's shape:
 *   completions: {tokens, token_logprobs, top_logprobs, text_offset}
 *   chat:        {content: [{token, logprob, bytes, top_logprobs}]}
 */

static json_t *
ngx_http_nalar_logprobs_json(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch, nalar_output *o)
{
    int32_t                 k, j, n_top, tok_id;
    json_t                 *res, *tokens, *lps, *tops, *offs, *content, *t,
                           *top, *item, *bytes;
    nalar_logprob          *row;
    const nalar_tokenizer  *tok;

    tok = nalar_model_tokenizer(nalar_engine_model(ctx->model->engine));
    n_top = ctx->logprobs > 0 ? (int32_t) ctx->logprobs : 0;

    if (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT) {
        content = json_array();
        res = json_pack("{s:o}", "content", content);
        if (res == NULL) {
            return NULL;
        }

        for (k = 0; k < o->n_ids; k++) {
            row = o->logprobs ? &o->logprobs[k * (1 + n_top)] : NULL;
            tok_id = o->ids[k];

            t = ngx_http_nalar_token_json(ctx, tok, tok_id, &bytes);
            top = json_array();

            item = json_pack("{s:o,s:f,s:o,s:o}", "token", t,
                             "logprob", row ? (double) row[0].logprob : 0.0,
                             "bytes", bytes, "top_logprobs", top);
            if (item == NULL) {
                json_decref(res);
                return NULL;
            }

            for (j = 1; row && j <= n_top; j++) {
                t = ngx_http_nalar_token_json(ctx, tok, row[j].id, &bytes);
                json_array_append_new(top,
                                      json_pack("{s:o,s:f,s:o}", "token", t,
                                                "logprob",
                                                (double) row[j].logprob,
                                                "bytes", bytes));
            }

            json_array_append_new(content, item);
        }

        return res;
    }

    tokens = json_array();
    lps = json_array();
    tops = json_array();
    offs = json_array();

    res = json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens,
                    "token_logprobs", lps, "top_logprobs", tops,
                    "text_offset", offs);
    if (res == NULL) {
        return NULL;
    }

    for (k = 0; k < o->n_ids; k++) {
        row = o->logprobs ? &o->logprobs[k * (1 + n_top)] : NULL;

        t = ngx_http_nalar_token_json(ctx, tok, o->ids[k], &bytes);
        json_array_append_new(offs, json_integer((json_int_t)
                                                 ch->text_offset));
        ch->text_offset += json_array_size(bytes);
        json_decref(bytes);

        json_array_append_new(tokens, t);
        json_array_append_new(lps, json_real(row ? row[0].logprob : 0.0));

        top = json_object();

        for (j = 1; row && j <= n_top; j++) {
            t = ngx_http_nalar_token_json(ctx, tok, row[j].id, &bytes);
            json_decref(bytes);

            if (json_is_string(t)) {
                json_object_set_new(top, json_string_value(t),
                                    json_real(row[j].logprob));
            }

            json_decref(t);
        }

        json_array_append_new(tops, top);
    }

    return res;
}


/*
 * A token as OpenAI shows it: its text, or "bytes:\xNN..." when its bytes
 * are not valid UTF-8 on their own; *bytes gets the byte values.
 */

static json_t *
ngx_http_nalar_token_json(ngx_http_nalar_ctx_t *ctx,
    const nalar_tokenizer *tok, int32_t id, json_t **bytes)
{
    int      n, k;
    u_char   buf[256], esc[sizeof("bytes:") + 4 * 256], *p;
    json_t  *s;

    n = nalar_token_bytes(tok, id, (char *) buf, sizeof(buf));
    if (n < 0) {
        n = 0;
    }

    *bytes = json_array();

    for (k = 0; k < n; k++) {
        json_array_append_new(*bytes, json_integer(buf[k]));
    }

    if (ctx->token_ids) {
        p = ngx_sprintf(esc, "token_id:%D", id);
        return json_stringn((char *) esc, p - esc);
    }

    s = json_stringn((char *) buf, n);

    if (s == NULL) {
        p = ngx_cpymem(esc, "bytes:", 6);

        for (k = 0; k < n; k++) {
            p = ngx_sprintf(p, "\\x%02xd", buf[k]);
        }

        s = json_stringn((char *) esc, p - esc);
    }

    return s;
}


static json_t *
ngx_http_nalar_usage_json(ngx_http_nalar_ctx_t *ctx)
{
    ngx_uint_t  i;
    json_int_t  completion, accepted, rejected;

    completion = 0;
    accepted = 0;
    rejected = 0;

    for (i = 0; i < ctx->n; i++) {
        completion += ctx->choices[i].usage.n_completion;
        accepted += ctx->choices[i].usage.pred_accepted;
        rejected += ctx->choices[i].usage.pred_rejected;
    }

    /* as OpenAI: the prediction's details are there, zero, without one */

    return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I,s:I}}",
                     "prompt_tokens", (json_int_t) ctx->usage.n_prompt,
                     "completion_tokens", completion,
                     "total_tokens", (json_int_t) ctx->usage.n_prompt
                                     + completion,
                     "prompt_tokens_details",
                     "cached_tokens", (json_int_t) ctx->usage.n_cached,
                     "completion_tokens_details",
                     "accepted_prediction_tokens", accepted,
                     "rejected_prediction_tokens", rejected);
}


static const char *
ngx_http_nalar_finish_reason(nalar_finish f)
{
    return (f == NALAR_FINISH_LENGTH) ? "length" : "stop";
}


/* "tool_calls" for an answer of calls that ended by itself */

static const char *
ngx_http_nalar_choice_finish(ngx_http_nalar_choice_t *ch)
{
    if (ch->finish == NALAR_FINISH_STOP && ch->tools
        && nalar_toolp_n_named(ch->tools) > 0)
    {
        return "tool_calls";
    }

    return ngx_http_nalar_finish_reason(ch->finish);
}


/*
 * Sends a chain of the stream (NULL: only what the client has not taken
 * yet).  NGX_OK: the client took everything.  NGX_AGAIN: it has not; the
 * stream is blocked (backpressure: nothing more is taken from the engine
 * until the client catches up) and the write event armed.  NGX_ERROR: the
 * request is finalized.  send_timeout runs between two writes that made
 * progress: it is armed where it does not run, and again after a blocked
 * stream's write that made progress; never in place of limit_rate's delay.
 */

static ngx_int_t
ngx_http_nalar_send(ngx_http_nalar_ctx_t *ctx, ngx_chain_t *out)
{
    off_t                      sent;
    ngx_uint_t                 blocked;
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = ctx->request;
    c = r->connection;
    wev = c->write;
    blocked = ctx->blocked;
    sent = c->sent;

    if (ngx_http_nalar_output(ctx, out) == NGX_ERROR) {
        goto failed;
    }

    if (!r->buffered && !c->buffered) {
        return NGX_OK;
    }

    if (!blocked) {
        ctx->blocked = 1;

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "nalar stream blocked: the client is slow");
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (!wev->delayed && (!wev->timer_set || (blocked && c->sent != sent))) {
        ngx_add_timer(wev, clcf->send_timeout);
    }

    if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
        goto failed;
    }

    return NGX_AGAIN;

failed:

    ctx->done = 1;
    ngx_http_finalize_request(r, NGX_ERROR);

    return NGX_ERROR;
}


/* Sends a chain of the stream and recycles the buffers already sent. */

static ngx_int_t
ngx_http_nalar_output(ngx_http_nalar_ctx_t *ctx, ngx_chain_t *out)
{
    ngx_int_t  rc;

    rc = ngx_http_output_filter(ctx->request, out);

    ngx_chain_update_chains(ctx->request->pool, &ctx->free, &ctx->busy, &out,
                            (ngx_buf_tag_t) &ngx_nalar_module);

    return rc;
}


static ngx_int_t
ngx_http_nalar_append_raw(ngx_http_request_t *r, ngx_chain_t ***ll,
    u_char *data, size_t len)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ngx_calloc_buf(r->pool);
    cl = ngx_alloc_chain_link(r->pool);
    if (b == NULL || cl == NULL) {
        return NGX_ERROR;
    }

    b->pos = data;
    b->last = data + len;
    b->memory = 1;

    cl->buf = b;
    cl->next = NULL;
    **ll = cl;
    *ll = &cl->next;

    return NGX_OK;
}


/*
 * SSE comments keep idle streams (queued requests) from being cut by
 * proxies.  The timer is not cancelable, so a worker that is shutting down
 * gracefully waits for its streams to finish.
 */

void
ngx_http_nalar_timer_handler(ngx_event_t *ev)
{
    ngx_int_t                   rc;
    ngx_chain_t                *out, **ll;
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    ctx = ev->data;
    r = ctx->request;
    c = r->connection;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if (ctx->done) {
        return;
    }

    ngx_add_timer(ev, nlcf->keepalive);

    if (!ctx->stream || !ctx->header_sent || ctx->blocked
        || ngx_current_msec - ctx->last_send < nlcf->keepalive)
    {
        return;
    }

    out = NULL;
    ll = &out;

    if (ngx_http_nalar_append_raw(r, &ll, (u_char *) ": keep-alive\n\n",
                                  sizeof(": keep-alive\n\n") - 1)
        != NGX_OK)
    {
        ctx->done = 1;
        ngx_http_finalize_request(r, NGX_ERROR);
        ngx_http_run_posted_requests(c);
        return;
    }

    out->buf->flush = 1;
    ctx->last_send = ngx_current_msec;

    rc = ngx_http_nalar_output(ctx, out);

    if (rc == NGX_ERROR) {
        ctx->done = 1;
        ngx_http_finalize_request(r, NGX_ERROR);

    } else if (r->buffered || c->buffered) {
        ctx->blocked = 1;
        r->write_event_handler(r);
    }

    ngx_http_run_posted_requests(c);
}
