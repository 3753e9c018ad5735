/*
 * LoRA adapters in the engine: an adapter applied at run time equals the
 * merged model file (`nalar mkmodel --merge`) for every architecture of the
 * conformance kit, in F16 and Q4_K_M; sequences over several adapters
 * batched together equal each run alone; speculation under an adapter
 * equals plain decoding under it; the prefix cache keeps adapters apart;
 * a bad adapter id is refused; the per-adapter counters count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "lora.h"
#include "mkmodel.h"
#include "model.h"
#include "tap.h"

static char dir[64];

#define MAXN 64

/* one request's output: ids and each token's logprob */
typedef struct {
    int32_t      ids[MAXN];
    float        lp[MAXN];
    int          n;
    int32_t      cached;
    nalar_finish finish;
} got;


static void
take(nalar_request *r, void *ctx)
{
    got          *g = ctx;
    nalar_output  o;

    nalar_request_take(r, &o);
    for (int i = 0; i < o.n_ids && g->n < MAXN; i++) {
        g->lp[g->n] = o.logprobs != NULL ? o.logprobs[i].logprob : NAN;
        g->ids[g->n++] = o.ids[i];
    }
    g->cached = o.usage.n_cached;
    if (o.finish != NALAR_FINISH_NONE) {
        g->finish = o.finish;
    }
    nalar_output_free(&o);
}


static nalar_engine *
engine(const char *model, const nalar_engine_lora *l, int n, int cache,
       const char *draft, int spec)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = model;
    o.loras = l;
    o.n_loras = n;
    o.prefix_cache = cache;
    o.n_threads = 2;
    o.max_batch_tokens = 256;
    o.draft_path = draft;
    o.spec_mode = spec;
    o.spec_max_k = 4;
    o.spec_fixed_k = spec != 0 ? 3 : 0;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine %s: %s", model, err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


static void
req_params(nalar_request_params *p, const int32_t *prompt, int n_prompt,
           int n, int adapter)
{
    memset(p, 0, sizeof(*p));
    nalar_sampling_default(&p->sampling);
    p->sampling.temperature = 0;
    p->prompt = prompt;
    p->n_prompt = n_prompt;
    p->max_tokens = n;
    p->ignore_eos = 1;
    p->logprobs = 1;
    p->adapter = adapter;
}


/* Requests (params ps[0 .. n)) run together; outputs into gs. */
static int
run_all(nalar_engine *e, const nalar_request_params *ps, int n, got *gs)
{
    nalar_request *r[32];
    nalar_err      err;
    int            rc = 0;

    for (int i = 0; i < n; i++) {
        memset(&gs[i], 0, sizeof(gs[i]));
        r[i] = nalar_request_create(&ps[i], take, &gs[i], &err);
    }
    if (nalar_engine_run_sync(e, r, n, &err) != 0) {
        diag("run: %s", err.msg);
        rc = -1;
    }
    for (int i = 0; i < n; i++) {
        take(r[i], &gs[i]);
        rc |= gs[i].finish != NALAR_FINISH_LENGTH ? -1 : 0;
        nalar_request_unref(r[i]);
    }
    return rc;
}


static int32_t
prompt_token(int s, int i, int32_t V)
{
    return 3 + (s * 131 + i * 37 + 11) % (V - 3);
}


static double
lp_diff(const got *a, const got *b)
{
    double d = 0;

    for (int i = 0; i < a->n && i < b->n; i++) {
        double e = fabs((double) a->lp[i] - b->lp[i]);

        d = e > d ? e : d;
    }
    return d;
}


/* ---- the merged file ---- */

/* Logits of every position of a prompt through a backend (the adapter
 * attached as id 1 and used when a != NULL): (n, V) into out. */
