/*
 * libFuzzer target for the chat templates (api/chat.c).  Byte 0:
 *   0xff: the rest is a Jinja template: nalar_chat_style_detect must name a
 *         style, ChatML whenever "<|im_start|>" is in it; and the rest as a
 *         style name must parse back to itself or be refused;
 *   else: style = byte 0 % 12 (auto, chatml, llama2, llama3, zephyr,
 *         mistral, gemma, phi3, mistral-v7, mistral-v1, mistral-v3,
 *         mistral-v7-spm), then
 *         messages as records [role][len][len bytes]: role 0-4 is system,
 *         developer, user, assistant, tool; a larger role byte r takes the
 *         first (r - 5) % 12 of the record's bytes as the role text.
 * nalar_chat_render must refuse any unknown role (and llama2 a tool
 * message, and a system message no user turn follows; mistral-v7 and
 * mistral-v7-spm a tool message; mistral and mistral-v3 a tool
 * message, and system messages when the last other message is not a user
 * turn; mistral-v1 a tool message, and system messages with no user turn;
 * gemma a system message after the first other message, or leading
 * ones no user turn follows) with a reason, and otherwise return pieces
 * whose text ends with the style's generation prompt and holds every
 * message's content in order (gemma: trimmed; mistral-v3: assistant
 * content trimmed; mistral, mistral-v1, mistral-v3: the system messages
 * anywhere), where no piece of a message's content is markup (special).
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=chat
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

#define MAX_MSGS 64


static void
die(const char *what)
{
    fprintf(stderr, "fuzz_chat: %s\n", what);
    abort();
}


static int
is_role(const nalar_chat_msg *m, const char *r)
{
    return m->role_len == strlen(r) && memcmp(m->role, r, m->role_len) == 0;
}


static void
template(const uint8_t *d, size_t n)
{
    char *s = malloc(n + 1);
    int   st;

    if (s == NULL) {
        return;
    }
    memcpy(s, d, n);
    s[n] = '\0';
    st = nalar_chat_style_detect(s);
    if (st < NALAR_CHAT_CHATML || st > NALAR_CHAT_MISTRAL_V7_SPM) {
        die("detect gave no style");
    }
    if (strstr(s, "<|im_start|>") != NULL && st != NALAR_CHAT_CHATML) {
        die("a ChatML template detected as another style");
    }
    st = nalar_chat_style_parse(s, n);
    if (st >= 0 && strcmp(nalar_chat_style_name(st), s) != 0) {
        die("style name does not parse back");
    }
    free(s);
}


static const char *
gen_prompt(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_LLAMA3:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case NALAR_CHAT_ZEPHYR:
        return "<|assistant|>\n";
    case NALAR_CHAT_LLAMA2:
    case NALAR_CHAT_MISTRAL:
    case NALAR_CHAT_MISTRAL_V7:
    case NALAR_CHAT_MISTRAL_V1:
    case NALAR_CHAT_MISTRAL_V3:
    case NALAR_CHAT_MISTRAL_V7_SPM:
        return "";
    case NALAR_CHAT_GEMMA:
        return "<start_of_turn>model\n";
    case NALAR_CHAT_PHI3:
        return "<|assistant|>\n";
    default:
        return "<|im_start|>assistant\n";
    }
}


/*
 * The input as messages: each a role byte (0-4 a known role, else a role
 * of up to 11 bytes of the text), a length byte and the text.  Sets
 * *unknown where a role is not one of the five, *tool where one is tool.
 */
