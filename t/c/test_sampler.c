/*
 * Sampler and stop-sequence tests.  The sampling tests compare against a
 * textbook reference (sort everything, softmax in double, cut) and check that
 * draws follow the distribution nalar_sampler_dist reports, with a chi-square
 * statistic at fixed seeds (deterministic: no flaky thresholds).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "stop.h"
#include "tap.h"


/* ---- a reference sampler distribution, written from the definitions ---- */

static const float *ref_l;

static int
ref_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;

    if (ref_l[x] != ref_l[y]) {
        return ref_l[x] > ref_l[y] ? -1 : 1;
    }
    return x < y ? -1 : 1;
}


/* out[V] = the distribution for already-penalised logits l; returns the
 * number of kept tokens */
static int
ref_dist(const float *l, int V, const nalar_sampling *p, double *out)
{
    int32_t *ord = malloc(sizeof(*ord) * (size_t) V);
    double  *q = calloc((size_t) V, sizeof(*q));
    int      n = V, i;
    double   z = 0, cum = 0, pmax;

    for (i = 0; i < V; i++) {
        ord[i] = i;
        out[i] = 0;
    }
    ref_l = l;
    qsort(ord, (size_t) V, sizeof(*ord), ref_cmp);

    if (p->temperature <= 0) {
        out[ord[0]] = 1;
        free(ord);
        free(q);
        return 1;
    }
    if (p->top_k > 0 && p->top_k < V) {
        n = p->top_k;
    }
    for (i = 0; i < n; i++) {
        q[i] = exp(((double) l[ord[i]] - l[ord[0]]) / p->temperature);
        z += q[i];
    }
    for (i = 0; i < n; i++) {
        q[i] /= z;
    }
    if (p->top_p < 1) {
        for (i = 0; i < n; i++) {
            cum += q[i];
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    pmax = q[0];
    if (p->min_p > 0) {
        for (i = 1; i < n; i++) {
            if (q[i] < p->min_p * pmax) {
                n = i;
                break;
            }
        }
    }
    z = 0;
    for (i = 0; i < n; i++) {
        z += q[i];
    }
    for (i = 0; i < n; i++) {
        out[ord[i]] = q[i] / z;
    }
    free(ord);
    free(q);
    return n;
}


static void
shuffle(int32_t *a, int n, nalar_rng *r)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int) (nalar_rng_next(r) % (uint64_t) (i + 1));
        int32_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}


/* ---- RNG ---- */

static void
test_rng(void)
{
    nalar_rng a;
    double    sum = 0, lo = 1, hi = 0;

    /* values from an independent implementation (Python, 64-bit masks) */
    nalar_rng_seed(&a, 0);
    ok(nalar_rng_next(&a) == 0x99ec5f36cb75f2b4ULL
       && nalar_rng_next(&a) == 0xbf6e1f784956452aULL
       && nalar_rng_next(&a) == 0x1a5f849d4933e6e0ULL,
       "xoshiro256** from splitmix64(0) matches the reference stream");
    nalar_rng_seed(&a, 12345);
    ok(nalar_rng_next(&a) == 0xbe6a36374160d49bULL
       && nalar_rng_next(&a) == 0x214aaa0637a688c6ULL,
       "xoshiro256** from splitmix64(12345) matches the reference stream");

    nalar_rng_seed(&a, 7);
    for (int i = 0; i < 100000; i++) {
        double u = nalar_rng_uniform(&a);

        sum += u;
        lo = fmin(lo, u);
        hi = fmax(hi, u);
    }
    ok(lo >= 0 && hi < 1, "uniform stays in [0, 1): min %g max %.17g", lo, hi);
    ok(fabs(sum / 100000 - 0.5) < 0.005, "uniform mean %.4f ~ 0.5",
       sum / 100000);
    ok(lo < 1e-3 && hi > 1 - 1e-3, "uniform covers the interval");
}


/* ---- greedy ---- */

static void
test_greedy(void)
{
    float          x[] = { 0.5f, 3.0f, -1.0f, 3.0f, 2.9f };
    float          y[] = { NAN, -INFINITY, 1.0f, NAN };
    float          l[5];
    nalar_sampling p;
    nalar_sampler  s;

    is_int(nalar_argmax(x, 5), 1, "argmax ties go to the lowest id");
    is_int(nalar_argmax(x, 3), 1, "argmax over a prefix");
    is_int(nalar_argmax(y, 4), 2, "argmax skips NaN");
    is_int(nalar_argmax(x, 0), -1, "argmax of nothing is -1");

    nalar_sampling_default(&p);
    p.temperature = 0;
    ok(nalar_sampler_init(&s, &p, 5) == 0, "init greedy sampler");
    int hits = 0;
    for (int i = 0; i < 20; i++) {
        memcpy(l, x, sizeof(l));
        hits += nalar_sample(&s, l, NULL) == 1;
    }
    is_int(hits, 20, "temperature 0 always returns the (lowest-id) argmax");
    memcpy(l, x, sizeof(l));
    is_int(nalar_sampler_dist(&s, l), 1, "greedy dist has one candidate");
    ok(s.probs[1] == 1 && s.probs[0] == 0 && s.probs[3] == 0
       && s.probs[4] == 0, "greedy dist is a point mass on the argmax");
    nalar_sampler_free(&s);

    ok(nalar_sampler_init(&s, &p, 0) == -1, "init rejects an empty vocab");
}


