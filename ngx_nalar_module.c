
/*
 * Nalar: an OpenAI-compatible LLM API inside nginx.
 *
 * The engine (src/engine.h) runs continuous batching on its own threads,
 * started in each worker's init_process.  The event loop never waits on it:
 * the engine's notify callback queues the request's slot on a locked done
 * queue and writes to an eventfd the module owns; the eventfd's read
 * handler takes the output and writes SSE chunks or the final JSON.
 *
 * The only memory shared with engine threads is the slot (malloc'd, never
 * freed before the engines are joined, reused from a free list) and the
 * refcounted nalar_request; per-request state lives in the request pool and
 * is reached from a slot only on the event loop.
 *
 * This file is the module itself: its directives and their configuration
 * (create, merge, the directive handlers but those of ngx_nalar_engine_conf.c,
 * ngx_nalar_lora.c, ngx_nalar_shared.c, ngx_nalar_tenancy.c and the edge's
 * files) and the handler and filter registration.  The rest of the glue lives
 * in nginx/, one file per concern: a worker's life (ngx_nalar_process.c:
 * engines, the eventfd, the parse threads) and its state (ngx_nalar_worker.c),
 * and what a request goes through.  nginx/ngx_nalar_module.h holds what they
 * share and lists them from the bottom up: calls go from this file down, never
 * back.  Configuration only.
 */

#include "ngx_nalar_module.h"
#include "backend.h"


