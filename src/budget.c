/*
 * The step budget's cost model (budget.h): a weighted least-squares line
 * through the last steps' (tokens, seconds).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "budget.h"

/* the recent steps spread enough in size to say what a token costs: this
 * many tokens, and this share of their mean, between smallest and largest */
#define SPREAD_TOKENS 8
#define SPREAD_SHARE  0.10
/* a line is trusted when each recent step lies this close to it */
#define FIT_SHARE     0.25
/* one step counts as at most this many times the estimate */
#define CLIP          4.0


void
nalar_budget_init(nalar_budget *m)
{
    memset(m, 0, sizeof(*m));
}


/* Every one of the recent steps lies within FIT_SHARE of a + b n. */
static int
fits_recent(const nalar_budget *m, double a, double b)
{
    for (int k = 0; k < m->count && k < NALAR_BUDGET_RECENT; k++) {
        int i = (m->head - 1 - k + NALAR_BUDGET_STEPS) % NALAR_BUDGET_STEPS;

        if (fabs(a + b * m->n[i] - m->t[i]) > FIT_SHARE * m->t[i]) {
            return 0;
        }
    }
    return 1;
}


/* Refit a and b from the steps kept (count > 0). */
static void
refit(nalar_budget *m)
{
    double w = 0, sn = 0, snn = 0, st = 0, snt = 0, wi = 1;
    double rn = 0, rt = 0, mn, mt, var, cov, s, a, b;
    int    lo = INT32_MAX, hi = 0, nr = 0;

    for (int k = 0; k < m->count; k++, wi *= NALAR_BUDGET_DECAY) {
        int    i = (m->head - 1 - k + NALAR_BUDGET_STEPS) % NALAR_BUDGET_STEPS;
        double n = m->n[i], t = m->t[i];

        w += wi;
        sn += wi * n;
        snn += wi * n * n;
        st += wi * t;
        snt += wi * n * t;
        if (k < NALAR_BUDGET_RECENT) {
            rn += n;
            rt += t;
            nr++;
            lo = m->n[i] < lo ? m->n[i] : lo;
            hi = m->n[i] > hi ? m->n[i] : hi;
        }
    }
    mn = sn / w;
    mt = st / w;
    rn /= nr;
    rt /= nr;
    var = snn / w - mn * mn;
    cov = snt / w - mn * mt;

    if (hi - lo >= SPREAD_TOKENS && hi - lo >= SPREAD_SHARE * rn
        && var > 0 && cov > 0)
    {
        b = cov / var;
        a = mt - b * mn;
        if (a < 0) {
            /* the line through the mean with no fixed cost: a step never
             * costs less than nothing */
            a = 0;
            b = mt / mn;
        }
        if (fits_recent(m, a, b)) {
            m->a = a;
            m->b = b;
            m->shape_a = a;
            m->shape_b = b;
            m->shaped = 1;
            return;
        }
    }
    if (!m->shaped) {
        /* nothing says how cost splits: all of it per token, which errs
         * toward smaller chunks for steps larger than those seen */
        m->a = 0;
        m->b = mt / mn;
        return;
    }
    /* the last trusted shape, scaled to the recent steps */
    s = m->shape_a + m->shape_b * rn;
    s = s > 0 ? rt / s : 1;
    m->a = s * m->shape_a;
    m->b = s * m->shape_b;
}


void
nalar_budget_record(nalar_budget *m, int32_t n_tokens, double seconds)
{
    double est;

    if (n_tokens <= 0 || !(seconds > 0) || !isfinite(seconds)) {
        return;
    }
    if (m->n_obs > 0) {
        est = m->a + m->b * n_tokens;
        if (est > 0 && seconds > CLIP * est) {
            seconds = CLIP * est;
        }
    }
    m->n[m->head] = n_tokens;
    m->t[m->head] = seconds;
    m->head = (m->head + 1) % NALAR_BUDGET_STEPS;
    m->count += m->count < NALAR_BUDGET_STEPS;
    m->n_obs++;
    refit(m);
}


double
nalar_budget_estimate(const nalar_budget *m, int32_t n_tokens)
{
    if (m->n_obs == 0) {
        return -1;
    }
    return m->a + m->b * (double) n_tokens;
}


int32_t
nalar_budget_fit(const nalar_budget *m, double target)
{
    double fit;

    if (m->n_obs == 0) {
        return -1;
    }
    if (!(m->b > 0)) {
        return m->a <= target ? INT32_MAX : 0;
    }
    /* the largest n with a + b n <= target; the epsilon keeps an exact
     * fit (tests) from rounding a whole token away */
    fit = floor((target - m->a) / m->b + 1e-6);
    return fit <= 0 ? 0 : fit >= INT32_MAX ? INT32_MAX : (int32_t) fit;
}


int32_t
nalar_budget_prefill(const nalar_budget *m, double target, int32_t n_fixed,
                     int32_t most)
{
    int64_t fit = nalar_budget_fit(m, target);

    if (fit < 0) {
        return most > NALAR_BUDGET_MIN_CHUNK ? most : NALAR_BUDGET_MIN_CHUNK;
    }
    fit -= n_fixed;
    if (fit > most) {
        fit = most;
    }
    return fit > NALAR_BUDGET_MIN_CHUNK ? (int32_t) fit
                                        : NALAR_BUDGET_MIN_CHUNK;
}
