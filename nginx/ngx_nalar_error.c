
/*
 * Errors in OpenAI's shape: a request step records one
 * ({"error":{"message","type","param","code"}} and its status) and the
 * one place that sends it, ngx_http_nalar_send_error, sends it once; the
 * header and body filters turn the error pages nginx answers itself in a
 * nalar_api location (413 from client_max_body_size, 503 from limit_req,
 * ...) into the same JSON.
 *
 * Event loop only: touches the request, its ctx and its output chain;
 * never an engine or an engine lock.
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_nalar_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


static ngx_http_output_header_filter_pt  ngx_http_nalar_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_nalar_next_body_filter;


/*
 * Records an error the glue finds itself: filled as a nalar_failure
 * (the message formatted as nginx does, %V and all) and recorded by
 * ngx_http_nalar_failure().  Returns the status.
 */

ngx_int_t
ngx_http_nalar_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *param, const char *code,
    const char *fmt, ...)
{
    u_char         *p;
    va_list         args;
    nalar_failure   f;

    va_start(args, fmt);
    p = ngx_vslprintf((u_char *) f.message,
                      (u_char *) f.message + sizeof(f.message) - 1, fmt, args);
    va_end(args);

    *p = '\0';
    nalar_failure_trim(&f);

    f.status = (int) status;
    f.type = type;
    f.code = code;
    ngx_cpystrn((u_char *) f.param, (u_char *) (param ? param : ""),
                sizeof(f.param));

    return ngx_http_nalar_failure(r, &f);
}


/*
 * Records {"error":{"message","type","param","code"}} of an error of any
 * layer (nalar_failure, written by nalar_api_error_json) and its status,
 * and returns the status: the step returns it to its caller, and
 * ngx_http_nalar_send_error() sends it.  After the header, no status can
 * be sent: NGX_ERROR.
 */

ngx_int_t
ngx_http_nalar_failure(ngx_http_request_t *r, const nalar_failure *f)
{
    json_t                *j;
    ngx_buf_t             *b;
    ngx_http_nalar_ctx_t  *ctx;

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "nalar: %d: %s", f->status, f->message);

    j = nalar_api_error_json(f);
    if (j == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (r->header_sent) {
        json_decref(j);
        return NGX_ERROR;
    }

    b = ngx_http_nalar_json_buf(r, j);
    json_decref(j);

    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx = ngx_http_nalar_get_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->err_status = f->status;
    ctx->err_body = b;

    return f->status;
}


/*
 * The one place a recorded error is sent: `rc` is what a step returned,
 * and the result is what to finalize the request with.
 */

ngx_int_t
ngx_http_nalar_send_error(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_buf_t             *b;
    ngx_http_nalar_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (rc < NGX_HTTP_SPECIAL_RESPONSE || ctx == NULL
        || ctx->err_body == NULL || (ngx_uint_t) rc != ctx->err_status)
    {
        return rc;
    }

    b = ctx->err_body;
    ctx->err_body = NULL;

    if (r->header_sent) {
        return NGX_ERROR;
    }

    return ngx_http_nalar_send_buf(r, ctx->err_status, b);
}


/*
 * Errors nginx answers itself in a nalar_api location (413 from
 * client_max_body_size, 401 from auth_basic, 503 from limit_req, ...) keep
 * their status and headers, but their HTML page becomes OpenAI's error
 * JSON, which is what API clients parse.
 */

static ngx_int_t
ngx_http_nalar_header_filter(ngx_http_request_t *r)
{
    u_char                     *p;
    json_t                     *j;
    size_t                      len;
    ngx_buf_t                  *b;
    ngx_uint_t                  status;
    const char                 *type, *code, *msg;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);
    status = r->headers_out.status;

    if ((nlcf->handler != NGX_HTTP_NALAR_API && !nlcf->route_edge)
        || r != r->main
        || status < NGX_HTTP_BAD_REQUEST
        || r->headers_out.content_type.len < sizeof("text/html") - 1
        || ngx_strncmp(r->headers_out.content_type.data, "text/html",
                       sizeof("text/html") - 1) != 0)
    {
        return ngx_http_nalar_next_header_filter(r);
    }

    switch (status) {
    case NGX_HTTP_UNAUTHORIZED:
        type = "authentication_error"; code = "invalid_api_key";
        msg = "Authorization required"; break;
    case NGX_HTTP_FORBIDDEN:
        type = "permission_error"; code = NULL; msg = "Forbidden";
        ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);
        if (ctx && ctx->tenant_state == NGX_HTTP_NALAR_TENANT_REFUSED) {
            code = "invalid_edge_identity";
            msg = "The request's edge identity did not verify";
        }
        break;
    case NGX_HTTP_NOT_FOUND:
        type = "invalid_request_error"; code = NULL; msg = "Not found"; break;
    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        type = "invalid_request_error"; code = "request_too_large";
        msg = "Request body is larger than client_max_body_size"; break;
    case 429:
        type = "rate_limit_error"; code = "rate_limit_exceeded";
        msg = "Too many requests"; break;
    case NGX_HTTP_SERVICE_UNAVAILABLE:
        type = "server_error"; code = "service_unavailable";
        msg = "Service temporarily unavailable"; break;
    default:
        type = (status >= 500) ? "server_error" : "invalid_request_error";
        code = NULL;
        msg = (status >= 500) ? "Internal server error" : "Bad request";
    }

    j = json_pack("{s:{s:s,s:s,s:n,s:s?}}", "error", "message", msg,
                  "type", type, "param", "code", code);
    if (j == NULL) {
        return NGX_ERROR;
    }

    len = json_dumpb(j, NULL, 0, JSON_COMPACT);

    b = ngx_create_temp_buf(r->pool, len + 1);
    if (b == NULL) {
        json_decref(j);
        return NGX_ERROR;
    }

    p = b->last;
    b->last += json_dumpb(j, (char *) p, len, JSON_COMPACT);
    *b->last++ = '\n';
    b->last_buf = 1;
    b->last_in_chain = 1;

    json_decref(j);

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx == NULL) {
        ctx = ngx_http_nalar_get_ctx(r);
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ctx->done = 1;
    }

    ctx->error_body = b;

    ngx_http_nalar_json_headers(r, b);

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    ngx_http_clear_accept_ranges(r);
    ngx_http_clear_last_modified(r);
    ngx_http_clear_etag(r);

    return ngx_http_nalar_next_header_filter(r);
}


static ngx_int_t
ngx_http_nalar_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_uint_t             last;
    ngx_chain_t           *cl, out;
    ngx_http_nalar_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx == NULL || ctx->error_body == NULL) {
        return ngx_http_nalar_next_body_filter(r, in);
    }

    /* the HTML page is dropped; the JSON goes with its last buffer */

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        if (cl->buf->last_buf) {
            last = 1;
        }

        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }

    if (!last) {
        return NGX_OK;
    }

    out.buf = ctx->error_body;
    out.next = NULL;
    ctx->error_body = NULL;

    return ngx_http_nalar_next_body_filter(r, &out);
}


/* The filters go in at postconfiguration, in front of those already in. */

ngx_int_t
ngx_http_nalar_filter_init(ngx_conf_t *cf)
{
    ngx_http_nalar_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_nalar_header_filter;

    ngx_http_nalar_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_nalar_body_filter;

    return NGX_OK;
}
