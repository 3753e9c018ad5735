/*
 * Speculative decoding's cost model and step gate, on made-up
 * measurements: what each decides follows from the numbers it was given
 * (the choice of k, the acceptance estimates, the pass-cost table, the
 * step gate and its explorations, the probes' budget).  No engine runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "tap.h"


/* The neighbouring k now and then: one step in NALAR_SPEC_NEIGHBOUR, one
 * more and one fewer in turn, never outside 1 .. k_max. */
static void
test_neighbour_k(void)
{
    int N = NALAR_SPEC_NEIGHBOUR, n_k[NALAR_SPEC_MAX_K + 2] = { 0 };

    for (unsigned n = 1; n <= 4 * (unsigned) N; n++) {
        n_k[nalar_spec_neighbour_k(3, 8, n)]++;
    }
    ok(n_k[3] == 4 * N - 4 && n_k[4] == 2 && n_k[2] == 2,
       "k = 3: %d steps at 3, %d at 4, %d at 2 of %d", n_k[3], n_k[4],
       n_k[2], 4 * N);
    is_int(nalar_spec_neighbour_k(3, 8, N), 4, "first the larger");
    is_int(nalar_spec_neighbour_k(3, 8, 2 * N), 2, "then the smaller");
    is_int(nalar_spec_neighbour_k(3, 8, N + 1), 3, "otherwise k itself");
    is_int(nalar_spec_neighbour_k(1, 8, 2 * N), 1, "never below 1");
    is_int(nalar_spec_neighbour_k(8, 8, N), 8, "never above k_max");
    is_int(nalar_spec_neighbour_k(8, 8, 2 * N), 7,
           "k_max's smaller neighbour");
}


/*
 * An exploring burst ends when its speculative steps are recorded, not
 * when the gate has let that many steps speculate: the requests of a
 * step the gate allows may all choose k = 0 (their cost model says no),
 * and such a step is a plain one.  On the demo draft, a burst spent
 * on plain steps left the forgotten rate to the next speculative step
 * alone, a probe confirming one token in 3x the time, read as 0.45x; the
 * loss it showed held speculation off for the next 966 steps.
 */
/*
 * A fresh gate where one sequence's plain and speculative steps both
 * confirm 4 tokens a millisecond (no gain), run until the gate next
 * explores speculation; its first step, plain, recorded.  Returns the
 * plain steps waited (2000: it never explored).
 */
static int
gate_to_exploration(nalar_spec_gate *g, unsigned d)
{
    int i;

    memset(g, 0, sizeof(*g));
    for (i = 0; i < 200; i++) {
        int s = nalar_spec_gate_allow(g, 1, d);

        nalar_spec_gate_record(g, 1, s ? d : 0, 4.0, 1e-3);
    }
    for (i = 0; i < 2000 && !nalar_spec_gate_allow(g, 1, d); i++) {
        nalar_spec_gate_record(g, 1, 0, 4.0, 1e-3);
    }
    nalar_spec_gate_record(g, 1, 0, 4.0, 1e-3);
    return i;
}


