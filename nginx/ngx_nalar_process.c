
/*
 * A worker's life: init_process starts each model's engine (its threads
 * never in the master), the eventfd the engines and the parse threads
 * wake the loop with, and the parse threads; a timer watches the models
 * load; exit_process stops and joins every thread before freeing what
 * they may still touch, and closes the eventfd.  What it makes is the
 * worker's state (ngx_nalar_worker.c).
 *
 * Event loop (init and exit) only: the engines are started, watched and
 * joined here, never locked.
 */

#include "ngx_nalar_module.h"


static ngx_http_nalar_runtime_t *ngx_http_nalar_runtime_create(
    ngx_cycle_t *cycle, ngx_http_nalar_main_conf_t *nmcf);
static ngx_int_t ngx_http_nalar_eventfd_open(ngx_cycle_t *cycle);
static void ngx_http_nalar_engine_start(ngx_cycle_t *cycle,
    ngx_http_nalar_main_conf_t *nmcf, ngx_uint_t i, sigset_t *set);
static void ngx_http_nalar_parsers_start(ngx_cycle_t *cycle, sigset_t *set);
static void ngx_http_nalar_load_watch(ngx_event_t *ev);


/*
 * Engines start here, in each worker (never in the master).  Their threads
 * inherit a mask with every signal blocked, as nginx's own thread pools do,
 * so that signals reach the event loop only.  The steps: the runtime (the
 * worker's models), the eventfd, each model's engine, the parse threads,
 * and the timer that watches the models load.
 */

