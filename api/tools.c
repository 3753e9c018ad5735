/*
 * Tool calls in a chat answer (see api/tools.h).  The work per take
 * is linear in the take's text: the JSON of the calls is scanned once, a
 * byte at a time, keeping the depth, whether it is in a string, and the
 * key of the call object it is in.
 */
#include <stdlib.h>
#include <string.h>

#include "tools.h"

/* where in a call object (depth 1) the scanner is */
enum {
    OBJ_KEY = 0,        /* before a key */
    OBJ_IN_KEY,
    OBJ_COLON,
    OBJ_VALUE,          /* before a value */
    OBJ_IN_VALUE,
    OBJ_AFTER           /* after a value */
};

enum { KEY_OTHER = 0, KEY_NAME, KEY_ARGS };

static void scan_string(nalar_tool_parser *p, nalar_tool_call *c, char ch);
static void scan_punct(nalar_tool_parser *p, nalar_tool_call *c, char ch);


static int
buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    char    *nb;
    size_t   c;

    if (n == 0) {
        return 0;
    }

    if (*len + n > *cap) {
        c = *cap ? *cap : 64;
        while (c < *len + n) {
            c *= 2;
        }
        nb = realloc(*buf, c);
        if (nb == NULL) {
            return -1;
        }
        *buf = nb;
        *cap = c;
    }

    memcpy(*buf + *len, s, n);
    *len += n;

    return 0;
}


static int
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}


void
nalar_toolp_init(nalar_tool_parser *p, const nalar_chat_call_format *fmt,
                 const nalar_tokenizer *tok, int forced)
{
    int32_t  id;

    memset(p, 0, sizeof(*p));
    p->fmt = fmt;
    p->tok = tok;
    p->opener_id = -1;
    p->state = forced ? NALAR_TOOLP_CALLS : NALAR_TOOLP_UNDECIDED;

    if (tok != NULL && fmt->opener[0] != '\0') {
        id = nalar_tok_lookup(tok, fmt->opener, strlen(fmt->opener));
        if (id >= 0 && nalar_tok_is_control(tok, id)) {
            p->opener_id = id;
        }
    }
}


void
nalar_toolp_free(nalar_tool_parser *p)
{
    size_t  i;

    for (i = 0; i < p->n_calls; i++) {
        free(p->calls[i].args);
    }

    free(p->calls);
    free(p->out);
    free(p->held);
    memset(p, 0, sizeof(*p));
}


/* A new call object opens: it takes the place of a previous one that got
 * no name. */

static nalar_tool_call *
call_open(nalar_tool_parser *p)
{
    size_t            cap;
    nalar_tool_call  *c, *nc;

    if (p->n_calls > 0 && !p->calls[p->n_calls - 1].named) {
        c = &p->calls[p->n_calls - 1];
        c->args_len = 0;
        c->name_len = 0;
        c->complete = 0;
        return c;
    }

    if (p->n_calls == p->cap_calls) {
        cap = p->cap_calls ? p->cap_calls * 2 : 4;
        nc = realloc(p->calls, cap * sizeof(nalar_tool_call));
        if (nc == NULL) {
            return NULL;
        }
        p->calls = nc;
        p->cap_calls = cap;
    }

    c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof(*c));

    return c;
}


static int
args_add(nalar_tool_parser *p, nalar_tool_call *c, const char *s, size_t n)
{
    if (buf_add(&c->args, &c->args_len, &c->args_cap, s, n) != 0) {
        p->failed = 1;
        return -1;
    }

    return 0;
}


static void
args_end(nalar_tool_parser *p, nalar_tool_call *c)
{
    p->in_args = 0;
    p->args_prim = 0;
}


static void
key_done(nalar_tool_parser *p)
{
    size_t  n;

    n = p->key_len;

    if (n == 4 && memcmp(p->key, "name", 4) == 0) {
        p->key_kind = KEY_NAME;

    } else if (n == strlen(p->fmt->args_key)
               && memcmp(p->key, p->fmt->args_key, n) == 0)
    {
        p->key_kind = KEY_ARGS;

    } else {
        p->key_kind = KEY_OTHER;
    }
}