static void
test_gate_burst(void)
{
    unsigned          d = nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7);
    nalar_spec_gate  *g = calloc(1, sizeof(*g));
    int               allowed = 0, i;

    /* plain measured at 4 tokens a step, speculation at 4 (no gain) */
    i = gate_to_exploration(g, d);
    ok(nalar_spec_gate_ratio(g, 1, d) < 1.03,
       "burst: speculation measured without gain");
    ok(i < 2000, "burst: an exploration starts (after %d plain steps)", i);
    /* its first 20 steps stay plain (k = 0 chosen): still exploring */
    for (i = 0; i < 20; i++) {
        allowed += nalar_spec_gate_allow(g, 1, d);
        nalar_spec_gate_record(g, 1, 0, 4.0, 1e-3);
    }
    is_int(allowed, 20, "burst: plain steps do not use it up");
    /* one slow speculative step (1 token in 3 ms) does not make the
     * reading; the seven after it, at 1.5x, do */
    nalar_spec_gate_record(g, 1, d, 1.0, 3e-3);
    allowed = 0;
    for (i = 0; i < 7; i++) {
        allowed += nalar_spec_gate_allow(g, 1, d);
        nalar_spec_gate_record(g, 1, d, 6.0, 1e-3);
    }
    is_int(allowed, 7, "burst: it goes on until 8 speculative steps");
    allowed = 0;
    for (i = 0; i < 100; i++) {
        int s = nalar_spec_gate_allow(g, 1, d);

        allowed += s;
        nalar_spec_gate_record(g, 1, s ? d : 0, s ? 6.0 : 4.0, 1e-3);
    }
    ok(allowed >= 90, "burst: its 1.5x reading opens the gate (%d of the "
       "next 100 steps speculated, ratio %.2f)", allowed,
       nalar_spec_gate_ratio(g, 1, d));

    /* a burst whose steps all stay plain ends after 32 of them, and the
     * reading before it stands */
    gate_to_exploration(g, d);
    {
        double before = nalar_spec_gate_ratio(g, 1, d);

        allowed = 0;
        for (i = 0; i < 40; i++) {
            allowed += nalar_spec_gate_allow(g, 1, d);
            nalar_spec_gate_record(g, 1, 0, 4.0, 1e-3);
        }
        is_int(allowed, 32, "burst: with no speculative step it ends after "
               "32 steps");
        /* at its full weight (the 8 or more steps it rests on): one slow
         * step moves it, but not to what that step alone reads (0.17) */
        nalar_spec_gate_record(g, 1, d, 1.0, 3e-3);
        ok(fabs(nalar_spec_gate_ratio(g, 1, d) - before) < 0.3,
           "burst: and the reading before it stands (%.3f, %.3f after "
           "one slow step)", before, nalar_spec_gate_ratio(g, 1, d));
    }
    free(g);
}


/* Probes share one budget: 1% of the steps' time.  At 16 sequences, a
 * probe step of 800 us over a plain one of 300 us (excess 500 us) may come
 * once in 50 ms of steps; each request's own one-in-16 rule alone had
 * nearly every step carry a probe. */
static void
test_probe_pace(void)
{
    nalar_probe_pace p = { 0 };
    int              steps = 0, probes = 0;

    ok(nalar_probe_allow(&p), "probe pace: a fresh engine may probe");
    nalar_probe_record(&p, 800e-6, 500e-6, NALAR_PROBE_SHARE);
    ok(!nalar_probe_allow(&p), "probe pace: not right after a probe");
    while (!nalar_probe_allow(&p) && steps < 100000) {
        nalar_probe_record(&p, 300e-6, 0, NALAR_PROBE_SHARE);
        steps++;
    }
    ok(steps >= 160 && steps <= 170,
       "probe pace: the next after 100x its excess of steps (%d steps of "
       "300 us after 500 us)", steps);
    /* credit is not saved up: after a long run without probes, one probe
     * again waits its full span */
    for (int i = 0; i < 10000; i++) {
        nalar_probe_record(&p, 300e-6, 0, NALAR_PROBE_SHARE);
    }
    nalar_probe_record(&p, 800e-6, 500e-6, NALAR_PROBE_SHARE);
    ok(!nalar_probe_allow(&p), "probe pace: idle time buys no burst");
    /* a steady state: probing whenever allowed costs ~1% */
    {
        double spent = 0, total = 0;

        p.credit = 0;
        for (int i = 0; i < 100000; i++) {
            int probe = nalar_probe_allow(&p);

            probes += probe;
            spent += probe ? 500e-6 : 0;
            total += probe ? 800e-6 : 300e-6;
            nalar_probe_record(&p, probe ? 800e-6 : 300e-6,
                               probe ? 500e-6 : 0, NALAR_PROBE_SHARE);
        }
        ok(spent / total > 0.009 && spent / total < 0.011,
           "probe pace: probes cost %.2f%% of the time (%d probes)",
           100 * spent / total, probes);
    }
}


/* The best measured ratio at a batch size, over every mix: what decides
 * the probe share (above). */
