/*
 * jinja2's filters and tests, as its defaults and Hugging Face's tojson
 * define them (non-string values are str()'d first where jinja2 does so;
 * an undefined value is "" to the string filters, empty to the sequence
 * ones, and an error where jinja2 raises).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

static const char *const filters[] = {
    "trim", "tojson", "length", "count", "join", "upper", "lower", "replace",
    "first", "last", "default", "d", "indent", "selectattr", "rejectattr",
    "select", "reject", "map", "list", "string", "int", "float", "safe",
    "capitalize", "title", "unique", "sort", "items", "abs", "attr",
    "reverse", "escape", "e", "round", "sum", "min", "max", "wordcount",
    NULL
};
/* those before "equalto" take no argument */
static const char *const tests[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable",
    "sequence", "number", "integer", "float", "boolean", "true", "false",
    "callable", "odd", "even", "lower", "upper", "escaped",
    "equalto", "eq", "==", "sameas", "ne", "!=", "lt", "<", "le", "<=", "gt",
    ">", "ge", ">=", "in", "divisibleby", "filter", "test", NULL
};


static int
find(const char *const *l, const char *name)
{
    for (int i = 0; l[i] != NULL; i++) {
        if (strcmp(l[i], name) == 0) {
            return i;
        }
    }
    return -1;
}


int jj_filter_known(const char *name) { return find(filters, name) >= 0; }
int jj_test_known(const char *name) { return find(tests, name) >= 0; }


typedef struct {
    jv          *args;
    int          nargs;
    const char **kwn;
    jv          *kwv;
    int          nkw;
} fargs;


/* argument pos (after the value), or keyword name, or dflt */
static jv
farg(const fargs *a, int pos, const char *name, jv dflt)
{
    if (pos >= 0 && pos < a->nargs) {
        return a->args[pos];
    }
    for (int i = 0; i < a->nkw; i++) {
        if (strcmp(a->kwn[i], name) == 0) {
            return a->kwv[i];
        }
    }
    return dflt;
}


static int64_t
length(jj_ctx *c, jv v, int line)
{
    switch (v.t) {
    case JV_STR: return (int64_t) jj_utf8_len(v.u.s->s, v.u.s->len);
    case JV_LIST:
        if (v.tuple == 2) {
            jj_fail(&c->b, line, "object of type 'generator' has no len()");
        }
        return (int64_t) v.u.l->n;
    case JV_DICT: return (int64_t) v.u.d->n;
    case JV_UNDEF: return 0;
    default:
        jj_fail(&c->b, line, "object of type '%s' has no len()",
                jv_type_name(v));
    }
}


/* jinja2's indent: s += "\n", then str.splitlines, then rejoin */
static int
line_break(const char *s, size_t n, size_t i, size_t *len)
{
    unsigned char ch = (unsigned char) s[i];

    if (ch == '\r' && i + 1 < n && s[i + 1] == '\n') { *len = 2; return 1; }
    if (ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'
        || (ch >= 0x1c && ch <= 0x1e))
    {
        *len = 1;
        return 1;
    }
    if (ch == 0xc2 && i + 1 < n && (unsigned char) s[i + 1] == 0x85) {
        *len = 2;
        return 1;
    }
    if (ch == 0xe2 && i + 2 < n && (unsigned char) s[i + 1] == 0x80
        && ((unsigned char) s[i + 2] == 0xa8
            || (unsigned char) s[i + 2] == 0xa9))
    {
        *len = 3;
        return 1;
    }
    return 0;
}


