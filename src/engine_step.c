/*
 * One scheduling step (engine_step) and the phases engine_spec.c and
 * engine_queue.c do not own: dropping cancelled requests, building the
 * batch (decodes with their proposals, then prefill chunks within the
 * token budget), the forward pass, and advancing: sampling, verifying
 * proposals, confirming tokens, rolling provisional KV back, finishing.
 *
 * Threads: the engine thread only; e->mu is taken for metrics, r->mu
 * (through push_output and request_finish) for a request's output, neither
 * across the forward pass.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "engine_internal.h"
#include "kv.h"
#include "tokenizer.h"


static void
running_remove(nalar_engine *e, int32_t i)
{
    memmove(&e->running[i], &e->running[i + 1],
            (size_t) (e->n_running - i - 1) * sizeof(*e->running));
    e->n_running--;
}


static void
publish_metrics(nalar_engine *e)
{
    nalar_prefix_stats st;

    memset(&st, 0, sizeof(st));
    if (e->cache != NULL) {
        nalar_prefix_stats_get(e->cache, &st);
    }
    pthread_mutex_lock(&e->mu);
    e->m.requests_running = e->n_running;
    if (e->n_running == 0) {
        e->m.spec_provisional_blocks = 0;
    }
    e->m.prefix_queries_total = st.queries;
    e->m.prefix_hits_total = st.hits;
    e->m.prefix_evictions_total = st.evictions;
    e->m.prefix_blocks = st.blocks;
    e->kv_evictable = st.evictable;
    pthread_mutex_unlock(&e->mu);
}


/* Room for n tokens in a batch and its per-token request table. */
int
batch_reserve(nalar_batch *b, nalar_request ***req, int32_t *cap, int32_t n)
{
    if (n <= *cap) {
        return 0;
    }
#define GROW(p) do {                                                        \
        void *q_ = realloc(p, (size_t) n * sizeof(*(p)));                   \
        if (q_ == NULL) return -1;                                          \
        p = q_;                                                             \
    } while (0)
    GROW(b->tokens);
    GROW(b->pos);
    GROW(b->seq);
    GROW(b->want_logits);
    GROW(*req);
#undef GROW
    *cap = n;
    return 0;
}


static int
batch_grow(nalar_engine *e, int32_t n)
{
    return batch_reserve(&e->batch, &e->batch_req, &e->batch_cap, n);
}


/*
 * Confirm one token of r: append it, update penalties, metrics and output,
 * and finish r on EOS / stop token / stop string / max_tokens.  Returns 1
 * when r finished.  Every token a client sees went through here.
 */
static int
confirm_token(nalar_engine *e, nalar_request *r, int32_t id,
              const nalar_logprob *lp, double t)
{
    char        piece[256];
    const char *safe = "";
    int         n, stopped = 0, is_stop = 0;
    size_t      ns;

    nalar_sampler_accept(&r->sampler, id);
    r->tokens[r->n_tokens++] = id;
    r->n_generated++;
    if (r->gm != NULL && nalar_gmatcher_accept(r->gm, id) != 0) {
        /* the mask let it through, so the grammar failed: out of memory
         * or past a budget, which it names */
        request_finish(e, r, NALAR_FINISH_ERROR,
                       nalar_gmatcher_error(r->gm));
        return 1;
    }

    pthread_mutex_lock(&e->mu);
    e->m.generation_tokens_total++;
    e->lora_m[r->p.adapter].generation_tokens_total++;
    if (r->n_generated == 1) {
        hist_add(e->m.ttft_buckets, &e->m.ttft_sum, &e->m.ttft_count,
                 t - r->t_submit);
    } else {
        hist_add(e->m.itl_buckets, &e->m.itl_sum, &e->m.itl_count,
                 t - r->t_last);
    }
    pthread_mutex_unlock(&e->mu);
    if (r->n_generated == 1) {
        r->t_first = t;
        pthread_mutex_lock(&r->mu);
        r->ttft_ms = (t - r->t_submit) * 1e3;
        pthread_mutex_unlock(&r->mu);
    }
    r->t_last = t;

    if (!r->p.ignore_eos && nalar_tok_is_eog(e->model->tok, id)) {
        is_stop = 1;
    }
    for (int i = 0; i < r->p.n_stop_ids; i++) {
        is_stop |= r->stop_ids[i] == id;
    }
    if (is_stop) {
        /* the stop token itself is confirmed but not shown as text */
        if (push_output(r, "", 0, id, lp) != 0) {
            goto oom;
        }
        request_finish(e, r, NALAR_FINISH_STOP, NULL);
        return 1;
    }
    n = nalar_detok_feed(&r->detok, id, piece, sizeof(piece));
    if (n < 0) {
        n = 0;
    }
    if (test_fault(e, NALAR_FAULT_STOP)) {
        ns = 0;
        stopped = -1;
    } else {
        ns = nalar_stop_feed(r->stop, piece, (size_t) n, &safe, &stopped);
    }
    if (stopped < 0) {
        /* the matcher could not take the text: what it held back goes
         * out with the token (if that fails too, the error says enough),
         * then the error */
        (void) push_output(r, safe, ns, id, lp);
        goto oom;
    }
    if (push_output(r, safe, ns, id, lp) != 0) {
        goto oom;
    }
    if (stopped) {
        request_finish(e, r, NALAR_FINISH_STOP, NULL);
        return 1;
    }
    if (r->n_generated >= r->max_tokens || r->n_tokens >= r->cap_tokens
        || (r->gm != NULL && nalar_gmatcher_done(r->gm)))
    {
        n = nalar_detok_flush(&r->detok, piece, sizeof(piece));
        if (n > 0) {
            ns = nalar_stop_feed(r->stop, piece, (size_t) n, &safe,
                                 &stopped);
            if (stopped < 0 || push_output(r, safe, ns, -1, NULL) != 0) {
                goto oom;
            }
        }
        request_finish(e, r, stopped || (r->gm != NULL
                                         && nalar_gmatcher_done(r->gm))
                             ? NALAR_FINISH_STOP : NALAR_FINISH_LENGTH,
                       NULL);
        return 1;
    }
    return 0;

oom:
    /* the token's output could not be kept: the request ends with the
     * error rather than lose text silently (its KV goes back with it) */
    request_finish(e, r, NALAR_FINISH_ERROR, "out of memory for the output");
    return 1;
}


