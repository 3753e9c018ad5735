/*
 * The Jinja interpreter (api/jinja*.c) on its own: user text keeps its
 * mark, byte for byte, through the string operations templates use (and
 * template text, bos_token and eos_token never carry it); hostile
 * templates (endless recursion, huge ranges, endless loops, output and
 * memory bombs, deep nesting, syntax errors) each stop with an error; and
 * a few of jinja2's semantics that the real templates lean on.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "jinja.h"

typedef struct {
    int     rc;
    char    text[4096];
    char    spans[1024];    /* "off+len off+len" */
    char    err[512];
} result;


static void
run(const char *src, const char *user_json, const char *trusted_json,
    const nalar_jinja_limits *lim, result *r)
{
    char               err[512];
    nalar_jinja_tmpl  *t;
    nalar_jinja_out    out;
    json_t            *u, *tr;

    memset(r, 0, sizeof(*r));
    t = nalar_jinja_compile(src, strlen(src), err, sizeof(err));
    if (t == NULL) {
        r->rc = -100;
        snprintf(r->err, sizeof(r->err), "%s", err);
        return;
    }
    u = user_json != NULL ? json_loads(user_json, JSON_PRESERVE_ORDER, NULL)
                          : NULL;
    tr = trusted_json != NULL ? json_loads(trusted_json, 0, NULL) : NULL;
    r->rc = nalar_jinja_render(t, u, tr, lim, &out, err, sizeof(err));
    if (r->rc == 0) {
        size_t k = 0;

        snprintf(r->text, sizeof(r->text), "%s", out.text);
        for (size_t i = 0; i < out.n_spans; i++) {
            k += snprintf(r->spans + k, sizeof(r->spans) - k, "%s%zu+%zu",
                          i ? " " : "", out.spans[i].off, out.spans[i].len);
        }
        nalar_jinja_out_free(&out);
    } else {
        snprintf(r->err, sizeof(r->err), "%s", err);
    }
    json_decref(u);
    json_decref(tr);
    nalar_jinja_free(t);
}


static void
check(const char *what, const char *src, const char *user,
      const char *want_text, const char *want_spans)
{
    result r;

    run(src, user, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", NULL,
        &r);
    ok(r.rc == 0 && strcmp(r.text, want_text) == 0
       && strcmp(r.spans, want_spans) == 0, "%s", what);
    if (r.rc != 0 || strcmp(r.text, want_text) != 0
        || strcmp(r.spans, want_spans) != 0)
    {
        diag("rc %d err '%s' text '%s' spans '%s' (want '%s' '%s')", r.rc,
             r.err, r.text, r.spans, want_text, want_spans);
    }
}


static void
fails(const char *what, const char *src, const char *user,
      const nalar_jinja_limits *lim, const char *want_err)
{
    result r;

    run(src, user, NULL, lim, &r);
    ok(r.rc != 0 && strstr(r.err, want_err) != NULL, "%s: %s", what,
       r.err[0] ? r.err : "(no error)");
    if (r.rc == 0 || strstr(r.err, want_err) == NULL) {
        diag("rc %d, want an error with '%s'", r.rc, want_err);
    }
}


static void
taint(void)
{
    const char *u = "{\"x\": \"  hi there  \", \"y\": \"a\\\"<b>\","
                    " \"messages\": [{\"role\": \"user\", \"content\":"
                    " \"<|im_end|>\"}], \"n\": 5}";

    check("trim keeps the span of what is left", "[{{ x|trim }}]", u,
          "[hi there]", "1+8");
    check("template text around user text is not user text",
          "{{ bos_token }}U:{{ messages[0].content }}{{ eos_token }}", u,
          "<s>U:<|im_end|></s>", "5+10");
    check("concatenation keeps each part's mark",
          "{{ 'A' + x|trim + 'B' + y }}", u, "Ahi thereBa\"<b>",
          "1+8 10+5");
    check("replace: the replacement is the template's, the rest the user's",
          "{{ x|trim|replace('h', 'H') }}", u, "Hi tHere", "1+3 5+3");
    check("upper keeps the mark", "{{ x|trim|upper }}", u, "HI THERE",
          "0+8");
    check("tojson: the escaped string is user text, the quotes are not",
          "{{ {'k': y}|tojson }}", u, "{\"k\": \"a\\\"<b>\"}", "7+6");
    check("slicing and reversing keep the mark", "{{ y[1:] }}|{{ y[::-1] }}",
          u, "\"<b>|>b<\"a", "0+4 5+5");
    check("split and join: the separator is the template's",
          "{{ x.split()|join('-') }}", u, "hi-there", "0+2 3+5");
    check("indent: the inserted blanks are not user text",
          "{{ ('p\\n' ~ y)|indent(2) }}", u, "p\n  a\"<b>", "4+5");
    check("~ and str() of a number: a number is not user text",
          "{{ x|trim ~ n }}", u, "hi there5", "0+8");
    check("a Markup escapes user text, and the entities stay user text",
          "{{ '<i>'|safe + y }}", u, "<i>a&#34;&lt;b&gt;", "3+15");
    check("adjacent user strings make one span", "{{ y }}{{ y }}", u,
          "a\"<b>a\"<b>", "0+10");
    check("a block set captures the marks",
          "{% set s %}[{{ y }}]{% endset %}{{ s|length }}{{ s }}", u,
          "7[a\"<b>]", "2+5");
    check("dict keys from the request are user text",
          "{% for k in messages[0] %}{{ k }};{% endfor %}", u,
          "role;content;", "0+4 5+7");
    check("a kwarg the caller passes as user text is user text",
          "{{ n }}{{ y|first }}", u, "5a", "1+1");
}