static jv
indent(jj_ctx *c, jv s, const fargs *a)
{
    jv      w = farg(a, 0, "width", jv_int(4));
    int     first = jv_truthy(farg(a, 1, "first", jv_bool(0)));
    int     blank = jv_truthy(farg(a, 2, "blank", jv_bool(0)));
    jv      ind;
    jj_sb   sb;
    size_t  i = 0, nline = 0;
    const jj_str *p;

    if (s.t != JV_STR) {
        /* jinja2's do_indent adds "\n" to the value itself */
        jj_not_undef(c, s, c->line);
        jj_fail(&c->b, c->line, "unsupported operand type(s) for +=: '%s' "
                "and 'str'", jv_type_name(s));
    }
    p = s.u.s;
    if (w.t == JV_STR) {
        ind = w;
    } else {
        int64_t k = w.t == JV_INT ? w.u.i : w.t == JV_BOOL ? w.u.b : -1;
        jj_sb   t;

        if (k < 0 && w.t != JV_INT) {
            jj_fail(&c->b, c->line, "indent: the width must be a number");
        }
        jj_sb_init(&t, c->max_output);
        for (int64_t j = 0; j < k; j++) {
            jj_sb_putz(&c->b, &t, " ");
        }
        ind = jv_sb(&c->b, &t);
    }
    jj_sb_init(&sb, c->max_output);
    if (first) {
        jj_sb_put_str(&c->b, &sb, ind.u.s, 0, ind.u.s->len);
    }
    /* the lines of s + "\n": each ends at a break; the last is s's tail */
    while (i <= p->len) {
        size_t j = i, bl = 0;

        while (j < p->len && !line_break(p->s, p->len, j, &bl)) {
            j++;
        }
        if (nline > 0) {
            jj_sb_putz(&c->b, &sb, "\n");
            if (blank || j > i) {
                jj_sb_put_str(&c->b, &sb, ind.u.s, 0, ind.u.s->len);
            }
        }
        jj_sb_put_str(&c->b, &sb, p, i, j - i);
        nline++;
        if (j >= p->len) {
            break;
        }
        i = j + bl;
    }
    return jv_sb(&c->b, &sb);
}


/* jinja2's make_attrgetter: "a.b" or an index through getitem */
static jv
attr_of(jj_ctx *c, jv item, jv attr, int line)
{
    if (attr.t == JV_STR) {
        const char *s = attr.u.s->s;

        for (;;) {
            const char *dot = strchr(s, '.');
            size_t      n = dot != NULL ? (size_t) (dot - s) : strlen(s);
            jv          key = jv_str(&c->b, s, n, 0);
            char       *end;
            long long   k;

            errno = 0;
            k = strtoll(key.u.s->s, &end, 10);
            if (n > 0 && *end == 0 && errno == 0) {
                key = jv_int(k);
            }
            item = jj_getitem(c, item, key, line);
            if (dot == NULL) {
                return item;
            }
            s = dot + 1;
        }
    }
    return jj_getitem(c, item, attr, line);
}


static jv
select_items(jj_ctx *c, jv v, const fargs *a, int by_attr, int keep,
             int line)
{
    jv  seq, out = jv_list(&c->b, 0);
    int t0 = by_attr ? 1 : 0;

    /* jinja2's select_or_reject: "if value:" before iterating */
    out.tuple = 2;
    if (!jv_truthy(v)) {
        return out;
    }
    seq = jj_iter_list(c, v, line);

    for (size_t i = 0; i < seq.u.l->n; i++) {
        jv  item = seq.u.l->v[i], x = item;
        int r;

        jj_step(c);
        if (by_attr) {
            if (a->nargs < 1) {
                jj_fail(&c->b, line, "selectattr: missing the attribute");
            }
            x = attr_of(c, item, a->args[0], line);
        }
        if (a->nargs > t0) {
            if (a->args[t0].t != JV_STR) {
                jj_fail(&c->b, line, "the test must be a name");
            }
            if (!jj_test_known(a->args[t0].u.s->s)) {
                jj_fail(&c->b, line, "no test named '%s'",
                        a->args[t0].u.s->s);
            }
            r = jj_test(c, a->args[t0].u.s->s, x, a->args + t0 + 1,
                        a->nargs - t0 - 1, line);
        } else {
            r = jv_truthy(x);
        }
        if (r == keep) {
            jj_list_push(&c->b, out.u.l, item);
        }
    }
    out.tuple = 2;
    return out;
}


