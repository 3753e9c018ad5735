
/*
 * Tenancy: who a request is and which prefix cache scope it reads and
 * writes.  nalar_jwt_key's handler loads the keys at configuration time
 * (nginx -t reports a bad one); the access phase checks the bearer JWT, the
 * tenant comes from the verified claim or from a verified client
 * certificate's CA (mTLS), or behind an edge from the identity the edge
 * signed (ngx_nalar_edge.c).  $nalar_tenant (ngx_nalar_variables.c)
 * reports what is established here.
 *
 * The key loader runs while the configuration is read; the rest on the
 * event loop only: it touches the request, its ctx and the configuration,
 * never an engine or an engine lock.
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_tenant_token(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_http_nalar_loc_conf_t *nlcf, char *claim,
    size_t size, int *is_string);
static ngx_int_t ngx_http_nalar_tenant_scope(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_http_nalar_loc_conf_t *nlcf,
    int is_string);
static ngx_int_t ngx_http_nalar_client_ca(ngx_http_request_t *r,
    u_char *hex);
static void ngx_http_nalar_jwt_cleanup(void *data);


/* tenants */


/*
 * Access phase: where nalar_jwt_key is set, an API request (in a nalar_api
 * location, or an edge's: nalar_route_prefix) without a valid bearer
 * token ends here with 401, as auth_basic's do (and under `satisfy
 * any` the content handler refuses it again, so it never reaches a model).
 * CORS preflights carry no credentials and never reach a model either;
 * /health is for load balancers, which carry none.
 */

ngx_int_t
ngx_http_nalar_access_handler(ngx_http_request_t *r)
{
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if ((nlcf->handler != NGX_HTTP_NALAR_API && !nlcf->route_edge)
        || (nlcf->jwt == NULL && nlcf->edge_tenant == NULL)
        || r->method == NGX_HTTP_OPTIONS
        || ngx_http_nalar_endpoint(&r->uri) == NGX_HTTP_NALAR_EP_HEALTH)
    {
        return NGX_DECLINED;
    }

    ctx = ngx_http_nalar_tenant(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    switch (ctx->tenant_state) {

    case NGX_HTTP_NALAR_TENANT_MISSING:
    case NGX_HTTP_NALAR_TENANT_INVALID:
        return ngx_http_nalar_unauthorized(r, ctx);

    case NGX_HTTP_NALAR_TENANT_REFUSED:
        return NGX_HTTP_FORBIDDEN;

    default:
        return NGX_OK;
    }
}


/*
 * The tenant of a request, established once: behind an edge
 * (nalar_edge_tenant), the tenant and scope the edge signed; else the
 * verified JWT claim where nalar_jwt_key is set, else the value of
 * nalar_tenant, else "" (a single tenant).  Never anything from the
 * request body.  The reason a token is refused goes to the log only; the
 * client is told invalid_token.
 */

ngx_http_nalar_ctx_t *
ngx_http_nalar_tenant(ngx_http_request_t *r)
{
    int                         is_string;
    u_char                     *p, *last;
    ngx_int_t                   rc;
    ngx_str_t                   value;
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;
    char                        claim[NGX_HTTP_NALAR_MAX_TENANT];

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    ctx = ngx_http_nalar_get_ctx(r);
    if (ctx == NULL) {
        return NULL;
    }

    /* read again only where the location changed the rules */

    if (ctx->tenant_state != NGX_HTTP_NALAR_TENANT_UNKNOWN
        && ctx->tenant_conf == nlcf)
    {
        return ctx;
    }

    ctx->tenant_conf = nlcf;
    ctx->tenant_state = NGX_HTTP_NALAR_TENANT_OK;
    ngx_str_null(&ctx->tenant);
    ngx_str_null(&ctx->scope);
    is_string = 1;

    if (nlcf->edge_tenant) {
        return ngx_http_nalar_edge_verify(r, ctx) == NGX_OK ? ctx : NULL;
    }

    if (nlcf->jwt == NULL) {

        if (nlcf->tenant == NULL) {
            return ctx;
        }

        if (ngx_http_complex_value(r, nlcf->tenant, &value) != NGX_OK) {
            return NULL;
        }

        /* no identity: nothing is shared, not even among the anonymous */

        if (value.len == 0 || ngx_strlchr(value.data, value.data + value.len,
                                          '\0')
                              != NULL)
        {
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "nalar tenant: none, prefix cache off");
            ctx->tenant_state = NGX_HTTP_NALAR_TENANT_ANON;
            return ctx;
        }

        p = (u_char *) value.data;
        last = p + value.len;

    } else {
        rc = ngx_http_nalar_tenant_token(r, ctx, nlcf, claim, sizeof(claim),
                                         &is_string);
        if (rc != NGX_OK) {
            return rc == NGX_DECLINED ? ctx : NULL;
        }

        /* a non-empty string without control characters (jwt.h) */

        p = (u_char *) claim;
        last = p + ngx_strlen(claim);
    }

    ctx->tenant.len = last - p;
    ctx->tenant.data = ngx_pnalloc(r->pool, ctx->tenant.len + 1);
    if (ctx->tenant.data == NULL) {
        return NULL;
    }

    *ngx_cpymem(ctx->tenant.data, p, ctx->tenant.len) = '\0';

    return ngx_http_nalar_tenant_scope(r, ctx, nlcf, is_string) == NGX_OK
           ? ctx : NULL;
}


