/*
 * Speculative decoding's planning on the engine thread: each request's
 * proposer (spec_setup), the cost tables' seed (cost_seed), how many tokens
 * each decoding request proposes this step under the step gate and the
 * cost model (choose_k), the proposals themselves (n-gram lookup, the
 * client's prediction, the draft model's passes), and what a step teaches
 * the step gate and the probe budget (step_learn).  The cost model, the
 * gate and the acceptance estimates are spec.c; verifying proposals is
 * engine_step.c's verify, which draws the target's tokens as plain
 * decoding does.
 *
 * Threads: the engine thread only (e->mu taken for metrics).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "engine_internal.h"
#include "kv.h"
#include "spec.h"


/* cost_seed: passes of one sequence of 1 .. NALAR_SPEC_MAX_K + 1 tokens
 * (the last confirmed token and up to k proposals), after a prompt */
#define SEED_POS     32
#define SEED_ROUNDS  12        /* as many as the CPU backend needs to
                                  settle which way each size runs */
#define SEED_BUDGET  0.5       /* seconds at most (a large model on a CPU
                                  measures what the budget allows) */


/*
 * Seed a cost table with what passes of 1 .. NALAR_SPEC_MAX_K + 1 tokens of
 * one sequence cost on `be`: the fastest of up to SEED_ROUNDS rounds, the
 * sizes interleaved so that a slow spell of the machine falls on all alike.
 * Every size is measured before the cost model first chooses k: the model
 * measures only the sizes it chooses, so a size it has not measured would
 * stand at what interpolation or one slow first pass says, and one such
 * estimate can fix k at a worse size for good (and the step gate, judging
 * the draft by those steps, hold the draft back).
 *
 * The same passes settle what the backend measures of its own passes (the
 * CPU's: which way each size runs, see choose_way), so the first steps
 * that speculate, and the step gate judging them, do not carry that
 * measurement.  The costs recorded are of passes with the model's weights
 * hot in cache, which a serving pass need not have (a draft's, after a
 * target's, runs colder); serving passes correct them.
 * Skipped when the pool cannot spare the scratch sequence's blocks.
 */
void
cost_seed(nalar_backend *be, nalar_kv_pool *kv, int32_t n_vocab,
          nalar_cost_table *cost)
{
    enum { N = NALAR_SPEC_MAX_K + 1 };
    int32_t       tok[SEED_POS], pos[SEED_POS];
    int8_t        want[SEED_POS];
    nalar_seq_kv  s, *seq[SEED_POS];
    nalar_batch   b = { 0, tok, pos, seq, want, 0, NULL };
    double        best[N + 1], t_end = nalar_now_s() + SEED_BUDGET;
    float        *logits = nalar_alloc_lines((size_t) N * n_vocab
                                             * sizeof(float));
    nalar_err     err;

    nalar_seq_kv_init(&s);
    if (logits == NULL || nalar_seq_kv_reserve(kv, &s, SEED_POS + N) != 0) {
        goto done;
    }
    for (int32_t i = 0; i < SEED_POS; i++) {
        tok[i] = (int32_t) ((i * 7919L + 11) % n_vocab);
        pos[i] = i;
        seq[i] = &s;
        want[i] = i == SEED_POS - 1;
    }
    b.n_tokens = SEED_POS;
    b.n_logits = 1;
    if (be->forward(be, kv, &b, logits, &err) != 0) {
        goto done;
    }
    s.n_pos = SEED_POS;
    for (int n = 0; n <= N; n++) {
        best[n] = -1;
    }
    for (int round = 0; round < SEED_ROUNDS; round++) {
        for (int32_t n = 1; n <= N; n++) {
            double t0;

            if (nalar_now_s() > t_end) {
                goto record;
            }
            for (int32_t i = 0; i < n; i++) {
                pos[i] = SEED_POS + i;
                want[i] = 1;
            }
            b.n_tokens = n;
            b.n_logits = n;
            t0 = nalar_now_s();
            if (be->forward(be, kv, &b, logits, &err) != 0) {
                goto record;
            }
            t0 = nalar_now_s() - t0;
            best[n] = best[n] < 0 || t0 < best[n] ? t0 : best[n];
        }
    }
record:
    for (int32_t n = 1; n <= N; n++) {
        if (best[n] > 0) {
            nalar_cost_record(cost, n, best[n]);
        }
    }
done:
    nalar_seq_kv_release(kv, &s);
    free(logits);
}


