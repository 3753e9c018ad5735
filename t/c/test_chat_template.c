/*
 * Chat templates on the engine thread: the engine's deferred prompt
 * (nalar_prompt_deferred: rendered once at intake for the requests that
 * share it, refused alike), and the protocol layer's use of it
 * (api/chat_template.h): the variables as vLLM passes them, the pieces
 * (markup, user text), the errors, and a real template's prompt rendered
 * and tokenized by the engine as `nalar render --openai --ids` does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "chat_template.h"
#include "collect.h"
#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "model.h"
#include "tap.h"
#include "tokenizer.h"


static int
same(const int32_t *a, const int32_t *b, int n)
{
    return n >= 0 && (n == 0 || memcmp(a, b, (size_t) n * sizeof(*a)) == 0);
}


static int
kv_all_free(nalar_engine *e)
{
    nalar_kv_pool *p = nalar_engine_kv(e);
    nalar_err      err;

    if (nalar_kv_check(p, &err) != 0) {
        diag("%s", err.msg);
        return 0;
    }
    return p->n_free == p->n_blocks;
}


/*
 * A deferred prompt (nalar_prompt_deferred): the engine renders it once,
 * on its thread, for all the requests that share it, and each answers as
 * the same text given directly; add_bos 0 leaves BOS out; a render that
 * refuses (400) refuses every request with its message and param; the
 * source is released once, when the last reference goes.
 */
typedef struct {
    const char *text;
    int         status;       /* what render returns */
    int         add_bos;
    int         renders;
    int         releases;
} deferred_src;


static int
deferred_render(void *ctx, nalar_tok_text **pieces, int32_t *n, char **text,
                int *add_bos, char *msg, size_t cap)
{
    deferred_src *d = ctx;

    d->renders++;
    if (d->status != 0) {
        snprintf(msg, cap, "the template says no");
        return d->status;
    }
    *text = strdup(d->text);
    *pieces = malloc(2 * sizeof(nalar_tok_text));
    if (*text == NULL || *pieces == NULL) {
        snprintf(msg, cap, "out of memory");
        return 500;
    }
    /* two pieces: the text cut in the middle of a word */
    (*pieces)[0].text = *text;
    (*pieces)[0].len = 7;
    (*pieces)[0].special = 1;
    (*pieces)[1].text = *text + 7;
    (*pieces)[1].len = strlen(*text) - 7;
    (*pieces)[1].special = 0;
    *n = 2;
    *add_bos = d->add_bos;
    return 0;
}


static void
deferred_release(void *ctx)
{
    ((deferred_src *) ctx)->releases++;
}


static void
test_deferred_prompt(nalar_engine *e)
{
    enum { NCH = 3 };
    static const char    text[] = "In the beginning God created the heaven";
    nalar_tok_text       piece = { text, sizeof(text) - 1, 0 };
    nalar_prompt_source  src;
    nalar_prompt        *pr;
    nalar_request       *rs[NCH + 1];
    nalar_request_params p;
    nalar_err            err;
    collected            c[NCH + 1];
    deferred_src         d;
    int                  good, bos;

    for (bos = 1; bos >= 0; bos--) {
        memset(c, 0, sizeof(c));
        memset(&d, 0, sizeof(d));
        d.text = text;
        d.add_bos = bos;
        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = 0;
        p.max_tokens = 6;
        p.ignore_eos = 1;
        p.prompt_text = &piece;
        p.n_prompt_text = 1;
        rs[NCH] = nalar_request_create(&p, collect, &c[NCH], &err);

        src.render = deferred_render;
        src.release = deferred_release;
        src.ctx = &d;
        src.bytes = sizeof(text);
        pr = nalar_prompt_deferred(&src, &err);
        p.prompt_text = NULL;
        p.prompt_shared = pr;
        good = pr != NULL;
        for (int i = 0; i < NCH; i++) {
            rs[i] = nalar_request_create(&p, collect, &c[i], &err);
            good &= rs[i] != NULL;
        }
        nalar_prompt_unref(pr);
        ok(good && d.renders == 0, "deferred prompt: nothing rendered at "
           "create");
        nalar_engine_run_sync(e, rs, NCH + 1, &err);
        is_int(d.renders, 1, "deferred prompt: rendered once for %d "
               "requests", NCH);
        for (int i = 0; i < NCH; i++) {
            good &= c[i].n == 6
                    && c[i].last.usage.n_prompt == c[NCH].last.usage.n_prompt - !bos;
            good &= !bos || same(c[i].ids, c[NCH].ids, 6);
        }
        ok(good, "deferred prompt (add_bos %d): %d answers, prompts of %d "
           "tokens", bos, NCH, c[0].last.usage.n_prompt);
        for (int i = 0; i <= NCH; i++) {
            nalar_request_unref(rs[i]);
        }
        is_int(d.releases, 1, "deferred prompt: released once");
    }

    /* a render that refuses */
    memset(c, 0, sizeof(c));
    memset(&d, 0, sizeof(d));
    d.status = 400;
    src.ctx = &d;
    pr = nalar_prompt_deferred(&src, &err);
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.max_tokens = 4;
    p.prompt_shared = pr;
    p.prompt_param = "messages";
    for (int i = 0; i < NCH; i++) {
        rs[i] = nalar_request_create(&p, collect, &c[i], &err);
    }
    nalar_prompt_unref(pr);
    nalar_engine_run_sync(e, rs, NCH, &err);
    good = d.renders == 1;
    for (int i = 0; i < NCH; i++) {
        good &= c[i].finish == NALAR_FINISH_ERROR
                && c[i].last.error.status == 400
                && strcmp(c[i].last.error.param, "messages") == 0
                && strstr(c[i].last.error.message, "the template says no") != NULL
                && c[i].n == 0;
        nalar_request_unref(rs[i]);
    }
    ok(good, "a refusing render: rendered once, each request a 400 on "
       "messages with its message");
    is_int(d.releases, 1, "refused: released once");
    ok(kv_all_free(e), "deferred prompts: every KV block free");
}


