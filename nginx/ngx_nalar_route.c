
/*
 * Routing at an edge nginx that loads the module without a model and
 * proxies to engine nodes:
 *
 *   upstream nodes { hash $nalar_route_key consistent; server ...; }
 *
 * $nalar_route_key is a digest of the request's prefix cache scope (the
 * tenant, as nalar_tenant or nalar_jwt_key establish it), the model named
 * before the prompt, and the leading prompt text, so that requests whose
 * prompts begin alike reach the node that has that beginning cached.
 *
 * The leading prompt text is at most nalar_route_prefix bytes (decoded):
 * for completions, the beginning of the prompt (of the first prompt of a
 * batch; token ids as their decimal text); for chat, the leading system
 * (or developer) messages, or where the conversation does not start with
 * one, its first message.  Every turn of a conversation, and every
 * request that carries a tenant's system prompt, thus gets the same key
 * whatever follows: the node that cached the system prompt and the
 * earlier turns gets the next turn too.
 *
 * The text is found by api/route_text.c.  The body is the one
 * proxy_pass reads (without blocking) before it picks a peer, which is
 * when the upstream evaluates the key; it is left as it is.  Only its
 * first bytes are looked at (NGX_HTTP_NALAR_ROUTE_SCAN plus
 * 8 bytes per byte of prefix, enough for escaped text), and only up to
 * the end of the leading text, so the work is bounded whatever the body's
 * size; what is not found there is not in the key.  A body that is
 * missing, not read yet, or not JSON gets the scope's own key: the edge
 * routes it, the node answers with the error.
 *
 * The body filter here ends, with an SSE error event and [DONE], a stream
 * whose node went away before it finished (nginx would otherwise flush
 * what it had and close the connection, which an SSE client may take for
 * a complete answer).
 *
 * Event loop only.
 */

#include "ngx_nalar_module.h"
#include "route_text.h"


#define NGX_HTTP_NALAR_ROUTE_SCAN   (64 * 1024)
#define NGX_HTTP_NALAR_ROUTE_MODEL  256
#define NGX_HTTP_NALAR_ROUTE_HEX    32          /* 128 bits of SHA-256 */
#define NGX_HTTP_NALAR_ROUTE_EVENT  (1024 * 1024)   /* the longest event an
                                                       edge holds back */
#define NGX_HTTP_NALAR_ROUTE_HOLD   4096            /* a held buffer's
                                                       first size */


static ngx_int_t ngx_http_nalar_route_body(ngx_http_request_t *r,
    size_t limit, u_char **data, size_t *len);
static ngx_int_t ngx_http_nalar_route_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_nalar_route_pass(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_chain_t *held, ngx_chain_t *in,
    ngx_chain_t *upto, ngx_uint_t error);
static ngx_int_t ngx_http_nalar_route_hold(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, u_char *p, u_char *last);


static ngx_http_output_body_filter_pt  ngx_http_nalar_route_next_filter;

static u_char  ngx_http_nalar_route_error[] =
    "data: {\"error\":{\"message\":\"The engine node serving this stream "
    "went away before it finished\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"node_failed\"}}\n\n"
    "data: [DONE]\n\n";


ngx_int_t
ngx_http_nalar_route_init(ngx_conf_t *cf)
{
    ngx_http_nalar_route_next_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_nalar_route_filter;

    return NGX_OK;
}


/*
 * nalar_route_prefix SIZE;
 * How much leading prompt text $nalar_route_key reads; it also makes the
 * location an edge, where nalar_jwt_key refuses a request without a valid
 * token (as in a nalar_api location) and nginx's own error pages become
 * OpenAI's error JSON.
 */

char *
ngx_http_nalar_route_prefix(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ssize_t     size;
    ngx_str_t  *value;

    if (nlcf->route_prefix != NGX_CONF_UNSET_SIZE) {
        return "is duplicate";
    }

    value = cf->args->elts;

    size = ngx_parse_size(&value[1]);

    if (size == NGX_ERROR || size < 1 || size > 1024 * 1024) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\": a size from 1 to 1m "
                           "expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    nlcf->route_prefix = (size_t) size;
    nlcf->route_edge = 1;

    return NGX_CONF_OK;
}


/*
 * $nalar_route_key: 32 hex digits.  It is kept once the body has been
 * read; evaluated before (in a rewrite, say), it is the scope's key and
 * is worked out again later.
 */