static ngx_int_t ngx_http_nalar_init(ngx_conf_t *cf);
static void *ngx_http_nalar_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_nalar_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_nalar_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_nalar_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_nalar_model(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_nalar_api(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


static ngx_conf_num_bounds_t  ngx_http_nalar_threads_bounds = {
    ngx_conf_check_num_bounds, 0, 1024
};

static ngx_conf_num_bounds_t  ngx_http_nalar_positive_bounds = {
    ngx_conf_check_num_bounds, 1, 0x7fffffff
};

static ngx_conf_num_bounds_t  ngx_http_nalar_device_bounds = {
    ngx_conf_check_num_bounds, 0, 1023
};


static ngx_conf_enum_t  ngx_http_nalar_cache_scopes[] = {
    { ngx_string("tenant"), NGX_HTTP_NALAR_SCOPE_TENANT },
    { ngx_string("global"), NGX_HTTP_NALAR_SCOPE_GLOBAL },
    { ngx_null_string, 0 }
};


static ngx_conf_enum_t  ngx_http_nalar_cpu_activations[] = {
    { ngx_string("f32"), NALAR_ACT_F32 },
    { ngx_string("i16"), NALAR_ACT_I16 },
    { ngx_string("q8"), NALAR_ACT_Q8 },
    { ngx_string("pairs"), NALAR_ACT_PAIRS },
    { ngx_null_string, 0 }
};


static ngx_command_t  ngx_http_nalar_commands[] = {

    { ngx_string("nalar_model"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE23,
      ngx_http_nalar_model,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_lora"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_nalar_lora,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_threads"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, threads),
      &ngx_http_nalar_threads_bounds },

#ifdef NALAR_TEST_HOOKS

    /* for the module's own tests, in the test build (make module-asan)
     * alone: the N-th forward pass of each engine in each worker fails, as
     * an engine error mid-request would */
    { ngx_string("nalar_test_fault_forward"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, test_fault),
      &ngx_http_nalar_positive_bounds },

    /* for the module's own tests: a parse of a large body waits until the
     * file exists (and makes FILE.held to say it waits) */
    { ngx_string("nalar_test_hold_parse"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, test_hold),
      NULL },

#endif

    { ngx_string("nalar_kv_cache"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE12,
      ngx_http_nalar_kv_cache,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_cpu_activations"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, cpu_act_i16),
      &ngx_http_nalar_cpu_activations },

    { ngx_string("nalar_max_batch_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_max_batch_tokens,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_itl_target"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_itl_target,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_max_queue"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, max_queue),
      &ngx_http_nalar_positive_bounds },

    { ngx_string("nalar_max_running"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, max_running),
      &ngx_http_nalar_positive_bounds },

    { ngx_string("nalar_prefix_cache"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, prefix_cache),
      NULL },

    { ngx_string("nalar_backend"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, backend),
      NULL },

    { ngx_string("nalar_device"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_nalar_main_conf_t, device),
      &ngx_http_nalar_device_bounds },

    { ngx_string("nalar_gpu_memory"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_gpu_memory,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_api"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_nalar_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_NALAR_API,
      NULL },

    { ngx_string("nalar_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_nalar_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_NALAR_METRICS,
      NULL },

    { ngx_string("nalar_chat_template"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_chat_template,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_stream_keepalive"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, keepalive),
      NULL },

    { ngx_string("nalar_tenant"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, tenant),
      NULL },

    { ngx_string("nalar_jwt_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_nalar_jwt_key,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_jwt_claim"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, jwt_claim),
      NULL },

    { ngx_string("nalar_jwt_issuer"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, jwt_issuer),
      NULL },

    { ngx_string("nalar_jwt_audience"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, jwt_audience),
      NULL },

    { ngx_string("nalar_jwt_leeway"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, jwt_leeway),
      NULL },

    { ngx_string("nalar_prefix_cache_scope"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, cache_scope),
      &ngx_http_nalar_cache_scopes },

    { ngx_string("nalar_shared_prefix"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_shared_prefix,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_edge_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_nalar_edge_key,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_edge_tenant"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, edge_tenant),
      NULL },

    { ngx_string("nalar_edge_zone"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_edge_zone,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_edge_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_edge_metrics,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_edge_health"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_edge_health,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_route_prefix"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_nalar_route_prefix,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_adapter"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_nalar_loc_conf_t, adapter),
      NULL },

    { ngx_string("nalar_lora_allow"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_nalar_lora_allow,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("nalar_speculative"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE123,
      ngx_http_nalar_speculative,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_nalar_module_ctx = {
    ngx_http_nalar_add_variables,          /* preconfiguration */
    ngx_http_nalar_init,                   /* postconfiguration */

    ngx_http_nalar_create_main_conf,       /* create main configuration */
    ngx_http_nalar_init_main_conf,         /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_nalar_create_loc_conf,        /* create location configuration */
    ngx_http_nalar_merge_loc_conf          /* merge location configuration */
};


ngx_module_t  ngx_nalar_module = {
    NGX_MODULE_V1,
    &ngx_nalar_module_ctx,                 /* module context */
    ngx_http_nalar_commands,               /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_nalar_init_process,           /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_nalar_exit_process,           /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_int_t
ngx_http_nalar_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    /* bearer tokens are checked where auth_basic checks passwords */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_ACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_nalar_access_handler;

    if (ngx_http_nalar_filter_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_nalar_edge_status_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_nalar_route_init(cf);
}


/* configuration */


static void *
ngx_http_nalar_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_nalar_main_conf_t  *nmcf;

    nmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_nalar_main_conf_t));
    if (nmcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     nmcf->backend = { 0, NULL };
     *     nmcf->gpu_memory = 0;
     *     nmcf->kv_type = GGML_F32;
     *     nmcf->spec_draft = 0;
     *     nmcf->created = 0;
     */

    if (ngx_array_init(&nmcf->models, cf->pool, 2,
                       sizeof(ngx_http_nalar_model_t))
        != NGX_OK
        || ngx_array_init(&nmcf->loras, cf->pool, 2,
                          sizeof(ngx_http_nalar_lora_t))
           != NGX_OK
        || ngx_array_init(&nmcf->shared, cf->pool, 1,
                          sizeof(ngx_http_nalar_shared_t *))
           != NGX_OK)
    {
        return NULL;
    }

    nmcf->threads = NGX_CONF_UNSET;
#ifdef NALAR_TEST_HOOKS
    nmcf->test_fault = NGX_CONF_UNSET;
#endif
    nmcf->kv_cache = NGX_CONF_UNSET;
    nmcf->cpu_act_i16 = NGX_CONF_UNSET_UINT;
    nmcf->max_batch_tokens = NGX_CONF_UNSET;
    nmcf->itl_target = NGX_CONF_UNSET_MSEC;
    nmcf->max_queue = NGX_CONF_UNSET;
    nmcf->max_running = NGX_CONF_UNSET;
    nmcf->prefix_cache = NGX_CONF_UNSET;
    nmcf->device = NGX_CONF_UNSET;
    nmcf->spec_mode = NGX_CONF_UNSET_UINT;
    nmcf->spec_max_k = NGX_CONF_UNSET;

    return nmcf;
}


static char *
ngx_http_nalar_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    int64_t                  block;
    ngx_uint_t               i;
    ngx_http_nalar_model_t  *model;

    /* every nalar_lora is checked: their bases need not stay open */

    ngx_http_nalar_lora_close(nmcf);

    /* 0 and unset mean "the engine's default" */

    ngx_conf_init_value(nmcf->threads, 0);
#ifdef NALAR_TEST_HOOKS
    ngx_conf_init_value(nmcf->test_fault, 0);
#endif
    ngx_conf_init_value(nmcf->kv_cache, 0);
    /* 0: auto, each step sized to nalar_itl_target (100ms unless set) */
    ngx_conf_init_value(nmcf->max_batch_tokens, 0);
    ngx_conf_init_value(nmcf->max_queue, 0);
    ngx_conf_init_value(nmcf->max_running, 0);
    ngx_conf_init_value(nmcf->prefix_cache, 1);
    ngx_conf_init_uint_value(nmcf->spec_mode, NALAR_SPEC_AUTO);
    ngx_conf_init_value(nmcf->spec_max_k, 4);

    if (nmcf->backend.data == NULL) {
        ngx_str_set(&nmcf->backend, "cpu");
    }

    if (ngx_strcmp(nmcf->backend.data, "cpu") != 0
        && ngx_strcmp(nmcf->backend.data, "cuda") != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid nalar_backend \"%V\": \"cpu\" or "
                           "\"cuda\" expected", &nmcf->backend);
        return NGX_CONF_ERROR;
    }

    /* the CUDA backend has no adapter products (lora_attach) */

    if (ngx_strcmp(nmcf->backend.data, "cpu") != 0 && nmcf->loras.nelts) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_lora\" needs \"nalar_backend cpu\": "
                           "the %V backend does not serve LoRA adapters",
                           &nmcf->backend);
        return NGX_CONF_ERROR;
    }

#if !(NGX_NALAR_HAVE_CUDA)
    if (ngx_strcmp(nmcf->backend.data, "cuda") == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_backend \"cuda\": this module was built "
                           "without CUDA (build it where nvcc is found, or "
                           "with NALAR_CUDA=1)");
        return NGX_CONF_ERROR;
    }
#endif

    /* the CPU backend keeps every KV type; a GPU backend F32 and BF16
     * (nalar_backend_create says the same to an engine) */
    if (ngx_strcmp(nmcf->backend.data, "cpu") != 0
        && nmcf->kv_type == GGML_F16)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_kv_cache dtype=f16\" needs "
                           "\"nalar_backend cpu\": the %V backend keeps "
                           "its KV cache in f32 or bf16", &nmcf->backend);
        return NGX_CONF_ERROR;
    }

    /* unset: the CPU backend's default mode (NALAR_ACT_DEFAULT,
     * src/backend.h), F32 on another backend */
    ngx_conf_init_uint_value(nmcf->cpu_act_i16,
                             ngx_strcmp(nmcf->backend.data, "cpu") == 0
                             ? NALAR_ACT_DEFAULT : NALAR_ACT_F32);
    if (ngx_strcmp(nmcf->backend.data, "cpu") != 0 && nmcf->cpu_act_i16) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_cpu_activations %s\" is a mode of "
                           "\"nalar_backend cpu\"",
                           nalar_act_name((int) nmcf->cpu_act_i16));
        return NGX_CONF_ERROR;
    }

    if (nmcf->max_batch_tokens > 0 && nmcf->itl_target != NGX_CONF_UNSET_MSEC
        && nmcf->itl_target > 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_itl_target\" needs "
                           "\"nalar_max_batch_tokens auto\": a fixed "
                           "number of tokens is the step budget");
        return NGX_CONF_ERROR;
    }

    ngx_conf_init_msec_value(nmcf->itl_target, 100);

    if (ngx_strcmp(nmcf->backend.data, "cpu") == 0
        && (nmcf->device != NGX_CONF_UNSET || nmcf->gpu_memory > 0))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_device\" and \"nalar_gpu_memory\" need "
                           "\"nalar_backend cuda\"");
        return NGX_CONF_ERROR;
    }

    /* what each engine will be given must hold one block of its model
     * (on a GPU the draft's block comes out of the same budget) */

    model = nmcf->models.elts;

    for (i = 0; i < nmcf->models.nelts; i++) {
        block = model[i].kv_block;

        if (ngx_strcmp(nmcf->backend.data, "cuda") == 0) {
            block += model[i].draft_kv_block;
        }

        if (nmcf->kv_type != GGML_F32) {
            block /= 2;                 /* 16-bit elements */
        }

        if (nmcf->kv_cache > 0 && nmcf->kv_cache < block) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"nalar_kv_cache\" of %O bytes is smaller "
                               "than one KV block of model \"%V\" (%L "
                               "bytes)", nmcf->kv_cache, &model[i].name,
                               block);
            return NGX_CONF_ERROR;
        }

        if (nmcf->spec_draft && model[i].draft.len == 0) {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "\"nalar_speculative draft\": model \"%V\" "
                               "has no \"draft=\" model, its requests are "
                               "not speculated", &model[i].name);
        }
    }

    nmcf->created = ngx_time();

    return NGX_CONF_OK;
}