static jv
map_items(jj_ctx *c, jv v, const fargs *a, int line)
{
    jv seq, out;
    jv attr = farg(a, -1, "attribute", jv_undef(NULL));
    jv dflt = farg(a, -1, "default", jv_undef(NULL));

    if (!jv_truthy(v)) {            /* do_map: "if value:" */
        out = jv_list(&c->b, 0);
        out.tuple = 2;
        return out;
    }
    seq = jj_iter_list(c, v, line);
    out = jv_list(&c->b, seq.u.l->n);

    for (size_t i = 0; i < seq.u.l->n; i++) {
        jv x;

        jj_step(c);
        if (attr.t != JV_UNDEF) {
            x = attr_of(c, seq.u.l->v[i], attr, line);
            if (x.t == JV_UNDEF && dflt.t != JV_UNDEF) {
                x = dflt;
            }
        } else {
            if (a->nargs < 1 || a->args[0].t != JV_STR) {
                jj_fail(&c->b, line, "map: a filter name or attribute=");
            }
            if (!jj_filter_known(a->args[0].u.s->s)) {
                jj_fail(&c->b, line, "no filter named '%s'",
                        a->args[0].u.s->s);
            }
            x = jj_filter(c, a->args[0].u.s->s, seq.u.l->v[i], a->args + 1,
                          a->nargs - 1, a->kwn, a->kwv, a->nkw, line);
        }
        jj_list_push(&c->b, out.u.l, x);
    }
    out.tuple = 2;
    return out;
}


/* for sort and unique: the key, lowercased strings unless case_sensitive */
static jv
sort_key(jj_ctx *c, jv x, jv attr, int cs, int line)
{
    if (attr.t != JV_UNDEF && attr.t != JV_NONE) {
        x = attr_of(c, x, attr, line);
    }
    if (!cs && x.t == JV_STR) {
        x = jj_str_case(c, x, 0);
    }
    return x;
}


static jv
sorted(jj_ctx *c, jv v, const fargs *a, int line)
{
    jv   seq = jj_iter_list(c, v, line);
    int  rev = jv_truthy(farg(a, 0, "reverse", jv_bool(0)));
    int  cs = jv_truthy(farg(a, 1, "case_sensitive", jv_bool(0)));
    jv   attr = farg(a, 2, "attribute", jv_undef(NULL));
    size_t n = seq.u.l->n;
    jv  *keys = jj_alloc(&c->b, (n + 1) * sizeof(jv));
    jv   out = jv_list(&c->b, n);

    for (size_t i = 0; i < n; i++) {
        keys[i] = sort_key(c, seq.u.l->v[i], attr, cs, line);
        jj_list_push(&c->b, out.u.l, seq.u.l->v[i]);
    }
    /* insertion sort: stable, and bounded by the step budget */
    for (size_t i = 1; i < n; i++) {
        jv k = keys[i], x = out.u.l->v[i];
        size_t j = i;

        while (j > 0) {
            int r;

            jj_step(c);
            c->line = line;
            r = jv_compare(c, keys[j - 1], k);
            if (rev ? r >= 0 : r <= 0) {
                break;
            }
            keys[j] = keys[j - 1];
            out.u.l->v[j] = out.u.l->v[j - 1];
            j--;
        }
        keys[j] = k;
        out.u.l->v[j] = x;
    }
    return out;
}


static jv
unique(jj_ctx *c, jv v, const fargs *a, int line)
{
    jv   seq = jj_iter_list(c, v, line);
    int  cs = jv_truthy(farg(a, 0, "case_sensitive", jv_bool(0)));
    jv   attr = farg(a, 1, "attribute", jv_undef(NULL));
    jv   out = jv_list(&c->b, 0), seen = jv_list(&c->b, 0);

    for (size_t i = 0; i < seq.u.l->n; i++) {
        jv  k = sort_key(c, seq.u.l->v[i], attr, cs, line);
        int dup = 0;

        jj_hashable(c, k, line);        /* jinja2 keeps a set */
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) {
            jj_step(c);
            dup = jv_equal(seen.u.l->v[j], k);
        }
        if (!dup) {
            jj_list_push(&c->b, seen.u.l, k);
            jj_list_push(&c->b, out.u.l, seq.u.l->v[i]);
        }
    }
    out.tuple = 2;
    return out;
}


