/*
 * Chat templates: turn OpenAI `messages` into the prompt text a chat model
 * was trained on.  Jinja is not interpreted; the model's
 * tokenizer.chat_template is recognised as one of the common styles by its
 * marker tokens, and the style is rendered here.  No nginx dependency.
 */
#ifndef NGX_NALAR_CHAT_H
#define NGX_NALAR_CHAT_H

#include <stddef.h>

#include "nalar_err.h"

typedef enum {
    NALAR_CHAT_AUTO = 0,     /* from the model's tokenizer.chat_template */
    NALAR_CHAT_CHATML,       /* <|im_start|>role\n...<|im_end|>\n */
    NALAR_CHAT_LLAMA2,       /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    NALAR_CHAT_LLAMA3,       /* <|start_header_id|>role<|end_header_id|> */
    NALAR_CHAT_ZEPHYR        /* <|user|>\n...</s>\n */
} nalar_chat_style;

typedef struct {
    const char *role;        /* system, developer, user, assistant, tool */
    size_t      role_len;
    const char *content;     /* UTF-8 */
    size_t      content_len;
} nalar_chat_msg;

/* "chatml", "llama2", "llama3", "zephyr", "auto"; -1 when unknown. */
int nalar_chat_style_parse(const char *name, size_t len);
const char *nalar_chat_style_name(nalar_chat_style s);

/* The style of a Jinja template (NULL: no template): ChatML when nothing
 * is recognised, as llama.cpp does. */
nalar_chat_style nalar_chat_style_detect(const char *jinja);

/*
 * Renders the messages followed by the assistant's generation prompt.
 * The BOS token is not written: the tokenizer adds it.  Returns malloc'd
 * NUL-terminated text (length in *len), or NULL with err (unknown role,
 * out of memory).
 */
char *nalar_chat_render(nalar_chat_style s, const nalar_chat_msg *msgs,
                        size_t n, size_t *len, nalar_err *err);

/* The text that ends an assistant turn in this style (a stop string for
 * vocabularies where it is not a single end-of-generation token). */
const char *nalar_chat_stop(nalar_chat_style s);

#endif