/* ---- reproducibility ---- */

static void
test_seeds(void)
{
    enum { V = 50, N = 300 };
    float          base[V], l[V];
    int32_t        a[N], b[N], c[N];
    nalar_sampling p;
    nalar_sampler  s1, s2, s3;
    int            same12 = 1, same13 = 1;

    for (int i = 0; i < V; i++) {
        base[i] = (float) sin(i * 1.7) * 2;
    }
    nalar_sampling_default(&p);
    p.seed = 42;
    nalar_sampler_init(&s1, &p, V);
    nalar_sampler_init(&s2, &p, V);
    p.seed = 43;
    nalar_sampler_init(&s3, &p, V);
    for (int i = 0; i < N; i++) {
        memcpy(l, base, sizeof(l)); a[i] = nalar_sample(&s1, l, NULL);
        memcpy(l, base, sizeof(l)); b[i] = nalar_sample(&s2, l, NULL);
        memcpy(l, base, sizeof(l)); c[i] = nalar_sample(&s3, l, NULL);
        same12 &= a[i] == b[i];
        same13 &= a[i] == c[i];
    }
    ok(same12, "same seed: same %d samples", N);
    ok(!same13, "different seeds: different samples");
    nalar_sampler_free(&s1);
    nalar_sampler_free(&s2);
    nalar_sampler_free(&s3);
}


/* ---- top_k = 1 is greedy at any temperature ---- */

static void
test_topk1(void)
{
    enum { V = 1000 };
    float          l[V], g[V];
    float          temps[] = { 0.1f, 0.7f, 1.0f, 3.0f, 100.0f };
    nalar_rng      r;
    nalar_sampling p;
    nalar_sampler  s;
    int            good = 1;

    nalar_rng_seed(&r, 99);
    nalar_sampling_default(&p);
    p.top_k = 1;
    for (int ti = 0; ti < 5; ti++) {
        p.temperature = temps[ti];
        nalar_sampler_init(&s, &p, V);
        for (int row = 0; row < 20; row++) {
            for (int i = 0; i < V; i++) {
                /* coarse values: many ties, including at the top */
                l[i] = (float) (nalar_rng_next(&r) % 16);
                g[i] = l[i];
            }
            good &= nalar_sample(&s, l, NULL) == nalar_argmax(g, V);
        }
        nalar_sampler_free(&s);
    }
    ok(good, "top_k=1 equals greedy (ties included) at T = 0.1 .. 100");
}


/* ---- distribution and draws against the reference ---- */

/* The chi-square(d) quantile 1 - 1e-6 (Wilson-Hilferty, z = 4.7534;
 * above the exact value for d <= 8: 43.95 for 42.70 at d = 8) */
static double
chi2_crit_1e6(int d)
{
    double k = d < 1 ? 1 : d, a = 2.0 / (9.0 * k);

    return k * pow(1 - a + 4.7534 * sqrt(a), 3);
}


/*
 * Six "real" tokens with known probabilities hidden at shuffled ids of a
 * vocabulary of 64, the rest sharing a small tail.  Checks nalar_sampler_dist
 * against ref_dist, then draws 20000 tokens and computes chi-square of the
 * counts against the distribution (bins with expectation < 5 lumped).
 * The draws are sized by power: the deviation to catch is a draw that
 * lands on the wrong token (an off-by-one in the cumulative walk, a
 * biased uniform), which moves at least the smallest real token's mass,
 * a total variation distance delta of 0.03.  Drawing N from q when the
 * counts are tested against p, the statistic has noncentrality
 * N sum (q - p)^2 / p >= 4 N delta^2 (Cauchy-Schwarz, sum p = 1); at a
 * false-alarm rate of 1e-6 with at most 8 degrees of freedom, power 0.99
 * needs 70.4 (the noncentral chi-square's Poisson mixture), so
 * N = 70.4 / (4 x 0.03^2) = 19,600: 20,000 draws.  (At the 1e-3 it used
 * before, one run of the 12 checks failed falsely about once in 80.)
 */