static size_t
decode_msgs(const uint8_t *data, size_t size, nalar_chat_msg *msgs,
            nalar_tok_text *parts, int *unknown, int *tool)
{
    static const char *roles[] = { "system", "developer", "user",
                                   "assistant", "tool" };
    size_t n = 0, i = 1;

    while (i + 2 <= size && n < MAX_MSGS) {
        uint8_t r = data[i], l = data[i + 1];
        size_t  avail = size - i - 2, cl = l < avail ? l : avail;
        size_t  rl = r < 5 ? 0 : (size_t) (r - 5) % 12;

        rl = rl < cl ? rl : cl;
        if (r < 5) {
            msgs[n].role = roles[r];
            msgs[n].role_len = strlen(roles[r]);
        } else {
            msgs[n].role = (const char *) data + i + 2;
            msgs[n].role_len = rl;
        }
        parts[n].text = (const char *) data + i + 2 + rl;
        parts[n].len = cl - rl;
        parts[n].special = 0;
        msgs[n].parts = &parts[n];
        msgs[n].n_parts = 1;
        if (!(is_role(&msgs[n], "system") || is_role(&msgs[n], "developer")
              || is_role(&msgs[n], "user") || is_role(&msgs[n], "assistant")
              || is_role(&msgs[n], "tool")))
        {
            *unknown = 1;
        }
        *tool |= is_role(&msgs[n], "tool");
        n++;
        i += 2 + cl;
    }
    return n;
}


/* 1 where the style must refuse these messages (a system message it has
 * no place for, a tool turn it cannot show, an unknown role). */
static int
must_refuse(nalar_chat_style style, const nalar_chat_msg *msgs, size_t n,
            int unknown, int tool)
{
    int orphan = 0;

    if (style == NALAR_CHAT_LLAMA2 && !unknown && !tool) {
        /* llama2 puts system messages into the next user turn: one that
         * no user turn follows (before an assistant turn or the end) is
         * refused */
        int pending = 0;

        for (size_t k = 0; k < n && !orphan; k++) {
            if (is_role(&msgs[k], "user")) {
                pending = 0;
            } else if (is_role(&msgs[k], "assistant")) {
                orphan = pending;
            } else {
                pending = 1;
            }
        }
        orphan |= pending;
    }
    if ((style == NALAR_CHAT_MISTRAL || style == NALAR_CHAT_MISTRAL_V1
         || style == NALAR_CHAT_MISTRAL_V3) && !unknown)
    {
        /* system messages go into the last message, a user turn (v1: the
         * first user turn) */
        int sys = 0, last_user = 0, any_user = 0;

        for (size_t k = 0; k < n; k++) {
            if (is_role(&msgs[k], "system")
                || is_role(&msgs[k], "developer"))
            {
                sys = 1;
            } else {
                last_user = is_role(&msgs[k], "user");
                any_user |= last_user;
            }
        }
        orphan = tool || (sys && !(style == NALAR_CHAT_MISTRAL_V1
                                   ? any_user : last_user));
    }
    if (style == NALAR_CHAT_GEMMA && !unknown) {
        /* system messages only at the start, a user turn after them */
        size_t lead = 0;

        while (lead < n && (is_role(&msgs[lead], "system")
                            || is_role(&msgs[lead], "developer")))
        {
            lead++;
        }
        orphan = lead > 0 && (lead == n || !is_role(&msgs[lead], "user"));
        for (size_t k = lead; k < n; k++) {
            orphan |= is_role(&msgs[k], "system")
                      || is_role(&msgs[k], "developer");
        }
    }
    return unknown || (style == NALAR_CHAT_LLAMA2 && (tool || orphan))
           || ((style == NALAR_CHAT_MISTRAL || style == NALAR_CHAT_GEMMA
                || style == NALAR_CHAT_MISTRAL_V1
                || style == NALAR_CHAT_MISTRAL_V3)
               && orphan)
           || ((style == NALAR_CHAT_MISTRAL_V7
                || style == NALAR_CHAT_MISTRAL_V7_SPM) && tool);
}


/*
 * A rendering of known roles: no message's content in a special piece,
 * the generation prompt at the end, and each message's content (trimmed
 * where the style trims it) in order.  Frees pieces.
 */
