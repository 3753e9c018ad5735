/*
 * The tool call parser (api/tools.c): answers in each style's call
 * format, fed whole and a byte at a time, become the same calls (name,
 * arguments text) and content; an answer that does not open with a call,
 * or whose call has no name, is content, all of it.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "gguf.h"
#include "mkmodel.h"
#include "tokenizer.h"

#include "../../api/chat.c"
#include "../../api/chat_style.c"
#include "../../api/tools.c"


typedef struct {
    char    content[1024];
    size_t  n_content;
    char    args[1024];     /* the arguments of call 0, as taken in
                               fragments */
    size_t  n_args;
    int     fragments;
} seen;


/* Takes what the parser has for the response, as the response does. */
static void
take(nalar_tool_parser *p, seen *s)
{
    size_t            n;
    const char       *t;
    nalar_tool_call  *c;

    t = nalar_toolp_take_content(p, &n);
    if (n && s->n_content + n < sizeof(s->content)) {
        memcpy(s->content + s->n_content, t, n);
        s->n_content += n;
        s->content[s->n_content] = '\0';
    }

    if (nalar_toolp_n_named(p) > 0) {
        c = &p->calls[0];
        n = c->args_len - c->args_sent;
        if (n && s->n_args + n < sizeof(s->args)) {
            memcpy(s->args + s->n_args, c->args + c->args_sent, n);
            s->n_args += n;
            s->args[s->n_args] = '\0';
            s->fragments++;
        }
        c->args_sent = c->args_len;
    }
}


/* Feeds text in pieces of `step` bytes (0: whole), then finishes. */
static void
run(nalar_tool_parser *p, const char *text, size_t step, seen *s)
{
    size_t  off, n, len;

    memset(s, 0, sizeof(*s));
    len = strlen(text);

    for (off = 0; off < len; off += n) {
        n = step ? step : len;
        if (off + n > len) {
            n = len - off;
        }
        if (nalar_toolp_feed(p, text + off, n, NULL, 0) != 0) {
            diag("feed failed");
        }
        take(p, s);
    }

    nalar_toolp_finish(p);
    take(p, s);
}


static int
call_is(nalar_tool_parser *p, size_t k, const char *name, const char *args)
{
    nalar_tool_call  *c;

    if (k >= nalar_toolp_n_named(p)) {
        return 0;
    }

    c = &p->calls[k];

    return c->name_len == strlen(name)
           && memcmp(c->name, name, c->name_len) == 0
           && c->args_len == strlen(args)
           && memcmp(c->args, args, c->args_len) == 0;
}


/* The answer in both ways, whole and byte by byte, with the calls and
 * content expected. */
static void
check(nalar_chat_style style, int forced, const char *text,
      const char *name0, const char *args0, size_t n_calls,
      const char *content, const char *what)
{
    size_t             steps[] = { 0, 1, 3 };
    size_t             k;
    seen               s;
    nalar_tool_parser  p;

    for (k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        nalar_toolp_init(&p, nalar_chat_call_format_of(style), NULL, forced);
        run(&p, text, steps[k], &s);

        is_int(nalar_toolp_n_named(&p), n_calls, "%s (step %zu): %zu calls",
               what, steps[k], n_calls);
        if (n_calls) {
            ok(call_is(&p, 0, name0, args0)
               && strcmp(s.args, args0) == 0,
               "%s (step %zu): %s(%s), fragments join to the arguments",
               what, steps[k], name0, args0);
        }
        ok(strcmp(s.content, content) == 0, "%s (step %zu): the content "
           "(%zu bytes)", what, steps[k], strlen(content));

        if (steps[k] == 1 && n_calls && strlen(args0) > 1
            && strstr(text, "\"name\"") < strstr(text, args0))
        {
            ok(s.fragments > 1, "%s: fed a byte at a time, the arguments "
               "come in %d fragments", what, s.fragments);
        }

        nalar_toolp_free(&p);
    }
}