static void
test_gate_best(void)
{
    static nalar_spec_gate g;
    unsigned pred_hi = nalar_spec_gate_bit(NALAR_PROP_PREDICTION, 0.9);
    unsigned pred_lo = nalar_spec_gate_bit(NALAR_PROP_PREDICTION, 0.1);

    memset(&g, 0, sizeof(g));
    ok(nalar_spec_gate_best(&g, 1) < 0, "gate best: nothing measured");
    for (int i = 0; i < 8; i++) {
        nalar_spec_gate_record(&g, 1, 0, 1, 100e-6);
        nalar_spec_gate_record(&g, 1, pred_hi, 5, 200e-6);
        nalar_spec_gate_record(&g, 1, pred_lo, 1, 120e-6);
    }
    ok(fabs(nalar_spec_gate_best(&g, 1) - 2.5) < 1e-9,
       "gate best: the winning mix's 2.5x, not the losing one's (%.3f)",
       nalar_spec_gate_best(&g, 1));
    ok(nalar_spec_gate_ratio(&g, 1, pred_lo) < 1,
       "gate best: the losing mix measured apart");
    ok(nalar_spec_gate_best(&g, 4) < 0,
       "gate best: another batch size knows nothing of it");
}


/* The cost model's choice of k from acceptance and pass costs */
static void
test_choose_k(void)
{
    nalar_accept_stats a;
    double             verify[NALAR_SPEC_MAX_K + 1], gain;
    int                k;

    /* verification free (memory-bound target), acceptance 0.8 at every
     * position: the longest proposal wins */
    nalar_accept_init(&a, 0.8);
    for (k = 0; k <= NALAR_SPEC_MAX_K; k++) {
        verify[k] = 1e-3;
    }
    k = nalar_spec_choose_k(&a, 4, verify, 0, 1.03, &gain);
    is_int(k, 4, "free verification, acceptance 0.8: k = k_max");
    ok(gain > 2.5, "and the modelled gain is the expected length (%.2f)",
       gain);
    /* verification linear in tokens (compute-bound): nothing pays */
    for (k = 0; k <= NALAR_SPEC_MAX_K; k++) {
        verify[k] = 1e-3 * (k + 1);
    }
    k = nalar_spec_choose_k(&a, 4, verify, 0, 1.03, &gain);
    is_int(k, 0, "verification linear in tokens: k = 0");
    /* free verification but a draft costing a plain pass per token */
    for (k = 0; k <= NALAR_SPEC_MAX_K; k++) {
        verify[k] = 1e-3;
    }
    k = nalar_spec_choose_k(&a, 4, verify, 1e-3, 1.03, &gain);
    is_int(k, 0, "a draft as dear as the target: k = 0");
    /* acceptance falls to 0.1 after observed rejections: k = 0 */
    for (int i = 0; i < 200; i++) {
        nalar_accept_update(&a, 4, 0);
    }
    k = nalar_spec_choose_k(&a, 4, verify, 0.2e-3, 1.03, &gain);
    is_int(k, 0, "every proposal rejected: k = 0");
}


/* A request's acceptance estimates blended with its proposer's */
static void
test_accept_blend(void)
{
    /* a request's estimates pulled toward its proposer's: three
     * rejections of a fresh request move it 3/7 of the way; a long-lived
     * request's own (at most 12 remembered) outweighs the prior 3:1 */
    {
        nalar_accept_stats own, prior, out;

        nalar_accept_init(&prior, 0.8);
        nalar_accept_init(&own, 0.8);
        for (int i = 0; i < 3; i++) {
            nalar_accept_update(&own, 1, 0);
        }
        nalar_accept_blend(&out, &own, &prior, 4);
        ok(fabs(out.alpha[0] - (3 * own.alpha[0] + 4 * 0.8) / 7) < 1e-12
           && out.alpha[1] == 0.8,
           "blend: 3 own observations against a prior worth 4 (%.3f, own "
           "%.3f)", out.alpha[0], own.alpha[0]);
        for (int i = 0; i < 100; i++) {
            nalar_accept_update(&own, 1, 0);
        }
        nalar_accept_blend(&out, &own, &prior, 4);
        ok(fabs(out.alpha[0] - (12 * own.alpha[0] + 4 * 0.8) / 16) < 1e-12,
           "blend: own observations count up to 12 (%.3f)", out.alpha[0]);
    }

    /* a position that steps stopped proposing: its low estimate ages, and
     * the blend then stands at what all positions measure (pooled) */
    {
        nalar_accept_stats own, prior, out;

        nalar_accept_init(&prior, 0.7);
        nalar_accept_init(&own, 0.7);
        for (int i = 0; i < 20; i++) {          /* 2 proposed, 1 accepted */
            nalar_accept_update(&own, 2, 1);
            nalar_accept_update(&prior, 2, 1);
        }
        nalar_accept_blend(&out, &own, &prior, 4);
        ok(out.alpha[1] < 0.2 && own.seen[1] == 20,
           "the second position learnt low while proposed (%.3f)",
           out.alpha[1]);
        for (int i = 0; i < 30; i++) {          /* then only 1 proposed */
            nalar_accept_update(&own, 1, 1);
            nalar_accept_update(&prior, 1, 1);
        }
        nalar_accept_blend(&out, &own, &prior, 4);
        ok(own.seen[1] == 0 && own.alpha[1] < 0.2,
           "unproposed for 30 steps: its count aged to %d, its own estimate "
           "unchanged (%.3f)", own.seen[1], own.alpha[1]);
        ok(fabs(out.alpha[1] - prior.pooled) < 1e-12 && out.alpha[1] > 0.6,
           "the blend stands at the pooled estimate (%.3f)", out.alpha[1]);
        ok(out.alpha[0] > 0.9, "the first position keeps its own (%.3f)",
           out.alpha[0]);
    }
}


