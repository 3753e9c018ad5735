
/*
 * The identity an edge hands its engine nodes.  A node behind an edge
 * must give a request exactly the prefix cache scope a single node would
 * have given it: the scope names where the identity came from (a JWT key,
 * issuer and claim; a nalar_tenant expression and a client CA) as well as
 * its name, so that a JWT `sub` "victim" and a header tenant "victim"
 * never meet.  And a node must take that identity from the edge only.
 *
 * The edge (nalar_tenant or nalar_jwt_key, and nalar_edge_key) sends
 * $nalar_edge_identity, which signs the scope it established:
 *
 *   1.<time>.<payload>.<mac>
 *
 *   time     the edge's clock, seconds since the epoch, decimal
 *   payload  base64url (no padding) of "a" (no identity: nothing is
 *            cached, as nalar_tenant "" on one node) or
 *            "o<tenant length>:<tenant><scope>"
 *   mac      base64url of HMAC-SHA256(key, "nalar-edge-identity " +
 *            "1.<time>.<payload>")
 *
 * A node (nalar_edge_tenant $http_x_edge_identity, and the same
 * nalar_edge_key) takes the tenant and the scope from it only when the MAC
 * verifies and the time is within the key's skew of its own clock; else
 * the request is refused with 403 (never the bare name, never a scope of
 * its own).  The key is read from a file at configuration time: a local
 * process that cannot read the file cannot make an identity, whatever
 * address it binds.  The time bounds how long a header, once seen, can be
 * replayed onto another request: the skew (30 s by default), which is
 * all that two hosts' clocks need.
 *
 * The directive handler runs while the configuration is read; the rest
 * on the event loop only: it touches the request, its ctx and the
 * configuration, never an engine or an engine lock.
 */

#include "ngx_nalar_module.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>


#define NGX_HTTP_NALAR_EDGE_MIN_KEY   32
#define NGX_HTTP_NALAR_EDGE_MAX_KEY   4096
#define NGX_HTTP_NALAR_EDGE_MAX       4096      /* bytes of a header */
#define NGX_HTTP_NALAR_EDGE_MAC       32        /* HMAC-SHA256 */
#define NGX_HTTP_NALAR_EDGE_MAC64     43        /* ... in base64url */
#define NGX_HTTP_NALAR_EDGE_SKEW      30


static ngx_int_t ngx_http_nalar_edge_mac(ngx_http_request_t *r,
    ngx_http_nalar_edge_key_t *ek, u_char *data, size_t len, u_char *mac);
static ngx_int_t ngx_http_nalar_edge_key_read(ngx_conf_t *cf,
    ngx_str_t *file, u_char *buf, size_t *size);
static void ngx_http_nalar_edge_cleanup(void *data);
static ngx_int_t ngx_http_nalar_edge_signed(ngx_http_request_t *r,
    ngx_http_nalar_edge_key_t *ek, ngx_str_t *value, ngx_str_t *payload,
    const char **why);
static ngx_int_t ngx_http_nalar_edge_identity(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_str_t *payload, const char **why);


static u_char  ngx_http_nalar_edge_domain[] = "nalar-edge-identity ";


/*
 * nalar_edge_key FILE [skew=TIME] | off;
 * The file's bytes are the key, less a trailing line end (so that a text
 * key, `openssl rand -hex 32`, reads the same with or without one); at
 * least 32 bytes.  A file other users may read is refused: the key is
 * what tells the edge from any local process.
 */

