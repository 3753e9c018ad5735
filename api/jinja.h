/*
 * A Jinja2 interpreter for chat templates (the subset real models ship),
 * rendering what Python's jinja2 renders under Hugging Face's setup:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]), tojson = json.dumps(ensure_ascii=False),
 * globals raise_exception and strftime_now.  No nginx, no engine.
 *
 * Bounded: every render runs under a step budget, a nesting depth, an
 * output cap and a memory cap, and stops with an error past any of them.
 *
 * Taint: every string reached from the `user` variables (messages, tools,
 * documents, chat_template_kwargs) is user text and keeps that mark, byte
 * by byte, through the template's string operations; the rendered text
 * comes back with the byte spans that hold user text.  Template literals
 * and the `trusted` variables (bos_token, eos_token, ...) are not user text.
 */
#ifndef NALAR_JINJA_H
#define NALAR_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nalar_jinja_tmpl nalar_jinja_tmpl;

typedef struct {
    uint64_t  max_steps;    /* statements + expressions evaluated; 0: 5M */
    size_t    max_output;   /* bytes of any rendered text; 0: 8 MiB */
    size_t    max_memory;   /* bytes the render may allocate; 0: 256 MiB */
    int       max_depth;    /* nesting of evaluation (macros, expressions);
                               0: 400 */
    int64_t   now;          /* strftime_now's time (seconds since the epoch,
                               formatted as UTC); -1: the local time now */
} nalar_jinja_limits;

typedef struct {
    size_t  off;
    size_t  len;
} nalar_jinja_span;

typedef struct {
    char              *text;    /* NUL-terminated; len excludes the NUL */
    size_t             len;
    nalar_jinja_span  *spans;   /* user text, in order, disjoint, merged */
    size_t             n_spans;
} nalar_jinja_out;

/* Compiles src[0..len); NULL with a message naming the line in err. */
nalar_jinja_tmpl *nalar_jinja_compile(const char *src, size_t len, char *err,
                                      size_t err_len);
void nalar_jinja_free(nalar_jinja_tmpl *t);

/*
 * Renders t with the variables of two JSON objects (either may be NULL):
 * `user`'s strings are user text, `trusted`'s are not; a name in both takes
 * user's value.  lim may be NULL (the defaults).  Returns 0 and fills out
 * (free with nalar_jinja_out_free), or -1 with a message in err: the
 * template's raise_exception message, an undefined value used, a type error,
 * or a bound passed.  A compiled template may render from several threads.
 */
int nalar_jinja_render(const nalar_jinja_tmpl *t, json_t *user,
                       json_t *trusted, const nalar_jinja_limits *lim,
                       nalar_jinja_out *out, char *err, size_t err_len);
void nalar_jinja_out_free(nalar_jinja_out *out);

/* the error kinds a failed render gives, for a caller that maps them */
#define NALAR_JINJA_RAISED  (-2)    /* raise_exception: the message is the
                                       template's own */

#endif
