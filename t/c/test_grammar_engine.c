/*
 * Structured output in the engine, on the demo target model: greedy output
 * under each test schema (t/data/grammar/schemas.json) is the same with
 * speculation off and with forced-token proposals (n-gram mode), alone and
 * all ten batched, with the prefix cache off and on (a second run then
 * starts from cached blocks); a complete value finishes the request with
 * STOP; forced tokens are proposed and accepted; KV goes back to the pool.
 * Sampled outputs (GRAMMAR_SAMPLES per schema, default 20) and the greedy
 * ones are written as JSON lines to $GRAMMAR_OUT for t/32-grammar-engine.t
 * to validate with an independent validator.  A bad schema at intake is a
 * 400 naming response_format.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "collect.h"
#include "tap.h"

#define MODEL   "models/nalar-kjv-target-f32.gguf"
#define SCHEMAS "t/data/grammar/schemas.json"
#define MAX_TOK 400
#define N_SCHEMAS 10

static const int32_t prompt[] = { 1, 298, 1540, 416 };   /* "A wise man" */
static char   *schema_txt[N_SCHEMAS];
static char   *schema_name[N_SCHEMAS];
static FILE   *out;


static nalar_engine *
engine(int prefix_cache)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = MODEL;
    o.n_threads = 1;
    o.prefix_cache = prefix_cache;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


static nalar_request *
req(int s, float temperature, uint64_t seed, int spec_mode, collected *c)
{
    nalar_request_params p;
    nalar_err            err;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.prompt = prompt;
    p.n_prompt = 4;
    p.max_tokens = MAX_TOK;
    p.spec_mode = spec_mode;
    p.spec_max_k = 8;
    p.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
    p.json_schema = schema_txt[s];
    memset(c, 0, sizeof(*c));
    return nalar_request_create(&p, collect, c, &err);
}


