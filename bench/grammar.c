/*
 * Structured-output benchmark (bench/grammar.sh runs it): schema compile
 * time for the ten test schemas (cold cache, then a hit); the grammar's
 * share of a decode step (masking, uncached mask builds included) at batch
 * 1 and 16; and tokens per second of greedy generation under a schema with
 * long fixed key names with forced-token speculation (n-gram mode) against
 * speculation off, alternated in one process, with the share of tokens the
 * grammar forced.  Prints markdown.
 *
 *   build/bench/grammar MODEL SCHEMAS.json ROUNDS
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "grammar.h"
#include "model.h"
#include "../t/c/collect.h"

static const int32_t prompt[] = { 1, 298, 1540, 416 };   /* "A wise man" */

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
    qsort(v, n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* n requests of one schema, run to completion: seconds, tokens */
static double
run(nalar_engine *e, const char *schema, int n, int spec, float temp,
    int max_tokens, int64_t *tokens)
{
    nalar_request      *rs[64];
    static collected    c[64];
    nalar_request_params p;
    nalar_err           err;
    double              t0;

    for (int i = 0; i < n; i++) {
        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = temp;
        p.sampling.seed = 100 + i;
        p.prompt = prompt;
        p.n_prompt = 4;
        p.max_tokens = max_tokens;
        p.spec_mode = spec ? NALAR_SPEC_NGRAM : NALAR_SPEC_OFF;
        p.spec_max_k = 8;
        p.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
        p.json_schema = schema;
        memset(&c[i], 0, sizeof(c[i]));
        rs[i] = nalar_request_create(&p, collect, &c[i], &err);
    }
    t0 = nalar_now_s();
    nalar_engine_run_sync(e, rs, n, &err);
    t0 = nalar_now_s() - t0;
    *tokens = 0;
    for (int i = 0; i < n; i++) {
        *tokens += c[i].n;
        nalar_request_unref(rs[i]);
    }
    return t0;
}

int
main(int argc, char **argv)
{
    const char          *model = argc > 1 ? argv[1]
                                 : "models/nalar-kjv-target-f32.gguf";
    const char          *sf = argc > 2 ? argv[2]
                                 : "t/data/grammar/schemas.json";
    int                  rounds = argc > 3 ? atoi(argv[3]) : 5;
    json_error_t         je;
    json_t              *all = json_load_file(sf, 0, &je);
    nalar_engine_opts    o;
    nalar_err            err;
    nalar_engine        *e;
    nalar_grammar_cache *gc;
    char                *txt[16], ebuf[256];
    const char          *longkeys = NULL;
    size_t               ns = json_array_size(all);

    memset(&o, 0, sizeof(o));
    o.model_path = model;
    o.n_threads = 2;
    e = nalar_engine_create(&o, &err);
    if (all == NULL || e == NULL || nalar_engine_run_sync(e, NULL, 0, &err)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    /* compile: cold (a fresh cache per round), then a hit */
    printf("## compile (ms, median of %d cold compiles; hit)\n\n", rounds);
    printf("| schema | cold | hit |\n|---|---:|---:|\n");
    for (size_t i = 0; i < ns && i < 16; i++) {
        json_t *s = json_array_get(all, i);
        double  cold[64], hit = 0, cs;

        txt[i] = json_dumps(json_object_get(s, "schema"), JSON_COMPACT);
        if (strcmp(json_string_value(json_object_get(s, "name")),
                   "longkeys") == 0)
        {
            longkeys = txt[i];
        }
        for (int r = 0; r < rounds && r < 64; r++) {
            nalar_grammar *g;

            gc = nalar_grammar_cache_create(nalar_engine_model(e)->tok, 0);
            g = nalar_grammar_get(gc, NALAR_GRAMMAR_JSON_SCHEMA, txt[i],
                                  strlen(txt[i]), &cold[r], ebuf,
                                  sizeof(ebuf));
            nalar_grammar_release(g);
            g = nalar_grammar_get(gc, NALAR_GRAMMAR_JSON_SCHEMA, txt[i],
                                  strlen(txt[i]), &cs, ebuf, sizeof(ebuf));
            hit += cs;
            nalar_grammar_release(g);
            nalar_grammar_cache_destroy(gc);
        }
        printf("| %s | %.3f | %.3f |\n",
               json_string_value(json_object_get(s, "name")),
               median(cold, rounds) * 1e3, hit / rounds * 1e3);
    }
    /* mask share of a step: sampled, speculation off */
    printf("\n## mask cost per decode step (sampled, T=1, speculation "
           "off; all ten schemas in turn)\n\n");
    printf("| batch | step ms | grammar ms per step | share |\n"
           "|---:|---:|---:|---:|\n");
    for (int b = 1; b <= 16; b += 15) {
        double step = 0, mask = 0;

        for (int r = 0; r < rounds; r++) {
            for (size_t i = 0; i < ns; i++) {
                nalar_metrics m0, m1;
                int64_t       tok;
                double        s;

                nalar_engine_metrics(e, &m0);
                s = run(e, txt[i], b, 0, 1.0f, 200, &tok);
                nalar_engine_metrics(e, &m1);
                step += s;
                mask += m1.grammar_mask_seconds_total
                        - m0.grammar_mask_seconds_total;
            }
        }
        /* per step: the totals over the steps they took */
        {
            static uint64_t last_steps;
            nalar_metrics   m;
            uint64_t        steps;

            nalar_engine_metrics(e, &m);
            steps = m.steps_total - last_steps;
            last_steps = m.steps_total;
            printf("| %d | %.3f | %.4f | %.2f%% |\n", b,
                   step / steps * 1e3, mask / steps * 1e3,
                   100 * mask / step);
        }
    }
    /* forced-token speculation on the long-key schema */
    if (longkeys != NULL) {
        double  ratio[64], tps_on[64], tps_off[64];
        int64_t t_on = 0, t_off = 0;
        nalar_metrics m0, m1;

        for (int r = 0; r < rounds && r < 64; r++) {
            double s_off = run(e, longkeys, 1, 0, 0, 300, &t_off);
            double s_on;

            nalar_engine_metrics(e, &m0);
            s_on = run(e, longkeys, 1, 1, 0, 300, &t_on);
            nalar_engine_metrics(e, &m1);
            tps_off[r] = t_off / s_off;
            tps_on[r] = t_on / s_on;
            ratio[r] = tps_on[r] / tps_off[r];
        }
        printf("\n## forced-token speculation (longkeys schema, greedy, "
               "batch 1)\n\n");
        printf("| tokens | forced | tok/s off | tok/s forced | ratio |\n"
               "|---:|---:|---:|---:|---:|\n");
        printf("| %lld | %.0f%% | %.0f | %.0f | %.2fx |\n",
               (long long) t_on,
               100.0 * (m1.grammar_forced_accepted_total
                        - m0.grammar_forced_accepted_total) / t_on,
               median(tps_off, rounds), median(tps_on, rounds),
               median(ratio, rounds));
    }
    nalar_engine_destroy(e);
    json_decref(all);
    return 0;
}
