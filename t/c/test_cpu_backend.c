/*
 * The CPU backend's batch invariance, bit for bit: the logits of a token at
 * a position are the same floats whether the token is computed alone, in a
 * prefill chunk of its sequence, or in a batch mixed with another
 * sequence's tokens -- whatever attention tiles (KV-group heads and
 * consecutive tokens sharing each key and value load) the pass forms.
 * Greedy speculative decoding equal to plain decoding rests on this.  Run
 * for head layouts that tile differently (tiles of up to 8 rows for heads
 * of up to 32, 4 rows for larger ones): 2 heads of 32 per KV head (tiles of
 * 4 tokens), 1 head of 16 (8 tokens), 4 heads of 16 (2 tokens), 1 head of
 * 64 (4 tokens), and a head of 128 (rows attended one at a time).  A
 * pass of two tokens or more runs split by weight rows or by token (each
 * thread the whole model over its own tokens); the backend measures both
 * ways alternately for its first passes of each size, so every pooled
 * check here runs both (breaking either one fails them).  Quantized
 * models again with 16-bit and with 8-bit activations (each thread rounds
 * its normalised input once for the products that read it), and with seven
 * other sequences decoded alongside (a pass of short runs: Q, K and V
 * split by token), where the sequence checked is the last thread's.
 * Every float model again with an F16 and with a BF16 KV cache (keys and
 * values rounded once when stored, widened in attention: the same
 * invariance, and logits other than the F32 cache's), heads of 24 among
 * them (values summed one at a time), and the quantized ones with 16-bit
 * activations and a 16-bit KV cache (the stores' rounding and the loads'
 * widening on each instruction set: test_kv16).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_backend.h"
#include "clock.h"
#include "kv.h"
#include "mkmodel.h"
#include "model.h"
#include "tap.h"

#define N_POS  70
#define MAXB   96

static int act_i16;     /* the backends opened take 16-bit (NALAR_ACT_I16),
                           8-bit (NALAR_ACT_Q8) or pair-multiplier
                           (NALAR_ACT_PAIRS) activations */
static ggml_type kv_type; /* and keep their KV cache in this type */
static int per32_model;   /* the model's matrices all read x per 32 */


typedef struct {
    nalar_model   *m;
    nalar_backend *be;
    nalar_kv_pool  kv;
    int32_t        V;
} rig;


static int
rig_open(rig *g, const char *path, int threads)
{
    nalar_err err;

    memset(g, 0, sizeof(*g));
    g->m = nalar_model_load(path, &err);
    if (g->m == NULL) {
        diag("%s", err.msg);
        return -1;
    }
    g->V = g->m->cfg.n_vocab;
    g->be = nalar_cpu_backend_create(g->m, threads, &err);
    if (g->be != NULL) {
        g->be->kv_type = kv_type;
    }
    if (g->be == NULL
        || nalar_kv_pool_init(&g->kv, 64, g->m->cfg.n_layers,
                              g->m->cfg.n_kv_heads * g->m->cfg.head_dim,
                              &err) != 0
        || g->be->kv_alloc(g->be, &g->kv, &err) != 0)
    {
        diag("%s", err.msg);
        return -1;
    }
    nalar_cpu_backend_act_i16(g->be, act_i16);
    return 0;
}


static void
rig_close(rig *g)
{
    g->be->kv_free(g->be, &g->kv);
    nalar_kv_pool_free(&g->kv);
    g->be->destroy(g->be);
    nalar_model_destroy(g->m);
}


static int32_t
token_at(int32_t p, int32_t V)
{
    return 3 + (p * 37 + 11) % (V - 3);
}


/*
 * Feed positions 0..N_POS-1 of sequence s with pass sizes from `sizes`
 * (cycled); when `other` is set, each pass also carries the next position
 * of that second sequence (interleaved before and after s's tokens).
 * Logits of every s position go to out (N_POS, V).
 */
