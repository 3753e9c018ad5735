/*
 * Sampled structured output under the keywords real schemas use (bounds,
 * item counts, string lengths, patterns, formats), on the demo target
 * model: the five schemas of t/data/grammar/keywords.json, GRAMMAR_SAMPLES
 * sampled values each (default 200, temperature 1, a seed per value,
 * speculation off and on in turn), every one complete (STOP) within
 * MAX_TOK tokens, with no error and every KV block back in the pool.  The
 * values are written as JSON lines to $GRAMMAR_OUT for
 * t/33-grammar-keywords.t to validate with python3-jsonschema, format
 * checking on.  Sized by power: the validator is exact (no false alarm to
 * bound), and 200 values a schema find, with probability
 * 1 - (39/40)^200 = 0.994, a grammar defect that one sampled value in 40
 * meets.  A statistical test: it runs on the optimized build (NUM_TESTS in
 * the Makefile); sampled structured output runs under ASan in
 * test_grammar_engine, and these keywords' grammars in test_grammar.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "collect.h"
#include "tap.h"

#define MODEL     "models/nalar-kjv-target-f32.gguf"
#define SCHEMAS   "t/data/grammar/keywords.json"
#define MAX_TOK   600
#define N_SCHEMAS 5
#define BATCH     8          /* requests per schema per run */

static const int32_t prompt[] = { 1, 298, 1540, 416 };   /* "A wise man" */


int
main(void)
{
    json_error_t      je;
    json_t           *all = json_load_file(SCHEMAS, 0, &je);
    const char       *o = getenv("GRAMMAR_OUT");
    int               per = getenv("GRAMMAR_SAMPLES")
                            ? atoi(getenv("GRAMMAR_SAMPLES")) : 200;
    FILE             *out = o ? fopen(o, "w") : NULL;
    char             *txt[N_SCHEMAS];
    const char       *name[N_SCHEMAS];
    int               stop[N_SCHEMAS] = {0}, errors = 0;
    nalar_engine_opts eo;
    nalar_engine     *e;
    nalar_err         err;
    collected        *c = calloc(N_SCHEMAS * BATCH, sizeof(collected));

    ok(all != NULL && json_array_size(all) == N_SCHEMAS, "%d keyword schemas",
       N_SCHEMAS);
    if (all == NULL || c == NULL) {
        return done_testing();
    }
    for (int s = 0; s < N_SCHEMAS; s++) {
        json_t *en = json_array_get(all, s);

        name[s] = json_string_value(json_object_get(en, "name"));
        txt[s] = json_dumps(json_object_get(en, "schema"), JSON_COMPACT);
    }
    memset(&eo, 0, sizeof(eo));
    eo.model_path = MODEL;
    eo.n_threads = 1;
    e = nalar_engine_create(&eo, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        ok(0, "engine: %s", err.msg);
        return done_testing();
    }
    for (int k = 0; k < per; k += BATCH) {
        nalar_request *rs[N_SCHEMAS * BATCH];
        int            n = 0;

        for (int s = 0; s < N_SCHEMAS; s++) {
            for (int j = 0; j < BATCH && k + j < per; j++) {
                nalar_request_params p;

                memset(&p, 0, sizeof(p));
                nalar_sampling_default(&p.sampling);
                p.sampling.temperature = 1.0f;
                p.sampling.seed = 7000 + 131 * s + k + j;
                p.prompt = prompt;
                p.n_prompt = 4;
                p.max_tokens = MAX_TOK;
                p.spec_mode = (k + j) % 2 ? NALAR_SPEC_NGRAM : NALAR_SPEC_OFF;
                p.spec_max_k = 8;
                p.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
                p.json_schema = txt[s];
                memset(&c[n], 0, sizeof(collected));
                c[n].cached = s;     /* which schema, until collected */
                rs[n] = nalar_request_create(&p, collect, &c[n], &err);
                if (rs[n] == NULL) {
                    diag("%s: %s", name[s], err.msg);
                    errors++;
                    continue;
                }
                n++;
            }
        }
        {
            int which[N_SCHEMAS * BATCH];

            for (int i = 0; i < n; i++) {
                which[i] = c[i].cached;
            }
            if (nalar_engine_run_sync(e, rs, n, &err) != 0) {
                diag("run_sync: %s", err.msg);
                errors++;
            }
            for (int i = 0; i < n; i++) {
                int s = which[i];

                nalar_request_unref(rs[i]);
                if (c[i].finish != NALAR_FINISH_STOP) {
                    errors += c[i].finish == NALAR_FINISH_ERROR;
                    diag("%s: finish %d %s: %s", name[s], c[i].finish,
                         c[i].last.error.message, c[i].text);
                    continue;
                }
                stop[s]++;
                if (out != NULL) {
                    json_t *line = json_pack("{s:s, s:s}", "schema", name[s],
                                             "output", c[i].text);
                    char   *lt = json_dumps(line, JSON_COMPACT);

                    fprintf(out, "%s\n", lt);
                    free(lt);
                    json_decref(line);
                }
            }
        }
    }
    is_int(errors, 0, "no sampled request failed");
    for (int s = 0; s < N_SCHEMAS; s++) {
        is_int(stop[s], per, "%s: %d sampled values complete within %d "
               "tokens", name[s], per, MAX_TOK);
    }
    {
        /* the numeric build has no test hooks: the pool's counts come
         * from the engine's metrics */
        nalar_metrics mt;

        nalar_engine_metrics(e, &mt);
        ok(mt.kv_blocks_free == mt.kv_blocks_total,
           "every KV block back in the pool");
    }
    nalar_engine_destroy(e);
    if (out != NULL) {
        fclose(out);
    }
    for (int s = 0; s < N_SCHEMAS; s++) {
        free(txt[s]);
    }
    free(c);
    json_decref(all);
    return done_testing();
}
