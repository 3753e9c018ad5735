/*
 * Token sampling.  One call turns a row of logits into a token:
 *
 *   l[t] += logit_bias[t]
 *   l[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty
 *   T == 0:  argmax l
 *   else:    keep the top-k logits, e[t] = exp((l[t] - max l) / T),
 *            keep the top-p prefix of e sorted descending (mass >= top_p),
 *            keep e[t] >= min_p * max e, draw t with probability e[t] / sum e.
 *
 * Every kept set is a prefix of one total order on tokens (higher penalised
 * logit first, ties to the lower id), so "the candidates" is always
 * s->idx[0..n) in that order and a token is kept iff it does not rank after
 * the last candidate.  nalar_sampler_dist and nalar_sample share the code that
 * builds this set, which is what keeps the distribution speculative
 * verification sees identical to the one a token is drawn from.
 *
 * Cost for a 128k vocabulary: one vectorised pass for the penalties, then
 * with top-k a size-k heap over the vocabulary (O(V log k), no full sort, and
 * 64-token blocks that cannot enter skipped on their max); with top-p/min-p
 * one vectorised exp pass and only the tokens above a weight threshold are
 * collected and sorted; with neither, nothing is sorted and the draw skips
 * whole blocks of the vocabulary in id order.  About 50-120 us a token on
 * one x86 core.  All scratch lives in the sampler, so no call allocates.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exp_neg.h"
#include "sampler.h"


void
nalar_sampling_default(nalar_sampling *s)
{
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    s->presence_penalty = 0.0f;
    s->frequency_penalty = 0.0f;
    s->seed = 0xC0FFEE5EEDULL;
    s->n_logprobs = 0;
    s->n_bias = 0;
}


/* ---- RNG: xoshiro256** (Blackman & Vigna), state filled by splitmix64 ---- */

static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}


static inline uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}


void
nalar_rng_seed(nalar_rng *r, uint64_t seed)
{
    /* four consecutive splitmix64 outputs are distinct, so never all zero */
    for (int i = 0; i < 4; i++) {
        r->s[i] = splitmix64(&seed);
    }
}


uint64_t
nalar_rng_next(nalar_rng *r)
{
    uint64_t *s = r->s;
    uint64_t  result = rotl(s[1] * 5, 7) * 9;
    uint64_t  t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}


double
nalar_rng_uniform(nalar_rng *r)
{
    /* the top 53 bits fill a double's mantissa exactly: a grid on [0, 1) */
    return (double) (nalar_rng_next(r) >> 11) * 0x1.0p-53;
}


/* ---- sampler lifetime ---- */

static float
finite_or(float x, float dflt)
{
    return isfinite(x) ? x : dflt;
}


int
nalar_sampler_init(nalar_sampler *s, const nalar_sampling *p, int32_t n_vocab)
{
    memset(s, 0, sizeof(*s));
    if (n_vocab <= 0) {
        return -1;
    }

    if (p != NULL) {
        s->p = *p;
    } else {
        nalar_sampling_default(&s->p);
    }

    /*
     * Non-finite knobs would poison every probability; fall back to "off".
     * The server validates ranges for the client; this only keeps the math
     * defined whatever arrives.
     */
    s->p.presence_penalty = finite_or(s->p.presence_penalty, 0.0f);
    s->p.frequency_penalty = finite_or(s->p.frequency_penalty, 0.0f);
    if (isnan(s->p.temperature)) {
        s->p.temperature = 0.0f;
    }
    if (isnan(s->p.top_p)) {
        s->p.top_p = 1.0f;
    }
    if (isnan(s->p.min_p)) {
        s->p.min_p = 0.0f;
    }
    if (s->p.n_logprobs < 0) {
        s->p.n_logprobs = 0;
    }
    if (s->p.n_logprobs > 20) {
        s->p.n_logprobs = 20;
    }
    if (s->p.n_bias < 0 || s->p.n_bias > NALAR_MAX_LOGIT_BIAS) {
        s->p.n_bias = 0;
    }
    for (int32_t i = 0; i < s->p.n_bias; i++) {
        if (s->p.bias_id[i] < 0 || s->p.bias_id[i] >= n_vocab
            || !isfinite(s->p.bias[i]))
        {
            s->p.bias[i] = 0.0f;   /* ignored */
            s->p.bias_id[i] = 0;
        }
    }

    s->n_vocab = n_vocab;
    s->counts = calloc((size_t) n_vocab, sizeof(*s->counts));
    s->probs = calloc((size_t) n_vocab, sizeof(*s->probs));
    s->idx = calloc((size_t) n_vocab, sizeof(*s->idx));
    if (s->counts == NULL || s->probs == NULL || s->idx == NULL) {
        nalar_sampler_free(s);
        return -1;
    }

    nalar_rng_seed(&s->rng, s->p.seed);
    return 0;
}


