/*
 * Prefix KV cache: a chained hash table of published blocks with an LRU
 * list.  See prefix_cache.h for the identity scheme and invariants.
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_cache.h"

typedef struct {
    uint8_t  digest[NALAR_DIGEST];
    int32_t  tokens[NALAR_KV_BLOCK];
    int32_t  block;
    int32_t  next;           /* hash chain, -1 ends */
    int32_t  lru_prev;       /* towards least recently used, -1 ends */
    int32_t  lru_next;       /* towards most recently used, -1 ends */
    int      used;
} entry;

struct nalar_prefix_cache {
    nalar_kv_pool *pool;
    uint8_t        identity[NALAR_DIGEST];
    char           backend[64];
    entry         *e;             /* (cap) */
    int32_t        cap;
    int32_t        n;             /* entries in use */
    int32_t        free_head;     /* unused entries, linked by next */
    int32_t       *buckets;       /* (n_buckets) */
    int32_t        n_buckets;     /* power of two */
    int32_t        lru_head;      /* least recently used */
    int32_t        lru_tail;      /* most recently used */
    int32_t       *by_block;      /* (pool->n_blocks) entry index or -1 */
    uint64_t       queries, hits, evictions;
};


/* H(a, b) into out; -1 (out untouched) when the digest context cannot be
 * had (out of memory) or the digest fails: the caller must not use out. */
static int
sha256(const void *a, size_t na, const void *b, size_t nb,
       uint8_t out[NALAR_DIGEST])
{
    EVP_MD_CTX  *ctx = EVP_MD_CTX_new();
    unsigned int len = NALAR_DIGEST;
    uint8_t      d[EVP_MAX_MD_SIZE];
    int          ok;

    if (ctx == NULL) {
        return -1;
    }
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1
         && EVP_DigestUpdate(ctx, a, na) == 1
         && (nb == 0 || EVP_DigestUpdate(ctx, b, nb) == 1)
         && EVP_DigestFinal_ex(ctx, d, &len) == 1
         && len == NALAR_DIGEST;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        return -1;
    }
    memcpy(out, d, NALAR_DIGEST);
    return 0;
}


nalar_prefix_cache *
nalar_prefix_cache_create(nalar_kv_pool *pool, const uint8_t *identity,
                          const char *backend, nalar_err *err)
{
    nalar_prefix_cache *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        nalar_fail(err, "prefix cache: out of memory");
        return NULL;
    }
    c->pool = pool;
    memcpy(c->identity, identity, NALAR_DIGEST);
    snprintf(c->backend, sizeof(c->backend), "%s", backend);
    c->cap = pool->n_blocks;
    c->n_buckets = 64;
    while (c->n_buckets < 2 * c->cap) {
        c->n_buckets *= 2;
    }
    c->e = calloc((size_t) c->cap, sizeof(entry));
    c->buckets = malloc((size_t) c->n_buckets * sizeof(int32_t));
    c->by_block = malloc((size_t) pool->n_blocks * sizeof(int32_t));
    if (c->e == NULL || c->buckets == NULL || c->by_block == NULL) {
        nalar_prefix_cache_destroy(c);
        nalar_fail(err, "prefix cache: out of memory");
        return NULL;
    }
    for (int32_t i = 0; i < c->n_buckets; i++) {
        c->buckets[i] = -1;
    }
    for (int32_t i = 0; i < pool->n_blocks; i++) {
        c->by_block[i] = -1;
    }
    for (int32_t i = 0; i < c->cap; i++) {
        c->e[i].next = i + 1 < c->cap ? i + 1 : -1;
    }
    c->free_head = 0;
    c->lru_head = c->lru_tail = -1;
    return c;
}


void
nalar_prefix_cache_destroy(nalar_prefix_cache *c)
{
    if (c == NULL) {
        return;
    }
    if (c->e != NULL && c->buckets != NULL && c->by_block != NULL) {
        nalar_prefix_clear(c);
    }
    free(c->e);
    free(c->buckets);
    free(c->by_block);
    free(c);
}


