/*
 * The evaluator: statements write to the current output (a macro's or a
 * block set's capture, else the render's), expressions give values.  Every
 * statement and expression costs a step and nests one level; the step
 * budget and the depth bound stop a template that loops or recurses without
 * end.  Scopes are jinja2's: a for loop and a macro call open one (a `set`
 * inside stays inside), `if` does not; a namespace is how a loop changes a
 * value outside it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"


void
jj_step(jj_ctx *c)
{
    if (++c->steps > c->max_steps) {
        jj_fail(&c->b, c->line, "the template ran past its budget of %" PRIu64
                " steps", c->max_steps);
    }
}


static void
enter(jj_ctx *c)
{
    jj_step(c);
    if (++c->depth > c->max_depth) {
        jj_fail(&c->b, c->line, "the template nests deeper than %d levels "
                "(recursion?)", c->max_depth);
    }
}


void
jj_not_undef(jj_ctx *c, jv v, int line)
{
    if (v.t == JV_UNDEF) {
        if (v.u.name != NULL) {
            jj_fail(&c->b, line, "'%s' is undefined", v.u.name);
        }
        jj_fail(&c->b, line, "a value is undefined");
    }
}


static jv
lookup(jj_ctx *c, const char *name)
{
    static const struct { const char *name; int fn; } globals[] = {
        { "raise_exception", JJ_FN_RAISE }, { "strftime_now", JJ_FN_STRFTIME },
        { "namespace", JJ_FN_NAMESPACE }, { "range", JJ_FN_RANGE },
        { "dict", JJ_FN_DICT },
    };
    jv *v;

    for (jj_scope *s = c->scope; s != NULL; s = s->up) {
        if ((v = jj_dict_gets(&s->vars, name)) != NULL) {
            return *v;
        }
    }
    if ((v = jj_dict_gets(&c->ctxvars, name)) != NULL) {
        return *v;
    }
    for (size_t i = 0; i < sizeof(globals) / sizeof(globals[0]); i++) {
        if (strcmp(globals[i].name, name) == 0) {
            jv f = { .t = JV_FUNC };

            f.u.fn = globals[i].fn;
            return f;
        }
    }
    return jv_undef(name);
}


static void
bind(jj_ctx *c, jj_scope *s, const char *name, jv v)
{
    jv *p = jj_dict_gets(&s->vars, name);

    if (p != NULL) {
        *p = v;
        return;
    }
    jj_dict_set(&c->b, &s->vars, jv_str(&c->b, name, strlen(name), 0), v);
}


static jv
method_of(jj_ctx *c, jv obj, const char *name)
{
    jv m = { .t = JV_METHOD };

    m.u.meth = jj_alloc(&c->b, sizeof(jj_method));
    m.u.meth->self = obj;
    m.u.meth->name = name;
    return m;
}


jv
jj_getattr(jj_ctx *c, jv obj, const char *name, int line)
{
    jv *v;

    jj_not_undef(c, obj, line);
    if (jj_is_method(obj, name)) {
        return method_of(c, obj, name);
    }
    if ((obj.t == JV_DICT || obj.t == JV_NS)
        && (v = jj_dict_gets(obj.u.d, name)) != NULL)
    {
        return *v;
    }
    return jv_undef(name);
}


/* Python's index of code point k of s, and its byte offsets */
static size_t *
cp_offsets(jj_ctx *c, const jj_str *s, size_t *n)
{
    size_t   *off = jj_alloc(&c->b, (s->len + 1) * sizeof(size_t));
    size_t    i = 0, k = 0;
    uint32_t  cp;

    while (i < s->len) {
        off[k++] = i;
        i = jj_utf8_next(s->s, s->len, i, &cp);
    }
    off[k] = s->len;
    *n = k;
    return off;
}


