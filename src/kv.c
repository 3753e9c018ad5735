/*
 * Paged KV cache bookkeeping: block free list, refcounts, per-sequence
 * block tables.  See kv.h for the invariants.
 */
#include <stdlib.h>
#include <string.h>

#include "kv.h"


static void
publish_free(nalar_kv_pool *p)
{
    __atomic_store_n(&p->n_free_published, p->n_free, __ATOMIC_RELAXED);
}


int
nalar_kv_pool_init(nalar_kv_pool *p, int32_t n_blocks, int32_t n_layers,
                   int32_t kv_dim, nalar_err *err)
{
    memset(p, 0, sizeof(*p));
    if (n_blocks <= 0 || n_layers <= 0 || kv_dim <= 0) {
        return nalar_fail(err, "kv pool: bad shape (%d blocks, %d layers, "
                          "kv_dim %d)", n_blocks, n_layers, kv_dim);
    }
    p->n_blocks = n_blocks;
    p->n_layers = n_layers;
    p->kv_dim = kv_dim;
    p->refcount = calloc((size_t) n_blocks, sizeof(int32_t));
    p->free_list = malloc((size_t) n_blocks * sizeof(int32_t));
    if (p->refcount == NULL || p->free_list == NULL) {
        nalar_kv_pool_free(p);
        return nalar_fail(err, "kv pool: out of memory for %d blocks",
                          n_blocks);
    }
    /* lowest ids on top of the stack: blocks are handed out in order */
    for (int32_t i = 0; i < n_blocks; i++) {
        p->free_list[i] = n_blocks - 1 - i;
    }
    p->n_free = n_blocks;
    publish_free(p);
    return 0;
}


void
nalar_kv_pool_free(nalar_kv_pool *p)
{
    free(p->refcount);
    free(p->free_list);
    p->refcount = NULL;
    p->free_list = NULL;
}


static int32_t
block_alloc(nalar_kv_pool *p)
{
    int32_t b;

    if (p->n_free == 0) {
        return -1;
    }
    b = p->free_list[--p->n_free];
    p->refcount[b] = 1;
    publish_free(p);
    return b;
}


void
nalar_kv_block_ref(nalar_kv_pool *p, int32_t b)
{
    p->refcount[b]++;
}


void
nalar_kv_block_unref(nalar_kv_pool *p, int32_t b)
{
    if (--p->refcount[b] == 0) {
        p->free_list[p->n_free++] = b;
        publish_free(p);
    }
}


void
nalar_seq_kv_init(nalar_seq_kv *s)
{
    memset(s, 0, sizeof(*s));
}


static int
table_grow(nalar_seq_kv *s, int32_t need)
{
    int32_t  cap;
    int32_t *nb;

    if (need <= s->cap) {
        return 0;
    }
    cap = s->cap ? s->cap : 8;
    while (cap < need) {
        cap *= 2;
    }
    nb = realloc(s->blocks, (size_t) cap * sizeof(int32_t));
    if (nb == NULL) {
        return -1;
    }
    s->blocks = nb;
    s->cap = cap;
    return 0;
}


/* Does appending at position s->n_pos write into a shared block? */
static int
needs_cow(const nalar_kv_pool *p, const nalar_seq_kv *s, int32_t n_pos)
{
    int32_t last;

    if (n_pos <= s->n_pos || s->n_pos % NALAR_KV_BLOCK == 0) {
        return 0;
    }
    last = s->blocks[s->n_pos / NALAR_KV_BLOCK];
    return p->refcount[last] > 1;
}