int
nalar_prefix_root(const nalar_prefix_cache *c, const char *scope,
                  uint8_t out[NALAR_DIGEST])
{
    return nalar_prefix_root_adapter(c, scope, NULL, out);
}


int
nalar_prefix_root_adapter(const nalar_prefix_cache *c, const char *scope,
                          const uint8_t *adapter, uint8_t out[NALAR_DIGEST])
{
    char     desc[256 + sizeof(uint64_t)];
    size_t   n;
    uint64_t slen = scope != NULL ? strlen(scope) : 0;

    /* everything but the scope that shapes stored K/V: model identity
     * (weights, shapes, tokenizer), adapter slot, RoPE/dtype as the
     * backend implements them, attention kernel version, block size;
     * then the scope's length, the scope and the model identity */
    n = (size_t) snprintf(desc, 256,
                          "nalar-prefix-v1|adapter=%s|kv=%s|"
                          "backend=%s|attn=paged-v1|block=%d|scope=",
                          adapter != NULL ? "lora" : "none",
                          nalar_kv_type_name(c->pool),
                          c->backend, NALAR_KV_BLOCK);
    if (n >= 256) {
        return -1;
    }
    memcpy(desc + n, &slen, sizeof(slen));
    n += sizeof(slen);
    {
        EVP_MD_CTX  *ctx = EVP_MD_CTX_new();
        unsigned int len = NALAR_DIGEST;
        uint8_t      d[EVP_MAX_MD_SIZE];
        int          ok;

        if (ctx == NULL) {
            return -1;
        }
        ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1
             && EVP_DigestUpdate(ctx, desc, n) == 1
             && (slen == 0 || EVP_DigestUpdate(ctx, scope, slen) == 1)
             && EVP_DigestUpdate(ctx, c->identity, NALAR_DIGEST) == 1
             && (adapter == NULL
                 || EVP_DigestUpdate(ctx, adapter, NALAR_DIGEST) == 1)
             && EVP_DigestFinal_ex(ctx, d, &len) == 1
             && len == NALAR_DIGEST;
        EVP_MD_CTX_free(ctx);
        if (!ok) {
            return -1;
        }
        memcpy(out, d, NALAR_DIGEST);
    }
    return 0;
}


int
nalar_prefix_chain(const uint8_t prev[NALAR_DIGEST], const int32_t *tokens,
                   uint8_t out[NALAR_DIGEST])
{
    return sha256(prev, NALAR_DIGEST, tokens,
                  NALAR_KV_BLOCK * sizeof(int32_t), out);
}


int
nalar_prefix_rescope(const uint8_t prev[NALAR_DIGEST],
                     const uint8_t root[NALAR_DIGEST],
                     uint8_t out[NALAR_DIGEST])
{
    return sha256(prev, NALAR_DIGEST, root, NALAR_DIGEST, out);
}


static uint32_t
bucket_of(const nalar_prefix_cache *c, const uint8_t *d)
{
    uint32_t h;

    memcpy(&h, d, sizeof(h));
    return h & (uint32_t) (c->n_buckets - 1);
}


static int32_t
find(const nalar_prefix_cache *c, const uint8_t *d)
{
    for (int32_t i = c->buckets[bucket_of(c, d)]; i >= 0; i = c->e[i].next) {
        if (memcmp(c->e[i].digest, d, NALAR_DIGEST) == 0) {
            return i;
        }
    }
    return -1;
}


static void
lru_unlink(nalar_prefix_cache *c, int32_t i)
{
    entry *x = &c->e[i];

    if (x->lru_prev >= 0) c->e[x->lru_prev].lru_next = x->lru_next;
    else c->lru_head = x->lru_next;
    if (x->lru_next >= 0) c->e[x->lru_next].lru_prev = x->lru_prev;
    else c->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = -1;
}


static void
lru_push_mru(nalar_prefix_cache *c, int32_t i)
{
    entry *x = &c->e[i];

    x->lru_next = -1;
    x->lru_prev = c->lru_tail;
    if (c->lru_tail >= 0) c->e[c->lru_tail].lru_next = i;
    else c->lru_head = i;
    c->lru_tail = i;
}