static void
check_dist(const char *name, const nalar_sampling *p, int want_kept)
{
    enum { V = 64, N = 20000 };
    static const double P[6] = { 0.40, 0.25, 0.15, 0.10, 0.06, 0.0342 };
    float          base[V], l[V];
    double         dist[V], ref[V], sum = 0, maxdiff = 0, chi2 = 0, rest_e = 0;
    int32_t        perm[V];
    int            cnt[V] = { 0 }, rest_n = 0, bins = 0, kept, nz = 0;
    int            bad = 0;
    nalar_rng      r;
    nalar_sampler  s;

    nalar_rng_seed(&r, 1);
    for (int i = 0; i < V; i++) {
        perm[i] = i;
    }
    shuffle(perm, V, &r);
    for (int i = 0; i < V; i++) {
        /* 58 tail tokens of 0.0001 each: 0.0058 + 0.9942 above = 1 */
        base[perm[i]] = (float) log(i < 6 ? P[i] : 0.0001);
    }

    kept = ref_dist(base, V, p, ref);
    is_int(kept, want_kept, "%s: reference keeps %d tokens", name, want_kept);

    nalar_sampler_init(&s, p, V);
    memcpy(l, base, sizeof(l));
    int n = nalar_sampler_dist(&s, l);
    for (int i = 0; i < V; i++) {
        dist[i] = s.probs[i];            /* sampling reuses s.probs */
        sum += dist[i];
        maxdiff = fmax(maxdiff, fabs(dist[i] - ref[i]));
        nz += dist[i] > 0;
        bad |= (dist[i] > 0) != (ref[i] > 0);
    }
    is_int(n, kept, "%s: dist reports %d candidates", name, kept);
    ok(!bad && nz == kept, "%s: dist keeps exactly the reference tokens", name);
    ok(fabs(sum - 1) < 1e-5, "%s: dist sums to 1 (%.8f)", name, sum);
    ok(maxdiff < 1e-5, "%s: dist matches reference (max diff %.2g)", name,
       maxdiff);

    for (int i = 0; i < N; i++) {
        memcpy(l, base, sizeof(l));
        int32_t t = nalar_sample(&s, l, NULL);
        if (t < 0 || t >= V) {
            bad = 1;
            break;
        }
        cnt[t]++;
    }
    for (int i = 0; i < V; i++) {
        double e = N * dist[i];

        if (cnt[i] > 0 && dist[i] == 0) {
            bad = 1;
        }
        if (e >= 5) {
            chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
            bins++;
        } else {
            rest_e += e;
            rest_n += cnt[i];
        }
    }
    if (rest_e > 0) {
        chi2 += (rest_n - rest_e) * (rest_n - rest_e) / fmax(rest_e, 1);
        bins++;
    }
    ok(!bad, "%s: never draws a token outside the distribution", name);
    ok(bins >= 1 && chi2 < chi2_crit_1e6(bins - 1), "%s: chi2 = %.2f over "
       "%d bins (critical %.2f)", name, chi2, bins, chi2_crit_1e6(bins - 1));
    nalar_sampler_free(&s);
}


static void
test_distributions(void)
{
    nalar_sampling p;

    nalar_sampling_default(&p);
    check_dist("plain T=1", &p, 64);

    p.temperature = 0.5f;
    check_dist("T=0.5", &p, 64);

    nalar_sampling_default(&p);
    p.top_k = 3;
    check_dist("top_k=3", &p, 3);

    nalar_sampling_default(&p);
    p.top_p = 0.85f;         /* .40 .65 .80 .90 -> 4 */
    check_dist("top_p=0.85", &p, 4);

    nalar_sampling_default(&p);
    p.top_p = 0.99855f;      /* .9942 + 43.5 tail tokens: needs the tail,
                                which sits below the first threshold */
    check_dist("top_p=0.99855", &p, 50);

    nalar_sampling_default(&p);
    p.min_p = 0.3f;          /* keep p >= 0.12 -> 3 */
    check_dist("min_p=0.3", &p, 3);

    nalar_sampling_default(&p);
    p.temperature = 2.0f;    /* sqrt-flattened top 5: .304 .240 .186 .152 */
    p.top_k = 5;
    p.top_p = 0.8f;          /* cum .304 .544 .730 .882 -> 4 */
    p.min_p = 0.55f;         /* .55 * .304 = .167 -> 3 */
    check_dist("T=2 top_k=5 top_p=0.8 min_p=0.55", &p, 3);

    nalar_sampling_default(&p);
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    check_dist("T=0.7 top_p=0.9 min_p=0.05", &p, 4);
}


/* ---- penalties ---- */

