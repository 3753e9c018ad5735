/*
 * The serving engine: continuous batching over one model.  See engine.h for
 * the request lifecycle and engine_internal.h for how the engine's files
 * divide it.
 *
 * This file owns the engine object: creating it, loading the model, the
 * backend (and the draft's) and the KV pools, the engine thread's loop
 * (which runs engine_step, engine_step.c), nalar_engine_run_sync, the
 * metrics snapshot and destroying the engine.
 *
 * Threads: nalar_engine_create, _start, _run_sync and _destroy run on the
 * owner's thread; the load and the loop on the engine thread (or in
 * run_sync, on its caller's); nalar_engine_state, _model, _metrics and
 * _pass_cost on any thread (atomics, or under e->mu).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "engine.h"
#include "engine_internal.h"
#include "engine_test.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "prefix_cache.h"
#include "tokenizer.h"


const double nalar_hist_bounds[NALAR_HIST_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, INFINITY
};


#ifdef NALAR_TEST_HOOKS

void
nalar_engine_test_fault(nalar_engine *e, nalar_fault_site site, int n)
{
    __atomic_store_n(&e->fault[site], n, __ATOMIC_RELAXED);
}


void
nalar_engine_test_idle(nalar_engine *e, void (*fn)(void *arg), void *arg)
{
    e->idle_fn = fn;
    e->idle_arg = arg;
}


void
nalar_engine_test_keep_kv(nalar_engine *e, int keep)
{
    e->keep_kv = keep;
}


void
nalar_engine_test_step_cost(nalar_engine *e, double per_step,
                            double per_token, int reseed)
{
    static const int32_t sizes[] = { 1, 16, 64 };

    e->test_cost_set = 1;
    e->test_cost_a = per_step;
    e->test_cost_b = per_token;
    if (reseed) {
        /* as budget_seed would have measured them */
        nalar_budget_init(&e->budget);
        for (int k = 0; k < 3; k++) {
            nalar_budget_record(&e->budget, sizes[k],
                                per_step + per_token * sizes[k]);
        }
    }
}


void
nalar_engine_test_step_fn(nalar_engine *e,
                          void (*fn)(void *arg, const nalar_test_step *st),
                          void *arg)
{
    e->step_fn = fn;
    e->step_arg = arg;
}


int
nalar_engine_test_prefix_root(nalar_engine *e, const char *scope,
                              uint8_t *out)
{
    if (e->cache == NULL) {
        return -1;
    }
    return nalar_prefix_root(e->cache, scope, out);
}

#endif /* NALAR_TEST_HOOKS */


static char *
dup_or_null(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}


