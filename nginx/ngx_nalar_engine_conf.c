/*
 * The directives that size and shape each engine: nalar_kv_cache (the KV
 * pool's size and the type its K and V are kept in), nalar_gpu_memory,
 * nalar_speculative, and the step budget: nalar_max_batch_tokens and
 * nalar_itl_target.  Their handlers check the values and store them in the
 * main (or location) configuration; ngx_nalar_module.c keeps the command
 * table, the defaults and the checks across directives.
 *
 * Configuration only: they touch the configuration being read, nothing
 * else.
 */

#include "ngx_nalar_module.h"


/*
 * nalar_kv_cache [SIZE] [dtype=f32|f16|bf16];
 * The KV pool's size (a cap on a GPU), and the type its K and V are kept
 * in: f32 (the default), f16 (the CPU backend) or bf16: half the bytes per
 * position, so the same size holds twice the blocks and attention reads
 * half as much.  Which backend keeps which type is checked with the
 * backend, in the main configuration's init.
 */

char *
ngx_http_nalar_kv_cache(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    off_t        size;
    ngx_str_t   *value;
    ngx_uint_t   i, have_size, have_dtype;

    if (nmcf->kv_cache != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    have_size = 0;
    have_dtype = 0;

    for (i = 1; i < cf->args->nelts; i++) {

        if (value[i].len > 6
            && ngx_strncmp(value[i].data, "dtype=", 6) == 0
            && !have_dtype)
        {
            have_dtype = 1;

            if (value[i].len == 9
                && ngx_strncmp(value[i].data + 6, "f32", 3) == 0)
            {
                nmcf->kv_type = GGML_F32;
                continue;
            }

            if (value[i].len == 9
                && ngx_strncmp(value[i].data + 6, "f16", 3) == 0)
            {
                nmcf->kv_type = GGML_F16;
                continue;
            }

            if (value[i].len == 10
                && ngx_strncmp(value[i].data + 6, "bf16", 4) == 0)
            {
                nmcf->kv_type = GGML_BF16;
                continue;
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid KV cache type \"%V\": \"dtype=f32\", "
                               "\"dtype=f16\" or \"dtype=bf16\" expected",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        size = ngx_parse_offset(&value[i]);

        if (have_size || size == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\": a size and "
                               "\"dtype=f32|f16|bf16\" expected", &value[i]);
            return NGX_CONF_ERROR;
        }

        have_size = 1;
        nmcf->kv_cache = size;
    }

    if (!have_size) {
        nmcf->kv_cache = 0;
    }

    return NGX_CONF_OK;
}


/*
 * nalar_gpu_memory FRACTION | SIZE;
 * The device KV pool: a fraction (0, 1] of the device memory still free
 * once the weights are uploaded ("0.9"), or a size ("24g").
 */

char *
ngx_http_nalar_gpu_memory(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    off_t       size;
    ngx_int_t   frac;
    ngx_str_t  *value;

    if (nmcf->gpu_memory > 0) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strlchr(value[1].data, value[1].data + value[1].len, '.')
        != NULL)
    {
        /* a fraction with up to 4 decimals: "0.9", "1.0", ".85" */
        frac = ngx_atofp(value[1].data, value[1].len, 4);

        if (frac <= 0 || frac > 10000) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\": a fraction in (0, 1] "
                               "or a size expected", &value[1]);
            return NGX_CONF_ERROR;
        }

        nmcf->gpu_memory = (double) frac / 10000;
        return NGX_CONF_OK;
    }

    size = ngx_parse_offset(&value[1]);

    if (size == NGX_ERROR || size < 2) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\": a fraction in (0, 1] "
                           "or a size expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    nmcf->gpu_memory = (double) size;

    return NGX_CONF_OK;
}


/*
 * nalar_speculative off | draft | ngram | auto [max=K] [fixed];
 * The engine is per model, so a location's choice travels with each
 * request; the http-level one is also the engines' default.
 */

char *
ngx_http_nalar_speculative(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_int_t                    k;
    ngx_str_t                   *value;
    ngx_flag_t                   fixed;
    ngx_uint_t                   i, mode;
    ngx_http_nalar_main_conf_t  *nmcf;

    if (nlcf->spec_mode != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        mode = NALAR_SPEC_OFF;

    } else if (ngx_strcmp(value[1].data, "draft") == 0) {
        mode = NALAR_SPEC_DRAFT;

    } else if (ngx_strcmp(value[1].data, "ngram") == 0) {
        mode = NALAR_SPEC_NGRAM;

    } else if (ngx_strcmp(value[1].data, "auto") == 0) {
        mode = NALAR_SPEC_AUTO;

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\": \"off\", \"draft\", "
                           "\"ngram\" or \"auto\" expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    k = 4;
    fixed = 0;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strcmp(value[i].data, "fixed") == 0 && !fixed) {
            fixed = 1;
            continue;
        }

        k = -1;

        if (ngx_strncmp(value[i].data, "max=", 4) == 0) {
            k = ngx_atoi(value[i].data + 4, value[i].len - 4);
        }

        if (k < 1 || k > NALAR_SPEC_MAX_K) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\": \"max=\" with "
                               "1..%d or \"fixed\" expected", &value[i],
                               NALAR_SPEC_MAX_K);
            return NGX_CONF_ERROR;
        }
    }

    nlcf->spec_mode = mode;
    nlcf->spec_max_k = k;
    nlcf->spec_fixed = fixed;

    nmcf = ngx_http_conf_get_module_main_conf(cf, ngx_nalar_module);

    if (mode == NALAR_SPEC_DRAFT) {
        nmcf->spec_draft = 1;
    }

    if (cf->cmd_type == NGX_HTTP_MAIN_CONF) {
        nmcf->spec_mode = mode;
        nmcf->spec_max_k = k;
    }

    return NGX_CONF_OK;
}


/*
 * nalar_max_batch_tokens auto | N;
 * N: every step carries at most N tokens (decodes first, then prompt
 * chunks).  auto (the default, stored as 0): prompt chunks sized so that a
 * step fits nalar_itl_target, at most 512 tokens.
 */

char *
ngx_http_nalar_max_batch_tokens(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;

    if (nmcf->max_batch_tokens != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 4 && ngx_strncmp(value[1].data, "auto", 4) == 0) {
        nmcf->max_batch_tokens = 0;
        return NGX_CONF_OK;
    }

    n = ngx_atoi(value[1].data, value[1].len);

    if (n == NGX_ERROR || n < 1 || n > 0x7fffffff) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\": \"auto\" or a number "
                           "of tokens (at least 1) expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    nmcf->max_batch_tokens = n;

    return NGX_CONF_OK;
}


/*
 * nalar_itl_target TIME | off;
 * The inter-token latency a step should fit (with nalar_max_batch_tokens
 * auto): "100ms", "1s".  off: a fixed budget of 512 tokens.
 */

char *
ngx_http_nalar_itl_target(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    ngx_msec_t  t;
    ngx_str_t  *value;

    if (nmcf->itl_target != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        nmcf->itl_target = 0;
        return NGX_CONF_OK;
    }

    t = ngx_parse_time(&value[1], 0);

    if (t == (ngx_msec_t) NGX_ERROR || t == 0 || t > 3600000) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\": a time from 1ms to 1h "
                           "(\"100ms\") or \"off\" expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    nmcf->itl_target = t;

    return NGX_CONF_OK;
}