static void position_rng(nalar_request *r);


/*
 * Whether r's next tokens are the argmax of its logits and nothing more is
 * wanted of them: greedy, no penalty moving the logits, no logprobs.  (The
 * sampler's greedy pick and nalar_argmax agree on every row of finite
 * logits; on rows holding infinities they may pick different ones of the
 * tied extremes.)
 */
static int
greedy_plain(const nalar_request *r)
{
    const nalar_sampling *s = &r->sampler.p;

    return !(s->temperature > 0.0f) && s->presence_penalty == 0.0f
           && s->frequency_penalty == 0.0f && s->n_bias == 0
           && !r->p.logprobs && r->gm == NULL;
}


/*
 * Structured output: the tokens r's grammar does not allow next get a logit
 * of -inf, so every transform of the sampler (bias, penalties, temperature,
 * top-k/p, min-p) works on the model's distribution restricted to the
 * grammar, renormalised.  -1 (r finished with an error) when the grammar
 * allows nothing.
 */
static int
grammar_mask_row(nalar_engine *e, nalar_request *r, float *row)
{
    const uint32_t *mask;
    double          t0 = nalar_now_s(), dt;
    int32_t         V = e->model->cfg.n_vocab, any = 0;

    mask = nalar_gmatcher_mask(r->gm);
    if (mask != NULL) {
        for (int32_t w = 0; w * 32 < V; w++) {
            uint32_t m = mask[w];
            int32_t  end = (w + 1) * 32 < V ? (w + 1) * 32 : V;

            any |= m != 0;
            if (m == 0xffffffffu) {
                continue;
            }
            for (int32_t i = w * 32; i < end; i++) {
                if (!(m >> (i & 31) & 1)) {
                    row[i] = -INFINITY;
                }
            }
        }
    }
    dt = nalar_now_s() - t0;
    pthread_mutex_lock(&e->mu);
    e->m.grammar_mask_seconds_total += dt;
    e->m.grammar_masks_total++;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&r->mu);
    r->g_mask_ms += dt * 1e3;
    pthread_mutex_unlock(&r->mu);
    if (!any) {
        request_finish(e, r, NALAR_FINISH_ERROR, mask == NULL
                       ? nalar_gmatcher_error(r->gm)
                       : "the grammar allows no token");
        return -1;
    }
    return 0;
}


/* Sample r's next token from its logits row (or take the backend's argmax
 * of it, `given`, for a greedy_plain request) and confirm it. */
