/*
 * Chat templates (see ngx_nalar_chat.h).  The layouts follow the reference
 * templates shipped with the model families (one turn each, then the
 * generation prompt):
 *   ChatML:  <|im_start|>{role}\n{content}<|im_end|>\n
 *            ... <|im_start|>assistant\n
 *   Llama-2: [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
 *            {assistant} </s><s>[INST] ...
 *   Llama-3: <|start_header_id|>{role}<|end_header_id|>\n\n{content}
 *            <|eot_id|> ... <|start_header_id|>assistant<|end_header_id|>
 *   Zephyr:  <|{role}|>\n{content}</s>\n ... <|assistant|>\n
 */
#include <stdlib.h>
#include <string.h>

#include "ngx_nalar_chat.h"

/* The pieces rendered so far: markup or message content. */
typedef struct {
    nalar_tok_text  *v;
    size_t           n;
    size_t           cap;
    int              failed;
} chat_buf;


static void
chat_piece(chat_buf *b, const char *s, size_t n, int special)
{
    size_t           cap;
    nalar_tok_text  *nv;

    if (b->failed || n == 0) {
        return;
    }

    if (b->n == b->cap) {
        cap = b->cap ? b->cap * 2 : 16;
        nv = realloc(b->v, cap * sizeof(nalar_tok_text));
        if (nv == NULL) {
            b->failed = 1;
            return;
        }
        b->v = nv;
        b->cap = cap;
    }

    b->v[b->n].text = s;
    b->v[b->n].len = n;
    b->v[b->n].special = special;
    b->n++;
}


/* template markup: its control tokens are parsed */

static void
chat_puts(chat_buf *b, const char *s)
{
    chat_piece(b, s, strlen(s), 1);
}


/* the role names a template writes (checked against a fixed list first) */

static void
chat_role(chat_buf *b, const nalar_chat_msg *m)
{
    chat_piece(b, m->role, m->role_len, 1);
}


/* what a message says: literal text, never a control token */

static void
chat_content(chat_buf *b, const nalar_chat_msg *m)
{
    size_t  i;

    for (i = 0; i < m->n_parts; i++) {
        chat_piece(b, m->parts[i].text, m->parts[i].len, 0);
    }
}


static int
role_is(const nalar_chat_msg *m, const char *role)
{
    return m->role_len == strlen(role)
           && memcmp(m->role, role, m->role_len) == 0;
}


/* "developer" is OpenAI's newer name for the system role. */
static int
role_system(const nalar_chat_msg *m)
{
    return role_is(m, "system") || role_is(m, "developer");
}


int
nalar_chat_style_parse(const char *name, size_t len)
{
    static const char *names[] = { "auto", "chatml", "llama2", "llama3",
                                   "zephyr" };
    size_t  i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (len == strlen(names[i]) && memcmp(name, names[i], len) == 0) {
            return (int) i;
        }
    }

    return -1;
}


const char *
nalar_chat_style_name(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_CHATML: return "chatml";
    case NALAR_CHAT_LLAMA2: return "llama2";
    case NALAR_CHAT_LLAMA3: return "llama3";
    case NALAR_CHAT_ZEPHYR: return "zephyr";
    default:                return "auto";
    }
}


nalar_chat_style
nalar_chat_style_detect(const char *jinja)
{
    if (jinja == NULL) {
        return NALAR_CHAT_CHATML;
    }

    /* the marker tokens are distinctive enough to tell the styles apart */
    if (strstr(jinja, "<|im_start|>")) {
        return NALAR_CHAT_CHATML;
    }
    if (strstr(jinja, "<|start_header_id|>")) {
        return NALAR_CHAT_LLAMA3;
    }
    if (strstr(jinja, "<|user|>") || strstr(jinja, "<|assistant|>")) {
        return NALAR_CHAT_ZEPHYR;
    }
    if (strstr(jinja, "[INST]")) {
        return NALAR_CHAT_LLAMA2;
    }

    return NALAR_CHAT_CHATML;
}


const char *
nalar_chat_stop(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_LLAMA2: return "</s>";
    case NALAR_CHAT_LLAMA3: return "<|eot_id|>";
    case NALAR_CHAT_ZEPHYR: return "</s>";
    default:                return "<|im_end|>";
    }
}


static void
render_chatml(chat_buf *b, const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        chat_puts(b, "<|im_start|>");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "<|im_end|>\n");
    }

    chat_puts(b, "<|im_start|>assistant\n");
}


static void
render_llama3(chat_buf *b, const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        chat_puts(b, "<|start_header_id|>");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "<|end_header_id|>\n\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "<|eot_id|>");
    }

    chat_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}


static void
render_zephyr(chat_buf *b, const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        chat_puts(b, "<|");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "|>\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "</s>\n");
    }

    chat_puts(b, "<|assistant|>\n");
}


