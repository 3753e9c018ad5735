/*
 * Python's str and dict methods that templates call (strip, split,
 * startswith, replace, upper, items, get, ...), and the globals
 * (raise_exception, strftime_now, namespace, range, dict).  A string
 * method's result keeps, byte for byte, the taint of the characters it came
 * from; what the method itself writes (a replacement, a case mapping) takes
 * the taint of its source.  Mutating methods (list.append, dict.update)
 * fail, as in jinja2's ImmutableSandboxedEnvironment.
 */
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wctype.h>

#include "jinja_int.h"

#define JJ_MAX_RANGE 100000     /* jinja2.sandbox.MAX_RANGE */

static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
    "lower", "title", "capitalize", "replace", "find", "count", "join",
    "isdigit", "isalpha", "isspace", "islower", "isupper", "rsplit",
    "splitlines", "format", NULL
};
static const char *const dict_methods[] = {
    "items", "keys", "values", "get", "copy", "pop", "popitem",
    "setdefault", "update", "clear", "fromkeys", NULL
};
static const char *const list_methods[] = {
    "append", "extend", "insert", "pop", "remove", "index", "count",
    "reverse", "sort", "clear", "copy", NULL
};


static int
in_list(const char *const *l, const char *name)
{
    for (; *l != NULL; l++) {
        if (strcmp(*l, name) == 0) {
            return 1;
        }
    }
    return 0;
}


int
jj_is_method(jv obj, const char *name)
{
    switch (obj.t) {
    case JV_STR: return in_list(str_methods, name);
    case JV_DICT: return in_list(dict_methods, name);
    case JV_LIST: return in_list(list_methods, name);
    default: return 0;
    }
}


/* --- case mapping: C.UTF-8's tables (ASCII alone when it is missing) --- */

static pthread_once_t  loc_once = PTHREAD_ONCE_INIT;
static locale_t        loc_utf8;

static void
loc_init(void)
{
    loc_utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t) 0);
}


static uint32_t
map_case(uint32_t cp, int upper)
{
    if (cp < 0x80) {
        if (upper && cp >= 'a' && cp <= 'z') { return cp - 32; }
        if (!upper && cp >= 'A' && cp <= 'Z') { return cp + 32; }
        return cp;
    }
    pthread_once(&loc_once, loc_init);
    if (loc_utf8 == (locale_t) 0) {
        return cp;
    }
    return (uint32_t) (upper ? towupper_l((wint_t) cp, loc_utf8)
                       : towlower_l((wint_t) cp, loc_utf8));
}


static int
is_cased(uint32_t cp)
{
    return map_case(cp, 1) != cp || map_case(cp, 0) != cp;
}


