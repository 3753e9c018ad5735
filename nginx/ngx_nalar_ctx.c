
/*
 * What a request is to Nalar: its ctx (made on first use, by whichever
 * phase, variable or filter comes first) and the endpoint its URI names.
 * The lowest of the glue's files: it calls none of the others.
 *
 * Event loop only.
 */

#include "ngx_nalar_module.h"


/* The request's ctx, made (zeroed) if it has none yet; NULL: no memory. */

ngx_http_nalar_ctx_t *
ngx_http_nalar_get_ctx(ngx_http_request_t *r)
{
    ngx_http_nalar_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_nalar_ctx_t));
        if (ctx == NULL) {
            return NULL;
        }

        ctx->request = r;
        ngx_http_set_ctx(r, ctx, ngx_nalar_module);
    }

    return ctx;
}


/* The endpoint is chosen by how the URI ends. */

ngx_uint_t
ngx_http_nalar_endpoint(ngx_str_t *uri)
{
    size_t      len;
    u_char     *p;
    ngx_uint_t  i;

    static struct {
        ngx_str_t   suffix;
        ngx_uint_t  ep;
    }  suffixes[] = {
        { ngx_string("/chat/completions"), NGX_HTTP_NALAR_EP_CHAT },
        { ngx_string("/completions"), NGX_HTTP_NALAR_EP_COMPLETIONS },
        { ngx_string("/models"), NGX_HTTP_NALAR_EP_MODELS },
        { ngx_string("/tokenize"), NGX_HTTP_NALAR_EP_TOKENIZE },
        { ngx_string("/health"), NGX_HTTP_NALAR_EP_HEALTH }
    };

    len = uri->len;

    /* a trailing slash is forgiven */
    if (len > 1 && uri->data[len - 1] == '/') {
        len--;
    }

    for (i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        if (len < suffixes[i].suffix.len) {
            continue;
        }

        p = uri->data + len - suffixes[i].suffix.len;

        if (ngx_strncmp(p, suffixes[i].suffix.data, suffixes[i].suffix.len)
            == 0)
        {
            return suffixes[i].ep;
        }
    }

    return ngx_http_nalar_model_id(uri, NULL);
}


/*
 * /models/{id}: the id is everything after the first "/models/" (a model
 * name may hold a slash), a trailing slash forgiven.
 */

ngx_uint_t
ngx_http_nalar_model_id(ngx_str_t *uri, ngx_str_t *id)
{
    u_char  *p, *last;

    last = uri->data + uri->len;

    if (last - uri->data > 1 && last[-1] == '/') {
        last--;
    }

    p = ngx_strnstr(uri->data, "/models/", last - uri->data);

    if (p == NULL || last - p <= (ssize_t) sizeof("/models/") - 1) {
        return NGX_HTTP_NALAR_EP_NONE;
    }

    if (id != NULL) {
        id->data = p + sizeof("/models/") - 1;
        id->len = last - id->data;
    }

    return NGX_HTTP_NALAR_EP_MODEL;
}
