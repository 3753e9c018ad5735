/*
 * What bounds a request on an engine (engine.h: nalar_limits), and the
 * context check of intake on it.  nalar_limits_check reads only the
 * struct, so that a caller that holds a snapshot of an engine's limits
 * (the protocol layer, parsing on its own thread) refuses a prompt in
 * the engine's own words without the engine.
 *
 * nalar_engine_limits and nalar_engine_check_prompt run on any thread
 * once the engine is ready: the model's shape is fixed then, and the KV
 * pool's size is set once, before kv_ready.
 */
#include <stdio.h>

#include "engine.h"
#include "engine_internal.h"
#include "kv.h"


void
nalar_engine_limits(nalar_engine *e, nalar_limits *lim)
{
    lim->n_ctx = e->model->cfg.n_ctx;
    lim->n_vocab = nalar_tok_n_vocab(e->model->tok);
    lim->kv_blocks = e->kv_ready ? e->kv.n_blocks : 0;
}


int
nalar_limits_check(const nalar_limits *lim, int32_t n_prompt, int more,
                   int32_t max_tokens, char *msg, size_t cap)
{
    int32_t     n_ctx = lim->n_ctx;
    int32_t     n_gen = max_tokens > 0 ? max_tokens : 1;
    const char *al = more ? "at least " : "";

    if (more || n_prompt >= n_ctx
        || (max_tokens > 0 && (int64_t) n_prompt + max_tokens > n_ctx))
    {
        snprintf(msg, cap, "This model's maximum context length is %d "
                 "tokens. However, you requested %s%lld tokens (%s%d in the "
                 "prompt, %d in the completion). Please reduce the prompt "
                 "or the completion length.", n_ctx, al,
                 (long long) n_prompt + n_gen, al, n_prompt, n_gen);
        return -1;
    }
    /* a prompt the whole KV pool cannot hold is the client's mistake, not
     * a busy server */
    if (lim->kv_blocks > 0
        && (n_prompt + NALAR_KV_BLOCK) / NALAR_KV_BLOCK > lim->kv_blocks)
    {
        snprintf(msg, cap, "The prompt has %d tokens but the KV cache holds "
                 "only %d", n_prompt, lim->kv_blocks * NALAR_KV_BLOCK);
        return -1;
    }
    return 0;
}


int
nalar_engine_check_prompt(nalar_engine *e, int32_t n_prompt, int more,
                          int32_t max_tokens, char *msg, size_t cap)
{
    nalar_limits  lim;

    nalar_engine_limits(e, &lim);
    return nalar_limits_check(&lim, n_prompt, more, max_tokens, msg, cap);
}