static void
put_cp(jj_ctx *c, jj_sb *sb, uint32_t cp, int taint)
{
    char   d[4];
    size_t n;

    if (cp < 0x80) { d[0] = (char) cp; n = 1; }
    else if (cp < 0x800) {
        d[0] = (char) (0xc0 | (cp >> 6)); d[1] = (char) (0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        d[0] = (char) (0xe0 | (cp >> 12));
        d[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
        d[2] = (char) (0x80 | (cp & 0x3f));
        n = 3;
    } else {
        d[0] = (char) (0xf0 | (cp >> 18));
        d[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
        d[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
        d[3] = (char) (0x80 | (cp & 0x3f));
        n = 4;
    }
    jj_sb_put(&c->b, sb, d, n, taint);
}


jv
jj_str_case(jj_ctx *c, jv s, int how)
{
    jj_sb   sb;
    int     prev_cased = 0, first = 1;

    s = jv_to_string(c, s);
    jj_sb_init(&sb, c->max_output);
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t cp, m;
        size_t   j = jj_utf8_next(s.u.s->s, s.u.s->len, i, &cp);
        int      t = s.u.s->taint != NULL && s.u.s->taint[i];

        switch (how) {
        case 0: m = map_case(cp, 0); break;
        case 1: m = map_case(cp, 1); break;
        case 2: m = map_case(cp, !prev_cased); break;
        case 4:
            /* jinja2's |title: each piece between runs of -, blanks, (, {,
             * [ and < starts upper and goes on lower */
            m = map_case(cp, first);
            break;
        default: m = map_case(cp, first); break;
        }
        if (m == cp) {
            jj_sb_put_str(&c->b, &sb, s.u.s, i, j - i);
        } else {
            put_cp(c, &sb, m, t);
        }
        prev_cased = is_cased(cp);
        if (how == 4) {
            int sep = jj_py_space(cp) || cp == '-' || cp == '(' || cp == '{'
                      || cp == '[' || cp == '<';

            first = sep;
        } else {
            first = 0;
        }
        i = j;
    }
    return jv_sb(&c->b, &sb);
}


/* --- strip, split, replace --- */

static int
in_chars(const jj_str *chars, uint32_t cp)
{
    for (size_t i = 0; i < chars->len;) {
        uint32_t x;

        i = jj_utf8_next(chars->s, chars->len, i, &x);
        if (x == cp) {
            return 1;
        }
    }
    return 0;
}


static int
strip_char(jv chars, uint32_t cp)
{
    return chars.t == JV_STR ? in_chars(chars.u.s, cp) : jj_py_space(cp);
}


jv
jj_str_strip(jj_ctx *c, jv s, jv chars, int left, int right)
{
    size_t  a = 0, b, n;
    const jj_str *p;

    s = jv_to_string(c, s);
    p = s.u.s;
    n = p->len;
    b = n;
    if (left) {
        while (a < n) {
            uint32_t cp;
            size_t   j = jj_utf8_next(p->s, n, a, &cp);

            if (!strip_char(chars, cp)) {
                break;
            }
            a = j;
        }
    }
    if (right) {
        while (b > a) {
            size_t   k = b - 1;
            uint32_t cp;

            while (k > a && ((unsigned char) p->s[k] & 0xc0) == 0x80) {
                k--;
            }
            jj_utf8_next(p->s, n, k, &cp);
            if (!strip_char(chars, cp)) {
                break;
            }
            b = k;
        }
    }
    return jv_substr(&c->b, p, a, b - a);
}


jv
jj_str_split(jj_ctx *c, jv s, jv sep, int64_t maxsplit)
{
    jv            out = jv_list(&c->b, 0);
    const jj_str *p = s.u.s;
    size_t        i = 0, n = p->len;

    if (sep.t == JV_STR) {
        const jj_str *q = sep.u.s;

        if (q->len == 0) {
            jj_fail(&c->b, c->line, "empty separator");
        }
        for (;;) {
            const char *hit = maxsplit != 0
                              ? memmem(p->s + i, n - i, q->s, q->len) : NULL;

            jj_step(c);
            if (hit == NULL) {
                jj_list_push(&c->b, out.u.l, jv_substr(&c->b, p, i, n - i));
                return out;
            }
            jj_list_push(&c->b, out.u.l,
                         jv_substr(&c->b, p, i, (size_t) (hit - p->s) - i));
            i = (size_t) (hit - p->s) + q->len;
            if (maxsplit > 0) {
                maxsplit--;
            }
        }
    }
    /* no separator: runs of whitespace, none empty */
    for (;;) {
        size_t   a, j;
        uint32_t cp;

        while (i < n) {
            j = jj_utf8_next(p->s, n, i, &cp);
            if (!jj_py_space(cp)) {
                break;
            }
            i = j;
        }
        if (i >= n) {
            return out;
        }
        jj_step(c);
        if (maxsplit == 0) {
            size_t b = n;

            while (b > i) {
                size_t k = b - 1;

                while (k > i && ((unsigned char) p->s[k] & 0xc0) == 0x80) {
                    k--;
                }
                jj_utf8_next(p->s, n, k, &cp);
                if (!jj_py_space(cp)) {
                    break;
                }
                b = k;
            }
            jj_list_push(&c->b, out.u.l, jv_substr(&c->b, p, i, b - i));
            return out;
        }
        a = i;
        while (i < n) {
            j = jj_utf8_next(p->s, n, i, &cp);
            if (jj_py_space(cp)) {
                break;
            }
            i = j;
        }
        jj_list_push(&c->b, out.u.l, jv_substr(&c->b, p, a, i - a));
        if (maxsplit > 0) {
            maxsplit--;
        }
    }
}


jv
jj_str_replace(jj_ctx *c, jv s, jv old, jv new_, int64_t count)
{
    jj_sb         sb;
    const jj_str *p, *o, *w;
    size_t        i = 0;

    s = jv_to_string(c, s);
    old = jv_to_string(c, old);
    new_ = jv_to_string(c, new_);
    p = s.u.s;
    o = old.u.s;
    w = new_.u.s;
    jj_sb_init(&sb, c->max_output);
    if (o->len == 0) {
        /* "ab".replace("", "-") is "-a-b-" */
        for (;;) {
            uint32_t cp;
            size_t   j;

            if (count != 0) {
                jj_sb_put_str(&c->b, &sb, w, 0, w->len);
                if (count > 0) {
                    count--;
                }
            }
            if (i >= p->len) {
                break;
            }
            jj_step(c);
            j = jj_utf8_next(p->s, p->len, i, &cp);
            jj_sb_put_str(&c->b, &sb, p, i, j - i);
            i = j;
        }
        return jv_sb(&c->b, &sb);
    }
    for (;;) {
        const char *hit = count != 0
                          ? memmem(p->s + i, p->len - i, o->s, o->len) : NULL;
        size_t      at;

        jj_step(c);
        if (hit == NULL) {
            jj_sb_put_str(&c->b, &sb, p, i, p->len - i);
            break;
        }
        at = (size_t) (hit - p->s);
        jj_sb_put_str(&c->b, &sb, p, i, at - i);
        jj_sb_put_str(&c->b, &sb, w, 0, w->len);
        i = at + o->len;
        if (count > 0) {
            count--;
        }
    }
    return jv_sb(&c->b, &sb);
}


static int
affix(jj_ctx *c, jv s, jv x, int end)
{
    if (x.t == JV_LIST && x.tuple) {
        for (size_t i = 0; i < x.u.l->n; i++) {
            if (affix(c, s, x.u.l->v[i], end)) {
                return 1;
            }
        }
        return 0;
    }
    if (x.t != JV_STR) {
        jj_fail(&c->b, c->line, "%s first arg must be str or a tuple of str,"
                " not %s", end ? "endswith" : "startswith", jv_type_name(x));
    }
    if (x.u.s->len > s.u.s->len) {
        return 0;
    }
    return memcmp(s.u.s->s + (end ? s.u.s->len - x.u.s->len : 0), x.u.s->s,
                  x.u.s->len) == 0;
}


static jv
arg(jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int pos,
    const char *name, jv dflt)
{
    if (pos < nargs) {
        return args[pos];
    }
    for (int i = 0; i < nkw; i++) {
        if (strcmp(kwn[i], name) == 0) {
            return kwv[i];
        }
    }
    return dflt;
}


static int64_t
int_arg(jj_ctx *c, jv v, int64_t dflt)
{
    if (v.t == JV_UNDEF || v.t == JV_NONE) {
        return dflt;
    }
    if (v.t == JV_INT) {
        return v.u.i;
    }
    if (v.t == JV_BOOL) {
        return v.u.b;
    }
    jj_fail(&c->b, c->line, "'%s' object cannot be interpreted as an "
            "integer", jv_type_name(v));
}


static jv
str_join(jj_ctx *c, jv sep, jv items)
{
    jj_sb sb;

    items = jj_iter_list(c, items, c->line);
    jj_sb_init(&sb, c->max_output);
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (items.u.l->v[i].t != JV_STR) {
            jj_fail(&c->b, c->line, "sequence item %zu: expected str "
                    "instance, %s found", i, jv_type_name(items.u.l->v[i]));
        }
        if (i > 0) {
            jj_sb_put_str(&c->b, &sb, sep.u.s, 0, sep.u.s->len);
        }
        jj_sb_put_str(&c->b, &sb, items.u.l->v[i].u.s, 0,
                      items.u.l->v[i].u.s->len);
    }
    return jv_sb(&c->b, &sb);
}


static jv
str_method(jj_ctx *c, jv s, const char *name, jv *args, int nargs,
           const char **kwn, jv *kwv, int nkw)
{
    jv none = jv_none();

#define A(i, n) arg(args, nargs, kwn, kwv, nkw, (i), (n), none)
    if (strcmp(name, "strip") == 0) {
        return jj_str_strip(c, s, A(0, "chars"), 1, 1);
    }
    if (strcmp(name, "lstrip") == 0) {
        return jj_str_strip(c, s, A(0, "chars"), 1, 0);
    }
    if (strcmp(name, "rstrip") == 0) {
        return jj_str_strip(c, s, A(0, "chars"), 0, 1);
    }
    if (strcmp(name, "split") == 0) {
        return jj_str_split(c, s, A(0, "sep"), int_arg(c, A(1, "maxsplit"),
                                                       -1));
    }
    if (strcmp(name, "startswith") == 0 || strcmp(name, "endswith") == 0) {
        return jv_bool(affix(c, s, A(0, "prefix"), name[0] == 'e'));
    }
    if (strcmp(name, "upper") == 0) { return jj_str_case(c, s, 1); }
    if (strcmp(name, "lower") == 0) { return jj_str_case(c, s, 0); }
    if (strcmp(name, "title") == 0) { return jj_str_case(c, s, 2); }
    if (strcmp(name, "capitalize") == 0) {
        return jj_str_case(c, jj_str_case(c, s, 0), 3);
    }
    if (strcmp(name, "replace") == 0) {
        return jj_str_replace(c, s, A(0, "old"), A(1, "new"),
                              int_arg(c, A(2, "count"), -1));
    }
    if (strcmp(name, "join") == 0) {
        return str_join(c, s, A(0, "iterable"));
    }
    if (strcmp(name, "find") == 0 || strcmp(name, "count") == 0) {
        jv          x = A(0, "sub");
        const char *hit;
        int64_t     k = 0;
        size_t      i = 0;

        if (x.t != JV_STR) {
            jj_fail(&c->b, c->line, "must be str, not %s", jv_type_name(x));
        }
        hit = memmem(s.u.s->s, s.u.s->len, x.u.s->s, x.u.s->len);
        if (name[0] == 'f') {
            return jv_int(hit == NULL ? -1
                          : (int64_t) jj_utf8_len(s.u.s->s,
                                                  (size_t) (hit - s.u.s->s)));
        }
        if (x.u.s->len == 0) {
            return jv_int((int64_t) jj_utf8_len(s.u.s->s, s.u.s->len) + 1);
        }
        while ((hit = memmem(s.u.s->s + i, s.u.s->len - i, x.u.s->s,
                             x.u.s->len)) != NULL)
        {
            k++;
            i = (size_t) (hit - s.u.s->s) + x.u.s->len;
        }
        return jv_int(k);
    }
    if (strncmp(name, "is", 2) == 0) {
        int ok = s.u.s->len > 0, cased = 0;

        for (size_t i = 0; i < s.u.s->len;) {
            uint32_t cp;

            i = jj_utf8_next(s.u.s->s, s.u.s->len, i, &cp);
            if (strcmp(name, "isdigit") == 0) {
                ok &= cp >= '0' && cp <= '9';
            } else if (strcmp(name, "isspace") == 0) {
                ok &= jj_py_space(cp);
            } else if (strcmp(name, "isalpha") == 0) {
                ok &= is_cased(cp) || cp >= 0x80;
            } else if (strcmp(name, "islower") == 0) {
                ok &= map_case(cp, 0) == cp;
                cased |= is_cased(cp);
            } else {
                ok &= map_case(cp, 1) == cp;
                cased |= is_cased(cp);
            }
        }
        if (strcmp(name, "islower") == 0 || strcmp(name, "isupper") == 0) {
            ok &= cased;
        }
        return jv_bool(ok);
    }
#undef A
    jj_fail(&c->b, c->line, "str.%s is not supported here", name);
}


static jv
pair(jj_ctx *c, jv k, jv v)
{
    jv t = jv_list(&c->b, 2);

    t.tuple = 1;
    jj_list_push(&c->b, t.u.l, k);
    jj_list_push(&c->b, t.u.l, v);
    return t;
}


jv
jj_call_method(jj_ctx *c, jv self, const char *name, jv *args, int nargs,
               const char **kwn, jv *kwv, int nkw, int line)
{
    c->line = line;
    if (self.t == JV_STR) {
        return str_method(c, self, name, args, nargs, kwn, kwv, nkw);
    }
    if (self.t == JV_DICT) {
        jj_dict *d = self.u.d;
        jv       out;

        if (strcmp(name, "items") == 0 || strcmp(name, "keys") == 0
            || strcmp(name, "values") == 0)
        {
            out = jv_list(&c->b, d->n);
            for (size_t i = 0; i < d->n; i++) {
                jj_list_push(&c->b, out.u.l,
                             name[0] == 'i' ? pair(c, d->k[i], d->v[i])
                             : name[0] == 'k' ? d->k[i] : d->v[i]);
            }
            out.tuple = name[0] == 'k' ? 4 : name[0] == 'v' ? 5 : 6;
            return out;
        }
        if (strcmp(name, "get") == 0) {
            jv *v;

            if (nargs < 1) {
                jj_fail(&c->b, line, "get expected at least 1 argument");
            }
            v = jj_dict_get(d, args[0]);
            return v != NULL ? *v : nargs > 1 ? args[1] : jv_none();
        }
        if (strcmp(name, "copy") == 0) {
            out = jv_dict(&c->b, d->n);
            for (size_t i = 0; i < d->n; i++) {
                jj_dict_set(&c->b, out.u.d, d->k[i], d->v[i]);
            }
            return out;
        }
    }
    if (self.t == JV_LIST) {
        if (strcmp(name, "index") == 0 || strcmp(name, "count") == 0) {
            int64_t k = 0;

            for (size_t i = 0; nargs > 0 && i < self.u.l->n; i++) {
                if (jv_equal(self.u.l->v[i], args[0])) {
                    if (name[0] == 'i') {
                        return jv_int((int64_t) i);
                    }
                    k++;
                }
            }
            if (name[0] == 'i') {
                jj_fail(&c->b, line, "list.index(x): x not in list");
            }
            return jv_int(k);
        }
        if (strcmp(name, "copy") == 0) {
            jv out = jv_list(&c->b, self.u.l->n);

            for (size_t i = 0; i < self.u.l->n; i++) {
                jj_list_push(&c->b, out.u.l, self.u.l->v[i]);
            }
            return out;
        }
    }
    jj_fail(&c->b, line, "access to attribute '%s' of '%s' object is unsafe",
            name, jv_type_name(self));
}


/* --- printf-style formatting: str % args --- */

static void
pad_put(jj_ctx *c, jj_sb *sb, jv s, int width, int left, int taint_all)
{
    size_t n = jj_utf8_len(s.u.s->s, s.u.s->len);

    for (size_t k = n; !left && (int) k < width; k++) {
        jj_sb_putz(&c->b, sb, " ");
    }
    if (taint_all) {
        jj_sb_put(&c->b, sb, s.u.s->s, s.u.s->len, 0);
    } else {
        jj_sb_put_str(&c->b, sb, s.u.s, 0, s.u.s->len);
    }
    for (size_t k = n; left && (int) k < width; k++) {
        jj_sb_putz(&c->b, sb, " ");
    }
}


/* Python's fmt % args for %s %r %d %i %f %x %c and %%, with flags - 0 +,
 * a width and a precision.  A tuple gives the arguments; a dict (or any
 * other object with items, as Python counts a list) may be left unused. */
jv
jj_str_percent(jj_ctx *c, jv fmt, jv arg)
{
    const jj_str *f = fmt.u.s;
    jv           *args = &arg;
    size_t        nargs = 1, ai = 0;
    int           mapping = arg.t == JV_DICT || arg.t == JV_LIST
                            || arg.t == JV_UNDEF || arg.t == JV_NS;
    jj_sb         sb;

    if (arg.t == JV_LIST && arg.tuple == 1) {
        args = arg.u.l->v;
        nargs = arg.u.l->n;
        mapping = 0;
    }
    jj_sb_init(&sb, c->max_output);
    for (size_t i = 0; i < f->len; i++) {
        int     left = 0, zero = 0, plus = 0, width = 0, prec = -1;
        char    spec[32], buf[128];
        jv      v;

        if (f->s[i] != '%') {
            jj_sb_put_str(&c->b, &sb, f, i, 1);
            continue;
        }
        if (++i >= f->len) {
            jj_fail(&c->b, c->line, "incomplete format");
        }
        if (f->s[i] == '%') {
            jj_sb_putz(&c->b, &sb, "%");
            continue;
        }
        if (f->s[i] == '(') {
            size_t e = i + 1;

            while (e < f->len && f->s[e] != ')') {
                e++;
            }
            if (e >= f->len || arg.t != JV_DICT) {
                jj_fail(&c->b, c->line, "format requires a mapping");
            }
            v = jj_getitem(c, arg, jv_str(&c->b, f->s + i + 1, e - i - 1, 0),
                           c->line);
            jj_not_undef(c, v, c->line);
            i = e + 1;
        } else {
            v = jv_undef(NULL);
        }
        for (; i < f->len && strchr("-0+ #", f->s[i]) != NULL; i++) {
            left |= f->s[i] == '-';
            zero |= f->s[i] == '0';
            plus |= f->s[i] == '+';
        }
        for (; i < f->len && f->s[i] >= '0' && f->s[i] <= '9'; i++) {
            width = width * 10 + (f->s[i] - '0');
            if (width > 4096) {
                jj_fail(&c->b, c->line, "a format width over 4096");
            }
        }
        if (i < f->len && f->s[i] == '.') {
            for (prec = 0, i++; i < f->len && f->s[i] >= '0'
                 && f->s[i] <= '9'; i++)
            {
                prec = prec * 10 + (f->s[i] - '0');
                if (prec > 100) {
                    jj_fail(&c->b, c->line, "a format precision over 100");
                }
            }
        }
        if (i >= f->len) {
            jj_fail(&c->b, c->line, "incomplete format");
        }
        if (v.t == JV_UNDEF) {
            if (ai >= nargs) {
                jj_fail(&c->b, c->line, "not enough arguments for format "
                        "string");
            }
            v = args[ai++];
        }
        switch (f->s[i]) {
        case 's':
        case 'r': {
            jj_sb t;
            jv    s;

            jj_sb_init(&t, c->max_output);
            if (f->s[i] == 's') {
                jv_print(c, &t, v);
            } else {
                jv_repr(c, &t, v);
            }
            s = jv_sb(&c->b, &t);
            if (prec >= 0 && (size_t) prec < s.u.s->len) {
                size_t k = 0, b = 0;
                uint32_t cp;

                while (k < (size_t) prec && b < s.u.s->len) {
                    b = jj_utf8_next(s.u.s->s, s.u.s->len, b, &cp);
                    k++;
                }
                s = jv_substr(&c->b, s.u.s, 0, b);
            }
            pad_put(c, &sb, s, width, left, 0);
            continue;
        }
        case 'd': case 'i': case 'f': case 'F': case 'x': case 'X':
        case 'c':
            break;
        default:
            jj_fail(&c->b, c->line, "unsupported format character '%c'",
                    f->s[i]);
        }
        if (!jv_is_number(v)) {
            jj_fail(&c->b, c->line, "%%%c format: a real number is required,"
                    " not %s", f->s[i], jv_type_name(v));
        }
        snprintf(spec, sizeof(spec), "%%%s%s%s*", left ? "-" : "",
                 zero ? "0" : "", plus ? "+" : "");
        if (f->s[i] == 'f' || f->s[i] == 'F') {
            snprintf(spec + strlen(spec), sizeof(spec) - strlen(spec),
                     ".%df", prec < 0 ? 6 : prec);
            snprintf(buf, sizeof(buf), spec, width > 100 ? 100 : width,
                     jv_num(v));
        } else {
            int64_t k = v.t == JV_FLOAT ? (int64_t) v.u.f
                        : v.t == JV_INT ? v.u.i : v.u.b;

            if (v.t == JV_FLOAT && !(fabs(v.u.f) < 9.2e18)) {
                jj_fail(&c->b, c->line, "integer overflow (past 64 bits)");
            }
            if (f->s[i] == 'c') {
                if (k < 0 || k > 0x10ffff) {
                    jj_fail(&c->b, c->line, "%%c arg not in range");
                }
                put_cp(c, &sb, (uint32_t) k, 0);
                continue;
            }
            snprintf(spec + strlen(spec), sizeof(spec) - strlen(spec),
                     "%s", f->s[i] == 'x' ? PRIx64 : f->s[i] == 'X' ? PRIX64
                     : PRId64);
            snprintf(buf, sizeof(buf), spec, width > 100 ? 100 : width, k);
        }
        jj_sb_putz(&c->b, &sb, buf);
    }
    if (ai < nargs && !mapping) {
        jj_fail(&c->b, c->line, "not all arguments converted during string "
                "formatting");
    }
    return jv_sb(&c->b, &sb);
}


/* --- globals --- */

static jv
strftime_now(jj_ctx *c, jv fmt, int line)
{
    struct tm   tm;
    time_t      t;
    char        buf[256];
    size_t      n;

    if (fmt.t != JV_STR) {
        jj_fail(&c->b, line, "strftime_now: the format must be a string");
    }
    if (c->now >= 0) {
        t = (time_t) c->now;
        gmtime_r(&t, &tm);
    } else {
        t = time(NULL);
        localtime_r(&t, &tm);
    }
    n = strftime(buf, sizeof(buf), fmt.u.s->s, &tm);
    return jv_str(&c->b, buf, n, 0);
}


static jv
range(jj_ctx *c, jv *args, int nargs, int line)
{
    int64_t a = 0, b, s = 1, n;
    jv      out;

    if (nargs < 1 || nargs > 3) {
        jj_fail(&c->b, line, "range expected 1 to 3 arguments");
    }
    for (int i = 0; i < nargs; i++) {
        jj_not_undef(c, args[i], line);
    }
    if (nargs == 1) {
        b = int_arg(c, args[0], 0);
    } else {
        a = int_arg(c, args[0], 0);
        b = int_arg(c, args[1], 0);
        if (nargs == 3) {
            s = int_arg(c, args[2], 1);
        }
    }
    if (s == 0) {
        jj_fail(&c->b, line, "range() arg 3 must not be zero");
    }
    {
        /* in 128 bits: the span of two int64s overflows 64 */
        __int128 span = s > 0 ? (__int128) b - a : (__int128) a - b;
        __int128 step = s > 0 ? (__int128) s : -(__int128) s;

        n = span > 0 ? (int64_t) ((span + step - 1) / step > JJ_MAX_RANGE + 1
                                  ? JJ_MAX_RANGE + 1
                                  : (span + step - 1) / step) : 0;
    }
    if (n > JJ_MAX_RANGE) {
        jj_fail(&c->b, line, "Range too big. The sandbox blocks ranges larger"
                " than MAX_RANGE (%d).", JJ_MAX_RANGE);
    }
    out = jv_list(&c->b, (size_t) n);
    for (int64_t i = 0; i < n; i++) {
        jj_list_push(&c->b, out.u.l, jv_int(a + i * s));
    }
    out.tuple = 3;
    out.u.l->start = a;
    out.u.l->stop = b;
    out.u.l->step = s;
    return out;
}


jv
jj_call_func(jj_ctx *c, int fn, jv *args, int nargs, const char **kwn,
             jv *kwv, int nkw, int line)
{
    jv out;

    switch (fn) {
    case JJ_FN_RAISE: {
        jv msg = nargs > 0 ? jv_to_string(c, args[0]) : jv_strz(&c->b, "");

        if (c->b.err != NULL && c->b.err_len > 0) {
            snprintf(c->b.err, c->b.err_len, "%s", msg.u.s->s);
        }
        c->b.rc = NALAR_JINJA_RAISED;
        longjmp(c->b.jb, 1);
    }
    case JJ_FN_STRFTIME:
        return strftime_now(c, nargs > 0 ? args[0] : jv_none(), line);
    case JJ_FN_RANGE:
        return range(c, args, nargs, line);
    case JJ_FN_NAMESPACE:
    case JJ_FN_DICT:
        out = jv_dict(&c->b, 0);
        for (int i = 0; i < nargs; i++) {
            if (args[i].t != JV_DICT) {
                jj_fail(&c->b, line, "%s: a positional argument must be a "
                        "dict", fn == JJ_FN_DICT ? "dict" : "namespace");
            }
            for (size_t k = 0; k < args[i].u.d->n; k++) {
                jj_dict_set(&c->b, out.u.d, args[i].u.d->k[k],
                            args[i].u.d->v[k]);
            }
        }
        for (int i = 0; i < nkw; i++) {
            jj_dict_set(&c->b, out.u.d, jv_strz(&c->b, kwn[i]), kwv[i]);
        }
        if (fn == JJ_FN_NAMESPACE) {
            out.t = JV_NS;
        }
        return out;
    }
    jj_fail(&c->b, line, "not a function");
}