ngx_int_t
ngx_http_nalar_init_process(ngx_cycle_t *cycle)
{
    sigset_t                     set;
    ngx_uint_t                   i;
    ngx_http_nalar_runtime_t    *rt;
    ngx_http_nalar_main_conf_t  *nmcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    nmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_nalar_module);

    if (nmcf == NULL || nmcf->models.nelts == 0) {
        return NGX_OK;
    }

    rt = ngx_http_nalar_runtime_create(cycle, nmcf);
    if (rt == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_nalar_eventfd_open(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    sigfillset(&set);
    sigdelset(&set, SIGILL);
    sigdelset(&set, SIGFPE);
    sigdelset(&set, SIGSEGV);
    sigdelset(&set, SIGBUS);

    for (i = 0; i < nmcf->models.nelts; i++) {
        ngx_http_nalar_engine_start(cycle, nmcf, i, &set);
    }

    ngx_http_nalar_parsers_start(cycle, &set);

    /* event logging reads ((ngx_connection_t *) data)->fd */
    rt->load_conn.fd = (ngx_socket_t) -1;
    rt->load_ev.data = &rt->load_conn;
    rt->load_ev.handler = ngx_http_nalar_load_watch;
    rt->load_ev.log = cycle->log;
    rt->load_ev.cancelable = 1;
    ngx_add_timer(&rt->load_ev, 10);

    return NGX_OK;
}


/* The worker's runtime (its models) and the state's queues; NULL: no
 * memory. */

static ngx_http_nalar_runtime_t *
ngx_http_nalar_runtime_create(ngx_cycle_t *cycle,
    ngx_http_nalar_main_conf_t *nmcf)
{
    ngx_pool_t                *pool;
    ngx_http_nalar_worker_t   *w;
    ngx_http_nalar_runtime_t  *rt;

    w = ngx_http_nalar_worker();

    pool = ngx_create_pool(NGX_DEFAULT_POOL_SIZE, cycle->log);
    if (pool == NULL) {
        return NULL;
    }

    rt = ngx_pcalloc(pool, sizeof(ngx_http_nalar_runtime_t));
    if (rt == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    rt->pool = pool;
    rt->conf = nmcf;
    rt->n_models = nmcf->models.nelts;

    rt->models = ngx_pcalloc(pool, rt->n_models
                                   * sizeof(ngx_http_nalar_model_rt_t));
    if (rt->models == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    w->rt = rt;

    ngx_queue_init(&w->done);
    ngx_queue_init(&w->free_slots);
    ngx_queue_init(&w->jobs);
    ngx_queue_init(&w->results);

#ifdef NALAR_TEST_HOOKS
    w->hold_path = nmcf->test_hold.len ? (char *) nmcf->test_hold.data
                                       : NULL;
#endif

    if (ngx_array_init(&w->all_slots, cycle->pool, 64,
                       sizeof(ngx_http_nalar_slot_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return rt;
}


/*
 * The eventfd the engines' notify callbacks and the parse threads write,
 * read on the loop by the done handler.
 */

static ngx_int_t
ngx_http_nalar_eventfd_open(ngx_cycle_t *cycle)
{
    ngx_event_t              *rev;
    ngx_connection_t         *c;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    w->efd = eventfd(0, EFD_NONBLOCK|EFD_CLOEXEC);

    if (w->efd == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "nalar: eventfd() failed");
        return NGX_ERROR;
    }

    c = ngx_get_connection(w->efd, cycle->log);
    if (c == NULL) {
        (void) close(w->efd);
        w->efd = -1;
        return NGX_ERROR;
    }

    w->efd_conn = c;

    c->pool = cycle->pool;
    rev = c->read;
    rev->log = cycle->log;
    c->write->log = cycle->log;

    /* like nginx's channel: not a client, never reported as left open */
    rev->channel = 1;
    c->write->channel = 1;
    rev->handler = ngx_http_nalar_done_handler;

    if (ngx_add_event(rev, NGX_READ_EVENT, 0) == NGX_ERROR) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Model i's engine, created and started with `set` blocked; one that does
 * not start is logged and left NULL (its requests get an error, the
 * worker serves the others).
 */

static void
ngx_http_nalar_engine_start(ngx_cycle_t *cycle,
    ngx_http_nalar_main_conf_t *nmcf, ngx_uint_t i, sigset_t *set)
{
    int                         err_no;
    sigset_t                    old;
    nalar_err                   err;
    nalar_engine_opts           opts;
    ngx_http_nalar_model_t     *model;
    ngx_http_nalar_model_rt_t  *mrt;

    model = &((ngx_http_nalar_model_t *) nmcf->models.elts)[i];
    mrt = &ngx_http_nalar_worker()->rt->models[i];

    mrt->name = model->name;

    ngx_memzero(&opts, sizeof(nalar_engine_opts));

    opts.model_path = (char *) model->path.data;
    opts.model_name = (char *) model->name.data;
    opts.backend = (char *) nmcf->backend.data;
    opts.device = nmcf->device != NGX_CONF_UNSET ? (int) nmcf->device : -1;
    opts.worker = (int) ngx_worker;
    opts.gpu_memory = nmcf->gpu_memory;
    opts.n_threads = (int) nmcf->threads;
    opts.kv_bytes = (int64_t) nmcf->kv_cache;
    opts.kv_type = (int) nmcf->kv_type;
    opts.act_i16 = (int) nmcf->cpu_act_i16;
    opts.max_batch_tokens = (int32_t) nmcf->max_batch_tokens;

    if (nmcf->max_batch_tokens == 0) {
        /* auto: at most the default 512 tokens, sized to the target
         * (off: those 512, fixed) */
        opts.itl_target = (double) nmcf->itl_target / 1000;
    }

    opts.max_queue = (int32_t) nmcf->max_queue;
    opts.max_running = (int32_t) nmcf->max_running;
    opts.prefix_cache = (int) nmcf->prefix_cache;
    opts.load_async = 1;

    /* auto: the draft when the model has one, else n-gram lookup;
     * requests carry their location's choice, this is the default */
    opts.spec_mode = (int) nmcf->spec_mode;
    opts.spec_max_k = (int) nmcf->spec_max_k;

    if (model->draft.len) {
        opts.draft_path = (char *) model->draft.data;
    }

    /* its LoRA adapters, which a request names by their index + 1 */

    if (ngx_http_nalar_lora_opts(ngx_http_nalar_worker()->rt->pool, nmcf, i,
                                 &opts)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "nalar_model \"%V\": no memory for its adapters",
                      &model->name);
        return;
    }

    mrt->engine = nalar_engine_create(&opts, &err);

    if (mrt->engine == NULL) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "nalar_model \"%V\": %s", &model->name, err.msg);
        return;
    }

#ifdef NALAR_TEST_HOOKS
    if (nmcf->test_fault > 0) {
        nalar_engine_test_fault(mrt->engine, NALAR_FAULT_FORWARD,
                                (int) nmcf->test_fault);
    }
#endif

    err_no = pthread_sigmask(SIG_BLOCK, set, &old);
    if (err_no) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, err_no,
                      "nalar: pthread_sigmask() failed");
    }

    if (nalar_engine_start(mrt->engine, &err) != 0) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "nalar_model \"%V\": %s", &model->name, err.msg);
        nalar_engine_destroy(mrt->engine);
        mrt->engine = NULL;
    }

    if (err_no == 0) {
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
}


/* The parse threads, for large bodies, started with `set` blocked. */