static void
test_penalties(void)
{
    float          base[3] = { 2.0f, 1.9f, 0.5f }, l[3];
    nalar_sampling p;
    nalar_sampler  s;

    nalar_sampling_default(&p);
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    nalar_sampler_init(&s, &p, 3);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 0, "no history: argmax 0");
    nalar_sampler_accept(&s, 0);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 1, "presence 0.5 moves argmax to 1");
    ok(fabsf(l[0] - 1.5f) < 1e-6 && l[1] == 1.9f && l[2] == 0.5f,
       "presence penalty subtracted once from the seen token only");
    nalar_sampler_accept(&s, 0);
    memcpy(l, base, sizeof(l));
    nalar_sample(&s, l, NULL);
    ok(fabsf(l[0] - 1.5f) < 1e-6, "presence does not grow with count");
    nalar_sampler_accept(&s, -1);
    nalar_sampler_accept(&s, 3);
    is_int(s.counts[0] * 100 + s.counts[1] * 10 + s.counts[2], 200,
           "accept ignores out-of-range ids: counts stay {2, 0, 0}");
    memcpy(l, base, sizeof(l));
    nalar_sample(&s, l, NULL);
    ok(fabsf(l[0] - 1.5f) < 1e-6 && l[1] == 1.9f && l[2] == 0.5f,
       "and the penalties after them are those of the in-range ids");
    nalar_sampler_free(&s);

    p.presence_penalty = 0;
    p.frequency_penalty = 0.05f;
    nalar_sampler_init(&s, &p, 3);
    for (int i = 0; i < 3; i++) {
        nalar_sampler_accept(&s, 0);
    }
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 1,
           "frequency 0.05 x 3 (2.0 -> 1.85) moves argmax to 1");
    ok(fabsf(l[0] - 1.85f) < 1e-6, "frequency penalty is count * penalty");
    nalar_sampler_free(&s);

    p.frequency_penalty = 0.01f;
    nalar_sampler_init(&s, &p, 3);
    for (int i = 0; i < 3; i++) {
        nalar_sampler_accept(&s, 0);
    }
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 0, "frequency 0.01 x 3 keeps argmax 0");
    nalar_sampler_free(&s);

    p.frequency_penalty = 0;
    p.presence_penalty = -2.0f;
    nalar_sampler_init(&s, &p, 3);
    nalar_sampler_accept(&s, 2);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 2, "negative presence promotes token 2");
    nalar_sampler_free(&s);
}


/* ---- logprobs ---- */

static void
test_logprobs(void)
{
    enum { V = 1000, NLP = 5 };
    float          base[V], l[V], pen[V];
    double         want[V], m = -INFINITY, z = 0;
    nalar_logprob  lp[1 + NLP], lp2[1 + NLP];
    nalar_rng      r;
    nalar_sampling p;
    nalar_sampler  s, s2;
    int            good = 1, sorted = 1, top = 1, same = 1;
    int32_t        t;

    nalar_rng_seed(&r, 5);
    for (int i = 0; i < V; i++) {
        base[i] = (float) (nalar_rng_uniform(&r) * 10 - 5);
    }
    base[17] = base[3] = 6.0f;        /* a tie at the top */

    nalar_sampling_default(&p);
    p.n_logprobs = NLP;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    nalar_sampler_init(&s, &p, V);
    nalar_sampler_accept(&s, 3);
    nalar_sampler_accept(&s, 3);
    nalar_sampler_accept(&s, 900);

    /* direct log-softmax of the penalised logits */
    memcpy(pen, base, sizeof(pen));
    pen[3] -= 2 * 0.5f + 0.25f;
    pen[900] -= 0.5f + 0.25f;
    for (int i = 0; i < V; i++) {
        m = fmax(m, pen[i]);
    }
    for (int i = 0; i < V; i++) {
        z += exp(pen[i] - m);
    }
    for (int i = 0; i < V; i++) {
        want[i] = pen[i] - m - log(z);
    }

    memcpy(l, base, sizeof(l));
    t = nalar_sample(&s, l, lp);
    is_int(lp[0].id, t, "lp[0] is the chosen token");
    ok(fabs(lp[0].logprob - want[t]) < 1e-4, "chosen logprob %.5f == %.5f",
       lp[0].logprob, want[t]);
    for (int k = 1; k <= NLP; k++) {
        good &= fabs(lp[k].logprob - want[lp[k].id]) < 1e-4;
        if (k > 1) {
            sorted &= lp[k].logprob <= lp[k - 1].logprob;
        }
    }
    /* no token outside the list beats the last one in it */
    for (int i = 0; i < V; i++) {
        int in = 0;
        for (int k = 1; k <= NLP; k++) {
            in |= lp[k].id == i;
        }
        if (!in && want[i] > want[lp[NLP].id]) {
            top = 0;
        }
    }
    ok(good, "top logprobs equal the direct log-softmax");
    ok(sorted, "top logprobs are sorted descending");
    ok(top, "top logprobs are the %d largest", NLP);
    is_int(lp[1].id, 17, "the penalised former tie-mate 17 now leads");

    /* logprobs ignore temperature and truncation */
    p.temperature = 0.3f;
    p.top_k = 2;
    nalar_sampler_init(&s2, &p, V);
    nalar_sampler_accept(&s2, 3);
    nalar_sampler_accept(&s2, 3);
    nalar_sampler_accept(&s2, 900);
    memcpy(l, base, sizeof(l));
    t = nalar_sample(&s2, l, lp2);
    for (int k = 1; k <= NLP; k++) {
        same &= lp2[k].id == lp[k].id && lp2[k].logprob == lp[k].logprob;
    }
    ok(same, "top logprobs identical under T=0.3 top_k=2");
    ok(fabs(lp2[0].logprob - want[t]) < 1e-4,
       "chosen logprob at T=0.3 is still the T=1 value");
    nalar_sampler_free(&s);
    nalar_sampler_free(&s2);

    /* n_logprobs = 0: only lp[0], nothing past it touched */
    nalar_sampling_default(&p);
    nalar_sampler_init(&s, &p, V);
    lp[1].id = -7;
    memcpy(l, base, sizeof(l));
    t = nalar_sample(&s, l, lp);
    ok(lp[0].id == t && lp[1].id == -7, "n_logprobs 0 fills lp[0] only");
    nalar_sampler_free(&s);
}


