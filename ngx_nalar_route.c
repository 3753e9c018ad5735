
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
 * The body is the one proxy_pass reads (without blocking) before it picks
 * a peer, which is when the upstream evaluates the key; it is left as it
 * is.  Only its first bytes are looked at (NGX_HTTP_NALAR_ROUTE_SCAN plus
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


#define NGX_HTTP_NALAR_ROUTE_SCAN   (64 * 1024)
#define NGX_HTTP_NALAR_ROUTE_MODEL  256
#define NGX_HTTP_NALAR_ROUTE_HEX    32          /* 128 bits of SHA-256 */

#define NGX_HTTP_NALAR_SCAN_OK      0
#define NGX_HTTP_NALAR_SCAN_END     1           /* ran out of bytes */
#define NGX_HTTP_NALAR_SCAN_BAD     2


typedef struct {
    u_char        *p;
    u_char        *end;
    u_char        *out;                         /* the leading text */
    size_t         len;
    size_t         cap;
} ngx_http_nalar_scan_t;


static ngx_int_t ngx_http_nalar_route_body(ngx_http_request_t *r,
    size_t limit, u_char **data, size_t *len);
static size_t ngx_http_nalar_route_text(u_char *body, size_t len,
    ngx_uint_t chat, u_char *out, size_t cap, u_char *model,
    size_t *model_len);
static ngx_int_t ngx_http_nalar_scan_string(ngx_http_nalar_scan_t *s,
    u_char *dst, size_t *dst_len, size_t dst_cap, size_t *total);
static ngx_int_t ngx_http_nalar_scan_skip(ngx_http_nalar_scan_t *s);
static ngx_int_t ngx_http_nalar_scan_prompt(ngx_http_nalar_scan_t *s);
static ngx_int_t ngx_http_nalar_scan_messages(ngx_http_nalar_scan_t *s);
static ngx_int_t ngx_http_nalar_scan_content(ngx_http_nalar_scan_t *s);
static ngx_int_t ngx_http_nalar_route_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


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

        text_len = ngx_http_nalar_route_text(body, len,
                                             ep == NGX_HTTP_NALAR_EP_CHAT,
                                             text, nlcf->route_prefix,
                                             model, &model_len);
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
 * The leading text of a completions or chat body (see the top of this
 * file) into out, at most cap bytes; the model, where the body names it
 * before the prompt, into model.  Returns the text's length: 0 when there
 * is none.  The text is made of what the body's first `len` bytes hold; a
 * message cut off there before its role is known is left out.
 */

static size_t
ngx_http_nalar_route_text(u_char *body, size_t len, ngx_uint_t chat,
    u_char *out, size_t cap, u_char *model, size_t *model_len)
{
    size_t                 key_len, total;
    ngx_int_t              rc;
    ngx_uint_t             found;
    ngx_http_nalar_scan_t  s;
    u_char                 key[16];

    s.p = body;
    s.end = body + len;
    s.out = out;
    s.len = 0;
    s.cap = cap;

    *model_len = 0;
    found = 0;

    while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                           || *s.p == '\n'))
    {
        s.p++;
    }

    if (s.p == s.end || *s.p++ != '{') {
        return 0;
    }

    for ( ;; ) {
        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n' || *s.p == ','))
        {
            s.p++;
        }

        if (s.p == s.end || *s.p == '}') {
            break;
        }

        key_len = 0;

        if (ngx_http_nalar_scan_string(&s, key, &key_len, sizeof(key),
                                       &total)
            != NGX_HTTP_NALAR_SCAN_OK)
        {
            break;
        }

        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n'))
        {
            s.p++;
        }

        if (s.p == s.end || *s.p++ != ':') {
            break;
        }

        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n'))
        {
            s.p++;
        }

        if (s.p == s.end) {
            break;
        }

#define ngx_http_nalar_key_is(name)                                          \
        (total == sizeof(name) - 1                                           \
         && ngx_strncmp(key, name, sizeof(name) - 1) == 0)

        if (ngx_http_nalar_key_is("model") && *s.p == '"') {
            *model_len = 0;
            rc = ngx_http_nalar_scan_string(&s, model, model_len,
                                            NGX_HTTP_NALAR_ROUTE_MODEL,
                                            &total);

        } else if (!chat && ngx_http_nalar_key_is("prompt")) {
            (void) ngx_http_nalar_scan_prompt(&s);
            found = 1;
            break;

        } else if (chat && ngx_http_nalar_key_is("messages")) {
            (void) ngx_http_nalar_scan_messages(&s);
            found = 1;
            break;

        } else {
            rc = ngx_http_nalar_scan_skip(&s);
        }

#undef ngx_http_nalar_key_is

        if (rc != NGX_HTTP_NALAR_SCAN_OK) {
            break;
        }
    }

    return found ? s.len : 0;
}


