/*
 * Patterns to byte automata (see grammar_regex.h).
 *
 * The pattern (code points) is parsed into a tree; the tree into a
 * Thompson NFA over bytes, each character class expanded into the JSON
 * forms of its characters (short and \u escapes, UTF-8 sequences split
 * by byte ranges); the NFA into a DFA by the subset construction, whose
 * states from which no accepting state can be reached are dropped.
 *
 * The subset is the one OpenAI's structured outputs and xgrammar accept:
 * literals and escapes, classes (negated too), '.', groups ( ), (?: ) and
 * (?<name> ), alternation, the quantifiers * + ? {n} {n,} {n,m} (greedy
 * or lazy: the same strings), and the anchors ^ and $ at the ends of the
 * pattern's top-level branches.  Everything else is refused by name.
 *
 * Python's re (the reference validator) and ECMA-262 differ on \d \w \s
 * beyond ASCII: a class that takes them negatively (\D \W \S, or [^...]
 * holding one of them) produces ASCII characters only, where both agree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_regex.h"

#define RX_MAX_CP    0x10FFFF
#define RX_MAX_NODES 20000

enum { RN_SET, RN_CAT, RN_ALT, RN_REP, RN_EMPTY };

typedef struct { uint32_t lo, hi; } rrange;

typedef struct {
    int      kind;
    int32_t  a, b;           /* children */
    int32_t  min, max;       /* RN_REP: max -1 unbounded */
    rrange  *set;            /* RN_SET: sorted, disjoint */
    int32_t  n_set;
} rnode;

typedef struct {
    int32_t to;
    int16_t lo, hi;          /* lo -1: an epsilon edge */
    int32_t next;            /* the state's next edge, -1: none */
} nedge;

typedef struct {
    /* the pattern as code points */
    uint32_t *cp;
    int32_t   n_cp, pos;
    /* the tree */
    rnode    *nodes;
    int32_t   n_nodes, cap_nodes;
    /* the NFA */
    int32_t  *head;          /* per state: first edge, -1: none */
    uint8_t  *mid;           /* per state: inside a character's form */
    int32_t   n_st, cap_st;
    nedge    *edges;
    int32_t   n_edges, cap_edges;
    int32_t   accept;
    char     *err;
    size_t    errlen;
    int       failed;
} rx;


static int
rx_fail(rx *r, const char *msg, const char *what)
{
    if (!r->failed) {
        r->failed = 1;
        snprintf(r->err, r->errlen, msg, what);
    }
    return -1;
}


/* ---- character sets ---- */

/* adds [lo, hi] to the set (sorted, merged) */
static int
set_add(rx *r, rrange **set, int32_t *n, uint32_t lo, uint32_t hi)
{
    rrange  *s = realloc(*set, (*n + 1) * sizeof(rrange));
    int32_t  i, j;

    if (s == NULL) {
        return rx_fail(r, "out of memory%s", "");
    }
    *set = s;
    s[(*n)++] = (rrange) { lo, hi };
    /* insertion sort by lo, then merge overlapping or adjacent ranges */
    for (i = *n - 1; i > 0 && s[i - 1].lo > s[i].lo; i--) {
        rrange t = s[i];

        s[i] = s[i - 1];
        s[i - 1] = t;
    }
    for (i = 0, j = 0; i < *n; i++) {
        if (j > 0 && s[i].lo <= s[j - 1].hi + 1) {
            if (s[i].hi > s[j - 1].hi) {
                s[j - 1].hi = s[i].hi;
            }
        } else {
            s[j++] = s[i];
        }
    }
    *n = j;
    return 0;
}


/* the complement of the set within [0, max] */
static int
set_negate(rx *r, rrange **set, int32_t *n, uint32_t max)
{
    rrange  *old = *set;
    int32_t  on = *n;
    uint32_t from = 0;

    *set = NULL;
    *n = 0;
    for (int32_t i = 0; i < on && !r->failed; i++) {
        if (old[i].lo > from) {
            set_add(r, set, n, from, old[i].lo - 1);
        }
        from = old[i].hi + 1;
    }
    if (from <= max && !r->failed) {
        set_add(r, set, n, from, max);
    }
    free(old);
    return r->failed ? -1 : 0;
}


/* the set limited to [0, max] */
static void
set_clip(rrange *set, int32_t *n, uint32_t max)
{
    int32_t j = 0;

    for (int32_t i = 0; i < *n; i++) {
        if (set[i].lo <= max) {
            set[j] = set[i];
            if (set[j].hi > max) {
                set[j].hi = max;
            }
            j++;
        }
    }
    *n = j;
}


/* ECMA-262's \s, with what Python's re adds (\x1c-\x1f, \x85): the
 * union, so that \S leaves out what either calls a space */
static const rrange space_set[] = {
    { 0x09, 0x0D }, { 0x1C, 0x20 }, { 0x85, 0x85 }, { 0xA0, 0xA0 },
    { 0x1680, 0x1680 }, { 0x2000, 0x200A }, { 0x2028, 0x2029 },
    { 0x202F, 0x202F }, { 0x205F, 0x205F }, { 0x3000, 0x3000 },
    { 0xFEFF, 0xFEFF }
};


/* adds the class of \d \w \s (c lowercase) or its complement (uppercase);
 * *ascii_only set when the set must then stay within ASCII */
