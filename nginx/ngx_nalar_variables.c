
/*
 * The $nalar_* variables: a request's model and adapter, usage, tenant and
 * timings for the access log, and what an edge hands its nodes (the route key,
 * the signed identity).  Each reads what the request's steps recorded in its
 * ctx, or asks the file that owns the value (the tenant: tenancy; the
 * identity: the edge; the route key: the route); none of those calls back
 * here.
 *
 * Event loop only.
 */

#include "ngx_nalar_module.h"


static ngx_int_t ngx_http_nalar_tenant_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_nalar_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_nalar_edge_identity_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);


enum {
    NGX_HTTP_NALAR_VAR_MODEL = 0,
    NGX_HTTP_NALAR_VAR_ADAPTER,
    NGX_HTTP_NALAR_VAR_PROMPT_TOKENS,
    NGX_HTTP_NALAR_VAR_CACHED_TOKENS,
    NGX_HTTP_NALAR_VAR_COMPLETION_TOKENS,
    NGX_HTTP_NALAR_VAR_TTFT_MS,
    NGX_HTTP_NALAR_VAR_QUEUE_MS,
    NGX_HTTP_NALAR_VAR_SPEC_ACCEPTED,
    NGX_HTTP_NALAR_VAR_SPEC_PROPOSED,
    NGX_HTTP_NALAR_VAR_GRAMMAR_COMPILE_MS,
    NGX_HTTP_NALAR_VAR_GRAMMAR_MASK_MS,
    NGX_HTTP_NALAR_VAR_GRAMMAR_FORCED
};


static ngx_http_variable_t  ngx_http_nalar_vars[] = {

    { ngx_string("nalar_model"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_MODEL, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_adapter"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_ADAPTER, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_prompt_tokens"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_PROMPT_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_cached_tokens"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_CACHED_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_completion_tokens"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_COMPLETION_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_ttft_ms"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_TTFT_MS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_queue_ms"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_QUEUE_MS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_tenant"), NULL, ngx_http_nalar_tenant_variable,
      0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_spec_accepted"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_SPEC_ACCEPTED, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_spec_proposed"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_SPEC_PROPOSED, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_grammar_compile_ms"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_GRAMMAR_COMPILE_MS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_grammar_mask_ms"), NULL, ngx_http_nalar_variable,
      NGX_HTTP_NALAR_VAR_GRAMMAR_MASK_MS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_grammar_forced_tokens"), NULL,
      ngx_http_nalar_variable, NGX_HTTP_NALAR_VAR_GRAMMAR_FORCED,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_route_key"), NULL, ngx_http_nalar_route_key_variable,
      0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("nalar_edge_identity"), NULL,
      ngx_http_nalar_edge_identity_variable, 0, NGX_HTTP_VAR_NOCACHEABLE,
      0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_nalar_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_nalar_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_nalar_tenant_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_nalar_ctx_t  *ctx;

    ctx = ngx_http_nalar_tenant(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    if (ctx->tenant_state != NGX_HTTP_NALAR_TENANT_OK) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ctx->tenant.len;
    v->data = ctx->tenant.len ? ctx->tenant.data : (u_char *) "";
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_nalar_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    u_char                *p;
    double                 ms;
    ngx_uint_t             i;
    ngx_int_t              n;
    ngx_http_nalar_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx == NULL || ctx->model == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    if (data == NGX_HTTP_NALAR_VAR_MODEL) {
        v->len = ctx->model->name.len;
        v->data = ctx->model->name.data;
        v->valid = 1;
        v->no_cacheable = 1;
        v->not_found = 0;
        return NGX_OK;
    }

    /* the adapter that served it; empty: the base model alone */

    if (data == NGX_HTTP_NALAR_VAR_ADAPTER) {
        v->len = ctx->lora ? ctx->lora->name_len : 0;
        v->data = ctx->lora ? (u_char *) ctx->lora->name : (u_char *) "";
        v->valid = 1;
        v->no_cacheable = 1;
        v->not_found = 0;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT64_LEN + 8);
    if (p == NULL) {
        return NGX_ERROR;
    }

    switch (data) {

    case NGX_HTTP_NALAR_VAR_TTFT_MS:
    case NGX_HTTP_NALAR_VAR_QUEUE_MS:
        ms = (data == NGX_HTTP_NALAR_VAR_TTFT_MS) ? ctx->usage.ttft_ms
                                                  : ctx->usage.queue_ms;
        if (ms < 0) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->len = ngx_sprintf(p, "%.3f", ms) - p;
        break;

    case NGX_HTTP_NALAR_VAR_GRAMMAR_COMPILE_MS:
    case NGX_HTTP_NALAR_VAR_GRAMMAR_MASK_MS:
    case NGX_HTTP_NALAR_VAR_GRAMMAR_FORCED:

        /* summed over the choices; "-" without a grammar */

        ms = 0;
        n = 0;
        for (i = 0; i < ctx->n && ctx->choices; i++) {
            if (ctx->choices[i].usage.grammar_compile_ms < 0) {
                continue;
            }
            n++;
            ms += data == NGX_HTTP_NALAR_VAR_GRAMMAR_COMPILE_MS
                  ? ctx->choices[i].usage.grammar_compile_ms
                  : data == NGX_HTTP_NALAR_VAR_GRAMMAR_MASK_MS
                  ? ctx->choices[i].usage.grammar_mask_ms
                  : ctx->choices[i].usage.grammar_forced;
        }

        if (n == 0) {
            v->not_found = 1;
            return NGX_OK;
        }

        if (data == NGX_HTTP_NALAR_VAR_GRAMMAR_FORCED) {
            v->len = ngx_sprintf(p, "%i", (ngx_int_t) ms) - p;

        } else {
            v->len = ngx_sprintf(p, "%.3f", ms) - p;
        }

        break;

    default:
        if (data == NGX_HTTP_NALAR_VAR_PROMPT_TOKENS) {
            n = ctx->usage.n_prompt;

        } else if (data == NGX_HTTP_NALAR_VAR_CACHED_TOKENS) {
            n = ctx->usage.n_cached;

        } else {
            n = 0;
            for (i = 0; i < ctx->n && ctx->choices; i++) {
                n += data == NGX_HTTP_NALAR_VAR_SPEC_ACCEPTED
                     ? ctx->choices[i].usage.spec_accepted
                     : data == NGX_HTTP_NALAR_VAR_SPEC_PROPOSED
                     ? ctx->choices[i].usage.spec_proposed
                     : ctx->choices[i].usage.n_completion;
            }
        }

        v->len = ngx_sprintf(p, "%i", n) - p;
        break;
    }

    v->data = p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * $nalar_edge_identity: the tenant is established only where there is a
 * key to sign it with; ngx_http_nalar_edge_sign() says why not otherwise.
 */

static ngx_int_t
ngx_http_nalar_edge_identity_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_nalar_ctx_t       *ctx;
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    ctx = nlcf->edge_key ? ngx_http_nalar_tenant(r) : ngx_http_nalar_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_nalar_edge_sign(r, ctx, v);
}