/*
 * The bearer JWT of the Authorization header, verified: its claim in
 * `claim` (NGX_OK), or NGX_DECLINED with ctx->tenant_state saying why not
 * (the reason in the log).
 */

static ngx_int_t
ngx_http_nalar_tenant_token(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_loc_conf_t *nlcf, char *claim, size_t size,
    int *is_string)
{
    u_char            *p, *last;
    nalar_err          err;
    nalar_jwt_policy   policy;
    ngx_table_elt_t   *h;

    h = r->headers_in.authorization;

    if (h == NULL
        || h->value.len < sizeof("Bearer ") - 1
        || ngx_strncasecmp(h->value.data, (u_char *) "Bearer ",
                           sizeof("Bearer ") - 1)
           != 0)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "nalar: no bearer token");
        ctx->tenant_state = NGX_HTTP_NALAR_TENANT_MISSING;
        return NGX_DECLINED;
    }

    p = h->value.data + sizeof("Bearer ") - 1;
    last = h->value.data + h->value.len;

    while (p < last && *p == ' ') {
        p++;
    }

    while (last > p && last[-1] == ' ') {
        last--;
    }

    ngx_memzero(&policy, sizeof(nalar_jwt_policy));
    policy.claim = (const char *) nlcf->jwt_claim.data;
    policy.issuer = nlcf->jwt_issuer.len
                    ? (const char *) nlcf->jwt_issuer.data : NULL;
    policy.audience = nlcf->jwt_audience.len
                      ? (const char *) nlcf->jwt_audience.data : NULL;
    policy.leeway = nlcf->jwt_leeway;
    policy.now = ngx_time();

    if (nalar_jwt_verify_claim(nlcf->jwt, (const char *) p, last - p,
                               &policy, claim, size, is_string, &err)
        != 0)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "nalar: bearer token refused: %s", err.msg);
        ctx->tenant_state = NGX_HTTP_NALAR_TENANT_INVALID;
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * The prefix cache scope names where the identity came from, so that the
 * same name from two sources never meets: the key (its file's SHA-256),
 * issuer and claim that vouched for it, and the claim's JSON type ("777"
 * is not 777); or the nalar_tenant expression and the CA of a verified
 * client certificate.  Every part but the last has its length or a fixed
 * size.  A CA that cannot be named leaves the request anonymous.
 * NGX_ERROR: no memory.
 */

static ngx_int_t
ngx_http_nalar_tenant_scope(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_loc_conf_t *nlcf, int is_string)
{
    u_char  *p;
    size_t   len;
    u_char   ca[2 * EVP_MAX_MD_SIZE + 1];

    if (nlcf->jwt) {
        len = sizeof("jwt:::::s:") - 1 + nlcf->jwt_id.len
              + 2 * NGX_SIZE_T_LEN + nlcf->jwt_issuer.len
              + nlcf->jwt_claim.len + ctx->tenant.len;

    } else {
        if (ngx_http_nalar_client_ca(r, ca) != NGX_OK) {

            /* a CA that cannot be named: nothing is shared */

            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "nalar tenant: client CA not found, "
                           "prefix cache off");
            ctx->tenant_state = NGX_HTTP_NALAR_TENANT_ANON;
            return NGX_OK;
        }

        len = sizeof("var:::ca=:") - 1 + NGX_SIZE_T_LEN
              + nlcf->tenant->value.len + ngx_strlen(ca) + ctx->tenant.len;
    }

    ctx->scope.data = ngx_pnalloc(r->pool, len + 1);
    if (ctx->scope.data == NULL) {
        return NGX_ERROR;
    }

    if (nlcf->jwt) {
        p = ngx_sprintf(ctx->scope.data, "jwt:%V:%uz:%V:%uz:%V:%c:%V",
                        &nlcf->jwt_id, nlcf->jwt_issuer.len,
                        &nlcf->jwt_issuer, nlcf->jwt_claim.len,
                        &nlcf->jwt_claim, is_string ? 's' : 'n',
                        &ctx->tenant);

    } else {
        p = ngx_sprintf(ctx->scope.data, "var:%uz:%V:ca=%s:%V",
                        nlcf->tenant->value.len, &nlcf->tenant->value, ca,
                        &ctx->tenant);
    }

    *p = '\0';
    ctx->scope.len = p - ctx->scope.data;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "nalar tenant: \"%V\", scope \"%V\"", &ctx->tenant,
                   &ctx->scope);

    return NGX_OK;
}


