
/*
 * LoRA adapters through nginx: the directives (nalar_lora at http level,
 * nalar_adapter and nalar_lora_allow in locations), which adapters a
 * request may be served by, the adapters handed to each base model's
 * engine, and their counters for /metrics.
 *
 * Who chooses: where nalar_adapter is set, the server does, for every
 * request of the location (from a JWT claim, a map of $nalar_tenant, ...),
 * and the body cannot choose otherwise; elsewhere a body may name, as its
 * `model`, an adapter that nalar_lora_allow lets the location serve (none
 * by default).  Both reach the parse (api/request.c) as the list of
 * adapters it may serve: any other name gets the answer of an unknown
 * model, so an answer never tells which adapters exist.
 *
 * Configuration, and the event loop (the choice, the counters).  What a
 * request is given of its adapters is configuration memory, read-only in
 * workers, which a parse thread may read until the worker exits.
 */

#include "ngx_nalar_module.h"

#include <math.h>
#include <stddef.h>

#include "lora.h"


static ngx_int_t ngx_http_nalar_lora_find(ngx_array_t *a, size_t off,
    ngx_str_t *name);
static nalar_model *ngx_http_nalar_lora_base_open(ngx_conf_t *cf,
    ngx_http_nalar_model_t *model, nalar_err *err);
static void ngx_http_nalar_lora_base_close(void *data);


/* the per-adapter counters, labelled model and adapter */

typedef struct {
    char  *name;
    char  *help;
} ngx_http_nalar_lora_series_t;


static ngx_http_nalar_lora_series_t  ngx_http_nalar_lora_series[] = {
    { "nalar_lora_requests_total",
      "Requests served with a LoRA adapter (accepted at intake)." },
    { "nalar_lora_prompt_tokens_total",
      "Prompt tokens of requests served with a LoRA adapter." },
    { "nalar_lora_generation_tokens_total",
      "Tokens generated with a LoRA adapter." }
};


#define NGX_HTTP_NALAR_LORA_SERIES                                            \
    (sizeof(ngx_http_nalar_lora_series)                                       \
     / sizeof(ngx_http_nalar_lora_series[0]))


/*
 * The index of the element of array `a` whose name (the ngx_str_t at
 * offset `off` in it) is `name`, or -1: every lookup by name here, of
 * models, adapters and nalar_lora_allow's words.
 */

static ngx_int_t
ngx_http_nalar_lora_find(ngx_array_t *a, size_t off, ngx_str_t *name)
{
    u_char      *p;
    ngx_str_t   *s;
    ngx_uint_t   i;

    p = a->elts;

    for (i = 0; i < a->nelts; i++) {
        s = (ngx_str_t *) (p + i * a->size + off);

        if (s->len == name->len
            && ngx_strncmp(s->data, name->data, name->len) == 0)
        {
            return (ngx_int_t) i;
        }
    }

    return -1;
}


#define ngx_http_nalar_find_model(nmcf, s)                                    \
    ngx_http_nalar_lora_find(&(nmcf)->models,                                 \
                             offsetof(ngx_http_nalar_model_t, name), s)

#define ngx_http_nalar_find_lora(nmcf, s)                                     \
    ngx_http_nalar_lora_find(&(nmcf)->loras,                                  \
                             offsetof(ngx_http_nalar_lora_t, name), s)


/*
 * nalar_lora NAME PATH [base=MODEL] [scale=S];
 * The base is a model configured above (the first one by default); the
 * file is checked against the base's now, without reading weights, so
 * that `nginx -t` catches a missing, truncated or foreign adapter.  The
 * base is opened once for all its adapters (lora_base), and closed at
 * the end of the http block (ngx_http_nalar_lora_close).
 */

