/*
 * The parser: tokens to the syntax tree, by jinja2's grammar and operator
 * precedence (or < and < not < comparisons and `in` < + - < ~ < * / // %
 * < ** < unary - < filters and tests < postfix . [] ()).  Nesting is bounded
 * (JJ_PARSE_DEPTH), so a hostile template cannot exhaust the stack here.
 */
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

#define JJ_PARSE_DEPTH 200

typedef struct {
    jj_base    *b;
    jj_tok     *t;
    size_t      n, i;
    int         depth;
} parser;

typedef struct {
    jj_node        **v;
    int         n, cap;
} nvec;

static jj_node *parse_expr(parser *p, int condexpr);
static jj_node *parse_body(parser *p, const char *const *ends, int nends);
static jj_node *parse_unary(parser *p, int with_filter);
static jj_node *parse_primary(parser *p);
static jj_node *parse_tuple(parser *p, int condexpr, int explicit_parens);


static void
nvec_push(parser *p, nvec *v, jj_node *x)
{
    if (v->n == v->cap) {
        int   cap = v->cap ? 2 * v->cap : 4;
        jj_node  **nv = jj_alloc(p->b, cap * sizeof(jj_node *));

        if (v->n > 0) {
            memcpy(nv, v->v, v->n * sizeof(jj_node *));
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}


static jj_tok *
cur(parser *p)
{
    return &p->t[p->i < p->n ? p->i : p->n - 1];
}


static jj_tok *
next(parser *p)
{
    jj_tok *t = cur(p);

    if (p->i < p->n - 1) {
        p->i++;
    }
    return t;
}


static int
tok_is(const jj_tok *t, int type, const char *s)
{
    return t->type == type && (s == NULL || (t->len == strlen(s)
                                             && memcmp(t->s, s, t->len) == 0));
}


static int is_op(parser *p, const char *s) { return tok_is(cur(p), T_OP, s); }
static int is_name(parser *p, const char *s)
{
    return tok_is(cur(p), T_NAME, s);
}


static const char *
describe(const jj_tok *t)
{
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_BEND: return "end of statement block";
    case T_VEND: return "end of print statement";
    case T_TEXT: return "template data";
    default: return "token";
    }
}


static void
expect_op(parser *p, const char *s)
{
    jj_tok *t = cur(p);

    if (!tok_is(t, T_OP, s)) {
        jj_fail(p->b, t->line, "expected '%s', got %s%s%.*s%s", s,
                describe(t), t->s != NULL ? " '" : "",
                t->s != NULL ? (int) (t->len > 40 ? 40 : t->len) : 0,
                t->s != NULL ? t->s : "", t->s != NULL ? "'" : "");
    }
    next(p);
}


static void
expect_type(parser *p, int type, const char *what)
{
    jj_tok *t = cur(p);

    if (t->type != type) {
        jj_fail(p->b, t->line, "expected %s, got %s%s%.*s%s", what,
                describe(t), t->s != NULL ? " '" : "",
                t->s != NULL ? (int) (t->len > 40 ? 40 : t->len) : 0,
                t->s != NULL ? t->s : "", t->s != NULL ? "'" : "");
    }
    next(p);
}


static const char *
expect_name(parser *p)
{
    jj_tok *t = cur(p);

    expect_type(p, T_NAME, "a name");
    return jj_strdup(p->b, t->s, t->len);
}


static jj_node *
mk(parser *p, int k)
{
    jj_node *n = jj_alloc(p->b, sizeof(jj_node));

    n->k = k;
    n->line = cur(p)->line;
    return n;
}


static void
enter(parser *p)
{
    if (++p->depth > JJ_PARSE_DEPTH) {
        jj_fail(p->b, cur(p)->line, "the template nests deeper than %d",
                JJ_PARSE_DEPTH);
    }
}


/* call arguments after "(": positional, then name=value */
static void
parse_args(parser *p, jj_node *n)
{
    nvec    pos = { 0 }, kv = { 0 };
    const char **names = NULL;
    int     cap = 0;

    while (!is_op(p, ")")) {
        if (pos.n + kv.n > 0) {
            expect_op(p, ",");
            if (is_op(p, ")")) {
                break;
            }
        }
        if (cur(p)->type == T_NAME && tok_is(&p->t[p->i + 1], T_OP, "=")) {
            const char *name = expect_name(p);

            next(p);
            if (kv.n == cap) {
                const char **nn;

                cap = cap ? 2 * cap : 4;
                nn = jj_alloc(p->b, cap * sizeof(char *));
                if (kv.n > 0) {
                    memcpy(nn, names, kv.n * sizeof(char *));
                }
                names = nn;
            }
            names[kv.n] = name;
            nvec_push(p, &kv, parse_expr(p, 1));
        } else {
            if (kv.n > 0) {
                jj_fail(p->b, cur(p)->line, "a positional argument after a "
                        "keyword argument");
            }
            nvec_push(p, &pos, parse_expr(p, 1));
        }
    }
    next(p);
    n->args = pos.v;
    n->nargs = pos.n;
    n->kwv = kv.v;
    n->kwn = names;
    n->nkw = kv.n;
}


static jj_node *
parse_subscript(parser *p, jj_node *target)
{
    jj_node *n, *parts[3] = { NULL, NULL, NULL };
    int k = 0, slice = 0;

    for (;;) {
        if (is_op(p, ":")) {
            slice = 1;
            next(p);
            if (++k > 2) {
                jj_fail(p->b, cur(p)->line, "a bad slice");
            }
            continue;
        }
        if (is_op(p, "]")) {
            break;
        }
        if (parts[k] != NULL) {
            jj_fail(p->b, cur(p)->line, "expected ']'");
        }
        parts[k] = parse_expr(p, 1);
        if (k == 0 && !slice && is_op(p, ",")) {
            /* x[a, b]: the key is a tuple */
            nvec t = { 0 };

            nvec_push(p, &t, parts[0]);
            while (is_op(p, ",")) {
                next(p);
                if (is_op(p, "]")) {
                    break;
                }
                nvec_push(p, &t, parse_expr(p, 1));
            }
            parts[0] = mk(p, JN_TUPLE);
            parts[0]->args = t.v;
            parts[0]->nargs = t.n;
        }
    }
    next(p);
    if (!slice) {
        if (parts[0] == NULL) {
            jj_fail(p->b, cur(p)->line, "an empty subscript");
        }
        n = mk(p, JN_ITEM);
        n->a = target;
        n->b = parts[0];
        return n;
    }
    n = mk(p, JN_SLICE);
    n->a = target;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}


static jj_node *
parse_postfix(parser *p, jj_node *node)
{
    for (;;) {
        jj_node *n;

        if (is_op(p, ".")) {
            next(p);
            if (cur(p)->type == T_INT) {
                n = mk(p, JN_ITEM);
                n->b = mk(p, JN_LIT);
                n->b->lit = jv_int(next(p)->i);
            } else {
                n = mk(p, JN_ATTR);
                n->name = expect_name(p);
            }
            n->a = node;
        } else if (is_op(p, "[")) {
            next(p);
            n = parse_subscript(p, node);
        } else if (is_op(p, "(")) {
            next(p);
            n = mk(p, JN_CALL);
            n->a = node;
            parse_args(p, n);
        } else {
            return node;
        }
        node = n;
    }
}


static const char *
dotted_name(parser *p)
{
    const char *name = expect_name(p);

    while (is_op(p, ".") && p->t[p->i + 1].type == T_NAME) {
        const char *more;
        char       *s;

        next(p);
        more = expect_name(p);
        s = jj_alloc(p->b, strlen(name) + strlen(more) + 2);
        strcpy(s, name);
        strcat(s, ".");
        strcat(s, more);
        name = s;
    }
    return name;
}


static jj_node *
parse_filter(parser *p, jj_node *target)
{
    jj_node *n = mk(p, JN_FILTER);

    n->name = dotted_name(p);
    if (!jj_filter_known(n->name)) {
        jj_fail(p->b, n->line, "no filter named '%s'", n->name);
    }
    n->a = target;
    if (is_op(p, "(")) {
        next(p);
        parse_args(p, n);
    }
    return n;
}


static jj_node *
parse_test(parser *p, jj_node *target)
{
    jj_node     *n = mk(p, JN_TEST);
    jj_tok *t;

    if (is_name(p, "not")) {
        next(p);
        n->op = 1;
    }
    n->name = dotted_name(p);
    if (!jj_test_known(n->name)) {
        jj_fail(p->b, n->line, "no test named '%s'", n->name);
    }
    n->a = target;
    t = cur(p);
    if (is_op(p, "(")) {
        next(p);
        parse_args(p, n);
    } else if ((t->type == T_NAME || t->type == T_STR || t->type == T_INT
                || t->type == T_FLOAT || is_op(p, "(") || is_op(p, "[")
                || is_op(p, "{"))
               && !is_name(p, "else") && !is_name(p, "or")
               && !is_name(p, "and"))
    {
        if (is_name(p, "is")) {
            jj_fail(p->b, t->line, "you cannot chain multiple tests with is");
        }
        n->args = jj_alloc(p->b, sizeof(jj_node *));
        n->args[0] = parse_postfix(p, parse_primary(p));
        n->nargs = 1;
    }
    return n;
}


static jj_node *
parse_filter_expr(parser *p, jj_node *node)
{
    for (;;) {
        if (is_op(p, "|")) {
            next(p);
            node = parse_filter(p, node);
        } else if (is_name(p, "is")) {
            next(p);
            node = parse_test(p, node);
        } else if (is_op(p, "(")) {
            jj_node *n = mk(p, JN_CALL);

            next(p);
            n->a = node;
            parse_args(p, n);
            node = n;
        } else {
            return node;
        }
    }
}


static jj_node *
parse_primary(parser *p)
{
    jj_tok *t = cur(p);
    jj_node     *n;

    enter(p);
    if (t->type == T_NAME) {
        n = mk(p, JN_LIT);
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) {
            n->lit = jv_bool(1);
        } else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) {
            n->lit = jv_bool(0);
        } else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) {
            n->lit = jv_none();
        } else {
            n->k = JN_NAME;
            n->name = jj_strdup(p->b, t->s, t->len);
        }
        next(p);
    } else if (t->type == T_STR) {
        jj_sb sb;

        jj_sb_init(&sb, 0);
        while (cur(p)->type == T_STR) {
            jj_sb_put(p->b, &sb, cur(p)->s, cur(p)->len, 0);
            next(p);
        }
        n = mk(p, JN_LIT);
        n->lit = jv_sb(p->b, &sb);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = mk(p, JN_LIT);
        n->lit = t->type == T_INT ? jv_int(t->i) : jv_float(t->f);
        next(p);
    } else if (is_op(p, "(")) {
        next(p);
        n = parse_tuple(p, 1, 1);
        expect_op(p, ")");
    } else if (is_op(p, "[")) {
        nvec items = { 0 };

        next(p);
        n = mk(p, JN_LIST);
        while (!is_op(p, "]")) {
            if (items.n > 0) {
                expect_op(p, ",");
                if (is_op(p, "]")) {
                    break;
                }
            }
            nvec_push(p, &items, parse_expr(p, 1));
        }
        next(p);
        n->args = items.v;
        n->nargs = items.n;
    } else if (is_op(p, "{")) {
        nvec keys = { 0 }, vals = { 0 };

        next(p);
        n = mk(p, JN_DICTLIT);
        while (!is_op(p, "}")) {
            if (keys.n > 0) {
                expect_op(p, ",");
                if (is_op(p, "}")) {
                    break;
                }
            }
            nvec_push(p, &keys, parse_expr(p, 1));
            expect_op(p, ":");
            nvec_push(p, &vals, parse_expr(p, 1));
        }
        next(p);
        n->args = keys.v;
        n->kwv = vals.v;
        n->nargs = keys.n;
    } else {
        jj_fail(p->b, t->line, "unexpected %s%s%.*s%s", describe(t),
                t->s != NULL ? " '" : "",
                t->s != NULL ? (int) (t->len > 40 ? 40 : t->len) : 0,
                t->s != NULL ? t->s : "", t->s != NULL ? "'" : "");
    }
    p->depth--;
    return n;
}