static void
ngx_http_nalar_parsers_start(ngx_cycle_t *cycle, sigset_t *set)
{
    int                       err_no, rc;
    sigset_t                  old;
    ngx_uint_t                i;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    err_no = pthread_sigmask(SIG_BLOCK, set, &old);
    if (err_no) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, err_no,
                      "nalar: pthread_sigmask() failed");
    }

    w->parser_stop = 0;

    for (i = 0; i < NGX_HTTP_NALAR_PARSE_LANES; i++) {
        rc = pthread_create(&w->parser_tid[i], NULL,
                            ngx_http_nalar_parse_thread,
                            (void *) (uintptr_t)
                                (i ? NGX_HTTP_NALAR_PARSE_SMALL : 0));
        if (rc != 0) {
            /* without the first, bodies are parsed on the event loop */
            ngx_log_error(NGX_LOG_ALERT, cycle->log, rc,
                          "nalar: pthread_create() failed");
            break;
        }

        w->parsers++;
    }

    if (err_no == 0) {
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
}


/*
 * Models load on engine threads; this timer, on the event loop, polls
 * their state until each is ready or failed and says which in error_log
 * (a failure names its reason: no GPU, not enough memory, ...).  A ready
 * model's shared prefixes are tokenized here, once in the worker.
 */

static void
ngx_http_nalar_load_watch(ngx_event_t *ev)
{
    int                         state;
    ngx_uint_t                  i, pending;
    nalar_err                   err;
    ngx_http_nalar_runtime_t   *rt;
    ngx_http_nalar_model_rt_t  *model;
    ngx_http_nalar_worker_t    *w;

    w = ngx_http_nalar_worker();

    rt = w->rt;

    if (rt == NULL) {
        return;
    }

    model = rt->models;
    pending = 0;

    for (i = 0; i < rt->n_models; i++) {
        if (model[i].engine == NULL || model[i].load_logged) {
            continue;
        }

        err.msg[0] = '\0';
        state = nalar_engine_state(model[i].engine, &err);

        if (state == 0) {
            pending = 1;
            continue;
        }

        model[i].load_logged = 1;

        if (state == 1) {
            ngx_log_error(NGX_LOG_NOTICE, ev->log, 0,
                          "nalar_model \"%V\": ready", &model[i].name);

            if (model[i].prefix == NULL) {
                (void) ngx_http_nalar_tokenize_shared(&model[i], ev->log);
            }

        } else {
            ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                          "nalar_model \"%V\" failed to load: %s",
                          &model[i].name, err.msg);
        }
    }

    if (pending && !ngx_exiting && !ngx_quit && !ngx_terminate) {
        ngx_add_timer(ev, 50);
    }
}


/* Engines are joined before the slots they may notify are freed. */

void
ngx_http_nalar_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                 i;
    ngx_queue_t               *q;
    ngx_http_nalar_slot_t    **slots;
    ngx_http_nalar_runtime_t  *rt;
    ngx_http_nalar_worker_t   *w;

    w = ngx_http_nalar_worker();

    rt = w->rt;

    if (rt == NULL) {
        return;
    }

    if (rt->load_ev.timer_set) {
        ngx_del_timer(&rt->load_ev);
    }

    /* the parse thread finishes what it parses; what it did not free is
     * freed here (the requests are gone with the process) */

    if (w->parsers) {
        pthread_mutex_lock(&w->mutex);
        __atomic_store_n(&w->parser_stop, 1, __ATOMIC_RELAXED);
        pthread_cond_broadcast(&w->jobs_cond);
        pthread_mutex_unlock(&w->mutex);

        for (i = 0; i < w->parsers; i++) {
            (void) pthread_join(w->parser_tid[i], NULL);
        }

        w->parsers = 0;
    }

    while (!ngx_queue_empty(&w->jobs)) {
        q = ngx_queue_head(&w->jobs);
        ngx_queue_remove(q);
        ngx_http_nalar_parse_free(ngx_queue_data(q, ngx_http_nalar_parse_t,
                                                 queue));
    }

    while (!ngx_queue_empty(&w->results)) {
        q = ngx_queue_head(&w->results);
        ngx_queue_remove(q);
        ngx_http_nalar_parse_free(ngx_queue_data(q, ngx_http_nalar_parse_t,
                                                 queue));
    }

    for (i = 0; i < rt->n_models; i++) {
        if (rt->models[i].engine) {
            nalar_engine_destroy(rt->models[i].engine);
            rt->models[i].engine = NULL;
        }
    }

    if (w->efd_conn) {
        ngx_close_connection(w->efd_conn);
        w->efd_conn = NULL;
        w->efd = -1;
    }

    slots = w->all_slots.elts;

    for (i = 0; i < w->all_slots.nelts; i++) {
        if (slots[i]->req) {
            nalar_request_unref(slots[i]->req);
        }

        ngx_free(slots[i]);
    }

    w->all_slots.nelts = 0;
    w->rt = NULL;

    ngx_destroy_pool(rt->pool);
}
