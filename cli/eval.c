/*
 * `nalar eval`: teacher-forced logits of a list of token ids, one JSON
 * line per position (its top K and the logsumexp), from the model alone
 * or with a LoRA adapter applied at run time (--lora PATH[:SCALE]), for
 * comparisons with reference numbers (the conformance kit, llama.cpp's
 * merged files in bench/lora-peer.sh).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "eval.h"
#include "kv.h"
#include "lora.h"
#include "model.h"
#include "opts.h"

#define EVAL_CHUNK 64    /* positions per forward pass */


/* Row `row` of logits as one JSON line: its top k (ids by logit, ties to
 * the lower id) and the logsumexp over the vocabulary. */
static void
eval_print(int32_t pos, const float *row, int32_t V, int k, int32_t *top)
{
    double mx = -INFINITY, sum = 0;
    int    n = 0;

    for (int32_t v = 0; v < V; v++) {
        int i;

        mx = row[v] > mx ? row[v] : mx;
        /* insertion into the descending top list */
        if (n == k && !(row[v] > row[top[n - 1]])) {
            continue;
        }
        i = n < k ? n++ : n - 1;
        while (i > 0 && row[v] > row[top[i - 1]]) {
            top[i] = top[i - 1];
            i--;
        }
        top[i] = v;
    }
    for (int32_t v = 0; v < V; v++) {
        sum += exp((double) row[v] - mx);
    }
    printf("{\"pos\": %d, \"top\": [", pos);
    for (int i = 0; i < n; i++) {
        printf(isfinite(row[top[i]]) ? "%s[%d, %.6f]" : "%s[%d, null]",
               i ? ", " : "", top[i], (double) row[top[i]]);
    }
    if (isfinite(mx + log(sum))) {
        printf("], \"logsumexp\": %.6f}\n", mx + log(sum));
    } else {
        printf("], \"logsumexp\": null}\n");
    }
}


/* --ids: ids in [0, V), separated by spaces, commas or newlines; NULL
 * with *n -1 after a message (bad input), or 0 when out of memory. */
static int32_t *
parse_ids(const char *ids_s, int32_t V, int *n)
{
    int32_t    *ids = NULL;
    int         cap = 0;
    const char *p;
    char       *end;

    *n = 0;
    for (p = ids_s;;) {
        long v;

        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= V) {
            fprintf(stderr, "nalar eval: --ids: '%.20s' is not a token id "
                    "(0 .. %d)\n", p, V - 1);
            free(ids);
            *n = -1;
            return NULL;
        }
        if (*n == cap) {
            int32_t *q;

            cap = cap ? 2 * cap : 256;
            q = realloc(ids, (size_t) cap * sizeof(int32_t));
            if (q == NULL) {
                fprintf(stderr, "nalar: out of memory\n");
                free(ids);
                *n = 0;
                return NULL;
            }
            ids = q;
        }
        ids[(*n)++] = (int32_t) v;
        p = end;
    }
    if (*n == 0) {
        fprintf(stderr, "nalar eval: --ids holds no id\n");
        free(ids);
        *n = -1;
        return NULL;
    }
    return ids;
}


/* --lora PATH[:SCALE]: the adapter loaded for m and attached to be as
 * id 1 (*out: the adapter, for the caller to free after the backend).
 * 0, or the command's exit status after a message: 2 for a bad argument,
 * 1 for a file that does not load. */
