/*
 * Proposers without a model, and the cost model for choosing k.
 */
#include <string.h>

#include "spec.h"


int
nalar_ngram_propose(const int32_t *corpus, int32_t n_corpus,
                    const int32_t *key, int32_t n_key, int n_min, int n_max,
                    int k, int32_t *out)
{
    if (k <= 0) {
        return 0;
    }
    for (int n = n_max; n >= n_min; n--) {
        const int32_t *tail;

        if (n <= 0 || n > n_key) {
            continue;
        }
        tail = key + n_key - n;
        /* latest start s with corpus[s, s+n) == tail and a follower */
        for (int32_t s = n_corpus - n - 1; s >= 0; s--) {
            int32_t m;

            if (corpus + s == tail) {
                continue;   /* the key itself */
            }
            if (memcmp(corpus + s, tail, (size_t) n * sizeof(int32_t)) != 0) {
                continue;
            }
            m = n_corpus - (s + n);
            m = m < k ? m : k;
            memcpy(out, corpus + s + n, (size_t) m * sizeof(int32_t));
            return m;
        }
    }
    return 0;
}


/* The size a point stands for. */
static int
point_size(int i)
{
    if (i < 32) {
        return i + 1;                       /* 1..32 */
    }
    /* then four steps per doubling: 40, 48, 56, 64, 80, ... 2048 */
    return (32 << ((i - 32) / 4)) + ((i - 32) % 4 + 1) * (8 << ((i - 32) / 4));
}


/* The point of the largest size <= n. */
static int
point_of(int n)
{
    int i = 0;

    while (i + 1 < NALAR_COST_POINTS && point_size(i + 1) <= n) {
        i++;
    }
    return i;
}


void
nalar_cost_record(nalar_cost_table *c, int n_tokens, double seconds)
{
    int i;

    if (n_tokens <= 0 || !(seconds > 0)) {
        return;
    }
    i = point_of(n_tokens);
    /* normalise to the point's size (time ~ linear between points) */
    seconds *= (double) point_size(i) / n_tokens;
    if (c->n[i] == 0) {
        c->t[i] = seconds;
    } else if (seconds < c->t[i]) {
        c->t[i] = 0.5 * (c->t[i] + seconds);
    } else {
        c->t[i] += 0.05 * (seconds - c->t[i]);
    }
    c->n[i]++;
}


double
nalar_cost_estimate(const nalar_cost_table *c, int n_tokens)
{
    int    lo = -1, hi = -1, i;
    double est, sl, sh;

    if (n_tokens <= 0) {
        return 0;
    }
    i = point_of(n_tokens);
    for (int j = i; j >= 0; j--) {
        if (c->n[j] > 0) {
            lo = j;
            break;
        }
    }
    for (int j = i + 1; j < NALAR_COST_POINTS; j++) {
        if (c->n[j] > 0) {
            hi = j;
            break;
        }
    }
    if (lo < 0 && hi < 0) {
        return -1;
    }
    if (lo < 0) {
        /* below what was measured: proportional to n.  This flatters
         * plain decoding (fewer tokens), so speculation is chosen only
         * on evidence; choosing k = 0 then measures the real cost */
        return c->t[hi] * n_tokens / point_size(hi);
    }
    if (hi < 0) {
        /* above what was measured: assume compute-bound, linear in n */
        est = c->t[lo] * n_tokens / point_size(lo);
    } else {
        sl = point_size(lo);
        sh = point_size(hi);
        est = c->t[lo] + (n_tokens - sl) / (sh - sl) * (c->t[hi] - c->t[lo]);
        est = est > c->t[lo] ? est : c->t[lo];
        /* and no more than any larger pass measured: a size seldom run
         * (one speculation rarely chooses) may hold one slow pass for
         * long */
        for (int j = hi; j < NALAR_COST_POINTS; j++) {
            if (c->n[j] > 0 && c->t[j] < est) {
                est = c->t[j];
            }
        }
    }
    /* nor than as many one-token passes, for the same reason */
    if (c->n[0] > 0 && c->t[0] * n_tokens < est) {
        est = c->t[0] * n_tokens;
    }
    return est;
}