static void
check_rendered(nalar_chat_style style, const nalar_chat_msg *msgs,
               const nalar_tok_text *parts, size_t n, nalar_tok_text *pieces,
               size_t n_pieces)
{
    size_t      len = 0, at = 0;
    const char *gp;
    char       *text, *p;

    /* what the client wrote is literal: a piece that points into a
     * message's content is never one whose control tokens are parsed (the
     * role, checked against the known roles above, may be markup) */
    for (size_t k = 0; k < n_pieces; k++) {
        for (size_t m = 0; pieces[k].special && m < n; m++) {
            if (pieces[k].len > 0 && pieces[k].text >= parts[m].text
                && pieces[k].text < parts[m].text + parts[m].len)
            {
                die("a message's content is a special piece");
            }
        }
        len += pieces[k].len;
    }
    text = malloc(len + 1);
    if (text == NULL) {
        die("out of memory");
    }
    len = 0;
    for (size_t k = 0; k < n_pieces; k++) {
        if (pieces[k].len > 0) {
            memcpy(text + len, pieces[k].text, pieces[k].len);
        }
        len += pieces[k].len;
    }
    text[len] = '\0';
    free(pieces);
    gp = gen_prompt(style);
    if (len < strlen(gp) || strcmp(text + len - strlen(gp), gp) != 0) {
        die("rendered text does not end with the generation prompt");
    }
    for (size_t k = 0; k < n; k++) {
        const char *c = parts[k].text;
        size_t      cl = parts[k].len, from = at;
        int         anywhere = 0;

        if ((style == NALAR_CHAT_GEMMA && !(is_role(&msgs[k], "system")
                                            || is_role(&msgs[k], "developer")))
            || (style == NALAR_CHAT_MISTRAL_V3
                && is_role(&msgs[k], "assistant")))
        {
            while (cl > 0 && strchr(" \t\n\r\v\f", *c) != NULL && *c) {
                c++;
                cl--;
            }
            while (cl > 0 && c[cl - 1] != '\0'
                   && strchr(" \t\n\r\v\f", c[cl - 1]) != NULL)
            {
                cl--;
            }
        }
        if ((style == NALAR_CHAT_MISTRAL || style == NALAR_CHAT_MISTRAL_V1
             || style == NALAR_CHAT_MISTRAL_V3)
            && (is_role(&msgs[k], "system")
                || is_role(&msgs[k], "developer")))
        {
            from = 0;
            anywhere = 1;
        }
        p = cl == 0 ? text + from : memmem(text + from, len - from, c, cl);
        if (p == NULL) {
            die("a message's content is missing or out of order");
        }
        if (!anywhere) {
            at = (size_t) (p - text) + cl;
        }
    }
    free(text);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nalar_chat_msg    msgs[MAX_MSGS];
    nalar_tok_text    parts[MAX_MSGS], *pieces;
    nalar_chat_style  style;
    nalar_err         err;
    size_t            n, n_pieces = 0;
    int               unknown = 0, tool = 0;

    if (size == 0) {
        return 0;
    }
    if (data[0] == 0xff) {
        template(data + 1, size - 1);
        return 0;
    }
    style = (nalar_chat_style) (data[0] % 12);
    n = decode_msgs(data, size, msgs, parts, &unknown, &tool);

    err.msg[0] = '\0';
    pieces = nalar_chat_render(style, msgs, n, &n_pieces, &err);
    if (must_refuse(style, msgs, n, unknown, tool)) {
        if (pieces != NULL || err.msg[0] == '\0') {
            die("a message of an unknown role was rendered");
        }
        if (unknown && strstr(err.msg, "unknown role") == NULL) {
            die("the refusal does not say the role is unknown");
        }
        return 0;
    }
    if (pieces == NULL) {
        fprintf(stderr, "fuzz_chat: %s\n", err.msg);
        die("render failed on known roles");
    }
    check_rendered(style, msgs, parts, n, pieces, n_pieces);
    return 0;
}