jv
jj_getitem(jj_ctx *c, jv obj, jv key, int line)
{
    jv *v;

    jj_not_undef(c, obj, line);
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        if ((v = jj_dict_get(obj.u.d, key)) != NULL) {
            return *v;
        }
    } else if ((obj.t == JV_LIST || obj.t == JV_STR)
               && (key.t == JV_INT || key.t == JV_BOOL))
    {
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;

        if (obj.t == JV_LIST && (obj.tuple <= 1 || obj.tuple == 3)) {
            if (i < 0) {
                i += (int64_t) obj.u.l->n;
            }
            if (i >= 0 && (size_t) i < obj.u.l->n) {
                return obj.u.l->v[i];
            }
        } else if (obj.t == JV_STR) {
            size_t  n, *off = cp_offsets(c, obj.u.s, &n);

            if (i < 0) {
                i += (int64_t) n;
            }
            if (i >= 0 && (size_t) i < n) {
                return jv_substr(&c->b, obj.u.s, off[i], off[i + 1] - off[i]);
            }
        }
    }
    if (key.t == JV_STR) {
        if (jj_is_method(obj, key.u.s->s)) {
            return method_of(c, obj, key.u.s->s);
        }
        return jv_undef(key.u.s->s);
    }
    return jv_undef(NULL);
}


static int64_t
slice_arg(jj_ctx *c, jv v, int64_t dflt, int line)
{
    if (v.t == JV_NONE || v.t == JV_UNDEF) {
        return dflt;
    }
    if (v.t == JV_INT) {
        return v.u.i;
    }
    if (v.t == JV_BOOL) {
        return v.u.b;
    }
    jj_fail(&c->b, line, "slice indices must be integers or None");
}


/* Python's slice(start, stop, step).indices(n) over a list or a string */
static jv
eval_slice(jj_ctx *c, jj_node *n)
{
    jv       obj = jj_eval(c, n->a);
    jv       vs[3];
    int64_t  len, start, stop, step, i;
    size_t  *off = NULL, count;
    jj_sb    sb;
    jv       out;

    for (int k = 0; k < 3; k++) {
        jj_node *e = k == 0 ? n->b : k == 1 ? n->c : n->d;

        vs[k] = e != NULL ? jj_eval(c, e) : jv_none();
    }
    jj_not_undef(c, obj, n->line);
    if (obj.t == JV_STR) {
        off = cp_offsets(c, obj.u.s, &count);
        len = (int64_t) count;
    } else if (obj.t == JV_LIST && (obj.tuple <= 1 || obj.tuple == 3)) {
        len = (int64_t) obj.u.l->n;
    } else {
        /* jinja2 compiles a slice to Python's own subscript, not to its
         * forgiving getitem */
        jj_fail(&c->b, n->line, obj.t == JV_DICT
                ? "unhashable type: 'slice'" : "'%s' object is not "
                "subscriptable", jv_type_name(obj));
    }
    step = slice_arg(c, vs[2], 1, n->line);
    if (step == 0) {
        jj_fail(&c->b, n->line, "slice step cannot be zero");
    }
    start = slice_arg(c, vs[0], step > 0 ? 0 : len - 1, n->line);
    stop = slice_arg(c, vs[1], step > 0 ? len : -len - 1, n->line);
    if (vs[0].t == JV_INT || vs[0].t == JV_BOOL) {
        if (start < 0) {
            start += len;
            if (start < 0) {
                start = step < 0 ? -1 : 0;
            }
        } else if (start >= len) {
            start = step < 0 ? len - 1 : len;
        }
    }
    if (vs[1].t == JV_INT || vs[1].t == JV_BOOL) {
        if (stop < 0) {
            stop += len;
            if (stop < 0) {
                stop = step < 0 ? -1 : 0;
            }
        } else if (stop >= len) {
            stop = step < 0 ? len - 1 : len;
        }
    } else if (step < 0) {
        stop = -1;
    }
    if (obj.t == JV_LIST) {
        out = jv_list(&c->b, 0);
        for (i = start; step > 0 ? i < stop : i > stop; i += step) {
            jj_step(c);
            jj_list_push(&c->b, out.u.l, obj.u.l->v[i]);
        }
        /* a tuple's slice is a tuple, a range's a range */
        out.tuple = obj.tuple;
        if (obj.tuple == 3) {
            jj_list *r = obj.u.l;

            out.u.l->start = r->start + start * r->step;
            out.u.l->stop = r->start + stop * r->step;
            out.u.l->step = r->step * step;
        }
        return out;
    }
    jj_sb_init(&sb, c->max_output);
    for (i = start; step > 0 ? i < stop : i > stop; i += step) {
        jj_step(c);
        jj_sb_put_str(&c->b, &sb, obj.u.s, off[i], off[i + 1] - off[i]);
    }
    return jv_sb(&c->b, &sb);
}


