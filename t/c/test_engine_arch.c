/*
 * Engine tests on the conformance kit's other architectures and on a
 * model whose every layer slides: greedy ids alone are the reference, and
 * batched, chunked, preempted, speculated (n-gram, a random draft, the
 * model as its own draft) and from the prefix cache they are the same;
 * sliding layers give their blocks back; the activations' mode enters
 * the prefix cache's root digest.  (The demo models' reference ids, the
 * KV pool, failures and concurrency are test_engine's.)
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "mkmodel.h"
#include "model.h"
#include "collect.h"
#include "tap.h"
#include "tokenizer.h"
#include "engine_helpers.h"


/*
 * Exactness on the other architectures (t/data/conformance: qwen2 biases,
 * qwen3 q/k norms, gemma2 soft-caps, post-norms and a 32-position sliding
 * window, phi3 fused tensors, Llama 3.1 frequency factors): every prompt's
 * greedy ids alone are the reference, and batched, chunked, preempted,
 * with n-gram speculation and served from the prefix cache they are the
 * same.  The prompts are longer than gemma2's window, and the prefix
 * cache serves a prompt whose shared part spans it.
 */
#define ARCH_N     24     /* generated tokens */
#define ARCH_P     4      /* prompts */

static nalar_engine *
engine_xd(const char *path, const char *draft, int chunk, int64_t kv_bytes,
          int prefix, int spec)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.draft_path = draft;
    o.max_batch_tokens = chunk;
    o.kv_bytes = kv_bytes;
    o.n_threads = 2;
    o.prefix_cache = prefix;
    o.spec_mode = spec;
    o.spec_fixed_k = spec != 0 ? 4 : 0;   /* propose at every step */
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


static nalar_engine *
engine_x(const char *path, int chunk, int64_t kv_bytes, int prefix, int spec)
{
    return engine_xd(path, NULL, chunk, kv_bytes, prefix, spec);
}


/* the prompts (k < ARCH_P) all together, plus `extra` fillers; 1 when
 * each equals want[k] and (without a prefix cache, which keeps blocks)
 * every KV block is free again */
static int
arch_run(nalar_engine *e, int32_t (*prompts)[80], const int *len,
         int32_t (*want)[ARCH_N], int extra, int cached, const char *what)
{
    nalar_request *reqs[ARCH_P + 4];
    collected     *out = calloc(ARCH_P + 4, sizeof(collected));
    int32_t        filler[64];
    int            n = 0, good = 1;
    nalar_err      err;

    if (e == NULL || out == NULL) {
        free(out);
        return 0;
    }
    for (int i = 0; i < 64; i++) {
        filler[i] = 300 + (i * 53) % 1700;
    }
    for (int i = 0; i < extra; i++) {
        reqs[n] = greedy_req(filler, 10 + 17 * i, 5 + 4 * i, &out[n]);
        n++;
    }
    for (int k = 0; k < ARCH_P; k++) {
        reqs[n] = greedy_req(prompts[k], len[k], ARCH_N, &out[n]);
        n++;
    }
    if (nalar_engine_run_sync(e, reqs, n, &err) != 0) {
        diag("%s: run: %s", what, err.msg);
        good = 0;
    }
    for (int k = 0; k < ARCH_P; k++) {
        collected *c = &out[extra + k];

        if (c->n != ARCH_N || !same(c->ids, want[k], ARCH_N)) {
            diag("%s: prompt %d: %d ids, first %d %d", what, k, c->n,
                 c->ids[0], c->ids[1]);
            good = 0;
        }
    }
    for (int i = 0; i < n; i++) {
        nalar_request_unref(reqs[i]);
    }
    if (!cached) {
        good &= kv_all_free(e);
    }
    free(out);
    return good;
}


/*
 * Draft-model speculation: a draft of the same architecture and
 * vocabulary with random weights (its proposals mostly rejected: the
 * rollback path), and the target as its own draft (all accepted), 4
 * proposals at every step; the ids are those without speculation.
 */
