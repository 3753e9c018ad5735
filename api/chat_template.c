/*
 * Chat templates run (api/chat_template.h): the request's variables, the
 * render, its pieces, and the deferred render the engine calls at intake.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "chat_template.h"


nalar_chat_template *
nalar_chat_template_compile(const char *src, size_t len, char *err,
                            size_t err_len)
{
    char                *text;
    nalar_chat_template *t;

    t = calloc(1, sizeof(*t));
    text = malloc(len + 1);
    if (t == NULL || text == NULL) {
        free(t);
        free(text);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }

    t->jinja = nalar_jinja_compile(src, len, err, err_len);
    if (t->jinja == NULL) {
        free(t);
        free(text);
        return NULL;
    }

    /* the style's detection reads a NUL-terminated text */
    memcpy(text, src, len);
    text[len] = '\0';
    t->style = (int) nalar_chat_style_detect(text);
    free(text);

    return t;
}


void
nalar_chat_template_free(nalar_chat_template *t)
{
    if (t != NULL) {
        nalar_jinja_free(t->jinja);
        free(t);
    }
}


/* A content array's text parts joined with "\n" (vLLM's "string" content
 * format); NULL on out of memory.  The parts were checked at the parse. */
static json_t *
tmpl_joined(const json_t *content)
{
    char    *buf, *p;
    size_t   i, len;
    json_t  *text, *s;

    len = 0;
    for (i = 0; i < json_array_size(content); i++) {
        text = json_object_get(json_array_get(content, i), "text");
        len += json_string_length(text) + 1;
    }

    buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }

    p = buf;
    for (i = 0; i < json_array_size(content); i++) {
        text = json_object_get(json_array_get(content, i), "text");
        if (i > 0) {
            *p++ = '\n';
        }
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }

    s = json_stringn_nocheck(buf, (size_t) (p - buf));
    free(buf);

    return s;
}


/* An assistant's tool calls with each arguments string that holds a JSON
 * object parsed into it, as vLLM hands them to Hugging Face templates. */
static json_t *
tmpl_calls(const json_t *calls)
{
    size_t   i;
    json_t  *out, *call, *f, *args, *parsed;

    out = json_array();
    if (out == NULL) {
        return NULL;
    }

    for (i = 0; i < json_array_size(calls); i++) {
        call = json_array_get(calls, i);
        f = json_object_get(call, "function");
        args = json_object_get(f, "arguments");
        parsed = json_is_string(args)
                 ? json_loadb(json_string_value(args),
                              json_string_length(args), JSON_DECODE_ANY,
                              NULL)
                 : NULL;

        if (!json_is_object(parsed)) {
            json_decref(parsed);
            if (json_array_append(out, call) != 0) {
                goto failed;
            }
            continue;
        }

        call = json_copy(call);
        f = json_copy(f);
        if (call == NULL || f == NULL
            || json_object_set_new(f, "arguments", parsed) != 0
            || json_object_set_new(call, "function", f) != 0
            || json_array_append_new(out, call) != 0)
        {
            json_decref(call);
            goto failed;
        }
    }

    return out;

failed:

    json_decref(out);
    return NULL;
}


/* The messages as the template sees them: shared with the body where
 * nothing changes, shallow copies where something does. */
static json_t *
tmpl_messages(const json_t *messages)
{
    size_t   i;
    json_t  *out, *m, *content, *calls, *v;

    out = json_array();
    if (out == NULL) {
        return NULL;
    }

    for (i = 0; i < json_array_size(messages); i++) {
        m = json_array_get(messages, i);
        content = json_object_get(m, "content");
        calls = json_object_get(m, "tool_calls");

        if (!json_is_array(content) && !json_is_array(calls)) {
            if (json_array_append(out, m) != 0) {
                goto failed;
            }
            continue;
        }

        m = json_copy(m);
        if (m == NULL) {
            goto failed;
        }

        if (json_is_array(content)) {
            v = tmpl_joined(content);
            if (json_object_set_new(m, "content", v) != 0) {
                json_decref(m);
                goto failed;
            }
        }

        if (json_is_array(calls)) {
            v = tmpl_calls(calls);
            if (json_object_set_new(m, "tool_calls", v) != 0) {
                json_decref(m);
                goto failed;
            }
        }

        if (json_array_append_new(out, m) != 0) {
            goto failed;
        }
    }

    return out;

failed:

    json_decref(out);
    return NULL;
}


int
nalar_chat_template_vars(json_t *root, json_t *tools,
                         int add_generation_prompt, const char *bos,
                         const char *eos, json_t **user, json_t **trusted)
{
    json_t  *u, *t, *v;

    u = json_object();
    t = json_pack("{sbssss}", "add_generation_prompt", add_generation_prompt,
                  "bos_token", bos ? bos : "", "eos_token", eos ? eos : "");

    if (u == NULL || t == NULL) {
        goto failed;
    }

    /* the request's kwargs first: the parse refused those that would
     * stand for the variables below */

    v = json_object_get(root, "chat_template_kwargs");
    if (json_is_object(v) && json_object_update(u, v) != 0) {
        goto failed;
    }

    v = json_object_get(root, "documents");

    if (json_object_set_new(u, "messages",
                            tmpl_messages(json_object_get(root, "messages")))
        != 0
        || json_object_set(u, "tools", tools ? tools : json_null()) != 0
        || json_object_set(u, "documents", v ? v : json_null()) != 0)
    {
        goto failed;
    }

    *user = u;
    *trusted = t;

    return 0;

failed:

    json_decref(u);
    json_decref(t);
    return -1;
}


