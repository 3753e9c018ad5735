/*
 * KV reservation and the prefix-cache glue: a request's block digests
 * (chained, scoped), sharing published blocks at admission (cache_match),
 * publishing confirmed blocks (cache_publish), and reserving KV, evicting
 * unreferenced cached blocks when the free list is short.  The cache
 * itself is prefix_cache.c.
 *
 * Threads: the engine thread only (r->mu taken to set what the consumer
 * reads of the cached prompt tokens).
 */
#include <pthread.h>
#include <string.h>

#include "engine_internal.h"
#include "kv.h"
#include "prefix_cache.h"


/* Digest of block i of r's tokens, computing the chain up to it; NULL
 * when out of memory (the digest context), and nothing is ever looked up
 * or published under a digest that was not computed. */
static const uint8_t *
block_digest(nalar_engine *e, nalar_request *r, int32_t i)
{
    while (r->n_digests <= i) {
        int32_t        k = r->n_digests;
        const int32_t *toks = r->tokens + (int64_t) k * NALAR_KV_BLOCK;
        int            shared_k = (k + 1) * NALAR_KV_BLOCK
                                  <= r->p.n_shared_prefix;
        uint8_t        prev[NALAR_DIGEST], root[NALAR_DIGEST];

        if (test_fault(e, NALAR_FAULT_DIGEST)) {
            return NULL;
        }
        if (k == 0) {
            /* blocks inside the operator's shared prefix live in the
             * global scope; everything else in the request's scope */
            if (nalar_prefix_root_adapter(e->cache, shared_k ? "" : r->scope,
                                          engine_lora_digest(e, r), prev)
                != 0)
            {
                return NULL;
            }
        } else {
            int shared_prev = k * NALAR_KV_BLOCK <= r->p.n_shared_prefix;

            memcpy(prev, r->digests[k - 1], NALAR_DIGEST);
            if (shared_prev && !shared_k && r->scope[0] != '\0'
                && (nalar_prefix_root_adapter(e->cache, r->scope,
                                              engine_lora_digest(e, r), root)
                    != 0
                    || nalar_prefix_rescope(prev, root, prev) != 0))
            {
                return NULL;
            }
        }
        if (nalar_prefix_chain(prev, toks, r->digests[k]) != 0) {
            return NULL;
        }
        r->n_digests++;
    }
    return r->digests[i];
}


/* At admission: share the longest published chain of the prompt's full
 * blocks, leaving at least one token to compute (its logits are needed).
 * -1 when out of memory: r then holds no shared block it did not hold. */
int
cache_match(nalar_engine *e, nalar_request *r)
{
    int32_t max_blocks, matched;

    if (e->cache == NULL || r->p.no_cache || r->kv.n_blocks != 0) {
        return 0;
    }
    max_blocks = (r->n_tokens - 1) / NALAR_KV_BLOCK;
    if (max_blocks <= 0) {
        return 0;
    }
    if (block_digest(e, r, max_blocks - 1) == NULL) {
        return -1;
    }
    matched = nalar_prefix_match(e->cache, &r->kv,
                                 (const uint8_t (*)[NALAR_DIGEST]) r->digests,
                                 r->tokens, max_blocks);
    r->n_computed = matched * NALAR_KV_BLOCK;
    r->kv.n_pos = r->n_computed;
    if (!r->admitted_once) {
        pthread_mutex_lock(&r->mu);
        r->n_cached = matched * NALAR_KV_BLOCK;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->n_published < matched) {
        r->n_published = matched;
    }
    return 0;
}


/* Publish r's full blocks whose positions are all confirmed and computed
 * (n_confirmed: positions [0, n_confirmed) hold confirmed tokens' KV).
 * -1 when out of memory (a digest): the blocks before stay published. */
int
cache_publish(nalar_engine *e, nalar_request *r, int32_t n_confirmed)
{
    if (e->cache == NULL || r->p.no_cache) {
        return 0;
    }
    while ((r->n_published + 1) * NALAR_KV_BLOCK <= n_confirmed) {
        int32_t        i = r->n_published;
        const uint8_t *d = block_digest(e, r, i);

        if (d == NULL) {
            return -1;
        }
        nalar_prefix_publish(e->cache, d,
                             r->tokens + (int64_t) i * NALAR_KV_BLOCK,
                             r->kv.blocks[i]);
        r->n_published++;
    }
    return 0;
}


/*
 * A model whose every layer slides never reads a position again once it
 * is before the window of the next query (at n_computed): the whole
 * blocks there go back to the pool.  With the prefix cache, only blocks
 * already published go (the cache keeps its reference, so they stay
 * until evicted): a block is never published after it left the
 * sequence, and a prefix hit brings every block from position 0.
 */
void
kv_slide(nalar_engine *e, nalar_request *r)
{
    const nalar_config *c = &e->model->cfg;
    int32_t             pos;

    if (c->swa_window <= 0 || c->swa_layers != 1 || test_keep_kv(e)) {
        return;
    }
    pos = r->n_computed - c->swa_window + 1;
    if (e->cache != NULL && !r->p.no_cache
        && pos > r->n_published * NALAR_KV_BLOCK)
    {
        pos = r->n_published * NALAR_KV_BLOCK;
    }
    nalar_seq_kv_drop_before(&e->kv, &r->kv, pos);
}


/* Blocks that could be handed out now: free plus evictable cached ones. */
int32_t
kv_available(nalar_engine *e)
{
    nalar_prefix_stats st;

    if (e->cache == NULL) {
        return e->kv.n_free;
    }
    nalar_prefix_stats_get(e->cache, &st);
    return e->kv.n_free + st.evictable;
}


/* Reserve KV for r up to n_pos, evicting unreferenced cached blocks when
 * the free list is short. */
int
kv_reserve(nalar_engine *e, nalar_request *r, int32_t n_pos)
{
    int32_t need;

    if (nalar_seq_kv_reserve(&e->kv, &r->kv, n_pos) == 0) {
        return 0;
    }
    if (e->cache == NULL) {
        return -1;
    }
    need = nalar_seq_kv_blocks_needed(&e->kv, &r->kv, n_pos) - e->kv.n_free;
    nalar_prefix_evict(e->cache, need);
    return nalar_seq_kv_reserve(&e->kv, &r->kv, n_pos);
}