static jj_node *
parse_unary(parser *p, int with_filter)
{
    jj_node *n;

    enter(p);
    if (is_op(p, "-") || is_op(p, "+")) {
        n = mk(p, is_op(p, "-") ? JN_NEG : JN_POS);
        next(p);
        n->a = parse_unary(p, 0);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) {
        n = parse_filter_expr(p, n);
    }
    p->depth--;
    return n;
}


static jj_node *
binary(parser *p, int k, int op, jj_node *a, jj_node *b)
{
    jj_node *n = mk(p, k);

    n->op = op;
    n->a = a;
    n->b = b;
    n->line = a->line;
    return n;
}


static jj_node *
parse_pow(parser *p)
{
    jj_node *n = parse_unary(p, 1);

    while (is_op(p, "**")) {
        next(p);
        n = binary(p, JN_BIN, OP_POW, n, parse_unary(p, 1));
    }
    return n;
}


static jj_node *
parse_math2(parser *p)
{
    jj_node *n = parse_pow(p);

    for (;;) {
        int op = is_op(p, "*") ? OP_MUL : is_op(p, "/") ? OP_DIV
                 : is_op(p, "//") ? OP_FLOORDIV : is_op(p, "%") ? OP_MOD : -1;

        if (op < 0) {
            return n;
        }
        next(p);
        n = binary(p, JN_BIN, op, n, parse_pow(p));
    }
}


