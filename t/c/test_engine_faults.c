/*
 * Allocation failures that one request owns, injected (engine_test.h, in
 * builds with NALAR_TEST_HOOKS): growing a request's output (push_output),
 * the prefix cache's digest context (looking a prompt up at admission and
 * publishing confirmed blocks), the stop-string matcher, a request's token
 * and digest arrays at its start.  At each site, the request that met the
 * failure ends with NALAR_FINISH_ERROR and "out of memory"; the others
 * complete with the same tokens as without the failure; every KV block
 * comes back (held by no sequence: free, or by the prefix cache alone).
 *
 * And a request's large parameters (stop strings, prediction, schema) are
 * one copy shared by its choices (nalar_params): one copy for 16
 * requests, the same bytes seen by each, the same outputs as requests
 * with their own copies.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "collect.h"
#include "tap.h"

#define N_REQ      3
#define MAX_TOK    20
#define PROMPT_LEN 20

/* the demo model's reference prompts (t/c/test_engine.c), each repeated
 * to PROMPT_LEN ids: a full block to look up at admission */
static const int32_t seeds[N_REQ][6] = {
    { 1, 780, 262, 1794, 1046 },
    { 1, 327, 337, 559, 292, 718 },
    { 1, 298, 1540, 416 },
};
static const int seed_len[N_REQ] = { 5, 6, 4 };

static int32_t prompts[N_REQ][PROMPT_LEN];


static nalar_engine *
engine(const char *path)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.n_threads = 2;
    o.prefix_cache = 1;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/* No sequence holds a block: each is free or held by the prefix cache
 * alone (refcount 1), and the pool's invariants hold. */
static int
kv_back(nalar_engine *e)
{
    nalar_kv_pool *p = nalar_engine_kv(e);
    nalar_metrics  m;
    nalar_err      err;
    int64_t        refs = 0;

    if (nalar_kv_check(p, &err) != 0) {
        diag("%s", err.msg);
        return 0;
    }
    nalar_engine_metrics(e, &m);
    for (int32_t b = 0; b < p->n_blocks; b++) {
        refs += p->refcount[b];
    }
    if (p->n_free + m.prefix_blocks != p->n_blocks
        || refs != m.prefix_blocks)
    {
        diag("%d free + %d cached of %d blocks, %lld references",
             p->n_free, m.prefix_blocks, p->n_blocks, (long long) refs);
        return 0;
    }
    return 1;
}


/* The N_REQ requests, greedy, MAX_TOK tokens each (a stop string that
 * never matches: the matcher runs on every token), run together. */
static void
run_set(nalar_engine *e, collected *c)
{
    static const char   *stop[] = { "@@never@@" };
    nalar_request       *rs[N_REQ];
    nalar_request_params p;
    nalar_err            err;

    for (int i = 0; i < N_REQ; i++) {
        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = 0;
        p.prompt = prompts[i];
        p.n_prompt = PROMPT_LEN;
        p.max_tokens = MAX_TOK;
        p.ignore_eos = 1;
        p.stop = stop;
        p.n_stop = 1;
        memset(&c[i], 0, sizeof(c[i]));
        rs[i] = nalar_request_create(&p, collect, &c[i], &err);
        if (rs[i] == NULL) {
            diag("create: %s", err.msg);
            exit(1);
        }
    }
    nalar_engine_run_sync(e, rs, N_REQ, &err);
    for (int i = 0; i < N_REQ; i++) {
        nalar_request_unref(rs[i]);
    }
}


/*
 * The at-th time the engine reaches `site`, it fails there: exactly one
 * request ends with "out of memory", the others as in `ref`.
 */
static void
check_site(nalar_engine *e, nalar_fault_site site, int at, const char *what,
           const collected *ref)
{
    collected c[N_REQ];
    int       failed = -1, errors = 0, good = 1;

    nalar_engine_test_fault(e, site, at);
    run_set(e, c);
    nalar_engine_test_fault(e, site, 0);
    for (int i = 0; i < N_REQ; i++) {
        if (c[i].finish == NALAR_FINISH_ERROR) {
            errors++;
            failed = i;
            continue;
        }
        good &= c[i].finish == NALAR_FINISH_LENGTH && c[i].n == MAX_TOK
                && memcmp(c[i].ids, ref[i].ids, MAX_TOK * sizeof(int32_t))
                   == 0
                && strcmp(c[i].text, ref[i].text) == 0;
    }
    ok(errors == 1
       && strstr(c[failed].last.error.message, "out of memory") != NULL,
       "%s: the request that met it ends with the error (%d errors%s%s)",
       what, errors, errors == 1 ? ": " : "",
       errors == 1 ? c[failed].last.error.message : "");
    ok(errors == 1 && c[failed].n < MAX_TOK
       && memcmp(c[failed].ids, ref[failed].ids,
                 (size_t) c[failed].n * sizeof(int32_t)) == 0,
       "%s: what it gave before the failure is the reference's (%d of %d "
       "tokens)", what, errors == 1 ? c[failed].n : -1, MAX_TOK);
    ok(good, "%s: the other requests give the reference tokens", what);
    ok(kv_back(e), "%s: every KV block back (free or cached)", what);
}


