/*
 * nalar verify-bench: what one forward pass costs against the number of
 * tokens it carries, for one sequence at a given position (the shape of a
 * speculative verification: the last confirmed token and k proposals), and
 * the arithmetic rate each reaches.
 *
 * Speculation pays when verifying k + 1 tokens costs much less than k + 1
 * single-token steps.  On a GPU a decode step is bound by reading the
 * weights, so a few more tokens are nearly free; on a CPU whose caches
 * hold the whole model a step is bound by arithmetic, and the curve
 * printed here is the ceiling on any proposer's speedup: with a tokens per
 * step confirmed, speedup <= a * t(1) / t(k + 1) before the proposer's own
 * cost.
 *
 * It also measures a cache line's round trip between two threads: passes
 * split over threads exchange activation rows and meet at barriers, so
 * how far apart the cores sit decides how well two threads share a pass
 * (on a 2-vCPU virtual machine the round trip can vary from 175 ns to
 * 500 ns minute to minute, and a 2-thread pass's gain with it).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_backend.h"
#include "bench.h"
#include "opts.h"
#include "clock.h"
#include "kv.h"
#include "model.h"

#define MAX_T 33
#define TRIPS 200000
#define TRIP_SECONDS 0.2     /* at most: one CPU would take a timeslice */

/* the line two threads hand back and forth: even, the first thread's
 * turn; odd, the peer's; -1, the peer stops */
static long trip_line[16] __attribute__((aligned(64)));


static void *
trip_peer(void *arg)
{
    for ( ;; ) {
        long v;

        while ((v = __atomic_load_n(&trip_line[0], __ATOMIC_ACQUIRE)) >= 0
               && v % 2 == 0)
        {
            /* spin */
        }
        if (v < 0) {
            return arg;
        }
        __atomic_store_n(&trip_line[0], v + 1, __ATOMIC_RELEASE);
    }
}


/* nanoseconds for a cache line to go to another thread and back; -1 when
 * no second thread starts */