static void *
ngx_http_nalar_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_nalar_loc_conf_t  *nlcf;

    nlcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_nalar_loc_conf_t));
    if (nlcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     nlcf->handler = 0;
     *     nlcf->jwt_claim = { 0, NULL };
     *     nlcf->jwt_issuer = { 0, NULL };
     *     nlcf->jwt_audience = { 0, NULL };
     *     nlcf->edge_metrics = NULL;
     *     nlcf->edge_health = NULL;
     *     nlcf->lora_list = NULL;
     *     nlcf->n_lora_list = 0;
     */

    nlcf->chat_style = NGX_CONF_UNSET_UINT;
    nlcf->chat_tmpl = NGX_CONF_UNSET_PTR;
    nlcf->keepalive = NGX_CONF_UNSET_MSEC;
    nlcf->tenant = NGX_CONF_UNSET_PTR;
    nlcf->jwt = NGX_CONF_UNSET_PTR;
    nlcf->jwt_leeway = NGX_CONF_UNSET;
    nlcf->cache_scope = NGX_CONF_UNSET_UINT;
    nlcf->edge_key = NGX_CONF_UNSET_PTR;
    nlcf->edge_tenant = NGX_CONF_UNSET_PTR;
    nlcf->shared = NGX_CONF_UNSET_PTR;
    nlcf->spec_mode = NGX_CONF_UNSET_UINT;
    nlcf->spec_max_k = NGX_CONF_UNSET;
    nlcf->spec_fixed = NGX_CONF_UNSET;
    nlcf->route_prefix = NGX_CONF_UNSET_SIZE;
    nlcf->route_edge = NGX_CONF_UNSET;
    nlcf->edge_zone = NGX_CONF_UNSET_PTR;
    nlcf->adapter = NGX_CONF_UNSET_PTR;
    nlcf->lora_allow = NGX_CONF_UNSET_PTR;

    return nlcf;
}


