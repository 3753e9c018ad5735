/*
 * Prefix cache: hits only for the same computation (scope, model, token ids
 * at the same positions), whole blocks only, identical output with the
 * cache on and off, eviction that never touches blocks in use.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "model.h"
#include "prefix_cache.h"
#include "collect.h"
#include "tap.h"
#include "tokenizer.h"

static const char *MODEL = "models/nalar-kjv-target-f32.gguf";
static ggml_type   kv_type;     /* the engines' KV cache (each is run) */



static nalar_engine *
engine(int cache, int64_t kv_bytes)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = MODEL;
    o.prefix_cache = cache;
    o.kv_bytes = kv_bytes;
    o.n_threads = 2;
    o.max_batch_tokens = 64;
    o.kv_type = kv_type;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        return NULL;
    }
    return e;
}


/* Run one greedy request to completion; returns its collected output. */
static collected
run(nalar_engine *e, const int32_t *prompt, int n, const char *scope,
    int n_shared, int max_tokens)
{
    nalar_request_params p;
    nalar_request       *r;
    nalar_err            err;
    collected            c;

    memset(&c, 0, sizeof(c));
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = prompt;
    p.n_prompt = n;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    p.cache_scope = scope;
    p.n_shared_prefix = n_shared;
    r = nalar_request_create(&p, collect, &c, &err);
    if (r == NULL || nalar_engine_run_sync(e, &r, 1, &err) != 0) {
        diag("run: %s", err.msg);
    }
    nalar_request_unref(r);
    return c;
}


static int
same(const collected *a, const collected *b)
{
    return a->n == b->n
           && memcmp(a->ids, b->ids, (size_t) a->n * sizeof(int32_t)) == 0;
}


static int
kv_consistent(nalar_engine *e)
{
    nalar_err err;

    if (nalar_kv_check(nalar_engine_kv(e), &err) != 0) {
        diag("%s", err.msg);
        return 0;
    }
    return 1;
}


/* The root digest: another model identity, another scope or another KV
 * element type never matches */
static void
test_digests(void)
{
    /* digests: another model identity or another scope never matches */
    {
        nalar_kv_pool       pool;
        nalar_err           err;
        uint8_t             id1[32] = { 1 }, id2[32] = { 2 };
        uint8_t             r1[32], r2[32], r3[32];
        nalar_prefix_cache *c1, *c2;

        nalar_kv_pool_init(&pool, 4, 1, 4, &err);
        c1 = nalar_prefix_cache_create(&pool, id1, "cpu", &err);
        c2 = nalar_prefix_cache_create(&pool, id2, "cpu", &err);
        nalar_prefix_root(c1, "A", r1);
        nalar_prefix_root(c2, "A", r2);
        nalar_prefix_root(c1, "B", r3);
        ok(memcmp(r1, r2, 32) != 0, "another model: another root");
        ok(memcmp(r1, r3, 32) != 0, "another scope: another root");
        nalar_prefix_cache_destroy(c1);
        nalar_prefix_cache_destroy(c2);
        nalar_kv_pool_free(&pool);
    }

    /* the KV cache's element type is part of the root: blocks a BF16
     * pool holds never answer an F32 pool's lookup, or the reverse */
    {
        nalar_kv_pool       pool, pool16;
        nalar_err           err;
        uint8_t             id[32] = { 1 }, r32[32], r16[32], r0[32];
        nalar_prefix_cache *c32, *c16;

        nalar_kv_pool_init(&pool, 4, 1, 4, &err);
        nalar_kv_pool_init(&pool16, 4, 1, 4, &err);
        pool16.elem_bytes = 2;
        c32 = nalar_prefix_cache_create(&pool, id, "cuda", &err);
        c16 = nalar_prefix_cache_create(&pool16, id, "cuda", &err);
        nalar_prefix_root(c32, "A", r0);
        pool.elem_bytes = 4;
        nalar_prefix_root(c32, "A", r32);
        nalar_prefix_root(c16, "A", r16);
        ok(memcmp(r32, r16, 32) != 0, "a BF16 KV pool: another root");
        {
            uint8_t rf16[32];

            /* F16 and BF16 elements are both 2 bytes: the type tells */
            pool16.type = GGML_F16;
            nalar_prefix_root(c16, "A", rf16);
            ok(memcmp(rf16, r16, 32) != 0 && memcmp(rf16, r32, 32) != 0,
               "an F16 KV pool: a root of its own, neither BF16's nor "
               "F32's");
            pool16.type = GGML_BF16;
            nalar_prefix_root(c16, "A", rf16);
            ok(memcmp(rf16, r16, 32) == 0, "a BF16 pool whether or not "
               "its backend set the type");
        }
        ok(memcmp(r32, r0, 32) == 0,
           "an F32 pool whether or not its backend set elem_bytes");
        nalar_prefix_cache_destroy(c32);
        nalar_prefix_cache_destroy(c16);
        nalar_kv_pool_free(&pool);
        nalar_kv_pool_free(&pool16);
    }
}