static void
test_faults(const char *path)
{
    nalar_engine *e = engine(path);
    collected     ref[N_REQ], again[N_REQ];
    int           good = 1;

    if (e == NULL) {
        ok(0, "engine for the fault tests");
        return;
    }
    for (int i = 0; i < N_REQ; i++) {
        for (int k = 0; k < PROMPT_LEN; k++) {
            prompts[i][k] = seeds[i][k % seed_len[i]];
        }
    }

    /* the reference, with the cache empty, then with it full */
    run_set(e, ref);
    run_set(e, again);
    for (int i = 0; i < N_REQ; i++) {
        good &= ref[i].finish == NALAR_FINISH_LENGTH && ref[i].n == MAX_TOK
                && again[i].cached > 0
                && memcmp(again[i].ids, ref[i].ids,
                          MAX_TOK * sizeof(int32_t)) == 0;
    }
    ok(good, "without failures: %d tokens each, the same from the cache",
       MAX_TOK);
    ok(kv_back(e), "without failures: every KV block back");

    /* each request pushes output once per token: the 5th push is the
     * second request's second token; the 2nd is its first */
    check_site(e, NALAR_FAULT_OUTPUT, 5, "output, mid-generation", ref);
    check_site(e, NALAR_FAULT_OUTPUT, 2, "output, first token", ref);
    /* digests: one per request at admission (block 0, looked up), then
     * one per request when block 1 is published */
    check_site(e, NALAR_FAULT_DIGEST, 2, "prefix digest at admission", ref);
    check_site(e, NALAR_FAULT_DIGEST, 5, "prefix digest when publishing",
               ref);
    check_site(e, NALAR_FAULT_STOP, 7, "stop matcher", ref);
    check_site(e, NALAR_FAULT_START, 3, "request start", ref);

    /* and the engine serves as before */
    run_set(e, again);
    good = 1;
    for (int i = 0; i < N_REQ; i++) {
        good &= again[i].finish == NALAR_FINISH_LENGTH
                && memcmp(again[i].ids, ref[i].ids,
                          MAX_TOK * sizeof(int32_t)) == 0;
    }
    ok(good, "after the failures: the reference tokens");
    ok(kv_back(e), "after the failures: every KV block back");
    nalar_engine_destroy(e);
}


/*
 * 16 choices of one request share one copy of its large parameters: made
 * once (nalar_params_create), each request sees the same bytes at the same
 * address, the caller's buffers may go once they are made, and each
 * answers as a request with its own copy.
 */
#define N_CHOICES 16

