/*
 * Token sampling from one row of logits.
 *
 * Order of transforms (as llama.cpp / vLLM apply them): logit bias and
 * penalties on the raw logits, then greedy short-cut when temperature == 0,
 * else top-k, then
 * softmax at temperature, top-p (nucleus), min-p, renormalise and draw with
 * the request's own seeded RNG.  The same transforms produce the target
 * distribution that speculative verification compares against.
 */
#ifndef NALAR_SAMPLER_H
#define NALAR_SAMPLER_H

#include <stdint.h>

#define NALAR_MAX_LOGIT_BIAS 300

typedef struct {
    float    temperature;        /* 0 = greedy */
    int32_t  top_k;              /* <= 0: off */
    float    top_p;              /* >= 1: off */
    float    min_p;              /* <= 0: off */
    float    presence_penalty;   /* OpenAI semantics: -2..2 */
    float    frequency_penalty;  /* OpenAI semantics: -2..2 */
    uint64_t seed;
    int32_t  n_logprobs;         /* top-N logprobs to report, 0..20 */
    /* OpenAI's logit_bias: bias[i] (-100..100) is added to the logit of
     * token bias_id[i] before anything else */
    int32_t  n_bias;
    int32_t  bias_id[NALAR_MAX_LOGIT_BIAS];
    float    bias[NALAR_MAX_LOGIT_BIAS];
} nalar_sampling;

void nalar_sampling_default(nalar_sampling *s);

/* xoshiro256** seeded by splitmix64: reproducible per request. */
typedef struct { uint64_t s[4]; } nalar_rng;
void     nalar_rng_seed(nalar_rng *r, uint64_t seed);
uint64_t nalar_rng_next(nalar_rng *r);
double   nalar_rng_uniform(nalar_rng *r);    /* [0, 1) */

typedef struct {
    int32_t id;
    float   logprob;
} nalar_logprob;

typedef struct {
    nalar_sampling  p;
    nalar_rng       rng;
    int32_t         n_vocab;
    int32_t        *counts;   /* (n_vocab) occurrences in generated output */
    /* scratch, (n_vocab) each */
    float          *probs;
    int32_t        *idx;
} nalar_sampler;

int  nalar_sampler_init(nalar_sampler *s, const nalar_sampling *p,
                        int32_t n_vocab);
void nalar_sampler_free(nalar_sampler *s);

/* Record an emitted token (for presence/frequency penalties). */
void nalar_sampler_accept(nalar_sampler *s, int32_t id);

/*
 * Apply penalties + temperature/top-k/top-p/min-p to `logits` (n_vocab,
 * modified in place) and write the resulting distribution to s->probs.
 * Returns the number of candidates with nonzero probability; for greedy
 * (temperature 0) the distribution is a point mass on the argmax.
 */
int nalar_sampler_dist(nalar_sampler *s, float *logits);

/*
 * Sample one token from `logits` (n_vocab, modified in place).  When
 * lp != NULL, fills lp[0] with the chosen token's logprob and lp[1..n] with
 * the top-n alternatives (log-softmax of the penalised logits at T=1, as
 * OpenAI reports them; lp has room for 1 + p.n_logprobs entries); returns
 * the token id.  Like nalar_sampler_dist, each call applies the penalties to
 * the buffer it is given, so give each call fresh logits.
 */
int32_t nalar_sample(nalar_sampler *s, float *logits, nalar_logprob *lp);

/*
 * Draw an index in [0, n) with probability w[i] / sum(w) using the sampler's
 * RNG (inverse CDF in index order); negative or non-finite weights count as
 * zero.  For speculative decoding's residual max(0, p - q).  Returns -1 when
 * no weight is positive.
 */
int32_t nalar_sample_from(nalar_sampler *s, const float *w, int32_t n);

/* Greedy argmax over n floats (ties: lowest id). */
int32_t nalar_argmax(const float *x, int32_t n);

#endif