/* A request's acceptance estimates (but for its own prediction's) are
 * pulled toward its proposer's over all requests, as if by this many
 * observations (nalar_accept_blend). */
#define ACC_PRIOR_WEIGHT 4


/* Pick the request's proposer from its mode, the engine's and what the
 * engine has; prepare draft sampling state. */
int
spec_setup(nalar_engine *e, nalar_request *r)
{
    int mode = r->p.spec_mode != NALAR_SPEC_DEFAULT ? r->p.spec_mode
                                                    : e->opts.spec_mode;
    int kmax = r->p.spec_max_k > 0 ? r->p.spec_max_k : e->opts.spec_max_k;

    r->spec_k_max = kmax > 0 ? kmax : 4;
    if (r->spec_k_max > NALAR_SPEC_MAX_K) {
        r->spec_k_max = NALAR_SPEC_MAX_K;
    }
    if (e->opts.spec_fixed_k > 0) {
        r->spec_k_max = e->opts.spec_fixed_k < NALAR_SPEC_MAX_K
                        ? e->opts.spec_fixed_k : NALAR_SPEC_MAX_K;
    }
    r->prop = NALAR_PROP_NONE;
    if (r->n_pred > 0) {
        /* the client's own prediction is the best proposal there is */
        r->prop = NALAR_PROP_PREDICTION;
    } else if (mode == NALAR_SPEC_DRAFT || mode == NALAR_SPEC_AUTO) {
        r->prop = e->draft != NULL ? NALAR_PROP_DRAFT
                  : mode == NALAR_SPEC_AUTO ? NALAR_PROP_NGRAM
                  : NALAR_PROP_NONE;
    } else if (mode == NALAR_SPEC_NGRAM) {
        r->prop = NALAR_PROP_NGRAM;
    }
    r->ngram_fallback = mode == NALAR_SPEC_AUTO
                        && r->prop == NALAR_PROP_DRAFT;
    r->prop_now = r->prop;
    nalar_accept_init(&r->acc, r->prop == NALAR_PROP_PREDICTION ? 0.9
                               : r->prop == NALAR_PROP_DRAFT ? 0.7 : 0.5);
    nalar_accept_init(&r->acc_ngram, 0.5);
    return 0;
}


#define PRED_TAIL   3    /* output tokens that re-anchor the alignment */
#define PRED_REACH  32   /* farthest shift a nearby tail match explains,
                            and the longest changed span it outlasts */


/*
 * The client's prediction: the output should run along it.  r->pred_off is
 * the alignment (prediction index - output index); returns the prediction
 * index the next output token should be, or -1 when the output's tail is
 * nowhere in the prediction.
 *
 * Edits the client did not foresee show up as mismatches at the current
 * alignment, newest first:
 *   - fewer than PRED_TAIL in a row: substituted tokens (a renamed
 *     identifier); the alignment holds;
 *   - more: either the text shifted (an insertion or a deletion), and the
 *     output's last PRED_TAIL tokens occur again in the prediction within
 *     PRED_REACH of the alignment -- it moves there -- or a whole phrase
 *     was rewritten: the alignment holds, and once the phrase ends (up to
 *     PRED_REACH tokens) the output runs along the prediction again where
 *     it was.  Where the tail recurs nearby (repetitive text: a rewritten
 *     phrase's own tokens recur a period away), the nearest occurrence
 *     ahead wins: moving back would meet the same edit again, step after
 *     step, where moving ahead skips it;
 *   - more than PRED_REACH: the output left the prediction; the alignment
 *     moves to the tail's nearest occurrence anywhere, or there is none.
 * A move needs PRED_TAIL matching tokens: a shorter tail recurs
 * everywhere.
 */