/* ---- hostile logits ---- */

static void
test_hostile(void)
{
    float          l[6], masked[6] = { -INFINITY, 1, NAN, -INFINITY, 1, 0 };
    nalar_sampling p;
    nalar_sampler  s;
    int            good = 1;

    nalar_sampling_default(&p);
    nalar_sampler_init(&s, &p, 6);
    for (int i = 0; i < 2000; i++) {
        memcpy(l, masked, sizeof(l));
        int32_t t = nalar_sample(&s, l, NULL);
        good &= t == 1 || t == 4 || t == 5;
    }
    ok(good, "-inf and NaN logits are never drawn");
    memcpy(l, masked, sizeof(l));
    nalar_sampler_dist(&s, l);
    ok(s.probs[0] == 0 && s.probs[2] == 0 && s.probs[3] == 0
       && s.probs[1] > 0.4f, "-inf and NaN logits get probability 0");

    for (int i = 0; i < 6; i++) {
        l[i] = -INFINITY;
    }
    int32_t t = nalar_sample(&s, l, NULL);
    ok(t >= 0 && t < 6, "all -inf row still yields a token (%d)", t);
    for (int i = 0; i < 6; i++) {
        l[i] = i == 2 ? INFINITY : 0;
    }
    is_int(nalar_sample(&s, l, NULL), 2, "+inf logit wins");
    nalar_sampler_free(&s);

    float w[4] = { 0, 3, 1, -2 };
    int   cnt[4] = { 0 };
    nalar_sampler_init(&s, &p, 4);
    for (int i = 0; i < 20000; i++) {
        cnt[nalar_sample_from(&s, w, 4)]++;
    }
    ok(cnt[0] == 0 && cnt[3] == 0 && fabs(cnt[1] / 20000.0 - 0.75) < 0.015,
       "sample_from follows weights (%d %d %d %d)", cnt[0], cnt[1], cnt[2],
       cnt[3]);
    float zero[2] = { 0, -1 };
    is_int(nalar_sample_from(&s, zero, 2), -1, "sample_from all-zero is -1");
    nalar_sampler_free(&s);
}


/* ---- a Llama-3-sized vocabulary ---- */