static int
prompt_logits(nalar_model *m, const nalar_lora *a, int32_t *tok,
              int n, float *out)
{
    nalar_backend_opts bo;
    nalar_backend     *be;
    nalar_kv_pool      kv;
    nalar_seq_kv       s, *seq[32];
    nalar_batch        b;
    int32_t            pos[32], ad[32];
    int8_t             want[32];
    nalar_err          err;
    int                rc = -1;

    memset(&bo, 0, sizeof(bo));
    bo.name = "cpu";
    bo.n_threads = 2;
    be = nalar_backend_create(m, &bo, &err);
    if (be == NULL || nalar_kv_pool_init(&kv, 4, m->cfg.n_layers,
                                         m->cfg.n_kv_heads
                                         * m->cfg.head_dim, &err) != 0)
    {
        diag("backend: %s", err.msg);
        if (be != NULL) {
            be->destroy(be);
        }
        return -1;
    }
    if (be->kv_alloc(be, &kv, &err) == 0
        && (a == NULL || be->lora_attach(be, 1, a, &err) == 0))
    {
        nalar_seq_kv_init(&s);
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            seq[i] = &s;
            want[i] = 1;
            ad[i] = 1;
        }
        b.n_tokens = n;
        b.tokens = tok;
        b.pos = pos;
        b.seq = seq;
        b.want_logits = want;
        b.n_logits = n;
        b.adapter = a != NULL ? ad : NULL;
        if (nalar_seq_kv_reserve(&kv, &s, n) == 0
            && be->forward(be, &kv, &b, out, &err) == 0)
        {
            rc = 0;
        } else {
            diag("forward: %s", err.msg);
        }
        nalar_seq_kv_release(&kv, &s);
        be->kv_free(be, &kv);
    } else {
        diag("kv/attach: %s", err.msg);
    }
    nalar_kv_pool_free(&kv);
    be->destroy(be);
    return rc;
}


static double
max_abs(const float *a, const float *b, size_t n)
{
    double d = 0;

    for (size_t i = 0; i < n; i++) {
        double e = fabs((double) a[i] - b[i]);

        d = e > d ? e : d;
    }
    return d;
}


/*
 * One conformance file: a random adapter (F16 at rank 8 on an F16 base,
 * Q8_0 at rank 32 on a block-quantized one) and the merged file.  Logits
 * of a 24-token prompt, run time vs merged, within the kit's tolerance for
 * the base's type; greedy ids through the engine equal.
 */