static int32_t
pred_align(nalar_request *r)
{
    const int32_t *out = r->tokens + r->p.n_prompt, *pred = r->pred;
    int32_t        g = r->n_generated, at = g + r->pred_off;
    int32_t        run = 0, tail = g < PRED_TAIL ? g : PRED_TAIL;
    int32_t        best = -1, ahead = -1;

    /* newest output tokens that differ from the prediction where aligned */
    while (run < g && run <= PRED_REACH
           && (at - 1 - run < 0 || at - 1 - run >= r->n_pred
               || out[g - 1 - run] != pred[at - 1 - run]))
    {
        run++;
    }
    if (run < PRED_TAIL && at >= 0 && at <= r->n_pred) {
        return at;
    }
    /* the tail's occurrences: within PRED_REACH of the alignment (a
     * shift: the nearest one ahead, else the nearest), or anywhere once
     * the output has left the prediction (the nearest) */
    for (int32_t s = 0; tail > 0 && s + tail <= r->n_pred; s++) {
        int32_t to = s + tail;

        if ((run <= PRED_REACH && labs((long) (to - at)) > PRED_REACH)
            || memcmp(pred + s, out + g - tail,
                      (size_t) tail * sizeof(int32_t)) != 0)
        {
            continue;
        }
        if (to > at) {
            ahead = ahead < 0 || to < ahead ? to : ahead;
        }
        if (best < 0 || labs((long) (to - at)) < labs((long) (best - at))) {
            best = to;
        }
    }
    best = run <= PRED_REACH && ahead >= 0 ? ahead : best;
    if (best >= 0) {
        r->pred_off = best - g;
        return best;
    }
    return run <= PRED_REACH && at >= 0 && at <= r->n_pred ? at : -1;
}


/* Context-free proposals: n-gram lookup over the sequence so far, or the
 * client's prediction.  Returns the number proposed (<= k). */
static int32_t
propose_lookup(nalar_request *r, int32_t k)
{
    int32_t at, n;

    if (r->prop_now == NALAR_PROP_NGRAM) {
        return nalar_ngram_propose(r->tokens, r->n_tokens, r->tokens,
                                   r->n_tokens, 1, 3, k, r->props);
    }
    at = pred_align(r);
    if (at < 0) {
        return 0;
    }
    n = r->n_pred - at < k ? r->n_pred - at : k;
    memcpy(r->props, r->pred + at, (size_t) (n > 0 ? n : 0)
                                   * sizeof(int32_t));
    return n > 0 ? n : 0;
}


/* The gate's mix of this step: the bits of the decoding requests' current
 * proposers; with `ngram`, as if those that may fall back to n-gram lookup
 * (auto with a draft) did.  Requests at a `fixed` location are left out:
 * they speculate whatever the gate says, and set *any_fixed. */
static unsigned
step_mix(nalar_engine *e, int ngram, int *any_fixed)
{
    unsigned mix = 0;

    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];

        if (r->prop == NALAR_PROP_NONE || r->n_tokens - r->n_computed != 1) {
            continue;
        }
        if (r->p.spec_fixed) {
            *any_fixed = 1;
            continue;
        }
        mix |= ngram && r->ngram_fallback
               ? nalar_spec_gate_bit(NALAR_PROP_NGRAM, 0)
               : nalar_spec_gate_bit(r->prop_now, acc_now(r)->alpha[0]);
    }
    return mix;
}


/* A draft that must first catch up on more tokens than this (decoded
 * while it was not used) is cold: the gate does not count the catch-up
 * (see its record in engine_step), and choose_k weighs it. */
#define DRAFT_WARM 9