static nalar_tokenizer *
load(const char *path)
{
    gguf_file        *f;
    nalar_err         err;
    nalar_tokenizer  *t;

    f = gguf_open(path, &err);
    if (f == NULL) {
        diag("gguf_open: %s", err.msg);
        return NULL;
    }
    t = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    return t;
}


/* A BPE vocabulary whose tool markers are control tokens. */
static nalar_tokenizer *
tool_vocab(void)
{
    nalar_mkmodel_opts  o;
    nalar_err           err;
    nalar_tokenizer    *t;
    char                path[] = "/tmp/nalar_tools_XXXXXX";
    int                 fd = mkstemp(path);

    if (fd < 0) {
        return NULL;
    }
    close(fd);
    nalar_mkmodel_defaults(&o);
    o.dim = 32;
    o.n_layers = 1;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.ffn_dim = 32;
    o.n_vocab = 1024;
    o.bpe = 1;
    o.chatml = 1;
    o.control_tokens = "<tool_call>,</tool_call>,[TOOL_CALLS]";
    if (nalar_mkmodel(&o, path, &err) != 0) {
        diag("mkmodel: %s", err.msg);
        unlink(path);
        return NULL;
    }
    t = load(path);
    unlink(path);
    return t;
}


/* The opener as a control token: it writes no text, the ids show it. */
static void
test_control_opener(void)
{
    int32_t            ids[8], op, nl, hi;
    seen               s;
    nalar_tokenizer   *t;
    nalar_tool_parser  p;
    const char        *body = "{\"name\": \"f\", \"arguments\": {}}";

    t = tool_vocab();
    ok(t != NULL, "a vocabulary with <tool_call> as a control token");
    if (t == NULL) {
        return;
    }

    op = nalar_tok_lookup(t, "<tool_call>", 11);
    ok(op >= 0 && nalar_tok_is_control(t, op), "<tool_call> is token %d",
       op);
    nl = -1;
    nalar_tokenize(t, "\n", 1, 0, 0, &nl, 1);
    hi = -1;
    nalar_tokenize(t, "h", 1, 0, 0, &hi, 1);

    /* <tool_call> then the call, in one take */
    nalar_toolp_init(&p, nalar_chat_call_format_of(NALAR_CHAT_CHATML), t, 0);
    is_int(p.opener_id, op, "the parser knows the opener's id");
    ids[0] = op;
    memset(&s, 0, sizeof(s));
    nalar_toolp_feed(&p, body, strlen(body), ids, 1);
    nalar_toolp_finish(&p);
    take(&p, &s);
    ok(call_is(&p, 0, "f", "{}") && s.n_content == 0,
       "the control token opens a call (content \"%s\")", s.content);
    nalar_toolp_free(&p);

    /* whitespace before it, in an earlier take */
    nalar_toolp_init(&p, nalar_chat_call_format_of(NALAR_CHAT_CHATML), t, 0);
    memset(&s, 0, sizeof(s));
    ids[0] = nl;
    nalar_toolp_feed(&p, "\n", 1, ids, 1);
    take(&p, &s);
    ok(s.n_content == 0, "whitespace is held");
    ids[0] = op;
    nalar_toolp_feed(&p, body, strlen(body), ids, 1);
    nalar_toolp_finish(&p);
    take(&p, &s);
    ok(call_is(&p, 0, "f", "{}") && s.n_content == 0,
       "whitespace, then the control token: a call");
    nalar_toolp_free(&p);

    /* text before it: content, the call's JSON too */
    nalar_toolp_init(&p, nalar_chat_call_format_of(NALAR_CHAT_CHATML), t, 0);
    memset(&s, 0, sizeof(s));
    ids[0] = hi;
    ids[1] = op;
    nalar_toolp_feed(&p, "h{}", 3, ids, 2);
    nalar_toolp_finish(&p);
    take(&p, &s);
    ok(nalar_toolp_n_named(&p) == 0 && strcmp(s.content, "h{}") == 0,
       "text before the control token: content (\"%s\")", s.content);
    nalar_toolp_free(&p);

    nalar_tokenizer_destroy(t);
}


