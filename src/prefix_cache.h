/*
 * Prefix KV cache: full KV blocks published under a chained digest of
 * everything that determines their contents.
 *
 *   root  = SHA-256("nalar-prefix-v1", scope, model identity, adapter,
 *                   RoPE and dtype, backend + attention kernel version,
 *                   block size)
 *   h_i   = SHA-256(h_{i-1}, token ids of block i)     (h_{-1} = root)
 *
 * so block i can only be found by a request whose scope, model and first
 * (i+1) * NALAR_KV_BLOCK tokens at the same positions are equal.  A hit
 * also compares the stored token ids, so even a digest collision cannot
 * serve wrong state.
 *
 * Invariants:
 *   - every entry holds one reference on its KV block (refcount >= 1);
 *   - only blocks whose positions are all confirmed and computed are
 *     published (the engine's job: it never publishes provisional
 *     speculative positions or a partial tail);
 *   - an entry is evicted only when the cache's reference is the last one
 *     (no sequence holds the block), least recently used first.
 *
 * Engine-thread only, like the pool it references.
 */
#ifndef NALAR_PREFIX_CACHE_H
#define NALAR_PREFIX_CACHE_H

#include <stdint.h>

#include "kv.h"
#include "nalar_err.h"

#define NALAR_DIGEST 32

typedef struct nalar_prefix_cache nalar_prefix_cache;

typedef struct {
    uint64_t queries;     /* prompt tokens looked up */
    uint64_t hits;        /* prompt tokens served from the cache */
    uint64_t evictions;   /* blocks evicted */
    int32_t  blocks;      /* blocks published and held now */
    int32_t  evictable;   /* of those, held by no sequence */
} nalar_prefix_stats;

/* `identity`: the model's computation identity (nalar_model.identity);
 * `backend`: the backend as it computes (its name; "cpu act=i16" for
 * the CPU backend with int16 activations). */
nalar_prefix_cache *nalar_prefix_cache_create(nalar_kv_pool *pool,
                                              const uint8_t *identity,
                                              const char *backend,
                                              nalar_err *err);
void nalar_prefix_cache_destroy(nalar_prefix_cache *c);

/*
 * The digests.  Each returns 0, or -1 when out of memory (OpenSSL's digest
 * context) with out untouched: a digest that was not computed must never
 * be looked up or published, or one tenant's blocks could answer for
 * another's (the digests keep the scopes apart).
 */
/* Root digest of a scope ("" = the single-tenant / global scope), for
 * the base model alone. */
int nalar_prefix_root(const nalar_prefix_cache *c, const char *scope,
                      uint8_t out[NALAR_DIGEST]);
/* The same under a LoRA adapter: `adapter` its digest (lora.h), or NULL
 * for the base alone (then the same root as nalar_prefix_root). */
int nalar_prefix_root_adapter(const nalar_prefix_cache *c, const char *scope,
                              const uint8_t *adapter,
                              uint8_t out[NALAR_DIGEST]);
/* h = H(prev, tokens of one block) */
int nalar_prefix_chain(const uint8_t prev[NALAR_DIGEST],
                       const int32_t *tokens, uint8_t out[NALAR_DIGEST]);
/* h = H(prev, root) -- switches a chain from a shared (global) prefix
 * into a tenant's scope; out may be prev */
int nalar_prefix_rescope(const uint8_t prev[NALAR_DIGEST],
                         const uint8_t root[NALAR_DIGEST],
                         uint8_t out[NALAR_DIGEST]);

/*
 * Match the longest chain of published blocks for `tokens` (at most
 * max_blocks blocks).  digests[i] is the digest of block i (the caller
 * computes them once per request).  Matched blocks are appended to the
 * empty `seq` with a reference taken; returns the number of blocks matched.
 */
int32_t nalar_prefix_match(nalar_prefix_cache *c, nalar_seq_kv *seq,
                           const uint8_t (*digests)[NALAR_DIGEST],
                           const int32_t *tokens, int32_t max_blocks);

/* Publish block `block` holding `tokens` (NALAR_KV_BLOCK ids) under
 * `digest`.  A digest already present is left as it is. */
void nalar_prefix_publish(nalar_prefix_cache *c,
                          const uint8_t digest[NALAR_DIGEST],
                          const int32_t *tokens, int32_t block);

/* Evict up to n unreferenced blocks (LRU first); returns blocks freed. */
int32_t nalar_prefix_evict(nalar_prefix_cache *c, int32_t n);

/* Drop every entry (e.g. cache switched off). */
void nalar_prefix_clear(nalar_prefix_cache *c);

void nalar_prefix_stats_get(const nalar_prefix_cache *c,
                            nalar_prefix_stats *s);

#endif