static jv
to_int(jj_ctx *c, jv v, jv dflt)
{
    if (v.t == JV_INT) { return v; }
    if (v.t == JV_BOOL) { return jv_int(v.u.b); }
    if (v.t == JV_FLOAT) {
        /* in int64 range only (Python's ints have no bound) */
        return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18
               ? jv_int((int64_t) v.u.f) : dflt;
    }
    if (v.t == JV_STR) {
        jv          s = jj_str_strip(c, v, jv_none(), 1, 1);
        char       *end;
        long long   k;
        double      f;

        errno = 0;
        k = strtoll(s.u.s->s, &end, 10);
        if (s.u.s->len > 0 && *end == 0 && errno == 0) {
            return jv_int(k);
        }
        f = strtod(s.u.s->s, &end);
        if (s.u.s->len > 0 && *end == 0 && isfinite(f) && fabs(f) < 9.2e18) {
            return jv_int((int64_t) f);
        }
    }
    return dflt;
}


static jv
tojson(jj_ctx *c, jv v, const fargs *a)
{
    /* HF: tojson(x, ensure_ascii=False, indent=None, separators=None,
     * sort_keys=False) */
    jv    ascii = farg(a, 0, "ensure_ascii", jv_bool(0));
    jv    ind = farg(a, 1, "indent", jv_none());
    jv    sk = farg(a, 3, "sort_keys", jv_bool(0));
    int   n = -1;
    jj_sb sb;

    if (farg(a, 2, "separators", jv_none()).t != JV_NONE) {
        jj_fail(&c->b, c->line, "tojson: separators= is not supported");
    }
    if (ind.t == JV_INT) {
        n = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : (int) ind.u.i;
    } else if (ind.t != JV_NONE) {
        jj_fail(&c->b, c->line, "tojson: indent must be a number");
    }
    jj_sb_init(&sb, c->max_output);
    jj_tojson(c, &sb, v, n, jv_truthy(sk), jv_truthy(ascii), 0);
    return jv_sb(&c->b, &sb);
}


static jv
first_last(jj_ctx *c, jv v, int last, int line)
{
    jv seq = jj_iter_list(c, v, line);

    if (last && v.t == JV_LIST && v.tuple == 2) {
        jj_fail(&c->b, line, "'generator' object is not reversible");
    }
    if (seq.u.l->n == 0) {
        return jv_undef(last ? "last" : "first");
    }
    return seq.u.l->v[last ? seq.u.l->n - 1 : 0];
}


