/*
 * Chat-template benchmark (bench/template.sh runs it): what intake spends
 * on a chat prompt made by a Jinja template (the variables, the render,
 * the pieces, the tokenizing: the same calls the engine thread makes,
 * api/chat_template.c) against the prefill of that prompt on the same
 * model, both in one process, alternated, medians over ROUNDS.  The
 * conversation has tools and grows turn by turn until its prompt has at
 * least TOKENS tokens.  Prints markdown.
 *
 *   build/bench/template MODEL TEMPLATE TOKENS ROUNDS
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "clock.h"
#include "engine.h"
#include "model.h"
#include "../t/c/collect.h"

static const char  *lines[] = {
    "And God said, Let there be light: and there was light. ",
    "The heavens declare the glory of God; and the firmament sheweth his "
    "handywork. ",
    "A soft answer turneth away wrath: but grievous words stir up anger. ",
    "To every thing there is a season, and a time to every purpose under "
    "the heaven. ",
};


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


static char *
slurp(const char *path, size_t *len)
{
    FILE  *f = fopen(path, "rb");
    char  *buf;
    long   n;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0) {
        if (f != NULL) {
            fclose(f);
        }
        return NULL;
    }
    rewind(f);
    buf = malloc((size_t) n + 1);
    if (buf != NULL && fread(buf, 1, (size_t) n, f) != (size_t) n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
        *len = (size_t) n;
    }
    return buf;
}


/* The request body: three tools, a system message, then turns of user
 * and assistant (one calls a tool, one tool result) up to `turns`. */
static json_t *
conversation(int turns)
{
    json_t *msgs = json_array(), *tools = json_array();
    char    text[2048];

    for (int i = 0; i < 3; i++) {
        char name[32];

        snprintf(name, sizeof(name), "lookup_%d", i);
        json_array_append_new(tools, json_pack(
            "{ss s{ss ss s{ss s{s{ss ss} s{ss s[sss]}} s[s]}}}",
            "type", "function", "function", "name", name,
            "description", "Look up a verse by book, chapter and verse",
            "parameters", "type", "object", "properties",
            "reference", "type", "string", "description", "e.g. John 3:16",
            "version", "type", "string", "enum", "KJV", "ASV", "WEB",
            "required", "reference"));
    }
    json_array_append_new(msgs, json_pack("{ssss}", "role", "system",
                          "content", "You are a careful reader of the King "
                          "James Bible."));
    for (int t = 0; t < turns; t++) {
        text[0] = '\0';
        for (int k = 0; k < 3; k++) {
            strcat(text, lines[(t + k) % 4]);
        }
        json_array_append_new(msgs, json_pack("{ssss}", "role", "user",
                                              "content", text));
        if (t % 4 == 1) {
            json_array_append_new(msgs, json_pack(
                "{ss sn s[{ss ss s{ss ss}}]}", "role", "assistant",
                "content", "tool_calls", "id", "call_1", "type", "function",
                "function", "name", "lookup_0", "arguments",
                "{\"reference\": \"Genesis 1:3\", \"version\": \"KJV\"}"));
            json_array_append_new(msgs, json_pack(
                "{ss ss ss}", "role", "tool", "tool_call_id", "call_1",
                "content", lines[t % 4]));
        }
        json_array_append_new(msgs, json_pack("{ssss}", "role", "assistant",
                                              "content", lines[(t + 1) % 4]));
    }
    json_array_append_new(msgs, json_pack("{ssss}", "role", "user",
                                          "content", "And what then?"));
    return json_pack("{soso}", "messages", msgs, "tools", tools);
}


/* What intake does with a template: seconds; the ids in *ids. */
static double
render_tokenize(const nalar_chat_template *t, json_t *root,
                const nalar_tokenizer *tok, int32_t **ids, int *n)
{
    json_t          *user, *trusted;
    nalar_tok_text  *pieces;
    int32_t          np;
    char            *text, msg[256];
    int              more;
    double           t0 = nalar_now_s();

    if (nalar_chat_template_vars(root, json_object_get(root, "tools"), 1,
                                 "<s>", "</s>", &user, &trusted) != 0
        || nalar_chat_template_render(t, user, trusted, NULL, &pieces, &np,
                                      &text, msg, sizeof(msg)) != 0)
    {
        fprintf(stderr, "render failed: %s\n", msg);
        exit(1);
    }
    *n = nalar_tokenize_bounded(tok, pieces, (size_t) np, 0, 1 << 20, ids,
                                &more);
    t0 = nalar_now_s() - t0;
    json_decref(user);
    json_decref(trusted);
    free(pieces);
    free(text);
    return t0;
}


static double
prefill(nalar_engine *e, const int32_t *ids, int n)
{
    nalar_request        *r;
    nalar_request_params  p;
    nalar_err             err;
    static collected      c;
    double                t0;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = 1;
    p.no_cache = 1;
    memset(&c, 0, sizeof(c));
    r = nalar_request_create(&p, collect, &c, &err);
    if (r == NULL) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    t0 = nalar_now_s();
    nalar_engine_run_sync(e, &r, 1, &err);
    t0 = nalar_now_s() - t0;
    if (c.finish != NALAR_FINISH_LENGTH && c.finish != NALAR_FINISH_STOP) {
        fprintf(stderr, "prefill failed: %s\n", c.last.error.message);
        exit(1);
    }
    nalar_request_unref(r);
    return t0;
}


int
main(int argc, char **argv)
{
    nalar_engine_opts    o;
    nalar_engine        *e;
    nalar_err            err;
    nalar_chat_template *t;
    json_t              *root = NULL;
    char                *src, msg[512];
    size_t               len;
    int32_t             *ids = NULL;
    int                  n = 0, want, rounds, turns;
    double              *tr, *tp;

    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL TEMPLATE TOKENS ROUNDS\n", argv[0]);
        return 2;
    }
    want = atoi(argv[3]);
    rounds = atoi(argv[4]);
    src = slurp(argv[2], &len);
    t = src ? nalar_chat_template_compile(src, len, msg, sizeof(msg)) : NULL;
    if (t == NULL) {
        fprintf(stderr, "%s: %s\n", argv[2], src ? msg : "cannot read");
        return 1;
    }
    memset(&o, 0, sizeof(o));
    o.model_path = argv[1];
    o.prefix_cache = 0;
    o.max_batch_tokens = 8192;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }

    /* the conversation: as many turns as make the tokens wanted */
    for (turns = 1; n < want; turns++) {
        json_decref(root);
        free(ids);
        root = conversation(turns);
        render_tokenize(t, root, nalar_engine_model(e)->tok, &ids, &n);
    }

    tr = calloc((size_t) rounds, sizeof(double));
    tp = calloc((size_t) rounds, sizeof(double));
    for (int i = 0; i < rounds; i++) {
        int32_t *again;
        int      m;

        tr[i] = render_tokenize(t, root, nalar_engine_model(e)->tok, &again,
                                &m);
        free(again);
        tp[i] = prefill(e, ids, n);
    }
    printf("| prompt tokens | messages | render + tokenize (ms) | prefill "
           "(ms) | ratio |\n|---:|---:|---:|---:|---:|\n");
    {
        double r = median(tr, rounds), p = median(tp, rounds);

        printf("| %d | %zu | %.3f | %.1f | %.2f%% |\n", n,
               json_array_size(json_object_get(root, "messages")), r * 1e3,
               p * 1e3, 100 * r / p);
    }
    free(tr);
    free(tp);
    free(ids);
    json_decref(root);
    nalar_engine_destroy(e);
    nalar_chat_template_free(t);
    free(src);
    return 0;
}