int32_t
nalar_seq_kv_blocks_needed(const nalar_kv_pool *p, const nalar_seq_kv *s,
                           int32_t n_pos)
{
    int32_t want = (n_pos + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
    int32_t extra = want > s->n_blocks ? want - s->n_blocks : 0;

    return extra + needs_cow(p, s, n_pos);
}


int
nalar_seq_kv_reserve(nalar_kv_pool *p, nalar_seq_kv *s, int32_t n_pos)
{
    int32_t want = (n_pos + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;

    if (nalar_seq_kv_blocks_needed(p, s, n_pos) > p->n_free) {
        return -1;
    }
    if (table_grow(s, want) != 0) {
        return -1;
    }
    if (needs_cow(p, s, n_pos)) {
        int32_t i = s->n_pos / NALAR_KV_BLOCK;
        int32_t old = s->blocks[i];
        int32_t nb = block_alloc(p);

        if (p->copy != NULL) {
            p->copy(p->copy_ctx, nb, old);
        }
        nalar_kv_block_unref(p, old);
        s->blocks[i] = nb;
    }
    while (s->n_blocks < want) {
        s->blocks[s->n_blocks++] = block_alloc(p);
    }
    return 0;
}


void
nalar_seq_kv_truncate(nalar_kv_pool *p, nalar_seq_kv *s, int32_t pos)
{
    int32_t keep;

    if (pos < 0) {
        pos = 0;
    }
    if (pos < s->n_pos) {
        s->n_pos = pos;
    }
    keep = (pos + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
    while (s->n_blocks > keep) {
        if (--s->n_blocks >= s->n_dead) {
            nalar_kv_block_unref(p, s->blocks[s->n_blocks]);
        }
    }
    if (s->n_dead > s->n_blocks) {
        s->n_dead = s->n_blocks;
    }
}


int32_t
nalar_seq_kv_drop_before(nalar_kv_pool *p, nalar_seq_kv *s, int32_t pos)
{
    int32_t n = pos / NALAR_KV_BLOCK, dropped;

    if (n > s->n_blocks - 1) {
        n = s->n_blocks - 1;
    }
    if (n <= s->n_dead) {
        return 0;
    }
    dropped = n - s->n_dead;
    for (int32_t i = s->n_dead; i < n; i++) {
        nalar_kv_block_unref(p, s->blocks[i]);
    }
    for (int32_t i = 0; i < n; i++) {
        s->blocks[i] = s->blocks[n];
    }
    s->n_dead = n;
    return dropped;
}


#ifdef NALAR_TEST_HOOKS
int
nalar_seq_kv_share(nalar_kv_pool *p, nalar_seq_kv *dst,
                   const nalar_seq_kv *src, int32_t n_pos)
{
    int32_t n = (n_pos + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;

    if (dst->n_blocks != 0 || n_pos > src->n_pos || src->n_dead > 0) {
        return -1;
    }
    if (table_grow(dst, n) != 0) {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        dst->blocks[i] = src->blocks[i];
        nalar_kv_block_ref(p, src->blocks[i]);
    }
    dst->n_blocks = n;
    dst->n_pos = n_pos;
    return 0;
}
#endif


void
nalar_seq_kv_release(nalar_kv_pool *p, nalar_seq_kv *s)
{
    nalar_seq_kv_truncate(p, s, 0);
    free(s->blocks);
    nalar_seq_kv_init(s);
}


int
nalar_kv_check(const nalar_kv_pool *p, nalar_err *err)
{
    int32_t  n_zero = 0;
    uint8_t *seen;

    for (int32_t b = 0; b < p->n_blocks; b++) {
        if (p->refcount[b] < 0) {
            return nalar_fail(err, "kv: block %d has refcount %d", b,
                              p->refcount[b]);
        }
        n_zero += p->refcount[b] == 0;
    }
    if (n_zero != p->n_free) {
        return nalar_fail(err, "kv: %d blocks unreferenced but %d on the "
                          "free list", n_zero, p->n_free);
    }
    seen = calloc((size_t) p->n_blocks, 1);
    if (seen == NULL) {
        return nalar_fail(err, "kv: out of memory");
    }
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_list[i];

        if (b < 0 || b >= p->n_blocks || seen[b] || p->refcount[b] != 0) {
            free(seen);
            return nalar_fail(err, "kv: free list entry %d (block %d) is "
                              "bad", i, b);
        }
        seen[b] = 1;
    }
    free(seen);
    return 0;
}