static jv
filter_more(jj_ctx *c, const char *name, jv v, const fargs *a, int line)
{
    jv out;

    if (strcmp(name, "abs") == 0) {
        if (v.t == JV_FLOAT) { return jv_float(fabs(v.u.f)); }
        if (v.t == JV_INT) {
            if (v.u.i == INT64_MIN) {
                jj_fail(&c->b, line, "integer overflow");
            }
            return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == JV_BOOL) { return jv_int(v.u.b); }
        jj_fail(&c->b, line, "bad operand type for abs(): '%s'",
                jv_type_name(v));
    }
    if (strcmp(name, "attr") == 0) {
        jv n = farg(a, 0, "name", jv_undef(NULL));

        if (n.t != JV_STR) {
            jj_fail(&c->b, line, "attr: the name must be a string");
        }
        return jj_getattr(c, v, n.u.s->s, line);
    }
    if (strcmp(name, "reverse") == 0) {
        jv seq;

        if (v.t == JV_STR) {
            jv rs = jj_iter_list(c, v, line);
            jj_sb sb;

            jj_sb_init(&sb, c->max_output);
            for (size_t i = rs.u.l->n; i-- > 0;) {
                jj_sb_put_str(&c->b, &sb, rs.u.l->v[i].u.s, 0,
                              rs.u.l->v[i].u.s->len);
            }
            return jv_sb(&c->b, &sb);
        }
        seq = jj_iter_list(c, v, line);
        out = jv_list(&c->b, seq.u.l->n);
        for (size_t i = seq.u.l->n; i-- > 0;) {
            jj_list_push(&c->b, out.u.l, seq.u.l->v[i]);
        }
        out.tuple = 2;      /* reversed(): an iterator */
        return out;
    }
    if (strcmp(name, "escape") == 0 || strcmp(name, "e") == 0) {
        jj_sb sb;

        if (v.t == JV_STR && v.safe) {
            return v;
        }
        v = jv_to_string(c, v);
        jj_sb_init(&sb, c->max_output);
        jj_sb_put_escaped(&c->b, &sb, v.u.s);
        out = jv_sb(&c->b, &sb);
        out.safe = 1;
        return out;
    }
    if (strcmp(name, "sum") == 0 || strcmp(name, "min") == 0
        || strcmp(name, "max") == 0)
    {
        jv seq = jj_iter_list(c, v, line);

        if (name[1] == 'u') {
            out = farg(a, 1, "start", jv_int(0));
            for (size_t i = 0; i < seq.u.l->n; i++) {
                out = jj_binop(c, OP_ADD, out, seq.u.l->v[i], line);
            }
            return out;
        }
        if (seq.u.l->n == 0) {
            return jv_undef(name);
        }
        {
            /* case-insensitive unless case_sensitive=true; the first of
             * equals wins, as Python's min and max give it */
            int cs = jv_truthy(farg(a, 0, "case_sensitive", jv_bool(0)));
            jv  attr = farg(a, 1, "attribute", jv_undef(NULL));
            jv  best = sort_key(c, seq.u.l->v[0], attr, cs, line);

            out = seq.u.l->v[0];
            for (size_t i = 1; i < seq.u.l->n; i++) {
                jv  k = sort_key(c, seq.u.l->v[i], attr, cs, line);
                int r;

                c->line = line;
                r = jv_compare(c, k, best);
                if (name[1] == 'i' ? r < 0 : r > 0) {
                    out = seq.u.l->v[i];
                    best = k;
                }
            }
        }
        return out;
    }
    if (strcmp(name, "wordcount") == 0) {
        return jv_int((int64_t) jj_str_split(c, jv_to_string(c, v),
                                             jv_none(), -1).u.l->n);
    }
    if (strcmp(name, "round") == 0) {
        jv     p = farg(a, 0, "precision", jv_int(0));
        double f = jv_num(v), m = pow(10, (double) (p.t == JV_INT ? p.u.i
                                                                  : 0));

        if (!jv_is_number(v)) {
            jj_fail(&c->b, line, "round: not a number");
        }
        return jv_float(nearbyint(f * m) / m);
    }
    jj_fail(&c->b, line, "the filter '%s' is not supported here", name);
}