static void
check_merged(const char *name, const char *type, double tol)
{
    char              base[128], ad[128], mg[128];
    nalar_mklora_opts o;
    nalar_err         err;
    nalar_model      *m = NULL, *mm = NULL;
    nalar_lora       *a = NULL;
    float            *z_rt = NULL, *z_mg = NULL, *z_b = NULL;
    int32_t           tok[24];
    int               q = strcmp(type, "F16") != 0;
    size_t            nz;

    snprintf(base, sizeof(base), "t/data/conformance/%s-%s.gguf", name,
             type);
    snprintf(ad, sizeof(ad), "%s/%s-%s.lora.gguf", dir, name, type);
    snprintf(mg, sizeof(mg), "%s/%s-%s.merged.gguf", dir, name, type);
    memset(&o, 0, sizeof(o));
    o.base = base;
    o.rank = q ? 32 : 8;
    o.type = q ? GGML_Q8_0 : GGML_F16;
    o.seed = 11;
    if (nalar_mkmodel_lora(&o, ad, &err) != 0
        || nalar_mkmodel_merge(base, ad, 1, mg, &err) != 0)
    {
        ok(0, "%s %s: adapter and merged file: %s", name, type, err.msg);
        return;
    }
    m = nalar_model_load(base, &err);
    mm = m != NULL ? nalar_model_load(mg, &err) : NULL;
    a = mm != NULL ? nalar_lora_load(m, "a", ad, 1, &err) : NULL;
    if (a == NULL) {
        ok(0, "%s %s: load: %s", name, type, err.msg);
        goto done;
    }
    for (int i = 0; i < 24; i++) {
        tok[i] = prompt_token(1, i, m->cfg.n_vocab);
    }
    nz = (size_t) 24 * m->cfg.n_vocab;
    z_rt = malloc(nz * sizeof(float));
    z_mg = malloc(nz * sizeof(float));
    z_b = malloc(nz * sizeof(float));
    if (prompt_logits(m, a, tok, 24, z_rt) != 0
        || prompt_logits(mm, NULL, tok, 24, z_mg) != 0
        || prompt_logits(m, NULL, tok, 24, z_b) != 0)
    {
        ok(0, "%s %s: forward passes", name, type);
        goto done;
    }
    ok(max_abs(z_b, z_mg, nz) > 4 * tol, "%s %s: the adapter moves the "
       "logits (by %.3g)", name, type, max_abs(z_b, z_mg, nz));
    ok(max_abs(z_rt, z_mg, nz) <= tol, "%s %s: logits at run time within "
       "%.3g of the merged file's (off by %.3g)", name, type, tol,
       max_abs(z_rt, z_mg, nz));
    {
        nalar_engine_lora    l = { "a", ad, 1 };
        nalar_engine        *e1 = engine(base, &l, 1, 0, NULL, 0);
        nalar_engine        *e2 = engine(mg, NULL, 0, 0, NULL, 0);
        nalar_request_params p;
        got                  g1, g2;

        req_params(&p, tok, 8, 24, 1);
        if (e1 == NULL || e2 == NULL || run_all(e1, &p, 1, &g1) != 0) {
            ok(0, "%s %s: engines", name, type);
        } else {
            p.adapter = 0;
            ok(run_all(e2, &p, 1, &g2) == 0 && g1.n == 24
               && memcmp(g1.ids, g2.ids, sizeof(g1.ids)) == 0,
               "%s %s: 24 greedy ids under the adapter equal the merged "
               "file's", name, type);
        }
        nalar_engine_destroy(e1);
        nalar_engine_destroy(e2);
    }
done:
    free(z_rt);
    free(z_mg);
    free(z_b);
    nalar_lora_destroy(a);
    nalar_model_destroy(mm);
    nalar_model_destroy(m);
}


/* ---- mixed batches, the cache, refusals, counters ---- */

#define N_AD 4

static char adapters[N_AD][128];

static void
make_adapters(const char *base)
{
    for (int i = 0; i < N_AD; i++) {
        nalar_mklora_opts o;
        nalar_err         err;

        memset(&o, 0, sizeof(o));
        o.base = base;
        o.rank = 4 + 4 * i;
        o.type = i % 2 ? GGML_F16 : GGML_F32;
        o.seed = 100 + (uint64_t) i;
        o.targets = i == 3 ? "q,v,down" : NULL;
        snprintf(adapters[i], sizeof(adapters[i]), "%s/ad%d.gguf", dir, i);
        if (nalar_mkmodel_lora(&o, adapters[i], &err) != 0) {
            diag("adapter %d: %s", i, err.msg);
        }
    }
}


/*
 * 16 sequences over the base and four adapters, in one engine at once,
 * equal each run alone, ids and logprobs bit for bit: the CPU backend
 * keeps a token's numbers independent of the rest of its pass (the base
 * products and the adapters' alike, cpu_lora.c), and the test's engines
 * run in F32 activations.
 */