/* The table of measured pass costs and its estimates */
static void
test_cost_table(void)
{
    /* pass costs: a size measured once, slowly, costs no more than a
     * larger size measured since */
    {
        nalar_cost_table c;

        memset(&c, 0, sizeof(c));
        for (int i = 0; i < 20; i++) {
            nalar_cost_record(&c, 1, 70e-6);
            nalar_cost_record(&c, 4, 110e-6);
        }
        nalar_cost_record(&c, 2, 200e-6);
        ok(fabs(nalar_cost_estimate(&c, 1) - 70e-6) < 1e-9
           && fabs(nalar_cost_estimate(&c, 4) - 110e-6) < 1e-9,
           "cost: measured sizes as measured");
        ok(nalar_cost_estimate(&c, 2) <= 110e-6 + 1e-12
           && nalar_cost_estimate(&c, 3) <= 110e-6 + 1e-12,
           "cost: a 2-token pass seen once at 200 us is held to the 4-token "
           "pass's 110 (2: %.0f us, 3: %.0f us)",
           nalar_cost_estimate(&c, 2) * 1e6,
           nalar_cost_estimate(&c, 3) * 1e6);
        ok(nalar_cost_estimate(&c, 3) >= nalar_cost_estimate(&c, 2),
           "cost: and stays monotone");
        ok(fabs(nalar_cost_estimate(&c, 8) - 220e-6) < 1e-9,
           "cost: beyond the largest measured, linear in tokens");
    }
    /* a size measured once, slowly, with nothing larger measured: held to
     * as many one-token passes (a draft's 4-sequence pass at 96 us once,
     * 8 us a token, had kept auto from drafting at batch 4) */
    {
        nalar_cost_table c;

        memset(&c, 0, sizeof(c));
        for (int i = 0; i < 20; i++) {
            nalar_cost_record(&c, 1, 8e-6);
            nalar_cost_record(&c, 2, 10e-6);
        }
        nalar_cost_record(&c, 4, 96e-6);
        ok(fabs(nalar_cost_estimate(&c, 4) - 32e-6) < 1e-9,
           "cost: a 4-token pass seen once at 96 us counts as 4 one-token "
           "passes, 32 us (%.0f us)", nalar_cost_estimate(&c, 4) * 1e6);
        ok(fabs(nalar_cost_estimate(&c, 2) - 10e-6) < 1e-9,
           "cost: sizes measured below that bound stay as measured");
    }
}


/* The step gate: plain and speculative steps measured against each
 * other, per batch size and proposer mix */