static int
attach_lora(const nalar_model *m, nalar_backend *be, const char *spec,
            nalar_lora **out)
{
    const char *colon = strrchr(spec, ':');
    char       *path, *end;
    double      scale = 1;
    nalar_err   err;

    path = strdup(spec);
    if (path == NULL) {
        fprintf(stderr, "nalar: out of memory\n");
        return 1;
    }
    if (colon != NULL) {
        path[colon - spec] = '\0';
        scale = strtod(colon + 1, &end);
        if (end == colon + 1 || *end != '\0' || !(scale >= 1e-6)
            || !(scale <= 1e6))
        {
            fprintf(stderr, "nalar eval: --lora %s: the scale is a number "
                    "from 1e-6 to 1e6\n", spec);
            free(path);
            return 2;
        }
    }
    if (be->lora_attach == NULL) {
        fprintf(stderr, "nalar eval: the %s backend does not serve LoRA "
                "adapters\n", be->name);
        free(path);
        return 2;
    }
    *out = nalar_lora_load(m, "eval", path, (float) scale, &err);
    free(path);
    if (*out == NULL || be->lora_attach(be, 1, *out, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    return 0;
}


int
nalar_cmd_eval(int argc, char **argv)
{
    const char         *model = NULL, *ids_s = NULL, *act = NULL;
    const char         *kvt = NULL;
    const char         *lora_s = NULL;
    int                 top_k = 16, n = 0, rc = 1;
    nalar_backend_opts  bo;
    nalar_model        *m = NULL;
    nalar_backend      *be = NULL;
    nalar_kv_pool       kv;
    nalar_seq_kv        s;
    nalar_err           err;
    int32_t            *ids = NULL, *top = NULL;
    float              *logits = NULL;
    nalar_lora         *lora = NULL;

    memset(&bo, 0, sizeof(bo));
    memset(&kv, 0, sizeof(kv));
    nalar_seq_kv_init(&s);
    {
        const nalar_opt opts[] = {
            { "-m", NULL, NALAR_OPT_STR, &model, NULL, 0 },
            { "--ids", NULL, NALAR_OPT_STR, &ids_s, NULL, 0 },
            { "--top", NULL, NALAR_OPT_INT, &top_k, NULL, 0 },
            { "--backend", NULL, NALAR_OPT_STR, &bo.name, NULL, 0 },
            { "--device", NULL, NALAR_OPT_INT, &bo.device, NULL, 0 },
            { "-t", "--threads", NALAR_OPT_INT, &bo.n_threads, NULL, 0 },
            { "--cpu-activations", NULL, NALAR_OPT_STR, &act, NULL, 0 },
            { "--kv-type", NULL, NALAR_OPT_STR, &kvt, NULL, 0 },
            { "--lora", NULL, NALAR_OPT_STR, &lora_s, NULL, 0 },
        };
        int             kt;

        if (NALAR_OPTS_PARSE("eval", argc, argv, opts) != 0) {
            return 2;
        }
        bo.act_i16 = nalar_opt_activations("eval", act, bo.name);
        kt = nalar_opt_kv_type("eval", kvt);
        if (bo.act_i16 < 0 || kt < 0) {
            return 2;
        }
        bo.kv_type = (ggml_type) kt;
    }
    if (model == NULL || ids_s == NULL || top_k < 1) {
        fprintf(stderr, "nalar eval: -m MODEL and --ids \"ID ...\" are "
                "required, and --top is at least 1\n");
        return 2;
    }
    m = nalar_model_load(model, &err);
    if (m == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    top_k = top_k < m->cfg.n_vocab ? top_k : m->cfg.n_vocab;
    ids = parse_ids(ids_s, m->cfg.n_vocab, &n);
    if (ids == NULL) {
        rc = n < 0 ? 2 : 1;
        goto done;
    }
    be = nalar_backend_create(m, &bo, &err);
    if (be == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        goto done;
    }
    if (lora_s != NULL) {
        rc = attach_lora(m, be, lora_s, &lora);
        if (rc != 0) {
            goto done;
        }
        rc = 1;
    }
    top = malloc((size_t) top_k * sizeof(int32_t));
    logits = nalar_alloc_lines((size_t) EVAL_CHUNK * m->cfg.n_vocab
                               * sizeof(float));
    snprintf(err.msg, sizeof(err.msg), "out of memory");
    if (top == NULL || logits == NULL
        || nalar_kv_pool_init(&kv, (n + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK,
                              m->cfg.n_layers,
                              m->cfg.n_kv_heads * m->cfg.head_dim, &err) != 0
        || be->kv_alloc(be, &kv, &err) != 0
        || nalar_seq_kv_reserve(&kv, &s, n) != 0)
    {
        fprintf(stderr, "nalar: %s\n", err.msg);
        goto done;
    }
    /* teacher-forced: chunks of the ids, each position's logits */
    for (int32_t t0 = 0; t0 < n; t0 += EVAL_CHUNK) {
        int32_t       c = n - t0 < EVAL_CHUNK ? n - t0 : EVAL_CHUNK;
        int32_t       pos[EVAL_CHUNK];
        int8_t        want[EVAL_CHUNK];
        nalar_seq_kv *seq[EVAL_CHUNK];
        int32_t       adapter[EVAL_CHUNK];
        nalar_batch   b;

        for (int32_t i = 0; i < c; i++) {
            pos[i] = t0 + i;
            want[i] = 1;
            seq[i] = &s;
            adapter[i] = 1;
        }
        b.n_tokens = c;
        b.tokens = ids + t0;
        b.pos = pos;
        b.seq = seq;
        b.want_logits = want;
        b.n_logits = c;
        b.adapter = lora != NULL ? adapter : NULL;
        if (be->forward(be, &kv, &b, logits, &err) != 0) {
            fprintf(stderr, "nalar: %s\n", err.msg);
            goto done;
        }
        for (int32_t i = 0; i < c; i++) {
            eval_print(t0 + i, logits + (size_t) i * m->cfg.n_vocab,
                       m->cfg.n_vocab, top_k, top);
        }
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    nalar_seq_kv_release(&kv, &s);
    if (kv.k != NULL) {
        be->kv_free(be, &kv);
    }
    nalar_kv_pool_free(&kv);
    if (be != NULL) {
        be->destroy(be);
    }
    nalar_lora_destroy(lora);      /* the backend read it until now */
    free(logits);
    free(top);
    free(ids);
    nalar_model_destroy(m);
    return rc;
}