static void
emit_token(nalar_engine *e, nalar_request *r, float *row,
           const int32_t *given, double t)
{
    nalar_logprob lp[21];
    int32_t       id;

    if (r->gm != NULL && given == NULL
        && grammar_mask_row(e, r, row) != 0)
    {
        return;
    }
    position_rng(r);
    id = given != NULL ? *given
                       : nalar_sample(&r->sampler, row,
                                      r->p.logprobs ? lp : NULL);
    if (!confirm_token(e, r, id, r->p.logprobs ? lp : NULL, t)
        && r->notify != NULL)
    {
        r->notify(r, r->notify_ctx);
    }
}


/*
 * The randomness of output position i is a function of (seed, i) alone, so
 * a seeded request gives the same tokens however its positions were
 * batched, chunked or speculated.
 */
static void
position_rng(nalar_request *r)
{
    nalar_rng_seed(&r->sampler.rng, r->p.sampling.seed
                   + 0x9E3779B97F4A7C15ull * (uint64_t) (r->n_generated + 1));
}


/*
 * Verify r's proposals against the target's logits rows[0..n_prop] (row i
 * follows the token at position p + i, p = position of the last confirmed
 * token) and confirm what survives.  At each row the target's own token is
 * drawn exactly as plain decoding would draw it (same transforms, same
 * position-keyed randomness; argmax when greedy); the proposal is accepted
 * when it equals that token, and the first differing draw is confirmed in
 * its place.  Proposals are point masses, so this is lossless speculative
 * sampling: acceptance probability p(x) = min(1, p(x)/q(x)) with q(x) = 1,
 * and a rejected position yields a draw from p without x, renormalised --
 * max(0, p - q) normalised.  With `given` (a greedy_plain request whose
 * rows the backend reduced to their argmax) the draws are given[0..n_prop].
 * Returns the number of proposals accepted.
 */
static int32_t
verify(nalar_engine *e, nalar_request *r, float *rows, const int32_t *given,
       double t)
{
    int32_t        V = e->model->cfg.n_vocab, k = r->n_prop, accepted = 0;
    nalar_logprob  lpbuf[21];
    nalar_logprob *lp = r->p.logprobs ? lpbuf : NULL;

    for (int32_t i = 0; i <= k; i++) {
        int32_t id;

        /* the grammar's state follows the tokens confirmed so far, which
         * are the proposals before row i */
        if (r->gm != NULL && given == NULL
            && grammar_mask_row(e, r, rows + (size_t) i * V) != 0)
        {
            break;
        }
        position_rng(r);
        id = given != NULL ? given[i]
                           : nalar_sample(&r->sampler, rows + (size_t) i * V,
                                          lp);
        if (i < k && id == r->props[i]) {
            accepted++;
            if (confirm_token(e, r, id, lp, t)) {
                break;
            }
            continue;
        }
        /* the target's own token: after the last proposal, or in place of
         * the first rejected one */
        confirm_token(e, r, id, lp, t);
        break;
    }
    return accepted;
}


/* Count of blocks held only for provisional positions of r. */
static int32_t
provisional_blocks(const nalar_request *r)
{
    int32_t confirmed = (r->n_computed + 1 + NALAR_KV_BLOCK - 1)
                        / NALAR_KV_BLOCK;

    return r->kv.n_blocks > confirmed ? r->kv.n_blocks - confirmed : 0;
}


/* Cancelled requests leave first: their blocks go back to the pool. */
static void
step_drop_cancelled(nalar_engine *e)
{
    for (int32_t i = 0; i < e->n_running; ) {
        nalar_request *r = e->running[i];

        if (__atomic_load_n(&r->cancelled, __ATOMIC_ACQUIRE)) {
            running_remove(e, i);
            finish_unref(e, r, NALAR_FINISH_CANCELLED, NULL);
            continue;
        }
        i++;
    }
}


/*
 * Reserve KV for this step's tokens and batch them: decodes (1 token plus
 * proposals, at provisional positions) first, then prefill chunks in
 * admission order while the step's prompt-token allowance lasts (what a
 * fixed budget leaves, or what fits the ITL target: engine_budget.c).
 * sp->n_tok may come out 0 (every request preempted or finished).
 */
