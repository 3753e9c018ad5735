/*
 * A chat template run as the model was trained with it: a compiled Jinja
 * template (api/jinja.h), the variables Hugging Face's transformers and
 * vLLM pass it for an OpenAI chat request, and the rendered text cut into
 * pieces for the tokenizer: what the template wrote is markup (special =
 * 1: its control tokens are tokens), what came from the request is user
 * text (special = 0: "<|im_end|>" typed by a user stays text).
 *
 * A request's render runs on the engine thread, at intake
 * (nalar_chat_template_prompt hands the engine a callback), never on the
 * nginx event loop.  No nginx dependency.
 */
#ifndef NALAR_CHAT_TEMPLATE_H
#define NALAR_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine.h"
#include "jinja.h"
#include "tokenizer.h"

/* compiled once (per model, per operator file), read by any thread */
typedef struct {
    nalar_jinja_tmpl  *jinja;
    int                style;   /* nalar_chat_style found in the source:
                                   the family whose tool calls the answer
                                   is parsed for, and whose end-of-turn
                                   text stops generation */
} nalar_chat_template;

/* NULL with a message naming the line in err */
nalar_chat_template *nalar_chat_template_compile(const char *src, size_t len,
                                                 char *err, size_t err_len);
void nalar_chat_template_free(nalar_chat_template *t);

/*
 * The variables of a chat request, as vLLM passes them to
 * apply_chat_template: `user` (user text): messages (text parts of a
 * content array joined with "\n", a tool call's arguments string parsed
 * into an object), tools (NULL: None), documents (None when absent) and
 * each member of chat_template_kwargs; `trusted`: add_generation_prompt,
 * bos_token, eos_token.  0, or -1 out of memory.
 */
int nalar_chat_template_vars(json_t *root, json_t *tools,
                             int add_generation_prompt, const char *bos,
                             const char *eos, json_t **user,
                             json_t **trusted);

/*
 * Renders t with the variables and cuts the text into pieces: markup
 * (special = 1) and user text (special = 0), then `open` (markup, NULL:
 * none) after it.  *pieces ((*n)) point into *text and `open`; both
 * malloc'd.  0, or an HTTP status with msg: 400 for the template's own
 * failure on this request (raise_exception: its message; a bound passed,
 * an undefined value used), 500 out of memory.
 */
int nalar_chat_template_render(const nalar_chat_template *t, json_t *user,
                               json_t *trusted, const char *open,
                               nalar_tok_text **pieces, int32_t *n,
                               char **text, char *msg, size_t cap);

/* The pieces of a rendered text: markup and user spans alternating. */
nalar_tok_text *nalar_chat_template_pieces(const nalar_jinja_out *out,
                                           const char *open, int32_t *n);

/* What a request's deferred render needs. */
typedef struct {
    const nalar_chat_template  *tmpl;   /* outlives the prompt */
    json_t                     *root;   /* the request body: a reference is
                                           taken */
    json_t                     *tools;  /* in root: the tools shown, or
                                           NULL */
    int                         add_generation_prompt;
    const char                 *bos;    /* copied */
    const char                 *eos;
    const char                 *open;   /* static: after the render, or
                                           NULL */
} nalar_chat_job;

/* The engine prompt that renders job at intake (nalar_prompt_deferred);
 * NULL with err. */
nalar_prompt *nalar_chat_template_prompt(const nalar_chat_job *job,
                                         nalar_err *err);

#endif