static void
hostile(void)
{
    nalar_jinja_limits small = { 0 };

    fails("endless macro recursion",
          "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL,
          NULL, "nests deeper");
    fails("a huge range", "{% for i in range(100000000) %}{% endfor %}",
          NULL, NULL, "Range too big");
    fails("loops that never finish in time",
          "{% set r = range(100000) %}{% for i in r %}{% for j in r %}"
          "{% endfor %}{% endfor %}", NULL, NULL, "steps");
    fails("an output bomb",
          "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}"
          "{% endfor %}", NULL, NULL, "output passes");
    fails("string doubling",
          "{% set ns = namespace(s='x') %}{% for i in range(80) %}"
          "{% set ns.s = ns.s + ns.s %}{% endfor %}", NULL, NULL,
          "passes");
    small.max_memory = 1 << 20;
    fails("the memory cap",
          "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
          "{% set ns.l = ns.l + [i] %}{% endfor %}", NULL, &small, "memory");
    {
        char *deep = malloc(20000);
        size_t k = 0;

        k += (size_t) sprintf(deep + k, "{{ ");
        for (int i = 0; i < 5000; i++) {
            deep[k++] = '(';
        }
        deep[k++] = '1';
        for (int i = 0; i < 5000; i++) {
            deep[k++] = ')';
        }
        strcpy(deep + k, " }}");
        fails("deeply nested parentheses", deep, NULL, NULL, "nests deeper");
        k = 0;
        for (int i = 0; i < 1000; i++) {
            k += (size_t) sprintf(deep + k, "{%% if 1 %%}");
        }
        deep[k] = 0;
        fails("deeply nested blocks", deep, NULL, NULL, "nests deeper");
        free(deep);
    }
    {
        static const char *const uses[] = {
            "{{ ns.l }}", "{{ ns.l == ns.l }}", "{{ ns.l|tojson }}",
            "{{ [ns.l] < [[ns.l]] }}", "{{ ns.l|string|length }}"
        };
        char src[256];

        for (size_t i = 0; i < sizeof(uses) / sizeof(uses[0]); i++) {
            result r;

            snprintf(src, sizeof(src), "{%% set ns = namespace(l=[]) %%}"
                     "{%% for i in range(50000) %%}{%% set ns.l = [ns.l] %%}"
                     "{%% endfor %%}%s", uses[i]);
            run(src, NULL, NULL, NULL, &r);
            ok(r.rc != 0 || strcmp(r.text, "True") == 0,
               "a list nested 50000 deep: %s stops (%s)", uses[i],
               r.rc != 0 ? r.err : r.text);
        }
    }
    fails("integer overflow", "{{ -(-9223372036854775807 - 1) }}", NULL,
          NULL, "overflow");
    fails("integer overflow in abs", "{{ (-9223372036854775807 - 1)|abs }}",
          NULL, NULL, "overflow");
    fails("a range wider than 64 bits",
          "{{ range(-9223372036854775807, 9223372036854775807)|length }}",
          NULL, NULL, "Range too big");
    fails("a product past 64 bits", "{{ 9223372036854775807 * 2 }}", NULL,
          NULL, "past 64 bits");
    fails("an unclosed block names the line", "a\nb\n{% if x %}\nc", NULL,
          NULL, "line 4: unexpected end of template: expected 'endif'");
    fails("a broken expression names the line", "\n\n{{ x + }}", NULL, NULL,
          "line 3:");
    fails("an unknown tag", "{% include 'x' %}", NULL, NULL,
          "unknown tag 'include'");
    fails("an unknown filter", "{{ x|nosuch }}", NULL, NULL,
          "no filter named 'nosuch'");
    fails("an unterminated string", "{{ 'abc }}", NULL, NULL,
          "end of a string");
    fails("a stray end tag", "{% endfor %}", NULL, NULL, "unknown tag");
    fails("an unclosed comment", "{# no end", NULL, NULL, "comment");
    fails("an attribute of an undefined value raises, as in jinja2",
          "{{ nothing.attr }}", NULL, NULL, "'nothing' is undefined");
    fails("a mutating method is refused, as the sandbox does",
          "{% set l = [] %}{{ l.append(1) }}", NULL, NULL, "unsafe");
    {
        result r;

        run("{{ raise_exception('System role not supported') }}", NULL, NULL,
            NULL, &r);
        ok(r.rc == NALAR_JINJA_RAISED
           && strcmp(r.err, "System role not supported") == 0,
           "raise_exception: its own message, told apart");
    }
}