static void
test_shared_params(const char *path)
{
    static const char  schema[] = "{\"type\":\"object\",\"properties\":"
                                  "{\"name\":{\"type\":\"string\"}},"
                                  "\"required\":[\"name\"]}";
    static const char  line[] = "{\"name\": \"And it came to pass\"} ";
    nalar_engine        *e = engine(path);
    nalar_request_params p;
    nalar_params        *pc;
    nalar_request       *rs[N_CHOICES + 1];
    nalar_test_params_ptrs ptr[N_CHOICES + 1];
    collected           *c = calloc(N_CHOICES + 1, sizeof(collected));
    char                *pred = malloc(64 * 1024), *sch = strdup(schema);
    char                *stops[4];
    nalar_tok_text       piece;
    nalar_err            err;
    uint64_t             before, copies;
    int                  good = 1, same_ptr = 1, differ = 0;

    if (e == NULL || c == NULL || pred == NULL || sch == NULL) {
        ok(0, "shared parameters: setup");
        free(c);
        free(pred);
        free(sch);
        nalar_engine_destroy(e);
        return;
    }
    pred[0] = '\0';
    for (size_t n = 0; n + sizeof(line) < 64 * 1024; n += sizeof(line) - 1) {
        strcat(pred + n, line);
    }
    for (int i = 0; i < 4; i++) {
        stops[i] = malloc(256 + 1);
        memset(stops[i], 'a' + i, 256);
        stops[i][256] = '\0';
    }
    piece.text = pred;
    piece.len = strlen(pred);
    piece.special = 0;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = seeds[1];
    p.n_prompt = seed_len[1];
    p.max_tokens = 16;
    p.stop = (const char **) stops;
    p.n_stop = 4;
    p.prediction_text = &piece;
    p.n_prediction_text = 1;
    p.spec_fixed = 1;
    p.spec_max_k = 4;
    p.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
    p.json_schema = sch;

    /* the reference: a request with its own copy */
    before = nalar_test_params_copies();
    rs[N_CHOICES] = nalar_request_create(&p, collect, &c[N_CHOICES], &err);
    is_int((int) (nalar_test_params_copies() - before), 1,
           "a request without params_shared makes its own copy");

    before = nalar_test_params_copies();
    pc = nalar_params_create(&p, &err);
    ok(pc != NULL, "nalar_params_create");
    p.params_shared = pc;
    /* what params_shared stands for is taken from it, not from p */
    p.stop = NULL;
    p.n_stop = 0;
    p.prediction_text = NULL;
    p.json_schema = NULL;
    for (int i = 0; i < N_CHOICES; i++) {
        rs[i] = nalar_request_create(&p, collect, &c[i], &err);
        good &= rs[i] != NULL;
        p.sampling.seed += 0x9e3779b97f4a7c15ULL;
    }
    nalar_params_unref(pc);
    copies = nalar_test_params_copies() - before;
    ok(good && copies == 1, "%d choices with %zu bytes of prediction, 4 "
       "stop strings of 256 bytes and a schema: %llu copy", N_CHOICES,
       piece.len, (unsigned long long) copies);
    for (int i = 0; i <= N_CHOICES; i++) {
        nalar_test_request_params(rs[i], &ptr[i]);
    }
    for (int i = 1; i < N_CHOICES; i++) {
        same_ptr &= ptr[i].stop0 == ptr[0].stop0
                    && ptr[i].schema == ptr[0].schema
                    && ptr[i].prediction == ptr[0].prediction;
    }
    differ = ptr[0].stop0 != ptr[N_CHOICES].stop0
             && ptr[0].stop0 != stops[0] && ptr[0].schema != sch
             && ptr[0].prediction != pred;
    ok(same_ptr && ptr[0].stop0 != NULL && ptr[0].schema != NULL
       && ptr[0].prediction != NULL,
       "each choice borrows the same stop strings, schema and prediction");
    ok(differ, "a copy of the caller's bytes, not the request's own");
    ok(ptr[0].stop0 != NULL && strcmp(ptr[0].stop0, stops[0]) == 0
       && ptr[0].schema != NULL && strcmp(ptr[0].schema, schema) == 0
       && ptr[0].prediction != NULL
       && strncmp(ptr[0].prediction, pred, piece.len) == 0,
       "the copy holds the caller's bytes");

    /* the caller's buffers go: the requests hold what they need */
    memset(pred, 'x', piece.len);
    memset(sch, 'x', strlen(sch));
    for (int i = 0; i < 4; i++) {
        memset(stops[i], 'x', 256);
    }
    nalar_engine_run_sync(e, rs, N_CHOICES + 1, &err);
    ok(c[N_CHOICES].finish != NALAR_FINISH_ERROR && c[N_CHOICES].n > 0
       && c[N_CHOICES].text[0] == '{',
       "the reference answers under the schema: '%s'", c[N_CHOICES].text);
    good = 1;
    for (int i = 0; i < N_CHOICES; i++) {
        good &= c[i].finish == c[N_CHOICES].finish
                && c[i].n == c[N_CHOICES].n
                && memcmp(c[i].ids, c[N_CHOICES].ids,
                          (size_t) c[i].n * sizeof(int32_t)) == 0
                && c[i].last.usage.spec_accepted
                   == c[N_CHOICES].last.usage.spec_accepted;
    }
    ok(good, "each of the %d choices answers as the request with its own "
       "copy (%d tokens, %d accepted from the prediction)", N_CHOICES,
       c[N_CHOICES].n, c[N_CHOICES].last.usage.spec_accepted);
    for (int i = 0; i <= N_CHOICES; i++) {
        nalar_request_unref(rs[i]);
    }
    ok(kv_back(e), "shared parameters: every KV block back");
    for (int i = 0; i < 4; i++) {
        free(stops[i]);
    }
    free(pred);
    free(sch);
    free(c);
    nalar_engine_destroy(e);
}


int
main(void)
{
    const char *tf32 = "models/nalar-kjv-target-f32.gguf";

    test_faults(tf32);
    test_shared_params(tf32);
    return done_testing();
}