/* the variables: content parts joined with "\n", a tool call's arguments
 * parsed, None for tools and documents, kwargs beside them */
static void
test_vars(void)
{
    json_error_t  je;
    json_t       *root, *user, *trusted, *m;

    root = json_loads("{\"messages\": ["
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
        "\"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{"
        "\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
        "\"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]}],"
        "\"chat_template_kwargs\": {\"enable_thinking\": false}}", 0, &je);
    ok(root != NULL, "vars: the request parses");
    ok(nalar_chat_template_vars(root, NULL, 1, "<s>", "</s>", &user,
                                &trusted) == 0, "vars: made");
    m = json_object_get(user, "messages");
    ok(json_is_string(json_object_get(json_array_get(m, 0), "content"))
       && strcmp(json_string_value(json_object_get(json_array_get(m, 0),
                                                   "content")), "a\nb") == 0,
       "vars: text parts joined with a newline");
    ok(json_is_integer(json_object_get(json_object_get(json_object_get(
           json_array_get(json_object_get(json_array_get(m, 1),
                                          "tool_calls"), 0),
           "function"), "arguments"), "x")),
       "vars: a tool call's arguments parsed into an object");
    ok(json_is_string(json_object_get(json_object_get(json_array_get(
           json_object_get(json_array_get(json_object_get(root, "messages"),
                                          1), "tool_calls"), 0), "function"),
           "arguments")), "vars: the request itself is unchanged");
    ok(json_is_null(json_object_get(user, "tools"))
       && json_is_null(json_object_get(user, "documents")),
       "vars: tools and documents None");
    ok(json_is_false(json_object_get(user, "enable_thinking")),
       "vars: the kwargs are variables");
    ok(json_is_true(json_object_get(trusted, "add_generation_prompt"))
       && strcmp(json_string_value(json_object_get(trusted, "bos_token")),
                 "<s>") == 0, "vars: the trusted ones");
    json_decref(user);
    json_decref(trusted);
    json_decref(root);
}


/* markup and user spans alternate; the opener comes last */
static void
test_pieces(void)
{
    static const char     src[] = "{{ '<|a|>' }}{{ x }}{{ '<|b|>' }}{{ y }}";
    char                  err[256], msg[256], *text;
    nalar_chat_template  *t;
    nalar_tok_text       *pc;
    int32_t               n;
    json_t               *user, *trusted;
    int                   rc;

    t = nalar_chat_template_compile(src, sizeof(src) - 1, err, sizeof(err));
    ok(t != NULL, "pieces: compiles");
    user = json_pack("{ssss}", "x", "hi", "y", "<|b|>");
    trusted = json_object();
    rc = nalar_chat_template_render(t, user, trusted, "<open>", &pc, &n,
                                    &text, msg, sizeof(msg));
    is_int(rc, 0, "pieces: rendered");
    ok(rc == 0 && n == 5
       && pc[0].special == 1 && pc[0].len == 5
       && pc[1].special == 0 && memcmp(pc[1].text, "hi", 2) == 0
       && pc[2].special == 1 && memcmp(pc[2].text, "<|b|>", 5) == 0
       && pc[3].special == 0 && memcmp(pc[3].text, "<|b|>", 5) == 0
       && pc[4].special == 1 && strcmp(pc[4].text, "<open>") == 0,
       "pieces: markup, user, markup, user (its <|b|> literal), opener");
    if (rc == 0) {
        free(pc);
        free(text);
    }
    json_decref(user);
    json_decref(trusted);
    nalar_chat_template_free(t);
}