/*
 * Would r's cold draft repay its catch-up?  Yes when what is left of the
 * request (at most), decoded at `gain` over plain decoding (plain_tok:
 * r's share of a plain pass), saves more time than the draft takes to
 * catch up.  (For example, 16 streams draining to 5: a step's
 * catch-up of 10.8 ms -- 35 plain steps -- for requests with a few dozen
 * tokens left; catch-ups took 6% of the run.)
 */
static int
catchup_repays(nalar_engine *e, const nalar_request *r, double plain_tok,
               double gain)
{
    int32_t left = r->max_tokens - r->n_generated;
    double  cost = nalar_cost_estimate(&e->draft_cost,
                                       r->n_tokens - r->d_computed);

    return cost < 0 || left * plain_tok * (1 - 1 / gain) > cost;
}


/* How many tokens r should propose this step (0: plain decode); *probe
 * set when that k is a probe's (below), else left alone. */
static int32_t
choose_k(nalar_engine *e, nalar_request *r, int32_t n_decode,
         int32_t n_prefill, int32_t n_draft, int *probe)
{
    int32_t cap = r->spec_k_max, k;
    double  verify[NALAR_SPEC_MAX_K + 1], draft_tok = 0, gain;
    int     known = 1;
    nalar_accept_stats acc;

    /* never propose past max_tokens or the context */
    if (cap > r->max_tokens - r->n_generated - 1) {
        cap = r->max_tokens - r->n_generated - 1;
    }
    if (cap > r->cap_tokens - r->n_tokens) {
        cap = r->cap_tokens - r->n_tokens;
    }
    if (cap <= 0) {
        return 0;
    }
    if (e->opts.spec_fixed_k > 0 || r->p.spec_fixed) {
        return cap;
    }
    /* this request's share of a pass in which each of the n_decode
     * sequences verifies k proposals, next to n_prefill prompt tokens */
    for (int32_t j = 0; j <= cap; j++) {
        double tt = nalar_cost_estimate(&e->target_cost,
                                        n_prefill + n_decode * (1 + j));
        if (tt < 0) {
            known = 0;
            break;
        }
        verify[j] = tt / n_decode;
    }
    if (r->prop_now == NALAR_PROP_DRAFT) {
        double td = nalar_cost_estimate(&e->draft_cost,
                                        n_draft > 0 ? n_draft : 1);
        if (td < 0) {
            known = 0;
        } else {
            draft_tok = td / (n_draft > 0 ? n_draft : 1);
        }
    }
    if (!known) {
        /* measure before deciding: one request a step, as a probe (at 16
         * streams, every request's first draft catching up at once took
         * 3 ms, ten plain steps) */
        if (*probe) {
            return 0;
        }
        *probe = 1;
        return cap < 2 ? cap : 2;
    }
    if (r->prop_now == NALAR_PROP_PREDICTION) {
        acc = *acc_now(r);    /* one client's predictions: its own */
    } else {
        nalar_accept_blend(&acc, acc_now(r), &e->prop_acc[r->prop_now],
                           ACC_PRIOR_WEIGHT);
    }
    k = nalar_spec_choose_k(&acc, cap, verify, draft_tok, 1.03, &gain);
    if (k > 0 && r->prop_now == NALAR_PROP_DRAFT
        && r->n_tokens - r->d_computed > DRAFT_WARM)
    {
        /* a catch-up is repaid by the decode steps after this one, which
         * have no prompt tokens to make verification cheap.  The gain is
         * the larger of the model's and the one the gate measures for the
         * draft at this batch size: the model's alone sits near its
         * margin just when it turns k back on, so it would refuse
         * catch-ups ever longer as the draft fell further behind */
        double  g = gain, gm = nalar_spec_gate_ratio(
                                  &e->gate, n_decode,
                                  nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0));
        double  decode[NALAR_SPEC_MAX_K + 1], *d = verify;

        if (n_prefill > 0) {
            /* the same passes without the prompt tokens */
            for (int32_t j = 0; j <= cap; j++) {
                double tt = nalar_cost_estimate(&e->target_cost,
                                                n_decode * (1 + j));

                decode[j] = (tt > 0 ? tt : 0) / n_decode;
            }
            d = decode;
            nalar_spec_choose_k(&acc, cap, decode, draft_tok, 1.03, &g);
        }
        g = gm > g ? gm : g;
        if (!catchup_repays(e, r, d[0], g)) {
            k = 0;
        }
    }
    if (k == 0 && ++r->since_spec >= 16 && !*probe
        && nalar_probe_allow(&e->probe_pace))
    {
        /* probe now and then, alternating a short and a full proposal, so
         * both the acceptance estimates and the cost of larger passes stay
         * current (a cost measured once on a busy machine would otherwise
         * keep speculation off for good); one request a step, as the
         * engine's probe budget allows */
        r->since_spec = 0;
        r->probes++;
        *probe = 1;
        k = r->probes % 2 ? 1 : cap;
    } else if (k > 0) {
        /* now and then a neighbouring k, to keep its cost measured */
        k = nalar_spec_neighbour_k(k, cap, ++r->spec_steps);
    }
    if (k > 0) {
        r->since_spec = 0;
    }
    return k;
}