nalar_engine *
nalar_engine_create(const nalar_engine_opts *o, nalar_err *err)
{
    nalar_engine *e;

    if (o->model_path == NULL) {
        nalar_fail(err, "engine: no model path");
        return NULL;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        nalar_fail(err, "engine: out of memory");
        return NULL;
    }
    e->opts = *o;
    for (int p = 0; p < NALAR_PROP_COUNT; p++) {
        nalar_accept_init(&e->prop_acc[p], p == NALAR_PROP_DRAFT ? 0.7 : 0.5);
    }
    e->model_path = strdup(o->model_path);
    e->model_name = dup_or_null(o->model_name);
    e->backend_name = strdup(o->backend != NULL ? o->backend : "cpu");
    if (e->opts.max_batch_tokens <= 0) {
        e->opts.max_batch_tokens = 512;
    }
    if (e->opts.max_queue <= 0) {
        e->opts.max_queue = 1024;
    }
    if (e->opts.max_running <= 0) {
        e->opts.max_running = 64;
    }
    if (e->opts.max_running > e->opts.max_batch_tokens) {
        e->opts.max_running = e->opts.max_batch_tokens;
    }
    e->opts.model_path = e->model_path;
    e->opts.model_name = e->model_name;
    e->opts.backend = e->backend_name;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->running = calloc((size_t) e->opts.max_running, sizeof(*e->running));
    if (e->model_path == NULL || e->backend_name == NULL
        || (o->model_name != NULL && e->model_name == NULL)
        || e->running == NULL)
    {
        nalar_fail(err, "engine: out of memory");
        nalar_engine_destroy(e);
        return NULL;
    }
    if (engine_lora_copy(e, o, err) != 0) {
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/* The comparison nalar_same_vocab makes, of two loaded tokenizers. */
static int
vocab_compare(const nalar_tokenizer *t, const nalar_tokenizer *d,
              const char *target, const char *draft, nalar_err *err)
{
    int32_t n = nalar_tok_n_vocab(t);

    if (nalar_tok_n_vocab(d) != n) {
        return nalar_fail(err, "%s has a vocabulary of %d tokens but the "
                          "target %s has %d: a draft must share the "
                          "target's vocabulary", draft, nalar_tok_n_vocab(d),
                          target, n);
    }
    if (nalar_tok_kind_of(t) != nalar_tok_kind_of(d)
        || nalar_tok_bos(t) != nalar_tok_bos(d)
        || nalar_tok_eos(t) != nalar_tok_eos(d))
    {
        return nalar_fail(err, "%s: the vocabulary's tokenizer kind or "
                          "special tokens (BOS, EOS) differ from the target "
                          "%s", draft, target);
    }
    for (int32_t i = 0; i < n; i++) {
        const char *a = nalar_tok_piece(t, i);
        const char *b = nalar_tok_piece(d, i);

        if (a == NULL || b == NULL || strcmp(a, b) != 0
            || nalar_tok_is_eog(t, i) != nalar_tok_is_eog(d, i))
        {
            return nalar_fail(err, "%s: token %d of the vocabulary is "
                              "\"%s\" but the target's is \"%s\": a draft "
                              "must share the target's vocabulary", draft, i,
                              b != NULL ? b : "", a != NULL ? a : "");
        }
    }
    return 0;
}


int
nalar_same_vocab(const char *target, const char *draft, nalar_err *err)
{
    nalar_tokenizer *t = NULL, *d = NULL;
    gguf_file       *f;
    int              rc = -1;

    f = gguf_open(target, err);
    if (f == NULL) {
        goto done;
    }
    t = nalar_tokenizer_create(f, err);
    gguf_close(f);
    if (t == NULL) {
        goto done;
    }
    f = gguf_open(draft, err);
    if (f == NULL) {
        goto done;
    }
    d = nalar_tokenizer_create(f, err);
    gguf_close(f);
    if (d == NULL) {
        goto done;
    }
    rc = vocab_compare(t, d, target, draft, err);
done:
    nalar_tokenizer_destroy(d);
    nalar_tokenizer_destroy(t);
    return rc;
}


/* The draft model and its backend (on the target's workers or device). */
static int
draft_open(nalar_engine *e, nalar_err *err)
{
    e->draft = nalar_model_load(e->opts.draft_path, err);
    if (e->draft == NULL) {
        return -1;
    }
    if (vocab_compare(e->model->tok, e->draft->tok, e->model->path,
                      e->draft->path, err) != 0)
    {
        return -1;
    }
    e->draft_be = nalar_backend_create_sharing(e->draft, e->be, err);
    return e->draft_be == NULL ? -1 : 0;
}


/*
 * How many KV blocks the pool holds.  CPU: kv_bytes of target KV (the
 * draft, when there is one, gets as many blocks of its own size).  GPU:
 * the target's and the draft's blocks together fit in gpu_memory (a
 * fraction of the device memory still free once the weights are uploaded,
 * or a size), capped by kv_bytes when that is set.
 */
static int32_t
kv_pool_blocks(nalar_engine *e, nalar_err *err)
{
    int64_t block_bytes = nalar_kv_block_bytes(e->model, e->be->kv_type);
    int64_t kv_bytes;

    if (e->be->free_memory != NULL) {
        int64_t free_bytes = e->be->free_memory(e->be);
        double  g = e->opts.gpu_memory > 0 ? e->opts.gpu_memory : 0.9;

        if (e->draft != NULL) {
            block_bytes += nalar_kv_block_bytes(e->draft, e->be->kv_type);
        }
        if (g > 1) {
            kv_bytes = (int64_t) g;
        } else if (free_bytes < 0) {
            nalar_fail(err, "engine: cannot query free memory of %s device "
                       "%d", e->be->name, e->be->device);
            return -1;
        } else {
            kv_bytes = (int64_t) (g * (double) free_bytes);
        }
        if (e->opts.kv_bytes > 0 && e->opts.kv_bytes < kv_bytes) {
            kv_bytes = e->opts.kv_bytes;
        }
        if (free_bytes >= 0 && kv_bytes > free_bytes) {
            nalar_fail(err, "engine: a KV cache of %lld MiB does not fit in "
                       "the %lld MiB free on %s device %d",
                       (long long) (kv_bytes >> 20),
                       (long long) (free_bytes >> 20), e->be->name,
                       e->be->device);
            return -1;
        }
    } else {
        kv_bytes = e->opts.kv_bytes;
        if (kv_bytes <= 0) {
            kv_bytes = 16 * block_bytes
                       * ((e->model->cfg.n_ctx + NALAR_KV_BLOCK - 1)
                          / NALAR_KV_BLOCK);
            if (kv_bytes > (int64_t) 1 << 30) {
                kv_bytes = (int64_t) 1 << 30;
            }
        }
    }
    if (kv_bytes / block_bytes < 1) {
        nalar_fail(err, "engine: KV cache of %lld bytes holds no block (one "
                   "block takes %lld bytes)", (long long) kv_bytes,
                   (long long) block_bytes);
        return -1;
    }
    return kv_bytes / block_bytes > INT32_MAX / 2
           ? INT32_MAX / 2 : (int32_t) (kv_bytes / block_bytes);
}


/* Load the model, the backend (and the draft's) and the KV pools. */
static int
engine_load(nalar_engine *e, nalar_err *err)
{
    nalar_backend_opts bo = { e->backend_name, e->opts.n_threads,
                              e->opts.device, e->opts.worker,
                              e->opts.gpu_gemv_max,
                              (ggml_type) e->opts.kv_type,
                              e->opts.act_i16 };
    int32_t            n_blocks;

    e->model = nalar_model_load(e->model_path, err);
    if (e->model == NULL) {
        return -1;
    }
    if (e->model_name == NULL) {
        e->model_name = strdup(e->model->name);
        if (e->model_name == NULL) {
            return nalar_fail(err, "engine: out of memory");
        }
    }
    e->be = nalar_backend_create(e->model, &bo, err);
    if (e->be == NULL || engine_lora_load(e, err) != 0) {
        return -1;
    }
    if (e->opts.draft_path != NULL && draft_open(e, err) != 0) {
        return -1;
    }
    n_blocks = kv_pool_blocks(e, err);
    if (n_blocks < 0) {
        return -1;
    }
    if (nalar_kv_pool_init(&e->kv, n_blocks, e->model->cfg.n_layers,
                           e->model->cfg.n_kv_heads * e->model->cfg.head_dim,
                           err) != 0)
    {
        return -1;
    }
    if (e->be->kv_alloc(e->be, &e->kv, err) != 0) {
        nalar_kv_pool_free(&e->kv);
        return -1;
    }
    e->kv_ready = 1;
    if (e->draft != NULL) {
        if (nalar_kv_pool_init(&e->dkv, n_blocks, e->draft->cfg.n_layers,
                               e->draft->cfg.n_kv_heads
                               * e->draft->cfg.head_dim, err) != 0)
        {
            return -1;
        }
        if (e->draft_be->kv_alloc(e->draft_be, &e->dkv, err) != 0) {
            nalar_kv_pool_free(&e->dkv);
            return -1;
        }
        e->dkv_ready = 1;
    }
    if (e->opts.prefix_cache) {
        /* the backend as it computes: its activations' rounding too */
        e->cache = nalar_prefix_cache_create(&e->kv, e->model->identity,
                                             e->opts.act_i16
                                             == NALAR_ACT_PAIRS
                                             ? "cpu act=pairs"
                                             : e->opts.act_i16
                                             == NALAR_ACT_Q8
                                             ? "cpu act=q8"
                                             : e->opts.act_i16
                                             ? "cpu act=i16" : e->be->name,
                                             err);
        if (e->cache == NULL) {
            return -1;
        }
    }
    e->grammars = nalar_grammar_cache_create(e->model->tok, 0);
    if (e->grammars == NULL) {
        return nalar_fail(err, "engine: out of memory");
    }
    /* what verifying (and drafting) k proposals costs, before the cost
     * model first chooses k; the same passes settle which way the CPU
     * backend runs each size (see cost_seed) */
    cost_seed(e->be, &e->kv, e->model->cfg.n_vocab, &e->target_cost);
    if (e->draft != NULL) {
        cost_seed(e->draft_be, &e->dkv, e->draft->cfg.n_vocab,
                  &e->draft_cost);
    }
    /* what steps cost by their size, before the first prompt is chunked
     * to the ITL target */
    if (e->opts.itl_target > 0) {
        budget_seed(e);
    }
    pthread_mutex_lock(&e->mu);
    e->m.kv_blocks_total = n_blocks;
    e->m.kv_blocks_free = n_blocks;
    pthread_mutex_unlock(&e->mu);
    return 0;
}


int
nalar_engine_state(nalar_engine *e, nalar_err *err)
{
    int s = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);

    if (s < 0 && err != NULL) {
        *err = e->load_err;
    }
    return s;
}


nalar_model *
nalar_engine_model(nalar_engine *e)
{
    return nalar_engine_state(e, NULL) == 1 ? e->model : NULL;
}


void
nalar_engine_metrics(nalar_engine *e, nalar_metrics *m)
{
    pthread_mutex_lock(&e->mu);
    *m = e->m;
    m->requests_waiting = e->n_waiting;
    if (e->kv_ready) {
        m->kv_blocks_free = __atomic_load_n(&e->kv.n_free_published,
                                            __ATOMIC_RELAXED)
                            + e->kv_evictable;
    }
    pthread_mutex_unlock(&e->mu);
}


static void *
engine_main(void *arg)
{
    nalar_engine *e = arg;

    if (e->model == NULL) {
        if (engine_load(e, &e->load_err) != 0) {
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
        }
    }
    for ( ;; ) {
        nalar_err err;

        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_waiting == 0 && e->n_running == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        pthread_mutex_unlock(&e->mu);
        if (nalar_engine_state(e, NULL) != 1) {
            fail_all_waiting(e, NALAR_FINISH_ERROR, e->load_err.msg);
            continue;
        }
        /* an idle step (0) leaves nothing running, and a failed one (-1)
         * has finished what ran; whatever waits now (a request submitted
         * since step_admit looked, one preempted in the step) the next
         * step admits, since with nothing running step_admit takes the
         * head whatever it needs: nothing waiting is ever unadmittable */
        if (engine_step(e, &err) == 0) {
            test_idle(e);
        }
    }
    return NULL;
}


int
nalar_engine_start(nalar_engine *e, nalar_err *err)
{
    if (!e->opts.load_async && e->model == NULL) {
        if (engine_load(e, &e->load_err) != 0) {
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
            *err = e->load_err;
            return -1;
        }
        __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        return nalar_fail(err, "engine: cannot start the engine thread");
    }
    e->started = 1;
    return 0;
}


int
nalar_engine_run_sync(nalar_engine *e, nalar_request **reqs, int n,
                      nalar_err *err)
{
    int failed = 0;

    if (e->started) {
        return nalar_fail(err, "engine: run_sync on a started engine");
    }
    if (e->model == NULL) {
        if (engine_load(e, err) != 0) {
            e->load_err = *err;
            __atomic_store_n(&e->state, -1, __ATOMIC_RELEASE);
            return -1;
        }
        __atomic_store_n(&e->state, 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < n; i++) {
        if (nalar_engine_submit(e, reqs[i], err) != 0) {
            /* what was submitted is cancelled and run out, so nothing is
             * left in the engine when the caller frees its requests */
            for (int j = 0; j < i; j++) {
                nalar_request_cancel(reqs[j]);
            }
            failed = 1;
            break;
        }
    }
    /* until nothing runs or waits: a failed step finished what was
     * running, and what waits still runs (as on the engine thread) */
    for ( ;; ) {
        nalar_err step_err;
        int       rc = engine_step(e, &step_err), waiting;

        if (rc < 0 && !failed) {
            *err = step_err;
            failed = 1;
        }
        pthread_mutex_lock(&e->mu);
        waiting = e->n_waiting;
        pthread_mutex_unlock(&e->mu);
        if (rc == 0 && waiting == 0 && e->n_running == 0) {
            return failed ? -1 : 0;
        }
    }
}


void
nalar_engine_destroy(nalar_engine *e)
{
    if (e == NULL) {
        return;
    }
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    while (e->n_running > 0) {
        nalar_request *r = e->running[--e->n_running];

        finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
    }
    fail_all_waiting(e, NALAR_FINISH_CANCELLED, NULL);
    nalar_prefix_cache_destroy(e->cache);
    nalar_grammar_cache_destroy(e->grammars);
    if (e->dkv_ready) {
        e->draft_be->kv_free(e->draft_be, &e->dkv);
        nalar_kv_pool_free(&e->dkv);
    }
    if (e->draft_be != NULL) {
        e->draft_be->destroy(e->draft_be);
    }
    nalar_model_destroy(e->draft);
    free(e->dbatch.tokens);
    free(e->dbatch.pos);
    free(e->dbatch.seq);
    free(e->dbatch.want_logits);
    free(e->dbatch_req);
    free(e->dlogits);
    if (e->kv_ready) {
        e->be->kv_free(e->be, &e->kv);
        nalar_kv_pool_free(&e->kv);
    }
    if (e->be != NULL) {
        e->be->destroy(e->be);
    }
    engine_lora_destroy(e);
    nalar_model_destroy(e->model);
    free(e->batch.tokens);
    free(e->batch.pos);
    free(e->batch.seq);
    free(e->batch.want_logits);
    free(e->batch_req);
    free(e->logits);
    free(e->ids);
    free(e->running);
    free(e->model_path);
    free(e->model_name);
    free(e->backend_name);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}


#ifdef NALAR_TEST_HOOKS
/* test hooks (engine_test.h): what tests read of a loaded engine */

nalar_kv_pool *
nalar_engine_kv(nalar_engine *e)
{
    return e->kv_ready ? &e->kv : NULL;
}


double
nalar_engine_pass_cost(nalar_engine *e, int draft, int32_t n_tokens)
{
    if (draft && e->draft == NULL) {
        return -1;
    }
    return nalar_cost_estimate(draft ? &e->draft_cost : &e->target_cost,
                               n_tokens);
}
#endif