void
nalar_accept_init(nalar_accept_stats *a, double prior)
{
    for (int i = 0; i < NALAR_SPEC_MAX_K; i++) {
        a->alpha[i] = prior;
        a->seen[i] = 0;
    }
    a->pooled = prior;
    a->pooled_seen = 0;
}


void
nalar_accept_blend(nalar_accept_stats *out, const nalar_accept_stats *own,
                   const nalar_accept_stats *prior, int weight)
{
    for (int i = 0; i < NALAR_SPEC_MAX_K; i++) {
        double n = own->seen[i] < 12 ? own->seen[i] : 12;
        double m = prior->seen[i] < 12 ? prior->seen[i] : 12;
        double p = (m * prior->alpha[i]
                    + NALAR_ACCEPT_POOLED * prior->pooled)
                   / (m + NALAR_ACCEPT_POOLED);

        out->alpha[i] = (n * own->alpha[i] + weight * p) / (n + weight);
        out->seen[i] = own->seen[i];
    }
    out->pooled = own->pooled;
    out->pooled_seen = own->pooled_seen;
}


void
nalar_accept_update(nalar_accept_stats *a, int proposed, int accepted)
{
    /* positions 0..accepted-1 were reached and accepted; position
     * `accepted` (if proposed) was reached and rejected; positions from
     * `proposed` on were not proposed, and their estimates age */
    for (int i = 0; i < NALAR_SPEC_MAX_K; i++) {
        double x = i < accepted ? 1.0 : 0.0, w;

        if (i >= proposed) {
            a->seen[i] -= a->seen[i] > 0;
            continue;
        }
        if (i > accepted) {
            continue;
        }
        w = a->seen[i] < 10 ? 1.0 / (a->seen[i] + 2) : 0.08;
        a->alpha[i] += w * (x - a->alpha[i]);
        a->seen[i]++;
        w = a->pooled_seen < 10 ? 1.0 / (a->pooled_seen + 2) : 0.04;
        a->pooled += w * (x - a->pooled);
        a->pooled_seen++;
    }
}


double
nalar_accept_expected(const nalar_accept_stats *a, int k)
{
    double e = 1.0, p = 1.0;

    for (int i = 0; i < k && i < NALAR_SPEC_MAX_K; i++) {
        p *= a->alpha[i];
        e += p;
    }
    return e;
}


int
nalar_spec_choose_k(const nalar_accept_stats *a, int k_max,
                    const double *verify, double draft_tok, double margin,
                    double *gain)
{
    double plain = verify[0], best = 1.0 / plain;
    int    best_k = 0;

    if (k_max > NALAR_SPEC_MAX_K) {
        k_max = NALAR_SPEC_MAX_K;
    }
    for (int k = 1; k <= k_max; k++) {
        double rate = nalar_accept_expected(a, k)
                      / (verify[k] + k * draft_tok);

        if (rate > best) {
            best = rate;
            best_k = k;
        }
    }
    if (best_k > 0 && best * plain < margin) {
        best_k = 0;
        best = 1.0 / plain;
    }
    if (gain != NULL) {
        *gain = best * plain;
    }
    return best_k;
}


int
nalar_spec_neighbour_k(int k, int k_max, unsigned n)
{
    int nk;

    if (n == 0 || n % NALAR_SPEC_NEIGHBOUR != 0) {
        return k;
    }
    nk = n / NALAR_SPEC_NEIGHBOUR % 2 ? k + 1 : k - 1;
    return nk >= 1 && nk <= k_max ? nk : k;
}


int
nalar_probe_allow(const nalar_probe_pace *p)
{
    return p->credit >= 0;
}


void
nalar_probe_record(nalar_probe_pace *p, double seconds, double excess,
                   double share)
{
    if (seconds > 0) {
        p->credit += share * seconds;
    }
    if (excess > 0) {
        p->credit -= excess;
    }
    if (p->credit > 0) {
        p->credit = 0;
    }
}


/* --- the step gate --- */