static void
step_build_batch(nalar_engine *e, step_plan *sp)
{
    nalar_batch *b = &e->batch;
    int32_t      budget = 0, used = 0, first_prefill = 0;

    sp->n_tok = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            /* the decodes are in: what prompt tokens may join them */
            budget = step_prefill_allowance(e, used);
            first_prefill = sp->n_tok;
            sp->n_fixed = used;
            sp->prefill_allow = budget > 0 ? budget : 0;
            for (int32_t i = 0; i < e->n_running; i++) {
                int32_t todo = e->running[i]->n_tokens
                               - e->running[i]->n_computed;

                sp->prefill_pending += todo > 1 ? todo : 0;
            }
        }
        for (int32_t i = 0; i < e->n_running; i++) {
            nalar_request *r = e->running[i];
            int32_t        todo = r->n_tokens - r->n_computed;
            int32_t        n;

            if ((pass == 0) != (todo == 1)) {
                continue;
            }
            n = todo + r->n_prop;
            if (pass == 1) {
                if (budget <= 0) {
                    break;
                }
                n = todo < budget ? todo : budget;
            }
            while (kv_reserve(e, r, r->n_computed + n) != 0) {
                if (r->n_prop > 0) {
                    /* speculation is the first thing to give up */
                    n -= r->n_prop;
                    r->n_prop = 0;
                    continue;
                }
                if (e->running[e->n_running - 1] == r) {
                    break;
                }
                preempt_last(e);
            }
            if (r->kv.n_blocks * NALAR_KV_BLOCK < r->n_computed + n) {
                /* r itself is the newest: preempt it unless it is alone */
                if (e->n_running > 1) {
                    preempt_last(e);
                    break;
                }
                running_remove(e, i);
                finish_unref(e, r, NALAR_FINISH_ERROR,
                             "the KV cache is too small for this request");
                break;
            }
            for (int32_t k = 0; k < n; k++) {
                int32_t p = r->n_computed + k;
                int     last = p >= r->n_tokens - 1;

                b->tokens[sp->n_tok] = p < r->n_tokens ? r->tokens[p]
                                   : r->props[p - r->n_tokens];
                b->pos[sp->n_tok] = p;
                b->seq[sp->n_tok] = &r->kv;
                b->want_logits[sp->n_tok] = last;
                e->batch_req[sp->n_tok] = r;
                sp->n_tok++;
            }
            if (r->n_prop > 0) {
                sp->n_spec++;
                sp->provisional += provisional_blocks(r);
            }
            budget -= n;
            used += n;
        }
    }
    /* a preemption may have dropped requests whose tokens are batched */
    {
        int32_t w = 0;

        sp->n_logits = 0;
        for (int32_t k = 0; k < sp->n_tok; k++) {
            nalar_request *r = e->batch_req[k];

            if (r->state != REQ_RUNNING) {
                continue;
            }
            b->tokens[w] = b->tokens[k];
            b->pos[w] = b->pos[k];
            b->seq[w] = b->seq[k];
            b->want_logits[w] = b->want_logits[k];
            sp->n_logits += b->want_logits[k];
            sp->n_prefill_tok += k >= first_prefill;
            e->batch_req[w++] = r;
        }
        sp->n_tok = w;
    }
    if (sp->n_tok == 0) {
        return;
    }
    /* a probe's step: its tokens but for proposals, what it would have
     * cost without the probe */
    if (sp->any_probe) {
        sp->n_unprop = sp->n_tok;
        for (int32_t i = 0; i < e->n_running; i++) {
            sp->n_unprop -= e->running[i]->n_prop;
        }
    }
    b->n_tokens = sp->n_tok;
    b->n_logits = sp->n_logits;
}


/*
 * The forward pass over the batch, timed into the target's cost table.
 * Returns -1 with err when out of memory for the logits, or on a backend
 * failure.
 */