static jj_node *
parse_concat(parser *p)
{
    jj_node   *first = parse_math2(p);
    nvec  v = { 0 };
    jj_node   *n;

    if (!is_op(p, "~")) {
        return first;
    }
    nvec_push(p, &v, first);
    while (is_op(p, "~")) {
        next(p);
        nvec_push(p, &v, parse_math2(p));
    }
    n = mk(p, JN_CONCAT);
    n->args = v.v;
    n->nargs = v.n;
    return n;
}


static jj_node *
parse_math1(parser *p)
{
    jj_node *n = parse_concat(p);

    while (is_op(p, "+") || is_op(p, "-")) {
        int op = is_op(p, "+") ? OP_ADD : OP_SUB;

        next(p);
        n = binary(p, JN_BIN, op, n, parse_concat(p));
    }
    return n;
}


static jj_node *
parse_compare(parser *p)
{
    jj_node *n = parse_math1(p), *prev = n, *result = NULL;

    for (;;) {
        int  op = is_op(p, "==") ? OP_EQ : is_op(p, "!=") ? OP_NE
                  : is_op(p, "<") ? OP_LT : is_op(p, "<=") ? OP_LE
                  : is_op(p, ">") ? OP_GT : is_op(p, ">=") ? OP_GE
                  : is_name(p, "in") ? OP_IN : -1;
        jj_node  *rhs, *cmp;

        if (op < 0 && is_name(p, "not")
            && tok_is(&p->t[p->i + 1], T_NAME, "in"))
        {
            next(p);
            op = OP_NOTIN;
        }
        if (op < 0) {
            return result != NULL ? result : n;
        }
        next(p);
        rhs = parse_math1(p);
        cmp = binary(p, JN_CMP, op, prev, rhs);
        /* a < b < c is a < b and b < c */
        result = result == NULL ? cmp : binary(p, JN_AND, 0, result, cmp);
        prev = rhs;
    }
}