static void
check_mixed(const char *base)
{
    nalar_engine_lora    l[N_AD];
    nalar_engine        *e;
    nalar_request_params ps[16];
    int32_t              prompts[16][20];
    got                  together[16], alone;
    int                  ids_ok = 1, diff_ad = 0;
    double               d = 0;

    for (int i = 0; i < N_AD; i++) {
        l[i].name = adapters[i];
        l[i].path = adapters[i];
        l[i].scale = i == 2 ? 0.5 : 1;
    }
    e = engine(base, l, N_AD, 0, NULL, 0);
    if (e == NULL) {
        ok(0, "mixed: engine");
        return;
    }
    for (int s = 0; s < 16; s++) {
        for (int i = 0; i < 20; i++) {
            prompts[s][i] = prompt_token(s % 3, i, 2048);
        }
        /* prompts by s % 3, adapters by s % 5: each prompt meets
         * several adapters */
        req_params(&ps[s], prompts[s], 12 + 2 * (s % 3), 16,
                   s % (N_AD + 1));
    }
    ok(run_all(e, ps, 16, together) == 0, "16 sequences over 4 adapters "
       "and the base run together");
    for (int s = 0; s < 16; s++) {
        if (run_all(e, &ps[s], 1, &alone) != 0
            || memcmp(alone.ids, together[s].ids, sizeof(alone.ids)) != 0)
        {
            ids_ok = 0;
            diag("sequence %d (adapter %d) differs", s, ps[s].adapter);
        }
        d = lp_diff(&alone, &together[s]) > d ? lp_diff(&alone, &together[s])
                                               : d;
    }
    ok(ids_ok, "each sequence's ids batched equal its ids alone");
    ok(d == 0 && isfinite(together[0].lp[0]) && together[0].lp[0] < 0,
       "each token's logprob batched equals its logprob alone (off by "
       "%.3g)", d);
    /* s = 0, 3, 6, 9, 12: one prompt under the base and adapters 3, 1,
     * 4, 2: each must give other ids than the base, or the test proves
     * nothing */
    diff_ad = 1;
    for (int s = 3; s < 15; s += 3) {
        diff_ad &= memcmp(together[s].ids, together[0].ids,
                          sizeof(together[0].ids)) != 0;
    }
    ok(diff_ad, "one prompt under each adapter gives other ids than the "
       "base");
    nalar_engine_destroy(e);
}


static void
check_cache_and_counters(const char *base)
{
    nalar_engine_lora    l[2] = { { "a", adapters[0], 1 },
                                  { "b", adapters[1], 1 } };
    nalar_engine        *e = engine(base, l, 2, 1, NULL, 0);
    nalar_request_params p;
    nalar_request       *r;
    nalar_lora_metrics   lm[3];
    nalar_err            err;
    int32_t              prompt[80];
    got                  g[5];

    if (e == NULL) {
        ok(0, "cache: engine");
        return;
    }
    for (int i = 0; i < 80; i++) {
        prompt[i] = prompt_token(7, i, 2048);
    }
    req_params(&p, prompt, 80, 4, 1);
    run_all(e, &p, 1, &g[0]);
    run_all(e, &p, 1, &g[1]);
    p.adapter = 2;
    run_all(e, &p, 1, &g[2]);
    p.adapter = 0;
    run_all(e, &p, 1, &g[3]);
    p.adapter = 2;
    run_all(e, &p, 1, &g[4]);
    is_int(g[0].cached, 0, "first request under adapter a: nothing cached");
    ok(g[1].cached >= 64, "the same prompt under a again hits (%d cached)",
       g[1].cached);
    is_int(g[2].cached, 0, "the same prompt under adapter b: 0 cached");
    is_int(g[3].cached, 0, "the same prompt on the base: 0 cached");
    ok(g[4].cached >= 64, "under b again hits (%d cached)", g[4].cached);

    p.adapter = 3;
    r = nalar_request_create(&p, NULL, NULL, &err);
    ok(nalar_engine_run_sync(e, &r, 1, &err) != 0
       && strstr(err.msg, "adapter 3 is not one of the engine's") != NULL,
       "adapter 3 of 2 refused: %s", err.msg);
    /* the caller's mistake, not a busy server (the glue answers 500) */
    is_int(nalar_engine_submit(e, r, &err), NALAR_SUBMIT_INVALID,
           "submit refuses adapter 3 of 2 as invalid, not busy");
    nalar_request_unref(r);
    p.adapter = -1;
    r = nalar_request_create(&p, NULL, NULL, &err);
    ok(nalar_engine_run_sync(e, &r, 1, &err) != 0, "adapter -1 refused");
    nalar_request_unref(r);

    for (int i = 0; i < 3; i++) {
        nalar_engine_lora_metrics(e, i, &lm[i]);
    }
    ok(lm[0].requests_total == 1 && lm[1].requests_total == 2
       && lm[2].requests_total == 2, "requests by adapter: base 1, a 2, "
       "b 2 (refusals not counted)");
    ok(lm[1].prompt_tokens_total == 160 && lm[2].generation_tokens_total
       == 8 && lm[0].generation_tokens_total == 4, "prompt and generated "
       "tokens counted by adapter");
    ok(nalar_engine_lora_metrics(e, 3, &lm[0]) == -1
       && nalar_engine_lora_metrics(e, -1, &lm[0]) == -1,
       "counters of no adapter: -1");
    memset(&err, 0, sizeof(err));
    ok(nalar_kv_check(nalar_engine_kv(e), &err) == 0, "the KV pool's "
       "invariants hold %s", err.msg);
    nalar_engine_destroy(e);
}