static void
test_gate(void)
{
    nalar_spec_gate *g = calloc(1, sizeof(*g));
    int              allowed;

    if (g == NULL) {
        ok(0, "gate: calloc");
        return;
    }
    /* unknown rates: plain first (8 steps), then speculation (8) */
    allowed = 0;
    for (int i = 0; i < 40; i++) {
        int s = nalar_spec_gate_allow(g, 4, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7));

        if (i < 8) {
            allowed += s;
        } else if (i == 8) {
            is_int(allowed, 0, "unknown rates: the first 8 steps plain");
            allowed = 0;
        }
        allowed += i >= 8 && s;
        nalar_spec_gate_record(g, 4, s ? nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7) : 0,
                               s ? 3.0 : 4.0, 1e-3);   /* spec 0.75x */
    }
    /* 8 steps measure it, then one burst of 8 after a gap of 16 */
    ok(allowed >= 8 && allowed <= 16, "then speculation measured and found "
       "slower (%d of the next 32 speculated)", allowed);
    ok(nalar_spec_gate_ratio(g, 4, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7)) < 0.8,
       "measured ratio 0.75 (%.2f)",
       nalar_spec_gate_ratio(g, 4, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7)));
    /* slower with speculation: off but for rare explorations */
    allowed = 0;
    for (int i = 0; i < 2000; i++) {
        int s = nalar_spec_gate_allow(g, 4, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7));

        allowed += s;
        nalar_spec_gate_record(g, 4, s ? nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7) : 0,
                               s ? 3.0 : 4.0, 1e-3);
    }
    /* bursts of 4 after gaps of 16, 32, ... 1024: about 6 bursts */
    ok(allowed > 0 && allowed <= 40, "slower: %d of 2000 steps explored "
       "speculation (< 2%%)", allowed);
    /* a larger batch is judged by this loss (verification only gets
     * dearer), a smaller one and other mixes are not */
    for (int i = 0; i < 8; i++) {
        nalar_spec_gate_record(g, 16, 0, 16.0, 1e-3);
        nalar_spec_gate_record(g, 2, 0, 2.0, 1e-3);
    }
    allowed = 0;
    for (int i = 0; i < 200; i++) {
        allowed += nalar_spec_gate_allow(g, 16, nalar_spec_gate_bit(
                                                    NALAR_PROP_DRAFT, 0.7));
    }
    is_int(allowed, 0, "a larger batch does not explore what loses at a "
           "smaller one");
    is_int(nalar_spec_gate_allow(g, 2, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7)), 1,
           "a smaller batch size is not judged by this one");
    is_int(nalar_spec_gate_allow(g, 4, nalar_spec_gate_bit(NALAR_PROP_PREDICTION, 0.9)), 1,
           "another proposer is not judged by this one");
    /* the same proposer with a low acceptance estimate (a client's poor
     * prediction) is its own class: closing it leaves the good ones be */
    for (int i = 0; i < 200; i++) {
        unsigned lo = nalar_spec_gate_bit(NALAR_PROP_PREDICTION, 0.2);
        int      s = nalar_spec_gate_allow(g, 4, lo);

        nalar_spec_gate_record(g, 4, s ? lo : 0, s ? 2.0 : 4.0, 1e-3);
    }
    ok(nalar_spec_gate_ratio(g, 4, nalar_spec_gate_bit(NALAR_PROP_PREDICTION,
                                                       0.2)) < 0.6,
       "poor predictions measured slower");
    is_int(nalar_spec_gate_allow(g, 4, nalar_spec_gate_bit(NALAR_PROP_PREDICTION,
                                                          0.9)), 1,
           "good predictions still speculate");
    /* the text changes: speculation now wins 1.5x; explorations notice it
     * and the gate opens within a few of them */
    allowed = 0;
    for (int i = 0; i < 4000; i++) {
        int s = nalar_spec_gate_allow(g, 4, nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7));

        if (i >= 3000) {
            allowed += s;
        }
        nalar_spec_gate_record(g, 4, s ? nalar_spec_gate_bit(NALAR_PROP_DRAFT, 0.7) : 0,
                               s ? 6.0 : 4.0, 1e-3);
    }
    ok(allowed >= 900, "faster: %d of the last 1000 steps speculated",
       allowed);
    /* one plain step in 16 would cost 2.1% of throughput at 1.5x; the gap
     * keeps it under 1%: one in 33 */
    ok(allowed >= 1000 - 1000 / 33 - 2,
       "plain steps while winning 1.5x: %d of 1000 (one in 33, not 16)",
       1000 - allowed);
    ok(allowed < 1000, "and plain steps still keep the plain rate current");
    /* and the larger batch, no longer vetoed, measures for itself */
    is_int(nalar_spec_gate_allow(g, 16, nalar_spec_gate_bit(NALAR_PROP_DRAFT,
                                                           0.7)), 1,
           "a win at the smaller batch lifts the larger one's veto");
    free(g);
}


int
main(void)
{
    test_choose_k();
    test_accept_blend();
    test_cost_table();
    test_gate();
    test_gate_burst();
    test_neighbour_k();
    test_probe_pace();
    test_gate_best();
    return done_testing();
}