char *
ngx_http_nalar_edge_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    u_char                     *buf;
    size_t                      len;
    time_t                      skew;
    ngx_str_t                  *value, file, s;
    ngx_uint_t                  i;
    ngx_pool_cleanup_t         *cln;
    ngx_http_nalar_edge_key_t  *ek;

    if (nlcf->edge_key != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        nlcf->edge_key = NULL;
        return NGX_CONF_OK;
    }

    skew = NGX_HTTP_NALAR_EDGE_SKEW;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "skew=", 5) == 0) {
            s.data = value[i].data + 5;
            s.len = value[i].len - 5;

            skew = ngx_parse_time(&s, 1);

            if (skew == (time_t) NGX_ERROR || skew < 1 || skew > 3600) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "nalar_edge_key: invalid \"%V\": a time "
                                   "from 1s to 1h expected", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_edge_key: invalid parameter \"%V\"",
                           &value[i]);
        return NGX_CONF_ERROR;
    }

    file = value[1];

    if (ngx_conf_full_name(cf->cycle, &file, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    /* one byte more than a key may have, to tell a long one */

    buf = ngx_pnalloc(cf->pool, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1);
    if (buf == NULL) {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_nalar_edge_key_read(cf, &file, buf, &len) != NGX_OK) {
        OPENSSL_cleanse(buf, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1);
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        OPENSSL_cleanse(buf, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1);
        return NGX_CONF_ERROR;
    }

    ek = ngx_pcalloc(cf->pool, sizeof(ngx_http_nalar_edge_key_t));
    if (ek == NULL) {
        OPENSSL_cleanse(buf, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1);
        return NGX_CONF_ERROR;
    }

    /* the key is wiped when the configuration goes */

    ek->key.data = buf;
    cln->handler = ngx_http_nalar_edge_cleanup;
    cln->data = ek;

    if (len > NGX_HTTP_NALAR_EDGE_MAX_KEY) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_edge_key: \"%V\" is longer than %d bytes",
                           &file, NGX_HTTP_NALAR_EDGE_MAX_KEY);
        return NGX_CONF_ERROR;
    }

    if (len && buf[len - 1] == LF) {
        len--;

        if (len && buf[len - 1] == CR) {
            len--;
        }
    }

    if (len < NGX_HTTP_NALAR_EDGE_MIN_KEY) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_edge_key: \"%V\" holds %uz bytes; a key "
                           "of at least %d is needed (openssl rand -hex 32)",
                           &file, len, NGX_HTTP_NALAR_EDGE_MIN_KEY);
        return NGX_CONF_ERROR;
    }

    ek->key.len = len;
    ek->skew = skew;

    nlcf->edge_key = ek;

    return NGX_CONF_OK;
}


/*
 * The key file's first NGX_HTTP_NALAR_EDGE_MAX_KEY + 1 bytes into buf:
 * a plain file that other users cannot read.  NGX_ERROR: said why.
 */

static ngx_int_t
ngx_http_nalar_edge_key_read(ngx_conf_t *cf, ngx_str_t *file, u_char *buf,
    size_t *size)
{
    size_t           len;
    ssize_t          n;
    ngx_fd_t         fd;
    ngx_file_info_t  fi;

    fd = ngx_open_file(file->data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "nalar_edge_key: cannot open \"%V\"", file);
        return NGX_ERROR;
    }

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "nalar_edge_key: cannot stat \"%V\"", file);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    if (!ngx_is_file(&fi)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_edge_key: \"%V\" is not a file", file);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    if (fi.st_mode & S_IROTH) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_edge_key: \"%V\" can be read by every "
                           "user; make it readable by nginx's user only "
                           "(chmod o-r)", file);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    len = 0;

    while (len < NGX_HTTP_NALAR_EDGE_MAX_KEY + 1) {
        n = ngx_read_fd(fd, buf + len, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1 - len);

        if (n == -1) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                               "nalar_edge_key: cannot read \"%V\"", file);
            (void) ngx_close_file(fd);
            return NGX_ERROR;
        }

        if (n == 0) {
            break;
        }

        len += n;
    }

    (void) ngx_close_file(fd);

    *size = len;

    return NGX_OK;
}


static void
ngx_http_nalar_edge_cleanup(void *data)
{
    ngx_http_nalar_edge_key_t *ek = data;

    OPENSSL_cleanse(ek->key.data, NGX_HTTP_NALAR_EDGE_MAX_KEY + 1);
}


/*
 * $nalar_edge_identity: the request's identity as this location
 * established it in ctx (nalar_tenant, nalar_jwt_key, a client CA; the
 * caller establishes it where there is a key), signed.  Not found, so that
 * proxy_set_header sends no header and the node refuses the request, where
 * there is no key or no valid token.
 */