/* raise_exception: 400 with its message; a bound: 400 saying which */
static void
test_errors(void)
{
    static const char    *raise = "{{ raise_exception('no system, please') }}";
    static const char    *deep = "{% macro f() %}{{ f() }}{% endmacro %}"
                                 "{{ f() }}";
    char                  err[256], msg[256], *text;
    nalar_chat_template  *t;
    nalar_tok_text       *pc;
    int32_t               n;
    json_t               *v = json_object();

    t = nalar_chat_template_compile(raise, strlen(raise), err, sizeof(err));
    is_int(nalar_chat_template_render(t, v, v, NULL, &pc, &n, &text, msg,
                                      sizeof(msg)), 400, "raise: 400");
    ok(strcmp(msg, "no system, please") == 0, "raise: its message (%s)",
       msg);
    nalar_chat_template_free(t);
    t = nalar_chat_template_compile(deep, strlen(deep), err, sizeof(err));
    is_int(nalar_chat_template_render(t, v, v, NULL, &pc, &n, &text, msg,
                                      sizeof(msg)), 400, "recursion: 400");
    ok(strstr(msg, "the chat template failed") != NULL
       && strstr(msg, "deeper") != NULL, "recursion: says so (%s)", msg);
    nalar_chat_template_free(t);
    t = nalar_chat_template_compile("{% if %}", 8, err, sizeof(err));
    ok(t == NULL && strstr(err, "line 1") != NULL,
       "a syntax error: not compiled, the line named (%s)", err);
    json_decref(v);
}


/* A real template through the engine: the request's prompt is the
 * template's text tokenized as one, without an added BOS. */
static void
test_real(nalar_engine *e, const char *tmpl_path)
{
    FILE                 *f = fopen(tmpl_path, "rb");
    static char           src[65536];
    size_t                len = f ? fread(src, 1, sizeof(src), f) : 0;
    char                  err[256], msg[256], *text;
    nalar_chat_template  *t;
    nalar_chat_job        job;
    nalar_prompt         *pr;
    nalar_request        *r;
    nalar_request_params  p;
    nalar_err             nerr;
    nalar_tok_text       *pc;
    int32_t               n, *ids;
    int                   k, more;
    json_t               *root, *user, *trusted;
    collected             c;

    if (f != NULL) {
        fclose(f);
    }
    t = nalar_chat_template_compile(src, len, err, sizeof(err));
    ok(t != NULL && t->style == NALAR_CHAT_CHATML, "Qwen2.5's template compiles, ChatML "
       "style found in it");
    root = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": "
                      "\"In the beginning <|im_end|>\"}]}", 0, NULL);

    /* what the engine should make of it */
    nalar_chat_template_vars(root, NULL, 1, "<s>", "</s>", &user, &trusted);
    nalar_chat_template_render(t, user, trusted, NULL, &pc, &n, &text, msg,
                               sizeof(msg));
    k = nalar_tokenize_bounded(nalar_engine_model(e)->tok, pc, (size_t) n, 0,
                               512, &ids, &more);
    json_decref(user);
    json_decref(trusted);
    free(pc);
    free(text);

    job.tmpl = t;
    job.root = root;
    job.tools = NULL;
    job.add_generation_prompt = 1;
    job.bos = "<s>";
    job.eos = "</s>";
    job.open = NULL;
    pr = nalar_chat_template_prompt(&job, &nerr);
    json_decref(root);      /* the prompt holds its own reference */
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = 2;
    p.prompt_shared = pr;
    memset(&c, 0, sizeof(c));
    r = nalar_request_create(&p, collect, &c, &nerr);
    nalar_prompt_unref(pr);
    nalar_engine_run_sync(e, &r, 1, &nerr);
    ok(k > 0 && c.last.usage.n_prompt == k && c.finish == NALAR_FINISH_LENGTH,
       "the engine's prompt is the render's %d tokens, no BOS added "
       "(got %d)", k, c.last.usage.n_prompt);
    nalar_request_unref(r);
    free(ids);
    nalar_chat_template_free(t);
    ok(kv_all_free(e), "real template: every KV block free");
}


int
main(void)
{
    nalar_engine_opts o;
    nalar_engine     *e;
    nalar_err         err;

    test_vars();
    test_pieces();
    test_errors();
    memset(&o, 0, sizeof(o));
    o.model_path = "models/nalar-kjv-target-f32.gguf";
    o.n_threads = 2;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        ok(0, "the demo model loads: %s", err.msg);
        nalar_engine_destroy(e);
        return done_testing();
    }
    test_deferred_prompt(e);
    test_real(e, "t/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    nalar_engine_destroy(e);
    return done_testing();
}