static int
feed(rig *g, const int *sizes, int n_sizes, int mixed, float *out)
{
    nalar_seq_kv  s, o;
    int32_t       tok[MAXB], pos[MAXB];
    int8_t        want[MAXB];
    nalar_seq_kv *seq[MAXB];
    int32_t       mine[MAXB];
    float        *logits = nalar_alloc_lines((size_t) MAXB * g->V
                                             * sizeof(float));
    nalar_err     err;
    int           rc = 0, pi = 0;
    int32_t       p = 0, po = 0;

    nalar_seq_kv_init(&s);
    nalar_seq_kv_init(&o);
    if (logits == NULL || nalar_seq_kv_reserve(&g->kv, &s, N_POS) != 0
        || nalar_seq_kv_reserve(&g->kv, &o, N_POS * 2) != 0)
    {
        free(logits);
        return -1;
    }
    while (p < N_POS) {
        int32_t     n = sizes[pi++ % n_sizes], nt = 0, nl = 0;
        nalar_batch b;

        n = n < N_POS - p ? n : N_POS - p;
        if (mixed && pi % 2) {
            tok[nt] = token_at(po + 500, g->V); pos[nt] = po++;
            seq[nt] = &o; want[nt] = 0; mine[nt++] = -1;
        }
        for (int32_t i = 0; i < n; i++) {
            tok[nt] = token_at(p, g->V); pos[nt] = p;
            seq[nt] = &s; want[nt] = 1; mine[nt++] = p++;
        }
        if (mixed) {
            tok[nt] = token_at(po + 500, g->V); pos[nt] = po++;
            seq[nt] = &o; want[nt] = 1; mine[nt++] = -1;
        }
        for (int32_t i = 0; i < nt; i++) {
            nl += want[i];
        }
        b.n_tokens = nt; b.tokens = tok; b.pos = pos; b.seq = seq;
        b.want_logits = want; b.n_logits = nl; b.adapter = NULL;
        if (g->be->forward(g->be, &g->kv, &b, logits, &err) != 0) {
            diag("forward: %s", err.msg);
            rc = -1;
            break;
        }
        for (int32_t i = 0, li = 0; i < nt; i++) {
            if (!want[i]) {
                continue;
            }
            if (mine[i] >= 0) {
                memcpy(out + (size_t) mine[i] * g->V,
                       logits + (size_t) li * g->V, g->V * sizeof(float));
            }
            li++;
        }
    }
    nalar_seq_kv_release(&g->kv, &s);
    nalar_seq_kv_release(&g->kv, &o);
    free(logits);
    return rc;
}


/* s's positions one per pass, each pass first one token of each of
 * n_other (< MAXB) other sequences, each its own tokens */
static int
feed_many(rig *g, int n_other, float *out)
{
    nalar_seq_kv  s[MAXB];
    int32_t       tok[MAXB], pos[MAXB];
    int8_t        want[MAXB];
    nalar_seq_kv *seq[MAXB];
    float        *logits = nalar_alloc_lines((size_t) MAXB * g->V
                                             * sizeof(float));
    nalar_err     err;
    int           rc = 0;

    for (int i = 0; i <= n_other; i++) {
        nalar_seq_kv_init(&s[i]);
    }
    for (int i = 0; i <= n_other && logits != NULL; i++) {
        if (nalar_seq_kv_reserve(&g->kv, &s[i], N_POS) != 0) {
            rc = -1;
        }
    }
    for (int32_t p = 0; p < N_POS && rc == 0 && logits != NULL; p++) {
        nalar_batch b;

        for (int i = 0; i <= n_other; i++) {
            tok[i] = token_at(i < n_other ? p + 100 * (i + 1) : p, g->V);
            pos[i] = p;
            seq[i] = &s[i == n_other ? 0 : i + 1];
            want[i] = i == n_other;
        }
        b.n_tokens = n_other + 1; b.tokens = tok; b.pos = pos; b.seq = seq;
        b.want_logits = want; b.n_logits = 1; b.adapter = NULL;
        if (g->be->forward(g->be, &g->kv, &b, logits, &err) != 0) {
            diag("forward: %s", err.msg);
            rc = -1;
            break;
        }
        memcpy(out + (size_t) p * g->V, logits, g->V * sizeof(float));
    }
    for (int i = 0; i <= n_other; i++) {
        nalar_seq_kv_release(&g->kv, &s[i]);
    }
    free(logits);
    return logits == NULL ? -1 : rc;
}