/*
 * Llama-2 folds the system prompt into the first user turn and closes each
 * exchange with EOS, opening the next with BOS; the first BOS comes from
 * the tokenizer.
 */
static int
render_llama2(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
              nalar_err *err)
{
    size_t  i, k, sys;
    int     first, n_sys;

    /* the system messages since the last turn go into the next user turn's
     * <<SYS>> block, in order; one that no user turn follows has no place
     * in this template and is refused rather than dropped */

    sys = 0;
    n_sys = 0;
    first = 1;

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            if (n_sys++ == 0) {
                sys = i;
            }
            continue;
        }

        if (role_is(&msgs[i], "user")) {
            chat_puts(b, first ? "[INST] " : "<s>[INST] ");
            if (n_sys > 0) {
                chat_puts(b, "<<SYS>>\n");
                for (k = sys; k < i; k++) {
                    if (role_system(&msgs[k])) {
                        if (k != sys) {
                            chat_puts(b, "\n\n");
                        }
                        chat_content(b, &msgs[k]);
                    }
                }
                chat_puts(b, "\n<</SYS>>\n\n");
                n_sys = 0;
            }
            chat_content(b, &msgs[i]);
            chat_puts(b, " [/INST]");
            first = 0;

        } else if (role_is(&msgs[i], "assistant") && n_sys == 0) {
            chat_puts(b, " ");
            chat_content(b, &msgs[i]);
            chat_puts(b, " </s>");

        } else if (role_is(&msgs[i], "assistant")) {
            break;

        } else {
            return nalar_fail(err, "messages[%zu]: role \"%.*s\" is not "
                              "supported by the llama2 chat template", i,
                              (int) msgs[i].role_len, msgs[i].role);
        }
    }

    if (n_sys > 0) {
        return nalar_fail(err, "messages[%zu]: the llama2 chat template "
                          "places a system message in the user turn that "
                          "follows it, and none does", sys);
    }

    return 0;
}


nalar_tok_text *
nalar_chat_render(nalar_chat_style s, const nalar_chat_msg *msgs, size_t n,
                  size_t *n_pieces, nalar_err *err)
{
    size_t    i;
    chat_buf  b;

    memset(&b, 0, sizeof(b));

    for (i = 0; i < n; i++) {
        if (!(role_system(&msgs[i]) || role_is(&msgs[i], "user")
              || role_is(&msgs[i], "assistant") || role_is(&msgs[i], "tool")))
        {
            nalar_fail(err, "messages[%zu]: unknown role \"%.*s\"", i,
                       (int) msgs[i].role_len, msgs[i].role);
            return NULL;
        }
    }

    switch (s) {
    case NALAR_CHAT_LLAMA2:
        if (render_llama2(&b, msgs, n, err) != 0) {
            free(b.v);
            return NULL;
        }
        break;
    case NALAR_CHAT_LLAMA3:
        render_llama3(&b, msgs, n);
        break;
    case NALAR_CHAT_ZEPHYR:
        render_zephyr(&b, msgs, n);
        break;
    default:
        render_chatml(&b, msgs, n);
        break;
    }

    if (!b.failed && b.v == NULL) {
        /* no pieces: an empty prompt (BOS alone) */
        b.v = malloc(sizeof(nalar_tok_text));
        b.failed = (b.v == NULL);
    }

    if (b.failed) {
        free(b.v);
        nalar_fail(err, "chat template: out of memory");
        return NULL;
    }

    *n_pieces = b.n;
    return b.v;
}


int
nalar_chat_content(const json_t *content, nalar_tok_text *parts,
                   nalar_err *err)
{
    size_t   j;
    json_t  *part, *type, *text;

    if (json_is_string(content)) {
        parts[0].text = json_string_value(content);
        parts[0].len = json_string_length(content);
        parts[0].special = 0;
        return 1;
    }

    if (content == NULL || json_is_null(content)) {
        return 0;
    }

    if (!json_is_array(content)) {
        nalar_fail(err, "content must be a string or an array of text parts");
        return -1;
    }

    for (j = 0; j < json_array_size(content); j++) {
        part = json_array_get(content, j);
        type = json_object_get(part, "type");
        text = json_object_get(part, "text");

        if (!json_is_string(type)
            || strcmp(json_string_value(type), "text") != 0
            || !json_is_string(text))
        {
            nalar_fail(err, "content[%zu]: only text parts are supported", j);
            return -1;
        }

        parts[j].text = json_string_value(text);
        parts[j].len = json_string_length(text);
        parts[j].special = 0;
    }

    return (int) j;
}


size_t
nalar_chat_n_parts(const json_t *content)
{
    return json_is_array(content) ? json_array_size(content) : 1;
}