int32_t
nalar_prefix_match(nalar_prefix_cache *c, nalar_seq_kv *seq,
                   const uint8_t (*digests)[NALAR_DIGEST],
                   const int32_t *tokens, int32_t max_blocks)
{
    int32_t matched = 0;

    c->queries += (uint64_t) max_blocks * NALAR_KV_BLOCK;
    for (int32_t b = 0; b < max_blocks; b++) {
        int32_t i = find(c, digests[b]);

        if (i < 0 || memcmp(c->e[i].tokens, tokens + b * NALAR_KV_BLOCK,
                            sizeof(c->e[i].tokens)) != 0)
        {
            break;
        }
        if (seq->n_blocks == seq->cap) {
            int32_t  cap = seq->cap ? seq->cap * 2 : 8;
            int32_t *nb = realloc(seq->blocks, (size_t) cap * sizeof(int32_t));

            if (nb == NULL) {
                break;
            }
            seq->blocks = nb;
            seq->cap = cap;
        }
        nalar_kv_block_ref(c->pool, c->e[i].block);
        seq->blocks[seq->n_blocks++] = c->e[i].block;
        seq->n_pos = seq->n_blocks * NALAR_KV_BLOCK;
        lru_unlink(c, i);
        lru_push_mru(c, i);
        matched++;
    }
    c->hits += (uint64_t) matched * NALAR_KV_BLOCK;
    return matched;
}


void
nalar_prefix_publish(nalar_prefix_cache *c, const uint8_t digest[NALAR_DIGEST],
                     const int32_t *tokens, int32_t block)
{
    int32_t  i;
    uint32_t bk;

    if (find(c, digest) >= 0 || c->by_block[block] >= 0
        || c->free_head < 0)
    {
        return;
    }
    i = c->free_head;
    c->free_head = c->e[i].next;
    memcpy(c->e[i].digest, digest, NALAR_DIGEST);
    memcpy(c->e[i].tokens, tokens, sizeof(c->e[i].tokens));
    c->e[i].block = block;
    c->e[i].used = 1;
    bk = bucket_of(c, digest);
    c->e[i].next = c->buckets[bk];
    c->buckets[bk] = i;
    c->by_block[block] = i;
    lru_push_mru(c, i);
    nalar_kv_block_ref(c->pool, block);
    c->n++;
}


static void
remove_entry(nalar_prefix_cache *c, int32_t i)
{
    uint32_t bk = bucket_of(c, c->e[i].digest);
    int32_t *pp = &c->buckets[bk];

    while (*pp != i) {
        pp = &c->e[*pp].next;
    }
    *pp = c->e[i].next;
    lru_unlink(c, i);
    c->by_block[c->e[i].block] = -1;
    nalar_kv_block_unref(c->pool, c->e[i].block);
    c->e[i].used = 0;
    c->e[i].next = c->free_head;
    c->free_head = i;
    c->n--;
}


int32_t
nalar_prefix_evict(nalar_prefix_cache *c, int32_t n)
{
    int32_t freed = 0;

    for (int32_t i = c->lru_head; i >= 0 && freed < n; ) {
        int32_t next = c->e[i].lru_next;

        if (c->pool->refcount[c->e[i].block] == 1) {
            remove_entry(c, i);
            c->evictions++;
            freed++;
        }
        i = next;
    }
    return freed;
}


void
nalar_prefix_clear(nalar_prefix_cache *c)
{
    while (c->lru_head >= 0) {
        remove_entry(c, c->lru_head);
    }
}


void
nalar_prefix_stats_get(const nalar_prefix_cache *c, nalar_prefix_stats *s)
{
    s->queries = c->queries;
    s->hits = c->hits;
    s->evictions = c->evictions;
    s->blocks = c->n;
    s->evictable = 0;
    for (int32_t i = c->lru_head; i >= 0; i = c->e[i].lru_next) {
        s->evictable += c->pool->refcount[c->e[i].block] == 1;
    }
}