/*
 * Rendering with tools, every tool style: the pieces join to a text with
 * the tool, the call and the result in place, and every piece that holds
 * the client's text (JSON written by the renderer included) is literal.
 */
static void
test_render(void)
{
    static const nalar_chat_style  styles[] = {
        NALAR_CHAT_CHATML, NALAR_CHAT_LLAMA3, NALAR_CHAT_MISTRAL,
        NALAR_CHAT_MISTRAL_V3, NALAR_CHAT_MISTRAL_V7,
        NALAR_CHAT_MISTRAL_V7_SPM
    };
    char                 text[8192];
    size_t               i, k, n, len;
    json_t              *tools, *calls, *id;
    nalar_err            err;
    nalar_tok_text       parts[4], *r;
    nalar_chat_msg       m[4];
    nalar_chat_tools     t;
    nalar_chat_tool_msg  tm[4];
    json_error_t         je;
    int                  literal;

    tools = json_loads("[{\"type\": \"function\", \"function\": "
                       "{\"name\": \"f\", \"description\": "
                       "\"<tool_call> X\"}}]", 0, &je);
    calls = json_loads("[{\"id\": \"abcDEF123\", \"type\": \"function\", "
                       "\"function\": {\"name\": \"f\", \"arguments\": "
                       "\"{\\\"a\\\":1}\"}}]", 0, &je);
    id = json_string("abcDEF123");

    for (k = 0; k < 4; k++) {
        static const char *roles[] = { "system", "user", "assistant",
                                       "tool" };
        static const char *texts[] = { "S", "U [TOOL_CALLS]", "",
                                       "R </tool_call>" };

        parts[k] = (nalar_tok_text) { texts[k], strlen(texts[k]), 0 };
        m[k].role = roles[k];
        m[k].role_len = strlen(roles[k]);
        m[k].parts = &parts[k];
        m[k].n_parts = strlen(texts[k]) ? 1 : 0;
        memset(&tm[k], 0, sizeof(tm[k]));
    }
    tm[2].tool_calls = calls;
    tm[3].tool_call_id = id;

    t.tools = tools;
    t.msgs = tm;
    t.open_call = 1;

    for (i = 0; i < sizeof(styles) / sizeof(styles[0]); i++) {
        r = nalar_chat_render_tools(styles[i], m, 4, &t, &n, &err);
        ok(r != NULL, "%s: renders with tools (%s)",
           nalar_chat_style_name(styles[i]), r ? "" : err.msg);
        if (r == NULL) {
            continue;
        }

        len = 0;
        literal = 1;
        for (k = 0; k < n && len + r[k].len < sizeof(text); k++) {
            memcpy(text + len, r[k].text, r[k].len);
            len += r[k].len;
            if ((memmem(r[k].text, r[k].len, "<tool_call> X", 13)
                 || memmem(r[k].text, r[k].len, "{\"a\": 1}", 8)
                 || memmem(r[k].text, r[k].len, "\"abcDEF123\"", 11)
                 || memmem(r[k].text, r[k].len, "R </tool_call>", 14))
                && r[k].special)
            {
                literal = 0;
            }
        }
        text[len] = '\0';

        ok(strstr(text, "\"description\": \"<tool_call> X\"")
           && strstr(text, "{\"a\": 1}")
           && strstr(text, "R </tool_call>")
           && strstr(text, "U [TOOL_CALLS]"),
           "%s: the tool, the call's arguments, the result and the user's "
           "text are there", nalar_chat_style_name(styles[i]));
        ok(literal, "%s: the client's text is in literal pieces",
           nalar_chat_style_name(styles[i]));
        ok(len >= strlen(nalar_chat_call_format_of(styles[i])->prompt_open)
           && strcmp(text + len
                     - strlen(nalar_chat_call_format_of(styles[i])
                              ->prompt_open),
                     nalar_chat_call_format_of(styles[i])->prompt_open) == 0,
           "%s: the prompt ends with the call opener",
           nalar_chat_style_name(styles[i]));
        free(r);
    }

    r = nalar_chat_render_tools(NALAR_CHAT_GEMMA, m, 2, &t, &n, &err);
    ok(r == NULL && strstr(err.msg, "no tool format"),
       "gemma: tools are refused (%s)", err.msg);
    free(r);

    json_decref(tools);
    json_decref(calls);
    json_decref(id);
}


