/*
 * nalar spec-bench and nalar prefix-bench: engine-level benchmarks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "opts.h"
#include "clock.h"
#include "collect.h"
#include "engine.h"
#include "model.h"
#include "prefix_cache.h"
#include "tokenizer.h"

#define MAX_REQ 64
#define MAX_REPS 15


static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static double
median(double *v, int n)
{
    qsort(v, (size_t) n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


static double
percentile(double *v, int n, double q)
{
    int i;

    qsort(v, (size_t) n, sizeof(double), cmp_double);
    i = (int) (q * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}


int
nalar_bench_spec_mode(const char *s)
{
    if (strcmp(s, "off") == 0) return NALAR_SPEC_OFF;
    if (strcmp(s, "draft") == 0) return NALAR_SPEC_DRAFT;
    if (strcmp(s, "ngram") == 0) return NALAR_SPEC_NGRAM;
    if (strcmp(s, "auto") == 0) return NALAR_SPEC_AUTO;
    return -1;
}


static int
parse_list(const char *s, int *out, int cap)
{
    int   n = 0;
    char *d = strdup(s), *t;

    for (t = strtok(d, ","); t != NULL && n < cap; t = strtok(NULL, ",")) {
        out[n++] = strcmp(t, "auto") == 0 ? -1 : atoi(t);
    }
    free(d);
    return n;
}


/* --- spec-bench --- */

static const char *bench_prompts[] = {
    "In the beginning", "And it came to pass", "A wise man",
    "The LORD is my shepherd", "Blessed are the meek, for",
    "Now the serpent was more subtil than", "There is no", "Love is",
};
#define N_BENCH_PROMPTS 8

typedef struct {
    const char *model, *draft;
    int         threads, n_gen;
} spec_env;


/*
 * Streams: an engine running at most `streams` sequences at once is given
 * SPEC_WAVES requests per stream; as one finishes the next waiting one
 * takes its place (continuous batching), so the batch stays full but for
 * the last wave.  Without it, sequences that speculation finishes at
 * different steps leave a tail of small batches that plain decoding, whose
 * sequences all end together, never has.
 */
#define SPEC_WAVES 4

