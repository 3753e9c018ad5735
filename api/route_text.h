/*
 * The leading prompt text of an OpenAI completions or chat completions
 * body, which the edge's $nalar_route_key digests (ngx_nalar_route.c):
 *
 *   completions: the prompt's first `cap` bytes (of the first prompt of a
 *   batch; token ids as their decimal text, comma-separated);
 *   chat: the leading system or developer messages, or where the first
 *   message is neither, the first message; each message as 0x1e, then its
 *   role as ROLE 0x1f and its content's text (a string, or the "text" of
 *   its parts), in the order the body has them; the first `cap` bytes.
 *
 * Strings are decoded (escapes, surrogate pairs; an invalid escape is
 * U+FFFD).  Only `len` bytes are read, and only up to the end of the
 * text: a message cut off there before its role is known is left out.
 * The model, where the body names it before the prompt, goes to `model`
 * (at most model_cap bytes).  Returns the text's length: 0 when the body
 * has none (not JSON, no prompt, or one that begins past `len`).
 *
 * No nginx dependency, no shared state: safe on any thread.
 */
#ifndef NGX_NALAR_ROUTE_TEXT_H
#define NGX_NALAR_ROUTE_TEXT_H

#include <stddef.h>

size_t nalar_route_text(const unsigned char *body, size_t len, int chat,
    unsigned char *out, size_t cap, unsigned char *model, size_t model_cap,
    size_t *model_len);

#endif