jv
jj_iter_list(jj_ctx *c, jv v, int line)
{
    jv out;

    switch (v.t) {
    case JV_LIST:
        if (v.u.l->raise != NULL) {
            jj_fail(&c->b, line, "%s", v.u.l->raise);
        }
        return v;
    case JV_UNDEF:
        return jv_list(&c->b, 0);
    case JV_DICT:
        out = jv_list(&c->b, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jj_list_push(&c->b, out.u.l, v.u.d->k[i]);
        }
        return out;
    case JV_STR: {
        size_t  n, *off = cp_offsets(c, v.u.s, &n);

        out = jv_list(&c->b, n);
        for (size_t i = 0; i < n; i++) {
            jj_list_push(&c->b, out.u.l,
                         jv_substr(&c->b, v.u.s, off[i], off[i + 1] - off[i]));
        }
        return out;
    }
    default:
        jj_fail(&c->b, line, "'%s' object is not iterable", jv_type_name(v));
    }
}


static jv
str_concat(jj_ctx *c, jv a, jv b)
{
    jj_sb sb;
    jv    r;
    int   safe = a.safe || b.safe;

    jj_sb_init(&sb, c->max_output);
    /* Markup + str escapes the str (markupsafe) */
    if (safe && !a.safe) {
        jj_sb_put_escaped(&c->b, &sb, a.u.s);
    } else {
        jj_sb_put_str(&c->b, &sb, a.u.s, 0, a.u.s->len);
    }
    if (safe && !b.safe) {
        jj_sb_put_escaped(&c->b, &sb, b.u.s);
    } else {
        jj_sb_put_str(&c->b, &sb, b.u.s, 0, b.u.s->len);
    }
    r = jv_sb(&c->b, &sb);
    r.safe = (uint8_t) safe;
    return r;
}


static const char *const op_names[] = {
    "+", "-", "*", "/", "//", "%", "**"
};


static jv
repeat(jj_ctx *c, jv seq, int64_t k)
{
    jv r;

    if (k < 0) {
        k = 0;
    }
    if (seq.t == JV_STR) {
        jj_sb sb;

        jj_sb_init(&sb, c->max_output);
        for (int64_t i = 0; i < k; i++) {
            jj_step(c);
            jj_sb_put_str(&c->b, &sb, seq.u.s, 0, seq.u.s->len);
        }
        r = jv_sb(&c->b, &sb);
        return r;
    }
    r = jv_list(&c->b, 0);
    r.tuple = seq.tuple;
    for (int64_t i = 0; i < k; i++) {
        for (size_t j = 0; j < seq.u.l->n; j++) {
            jj_step(c);
            jj_list_push(&c->b, r.u.l, seq.u.l->v[j]);
        }
    }
    return r;
}


