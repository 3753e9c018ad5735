/*
 * What the engine tests share: greedy requests collected with collect()
 * (collect.h), comparing ids, and the KV pool's invariants with every
 * block back.  Header-only (static inline): each test program has its
 * own copy.
 */
#ifndef NALAR_ENGINE_HELPERS_H
#define NALAR_ENGINE_HELPERS_H

#include <string.h>

#include "engine.h"
#include "kv.h"
#include "collect.h"
#include "tap.h"

/* the parameters of a greedy request for n tokens past EOS */
static inline nalar_request_params
greedy_params(const int32_t *prompt, int n_prompt, int n)
{
    nalar_request_params p;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = n;
    p.ignore_eos = 1;
    return p;
}


/* greedy, n tokens past EOS, collected in *c; with logprobs when asked */
static inline nalar_request *
greedy_req_lp(const int32_t *prompt, int n_prompt, int n, int logprobs,
              collected *c)
{
    nalar_request_params p = greedy_params(prompt, n_prompt, n);
    nalar_err            err;

    p.logprobs = logprobs;
    memset(c, 0, sizeof(*c));
    return nalar_request_create(&p, collect, c, &err);
}


static inline nalar_request *
greedy_req(const int32_t *prompt, int n_prompt, int n, collected *c)
{
    return greedy_req_lp(prompt, n_prompt, n, 0, c);
}


static inline int
same(const int32_t *a, const int32_t *b, int n)
{
    return memcmp(a, b, (size_t) n * sizeof(int32_t)) == 0;
}


static inline int
kv_all_free(nalar_engine *e)
{
    nalar_kv_pool *p = nalar_engine_kv(e);
    nalar_err      err;

    if (nalar_kv_check(p, &err) != 0) {
        diag("%s", err.msg);
        return 0;
    }
    return p->n_free == p->n_blocks;
}

#endif