ngx_int_t
ngx_http_nalar_route_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                     *body, *text, *p, *in;
    size_t                      len, text_len, model_len, in_len;
    ngx_int_t                   rc;
    ngx_str_t                   scope;
    ngx_uint_t                  ep;
    unsigned int                md_len;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;
    u_char                      md[EVP_MAX_MD_SIZE];
    u_char                      model[NGX_HTTP_NALAR_ROUTE_MODEL];

    ctx = ngx_http_nalar_tenant(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    if (ctx->route_key.len) {
        goto done;
    }

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    /* the scope the nodes' caches will use: none is shared across
     * tenants unless the cache scope is global */

    ngx_str_null(&scope);

    if (nlcf->cache_scope != NGX_HTTP_NALAR_SCOPE_GLOBAL
        && ctx->tenant_state == NGX_HTTP_NALAR_TENANT_OK
        && ctx->scope.len)
    {
        scope = ctx->scope;
    }

    ep = ngx_http_nalar_endpoint(&r->uri);
    text_len = 0;
    model_len = 0;
    text = NULL;

    rc = NGX_DECLINED;

    if (ep == NGX_HTTP_NALAR_EP_COMPLETIONS || ep == NGX_HTTP_NALAR_EP_CHAT) {
        rc = ngx_http_nalar_route_body(r, NGX_HTTP_NALAR_ROUTE_SCAN
                                          + 8 * nlcf->route_prefix,
                                       &body, &len);
        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (rc == NGX_OK) {
        text = ngx_pnalloc(r->pool, nlcf->route_prefix);
        if (text == NULL) {
            return NGX_ERROR;
        }

        text_len = nalar_route_text(body, len, ep == NGX_HTTP_NALAR_EP_CHAT,
                                    text, nlcf->route_prefix, model,
                                    sizeof(model), &model_len);
    }

    /* scope, endpoint, model and text, each but the last with its
     * length; no text: the scope's own key */

    in_len = 3 * NGX_SIZE_T_LEN + 8 + scope.len + model_len + text_len;

    in = ngx_pnalloc(r->pool, in_len);
    if (in == NULL) {
        return NGX_ERROR;
    }

    p = ngx_sprintf(in, "%uz:%V:", scope.len, &scope);

    if (text_len) {
        p = ngx_sprintf(p, "%c:%uz:", ep == NGX_HTTP_NALAR_EP_CHAT ? 'c' : 'p',
                        model_len);
        p = ngx_cpymem(p, model, model_len);
        p = ngx_cpymem(p, text, text_len);
    }

    md_len = 0;

    if (EVP_Digest(in, p - in, md, &md_len, EVP_sha256(), NULL) != 1
        || md_len < NGX_HTTP_NALAR_ROUTE_HEX / 2)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "nalar: SHA-256 failed");
        return NGX_ERROR;
    }

    p = ngx_pnalloc(r->pool, NGX_HTTP_NALAR_ROUTE_HEX);
    if (p == NULL) {
        return NGX_ERROR;
    }

    (void) ngx_hex_dump(p, md, NGX_HTTP_NALAR_ROUTE_HEX / 2);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "nalar route key: %*s, %uz bytes of text",
                   (size_t) NGX_HTTP_NALAR_ROUTE_HEX, p, text_len);

    if (rc == NGX_DECLINED && r->request_body == NULL
        && (ep == NGX_HTTP_NALAR_EP_COMPLETIONS
            || ep == NGX_HTTP_NALAR_EP_CHAT))
    {
        /* the body is still to come: not kept */
        v->len = NGX_HTTP_NALAR_ROUTE_HEX;
        v->data = p;
        goto value;
    }

    ctx->route_key.data = p;
    ctx->route_key.len = NGX_HTTP_NALAR_ROUTE_HEX;
    ctx->route_text = (text_len != 0);

done:

    v->len = ctx->route_key.len;
    v->data = ctx->route_key.data;

value:

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * The body's first bytes, at most `limit`: NGX_DECLINED where there is no
 * whole body to look at (none, not read yet, or read without buffering).
 * A part nginx wrote to its temporary file is read back with one pread of
 * at most `limit` bytes, a bounded read of what was just written.
 */