static void
check_model(const char *path, const char *name)
{
    static const int one[] = { 1 }, chunk[] = { 33, 37 },
                     verify[] = { 5, 1, 9, 3, 2, 4 };
    static const struct { const int *s; int n, mixed, threads;
                          const char *what; } ways[] = {
        { chunk, 2, 0, 2, "prefill chunks of 33 and 37" },
        { verify, 6, 0, 2, "passes of 5, 1, 9, 3, 2, 4 tokens" },
        { verify, 6, 1, 2, "the same mixed with another sequence" },
        { chunk, 2, 1, 1, "chunks, mixed, one thread" },
        { NULL, 0, 7, 2, "each pass with seven other sequences' tokens" },
    };
    rig    g;
    float *ref, *got;

    if (rig_open(&g, path, 2) != 0) {
        ok(0, "%s: model and backend", name);
        return;
    }
    ref = malloc((size_t) N_POS * g.V * sizeof(float));
    got = malloc((size_t) N_POS * g.V * sizeof(float));
    ok(ref != NULL && got != NULL && feed(&g, one, 1, 0, ref) == 0,
       "%s: one token per pass", name);
    if (kv_type != GGML_F32 && got != NULL) {
        rig       h;
        int       differ = 0;
        ggml_type t = kv_type;

        /* the KV type is in effect: an F32 KV cache gives other logits */
        kv_type = GGML_F32;
        if (rig_open(&h, path, 2) == 0) {
            differ = feed(&h, one, 1, 0, got) == 0
                     && memcmp(ref, got, (size_t) N_POS * g.V
                                         * sizeof(float)) != 0;
            rig_close(&h);
        }
        kv_type = t;
        ok(differ, "%s: an F32 KV cache gives other logits", name);
    }
    /* the mode is in effect: F32 activations give other logits, and
     * (pair multipliers, whose x' the 16-bit kernels compute) so do
     * 16-bit ones, but for a model whose matrices all read x per 32
     * (Q8_0), where the pairs mode takes the 16-bit codes: the same */
    for (int other = 0; act_i16 && got != NULL && other <= NALAR_ACT_I16;
         other++)
    {
        rig h;
        int differ = 0, mode = act_i16;

        if (other == NALAR_ACT_I16 && mode != NALAR_ACT_PAIRS) {
            break;
        }
        act_i16 = other;
        if (rig_open(&h, path, 2) == 0) {
            int ran = feed(&h, one, 1, 0, got) == 0;

            differ = ran && memcmp(ref, got, (size_t) N_POS * g.V
                                             * sizeof(float)) != 0;
            if (other == NALAR_ACT_I16 && per32_model) {
                differ = ran && !differ;
            }
            rig_close(&h);
        }
        act_i16 = mode;
        ok(differ, "%s: %s activations give %s logits", name,
           nalar_act_name(other),
           other == NALAR_ACT_I16 && per32_model ? "the same" : "other");
    }
    for (size_t w = 0; w < sizeof(ways) / sizeof(ways[0]); w++) {
        rig     h;
        int32_t bad = -1;

        if (rig_open(&h, path, ways[w].threads) != 0) {
            ok(0, "%s: backend", name);
            continue;
        }
        memset(got, 0, (size_t) N_POS * g.V * sizeof(float));
        if ((ways[w].n > 0 ? feed(&h, ways[w].s, ways[w].n, ways[w].mixed,
                                  got)
                           : feed_many(&h, ways[w].mixed, got)) != 0)
        {
            bad = -2;
        }
        for (int32_t p = 0; p < N_POS && bad == -1; p++) {
            if (memcmp(ref + (size_t) p * g.V, got + (size_t) p * g.V,
                       g.V * sizeof(float)) != 0)
            {
                bad = p;
            }
        }
        ok(bad == -1, "%s: %s: logits bit-identical at all %d positions%s",
           name, ways[w].what, N_POS,
           bad >= 0 ? " (first difference at a position)" : "");
        if (bad >= 0) {
            diag("first difference at position %d", bad);
        }
        rig_close(&h);
    }
    free(ref);
    free(got);
    rig_close(&g);
}


/*
 * A worker that is slow to run (a busy machine deschedules it) makes every
 * pooled pass wait for it at its barriers; the backend then runs its
 * one-token passes on the calling thread alone, with the same bits.  The
 * stall is 3 ms, or four times a pass on one thread where that is longer
 * (a slow build or a busy machine), so that a pooled pass stays the
 * slower way whatever this machine's speed.
 */
static void
check_stalled_worker(const char *path)
{
    static const int one[] = { 1 };
    rig       g, h;
    float    *ref, *got;
    uint64_t  solo;
    int       same, stall_us;
    double    t0, pass_us = 0;

    if (rig_open(&g, path, 1) != 0 || rig_open(&h, path, 2) != 0) {
        ok(0, "stalled worker: backends");
        return;
    }
    ref = malloc((size_t) N_POS * g.V * sizeof(float));
    got = malloc((size_t) N_POS * g.V * sizeof(float));
    t0 = nalar_now_s();
    if (ref != NULL && feed(&g, one, 1, 0, ref) == 0) {
        pass_us = (nalar_now_s() - t0) * 1e6 / N_POS;
    }
    stall_us = 4 * pass_us > 3000 ? (int) (4 * pass_us) : 3000;
    nalar_cpu_backend_test_stall(h.be, stall_us);
    ok(ref != NULL && got != NULL && pass_us > 0
       && feed(&h, one, 1, 0, got) == 0,
       "stalled worker: %d passes (one thread's: %.0f us each; stall %d us)",
       N_POS, pass_us, stall_us);
    same = ref != NULL && got != NULL
           && memcmp(ref, got, (size_t) N_POS * g.V * sizeof(float)) == 0;
    solo = nalar_cpu_backend_test_solo_passes(h.be);
    ok(solo >= N_POS - 20, "a worker stalled per pass: %llu of %d "
       "one-token passes ran on the calling thread alone (>= %d)",
       (unsigned long long) solo, N_POS, N_POS - 20);
    ok(same, "stalled worker: logits bit-identical to one thread's");
    nalar_cpu_backend_test_stall(h.be, 0);
    free(ref);
    free(got);
    rig_close(&h);
    rig_close(&g);
}