void
nalar_sampler_free(nalar_sampler *s)
{
    free(s->counts);
    free(s->probs);
    free(s->idx);
    s->counts = NULL;
    s->probs = NULL;
    s->idx = NULL;
    s->n_vocab = 0;
}


void
nalar_sampler_accept(nalar_sampler *s, int32_t id)
{
    if (id >= 0 && id < s->n_vocab && s->counts[id] < INT32_MAX) {
        s->counts[id]++;
    }
}


/* ---- ordering helpers ---- */

/* Token a ranks before b: higher logit, ties to the lower id.  A total order
 * once NaNs are gone, so every selection below is deterministic. */
static inline int
before(const float *l, int32_t a, int32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}


/*
 * Vocabulary-wide loops, written so the compiler can vectorise them without
 * -ffast-math: no branches on the data, reductions split into lanes.
 */

enum { LANES = 8, BLOCK = 512 };


/* max of x[0..n), no NaNs present */
static float
max_of(const float *x, int32_t n)
{
    float m[LANES], r;
    int32_t i = 0;

    for (int j = 0; j < LANES; j++) {
        m[j] = -FLT_MAX;
    }
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        }
    }
    r = m[0];
    for (int j = 1; j < LANES; j++) {
        r = m[j] > r ? m[j] : r;
    }
    for (; i < n; i++) {
        r = x[i] > r ? x[i] : r;
    }
    return r;
}


/* sum of x[0..n) in double, in a fixed (lane) order */
static double
sum_of(const float *x, int32_t n)
{
    double a[LANES] = { 0 }, r = 0.0;
    int32_t i = 0;

    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            a[j] += x[i + j];
        }
    }
    for (int j = 0; j < LANES; j++) {
        r += a[j];
    }
    for (; i < n; i++) {
        r += x[i];
    }
    return r;
}


/* sum of x[0..n) as whole BLOCKs of sum_of: the draw skips blocks in the
 * same order and so reaches exactly this total */
static double
block_sum(const float *x, int32_t n)
{
    double r = 0.0;

    for (int32_t b = 0; b < n; b += BLOCK) {
        r += sum_of(x + b, n - b < BLOCK ? n - b : BLOCK);
    }
    return r;
}


/* lowest t with x[t] == m (m taken from x, so one exists) */
static int32_t
first_eq(const float *x, int32_t n, float m)
{
    for (int32_t t = 0; t < n; t++) {
        if (x[t] == m) {
            return t;
        }
    }
    return 0;
}


/* e[t] = exp((l[t] - m) / T) over the whole vocabulary */
static void
exp_weights(const float *l, float *e, int32_t n, float m, float T)
{
    for (int32_t t = 0; t < n; t++) {
        e[t] = nalar_exp_neg((l[t] - m) / T);
    }
}


int32_t
nalar_argmax(const float *x, int32_t n)
{
    int32_t best = -1;

    if (n <= 0) {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        /* strict > keeps the lowest id on ties; NaN never wins */
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) {
            best = i;
        }
    }
    return best < 0 ? 0 : best;
}


/*
 * Heap on token ids whose root is the token ranking LAST: the right shape for
 * "keep the k best" (compare a newcomer with the worst kept one) and for
 * heapsort (repeatedly move the worst to the end leaves the array best-first).
 */
