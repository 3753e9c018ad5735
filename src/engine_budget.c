/*
 * The step budget, engine side: how many prompt tokens a step may carry
 * beside its decodes (a fixed max_batch_tokens, or what the cost model of
 * budget.h says fits opts.itl_target), what the model first knows (a few
 * passes timed at load), and what each step teaches it and the metrics
 * (the step-duration histogram, the steps over the target).
 *
 * Threads: the engine thread; e->mu for the metrics.
 */
#include <pthread.h>
#include <stdlib.h>

#include "backend.h"
#include "budget.h"
#include "clock.h"
#include "engine_internal.h"
#include "kv.h"

/* budget_seed: passes of these sizes, twice each (the faster kept), after
 * one untimed pass of the largest that brings the weights in */
#define SEED_MAX     64
#define SEED_ROUNDS  2
#define SEED_BUDGET  0.5      /* seconds at most */

static const int32_t seed_sizes[] = { 1, 16, SEED_MAX };
#define N_SEED ((int) (sizeof(seed_sizes) / sizeof(seed_sizes[0])))


/*
 * What a step of 1, 16 and 64 tokens costs on this backend, so the first
 * prompt that arrives is chunked to the target rather than taken whole.
 * A step's own costs (sampling, bookkeeping) come in with the first steps
 * served; the seed fades from the fit within a few dozen.  Skipped when the
 * pool cannot spare the scratch sequence: the model then learns from the
 * first steps alone (the first may be a full max_batch_tokens).
 */
void
budget_seed(nalar_engine *e)
{
    int32_t       tok[SEED_MAX], pos[SEED_MAX];
    int8_t        want[SEED_MAX];
    nalar_seq_kv  s, *seq[SEED_MAX];
    nalar_batch   b = { 0, tok, pos, seq, want, 0, NULL };
    double        best[N_SEED], t_end = nalar_now_s() + SEED_BUDGET, t0;
    int32_t       V = e->model->cfg.n_vocab;
    float        *logits = nalar_alloc_lines((size_t) V * sizeof(float));
    nalar_err     err;

    nalar_budget_init(&e->budget);
    nalar_seq_kv_init(&s);
    if (logits == NULL
        || nalar_seq_kv_reserve(&e->kv, &s, SEED_MAX + 1) != 0)
    {
        goto done;
    }
    for (int32_t i = 0; i < SEED_MAX; i++) {
        tok[i] = (int32_t) ((i * 7919L + 11) % V);
        seq[i] = &s;
    }
    for (int k = 0; k < N_SEED; k++) {
        best[k] = -1;
    }
    for (int round = -1; round < SEED_ROUNDS; round++) {
        for (int k = round < 0 ? N_SEED - 1 : 0; k < N_SEED; k++) {
            int32_t n = seed_sizes[k];

            if (nalar_now_s() > t_end) {
                goto record;
            }
            /* a prompt's chunk at 0..n-1, or one decode after it */
            for (int32_t i = 0; i < n; i++) {
                pos[i] = n == 1 ? SEED_MAX : i;
                want[i] = i == n - 1;
            }
            b.n_tokens = n;
            b.n_logits = 1;
            t0 = nalar_now_s();
            if (e->be->forward(e->be, &e->kv, &b, logits, &err) != 0) {
                goto record;
            }
            t0 = nalar_now_s() - t0;
            s.n_pos = SEED_MAX;
            if (round >= 0 && (best[k] < 0 || t0 < best[k])) {
                best[k] = t0;
            }
        }
    }
record:
    for (int k = 0; k < N_SEED; k++) {
        if (best[k] > 0) {
            nalar_budget_record(&e->budget, seed_sizes[k], best[k]);
        }
    }
done:
    nalar_seq_kv_release(&e->kv, &s);
    free(logits);
}


/*
 * Prompt tokens this step may carry beside the n_fixed tokens (decodes and
 * their proposals) already batched.  Fixed budget: what max_batch_tokens
 * leaves (<= 0: none, exactly as it always was).  With a target: what the
 * cost model says fits it, at least NALAR_BUDGET_MIN_CHUNK (prefill never
 * starves), and within max_batch_tokens (the minimum chunk included); but
 * a step that carries no decode (n_fixed 0: every running request is
 * prefilling) has no stream waiting for its next token, so nothing for
 * the target to protect: it takes max_batch_tokens, and the prompts get
 * their first tokens in fewer, larger steps, which cost less per token
 * (a prompt alone on an idle server is prefilled in one step up to 512
 * tokens, where the target would cut it into many).
 */