static nalar_engine *
spec_engine(const spec_env *env, int mode, int k, int streams,
            nalar_err *err)
{
    nalar_engine_opts o;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = env->model;
    o.draft_path = mode == NALAR_SPEC_DRAFT || mode == NALAR_SPEC_AUTO
                   ? env->draft : NULL;
    o.spec_mode = k == 0 ? NALAR_SPEC_OFF : mode;
    o.spec_max_k = k > 0 ? k : 8;
    o.spec_fixed_k = k > 0 ? k : 0;
    o.n_threads = env->threads;
    o.max_running = streams;
    e = nalar_engine_create(&o, err);
    if (e != NULL && nalar_engine_run_sync(e, NULL, 0, err) != 0) {
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/* Request i's length with `vary`: n_gen / 2 up to 15/16 of it, so that
 * sequences end at different steps with or without speculation, as in
 * service (all of one length, plain decoding would keep them in lockstep,
 * which speculation cannot). */
static int
bench_len(int i, int n_gen)
{
    return n_gen / 2 + (i % N_BENCH_PROMPTS) * n_gen / 16;
}


/* Run n greedy requests to completion (as many at once as the engine's
 * max_running); returns confirmed tokens/s.  preds == NULL and plain: the
 * requests turn speculation off (the baseline, on the same engine). */
static double
spec_run(nalar_engine *e, int32_t (*prompts)[64], const int *n_prompts,
         int n, int n_gen, int vary, int32_t (*preds)[1024], int n_pred,
         int plain, collected *out)
{
    nalar_request       *reqs[MAX_REQ];
    nalar_request_params p;
    nalar_err            err;
    double               t0, dt;
    long                 total = 0;

    for (int i = 0; i < n; i++) {
        int k = i % N_BENCH_PROMPTS;

        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = 0;
        p.prompt = prompts[k];
        p.n_prompt = n_prompts[k];
        p.max_tokens = vary ? bench_len(i, n_gen) : n_gen;
        p.ignore_eos = 1;
        if (plain) {
            p.spec_mode = NALAR_SPEC_OFF;
        } else if (preds != NULL) {
            p.prediction = preds[k];
            p.n_prediction = n_pred;
        }
        memset(&out[i], 0, sizeof(out[i]));
        reqs[i] = nalar_request_create(&p, collect, &out[i], &err);
    }
    t0 = nalar_now_s();
    nalar_engine_run_sync(e, reqs, n, &err);
    dt = nalar_now_s() - t0;
    for (int i = 0; i < n; i++) {
        total += out[i].n;
        nalar_request_unref(reqs[i]);
    }
    return (double) total / dt;
}


/* what every row of a spec-bench runs on */
typedef struct {
    spec_env    env;
    int32_t     prompts[N_BENCH_PROMPTS][64];
    int         n_prompts[N_BENCH_PROMPTS];
    int32_t   (*preds)[1024];    /* an editing task's predictions, or NULL */
    collected  *out;             /* (MAX_REQ) */
    int         reps, json;
} spec_set;


/* edit-rename: the output's recurring tokens (3 or more occurrences), in
 * order of first appearance, each renamed at every occurrence, as long as
 * at most a tenth of the output differs.  Tokens changed, all prompts. */
static int
predict_rename(spec_set *S)
{
    int n_gen = S->env.n_gen, total_changed = 0;

    for (int k = 0; k < N_BENCH_PROMPTS; k++) {
        int32_t *ids = S->out[k].ids;
        int      changed = 0;

        for (int i = 0; i < n_gen; i++) {
            S->preds[k][i] = ids[i];
        }
        for (int i = 0; i < n_gen; i++) {
            int seen = 0, count = 0;

            for (int j = 0; j < i; j++) {
                seen |= ids[j] == ids[i];
            }
            for (int j = i; j < n_gen; j++) {
                count += ids[j] == ids[i];
            }
            if (seen || count < 3 || (changed + count) * 10 > n_gen) {
                continue;
            }
            for (int j = i; j < n_gen; j++) {
                if (ids[j] == ids[i]) {
                    S->preds[k][j] = (ids[i] + 7) % 2000 + 3;
                }
            }
            changed += count;
        }
        total_changed += changed;
    }
    return total_changed;
}


/* edit: one token in 10 differs, at positions drawn at random (a fixed
 * period would line up with k + 1).  edit-spans (spans): spans of 3 to 9
 * tokens, each after 9 times its length unchanged. */
static void
predict_edits(spec_set *S, int spans)
{
    for (int k = 0; k < N_BENCH_PROMPTS; k++) {
        int keep = 0, change = 0;

        for (int i = 0; i < S->env.n_gen; i++) {
            uint64_t h = ((uint64_t) k * 1000003u + (uint64_t) i)
                         * 0x9E3779B97F4A7C15ull;
            int      wrong;

            if (spans) {
                if (keep == 0 && change == 0) {
                    change = 3 + (int) ((h >> 40) % 7);
                    keep = 9 * change;
                }
                wrong = keep == 0;
                if (keep > 0) keep--; else change--;
            } else {
                wrong = (h >> 32) % 10 == 0;
            }
            S->preds[k][i] = wrong ? (S->out[k].ids[i] + 7) % 2000 + 3
                                   : S->out[k].ids[i];
        }
    }
}


/*
 * An editing task: the client predicts the text it expects back, and 90%
 * of it is right (edit: scattered tokens, the hardest case for
 * speculation; edit-spans: the changes come as phrases, as a real edit's
 * do; edit-rename: an identifier renamed throughout, as in code -- the
 * same substitution again and again, not at random places).  The
 * predictions are the plain output of `base`, changed.  The proposer's
 * name; NULL out of memory.
 */
static const char *
spec_predictions(spec_set *S, nalar_engine *base, const char *task)
{
    int spans = strcmp(task, "edit-spans") == 0;
    int rename = strcmp(task, "edit-rename") == 0;

    S->preds = calloc(N_BENCH_PROMPTS, sizeof(*S->preds));
    if (S->preds == NULL) {
        return NULL;
    }
    spec_run(base, S->prompts, S->n_prompts, N_BENCH_PROMPTS, S->env.n_gen,
             0, NULL, 0, 1, S->out);
    if (rename) {
        int total_changed = predict_rename(S);

        fprintf(stderr, "edit-rename: %.1f%% of the output predicted\n",
                100.0 - 100.0 * total_changed
                        / (N_BENCH_PROMPTS * S->env.n_gen));
        return "prediction-rename";
    }
    predict_edits(S, spans);
    return spans ? "prediction-spans" : "prediction";
}


/* One row of the table: proposer, streams b, k, medians of the runs,
 * the paired speedup, and the engine's speculation counters. */
static void
spec_print(const spec_set *S, const char *proposer, int b, int k,
           double *tp, double *ts, const nalar_metrics *mt,
           double confirmed)
{
    int    reps = S->reps;
    double ratio[MAX_REPS], pair[MAX_REPS], mp, ms, sp;
    char   kname[16];

    /* the speedup: median of the paired ratios (each speculative run
     * against the plain run just before it), steadier than a ratio of
     * medians on a machine whose speed drifts.  median() sorts its array
     * in place, so the ratios are kept, in run order, apart (ts and tp
     * are sorted below: their quotients after that pair no runs) */
    for (int r = 0; r < reps; r++) {
        ratio[r] = pair[r] = ts[r] / tp[r];
    }
    sp = median(ratio, reps);
    mp = median(tp, reps);
    ms = median(ts, reps);
    if (S->json) {
        snprintf(kname, sizeof(kname), k < 0 ? "auto"
                 : k == 0 ? "off (control)" : "%d", k);
        printf("{\"proposer\": \"%s\", \"streams\": %d, "
               "\"k\": \"%s\", \"tokens_per_s\": %.1f, "
               "\"plain_tokens_per_s\": %.1f, \"speedup\": "
               "%.3f, \"accepted\": %llu, \"proposed\": "
               "%llu, \"acceptance\": %.3f, "
               "\"accepted_per_step\": %.2f, "
               "\"draft_ms_per_token\": %.4f, "
               "\"verify_ms_per_token\": %.4f, "
               "\"speedups\": [",
               proposer, b, kname, ms, mp, sp,
               (unsigned long long) mt->spec_accepted_tokens_total,
               (unsigned long long) mt->spec_draft_tokens_total,
               mt->spec_draft_tokens_total
               ? (double) mt->spec_accepted_tokens_total
                 / mt->spec_draft_tokens_total : 0,
               mt->spec_drafts_total
               ? (double) mt->spec_accepted_tokens_total
                 / mt->spec_drafts_total : 0,
               1e3 * mt->spec_draft_seconds_total / confirmed,
               1e3 * mt->spec_verify_seconds_total / confirmed);
        /* every pair's ratio, in the order run */
        for (int r = 0; r < reps; r++) {
            printf("%s%.3f", r ? ", " : "", pair[r]);
        }
        printf("]}\n");
    } else {
        snprintf(kname, sizeof(kname), k < 0 ? "auto" : "%d", k);
        printf("| %s | %d | %s | %.0f | %.0f | %.2fx | "
               "%llu/%llu | %.2f | %.4f | %.4f |\n",
               proposer, b, kname, ms, mp, sp,
               (unsigned long long) mt->spec_accepted_tokens_total,
               (unsigned long long) mt->spec_draft_tokens_total,
               mt->spec_drafts_total
               ? (double) mt->spec_accepted_tokens_total
                 / mt->spec_drafts_total : 0,
               1e3 * mt->spec_draft_seconds_total / confirmed,
               1e3 * mt->spec_verify_seconds_total / confirmed);
    }
    fflush(stdout);
}


/* One row: an engine of `mode` with k fixed (k = 0: a second plain engine
 * against the first, the noise floor of the comparison, an A/A control)
 * running b streams; 0, or -1 when the engine cannot start. */
static int
spec_row(spec_set *S, int mode, const char *proposer, int b, int k)
{
    int           n_req = b * SPEC_WAVES;
    double        tp[MAX_REPS], ts[MAX_REPS], confirmed = 0;
    nalar_engine *e;
    nalar_metrics mt;
    nalar_err     err;

    e = spec_engine(&S->env, mode, k, b, &err);
    if (e == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return -1;
    }
    /* alternate on the same engine (same threads, memory and KV pool: no
     * instance-to-instance difference): plain, speculative, plain, ...;
     * k = 0 runs plain twice */
    for (int r = 0; r < S->reps; r++) {
        tp[r] = spec_run(e, S->prompts, S->n_prompts, n_req, S->env.n_gen,
                         1, NULL, 0, 1, S->out);
        ts[r] = spec_run(e, S->prompts, S->n_prompts, n_req, S->env.n_gen,
                         1, S->preds, S->env.n_gen, k == 0, S->out);
    }
    nalar_engine_metrics(e, &mt);
    for (int i = 0; i < n_req; i++) {
        confirmed += (double) S->reps * bench_len(i, S->env.n_gen);
    }
    spec_print(S, proposer, b, k, tp, ts, &mt, confirmed);
    nalar_engine_destroy(e);
    return 0;
}


int
nalar_cmd_spec_bench(int argc, char **argv)
{
    spec_set        S;
    const char     *task = "prompts", *blist = "1,4,16";
    const char     *klist = "0,1,2,4,8", *only = NULL;
    int             bs[8], ks[8], n_b, n_k;
    nalar_err       err;
    nalar_engine   *base;
    nalar_model    *m;
    const char     *proposers[4];
    int             modes[4], n_modes = 0;
    const nalar_opt opts[] = {
        { "-m", NULL, NALAR_OPT_STR, &S.env.model, NULL, 0 },
        { "--draft", NULL, NALAR_OPT_STR, &S.env.draft, NULL, 0 },
        { "--task", NULL, NALAR_OPT_STR, &task, NULL, 0 },
        { "-b", NULL, NALAR_OPT_STR, &blist, NULL, 0 },
        { "-k", NULL, NALAR_OPT_STR, &klist, NULL, 0 },
        { "-n", NULL, NALAR_OPT_INT, &S.env.n_gen, NULL, 0 },
        { "-t", NULL, NALAR_OPT_INT, &S.env.threads, NULL, 0 },
        { "--reps", NULL, NALAR_OPT_INT, &S.reps, NULL, 0 },
        { "--only", NULL, NALAR_OPT_STR, &only, NULL, 0 },
        { "--json", NULL, NALAR_OPT_FLAG, &S.json, NULL, 0 },
    };

    memset(&S, 0, sizeof(S));
    S.env.n_gen = 96;
    S.reps = 5;
    if (NALAR_OPTS_PARSE("spec-bench", argc, argv, opts) != 0) {
        return 2;
    }
    if (S.env.model == NULL || S.env.n_gen < 1 || S.env.n_gen > 400) {
        fprintf(stderr, "nalar spec-bench: -m MODEL required, -n 1..400\n");
        return 2;
    }
    if (strcmp(task, "edit") != 0 && strcmp(task, "edit-spans") != 0
        && strcmp(task, "edit-rename") != 0 && strcmp(task, "prompts") != 0)
    {
        fprintf(stderr, "nalar spec-bench: --task is prompts, edit, "
                "edit-spans or edit-rename, not '%s'\n", task);
        return 2;
    }
    S.reps = S.reps < 1 ? 1 : S.reps > MAX_REPS ? MAX_REPS : S.reps;
    n_b = parse_list(blist, bs, 8);
    n_k = parse_list(klist, ks, 8);
    S.out = calloc(MAX_REQ, sizeof(collected));
    base = spec_engine(&S.env, NALAR_SPEC_OFF, 0, MAX_REQ, &err);
    if (base == NULL || S.out == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    m = nalar_engine_model(base);
    for (int k = 0; k < N_BENCH_PROMPTS; k++) {
        S.n_prompts[k] = nalar_tokenize(m->tok, bench_prompts[k],
                                        strlen(bench_prompts[k]), 1, 0,
                                        S.prompts[k], 64);
    }
    if (strcmp(task, "prompts") != 0) {
        proposers[n_modes] = spec_predictions(&S, base, task);
        if (proposers[n_modes] == NULL) {
            fprintf(stderr, "nalar: out of memory\n");
            return 1;
        }
        modes[n_modes++] = NALAR_SPEC_OFF;
    } else {
        if (S.env.draft != NULL) {
            proposers[n_modes] = "draft";
            modes[n_modes++] = NALAR_SPEC_DRAFT;
            /* the server's default with a draft: the draft, and n-gram
             * lookup where the gate holds the draft back or measures it
             * slower */
            proposers[n_modes] = "auto";
            modes[n_modes++] = NALAR_SPEC_AUTO;
        }
        proposers[n_modes] = "ngram";
        modes[n_modes++] = NALAR_SPEC_NGRAM;
    }

    if (!S.json) {
        printf("| proposer | streams | k | tokens/s (median of %d) | "
               "plain tokens/s | speedup | accepted/proposed | "
               "mean accepted per step | draft ms/token | verify ms/token |"
               "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               S.reps);
    }
    for (int pi = 0; pi < n_modes; pi++) {
        if (only != NULL && strcmp(only, proposers[pi]) != 0) {
            continue;
        }
        for (int bi = 0; bi < n_b; bi++) {
            int b = bs[bi] > MAX_REQ / SPEC_WAVES ? MAX_REQ / SPEC_WAVES
                                                  : bs[bi];

            for (int ki = 0; ki < n_k; ki++) {
                if (modes[pi] == NALAR_SPEC_AUTO && ks[ki] > 0) {
                    continue;   /* a fixed k is the draft's row */
                }
                if (spec_row(&S, modes[pi], proposers[pi], b, ks[ki]) != 0) {
                    return 1;
                }
            }
        }
    }
    nalar_engine_destroy(base);
    free(S.out);
    free(S.preds);
    return 0;
}


/* --- prefix-bench --- */

typedef struct {
    double ttft_ms;
    int    cached;
} first_token;


static void
ttft_take(nalar_request *r, void *ctx)
{
    first_token *f = ctx;
    nalar_output o;

    nalar_request_take(r, &o);
    if (o.usage.ttft_ms >= 0) {
        f->ttft_ms = o.usage.ttft_ms;
    }
    f->cached = o.usage.n_cached;
    nalar_output_free(&o);
}


static first_token
one_request(nalar_engine *e, const int32_t *prompt, int n, const char *scope,
            int n_shared, int max_tokens)
{
    nalar_request_params p;
    nalar_request       *r;
    nalar_err            err;
    first_token          f = { -1, 0 };

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = prompt;
    p.n_prompt = n;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    p.cache_scope = scope;
    p.n_shared_prefix = n_shared;
    r = nalar_request_create(&p, ttft_take, &f, &err);
    nalar_engine_run_sync(e, &r, 1, &err);
    nalar_request_unref(r);
    return f;
}


static uint64_t bench_rng = 88172645463325252ull;

static int32_t
rand_token(int32_t n_vocab)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (int32_t) (3 + bench_rng % (uint64_t) (n_vocab - 3));
}


/* the cost of identity: hashing a whole prompt's blocks */
static void
prefix_hash_cost(const int32_t *prompt, int len, int json)
{
    uint8_t d[NALAR_DIGEST] = { 0 };
    double  t0 = nalar_now_s();
    int     nb = len / NALAR_KV_BLOCK;

    for (int r = 0; r < 100; r++) {
        for (int b = 0; b < nb; b++) {
            nalar_prefix_chain(d, prompt, d);
        }
    }
    if (!json) {
        printf("hashing %d blocks (%d tokens): %.1f us\n\n", nb, len,
               (nalar_now_s() - t0) / 100 * 1e6);
    } else {
        printf("{\"hash_us\": %.1f}\n", (nalar_now_s() - t0) / 100 * 1e6);
    }
}


/* TTFT with the cache on and off, for prompts whose first `rate` percent
 * a warm-up request shared; prompt and warm hold len tokens each. */
static void
prefix_reuse(nalar_engine *on, nalar_engine *off, int32_t *prompt,
             int32_t *warm, int len, int reps, int json)
{
    static const int rates[] = { 0, 25, 50, 75, 95 };
    int32_t          V = nalar_engine_model(on)->cfg.n_vocab;

    if (!json) {
        printf("| reuse L_hit/L_in | cached tokens | TTFT cache on (ms) | "
               "TTFT cache off (ms) | ratio | ideal ratio |\n"
               "|---:|---:|---:|---:|---:|---:|\n");
    }
    for (size_t ri = 0; ri < sizeof(rates) / sizeof(rates[0]); ri++) {
        double ton[MAX_REPS], toff[MAX_REPS], a, b;
        int    cached = 0;

        for (int r = 0; r < reps; r++) {
            int         keep = len * rates[ri] / 100;
            first_token f;

            /* a fresh prompt; the warm-up shares its first `keep` tokens */
            prompt[0] = 1;
            for (int i = 1; i < len; i++) {
                prompt[i] = rand_token(V);
            }
            memcpy(warm, prompt, (size_t) len * sizeof(int32_t));
            for (int i = keep > 1 ? keep : 1; i < len; i++) {
                warm[i] = rand_token(V);
            }
            one_request(on, warm, len, "bench", 0, 1);
            f = one_request(on, prompt, len, "bench", 0, 1);
            ton[r] = f.ttft_ms;
            cached = f.cached;
            f = one_request(off, prompt, len, "bench", 0, 1);
            toff[r] = f.ttft_ms;
        }
        a = median(ton, reps);
        b = median(toff, reps);
        if (json) {
            printf("{\"reuse\": %d, \"cached\": %d, \"ttft_on_ms\": %.2f, "
                   "\"ttft_off_ms\": %.2f, \"ratio\": %.3f, \"ideal\": "
                   "%.3f}\n", rates[ri], cached, a, b, a / b,
                   1.0 - (double) cached / len);
        } else {
            printf("| %d%% | %d | %.1f | %.1f | %.3f | %.3f |\n",
                   rates[ri], cached, a, b, a / b,
                   1.0 - (double) cached / len);
        }
        fflush(stdout);
    }
}


/* multi-tenant: 8 tenants, a shared 512-token system prompt, each
 * tenant's own growing history; shared prefixes on (shared) or off */
static void
prefix_tenants(nalar_engine *on, int32_t *prompt, int32_t *warm, int len,
               int shared, int json)
{
    int32_t       V = nalar_engine_model(on)->cfg.n_vocab;
    nalar_metrics mt0, mt1;
    double        tt[64], t0, q, h, el, p50, p99;
    int           n = 0, sys = 512 < len / 2 ? 512 : len / 2;
    long          toks = 0;
    char          scope[48];

    nalar_engine_metrics(on, &mt0);
    for (int i = 0; i < sys; i++) {
        warm[i] = i == 0 ? 1 : 3 + (i * 37) % (V - 3);
    }
    t0 = nalar_now_s();
    for (int turn = 0; turn < 4; turn++) {
        for (int ten = 0; ten < 8 && n < 64; ten++) {
            int         plen = sys + 64 * (turn + 1);
            first_token f;

            memcpy(prompt, warm, (size_t) sys * sizeof(int32_t));
            for (int i = sys; i < plen; i++) {
                prompt[i] = 3 + ((i * 131 + ten * 7919 + shared * 17)
                                 % (V - 3));
            }
            snprintf(scope, sizeof(scope), "tenant%d-%d", ten, shared);
            f = one_request(on, prompt, plen, scope, shared ? sys : 0, 8);
            tt[n++] = f.ttft_ms;
            toks += plen + 8;
        }
    }
    nalar_engine_metrics(on, &mt1);
    q = (double) (mt1.prefix_queries_total - mt0.prefix_queries_total);
    h = (double) (mt1.prefix_hits_total - mt0.prefix_hits_total);
    el = nalar_now_s() - t0;
    p50 = percentile(tt, n, 0.5);
    p99 = percentile(tt, n, 0.99);
    if (json) {
        printf("{\"multi_tenant\": true, \"shared_prefix\": %s, "
               "\"hit_rate\": %.3f, \"ttft_p50_ms\": %.2f, "
               "\"ttft_p99_ms\": %.2f, \"tokens_per_s\": %.1f}\n",
               shared ? "true" : "false", q > 0 ? h / q : 0, p50, p99,
               toks / el);
    } else {
        printf("%s8 tenants, shared %d-token system prompt %s: hit "
               "rate %.1f%%, TTFT p50 %.1f ms, p99 %.1f ms, %.0f "
               "prompt+output tokens/s\n", shared ? "\n" : "", sys,
               shared ? "declared shared" : "not shared",
               q > 0 ? 100 * h / q : 0, p50, p99, toks / el);
    }
}


int
nalar_cmd_prefix_bench(int argc, char **argv)
{
    const char       *model = NULL;
    int               len = 1500, threads = 0, reps = 5, json = 0;
    nalar_engine_opts o;
    nalar_engine     *on, *off;
    nalar_err         err;
    int32_t          *prompt, *warm;
    const nalar_opt   opts[] = {
        { "-m", NULL, NALAR_OPT_STR, &model, NULL, 0 },
        { "-p", NULL, NALAR_OPT_INT, &len, NULL, 0 },
        { "-t", NULL, NALAR_OPT_INT, &threads, NULL, 0 },
        { "--reps", NULL, NALAR_OPT_INT, &reps, NULL, 0 },
        { "--json", NULL, NALAR_OPT_FLAG, &json, NULL, 0 },
    };

    if (NALAR_OPTS_PARSE("prefix-bench", argc, argv, opts) != 0) {
        return 2;
    }
    if (model == NULL || len < 32) {
        fprintf(stderr, "nalar prefix-bench: -m MODEL required, -p >= 32\n");
        return 2;
    }
    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    memset(&o, 0, sizeof(o));
    o.model_path = model;
    o.n_threads = threads;
    o.max_batch_tokens = 512;
    o.prefix_cache = 1;
    on = nalar_engine_create(&o, &err);
    if (on == NULL || nalar_engine_run_sync(on, NULL, 0, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    o.prefix_cache = 0;
    off = nalar_engine_create(&o, &err);
    if (off == NULL || nalar_engine_run_sync(off, NULL, 0, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    if (len >= nalar_engine_model(on)->cfg.n_ctx) {
        fprintf(stderr, "nalar prefix-bench: -p %d does not fit the "
                "context of %d\n", len, nalar_engine_model(on)->cfg.n_ctx);
        return 2;
    }
    /* room for len tokens, and for the tenants' prompts (a system prompt
     * of at most len / 2, then up to 256 tokens of history) */
    prompt = calloc((size_t) len + 256, sizeof(int32_t));
    warm = calloc((size_t) len + 256, sizeof(int32_t));
    if (prompt == NULL || warm == NULL) {
        fprintf(stderr, "nalar: out of memory\n");
        return 1;
    }
    prefix_hash_cost(prompt, len, json);
    prefix_reuse(on, off, prompt, warm, len, reps, json);
    for (int shared = 1; shared >= 0; shared--) {
        prefix_tenants(on, prompt, warm, len, shared, json);
    }
    free(prompt);
    free(warm);
    nalar_engine_destroy(on);
    nalar_engine_destroy(off);
    return 0;
}