#define GATE_MIN_PLAIN  8       /* observations before a rate is trusted */
#define GATE_MIN_SPEC   8       /* a speculative step confirms 1 to k+1
                                   tokens, so a few steps' rate varies
                                   widely: it takes this many before a
                                   first reading or burst that falls low
                                   may hold a good draft back */
#define GATE_DECAY      0.97    /* per recorded step: ~33 steps of memory */
#define GATE_GAP_MIN    16
#define GATE_GAP_MAX    1024    /* by doubling; by the loss, up to: */
#define GATE_GAP_LOSS   8192
#define GATE_MARGIN     NALAR_GATE_MARGIN
#define GATE_CLIP       3.0     /* a step's seconds count up to this many
                                   times the mean step's */
#define GATE_EXPLORE    0.01    /* most of plain throughput that exploring
                                   may cost */
#define GATE_BURST      8       /* speculative steps per exploration (as
                                   many as a first reading, GATE_MIN_SPEC) */
#define GATE_FORGET     0.05    /* weight left to the old rate by one */
#define GATE_BURST_SPAN 32      /* steps a burst may wait for its 8
                                   speculative ones (the sequences of a
                                   step it allows may all choose k = 0):
                                   then it ends, the old rate standing */


/*
 * The wait between plain steps while speculation wins at ratio spec/plain:
 * one plain step in `gap` loses (1 - plain/spec) of a step's tokens, so
 * a gap of at least that over GATE_EXPLORE keeps the cost of measuring
 * plain decoding under 1% (at 1.4x: 29 steps; at 2.5x: 60), and at least
 * GATE_GAP_MIN.  (A fixed 16 cost 1.8% at 1.4x, 3.75% at 2.5x.)
 */
static int
win_gap(double plain, double spec)
{
    double g = (1.0 - plain / spec) / GATE_EXPLORE;

    return g < GATE_GAP_MIN ? GATE_GAP_MIN
           : g > GATE_GAP_MAX ? GATE_GAP_MAX : (int) g;
}


static int
gate_cell(int n_decode)
{
    int c = 16;

    if (n_decode <= 16) {
        return n_decode > 0 ? n_decode - 1 : 0;
    }
    /* 17-32, 33-64, ... */
    for (int n = 32; n < n_decode && c < NALAR_GATE_CELLS - 1; n *= 2) {
        c++;
    }
    return c;
}


static double
rate_of(const nalar_rate *r, int min_steps)
{
    return r->n >= min_steps && r->sec > 0 ? r->tok / r->sec : -1;
}


int
nalar_spec_gate_allow(nalar_spec_gate *g, int n_decode, unsigned mix)
{
    int     c = gate_cell(n_decode);
    double  plain, spec;
    int    *gap, *since;

    mix &= NALAR_GATE_MIXES - 1;
    plain = rate_of(&g->plain[c], GATE_MIN_PLAIN);
    spec = rate_of(&g->spec[c][mix], GATE_MIN_SPEC);
    gap = &g->gap[c][mix];
    since = &g->since[c][mix];
    if (*gap == 0) {
        *gap = GATE_GAP_MIN;
    }
    if (plain < 0) {
        return 0;          /* measure the safe mode first */
    }
    /* verification only gets dearer as the batch grows: a loss measured
     * at a smaller batch stands for this one too, and exploring here would
     * pay for nothing (for a draft, every exploration first brings each
     * sequence's draft KV up to date).  The smaller batch keeps exploring
     * and lifts this veto when it finds a win. */
    for (int c2 = 0; c2 < c; c2++) {
        double p2 = rate_of(&g->plain[c2], GATE_MIN_PLAIN);
        double s2 = rate_of(&g->spec[c2][mix], GATE_MIN_SPEC);

        if (p2 > 0 && s2 > 0 && s2 < p2 * GATE_MARGIN) {
            return 0;
        }
    }
    if (spec < 0) {
        return 1;          /* then a few speculative steps */
    }
    if (g->burst[c][mix] > 0) {
        if (++g->burst_age[c][mix] <= GATE_BURST_SPAN) {
            return 1;      /* until the burst's steps are recorded */
        }
        g->burst[c][mix] = 0;
    }
    if (++*since < *gap) {
        return spec >= plain * GATE_MARGIN;     /* the better mode */
    }
    /* explore the other mode; a loss confirmed again waits longer */
    *since = 0;
    if (spec < plain * GATE_MARGIN) {
        /* a burst of speculative steps, measured apart: once complete,
         * its rate mostly replaces the old one (see record) */
        double loss;

        memset(&g->fresh[c][mix], 0, sizeof(nalar_rate));
        g->burst[c][mix] = GATE_BURST;
        g->burst_age[c][mix] = 0;
        /* the next wait: doubled, and long enough that a burst as slow as
         * the last one costs at most GATE_EXPLORE of plain throughput (a
         * burst of B steps at rate ratio x costs B (1/x - 1) plain steps) */
        loss = GATE_BURST * (plain / spec - 1) / GATE_EXPLORE;
        *gap = *gap * 2 < GATE_GAP_MAX ? *gap * 2 : GATE_GAP_MAX;
        if (loss > *gap) {
            *gap = loss < GATE_GAP_LOSS ? (int) loss : GATE_GAP_LOSS;
        }
        return 1;
    }
    *gap = win_gap(plain, spec);
    return 0;
}


