/*
 * The step budget's cost model (budget.h): a decayed least-squares line
 * through the recent steps' (tokens, seconds).
 */
#include <math.h>

#include "budget.h"

/* sizes spread enough to say what a token costs: a standard deviation of at
 * least this many tokens, and of this share of the mean size */
#define SPREAD_TOKENS 4.0
#define SPREAD_SHARE  0.05
/* one step counts as at most this many times the estimate */
#define CLIP          4.0


void
nalar_budget_init(nalar_budget *m)
{
    m->w = m->sn = m->snn = m->st = m->snt = 0;
    m->a = m->b = 0;
    m->shape_a = m->shape_b = 0;
    m->shaped = 0;
    m->n_obs = 0;
}


/* Refit a and b from the sums (w > 0). */
static void
refit(nalar_budget *m)
{
    double mn = m->sn / m->w, mt = m->st / m->w;
    double var = m->snn / m->w - mn * mn;
    double cov = m->snt / m->w - mn * mt;
    double s, b, a;

    if (var >= SPREAD_TOKENS * SPREAD_TOKENS
        && var >= SPREAD_SHARE * SPREAD_SHARE * mn * mn && cov > 0)
    {
        b = cov / var;
        a = mt - b * mn;
        if (a < 0) {
            /* the line through the mean with no fixed cost: a step never
             * costs less than nothing */
            a = 0;
            b = mt / mn;
        }
        m->a = a;
        m->b = b;
        m->shape_a = a;
        m->shape_b = b;
        m->shaped = 1;
        return;
    }
    if (!m->shaped) {
        /* nothing says how cost splits: all of it per token, which errs
         * toward smaller chunks for steps larger than those seen */
        m->a = 0;
        m->b = mn > 0 ? mt / mn : 0;
        return;
    }
    /* the sizes did not spread: the last shape, scaled to the mean */
    s = m->shape_a + m->shape_b * mn;
    s = s > 0 ? mt / s : 1;
    m->a = s * m->shape_a;
    m->b = s * m->shape_b;
}


void
nalar_budget_record(nalar_budget *m, int32_t n_tokens, double seconds)
{
    double n = n_tokens, est;

    if (n_tokens <= 0 || !(seconds > 0) || !isfinite(seconds)) {
        return;
    }
    if (m->n_obs > 0) {
        est = m->a + m->b * n;
        if (est > 0 && seconds > CLIP * est) {
            seconds = CLIP * est;
        }
    }
    m->w = NALAR_BUDGET_DECAY * m->w + 1;
    m->sn = NALAR_BUDGET_DECAY * m->sn + n;
    m->snn = NALAR_BUDGET_DECAY * m->snn + n * n;
    m->st = NALAR_BUDGET_DECAY * m->st + seconds;
    m->snt = NALAR_BUDGET_DECAY * m->snt + n * seconds;
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
nalar_budget_prefill(const nalar_budget *m, double target, int32_t n_fixed,
                     int32_t most)
{
    double fit;

    if (m->n_obs == 0) {
        return most > NALAR_BUDGET_MIN_CHUNK ? most : NALAR_BUDGET_MIN_CHUNK;
    }
    if (m->b > 0) {
        /* the largest n with a + b (n_fixed + n) <= target; the epsilon
         * keeps an exact fit (tests) from rounding a whole token away */
        fit = floor((target - m->a) / m->b + 1e-6) - n_fixed;
    } else {
        fit = m->a <= target ? most : 0;
    }
    if (fit > most) {
        fit = most;
    }
    return fit > NALAR_BUDGET_MIN_CHUNK ? (int32_t) fit
                                        : NALAR_BUDGET_MIN_CHUNK;
}