static jv
arith(jj_ctx *c, int op, jv a, jv b, int line)
{
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
        int64_t x = a.t == JV_INT ? a.u.i : a.u.b;
        int64_t y = b.t == JV_INT ? b.u.i : b.u.b;
        int64_t r;

        switch (op) {
        /* Python's ints have no bound; ours stop at 64 bits, with an
         * error rather than a different number */
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &r)) { goto overflow; }
            return jv_int(r);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &r)) { goto overflow; }
            return jv_int(r);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &r)) { goto overflow; }
            return jv_int(r);
        case OP_DIV:
            break;
        case OP_FLOORDIV:
        case OP_MOD:
            if (y == 0) {
                jj_fail(&c->b, line, "integer division or modulo by zero");
            }
            if (x == INT64_MIN && y == -1) {
                goto overflow;
            }
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) {
                r--;
            }
            return op == OP_FLOORDIV ? jv_int(r) : jv_int(x - r * y);
        case OP_POW:
            if (y >= 0) {
                int64_t acc = 1;

                for (int64_t i = 0; i < y; i++) {
                    jj_step(c);
                    if (__builtin_mul_overflow(acc, x, &acc)) {
                        goto overflow;
                    }
                }
                return jv_int(acc);
            }
            break;
        }
    }
    {
        double x = jv_num(a), y = jv_num(b);

        switch (op) {
        case OP_ADD: return jv_float(x + y);
        case OP_SUB: return jv_float(x - y);
        case OP_MUL: return jv_float(x * y);
        case OP_DIV:
            if (y == 0) {
                jj_fail(&c->b, line, "division by zero");
            }
            return jv_float(x / y);
        case OP_FLOORDIV:
            if (y == 0) {
                jj_fail(&c->b, line, "float floor division by zero");
            }
            return jv_float(floor(x / y));
        case OP_MOD: {
            double m;

            if (y == 0) {
                jj_fail(&c->b, line, "float modulo");
            }
            m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) {
                m += y;
            }
            return jv_float(m);
        }
        default:
            return jv_float(pow(x, y));
        }
    }

overflow:
    jj_fail(&c->b, line, "integer overflow (past 64 bits)");
}


/* Python's dict keys and set members: not a list, dict or view */
void
jj_hashable(jj_ctx *c, jv v, int line)
{
    if ((v.t == JV_LIST && v.tuple != 1 && v.tuple != 3) || v.t == JV_DICT
        || v.t == JV_NS)
    {
        jj_fail(&c->b, line, "unhashable type: '%s'", jv_type_name(v));
    }
    if (v.t == JV_LIST) {
        for (size_t i = 0; i < v.u.l->n; i++) {
            jj_hashable(c, v.u.l->v[i], line);
        }
    }
}


jv
jj_binop(jj_ctx *c, int op, jv a, jv b, int line)
{
    if (op == OP_MOD && a.t == JV_STR) {
        c->line = line;
        return jj_str_percent(c, a, b);
    }
    jj_not_undef(c, a, line);
    jj_not_undef(c, b, line);
    if (jv_is_number(a) && jv_is_number(b)) {
        return arith(c, op, a, b, line);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        return str_concat(c, a, b);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST
        && a.tuple == b.tuple && a.tuple < 2)
    {
        jv r = jv_list(&c->b, a.u.l->n + b.u.l->n);

        for (size_t i = 0; i < a.u.l->n; i++) {
            jj_list_push(&c->b, r.u.l, a.u.l->v[i]);
        }
        for (size_t i = 0; i < b.u.l->n; i++) {
            jj_list_push(&c->b, r.u.l, b.u.l->v[i]);
        }
        r.tuple = a.tuple;
        return r;
    }
    if (op == OP_MUL && (a.t == JV_STR || (a.t == JV_LIST && a.tuple < 2))
        && (b.t == JV_INT || b.t == JV_BOOL))
    {
        return repeat(c, a, b.t == JV_INT ? b.u.i : b.u.b);
    }
    if (op == OP_MUL && (b.t == JV_STR || (b.t == JV_LIST && b.tuple < 2))
        && (a.t == JV_INT || a.t == JV_BOOL))
    {
        return repeat(c, b, a.t == JV_INT ? a.u.i : a.u.b);
    }
    if (op == OP_ADD && a.t == JV_STR) {
        jj_fail(&c->b, line, "can only concatenate str (not \"%s\") to str",
                jv_type_name(b));
    }
    jj_fail(&c->b, line, "unsupported operand type(s) for %s: '%s' and '%s'",
            op_names[op], jv_type_name(a), jv_type_name(b));
}