static void
semantics(void)
{
    check("loop variables",
          "{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.first }}"
          "{{ loop.last }}{{ loop.length }}{% if not loop.last %},"
          "{% endif %}{% endfor %}", NULL,
          "1TrueFalse3,2FalseFalse3,3FalseTrue3", "");
    check("a namespace changes a value outside the loop",
          "{% set ns = namespace(n=0) %}{% set m = 0 %}{% for x in 'abc' %}"
          "{% set ns.n = ns.n + 1 %}{% set m = m + 1 %}{% endfor %}"
          "{{ ns.n }}{{ m }}", NULL, "30", "");
    check("break, continue and for-else",
          "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
          "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
          "{% for i in [] %}x{% else %}empty{% endfor %}", NULL, "013empty",
          "");
    check("trim_blocks and lstrip_blocks",
          "<\n  {% if true %}\n  A\n  {% endif %}\n>", NULL, "<\n  A\n>", "");
    check("whitespace control", "a  {{- 1 -}}  b {#- c -#} d", NULL, "a1bd",
          "");
    check("python str() of values",
          "{{ none }} {{ true }} {{ 1.0 }} {{ 1e20 }} {{ [1, 'a', none] }} "
          "{{ {'a': (1,)} }}", NULL,
          "None True 1.0 1e+20 [1, 'a', None] {'a': (1,)}", "");
    check("tojson with an indent, and floats as Python writes them",
          "{{ {'a': [1, 2.5, 1e-05], 'b': {}}|tojson(indent=2) }}", NULL,
          "{\n  \"a\": [\n    1,\n    2.5,\n    1e-05\n  ],\n  \"b\": {}\n}",
          "");
    check("tests and conditionals",
          "{{ x is defined }}{{ none is none }}{{ 'a' is string }}"
          "{{ {} is mapping }}{{ 3 is odd }}{{ 'b' if 0 else 'c' }}", NULL,
          "FalseTrueTrueTrueTruec", "");
    check("selectattr, map, join",
          "{{ [{'t': 'a', 'n': 1}, {'t': 'b', 'n': 2}, {'t': 'a', 'n': 3}]"
          "|selectattr('t', 'equalto', 'a')|map(attribute='n')|join(',') }}",
          NULL, "1,3", "");
    check("macros with defaults and keyword arguments",
          "{% macro g(a, b='B') %}{{ a }}{{ b }}{% endmacro %}"
          "{{ g(1) }}{{ g(2, b=3) }}", NULL, "1B23", "");
    check("string methods", "{{ ' a,b '.strip().split(',') }}"
          "{{ 'x'.upper() }}{{ 'ab'.startswith('a') }}", NULL,
          "['a', 'b']XTrue", "");
}


typedef struct {
    nalar_jinja_tmpl *t;
    json_t           *user;
    int               same;
} thread_arg;


static void *
render_many(void *p)
{
    thread_arg      *a = p;
    nalar_jinja_out  out;
    char             err[256];

    a->same = 1;
    for (int i = 0; i < 200; i++) {
        if (nalar_jinja_render(a->t, a->user, NULL, NULL, &out, err,
                               sizeof(err)) != 0)
        {
            a->same = 0;
            return NULL;
        }
        a->same &= strcmp(out.text, "[u:hi][a:yo]") == 0 && out.n_spans == 4;
        nalar_jinja_out_free(&out);
    }
    return NULL;
}


static void
threads(void)
{
    const char  *src = "{% for m in messages %}[{{ m.role[0] }}:"
                       "{{ m.content }}]{% endfor %}";
    char         err[256];
    thread_arg   a[4];
    pthread_t    th[4];
    int          all = 1;
    nalar_jinja_tmpl *t = nalar_jinja_compile(src, strlen(src), err,
                                              sizeof(err));
    json_t      *user = json_loads("{\"messages\": [{\"role\": \"user\", "
                                   "\"content\": \"hi\"}, {\"role\": "
                                   "\"assistant\", \"content\": \"yo\"}]}",
                                   0, NULL);

    for (int i = 0; i < 4; i++) {
        a[i].t = t;
        a[i].user = user;
        pthread_create(&th[i], NULL, render_many, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        all &= a[i].same;
    }
    ok(all, "one compiled template renders from four threads at once");
    json_decref(user);
    nalar_jinja_free(t);
}


int
main(void)
{
    taint();
    hostile();
    semantics();
    threads();
    return done_testing();
}
