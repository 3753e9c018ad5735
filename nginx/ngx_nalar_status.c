
/*
 * Status endpoints: /models and /models/{id}, /health, and the Prometheus
 * metrics of nalar_metrics.
 *
 * Event loop only.  Reads the worker's models and the engines' counters
 * through the engine's calls: nalar_engine_state is an atomic load;
 * nalar_engine_metrics copies the counters under the engine's queue mutex,
 * which the engine thread holds only for queue moves and counter updates
 * (never across tokenizing or a forward pass), so it never waits on an
 * engine thread's work.
 */

#include "ngx_nalar_module.h"


static u_char *ngx_http_nalar_metrics_scalars(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);
static u_char *ngx_http_nalar_metrics_spec(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);
static u_char *ngx_http_nalar_metrics_prefix(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);
static u_char *ngx_http_nalar_metrics_grammar(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);
static u_char *ngx_http_nalar_metrics_hists(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);
static u_char *ngx_http_nalar_metrics_steps(u_char *p, u_char *end,
    nalar_metrics *m, ngx_http_nalar_model_rt_t *model, ngx_uint_t n);

/*
 * /models: the list; /models/{id}: one model object, or 404.  Both show
 * what the location may serve this request: the base models (but where
 * nalar_adapter chose an adapter, which alone serves) and the adapters it
 * may serve, each with its base as "parent", as vLLM lists its LoRA
 * modules (without "root": vLLM puts the adapter's path there, which is
 * the server's business).
 */