static int
run(nalar_engine *e, nalar_request **rs, int n)
{
    nalar_err err;
    int       rc = nalar_engine_run_sync(e, rs, n, &err);

    if (rc != 0) {
        diag("run_sync: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        nalar_request_unref(rs[i]);
    }
    return rc;
}


static void
record(int s, const collected *c)
{
    json_t *line;
    char   *lt;

    if (out == NULL || c->finish != NALAR_FINISH_STOP) {
        return;
    }
    line = json_pack("{s:s, s:s}", "schema", schema_name[s], "output",
                     c->text);
    lt = json_dumps(line, JSON_COMPACT);
    fprintf(out, "%s\n", lt);
    free(lt);
    json_decref(line);
}


static int
kv_all_free(nalar_engine *e)
{
    nalar_kv_pool *p = nalar_engine_kv(e);

    return p->n_free == p->n_blocks;
}


static collected ref[N_SCHEMAS], got[N_SCHEMAS];

static int
same(const collected *a, const collected *b)
{
    return a->n == b->n && a->finish == b->finish
           && memcmp(a->ids, b->ids, a->n * sizeof(int32_t)) == 0;
}


static void
test_greedy(void)
{
    nalar_engine  *e = engine(0), *ec;
    nalar_request *rs[N_SCHEMAS];
    nalar_metrics  m;
    int            eq, stop = 0;

    if (e == NULL) {
        ok(0, "engine");
        return;
    }
    /* reference: alone, speculation off */
    for (int s = 0; s < N_SCHEMAS; s++) {
        rs[0] = req(s, 0, 1, NALAR_SPEC_OFF, &ref[s]);
        run(e, rs, 1);
        stop += ref[s].finish == NALAR_FINISH_STOP;
        record(s, &ref[s]);
        diag("%s: %d tokens, finish %d: %s", schema_name[s], ref[s].n,
             ref[s].finish, ref[s].text);
    }
    ok(stop >= N_SCHEMAS - 2, "%d of %d greedy values complete (STOP)", stop,
       N_SCHEMAS);
    nalar_engine_metrics(e, &m);
    is_int(m.grammar_forced_tokens_total, 0,
           "no forced proposals with speculation off");
    ok(m.grammar_compiles_total == N_SCHEMAS && m.grammar_masks_total > 0,
       "metrics: %llu compiles, %llu masks",
       (unsigned long long) m.grammar_compiles_total,
       (unsigned long long) m.grammar_masks_total);

    /* forced tokens (n-gram mode), alone */
    eq = 0;
    for (int s = 0; s < N_SCHEMAS; s++) {
        rs[0] = req(s, 0, 1, NALAR_SPEC_NGRAM, &got[s]);
        run(e, rs, 1);
        eq += same(&got[s], &ref[s]);
        if (!same(&got[s], &ref[s])) {
            diag("%s differs: %s", schema_name[s], got[s].text);
        }
    }
    is_int(eq, N_SCHEMAS, "forced-token speculation alone: same output");
    nalar_engine_metrics(e, &m);
    ok(m.grammar_forced_tokens_total > 0
       && m.grammar_forced_accepted_total > 0,
       "forced tokens proposed (%llu) and accepted (%llu)",
       (unsigned long long) m.grammar_forced_tokens_total,
       (unsigned long long) m.grammar_forced_accepted_total);
    is_int(m.grammar_compiles_total, N_SCHEMAS,
           "the second request of a schema hits the cache");

    /* all ten batched, with and without speculation */
    for (int spec = 0; spec < 2; spec++) {
        for (int s = 0; s < N_SCHEMAS; s++) {
            rs[s] = req(s, 0, 1, spec ? NALAR_SPEC_NGRAM : NALAR_SPEC_OFF,
                        &got[s]);
        }
        run(e, rs, N_SCHEMAS);
        eq = 0;
        for (int s = 0; s < N_SCHEMAS; s++) {
            eq += same(&got[s], &ref[s]);
        }
        is_int(eq, N_SCHEMAS, "ten batched, speculation %s: same output",
               spec ? "on" : "off");
    }
    ok(kv_all_free(e), "every KV block back in the pool");
    nalar_engine_destroy(e);

    /* prefix cache on: the second run of each starts from cached blocks */
    ec = engine(1);
    for (int pass = 0; ec && pass < 2; pass++) {
        for (int s = 0; s < N_SCHEMAS; s++) {
            rs[s] = req(s, 0, 1, pass ? NALAR_SPEC_NGRAM : NALAR_SPEC_OFF,
                        &got[s]);
        }
        run(ec, rs, N_SCHEMAS);
        eq = 0;
        for (int s = 0; s < N_SCHEMAS; s++) {
            eq += same(&got[s], &ref[s]);
        }
        is_int(eq, N_SCHEMAS, "prefix cache on, pass %d: same output", pass);
    }
    nalar_engine_destroy(ec);
}


static void
test_sampled(int per_schema)
{
    nalar_engine  *e = engine(0);
    nalar_request *rs[N_SCHEMAS];
    collected     *c = calloc(N_SCHEMAS, sizeof(collected));
    int            stop = 0, total = 0, errors = 0;

    if (e == NULL || c == NULL) {
        ok(0, "engine");
        free(c);
        return;
    }
    for (int k = 0; k < per_schema; k++) {
        for (int s = 0; s < N_SCHEMAS; s++) {
            rs[s] = req(s, 1.0f, 1000 + k, k % 2 ? NALAR_SPEC_NGRAM
                                                 : NALAR_SPEC_OFF, &c[s]);
        }
        run(e, rs, N_SCHEMAS);
        for (int s = 0; s < N_SCHEMAS; s++) {
            total++;
            stop += c[s].finish == NALAR_FINISH_STOP;
            errors += c[s].finish == NALAR_FINISH_ERROR;
            if (c[s].finish != NALAR_FINISH_STOP) {
                diag("%s: finish %d %s: %s", schema_name[s], c[s].finish,
                     c[s].last.error.message, c[s].text);
            }
            record(s, &c[s]);
        }
    }
    is_int(errors, 0, "no sampled request failed");
    is_int(stop, total, "every sampled value completed within %d tokens "
           "(%d of %d)", MAX_TOK, stop, total);
    ok(kv_all_free(e), "every KV block back in the pool");
    nalar_engine_destroy(e);
    free(c);
}


static void
test_bad_schema(void)
{
    nalar_engine        *e = engine(0);
    nalar_request       *r;
    nalar_request_params p;
    nalar_err            err;
    collected            c;

    if (e == NULL) {
        ok(0, "engine");
        return;
    }
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.prompt = prompt;
    p.n_prompt = 4;
    p.max_tokens = 8;
    p.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
    p.json_schema = "{\"type\":\"string\",\"pattern\":\"(?=a)\"}";
    memset(&c, 0, sizeof(c));
    r = nalar_request_create(&p, collect, &c, &err);
    run(e, &r, 1);
    ok(c.finish == NALAR_FINISH_ERROR && c.last.error.status == 400
       && strcmp(c.last.error.param, "response_format") == 0
       && strstr(c.last.error.message, "lookahead") != NULL,
       "a bad schema at intake: 400, response_format, names the lookahead "
       "(%s)",
       c.last.error.message);
    ok(kv_all_free(e), "no KV held");
    nalar_engine_destroy(e);
}


int
main(void)
{
    json_error_t je;
    json_t      *all = json_load_file(SCHEMAS, 0, &je);
    const char  *o = getenv("GRAMMAR_OUT");

    ok(all != NULL && json_array_size(all) == N_SCHEMAS, "test schemas");
    if (all == NULL) {
        return done_testing();
    }
    for (int s = 0; s < N_SCHEMAS; s++) {
        json_t *e = json_array_get(all, s);

        schema_name[s] = strdup(json_string_value(json_object_get(e,
                                                                  "name")));
        schema_txt[s] = json_dumps(json_object_get(e, "schema"),
                                   JSON_COMPACT);
    }
    out = o ? fopen(o, "w") : NULL;
    test_bad_schema();
    test_greedy();
    test_sampled(getenv("GRAMMAR_SAMPLES") ? atoi(getenv("GRAMMAR_SAMPLES"))
                                           : 20);
    if (out != NULL) {
        fclose(out);
    }
    for (int s = 0; s < N_SCHEMAS; s++) {
        free(schema_name[s]);
        free(schema_txt[s]);
    }
    json_decref(all);
    return done_testing();
}