/* eviction under a small pool: many prompts, outputs unchanged */
static void
test_eviction(nalar_engine *off)
{
    {
        nalar_engine  *small;
        nalar_model   *mm = nalar_engine_model(off);
        int64_t        bb = nalar_kv_block_bytes(mm, kv_type);
        int            good = 0;
        nalar_metrics  mt;

        small = engine(1, 14 * bb);
        for (int i = 0; i < 12; i++) {
            int32_t   p[120];
            int       len = 40 + 7 * (i % 5);
            collected x, y;

            for (int k = 0; k < len; k++) {
                p[k] = k == 0 ? 1 : 300 + (k * (i % 4 + 3)) % 1200;
            }
            x = run(small, p, len, i % 2 ? "A" : "B", 0, 16);
            y = run(off, p, len, "", 0, 16);
            good += same(&x, &y);
        }
        is_int(good, 12, "KV %s: outputs identical under eviction pressure",
               nalar_kv_type_name(nalar_engine_kv(small)));
        nalar_engine_metrics(small, &mt);
        ok(mt.prefix_evictions_total > 0, "blocks were evicted (%llu)",
           (unsigned long long) mt.prefix_evictions_total);
        ok(kv_consistent(small), "KV invariants hold after eviction");
        ok(nalar_engine_kv(small)->n_blocks == 14,
           "14 blocks of this KV type in 14 blocks' bytes (%d)",
           nalar_engine_kv(small)->n_blocks);
        nalar_engine_destroy(small);
    }
}