static jj_node *
parse_not(parser *p)
{
    if (is_name(p, "not")) {
        jj_node *n = mk(p, JN_NOT);

        next(p);
        enter(p);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}


static jj_node *
parse_and(parser *p)
{
    jj_node *n = parse_not(p);

    while (is_name(p, "and")) {
        next(p);
        n = binary(p, JN_AND, 0, n, parse_not(p));
    }
    return n;
}


static jj_node *
parse_or(parser *p)
{
    jj_node *n = parse_and(p);

    while (is_name(p, "or")) {
        next(p);
        n = binary(p, JN_OR, 0, n, parse_and(p));
    }
    return n;
}


static jj_node *
parse_expr(parser *p, int condexpr)
{
    jj_node *n;

    enter(p);
    n = parse_or(p);
    while (condexpr && is_name(p, "if")) {
        jj_node *c = mk(p, JN_COND);

        next(p);
        c->a = n;
        c->b = parse_or(p);
        if (is_name(p, "else")) {
            next(p);
            c->c = parse_expr(p, 1);
        }
        n = c;
    }
    p->depth--;
    return n;
}


/* an expression, or several with commas: a tuple */
static jj_node *
parse_tuple(parser *p, int condexpr, int explicit_parens)
{
    nvec  v = { 0 };
    int   comma = 0;
    jj_node   *n;

    for (;;) {
        if (v.n > 0) {
            if (!is_op(p, ",")) {
                break;
            }
            next(p);
            comma = 1;
        }
        if (cur(p)->type == T_BEND || cur(p)->type == T_VEND
            || is_op(p, ")") || (v.n > 0 && is_name(p, "in")))
        {
            break;
        }
        nvec_push(p, &v, parse_expr(p, condexpr));
    }
    if (v.n == 1 && !comma) {
        return v.v[0];
    }
    if (v.n == 0 && !explicit_parens) {
        jj_fail(p->b, cur(p)->line, "expected an expression");
    }
    n = mk(p, JN_TUPLE);
    n->args = v.v;
    n->nargs = v.n;
    return n;
}


/* --- statements --- */

static void
end_block(parser *p)
{
    expect_type(p, T_BEND, "the end of the statement ('%}')");
}


/* at "{% name": consumes both when name is `want` */
static int
at_tag(parser *p, const char *want)
{
    if (cur(p)->type == T_BBEGIN && tok_is(&p->t[p->i + 1], T_NAME, want)) {
        p->i += 2;
        return 1;
    }
    return 0;
}


static void
parse_targets(parser *p, jj_node *n)
{
    const char **names = jj_alloc(p->b, 16 * sizeof(char *));
    int          k = 0, paren = 0;

    if (is_op(p, "(")) {
        next(p);
        paren = 1;
    }
    do {
        if (k > 0) {
            next(p);
        }
        if (k == 16) {
            jj_fail(p->b, cur(p)->line, "too many names to assign");
        }
        names[k++] = expect_name(p);
    } while (is_op(p, ","));
    if (paren) {
        expect_op(p, ")");
    }
    n->names = names;
    n->nnames = k;
}


static jj_node *
parse_if(parser *p)
{
    static const char *const ends[] = { "elif", "else", "endif" };
    jj_node *n = mk(p, JN_IF);

    n->a = parse_tuple(p, 1, 0);
    end_block(p);
    n->b = parse_body(p, ends, 3);
    if (at_tag(p, "elif")) {
        n->c = parse_if(p);
        return n;
    }
    if (at_tag(p, "else")) {
        static const char *const endif[] = { "endif" };

        end_block(p);
        n->c = parse_body(p, endif, 1);
    }
    if (!at_tag(p, "endif")) {
        jj_fail(p->b, cur(p)->line, "expected 'endif'");
    }
    end_block(p);
    return n;
}


static jj_node *
parse_for(parser *p)
{
    static const char *const ends[] = { "else", "endfor" };
    static const char *const endfor[] = { "endfor" };
    jj_node *n = mk(p, JN_FOR);

    parse_targets(p, n);
    if (!is_name(p, "in")) {
        jj_fail(p->b, cur(p)->line, "expected 'in' in a for loop");
    }
    next(p);
    n->a = parse_tuple(p, 0, 0);
    if (is_name(p, "if")) {
        next(p);
        n->d = parse_expr(p, 1);
    }
    if (is_name(p, "recursive")) {
        jj_fail(p->b, cur(p)->line, "recursive loops are not supported");
    }
    end_block(p);
    n->b = parse_body(p, ends, 2);
    if (at_tag(p, "else")) {
        end_block(p);
        n->c = parse_body(p, endfor, 1);
    }
    if (!at_tag(p, "endfor")) {
        jj_fail(p->b, cur(p)->line, "expected 'endfor'");
    }
    end_block(p);
    return n;
}


/* "| name(args) | ..." applied to a placeholder (a == NULL) */
static jj_node *
parse_filter_chain(parser *p)
{
    jj_node *n = NULL;

    while (is_op(p, "|")) {
        next(p);
        n = parse_filter(p, n);
    }
    return n;
}


static jj_node *
parse_set(parser *p)
{
    static const char *const endset[] = { "endset" };
    jj_node *n = mk(p, JN_SET);

    if (cur(p)->type == T_NAME && tok_is(&p->t[p->i + 1], T_OP, ".")) {
        n->name = expect_name(p);       /* set ns.attr = ... */
        next(p);
        n->names = jj_alloc(p->b, sizeof(char *));
        n->names[0] = expect_name(p);
        n->nnames = 1;
        n->op = 1;
    } else {
        parse_targets(p, n);
    }
    if (is_op(p, "=")) {
        next(p);
        n->a = parse_tuple(p, 1, 0);
        end_block(p);
        return n;
    }
    if (n->op || n->nnames != 1) {
        jj_fail(p->b, n->line, "expected '=' in a set");
    }
    n->k = JN_SETBLOCK;
    n->a = parse_filter_chain(p);
    end_block(p);
    n->b = parse_body(p, endset, 1);
    at_tag(p, "endset");
    end_block(p);
    return n;
}


static jj_node *
parse_macro(parser *p, int k)
{
    static const char *const endmacro[] = { "endmacro" };
    static const char *const endcall[] = { "endcall" };
    jj_node          *n = mk(p, k);
    nvec         defs = { 0 };
    const char **names = jj_alloc(p->b, 32 * sizeof(char *));

    if (k == JN_MACRO) {
        n->name = expect_name(p);
    }
    expect_op(p, "(");
    while (!is_op(p, ")")) {
        if (n->nnames > 0) {
            expect_op(p, ",");
        }
        if (n->nnames == 32) {
            jj_fail(p->b, cur(p)->line, "too many macro parameters");
        }
        names[n->nnames++] = expect_name(p);
        if (is_op(p, "=")) {
            next(p);
            nvec_push(p, &defs, parse_expr(p, 1));
        } else {
            if (defs.n > 0) {
                jj_fail(p->b, cur(p)->line, "a parameter without a default "
                        "follows one with a default");
            }
        }
    }
    next(p);
    n->names = names;
    n->kwv = defs.v;
    n->nkw = defs.n;
    if (k == JN_CALLBLOCK) {
        n->a = parse_expr(p, 1);
        if (n->a->k != JN_CALL) {
            jj_fail(p->b, n->line, "expected a call in a call block");
        }
    }
    end_block(p);
    n->b = parse_body(p, k == JN_MACRO ? endmacro : endcall, 1);
    p->i += 2;
    if (k == JN_MACRO && cur(p)->type == T_NAME) {
        next(p);
    }
    end_block(p);
    return n;
}


static jj_node *
parse_statement(parser *p)
{
    jj_tok *t = cur(p);
    jj_node     *n;

    enter(p);
    if (t->type != T_NAME) {
        jj_fail(p->b, t->line, "expected a statement name");
    }
    next(p);
    if (tok_is(t, T_NAME, "if")) {
        n = parse_if(p);
    } else if (tok_is(t, T_NAME, "for")) {
        n = parse_for(p);
    } else if (tok_is(t, T_NAME, "set")) {
        n = parse_set(p);
    } else if (tok_is(t, T_NAME, "macro")) {
        n = parse_macro(p, JN_MACRO);
    } else if (tok_is(t, T_NAME, "call")) {
        n = mk(p, JN_CALLBLOCK);
        if (is_op(p, "(")) {
            n = parse_macro(p, JN_CALLBLOCK);
        } else {
            static const char *const endcall[] = { "endcall" };

            n->names = NULL;
            n->a = parse_expr(p, 1);
            if (n->a->k != JN_CALL) {
                jj_fail(p->b, n->line, "expected a call in a call block");
            }
            end_block(p);
            n->b = parse_body(p, endcall, 1);
            p->i += 2;
            end_block(p);
        }
    } else if (tok_is(t, T_NAME, "filter")) {
        static const char *const endfilter[] = { "endfilter" };

        n = mk(p, JN_FILTERBLOCK);
        n->a = parse_filter(p, NULL);
        while (is_op(p, "|")) {
            next(p);
            n->a = parse_filter(p, n->a);
        }
        end_block(p);
        n->b = parse_body(p, endfilter, 1);
        p->i += 2;
        end_block(p);
    } else if (tok_is(t, T_NAME, "break") || tok_is(t, T_NAME, "continue")) {
        n = mk(p, tok_is(t, T_NAME, "break") ? JN_BREAK : JN_CONTINUE);
        end_block(p);
    } else {
        jj_fail(p->b, t->line, "unknown tag '%.*s'",
                (int) (t->len > 40 ? 40 : t->len), t->s);
    }
    p->depth--;
    return n;
}


static jj_node *
parse_body(parser *p, const char *const *ends, int nends)
{
    jj_node   *body = mk(p, JN_BODY);
    nvec  v = { 0 };

    enter(p);
    for (;;) {
        jj_tok *t = cur(p);

        if (t->type == T_EOF) {
            if (nends > 0) {
                jj_fail(p->b, t->line, "unexpected end of template: expected "
                        "'%s'", ends[nends - 1]);
            }
            break;
        }
        if (t->type == T_TEXT) {
            jj_node *n = mk(p, JN_TEXT);

            n->lit = jv_str(p->b, t->s, t->len, 0);
            nvec_push(p, &v, n);
            next(p);
        } else if (t->type == T_VBEGIN) {
            jj_node *n = mk(p, JN_OUT);

            next(p);
            n->a = parse_tuple(p, 1, 0);
            expect_type(p, T_VEND, "the end of the print statement ('}}')");
            nvec_push(p, &v, n);
        } else if (t->type == T_BBEGIN) {
            jj_tok *name = &p->t[p->i + 1];
            int     k;

            for (k = 0; k < nends; k++) {
                if (tok_is(name, T_NAME, ends[k])) {
                    break;
                }
            }
            if (k < nends) {
                break;
            }
            next(p);
            nvec_push(p, &v, parse_statement(p));
        } else {
            jj_fail(p->b, t->line, "unexpected %s", describe(t));
        }
    }
    body->args = v.v;
    body->nargs = v.n;
    p->depth--;
    return body;
}


jj_node *
jj_parse(jj_base *b, const char *src, size_t len)
{
    jj_toks toks = { 0 };
    parser  p;

    jj_lex(b, src, len, &toks);
    memset(&p, 0, sizeof(p));
    p.b = b;
    p.t = toks.v;
    p.n = toks.n;
    return parse_body(&p, NULL, 0);
}