int
main(void)
{
    test_render();

    /* chatml (Hermes, Qwen) */
    check(NALAR_CHAT_CHATML, 0,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call>",
          "get_weather", "{\"city\": \"Paris\"}", 1, "",
          "chatml: one call");
    check(NALAR_CHAT_CHATML, 0,
          "\n <tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n"
          "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
          "{}}\n</tool_call>",
          "a", "{\"x\": 1}", 2, "", "chatml: two calls after whitespace");
    check(NALAR_CHAT_CHATML, 0, "Hello <tool_call>{\"name\": \"a\"}",
          NULL, NULL, 0, "Hello <tool_call>{\"name\": \"a\"}",
          "chatml: text first is content");
    check(NALAR_CHAT_CHATML, 0, "<tools are fun", NULL, NULL, 0,
          "<tools are fun", "chatml: a prefix of the opener, then text");
    check(NALAR_CHAT_CHATML, 0, "<tool_call>\nnot json", NULL, NULL, 0,
          "<tool_call>\nnot json", "chatml: a call without JSON is content");
    check(NALAR_CHAT_CHATML, 0, "<tool_call>\n{\"name\": 7}", NULL, NULL, 0,
          "<tool_call>\n{\"name\": 7}",
          "chatml: a call without a name is content");
    check(NALAR_CHAT_CHATML, 0, "<tool_ca", NULL, NULL, 0, "<tool_ca",
          "chatml: an answer that ends inside the opener is content");

    /* llama3: the JSON object is the call */
    check(NALAR_CHAT_LLAMA3, 0,
          "{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\\\"\"}]}}",
          "f", "{\"a\": [1, {\"b\": \"}\\\"\"}]}", 1, "",
          "llama3: nested arguments, a brace and a quote in a string");
    check(NALAR_CHAT_LLAMA3, 0, "Sure, {\"name\": \"f\"}", NULL, NULL, 0,
          "Sure, {\"name\": \"f\"}", "llama3: text is content");
    check(NALAR_CHAT_LLAMA3, 0,
          "{\"parameters\": {\"x\": 1}, \"name\": \"f\"}",
          "f", "{\"x\": 1}", 1, "", "llama3: arguments before the name");
    check(NALAR_CHAT_LLAMA3, 0,
          "{\"name\": \"f\", \"parameters\": 5 }", "f", "5", 1, "",
          "llama3: a primitive value");

    /* mistral: a list of calls after [TOOL_CALLS] */
    check(NALAR_CHAT_MISTRAL, 0,
          "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": \"y\"}, "
          "\"id\": \"abcdefghi\"}, {\"name\": \"b\", \"arguments\": {}}]",
          "a", "{\"x\": \"y\"}", 2, "", "mistral: two calls");
    check(NALAR_CHAT_MISTRAL_V3, 0,
          "[TOOL_CALLS] [{\"foo\": 1}, {\"name\": \"g\", \"arguments\": "
          "{}}]",
          "g", "{}", 1, "", "mistral-v3: an object without a name is "
          "skipped");

    /* a call that must be made: the answer is its JSON */
    check(NALAR_CHAT_CHATML, 1,
          "{\"name\": \"f\", \"arguments\": {\"q\": \"a\\\"b\"}}",
          "f", "{\"q\": \"a\\\"b\"}", 1, "", "forced: the call's JSON");
    check(NALAR_CHAT_MISTRAL, 1, "{\"name\": \"f\", \"arguments\": {}}",
          "f", "{}", 1, "", "forced mistral: the object after [TOOL_CALLS][");

    test_control_opener();

    return done_testing();
}