static double
line_round_trip_ns(void)
{
    pthread_t t;
    double    t0 = nalar_now_s(), dt;
    long      i;

    __atomic_store_n(&trip_line[0], 0, __ATOMIC_RELEASE);
    if (pthread_create(&t, NULL, trip_peer, NULL) != 0) {
        return -1;
    }
    for (i = 0; i < TRIPS; i++) {
        while (__atomic_load_n(&trip_line[0], __ATOMIC_ACQUIRE) != 2 * i) {
            /* spin */
        }
        if (i % 1024 == 1023 && nalar_now_s() - t0 > TRIP_SECONDS) {
            break;
        }
        __atomic_store_n(&trip_line[0], 2 * i + 1, __ATOMIC_RELEASE);
    }
    dt = nalar_now_s() - t0;
    /* the peer may still be answering the last odd value: take its answer
     * before telling it to stop, or its store would overwrite the -1 and
     * it would spin for good (a run that completed every trip would hang
     * in pthread_join) */
    while (__atomic_load_n(&trip_line[0], __ATOMIC_ACQUIRE) != 2 * i) {
        /* spin */
    }
    __atomic_store_n(&trip_line[0], -1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    return dt / (double) i * 1e9;
}


/* Multiply-adds of one token's forward pass at position pos: the weight
 * products (the token embedding is a lookup) and attention over pos + 1
 * keys (q.k and the weighted sum of values). */
static double
flops_per_token(const nalar_config *c, int pos)
{
    double q = (double) c->n_heads * c->head_dim;
    double kv = (double) c->n_kv_heads * c->head_dim;
    double layer = c->dim * (q + 2 * kv) + q * c->dim
                   + 3.0 * c->dim * c->ffn_dim
                   + 2.0 * c->n_heads * c->head_dim * (pos + 1);

    return 2 * (c->n_layers * layer + (double) c->dim * c->n_vocab);
}


int
nalar_cmd_verify_bench(int argc, char **argv)
{
    const char    *path = NULL;
    int            threads = 0, pos = 200, json = 0, reps = 7;
    static const int ts[] = { 1, 2, 3, 5, 9, 17, 33 };
    nalar_err      err;
    nalar_model   *m;
    nalar_backend *be;
    nalar_kv_pool  kv;
    nalar_seq_kv   s;
    int32_t        tok[MAX_T], p[MAX_T];
    int8_t         want[MAX_T];
    nalar_seq_kv  *seq[MAX_T];
    float         *logits;
    double         t1 = 0, per_tok, trip_ns;

    const nalar_opt opts[] = {
        { "-m", NULL, NALAR_OPT_STR, &path, NULL, 0 },
        { "-t", NULL, NALAR_OPT_INT, &threads, NULL, 0 },
        { "--pos", NULL, NALAR_OPT_INT, &pos, NULL, 0 },
        { "--reps", NULL, NALAR_OPT_INT, &reps, NULL, 0 },
        { "--json", NULL, NALAR_OPT_FLAG, &json, NULL, 0 },
    };

    if (NALAR_OPTS_PARSE("verify-bench", argc, argv, opts) != 0) {
        return 2;
    }
    if (path == NULL || reps < 1) {
        fprintf(stderr, "nalar verify-bench: -m MODEL required\n");
        return 2;
    }
    m = nalar_model_load(path, &err);
    if (m == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    if (pos < 0 || pos + MAX_T > m->cfg.n_ctx) {
        fprintf(stderr, "nalar verify-bench: --pos must leave %d positions "
                "of the context (%d)\n", MAX_T, m->cfg.n_ctx);
        nalar_model_destroy(m);
        return 2;
    }
    be = nalar_cpu_backend_create(m, threads, &err);
    logits = nalar_alloc_lines((size_t) MAX_T * m->cfg.n_vocab
                               * sizeof(float));
    if (be == NULL || logits == NULL
        || nalar_kv_pool_init(&kv, (pos + MAX_T) / NALAR_KV_BLOCK + 2,
                              m->cfg.n_layers,
                              m->cfg.n_kv_heads * m->cfg.head_dim, &err) != 0
        || be->kv_alloc(be, &kv, &err) != 0)
    {
        fprintf(stderr, "nalar: %s\n", be == NULL || logits == NULL
                                       ? "out of memory" : err.msg);
        return 1;
    }
    nalar_seq_kv_init(&s);
    if (nalar_seq_kv_reserve(&kv, &s, pos + MAX_T) != 0) {
        fprintf(stderr, "nalar: KV reservation failed\n");
        return 1;
    }
    /* the sequence's first pos positions, in chunks of MAX_T */
    for (int p0 = 0; p0 < pos; p0 += MAX_T) {
        nalar_batch b = { 0, tok, p, seq, want, 1, NULL };

        b.n_tokens = pos - p0 < MAX_T ? pos - p0 : MAX_T;
        for (int i = 0; i < b.n_tokens; i++) {
            tok[i] = 3 + (p0 + i) * 7 % (m->cfg.n_vocab - 3);
            p[i] = p0 + i;
            seq[i] = &s;
            want[i] = i == b.n_tokens - 1;
        }
        if (be->forward(be, &kv, &b, logits, &err) != 0) {
            fprintf(stderr, "nalar: %s\n", err.msg);
            return 1;
        }
    }
    trip_ns = line_round_trip_ns();
    if (!json) {
        char nthr[32];

        if (threads > 0) {
            snprintf(nthr, sizeof(nthr), "%d", threads);
        } else {
            snprintf(nthr, sizeof(nthr), "one per core");
        }
        printf("one sequence at position %d, threads: %s; a cache line's "
               "round trip between two threads: %.0f ns\n\n"
               "| tokens | us per pass | x one token | us per token | "
               "GFLOP/s | ceiling: tokens per pass / cost |\n"
               "|---:|---:|---:|---:|---:|---:|\n", pos, nthr, trip_ns);
    }
    for (size_t ti = 0; ti < sizeof(ts) / sizeof(ts[0]); ti++) {
        int         T = ts[ti];
        nalar_batch b = { T, tok, p, seq, want, T, NULL };
        double      best = 1e30;

        for (int i = 0; i < T; i++) {
            tok[i] = 3 + i * 13 % (m->cfg.n_vocab - 3);
            p[i] = pos + i;
            seq[i] = &s;
            want[i] = 1;
        }
        for (int r = 0; r < reps; r++) {
            double t0 = nalar_now_s(), dt;
            int    n = 50;

            for (int it = 0; it < n; it++) {
                be->forward(be, &kv, &b, logits, &err);
            }
            dt = (nalar_now_s() - t0) / n;
            best = dt < best ? dt : best;
        }
        if (T == 1) {
            t1 = best;
        }
        per_tok = best / T;
        if (json) {
            printf("{\"tokens\": %d, \"pos\": %d, \"us_per_pass\": %.2f, "
                   "\"ratio\": %.3f, \"gflops\": %.2f, "
                   "\"line_round_trip_ns\": %.0f}\n", T, pos,
                   best * 1e6, best / t1,
                   flops_per_token(&m->cfg, pos) / per_tok / 1e9, trip_ns);
        } else {
            printf("| %d | %.1f | %.2f | %.1f | %.1f | %.2fx |\n", T,
                   best * 1e6, best / t1, per_tok * 1e6,
                   flops_per_token(&m->cfg, pos) / per_tok / 1e9,
                   T * t1 / best);
        }
    }
    nalar_seq_kv_release(&kv, &s);
    be->kv_free(be, &kv);
    nalar_kv_pool_free(&kv);
    be->destroy(be);
    free(logits);
    nalar_model_destroy(m);
    return 0;
}
