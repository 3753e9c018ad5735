/*
 * The step budget sized to an ITL target (src/budget.c, engine_budget.c):
 * the cost model's fit on exact and noisy steps, its fallbacks (sizes that
 * do not spread, a single slow step); the engine's admission decisions
 * under a fake clock (every step costs a known time per step and per
 * token), checked step by step against what fits the target -- decisions,
 * not wall-clock times; the budget adapting when the clock slows; prefill
 * never starving; and greedy ids identical under every budget, alone and
 * batched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "collect.h"
#include "engine_helpers.h"
#include "tap.h"

#define MODEL "models/nalar-kjv-target-f32.gguf"
#define N_GEN 48

/* "In the beginning": the reference greedy continuation (models/README.md,
 * t/c/test_engine.c) */
static const int32_t ref_prompt[] = { 1, 780, 262, 1794, 1046 };
static const int32_t ref_ids[N_GEN] = {
    272, 262, 893, 322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416,
    1978, 1953, 793, 1967, 13, 843, 356, 388, 722, 323, 1962, 398, 2, 1,
    375, 767, 823, 313, 262, 893, 322, 349, 261, 416, 517, 322, 261, 416,
    517, 322, 261, 13, 1965, 369
};


/* --- the cost model alone ------------------------------------------------ */

static void
test_model(void)
{
    nalar_budget m;
    double       est;
    int          good;

    nalar_budget_init(&m);
    ok(nalar_budget_estimate(&m, 10) < 0, "no estimate before any step");
    is_int(nalar_budget_prefill(&m, 0.1, 16, 496), 496,
           "before any step: the most allowed");
    is_int(nalar_budget_fit(&m, 0.1), -1, "before any step: no fit");

    /* exact steps of 10 ms + 1 ms per token, sizes spread */
    for (int i = 0; i < 20; i++) {
        int32_t n = i % 2 ? 16 : 16 + 7 * i;

        nalar_budget_record(&m, n, 0.010 + 0.001 * n);
    }
    ok(fabs(m.a - 0.010) < 1e-9 && fabs(m.b - 0.001) < 1e-9,
       "the fit recovers 10 ms per step and 1 ms per token (%g, %g)",
       m.a, m.b);
    is_int(nalar_budget_fit(&m, 0.100), 90,
           "100 ms target: 90 batch tokens fit");
    is_int(nalar_budget_fit(&m, 0.005), 0,
           "5 ms target, under the 10 ms a step costs: none fit");
    is_int(nalar_budget_prefill(&m, 0.100, 16, 496), 90 - 16,
           "100 ms target, 16 decodes: 74 prompt tokens fit");
    is_int(nalar_budget_prefill(&m, 0.100, 70, 442), 20,
           "70 decodes leave 20: 20 prompt tokens fit");
    is_int(nalar_budget_prefill(&m, 0.100, 80, 432), NALAR_BUDGET_MIN_CHUNK,
           "80 decodes leave 10: the minimum chunk still goes");
    is_int(nalar_budget_prefill(&m, 1.0, 16, 496), 496,
           "a loose target: capped at the most allowed");
    is_int(nalar_budget_prefill(&m, 1.0, 500, 12), NALAR_BUDGET_MIN_CHUNK,
           "the minimum chunk goes past the cap too");

    /* the machine slows 2x while only 16-token decode steps run: the
     * shape holds, the scale follows */
    for (int i = 0; i < 60; i++) {
        nalar_budget_record(&m, 16, 2 * (0.010 + 0.001 * 16));
    }
    est = nalar_budget_estimate(&m, 100);
    ok(fabs(est - 2 * 0.110) < 0.01 * 0.220,
       "steady decodes 2x slower: a 100-token step is estimated 2x (%g)",
       est);
    is_int(nalar_budget_prefill(&m, 0.100, 8, 504), 40 - 8,
           "...so 2x slower steps of 8 decodes leave room for 32 tokens");

    /* one step 100x slower counts as 4x at most */
    nalar_budget_init(&m);
    for (int i = 0; i < 20; i++) {
        int32_t n = i % 2 ? 16 : 80;

        nalar_budget_record(&m, n, 0.010 + 0.001 * n);
    }
    nalar_budget_record(&m, 16, 100 * 0.026);
    est = nalar_budget_estimate(&m, 80);
    ok(est < 0.090 * 2.5, "one step 100x slow moves the estimate < 2.5x "
       "(80 tokens: %g s, was 0.090)", est);
    for (int i = 0; i < 40; i++) {
        int32_t n = i % 2 ? 16 : 80;

        nalar_budget_record(&m, n, 0.010 + 0.001 * n);
    }
    est = nalar_budget_estimate(&m, 80);
    ok(fabs(est - 0.090) < 0.002, "and it fades (80 tokens: %g s)", est);

    /* noisy steps: within 10% */
    nalar_budget_init(&m);
    srand(7);
    good = 1;
    for (int i = 0; i < 200; i++) {
        int32_t n = 16 + rand() % 100;
        double  noise = 1 + 0.1 * ((double) rand() / RAND_MAX - 0.5);

        nalar_budget_record(&m, n, (0.010 + 0.001 * n) * noise);
        if (i > 20) {
            est = nalar_budget_estimate(&m, 90);
            good &= fabs(est - 0.100) < 0.010;
        }
    }
    ok(good, "noisy steps (+-5%%): the 90-token estimate stays within 10%%");
}


