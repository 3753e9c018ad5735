/*
 * Shared prefixes: nalar_shared_prefix's handler reads the file while the
 * configuration is read (nginx -t reports a bad one), and each worker
 * tokenizes every prefix per model, both ways (literal and with control
 * tokens), once the model is ready.
 *
 * Configuration, then the event loop only: the tokenizing reads the
 * model's tokenizer and writes the worker's runtime pool, never an engine
 * lock.
 */

#include "ngx_nalar_module.h"


/*
 * nalar_shared_prefix FILE | off;
 * The text is read now (one trailing newline dropped) and tokenized in each
 * worker, per model, once the model is ready.
 */

char *
ngx_http_nalar_shared_prefix(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    off_t                        size;
    ssize_t                      n;
    ngx_str_t                   *value;
    ngx_file_t                   file;
    ngx_file_info_t              fi;
    ngx_http_nalar_shared_t     *sp, **spp;
    ngx_http_nalar_main_conf_t  *nmcf;

    if (nlcf->shared != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        nlcf->shared = NULL;
        return NGX_CONF_OK;
    }

    sp = ngx_pcalloc(cf->pool, sizeof(ngx_http_nalar_shared_t));
    if (sp == NULL) {
        return NGX_CONF_ERROR;
    }

    sp->file = value[1];

    if (ngx_conf_full_name(cf->cycle, &sp->file, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&file, sizeof(ngx_file_t));
    file.name = sp->file;
    file.log = cf->log;

    file.fd = ngx_open_file(sp->file.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "nalar_shared_prefix: " ngx_open_file_n
                           " \"%V\" failed", &sp->file);
        return NGX_CONF_ERROR;
    }

    n = NGX_ERROR;

    if (ngx_fd_info(file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "nalar_shared_prefix: " ngx_fd_info_n
                           " \"%V\" failed", &sp->file);
        goto done;
    }

    size = ngx_file_size(&fi);

    if (size <= 0 || size > NGX_HTTP_NALAR_MAX_SHARED) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_shared_prefix: \"%V\" has %O bytes; "
                           "1 to %d expected", &sp->file, size,
                           NGX_HTTP_NALAR_MAX_SHARED);
        goto done;
    }

    sp->text.data = ngx_pnalloc(cf->pool, size + 1);
    if (sp->text.data == NULL) {
        goto done;
    }

    n = ngx_read_file(&file, sp->text.data, size, 0);

    if (n != NGX_ERROR && n != size) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_shared_prefix: read only %z of %O bytes "
                           "of \"%V\"", n, size, &sp->file);
        n = NGX_ERROR;
    }

done:

    if (ngx_close_file(file.fd) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, ngx_errno,
                           ngx_close_file_n " \"%V\" failed", &sp->file);
    }

    if (n == NGX_ERROR) {
        return NGX_CONF_ERROR;
    }

    sp->text.len = n;

    if (sp->text.data[sp->text.len - 1] == '\n') {
        sp->text.len--;
    }

    sp->text.data[sp->text.len] = '\0';

    if (sp->text.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_shared_prefix: \"%V\" is empty", &sp->file);
        return NGX_CONF_ERROR;
    }

    nmcf = ngx_http_conf_get_module_main_conf(cf, ngx_nalar_module);

    spp = ngx_array_push(&nmcf->shared);
    if (spp == NULL) {
        return NGX_CONF_ERROR;
    }

    *spp = sp;
    sp->index = nmcf->shared.nelts - 1;

    nlcf->shared = sp;

    return NGX_CONF_OK;
}


/*
 * The model's ids of every nalar_shared_prefix, both ways (literal and
 * with control tokens), from the worker's runtime pool; a text that cannot
 * be tokenized shares nothing.  The model must be ready.
 */

ngx_int_t
ngx_http_nalar_tokenize_shared(ngx_http_nalar_model_rt_t *model,
    ngx_log_t *log)
{
    int                           n, more;
    int32_t                      *ids, *tok;
    nalar_tok_text                piece;
    ngx_uint_t                    k;
    nalar_model                  *m;
    ngx_http_nalar_shared_t     **sp;
    ngx_http_nalar_runtime_t     *rt;
    ngx_http_nalar_prefix_ids_t  *prefix;
    ngx_http_nalar_worker_t      *w;

    w = ngx_http_nalar_worker();

    rt = w->rt;
    sp = rt->conf->shared.elts;

    prefix = ngx_pcalloc(rt->pool, (2 * rt->conf->shared.nelts + 1)
                                   * sizeof(ngx_http_nalar_prefix_ids_t));
    if (prefix == NULL) {
        return NGX_ERROR;
    }

    m = nalar_engine_model(model->engine);

    for (k = 0; k < 2 * rt->conf->shared.nelts; k++) {
        piece.text = (const char *) sp[k / 2]->text.data;
        piece.len = sp[k / 2]->text.len;
        piece.special = k & 1;

        /* a prefix beyond the context can never be shared */

        tok = NULL;
        n = nalar_tokenize_bounded(nalar_model_tokenizer(m), &piece, 1,
                                   nalar_tok_add_bos(nalar_model_tokenizer(m)),
                                   nalar_model_n_ctx(m), &tok, &more);
        if (n < 0) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "nalar_shared_prefix \"%V\" could not be tokenized "
                          "for the model \"%V\"", &sp[k / 2]->file,
                          &model->name);
            n = 0;
        }

        ids = NULL;

        if (n > 0) {
            ids = ngx_palloc(rt->pool, n * sizeof(int32_t));
            if (ids == NULL) {
                free(tok);
                return NGX_ERROR;
            }

            ngx_memcpy(ids, tok, n * sizeof(int32_t));
        }

        free(tok);

        prefix[k].ids = ids;
        prefix[k].n = n;
    }

    model->prefix = prefix;

    return NGX_OK;
}