static int
step_forward(nalar_engine *e, step_plan *sp, nalar_err *err)
{
    nalar_batch *b = &e->batch;
    int32_t      V = e->model->cfg.n_vocab;
    double       t, t0;

    if (sp->n_logits > e->logits_cap) {
        /* rows the backend's threads split: on cache lines; a step's
         * logits are written before they are read, so no copy */
        float *l = test_fault(e, NALAR_FAULT_LOGITS) ? NULL
                   : nalar_alloc_lines((size_t) sp->n_logits * V
                                       * sizeof(float));
        if (l == NULL) {
            return nalar_fail(err, "engine: out of memory for %d logit "
                              "rows", sp->n_logits);
        }
        free(e->logits);
        e->logits = l;
        e->logits_cap = sp->n_logits;
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = sp->provisional;
    pthread_mutex_unlock(&e->mu);

    /* every row greedy and plain: the backend's argmax, when it has one */
    sp->use_ids = e->be->forward_argmax != NULL
                  && sp->n_logits > 0;
    for (int32_t k = 0; k < sp->n_tok && sp->use_ids; k++) {
        sp->use_ids = !b->want_logits[k] || greedy_plain(e->batch_req[k]);
    }
    if (sp->use_ids && sp->n_logits > e->ids_cap) {
        int32_t *ids = malloc((size_t) sp->n_logits * sizeof(int32_t));

        if (ids == NULL) {
            sp->use_ids = 0;
        } else {
            free(e->ids);
            e->ids = ids;
            e->ids_cap = sp->n_logits;
        }
    }

    /* each token's adapter, from its request (NULL: none has one) */
    if (engine_lora_batch(e, b, e->batch_req) != 0) {
        return nalar_fail(err, "engine: out of memory for the batch's "
                          "adapters");
    }
    t0 = nalar_now_s();
    if (test_fault(e, NALAR_FAULT_FORWARD)
        ? nalar_fail(err, "backend: injected failure") != 0
        : sp->use_ids
        ? e->be->forward_argmax(e->be, &e->kv, b, e->ids, e->logits, err)
          != 0
        : e->be->forward(e->be, &e->kv, b, e->logits, err) != 0)
    {
        return -1;
    }
    t = nalar_now_s();
    nalar_cost_record(&e->target_cost, sp->n_tok, t - t0);

    pthread_mutex_lock(&e->mu);
    e->m.steps_total++;
    e->m.argmax_steps_total += sp->use_ids != 0;
    if (sp->n_spec > 0) {
        e->m.spec_verify_seconds_total += t - t0;
    }
    pthread_mutex_unlock(&e->mu);
    sp->t_pass = t;
    return 0;
}


/*
 * Advance: KV covers the batched positions; sample or verify where there
 * are logits (a request's rows are consecutive); finished requests leave.
 */
static void
step_advance(nalar_engine *e, step_plan *sp)
{
    nalar_batch *b = &e->batch;
    int32_t      V = e->model->cfg.n_vocab;
    int          use_ids = sp->use_ids;
    double       t = sp->t_pass;
    int32_t      li = 0;

    for (int32_t k = 0; k < sp->n_tok; k++) {
        nalar_request *r = e->batch_req[k];
        int32_t        p0, accepted, kprop;

        if (!b->want_logits[k]) {
            r->n_computed = b->pos[k] + 1;
            r->kv.n_pos = r->n_computed;
            kv_slide(e, r);
            continue;
        }
        if (r->n_generated == 0) {
            pthread_mutex_lock(&e->mu);
            e->m.prompt_tokens_total += (uint64_t) r->p.n_prompt;
            e->lora_m[r->p.adapter].prompt_tokens_total
                += (uint64_t) r->p.n_prompt;
            pthread_mutex_unlock(&e->mu);
        }
        if (r->n_prop == 0) {
            r->n_computed = b->pos[k] + 1;
            r->kv.n_pos = r->n_computed;
            /* every computed position holds a confirmed token */
            if (cache_publish(e, r, r->n_computed) != 0) {
                request_finish(e, r, NALAR_FINISH_ERROR,
                               "out of memory for the prefix cache");
                li++;
                continue;
            }
            kv_slide(e, r);
            emit_token(e, r, use_ids ? NULL : e->logits + (size_t) li * V,
                       use_ids ? e->ids + li : NULL, t);
            li++;
            sp->n_confirmed++;
            continue;
        }

        /* verification: rows li .. li + n_prop */
        kprop = r->n_prop;
        p0 = b->pos[k];
        accepted = verify(e, r,
                          use_ids ? NULL : e->logits + (size_t) li * V,
                          use_ids ? e->ids + li : NULL, t);
        li += kprop + 1;
        k += kprop;   /* skip the proposals' batch entries */
        r->n_prop = 0;

        sp->n_confirmed += accepted + 1;
        if (r->n_forced > 0) {
            /* the grammar's proposals say nothing of the proposer's */
            pthread_mutex_lock(&e->mu);
            e->m.grammar_forced_accepted_total += (uint64_t)
                (accepted < r->n_forced ? accepted : r->n_forced);
            pthread_mutex_unlock(&e->mu);
            pthread_mutex_lock(&r->mu);
            r->g_forced_accepted +=
                accepted < r->n_forced ? accepted : r->n_forced;
            pthread_mutex_unlock(&r->mu);
        } else {
            nalar_accept_update(acc_now(r), kprop, accepted);
        }
        if (r->n_forced == 0 && r->prop_now != NALAR_PROP_PREDICTION) {
            nalar_accept_update(&e->prop_acc[r->prop_now], kprop,
                                accepted);
        }
        pthread_mutex_lock(&e->mu);
        e->m.spec_drafts_total++;
        e->m.spec_draft_tokens_total += (uint64_t) kprop;
        e->m.spec_accepted_tokens_total += (uint64_t) accepted;
        for (int32_t i = 0; i < accepted; i++) {
            e->m.spec_accepted_per_pos[i]++;
        }
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&r->mu);
        r->spec_proposed += kprop;
        r->spec_accepted += accepted;
        if (r->prop == NALAR_PROP_PREDICTION) {
            r->pred_accepted += accepted;
            r->pred_rejected += kprop - accepted;
        }
        pthread_mutex_unlock(&r->mu);

        if (r->state == REQ_FINISHED) {
            continue;   /* finishing released every block */
        }
        /* roll back: keep KV of the last confirmed token and the
         * accepted proposals; provisional blocks go back to the pool */
        r->n_computed = p0 + 1 + accepted;
        nalar_seq_kv_truncate(&e->kv, &r->kv, r->n_computed);
        r->kv.n_pos = r->n_computed;
        if (cache_publish(e, r, r->n_computed) != 0) {
            request_finish(e, r, NALAR_FINISH_ERROR,
                           "out of memory for the prefix cache");
            continue;
        }
        kv_slide(e, r);
        if (r->prop_now == NALAR_PROP_DRAFT) {
            /* the draft computed the last token and proposals
             * 1..kprop-1; those that were confirmed stay valid */
            int32_t keep = p0 + 1 + (accepted < kprop - 1 ? accepted
                                                          : kprop - 1);
            if (r->d_computed > keep) {
                r->d_computed = keep;
            }
            nalar_seq_kv_truncate(&e->dkv, &r->dkv, r->d_computed);
        }
        if (r->notify != NULL) {
            r->notify(r, r->notify_ctx);
        }
    }
    for (int32_t i = 0; i < e->n_running; ) {
        if (e->running[i]->state == REQ_FINISHED) {
            nalar_request *r = e->running[i];

            running_remove(e, i);
            nalar_request_unref(r);
            continue;
        }
        i++;
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = 0;
    pthread_mutex_unlock(&e->mu);
}


/* A step failed: every running request finishes with its error, and its
 * KV goes back to the pool.  Waiting requests stay: the next step tries
 * them afresh. */
static void
fail_running(nalar_engine *e, const char *msg)
{
    while (e->n_running > 0) {
        nalar_request *r = e->running[--e->n_running];

        finish_unref(e, r, NALAR_FINISH_ERROR, msg);
    }
    pthread_mutex_lock(&e->mu);
    e->m.spec_provisional_blocks = 0;
    pthread_mutex_unlock(&e->mu);
    publish_metrics(e);
}


/*
 * One scheduling step: drop cancelled requests, admit waiting ones, build a
 * batch (decodes first, with speculative proposals where they pay, then
 * prefill chunks within the token budget), run the forward pass, sample or
 * verify.  Returns 1 if work was done, 0 if idle, -1 with err when the step
 * failed (out of memory, or the backend): every request that was running
 * is then finished with that error (fail_running), none is left running.
 */
int
engine_step(nalar_engine *e, nalar_err *err)
{
    step_plan sp;

    memset(&sp, 0, sizeof(sp));
    sp.t_start = nalar_now_s();
    step_drop_cancelled(e);
    step_intake(e);
    step_admit(e);
    sp.t_plan = nalar_now_s();
    if (e->n_running == 0) {
        /* cancellations may have just emptied the running set */
        publish_metrics(e);
        return 0;
    }
    if (test_fault(e, NALAR_FAULT_BATCH)
        || batch_grow(e, e->opts.max_batch_tokens
                         + e->n_running * (1 + NALAR_SPEC_MAX_K)) != 0)
    {
        nalar_fail(err, "engine: out of memory for the batch");
        fail_running(e, err->msg);
        return -1;
    }
    step_plan_speculation(e, &sp);
    step_build_batch(e, &sp);
    if (sp.n_tok == 0) {
        /* every request finished or was preempted while batching: the
         * gauges must say so even if the engine now goes idle */
        publish_metrics(e);
        return e->n_running > 0;
    }
    if (step_forward(e, &sp, err) != 0) {
        fail_running(e, err->msg);
        return -1;
    }
    step_advance(e, &sp);
    step_learn(e, &sp);
    step_budget_learn(e, &sp);
    publish_metrics(e);
    return 1;
}