/*
 * A JSON string at s->p, decoded into dst (at most dst_cap bytes; dst may
 * be NULL); *total: its whole decoded length.  Invalid escapes and lone
 * surrogates decode as U+FFFD: the text only needs to be the same for the
 * same bytes.
 */

static ngx_int_t
ngx_http_nalar_scan_string(ngx_http_nalar_scan_t *s, u_char *dst,
    size_t *dst_len, size_t dst_cap, size_t *total)
{
    u_char      c, utf[4];
    size_t      n, i;
    uint32_t    cp, lo;
    ngx_uint_t  k;

    *total = 0;

    if (s->p == s->end) {
        return NGX_HTTP_NALAR_SCAN_END;
    }

    if (*s->p != '"') {
        return NGX_HTTP_NALAR_SCAN_BAD;
    }

    s->p++;

    while (s->p < s->end) {
        c = *s->p++;

        if (c == '"') {
            return NGX_HTTP_NALAR_SCAN_OK;
        }

        n = 1;
        utf[0] = c;

        if (c == '\\') {
            if (s->p == s->end) {
                return NGX_HTTP_NALAR_SCAN_END;
            }

            c = *s->p++;

            switch (c) {
            case 'b': utf[0] = '\b'; break;
            case 'f': utf[0] = '\f'; break;
            case 'n': utf[0] = '\n'; break;
            case 'r': utf[0] = '\r'; break;
            case 't': utf[0] = '\t'; break;

            case 'u':
                cp = 0;

                for (k = 0; k < 4; k++) {
                    if (s->p == s->end) {
                        return NGX_HTTP_NALAR_SCAN_END;
                    }

                    c = *s->p++;
                    cp <<= 4;

                    if (c >= '0' && c <= '9') {
                        cp |= c - '0';

                    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
                        cp |= (c | 0x20) - 'a' + 10;

                    } else {
                        cp = 0xfffd;
                        break;
                    }
                }

                if (cp >= 0xd800 && cp < 0xdc00) {
                    /* a high surrogate: its low half follows */

                    if (s->end - s->p < 6) {
                        return NGX_HTTP_NALAR_SCAN_END;
                    }

                    lo = 0;

                    if (s->p[0] == '\\' && s->p[1] == 'u') {
                        for (k = 2; k < 6; k++) {
                            c = s->p[k];
                            lo <<= 4;

                            if (c >= '0' && c <= '9') {
                                lo |= c - '0';

                            } else if ((c | 0x20) >= 'a'
                                       && (c | 0x20) <= 'f')
                            {
                                lo |= (c | 0x20) - 'a' + 10;

                            } else {
                                lo = 0;
                                break;
                            }
                        }
                    }

                    if (lo >= 0xdc00 && lo < 0xe000) {
                        s->p += 6;
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);

                    } else {
                        cp = 0xfffd;
                    }

                } else if (cp >= 0xdc00 && cp < 0xe000) {
                    cp = 0xfffd;
                }

                if (cp < 0x80) {
                    utf[0] = (u_char) cp;

                } else if (cp < 0x800) {
                    utf[0] = (u_char) (0xc0 | (cp >> 6));
                    utf[1] = (u_char) (0x80 | (cp & 0x3f));
                    n = 2;

                } else if (cp < 0x10000) {
                    utf[0] = (u_char) (0xe0 | (cp >> 12));
                    utf[1] = (u_char) (0x80 | ((cp >> 6) & 0x3f));
                    utf[2] = (u_char) (0x80 | (cp & 0x3f));
                    n = 3;

                } else {
                    utf[0] = (u_char) (0xf0 | (cp >> 18));
                    utf[1] = (u_char) (0x80 | ((cp >> 12) & 0x3f));
                    utf[2] = (u_char) (0x80 | ((cp >> 6) & 0x3f));
                    utf[3] = (u_char) (0x80 | (cp & 0x3f));
                    n = 4;
                }

                break;

            default:
                /* \" \\ \/ and anything else as itself */
                utf[0] = c;
            }
        }

        *total += n;

        if (dst == NULL) {
            continue;
        }

        for (i = 0; i < n && *dst_len < dst_cap; i++) {
            dst[(*dst_len)++] = utf[i];
        }
    }

    return NGX_HTTP_NALAR_SCAN_END;
}


/* Any JSON value at s->p, without looking into it. */

