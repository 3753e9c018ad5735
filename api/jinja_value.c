/*
 * The interpreter's arena and values: strings with their taint flags,
 * lists, dicts, and Python's truth, equality, order, str() and repr() over
 * them (what jinja2 does, it does through Python's operators).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

#define JJ_CHUNK  (64 * 1024)


void *
jj_alloc(jj_base *b, size_t n)
{
    jj_chunk  *c = b->chunks;
    void      *p;

    n = (n + 15) & ~(size_t) 15;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > JJ_CHUNK / 4 ? n : JJ_CHUNK;

        if (b->total + cap + sizeof(jj_chunk) > b->limit) {
            jj_fail(b, 0, "the template needs more than %zu bytes of memory",
                    b->limit);
        }
        c = malloc(sizeof(jj_chunk) + cap);
        if (c == NULL) {
            jj_fail(b, 0, "out of memory");
        }
        b->total += cap + sizeof(jj_chunk);
        c->cap = cap;
        c->used = 0;
        /* a big block goes behind the current chunk, which keeps its room */
        if (cap > JJ_CHUNK && b->chunks != NULL) {
            c->next = b->chunks->next;
            b->chunks->next = c;
        } else {
            c->next = b->chunks;
            b->chunks = c;
        }
    }
    p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}


void
jj_arena_free(jj_chunk *c)
{
    while (c != NULL) {
        jj_chunk *next = c->next;

        free(c);
        c = next;
    }
}


void
jj_fail(jj_base *b, int line, const char *fmt, ...)
{
    va_list ap;
    int     k = 0;

    if (b->err != NULL && b->err_len > 0) {
        if (line > 0) {
            k = snprintf(b->err, b->err_len, "line %d: ", line);
            if (k < 0 || (size_t) k >= b->err_len) {
                k = 0;
            }
        }
        va_start(ap, fmt);
        vsnprintf(b->err + k, b->err_len - k, fmt, ap);
        va_end(ap);
    }
    if (b->rc == 0) {
        b->rc = -1;
    }
    longjmp(b->jb, 1);
}


char *
jj_strdup(jj_base *b, const char *s, size_t n)
{
    char *p = jj_alloc(b, n + 1);

    memcpy(p, s, n);
    return p;
}


/* --- constructors --- */

jv jv_undef(const char *name) { jv v = { .t = JV_UNDEF }; v.u.name = name;
                                return v; }
jv jv_none(void) { jv v = { .t = JV_NONE }; return v; }
jv jv_bool(int b) { jv v = { .t = JV_BOOL }; v.u.b = b != 0; return v; }
jv jv_int(int64_t i) { jv v = { .t = JV_INT }; v.u.i = i; return v; }
jv jv_float(double f) { jv v = { .t = JV_FLOAT }; v.u.f = f; return v; }


jv
jv_str(jj_base *b, const char *s, size_t n, int tainted)
{
    jv      v = { .t = JV_STR };
    jj_str *p = jj_alloc(b, sizeof(jj_str));

    p->len = n;
    p->s = jj_strdup(b, s, n);
    if (tainted && n > 0) {
        p->taint = jj_alloc(b, n);
        memset(p->taint, 1, n);
    }
    v.u.s = p;
    return v;
}


jv
jv_strz(jj_base *b, const char *s)
{
    return jv_str(b, s, strlen(s), 0);
}


/* the string sb holds; sb's buffers become the string's (sb is done) */
jv
jv_sb(jj_base *b, const jj_sb *sb)
{
    jv      v = { .t = JV_STR };
    jj_str *p = jj_alloc(b, sizeof(jj_str));

    p->len = sb->len;
    p->s = sb->s != NULL ? sb->s : jj_alloc(b, 1);
    p->taint = sb->tainted ? sb->t : NULL;
    v.u.s = p;
    return v;
}


jv
jv_substr(jj_base *b, const jj_str *s, size_t off, size_t n)
{
    jv v = jv_str(b, s->s + off, n, 0);

    if (s->taint != NULL && n > 0) {
        size_t i;

        for (i = 0; i < n && !s->taint[off + i]; i++) {
        }
        if (i < n) {
            v.u.s->taint = jj_alloc(b, n);
            memcpy(v.u.s->taint, s->taint + off, n);
        }
    }
    return v;
}


jv
jv_list(jj_base *b, size_t cap)
{
    jv v = { .t = JV_LIST };

    v.u.l = jj_alloc(b, sizeof(jj_list));
    if (cap > 0) {
        v.u.l->v = jj_alloc(b, cap * sizeof(jv));
        v.u.l->cap = cap;
    }
    return v;
}


jv
jv_dict(jj_base *b, size_t cap)
{
    jv v = { .t = JV_DICT };

    v.u.d = jj_alloc(b, sizeof(jj_dict));
    if (cap > 0) {
        v.u.d->k = jj_alloc(b, cap * sizeof(jv));
        v.u.d->v = jj_alloc(b, cap * sizeof(jv));
        v.u.d->cap = cap;
    }
    return v;
}


