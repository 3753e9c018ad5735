/*
 * Chat templates: turn OpenAI `messages` into the prompt text a chat model
 * was trained on.  Jinja is not interpreted; the model's
 * tokenizer.chat_template is recognised as one of the common styles by its
 * marker tokens, and the style is rendered here.  No nginx dependency.
 */
#ifndef NGX_NALAR_CHAT_H
#define NGX_NALAR_CHAT_H

#include <stddef.h>

#include <jansson.h>

#include "nalar_err.h"
#include "tokenizer.h"

typedef enum {
    NALAR_CHAT_AUTO = 0,     /* from the model's tokenizer.chat_template */
    NALAR_CHAT_CHATML,       /* <|im_start|>role\n...<|im_end|>\n */
    NALAR_CHAT_LLAMA2,       /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    NALAR_CHAT_LLAMA3,       /* <|start_header_id|>role<|end_header_id|> */
    NALAR_CHAT_ZEPHYR,       /* <|user|>\n...</s>\n */
    NALAR_CHAT_MISTRAL,      /* [INST]...[/INST]...</s> (v3 tekken) */
    NALAR_CHAT_GEMMA,        /* <start_of_turn>role\n...<end_of_turn>\n */
    NALAR_CHAT_PHI3,         /* <|user|>\n...<|end|>\n */
    NALAR_CHAT_MISTRAL_V7,   /* [SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...
                                (v7 tekken) */
    NALAR_CHAT_MISTRAL_V1,   /* " [INST] ... [/INST] ...</s>" */
    NALAR_CHAT_MISTRAL_V3,   /* [INST] ...[/INST] ...</s> */
    NALAR_CHAT_MISTRAL_V7_SPM  /* [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT]
                                  [INST] ...[/INST] ...</s> */
} nalar_chat_style;

typedef struct {
    const char           *role;    /* system, developer, user, assistant,
                                      tool */
    size_t                role_len;
    const nalar_tok_text *parts;   /* the content: literal UTF-8 text */
    size_t                n_parts;
} nalar_chat_msg;

/*
 * Tool calling (OpenAI `tools`): what the messages carry beyond their
 * content, and the tools to render.  All of it is the client's: rendered
 * as literal text, never as control tokens.
 */
typedef struct {
    const json_t  *tool_calls;      /* an assistant's: OpenAI's tool_calls
                                       array, or NULL */
    const json_t  *tool_call_id;    /* a tool message's: the id (a
                                       string) of the call it answers, or
                                       NULL */
} nalar_chat_tool_msg;

typedef struct {
    const json_t               *tools;      /* the tools array to render
                                               (NULL or empty: none) */
    const nalar_chat_tool_msg  *msgs;       /* (n) one per message */
    int                         open_call;  /* the generation prompt ends
                                               with the style's call opener:
                                               the answer is a call */
} nalar_chat_tools;

/*
 * How a style's model writes tool calls in its answer:
 *   chatml:  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *   llama3:  {"name": ..., "parameters": {...}}
 *   mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
 * NULL: the style has no tool format.
 */
typedef struct {
    const char  *opener;        /* what opens the calls ("" : the call's
                                   JSON itself, llama3) */
    const char  *closer;        /* what closes each call, or NULL */
    const char  *args_key;      /* "arguments" or "parameters" */
    const char  *prompt_open;   /* appended to the generation prompt for a
                                   call that must be made: then the answer
                                   is the one call's JSON object */
    int          id_len;        /* the ids the style's templates take: 9
                                   alphanumerics (Mistral), or 0: any */
} nalar_chat_call_format;

const nalar_chat_call_format *nalar_chat_call_format_of(nalar_chat_style s);

/* "chatml", "llama2", "llama3", "zephyr", "mistral", "gemma", "phi3",
 * "mistral-v7", "mistral-v1", "mistral-v3", "mistral-v7-spm", "auto"; -1
 * when unknown. */
int nalar_chat_style_parse(const char *name, size_t len);
const char *nalar_chat_style_name(nalar_chat_style s);

/* The style of a Jinja template (NULL: no template): ChatML when nothing
 * is recognised, as llama.cpp does. */
nalar_chat_style nalar_chat_style_detect(const char *jinja);

/*
 * Renders the messages followed by the assistant's generation prompt, as
 * pieces of text to be tokenized one after the other
 * (nalar_tokenize_bounded): the template's markup (special = 1, where its
 * control tokens are parsed) and the messages' content parts (special = 0:
 * what a user writes never becomes a control token).  The BOS token is not
 * written: the tokenizer adds it.  The pieces point into msgs and static
 * text.  Returns a malloc'd array (length in *n_pieces), or NULL with err
 * (unknown role, out of memory).
 */
nalar_tok_text *nalar_chat_render(nalar_chat_style s,
                                  const nalar_chat_msg *msgs, size_t n,
                                  size_t *n_pieces, nalar_err *err);

/*
 * nalar_chat_render with tools: the tools in the style's format, an
 * assistant's tool_calls and tool messages (tool_call_id) rendered back,
 * and with open_call the style's call opener after the generation prompt.
 * A style with no tool format refuses tools and tool calls.  tools NULL:
 * as nalar_chat_render.  The pieces may point into the returned array's
 * own memory (JSON written here): free the array only.
 */
nalar_tok_text *nalar_chat_render_tools(nalar_chat_style s,
                                        const nalar_chat_msg *msgs, size_t n,
                                        const nalar_chat_tools *tools,
                                        size_t *n_pieces, nalar_err *err);

/*
 * OpenAI's content value: a string, null (no text), or an array of
 * {"type": "text", "text": ...} parts, whose texts follow one another (the
 * tokenizer encodes adjacent literal pieces as one text).  Fills `parts`
 * (room for nalar_chat_n_parts(content)) with literal pieces pointing into
 * the JSON; returns their number, or -1 with err ("content[2]: only text
 * parts are supported").
 */
int nalar_chat_content(const json_t *content, nalar_tok_text *parts,
                       nalar_err *err);
size_t nalar_chat_n_parts(const json_t *content);

/* The text that ends an assistant turn in this style (a stop string for
 * vocabularies where it is not a single end-of-generation token). */
const char *nalar_chat_stop(nalar_chat_style s);

#endif
