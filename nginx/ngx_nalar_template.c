/*
 * Chat templates in the configuration: `nalar_chat_template auto |
 * file=PATH | STYLE` and each model's own tokenizer.chat_template,
 * compiled once when the configuration is read (so `nginx -t` reports a
 * template that does not compile, with its line), shared read-only by
 * the workers, and freed with the configuration's pool.  Requests render
 * them on the engine threads (api/chat_template.h).
 */

#include "ngx_nalar_module.h"


static void ngx_http_nalar_template_cleanup(void *data);
static nalar_chat_template *ngx_http_nalar_template_compile(ngx_conf_t *cf,
    const char *src, size_t len, char *err, size_t err_len);


/* A compiled template freed with the configuration; NULL with err. */

static nalar_chat_template *
ngx_http_nalar_template_compile(ngx_conf_t *cf, const char *src, size_t len,
    char *err, size_t err_len)
{
    ngx_pool_cleanup_t   *cln;
    nalar_chat_template  *t;

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_cpystrn((u_char *) err, (u_char *) "out of memory", err_len);
        return NULL;
    }

    t = nalar_chat_template_compile(src, len, err, err_len);
    if (t == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_nalar_template_cleanup;
    cln->data = t;

    return t;
}


static void
ngx_http_nalar_template_cleanup(void *data)
{
    nalar_chat_template_free(data);
}


/*
 * The model's own template (tokenizer.chat_template), compiled for
 * `nalar_chat_template auto`.  A model without one is rendered with the
 * style its vocabulary suggests; one whose template does not compile is
 * too, with a warning that names the line (a GGUF may come from anywhere:
 * the operator can name a style or a file instead).
 */

ngx_int_t
ngx_http_nalar_model_template(ngx_conf_t *cf, ngx_http_nalar_model_t *model)
{
    char        *src, msg[512];
    nalar_err    err;
    gguf_file   *f;

    f = gguf_open((char *) model->path.data, &err);
    if (f == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "nalar_model \"%V\": %s",
                           &model->name, err.msg);
        return NGX_ERROR;
    }

    src = gguf_get_str(f, "tokenizer.chat_template");
    gguf_close(f);

    if (src == NULL) {
        return NGX_OK;
    }

    model->tmpl = ngx_http_nalar_template_compile(cf, src, strlen(src), msg,
                                                  sizeof(msg));
    free(src);

    if (model->tmpl == NULL) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "nalar_model \"%V\": its tokenizer.chat_template "
                           "does not compile (%s); chat requests use the "
                           "style found in it unless nalar_chat_template "
                           "names a style or file=PATH", &model->name, msg);
    }

    return NGX_OK;
}


/* nalar_chat_template auto | file=PATH | STYLE */

char *
ngx_http_nalar_chat_template(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    int         style;
    char        msg[512];
    u_char     *src;
    ssize_t     n;
    ngx_str_t  *value, path;
    ngx_file_t  file;

    if (nlcf->chat_style != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    nlcf->chat_tmpl = NULL;

    if (value[1].len > 5 && ngx_strncmp(value[1].data, "file=", 5) == 0) {
        path.data = value[1].data + 5;
        path.len = value[1].len - 5;

        if (ngx_conf_full_name(cf->cycle, &path, 1) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

        ngx_memzero(&file, sizeof(ngx_file_t));
        file.name = path;
        file.log = cf->log;

        file.fd = ngx_open_file(path.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
        if (file.fd == NGX_INVALID_FILE) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                               ngx_open_file_n " \"%V\" failed", &path);
            return NGX_CONF_ERROR;
        }

        if (ngx_fd_info(file.fd, &file.info) == NGX_FILE_ERROR
            || ngx_file_size(&file.info) > NGX_HTTP_NALAR_MAX_TEMPLATE)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "chat template \"%V\" "
                               "is not a file of at most %d bytes", &path,
                               NGX_HTTP_NALAR_MAX_TEMPLATE);
            ngx_close_file(file.fd);
            return NGX_CONF_ERROR;
        }

        src = ngx_pnalloc(cf->temp_pool, ngx_file_size(&file.info) + 1);
        if (src == NULL) {
            ngx_close_file(file.fd);
            return NGX_CONF_ERROR;
        }

        n = ngx_read_file(&file, src, ngx_file_size(&file.info), 0);
        ngx_close_file(file.fd);

        if (n == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        nlcf->chat_tmpl = ngx_http_nalar_template_compile(cf, (char *) src,
                                                          (size_t) n, msg,
                                                          sizeof(msg));
        if (nlcf->chat_tmpl == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "chat template \"%V\": "
                               "%s", &path, msg);
            return NGX_CONF_ERROR;
        }

        nlcf->chat_style = NALAR_CHAT_AUTO;

        return NGX_CONF_OK;
    }

    style = nalar_chat_style_parse((char *) value[1].data, value[1].len);
    if (style < 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid chat template \"%V\": \"auto\", "
                           "\"file=PATH\", \"chatml\", \"llama2\", "
                           "\"llama3\", \"zephyr\", \"mistral\", "
                           "\"mistral-v7\", \"mistral-v1\", \"mistral-v3\", "
                           "\"mistral-v7-spm\", \"gemma\" or \"phi3\" "
                           "expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    nlcf->chat_style = (ngx_uint_t) style;

    return NGX_CONF_OK;
}
