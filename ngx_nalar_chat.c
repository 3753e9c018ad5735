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

typedef struct {
    char   *p;
    size_t  len;
    size_t  cap;
    int     failed;
} chat_buf;


static void
chat_put(chat_buf *b, const char *s, size_t n)
{
    char    *np;
    size_t   cap;

    if (b->failed) {
        return;
    }

    if (b->len + n + 1 > b->cap) {
        cap = (b->cap ? b->cap * 2 : 256);
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }

    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}


static void
chat_puts(chat_buf *b, const char *s)
{
    chat_put(b, s, strlen(s));
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
            chat_put(b, msgs[i].role, msgs[i].role_len);
        }
        chat_puts(b, "\n");
        chat_put(b, msgs[i].content, msgs[i].content_len);
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
            chat_put(b, msgs[i].role, msgs[i].role_len);
        }
        chat_puts(b, "<|end_header_id|>\n\n");
        chat_put(b, msgs[i].content, msgs[i].content_len);
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
            chat_put(b, msgs[i].role, msgs[i].role_len);
        }
        chat_puts(b, "|>\n");
        chat_put(b, msgs[i].content, msgs[i].content_len);
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
    size_t                 i;
    int                    first;
    const nalar_chat_msg  *sys;

    sys = NULL;
    first = 1;

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            sys = &msgs[i];
            continue;
        }

        if (role_is(&msgs[i], "user")) {
            chat_puts(b, first ? "[INST] " : "<s>[INST] ");
            if (sys) {
                chat_puts(b, "<<SYS>>\n");
                chat_put(b, sys->content, sys->content_len);
                chat_puts(b, "\n<</SYS>>\n\n");
                sys = NULL;
            }
            chat_put(b, msgs[i].content, msgs[i].content_len);
            chat_puts(b, " [/INST]");
            first = 0;

        } else if (role_is(&msgs[i], "assistant")) {
            chat_puts(b, " ");
            chat_put(b, msgs[i].content, msgs[i].content_len);
            chat_puts(b, " </s>");

        } else {
            return nalar_fail(err, "messages[%zu]: role \"%.*s\" is not "
                              "supported by the llama2 chat template", i,
                              (int) msgs[i].role_len, msgs[i].role);
        }
    }

    return 0;
}


char *
nalar_chat_render(nalar_chat_style s, const nalar_chat_msg *msgs, size_t n,
                  size_t *len, nalar_err *err)
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
            free(b.p);
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

    chat_put(&b, "", 0);

    if (b.failed || b.p == NULL) {
        free(b.p);
        nalar_fail(err, "chat template: out of memory");
        return NULL;
    }

    *len = b.len;
    return b.p;
}
