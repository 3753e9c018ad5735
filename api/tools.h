/*
 * Tool calls in a chat answer: the answer's text, as the engine confirms
 * it, split into content and the calls the model wrote in its chat style's
 * format (nalar_chat_call_format), each call's name and the text of its
 * arguments as they arrive, for the response to send as OpenAI's
 * tool_calls (whole, or streamed as fragments).  No nginx dependency.
 *
 * An answer is calls when it opens (after whitespace) with the style's
 * opener: its text ("<tool_call>"), its control token (seen among the
 * confirmed ids, since a control token writes no text), or for llama3 the
 * call's own "{".  Until that is decided the text is held; an answer whose
 * calls hold no complete function name is content after all, the held text
 * included.  After the opener each top-level JSON object is a call; text
 * between them (closers, brackets, commas) is skipped.
 */
#ifndef NGX_NALAR_TOOLS_H
#define NGX_NALAR_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "tokenizer.h"

#define NALAR_TOOL_NAME_MAX  256

typedef struct {
    char          id[48];       /* the response's, once announced */
    char          name[NALAR_TOOL_NAME_MAX];
    size_t        name_len;
    char         *args;         /* the arguments' JSON text so far */
    size_t        args_len;
    size_t        args_cap;
    size_t        args_sent;    /* the response's: streamed so far */
    unsigned      named:1;      /* the name is complete */
    unsigned      announced:1;  /* the response's: its first chunk sent */
    unsigned      complete:1;   /* its object is closed */
} nalar_tool_call;

typedef enum {
    NALAR_TOOLP_UNDECIDED = 0,
    NALAR_TOOLP_CONTENT,
    NALAR_TOOLP_CALLS
} nalar_toolp_state;

typedef struct {
    const nalar_chat_call_format *fmt;
    const nalar_tokenizer        *tok;
    int32_t            opener_id;   /* the opener's control token, or -1 */
    nalar_toolp_state  state;

    /* content not yet taken (nalar_toolp_take_content) */
    char              *out;
    size_t             out_len;
    size_t             out_cap;

    /* the answer's text since it may be calls: given back as content when
     * it holds none */
    char              *held;
    size_t             held_len;
    size_t             held_cap;

    nalar_tool_call   *calls;       /* the last one may be unnamed yet */
    size_t             n_calls;
    size_t             cap_calls;

    /* the scanner over the calls' JSON */
    int                depth;
    int                obj;         /* where in a call object */
    int                key_kind;    /* the current key: other, name, args */
    char               key[16];
    size_t             key_len;
    unsigned           in_str:1;
    unsigned           esc:1;
    unsigned           in_args:1;   /* the bytes are the arguments' */
    unsigned           args_prim:1; /* a primitive value: ends at , or } */
    unsigned           failed:1;    /* out of memory */
} nalar_tool_parser;

/*
 * forced: the prompt ended with the style's call opener and the answer is
 * the call's JSON.  The opener's control token, if the vocabulary has one,
 * is looked up in tok.
 */
void nalar_toolp_init(nalar_tool_parser *p, const nalar_chat_call_format *fmt,
                      const nalar_tokenizer *tok, int forced);
void nalar_toolp_free(nalar_tool_parser *p);

/* One take of the engine's output: its text and confirmed ids.  0, or -1
 * when out of memory. */
int nalar_toolp_feed(nalar_tool_parser *p, const char *text, size_t len,
                     const int32_t *ids, int32_t n_ids);

/* The answer is over: what is still undecided, or calls without a name,
 * become content.  0, or -1 when out of memory. */
int nalar_toolp_finish(nalar_tool_parser *p);

/* The content since the last take (*len 0: none); valid until the next
 * call on the parser. */
const char *nalar_toolp_take_content(nalar_tool_parser *p, size_t *len);

/* The calls with a complete name (the first n of p->calls). */
size_t nalar_toolp_n_named(const nalar_tool_parser *p);

#endif
