
/*
 * What goes to the client, below the response's logic: a JSON body with
 * its headers, an added header, and the stream's server-sent events (one
 * "data: {json}" event, a chunk around one choice), built in buffers the
 * client has already taken where there are some.  It calls none of the
 * glue's other files.
 *
 * Event loop only.
 */

#include "ngx_nalar_module.h"


static ngx_str_t  ngx_http_nalar_json_type = ngx_string("application/json");


ngx_int_t
ngx_http_nalar_send_json(ngx_http_request_t *r, ngx_uint_t status, json_t *j)
{
    ngx_buf_t  *b;

    b = ngx_http_nalar_json_buf(r, j);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_nalar_send_buf(r, status, b);
}


/* The compact JSON and a newline, the response's last buffer. */

ngx_buf_t *
ngx_http_nalar_json_buf(ngx_http_request_t *r, json_t *j)
{
    size_t      len;
    ngx_buf_t  *b;

    len = json_dumpb(j, NULL, 0, JSON_COMPACT);
    if (len == 0) {
        return NULL;
    }

    b = ngx_create_temp_buf(r->pool, len + 1);
    if (b == NULL) {
        return NULL;
    }

    b->last += json_dumpb(j, (char *) b->last, len, JSON_COMPACT);
    *b->last++ = '\n';
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    return b;
}


ngx_int_t
ngx_http_nalar_send_buf(ngx_http_request_t *r, ngx_uint_t status,
    ngx_buf_t *b)
{
    ngx_int_t     rc;
    ngx_chain_t   out;

    r->headers_out.status = status;
    ngx_http_nalar_json_headers(r, b);

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


ngx_int_t
ngx_http_nalar_add_header(ngx_http_request_t *r, char *key, char *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value.data = (u_char *) value;
    h->value.len = ngx_strlen(value);
    h->lowcase_key = NULL;

    return NGX_OK;
}


/* A chunk of the stream around one choice (whose reference it takes). */

ngx_int_t
ngx_http_nalar_append_chunk(ngx_http_nalar_ctx_t *ctx, ngx_chain_t ***ll,
    json_t *choice)
{
    json_t     *chunk;
    ngx_int_t   rc;

    if (choice == NULL) {
        return NGX_ERROR;
    }

    chunk = json_pack("{s:s,s:s,s:I,s:s,s:[o]}",
                      "id", ctx->id,
                      "object", ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT
                                ? "chat.completion.chunk"
                                : "text_completion",
                      "created", (json_int_t) ctx->created,
                      "model", ctx->served,
                      "choices", choice);
    if (chunk == NULL) {
        return NGX_ERROR;
    }

    if (ctx->include_usage) {
        json_object_set_new(chunk, "usage", json_null());
    }

    rc = ngx_http_nalar_append_event(ctx, ll, chunk);
    json_decref(chunk);

    return rc;
}


/* "data: {json}\n\n" appended to the chain being built. */

ngx_int_t
ngx_http_nalar_append_event(ngx_http_nalar_ctx_t *ctx, ngx_chain_t ***ll,
    json_t *j)
{
    size_t        len, size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (j == NULL) {
        return NGX_ERROR;
    }

    len = json_dumpb(j, NULL, 0, JSON_COMPACT);
    if (len == 0) {
        return NGX_ERROR;
    }

    size = len + sizeof("data: \n\n") - 1;

    /* buffers the client has taken are reused: a long stream's memory is
     * what is in flight, not everything it ever sent */

    cl = ngx_chain_get_free_buf(ctx->request->pool, &ctx->free);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    if (b->start == NULL || (size_t) (b->end - b->start) < size) {
        size = ngx_max(size, 512);

        b->start = ngx_palloc(ctx->request->pool, size);
        if (b->start == NULL) {
            return NGX_ERROR;
        }

        b->end = b->start + size;
    }

    b->pos = b->start;
    b->last = ngx_cpymem(b->start, "data: ", 6);
    b->last += json_dumpb(j, (char *) b->last, len, JSON_COMPACT);
    *b->last++ = '\n';
    *b->last++ = '\n';

    b->temporary = 1;
    b->flush = 0;
    b->last_buf = 0;
    b->last_in_chain = 0;
    b->tag = (ngx_buf_tag_t) &ngx_nalar_module;

    **ll = cl;
    *ll = &cl->next;

    return NGX_OK;
}


/* The headers of a JSON body: its type and length. */

void
ngx_http_nalar_json_headers(ngx_http_request_t *r, ngx_buf_t *b)
{
    r->headers_out.content_type = ngx_http_nalar_json_type;
    r->headers_out.content_type_len = ngx_http_nalar_json_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;
}
