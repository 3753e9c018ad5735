/*
 * Paged KV cache: a pool of fixed-size blocks shared by all sequences.
 *
 * A block holds NALAR_KV_BLOCK consecutive positions of one sequence, for
 * every layer, K and V.  A sequence owns a block table mapping position p to
 * block table[p / NALAR_KV_BLOCK], slot p % NALAR_KV_BLOCK.
 *
 * Invariants (kept by kv.c, checked by nalar_kv_check):
 *   - refcount[b] == number of block tables that list b; a block with
 *     refcount 0 is on the free list exactly once.
 *   - a block with refcount > 1 is never written: appending into a shared
 *     partial block first copies it (copy-on-write).
 *   - seq->n_pos <= seq->n_blocks * NALAR_KV_BLOCK.
 *
 * The pool's bookkeeping is host memory; the storage (K/V arrays) belongs to
 * the backend (host RAM for the CPU backend, device memory for CUDA), which
 * supplies the block copy used for copy-on-write.
 *
 * Not thread-safe: one engine thread owns a pool.  n_free is also published
 * atomically for metrics readers.
 */
#ifndef NALAR_KV_H
#define NALAR_KV_H

#include <stdint.h>

#include "gguf.h"
#include "nalar_err.h"

#define NALAR_KV_BLOCK 16

typedef struct nalar_kv_pool nalar_kv_pool;

typedef void (*nalar_kv_copy_fn)(void *ctx, int32_t dst, int32_t src);

struct nalar_kv_pool {
    int32_t  n_blocks;
    int32_t  n_layers;
    int32_t  kv_dim;        /* n_kv_heads * head_dim */
    /* storage, owned by the backend; for the CPU backend:
     * k, v: (n_blocks, n_layers, NALAR_KV_BLOCK, kv_dim) elements of
     * `type`: floats, or with a 16-bit type uint16_t codes (read them
     * through a uint16_t pointer; the float type is only the field's) */
    float   *k;
    float   *v;
    int32_t *refcount;      /* (n_blocks) */
    int32_t *free_list;     /* (n_blocks) stack of free block ids */
    int32_t  n_free;
    int32_t  n_free_published;  /* atomic copy of n_free for other threads */
    nalar_kv_copy_fn copy;  /* copies one block (all layers, K and V) */
    void    *copy_ctx;
    int32_t  elem_bytes;    /* bytes of one K/V element as stored: 4 (F32;
                               0 reads as 4) or 2 (F16, BF16) */
    /* the element type as stored, a ggml_type: GGML_F32 (0), GGML_F16
     * (the CPU backend) or GGML_BF16.  Set by the backend's kv_alloc with
     * elem_bytes, from its kv_type: a pool has one type for its life, and
     * an engine one pool (one for its draft), so every block it holds was
     * made under this type.  The prefix cache's root names it
     * (nalar_kv_type_name). */
    int32_t  type;
};

/* "f32", "f16" or "bf16": the pool's element type as the prefix cache's
 * root and the logs name it (an F32 pool whose backend set only
 * elem_bytes 2 is a BF16 one, as before the type field) */
static inline const char *
nalar_kv_type_name(const nalar_kv_pool *p)
{
    if (p->type == GGML_F16) {
        return "f16";
    }
    return p->type == GGML_BF16 || p->elem_bytes == 2 ? "bf16" : "f32";
}

typedef struct {
    int32_t *blocks;        /* (cap) block ids, first n_blocks valid */
    int32_t  n_blocks;
    int32_t  cap;
    int32_t  n_pos;         /* positions [0, n_pos) hold valid KV */
    int32_t  n_dead;        /* blocks [0, n_dead) were given back (their
                               positions are before every window): not
                               owned, each names the first owned block so
                               that a pass reading them reads memory the
                               sequence holds (with attention weight 0) */
} nalar_seq_kv;

/* Bookkeeping only; storage is attached by the backend. */
int  nalar_kv_pool_init(nalar_kv_pool *p, int32_t n_blocks, int32_t n_layers,
                        int32_t kv_dim, nalar_err *err);
void nalar_kv_pool_free(nalar_kv_pool *p);

/* Offset (in elements) of position slot `slot` of layer `layer` in block b. */
static inline int64_t
nalar_kv_offset(const nalar_kv_pool *p, int32_t b, int32_t layer,
                int32_t slot)
{
    return (((int64_t) b * p->n_layers + layer) * NALAR_KV_BLOCK + slot)
           * p->kv_dim;
}

void nalar_seq_kv_init(nalar_seq_kv *s);
/* Make positions [0, n_pos) writable-backed: allocate blocks as needed and
 * copy-on-write a shared last block that will be appended to.  Does not
 * change s->n_pos.  Returns -1 (nothing allocated) when the pool is short. */
int  nalar_seq_kv_reserve(nalar_kv_pool *p, nalar_seq_kv *s, int32_t n_pos);
/* Blocks that reserve(n_pos) would take from the pool. */
int32_t nalar_seq_kv_blocks_needed(const nalar_kv_pool *p,
                                   const nalar_seq_kv *s, int32_t n_pos);
/* Forget positions >= pos and release blocks no longer needed. */
void nalar_seq_kv_truncate(nalar_kv_pool *p, nalar_seq_kv *s, int32_t pos);
#ifdef NALAR_TEST_HOOKS
/* For tests of the pool's sharing and copy on write (the engine shares
 * blocks through the prefix cache): dst (empty) shares src's first n_pos
 * positions (refcount++ on blocks); -1 when src gave any of their blocks
 * back. */
int  nalar_seq_kv_share(nalar_kv_pool *p, nalar_seq_kv *dst,
                        const nalar_seq_kv *src, int32_t n_pos);
#endif
/* Give back to the pool every whole block whose positions are all
 * before pos (keeping at least the last block): a sliding-window model
 * whose every layer slides never reads them again.  Returns the number
 * given back. */
int32_t nalar_seq_kv_drop_before(nalar_kv_pool *p, nalar_seq_kv *s,
                                 int32_t pos);
/* Release every block and the table. */
void nalar_seq_kv_release(nalar_kv_pool *p, nalar_seq_kv *s);

/* Block-level references (the prefix cache holds blocks this way). */
void    nalar_kv_block_ref(nalar_kv_pool *p, int32_t b);
void    nalar_kv_block_unref(nalar_kv_pool *p, int32_t b);

/* Consistency check for tests: returns 0 when the invariants hold. */
int  nalar_kv_check(const nalar_kv_pool *p, nalar_err *err);

#endif