jv
jj_filter(jj_ctx *c, const char *name, jv v, jv *args, int nargs,
          const char **kwn, jv *kwv, int nkw, int line)
{
    fargs a = { args, nargs, kwn, kwv, nkw };
    jv    out;

    c->line = line;
    jj_step(c);
    if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        jv dflt = farg(&a, 0, "default_value", jv_strz(&c->b, ""));
        int boolean = jv_truthy(farg(&a, 1, "boolean", jv_bool(0)));

        return v.t == JV_UNDEF || (boolean && !jv_truthy(v)) ? dflt : v;
    }
    if (strcmp(name, "safe") == 0) {
        out = jv_to_string(c, v);
        out.safe = 1;
        return out;
    }
    if (strcmp(name, "tojson") == 0) {
        return tojson(c, v, &a);
    }
    if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        return jv_int(length(c, v, line));
    }
    if (strcmp(name, "string") == 0) {
        return jv_to_string(c, v);
    }
    if (strcmp(name, "trim") == 0) {
        return jj_str_strip(c, v, farg(&a, 0, "chars", jv_none()), 1, 1);
    }
    if (strcmp(name, "upper") == 0) { return jj_str_case(c, v, 1); }
    if (strcmp(name, "lower") == 0) { return jj_str_case(c, v, 0); }
    if (strcmp(name, "title") == 0) { return jj_str_case(c, v, 4); }
    if (strcmp(name, "capitalize") == 0) {
        return jj_str_case(c, jj_str_case(c, v, 0), 3);
    }
    if (strcmp(name, "replace") == 0) {
        jv n = farg(&a, 2, "count", jv_none());

        return jj_str_replace(c, v, farg(&a, 0, "old", jv_strz(&c->b, "")),
                              farg(&a, 1, "new", jv_strz(&c->b, "")),
                              n.t == JV_INT ? n.u.i : -1);
    }
    if (strcmp(name, "join") == 0) {
        jv    sep = jv_to_string(c, farg(&a, 0, "d", jv_strz(&c->b, "")));
        jv    attr = farg(&a, 1, "attribute", jv_none());
        jv    seq = jj_iter_list(c, v, line);
        jj_sb sb;

        jj_sb_init(&sb, c->max_output);
        for (size_t i = 0; i < seq.u.l->n; i++) {
            jv x = seq.u.l->v[i];

            if (attr.t != JV_NONE) {
                x = attr_of(c, x, attr, line);
            }
            if (i > 0) {
                jj_sb_put_str(&c->b, &sb, sep.u.s, 0, sep.u.s->len);
            }
            jv_print(c, &sb, x);
        }
        return jv_sb(&c->b, &sb);
    }
    if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        return first_last(c, v, name[0] == 'l', line);
    }
    if (strcmp(name, "indent") == 0) {
        return indent(c, v, &a);
    }
    if (strcmp(name, "selectattr") == 0 || strcmp(name, "rejectattr") == 0) {
        return select_items(c, v, &a, 1, name[0] == 's', line);
    }
    if (strcmp(name, "select") == 0 || strcmp(name, "reject") == 0) {
        return select_items(c, v, &a, 0, name[0] == 's', line);
    }
    if (strcmp(name, "map") == 0) {
        return map_items(c, v, &a, line);
    }
    if (strcmp(name, "list") == 0) {
        jv seq = jj_iter_list(c, v, line);

        out = jv_list(&c->b, seq.u.l->n);
        for (size_t i = 0; i < seq.u.l->n; i++) {
            jj_list_push(&c->b, out.u.l, seq.u.l->v[i]);
        }
        return out;
    }
    if (strcmp(name, "items") == 0) {
        /* a generator in jinja2 (so not JSON, no length) */
        if (v.t == JV_UNDEF) {
            out = jv_list(&c->b, 0);
        } else if (v.t != JV_DICT) {
            /* raised when iterated, as jinja2's generator does */
            out = jv_list(&c->b, 0);
            out.u.l->raise = "Can only get item pairs from a mapping.";
        } else {
            out = jj_call_method(c, v, "items", NULL, 0, NULL, NULL, 0, line);
        }
        out.tuple = 2;
        return out;
    }
    if ((strcmp(name, "int") == 0 || strcmp(name, "float") == 0)
        && v.t == JV_UNDEF)
    {
        jj_not_undef(c, v, line);       /* Undefined.__int__ raises */
    }
    if (strcmp(name, "int") == 0) {
        return to_int(c, v, farg(&a, 0, "default", jv_int(0)));
    }
    if (strcmp(name, "float") == 0) {
        jv d = farg(&a, 0, "default", jv_float(0));

        if (jv_is_number(v)) {
            return jv_float(jv_num(v));
        }
        if (v.t == JV_STR) {
            char  *end;
            double f = strtod(v.u.s->s, &end);

            return v.u.s->len > 0 && *end == 0 ? jv_float(f) : d;
        }
        return d;
    }
    if (strcmp(name, "unique") == 0) {
        return unique(c, v, &a, line);
    }
    if (strcmp(name, "sort") == 0) {
        return sorted(c, v, &a, line);
    }
    return filter_more(c, name, v, &a, line);
}


