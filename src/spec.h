/*
 * Speculative decoding: proposers that need no model (n-gram prompt lookup,
 * the client's predicted output) and the cost model that decides how many
 * tokens to propose.  Verification itself lives in the engine, which owns
 * the target's logits and the KV rollback.
 *
 * Proposing is not confirming: nothing here touches the output.
 */
#ifndef NALAR_SPEC_H
#define NALAR_SPEC_H

#include <stdint.h>

#define NALAR_SPEC_MAX_K 8

typedef enum {
    NALAR_SPEC_DEFAULT = 0,   /* request: use the engine's setting */
    NALAR_SPEC_OFF,
    NALAR_SPEC_DRAFT,
    NALAR_SPEC_NGRAM,
    NALAR_SPEC_AUTO           /* draft when the model has one, else n-gram */
} nalar_spec_mode;

typedef enum {
    NALAR_PROP_NONE = 0,
    NALAR_PROP_DRAFT,
    NALAR_PROP_NGRAM,
    NALAR_PROP_PREDICTION,
    NALAR_PROP_COUNT
} nalar_proposer;

/*
 * Prompt lookup: find the latest occurrence in corpus[0, n_corpus) of the
 * last n tokens of key[0, n_key) (n from n_max down to n_min) that is
 * followed by at least one token, and copy up to k following tokens to
 * out.  An occurrence may not be the key itself (when key is a suffix of
 * corpus).  Returns the number of tokens proposed (0 if no match).
 */
int nalar_ngram_propose(const int32_t *corpus, int32_t n_corpus,
                        const int32_t *key, int32_t n_key, int n_min,
                        int n_max, int k, int32_t *out);

/* Forward-pass time by batch size: one point per size for 1..32 tokens,
 * then four steps per doubling up to 2048; each point a moving estimate of measured
 * seconds that falls fast (cold starts and noise only ever add time) and
 * rises slowly.  An estimate is never above a larger size's measured cost,
 * nor above n one-token passes: a size seldom run may hold one slow pass
 * for long (a draft's 4-sequence pass measured once at 96 us, against
 * 8 us for one token, kept auto from drafting at batch 4 for good). */
#define NALAR_COST_POINTS 56
typedef struct {
    double t[NALAR_COST_POINTS];
    int    n[NALAR_COST_POINTS];   /* observations */
} nalar_cost_table;

void   nalar_cost_record(nalar_cost_table *c, int n_tokens, double seconds);
/* Estimated seconds for a pass of n_tokens; < 0 when nothing is known. */
double nalar_cost_estimate(const nalar_cost_table *c, int n_tokens);

/* Acceptance by position: alpha[i] estimates P(proposal i+1 accepted |
 * proposals 1..i accepted), from seen[i] observations (counted down again
 * on steps that did not propose that far: an estimate ages while it goes
 * unobserved); pooled, every observation of every position. */
typedef struct {
    double alpha[NALAR_SPEC_MAX_K];
    int    seen[NALAR_SPEC_MAX_K];
    double pooled;
    int    pooled_seen;
} nalar_accept_stats;

void nalar_accept_init(nalar_accept_stats *a, double prior);
/* out = own's estimates pulled toward prior's (a proposer's over all
 * requests), the prior worth `weight` observations against own's (at most
 * the ~12 its moving average remembers).  One request's few, noisy
 * observations neither stand alone nor stay wrong for good: an estimate
 * that a run of rejections took low (so that the request stopped
 * proposing and observing) recovers as the proposer's does.  The prior's
 * own estimate of a position is in turn pulled toward its pooled one,
 * worth NALAR_ACCEPT_POOLED observations, so that a position no step has
 * proposed lately (its count aged away) stands at what all positions
 * measure: a low estimate that had k stop short of it cannot hold k
 * there for good (e.g. the demo draft at k = 1 in 40% of its steps, the
 * second position estimated at 0.43-0.51 while fixed k = 2 measured it at
 * 0.87). */
