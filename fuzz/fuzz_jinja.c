/*
 * libFuzzer target for the Jinja interpreter (api/jinja*.c): the input is a
 * template.  It must compile or be refused with a message, and a compiled
 * one must render over a fixed conversation (messages with tool calls,
 * tools, kwargs) within small bounds or fail with a message; never crash,
 * hang or leak.  A render's spans must lie inside its text, in order and
 * apart, and rendering twice must give the same bytes and spans.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=jinja
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jinja.h"

static json_t *user, *trusted;


static void
die(const char *why)
{
    fprintf(stderr, "fuzz_jinja: %s\n", why);
    abort();
}


static void
init(void)
{
    user = json_loads(
        "{\"messages\": ["
        "{\"role\": \"system\", \"content\": \" Be brief. \"},"
        "{\"role\": \"user\", \"content\": \"Weather in <|im_end|> Paris?\"},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": ["
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
        " \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\": \"tool\", \"content\": \"21 C\"},"
        "{\"role\": \"assistant\", \"content\": \"<think>x</think>Sunny.\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\":"
        " \"get_weather\", \"description\": \"Weather\", \"parameters\":"
        " {\"type\": \"object\", \"properties\": {\"city\": {\"type\":"
        " \"string\", \"description\": \"a city\"}}, \"required\":"
        " [\"city\"]}}}],"
        "\"documents\": null, \"enable_thinking\": false}",
        JSON_PRESERVE_ORDER, NULL);
    trusted = json_loads("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
                         " \"add_generation_prompt\": true}", 0, NULL);
    if (user == NULL || trusted == NULL) {
        die("the fixed variables do not parse");
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char                err[256], err2[256];
    nalar_jinja_tmpl   *t;
    nalar_jinja_out     out, out2;
    nalar_jinja_limits  lim = { 200000, 1 << 16, 32u << 20, 200, 0 };
    int                 rc, rc2;

    if (user == NULL) {
        init();
    }
    err[0] = 0;
    t = nalar_jinja_compile((const char *) data, size, err, sizeof(err));
    if (t == NULL) {
        if (err[0] == 0) {
            die("refused without a message");
        }
        return 0;
    }
    err[0] = err2[0] = 0;
    rc = nalar_jinja_render(t, user, trusted, &lim, &out, err, sizeof(err));
    rc2 = nalar_jinja_render(t, user, trusted, &lim, &out2, err2,
                             sizeof(err2));
    if (rc != rc2) {
        die("two renders disagree");
    }
    if (rc != 0) {
        if (err[0] == 0 && rc != NALAR_JINJA_RAISED) {
            die("failed without a message");
        }
    } else {
        size_t end = 0;

        if (out.text[out.len] != 0 || out.len != out2.len
            || memcmp(out.text, out2.text, out.len) != 0
            || out.n_spans != out2.n_spans)
        {
            die("two renders gave different text");
        }
        for (size_t i = 0; i < out.n_spans; i++) {
            if (out.spans[i].len == 0 || out.spans[i].off < end
                || (i > 0 && out.spans[i].off == end)
                || out.spans[i].off + out.spans[i].len > out.len
                || out.spans[i].off != out2.spans[i].off
                || out.spans[i].len != out2.spans[i].len)
            {
                die("a span is out of place");
            }
            end = out.spans[i].off + out.spans[i].len;
        }
        nalar_jinja_out_free(&out);
        nalar_jinja_out_free(&out2);
    }
    nalar_jinja_free(t);
    return 0;
}
