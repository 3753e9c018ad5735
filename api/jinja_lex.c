/*
 * The template's tokens, as jinja2's lexer makes them with trim_blocks and
 * lstrip_blocks on: text between tags (with {%- -%} {{- -}} whitespace
 * control, a block's or comment's first newline after it dropped, and the
 * blanks before a block or comment alone on its line dropped), and inside
 * each tag the names, literals and operators of its expression.  The
 * source's newlines are normalised to "\n" and one final newline dropped,
 * as jinja2 does (keep_trailing_newline=False).
 */
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

typedef struct {
    jj_base     *b;
    const char  *s;
    size_t       n;
    size_t       pos;
    int          line;
    jj_toks     *out;
} lexer;


static jj_tok *
emit(lexer *x, int type, const char *s, size_t len)
{
    jj_tok *t;

    if (x->out->n == x->out->cap) {
        size_t  cap = x->out->cap ? 2 * x->out->cap : 256;
        jj_tok *nv = jj_alloc(x->b, cap * sizeof(jj_tok));

        if (x->out->n > 0) {
            memcpy(nv, x->out->v, x->out->n * sizeof(jj_tok));
        }
        x->out->v = nv;
        x->out->cap = cap;
    }
    t = &x->out->v[x->out->n++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->line = x->line;
    t->s = s;
    t->len = len;
    return t;
}


static int
ws(char c)
{
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
}


/* moves to i, counting the newlines passed */
static void
advance(lexer *x, size_t i)
{
    for (size_t k = x->pos; k < i; k++) {
        x->line += x->s[k] == '\n';
    }
    x->pos = i;
}


static size_t
hexval(const char *s, size_t n, int *ok)
{
    size_t v = 0;

    for (size_t i = 0; i < n; i++) {
        char c = s[i];

        v <<= 4;
        if (c >= '0' && c <= '9') { v |= c - '0'; }
        else if (c >= 'a' && c <= 'f') { v |= c - 'a' + 10; }
        else if (c >= 'A' && c <= 'F') { v |= c - 'A' + 10; }
        else { *ok = 0; return 0; }
    }
    return v;
}


static size_t
put_utf8(char *d, uint32_t cp)
{
    if (cp < 0x80) { d[0] = (char) cp; return 1; }
    if (cp < 0x800) {
        d[0] = (char) (0xc0 | (cp >> 6));
        d[1] = (char) (0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char) (0xe0 | (cp >> 12));
        d[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
        d[2] = (char) (0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (char) (0xf0 | (cp >> 18));
    d[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
    d[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
    d[3] = (char) (0x80 | (cp & 0x3f));
    return 4;
}


/* a string literal's body, unescaped as Python's "unicode-escape" does */
static void
lex_string(lexer *x)
{
    char        q = x->s[x->pos];
    size_t      i = x->pos + 1, k = 0;
    char       *d;
    int         line = x->line;

    while (i < x->n && x->s[i] != q) {
        i += x->s[i] == '\\' ? 2 : 1;
    }
    if (i >= x->n) {
        jj_fail(x->b, line, "unexpected end of a string");
    }
    d = jj_alloc(x->b, i - x->pos + 1);
    for (size_t j = x->pos + 1; j < i; j++) {
        char     c = x->s[j];
        int      ok = 1;
        size_t   w = 0;
        uint32_t cp;

        if (c != '\\') {
            d[k++] = c;
            continue;
        }
        c = x->s[++j];
        switch (c) {
        case 'n': d[k++] = '\n'; continue;
        case 't': d[k++] = '\t'; continue;
        case 'r': d[k++] = '\r'; continue;
        case 'a': d[k++] = '\a'; continue;
        case 'b': d[k++] = '\b'; continue;
        case 'f': d[k++] = '\f'; continue;
        case 'v': d[k++] = '\v'; continue;
        case '\\': case '\'': case '"': d[k++] = c; continue;
        case '\n': continue;
        case 'x': w = 2; break;
        case 'u': w = 4; break;
        case 'U': w = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                for (int m = 0; m < 3 && j < i && x->s[j] >= '0'
                     && x->s[j] <= '7'; m++, j++)
                {
                    cp = cp * 8 + (uint32_t) (x->s[j] - '0');
                }
                j--;
                k += put_utf8(d + k, cp);
                continue;
            }
            d[k++] = '\\';
            d[k++] = c;
            continue;
        }
        if (j + w >= i) {
            jj_fail(x->b, line, "a truncated \\%c escape in a string", c);
        }
        cp = (uint32_t) hexval(x->s + j + 1, w, &ok);
        if (!ok || cp > 0x10ffff) {
            jj_fail(x->b, line, "a bad \\%c escape in a string", c);
        }
        j += w;
        k += put_utf8(d + k, cp);
    }
    emit(x, T_STR, d, k);
    advance(x, i + 1);
}


static void
lex_number(lexer *x)
{
    size_t  i = x->pos;
    int     is_float = 0;
    char    buf[128];
    size_t  k = 0;
    jj_tok *t;

    while (i < x->n && (((x->s[i] >= '0' && x->s[i] <= '9'))
                        || (x->s[i] == '_' && i + 1 < x->n
                            && x->s[i + 1] >= '0' && x->s[i + 1] <= '9')))
    {
        i++;
    }
    /* no float after a dot: "x.0.1" is attribute 0 then 1 */
    if (!(x->pos > 0 && x->s[x->pos - 1] == '.')) {
        if (i + 1 < x->n && x->s[i] == '.' && x->s[i + 1] >= '0'
            && x->s[i + 1] <= '9')
        {
            is_float = 1;
            i++;
            while (i < x->n && ((x->s[i] >= '0' && x->s[i] <= '9')
                                || x->s[i] == '_'))
            {
                i++;
            }
        }
        if (i < x->n && (x->s[i] == 'e' || x->s[i] == 'E')) {
            size_t j = i + 1;

            if (j < x->n && (x->s[j] == '+' || x->s[j] == '-')) {
                j++;
            }
            if (j < x->n && x->s[j] >= '0' && x->s[j] <= '9') {
                is_float = 1;
                i = j;
                while (i < x->n && x->s[i] >= '0' && x->s[i] <= '9') {
                    i++;
                }
            }
        }
    }
    for (size_t j = x->pos; j < i && k < sizeof(buf) - 1; j++) {
        if (x->s[j] != '_') {
            buf[k++] = x->s[j];
        }
    }
    buf[k] = 0;
    t = emit(x, is_float ? T_FLOAT : T_INT, x->s + x->pos, i - x->pos);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        t->i = strtoll(buf, NULL, 10);
    }
    advance(x, i);
}


static const char *const ops[] = {
    "**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"
};


/* the tokens of one tag's inside, up to and past its end ("%}" or "}}");
 * returns whether the end strips the whitespace after it ("-%}") or 1 +
 * that it keeps it ("+%}") */
static int
lex_tag(lexer *x, int block)
{
    int     depth = 0;
    char    e = block ? '%' : '}';

    for (;;) {
        size_t i = x->pos;

        while (i < x->n && ws(x->s[i])) {
            i++;
        }
        advance(x, i);
        if (i >= x->n) {
            jj_fail(x->b, x->line, "unexpected end of template inside a "
                    "tag (no closing '%s')", block ? "%}" : "}}");
        }
        if (depth == 0) {
            int strip = x->s[i] == '-' ? 1 : x->s[i] == '+' && block ? 2 : 0;
            size_t j = i + (strip != 0);

            if (j + 1 < x->n && x->s[j] == e && x->s[j + 1] == '}') {
                emit(x, block ? T_BEND : T_VEND, NULL, 0);
                advance(x, j + 2);
                return strip;
            }
        }
        if ((x->s[i] >= 'a' && x->s[i] <= 'z') || (x->s[i] >= 'A'
            && x->s[i] <= 'Z') || x->s[i] == '_')
        {
            size_t j = i;

            while (j < x->n && ((x->s[j] >= 'a' && x->s[j] <= 'z')
                   || (x->s[j] >= 'A' && x->s[j] <= 'Z') || x->s[j] == '_'
                   || (x->s[j] >= '0' && x->s[j] <= '9')))
            {
                j++;
            }
            emit(x, T_NAME, x->s + i, j - i);
            advance(x, j);
            continue;
        }
        if (x->s[i] >= '0' && x->s[i] <= '9') {
            lex_number(x);
            continue;
        }
        if (x->s[i] == '\'' || x->s[i] == '"') {
            lex_string(x);
            continue;
        }
        {
            size_t k;

            for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
                size_t l = strlen(ops[k]);

                if (i + l <= x->n && memcmp(x->s + i, ops[k], l) == 0) {
                    break;
                }
            }
            if (k == sizeof(ops) / sizeof(ops[0])) {
                jj_fail(x->b, x->line, "unexpected character '%c' in a tag",
                        x->s[i]);
            }
            if (strchr("([{", ops[k][0]) != NULL) {
                depth++;
            } else if (strchr(")]}", ops[k][0]) != NULL && depth > 0) {
                depth--;
            }
            emit(x, T_OP, ops[k], strlen(ops[k]));
            advance(x, i + strlen(ops[k]));
        }
    }
}


/* after a tag's end: "-%}" strips all whitespace, "%}" and "#}" (not
 * "+%}") one newline (trim_blocks); returns whether a line starts here */
static int
after_tag(lexer *x, int strip, int block_or_comment)
{
    size_t i = x->pos, start = x->pos;

    if (strip == 1) {
        while (i < x->n && ws(x->s[i])) {
            i++;
        }
    } else if (strip == 0 && block_or_comment && i < x->n
               && x->s[i] == '\n')
    {
        i++;
    }
    advance(x, i);
    return i > start ? x->s[i - 1] == '\n' : 0;
}


static void
lex_text_before(lexer *x, size_t start, int kind, int line_starting)
{
    size_t tlen = start - x->pos;
    char   mod = start + 2 < x->n ? x->s[start + 2] : 0;

    if (mod == '-') {
        while (tlen > 0 && ws(x->s[x->pos + tlen - 1])) {
            tlen--;
        }
    } else if (!(mod == '+' && kind != '{') && kind != '{') {
        /* lstrip_blocks: blanks alone before the tag on its line */
        size_t l = tlen;

        while (l > 0 && x->s[x->pos + l - 1] != '\n') {
            l--;
        }
        if (l > 0 || line_starting) {
            size_t k = l;

            while (k < tlen && (x->s[x->pos + k] == ' '
                                || x->s[x->pos + k] == '\t'))
            {
                k++;
            }
            if (k == tlen) {
                tlen = l;
            }
        }
    }
    if (tlen > 0) {
        emit(x, T_TEXT, x->s + x->pos, tlen);
    }
    advance(x, start + 2 + (mod == '-' || (mod == '+' && kind != '{')));
}


static void
lex_raw(lexer *x, int line_starting)
{
    /* {% raw %}...{% endraw %}: the text between, as it is */
    size_t      i = x->pos;
    const char *p;
    size_t      body;

    (void) line_starting;
    for (;;) {
        p = memmem(x->s + i, x->n - i, "{%", 2);
        if (p == NULL) {
            jj_fail(x->b, x->line, "missing endraw");
        }
        i = (size_t) (p - x->s);
        {
            size_t j = i + 2;

            if (j < x->n && (x->s[j] == '-' || x->s[j] == '+')) {
                j++;
            }
            while (j < x->n && ws(x->s[j])) {
                j++;
            }
            if (j + 6 <= x->n && memcmp(x->s + j, "endraw", 6) == 0) {
                body = i;
                if (x->s[i + 2] == '-') {
                    while (body > x->pos && ws(x->s[body - 1])) {
                        body--;
                    }
                }
                if (body > x->pos) {
                    emit(x, T_TEXT, x->s + x->pos, body - x->pos);
                }
                advance(x, j + 6);
                return;
            }
        }
        i += 2;
    }
}


static char *
normalise(jj_base *b, const char *src, size_t *len)
{
    char   *d = jj_alloc(b, *len + 1);
    size_t  k = 0;

    for (size_t i = 0; i < *len; i++) {
        if (src[i] == '\r') {
            d[k++] = '\n';
            if (i + 1 < *len && src[i + 1] == '\n') {
                i++;
            }
        } else {
            d[k++] = src[i];
        }
    }
    if (k > 0 && d[k - 1] == '\n') {
        k--;
    }
    d[k] = 0;
    *len = k;
    return d;
}


void
jj_lex(jj_base *b, const char *src, size_t len, jj_toks *out)
{
    lexer   x = { b, NULL, 0, 0, 1, out };
    int     line_starting = 1;

    x.s = normalise(b, src, &len);
    x.n = len;
    while (x.pos < x.n) {
        size_t      start = x.pos;
        const char *p;
        int         kind;

        for (;;) {
            p = memchr(x.s + start, '{', x.n - start);
            if (p == NULL || p + 1 >= x.s + x.n) {
                p = NULL;
                break;
            }
            start = (size_t) (p - x.s);
            if (p[1] == '{' || p[1] == '%' || p[1] == '#') {
                break;
            }
            start++;
        }
        if (p == NULL) {
            emit(&x, T_TEXT, x.s + x.pos, x.n - x.pos);
            advance(&x, x.n);
            break;
        }
        kind = p[1];
        lex_text_before(&x, start, kind, line_starting);
        if (kind == '#') {
            const char *e = x.pos <= x.n
                            ? memmem(x.s + x.pos, x.n - x.pos, "#}", 2) : NULL;
            int         strip;

            if (e == NULL) {
                jj_fail(b, x.line, "missing end of comment tag");
            }
            strip = e > x.s + x.pos && e[-1] == '-' ? 1
                    : e > x.s + x.pos && e[-1] == '+' ? 2 : 0;
            advance(&x, (size_t) (e - x.s) + 2);
            line_starting = after_tag(&x, strip, 1);
            continue;
        }
        emit(&x, kind == '%' ? T_BBEGIN : T_VBEGIN, NULL, 0);
        {
            /* {% raw %} */
            size_t i = x.pos;

            while (i < x.n && ws(x.s[i])) {
                i++;
            }
            if (kind == '%' && i + 3 <= x.n && memcmp(x.s + i, "raw", 3) == 0
                && (i + 3 == x.n || !(x.s[i + 3] == '_'
                    || (x.s[i + 3] >= 'a' && x.s[i + 3] <= 'z'))))
            {
                int strip;

                out->n--;
                advance(&x, i + 3);
                strip = lex_tag(&x, 1);
                out->n--;
                line_starting = after_tag(&x, strip, 1);
                lex_raw(&x, line_starting);
                strip = lex_tag(&x, 1);
                out->n--;
                line_starting = after_tag(&x, strip, 1);
                continue;
            }
        }
        line_starting = after_tag(&x, lex_tag(&x, kind == '%'), kind == '%');
    }
    emit(&x, T_EOF, NULL, 0);
}