static void
check_arch_draft(const char *name, const char *path, const char *arch,
                 int window, int32_t (*prompts)[80], const int *len,
                 int32_t (*want)[ARCH_N])
{
    char                dpath[128];
    nalar_mkmodel_opts  mo;
    nalar_engine       *e;
    nalar_metrics       mt;
    nalar_err           err;

    snprintf(dpath, sizeof(dpath), "/tmp/nalar-test-draft-%d-%s.gguf",
             (int) getpid(), name);
    nalar_mkmodel_defaults(&mo);
    mo.dim = 64;
    mo.n_layers = 2;
    mo.n_heads = 2;
    mo.n_kv_heads = 1;
    mo.ffn_dim = 128;
    mo.n_ctx = 512;
    mo.seed = 5;
    mo.vocab_from = path;
    mo.arch = arch;
    mo.window = window;
    if (nalar_mkmodel(&mo, dpath, &err) != 0) {
        ok(0, "%s: a draft model: %s", name, err.msg);
        return;
    }

    e = engine_xd(path, dpath, 512, 0, 0, NALAR_SPEC_DRAFT);
    ok(arch_run(e, prompts, len, want, 1, 0, "random draft"),
       "%s: with a random %s draft, the same", name, arch);
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.spec_draft_tokens_total > 0
           && mt.spec_accepted_tokens_total < mt.spec_draft_tokens_total,
           "%s: ... which proposed %llu tokens, %llu accepted", name,
           (unsigned long long) mt.spec_draft_tokens_total,
           (unsigned long long) mt.spec_accepted_tokens_total);
    }
    nalar_engine_destroy(e);
    unlink(dpath);

    e = engine_xd(path, path, 512, 0, 0, NALAR_SPEC_DRAFT);
    ok(arch_run(e, prompts, len, want, 0, 0, "self draft"),
       "%s: as its own draft, the same", name);
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.spec_accepted_tokens_total > 0,
           "%s: ... with %llu of %llu proposals accepted", name,
           (unsigned long long) mt.spec_accepted_tokens_total,
           (unsigned long long) mt.spec_draft_tokens_total);
    }
    nalar_engine_destroy(e);
}


static void
check_arch(const char *name, const char *arch, int window)
{
    char           path[128];
    int32_t        prompts[ARCH_P][80], want[ARCH_P][ARCH_N];
    int            len[ARCH_P] = { 40, 57, 70, 75 };
    nalar_engine  *e;
    nalar_metrics  mt;
    int64_t        bb;
    int            alone = 1;

    snprintf(path, sizeof(path), "t/data/conformance/%s.gguf", name);
    for (int k = 0; k < ARCH_P; k++) {
        prompts[k][0] = 1;
        for (int i = 1; i < 80; i++) {
            /* prompts 2 and 3 share their first 64 ids; each repeats a
             * phrase, for the n-gram proposer */
            prompts[k][i] = k == 3 && i >= 64 ? 700 + i
                            : 3 + ((k == 3 ? 2 : k) * 389 + (i % 23) * 97)
                                  % 2040;
        }
    }
    e = engine_x(path, 512, 0, 0, 0);
    ok(e != NULL, "%s: loads", name);
    if (e == NULL) {
        return;
    }
    for (int k = 0; k < ARCH_P; k++) {
        collected      c;
        nalar_request *r = greedy_req(prompts[k], len[k], ARCH_N, &c);
        nalar_err      err;

        nalar_engine_run_sync(e, &r, 1, &err);
        alone &= c.n == ARCH_N;
        memcpy(want[k], c.ids, sizeof(want[k]));
        nalar_request_unref(r);
    }
    ok(alone, "%s: each prompt alone gives %d ids", name, ARCH_N);
    ok(arch_run(e, prompts, len, want, 0, 0, "batched"),
       "%s: batched, the ids of each alone", name);
    ok(arch_run(e, prompts, len, want, 3, 0, "batched with 3 others"),
       "%s: batched with 3 others, the same", name);
    {
        const nalar_config *cf = &nalar_engine_model(e)->cfg;

        bb = 2LL * cf->n_layers * NALAR_KV_BLOCK * cf->n_kv_heads
             * cf->head_dim * 4;
    }
    nalar_engine_destroy(e);

    e = engine_x(path, 5, 0, 0, 0);
    ok(arch_run(e, prompts, len, want, 2, 0, "chunked"),
       "%s: chunked prefill (5 tokens a step), the same", name);
    nalar_engine_destroy(e);

    e = engine_x(path, 64, 14 * bb, 0, 0);
    ok(arch_run(e, prompts, len, want, 2, 0, "preempted"),
       "%s: on 14 KV blocks, the same", name);
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.preemptions_total > 0, "%s: ... with preemption (%llu)", name,
           (unsigned long long) mt.preemptions_total);
    }
    nalar_engine_destroy(e);

    e = engine_x(path, 512, 0, 0, NALAR_SPEC_NGRAM);
    ok(arch_run(e, prompts, len, want, 0, 0, "n-gram speculation"),
       "%s: with n-gram speculation, the same", name);
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.spec_draft_tokens_total > 0, "%s: ... which proposed %llu "
           "tokens", name, (unsigned long long) mt.spec_draft_tokens_total);
    }
    nalar_engine_destroy(e);

    check_arch_draft(name, path, arch, window, prompts, len, want);

    /* prefix cache: prompt 2 published, then prompt 3 (its first 64 ids
     * shared: four blocks, twice gemma2's window) from the cache */
    e = engine_x(path, 512, 0, 1, 0);
    if (e != NULL) {
        collected      c;
        nalar_request *r;
        nalar_err      err;
        int            good = 1;

        for (int k = 2; k < ARCH_P; k++) {
            r = greedy_req(prompts[k], len[k], ARCH_N, &c);
            nalar_engine_run_sync(e, &r, 1, &err);
            good &= c.n == ARCH_N && same(c.ids, want[k], ARCH_N);
            nalar_request_unref(r);
        }
        nalar_engine_metrics(e, &mt);
        ok(good && mt.prefix_hits_total >= 64, "%s: prefix cache on, the "
           "same (%llu prompt tokens from the cache)", name,
           (unsigned long long) mt.prefix_hits_total);
        ok(arch_run(e, prompts, len, want, 1, 1, "cache, batched"),
           "%s: prefix cache on, batched, the same", name);
    } else {
        ok(0, "%s: engine with the prefix cache", name);
    }
    nalar_engine_destroy(e);
}