/*
 * The shared prefix (an operator's, in the global scope every tenant
 * reuses) is keyed by the adapter too: under one adapter it crosses
 * tenants, under another adapter or the base it serves nothing.
 */
static void
check_shared_prefix(const char *base)
{
    nalar_engine_lora    l[2] = { { "a", adapters[0], 1 },
                                  { "b", adapters[1], 1 } };
    nalar_engine        *e = engine(base, l, 2, 1, NULL, 0);
    nalar_request_params p;
    int32_t              prompt[80];
    got                  g[5];

    if (e == NULL) {
        ok(0, "shared prefix: engine");
        return;
    }
    for (int i = 0; i < 80; i++) {
        prompt[i] = prompt_token(9, i, 2048);
    }
    req_params(&p, prompt, 80, 4, 1);
    p.shared_prefix = prompt;
    p.n_shared_ids = 64;
    p.cache_scope = "t1";
    run_all(e, &p, 1, &g[0]);
    p.cache_scope = "t2";
    run_all(e, &p, 1, &g[1]);
    p.adapter = 2;
    run_all(e, &p, 1, &g[2]);
    p.adapter = 0;
    run_all(e, &p, 1, &g[3]);
    p.adapter = 2;
    p.cache_scope = "t1";
    run_all(e, &p, 1, &g[4]);
    is_int(g[0].cached, 0, "shared prefix, tenant 1 under a: nothing cached");
    is_int(g[1].cached, 64, "tenant 2 under a: the 64 shared tokens");
    is_int(g[2].cached, 0, "tenant 2 under b: 0 cached");
    is_int(g[3].cached, 0, "tenant 2 on the base: 0 cached");
    is_int(g[4].cached, 64, "tenant 1 under b: b's 64 shared tokens");
    nalar_engine_destroy(e);
}


/* ---- speculation ---- */

