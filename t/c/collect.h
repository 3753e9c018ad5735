/*
 * What a program that runs requests with nalar_engine_run_sync collects
 * from each: the engine's notify callback, collect(), takes everything new
 * and appends it here.  For the C tests, t/gpu/cuda_check.c and the CLI's
 * engine benchmarks; not part of the engine.  Header-only: each program
 * has its own copy of collect().
 */
#ifndef NALAR_COLLECT_H
#define NALAR_COLLECT_H

#include <string.h>

#include "engine.h"

typedef struct {
    int32_t      ids[1024];     /* (n) token ids, in order */
    int          n;
    char         text[8192];    /* (len) the text, NUL-terminated */
    size_t       len;
    nalar_finish finish;        /* NONE until the last take */
    int32_t      cached;        /* prompt tokens served from the cache */
    nalar_output last;          /* the usage and refusal of the last
                                   take (no pointers) */
} collected;


static void
collect(nalar_request *r, void *ctx)
{
    collected   *c = ctx;
    nalar_output o;

    nalar_request_take(r, &o);
    for (int i = 0; i < o.n_ids && c->n < 1024; i++) {
        c->ids[c->n++] = o.ids[i];
    }
    if (c->len + o.text_len < sizeof(c->text)) {
        memcpy(c->text + c->len, o.text, o.text_len);
        c->len += o.text_len;
        c->text[c->len] = '\0';
    }
    if (o.finish != NALAR_FINISH_NONE) {
        c->finish = o.finish;
    }
    c->cached = o.usage.n_cached;
    c->last.usage = o.usage;
    c->last.accepted = o.accepted;
    if (o.finish != NALAR_FINISH_NONE) {
        c->last.error = o.error;
    }
    nalar_output_free(&o);
}

#endif