/*
 * The CA of a verified client certificate, as the SHA-256 of the issuing
 * CA's public key in hex: two CAs that share a name but not a key never
 * share a scope.  The issuer is the second link of the chain nginx
 * verified; a resumed session has no chain, and its issuer is the
 * certificate of the server's trust store that has the issuer's name and
 * whose key verifies the client certificate's signature.  "-" without a
 * verified certificate; NGX_DECLINED when the issuer is not found (an
 * intermediate the client sent in the full handshake only).
 */

static ngx_int_t
ngx_http_nalar_client_ca(ngx_http_request_t *r, u_char *hex)
{
#if (NGX_HTTP_SSL)
    int              i;
    SSL             *ssl;
    X509            *cert, *ca, *c;
    u_char           md[EVP_MAX_MD_SIZE];
    unsigned int     n;
    X509_STORE_CTX  *sctx;
    STACK_OF(X509)  *chain, *certs;

    if (r->connection->ssl == NULL) {
        goto none;
    }

    ssl = r->connection->ssl->connection;

    if (SSL_get_verify_result(ssl) != X509_V_OK) {
        goto none;
    }

    cert = SSL_get_peer_certificate(ssl);
    if (cert == NULL) {
        goto none;
    }

    ca = NULL;
    chain = SSL_get0_verified_chain(ssl);

    if (chain != NULL && sk_X509_num(chain) > 0) {

        /* the leaf, its issuer, ...; a trusted self-signed leaf alone */

        ca = sk_X509_value(chain, sk_X509_num(chain) > 1 ? 1 : 0);
        X509_up_ref(ca);

    } else {
        sctx = X509_STORE_CTX_new();

        if (sctx != NULL
            && X509_STORE_CTX_init(sctx,
                                   SSL_CTX_get_cert_store(
                                       SSL_get_SSL_CTX(ssl)),
                                   cert, NULL)
               == 1)
        {
            certs = X509_STORE_CTX_get1_certs(sctx,
                                              X509_get_issuer_name(cert));

            for (i = 0; certs != NULL && i < sk_X509_num(certs); i++) {
                c = sk_X509_value(certs, i);

                if (X509_check_issued(c, cert) == X509_V_OK
                    && X509_verify(cert, X509_get0_pubkey(c)) == 1)
                {
                    ca = c;
                    X509_up_ref(ca);
                    break;
                }
            }

            sk_X509_pop_free(certs, X509_free);
        }

        X509_STORE_CTX_free(sctx);
    }

    X509_free(cert);

    if (ca == NULL) {
        return NGX_DECLINED;
    }

    n = 0;

    if (X509_pubkey_digest(ca, EVP_sha256(), md, &n) != 1) {
        n = 0;
    }

    X509_free(ca);

    if (n == 0) {
        return NGX_DECLINED;
    }

    *ngx_hex_dump(hex, md, n) = '\0';
    return NGX_OK;

none:
#endif

    hex[0] = '-';
    hex[1] = '\0';

    return NGX_OK;
}


/*
 * RFC 6750 3.1: no error code when no credentials were sent at all.  Under
 * `satisfy any` the access phase may have added the header already and
 * disabled it when another module let the request in: it is reused.
 */

ngx_int_t
ngx_http_nalar_unauthorized(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx)
{
    ngx_table_elt_t  *h;

    h = r->headers_out.www_authenticate;

    if (h == NULL) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    h->hash = 1;
    ngx_str_set(&h->key, "WWW-Authenticate");

    if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_MISSING) {
        ngx_str_set(&h->value, "Bearer");

    } else {
        ngx_str_set(&h->value, "Bearer error=\"invalid_token\"");
    }

    r->headers_out.www_authenticate = h;

    return NGX_HTTP_UNAUTHORIZED;
}