int
main(void)
{
    char               dir[] = "/tmp/nalar-cpu-XXXXXX", path[256];
    char               name[256];
    nalar_mkmodel_opts o;
    nalar_err          err;
    static const struct { int heads, kv_heads, dim; const char *name; } m[] = {
        { 4, 4, 64, "4 heads, 4 KV heads (tiles of 8 tokens)" },
        { 4, 1, 64, "4 heads, 1 KV head (tiles of 2 tokens, 4 heads)" },
        { 2, 2, 128, "heads of 64 (tiles of 4 tokens)" },
        { 2, 1, 256, "head of 128" },
        { 2, 2, 48, "heads of 24 (values one at a time)" },
    };
    /* every model in each KV type the CPU backend keeps */
    static const struct { ggml_type t; const char *name; } kv[] = {
        { GGML_F32, "" }, { GGML_F16, ", KV f16" }, { GGML_BF16, ", KV bf16" },
    };

    for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++) {
        kv_type = kv[k].t;
        snprintf(name, sizeof(name), "demo target (2 heads per KV head, "
                 "tiles of 4 tokens)%s", kv[k].name);
        check_model("models/nalar-kjv-target-f32.gguf", name);
    }
    kv_type = GGML_F32;
    check_stalled_worker("models/nalar-kjv-target-f32.gguf");
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
        nalar_mkmodel_defaults(&o);
        o.dim = m[i].dim;
        o.n_layers = 2;
        o.n_heads = m[i].heads;
        o.n_kv_heads = m[i].kv_heads;
        o.ffn_dim = 96;
        o.n_vocab = 300;
        o.seed = 11 + (uint64_t) i;
        snprintf(path, sizeof(path), "%s/m%zu.gguf", dir, i);
        if (nalar_mkmodel(&o, path, &err) != 0) {
            ok(0, "mkmodel: %s", err.msg);
            continue;
        }
        for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++) {
            kv_type = kv[k].t;
            snprintf(name, sizeof(name), "%s%s", m[i].name, kv[k].name);
            check_model(path, name);
        }
        kv_type = GGML_F32;
        unlink(path);
    }
    for (int i = 0; i < 2; i++) {
        nalar_mkmodel_defaults(&o);
        o.dim = 256;
        o.n_layers = 2;
        o.n_heads = 4;
        o.n_kv_heads = 2;
        o.ffn_dim = 512;
        o.n_vocab = 300;
        o.type = i == 0 ? GGML_Q8_0 : GGML_Q4_K;
        o.kmix = i == 1;
        o.seed = 21 + (uint64_t) i;
        snprintf(path, sizeof(path), "%s/q%d.gguf", dir, i);
        if (nalar_mkmodel(&o, path, &err) != 0) {
            ok(0, "mkmodel: %s", err.msg);
            continue;
        }
        act_i16 = 1;
        check_model(path, i == 0 ? "Q8_0, 16-bit activations"
                                 : "Q4_K_M, 16-bit activations");
        act_i16 = NALAR_ACT_Q8;
        check_model(path, i == 0 ? "Q8_0, 8-bit activations"
                                 : "Q4_K_M, 8-bit activations");
        act_i16 = NALAR_ACT_PAIRS;
        per32_model = i == 0;
        check_model(path, i == 0 ? "Q8_0, pair multipliers"
                                 : "Q4_K_M, pair multipliers");
        per32_model = 0;
        /* the default activations with a half-size KV cache */
        act_i16 = 1;
        kv_type = i == 0 ? GGML_F16 : GGML_BF16;
        check_model(path, i == 0 ? "Q8_0, 16-bit activations, KV f16"
                                 : "Q4_K_M, 16-bit activations, KV bf16");
        kv_type = GGML_F32;
        act_i16 = 0;
        unlink(path);
    }
    rmdir(dir);
    return done_testing();
}