void
jj_list_push(jj_base *b, jj_list *l, jv v)
{
    if (l->n == l->cap) {
        size_t  cap = l->cap ? 2 * l->cap : 8;
        jv     *nv = jj_alloc(b, cap * sizeof(jv));

        if (l->n > 0) {
            memcpy(nv, l->v, l->n * sizeof(jv));
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}


jv *
jj_dict_get(const jj_dict *d, jv key)
{
    for (size_t i = 0; i < d->n; i++) {
        if (jv_equal(d->k[i], key)) {
            return &d->v[i];
        }
    }
    return NULL;
}


jv *
jj_dict_gets(const jj_dict *d, const char *key)
{
    size_t n = strlen(key);

    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].t == JV_STR && d->k[i].u.s->len == n
            && memcmp(d->k[i].u.s->s, key, n) == 0)
        {
            return &d->v[i];
        }
    }
    return NULL;
}


void
jj_dict_set(jj_base *b, jj_dict *d, jv key, jv val)
{
    jv *p = jj_dict_get(d, key);

    if (p != NULL) {
        *p = val;
        return;
    }
    if (d->n == d->cap) {
        size_t  cap = d->cap ? 2 * d->cap : 8;
        jv     *nk = jj_alloc(b, cap * sizeof(jv));
        jv     *nv = jj_alloc(b, cap * sizeof(jv));

        if (d->n > 0) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}


/* --- string building --- */

void
jj_sb_init(jj_sb *sb, size_t max)
{
    memset(sb, 0, sizeof(*sb));
    sb->max = max;
}


static void
sb_grow(jj_base *b, jj_sb *sb, size_t n)
{
    size_t          cap;
    char           *s;
    unsigned char  *t;

    if (sb->max > 0 && sb->len + n > sb->max) {
        jj_fail(b, 0, "the template's output passes %zu bytes", sb->max);
    }
    if (sb->len + n + 1 <= sb->cap) {
        return;
    }
    cap = sb->cap ? sb->cap : 64;
    while (cap < sb->len + n + 1) {
        cap *= 2;
    }
    s = jj_alloc(b, cap);
    t = jj_alloc(b, cap);
    if (sb->len > 0) {
        memcpy(s, sb->s, sb->len);
        memcpy(t, sb->t, sb->len);
    }
    sb->s = s;
    sb->t = t;
    sb->cap = cap;
}


void
jj_sb_put(jj_base *b, jj_sb *sb, const char *s, size_t n, int taint)
{
    if (n == 0) {
        return;
    }
    sb_grow(b, sb, n);
    memcpy(sb->s + sb->len, s, n);
    memset(sb->t + sb->len, taint ? 1 : 0, n);
    sb->len += n;
    sb->tainted |= taint != 0;
}


void
jj_sb_putz(jj_base *b, jj_sb *sb, const char *s)
{
    jj_sb_put(b, sb, s, strlen(s), 0);
}


void
jj_sb_put_str(jj_base *b, jj_sb *sb, const jj_str *s, size_t off, size_t n)
{
    if (n == 0) {
        return;
    }
    sb_grow(b, sb, n);
    memcpy(sb->s + sb->len, s->s + off, n);
    if (s->taint != NULL) {
        memcpy(sb->t + sb->len, s->taint + off, n);
        sb->tainted = 1;
    } else {
        memset(sb->t + sb->len, 0, n);
    }
    sb->len += n;
}


/* markupsafe.escape: & < > ' " as entities, each keeping its byte's taint */
void
jj_sb_put_escaped(jj_base *b, jj_sb *sb, const jj_str *s)
{
    for (size_t i = 0; i < s->len; i++) {
        const char *e = NULL;
        int         t = s->taint != NULL && s->taint[i];

        switch (s->s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '\'': e = "&#39;"; break;
        case '"': e = "&#34;"; break;
        }
        if (e != NULL) {
            jj_sb_put(b, sb, e, strlen(e), t);
        } else {
            jj_sb_put_str(b, sb, s, i, 1);
        }
    }
}


/* --- UTF-8 --- */

/* the code point at s[i] into *cp; returns the index after it (a byte
 * that starts no valid sequence is one code point of its own) */
size_t
jj_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *) s;
    uint32_t             c = u[i];
    size_t               k, need;

    if (c < 0x80) {
        *cp = c;
        return i + 1;
    }
    need = c >= 0xf8 ? 0 : c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    if (need == 0 || i + need >= n) {
        *cp = c;
        return i + 1;
    }
    c &= need == 1 ? 0x1f : need == 2 ? 0x0f : 0x07;
    for (k = 1; k <= need; k++) {
        if ((u[i + k] & 0xc0) != 0x80) {
            *cp = u[i];
            return i + 1;
        }
        c = (c << 6) | (u[i + k] & 0x3f);
    }
    *cp = c;
    return i + need + 1;
}