static int
set_add_shorthand(rx *r, rrange **set, int32_t *n, uint32_t c,
                  int *ascii_only)
{
    rrange  *t = NULL;
    int32_t  tn = 0;
    uint32_t lc = c | 0x20;

    if (lc == 'd') {
        set_add(r, &t, &tn, '0', '9');
    } else if (lc == 'w') {
        set_add(r, &t, &tn, '0', '9');
        set_add(r, &t, &tn, 'A', 'Z');
        set_add(r, &t, &tn, 'a', 'z');
        set_add(r, &t, &tn, '_', '_');
    } else if (c == 's') {
        /* only the spaces both agree on */
        set_add(r, &t, &tn, 0x09, 0x0D);
        set_add(r, &t, &tn, ' ', ' ');
    } else {
        for (size_t i = 0; i < sizeof(space_set) / sizeof(space_set[0]); i++) {
            set_add(r, &t, &tn, space_set[i].lo, space_set[i].hi);
        }
    }
    if (c != lc) {
        set_negate(r, &t, &tn, RX_MAX_CP);
        set_clip(t, &tn, 0x7F);
        *ascii_only = 1;
    }
    for (int32_t i = 0; i < tn && !r->failed; i++) {
        set_add(r, set, n, t[i].lo, t[i].hi);
    }
    free(t);
    return r->failed ? -1 : 0;
}


/* ---- the tree ---- */

static int32_t
node_new(rx *r, int kind, int32_t a, int32_t b)
{
    if (r->failed) {
        return -1;
    }
    if (r->n_nodes == r->cap_nodes) {
        int32_t nc = r->cap_nodes ? r->cap_nodes * 2 : 64;
        rnode  *nn;

        if (nc > RX_MAX_NODES) {
            return rx_fail(r, "'pattern' is too long%s", "");
        }
        nn = realloc(r->nodes, nc * sizeof(rnode));
        if (nn == NULL) {
            return rx_fail(r, "out of memory%s", "");
        }
        r->nodes = nn;
        r->cap_nodes = nc;
    }
    memset(&r->nodes[r->n_nodes], 0, sizeof(rnode));
    r->nodes[r->n_nodes].kind = kind;
    r->nodes[r->n_nodes].a = a;
    r->nodes[r->n_nodes].b = b;
    return r->n_nodes++;
}


static int32_t
node_set1(rx *r, uint32_t lo, uint32_t hi)
{
    int32_t i = node_new(r, RN_SET, -1, -1);

    if (i >= 0) {
        set_add(r, &r->nodes[i].set, &r->nodes[i].n_set, lo, hi);
    }
    return r->failed ? -1 : i;
}


static int
peek(rx *r)
{
    return r->pos < r->n_cp ? (int) r->cp[r->pos] : -1;
}


static int
hexval(uint32_t c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? (int) (c - 'a' + 10) : -1;
}


/* \xHH, \uHHHH or \u{H...}: the code point, or -1 */
static int64_t
parse_hex_escape(rx *r, int ndig)
{
    int64_t v = 0;

    if (ndig == 4 && peek(r) == '{') {
        int k = 0;

        r->pos++;
        while (peek(r) >= 0 && peek(r) != '}' && k < 7) {
            int h = hexval(r->cp[r->pos]);

            if (h < 0) {
                return rx_fail(r, "a bad \\u{...} escape in 'pattern'%s",
                               "");
            }
            v = v * 16 + h;
            r->pos++;
            k++;
        }
        if (peek(r) != '}' || k == 0 || v > RX_MAX_CP) {
            return rx_fail(r, "a bad \\u{...} escape in 'pattern'%s", "");
        }
        r->pos++;
        return v;
    }
    for (int i = 0; i < ndig; i++) {
        int h = peek(r) >= 0 ? hexval(r->cp[r->pos]) : -1;

        if (h < 0) {
            return rx_fail(r, "a bad \\x or \\u escape in 'pattern'%s", "");
        }
        v = v * 16 + h;
        r->pos++;
    }
    return v;
}


/*
 * An escape after '\' (consumed): a single code point (returned), or a
 * shorthand class added to *set (returns -2).  in_class: inside [...].
 */
static int64_t
parse_escape(rx *r, int in_class, rrange **set, int32_t *n, int *ascii_only)
{
    int c = peek(r);

    if (c < 0) {
        return rx_fail(r, "'pattern' ends in '\\'%s", "");
    }
    r->pos++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        if (set_add_shorthand(r, set, n, c, ascii_only) < 0) {
            return -1;
        }
        return -2;
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'x': return parse_hex_escape(r, 2);
    case 'u': return parse_hex_escape(r, 4);
    case '0':
        if (peek(r) >= '0' && peek(r) <= '9') {
            return rx_fail(r, "unsupported octal escape in 'pattern'%s",
                           "");
        }
        return 0;
    case 'b':
        if (in_class) {
            return 8;
        }
        return rx_fail(r, "unsupported word boundary '\\b' in "
                       "'pattern'%s", "");
    case 'B':
        return rx_fail(r, "unsupported word boundary '\\B' in "
                       "'pattern'%s", "");
    case 'k':
        return rx_fail(r, "unsupported backreference '\\k' in "
                       "'pattern'%s", "");
    case 'p': case 'P':
        return rx_fail(r, "unsupported Unicode property escape in "
                       "'pattern'%s", "");
    case 'c':
        return rx_fail(r, "unsupported control escape '\\c' in "
                       "'pattern'%s", "");
    default:
        break;
    }
    if (c >= '1' && c <= '9') {
        return rx_fail(r, "unsupported backreference in 'pattern'%s", "");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        char e[8];

        snprintf(e, sizeof(e), "\\%c", c);
        return rx_fail(r, "unsupported escape '%s' in 'pattern'", e);
    }
    return c;                /* an escaped punctuation or other character */
}