static int
contains(jj_ctx *c, jv item, jv box, int line)
{
    switch (box.t) {
    case JV_STR:
        if (item.t != JV_STR) {
            jj_fail(&c->b, line, "'in <string>' requires string as left "
                    "operand, not %s", jv_type_name(item));
        }
        return item.u.s->len == 0
               || memmem(box.u.s->s, box.u.s->len, item.u.s->s,
                         item.u.s->len) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < box.u.l->n; i++) {
            jj_step(c);
            if (jv_equal(box.u.l->v[i], item)) {
                return 1;
            }
        }
        return 0;
    case JV_DICT:
        jj_hashable(c, item, line);
        return jj_dict_get(box.u.d, item) != NULL;
    case JV_UNDEF:
        return 0;
    default:
        jj_fail(&c->b, line, "argument of type '%s' is not iterable",
                jv_type_name(box));
    }
}


static jv
compare(jj_ctx *c, jj_node *n)
{
    jv  a = jj_eval(c, n->a), b = jj_eval(c, n->b);
    int r;

    switch (n->op) {
    case OP_EQ: return jv_bool(jv_equal(a, b));
    case OP_NE: return jv_bool(!jv_equal(a, b));
    case OP_IN: return jv_bool(contains(c, a, b, n->line));
    case OP_NOTIN: return jv_bool(!contains(c, a, b, n->line));
    }
    c->line = n->line;
    r = jv_compare(c, a, b);
    switch (n->op) {
    case OP_LT: return jv_bool(r < 0);
    case OP_LE: return jv_bool(r <= 0);
    case OP_GT: return jv_bool(r > 0);
    default: return jv_bool(r >= 0);
    }
}


typedef struct {
    jv          *args;
    int          nargs;
    const char **kwn;
    jv          *kwv;
    int          nkw;
} jj_args;


static void
eval_args(jj_ctx *c, jj_node *n, jj_args *a)
{
    a->nargs = n->nargs;
    a->nkw = n->nkw;
    a->kwn = n->kwn;
    a->args = jj_alloc(&c->b, (n->nargs + 1) * sizeof(jv));
    a->kwv = jj_alloc(&c->b, (n->nkw + 1) * sizeof(jv));
    for (int i = 0; i < n->nargs; i++) {
        a->args[i] = jj_eval(c, n->args[i]);
    }
    for (int i = 0; i < n->nkw; i++) {
        a->kwv[i] = jj_eval(c, n->kwv[i]);
    }
}


static jv
eval_call(jj_ctx *c, jj_node *n)
{
    jv      f;
    jj_args a;

    f = jj_eval(c, n->a);
    eval_args(c, n, &a);
    switch (f.t) {
    case JV_MACRO:
        return jj_call_macro(c, f.u.m, a.args, a.nargs, a.kwn, a.kwv, a.nkw,
                             n->line);
    case JV_FUNC:
        return jj_call_func(c, f.u.fn, a.args, a.nargs, a.kwn, a.kwv, a.nkw,
                            n->line);
    case JV_METHOD:
        return jj_call_method(c, f.u.meth->self, f.u.meth->name, a.args,
                              a.nargs, a.kwn, a.kwv, a.nkw, n->line);
    case JV_UNDEF:
        jj_not_undef(c, f, n->line);
        /* fallthrough */
    default:
        jj_fail(&c->b, n->line, "'%s' object is not callable",
                jv_type_name(f));
    }
}


/* the filters of a chain (innermost first) over v; a NULL target is v */
static jv
apply_filters(jj_ctx *c, jj_node *f, jv v)
{
    jj_args a;

    if (f->a != NULL) {
        v = apply_filters(c, f->a, v);
    }
    eval_args(c, f, &a);
    return jj_filter(c, f->name, v, a.args, a.nargs, a.kwn, a.kwv, a.nkw,
                     f->line);
}