size_t
jj_utf8_len(const char *s, size_t n)
{
    size_t   i = 0, k = 0;
    uint32_t cp;

    while (i < n) {
        i = jj_utf8_next(s, n, i, &cp);
        k++;
    }
    return k;
}


/* Python's str.isspace */
int
jj_py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20)
           || cp == 0x85 || cp == 0xa0 || cp == 0x1680
           || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028
           || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}


/* --- Python semantics --- */

int
jv_is_number(jv v)
{
    return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
}


double
jv_num(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double) v.u.i
           : v.t == JV_BOOL ? v.u.b : 0;
}


int
jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->len > 0;
    case JV_LIST: return v.tuple == 2 || v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return 1;
    }
}


/* Values nest at most this deep for ==, repr and order: deeper nesting
 * (only a template building it on purpose makes it) compares unequal and
 * fails to print or order, rather than exhausting the stack. */
#define JJ_VALUE_DEPTH 200

static int equal_at(jv a, jv b, int depth);


int
jv_equal(jv a, jv b)
{
    return equal_at(a, b, 0);
}


static int
equal_at(jv a, jv b, int depth)
{
    if (depth > JJ_VALUE_DEPTH) {
        return 0;
    }
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            return (a.t == JV_INT ? a.u.i : a.u.b)
                   == (b.t == JV_INT ? b.u.i : b.u.b);
        }
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) {
        return 0;
    }
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR:
        return a.u.s->len == b.u.s->len
               && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JV_LIST:
        if (a.u.l == b.u.l && a.tuple == b.tuple) {
            return 1;       /* the same list (Python's identity shortcut) */
        }
        if (a.u.l->n != b.u.l->n || a.tuple != b.tuple) {
            return 0;
        }
        for (size_t i = 0; i < a.u.l->n; i++) {
            if (!equal_at(a.u.l->v[i], b.u.l->v[i], depth + 1)) {
                return 0;
            }
        }
        return 1;
    case JV_DICT:
        if (a.u.d == b.u.d) {
            return 1;
        }
        if (a.u.d->n != b.u.d->n) {
            return 0;
        }
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jj_dict_get(b.u.d, a.u.d->k[i]);

            if (o == NULL || !equal_at(a.u.d->v[i], *o, depth + 1)) {
                return 0;
            }
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}


static void
value_enter(jj_ctx *c)
{
    if (++c->depth > c->max_depth) {
        jj_fail(&c->b, c->line, "a value nests deeper than %d levels",
                c->max_depth);
    }
}


int
jv_compare(jj_ctx *c, jv a, jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t == JV_INT && b.t == JV_INT) {
            return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        }
        return (jv_num(a) > jv_num(b)) - (jv_num(a) < jv_num(b));
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int    r = memcmp(a.u.s->s, b.u.s->s, n);

        if (r != 0) {
            return r;
        }
        return (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) {
                int r;

                value_enter(c);
                r = jv_compare(c, a.u.l->v[i], b.u.l->v[i]);
                c->depth--;
                return r;
            }
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jj_not_undef(c, a.t == JV_UNDEF ? a : b, c->line);
    }
    jj_fail(&c->b, c->line, "'<' not supported between instances of '%s' "
            "and '%s'", jv_type_name(a), jv_type_name(b));
}


const char *
jv_type_name(jv v)
{
    static const char *names[] = {
        "Undefined", "NoneType", "bool", "int", "float", "str", "list",
        "dict", "Namespace", "Macro", "function", "builtin_function_or_method"
    };

    if (v.t == JV_LIST && v.tuple) {
        static const char *const kinds[] = {
            "list", "tuple", "generator", "range", "dict_keys", "dict_values",
            "dict_items"
        };

        return kinds[v.tuple];
    }
    return names[v.t];
}


static void
repr_str(jj_ctx *c, jj_sb *sb, const jj_str *s)
{
    int q = memchr(s->s, '\'', s->len) != NULL
            && memchr(s->s, '"', s->len) == NULL ? '"' : '\'';
    char qs[2] = { (char) q, 0 };

    jj_sb_putz(&c->b, sb, qs);
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t   j = jj_utf8_next(s->s, s->len, i, &cp);
        int      t = s->taint != NULL && s->taint[i];
        char     e[16];

        e[0] = 0;
        if (cp == '\\' || cp == (uint32_t) q) {
            snprintf(e, sizeof(e), "\\%c", (char) cp);
        } else if (cp == '\n') {
            strcpy(e, "\\n");
        } else if (cp == '\r') {
            strcpy(e, "\\r");
        } else if (cp == '\t') {
            strcpy(e, "\\t");
        } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
            snprintf(e, sizeof(e), "\\x%02x", cp);
        } else if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f)
                   || (cp >= 0x2028 && cp <= 0x202f)
                   || (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000
                   || cp == 0xfeff)
        {
            snprintf(e, sizeof(e), "\\u%04x", cp);
        }
        if (e[0] != 0) {
            jj_sb_put(&c->b, sb, e, strlen(e), t);
        } else {
            jj_sb_put_str(&c->b, sb, s, i, j - i);
        }
        i = j;
    }
    jj_sb_putz(&c->b, sb, qs);
}