static ngx_int_t
ngx_http_nalar_route_body(ngx_http_request_t *r, size_t limit, u_char **data,
    size_t *len)
{
    off_t         offset;
    u_char       *p;
    size_t        size, n;
    ssize_t       got;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (r->request_body == NULL
        || r->request_body_no_buffering
        || r->reading_body
        || r->request_body->rest)
    {
        return NGX_DECLINED;
    }

    size = ngx_min(ngx_http_nalar_body_size(r->request_body->bufs), limit);

    if (size == 0) {
        return NGX_DECLINED;
    }

    p = ngx_pnalloc(r->pool, size);
    if (p == NULL) {
        return NGX_ERROR;
    }

    *data = p;

    for (cl = r->request_body->bufs; cl && size; cl = cl->next) {
        b = cl->buf;
        n = ngx_min((size_t) ngx_buf_size(b), size);

        if (n == 0) {
            continue;
        }

        if (b->in_file) {
            /* ngx_read_file() moves the offset temporary files are
             * written at */
            offset = b->file->offset;
            got = ngx_read_file(b->file, p, n, b->file_pos);
            b->file->offset = offset;

            if (got == NGX_ERROR) {
                return NGX_DECLINED;
            }

            n = (size_t) got;

        } else {
            ngx_memcpy(p, b->pos, n);
        }

        p += n;
        size -= n;
    }

    *len = p - *data;

    return NGX_OK;
}


/*
 * An edge passes a node's stream on in whole events.  What comes after the
 * stream's last empty line ("\n\n", or "\r\n\r\n") is the beginning of an
 * event: it is copied to ctx->route_held and goes out with the rest of
 * that event.  The node's buffers are marked sent up to where they were
 * passed on, so the upstream reuses them as it would have.
 *
 * A stream cut off by its node: nginx's upstream, finalizing with an
 * error once the response has begun, has closed the node's connection and
 * passes a flush without the last buffer, then closes the client's
 * connection.  Here the held beginning of an event is dropped, and an
 * error event and [DONE] go out, with the last buffer, so that the client
 * sees the stream end as the nodes end a failed one, and never part of an
 * event.
 *
 * With proxy_buffering on, a buffer not in memory, or an event longer than
 * NGX_HTTP_NALAR_ROUTE_EVENT, the stream passes as it comes, and a cut one
 * still ends with the error event.
 */

static ngx_int_t
ngx_http_nalar_route_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    u_char                     *p, *cut;
    size_t                      held, tail;
    ngx_uint_t                  blank, gone;
    ngx_buf_t                  *b;
    ngx_chain_t                *cl, *at, *prev;
    ngx_http_upstream_t        *u;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    u = r->upstream;

    if (in == NULL || u == NULL || r != r->main || !u->header_sent
        || r->headers_out.status != NGX_HTTP_OK
        || r->headers_out.content_type.len < sizeof("text/event-stream") - 1
        || ngx_strncasecmp(r->headers_out.content_type.data,
                           (u_char *) "text/event-stream",
                           sizeof("text/event-stream") - 1)
           != 0)
    {
        return ngx_http_nalar_route_next_filter(r, in);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);
    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if ((ctx == NULL && !nlcf->route_edge)
        || (ctx != NULL && ctx->route_ended))
    {
        return ngx_http_nalar_route_next_filter(r, in);
    }

    ctx = ngx_http_nalar_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    gone = (u->peer.connection == NULL);

    /* the end: what is held goes first */

    for (cl = in; cl; cl = cl->next) {
        if (cl->buf->last_buf) {
            prev = ctx->route_held;
            ctx->route_held = NULL;
            ctx->route_ended = 1;

            return ngx_http_nalar_route_pass(r, ctx, prev, in, NULL, 0);
        }

        if (ngx_buf_size(cl->buf) && !ngx_buf_in_memory_only(cl->buf)) {
            ctx->route_raw = 1;
        }
    }

    if (u->buffering) {
        ctx->route_raw = 1;
    }

    if (ctx->route_raw) {
        prev = ctx->route_held;
        ctx->route_held = NULL;
        ctx->route_ended = gone;

        return ngx_http_nalar_route_pass(r, ctx, prev, in, NULL, gone);
    }

    /* the last empty line in what came: "at" and "cut" are after it */

    at = NULL;
    cut = NULL;
    blank = ctx->route_blank;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        for (p = b->pos; p < b->last; p++) {
            if (*p == LF) {
                if (blank) {
                    at = cl;
                    cut = p + 1;
                }

                blank = 1;

            } else if (*p != CR) {
                blank = 0;
            }
        }
    }

    held = ctx->route_held ? ngx_buf_size(ctx->route_held->buf) : 0;
    tail = 0;

    for (cl = at ? at : in; cl; cl = cl->next) {
        b = cl->buf;
        tail += b->last - (cl == at ? cut : b->pos);
    }

    if ((at ? tail : held + tail) > NGX_HTTP_NALAR_ROUTE_EVENT) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "nalar: a stream's event is longer than %uz bytes; "
                      "the stream passes as it comes",
                      (size_t) NGX_HTTP_NALAR_ROUTE_EVENT);

        ctx->route_raw = 1;

        return ngx_http_nalar_route_filter(r, in);
    }

    ctx->route_blank = blank;

    /*
     * up to the empty line: what was held, then in's buffers up to "at",
     * which ends at "cut"; after it, the beginning of the next event is
     * copied to be held and its buffers are marked sent
     */

    prev = NULL;

    if (at) {
        prev = ctx->route_held;
        ctx->route_held = NULL;
    }

    for (cl = at ? at : in; cl; cl = cl->next) {
        b = cl->buf;
        p = (cl == at) ? cut : b->pos;

        if (ngx_http_nalar_route_hold(r, ctx, p, b->last) != NGX_OK) {
            return NGX_ERROR;
        }

        b->last = p;
    }

    if (gone) {
        /* the beginning of an event that will not end is dropped */
        ctx->route_held = NULL;
        ctx->route_ended = 1;
    }

    return ngx_http_nalar_route_pass(r, ctx, prev, at ? in : NULL, at, gone);
}