static void
sift_down(int32_t *h, int32_t n, int32_t i, const float *l)
{
    for (;;) {
        int32_t w = i, c = 2 * i + 1, t;

        if (c < n && before(l, h[w], h[c])) {
            w = c;
        }
        if (c + 1 < n && before(l, h[w], h[c + 1])) {
            w = c + 1;
        }
        if (w == i) {
            return;
        }
        t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}


static void
heapify(int32_t *h, int32_t n, const float *l)
{
    for (int32_t i = n / 2 - 1; i >= 0; i--) {
        sift_down(h, n, i, l);
    }
}


/* h[0..n) must already be a heap; leaves it sorted best-first. */
static void
heap_sort(int32_t *h, int32_t n, const float *l)
{
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = h[0]; h[0] = h[end]; h[end] = t;
        sift_down(h, end, 0, l);
    }
}


/* ---- the candidate set ---- */

/*
 * Logit bias, then penalties (OpenAI), then clamp so the order is total and
 * exp() defined: NaN ranks last, +-inf become +-FLT_MAX (a -inf mask still
 * gets weight exp(-huge) == 0, and all-masked rows degrade to uniform, not
 * NaN).  In place.
 */
static void
penalise(const nalar_sampler *s, float *l)
{
    const nalar_sampling *p = &s->p;

    for (int32_t i = 0; i < p->n_bias; i++) {
        l[p->bias_id[i]] += p->bias[i];
    }
    for (int32_t t = 0; t < s->n_vocab; t++) {
        int32_t c = s->counts[t];
        float   x = l[t] - ((float) c * p->frequency_penalty
                            + (c > 0 ? p->presence_penalty : 0.0f));

        x = x >= -FLT_MAX ? x : -FLT_MAX;     /* NaN fails: ranks last */
        x = x <= FLT_MAX ? x : FLT_MAX;
        l[t] = x;
    }
}


/*
 * top-k (0 < k < V): the k best in s->idx, best-first, their weights at
 * temperature T in s->probs (max m first: weight 1), their sum in *Z.
 */
static int32_t
keep_top_k(nalar_sampler *s, const float *l, float m, float T, double *Z)
{
    int32_t  V = s->n_vocab, k = s->p.top_k;
    int32_t *idx = s->idx;
    float   *e = s->probs;
    float    worst;

    /* a heap of the k best seen so far, the worst at its root */
    for (int32_t t = 0; t < k; t++) {
        idx[t] = t;
    }
    heapify(idx, k, l);

    /* a newcomer has a higher id than every kept token, so it gets in
     * only with a strictly larger logit; blocks whose max is not larger
     * than the worst kept one are skipped whole */
    worst = l[idx[0]];
    for (int32_t b = k; b < V; b += 64) {
        int32_t end = V - b < 64 ? V : b + 64;

        if (max_of(l + b, end - b) <= worst) {
            continue;
        }
        for (int32_t t = b; t < end; t++) {
            if (l[t] > worst) {
                idx[0] = t;
                sift_down(idx, k, 0, l);
                worst = l[idx[0]];
            }
        }
    }
    heap_sort(idx, k, l);

    /* softmax at temperature over the survivors (max first: weight 1) */
    *Z = 0.0;
    for (int32_t i = 0; i < k; i++) {
        e[idx[i]] = nalar_exp_neg((l[idx[i]] - m) / T);
        *Z += e[idx[i]];
    }
    return k;
}


/*
 * top-p or min-p over weights s->probs (sum Z): only the head of the
 * distribution can survive, so collect the tokens above a weight
 * threshold, sort just those best-first into s->idx, and lower the
 * threshold only if their mass falls short of top_p.  With min-p the
 * threshold is exact: nothing below min_p * max can be kept whatever
 * top-p says.  The count collected (not yet cut).
 */
static int32_t
keep_head(nalar_sampler *s, const float *l, double Z)
{
    const nalar_sampling *p = &s->p;
    int32_t               V = s->n_vocab, n;
    int32_t              *idx = s->idx;
    const float          *e = s->probs;
    float                 th = p->min_p > 0.0f ? fminf(p->min_p, 1.0f)
                                               : 1e-3f;

    for (;;) {
        double kept = 0.0;

        n = 0;
        for (int32_t b = 0; b < V; b += 64) {
            int32_t end = V - b < 64 ? V : b + 64;

            if (max_of(e + b, end - b) < th) {
                continue;
            }
            for (int32_t t = b; t < end; t++) {
                if (e[t] >= th) {
                    idx[n++] = t;
                    kept += e[t];
                }
            }
        }
        if (p->min_p > 0.0f || th == 0.0f
            || kept >= (double) p->top_p * Z)
        {
            double cum = 0.0;

            heapify(idx, n, l);
            heap_sort(idx, n, l);

            /* the sorted prefix must reach top_p too (rounding differs) */
            for (int32_t i = 0; i < n; i++) {
                cum += e[idx[i]];
            }
            if (p->min_p > 0.0f || th == 0.0f
                || cum >= (double) p->top_p * Z)
            {
                return n;
            }
        }
        th = th > 1e-12f ? th * 1e-3f : 0.0f;
    }
}