/*
 * A model whose every layer slides (phi3, window 32) gives the KV blocks
 * before the window back to the pool: a 200-token generation holds at
 * most ceil(32 / 16) + 1 blocks (those the window reaches, the first of
 * them partly), and its ids are those of the same engine keeping every
 * block (nalar_engine_test_keep_kv); alone, batched, chunked, preempted,
 * with n-gram speculation and with the prefix cache, which keeps the
 * blocks it published.
 */
typedef struct {
    collected      c;
    nalar_kv_pool *kv;
    int32_t        held;      /* most blocks out of the pool at a notify */
} held_watch;


static void
held_notify(nalar_request *r, void *ctx)
{
    held_watch *w = ctx;

    collect(r, &w->c);
    if (w->kv->n_blocks - w->kv->n_free > w->held) {
        w->held = w->kv->n_blocks - w->kv->n_free;
    }
}


#define SLIDE_N  200

static int32_t
slide_alone(const char *path, int keep, const int32_t *prompt, int n_prompt,
            int32_t *ids)
{
    nalar_engine         *e = engine_x(path, 512, 0, 0, 0);
    nalar_request_params  p;
    nalar_request        *r;
    nalar_err             err;
    held_watch            w;

    if (e == NULL) {
        return -1;
    }
    nalar_engine_test_keep_kv(e, keep);
    memset(&p, 0, sizeof(p));
    memset(&w, 0, sizeof(w));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = SLIDE_N;
    p.ignore_eos = 1;
    w.kv = nalar_engine_kv(e);
    r = nalar_request_create(&p, held_notify, &w, &err);
    nalar_engine_run_sync(e, &r, 1, &err);
    memcpy(ids, w.c.ids, sizeof(int32_t) * SLIDE_N);
    nalar_request_unref(r);
    if (w.c.n != SLIDE_N || !kv_all_free(e)) {
        w.held = -1;
    }
    nalar_engine_destroy(e);
    return w.held;
}