static int32_t
parse_class(rx *r)
{
    int32_t i = node_new(r, RN_SET, -1, -1);
    int     neg = 0, ascii_only = 0, first = 1;
    rrange *set = NULL;
    int32_t n = 0;

    if (i < 0) {
        return -1;
    }
    if (peek(r) == '^') {
        neg = 1;
        r->pos++;
    }
    for (;;) {
        int64_t lo, hi;
        int     c = peek(r);

        if (c < 0) {
            free(set);
            return rx_fail(r, "an unterminated '[' in 'pattern'%s", "");
        }
        if (c == ']') {
            if (first) {
                free(set);
                return rx_fail(r, "unsupported empty class '[]' in "
                               "'pattern'%s", "");
            }
            r->pos++;
            break;
        }
        first = 0;
        r->pos++;
        if (c == '\\') {
            lo = parse_escape(r, 1, &set, &n, &ascii_only);
            if (lo == -2) {
                continue;
            }
            if (lo < 0) {
                free(set);
                return -1;
            }
        } else if (c == '[' && (peek(r) == ':' || peek(r) == '='
                                || peek(r) == '.'))
        {
            free(set);
            return rx_fail(r, "unsupported POSIX class in 'pattern'%s", "");
        } else {
            lo = c;
        }
        hi = lo;
        if (peek(r) == '-' && r->pos + 1 < r->n_cp
            && r->cp[r->pos + 1] != ']')
        {
            r->pos++;
            c = peek(r);
            r->pos++;
            if (c == '\\') {
                int32_t tn = 0;
                rrange *t = NULL;

                hi = parse_escape(r, 1, &t, &tn, &ascii_only);
                free(t);
                if (hi == -2) {
                    free(set);
                    return rx_fail(r, "a class shorthand ends a range in "
                                   "'pattern'%s", "");
                }
                if (hi < 0) {
                    free(set);
                    return -1;
                }
            } else {
                hi = c;
            }
            if (hi < lo) {
                free(set);
                return rx_fail(r, "a range out of order in a class in "
                               "'pattern'%s", "");
            }
        }
        if (set_add(r, &set, &n, (uint32_t) lo, (uint32_t) hi) < 0) {
            free(set);
            return -1;
        }
    }
    if (neg) {
        set_negate(r, &set, &n, RX_MAX_CP);
    }
    if (ascii_only) {
        set_clip(set, &n, 0x7F);
    }
    r->nodes[i].set = set;
    r->nodes[i].n_set = n;
    return r->failed ? -1 : i;
}


static int32_t parse_alt(rx *r, int depth);


/* a decimal count in {n,m}; -1 when none */
static int64_t
parse_count(rx *r)
{
    int64_t v = -1;

    while (peek(r) >= '0' && peek(r) <= '9') {
        v = (v < 0 ? 0 : v * 10) + (peek(r) - '0');
        if (v > 100000) {
            v = 100000;
        }
        r->pos++;
    }
    return v;
}


static int32_t
parse_atom(rx *r, int depth)
{
    int c = peek(r);

    r->pos++;
    switch (c) {
    case '(':
        if (peek(r) == '?') {
            r->pos++;
            c = peek(r);
            if (c == ':') {
                r->pos++;
            } else if (c == '=' || c == '!') {
                return rx_fail(r, "unsupported lookahead '(?%s' in "
                               "'pattern'", c == '=' ? "=" : "!");
            } else if (c == '<' && r->pos + 1 < r->n_cp
                       && (r->cp[r->pos + 1] == '=' || r->cp[r->pos + 1]
                                                       == '!'))
            {
                return rx_fail(r, "unsupported lookbehind '(?<%s' in "
                               "'pattern'", r->cp[r->pos + 1] == '=' ? "="
                                                                   : "!");
            } else if (c == '<') {
                /* a named group: the name, then an ordinary group */
                while (peek(r) >= 0 && peek(r) != '>') {
                    r->pos++;
                }
                if (peek(r) != '>') {
                    return rx_fail(r, "a bad group name in 'pattern'%s",
                                   "");
                }
                r->pos++;
            } else {
                return rx_fail(r, "unsupported group '(?' (flags or "
                               "another extension) in 'pattern'%s", "");
            }
        }
        {
            int32_t g = parse_alt(r, depth + 1);

            if (g < 0) {
                return -1;
            }
            if (peek(r) != ')') {
                return rx_fail(r, "an unterminated '(' in 'pattern'%s", "");
            }
            r->pos++;
            return g;
        }
    case ')':
        return rx_fail(r, "an unmatched ')' in 'pattern'%s", "");
    case '[':
        return parse_class(r);
    case '.':
        {
            /* ECMA-262: anything but a line terminator */
            int32_t i = node_new(r, RN_SET, -1, -1);

            if (i >= 0) {
                set_add(r, &r->nodes[i].set, &r->nodes[i].n_set, '\n', '\n');
                set_add(r, &r->nodes[i].set, &r->nodes[i].n_set, '\r', '\r');
                set_add(r, &r->nodes[i].set, &r->nodes[i].n_set, 0x2028,
                        0x2029);
                set_negate(r, &r->nodes[i].set, &r->nodes[i].n_set,
                           RX_MAX_CP);
            }
            return r->failed ? -1 : i;
        }
    case '\\':
        {
            rrange *set = NULL;
            int32_t n = 0;
            int     ascii_only = 0;
            int64_t e = parse_escape(r, 0, &set, &n, &ascii_only);
            int32_t i;

            if (e == -2) {
                i = node_new(r, RN_SET, -1, -1);
                if (i < 0) {
                    free(set);
                    return -1;
                }
                r->nodes[i].set = set;
                r->nodes[i].n_set = n;
                return i;
            }
            free(set);
            return e < 0 ? -1 : node_set1(r, (uint32_t) e, (uint32_t) e);
        }
    case '^':
    case '$':
        return rx_fail(r, "unsupported anchor '%s' inside 'pattern' (only "
                       "at the start or end of a branch)", c == '^' ? "^"
                                                                   : "$");
    case '*': case '+': case '?':
        return rx_fail(r, "nothing to repeat before a quantifier in "
                       "'pattern'%s", "");
    case '{':
        {
            int save = r->pos;

            if (parse_count(r) >= 0) {
                return rx_fail(r, "nothing to repeat before a quantifier "
                               "in 'pattern'%s", "");
            }
            r->pos = save;
        }
        return node_set1(r, '{', '{');
    default:
        return node_set1(r, (uint32_t) c, (uint32_t) c);
    }
}