int32_t
step_prefill_allowance(nalar_engine *e, int32_t n_fixed)
{
    int32_t n;

    if (!(e->opts.itl_target > 0) || n_fixed == 0) {
        return e->opts.max_batch_tokens - n_fixed;
    }
    n = nalar_budget_prefill(&e->budget, e->opts.itl_target, n_fixed,
                             e->opts.max_batch_tokens - n_fixed);
    /* the minimum chunk too stays within max_batch_tokens: the batch has
     * room for that many beside the decodes (engine_step) */
    return n < e->opts.max_batch_tokens ? n : e->opts.max_batch_tokens;
}


/*
 * Proposal tokens this step may add to its n_decode decodes: what the
 * target leaves beside them and the n_prefill prompt tokens the step
 * carries (those waiting, up to the allowance beside the decodes), so
 * that proposals never push a step past a target it could hold, and never
 * take a waiting prompt's room: speculation backs off while prompts wait
 * (it makes running streams' tokens cheaper; the prompts' first tokens
 * come first), and has the whole room again once none does.  -1: no limit
 * -- a fixed budget, nothing measured yet, or a target the decodes and the
 * minimum chunk overrun already (a machine slower than the target allows):
 * every step then misses it whatever it proposes, and proposals that are
 * accepted make each token cheaper, as the cost model judges them.
 */
int32_t
step_proposal_room(nalar_engine *e, int32_t n_decode, int32_t n_prefill)
{
    int64_t fit, room;

    if (!(e->opts.itl_target > 0)) {
        return -1;
    }
    fit = nalar_budget_fit(&e->budget, e->opts.itl_target);
    if (fit < 0) {
        return -1;
    }
    if (fit - n_decode - (n_prefill < NALAR_BUDGET_MIN_CHUNK
                          ? n_prefill : NALAR_BUDGET_MIN_CHUNK) < 0)
    {
        return -1;
    }
    room = fit - n_decode - n_prefill;
    return room < 0 ? 0 : room >= INT32_MAX ? INT32_MAX : (int32_t) room;
}


/* Seconds a step took: measured, or what a test says it costs. */
static double
step_seconds(nalar_engine *e, const step_plan *sp, double t0, double t1)
{
#ifdef NALAR_TEST_HOOKS
    if (e->test_cost_set) {
        return e->test_cost_a + e->test_cost_b * sp->n_tok;
    }
#endif
    return t1 - t0;
}


/*
 * A finished step: the cost model learns what its batch cost (from
 * admission on: tokenizing new prompts depends on nothing the budget
 * decides), the metrics see the whole step.
 */
void
step_budget_learn(nalar_engine *e, const step_plan *sp)
{
    double t = nalar_now_s();
    double model_s = step_seconds(e, sp, sp->t_plan, t);
    double step_s = step_seconds(e, sp, sp->t_start, t);

    if (e->opts.itl_target > 0) {
        nalar_budget_record(&e->budget, sp->n_tok, model_s);
    }
    pthread_mutex_lock(&e->mu);
    hist_add(e->m.step_buckets, &e->m.step_sum, &e->m.step_count, step_s);
    /* over the target counts where a stream waited on the step: a step
     * with no decode may be longer by design (step_prefill_allowance) */
    e->m.steps_over_target_total += e->opts.itl_target > 0 && sp->n_fixed > 0
                                    && step_s > e->opts.itl_target;
    e->m.step_prefill_budget = sp->prefill_allow;
    pthread_mutex_unlock(&e->mu);
#ifdef NALAR_TEST_HOOKS
    if (e->step_fn != NULL) {
        nalar_test_step st;

        st.n_decode = sp->n_decode;
        st.n_fixed = sp->n_fixed;
        st.n_prefill = sp->n_prefill_tok;
        st.allowance = sp->prefill_allow;
        st.pending = sp->prefill_pending;
        st.seconds = step_s;
        e->step_fn(e->step_arg, &st);
    }
#endif
}
