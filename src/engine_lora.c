/*
 * The engine's LoRA adapters (lora.h): the operator's list copied at
 * create, loaded and attached to the backend after the model, each
 * request's adapter checked at submit, carried per token in every batch
 * the engine builds for the target, keyed into the prefix cache's roots,
 * and counted.
 *
 * Ids: 0 is the base model alone; adapter i (0-based in opts.loras) is
 * id i + 1 everywhere (request params, batch.adapter, lora_attach,
 * nalar_engine_lora_metrics).  The draft model never gets an adapter: its
 * batches carry none, so its proposals come from the base, and the target
 * verifies them under the request's adapter (what it would have sampled).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "lora.h"


/* The operator's list, owned by the engine (the caller's may go). */
int
engine_lora_copy(nalar_engine *e, const nalar_engine_opts *o, nalar_err *err)
{
    e->n_loras = o->n_loras > 0 ? o->n_loras : 0;
    e->lora_m = calloc((size_t) e->n_loras + 1, sizeof(*e->lora_m));
    if (e->lora_m == NULL) {
        return nalar_fail(err, "engine: out of memory");
    }
    if (e->n_loras == 0) {
        return 0;
    }
    if (o->loras == NULL) {
        return nalar_fail(err, "engine: %d adapters but no list",
                          e->n_loras);
    }
    e->lora_opts = calloc((size_t) e->n_loras, sizeof(*e->lora_opts));
    if (e->lora_opts == NULL) {
        return nalar_fail(err, "engine: out of memory");
    }
    for (int32_t i = 0; i < e->n_loras; i++) {
        const nalar_engine_lora *l = &o->loras[i];

        if (l->path == NULL) {
            return nalar_fail(err, "engine: adapter %d has no file", i + 1);
        }
        /* 0 means 1; else held as a float (lora.h), so 1e-6 .. 1e6 */
        if (l->scale != 0 && !(l->scale >= 1e-6 && l->scale <= 1e6)) {
            return nalar_fail(err, "engine: adapter %s: scale %g (0, or "
                              "1e-6 to 1e6)", l->path, l->scale);
        }
        e->lora_opts[i].path = strdup(l->path);
        e->lora_opts[i].name = strdup(l->name != NULL ? l->name : l->path);
        e->lora_opts[i].scale = l->scale > 0 ? l->scale : 1;
        if (e->lora_opts[i].path == NULL || e->lora_opts[i].name == NULL) {
            return nalar_fail(err, "engine: out of memory");
        }
    }
    e->opts.loras = e->lora_opts;
    return 0;
}


/* Engine thread, after the model and its backend: load and attach each
 * adapter; a backend without lora_attach (CUDA) serves none. */
int
engine_lora_load(nalar_engine *e, nalar_err *err)
{
    if (e->n_loras == 0) {
        return 0;
    }
    if (e->be->lora_attach == NULL) {
        return nalar_fail(err, "engine: the %s backend does not serve LoRA "
                          "adapters (%d configured, e.g. %s); use the cpu "
                          "backend or no adapters", e->be->name, e->n_loras,
                          e->lora_opts[0].path);
    }
    e->loras = calloc((size_t) e->n_loras, sizeof(*e->loras));
    if (e->loras == NULL) {
        return nalar_fail(err, "engine: out of memory");
    }
    for (int32_t i = 0; i < e->n_loras; i++) {
        const nalar_engine_lora *l = &e->lora_opts[i];

        e->loras[i] = nalar_lora_load(e->model, l->name, l->path,
                                      (float) l->scale, err);
        if (e->loras[i] == NULL
            || e->be->lora_attach(e->be, i + 1, e->loras[i], err) != 0)
        {
            return -1;
        }
    }
    return 0;
}


/* After the backend is gone (it reads the adapters until then). */
void
engine_lora_destroy(nalar_engine *e)
{
    for (int32_t i = 0; e->loras != NULL && i < e->n_loras; i++) {
        nalar_lora_destroy(e->loras[i]);
    }
    for (int32_t i = 0; e->lora_opts != NULL && i < e->n_loras; i++) {
        free((char *) e->lora_opts[i].name);
        free((char *) e->lora_opts[i].path);
    }
    free(e->loras);
    free(e->lora_opts);
    free(e->lora_m);
    free(e->batch_adapter);
}


/* At submit: 0, or -1 when the caller named no adapter of this engine. */
int
engine_lora_check(nalar_engine *e, const nalar_request *r, nalar_err *err)
{
    if (r->p.adapter < 0 || r->p.adapter > e->n_loras) {
        return nalar_fail(err, "adapter %d is not one of the engine's "
                          "(0: the base model, 1..%d)", r->p.adapter,
                          e->n_loras);
    }
    return 0;
}


/* The adapter's digest for r's prefix roots: NULL for the base alone. */
const uint8_t *
engine_lora_digest(const nalar_engine *e, const nalar_request *r)
{
    return r->p.adapter > 0 ? e->loras[r->p.adapter - 1]->digest : NULL;
}


/*
 * Fill the step's batch.adapter from each token's request: NULL when no
 * token has an adapter, so the base path runs unchanged.  -1 when out of
 * memory (the batch is then left without one: the caller fails the step).
 */
int
engine_lora_batch(nalar_engine *e, nalar_batch *b,
                  nalar_request *const *req)
{
    int any = 0;

    b->adapter = NULL;
    for (int32_t k = 0; k < b->n_tokens && !any; k++) {
        any = req[k]->p.adapter != 0;
    }
    if (!any) {
        return 0;
    }
    if (b->n_tokens > e->batch_adapter_cap) {
        int32_t *a = realloc(e->batch_adapter,
                             (size_t) b->n_tokens * sizeof(int32_t));

        if (a == NULL) {
            return -1;
        }
        e->batch_adapter = a;
        e->batch_adapter_cap = b->n_tokens;
    }
    for (int32_t k = 0; k < b->n_tokens; k++) {
        e->batch_adapter[k] = req[k]->p.adapter;
    }
    b->adapter = e->batch_adapter;
    return 0;
}


int
nalar_engine_lora_metrics(nalar_engine *e, int32_t i, nalar_lora_metrics *out)
{
    if (i < 0 || i > e->n_loras) {
        return -1;
    }
    pthread_mutex_lock(&e->mu);
    *out = e->lora_m[i];
    pthread_mutex_unlock(&e->mu);
    return 0;
}