static int32_t
parse_repeat(rx *r, int depth)
{
    int32_t a = parse_atom(r, depth);

    while (a >= 0) {
        int     c = peek(r);
        int64_t min, max;

        if (c == '*') {
            min = 0; max = -1;
            r->pos++;
        } else if (c == '+') {
            min = 1; max = -1;
            r->pos++;
        } else if (c == '?') {
            min = 0; max = 1;
            r->pos++;
        } else if (c == '{') {
            int save = r->pos;

            r->pos++;
            if (peek(r) == ',') {
                return rx_fail(r, "unsupported quantifier '{,m}' in "
                               "'pattern' (write {0,m})%s", "");
            }
            min = parse_count(r);
            max = min;
            if (min >= 0 && peek(r) == ',') {
                r->pos++;
                max = parse_count(r);
            }
            if (min < 0 || peek(r) != '}') {
                r->pos = save;   /* a literal '{' follows */
                break;
            }
            r->pos++;
            if (max >= 0 && max < min) {
                return rx_fail(r, "a quantifier {n,m} with m < n in "
                               "'pattern'%s", "");
            }
            if (min > 1000 || max > 1000) {
                return rx_fail(r, "a quantifier's count above 1000 in "
                               "'pattern'%s", "");
            }
        } else {
            break;
        }
        if (peek(r) == '?') {
            r->pos++;        /* lazy: the same strings */
        }
        {
            int32_t n = node_new(r, RN_REP, a, -1);

            if (n < 0) {
                return -1;
            }
            r->nodes[n].min = (int32_t) min;
            r->nodes[n].max = (int32_t) max;
            a = n;
        }
        c = peek(r);
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (c == '{') {
                int save = r->pos;

                r->pos++;
                if (parse_count(r) < 0) {
                    r->pos = save;
                    continue;
                }
                r->pos = save;
            }
            return rx_fail(r, "a quantifier after a quantifier in "
                           "'pattern'%s", "");
        }
    }
    return a;
}


static int32_t
any_star(rx *r)
{
    int32_t any = node_set1(r, 0, RX_MAX_CP);
    int32_t s = node_new(r, RN_REP, any, -1);

    if (s >= 0) {
        r->nodes[s].min = 0;
        r->nodes[s].max = -1;
    }
    return s;
}


/* a branch: a run of repeats; at depth 0, ^ and $ at its ends anchor it,
 * and where they are missing, anything may come before or after */
static int32_t
parse_cat(rx *r, int depth)
{
    int32_t cat = node_new(r, RN_EMPTY, -1, -1);
    int     start = 0, end = 0;

    if (depth == 0 && peek(r) == '^') {
        start = 1;
        r->pos++;
    }
    while (cat >= 0 && peek(r) >= 0 && peek(r) != '|' && peek(r) != ')') {
        int32_t a;

        if (depth == 0 && peek(r) == '$'
            && (r->pos + 1 == r->n_cp || r->cp[r->pos + 1] == '|'))
        {
            end = 1;
            r->pos++;
            break;
        }
        a = parse_repeat(r, depth);
        if (a < 0) {
            return -1;
        }
        cat = node_new(r, RN_CAT, cat, a);
    }
    if (depth == 0 && cat >= 0) {
        if (!start) {
            cat = node_new(r, RN_CAT, any_star(r), cat);
        }
        if (!end) {
            cat = node_new(r, RN_CAT, cat, any_star(r));
        }
    }
    return cat;
}


static int32_t
parse_alt(rx *r, int depth)
{
    int32_t a = parse_cat(r, depth);

    while (a >= 0 && peek(r) == '|') {
        r->pos++;
        a = node_new(r, RN_ALT, a, parse_cat(r, depth));
        if (a >= 0 && r->nodes[a].b < 0) {
            return -1;
        }
    }
    return a;
}


/* ---- the NFA ---- */

static int32_t
st_new(rx *r)
{
    if (r->failed) {
        return -1;
    }
    if (r->n_st >= GR_REGEX_MAX_NFA) {
        char n[16];

        snprintf(n, sizeof(n), "%d", GR_REGEX_MAX_NFA);
        return rx_fail(r, "'pattern' is too large (more than %s automaton "
                       "states before determinising)", n);
    }
    if (r->n_st == r->cap_st) {
        int32_t  nc = r->cap_st ? r->cap_st * 2 : 256;
        int32_t *nh = realloc(r->head, nc * sizeof(int32_t));
        uint8_t *nm;

        if (nh == NULL) {
            return rx_fail(r, "out of memory%s", "");
        }
        r->head = nh;
        nm = realloc(r->mid, nc);
        if (nm == NULL) {
            return rx_fail(r, "out of memory%s", "");
        }
        r->mid = nm;
        r->cap_st = nc;
    }
    r->head[r->n_st] = -1;
    r->mid[r->n_st] = 0;
    return r->n_st++;
}