nalar_tok_text *
nalar_chat_template_pieces(const nalar_jinja_out *out, const char *open,
                           int32_t *n)
{
    size_t           i, at, k;
    nalar_tok_text  *pc;

    /* at most a markup piece before each span, one after the last, and
     * the opener */
    pc = malloc((2 * out->n_spans + 2) * sizeof(nalar_tok_text));
    if (pc == NULL) {
        return NULL;
    }

    k = 0;
    at = 0;

    for (i = 0; i <= out->n_spans; i++) {
        size_t  end = i < out->n_spans ? out->spans[i].off : out->len;

        if (end > at) {
            pc[k].text = out->text + at;
            pc[k].len = end - at;
            pc[k].special = 1;
            k++;
        }

        if (i < out->n_spans) {
            pc[k].text = out->text + out->spans[i].off;
            pc[k].len = out->spans[i].len;
            pc[k].special = 0;
            k++;
            at = out->spans[i].off + out->spans[i].len;
        }
    }

    if (open != NULL && open[0] != '\0') {
        pc[k].text = open;
        pc[k].len = strlen(open);
        pc[k].special = 1;
        k++;
    }

    *n = (int32_t) k;

    return pc;
}


int
nalar_chat_template_render(const nalar_chat_template *t, json_t *user,
                           json_t *trusted, const char *open,
                           nalar_tok_text **pieces, int32_t *n, char **text,
                           char *msg, size_t cap)
{
    int              rc;
    char             err[512];
    nalar_jinja_out  out;

    rc = nalar_jinja_render(t->jinja, user, trusted, NULL, &out, err,
                            sizeof(err));

    if (rc == NALAR_JINJA_RAISED) {
        snprintf(msg, cap, "%s", err);
        return 400;
    }

    if (rc != 0) {
        if (strstr(err, "out of memory") != NULL) {
            snprintf(msg, cap, "out of memory");
            return 500;
        }

        snprintf(msg, cap, "the chat template failed: %s", err);
        return 400;
    }

    *pieces = nalar_chat_template_pieces(&out, open, n);
    if (*pieces == NULL) {
        nalar_jinja_out_free(&out);
        snprintf(msg, cap, "out of memory");
        return 500;
    }

    /* the text is the prompt's from here on */
    *text = out.text;
    free(out.spans);

    return 0;
}


/* the deferred render: the job's own copy of what it reads */

typedef struct {
    nalar_chat_job  in;
    char           *bos;
    char           *eos;
} tmpl_job;


static int
tmpl_job_render(void *ctx, nalar_tok_text **pieces, int32_t *n, char **text,
                int *add_bos, char *msg, size_t cap)
{
    int        rc;
    json_t    *user, *trusted;
    tmpl_job  *j = ctx;

    /* the template writes the BOS it wants (bos_token): the tokenizer
     * adds none, as Hugging Face and vLLM tokenize a rendered chat */
    *add_bos = 0;

    if (nalar_chat_template_vars(j->in.root, j->in.tools,
                                 j->in.add_generation_prompt, j->bos, j->eos,
                                 &user, &trusted)
        != 0)
    {
        snprintf(msg, cap, "out of memory");
        return 500;
    }

    rc = nalar_chat_template_render(j->in.tmpl, user, trusted, j->in.open,
                                    pieces, n, text, msg, cap);

    json_decref(user);
    json_decref(trusted);

    return rc;
}


static void
tmpl_job_release(void *ctx)
{
    tmpl_job  *j = ctx;

    json_decref(j->in.root);
    free(j->bos);
    free(j->eos);
    free(j);
}


nalar_prompt *
nalar_chat_template_prompt(const nalar_chat_job *job, nalar_err *err)
{
    size_t                i;
    json_t               *m, *c;
    tmpl_job             *j;
    nalar_prompt         *pr;
    nalar_prompt_source   src;

    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        nalar_fail(err, "out of memory");
        return NULL;
    }

    j->in = *job;
    j->bos = strdup(job->bos ? job->bos : "");
    j->eos = strdup(job->eos ? job->eos : "");
    if (j->bos == NULL || j->eos == NULL) {
        free(j->bos);
        free(j->eos);
        free(j);
        nalar_fail(err, "out of memory");
        return NULL;
    }

    j->in.root = json_incref(job->root);

    src.render = tmpl_job_render;
    src.release = tmpl_job_release;
    src.ctx = j;
    src.bytes = 0;

    /* about what the render reads: the messages' text */
    m = json_object_get(job->root, "messages");
    for (i = 0; i < json_array_size(m); i++) {
        c = json_object_get(json_array_get(m, i), "content");
        src.bytes += json_is_string(c) ? json_string_length(c) : 64;
    }

    pr = nalar_prompt_deferred(&src, err);
    if (pr == NULL) {
        tmpl_job_release(j);
    }

    return pr;
}
