/*
 * Hooks for tests, nothing else: the engine's own (t/c/test_engine.c), and
 * the module's through its nalar_test_fault_forward directive.  The CLI
 * never calls these.  They make failures that real
 * traffic produces rarely (an allocation failing mid-step, a request
 * arriving just as the engine goes idle) happen on demand, and read what
 * the tests check (the KV pool, the cost model's estimates).
 *
 * They exist only in the test builds, compiled with -DNALAR_TEST_HOOKS
 * (the ASan flavour: build/asan/, the unit tests and `make module-asan`);
 * the production library, CLI and module have none of them.
 */
#ifndef NALAR_ENGINE_TEST_H
#define NALAR_ENGINE_TEST_H

#include "engine.h"

#ifdef NALAR_TEST_HOOKS

typedef enum {
    NALAR_FAULT_BATCH = 0,   /* growing the step's batch (every step) */
    NALAR_FAULT_LOGITS,      /* allocating room for more logit rows */
    NALAR_FAULT_FORWARD,     /* the backend's forward pass */
    NALAR_FAULT_OUTPUT,      /* growing a request's output buffer
                                (push_output), once per confirmed token */
    NALAR_FAULT_DIGEST,      /* the digest context of a prefix-cache block
                                digest (one per block and scope switch) */
    NALAR_FAULT_STOP,        /* growing the stop-string matcher's buffer,
                                once per confirmed token's text */
    NALAR_FAULT_START,       /* a request's token and digest arrays, the
                                first time it is scheduled */
    NALAR_FAULT_COUNT
} nalar_fault_site;

/* The n-th time (n >= 1) the engine reaches `site` from now on, it fails
 * there as if out of memory (the backend: as if it had failed); n = 0
 * disarms.  Any thread may arm it at any time. */
void nalar_engine_test_fault(nalar_engine *e, nalar_fault_site site, int n);

/* fn(arg) runs on the engine thread each time a step found nothing to
 * run, before the engine looks at its queue again.  Set it before
 * nalar_engine_start. */
void nalar_engine_test_idle(nalar_engine *e, void (*fn)(void *arg),
                            void *arg);

/*
 * A fake clock for the step budget: from now on every step "costs"
 * per_step + per_token x (its batch tokens) seconds -- what the cost model
 * learns, the step histogram and the over-target count see -- whatever it
 * really took.  reseed != 0: the model first forgets what it learned and is
 * seeded as at load, with those costs.  Call it on the thread that runs
 * the steps (run_sync's caller, or from a step callback).
 */
void nalar_engine_test_step_cost(nalar_engine *e, double per_step,
                                 double per_token, int reseed);

/* What one step decided, for the step callback. */
typedef struct {
    int32_t n_decode;     /* sequences decoding (before proposals) */
    int32_t n_fixed;      /* decode and proposal tokens batched */
    int32_t n_prefill;    /* prompt tokens batched */
    int32_t allowance;    /* prompt tokens it could have carried */
    int32_t pending;      /* prompt tokens running requests still wanted */
    double  seconds;      /* its duration (the fake clock's, when set) */
} nalar_test_step;

/* fn(arg, st) runs on the engine thread after every step that ran a pass.
 * Set it while no step runs. */
void nalar_engine_test_step_fn(nalar_engine *e,
                               void (*fn)(void *arg, const nalar_test_step *st),
                               void *arg);

/* Prompt texts the engine has copied so far, process-wide: each
 * nalar_prompt_create and each request given prompt_text (not
 * prompt_shared) makes one copy. */
uint64_t nalar_test_prompt_copies(void);

/* Large-parameter copies (nalar_params_create) made so far, process-
 * wide: each nalar_params_create, and each request created without
 * params_shared, makes one. */
uint64_t nalar_test_params_copies(void);

/* Where r keeps its large parameters (the shared copy's bytes): the
 * first stop string, the schema text, the prediction's text; NULL for
 * what r does not have.  For tests that two requests share them. */
typedef struct {
    const char *stop0;
    const char *schema;
    const char *prediction;
} nalar_test_params_ptrs;

void nalar_test_request_params(nalar_request *r, nalar_test_params_ptrs *out);

/* keep != 0: a model whose every layer slides keeps the KV blocks before
 * its window (as engines without the release did), for comparing ids.
 * Set it while the engine runs nothing. */
void nalar_engine_test_keep_kv(nalar_engine *e, int keep);

/* The prefix cache's root digest for `scope` (NALAR_DIGEST bytes into
 * out); -1 when the engine has no prefix cache (or has not loaded). */
int nalar_engine_test_prefix_root(nalar_engine *e, const char *scope,
                                  uint8_t *out);

/* The engine's KV pool once loaded, NULL before (tests check its
 * invariants with nalar_kv_check). */
struct nalar_kv_pool *nalar_engine_kv(nalar_engine *e);

/* The cost model's estimate, in seconds, of one pass of n_tokens tokens of
 * the target (draft != 0: of the draft); < 0 where nothing is known.  Passes
 * of one sequence of 1 .. NALAR_SPEC_MAX_K + 1 tokens are measured at load.
 * The engine thread updates the estimates: read them only while no step
 * runs (before nalar_engine_start, or between nalar_engine_run_sync
 * calls). */
double nalar_engine_pass_cost(nalar_engine *e, int draft, int32_t n_tokens);

#endif /* NALAR_TEST_HOOKS */

#endif