#define NALAR_ACCEPT_POOLED 2
void nalar_accept_blend(nalar_accept_stats *out,
                        const nalar_accept_stats *own,
                        const nalar_accept_stats *prior, int weight);
/* After a verification: `proposed` tokens were offered, the first
 * `accepted` of them confirmed. */
void nalar_accept_update(nalar_accept_stats *a, int proposed, int accepted);
/* Expected confirmed tokens per step with k proposals (>= 1). */
double nalar_accept_expected(const nalar_accept_stats *a, int k);

/*
 * Choose k in [0, k_max] maximising expected confirmed tokens per second:
 *   E(k) / (verify(k) + k * draft_tok)
 * where verify[k] is this request's share of a pass with k proposals each
 * (verify[0] = plain decode).  Speculates only when the best k beats plain
 * decoding by `margin` (e.g. 1.03).  Returns k; *gain = ratio to plain.
 */
int nalar_spec_choose_k(const nalar_accept_stats *a, int k_max,
                        const double *verify, double draft_tok,
                        double margin, double *gain);

/*
 * The k to run on a request's n-th speculative step (n from 1) when
 * choose_k said k (1 <= k <= k_max): k, but on every NALAR_SPEC_NEIGHBOUR-th
 * step a neighbour, alternately k + 1 and k - 1 (where within 1 .. k_max),
 * so the pass sizes next to the chosen one stay measured.  A size never run
 * keeps the cost estimate it had, and one slow pass can hold it above a
 * larger size's for good (e.g. the demo draft's k = 4, the fastest fixed
 * k, was never chosen because its 5-token pass was estimated as dear as a
 * 6-token one).
 */
#define NALAR_SPEC_NEIGHBOUR 16
int nalar_spec_neighbour_k(int k, int k_max, unsigned n);

/*
 * Probe pacing.  A request whose cost model keeps choosing k = 0 probes
 * now and then (a short or a full proposal) so that acceptance and the
 * cost of larger passes stay measured; but a probe costs its step real
 * time -- a draft first catches up on every token it missed, then runs k
 * passes -- and each request probing one step in 16 made nearly every
 * step at 16 sequences a probe's: 9-12% of a run, 0.846x of plain
 * decoding.  So probes share one budget per engine: every step adds a
 * share of its seconds, a probe step takes what it cost over the same
 * step without the probe, and a probe waits while the budget is below
 * zero (it never saves up beyond zero).  The share is
 * NALAR_PROBE_SHARE_WIN (one request at batch 1: about the old one probe
 * in 16 steps) where the step gate measures speculation winning at the
 * step's batch size with some mix of proposers (not necessarily this
 * step's: a client's prediction that stopped matching has a mix of its
 * own, and is what probes are for), since a request at k = 0 there is
 * missing that win and a probe is how it finds its way back (the demo
 * draft at batch 1 lost 5% on 1%); else NALAR_PROBE_SHARE, as probes
 * there mostly confirm what the gate knows.
 */
#define NALAR_PROBE_SHARE     0.01
#define NALAR_PROBE_SHARE_WIN 0.10
typedef struct {
    double credit;          /* seconds, <= 0 */
} nalar_probe_pace;

/* 1: a request may probe this step. */
int  nalar_probe_allow(const nalar_probe_pace *p);
/* A finished step of `seconds`, `excess` of them a probe's (0: none), and
 * `share` of them (NALAR_PROBE_SHARE or _WIN) added to the budget. */
void nalar_probe_record(nalar_probe_pace *p, double seconds, double excess,
                        double share);