static int
dbatch_grow(nalar_engine *e, int32_t n)
{
    return batch_reserve(&e->dbatch, &e->dbatch_req, &e->dbatch_cap, n);
}


/*
 * Draft proposals for the requests in reqs[0..n) (each wants n_prop
 * tokens): the first pass brings the draft's KV up to the last confirmed
 * token (catch-up), later passes feed the previous proposal.  A request
 * whose draft KV cannot be reserved proposes nothing this step.  Returns
 * the seconds a cold draft's catch-up took beyond an ordinary pass (its
 * first pass beyond the measured cost of a pass of one token per
 * request), else 0.
 */
static double
draft_propose(nalar_engine *e, nalar_request **reqs, int32_t n)
{
    int32_t     V = e->model->cfg.n_vocab, kmax = 0;
    nalar_batch *b = &e->dbatch;
    nalar_err   err;
    double      t0 = nalar_now_s(), first_s = 0, plain_s;
    int         cold = 0;

    for (int32_t i = 0; i < n; i++) {
        kmax = reqs[i]->n_prop > kmax ? reqs[i]->n_prop : kmax;
        cold |= reqs[i]->n_tokens - reqs[i]->d_computed > DRAFT_WARM;
    }
    if (e->dlogits == NULL) {
        e->dlogits = nalar_alloc_lines((size_t) e->opts.max_running * V
                                       * sizeof(float));
        if (e->dlogits == NULL) {
            for (int32_t i = 0; i < n; i++) reqs[i]->n_prop = 0;
            return 0;
        }
    }
    for (int32_t s = 0; s < kmax; s++) {
        int32_t nt = 0, nl = 0;
        double  ts = nalar_now_s();

        for (int32_t i = 0; i < n; i++) {
            nalar_request *r = reqs[i];
            int32_t        from, to;

            if (s >= r->n_prop) {
                continue;
            }
            /* positions fed: catch-up [d_computed, n_tokens) first, then
             * proposal s-1 at n_tokens - 1 + s */
            from = s == 0 ? r->d_computed : r->n_tokens - 1 + s;
            to = r->n_tokens + s;
            if (dbatch_grow(e, nt + (to - from)) != 0
                || nalar_seq_kv_reserve(&e->dkv, &r->dkv, to) != 0)
            {
                r->n_prop = s;   /* propose what we have */
                continue;
            }
            for (int32_t p = from; p < to; p++) {
                b->tokens[nt] = p < r->n_tokens ? r->tokens[p]
                                                : r->props[p - r->n_tokens];
                b->pos[nt] = p;
                b->seq[nt] = &r->dkv;
                b->want_logits[nt] = p == to - 1;
                e->dbatch_req[nt] = r;
                nt++;
            }
            nl++;
        }
        if (nt == 0) {
            break;
        }
        b->n_tokens = nt;
        b->n_logits = nl;
        if (e->draft_be->forward(e->draft_be, &e->dkv, b, e->dlogits, &err)
            != 0)
        {
            for (int32_t i = 0; i < n; i++) {
                if (reqs[i]->n_prop > s) reqs[i]->n_prop = s;
            }
            break;
        }
        ts = nalar_now_s() - ts;
        nalar_cost_record(&e->draft_cost, nt, ts);
        if (s == 0) {
            first_s = ts;
        }
        for (int32_t k = 0, li = 0; k < nt; k++) {
            nalar_request *r = e->dbatch_req[k];
            float         *row;

            if (!b->want_logits[k]) {
                continue;
            }
            row = e->dlogits + (size_t) li++ * V;
            r->d_computed = b->pos[k] + 1;
            r->dkv.n_pos = r->d_computed;
            /* the draft proposes its most likely token: a point-mass
             * proposal, verified by sampling the target (see verify) */
            r->props[s] = nalar_argmax(row, V);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_draft_seconds_total += nalar_now_s() - t0;
    pthread_mutex_unlock(&e->mu);
    /* a cold draft's first pass beyond an ordinary pass of one token per
     * request (as measured): the catch-up */
    plain_s = nalar_cost_estimate(&e->draft_cost, n);
    return cold && plain_s > 0 && first_s > plain_s ? first_s - plain_s : 0;
}


/*
 * auto with a draft: should this step's draft requests propose by n-gram
 * lookup instead?  Yes where the gate holds the draft back; otherwise by
 * the gate's measured rates of the two mixes: the faster one, the other
 * one step in 64 to keep its rate current (n-gram lookup one step in 8
 * until its rate is known).  A draft still without a rate of its own
 * counts as plain decoding, which the lookup must beat by the gate's
 * margin: a draft whose cost model keeps choosing k = 0 never gets a
 * rate, and its steps are plain ones (otherwise a random-weights draft
 * holds auto to 0.93-0.99x of plain decoding, the lookup standing in one
 * step in 8 and then never, where the lookup alone runs at 1.27x).  Text
 * that repeats itself favours the lookup, free text the draft.
 */
static int
prefer_ngram(nalar_engine *e, int32_t n_decode, unsigned mix,
             int draft_allowed)
{
    unsigned k = e->fallback_steps++;
    double   rd, rn;
    int      any_fixed;

    if (!draft_allowed) {
        return 1;
    }
    rd = nalar_spec_gate_ratio(&e->gate, n_decode, mix);
    rn = nalar_spec_gate_ratio(&e->gate, n_decode,
                               step_mix(e, 1, &any_fixed));
    if (rn < 0) {
        return k % 8 == 0;
    }
    if (rd < 0) {
        rd = NALAR_GATE_MARGIN;     /* plain, which a win must beat by as
                                       much */
    }
    return rn > rd ? k % 64 != 0 : k % 64 == 0;
}


/*
 * A client's prediction the step gate does not veto: its first PRED_FRESH
 * verifications.  The gate's rates are of other requests' predictions, and
 * say nothing of this client's; its own verifications (choose_k prices
 * them by its acceptance alone) decide after that, and their steps feed
 * the gate fresh readings.  Otherwise, with a busy loop on one of 2 cores,
 * a few slow readings could hold every later prediction back for good
 * (exact predictions would then accept nothing).
 */
#define PRED_FRESH 4


static int
pred_fresh(const nalar_request *r)
{
    return r->prop_now == NALAR_PROP_PREDICTION
           && r->acc.seen[0] < PRED_FRESH;
}


/*
 * Structured output: where r's grammar allows one continuation only, its
 * tokens (nalar_gmatcher_forced) are this step's proposals, with n-gram
 * lookup's after them where r looks up; they bypass the cost model and the
 * gate (verifying them is one pass for tokens that are all but certain to
 * be accepted).  Verification masks each row with the grammar's state after
 * the tokens confirmed before it (verify), so a proposal the model would
 * not sample is rejected as any other is.  1 when r proposes so.
 */
static int
grammar_propose(nalar_engine *e, nalar_request *r)
{
    int32_t cap = NALAR_SPEC_MAX_K, nf, n;

    if (cap > r->max_tokens - r->n_generated - 1) {
        cap = r->max_tokens - r->n_generated - 1;
    }
    if (cap > r->cap_tokens - r->n_tokens) {
        cap = r->cap_tokens - r->n_tokens;
    }
    if (cap <= 0) {
        return 0;
    }
    nf = nalar_gmatcher_forced(r->gm, r->props, cap);
    if (nf <= 0) {
        return 0;
    }
    n = nf;
    if (nf < cap && (r->prop == NALAR_PROP_NGRAM || r->ngram_fallback)) {
        /* the tokens after the sequence are scratch until confirmed */
        memcpy(r->tokens + r->n_tokens, r->props,
               (size_t) nf * sizeof(int32_t));
        n += nalar_ngram_propose(r->tokens, r->n_tokens + nf, r->tokens,
                                 r->n_tokens + nf, 1, 3, cap - nf,
                                 r->props + nf);
    }
    r->n_prop = n;
    r->n_forced = nf;
    if (r->prop_now == NALAR_PROP_DRAFT) {
        /* the draft's KV catches up when it is next used */
        r->prop_now = NALAR_PROP_NGRAM;
    }
    pthread_mutex_lock(&e->mu);
    e->m.grammar_forced_tokens_total += (uint64_t) nf;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&r->mu);
    r->g_forced += nf;
    pthread_mutex_unlock(&r->mu);
    return 1;
}


/*
 * Plan speculation: how many decodes and prompt tokens this step has, then
 * each speculating request's k from the cost model (under the step gate),
 * and the draft's proposals.  With an ITL target the step's proposals, in
 * admission order, take only the room it leaves beside the decodes and the
 * prompt tokens it carries (step_proposal_room): speculation never makes a
 * step overshoot a target it could hold, nor takes a waiting prompt's
 * room (a grammar's forced tokens take of the room but are not held to
 * it).
 */
void
step_plan_speculation(nalar_engine *e, step_plan *sp)
{
    int32_t        allow, room, n_dreq = 0;
    int            may_speculate = 1;
    nalar_request *dreqs[256];

    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];
        int32_t        todo = r->n_tokens - r->n_computed;

        r->n_prop = 0;
        if (todo == 1) {
            sp->n_decode++;
        } else {
            sp->n_prefill += todo;
        }
    }
    /* what the batch will carry beside the decodes (before proposals) */
    allow = step_prefill_allowance(e, sp->n_decode);
    if (sp->n_prefill > allow) {
        sp->n_prefill = allow;
    }
    sp->n_prefill = sp->n_prefill > 0 ? sp->n_prefill : 0;
    /* with a target, every proposal fits it (-1: no limit) */
    room = step_proposal_room(e, sp->n_decode, sp->n_prefill);
    for (int32_t i = 0; i < e->n_running; i++) {
        e->running[i]->prop_now = e->running[i]->prop;
    }
    sp->mix = step_mix(e, 0, &sp->any_fixed);
    /* the gate vetoes speculation where whole steps measured slower with
     * it; fixed k (benchmarks) bypasses it */
    if (sp->mix != 0 && e->opts.spec_fixed_k <= 0) {
        may_speculate = nalar_spec_gate_allow(&e->gate, sp->n_decode, sp->mix);
        if ((sp->mix & nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0)) != 0
            && prefer_ngram(e, sp->n_decode, sp->mix, may_speculate))
        {
            /* auto with a draft: n-gram lookup (free to propose) stands in
             * for the draft, judged by the gate as a mix of its own; the
             * draft's KV catches up when the draft is next used */
            int any = 0;

            for (int32_t i = 0; i < e->n_running; i++) {
                nalar_request *r = e->running[i];

                if (r->ngram_fallback && !r->p.spec_fixed
                    && r->n_tokens - r->n_computed == 1)
                {
                    r->prop_now = NALAR_PROP_NGRAM;
                    any = 1;
                }
            }
            if (any) {
                sp->mix = step_mix(e, 0, &sp->any_fixed);
                may_speculate = nalar_spec_gate_allow(&e->gate, sp->n_decode,
                                                      sp->mix);
            }
        }
    }
    for (int32_t i = 0; i < e->n_running; i++) {
        nalar_request *r = e->running[i];

        r->n_forced = 0;
        if (r->gm != NULL && r->prop != NALAR_PROP_NONE
            && r->n_tokens - r->n_computed == 1 && grammar_propose(e, r))
        {
            /* not a step the gate should learn from; tokens all but
             * certain to be accepted, so not held to the room, but they
             * take of it */
            sp->any_fixed = 1;
            if (room > 0) {
                room = room > r->n_prop ? room - r->n_prop : 0;
            }
            continue;
        }
        if (r->prop == NALAR_PROP_NONE || r->n_tokens - r->n_computed != 1
            || (!may_speculate && !r->p.spec_fixed && !pred_fresh(r))
            || room == 0)
        {
            continue;
        }
        r->n_prop = choose_k(e, r, sp->n_decode, sp->n_prefill,
                             r->prop_now == NALAR_PROP_DRAFT
                             ? sp->n_decode : 0, &sp->any_probe);
        if (room > 0 && r->n_prop > room) {
            r->n_prop = room;
        }
        if (r->n_prop > 0 && r->prop_now != NALAR_PROP_DRAFT) {
            r->n_prop = propose_lookup(r, r->n_prop);
        } else if (r->n_prop > 0 && n_dreq < 256) {
            dreqs[n_dreq++] = r;
        } else {
            r->n_prop = 0;
        }
        if (room > 0) {
            room -= r->n_prop;
        }
    }
    if (n_dreq > 0) {
        sp->catchup_s = draft_propose(e, dreqs, n_dreq);
    }
}