static void
check_slide(void)
{
    char                path[128];
    nalar_mkmodel_opts  mo;
    nalar_err           err;
    nalar_engine       *e;
    nalar_metrics       mt;
    int32_t             prompts[ARCH_P][80], want[ARCH_P][ARCH_N];
    int32_t             ref[SLIDE_N], got[SLIDE_N];
    int                 len[ARCH_P] = { 40, 57, 70, 75 }, alone = 1;
    int32_t             held, bound = (32 + NALAR_KV_BLOCK - 1)
                                      / NALAR_KV_BLOCK + 1;
    int64_t             bb;

    snprintf(path, sizeof(path), "/tmp/nalar-test-slide-%d.gguf",
             (int) getpid());
    nalar_mkmodel_defaults(&mo);
    mo.dim = 64;
    mo.n_layers = 2;
    mo.n_heads = 2;
    mo.n_kv_heads = 1;
    mo.ffn_dim = 128;
    mo.arch = "phi3";
    mo.window = 32;
    mo.seed = 11;
    if (nalar_mkmodel(&mo, path, &err) != 0) {
        ok(0, "an all-sliding phi3 model: %s", err.msg);
        return;
    }
    for (int k = 0; k < ARCH_P; k++) {
        prompts[k][0] = 1;
        for (int i = 1; i < 80; i++) {
            prompts[k][i] = k == 3 && i >= 64 ? 700 + i
                            : 3 + ((k == 3 ? 2 : k) * 389 + (i % 23) * 97)
                                  % 2040;
        }
    }

    held = slide_alone(path, 1, prompts[0], len[0], ref);
    ok(held > bound, "all-sliding, every block kept: %d held", held);
    held = slide_alone(path, 0, prompts[0], len[0], got);
    ok(held > 0 && held <= bound, "all-sliding: %d tokens hold at most %d "
       "blocks (%d)", len[0] + SLIDE_N, bound, held);
    ok(held > 0 && same(got, ref, SLIDE_N),
       "all-sliding: the ids of the run that kept every block");

    e = engine_x(path, 512, 0, 0, 0);
    if (e == NULL) {
        ok(0, "all-sliding: engine");
        unlink(path);
        return;
    }
    nalar_engine_test_keep_kv(e, 1);
    for (int k = 0; k < ARCH_P; k++) {
        collected      c;
        nalar_request *r = greedy_req(prompts[k], len[k], ARCH_N, &c);

        nalar_engine_run_sync(e, &r, 1, &err);
        alone &= c.n == ARCH_N;
        memcpy(want[k], c.ids, sizeof(want[k]));
        nalar_request_unref(r);
    }
    ok(alone, "all-sliding: each prompt alone, every block kept");
    {
        const nalar_config *cf = &nalar_engine_model(e)->cfg;

        bb = 2LL * cf->n_layers * NALAR_KV_BLOCK * cf->n_kv_heads
             * cf->head_dim * 4;
    }
    nalar_engine_test_keep_kv(e, 0);
    ok(arch_run(e, prompts, len, want, 3, 0, "slide batched"),
       "all-sliding: batched with 3 others, the same");
    nalar_engine_destroy(e);

    e = engine_x(path, 5, 0, 0, 0);
    ok(arch_run(e, prompts, len, want, 2, 0, "slide chunked"),
       "all-sliding: chunked prefill (5 tokens a step), the same");
    nalar_engine_destroy(e);

    e = engine_x(path, 64, 8 * bb, 0, 0);
    ok(arch_run(e, prompts, len, want, 2, 0, "slide preempted"),
       "all-sliding: on 8 KV blocks, the same");
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.preemptions_total > 0, "all-sliding: ... with preemption "
           "(%llu)", (unsigned long long) mt.preemptions_total);
    }
    nalar_engine_destroy(e);

    e = engine_x(path, 512, 0, 0, NALAR_SPEC_NGRAM);
    ok(arch_run(e, prompts, len, want, 0, 0, "slide n-gram"),
       "all-sliding: with n-gram speculation, the same");
    nalar_engine_destroy(e);

    e = engine_x(path, 512, 0, 1, 0);
    ok(arch_run(e, prompts, len, want, 0, 1, "slide cache")
       && arch_run(e, prompts, len, want, 1, 1, "slide cache hits"),
       "all-sliding: prefix cache on, twice, the same");
    if (e != NULL) {
        nalar_engine_metrics(e, &mt);
        ok(mt.prefix_hits_total >= 64, "all-sliding: ... %llu prompt "
           "tokens from the cache", (unsigned long long) mt.prefix_hits_total);
    }
    nalar_engine_destroy(e);
    unlink(path);
}


/* The activations' mode enters the prefix cache's root digest: an engine
 * with int16 activations (or pair multipliers) never serves KV computed
 * with F32 ones, nor the reverse, nor each other's; the same mode gives
 * the same root */
static void
test_act_identity(const char *path)
{
    static const int mode[] = { NALAR_ACT_F32, NALAR_ACT_I16,
                                NALAR_ACT_F32, NALAR_ACT_PAIRS };
    uint8_t       root[4][32];
    int           got = 0;
    nalar_err     err;
    nalar_engine *e;

    for (int i = 0; i < 4; i++) {
        nalar_engine_opts o;

        memset(&o, 0, sizeof(o));
        o.model_path = path;
        o.n_threads = 1;
        o.prefix_cache = 1;
        o.act_i16 = mode[i];
        e = nalar_engine_create(&o, &err);
        if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
            diag("engine: %s", err.msg);
        } else {
            got += nalar_engine_test_prefix_root(e, "", root[i]) == 0;
        }
        nalar_engine_destroy(e);
    }
    ok(got == 4 && memcmp(root[0], root[1], 32) != 0
       && memcmp(root[0], root[2], 32) == 0, "int16 activations: another "
       "prefix-cache root digest than F32's; F32 twice: the same");
    ok(got == 4 && memcmp(root[3], root[0], 32) != 0
       && memcmp(root[3], root[1], 32) != 0, "pair multipliers: another "
       "root digest than F32's and int16's");
}


int
main(void)
{
    /* the file, its architecture, the sliding window of its draft */
    static const struct {
        const char *name, *arch;
        int         window;
    } archs[] = {
        { "llama3-F32", "llama", 0 }, { "qwen2-F16", "qwen2", 0 },
        { "qwen3-F16", "qwen3", 0 }, { "gemma2-F16", "gemma2", 32 },
        { "phi3-F16", "phi3", 32 },
    };

    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        check_arch(archs[i].name, archs[i].arch, archs[i].window);
    }
    check_slide();
    test_act_identity("t/data/conformance/llama3-Q8_0.gguf");
    return done_testing();
}
