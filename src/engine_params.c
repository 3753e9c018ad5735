/*
 * A request's large parameters, copied once (engine.h, nalar_params):
 * the stop strings and stop ids, the prediction (ids or text pieces), the
 * operator's shared prefix and the JSON Schema text.  The n choices of one
 * API request hold references to one copy and borrow from it; the copy is
 * immutable from creation to its last unref, so any thread may read it
 * and no lock guards it.  What a choice changes (its tokenized prediction,
 * its stop matcher's buffer) is its own.
 *
 * Threads: any (the reference count is an atomic).
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h"


#ifdef NALAR_TEST_HOOKS
static uint64_t  params_copies;       /* atomic: engine_test.h */
#define count_copy()  __atomic_add_fetch(&params_copies, 1, __ATOMIC_RELAXED)
#else
#define count_copy()
#endif


/* n items of `size` bytes at src, copied (NULL when n <= 0); -1 out of
 * memory */
static int
copy_array(void **dst, const void *src, int32_t n, size_t size)
{
    *dst = NULL;
    if (n <= 0 || src == NULL) {
        return 0;
    }
    *dst = malloc((size_t) n * size);
    if (*dst == NULL) {
        return -1;
    }
    memcpy(*dst, src, (size_t) n * size);
    return 0;
}


nalar_params *
nalar_params_create(const nalar_request_params *p, nalar_err *err)
{
    nalar_params *pc = calloc(1, sizeof(*pc));
    size_t        total = 0, off = 0;

    if (pc == NULL) {
        goto oom;
    }
    pc->refs = 1;

    /* the stop strings, back to back in one buffer */
    pc->n_stop = p->n_stop > 0 ? p->n_stop : 0;
    for (int32_t i = 0; i < pc->n_stop; i++) {
        total += strlen(p->stop[i]) + 1;
    }
    pc->stops = calloc((size_t) pc->n_stop + 1, sizeof(*pc->stops));
    pc->stop_text = malloc(total + 1);
    if (pc->stops == NULL || pc->stop_text == NULL) {
        goto oom;
    }
    for (int32_t i = 0; i < pc->n_stop; i++) {
        size_t l = strlen(p->stop[i]) + 1;

        memcpy(pc->stop_text + off, p->stop[i], l);
        pc->stops[i] = pc->stop_text + off;
        off += l;
    }

    pc->n_stop_ids = p->n_stop_ids > 0 ? p->n_stop_ids : 0;
    if (copy_array((void **) &pc->stop_ids, p->stop_ids, pc->n_stop_ids,
                   sizeof(int32_t)) != 0)
    {
        goto oom;
    }

    if (p->prediction_text != NULL) {
        pc->n_pred_pieces = p->n_prediction_text > 0 ? p->n_prediction_text
                                                     : 0;
        pc->pred_pieces = nalar_pieces_copy(p->prediction_text,
                                            pc->n_pred_pieces,
                                            &pc->pred_text);
        if (pc->pred_pieces == NULL) {
            goto oom;
        }
    } else if (p->n_prediction > 0) {
        pc->n_pred = p->n_prediction;
        if (copy_array((void **) &pc->pred, p->prediction, pc->n_pred,
                       sizeof(int32_t)) != 0)
        {
            goto oom;
        }
    }

    if (p->shared_prefix != NULL && p->n_shared_ids > 0) {
        pc->n_shared_ids = p->n_shared_ids;
        if (copy_array((void **) &pc->shared_ids, p->shared_prefix,
                       pc->n_shared_ids, sizeof(int32_t)) != 0)
        {
            goto oom;
        }
    }

    if (p->grammar == NALAR_GRAMMAR_JSON_SCHEMA) {
        pc->schema = strdup(p->json_schema != NULL ? p->json_schema : "{}");
        if (pc->schema == NULL) {
            goto oom;
        }
    }

    count_copy();
    return pc;

oom:
    nalar_params_unref(pc);
    nalar_fail(err, "out of memory");
    return NULL;
}


void
nalar_params_ref(nalar_params *pc)
{
    __atomic_add_fetch(&pc->refs, 1, __ATOMIC_RELAXED);
}


void
nalar_params_unref(nalar_params *pc)
{
    if (pc == NULL || __atomic_sub_fetch(&pc->refs, 1, __ATOMIC_ACQ_REL) != 0)
    {
        return;
    }
    free(pc->stops);
    free(pc->stop_text);
    free(pc->stop_ids);
    free(pc->pred_pieces);
    free(pc->pred_text);
    free(pc->pred);
    free(pc->shared_ids);
    free(pc->schema);
    free(pc);
}


#ifdef NALAR_TEST_HOOKS

uint64_t
nalar_test_params_copies(void)
{
    return __atomic_load_n(&params_copies, __ATOMIC_RELAXED);
}


void
nalar_test_request_params(nalar_request *r, nalar_test_params_ptrs *out)
{
    const nalar_params *pc = r->params;

    out->stop0 = pc->n_stop > 0 ? pc->stops[0] : NULL;
    out->schema = pc->schema;
    out->prediction = pc->pred_text;
}

#endif /* NALAR_TEST_HOOKS */