/* a state inside a character's JSON form */
static int32_t
st_mid(rx *r)
{
    int32_t q = st_new(r);

    if (q >= 0) {
        r->mid[q] = 1;
    }
    return q;
}


static void
edge(rx *r, int32_t from, int32_t to, int lo, int hi)
{
    if (r->failed || from < 0 || to < 0) {
        return;
    }
    if (r->n_edges == r->cap_edges) {
        int32_t nc = r->cap_edges ? r->cap_edges * 2 : 512;
        nedge  *ne = realloc(r->edges, nc * sizeof(nedge));

        if (ne == NULL) {
            rx_fail(r, "out of memory%s", "");
            return;
        }
        r->edges = ne;
        r->cap_edges = nc;
    }
    r->edges[r->n_edges] = (nedge) { to, (int16_t) lo, (int16_t) hi,
                                     r->head[from] };
    r->head[from] = r->n_edges++;
}


/* a chain of byte ranges from s to e */
static void
chain(rx *r, int32_t s, int32_t e, const uint8_t *lo, const uint8_t *hi,
      int n)
{
    int32_t cur = s;

    for (int i = 0; i < n; i++) {
        int32_t nx = i == n - 1 ? e : st_mid(r);

        edge(r, cur, nx, lo[i], hi[i]);
        cur = nx;
    }
}


static int
utf8_enc(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t) c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = 0xC0 | (c >> 6);
        o[1] = 0x80 | (c & 0x3F);
        return 2;
    }
    if (c < 0x10000) {
        o[0] = 0xE0 | (c >> 12);
        o[1] = 0x80 | ((c >> 6) & 0x3F);
        o[2] = 0x80 | (c & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (c >> 18);
    o[1] = 0x80 | ((c >> 12) & 0x3F);
    o[2] = 0x80 | ((c >> 6) & 0x3F);
    o[3] = 0x80 | (c & 0x3F);
    return 4;
}


/* [lo, hi] (no surrogate, at least 0x80) as UTF-8 byte-range chains: the
 * range split until each piece is one product of byte ranges */
static void
utf8_ranges(rx *r, int32_t s, int32_t e, uint32_t lo, uint32_t hi)
{
    static const uint32_t lens[] = { 0x7F, 0x7FF, 0xFFFF };
    uint8_t a[4], b[4];
    int     n;

    if (lo > hi || r->failed) {
        return;
    }
    for (int i = 0; i < 3; i++) {
        if (lo <= lens[i] && hi > lens[i]) {
            utf8_ranges(r, s, e, lo, lens[i]);
            utf8_ranges(r, s, e, lens[i] + 1, hi);
            return;
        }
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;

        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_ranges(r, s, e, lo, lo | m);
                utf8_ranges(r, s, e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_ranges(r, s, e, lo, (hi & ~m) - 1);
                utf8_ranges(r, s, e, hi & ~m, hi);
                return;
            }
        }
    }
    n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    chain(r, s, e, a, b, n);
}


/* the JSON forms of the characters of a set, from s to e */
static void
build_set(rx *r, const rrange *set, int32_t n, int32_t s, int32_t e)
{
    static const char hex[] = "0123456789abcdef";
    int32_t bs = -1, u00 = -1, uh[2] = { -1, -1 };

    for (int32_t i = 0; i < n && !r->failed; i++) {
        uint32_t lo = set[i].lo, hi = set[i].hi;

        for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
            if (c >= 0x20 && c != '"' && c != '\\') {
                /* a run of plain ASCII as one byte range */
                uint32_t top = c;

                while (top + 1 <= hi && top + 1 < 0x80 && top + 1 != '"'
                       && top + 1 != '\\')
                {
                    top++;
                }
                edge(r, s, e, (int) c, (int) top);
                c = top;
                continue;
            }
            if (bs < 0) {
                bs = st_mid(r);
                edge(r, s, bs, '\\', '\\');
            }
            if (c == '"' || c == '\\') {
                edge(r, bs, e, (int) c, (int) c);
                continue;
            }
            /* a control character: its short escape, and \u00XX */
            {
                const char *sh = strchr("\bb\tt\nn\ff\rr", (int) c);

                if (c != 0 && sh != NULL) {
                    edge(r, bs, e, sh[1], sh[1]);
                }
            }
            if (u00 < 0) {
                int32_t u = st_mid(r), u0 = st_mid(r);

                u00 = st_mid(r);
                edge(r, bs, u, 'u', 'u');
                edge(r, u, u0, '0', '0');
                edge(r, u0, u00, '0', '0');
            }
            if (uh[c >> 4] < 0) {
                uh[c >> 4] = st_mid(r);
                edge(r, u00, uh[c >> 4], hex[c >> 4], hex[c >> 4]);
            }
            edge(r, uh[c >> 4], e, hex[c & 15], hex[c & 15]);
        }
        if (hi >= 0x80) {
            if (lo < 0x80) {
                lo = 0x80;
            }
            /* no surrogate */
            if (lo < 0xD800) {
                utf8_ranges(r, s, e, lo, hi < 0xD7FF ? hi : 0xD7FF);
            }
            if (hi > 0xDFFF) {
                utf8_ranges(r, s, e, lo > 0xE000 ? lo : 0xE000, hi);
            }
        }
    }
}


