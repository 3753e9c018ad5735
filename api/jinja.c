/*
 * The interpreter's entry points: compile a template once, render it many
 * times (each render has its own arena and bounds; the compiled tree is only
 * read), and hand back the text with its user-text spans.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

#define JJ_COMPILE_MEMORY   (64u << 20)


nalar_jinja_tmpl *
nalar_jinja_compile(const char *src, size_t len, char *err, size_t err_len)
{
    jj_base                      b;
    nalar_jinja_tmpl *volatile   t = NULL;

    memset(&b, 0, sizeof(b));
    b.limit = JJ_COMPILE_MEMORY;
    b.err = err;
    b.err_len = err_len;
    if (setjmp(b.jb) != 0) {
        jj_arena_free(b.chunks);
        return NULL;
    }
    t = jj_alloc(&b, sizeof(*t));
    t->root = jj_parse(&b, src, len);
    t->arena = b.chunks;
    return t;
}


void
nalar_jinja_free(nalar_jinja_tmpl *t)
{
    if (t != NULL) {
        jj_arena_free(t->arena);
    }
}


static void
add_vars(jj_ctx *c, json_t *obj, int tainted)
{
    const char *key;
    json_t     *val;

    if (obj == NULL) {
        return;
    }
    if (!json_is_object(obj)) {
        jj_fail(&c->b, 0, "the variables must be a JSON object");
    }
    json_object_foreach(obj, key, val) {
        jj_dict_set(&c->b, &c->ctxvars, jv_str(&c->b, key, strlen(key), 0),
                    jj_from_json(&c->b, val, tainted, 0));
    }
}


/* the runs of tainted bytes */
static int
spans(const jj_sb *sb, nalar_jinja_out *out)
{
    size_t n = 0, k = 0;

    for (size_t i = 0; i < sb->len; i++) {
        n += sb->t[i] && (i == 0 || !sb->t[i - 1]);
    }
    out->spans = calloc(n ? n : 1, sizeof(nalar_jinja_span));
    if (out->spans == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sb->len; i++) {
        if (sb->t[i] && (i == 0 || !sb->t[i - 1])) {
            out->spans[k].off = i;
            out->spans[k].len = 0;
            k++;
        }
        if (sb->t[i]) {
            out->spans[k - 1].len++;
        }
    }
    out->n_spans = n;
    return 0;
}


int
nalar_jinja_render(const nalar_jinja_tmpl *t, json_t *user, json_t *trusted,
                   const nalar_jinja_limits *lim, nalar_jinja_out *out,
                   char *err, size_t err_len)
{
    jj_ctx      *c;
    jj_sb        sb;
    int          rc;

    memset(out, 0, sizeof(*out));
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    c->b.limit = lim != NULL && lim->max_memory ? lim->max_memory : 256u << 20;
    c->max_steps = lim != NULL && lim->max_steps ? lim->max_steps : 5000000;
    c->max_depth = lim != NULL && lim->max_depth ? lim->max_depth : 400;
    c->max_output = lim != NULL && lim->max_output ? lim->max_output
                                                   : 8u << 20;
    c->now = lim != NULL ? lim->now : -1;
    c->b.err = err;
    c->b.err_len = err_len;
    if (setjmp(c->b.jb) != 0) {
        rc = c->b.rc != 0 ? c->b.rc : -1;
        jj_arena_free(c->b.chunks);
        free(c);
        return rc;
    }
    add_vars(c, trusted, 0);
    add_vars(c, user, 1);
    c->root = jj_alloc(&c->b, sizeof(jj_scope));
    c->scope = c->root;
    jj_sb_init(&sb, c->max_output);
    c->out = &sb;
    {
        int ctl = 0;

        jj_exec_body(c, t->root, &ctl);
    }
    out->text = malloc(sb.len + 1);
    if (out->text == NULL || spans(&sb, out) != 0) {
        free(out->text);
        out->text = NULL;
        snprintf(err, err_len, "out of memory");
        jj_arena_free(c->b.chunks);
        free(c);
        return -1;
    }
    if (sb.len > 0) {
        memcpy(out->text, sb.s, sb.len);
    }
    out->text[sb.len] = 0;
    out->len = sb.len;
    jj_arena_free(c->b.chunks);
    free(c);
    return 0;
}


void
nalar_jinja_out_free(nalar_jinja_out *out)
{
    free(out->text);
    free(out->spans);
    memset(out, 0, sizeof(*out));
}