static void
test_big_vocab(void)
{
    enum { V = 128256 };
    float         *base = malloc(sizeof(float) * V), *l = malloc(sizeof(float) * V);
    double        *ref = malloc(sizeof(double) * V);
    nalar_rng      r;
    nalar_sampling p;
    nalar_sampler  s;
    nalar_logprob  lp[21];

    nalar_rng_seed(&r, 2024);
    for (int i = 0; i < V; i++) {
        /* roughly Gumbel-ish: a few tall logits over a broad floor */
        double u = nalar_rng_uniform(&r);
        base[i] = (float) (-log(-log(u + 1e-12) + 1e-12) * 2);
    }

    struct { const char *name; float T; int k; float tp, mp; } cfg[] = {
        { "greedy",            0.0f,  0, 1.0f, 0.0f },
        { "untruncated",       1.0f,  0, 1.0f, 0.0f },
        { "top_k=40",          0.8f, 40, 1.0f, 0.0f },
        { "top_p=0.9",         1.0f,  0, 0.9f, 0.0f },
        { "min_p=0.05",        1.0f,  0, 1.0f, 0.05f },
        { "top_k=50 top_p=.95", 0.6f, 50, 0.95f, 0.0f },
        { "top_k=100000",      1.0f, 100000, 0.5f, 0.0f },
    };
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        double sum = 0, maxdiff = 0;
        int    kept, n, in = 1;

        nalar_sampling_default(&p);
        p.temperature = cfg[c].T;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].tp;
        p.min_p = cfg[c].mp;
        p.n_logprobs = 20;
        if (nalar_sampler_init(&s, &p, V) != 0) {
            ok(0, "init V=%d", V);
            continue;
        }
        kept = ref_dist(base, V, &p, ref);
        memcpy(l, base, sizeof(float) * V);
        n = nalar_sampler_dist(&s, l);
        for (int i = 0; i < V; i++) {
            sum += s.probs[i];
            maxdiff = fmax(maxdiff, fabs(s.probs[i] - ref[i]));
        }
        for (int i = 0; i < 50; i++) {
            memcpy(l, base, sizeof(float) * V);
            int32_t t = nalar_sample(&s, l, lp);
            in &= t >= 0 && t < V && ref[t] > 0 && lp[0].id == t;
        }
        ok(abs(n - kept) <= 1 && fabs(sum - 1) < 1e-4 && maxdiff < 1e-5 && in,
           "V=%d %s: %d kept (ref %d), sum %.6f, max diff %.2g", V,
           cfg[c].name, n, kept, sum, maxdiff);
        nalar_sampler_free(&s);
    }

    /* logprobs over the big vocabulary: top 20 and values, directly */
    {
        int32_t *ord = malloc(sizeof(int32_t) * V);
        double   m = -INFINITY, z = 0;
        int      good = 1;

        for (int i = 0; i < V; i++) {
            ord[i] = i;
            m = fmax(m, base[i]);
        }
        for (int i = 0; i < V; i++) {
            z += exp(base[i] - m);
        }
        ref_l = base;
        qsort(ord, V, sizeof(*ord), ref_cmp);
        nalar_sampling_default(&p);
        p.top_k = 40;
        p.n_logprobs = 20;
        nalar_sampler_init(&s, &p, V);
        memcpy(l, base, sizeof(float) * V);
        int32_t t = nalar_sample(&s, l, lp);
        good &= fabs(lp[0].logprob - (base[t] - m - log(z))) < 1e-4;
        for (int k = 1; k <= 20; k++) {
            good &= lp[k].id == ord[k - 1]
                    && fabs(lp[k].logprob - (base[ord[k - 1]] - m - log(z)))
                       < 1e-4;
        }
        ok(good, "V=%d: top-20 logprobs are the sorted log-softmax", V);
        nalar_sampler_free(&s);
        free(ord);
    }

    /* flat row: top-p must sort (nearly) everything */
    for (int i = 0; i < V; i++) {
        base[i] = 0.25f;
    }
    nalar_sampling_default(&p);
    p.top_p = 0.9f;
    nalar_sampler_init(&s, &p, V);
    memcpy(l, base, sizeof(float) * V);
    is_int(nalar_sampler_dist(&s, l), (int) ceil(0.9f * (double) V),
           "flat row, top_p=0.9 keeps ceil(0.9 V) tokens");
    ok(s.probs[0] > 0 && s.probs[V - 1] == 0, "flat row: ties kept by low id");
    nalar_sampler_free(&s);

    /* one peak over a tail below the first threshold: mass is in the tail */
    for (int i = 0; i < V; i++) {
        base[i] = i == 7 ? 0.0f : -8.0f;
    }
    p.top_p = 0.5f;
    nalar_sampler_init(&s, &p, V);
    memcpy(l, base, sizeof(float) * V);
    int n = nalar_sampler_dist(&s, l);
    int kept = ref_dist(base, V, &p, ref);
    ok(abs(n - kept) <= 1 && kept > 1000 && s.probs[7] > s.probs[8],
       "peak over heavy tail, top_p=0.5: %d kept (ref %d)", n, kept);
    nalar_sampler_free(&s);

    free(base);
    free(l);
    free(ref);
}


/* ---- stop sequences ---- */

/* Feed pieces, collect everything emitted (plus the flush unless stopped). */
static int
run_stop(const char **stops, int ns, const char **pieces, int np, char *out,
         int *stopped_at)
{
    nalar_stop *st = nalar_stop_create(stops, ns);
    const char *e;
    size_t      n, len = 0;
    int         stopped = 0;

    *stopped_at = -1;
    for (int i = 0; i < np; i++) {
        n = nalar_stop_feed(st, pieces[i], strlen(pieces[i]), &e, &stopped);
        memcpy(out + len, e, n);
        len += n;
        if (stopped && *stopped_at < 0) {
            *stopped_at = i;
        }
    }
    n = nalar_stop_flush(st, &e);
    memcpy(out + len, e, n);
    len += n;
    out[len] = '\0';
    nalar_stop_destroy(st);
    return (int) len;
}