/*
 * Passes on, in links of its own: the held buffer "held" (NULL: none),
 * in's buffers up to and with "upto" (NULL: all of them), and where
 * "error", the error event and [DONE] with the last buffer.  The held
 * buffer is reused once it is sent.
 */

static ngx_int_t
ngx_http_nalar_route_pass(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    ngx_chain_t *held, ngx_chain_t *in, ngx_chain_t *upto, ngx_uint_t error)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t  *cl, *next, *out, **ll;

    out = NULL;
    ll = &out;

    if (held) {
        held->next = NULL;

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = held->buf;
        *ll = cl;
        ll = &cl->next;
    }

    for (next = in; next; next = next->next) {
        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = next->buf;
        *ll = cl;
        ll = &cl->next;

        if (next == upto) {
            break;
        }
    }

    if (error) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "nalar: the stream's node went away before it "
                      "finished; the stream ends with an error event");

        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->pos = ngx_http_nalar_route_error;
        b->last = b->pos + sizeof(ngx_http_nalar_route_error) - 1;
        b->memory = 1;
        b->last_buf = 1;
        b->last_in_chain = 1;
        b->flush = 1;

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = b;
        *ll = cl;
        ll = &cl->next;
    }

    *ll = NULL;

    if (out == NULL) {
        return NGX_OK;
    }

    rc = ngx_http_nalar_route_next_filter(r, out);

    /* the filters after this one keep links of their own */

    for (cl = out; cl; cl = next) {
        next = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    ngx_chain_update_chains(r->pool, &ctx->route_free, &ctx->route_busy,
                            &held, (ngx_buf_tag_t) &ngx_http_nalar_route_error);

    return rc;
}


/* appends [p, last) to the held beginning of an event */

static ngx_int_t
ngx_http_nalar_route_hold(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    u_char *p, u_char *last)
{
    u_char     *start;
    size_t      size, need;
    ngx_buf_t  *b;

    if (p == last) {
        return NGX_OK;
    }

    if (ctx->route_held == NULL) {
        ctx->route_held = ngx_chain_get_free_buf(r->pool, &ctx->route_free);
        if (ctx->route_held == NULL) {
            return NGX_ERROR;
        }

        b = ctx->route_held->buf;
        b->pos = b->start;
        b->last = b->start;
        b->temporary = 1;
        b->tag = (ngx_buf_tag_t) &ngx_http_nalar_route_error;
    }

    b = ctx->route_held->buf;
    need = (b->last - b->pos) + (last - p);

    if (b->start == NULL || (size_t) (b->end - b->pos) < need) {
        size = ngx_max(need * 2, NGX_HTTP_NALAR_ROUTE_HOLD);

        start = ngx_palloc(r->pool, size);
        if (start == NULL) {
            return NGX_ERROR;
        }

        if (b->start) {
            ngx_memcpy(start, b->pos, b->last - b->pos);
            ngx_pfree(r->pool, b->start);
        }

        b->last = start + (b->last - b->pos);
        b->pos = start;
        b->start = start;
        b->end = start + size;
    }

    b->last = ngx_cpymem(b->last, p, last - p);

    return NGX_OK;
}