char *
ngx_http_nalar_lora(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    char                    *end;
    ngx_int_t                m;
    ngx_str_t               *value, base;
    ngx_uint_t               i, n;
    nalar_err                err;
    nalar_model             *meta;
    ngx_http_nalar_lora_t   *lora;
    ngx_http_nalar_model_t  *model;

    value = cf->args->elts;

    if (cf->args->nelts > 5) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid number of arguments in \"nalar_lora\" "
                           "directive");
        return NGX_CONF_ERROR;
    }

    if (value[1].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_lora: the adapter's name is empty");
        return NGX_CONF_ERROR;
    }

    /* the name goes into metrics labels and logs as it is */

    for (i = 0; i < value[1].len; i++) {
        if (value[1].data[i] < 0x20 || value[1].data[i] == 0x7f
            || value[1].data[i] == '"' || value[1].data[i] == '\\')
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora \"%V\": a name may not hold "
                               "quotes, backslashes or control characters",
                               &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    /* nalar_lora_allow reads these two as keywords */

    if ((value[1].len == 3 && ngx_strncmp(value[1].data, "all", 3) == 0)
        || (value[1].len == 4 && ngx_strncmp(value[1].data, "none", 4) == 0))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_lora \"%V\": \"all\" and \"none\" are "
                           "nalar_lora_allow's keywords, not names",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_nalar_lora_clash(cf, nmcf, &value[1]) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    lora = ngx_array_push(&nmcf->loras);
    if (lora == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(lora, sizeof(ngx_http_nalar_lora_t));

    lora->name = value[1];
    lora->path = value[2];
    lora->scale = 1.0;

    ngx_str_null(&base);

    for (i = 3; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "base=", 5) == 0 && base.data == NULL)
        {
            base.data = value[i].data + 5;
            base.len = value[i].len - 5;
            continue;
        }

        if (ngx_strncmp(value[i].data, "scale=", 6) == 0
            && value[i].len > 6)
        {
            /* the argument is NUL-terminated */
            lora->scale = strtod((char *) value[i].data + 6, &end);

            /* the engine holds it as a float: 1e-6 .. 1e6 keeps it one */

            if (*end == '\0' && lora->scale >= 1e-6 && lora->scale <= 1e6) {
                continue;
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora \"%V\": invalid \"%V\": the "
                               "scale must be a finite number above 0",
                               &value[1], &value[i]);
            return NGX_CONF_ERROR;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_lora \"%V\": invalid parameter \"%V\"",
                           &value[1], &value[i]);
        return NGX_CONF_ERROR;
    }

    m = base.data == NULL ? (nmcf->models.nelts ? 0 : -1)
                          : ngx_http_nalar_find_model(nmcf, &base);

    if (m == -1) {
        if (base.data == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora \"%V\": no nalar_model is "
                               "configured before it to be its base",
                               &value[1]);
        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora \"%V\": unknown base model "
                               "\"%V\" (base= names a nalar_model "
                               "configured before it)", &value[1], &base);
        }

        return NGX_CONF_ERROR;
    }

    model = (ngx_http_nalar_model_t *) nmcf->models.elts + m;

    if (ngx_conf_full_name(cf->cycle, &lora->path, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    /* ngx_conf_full_name() leaves the path NUL-terminated */

    err.msg[0] = '\0';

    meta = ngx_http_nalar_lora_base_open(cf, model, &err);

    if (meta == NULL && err.msg[0] == '\0') {
        return NGX_CONF_ERROR;
    }

    if (meta == NULL
        || nalar_lora_check_model(meta, (char *) lora->path.data, &err) != 0)
    {
        /* the message names the file: "FILE: what is wrong" */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_lora \"%V\" (base \"%V\"): %s",
                           &value[1], &model->name, err.msg);
        return NGX_CONF_ERROR;
    }

    /* its index among its base's adapters, as the engine numbers them */

    n = 1;
    lora = nmcf->loras.elts;

    for (i = 0; i < nmcf->loras.nelts - 1; i++) {
        n += (lora[i].api.model == (int) m);
    }

    lora = &lora[nmcf->loras.nelts - 1];

    lora->api.name = (char *) lora->name.data;
    lora->api.name_len = lora->name.len;
    lora->api.model = (int) m;
    lora->api.adapter = (int32_t) n;

    return NGX_CONF_OK;
}


/*
 * The base `model` opened (its configuration, shapes and tokenizer, no
 * weights) for checking its adapters: by its first nalar_lora, then kept
 * until ngx_http_nalar_lora_close (or the configuration's pool goes, when
 * the configuration fails before).  NULL with err when it does not open,
 * NULL with an empty err when out of memory.
 */