static void
test_stop(void)
{
    char        out[4096];
    int         at;
    const char *e;
    size_t      n;
    int         stopped;

    {
        const char *pieces[] = { "hello", " ", "world" };
        run_stop(NULL, 0, pieces, 3, out, &at);
        ok(strcmp(out, "hello world") == 0 && at == -1,
           "no stops: pass-through");
        nalar_stop *st = nalar_stop_create(NULL, 0);
        n = nalar_stop_feed(st, "abc", 3, &e, &stopped);
        ok(n == 3 && memcmp(e, "abc", 3) == 0 && !stopped,
           "no stops: each feed emitted at once");
        nalar_stop_destroy(st);
    }
    {
        const char *stops[] = { "", NULL, "" };
        const char *pieces[] = { "a", "" , "b" };
        run_stop(stops, 3, pieces, 3, out, &at);
        ok(strcmp(out, "ab") == 0 && at == -1, "empty/NULL stops ignored");
    }
    {
        /* split across feeds, checked call by call */
        const char *stops[] = { "</s>" };
        nalar_stop *st = nalar_stop_create(stops, 1);

        n = nalar_stop_feed(st, "ab<", 3, &e, &stopped);
        ok(n == 2 && memcmp(e, "ab", 2) == 0 && !stopped,
           "split stop: 'ab<' emits 'ab', holds '<'");
        n = nalar_stop_feed(st, "/", 1, &e, &stopped);
        ok(n == 0 && !stopped, "split stop: '/' held");
        n = nalar_stop_feed(st, "s", 1, &e, &stopped);
        ok(n == 0 && !stopped, "split stop: 's' held");
        n = nalar_stop_feed(st, ">cd", 3, &e, &stopped);
        ok(n == 0 && stopped, "split stop: '>' completes it, 'cd' dropped");
        n = nalar_stop_feed(st, "more", 4, &e, &stopped);
        ok(n == 0 && stopped, "after stop: nothing more");
        ok(nalar_stop_flush(st, &e) == 0, "after stop: flush empty");
        nalar_stop_destroy(st);
    }
    {
        const char *stops[] = { "aab" };
        const char *pieces[] = { "a", "a", "a", "b", "zzz" };
        run_stop(stops, 1, pieces, 5, out, &at);
        ok(strcmp(out, "a") == 0 && at == 3, "'aab' found in 'aaab' (got '%s')",
           out);
    }
    {
        const char *stops[] = { "abc" };
        const char *pieces[] = { "ab", "d", "ab" };
        nalar_stop *st = nalar_stop_create(stops, 1);
        n = nalar_stop_feed(st, "ab", 2, &e, &stopped);
        ok(n == 0, "false start held");
        n = nalar_stop_feed(st, "d", 1, &e, &stopped);
        ok(n == 3 && memcmp(e, "abd", 3) == 0 && !stopped,
           "false start released when it diverges");
        nalar_stop_destroy(st);
        run_stop(stops, 1, pieces, 3, out, &at);
        ok(strcmp(out, "abdab") == 0 && at == -1,
           "held-back text flushed at the end");
    }
    {
        const char *stops[] = { "STOP" };
        const char *pieces[] = { "STOPxyz" };
        int len = run_stop(stops, 1, pieces, 1, out, &at);
        ok(len == 0 && at == 0, "stop at the very start emits nothing");
    }
    {
        const char *stops[] = { "\n\nUser:", "###" };
        const char *pieces[] = { "foo\n\nUs", "er wrote ", "#", "##bar" };
        run_stop(stops, 2, pieces, 4, out, &at);
        ok(strcmp(out, "foo\n\nUser wrote ") == 0 && at == 3,
           "multiple stops: near-miss of one, hit of the other");
    }
    {
        /* as if streamed byte by byte: "cd" completes before "abcdef" */
        const char *stops[] = { "abcdef", "cd" };
        const char *pieces[] = { "xabcdefg" };
        run_stop(stops, 2, pieces, 1, out, &at);
        ok(strcmp(out, "xab") == 0 && at == 0,
           "the first stop to complete wins, even inside one feed (got '%s')",
           out);
    }
    {
        const char *stops[] = { "b", "ab" };
        const char *pieces[] = { "xa", "b" };
        run_stop(stops, 2, pieces, 2, out, &at);
        ok(strcmp(out, "x") == 0 && at == 1,
           "stops completing on the same byte: the longer one cuts (got '%s')",
           out);
    }
    {
        const char *stops[] = { "\xc3\xa9!" };     /* "é!" */
        nalar_stop *st = nalar_stop_create(stops, 1);
        n = nalar_stop_feed(st, "caf\xc3\xa9", 5, &e, &stopped);
        ok(n == 3 && memcmp(e, "caf", 3) == 0, "UTF-8: held at 'é'");
        n = nalar_stop_feed(st, "s", 1, &e, &stopped);
        ok(n == 3 && memcmp(e, "\xc3\xa9s", 3) == 0, "UTF-8: released whole");
        nalar_stop_destroy(st);
    }
    {
        /* a feed much larger than the initial buffer */
        static char big[3000];
        const char *stops[] = { "END" };
        memset(big, 'x', sizeof(big) - 1);
        memcpy(big + 2000, "EN", 2);
        const char *pieces[] = { "EN", big, "EN", "D!" };
        int len = run_stop(stops, 1, pieces, 4, out, &at);
        ok(len == 2 + 2999 && at == 3 && memcmp(out + 2002, "ENxx", 4) == 0,
           "large feed grows the buffer (%d bytes)", len);
    }
}


/* random streams of 'a' and 'b' cut into random pieces, with random stops,
 * against a whole-text search */