/* --- the engine under a fake clock -------------------------------------- */

#define MAX_STEPS 4096

typedef struct {
    nalar_engine    *e;
    nalar_test_step  s[MAX_STEPS];
    int              n;
    /* switch the clock after this many steps (0: never) */
    int              switch_at;
    double           a2, b2;
} step_log;


static void
on_step(void *arg, const nalar_test_step *st)
{
    step_log *l = arg;

    if (l->n < MAX_STEPS) {
        l->s[l->n] = *st;
    }
    l->n++;
    if (l->switch_at > 0 && l->n == l->switch_at) {
        nalar_engine_test_step_cost(l->e, l->a2, l->b2, 0);
    }
}


static nalar_engine *
engine_budget(int32_t chunk, double target, int spec)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = MODEL;
    o.max_batch_tokens = chunk;
    o.itl_target = target;
    o.n_threads = 2;
    o.spec_mode = spec ? NALAR_SPEC_NGRAM : 0;
    o.spec_fixed_k = spec ? 4 : 0;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


static int32_t filler[480];

/*
 * The workload: n_short short prompts decoding 40 tokens, then n_long
 * prompts of `len` tokens decoding 8, all submitted at once.  out and reqs
 * hold n_short + n_long.
 */
static int
run_mix(nalar_engine *e, int n_short, int n_long, int len, collected *out)
{
    nalar_request *reqs[64];
    int            n = 0, fin = 0;
    nalar_err      err;

    for (int i = 0; i < n_short; i++) {
        reqs[n] = greedy_req(filler + 7 * i, 5, 40, &out[n]);
        n++;
    }
    for (int i = 0; i < n_long; i++) {
        reqs[n] = greedy_req(filler + 11 * i, len, 8, &out[n]);
        n++;
    }
    if (nalar_engine_run_sync(e, reqs, n, &err) != 0) {
        diag("run: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        fin += out[i].finish == NALAR_FINISH_LENGTH;
        nalar_request_unref(reqs[i]);
    }
    return fin;
}


/* What the target leaves for prompts beside n_fixed tokens, as the steps
 * cost a + b n: at least the minimum chunk, at most what the cap leaves;
 * with no decode in the step (n_fixed 0), the cap: no stream waits. */
static int32_t
expected_allow(double target, double a, double b, int32_t n_fixed,
               int32_t cap)
{
    int32_t fit = (int32_t) floor((target - a) / b + 1e-6) - n_fixed;

    if (n_fixed == 0) {
        return cap;
    }

    fit = fit < cap - n_fixed ? fit : cap - n_fixed;
    return fit > NALAR_BUDGET_MIN_CHUNK ? fit : NALAR_BUDGET_MIN_CHUNK;
}


/* Every step's decision against the fake clock's costs: the allowance is
 * what fits, and the step carried the allowance or every pending prompt
 * token.  Counts the steps where the minimum chunk and where the fit
 * decided. */
static int
check_steps(const step_log *l, int from, int to, double target, double a,
            double b, int32_t cap, int32_t tol, int *n_min, int *n_fit,
            const char *what)
{
    int bad = 0;

    for (int i = from; i < to && i < MAX_STEPS; i++) {
        const nalar_test_step *s = &l->s[i];
        int32_t want = expected_allow(target, a, b, s->n_fixed, cap);
        int32_t carry = s->pending < s->allowance ? s->pending
                                                  : s->allowance;

        if (abs(s->allowance - want) > tol || s->n_prefill != carry) {
            if (bad++ < 3) {
                diag("%s: step %d: %d fixed, allowance %d (want %d), "
                     "carried %d of %d pending", what, i, s->n_fixed,
                     s->allowance, want, s->n_prefill, s->pending);
            }
        }
        if (s->pending > 0) {
            *n_min += want == NALAR_BUDGET_MIN_CHUNK;
            *n_fit += want != NALAR_BUDGET_MIN_CHUNK;
        }
    }
    return bad;
}


static void
test_admission(void)
{
    nalar_engine *e = engine_budget(0, 0.100, 0);
    step_log     *l = calloc(1, sizeof(*l));
    collected    *out = calloc(64, sizeof(collected));
    nalar_metrics m;
    int           n_min = 0, n_fit = 0, bad, starved = 0, over;

    ok(e != NULL, "engine with a 100 ms target loads");
    if (e == NULL) {
        free(l);
        free(out);
        return;
    }
    /* 10 ms per step, 2 ms per token: 45 tokens fit 100 ms */
    nalar_engine_test_step_cost(e, 0.010, 0.002, 1);
    l->e = e;
    nalar_engine_test_step_fn(e, on_step, l);
    is_int(run_mix(e, 6, 3, 300, out), 9,
           "6 short and 3 300-token prompts all finish");
    bad = check_steps(l, 0, l->n, 0.100, 0.010, 0.002, 512, 0, &n_min, &n_fit,
                      "6 + 3");
    is_int(bad, 0, "each of %d steps admitted what fits 100 ms at 10 ms + "
           "2 ms/token, or every pending prompt token", l->n);
    ok(n_fit > 0 && n_min == 0, "with 6 decodes the fit decides "
       "(%d steps fit, %d minimum)", n_fit, n_min);
    for (int i = 0; i < l->n && i < MAX_STEPS; i++) {
        starved += l->s[i].pending > 0 && l->s[i].n_prefill == 0;
    }
    is_int(starved, 0, "no step left a pending prompt without a chunk");
    /* the first step: 9 prompts (930 tokens), nothing decoding yet */
    ok(l->n > 0 && l->s[0].n_fixed == 0 && l->s[0].allowance == 512
       && l->s[0].n_prefill == 512, "the first step, nothing decoding, "
       "carried 512 prompt tokens (the cap), not the 45 that fit 100 ms "
       "(allowance %d, carried %d)", l->n > 0 ? l->s[0].allowance : -1,
       l->n > 0 ? l->s[0].n_prefill : -1);
    nalar_engine_metrics(e, &m);
    is_int(m.step_count, l->n, "the step histogram counts every step");
    is_int(m.step_buckets[NALAR_HIST_BUCKETS - 1], l->n,
           "...its +Inf bucket too");
    over = 0;
    for (int i = 0; i < l->n && i < MAX_STEPS; i++) {
        over += l->s[i].n_fixed > 0 && l->s[i].seconds > 0.100;
    }
    ok(l->s[0].seconds > 0.100, "...a step of %.0f ms: longer than the "
       "target, with no stream waiting on it", l->s[0].seconds * 1e3);
    is_int(m.steps_over_target_total, over, "steps over the target count "
           "those with decodes only (%d)", over);

    /* a 300-token prompt alone on an idle engine: one step, where the
     * target would have cut it into 7 */
    memset(l, 0, sizeof(*l));
    l->e = e;
    is_int(run_mix(e, 0, 1, 300, out), 1, "a 300-token prompt alone "
           "finishes");
    ok(l->n == 8 && l->s[0].n_prefill == 300 && l->s[1].n_fixed == 1,
       "...prefilled in its first step (300 tokens), then decoded: 8 "
       "steps for 8 tokens (%d steps, the first carried %d)", l->n,
       l->n > 0 ? l->s[0].n_prefill : -1);

    /* 4 ms per token: 22 tokens fit 100 ms, so 16 decodes leave 6, fewer
     * than the minimum chunk, which decides */
    nalar_engine_test_step_cost(e, 0.010, 0.004, 1);
    memset(l, 0, sizeof(*l));
    l->e = e;
    n_min = n_fit = 0;
    is_int(run_mix(e, 16, 2, 300, out), 18,
           "16 short and 2 300-token prompts all finish");
    bad = check_steps(l, 0, l->n, 0.100, 0.010, 0.004, 512, 0, &n_min, &n_fit,
                      "16 + 2");
    is_int(bad, 0, "each of %d steps admitted what fits, or the minimum "
           "chunk", l->n);
    ok(n_min > 0, "the minimum chunk decided %d steps (a prompt never "
       "waits for decodes to end)", n_min);
    nalar_engine_metrics(e, &m);
    ok(m.steps_over_target_total > 0, "steps over the target are counted "
       "(%llu of %llu)", (unsigned long long) m.steps_over_target_total,
       (unsigned long long) m.step_count);

    /* a loose target: the cap (max_batch_tokens) decides */
    memset(l, 0, sizeof(*l));
    l->e = e;
    n_min = n_fit = 0;
    nalar_engine_destroy(e);
    e = engine_budget(128, 10.0, 0);
    if (e != NULL) {
        nalar_engine_test_step_cost(e, 0.010, 0.002, 1);
        nalar_engine_test_step_fn(e, on_step, l);
        run_mix(e, 6, 3, 300, out);
        bad = check_steps(l, 0, l->n, 10.0, 0.010, 0.002, 128, 0, &n_min,
                          &n_fit, "loose");
        is_int(bad, 0, "10 s target, max_batch_tokens 128: each step "
               "admitted up to the cap (%d steps)", l->n);
    }
    nalar_engine_destroy(e);
    free(l);
    free(out);
}


/* The clock slows 2x mid-run: the allowance follows within a few steps. */
static void
test_adapt(void)
{
    nalar_engine *e = engine_budget(0, 0.100, 0);
    step_log     *l = calloc(1, sizeof(*l));
    collected    *out = calloc(64, sizeof(collected));
    int           n_min = 0, n_fit = 0, settle = 12, bad, shrank = 0;
    int           over = 0;

    if (e == NULL) {
        ok(0, "engine loads");
        free(l);
        free(out);
        return;
    }
    /* 1 ms per token, then 2 ms from step 6 on (mid-prefill) */
    nalar_engine_test_step_cost(e, 0.005, 0.001, 1);
    l->e = e;
    l->switch_at = 6;
    l->a2 = 0.010;
    l->b2 = 0.002;
    nalar_engine_test_step_fn(e, on_step, l);
    /* 8 long prompts: the first step (nothing decoding) takes 512 of
     * their 3,200 tokens, the rest wait beside the decodes */
    run_mix(e, 4, 8, 400, out);
    bad = check_steps(l, 0, 5, 0.100, 0.005, 0.001, 512, 0, &n_min, &n_fit,
                      "before");
    is_int(bad, 0, "before the slowdown: what fits 5 ms + 1 ms/token");
    for (int i = 6; i < l->n && i < MAX_STEPS; i++) {
        /* the whole step's fit: 95 tokens before, 45 after */
        shrank += i < 6 + settle && l->s[i].pending > 0
                  && l->s[i].allowance + l->s[i].n_fixed <= 85;
        over += l->s[i].seconds > 0.100;
    }
    ok(shrank > 0, "the allowance shrinks within %d steps of the "
       "slowdown", settle);
    n_min = n_fit = 0;
    bad = check_steps(l, 6 + 3 * settle, l->n, 0.100, 0.010, 0.002, 512, 1,
                      &n_min, &n_fit, "after");
    ok(l->n > 6 + 3 * settle + 5 && bad == 0, "%d steps after the "
       "slowdown settled on what fits 10 ms + 2 ms/token (%d steps in all, "
       "%d over 100 ms)", 3 * settle, l->n, over);
    ok(over <= 2 * settle, "steps over the target while it adapts: %d",
       over);
    nalar_engine_destroy(e);
    free(l);
    free(out);
}


/*
 * Speculation under a target: streams proposing 4 tokens each (n-gram,
 * fixed k) beside two 400-token prompts (the first step, with nothing
 * decoding, takes 512 of their tokens; the rest wait beside the decodes),
 * steps costing 10 ms + 2 ms per token, a 60 ms target (25 tokens).
 * Where the decodes and the minimum prompt chunk fit the target, the
 * step's proposals fit what it leaves beside the decodes and the prompt
 * tokens waiting (up to what the target allows them): a waiting prompt's
 * room is never a proposal's, and a step with no room proposes nothing;
 * where they overrun it (10 streams and a waiting prompt), proposals are
 * the cost model's to choose.
 */
static int
spec_room_run(int n_short, int *with, int *none, int *over, int *yielded)
{
    nalar_engine *e = engine_budget(0, 0.060, 1);
    step_log     *l = calloc(1, sizeof(*l));
    collected    *out = calloc(64, sizeof(collected));
    int           bad = 0;

    if (e == NULL || l == NULL || out == NULL) {
        nalar_engine_destroy(e);
        free(l);
        free(out);
        return -1;
    }
    nalar_engine_test_step_cost(e, 0.010, 0.002, 1);
    l->e = e;
    nalar_engine_test_step_fn(e, on_step, l);
    is_int(run_mix(e, n_short, 2, 400, out), n_short + 2,
           "%d speculating streams and 2 400-token prompts all finish",
           n_short);
    for (int i = 0; i < l->n && i < MAX_STEPS; i++) {
        const nalar_test_step *s = &l->s[i];
        int32_t reserve = s->pending < NALAR_BUDGET_MIN_CHUNK
                          ? s->pending : NALAR_BUDGET_MIN_CHUNK;
        int32_t room = 25 - s->n_decode - reserve;
        int32_t props = s->n_fixed - s->n_decode;

        if (room < 0) {
            *over += props > 0;
            continue;
        }
        /* the prompts' share: what waits, up to the room beside the
         * decodes (the minimum chunk at least) */
        reserve = 25 - s->n_decode;
        reserve = reserve > NALAR_BUDGET_MIN_CHUNK ? reserve
                                                   : NALAR_BUDGET_MIN_CHUNK;
        reserve = s->pending < reserve ? s->pending : reserve;
        room = 25 - s->n_decode - reserve;
        room = room > 0 ? room : 0;
        *yielded += s->pending > 0 && room == 0 && s->n_decode > 0
                    && s->n_prefill == reserve;
        if (props > room && bad++ < 3) {
            diag("step %d: %d decodes, %d proposals, %d prompt tokens "
                 "pending: room for %d", i, s->n_decode, props, s->pending,
                 room);
        }
        *with += props > 0;
        *none += props == 0 && room == 0 && s->n_decode > 0;
    }
    nalar_engine_destroy(e);
    free(l);
    free(out);
    return bad;
}


static void
test_spec_room(void)
{
    int with = 0, none = 0, over = 0, yielded = 0;

    is_int(spec_room_run(6, &with, &none, &over, &yielded), 0,
           "6 streams: every step's proposals fit what 60 ms leaves beside "
           "its decodes and the prompt tokens waiting");
    ok(with > 0, "...steps with room proposed (%d)", with);
    ok(yielded > 0, "...steps where prompts waited for all the room "
       "carried them, and no proposal (%d)", yielded);
    with = none = over = yielded = 0;
    is_int(spec_room_run(9, &with, &none, &over, &yielded), 0,
           "9 streams: the same");
    ok(none > 0, "...a step with no room proposed nothing (%d)", none);
    with = none = over = yielded = 0;
    is_int(spec_room_run(10, &with, &none, &over, &yielded), 0,
           "10 streams: the same wherever the target can be held");
    ok(over > 0, "...and steps whose decodes and minimum chunk overrun "
       "60 ms still speculate (%d)", over);
}


/* --- results do not depend on the budget -------------------------------- */

typedef struct {
    const char *name;
    int32_t     chunk;
    double      target;
    int         fake;        /* fake clock: 10 ms + 2 ms per token */
    int         spec;
} budget_cfg;


/* Steps that carried decodes, and all steps */
typedef struct {
    uint64_t with_decodes, all;
} step_count;


static void
count_step(void *arg, const nalar_test_step *st)
{
    step_count *c = arg;

    c->with_decodes += st->n_fixed > 0;
    c->all++;
}


static void
test_greedy(void)
{
    static const budget_cfg cfgs[] = {
        { "fixed 512", 512, 0, 0, 0 },
        { "fixed 128", 128, 0, 0, 0 },
        { "auto, 1 us target (minimum chunks)", 0, 1e-6, 0, 0 },
        { "auto, 10 s target", 0, 10.0, 0, 0 },
        { "auto, 100 ms, fake clock", 0, 0.100, 1, 0 },
        { "auto, 1 us, n-gram speculation (none fits)", 0, 1e-6, 0, 1 },
        { "auto, 60 ms, fake clock, n-gram speculation", 0, 0.060, 1, 1 },
        { "auto, 1 us, at most 16 tokens", 16, 1e-6, 0, 0 },
    };
    static collected long_alone;
    collected *base = calloc(16, sizeof(collected));
    collected *out = calloc(16, sizeof(collected));

    for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
        const budget_cfg *k = &cfgs[c];
        nalar_engine     *e = engine_budget(k->chunk, k->target, k->spec);
        nalar_request    *reqs[16];
        nalar_metrics     m;
        nalar_err         err;
        step_count        sc = { 0, 0 };
        int               n = 0, good = 1;

        if (e == NULL) {
            ok(0, "%s: engine loads", k->name);
            continue;
        }
        nalar_engine_test_step_fn(e, count_step, &sc);
        if (k->fake) {
            nalar_engine_test_step_cost(e, 0.010, 0.002, 1);
        }
        /* alone */
        reqs[0] = greedy_req(ref_prompt, 5, N_GEN, &out[0]);
        nalar_engine_run_sync(e, reqs, 1, &err);
        ok(out[0].n == N_GEN && same(out[0].ids, ref_ids, N_GEN),
           "%s: alone, the reference ids", k->name);
        nalar_request_unref(reqs[0]);

        /* a long prompt alone: chunks with nothing beside them */
        reqs[0] = greedy_req(filler, 300, 12, &out[0]);
        nalar_engine_run_sync(e, reqs, 1, &err);
        if (c == 0) {
            long_alone = out[0];
        }
        ok(out[0].n == 12 && same(out[0].ids, long_alone.ids, 12),
           "%s: a 300-token prompt alone, fixed 512's ids", k->name);
        nalar_request_unref(reqs[0]);

        /* batched: the reference, long prompts, short ones */
        for (int i = 0; i < 4; i++) {
            reqs[n] = greedy_req(filler + 13 * i, 150 + 70 * i, 12,
                                 &out[n]);
            n++;
        }
        reqs[n] = greedy_req(ref_prompt, 5, N_GEN, &out[n]);
        n++;
        for (int i = 0; i < 5; i++) {
            reqs[n] = greedy_req(filler + 5 * i, 3 + i, 20, &out[n]);
            n++;
        }
        nalar_engine_run_sync(e, reqs, n, &err);
        ok(out[4].n == N_GEN && same(out[4].ids, ref_ids, N_GEN),
           "%s: batched with long and short prompts, the reference ids",
           k->name);
        for (int i = 0; i < n; i++) {
            if (c == 0) {
                base[i] = out[i];
            }
            good &= out[i].n == base[i].n
                    && same(out[i].ids, base[i].ids, out[i].n);
            nalar_request_unref(reqs[i]);
        }
        ok(good, "%s: every request's ids equal fixed 512's", k->name);
        nalar_engine_metrics(e, &m);
        if (k->target > 0 && k->target < 1e-3 && !k->fake
            && k->chunk == 0)
        {
            ok(m.steps_over_target_total == sc.with_decodes
               && sc.with_decodes > 0 && sc.with_decodes < sc.all
               && m.step_count == sc.all, "%s: every step with decodes "
               "is counted over 1 us, none without (%llu of %llu, %llu "
               "with decodes)", k->name,
               (unsigned long long) m.steps_over_target_total,
               (unsigned long long) m.step_count,
               (unsigned long long) sc.with_decodes);
            is_int(m.step_prefill_budget, NALAR_BUDGET_MIN_CHUNK,
                   "%s: the budget gauge says the minimum chunk", k->name);
        }
        if (k->target <= 0) {
            is_int(m.steps_over_target_total, 0,
                   "%s: no target, no step counted over it", k->name);
        }
        nalar_engine_destroy(e);
    }
    free(base);
    free(out);
}


int
main(void)
{
    for (int i = 0; i < 480; i++) {
        filler[i] = 300 + (i * 37) % 1500;
    }
    test_model();
    test_admission();
    test_adapt();
    test_spec_room();
    test_greedy();
    return done_testing();
}