static jv
eval_inner(jj_ctx *c, jj_node *n)
{
    jv      v;
    jj_args a;

    switch (n->k) {
    case JN_LIT:
        return n->lit;
    case JN_NAME:
        return lookup(c, n->name);
    case JN_ATTR:
        return jj_getattr(c, jj_eval(c, n->a), n->name, n->line);
    case JN_ITEM:
        v = jj_eval(c, n->a);
        return jj_getitem(c, v, jj_eval(c, n->b), n->line);
    case JN_SLICE:
        return eval_slice(c, n);
    case JN_CALL:
        return eval_call(c, n);
    case JN_FILTER:
        v = jj_eval(c, n->a);
        eval_args(c, n, &a);
        return jj_filter(c, n->name, v, a.args, a.nargs, a.kwn, a.kwv, a.nkw,
                         n->line);
    case JN_TEST:
        v = jj_eval(c, n->a);
        eval_args(c, n, &a);
        return jv_bool(jj_test(c, n->name, v, a.args, a.nargs, n->line)
                       != n->op);
    case JN_NEG:
    case JN_POS:
        v = jj_eval(c, n->a);
        jj_not_undef(c, v, n->line);
        if (!jv_is_number(v)) {
            jj_fail(&c->b, n->line, "bad operand type for unary %s: '%s'",
                    n->k == JN_NEG ? "-" : "+", jv_type_name(v));
        }
        if (n->k == JN_POS) {
            return v.t == JV_BOOL ? jv_int(v.u.b) : v;
        }
        if (v.t == JV_INT && v.u.i == INT64_MIN) {
            jj_fail(&c->b, n->line, "integer overflow");
        }
        return v.t == JV_FLOAT ? jv_float(-v.u.f)
               : jv_int(-(v.t == JV_INT ? v.u.i : v.u.b));
    case JN_NOT:
        return jv_bool(!jv_truthy(jj_eval(c, n->a)));
    case JN_AND:
        v = jj_eval(c, n->a);
        return jv_truthy(v) ? jj_eval(c, n->b) : v;
    case JN_OR:
        v = jj_eval(c, n->a);
        return jv_truthy(v) ? v : jj_eval(c, n->b);
    case JN_BIN: {
        jv l = jj_eval(c, n->a);

        return jj_binop(c, n->op, l, jj_eval(c, n->b), n->line);
    }
    case JN_CMP:
        return compare(c, n);
    case JN_CONCAT: {
        jj_sb sb;

        jj_sb_init(&sb, c->max_output);
        for (int i = 0; i < n->nargs; i++) {
            jv_print(c, &sb, jj_eval(c, n->args[i]));
        }
        return jv_sb(&c->b, &sb);
    }
    case JN_COND:
        if (jv_truthy(jj_eval(c, n->b))) {
            return jj_eval(c, n->a);
        }
        return n->c != NULL ? jj_eval(c, n->c) : jv_undef(NULL);
    case JN_LIST:
    case JN_TUPLE:
        v = jv_list(&c->b, n->nargs);
        v.tuple = n->k == JN_TUPLE;
        for (int i = 0; i < n->nargs; i++) {
            jj_list_push(&c->b, v.u.l, jj_eval(c, n->args[i]));
        }
        return v;
    case JN_DICTLIT:
        v = jv_dict(&c->b, n->nargs);
        for (int i = 0; i < n->nargs; i++) {
            jv k = jj_eval(c, n->args[i]);

            jj_hashable(c, k, n->line);
            jj_dict_set(&c->b, v.u.d, k, jj_eval(c, n->kwv[i]));
        }
        return v;
    default:
        jj_fail(&c->b, n->line, "not an expression");
    }
}


jv
jj_eval(jj_ctx *c, jj_node *n)
{
    jv v;

    enter(c);
    v = eval_inner(c, n);
    c->depth--;
    return v;
}


/* --- statements --- */

static void
assign(jj_ctx *c, jj_scope *s, jj_node *n, jv v)
{
    if (n->nnames == 1) {
        bind(c, s, n->names[0], v);
        return;
    }
    v = jj_iter_list(c, v, n->line);
    if (v.u.l->n != (size_t) n->nnames) {
        jj_fail(&c->b, n->line, "%s values to unpack (expected %d, got %zu)",
                v.u.l->n > (size_t) n->nnames ? "too many" : "not enough",
                n->nnames, v.u.l->n);
    }
    for (int i = 0; i < n->nnames; i++) {
        bind(c, s, n->names[i], v.u.l->v[i]);
    }
}