/* the cache's behaviour with the engines' KV type kv_type */
static void
test_cache(void)
{
    nalar_engine *on, *off;
    int32_t       prompt[200], shifted[201], diverge[200], nobos[199];
    collected     ref, a1, a2, b1, c;
    nalar_model  *m;
    int           n;
    const char   *text = "And it came to pass in those days, that there went "
                         "out a decree from Caesar Augustus, that all the "
                         "world should be taxed. And all went to be taxed, "
                         "every one into his own city.";

    on = engine(1, 0);
    off = engine(0, 0);
    ok(on != NULL && off != NULL, "engines load, KV %s",
       on != NULL ? nalar_kv_type_name(nalar_engine_kv(on)) : "?");
    if (on == NULL || off == NULL) {
        nalar_engine_destroy(on);
        nalar_engine_destroy(off);
        return;
    }
    ok(nalar_engine_kv(on)->type == (int32_t) kv_type
       && nalar_engine_kv(on)->elem_bytes == nalar_kv_elem_bytes(kv_type),
       "the pool keeps the type asked for (%s, %d bytes an element)",
       nalar_kv_type_name(nalar_engine_kv(on)),
       nalar_engine_kv(on)->elem_bytes);
    {
        /* a size holds blocks of the type's size: twice the F32 count in
         * 2-byte elements, and the metrics say so */
        nalar_model   *mm = nalar_engine_model(on);
        nalar_engine  *sz = engine(0, 10 * nalar_kv_block_bytes(mm,
                                                                GGML_F32));
        nalar_metrics  mt;
        int32_t        want = 10 * 4 / nalar_kv_elem_bytes(kv_type);

        if (sz != NULL) {
            nalar_engine_metrics(sz, &mt);
        }
        ok(sz != NULL && nalar_engine_kv(sz)->n_blocks == want
           && mt.kv_blocks_total == want && mt.kv_blocks_free == want,
           "10 F32 blocks' bytes hold %d blocks (capacity metric %d)", want,
           sz != NULL ? mt.kv_blocks_total : -1);
        nalar_engine_destroy(sz);
    }
    m = nalar_engine_model(on);
    n = nalar_tokenize(m->tok, text, strlen(text), 1, 0, prompt, 200);
    diag("prompt: %d tokens", n);
    ok(n > 33 && n < 100, "prompt spans several blocks (%d tokens)", n);

    ref = run(off, prompt, n, "A", 0, 24);
    a1 = run(on, prompt, n, "A", 0, 24);
    a2 = run(on, prompt, n, "A", 0, 24);
    is_int(a1.cached, 0, "first request from tenant A: cold");
    is_int(a2.cached, (n - 1) / NALAR_KV_BLOCK * NALAR_KV_BLOCK,
           "second request from tenant A: every full block but the last "
           "token's is cached");
    ok(same(&a1, &ref) && same(&a2, &ref),
       "output with the cache (cold and warm) equals output without it");
    b1 = run(on, prompt, n, "B", 0, 24);
    is_int(b1.cached, 0, "tenant B sending the same prompt gets no hit");
    ok(same(&b1, &ref), "tenant B gets the same output");
    c = run(on, prompt, n, "", 0, 24);
    is_int(c.cached, 0, "the global scope does not see tenant A's blocks");

    /* near misses */
    shifted[0] = 1;
    memcpy(shifted + 1, prompt, (size_t) n * sizeof(int32_t));
    c = run(on, shifted, n + 1, "A", 0, 8);
    is_int(c.cached, 0, "positions shifted by a prepended token: no hit");
    memcpy(nobos, prompt + 1, (size_t) (n - 1) * sizeof(int32_t));
    c = run(on, nobos, n - 1, "A", 0, 8);
    is_int(c.cached, 0, "same text without BOS: no hit");
    memcpy(diverge, prompt, (size_t) n * sizeof(int32_t));
    diverge[20] = diverge[20] == 300 ? 301 : 300;
    c = run(on, diverge, n, "A", 0, 8);
    is_int(c.cached, 16, "divergence inside block 1: only block 0 hits");
    {
        collected r2 = run(off, diverge, n, "A", 0, 8);
        ok(same(&c, &r2), "a partial hit gives the uncached output");
    }

    /* generated blocks are published too: a follow-up turn hits them */
    {
        int32_t   turn2[300];
        collected t2, t2ref;
        int       n2 = n + 24;

        memcpy(turn2, prompt, (size_t) n * sizeof(int32_t));
        memcpy(turn2 + n, ref.ids, 24 * sizeof(int32_t));
        t2 = run(on, turn2, n2, "A", 0, 8);
        t2ref = run(off, turn2, n2, "A", 0, 8);
        ok(t2.cached >= (n / NALAR_KV_BLOCK + 1) * NALAR_KV_BLOCK
           && t2.cached <= n2 - 1,
           "follow-up turn reuses generated blocks (%d cached of %d)",
           t2.cached, n2);
        ok(same(&t2, &t2ref), "follow-up output unchanged by the cache");
    }

    /* an operator-declared shared prefix is reusable across tenants,
     * what follows it is not */
    {
        const char *sys = "You are a helpful assistant who answers in the "
                          "words of the King James Bible, briefly and with "
                          "great care. Question: who went out?";
        int32_t     sp[200];
        int         ns = nalar_tokenize(m->tok, sys, strlen(sys), 1, 0, sp,
                                        200);

        c = run(on, sp, ns, "C", 32, 4);
        is_int(c.cached, 0, "tenant C, first request with shared prefix: "
               "cold");
        c = run(on, sp, ns, "D", 32, 4);
        is_int(c.cached, 32, "tenant D reuses the 32-token shared prefix "
               "only");
        c = run(on, sp, ns, "C", 32, 4);
        is_int(c.cached, (ns - 1) / NALAR_KV_BLOCK * NALAR_KV_BLOCK,
               "tenant C reuses its own continuation");
    }

    ok(kv_consistent(on), "KV invariants hold with the cache");
    {
        nalar_metrics mt;

        nalar_engine_metrics(on, &mt);
        ok(mt.prefix_hits_total > 0 && mt.prefix_queries_total
           >= mt.prefix_hits_total && mt.prefix_blocks > 0,
           "metrics: %llu hits of %llu queried tokens, %d blocks",
           (unsigned long long) mt.prefix_hits_total,
           (unsigned long long) mt.prefix_queries_total, mt.prefix_blocks);
        is_int(mt.kv_blocks_free, mt.kv_blocks_total,
               "idle: cached blocks count as free");
    }
    nalar_engine_destroy(on);
    test_eviction(off);
    nalar_engine_destroy(off);
}


int
main(void)
{
    /* every KV type the CPU backend keeps: blocks shared and copied on
     * write in 2-byte elements as in 4-byte ones, none leaked */
    static const ggml_type types[] = { GGML_F32, GGML_F16, GGML_BF16 };

    test_digests();
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        kv_type = types[i];
        test_cache();
    }
    return done_testing();
}