/* the fragment of node i from s to a new end state, returned */
static int32_t
build(rx *r, int32_t i, int32_t s)
{
    rnode  *nd;
    int32_t e;

    if (r->failed || i < 0) {
        return -1;
    }
    nd = &r->nodes[i];
    switch (nd->kind) {
    case RN_EMPTY:
        return s;
    case RN_SET:
        e = st_new(r);
        build_set(r, nd->set, nd->n_set, s, e);
        return e;
    case RN_CAT:
        return build(r, nd->b, build(r, nd->a, s));
    case RN_ALT:
        {
            int32_t e1 = build(r, nd->a, s), e2 = build(r, nd->b, s);

            e = st_new(r);
            edge(r, e1, e, -1, -1);
            edge(r, e2, e, -1, -1);
            return e;
        }
    case RN_REP:
        {
            int32_t a = nd->a, min = nd->min, max = nd->max, cur = s;

            for (int32_t k = 0; k < min && cur >= 0; k++) {
                cur = build(r, a, cur);
            }
            if (max < 0) {
                /* a loop: cur -> x -> back to the loop's head */
                int32_t h = st_new(r), x;

                edge(r, cur, h, -1, -1);
                x = build(r, a, h);
                edge(r, x, h, -1, -1);
                return h;
            }
            e = st_new(r);
            for (int32_t k = min; k < max && cur >= 0; k++) {
                edge(r, cur, e, -1, -1);
                cur = build(r, a, cur);
            }
            edge(r, cur, e, -1, -1);
            return e;
        }
    }
    return -1;
}


/* ---- the DFA ---- */

typedef struct {
    int32_t  *set_off;       /* per DFA state: into pool */
    int32_t  *set_len;
    uint32_t *set_hash;
    int32_t   n, cap;
    int32_t  *pool;
    int64_t   n_pool, cap_pool;
    int32_t  *ht;            /* ids + 1 */
    int32_t   ht_cap;
    /* scratch */
    int32_t  *stamp;
    int32_t   gen;
    int32_t  *stack, *buf;
} dfab;


static int
cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;

    return (x > y) - (x < y);
}


/* the epsilon closure of buf[0..n) (in place, sorted); keeps the states
 * with byte edges and the accepting one */
static int32_t
closure(rx *r, dfab *d, int32_t n)
{
    int32_t sp = 0, out = 0;

    d->gen++;
    for (int32_t i = 0; i < n; i++) {
        if (d->stamp[d->buf[i]] != d->gen) {
            d->stamp[d->buf[i]] = d->gen;
            d->stack[sp++] = d->buf[i];
        }
    }
    while (sp > 0) {
        int32_t q = d->stack[--sp];
        int     keep = q == r->accept;

        for (int32_t ei = r->head[q]; ei >= 0; ei = r->edges[ei].next) {
            if (r->edges[ei].lo >= 0) {
                keep = 1;
                continue;
            }
            if (d->stamp[r->edges[ei].to] != d->gen) {
                d->stamp[r->edges[ei].to] = d->gen;
                d->stack[sp++] = r->edges[ei].to;
            }
        }
        if (keep) {
            d->buf[out++] = q;
        }
    }
    qsort(d->buf, out, sizeof(int32_t), cmp_i32);
    return out;
}


static uint32_t
hash_set(const int32_t *v, int32_t n)
{
    uint32_t h = 2166136261u;

    for (int32_t i = 0; i < n; i++) {
        h = (h ^ (uint32_t) v[i]) * 16777619u;
    }
    return h;
}


/* the DFA state of the set buf[0..n): its id (new ones appended), or -1 */
static int32_t
intern_set(rx *r, dfab *d, int32_t n)
{
    uint32_t h = hash_set(d->buf, n);
    int32_t  slot = (int32_t) (h & (d->ht_cap - 1));

    while (d->ht[slot]) {
        int32_t id = d->ht[slot] - 1;

        if (d->set_hash[id] == h && d->set_len[id] == n
            && memcmp(d->pool + d->set_off[id], d->buf,
                      n * sizeof(int32_t)) == 0)
        {
            return id;
        }
        slot = (slot + 1) & (d->ht_cap - 1);
    }
    if (d->n >= GR_REGEX_MAX_DFA) {
        char m[16];

        snprintf(m, sizeof(m), "%d", GR_REGEX_MAX_DFA);
        return rx_fail(r, "'pattern' is too complex (more than %s "
                       "automaton states)", m);
    }
    if (d->n_pool + n > d->cap_pool) {
        int64_t  nc = d->cap_pool ? d->cap_pool * 2 : 4096;
        int32_t *np;

        while (nc < d->n_pool + n) {
            nc *= 2;
        }
        np = realloc(d->pool, nc * sizeof(int32_t));
        if (np == NULL) {
            return rx_fail(r, "out of memory%s", "");
        }
        d->pool = np;
        d->cap_pool = nc;
    }
    memcpy(d->pool + d->n_pool, d->buf, n * sizeof(int32_t));
    d->set_off[d->n] = (int32_t) d->n_pool;
    d->set_len[d->n] = n;
    d->set_hash[d->n] = h;
    d->n_pool += n;
    d->ht[slot] = d->n + 1;
    return d->n++;
}


static void
dfab_free(dfab *d)
{
    free(d->set_off);
    free(d->set_len);
    free(d->set_hash);
    free(d->pool);
    free(d->ht);
    free(d->stamp);
    free(d->stack);
    free(d->buf);
}