/* the loop object: one dict per loop, its values set for each item */
static void
loop_vars(jj_ctx *c, jj_scope *s, jv *d, jj_list *items, size_t i)
{
    size_t n = items->n;
    struct { const char *k; jv v; } f[] = {
        { "index", jv_int((int64_t) i + 1) },
        { "index0", jv_int((int64_t) i) },
        { "revindex", jv_int((int64_t) (n - i)) },
        { "revindex0", jv_int((int64_t) (n - i - 1)) },
        { "first", jv_bool(i == 0) },
        { "last", jv_bool(i + 1 == n) },
        { "length", jv_int((int64_t) n) },
        { "depth", jv_int(1) },
        { "depth0", jv_int(0) },
        { "previtem", i > 0 ? items->v[i - 1] : jv_undef("previtem") },
        { "nextitem", i + 1 < n ? items->v[i + 1] : jv_undef("nextitem") },
    };

    if (d->t != JV_DICT) {
        *d = jv_dict(&c->b, 12);
        for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
            jj_dict_set(&c->b, d->u.d,
                        jv_str(&c->b, f[k].k, strlen(f[k].k), 0), f[k].v);
        }
    } else {
        for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
            d->u.d->v[k] = f[k].v;
        }
    }
    bind(c, s, "loop", *d);
}


static void
exec_for(jj_ctx *c, jj_node *n)
{
    jv        seq = jj_iter_list(c, jj_eval(c, n->a), n->line);
    jj_scope *s = jj_alloc(&c->b, sizeof(jj_scope)), *saved = c->scope;
    jj_list  *items = seq.u.l;
    jv        loop = jv_none();

    s->up = c->scope;
    c->scope = s;
    if (n->d != NULL) {
        /* for x in xs if cond: loop.* counts what passes */
        jv kept = jv_list(&c->b, 0);

        for (size_t i = 0; i < items->n; i++) {
            jj_step(c);
            assign(c, s, n, items->v[i]);
            if (jv_truthy(jj_eval(c, n->d))) {
                jj_list_push(&c->b, kept.u.l, items->v[i]);
            }
        }
        items = kept.u.l;
    }
    for (size_t i = 0; i < items->n; i++) {
        int ctl = 0;

        jj_step(c);
        loop_vars(c, s, &loop, items, i);
        assign(c, s, n, items->v[i]);
        jj_exec_body(c, n->b, &ctl);
        if (ctl == 1) {
            break;
        }
    }
    if (items->n == 0 && n->c != NULL) {
        int ctl = 0;

        c->scope = saved;
        jj_exec_body(c, n->c, &ctl);
    }
    c->scope = saved;
}


/* runs body with its output captured; returns it as a string */
static jv
capture(jj_ctx *c, jj_node *body)
{
    jj_sb *saved = c->out, sb;
    int    ctl = 0;

    jj_sb_init(&sb, c->max_output);
    c->out = &sb;
    jj_exec_body(c, body, &ctl);
    c->out = saved;
    return jv_sb(&c->b, &sb);
}