static ngx_int_t
ngx_http_nalar_scan_skip(ngx_http_nalar_scan_t *s)
{
    u_char      c;
    size_t      total;
    ngx_int_t   rc;
    ngx_uint_t  depth;

    depth = 0;

    while (s->p < s->end) {
        c = *s->p;

        switch (c) {

        case '"':
            rc = ngx_http_nalar_scan_string(s, NULL, NULL, 0, &total);
            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                return rc;
            }

            break;

        case '{':
        case '[':
            depth++;
            s->p++;
            break;

        case '}':
        case ']':
            if (depth == 0) {
                /* the end of the container this value is in */
                return NGX_HTTP_NALAR_SCAN_OK;
            }

            depth--;
            s->p++;
            break;

        case ',':
            if (depth == 0) {
                return NGX_HTTP_NALAR_SCAN_OK;
            }

            s->p++;
            break;

        default:
            s->p++;
        }

        if (depth == 0 && (c == '"' || c == '}' || c == ']')) {
            return NGX_HTTP_NALAR_SCAN_OK;
        }
    }

    return NGX_HTTP_NALAR_SCAN_END;
}


static void
ngx_http_nalar_scan_append(ngx_http_nalar_scan_t *s, u_char *data, size_t n)
{
    n = ngx_min(n, s->cap - s->len);
    ngx_memcpy(s->out + s->len, data, n);
    s->len += n;
}


/*
 * "prompt": a string, a batch's first string, or token ids (the first
 * list of a batch) as their decimal text.
 */

static ngx_int_t
ngx_http_nalar_scan_prompt(ngx_http_nalar_scan_t *s)
{
    size_t      total;
    ngx_uint_t  depth;

    depth = 0;

    for ( ;; ) {
        while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                 || *s->p == '\r' || *s->p == '\n'))
        {
            s->p++;
        }

        if (s->p == s->end) {
            return NGX_HTTP_NALAR_SCAN_END;
        }

        if (*s->p == '"') {
            return ngx_http_nalar_scan_string(s, s->out, &s->len, s->cap,
                                              &total);
        }

        if (*s->p != '[' || depth == 2) {
            break;
        }

        s->p++;
        depth++;
    }

    if (depth == 0) {
        return NGX_HTTP_NALAR_SCAN_BAD;
    }

    /* ids: digits, commas and blanks, copied without the blanks */

    while (s->p < s->end && *s->p != ']' && s->len < s->cap) {
        if ((*s->p >= '0' && *s->p <= '9') || *s->p == ',' || *s->p == '-') {
            ngx_http_nalar_scan_append(s, s->p, 1);

        } else if (*s->p != ' ' && *s->p != '\t' && *s->p != '\r'
                   && *s->p != '\n')
        {
            return NGX_HTTP_NALAR_SCAN_BAD;
        }

        s->p++;
    }

    return s->p < s->end ? NGX_HTTP_NALAR_SCAN_OK : NGX_HTTP_NALAR_SCAN_END;
}


/*
 * "messages": each message as 0x1e, then its fields in body order, the
 * role as ROLE 0x1f and the content as its text; the leading system or
 * developer messages, or the first message where the first is neither.
 */

static ngx_int_t
ngx_http_nalar_scan_messages(ngx_http_nalar_scan_t *s)
{
    size_t      mark, role_len, total;
    ngx_int_t   rc;
    ngx_uint_t  i, known, system, first_system;
    u_char      role[16], key[16];

    if (s->p == s->end) {
        return NGX_HTTP_NALAR_SCAN_END;
    }

    if (*s->p++ != '[') {
        return NGX_HTTP_NALAR_SCAN_BAD;
    }

    first_system = 0;

    for (i = 0; /* void */; i++) {

        while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                 || *s->p == '\r' || *s->p == '\n'
                                 || *s->p == ','))
        {
            s->p++;
        }

        if (s->p == s->end) {
            return NGX_HTTP_NALAR_SCAN_END;
        }

        if (*s->p == ']' || s->len == s->cap) {
            return NGX_HTTP_NALAR_SCAN_OK;
        }

        if (*s->p++ != '{') {
            return NGX_HTTP_NALAR_SCAN_BAD;
        }

        mark = s->len;
        known = 0;
        system = 0;

        ngx_http_nalar_scan_append(s, (u_char *) "\x1e", 1);

        for ( ;; ) {
            while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                     || *s->p == '\r' || *s->p == '\n'
                                     || *s->p == ','))
            {
                s->p++;
            }

            if (s->p == s->end) {
                rc = NGX_HTTP_NALAR_SCAN_END;
                goto cut;
            }

            if (*s->p == '}') {
                s->p++;
                break;
            }

            role_len = 0;
            rc = ngx_http_nalar_scan_string(s, key, &role_len, sizeof(key),
                                            &total);
            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                goto cut;
            }

            while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                     || *s->p == '\r' || *s->p == '\n'
                                     || *s->p == ':'))
            {
                s->p++;
            }

            if (total == 4 && ngx_strncmp(key, "role", 4) == 0
                && s->p < s->end && *s->p == '"')
            {
                role_len = 0;
                rc = ngx_http_nalar_scan_string(s, role, &role_len,
                                                sizeof(role), &total);
                if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                    goto cut;
                }

                known = 1;
                system = (total == 6
                          && ngx_strncmp(role, "system", 6) == 0)
                         || (total == 9
                             && ngx_strncmp(role, "developer", 9) == 0);

                if (i > 0 && !(first_system && system)) {
                    /* the leading text ends before this message */
                    s->len = mark;
                    return NGX_HTTP_NALAR_SCAN_OK;
                }

                ngx_http_nalar_scan_append(s, role, role_len);
                ngx_http_nalar_scan_append(s, (u_char *) "\x1f", 1);

            } else if (total == 7 && ngx_strncmp(key, "content", 7) == 0) {
                rc = ngx_http_nalar_scan_content(s);

            } else {
                rc = ngx_http_nalar_scan_skip(s);
            }

            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                goto cut;
            }
        }

        if (i == 0) {
            first_system = known && system;

            if (!first_system) {
                return NGX_HTTP_NALAR_SCAN_OK;
            }

        } else if (!known) {
            s->len = mark;
            return NGX_HTTP_NALAR_SCAN_OK;
        }
    }