/*
 * The model's text, a byte at a time, through the calls' JSON: a call
 * opens at '{' between calls; inside one, strings (scan_string) and
 * structure (scan_punct) move the object's state, and the arguments'
 * bytes are copied as they pass.  0, or -1 out of memory.
 */

static int
scan(nalar_tool_parser *p, const char *s, size_t len)
{
    char              ch;
    size_t            i;
    nalar_tool_call  *c;

    c = p->n_calls ? &p->calls[p->n_calls - 1] : NULL;

    for (i = 0; i < len; i++) {
        ch = s[i];

        if (p->depth == 0) {
            /* between calls: anything but an object is skipped */
            if (ch == '{') {
                c = call_open(p);
                if (c == NULL) {
                    p->failed = 1;
                    return -1;
                }
                p->depth = 1;
                p->obj = OBJ_KEY;
                p->in_str = 0;
                p->esc = 0;
                p->in_args = 0;
            }
            continue;
        }

        /* a primitive value (number, true, false, null) has no
         * whitespace: what follows it is not its */
        if (p->in_args && !(p->args_prim && is_space(ch))
            && args_add(p, c, &ch, 1) != 0)
        {
            return -1;
        }

        if (p->in_str) {
            scan_string(p, c, ch);
            continue;
        }

        if (p->depth == 1 && p->obj == OBJ_VALUE && !is_space(ch)) {
            p->obj = OBJ_IN_VALUE;

            if (p->key_kind == KEY_ARGS) {
                p->in_args = 1;
                p->args_prim = (ch != '{' && ch != '[' && ch != '"');
                if (args_add(p, c, &ch, 1) != 0) {
                    return -1;
                }
            }
        }

        scan_punct(p, c, ch);
    }

    return 0;
}


/* A byte inside a string: its end, or a key's or a name's byte. */

static void
scan_string(nalar_tool_parser *p, nalar_tool_call *c, char ch)
{
    if (p->esc) {
        p->esc = 0;

    } else if (ch == '\\') {
        p->esc = 1;

    } else if (ch == '"') {
        p->in_str = 0;

        if (p->depth == 1) {
            if (p->obj == OBJ_IN_KEY) {
                key_done(p);
                p->obj = OBJ_COLON;

            } else if (p->obj == OBJ_IN_VALUE) {
                if (p->key_kind == KEY_NAME) {
                    c->named = 1;
                }
                if (p->in_args) {
                    args_end(p, c);
                }
                p->obj = OBJ_AFTER;
            }
        }
        return;
    }

    if (p->depth == 1 && p->obj == OBJ_IN_KEY
        && p->key_len < sizeof(p->key))
    {
        p->key[p->key_len++] = ch;

    } else if (p->depth == 1 && p->obj == OBJ_IN_VALUE
               && p->key_kind == KEY_NAME
               && c->name_len < NALAR_TOOL_NAME_MAX - 1)
    {
        c->name[c->name_len++] = ch;
    }
}


/* A byte outside strings: a string's start, nesting, ',' and ':'. */

static void
scan_punct(nalar_tool_parser *p, nalar_tool_call *c, char ch)
{
    switch (ch) {

    case '"':
        p->in_str = 1;
        if (p->depth == 1 && p->obj == OBJ_KEY) {
            p->obj = OBJ_IN_KEY;
            p->key_len = 0;
        } else if (p->depth == 1 && p->obj == OBJ_IN_VALUE
                   && p->key_kind == KEY_NAME)
        {
            c->name_len = 0;
        }
        break;

    case '{':
    case '[':
        p->depth++;
        break;

    case '}':
    case ']':
        p->depth--;

        if (p->depth == 1 && p->in_args && !p->args_prim) {
            args_end(p, c);
            p->obj = OBJ_AFTER;

        } else if (p->depth == 0) {
            if (p->in_args) {
                /* the '}' that closed a primitive value's object */
                c->args_len--;
                args_end(p, c);
            }
            c->complete = 1;
        }
        break;

    case ',':
        if (p->depth == 1) {
            if (p->in_args) {
                c->args_len--;
                args_end(p, c);
            }
            p->obj = OBJ_KEY;
        }
        break;

    case ':':
        if (p->depth == 1 && p->obj == OBJ_COLON) {
            p->obj = OBJ_VALUE;
        }
        break;

    default:
        break;
    }
}