jv
jj_call_macro(jj_ctx *c, jj_node *m, jv *args, int nargs, const char **kwn,
              jv *kwv, int nkw, int line)
{
    jj_scope *s = jj_alloc(&c->b, sizeof(jj_scope)), *saved = c->scope;
    int       first_default = m->nnames - m->nkw;
    jj_node       *caller = c->caller;
    jv        r;

    c->caller = NULL;
    if (nargs > m->nnames) {
        jj_fail(&c->b, line, "macro '%s' takes not more than %d argument(s)",
                m->name != NULL ? m->name : "caller", m->nnames);
    }
    s->up = c->root;
    for (int i = 0; i < nkw; i++) {
        int k;

        for (k = 0; k < m->nnames && strcmp(m->names[k], kwn[i]) != 0; k++) {
        }
        if (k == m->nnames) {
            jj_fail(&c->b, line, "macro '%s' takes no keyword argument '%s'",
                    m->name != NULL ? m->name : "caller", kwn[i]);
        }
        if (k < nargs) {
            jj_fail(&c->b, line, "macro '%s' got multiple values for "
                    "argument '%s'", m->name, kwn[i]);
        }
    }
    c->scope = s;
    for (int k = 0; k < m->nnames; k++) {
        jv  v = jv_undef(m->names[k]);
        int given = 0;

        if (k < nargs) {
            v = args[k];
            given = 1;
        }
        for (int i = 0; i < nkw && !given; i++) {
            if (strcmp(m->names[k], kwn[i]) == 0) {
                v = kwv[i];
                given = 1;
            }
        }
        if (!given && k >= first_default) {
            v = jj_eval(c, m->kwv[k - first_default]);
        }
        bind(c, s, m->names[k], v);
    }
    if (caller != NULL) {
        jv cv = { .t = JV_MACRO };

        cv.u.m = caller;
        bind(c, s, "caller", cv);
    }
    enter(c);
    r = capture(c, m->b);
    c->depth--;
    c->scope = saved;
    return r;
}


static void
exec_set(jj_ctx *c, jj_node *n)
{
    jv v = jj_eval(c, n->a);

    if (n->op) {
        jv ns = lookup(c, n->name);

        if (ns.t != JV_NS) {
            jj_fail(&c->b, n->line, "cannot assign attribute on "
                    "non-namespace object");
        }
        jj_dict_set(&c->b, ns.u.d, jv_str(&c->b, n->names[0],
                    strlen(n->names[0]), 0), v);
        return;
    }
    assign(c, c->scope, n, v);
}


static void
exec_stmt(jj_ctx *c, jj_node *n, int *ctl)
{
    jv v;

    c->line = n->line;
    switch (n->k) {
    case JN_TEXT:
        jj_sb_put_str(&c->b, c->out, n->lit.u.s, 0, n->lit.u.s->len);
        return;
    case JN_OUT:
        v = jj_eval(c, n->a);
        jv_print(c, c->out, v);
        return;
    case JN_IF:
        while (n != NULL && n->k == JN_IF) {
            if (jv_truthy(jj_eval(c, n->a))) {
                jj_exec_body(c, n->b, ctl);
                return;
            }
            n = n->c;
        }
        if (n != NULL) {
            jj_exec_body(c, n, ctl);
        }
        return;
    case JN_FOR:
        exec_for(c, n);
        return;
    case JN_SET:
        exec_set(c, n);
        return;
    case JN_SETBLOCK:
        v = capture(c, n->b);
        if (n->a != NULL) {
            v = apply_filters(c, n->a, v);
        }
        bind(c, c->scope, n->names[0], v);
        return;
    case JN_FILTERBLOCK:
        v = apply_filters(c, n->a, capture(c, n->b));
        jv_print(c, c->out, v);
        return;
    case JN_MACRO:
        v.t = JV_MACRO;
        v.safe = v.tuple = 0;
        v.u.m = n;
        bind(c, c->scope, n->name, v);
        return;
    case JN_CALLBLOCK:
        c->caller = n;
        v = eval_call(c, n->a);
        c->caller = NULL;
        jv_print(c, c->out, v);
        return;
    case JN_BREAK:
        *ctl = 1;
        return;
    case JN_CONTINUE:
        *ctl = 2;
        return;
    default:
        jj_fail(&c->b, n->line, "not a statement");
    }
}


/* ctl: set to 1 by break, 2 by continue, for the loop around */
void
jj_exec_body(jj_ctx *c, jj_node *body, int *ctl)
{
    enter(c);
    for (int i = 0; i < body->nargs && *ctl == 0; i++) {
        jj_step(c);
        exec_stmt(c, body->args[i], ctl);
    }
    c->depth--;
}