/*
 * The n best-first candidates in s->idx cut by top-p (the shortest prefix
 * whose mass reaches top_p of Z) and min-p (drop e < min_p * max e; max e
 * is 1, and renormalising can't move this cut, since it scales every
 * weight alike); at least one is kept.
 */
static int32_t
cut_tail(const nalar_sampler *s, int32_t n, double Z)
{
    const nalar_sampling *p = &s->p;
    const float          *e = s->probs;

    if (p->top_p < 1.0f) {
        double cum = 0.0, target = (double) p->top_p * Z;

        for (int32_t i = 0; i < n; i++) {
            cum += e[s->idx[i]];
            if (cum >= target) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        for (int32_t i = 1; i < n; i++) {
            if (e[s->idx[i]] < p->min_p) {
                n = i;
                break;
            }
        }
    }
    return n < 1 ? 1 : n;
}


/*
 * Penalise and sanitise logits in place, then build the kept candidates.
 *
 * On return s->idx[0..n) holds the candidates best-first (or, when *all is
 * set, every token is a candidate in id order and idx is unused), s->probs[t]
 * holds the unnormalised weight e[t] of each candidate t (other entries are
 * stale), and *sum is the sum of the candidates' weights in that order.
 * The top candidate always has weight exactly 1, so *sum >= 1.
 */
static int32_t
candidates(nalar_sampler *s, float *l, double *sum, int *all)
{
    const nalar_sampling *p = &s->p;
    int32_t               V = s->n_vocab;
    float                 T = p->temperature;
    int32_t               k = p->top_k;
    int32_t               n;
    double                Z;
    float                 m;

    *all = 0;
    penalise(s, l);
    m = max_of(l, V);

    /* temperature 0 (or nonsense below it): a point mass on the argmax */
    if (!(T > 0.0f)) {
        s->idx[0] = first_eq(l, V, m);
        s->probs[s->idx[0]] = 1.0f;
        *sum = 1.0;
        return 1;
    }

    if (k > 0 && k < V) {
        n = keep_top_k(s, l, m, T, &Z);
    } else {
        exp_weights(l, s->probs, V, m, T);
        Z = block_sum(s->probs, V);
        if (!(p->top_p < 1.0f) && !(p->min_p > 0.0f)) {
            /* no truncation: the whole vocabulary, drawn in id order */
            *all = 1;
            *sum = Z;
            return V;
        }
        n = keep_head(s, l, Z);
    }
    n = cut_tail(s, n, Z);
    *sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        *sum += s->probs[s->idx[i]];
    }
    return n;
}


int
nalar_sampler_dist(nalar_sampler *s, float *logits)
{
    double  sum;
    int     all;
    int32_t n = candidates(s, logits, &sum, &all);
    int32_t V = s->n_vocab, nonzero = 0;
    float  *pr = s->probs;

    if (all) {
        for (int32_t t = 0; t < V; t++) {
            pr[t] = (float) (pr[t] / sum);
            nonzero += pr[t] > 0.0f;
        }
        return nonzero;
    }

    /* kept == does not rank after the last candidate (see the top) */
    int32_t last = s->idx[n - 1];
    float   ll = logits[last];

    for (int32_t t = 0; t < V; t++) {
        int kept = logits[t] > ll || (logits[t] == ll && t <= last);

        pr[t] = kept ? (float) (pr[t] / sum) : 0.0f;
        nonzero += pr[t] > 0.0f;
    }
    return nonzero;
}


/*
 * OpenAI's logprobs: log-softmax of the penalised logits at T = 1, whatever
 * the sampling transforms did.  lp[0] is the chosen token, lp[1..nlp] the
 * nlp best tokens, best first.
 */