ngx_int_t
ngx_http_nalar_edge_sign(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    ngx_http_variable_value_t *v)
{
    u_char                     *p, *raw, *out;
    size_t                      len;
    ngx_str_t                   src, dst;
    ngx_http_nalar_loc_conf_t  *nlcf;
    u_char                      mac[NGX_HTTP_NALAR_EDGE_MAC];

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if (nlcf->edge_key == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "nalar: $nalar_edge_identity without nalar_edge_key; "
                      "no identity is sent");

        ctx->edge_sign = NGX_HTTP_NALAR_SIGN_NO_KEY;
        v->not_found = 1;
        return NGX_OK;
    }

    /* what nalar_edge_zone counts; an error return below leaves ERROR */

    ctx->edge_sign = NGX_HTTP_NALAR_SIGN_ERROR;

    if (ctx->tenant_state != NGX_HTTP_NALAR_TENANT_OK
        && ctx->tenant_state != NGX_HTTP_NALAR_TENANT_ANON)
    {
        ctx->edge_sign = NGX_HTTP_NALAR_SIGN_NO_IDENTITY;
        v->not_found = 1;
        return NGX_OK;
    }

    /* the payload */

    len = 1 + NGX_SIZE_T_LEN + 1 + ctx->tenant.len + ctx->scope.len;

    raw = ngx_pnalloc(r->pool, len);
    if (raw == NULL) {
        return NGX_ERROR;
    }

    if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_ANON) {
        p = ngx_cpymem(raw, "a", 1);

    } else {
        p = ngx_sprintf(raw, "o%uz:%V%V", ctx->tenant.len, &ctx->tenant,
                        &ctx->scope);
    }

    src.data = raw;
    src.len = p - raw;

    /* "1.<time>.<payload>.<mac>" */

    len = sizeof("1..") - 1 + NGX_TIME_T_LEN + ngx_base64_encoded_length(
              src.len) + 1 + ngx_base64_encoded_length(sizeof(mac));

    if (len > NGX_HTTP_NALAR_EDGE_MAX) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "nalar: the edge identity is longer than %d bytes; "
                      "no identity is sent", NGX_HTTP_NALAR_EDGE_MAX);
        ctx->edge_sign = NGX_HTTP_NALAR_SIGN_TOO_LONG;
        v->not_found = 1;
        return NGX_OK;
    }

    out = ngx_pnalloc(r->pool, len);
    if (out == NULL) {
        return NGX_ERROR;
    }

    p = ngx_sprintf(out, "1.%T.", ngx_time());

    dst.data = p;
    ngx_encode_base64url(&dst, &src);
    p += dst.len;

    if (ngx_http_nalar_edge_mac(r, nlcf->edge_key, out, p - out, mac)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    *p++ = '.';

    src.data = mac;
    src.len = sizeof(mac);
    dst.data = p;
    ngx_encode_base64url(&dst, &src);
    p += dst.len;

    ctx->edge_sign = NGX_HTTP_NALAR_SIGN_OK;

    v->len = p - out;
    v->data = out;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * nalar_edge_tenant: the tenant and scope the edge signed, into ctx; or
 * NGX_HTTP_NALAR_TENANT_REFUSED, with the reason in the log (the client is
 * told only that the identity did not verify).  NGX_ERROR: no memory.
 */

ngx_int_t
ngx_http_nalar_edge_verify(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx)
{
    ngx_int_t                   rc;
    ngx_str_t                   value, payload;
    const char                 *why;
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    ctx->tenant_state = NGX_HTTP_NALAR_TENANT_REFUSED;

    if (ngx_http_complex_value(r, nlcf->edge_tenant, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    why = NULL;

    rc = ngx_http_nalar_edge_signed(r, nlcf->edge_key, &value, &payload,
                                    &why);

    if (rc == NGX_OK) {
        rc = ngx_http_nalar_edge_identity(r, ctx, &payload, &why);
    }

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "nalar: edge identity refused: %s", why);
        return NGX_OK;
    }

    return rc;
}


/*
 * "1.<time>.<payload>.<mac>": the MAC first (nothing unsigned is read),
 * then the time against the key's skew, then the payload decoded into
 * *payload (the request's pool).  NGX_DECLINED: *why says why not.
 */

static ngx_int_t
ngx_http_nalar_edge_signed(ngx_http_request_t *r,
    ngx_http_nalar_edge_key_t *ek, ngx_str_t *value, ngx_str_t *payload,
    const char **why)
{
    u_char     *p, *last, *dot, *start;
    time_t      t, now;
    ngx_str_t   src, dst;
    u_char      mac[NGX_HTTP_NALAR_EDGE_MAC];
    u_char      got[NGX_HTTP_NALAR_EDGE_MAC + 3];

    if (value->len == 0) {
        *why = "no edge identity";
        return NGX_DECLINED;
    }

    *why = "not an edge identity";

    if (value->len > NGX_HTTP_NALAR_EDGE_MAX
        || value->len < sizeof("1.0..") - 1 + NGX_HTTP_NALAR_EDGE_MAC64
        || value->data[0] != '1' || value->data[1] != '.')
    {
        return NGX_DECLINED;
    }

    last = value->data + value->len;
    dot = last - NGX_HTTP_NALAR_EDGE_MAC64 - 1;

    if (*dot != '.') {
        return NGX_DECLINED;
    }

    src.data = dot + 1;
    src.len = NGX_HTTP_NALAR_EDGE_MAC64;
    dst.data = got;

    if (ngx_decode_base64url(&dst, &src) != NGX_OK
        || dst.len != NGX_HTTP_NALAR_EDGE_MAC)
    {
        return NGX_DECLINED;
    }

    if (ngx_http_nalar_edge_mac(r, ek, value->data, dot - value->data, mac)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (CRYPTO_memcmp(mac, got, NGX_HTTP_NALAR_EDGE_MAC) != 0) {
        *why = "the signature does not verify";
        return NGX_DECLINED;
    }

    /* signed by the edge: "1.<time>.<payload>" */

    p = value->data + 2;
    start = ngx_strlchr(p, dot, '.');

    if (start == NULL || start == p) {
        *why = "a signed identity without a time";
        return NGX_DECLINED;
    }

    t = ngx_atotm(p, start - p);
    now = ngx_time();

    if (t == (time_t) NGX_ERROR || t < now - ek->skew || t > now + ek->skew) {
        *why = "the identity's time is outside the key's skew";
        return NGX_DECLINED;
    }

    start++;

    src.data = start;
    src.len = dot - start;

    payload->data = ngx_pnalloc(r->pool,
                                ngx_base64_decoded_length(src.len) + 1);
    if (payload->data == NULL) {
        return NGX_ERROR;
    }

    *why = "a signed identity that cannot be read";

    if (src.len == 0 || ngx_decode_base64url(payload, &src) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (ngx_strlchr(payload->data, payload->data + payload->len, '\0')
        != NULL)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * The signed payload into ctx: "a" (no identity) or
 * "o<tenant length>:<tenant><scope>".  NGX_DECLINED: *why says why not.
 */

static ngx_int_t
ngx_http_nalar_edge_identity(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_str_t *payload, const char **why)
{
    u_char  *p, *last, *end;
    size_t   tlen;

    p = payload->data;
    end = p + payload->len;

    if (*p == 'a' && end - p == 1) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "nalar tenant: the edge's, none, prefix cache off");
        ctx->tenant_state = NGX_HTTP_NALAR_TENANT_ANON;
        return NGX_OK;
    }

    if (*p != 'o'
        || (last = ngx_strlchr(p + 1, end, ':')) == NULL
        || last == p + 1
        || (tlen = ngx_atosz(p + 1, last - p - 1)) == (size_t) NGX_ERROR
        || tlen > (size_t) (end - last - 1)
        || (tlen == 0) != (end - last - 1 == 0))
    {
        *why = "a signed identity that cannot be read";
        return NGX_DECLINED;
    }

    last++;

    ctx->tenant_state = NGX_HTTP_NALAR_TENANT_OK;

    /* the single tenant of an edge without tenancy: the global scope */

    if (tlen == 0) {
        return NGX_OK;
    }

    ctx->tenant.data = last;
    ctx->tenant.len = tlen;

    ctx->scope.data = ngx_pnalloc(r->pool, end - last - tlen + 1);
    if (ctx->scope.data == NULL) {
        return NGX_ERROR;
    }

    ctx->scope.len = end - last - tlen;
    *ngx_cpymem(ctx->scope.data, last + tlen, ctx->scope.len) = '\0';

    /* the tenant NUL-terminated in place: the scope was copied out */

    last[tlen] = '\0';

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "nalar tenant: the edge's \"%V\", scope \"%V\"",
                   &ctx->tenant, &ctx->scope);

    return NGX_OK;
}


/* HMAC-SHA256 of the domain and [data, data + len) */

static ngx_int_t
ngx_http_nalar_edge_mac(ngx_http_request_t *r, ngx_http_nalar_edge_key_t *ek,
    u_char *data, size_t len, u_char *mac)
{
    size_t         n;
    u_char        *in;
    unsigned int   mac_len;

    n = sizeof(ngx_http_nalar_edge_domain) - 1;

    in = ngx_pnalloc(r->pool, n + len);
    if (in == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(in, ngx_http_nalar_edge_domain, n);
    ngx_memcpy(in + n, data, len);

    mac_len = 0;

    if (HMAC(EVP_sha256(), ek->key.data, (int) ek->key.len, in, n + len,
             mac, &mac_len)
        == NULL
        || mac_len != NGX_HTTP_NALAR_EDGE_MAC)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "nalar: HMAC-SHA256 failed");
        return NGX_ERROR;
    }

    return NGX_OK;
}