static int
out_add(nalar_tool_parser *p, const char *s, size_t n)
{
    if (buf_add(&p->out, &p->out_len, &p->out_cap, s, n) != 0) {
        p->failed = 1;
        return -1;
    }

    return 0;
}


static int
held_add(nalar_tool_parser *p, const char *s, size_t n)
{
    if (buf_add(&p->held, &p->held_len, &p->held_cap, s, n) != 0) {
        p->failed = 1;
        return -1;
    }

    return 0;
}


/* The answer is content: what was held goes out. */

static int
to_content(nalar_tool_parser *p)
{
    p->state = NALAR_TOOLP_CONTENT;

    if (p->held_len && out_add(p, p->held, p->held_len) != 0) {
        return -1;
    }

    p->held_len = 0;

    return 0;
}


static int
to_calls(nalar_tool_parser *p)
{
    p->state = NALAR_TOOLP_CALLS;

    return scan(p, p->held, p->held_len);
}


/* Whether the confirmed ids open with the opener's control token (after
 * tokens of whitespace): then the answer is calls. */

static int
opened_by_id(nalar_tool_parser *p, const int32_t *ids, int32_t n_ids)
{
    int      k, m;
    char     b[64];
    int32_t  i;

    if (p->opener_id < 0) {
        return 0;
    }

    for (k = 0; (size_t) k < p->held_len; k++) {
        if (!is_space(p->held[k])) {
            return 0;
        }
    }

    for (i = 0; i < n_ids; i++) {
        if (ids[i] == p->opener_id) {
            return 1;
        }

        m = nalar_token_bytes(p->tok, ids[i], b, sizeof(b));

        for (k = 0; k < m; k++) {
            if (!is_space(b[k])) {
                return 0;
            }
        }
    }

    return 0;
}


int
nalar_toolp_feed(nalar_tool_parser *p, const char *text, size_t len,
                 const int32_t *ids, int32_t n_ids)
{
    size_t       k, n;
    const char  *t, *op;

    if (p->failed) {
        return -1;
    }

    switch (p->state) {

    case NALAR_TOOLP_CONTENT:
        return out_add(p, text, len);

    case NALAR_TOOLP_CALLS:
        if (held_add(p, text, len) != 0) {
            return -1;
        }
        return scan(p, text, len);

    default:
        break;
    }

    if (opened_by_id(p, ids, n_ids)) {
        if (held_add(p, text, len) != 0) {
            return -1;
        }
        return to_calls(p);
    }

    if (held_add(p, text, len) != 0) {
        return -1;
    }

    for (k = 0; k < p->held_len && is_space(p->held[k]); k++) {
        /* the leading whitespace */
    }

    if (k == p->held_len) {
        return 0;
    }

    t = p->held + k;
    n = p->held_len - k;
    op = p->fmt->opener;

    if (op[0] == '\0') {
        /* llama3: the call is the answer's JSON object */
        return t[0] == '{' ? to_calls(p) : to_content(p);
    }

    if (n >= strlen(op) && memcmp(t, op, strlen(op)) == 0) {
        return to_calls(p);
    }

    if (n < strlen(op) && memcmp(t, op, n) == 0) {
        /* maybe the opener: held */
        return 0;
    }

    return to_content(p);
}


int
nalar_toolp_finish(nalar_tool_parser *p)
{
    size_t  i;

    if (p->failed) {
        return -1;
    }

    if (p->state == NALAR_TOOLP_UNDECIDED
        || (p->state == NALAR_TOOLP_CALLS && nalar_toolp_n_named(p) == 0))
    {
        for (i = 0; i < p->n_calls; i++) {
            free(p->calls[i].args);
        }
        p->n_calls = 0;

        return to_content(p);
    }

    return 0;
}


const char *
nalar_toolp_take_content(nalar_tool_parser *p, size_t *len)
{
    *len = p->out_len;
    p->out_len = 0;

    return p->out;
}


size_t
nalar_toolp_n_named(const nalar_tool_parser *p)
{
    if (p->n_calls > 0 && !p->calls[p->n_calls - 1].named) {
        return p->n_calls - 1;
    }

    return p->n_calls;
}