static void
fill_logprobs(const float *l, int32_t V, int32_t chosen, int32_t nlp,
              nalar_logprob *lp, float *scratch)
{
    nalar_logprob *top = lp + 1;
    float          m = max_of(l, V);
    double         lse;
    int32_t        c = 0;

    exp_weights(l, scratch, V, m, 1.0f);
    lse = (double) m + log(sum_of(scratch, V));

    lp[0].id = chosen;
    lp[0].logprob = (float) fmax((double) l[chosen] - lse, -FLT_MAX);

    /* insertion into a best-first list of nlp; most tokens fail the first
     * comparison, so this is one pass over the vocabulary */
    for (int32_t t = 0; t < V && nlp > 0; t++) {
        int32_t pos;

        if (c == nlp) {
            /* full: t (a higher id) gets in only above the worst kept;
             * skip ahead while whole blocks cannot */
            float worst = l[top[c - 1].id];

            while ((t & 63) == 0 && t + 64 <= V && max_of(l + t, 64) <= worst) {
                t += 64;
            }
            if (t >= V) {
                break;
            }
            if (!(l[t] > worst)) {
                continue;
            }
        }
        pos = c < nlp ? c : nlp - 1;
        while (pos > 0 && before(l, t, top[pos - 1].id)) {
            top[pos] = top[pos - 1];
            pos--;
        }
        top[pos].id = t;
        if (c < nlp) {
            c++;
        }
    }
    for (int32_t i = 0; i < c; i++) {
        top[i].logprob = (float) fmax((double) l[top[i].id] - lse, -FLT_MAX);
    }
}


int32_t
nalar_sample(nalar_sampler *s, float *logits, nalar_logprob *lp)
{
    double  sum, r, cum = 0.0;
    int     all;
    int32_t n = candidates(s, logits, &sum, &all);
    int32_t pick = -1, last = -1;

    /* inverse CDF over the candidates in their order (best-first, or id order
     * when untruncated); zero-weight tokens can never be crossed into */
    r = nalar_rng_uniform(&s->rng) * sum;
    if (all) {
        /* whole blocks below r are skipped with the sums that made `sum` */
        for (int32_t b = 0; b < n && pick < 0; b += BLOCK) {
            int32_t len = n - b < BLOCK ? n - b : BLOCK;
            double  bs = sum_of(s->probs + b, len);

            if (cum + bs <= r && b + BLOCK < n) {
                cum += bs;
                continue;
            }
            for (int32_t t = b; t < b + len; t++) {
                if (s->probs[t] > 0.0f) {
                    last = t;
                    cum += s->probs[t];
                    if (cum > r) {
                        pick = t;
                        break;
                    }
                }
            }
        }
    } else {
        for (int32_t i = 0; i < n; i++) {
            int32_t t = s->idx[i];

            if (s->probs[t] > 0.0f) {
                last = t;
                cum += s->probs[t];
                if (cum > r) {
                    pick = t;
                    break;
                }
            }
        }
    }
    if (pick < 0) {
        /* rounding left r just past the end: the last live candidate */
        pick = last >= 0 ? last : (all ? first_eq(logits, n, max_of(logits, n))
                                       : s->idx[0]);
    }

    if (lp != NULL) {
        int32_t nlp = s->p.n_logprobs;

        if (nlp > s->n_vocab) {
            nlp = s->n_vocab;
        }
        /* the weights are spent: s->probs is free to reuse */
        fill_logprobs(logits, s->n_vocab, pick, nlp, lp, s->probs);
    }
    return pick;
}


int32_t
nalar_sample_from(nalar_sampler *s, const float *w, int32_t n)
{
    double sum = 0.0, r, cum = 0.0;
    int32_t pick = -1;

    for (int32_t i = 0; i < n; i++) {
        if (w[i] > 0.0f && isfinite(w[i])) {
            sum += w[i];
        }
    }
    if (!(sum > 0.0)) {
        return -1;
    }

    r = nalar_rng_uniform(&s->rng) * sum;
    for (int32_t i = 0; i < n; i++) {
        if (w[i] > 0.0f && isfinite(w[i])) {
            pick = i;
            cum += w[i];
            if (cum > r) {
                break;
            }
        }
    }
    return pick;
}