int
jj_test(jj_ctx *c, const char *name, jv v, jv *args, int nargs, int line)
{
    jv x = nargs > 0 ? args[0] : jv_undef(NULL);
    int r;

    jj_step(c);
    c->line = line;
    if (nargs > 0 && find(tests, name) < find(tests, "equalto")) {
        jj_fail(&c->b, line, "test_%s() takes 1 positional argument but %d "
                "were given", name, nargs + 1);
    }
    if (strcmp(name, "defined") == 0) { return v.t != JV_UNDEF; }
    if (strcmp(name, "undefined") == 0) { return v.t == JV_UNDEF; }
    if (strcmp(name, "none") == 0) { return v.t == JV_NONE; }
    if (strcmp(name, "string") == 0) { return v.t == JV_STR; }
    if (strcmp(name, "mapping") == 0) { return v.t == JV_DICT; }
    if (strcmp(name, "iterable") == 0) {
        return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT
               || v.t == JV_UNDEF;
    }
    if (strcmp(name, "sequence") == 0) {
        /* jinja2's Undefined has a len() and a __getitem__: a sequence */
        return v.t == JV_STR || (v.t == JV_LIST && (v.tuple <= 1
                                                    || v.tuple == 3))
               || v.t == JV_DICT || v.t == JV_UNDEF;
    }
    if (strcmp(name, "number") == 0) { return jv_is_number(v); }
    if (strcmp(name, "integer") == 0) { return v.t == JV_INT; }
    if (strcmp(name, "float") == 0) { return v.t == JV_FLOAT; }
    if (strcmp(name, "boolean") == 0) { return v.t == JV_BOOL; }
    if (strcmp(name, "true") == 0) { return v.t == JV_BOOL && v.u.b; }
    if (strcmp(name, "false") == 0) { return v.t == JV_BOOL && !v.u.b; }
    if (strcmp(name, "callable") == 0) {
        return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
    }
    if (strcmp(name, "escaped") == 0) { return v.t == JV_STR && v.safe; }
    if (strcmp(name, "filter") == 0 || strcmp(name, "test") == 0) {
        return v.t == JV_STR && (name[0] == 'f' ? jj_filter_known(v.u.s->s)
                                                : jj_test_known(v.u.s->s));
    }
    if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        jv s = jv_to_string(c, v);

        return jv_equal(s, jj_str_case(c, s, name[0] == 'u'));
    }
    if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0
        || strcmp(name, "divisibleby") == 0)
    {
        jv m = jj_binop(c, OP_MOD, v, name[0] == 'd' ? x : jv_int(2), line);

        /* jinja2: value % 2 == 1, value % 2 == 0, value % num == 0 */
        return jv_equal(m, jv_int(name[0] == 'o' ? 1 : 0));
    }
    if (strcmp(name, "sameas") == 0) {
        return v.t == x.t && (v.t == JV_NONE || v.t == JV_UNDEF
                              || (v.t == JV_BOOL && v.u.b == x.u.b)
                              || (v.t == JV_LIST && v.u.l == x.u.l)
                              || (v.t == JV_DICT && v.u.d == x.u.d));
    }
    if (strcmp(name, "equalto") == 0 || strcmp(name, "eq") == 0
        || strcmp(name, "==") == 0)
    {
        return jv_equal(v, x);
    }
    if (strcmp(name, "ne") == 0 || strcmp(name, "!=") == 0) {
        return !jv_equal(v, x);
    }
    if (strcmp(name, "in") == 0) {
        jv out = jv_list(&c->b, 0);

        (void) out;
        if (x.t == JV_STR) {
            if (v.t != JV_STR) {
                jj_fail(&c->b, line, "'in <string>' requires string as left"
                        " operand");
            }
            return v.u.s->len == 0 || memmem(x.u.s->s, x.u.s->len, v.u.s->s,
                                             v.u.s->len) != NULL;
        }
        if (x.t == JV_DICT) {
            return jj_dict_get(x.u.d, v) != NULL;
        }
        x = jj_iter_list(c, x, line);
        for (size_t i = 0; i < x.u.l->n; i++) {
            if (jv_equal(x.u.l->v[i], v)) {
                return 1;
            }
        }
        return 0;
    }
    r = jv_compare(c, v, x);
    if (name[0] == 'l') { return name[1] == 't' ? r < 0 : r <= 0; }
    if (name[0] == 'g') { return name[1] == 't' ? r > 0 : r >= 0; }
    if (strcmp(name, "<") == 0) { return r < 0; }
    if (strcmp(name, "<=") == 0) { return r <= 0; }
    if (strcmp(name, ">") == 0) { return r > 0; }
    return r >= 0;
}