static void
test_stop_random(void)
{
    nalar_rng r;
    int       good = 1;

    nalar_rng_seed(&r, 77);
    for (int iter = 0; iter < 3000 && good; iter++) {
        char        text[64], stopbuf[3][6], want[64], got[256];
        const char *stops[3];
        int         tl = 1 + (int) (nalar_rng_next(&r) % 40);
        int         ns = 1 + (int) (nalar_rng_next(&r) % 3);
        int         first = tl, first_end = tl + 1, wl, np = 0;
        int         stopped_any = 0;
        const char *pieces[64];
        char        piecebuf[64][64];
        size_t      got_len = 0;

        for (int i = 0; i < tl; i++) {
            text[i] = "ab"[nalar_rng_next(&r) % 2];
        }
        text[tl] = '\0';
        for (int k = 0; k < ns; k++) {
            int sl = 1 + (int) (nalar_rng_next(&r) % 5);
            for (int i = 0; i < sl; i++) {
                stopbuf[k][i] = "ab"[nalar_rng_next(&r) % 2];
            }
            stopbuf[k][sl] = '\0';
            stops[k] = stopbuf[k];
            /* byte-by-byte semantics: the earliest-ending occurrence
             * wins, ties to the earliest start */
            char *hit = strstr(text, stopbuf[k]);
            if (hit != NULL) {
                int st = (int) (hit - text), en = st + sl;
                if (en < first_end || (en == first_end && st < first)) {
                    first_end = en;
                    first = st;
                }
            }
        }
        wl = first;
        memcpy(want, text, (size_t) wl);
        want[wl] = '\0';

        for (int pos = 0; pos < tl; np++) {
            int pl = 1 + (int) (nalar_rng_next(&r) % 4);
            if (pl > tl - pos) {
                pl = tl - pos;
            }
            memcpy(piecebuf[np], text + pos, (size_t) pl);
            piecebuf[np][pl] = '\0';
            pieces[np] = piecebuf[np];
            pos += pl;
        }

        int at2;
        got_len = (size_t) run_stop(stops, ns, pieces, np, got, &at2);
        stopped_any = at2 >= 0;
        if (got_len != (size_t) wl || memcmp(got, want, (size_t) wl) != 0
            || stopped_any != (first < tl))
        {
            good = 0;
            diag("text '%s' stops '%s' '%s' '%s': got '%s' want '%s'",
                 text, stops[0], ns > 1 ? stops[1] : "",
                 ns > 2 ? stops[2] : "", got, want);
        }
    }
    ok(good, "3000 random streams match a whole-text search");
}


/* ---- logit_bias ---- */

static void
test_logit_bias(void)
{
    nalar_sampling p;
    nalar_sampler  s;
    float          l[8], base[8] = { 1, 3, 2, 0, 0.5f, 2.5f, -1, 0 };
    int            all = 1, none = 1;

    /* greedy: +10 on token 6 wins over the argmax (1); -100 on the argmax
     * leaves the runner-up (5) */
    nalar_sampling_default(&p);
    p.temperature = 0;
    p.n_bias = 1;
    p.bias_id[0] = 6;
    p.bias[0] = 10;
    nalar_sampler_init(&s, &p, 8);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 6, "greedy: +10 on token 6 picks it");
    nalar_sampler_free(&s);

    p.bias_id[0] = 1;
    p.bias[0] = -100;
    nalar_sampler_init(&s, &p, 8);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 5, "greedy: -100 on the argmax "
           "picks the runner-up");
    memcpy(l, base, sizeof(l));
    nalar_sampler_dist(&s, l);
    ok(s.probs[1] == 0.0f && s.probs[5] == 1.0f, "the greedy distribution "
       "moves with the bias");
    nalar_sampler_free(&s);

    /* sampled: +100 on token 3 takes all the mass; -100 on tokens 1, 2, 5
     * leaves them none */
    p.temperature = 1;
    p.bias_id[0] = 3;
    p.bias[0] = 100;
    nalar_sampler_init(&s, &p, 8);
    for (int i = 0; i < 200; i++) {
        memcpy(l, base, sizeof(l));
        all &= nalar_sample(&s, l, NULL) == 3;
    }
    ok(all, "sampled: +100 on token 3 is drawn 200 times of 200");
    nalar_sampler_free(&s);

    p.n_bias = 3;
    p.bias_id[0] = 1;
    p.bias_id[1] = 2;
    p.bias_id[2] = 5;
    p.bias[0] = p.bias[1] = p.bias[2] = -100;
    nalar_sampler_init(&s, &p, 8);
    for (int i = 0; i < 200; i++) {
        int32_t t;

        memcpy(l, base, sizeof(l));
        t = nalar_sample(&s, l, NULL);
        none &= t != 1 && t != 2 && t != 5;
    }
    ok(none, "sampled: tokens biased -100 are never drawn in 200");
    nalar_sampler_free(&s);

    /* out of range ids are ignored, not written */
    p.n_bias = 2;
    p.bias_id[0] = 8;
    p.bias_id[1] = -1;
    p.bias[0] = p.bias[1] = 100;
    p.temperature = 0;
    nalar_sampler_init(&s, &p, 8);
    memcpy(l, base, sizeof(l));
    is_int(nalar_sample(&s, l, NULL), 1, "ids outside the vocabulary are "
           "ignored");
    nalar_sampler_free(&s);
}


int
main(void)
{
    test_rng();
    test_greedy();
    test_seeds();
    test_topk1();
    test_distributions();
    test_penalties();
    test_logprobs();
    test_hostile();
    test_big_vocab();
    test_stop();
    test_stop_random();
    test_logit_bias();
    return done_testing();
}