/* the subset construction: out->next and out->accept for every state */
static int
determinise(rx *r, gr_dfa *out)
{
    dfab     d;
    int32_t  cap = GR_REGEX_MAX_DFA;
    nedge   *el = NULL;
    int32_t  n_el = 0, cap_el = 0;

    memset(&d, 0, sizeof(d));
    d.ht_cap = 2 * 8192;
    d.set_off = malloc(cap * sizeof(int32_t));
    d.set_len = malloc(cap * sizeof(int32_t));
    d.set_hash = malloc(cap * sizeof(uint32_t));
    d.ht = calloc(d.ht_cap, sizeof(int32_t));
    d.stamp = calloc(r->n_st, sizeof(int32_t));
    d.stack = malloc(r->n_st * sizeof(int32_t));
    d.buf = malloc(r->n_st * sizeof(int32_t));
    out->next = malloc((int64_t) cap * 256 * sizeof(int32_t));
    out->accept = calloc(cap, 1);
    out->mid = calloc(cap, 1);
    if (!out->mid || !d.set_off || !d.set_len || !d.set_hash || !d.ht
        || !d.stamp || !d.stack || !d.buf || !out->next || !out->accept)
    {
        dfab_free(&d);
        return rx_fail(r, "out of memory%s", "");
    }
    d.buf[0] = 0;
    intern_set(r, &d, closure(r, &d, 1));
    for (int32_t q = 0; q < d.n && !r->failed; q++) {
        int32_t *mem = d.pool + d.set_off[q], nm = d.set_len[q];
        int32_t *nx = out->next + (int64_t) q * 256;
        uint8_t  bnd[257];

        /* the members' byte edges, and where their ranges start and end */
        memset(bnd, 0, sizeof(bnd));
        n_el = 0;
        /* a set's states are all inside a character or all between
         * two: the JSON forms are a prefix code, so the bytes read so far
         * say which */
        out->mid[q] = nm > 0 && r->mid[mem[0]];
        for (int32_t k = 0; k < nm; k++) {
            if (mem[k] == r->accept) {
                out->accept[q] = 1;
            }
            for (int32_t ei = r->head[mem[k]]; ei >= 0;
                 ei = r->edges[ei].next)
            {
                if (r->edges[ei].lo < 0) {
                    continue;
                }
                if (n_el == cap_el) {
                    int32_t nc = cap_el ? cap_el * 2 : 256;
                    nedge  *ne = realloc(el, nc * sizeof(nedge));

                    if (ne == NULL) {
                        rx_fail(r, "out of memory%s", "");
                        break;
                    }
                    el = ne;
                    cap_el = nc;
                }
                el[n_el++] = r->edges[ei];
                bnd[r->edges[ei].lo] = 1;
                bnd[r->edges[ei].hi + 1] = 1;
            }
        }
        for (int c = 0; c < 256 && !r->failed; ) {
            int     top = c, nb = 0;
            int32_t t;

            while (top + 1 < 256 && !bnd[top + 1]) {
                top++;
            }
            /* the segment [c, top] goes to the same NFA states */
            d.gen++;
            for (int32_t k = 0; k < n_el; k++) {
                if (el[k].lo <= c && c <= el[k].hi
                    && d.stamp[el[k].to] != d.gen)
                {
                    d.stamp[el[k].to] = d.gen;
                    d.buf[nb++] = el[k].to;
                }
            }
            t = nb ? intern_set(r, &d, closure(r, &d, nb)) : -1;
            for (int k = c; k <= top; k++) {
                nx[k] = t;
            }
            c = top + 1;
        }
    }
    out->n = d.n;
    free(el);
    dfab_free(&d);
    return r->failed ? -1 : 0;
}


/* drops the states that cannot reach an accepting one */
static int
prune(rx *r, gr_dfa *d)
{
    int32_t *rhead = malloc(d->n * sizeof(int32_t)), *map;
    int32_t *rto = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    int32_t *rnext = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    int32_t *work = malloc(d->n * sizeof(int32_t)), nw = 0, ne = 0, n = 0;
    uint8_t *live = calloc(d->n, 1);

    if (!rhead || !rto || !rnext || !work || !live) {
        free(rhead); free(rto); free(rnext); free(work); free(live);
        return rx_fail(r, "out of memory%s", "");
    }
    for (int32_t q = 0; q < d->n; q++) {
        rhead[q] = -1;
    }
    for (int32_t q = 0; q < d->n; q++) {
        for (int c = 0; c < 256; c++) {
            int32_t t = d->next[(int64_t) q * 256 + c];

            if (t >= 0 && (c == 0 || d->next[(int64_t) q * 256 + c - 1]
                                     != t))
            {
                rto[ne] = q;
                rnext[ne] = rhead[t];
                rhead[t] = ne++;
            }
        }
        if (d->accept[q]) {
            live[q] = 1;
            work[nw++] = q;
        }
    }
    while (nw > 0) {
        int32_t q = work[--nw];

        for (int32_t e = rhead[q]; e >= 0; e = rnext[e]) {
            if (!live[rto[e]]) {
                live[rto[e]] = 1;
                work[nw++] = rto[e];
            }
        }
    }
    free(rto); free(rnext); free(work);
    if (!live[0]) {
        free(rhead); free(live);
        return rx_fail(r, "'pattern' matches no string%s", "");
    }
    /* renumber the live states in order (the start stays 0) */
    map = rhead;
    for (int32_t q = 0; q < d->n; q++) {
        map[q] = live[q] ? n++ : -1;
    }
    for (int32_t q = 0; q < d->n; q++) {
        if (!live[q]) {
            continue;
        }
        for (int c = 0; c < 256; c++) {
            int32_t t = d->next[(int64_t) q * 256 + c];

            d->next[(int64_t) map[q] * 256 + c] = t >= 0 ? map[t] : -1;
        }
        d->accept[map[q]] = d->accept[q];
        d->mid[map[q]] = d->mid[q];
    }
    d->n = n;
    free(map);
    free(live);
    return 0;
}


