/*
 * The step budget sized to an inter-token latency target: what one engine
 * step costs as a function of its batch's tokens, learned from the steps
 * themselves, and how many prompt tokens a step may add to its decodes so
 * that it still fits the target (stall-free batching, as Sarathi-Serve).
 *
 * Model: a step of n batch tokens costs
 *
 *     t(n) = a + b n          a: seconds per step, b: seconds per token
 *
 * fitted by least squares over the last NALAR_BUDGET_STEPS steps, each
 * weighted NALAR_BUDGET_DECAY^age.  The line is trusted when the last
 * NALAR_BUDGET_RECENT steps spread in size (8 tokens, and 10% of their
 * mean, between the smallest and the largest) and each of them lies near
 * it (within 25%).  Otherwise -- steady decoding, whose sizes barely differ,
 * says nothing of b; and a line through steps from before and after the
 * machine slowed fits neither -- the fit keeps the shape (a : b) of the
 * last trusted line and scales it to the last few steps' mean time:
 * contention slows every part of a pass alike, so a machine that slows
 * while only decodes run is noticed before the next prompt arrives.  A
 * batch that changes (more decodes, longer prompts) moves the mean and,
 * once the sizes spread, the slope.  One step slower than 4x the model's
 * estimate counts as 4x (a page fault or a descheduled thread must not
 * shrink chunks for many steps); a machine that stays slower gets there
 * within a few steps all the same.
 *
 * The engine keeps one model per engine, so each backend (CPU, GPU) has its
 * own measured costs.  Pure arithmetic: no clock, no threads.
 */
#ifndef NALAR_BUDGET_H
#define NALAR_BUDGET_H

#include <stdint.h>

#define NALAR_BUDGET_STEPS  16
#define NALAR_BUDGET_RECENT 4
#define NALAR_BUDGET_DECAY  0.9
/* the smallest prefill a step gives a waiting prompt, whatever the target:
 * one KV block, so a prompt of P tokens waits at most ceil(P / 16) steps
 * for its first token.  It binds only where the target leaves room for
 * fewer tokens than this beside the decodes; there, a larger minimum
 * would make every such step overshoot the target by its excess (two
 * blocks overshot a 50 ms target by a quarter on the 108M model of
 * bench/itl.sh, whose 16 decodes alone cost 25 ms) */
#define NALAR_BUDGET_MIN_CHUNK 16

typedef struct {
    int32_t n[NALAR_BUDGET_STEPS];  /* the last steps' batch tokens */
    double  t[NALAR_BUDGET_STEPS];  /* and seconds; [head - 1] newest */
    int     head, count;
    double  a, b;                   /* the fit; both >= 0 once n_obs > 0 */
    double  shape_a, shape_b;       /* the last trusted line */
    int     shaped;                 /* shape_a, shape_b hold one */
    int64_t n_obs;                  /* steps recorded */
} nalar_budget;

void   nalar_budget_init(nalar_budget *m);
/* A step of n_tokens batch tokens took `seconds`. */
void   nalar_budget_record(nalar_budget *m, int32_t n_tokens, double seconds);
/* Estimated seconds of a step of n_tokens; < 0 before any step. */
double nalar_budget_estimate(const nalar_budget *m, int32_t n_tokens);
/*
 * Batch tokens a step may carry so that its estimate stays within `target`
 * seconds (0: not even one token fits; INT32_MAX: any number, the estimate
 * not growing with tokens); -1 before any step is recorded.
 */
int32_t nalar_budget_fit(const nalar_budget *m, double target);
/*
 * Prompt tokens a step that already carries n_fixed tokens (decodes and
 * their proposals) may add so that its estimate stays within `target`
 * seconds, at most `most`; but never fewer than NALAR_BUDGET_MIN_CHUNK,
 * even where `most` is less (the caller bounds it by its batch's room).
 * Before any step is recorded: `most` (or the minimum chunk).
 */
int32_t nalar_budget_prefill(const nalar_budget *m, double target,
                             int32_t n_fixed, int32_t most);

#endif