/* What the step teaches the step gate and the probe budget. */
void
step_learn(nalar_engine *e, const step_plan *sp)
{
    if (sp->n_prefill == 0 && sp->n_decode > 0 && sp->mix != 0
        && !sp->any_fixed && !sp->any_probe)
    {
        /* a pure decode step where speculation was possible: its rate,
         * as plain or as this mix of proposers.  A draft that first caught
         * up on many tokens decoded without it paid the price of
         * switching, once: not the rate of drafting, and counting it
         * would keep an exploring gate from ever letting the draft run.
         * A probe (a request trying k its cost model ruled out, see
         * choose_k) is not what speculating does either: a probe at a k
         * the model ruled out may confirm little, and read as the draft's
         * rate (most of all just after the gate has forgotten the old
         * one) it would hold the draft back long after */
        nalar_spec_gate_record(&e->gate, sp->n_decode,
                               sp->n_spec > 0 ? sp->mix : 0, sp->n_confirmed,
                               nalar_now_s() - sp->t_start - sp->catchup_s);
    }
    if (sp->any_probe || !nalar_probe_allow(&e->probe_pace)) {
        /* the probe budget (a full one stays full: no need to look up
         * the gate's best ratio every step).  A probe's cost: its step
         * over the target pass the step would have been without it
         * (bookkeeping counted in: the budget errs toward fewer probes) */
        double step_s = nalar_now_s() - sp->t_start, excess = 0;

        if (sp->any_probe) {
            double plain = nalar_cost_estimate(&e->target_cost, sp->n_unprop);

            excess = step_s - (plain > 0 ? plain : 0);
        }
        nalar_probe_record(&e->probe_pace, step_s, excess,
                           nalar_spec_gate_best(&e->gate, sp->n_decode)
                           >= NALAR_GATE_MARGIN
                           ? NALAR_PROBE_SHARE_WIN : NALAR_PROBE_SHARE);
    }
}