static void repr_inner(jj_ctx *c, jj_sb *sb, jv v);


void
jv_repr(jj_ctx *c, jj_sb *sb, jv v)
{
    jj_step(c);
    value_enter(c);
    repr_inner(c, sb, v);
    c->depth--;
}


static void
repr_inner(jj_ctx *c, jj_sb *sb, jv v)
{
    switch (v.t) {
    case JV_STR:
        if (v.safe) {
            jj_sb_putz(&c->b, sb, "Markup(");
        }
        repr_str(c, sb, v.u.s);
        if (v.safe) {
            jj_sb_putz(&c->b, sb, ")");
        }
        return;
    case JV_LIST:
        if (v.tuple == 2) {
            jj_fail(&c->b, c->line, "printing a generator (map, select, "
                    "...) is not supported: add |list");
        }
        if (v.tuple == 3) {
            char buf[96];

            if (v.u.l->step == 1) {
                snprintf(buf, sizeof(buf), "range(%" PRId64 ", %" PRId64 ")",
                         v.u.l->start, v.u.l->stop);
            } else {
                snprintf(buf, sizeof(buf), "range(%" PRId64 ", %" PRId64
                         ", %" PRId64 ")", v.u.l->start, v.u.l->stop,
                         v.u.l->step);
            }
            jj_sb_putz(&c->b, sb, buf);
            return;
        }
        if (v.tuple >= 4) {
            jv l = v;

            jj_sb_putz(&c->b, sb, jv_type_name(v));
            jj_sb_putz(&c->b, sb, "(");
            l.tuple = 0;
            repr_inner(c, sb, l);
            jj_sb_putz(&c->b, sb, ")");
            return;
        }
        jj_sb_putz(&c->b, sb, v.tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i > 0) {
                jj_sb_putz(&c->b, sb, ", ");
            }
            jv_repr(c, sb, v.u.l->v[i]);
        }
        jj_sb_putz(&c->b, sb, v.tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
        return;
    case JV_DICT:
        jj_sb_putz(&c->b, sb, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i > 0) {
                jj_sb_putz(&c->b, sb, ", ");
            }
            jv_repr(c, sb, v.u.d->k[i]);
            jj_sb_putz(&c->b, sb, ": ");
            jv_repr(c, sb, v.u.d->v[i]);
        }
        jj_sb_putz(&c->b, sb, "}");
        return;
    case JV_UNDEF:
        jj_sb_putz(&c->b, sb, "Undefined");
        return;
    default:
        jv_print(c, sb, v);
    }
}


void
jv_print(jj_ctx *c, jj_sb *sb, jv v)
{
    char buf[64];

    switch (v.t) {
    case JV_UNDEF:
        return;
    case JV_NONE:
        jj_sb_putz(&c->b, sb, "None");
        return;
    case JV_BOOL:
        jj_sb_putz(&c->b, sb, v.u.b ? "True" : "False");
        return;
    case JV_INT:
        snprintf(buf, sizeof(buf), "%" PRId64, v.u.i);
        jj_sb_putz(&c->b, sb, buf);
        return;
    case JV_FLOAT:
        jj_format_float(buf, sizeof(buf), v.u.f);
        jj_sb_putz(&c->b, sb, buf);
        return;
    case JV_STR:
        jj_sb_put_str(&c->b, sb, v.u.s, 0, v.u.s->len);
        return;
    case JV_LIST:
    case JV_DICT:
        jv_repr(c, sb, v);
        return;
    case JV_NS:
        jj_sb_putz(&c->b, sb, "<Namespace ");
        v.t = JV_DICT;
        jv_repr(c, sb, v);
        jj_sb_putz(&c->b, sb, ">");
        return;
    case JV_MACRO:
        snprintf(buf, sizeof(buf), "<Macro '%.40s'>", v.u.m->name);
        jj_sb_putz(&c->b, sb, buf);
        return;
    default:
        jj_sb_putz(&c->b, sb, "<function>");
    }
}


jv
jv_to_string(jj_ctx *c, jv v)
{
    jj_sb sb;

    if (v.t == JV_STR) {
        return v;
    }
    jj_sb_init(&sb, c->max_output);
    jv_print(c, &sb, v);
    return jv_sb(&c->b, &sb);
}