/*
 * The step gate: the last word on whether a decode step speculates at all,
 * from measured whole steps rather than modelled parts.  The per-request
 * cost model (above) estimates draft and verify time from forward passes
 * alone; what it misses (per-pass fixed costs of the draft, sampling k+1
 * rows, rollback, a machine busy with other work) shows up here, in the
 * confirmed tokens per second of complete engine steps.
 *
 * For each decode batch size (exact up to 16 sequences, then by doubling)
 * the gate keeps decayed sums of confirmed tokens and seconds for steps
 * without proposals (plain) and, per mix of proposers (a bitmask of
 * proposer and acceptance class: nalar_spec_gate_bit), steps with them.
 * The plain rate is measured first (8 steps), then speculation (8 steps).
 * A step may speculate while its rate beats the plain rate by 3%;
 * otherwise speculation is off but for a burst of exploring steps every
 * `gap` steps (16, doubling on every exploration that confirms the loss up
 * to 1024, and at least long enough that a burst costs under 1% of plain
 * throughput at the measured loss, up to 8192).  A burst is measured
 * apart and, once 8 speculative steps are in, replaces the old estimate
 * but for about a step's weight, so a change of load or of text is
 * noticed; a step it allowed whose requests all chose k = 0 is a plain
 * one and does not count, and a burst that gets no 8 speculative steps
 * within 32 ends with the old estimate standing.
 * Symmetrically, while speculation wins, one step in `gap` runs plain to
 * keep the plain rate current (16, or as many as keep those plain steps'
 * cost under 1% at the measured win, up to 1024).  A loss measured at a
 * smaller batch size vetoes speculation at larger ones (verification only
 * gets dearer as the batch grows) until the smaller one measures a win.
 * Only steps without prompt tokens are recorded.
 */
#define NALAR_GATE_CELLS 24
#define NALAR_GATE_MARGIN 1.03  /* speculate when measured this much
                                   faster: noise alone rarely gets there */
#define NALAR_GATE_MIXES 256

typedef struct {
    double tok, sec, w;     /* decayed sums of tokens, seconds and steps;
                               rate = tok / sec */
    int    n;               /* steps recorded */
} nalar_rate;

typedef struct {
    nalar_rate plain[NALAR_GATE_CELLS];
    nalar_rate spec[NALAR_GATE_CELLS][NALAR_GATE_MIXES];
    int        gap[NALAR_GATE_CELLS][NALAR_GATE_MIXES];    /* 0: 16 */
    int        since[NALAR_GATE_CELLS][NALAR_GATE_MIXES];  /* steps since
                                                             the last
                                                             exploration */
    int        burst[NALAR_GATE_CELLS][NALAR_GATE_MIXES];  /* exploring
                                                             steps still
                                                             to record */
    int        burst_age[NALAR_GATE_CELLS][NALAR_GATE_MIXES]; /* steps
                                                             it allowed */
    nalar_rate fresh[NALAR_GATE_CELLS][NALAR_GATE_MIXES];  /* its steps */
} nalar_spec_gate;

/* A request's bit in a step's mix: its proposer and, for a client's own
 * prediction, whether the request's acceptance estimate of the first
 * proposal is high (>= 0.6), so that one client's poor predictions do not
 * keep another's good ones from speculating.  (A draft's or the n-gram
 * lookup's acceptance is a property of the model and the text, hovers
 * around any threshold and would only split what the gate learns.) */
static inline unsigned
nalar_spec_gate_bit(int proposer, double alpha0)
{
    return 1u << (proposer * 2
                  + (proposer == NALAR_PROP_PREDICTION && alpha0 >= 0.6));
}

/* 1: a step of n_decode sequences whose requests' bits are `mix` may
 * speculate; 0: it runs plain. */
int  nalar_spec_gate_allow(nalar_spec_gate *g, int n_decode, unsigned mix);
/* A finished decode step: `mix` = proposers that proposed (0 = a plain
 * step), `tokens` confirmed in `seconds`. */
void nalar_spec_gate_record(nalar_spec_gate *g, int n_decode, unsigned mix,
                            double tokens, double seconds);
/* Measured rate with `mix` over the plain rate (< 0 when unknown). */
double nalar_spec_gate_ratio(const nalar_spec_gate *g, int n_decode,
                             unsigned mix);
/* The best of those over every mix measured at n_decode's batch size. */
double nalar_spec_gate_best(const nalar_spec_gate *g, int n_decode);

#endif