/*
 * The prefix cache scope of a request: its tenant, or the global scope
 * with nalar_prefix_cache_scope global.  And the leading whole blocks its
 * prompt has in common with the operator's nalar_shared_prefix: those live
 * in the global scope for every tenant (the text is the operator's, so
 * sharing it tells no tenant anything about another).
 */

ngx_int_t
ngx_http_nalar_scope(ngx_http_request_t *r, ngx_http_nalar_ctx_t *ctx,
    nalar_request_params *p)
{
    int                           special;
    ngx_http_nalar_shared_t      *sp;
    ngx_http_nalar_prefix_ids_t  *pi;
    ngx_http_nalar_loc_conf_t    *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if (nlcf->cache_scope == NGX_HTTP_NALAR_SCOPE_GLOBAL) {
        p->cache_scope = "";

    } else if (ctx->tenant_state == NGX_HTTP_NALAR_TENANT_ANON) {
        p->no_cache = 1;
        return NGX_OK;

    } else {
        /* NULL for a single tenant: the global scope */
        p->cache_scope = (const char *) ctx->scope.data;
    }

    sp = nlcf->shared;

    if (sp == NULL) {
        return NGX_OK;
    }

    /* the load watch tokenizes them when the model is ready; a request
     * may come first */

    if (ctx->model->prefix == NULL
        && ngx_http_nalar_tokenize_shared(ctx->model, r->connection->log)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* tokenized as the prompt is: control tokens are parsed for chat */

    special = (ctx->endpoint == NGX_HTTP_NALAR_EP_CHAT);
    pi = &ctx->model->prefix[2 * sp->index + special];

    /* the engine finds the whole blocks the prompt begins with */

    p->shared_prefix = pi->ids;
    p->n_shared_ids = pi->n;

    return NGX_OK;
}


/*
 * nalar_jwt_key FILE [ALG] | off;
 * Loaded now, so that `nginx -t` reports a bad key; each key is bound to
 * one algorithm here (see jwt.h), which is what defeats algorithm
 * confusion and "alg": "none".
 */

char *
ngx_http_nalar_jwt_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    FILE                *fp;
    size_t               n;
    u_char               buf[4096], md[EVP_MAX_MD_SIZE];
    nalar_err            err;
    ngx_str_t           *value, file;
    EVP_MD_CTX          *mdc;
    const char          *alg;
    unsigned int         md_len;
    nalar_jwt_keyset    *k;
    ngx_pool_cleanup_t  *cln;

    if (nlcf->jwt != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        nlcf->jwt = NULL;
        return NGX_CONF_OK;
    }

    file = value[1];

    if (ngx_conf_full_name(cf->cycle, &file, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    alg = (cf->args->nelts == 3) ? (const char *) value[2].data : NULL;

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    k = nalar_jwt_keyset_load((const char *) file.data, alg, &err);

    if (k == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "nalar_jwt_key: %s",
                           err.msg);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_nalar_jwt_cleanup;
    cln->data = k;

    nlcf->jwt = k;

    /* the key's identity in cache scopes: tenants that different keys
     * vouch for never share */

    fp = fopen((const char *) file.data, "rb");
    mdc = EVP_MD_CTX_new();
    md_len = 0;

    if (fp != NULL && mdc != NULL
        && EVP_DigestInit_ex(mdc, EVP_sha256(), NULL) == 1)
    {
        while ((n = fread(buf, 1, sizeof(buf), fp)) > 0) {
            if (EVP_DigestUpdate(mdc, buf, n) != 1) {
                break;
            }
        }

        if (!ferror(fp) && EVP_DigestFinal_ex(mdc, md, &md_len) != 1) {
            md_len = 0;
        }
    }

    EVP_MD_CTX_free(mdc);

    if (fp != NULL) {
        (void) fclose(fp);
    }

    if (md_len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "nalar_jwt_key: cannot hash \"%V\"", &file);
        return NGX_CONF_ERROR;
    }

    nlcf->jwt_id.data = ngx_pnalloc(cf->pool, 2 * md_len);
    if (nlcf->jwt_id.data == NULL) {
        return NGX_CONF_ERROR;
    }

    nlcf->jwt_id.len = ngx_hex_dump(nlcf->jwt_id.data, md, md_len)
                       - nlcf->jwt_id.data;

    return NGX_CONF_OK;
}


static void
ngx_http_nalar_jwt_cleanup(void *data)
{
    nalar_jwt_keyset_free(data);
}