static nalar_model *
ngx_http_nalar_lora_base_open(ngx_conf_t *cf, ngx_http_nalar_model_t *model,
    nalar_err *err)
{
    nalar_model         *meta;
    ngx_pool_cleanup_t  *cln;

    if (model->lora_base != NULL) {
        return model->lora_base->data;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    meta = nalar_model_open_meta((char *) model->path.data, err);
    if (meta == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_nalar_lora_base_close;
    cln->data = meta;
    model->lora_base = cln;

    return meta;
}


static void
ngx_http_nalar_lora_base_close(void *data)
{
    nalar_model_destroy(data);
}


/* The end of the http block: every base opened for its adapters is
 * closed (a worker holds no such mapping). */

void
ngx_http_nalar_lora_close(ngx_http_nalar_main_conf_t *nmcf)
{
    ngx_uint_t               i;
    ngx_http_nalar_model_t  *model;

    model = nmcf->models.elts;

    for (i = 0; i < nmcf->models.nelts; i++) {
        if (model[i].lora_base == NULL) {
            continue;
        }

        model[i].lora_base->handler(model[i].lora_base->data);
        model[i].lora_base->handler = NULL;
        model[i].lora_base = NULL;
    }
}


/*
 * A new model's or adapter's name must be no configured model's and no
 * adapter's: a `model` in a body names one of them.
 */

char *
ngx_http_nalar_lora_clash(ngx_conf_t *cf, ngx_http_nalar_main_conf_t *nmcf,
    ngx_str_t *name)
{
    if (ngx_http_nalar_find_model(nmcf, name) != -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" is already the name of a nalar_model",
                           name);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_nalar_find_lora(nmcf, name) != -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" is already the name of a nalar_lora",
                           name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* nalar_lora_allow all | none | NAME ...; the names are checked at merge,
 * when every nalar_lora is known */

char *
ngx_http_nalar_lora_allow(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_str_t   *value, *s;
    ngx_uint_t   i;

    if (nlcf->lora_allow != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    nlcf->lora_allow = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                        sizeof(ngx_str_t));
    if (nlcf->lora_allow == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        if ((ngx_strcmp(value[i].data, "all") == 0
             || ngx_strcmp(value[i].data, "none") == 0)
            && cf->args->nelts > 2)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora_allow: \"%V\" stands alone",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        if (ngx_http_nalar_lora_find(nlcf->lora_allow, 0, &value[i]) != -1) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora_allow: \"%V\" is named twice",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        s = ngx_array_push(nlcf->lora_allow);
        if (s == NULL) {
            return NGX_CONF_ERROR;
        }

        *s = value[i];
    }

    return NGX_CONF_OK;
}


/*
 * The location's adapters: nalar_adapter and nalar_lora_allow inherited
 * as nginx inherits, and the list a body may choose from made of the
 * allowed names (none when nalar_lora_allow is set nowhere above).
 */

char *
ngx_http_nalar_lora_merge(ngx_conf_t *cf, ngx_http_nalar_loc_conf_t *prev,
    ngx_http_nalar_loc_conf_t *conf)
{
    ngx_int_t                    k;
    ngx_str_t                   *word;
    ngx_uint_t                   i, j, all;
    ngx_http_nalar_lora_t       *lora;
    ngx_http_nalar_main_conf_t  *nmcf;

    ngx_conf_merge_ptr_value(conf->adapter, prev->adapter, NULL);
    ngx_conf_merge_ptr_value(conf->lora_allow, prev->lora_allow, NULL);

    conf->lora_list = NULL;
    conf->n_lora_list = 0;

    if (conf->lora_allow == NULL) {
        return NGX_CONF_OK;
    }

    nmcf = ngx_http_conf_get_module_main_conf(cf, ngx_nalar_module);
    lora = nmcf->loras.elts;
    word = conf->lora_allow->elts;

    if (ngx_strcmp(word[0].data, "none") == 0) {
        return NGX_CONF_OK;
    }

    all = (ngx_strcmp(word[0].data, "all") == 0);

    /* one more than needed: no adapter configured is no empty palloc */

    conf->lora_list = ngx_palloc(cf->pool, (nmcf->loras.nelts + 1)
                                           * sizeof(nalar_api_lora));
    if (conf->lora_list == NULL) {
        return NGX_CONF_ERROR;
    }

    if (all) {
        for (i = 0; i < nmcf->loras.nelts; i++) {
            conf->lora_list[i] = lora[i].api;
        }

        conf->n_lora_list = nmcf->loras.nelts;

        return NGX_CONF_OK;
    }

    for (j = 0; j < conf->lora_allow->nelts; j++) {
        k = ngx_http_nalar_find_lora(nmcf, &word[j]);

        if (k == -1) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_lora_allow: \"%V\" is not a "
                               "nalar_lora", &word[j]);
            return NGX_CONF_ERROR;
        }

        conf->lora_list[conf->n_lora_list++] = lora[k].api;
    }

    return NGX_CONF_OK;
}


/*
 * The adapters this request's parse may serve, in `in`: nalar_adapter's
 * value alone (forced), none where it is empty, else those the location
 * allows.  A value that names no adapter is the configuration's mistake:
 * logged with the value, and the client gets a 500.
 */

ngx_int_t
ngx_http_nalar_lora_in(ngx_http_request_t *r, nalar_api_in *in)
{
    ngx_int_t                    k;
    ngx_str_t                    value;
    ngx_http_nalar_lora_t       *lora;
    ngx_http_nalar_loc_conf_t   *nlcf;
    ngx_http_nalar_main_conf_t  *nmcf;

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    in->loras = NULL;
    in->n_loras = 0;
    in->lora_forced = 0;

    if (nlcf->adapter == NULL) {
        in->loras = nlcf->lora_list;
        in->n_loras = nlcf->n_lora_list;
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, nlcf->adapter, &value) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (value.len == 0) {
        return NGX_OK;
    }

    nmcf = ngx_http_get_module_main_conf(r, ngx_nalar_module);
    lora = nmcf->loras.elts;
    k = ngx_http_nalar_find_lora(nmcf, &value);

    if (k != -1) {
        in->loras = &lora[k].api;
        in->n_loras = 1;
        in->lora_forced = 1;
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "nalar_adapter: \"%V\" is not a nalar_lora", &value);

    return NGX_HTTP_INTERNAL_SERVER_ERROR;
}


/*
 * The adapters of model `model` for its engine, in the order of the
 * configuration (api.adapter - 1), allocated from `pool`, which outlives
 * the engine.
 */

ngx_int_t
ngx_http_nalar_lora_opts(ngx_pool_t *pool, ngx_http_nalar_main_conf_t *nmcf,
    ngx_uint_t model, nalar_engine_opts *opts)
{
    ngx_uint_t              i, n;
    nalar_engine_lora      *el;
    ngx_http_nalar_lora_t  *lora;

    opts->loras = NULL;
    opts->n_loras = 0;

    lora = nmcf->loras.elts;
    n = 0;

    for (i = 0; i < nmcf->loras.nelts; i++) {
        n += (lora[i].api.model == (int) model);
    }

    if (n == 0) {
        return NGX_OK;
    }

    el = ngx_pcalloc(pool, n * sizeof(nalar_engine_lora));
    if (el == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < nmcf->loras.nelts; i++) {
        if (lora[i].api.model != (int) model) {
            continue;
        }

        /* api.adapter counts from 1 */
        el[lora[i].api.adapter - 1].name = (char *) lora[i].name.data;
        el[lora[i].api.adapter - 1].path = (char *) lora[i].path.data;
        el[lora[i].api.adapter - 1].scale = lora[i].scale;
    }

    opts->loras = el;
    opts->n_loras = (int32_t) n;

    return NGX_OK;
}


/* Bytes the per-adapter counters take at most. */

size_t
ngx_http_nalar_lora_metrics_size(ngx_http_nalar_main_conf_t *nmcf)
{
    size_t                  size;
    ngx_uint_t              i;
    ngx_http_nalar_lora_t   *lora;
    ngx_http_nalar_model_t  *model;

    size = NGX_HTTP_NALAR_LORA_SERIES * 256;
    lora = nmcf->loras.elts;
    model = nmcf->models.elts;

    for (i = 0; i < nmcf->loras.nelts; i++) {
        size += NGX_HTTP_NALAR_LORA_SERIES
                * (128 + lora[i].name.len
                   + model[lora[i].api.model].name.len);
    }

    return size;
}


/*
 * The per-adapter counters, one series per adapter of a started engine
 * (an adapter whose base did not start has none): the engine's, taken
 * under its queue mutex, which no forward pass holds.  NULL: no memory.
 */

u_char *
ngx_http_nalar_lora_metrics(ngx_pool_t *pool, u_char *p, u_char *end,
    ngx_http_nalar_main_conf_t *nmcf, ngx_http_nalar_model_rt_t *model)
{
    uint64_t                       v;
    ngx_uint_t                     i, k;
    nalar_lora_metrics            *m;
    ngx_http_nalar_lora_t         *lora;
    ngx_http_nalar_model_rt_t     *base;
    ngx_http_nalar_lora_series_t  *s;

    if (model == NULL || nmcf->loras.nelts == 0) {
        return p;
    }

    lora = nmcf->loras.elts;

    m = ngx_palloc(pool, nmcf->loras.nelts * sizeof(nalar_lora_metrics));
    if (m == NULL) {
        return NULL;
    }

    for (i = 0; i < nmcf->loras.nelts; i++) {
        base = &model[lora[i].api.model];

        if (base->engine == NULL
            || nalar_engine_lora_metrics(base->engine, lora[i].api.adapter,
                                         &m[i])
               != 0)
        {
            ngx_memzero(&m[i], sizeof(nalar_lora_metrics));
        }
    }

    for (k = 0; k < NGX_HTTP_NALAR_LORA_SERIES; k++) {
        s = &ngx_http_nalar_lora_series[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s counter\n",
                         s->name, s->help, s->name);

        for (i = 0; i < nmcf->loras.nelts; i++) {
            base = &model[lora[i].api.model];

            if (base->engine == NULL) {
                continue;
            }

            switch (k) {
            case 0: v = m[i].requests_total; break;
            case 1: v = m[i].prompt_tokens_total; break;
            default: v = m[i].generation_tokens_total; break;
            }

            p = ngx_slprintf(p, end,
                             "%s{model=\"%V\",adapter=\"%V\"} %uL\n",
                             s->name, &base->name, &lora[i].name, v);
        }
    }

    return p;
}