ngx_int_t
ngx_http_nalar_models(ngx_http_request_t *r)
{
    json_t                      *list, *data, *m;
    ngx_str_t                    id;
    ngx_int_t                    rc;
    ngx_uint_t                   i, n, one;
    nalar_api_in                 in;
    ngx_http_nalar_model_t      *model;
    ngx_http_nalar_main_conf_t  *nmcf;

    nmcf = ngx_http_get_module_main_conf(r, ngx_nalar_module);
    model = nmcf->models.elts;

    rc = ngx_http_nalar_lora_in(r, &in);
    if (rc != NGX_OK) {
        return rc;
    }

    one = (ngx_http_nalar_endpoint(&r->uri) == NGX_HTTP_NALAR_EP_MODEL);
    ngx_str_null(&id);

    if (one) {
        (void) ngx_http_nalar_model_id(&r->uri, &id);
    }

    data = json_array();
    list = json_pack("{s:s,s:o}", "object", "list", "data", data);
    if (list == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    n = in.lora_forced ? 0 : nmcf->models.nelts;

    for (i = 0; i < n + in.n_loras; i++) {
        if (i < n) {
            m = json_pack("{s:s%,s:s,s:I,s:s}",
                          "id", model[i].name.data, model[i].name.len,
                          "object", "model",
                          "created", (json_int_t) nmcf->created,
                          "owned_by", "nalar");

        } else {
            m = json_pack("{s:s%,s:s,s:I,s:s,s:s%}",
                          "id", in.loras[i - n].name,
                          in.loras[i - n].name_len,
                          "object", "model",
                          "created", (json_int_t) nmcf->created,
                          "owned_by", "nalar",
                          "parent", model[in.loras[i - n].model].name.data,
                          model[in.loras[i - n].model].name.len);
        }

        if (m == NULL) {
            json_decref(list);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (one) {
            if (ngx_strlen(json_string_value(json_object_get(m, "id")))
                == id.len
                && ngx_strncmp(json_string_value(json_object_get(m, "id")),
                               id.data, id.len)
                   == 0)
            {
                json_decref(list);
                rc = ngx_http_nalar_send_json(r, NGX_HTTP_OK, m);
                json_decref(m);
                return rc;
            }

            json_decref(m);
            continue;
        }

        if (json_array_append_new(data, m) != 0) {
            json_decref(list);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (one) {
        json_decref(list);

        /* as the parse answers a `model` it cannot serve */

        return ngx_http_nalar_error(r, NGX_HTTP_NOT_FOUND,
                                    "invalid_request_error", "model",
                                    "model_not_found",
                                    "The model `%V` does not exist or you "
                                    "do not have access to it.", &id);
    }

    rc = ngx_http_nalar_send_json(r, NGX_HTTP_OK, list);
    json_decref(list);

    return rc;
}


/* 200 when every model can serve; 503 with Retry-After while loading. */

ngx_int_t
ngx_http_nalar_health(ngx_http_request_t *r)
{
    int                          state;
    json_t                      *root, *models, *m;
    ngx_int_t                    rc;
    ngx_uint_t                   i, status, loading;
    nalar_err                    err;
    const char                  *s;
    ngx_http_nalar_model_rt_t   *model;
    ngx_http_nalar_main_conf_t  *nmcf;
    ngx_http_nalar_worker_t     *w;

    w = ngx_http_nalar_worker();

    nmcf = ngx_http_get_module_main_conf(r, ngx_nalar_module);

    models = json_array();
    if (models == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    status = NGX_HTTP_OK;
    loading = 0;
    model = w->rt ? w->rt->models : NULL;

    for (i = 0; i < nmcf->models.nelts; i++) {
        err.msg[0] = '\0';

        if (model[i].engine == NULL) {
            state = -1;
            ngx_cpystrn((u_char *) err.msg, (u_char *) "engine not started",
                        sizeof(err.msg));

        } else {
            state = nalar_engine_state(model[i].engine, &err);
        }

        if (state == 1) {
            s = "ready";

        } else if (state == 0) {
            s = "loading";
            loading = 1;
            status = NGX_HTTP_SERVICE_UNAVAILABLE;

        } else {
            s = "failed";
            status = NGX_HTTP_SERVICE_UNAVAILABLE;
        }

        m = json_pack("{s:s%,s:s}", "id", model[i].name.data,
                      model[i].name.len, "status", s);
        if (m == NULL) {
            json_decref(models);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (state < 0) {
            json_object_set_new(m, "error", json_string(err.msg));
        }

        json_array_append_new(models, m);
    }

    root = json_pack("{s:s,s:o}", "status",
                     status == NGX_HTTP_OK ? "ok"
                                           : (loading ? "loading" : "failed"),
                     "models", models);
    if (root == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (loading && ngx_http_nalar_add_header(r, "Retry-After", "1") != NGX_OK)
    {
        json_decref(root);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_nalar_send_json(r, status, root);
    json_decref(root);

    return rc;
}


/*
 * Prometheus text exposition, one series per model: the tables name the
 * series; the handler takes each engine's counters, then each step below
 * writes its families.
 */

typedef struct {
    char  *name;
    char  *type;
    char  *help;
} ngx_http_nalar_series_t;


static ngx_http_nalar_series_t  ngx_http_nalar_scalars[] = {
    { "nalar_requests_running", "gauge",
      "Requests in prefill or decode." },
    { "nalar_requests_waiting", "gauge",
      "Requests waiting to be scheduled." },
    { "nalar_prompt_tokens_total", "counter",
      "Prompt tokens processed (prefill)." },
    { "nalar_generation_tokens_total", "counter",
      "Tokens generated." },
    /* the pool's size: a gauge, constant for the engine's life */
    { "nalar_kv_blocks_capacity", "gauge",
      "KV cache blocks in the pool (constant while the engine runs)." },
    { "nalar_kv_blocks_free", "gauge",
      "KV cache blocks no running sequence holds." },
    { "nalar_preemptions_total", "counter",
      "Sequences preempted because the KV cache ran out." },
    /* speculative decoding (vLLM's names, nalar_ prefixed) */
    { "nalar_spec_decode_num_drafts_total", "counter",
      "Speculative verification steps (one per sequence and step)." },
    { "nalar_spec_decode_num_draft_tokens_total", "counter",
      "Speculative proposals verified." },
    { "nalar_spec_decode_num_accepted_tokens_total", "counter",
      "Speculative proposals accepted." },
    { "nalar_spec_decode_provisional_kv_blocks", "gauge",
      "KV blocks holding unverified proposals right now." }
};


static ngx_http_nalar_series_t  ngx_http_nalar_spec_seconds[] = {
    { "nalar_spec_decode_draft_seconds_total", "counter",
      "Time the draft model spent proposing." },
    { "nalar_spec_decode_verify_seconds_total", "counter",
      "Time of the target passes that verified proposals." }
};


static ngx_http_nalar_series_t  ngx_http_nalar_hists[] = {
    { "nalar_time_to_first_token_seconds", "histogram",
      "Time from submission to the first generated token." },
    { "nalar_inter_token_latency_seconds", "histogram",
      "Time between consecutive tokens of a sequence." },
    { "nalar_queue_time_seconds", "histogram",
      "Time from submission to the first scheduling." },
    { "nalar_step_duration_seconds", "histogram",
      "Duration of engine steps (one batch: decodes and prefill "
      "chunks)." }
};


static ngx_http_nalar_series_t  ngx_http_nalar_prefix[] = {
    { "nalar_prefix_cache_queries_total", "counter",
      "Prompt tokens looked up in the prefix cache." },
    { "nalar_prefix_cache_hits_total", "counter",
      "Prompt tokens served from the prefix cache." },
    { "nalar_prefix_cache_evictions_total", "counter",
      "Prefix cache blocks evicted." },
    { "nalar_prefix_cache_blocks", "gauge",
      "KV blocks published in the prefix cache." }
};


static ngx_http_nalar_series_t  ngx_http_nalar_grammar[] = {
    { "nalar_grammar_requests_total", "counter",
      "Requests with a response_format grammar." },
    { "nalar_grammar_compiles_total", "counter",
      "Grammars compiled (the rest came from the cache)." },
    { "nalar_grammar_compile_seconds_total", "counter",
      "Time spent compiling grammars." },
    { "nalar_grammar_masks_total", "counter",
      "Logits rows masked by a grammar (one per sampled token)." },
    { "nalar_grammar_mask_seconds_total", "counter",
      "Time spent masking rows, building uncached masks included." },
    { "nalar_grammar_forced_tokens_total", "counter",
      "Tokens the grammar forced, proposed for verification." },
    { "nalar_grammar_forced_accepted_tokens_total", "counter",
      "Forced tokens confirmed." }
};


#define ngx_http_nalar_n(a)  (sizeof(a) / sizeof(a[0]))


ngx_int_t
ngx_http_nalar_metrics_handler(ngx_http_request_t *r)
{
    u_char                      *p, *end;
    size_t                       size, per;
    ngx_buf_t                   *b;
    ngx_uint_t                   i, n;
    nalar_metrics               *m;
    ngx_http_nalar_model_rt_t   *model;
    ngx_http_nalar_main_conf_t  *nmcf;
    ngx_http_nalar_worker_t     *w;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    w = ngx_http_nalar_worker();
    nmcf = ngx_http_get_module_main_conf(r, ngx_nalar_module);
    model = w->rt ? w->rt->models : NULL;
    n = nmcf->models.nelts;

    m = ngx_pcalloc(r->pool, (n + 1) * sizeof(nalar_metrics));
    if (m == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the buffer: each series line at most 128 bytes and the name */

    per = ngx_http_nalar_n(ngx_http_nalar_scalars)
          + ngx_http_nalar_n(ngx_http_nalar_hists) * (NALAR_HIST_BUCKETS + 2)
          + NALAR_SPEC_MAX_K + 4
          + ngx_http_nalar_n(ngx_http_nalar_prefix)
          + ngx_http_nalar_n(ngx_http_nalar_grammar);

    size = 4096 + ngx_http_nalar_n(ngx_http_nalar_grammar) * 192
           + ngx_http_nalar_lora_metrics_size(nmcf);

    for (i = 0; i < n; i++) {
        if (model[i].engine) {
            nalar_engine_metrics(model[i].engine, &m[i]);
        }

        size += per * (128 + model[i].name.len);
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;
    end = b->end;

    p = ngx_http_nalar_metrics_scalars(p, end, m, model, n);
    p = ngx_http_nalar_metrics_spec(p, end, m, model, n);
    p = ngx_http_nalar_metrics_prefix(p, end, m, model, n);
    p = ngx_http_nalar_metrics_grammar(p, end, m, model, n);
    p = ngx_http_nalar_metrics_hists(p, end, m, model, n);
    p = ngx_http_nalar_metrics_steps(p, end, m, model, n);

    p = ngx_http_nalar_lora_metrics(r->pool, p, end, nmcf, model);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = p;

    return ngx_http_nalar_send_metrics(r, b);
}


/* the engines' gauges and counters */

static u_char *
ngx_http_nalar_metrics_scalars(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    uint64_t                  v;
    ngx_uint_t                i, k;
    ngx_http_nalar_series_t  *s;

    for (k = 0; k < ngx_http_nalar_n(ngx_http_nalar_scalars); k++) {
        s = &ngx_http_nalar_scalars[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s %s\n",
                         s->name, s->help, s->name, s->type);

        for (i = 0; i < n; i++) {
            switch (k) {
            case 0: v = m[i].requests_running; break;
            case 1: v = m[i].requests_waiting; break;
            case 2: v = m[i].prompt_tokens_total; break;
            case 3: v = m[i].generation_tokens_total; break;
            case 4: v = m[i].kv_blocks_total; break;
            case 5: v = m[i].kv_blocks_free; break;
            case 6: v = m[i].preemptions_total; break;
            case 7: v = m[i].spec_drafts_total; break;
            case 8: v = m[i].spec_draft_tokens_total; break;
            case 9: v = m[i].spec_accepted_tokens_total; break;
            default: v = m[i].spec_provisional_blocks; break;
            }

            p = ngx_slprintf(p, end, "%s{model=\"%V\"} %uL\n",
                             s->name, &model[i].name, v);
        }
    }

    return p;
}


/* speculative decoding: acceptance by position, and the time it took */

static u_char *
ngx_http_nalar_metrics_spec(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    ngx_uint_t                i, k, h;
    ngx_http_nalar_series_t  *s;

    /* acceptance by position: position j counts steps whose proposal j
     * (0-based) was accepted, so it never exceeds position j-1 */

    p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s counter\n",
                     "nalar_spec_decode_num_accepted_tokens_per_pos_total",
                     "Speculative proposals accepted, by position in the "
                     "proposal.",
                     "nalar_spec_decode_num_accepted_tokens_per_pos_total");

    for (i = 0; i < n; i++) {
        for (h = 0; h < NALAR_SPEC_MAX_K; h++) {
            p = ngx_slprintf(p, end,
                             "nalar_spec_decode_num_accepted_tokens_per_pos"
                             "_total{model=\"%V\",position=\"%ui\"} %uL\n",
                             &model[i].name, h,
                             m[i].spec_accepted_per_pos[h]);
        }
    }

    for (k = 0; k < 2; k++) {
        s = &ngx_http_nalar_spec_seconds[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s %s\n",
                         s->name, s->help, s->name, s->type);

        for (i = 0; i < n; i++) {
            p = ngx_slprintf(p, end, "%s{model=\"%V\"} %.6f\n",
                             s->name, &model[i].name,
                             k == 0 ? m[i].spec_draft_seconds_total
                                    : m[i].spec_verify_seconds_total);
        }
    }

    return p;
}


/* the prefix cache */

static u_char *
ngx_http_nalar_metrics_prefix(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    uint64_t                  v;
    ngx_uint_t                i, k;
    ngx_http_nalar_series_t  *s;

    for (k = 0; k < ngx_http_nalar_n(ngx_http_nalar_prefix); k++) {
        s = &ngx_http_nalar_prefix[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s %s\n",
                         s->name, s->help, s->name, s->type);

        for (i = 0; i < n; i++) {
            switch (k) {
            case 0: v = m[i].prefix_queries_total; break;
            case 1: v = m[i].prefix_hits_total; break;
            case 2: v = m[i].prefix_evictions_total; break;
            default: v = (uint64_t) m[i].prefix_blocks; break;
            }

            p = ngx_slprintf(p, end, "%s{model=\"%V\"} %uL\n",
                             s->name, &model[i].name, v);
        }
    }

    return p;
}


/* structured output */

static u_char *
ngx_http_nalar_metrics_grammar(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    uint64_t                  v;
    ngx_uint_t                i, k;
    ngx_http_nalar_series_t  *s;

    for (k = 0; k < ngx_http_nalar_n(ngx_http_nalar_grammar); k++) {
        s = &ngx_http_nalar_grammar[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s %s\n",
                         s->name, s->help, s->name, s->type);

        for (i = 0; i < n; i++) {
            if (k == 2 || k == 4) {
                p = ngx_slprintf(p, end, "%s{model=\"%V\"} %.6f\n",
                                 s->name, &model[i].name,
                                 k == 2 ? m[i].grammar_compile_seconds_total
                                        : m[i].grammar_mask_seconds_total);
                continue;
            }

            switch (k) {
            case 0: v = m[i].grammar_requests_total; break;
            case 1: v = m[i].grammar_compiles_total; break;
            case 3: v = m[i].grammar_masks_total; break;
            case 5: v = m[i].grammar_forced_tokens_total; break;
            default: v = m[i].grammar_forced_accepted_total; break;
            }

            p = ngx_slprintf(p, end, "%s{model=\"%V\"} %uL\n",
                             s->name, &model[i].name, v);
        }
    }

    return p;
}


/* the latency histograms */

static u_char *
ngx_http_nalar_metrics_hists(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    char                      le[32];
    double                    sum;
    uint64_t                  count, *buckets;
    ngx_uint_t                i, k, h;
    ngx_http_nalar_series_t  *s;

    for (k = 0; k < ngx_http_nalar_n(ngx_http_nalar_hists); k++) {
        s = &ngx_http_nalar_hists[k];

        p = ngx_slprintf(p, end, "# HELP %s %s\n# TYPE %s %s\n",
                         s->name, s->help, s->name, s->type);

        for (i = 0; i < n; i++) {
            switch (k) {
            case 0:
                buckets = m[i].ttft_buckets;
                sum = m[i].ttft_sum;
                count = m[i].ttft_count;
                break;
            case 1:
                buckets = m[i].itl_buckets;
                sum = m[i].itl_sum;
                count = m[i].itl_count;
                break;
            case 2:
                buckets = m[i].queue_buckets;
                sum = m[i].queue_sum;
                count = m[i].queue_count;
                break;
            default:
                buckets = m[i].step_buckets;
                sum = m[i].step_sum;
                count = m[i].step_count;
                break;
            }

            for (h = 0; h < NALAR_HIST_BUCKETS; h++) {
                if (h == NALAR_HIST_BUCKETS - 1) {
                    p = ngx_slprintf(p, end,
                                     "%s_bucket{model=\"%V\",le=\"+Inf\"} "
                                     "%uL\n", s->name, &model[i].name,
                                     count);
                    break;
                }

                /* Prometheus writes bounds in their shortest form */
                (void) snprintf(le, sizeof(le), "%g", nalar_hist_bounds[h]);

                p = ngx_slprintf(p, end,
                                 "%s_bucket{model=\"%V\",le=\"%s\"} %uL\n",
                                 s->name, &model[i].name, le,
                                 buckets[h]);
            }

            p = ngx_slprintf(p, end, "%s_sum{model=\"%V\"} %.6f\n"
                             "%s_count{model=\"%V\"} %uL\n",
                             s->name, &model[i].name, sum,
                             s->name, &model[i].name, count);
        }
    }

    return p;
}


/*
 * The step budget's series (nalar_itl_target): steps over the target (their
 * share is this over nalar_step_duration_seconds_count) and the prompt
 * tokens the last step could carry.
 */

static u_char *
ngx_http_nalar_metrics_steps(u_char *p, u_char *end, nalar_metrics *m,
    ngx_http_nalar_model_rt_t *model, ngx_uint_t n)
{
    ngx_uint_t  i;

    p = ngx_slprintf(p, end, "# HELP nalar_steps_over_target_total Engine "
                     "steps with decodes that took longer than "
                     "nalar_itl_target.\n"
                     "# TYPE nalar_steps_over_target_total counter\n");

    for (i = 0; i < n; i++) {
        p = ngx_slprintf(p, end,
                         "nalar_steps_over_target_total{model=\"%V\"} %uL\n",
                         &model[i].name, m[i].steps_over_target_total);
    }

    p = ngx_slprintf(p, end, "# HELP nalar_step_prefill_budget_tokens "
                     "Prompt tokens the last step could carry beside its "
                     "decodes.\n"
                     "# TYPE nalar_step_prefill_budget_tokens gauge\n");

    for (i = 0; i < n; i++) {
        p = ngx_slprintf(p, end,
                         "nalar_step_prefill_budget_tokens{model=\"%V\"} "
                         "%D\n", &model[i].name, m[i].step_prefill_budget);
    }

    return p;
}


/*
 * Sends the buffer [b->pos, b->last) as a 200 of Prometheus text (the
 * exposition format 0.0.4): the node's metrics and the edge's.
 */
ngx_int_t
ngx_http_nalar_send_metrics(ngx_http_request_t *r, ngx_buf_t *b)
{
    ngx_int_t    rc;
    ngx_chain_t  out;

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type,
                "text/plain; version=0.0.4; charset=utf-8");
    r->headers_out.content_type_len = sizeof("text/plain") - 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}