void
nalar_spec_gate_record(nalar_spec_gate *g, int n_decode, unsigned mix,
                       double tokens, double seconds)
{
    int         c = gate_cell(n_decode);
    unsigned    m = mix & (NALAR_GATE_MIXES - 1);
    nalar_rate *r;

    if (!(seconds > 0) || tokens <= 0) {
        return;
    }
    r = mix == 0 ? &g->plain[c] : &g->spec[c][m];
    if (r->n >= GATE_MIN_SPEC && r->w > 0
        && seconds > GATE_CLIP * r->sec / r->w)
    {
        /* a step stalled by something else (the OS, another process)
         * would weigh on a ratio of sums for dozens of steps: clip it */
        seconds = GATE_CLIP * r->sec / r->w;
    }
    if (mix != 0 && g->burst[c][m] > 0) {
        /* an exploring burst: its steps apart from the old rate, which
         * they replace (but for about a step's weight) only once all 8
         * are in, so that no reading rests on one or two steps */
        nalar_rate *f = &g->fresh[c][m];

        f->tok += tokens;
        f->sec += seconds;
        f->w += 1;
        if (--g->burst[c][m] > 0) {
            return;
        }
        r->tok = r->tok * GATE_FORGET + f->tok;
        r->sec = r->sec * GATE_FORGET + f->sec;
        r->w = r->w * GATE_FORGET + f->w;
        r->n += GATE_BURST;
    } else {
        r->tok = r->tok * GATE_DECAY + tokens;
        r->sec = r->sec * GATE_DECAY + seconds;
        r->w = r->w * GATE_DECAY + 1;
        r->n++;
    }
    if (mix != 0 && r->n >= GATE_MIN_SPEC) {
        /* speculation that wins again shortens the wait between explorations
         * of plain decoding; see nalar_spec_gate_allow */
        double plain = rate_of(&g->plain[c], GATE_MIN_PLAIN);

        if (plain > 0 && r->tok / r->sec >= plain * GATE_MARGIN) {
            g->gap[c][m] = win_gap(plain, r->tok / r->sec);
        }
    }
}


double
nalar_spec_gate_ratio(const nalar_spec_gate *g, int n_decode, unsigned mix)
{
    int    c = gate_cell(n_decode);
    double plain = rate_of(&g->plain[c], GATE_MIN_PLAIN);
    double spec = rate_of(&g->spec[c][mix & (NALAR_GATE_MIXES - 1)], GATE_MIN_SPEC);

    return plain > 0 && spec > 0 ? spec / plain : -1;
}


double
nalar_spec_gate_best(const nalar_spec_gate *g, int n_decode)
{
    double best = -1;

    for (unsigned m = 1; m < NALAR_GATE_MIXES; m++) {
        double r = nalar_spec_gate_ratio(g, n_decode, m);

        best = r > best ? r : best;
    }
    return best;
}