cut:

    /* a message whose role is unknown joins the leading text only as
     * the first */

    if (i > 0 && !known) {
        s->len = mark;
    }

    return rc;
}


/* A message's content: a string, or the "text" of each of its parts. */

static ngx_int_t
ngx_http_nalar_scan_content(ngx_http_nalar_scan_t *s)
{
    size_t      key_len, total;
    ngx_int_t   rc;
    u_char      key[8];

    if (s->p == s->end) {
        return NGX_HTTP_NALAR_SCAN_END;
    }

    if (*s->p == '"') {
        return ngx_http_nalar_scan_string(s, s->out, &s->len, s->cap, &total);
    }

    if (*s->p != '[') {
        return ngx_http_nalar_scan_skip(s);
    }

    s->p++;

    for ( ;; ) {
        while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                 || *s->p == '\r' || *s->p == '\n'
                                 || *s->p == ','))
        {
            s->p++;
        }

        if (s->p == s->end) {
            return NGX_HTTP_NALAR_SCAN_END;
        }

        if (*s->p == ']') {
            s->p++;
            return NGX_HTTP_NALAR_SCAN_OK;
        }

        if (*s->p != '{') {
            rc = ngx_http_nalar_scan_skip(s);
            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                return rc;
            }

            continue;
        }

        s->p++;

        for ( ;; ) {
            while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                     || *s->p == '\r' || *s->p == '\n'
                                     || *s->p == ','))
            {
                s->p++;
            }

            if (s->p == s->end) {
                return NGX_HTTP_NALAR_SCAN_END;
            }

            if (*s->p == '}') {
                s->p++;
                break;
            }

            key_len = 0;
            rc = ngx_http_nalar_scan_string(s, key, &key_len, sizeof(key),
                                            &total);
            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                return rc;
            }

            while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                                     || *s->p == '\r' || *s->p == '\n'
                                     || *s->p == ':'))
            {
                s->p++;
            }

            if (total == 4 && ngx_strncmp(key, "text", 4) == 0
                && s->p < s->end && *s->p == '"')
            {
                rc = ngx_http_nalar_scan_string(s, s->out, &s->len, s->cap,
                                                &total);
            } else {
                rc = ngx_http_nalar_scan_skip(s);
            }

            if (rc != NGX_HTTP_NALAR_SCAN_OK) {
                return rc;
            }
        }
    }
}


/*
 * A stream cut off by its node: nginx's upstream, finalizing with an
 * error once the response has begun, has closed the node's connection and
 * passes a flush without the last buffer, then closes the client's
 * connection.  Here an error event and [DONE] go first, with the last
 * buffer, so that the client sees the stream end as the nodes end a
 * failed one.
 */

static ngx_int_t
ngx_http_nalar_route_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_buf_t                  *b;
    ngx_chain_t                *cl, **ll;
    ngx_http_upstream_t        *u;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    u = r->upstream;

    if (in == NULL || u == NULL || r != r->main || !u->header_sent
        || u->peer.connection != NULL || r->headers_out.status != NGX_HTTP_OK
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

    for (ll = &in; *ll; ll = &(*ll)->next) {
        if ((*ll)->buf->last_buf) {
            return ngx_http_nalar_route_next_filter(r, in);
        }
    }

    ctx = ngx_http_nalar_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->route_ended = 1;

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "nalar: the stream's node went away before it finished; "
                  "the stream ends with an error event");

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
    cl->next = NULL;
    *ll = cl;

    return ngx_http_nalar_route_next_filter(r, in);
}