static void
check_spec(void)
{
    static const char *T = "models/nalar-kjv-target-f32.gguf";
    static const char *D = "models/nalar-kjv-draft-f32.gguf";
    nalar_mklora_opts  o;
    nalar_err          err;
    char               ad[128];
    nalar_engine_lora  l;
    nalar_engine      *plain, *draft, *ngram;
    nalar_request_params p;
    int32_t            prompt[16];
    got                ref, base, g;

    memset(&o, 0, sizeof(o));
    o.base = T;
    o.rank = 8;
    o.type = GGML_F32;
    o.seed = 5;
    o.alpha = 2;     /* s_eff 1/4, B four times larger: the same change */
    snprintf(ad, sizeof(ad), "%s/kjv.gguf", dir);
    if (nalar_mkmodel_lora(&o, ad, &err) != 0) {
        ok(0, "spec adapter: %s", err.msg);
        return;
    }
    l.name = "k";
    l.path = ad;
    l.scale = 1;
    plain = engine(T, &l, 1, 0, NULL, 0);
    draft = engine(T, &l, 1, 0, D, NALAR_SPEC_DRAFT);
    ngram = engine(T, &l, 1, 0, NULL, NALAR_SPEC_NGRAM);
    if (plain == NULL || draft == NULL || ngram == NULL) {
        ok(0, "spec: engines");
        goto done;
    }
    for (int i = 0; i < 16; i++) {
        prompt[i] = 10 + (i * 7) % 50;
    }
    req_params(&p, prompt, 16, 40, 1);
    p.logprobs = 0;
    run_all(plain, &p, 1, &ref);
    p.adapter = 0;
    run_all(plain, &p, 1, &base);
    ok(memcmp(ref.ids, base.ids, sizeof(ref.ids)) != 0, "the adapter "
       "changes the target's greedy output");
    p.adapter = 1;
    ok(run_all(draft, &p, 1, &g) == 0
       && memcmp(g.ids, ref.ids, sizeof(ref.ids)) == 0,
       "draft speculation under the adapter equals plain decoding under "
       "it");
    {
        nalar_metrics mt;

        nalar_engine_metrics(draft, &mt);
        ok(mt.spec_draft_tokens_total > 0, "the draft's proposals were "
           "verified (%llu)",
           (unsigned long long) mt.spec_draft_tokens_total);
    }
    ok(run_all(ngram, &p, 1, &g) == 0
       && memcmp(g.ids, ref.ids, sizeof(ref.ids)) == 0,
       "n-gram speculation under the adapter equals plain decoding");
    /* predictions: the adapter's own output (accepted) and the base's
     * (rejected where they differ): verification runs under the adapter */
    p.prediction = ref.ids;
    p.n_prediction = ref.n;
    {
        nalar_metrics m0, m1;

        nalar_engine_metrics(ngram, &m0);
        ok(run_all(ngram, &p, 1, &g) == 0
           && memcmp(g.ids, ref.ids, sizeof(ref.ids)) == 0,
           "with its own output as the prediction: the same");
        nalar_engine_metrics(ngram, &m1);
        ok(m1.spec_accepted_tokens_total - m0.spec_accepted_tokens_total
           >= 20, "and most of the prediction was accepted under the "
           "adapter (%llu)", (unsigned long long)
           (m1.spec_accepted_tokens_total - m0.spec_accepted_tokens_total));
    }
    p.prediction = base.ids;
    p.n_prediction = base.n;
    ok(run_all(ngram, &p, 1, &g) == 0
       && memcmp(g.ids, ref.ids, sizeof(ref.ids)) == 0,
       "with the base model's output as the prediction: still the "
       "adapter's");
done:
    nalar_engine_destroy(plain);
    nalar_engine_destroy(draft);
    nalar_engine_destroy(ngram);
}


int
main(int argc, char **argv)
{
    static const struct { const char *name; } arch[] = {
        { "llama" }, { "llama3" }, { "qwen2" }, { "qwen3" }, { "gemma2" },
        { "phi3" },
    };

    (void) argc;
    (void) argv;
    snprintf(dir, sizeof(dir), "/tmp/nalar-lora-e-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        ok(0, "mkdtemp");
        return done_testing();
    }
    for (size_t i = 0; i < sizeof(arch) / sizeof(arch[0]); i++) {
        check_merged(arch[i].name, "F16", 0.027);
        check_merged(arch[i].name, "Q4_K_M", 0.65);
    }
    make_adapters("t/data/conformance/llama-F16.gguf");
    check_mixed("t/data/conformance/llama-F16.gguf");
    check_cache_and_counters("t/data/conformance/llama-F16.gguf");
    check_shared_prefix("t/data/conformance/llama-F16.gguf");
    check_spec();
    {
        char cmd[96];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) {
            diag("could not remove %s", dir);
        }
    }
    return done_testing();
}