int
gr_regex_dfa(const char *pat, size_t len, gr_dfa *out, char *err,
             size_t errlen)
{
    rx      r;
    int32_t root, s, e;
    int     rc = -1;

    memset(&r, 0, sizeof(r));
    memset(out, 0, sizeof(*out));
    r.err = err;
    r.errlen = errlen;
    r.cp = malloc((len + 1) * sizeof(uint32_t));
    if (r.cp == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* UTF-8 (jansson's strings are well formed) to code points */
    for (size_t i = 0; i < len; ) {
        unsigned char c = (unsigned char) pat[i];
        int           k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t      v = k == 1 ? c : c & (0x3F >> (k - 1));

        for (int j = 1; j < k && i + j < len; j++) {
            v = (v << 6) | ((unsigned char) pat[i + j] & 0x3F);
        }
        r.cp[r.n_cp++] = v;
        i += k;
    }
    root = parse_alt(&r, 0);
    if (root >= 0 && r.pos < r.n_cp) {
        rx_fail(&r, "an unmatched ')' in 'pattern'%s", "");
    }
    if (!r.failed) {
        s = st_new(&r);
        e = build(&r, root, s);
        r.accept = e;
        if (!r.failed && determinise(&r, out) == 0 && prune(&r, out) == 0) {
            rc = 0;
        }
    }
    if (r.failed && !r.err[0]) {
        snprintf(err, errlen, "'pattern' cannot be compiled");
    }
    for (int32_t i = 0; i < r.n_nodes; i++) {
        free(r.nodes[i].set);
    }
    free(r.nodes);
    free(r.cp);
    free(r.head);
    free(r.mid);
    free(r.edges);
    if (rc < 0) {
        gr_dfa_free(out);
    }
    return rc;
}


void
gr_dfa_free(gr_dfa *d)
{
    free(d->next);
    free(d->accept);
    free(d->mid);
    d->next = NULL;
    d->accept = NULL;
    d->mid = NULL;
    d->n = 0;
}


/* ---- formats, as anchored patterns ---- */

/* a year 0001-9999; a leap one (divisible by 4, centuries by 400) */
#define RX_YEAR "(?:\\d{3}[1-9]|\\d\\d[1-9]\\d|\\d[1-9]\\d\\d|[1-9]\\d{3})"
#define RX_LEAP "(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])" \
                "|(?:[02468][48]|[2468]0|[13579][26])00)"
/* RFC 3339 full-date, with the days of each month */
#define RX_DATE "(?:" RX_YEAR "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])" \
                "|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)" \
                "|02-(?:0[1-9]|1\\d|2[0-8]))|" RX_LEAP "-02-29)"
/* RFC 3339 full-time (no leap second: Python's validators refuse it) */
#define RX_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?" \
                "(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define RX_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define RX_IPV4 RX_OCTET "(?:\\." RX_OCTET "){3}"
#define RX_H "[0-9a-fA-F]{1,4}"
#define RX_IPV6 "(?:(?:" RX_H ":){7}" RX_H \
                "|(?:" RX_H ":){1,7}:" \
                "|(?:" RX_H ":){1,6}:" RX_H \
                "|(?:" RX_H ":){1,5}(?::" RX_H "){1,2}" \
                "|(?:" RX_H ":){1,4}(?::" RX_H "){1,3}" \
                "|(?:" RX_H ":){1,3}(?::" RX_H "){1,4}" \
                "|(?:" RX_H ":){1,2}(?::" RX_H "){1,5}" \
                "|" RX_H ":(?::" RX_H "){1,6}" \
                "|:(?:(?::" RX_H "){1,7}|:)" \
                "|(?:" RX_H ":){6}" RX_IPV4 \
                "|::(?:[fF]{4}:)?" RX_IPV4 ")"
#define RX_UCHAR "A-Za-z0-9._~!$&'()*+,;=\\-"
#define RX_PCT "%[0-9A-Fa-f]{2}"

static const struct { const char *name, *pattern; } gr_formats[] = {
    { "date", "^" RX_DATE "$" },
    { "time", "^" RX_TIME "$" },
    { "date-time", "^" RX_DATE "T" RX_TIME "$" },
    /* bounded as RFC 5321 bounds it: a local part of up to 64
     * characters, up to 3 labels of up to 63 and a top-level domain */
    { "email", "^[A-Za-z0-9._%+\\-]{1,64}@(?:[A-Za-z0-9\\-]{1,63}\\.){1,3}"
               "[A-Za-z]{2,24}$" },
    /* scheme "://" host [":" port] path ["?" query] ["#" fragment], each
     * part bounded (a host of up to 63 characters, up to 8 segments of
     * up to 32, a query of up to 64, a fragment of up to 32) */
    { "uri", "^[A-Za-z][A-Za-z0-9+.\\-]{0,15}://(?:[" RX_UCHAR "]|" RX_PCT
             "){1,63}(?::\\d{1,5})?(?:/(?:[" RX_UCHAR ":@]|" RX_PCT
             "){0,32}){0,8}(?:\\?(?:[" RX_UCHAR ":@/?]|" RX_PCT "){0,64})?"
             "(?:#(?:[" RX_UCHAR ":@/?]|" RX_PCT "){0,32})?$" },
    { "ipv4", "^" RX_IPV4 "$" },
    { "ipv6", "^" RX_IPV6 "$" },
    { "uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
              "[0-9a-f]{12}$" },
};


const char *
gr_format_pattern(const char *format)
{
    for (size_t i = 0; i < sizeof(gr_formats) / sizeof(gr_formats[0]); i++) {
        if (strcmp(format, gr_formats[i].name) == 0) {
            return gr_formats[i].pattern;
        }
    }
    return NULL;
}