static char *
ngx_http_nalar_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_nalar_loc_conf_t *prev = parent;
    ngx_http_nalar_loc_conf_t *conf = child;

    /* the directive sets both: they come from the same level */
    ngx_conf_merge_ptr_value(conf->chat_tmpl, prev->chat_tmpl, NULL);
    ngx_conf_merge_uint_value(conf->chat_style, prev->chat_style,
                              NALAR_CHAT_AUTO);
    ngx_conf_merge_msec_value(conf->keepalive, prev->keepalive, 15000);
    ngx_conf_merge_ptr_value(conf->tenant, prev->tenant, NULL);
    ngx_conf_merge_ptr_value(conf->jwt, prev->jwt, NULL);
    ngx_conf_merge_str_value(conf->jwt_id, prev->jwt_id, "");
    ngx_conf_merge_str_value(conf->jwt_claim, prev->jwt_claim, "sub");
    ngx_conf_merge_str_value(conf->jwt_issuer, prev->jwt_issuer, "");
    ngx_conf_merge_str_value(conf->jwt_audience, prev->jwt_audience, "");
    ngx_conf_merge_sec_value(conf->jwt_leeway, prev->jwt_leeway, 0);
    ngx_conf_merge_uint_value(conf->cache_scope, prev->cache_scope,
                              NGX_HTTP_NALAR_SCOPE_TENANT);
    ngx_conf_merge_ptr_value(conf->edge_key, prev->edge_key, NULL);
    ngx_conf_merge_ptr_value(conf->edge_tenant, prev->edge_tenant, NULL);
    ngx_conf_merge_ptr_value(conf->shared, prev->shared, NULL);
    ngx_conf_merge_uint_value(conf->spec_mode, prev->spec_mode,
                              NALAR_SPEC_AUTO);
    ngx_conf_merge_value(conf->spec_max_k, prev->spec_max_k, 4);
    ngx_conf_merge_value(conf->spec_fixed, prev->spec_fixed, 0);
    ngx_conf_merge_size_value(conf->route_prefix, prev->route_prefix, 2048);
    ngx_conf_merge_value(conf->route_edge, prev->route_edge, 0);
    ngx_conf_merge_ptr_value(conf->edge_zone, prev->edge_zone, NULL);

    if (ngx_http_nalar_lora_merge(cf, prev, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    /* behind an edge the tenant comes from the edge's signed identity
     * only: never also from a header or a token of the node's own */

    if (conf->edge_tenant && conf->edge_key == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_edge_tenant\" needs \"nalar_edge_key\" "
                           "(the key the edge signs identities with)");
        return NGX_CONF_ERROR;
    }

    if (conf->edge_tenant && (conf->tenant || conf->jwt)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nalar_edge_tenant\" cannot be used with "
                           "\"%s\": the edge establishes the tenant",
                           conf->jwt ? "nalar_jwt_key" : "nalar_tenant");
        return NGX_CONF_ERROR;
    }

    if (conf->keepalive == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_stream_keepalive must be positive");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * nalar_model NAME PATH [draft=PATH];
 * The file is validated now (header, architecture, tensor table,
 * vocabulary) without reading weights, so `nginx -t` catches a bad model.
 */

static char *
ngx_http_nalar_model(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_main_conf_t *nmcf = conf;

    ngx_str_t               *value;
    ngx_uint_t               i;
    nalar_err                err;
    ngx_http_nalar_model_t  *model;

    value = cf->args->elts;
    model = nmcf->models.elts;

    for (i = 0; i < nmcf->models.nelts; i++) {
        if (model[i].name.len == value[1].len
            && ngx_strncmp(model[i].name.data, value[1].data, value[1].len)
               == 0)
        {
            return "is duplicate";
        }
    }

    if (ngx_http_nalar_lora_clash(cf, nmcf, &value[1]) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    model = ngx_array_push(&nmcf->models);
    if (model == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(model, sizeof(ngx_http_nalar_model_t));

    model->name = value[1];
    model->path = value[2];

    if (ngx_conf_full_name(cf->cycle, &model->path, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (cf->args->nelts == 4) {
        if (ngx_strncmp(value[3].data, "draft=", 6) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\"", &value[3]);
            return NGX_CONF_ERROR;
        }

        model->draft.data = value[3].data + 6;
        model->draft.len = value[3].len - 6;

        if (ngx_conf_full_name(cf->cycle, &model->draft, 1) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
    }

    /* ngx_conf_full_name() leaves the names NUL-terminated */

    if (nalar_model_check_kv((char *) model->path.data, &model->kv_block,
                             &err)
        != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "nalar_model \"%V\": %s", &model->name, err.msg);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_nalar_model_template(cf, model) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (model->draft.len) {
        if (nalar_model_check_kv((char *) model->draft.data,
                                 &model->draft_kv_block, &err)
            != 0
            || nalar_same_vocab((char *) model->path.data,
                                (char *) model->draft.data, &err) != 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "nalar_model \"%V\" draft: %s", &model->name,
                               err.msg);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_nalar_api(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    if (nlcf->handler) {
        return "is duplicate";
    }

    nlcf->handler = cmd->offset;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_nalar_content_handler;

    return NGX_CONF_OK;
}
