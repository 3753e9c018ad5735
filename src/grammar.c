/*
 * Structured output (see grammar.h).
 *
 * Compile: the schema (parsed with jansson) becomes a context-free grammar.
 * A rule is a list of alternatives; an alternative is a run of symbols in
 * one array (g->sym), ended by SYM_END; a symbol is a byte class (a 256-bit
 * set in g->cls) or a reference to a rule.  Repetition is right recursion
 * (X ::= "" | c X), bounded counts (maxLength, maxItems, digits) are
 * unrolled into chains of rules.
 *
 * Run: a stack is a list of positions in g->sym (the return points, the
 * current symbol on top); after expansion every top is a byte class, and an
 * empty stack means the value is complete.  A state is the sorted set of
 * distinct stacks, interned in a hash table, so it is an integer: byte
 * transitions (state, byte) -> state are cached per state, a token's
 * transition walks its bytes, and a state's token mask is computed once by
 * walking the vocabulary's byte trie from it (a subtree whose prefix is
 * refused is skipped whole).  A reference to a rule that ends an alternative
 * pushes no return point (tail call), so repetition does not grow the stack;
 * nesting does, up to GR_MAX_DEPTH positions (deeper alternatives are not
 * taken).  A state holds as many stacks as its choices need.
 *
 * Bounds (compile cost, per-request work and memory; see gr_budget):
 * - compile: the grammar is at most GR_MAX_SYMS symbols (a 400 past it, at
 *   parse time); building it, checking its recursion and flattening it are
 *   linear in that, so a compile on the engine thread takes a bounded few
 *   milliseconds.  Recursion that can recur before producing a byte (left
 *   recursion) or can never end is refused at compile time (grammar_check).
 * - expansion: iterative, each distinct stack expanded once per transition
 *   (so duplicate paths, e.g. 2^18 through an anyOf chain, cost nothing),
 *   at most GR_MAX_WORK stack words per transition.
 * - one API call (a mask, a token) walks at most GR_MAX_CALL_WORK stack
 *   words; past either limit the call fails (NULL mask, refused token) and
 *   the grammar says why (nalar_gmatcher_error).
 * - memory: a grammar's automaton holds at most GR_MAX_BYTES; its masks
 *   and transitions (caches) are dropped when it passes half of that, and
 *   the grammar cache keeps at most GR_CACHE_BYTES of grammars.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar.h"
#include "grammar_regex.h"

#define GR_MAX_DEPTH      128
#define GR_MAX_SYMS       (1 << 18)   /* grammar size for one schema */
#define GR_MAX_UNROLL     4096        /* maxLength, maxItems */
#define GR_INT_DIGITS     15
#define GR_FRAC_DIGITS    15
#define GR_EXP_DIGITS     2   /* so a number stays a finite double */
#define GR_MAX_STATES     (1 << 20)
#define GR_MAX_WORK       (1 << 18)   /* stack words, one transition */
#define GR_MAX_CALL_WORK  ((int64_t) 1 << 26) /* stack words, one API call */
#define GR_MAX_BYTES      ((size_t) 64 << 20) /* one grammar's automaton */
#define GR_CACHE_BYTES    ((size_t) 256 << 20) /* a cache's grammars */

enum { SYM_END = 0, SYM_CLASS, SYM_REF };

typedef struct {
    int32_t kind;
    int32_t arg;
} gsym;

typedef struct {
    int32_t  off;            /* into g->pool */
    int32_t  len;
    uint32_t hash;
    int32_t *next;           /* (256) byte transitions: -2 unknown, -1 none */
    uint32_t *mask;          /* (n_words) or NULL until asked */
    int8_t   accepting;      /* holds an empty stack */
    int16_t  forced;         /* the one byte allowed, -1: none or several */
    int32_t  forced_tok;     /* where forced: the one token allowed (the
                                first of the forced bytes' tokenization);
                                -2 not known yet */
} gstate;

/* the vocabulary's byte trie, shared by a cache's grammars: node 0 is the
 * root; children in a sibling list */
typedef struct {
    int32_t  first_child;    /* -1: none */
    int32_t  next_sibling;   /* -1: none */
    int32_t  first_tok;      /* into toks, tokens whose piece ends here */
    int32_t  n_toks;
    uint8_t  byte;
} tnode;

typedef struct {
    int32_t  n_vocab;
    int32_t  n_words;
    tnode   *nodes;
    int32_t  n_nodes;
    int32_t *toks;
    int32_t *eog;            /* end-of-generation tokens */
    int32_t  n_eog;
    uint8_t *tok_len;        /* piece length, 0: never in a value */
    char   (*tok_bytes)[48];
} gvocab;

struct nalar_grammar {
    int        refs;
    /* cache key */
    int        kind;
    uint64_t   digest;
    char      *canon;
    size_t     canon_len;
    nalar_grammar *lru_next;
    /* the grammar */
    gsym      *sym;
    int32_t    n_sym;
    uint32_t (*cls)[8];
    int32_t    n_cls;
    int32_t   *rule_alts;    /* per rule: index into alts */
    int32_t   *rule_nalts;
    int32_t    n_rules;
    int32_t   *alts;         /* alternatives' first positions */
    int32_t    n_alts;
    int32_t    root;
    /* the automaton */
    const gvocab *voc;
    gstate    *st;
    int32_t    n_st, cap_st;
    int32_t   *pool;
    int64_t    n_pool, cap_pool;
    int32_t   *ht;           /* open addressing: state ids + 1 */
    int64_t    ht_cap;
    int32_t    start;
    uint32_t  *zero;         /* an all-zero mask */
    /* scratch for building states */
    int32_t   *scr;          /* stacks as [len, pos...] runs */
    int64_t    n_scr, cap_scr;
    int64_t   *ord;          /* intern: offsets of the stacks in scr */
    int64_t    cap_ord;
    /* expansion work list: stacks as [len, pos...] runs in wk, each once
     * (wk_ht: a set of their offsets + 1, valid where wk_ep matches) */
    int32_t   *wk;
    int64_t    n_wk, cap_wk;
    int64_t   *wk_ht;
    uint32_t  *wk_ep;
    int64_t    wk_ht_cap, wk_used;
    uint32_t   epoch;
    /* budgets */
    size_t     bytes;        /* the automaton's memory (states, pool, hash
                                table, transitions, masks) */
    size_t     base_bytes;   /* the grammar itself */
    int64_t    call_work;    /* stack words walked in this API call */
    const char *why;         /* the last failure, NULL: out of memory */
};

struct nalar_grammar_cache {
    gvocab          voc;
    int             cap;
    int             n;
    nalar_grammar  *head;    /* most recently used first */
};

struct nalar_gmatcher {
    nalar_grammar *g;
    int32_t       *hist;     /* states: hist[0] the start, then one per
                                accepted token; -3 once ended */
    int32_t        n_hist, cap_hist;
};

#define GR_ENDED (-3)

static int32_t forced_tok(nalar_grammar *g, int32_t s);


/* ---- building the grammar ---- */

typedef struct {
    int32_t  n_alt;
    int32_t  cap_alt;
    gsym   **alt;
    int32_t *alt_len;
} brule;

typedef struct {
    brule     *rules;
    int32_t    n_rules, cap_rules;
    uint32_t (*cls)[8];
    int32_t    n_cls, cap_cls;
    int64_t    n_syms;
    json_t    *root_schema;
    /* $ref targets: pointer string -> rule */
    struct { char *ref; int32_t rule; json_t *schema; int done; } *refs;
    int32_t    n_refs, cap_refs;
    json_t    *ref_map;      /* ref -> index into refs */
    json_t    *lit_map;      /* short literal text -> its rule */
    /* shared rules, -1 until made */
    int32_t    ws, strchar, string_any, value_any, object_any, array_any,
               number, integer, digit_cls;
    char      *err;
    size_t     errlen;
    int        failed;
    int        dry;          /* only check and count: nothing stored, so
                                the cost is the schema's size and the
                                unrolled counts' (capped by GR_MAX_SYMS).
                                nalar_schema_check no longer builds dry:
                                grammar_check needs the rules */
} gbuild;


static int
bfail(gbuild *b, const char *fmt, const char *a, const char *path)
{
    if (!b->failed) {
        b->failed = 1;
        if (b->errlen) {
            snprintf(b->err, b->errlen, fmt, a, path);
        }
    }
    return -1;
}


static int32_t
rule_new(gbuild *b)
{
    if (b->failed) {
        return -1;
    }
    if (b->dry) {
        return b->n_rules++;
    }
    if (b->n_rules == b->cap_rules) {
        int32_t  nc = b->cap_rules ? b->cap_rules * 2 : 64;
        brule   *nr = realloc(b->rules, nc * sizeof(brule));

        if (nr == NULL) {
            return bfail(b, "out of memory%s%s", "", "");
        }
        b->rules = nr;
        b->cap_rules = nc;
    }
    memset(&b->rules[b->n_rules], 0, sizeof(brule));
    return b->n_rules++;
}


static int32_t
cls_new(gbuild *b, const uint32_t set[8])
{
    if (b->failed) {
        return -1;
    }
    if (b->dry) {
        return 0;
    }
    for (int32_t i = b->n_cls - 1; i >= 0 && i >= b->n_cls - 8; i--) {
        if (memcmp(b->cls[i], set, 32) == 0) {
            return i;
        }
    }
    if (b->n_cls == b->cap_cls) {
        int32_t  nc = b->cap_cls ? b->cap_cls * 2 : 64;
        void    *nv = realloc(b->cls, nc * 32);

        if (nv == NULL) {
            return bfail(b, "out of memory%s%s", "", "");
        }
        b->cls = nv;
        b->cap_cls = nc;
    }
    memcpy(b->cls[b->n_cls], set, 32);
    return b->n_cls++;
}


static gsym
S_cls_range(gbuild *b, int lo, int hi)
{
    uint32_t set[8] = {0};

    for (int c = lo; c <= hi; c++) {
        set[c >> 5] |= 1u << (c & 31);
    }
    return (gsym) { SYM_CLASS, cls_new(b, set) };
}


static gsym
S_ch(gbuild *b, int c)
{
    return S_cls_range(b, c, c);
}


static gsym
S_ref(int32_t r)
{
    return (gsym) { SYM_REF, r };
}


/* Adds an alternative (n symbols) to rule r. */
static void
alt_add(gbuild *b, int32_t r, const gsym *s, int32_t n)
{
    brule *ru;
    gsym  *copy;

    if (b->failed || r < 0) {
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        if (s[i].arg < 0) {
            b->failed = 1;
            return;
        }
    }
    b->n_syms += n + 1;
    if (b->n_syms > GR_MAX_SYMS) {
        bfail(b, "the schema is too large%s%s", "", "");
        return;
    }
    if (b->dry) {
        return;
    }
    ru = &b->rules[r];
    if (ru->n_alt == ru->cap_alt) {
        int32_t  nc = ru->cap_alt ? ru->cap_alt * 2 : 2;
        gsym   **na = realloc(ru->alt, nc * sizeof(gsym *));
        int32_t *nl;

        if (na == NULL) {
            bfail(b, "out of memory%s%s", "", "");
            return;
        }
        ru->alt = na;
        nl = realloc(ru->alt_len, nc * sizeof(int32_t));
        if (nl == NULL) {
            bfail(b, "out of memory%s%s", "", "");
            return;
        }
        ru->alt_len = nl;
        ru->cap_alt = nc;
    }
    copy = malloc((n + 1) * sizeof(gsym));
    if (copy == NULL) {
        bfail(b, "out of memory%s%s", "", "");
        return;
    }
    if (n > 0) {
        memcpy(copy, s, n * sizeof(gsym));
    }
    ru->alt[ru->n_alt] = copy;
    ru->alt_len[ru->n_alt] = n;
    ru->n_alt++;
}


/* A rule matching exactly the bytes s[0..n).  Short literals are made
 * once per grammar ("null", "true", "false" of many properties share
 * one rule), so a schema's size counts each such literal once. */
static int32_t
rule_literal(gbuild *b, const char *s, size_t n)
{
    int32_t r;
    gsym   *v;
    char    key[64];
    json_t *known;

    key[0] = '\0';
    if (!b->dry && n < sizeof(key) && memchr(s, '\0', n) == NULL) {
        memcpy(key, s, n);
        key[n] = '\0';
        if (b->lit_map == NULL && (b->lit_map = json_object()) == NULL) {
            return bfail(b, "out of memory%s%s", "", "");
        }
        known = json_object_get(b->lit_map, key);
        if (known != NULL) {
            return (int32_t) json_integer_value(known);
        }
    }
    r = rule_new(b);
    if (r < 0) {
        return -1;
    }
    if (key[0] != '\0'
        && json_object_set_new(b->lit_map, key, json_integer(r)) != 0)
    {
        return bfail(b, "out of memory%s%s", "", "");
    }
    v = malloc((n ? n : 1) * sizeof(gsym));
    if (v == NULL) {
        return bfail(b, "out of memory%s%s", "", "");
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = S_ch(b, (unsigned char) s[i]);
    }
    alt_add(b, r, v, (int32_t) n);
    free(v);
    return b->failed ? -1 : r;
}


static int32_t
r_ws(gbuild *b)
{
    if (b->ws < 0) {
        gsym sp;

        b->ws = rule_new(b);
        sp = S_ch(b, ' ');
        alt_add(b, b->ws, &sp, 1);
    }
    return b->ws;
}


/* One character of a JSON string: printable ASCII but '"' and '\\', an
 * escape, or a well-formed multi-byte UTF-8 sequence. */
static int32_t
r_strchar(gbuild *b)
{
    if (b->strchar < 0) {
        int32_t  r = rule_new(b), hex = rule_new(b);
        uint32_t set[8] = {0};
        gsym     s[6];

        b->strchar = r;
        for (int c = 0x20; c < 0x80; c++) {
            if (c != '"' && c != '\\') {
                set[c >> 5] |= 1u << (c & 31);
            }
        }
        s[0] = (gsym) { SYM_CLASS, cls_new(b, set) };
        alt_add(b, r, s, 1);
        memset(set, 0, sizeof(set));
        for (const char *e = "\"\\/bfnrt"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[0] = S_ch(b, '\\');
        s[1] = (gsym) { SYM_CLASS, cls_new(b, set) };
        alt_add(b, r, s, 2);
        memset(set, 0, sizeof(set));
        for (const char *e = "0123456789abcdefABCDEF"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[0] = (gsym) { SYM_CLASS, cls_new(b, set) };
        alt_add(b, hex, s, 1);
        /* \uXXXX but not a surrogate (D800-DFFF) */
        s[0] = S_ch(b, '\\');
        s[1] = S_ch(b, 'u');
        memset(set, 0, sizeof(set));
        for (const char *e = "0123456789abceABCEfF"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[2] = (gsym) { SYM_CLASS, cls_new(b, set) };
        s[3] = s[4] = s[5] = S_ref(hex);
        alt_add(b, r, s, 6);
        memset(set, 0, sizeof(set));
        set['d' >> 5] |= 1u << ('d' & 31);
        set['D' >> 5] |= 1u << ('D' & 31);
        s[2] = (gsym) { SYM_CLASS, cls_new(b, set) };
        s[3] = S_cls_range(b, '0', '7');
        alt_add(b, r, s, 6);
        /* well-formed UTF-8 (no overlong form, no surrogate, nothing
         * above U+10FFFF) */
        {
            static const uint8_t seq[][8] = {
                /* n, then (lo, hi) per byte */
                { 2, 0xC2, 0xDF, 0x80, 0xBF },
                { 3, 0xE0, 0xE0, 0xA0, 0xBF, 0x80, 0xBF },
                { 3, 0xE1, 0xEC, 0x80, 0xBF, 0x80, 0xBF },
                { 3, 0xED, 0xED, 0x80, 0x9F, 0x80, 0xBF },
                { 3, 0xEE, 0xEF, 0x80, 0xBF, 0x80, 0xBF },
            };
            static const uint8_t seq4[][9] = {
                { 4, 0xF0, 0xF0, 0x90, 0xBF, 0x80, 0xBF, 0x80, 0xBF },
                { 4, 0xF1, 0xF3, 0x80, 0xBF, 0x80, 0xBF, 0x80, 0xBF },
                { 4, 0xF4, 0xF4, 0x80, 0x8F, 0x80, 0xBF, 0x80, 0xBF },
            };

            for (size_t q = 0; q < sizeof(seq) / sizeof(seq[0]); q++) {
                for (int j = 0; j < seq[q][0]; j++) {
                    s[j] = S_cls_range(b, seq[q][1 + 2 * j],
                                       seq[q][2 + 2 * j]);
                }
                alt_add(b, r, s, seq[q][0]);
            }
            for (size_t q = 0; q < sizeof(seq4) / sizeof(seq4[0]); q++) {
                for (int j = 0; j < 4; j++) {
                    s[j] = S_cls_range(b, seq4[q][1 + 2 * j],
                                       seq4[q][2 + 2 * j]);
                }
                alt_add(b, r, s, 4);
            }
        }
    }
    return b->strchar;
}


/* "..." with min..max characters (max < 0: unbounded) */
static int32_t
r_string(gbuild *b, int64_t min, int64_t max)
{
    int32_t r, prev = -1, first = -1, c = r_strchar(b);
    int64_t n = max >= 0 ? max : min;
    gsym    s[3];

    if (min == 0 && max < 0 && b->string_any >= 0) {
        return b->string_any;
    }
    /* chain C_0 .. C_n: C_k ::= strchar C_k+1 (k < min), or also "" */
    for (int64_t k = 0; k <= n; k++) {
        int32_t ck = rule_new(b);

        if (ck < 0) {
            return -1;
        }
        if (first < 0) {
            first = ck;
        }
        if (prev >= 0) {
            s[0] = S_ref(c);
            s[1] = S_ref(ck);
            alt_add(b, prev, s, 2);
            if (k - 1 >= min) {
                alt_add(b, prev, NULL, 0);
            }
        }
        prev = ck;
    }
    /* the last link */
    alt_add(b, prev, NULL, 0);
    if (max < 0) {
        s[0] = S_ref(c);
        s[1] = S_ref(prev);
        alt_add(b, prev, s, 2);
    }
    r = rule_new(b);
    s[0] = S_ch(b, '"');
    s[1] = S_ref(first);
    s[2] = s[0];
    alt_add(b, r, s, 3);
    if (min == 0 && max < 0) {
        b->string_any = r;
    }
    return b->failed ? -1 : r;
}


/* at_least..n digits, as a chain D_0 .. D_n (D_k: k digits so far) */
static int32_t
r_digits(gbuild *b, int n, int at_least)
{
    int32_t first = -1, prev = -1;
    gsym    s[2];

    s[0] = S_cls_range(b, '0', '9');
    for (int k = 0; k <= n; k++) {
        int32_t dk = rule_new(b);

        if (dk < 0) {
            return -1;
        }
        if (first < 0) {
            first = dk;
        }
        if (prev >= 0) {
            s[1] = S_ref(dk);
            alt_add(b, prev, s, 2);
            if (k - 1 >= at_least) {
                alt_add(b, prev, NULL, 0);
            }
        }
        prev = dk;
    }
    alt_add(b, prev, NULL, 0);
    return b->failed ? -1 : first;
}


static int32_t
r_integer(gbuild *b)
{
    if (b->integer < 0) {
        int32_t r = rule_new(b), mag = rule_new(b), rest;
        gsym    s[3];

        b->integer = r;
        /* "0" | [1-9] digits{0..14} */
        s[0] = S_ch(b, '0');
        alt_add(b, mag, s, 1);
        s[0] = S_cls_range(b, '1', '9');
        rest = r_digits(b, GR_INT_DIGITS - 1, 0);
        s[1] = S_ref(rest);
        alt_add(b, mag, s, 2);
        s[0] = S_ref(mag);
        alt_add(b, r, s, 1);
        s[0] = S_ch(b, '-');
        s[1] = S_ref(mag);
        alt_add(b, r, s, 2);
    }
    return b->integer;
}


static int32_t
r_number(gbuild *b)
{
    if (b->number < 0) {
        int32_t r = rule_new(b), frac = rule_new(b), ex = rule_new(b),
                sign = rule_new(b), in = r_integer(b);
        gsym    s[4];

        b->number = r;
        alt_add(b, frac, NULL, 0);
        s[0] = S_ch(b, '.');
        s[1] = S_ref(r_digits(b, GR_FRAC_DIGITS, 1));
        alt_add(b, frac, s, 2);
        alt_add(b, sign, NULL, 0);
        s[0] = S_ch(b, '-');
        alt_add(b, sign, s, 1);
        s[0] = S_ch(b, '+');
        alt_add(b, sign, s, 1);
        alt_add(b, ex, NULL, 0);
        {
            uint32_t set[8] = {0};

            set['e' >> 5] |= 1u << ('e' & 31);
            set['E' >> 5] |= 1u << ('E' & 31);
            s[0] = (gsym) { SYM_CLASS, cls_new(b, set) };
        }
        s[1] = S_ref(sign);
        s[2] = S_ref(r_digits(b, GR_EXP_DIGITS, 1));
        alt_add(b, ex, s, 3);
        s[0] = S_ref(in);
        s[1] = S_ref(frac);
        s[2] = S_ref(ex);
        alt_add(b, r, s, 3);
    }
    return b->number;
}


static int32_t r_value_any(gbuild *b);

/* "{" (string ": " V (", " string ": " V)*)? "}" with V the
 * value rule (any value when v < 0) */
static int32_t
r_object_map(gbuild *b, int32_t v)
{
    int32_t r = rule_new(b), body = rule_new(b), more = rule_new(b),
            kv = rule_new(b), ws = r_ws(b), str = r_string(b, 0, -1);
    gsym    s[5];

    if (v < 0) {
        v = r_value_any(b);
    }
    s[0] = S_ref(str);
    s[1] = S_ch(b, ':');
    s[2] = S_ref(ws);
    s[3] = S_ref(v);
    alt_add(b, kv, s, 4);
    alt_add(b, more, NULL, 0);
    s[0] = S_ch(b, ',');
    s[1] = S_ref(ws);
    s[2] = S_ref(kv);
    s[3] = S_ref(more);
    alt_add(b, more, s, 4);
    alt_add(b, body, NULL, 0);
    s[0] = S_ref(kv);
    s[1] = S_ref(more);
    alt_add(b, body, s, 2);
    s[0] = S_ch(b, '{');
    s[1] = S_ref(body);
    s[2] = S_ch(b, '}');
    alt_add(b, r, s, 3);
    return b->failed ? -1 : r;
}


/* "[" (V (", " V){min-1..max-1})? "]"; max < 0 unbounded */
static int32_t
r_array(gbuild *b, int32_t v, int64_t min, int64_t max)
{
    int32_t r = rule_new(b), ws = r_ws(b), first = -1, prev = -1;
    int64_t n = max >= 0 ? max : (min > 1 ? min : 1);
    gsym    s[5];

    if (v < 0) {
        v = r_value_any(b);
    }
    /* A_k: k items so far; A_k ::= [sep] V A_k+1 | "" (k >= min) */
    for (int64_t k = 0; k <= n; k++) {
        int32_t ak = rule_new(b);

        if (ak < 0) {
            return -1;
        }
        if (first < 0) {
            first = ak;
        }
        if (prev >= 0) {
            int i = 0;

            if (k - 1 > 0) {
                s[i++] = S_ch(b, ',');
                s[i++] = S_ref(ws);
            }
            s[i++] = S_ref(v);
            s[i++] = S_ref(ak);
            alt_add(b, prev, s, i);
            if (k - 1 >= min) {
                alt_add(b, prev, NULL, 0);
            }
        }
        prev = ak;
    }
    alt_add(b, prev, NULL, 0);
    if (max < 0) {
        /* A_n loops: ", " V A_n (n >= 1 items are there) */
        s[0] = S_ch(b, ',');
        s[1] = S_ref(ws);
        s[2] = S_ref(v);
        s[3] = S_ref(prev);
        alt_add(b, prev, s, 4);
    }
    s[0] = S_ch(b, '[');
    s[1] = S_ref(first);
    s[2] = S_ch(b, ']');
    alt_add(b, r, s, 3);
    return b->failed ? -1 : r;
}


static int32_t
r_value_any(gbuild *b)
{
    if (b->failed) {
        /* no rule is made after a failure, so value_any would stay -1
         * and r_object_map would come back here without end */
        return -1;
    }
    if (b->value_any < 0) {
        int32_t r = rule_new(b);
        gsym    s[1];

        b->value_any = r;
        b->object_any = r_object_map(b, r);
        b->array_any = r_array(b, r, 0, -1);
        s[0] = S_ref(b->object_any);
        alt_add(b, r, s, 1);
        s[0] = S_ref(b->array_any);
        alt_add(b, r, s, 1);
        s[0] = S_ref(r_string(b, 0, -1));
        alt_add(b, r, s, 1);
        s[0] = S_ref(r_number(b));
        alt_add(b, r, s, 1);
        s[0] = S_ref(rule_literal(b, "true", 4));
        alt_add(b, r, s, 1);
        s[0] = S_ref(rule_literal(b, "false", 5));
        alt_add(b, r, s, 1);
        s[0] = S_ref(rule_literal(b, "null", 4));
        alt_add(b, r, s, 1);
    }
    return b->value_any;
}


/* the canonical (compact) JSON of v as a literal rule */
static int32_t
rule_json_literal(gbuild *b, json_t *v, const char *path)
{
    char    *txt;
    int32_t  r;

    txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (txt == NULL) {
        return bfail(b, "cannot serialise the value at %s%s", path, "");
    }
    r = rule_literal(b, txt, strlen(txt));
    free(txt);
    return r;
}


static int32_t compile_schema(gbuild *b, json_t *sc, const char *path,
                              int depth);

static int
get_count(gbuild *b, json_t *sc, const char *key, int64_t *out,
          const char *path)
{
    json_t *v = json_object_get(sc, key);

    if (v == NULL) {
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0
        || json_integer_value(v) > GR_MAX_UNROLL)
    {
        char k[96];

        snprintf(k, sizeof(k), "'%s' (an integer 0..%d)", key, GR_MAX_UNROLL);
        return bfail(b, "unsupported value of %s at %s", k, path);
    }
    *out = json_integer_value(v);
    return 0;
}


static int32_t
ref_rule(gbuild *b, const char *ref, const char *path)
{
    json_t *target = NULL;
    int32_t r;

    /* known refs by name: a hash look-up, so many $defs stay linear */
    if (b->ref_map == NULL && (b->ref_map = json_object()) == NULL) {
        return bfail(b, "out of memory%s%s", "", "");
    }
    if ((target = json_object_get(b->ref_map, ref)) != NULL) {
        return b->refs[json_integer_value(target)].rule;
    }
    if (strcmp(ref, "#") == 0) {
        target = b->root_schema;
    } else if (strncmp(ref, "#/$defs/", 8) == 0) {
        target = json_object_get(json_object_get(b->root_schema, "$defs"),
                                 ref + 8);
    } else if (strncmp(ref, "#/definitions/", 14) == 0) {
        target = json_object_get(json_object_get(b->root_schema,
                                                 "definitions"), ref + 14);
    } else {
        return bfail(b, "unsupported $ref '%s' at %s (only #, #/$defs/NAME "
                     "and #/definitions/NAME)", ref, path);
    }
    if (target == NULL) {
        return bfail(b, "$ref '%s' at %s points nowhere", ref, path);
    }
    if (b->n_refs == b->cap_refs) {
        int32_t nc = b->cap_refs ? b->cap_refs * 2 : 8;
        void   *nv = realloc(b->refs, nc * sizeof(*b->refs));

        if (nv == NULL) {
            return bfail(b, "out of memory%s%s", "", "");
        }
        b->refs = nv;
        b->cap_refs = nc;
    }
    r = rule_new(b);
    if (r < 0) {
        return -1;
    }
    b->refs[b->n_refs].ref = strdup(ref);
    if (b->refs[b->n_refs].ref == NULL) {
        return bfail(b, "out of memory%s%s", "", "");
    }
    b->refs[b->n_refs].rule = r;
    b->refs[b->n_refs].schema = target;
    b->refs[b->n_refs].done = 0;
    if (json_object_set_new(b->ref_map, ref, json_integer(b->n_refs)) != 0) {
        free(b->refs[b->n_refs].ref);
        return bfail(b, "out of memory%s%s", "", "");
    }
    b->n_refs++;
    return r;
}


static const char *const gr_annotations[] = {
    "title", "description", "$schema", "$id", "$comment", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "$defs",
    "definitions", NULL
};

static const char *const gr_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items",
    "enum", "const", "anyOf", "$ref", "minLength", "maxLength", "minItems",
    "maxItems", "format", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", NULL
};


static int
known_key(const char *k)
{
    for (int i = 0; gr_annotations[i]; i++) {
        if (strcmp(k, gr_annotations[i]) == 0) {
            return 1;
        }
    }
    for (int i = 0; gr_keywords[i]; i++) {
        if (strcmp(k, gr_keywords[i]) == 0) {
            return 1;
        }
    }
    return 0;
}


static void
path_join(char *out, size_t cap, const char *path, const char *a,
          const char *c)
{
    snprintf(out, cap, "%s/%s%s%s", path, a, c ? "/" : "", c ? c : "");
}


/* The names in `required` as a set (a JSON object), so that marking each
 * property is a hash look-up: linear, where a scan per property was
 * quadratic (10k required properties took seconds).  NULL when req is. */
static json_t *
required_set(json_t *req)
{
    json_t *set;

    if (req == NULL) {
        return NULL;
    }
    set = json_object();
    for (size_t j = 0; set != NULL && j < json_array_size(req); j++) {
        if (json_object_set_new(set,
                                json_string_value(json_array_get(req, j)),
                                json_true()) != 0)
        {
            json_decref(set);
            return NULL;
        }
    }
    return set;
}


static int32_t
compile_object(gbuild *b, json_t *sc, const char *path, int depth)
{
    json_t     *props = json_object_get(sc, "properties");
    json_t     *req = json_object_get(sc, "required");
    json_t     *addl = json_object_get(sc, "additionalProperties");
    size_t      n, i;
    const char *key;
    json_t     *val;
    int32_t    *kv, *first, *rest, r, ws = r_ws(b);
    char       *optional, sub[512];
    json_t     *reqset;
    gsym        s[6];

    if (props != NULL && !json_is_object(props)) {
        return bfail(b, "'properties' at %s%s must be an object", path, "");
    }
    if (req != NULL && !json_is_array(req)) {
        return bfail(b, "'required' at %s%s must be an array", path, "");
    }
    if (addl != NULL && !json_is_boolean(addl) && !json_is_object(addl)) {
        return bfail(b, "'additionalProperties' at %s%s must be a boolean "
                     "or a schema", path, "");
    }
    /* every required name must be a property */
    for (i = 0; req && i < json_array_size(req); i++) {
        json_t *nm = json_array_get(req, i);

        if (!json_is_string(nm)) {
            return bfail(b, "'required' at %s%s must hold strings", path, "");
        }
        if (props == NULL || json_object_get(props, json_string_value(nm))
                             == NULL)
        {
            return bfail(b, "required property '%s' at %s is not in "
                         "'properties'", json_string_value(nm), path);
        }
    }
    n = props ? json_object_size(props) : 0;
    if (n == 0) {
        if (addl == NULL || json_is_true(addl)) {
            return r_object_map(b, -1);
        }
        if (json_is_object(addl)) {
            path_join(sub, sizeof(sub), path, "additionalProperties", NULL);
            return r_object_map(b, compile_schema(b, addl, sub, depth + 1));
        }
        return rule_literal(b, "{}", 2);
    }
    /* properties in their order; required ones present, optional ones may
     * be left out; additional properties (when allowed) are not produced */
    kv = calloc(n, sizeof(int32_t));
    first = calloc(n + 1, sizeof(int32_t));
    rest = calloc(n + 1, sizeof(int32_t));
    optional = calloc(n, 1);
    reqset = required_set(req);
    if (kv == NULL || first == NULL || rest == NULL || optional == NULL
        || (req != NULL && reqset == NULL))
    {
        free(kv); free(first); free(rest); free(optional);
        json_decref(reqset);
        return bfail(b, "out of memory%s%s", "", "");
    }
    i = 0;
    json_object_foreach(props, key, val) {
        char   *lit;
        json_t *ks = json_string(key);
        int32_t vr;

        optional[i] = reqset == NULL || json_object_get(reqset, key) == NULL;
        path_join(sub, sizeof(sub), path, "properties", key);
        vr = compile_schema(b, val, sub, depth + 1);
        lit = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (lit == NULL) {
            bfail(b, "out of memory%s%s", "", "");
            break;
        }
        kv[i] = rule_new(b);
        s[0] = S_ref(rule_literal(b, lit, strlen(lit)));
        s[1] = S_ch(b, ':');
        s[2] = S_ref(ws);
        s[3] = S_ref(vr);
        alt_add(b, kv[i], s, 4);
        free(lit);
        i++;
    }
    /* first[i]: properties i.. with none written yet; rest[i]: some were */
    for (i = 0; i <= n; i++) {
        first[i] = rule_new(b);
        rest[i] = rule_new(b);
    }
    alt_add(b, first[n], NULL, 0);
    alt_add(b, rest[n], NULL, 0);
    for (i = 0; i < n && !b->failed; i++) {
        s[0] = S_ref(kv[i]);
        s[1] = S_ref(rest[i + 1]);
        alt_add(b, first[i], s, 2);
        s[0] = S_ch(b, ',');
        s[1] = S_ref(ws);
        s[2] = S_ref(kv[i]);
        s[3] = S_ref(rest[i + 1]);
        alt_add(b, rest[i], s, 4);
        if (optional[i]) {
            s[0] = S_ref(first[i + 1]);
            alt_add(b, first[i], s, 1);
            s[0] = S_ref(rest[i + 1]);
            alt_add(b, rest[i], s, 1);
        }
    }
    r = rule_new(b);
    s[0] = S_ch(b, '{');
    s[1] = S_ref(first[0]);
    s[2] = S_ch(b, '}');
    alt_add(b, r, s, 3);
    free(kv); free(first); free(rest); free(optional);
    json_decref(reqset);
    return b->failed ? -1 : r;
}


/* ---- bounded integers and numbers ----
 *
 * A bounded integer is the decimal strings of the values in [lo, hi]:
 * magnitudes without a leading zero, split by digit count, and each count's
 * range split at the first digit where its ends differ (the classic
 * range-to-regex construction): a chain of rules per end, so the grammar
 * grows linearly with the number of digits.  "-0" is never produced.
 *
 * A bounded number has no exponent; its bounds are made inclusive decimal
 * ones first (see num_bound), and the fraction (at most GR_FRAC_DIGITS
 * digits) is compared digit by digit with theirs.
 */

#define GR_DEC_FRAC 400      /* a double's decimal fraction fits */

typedef struct {
    int     inf;             /* no bound on this side */
    int     neg;
    char    ip[24];          /* integer part, no leading zero ("0") */
    char    fp[GR_DEC_FRAC]; /* fraction digits, no trailing zero */
} gdec;

/* shared per range: x_any[k] matches exactly k digits */
typedef struct {
    int32_t any[21];
    int32_t frac_any;        /* r_digits(GR_FRAC_DIGITS, 0): rule frac_any
                                + j allows up to GR_FRAC_DIGITS - j digits */
} gnum;


static int32_t
any_digits(gbuild *b, gnum *nc, int k)
{
    if (nc->any[0] < 0) {
        gsym s[2];

        nc->any[0] = rule_new(b);
        alt_add(b, nc->any[0], NULL, 0);
        s[0] = S_cls_range(b, '0', '9');
        for (int i = 1; i <= 20; i++) {
            nc->any[i] = rule_new(b);
            s[1] = S_ref(nc->any[i - 1]);
            alt_add(b, nc->any[i], s, 2);
        }
    }
    return nc->any[k];
}


/* a rule of one alternative: class [lo, hi] then rule `next` (or nothing
 * when next < 0) */
static void
alt_digit(gbuild *b, int32_t r, int lo, int hi, int32_t next)
{
    gsym s[2];

    s[0] = S_cls_range(b, lo, hi);
    s[1] = S_ref(next);
    alt_add(b, r, s, next >= 0 ? 2 : 1);
}


/* digit strings s, |s| = |x| - pos, with s >= x[pos..] (ge) or <= (le) */
static int32_t
r_digits_cmp(gbuild *b, gnum *nc, const char *x, size_t pos, int ge)
{
    size_t  n = strlen(x);
    int32_t r, rest;
    int     d;

    if (pos == n) {
        return any_digits(b, nc, 0);
    }
    if (strspn(x + pos, ge ? "0" : "9") == n - pos) {
        return any_digits(b, nc, (int) (n - pos));
    }
    rest = r_digits_cmp(b, nc, x, pos + 1, ge);
    r = rule_new(b);
    d = x[pos];
    alt_digit(b, r, d, d, rest);
    if (ge && d < '9') {
        alt_digit(b, r, d + 1, '9', any_digits(b, nc, (int) (n - pos - 1)));
    }
    if (!ge && d > '0') {
        alt_digit(b, r, '0', d - 1, any_digits(b, nc, (int) (n - pos - 1)));
    }
    return r;
}


/* digit strings of x's length between x and y (x <= y, as long) */
static int32_t
r_digits_between(gbuild *b, gnum *nc, const char *x, const char *y,
                 size_t pos)
{
    size_t  n = strlen(x);
    int32_t r;

    if (pos == n) {
        return any_digits(b, nc, 0);
    }
    r = rule_new(b);
    if (x[pos] == y[pos]) {
        alt_digit(b, r, x[pos], x[pos],
                  r_digits_between(b, nc, x, y, pos + 1));
        return r;
    }
    alt_digit(b, r, x[pos], x[pos], r_digits_cmp(b, nc, x, pos + 1, 1));
    if (x[pos] + 1 <= y[pos] - 1) {
        alt_digit(b, r, x[pos] + 1, y[pos] - 1,
                  any_digits(b, nc, (int) (n - pos - 1)));
    }
    alt_digit(b, r, y[pos], y[pos], r_digits_cmp(b, nc, y, pos + 1, 0));
    return r;
}


/* the decimal strings (no leading zero) of the integers in [a, z]: an
 * alternative per digit count */
static int32_t
r_uint_range(gbuild *b, gnum *nc, uint64_t a, uint64_t z)
{
    char     xz[24];
    int32_t  r = rule_new(b);
    int      la, lz;
    uint64_t p10 = 1;        /* 10^(l-1) */

    la = snprintf(xz, sizeof(xz), "%llu", (unsigned long long) a);
    lz = snprintf(xz, sizeof(xz), "%llu", (unsigned long long) z);
    for (int l = 1; l < la; l++) {
        p10 *= 10;
    }
    for (int l = la; l <= lz && !b->failed; l++, p10 *= 10) {
        char lo[24], hi[24];
        gsym s;

        snprintf(lo, sizeof(lo), "%llu",
                 (unsigned long long) (l == la ? a : p10));
        if (l == lz) {
            memcpy(hi, xz, sizeof(hi));
        } else {
            memset(hi, '9', l);
            hi[l] = '\0';
        }
        s = S_ref(r_digits_between(b, nc, lo, hi, 0));
        alt_add(b, r, &s, 1);
    }
    return b->failed ? -1 : r;
}


/* the integers in [lo, hi] (lo <= hi) */
static int32_t
r_int_range(gbuild *b, int64_t lo, int64_t hi)
{
    gnum    nc;
    int32_t r = rule_new(b);
    gsym    s[2];

    memset(&nc, 0xff, sizeof(nc));
    if (hi >= 0) {
        s[0] = S_ref(r_uint_range(b, &nc, lo > 0 ? (uint64_t) lo : 0,
                                  (uint64_t) hi));
        alt_add(b, r, s, 1);
    }
    if (lo < 0) {
        /* magnitudes of the negative part, -0 left out */
        uint64_t mlo = hi < 0 ? (uint64_t) -(hi + 1) + 1 : 1,
                 mhi = (uint64_t) -(lo + 1) + 1;

        s[0] = S_ch(b, '-');
        s[1] = S_ref(r_uint_range(b, &nc, mlo, mhi));
        alt_add(b, r, s, 2);
    }
    return b->failed ? -1 : r;
}


/* digit j of a fraction (0 past its end) */
static int
frac_digit(const char *f, size_t j)
{
    return j < strlen(f) ? f[j] : '0';
}


/*
 * Fraction digits s (positions j.. of at most GR_FRAC_DIGITS) with
 * lo[j..] <= s <= hi[j..] as decimal fractions (lo, hi NULL: no bound),
 * at least one digit when need; -2 when there is none such.
 */
static int32_t
r_frac_body(gbuild *b, gnum *nc, const char *lo, const char *hi, size_t j,
            int need)
{
    gsym    alts[4][2];
    int     na[4], n = 0, empty;
    int32_t r;

    if (lo != NULL && (j >= strlen(lo) || strspn(lo + j, "0")
                                          == strlen(lo + j)))
    {
        lo = NULL;           /* lo's rest is zero: any s is >= */
    }
    if (hi != NULL && j < GR_FRAC_DIGITS
        && strlen(hi) >= GR_FRAC_DIGITS
        && strspn(hi + j, "9") >= GR_FRAC_DIGITS - j)
    {
        hi = NULL;           /* any s of the digits left is <= */
    }
    empty = lo == NULL && !need;
    if (lo == NULL && hi == NULL) {
        if (j >= GR_FRAC_DIGITS) {
            return empty ? any_digits(b, nc, 0) : -2;
        }
        if (nc->frac_any < 0) {
            nc->frac_any = r_digits(b, GR_FRAC_DIGITS, 0);
        }
        if (!need) {
            return nc->frac_any + (int32_t) j;
        }
        r = rule_new(b);
        alt_digit(b, r, '0', '9', nc->frac_any + (int32_t) j + 1);
        return r;
    }
    if (j >= GR_FRAC_DIGITS) {
        return empty ? any_digits(b, nc, 0) : -2;
    }
    {
        int dl = lo ? frac_digit(lo, j) : '0', dh = hi ? frac_digit(hi, j)
                                                      : '9';
        int32_t c;

        if (lo && hi && dl == dh) {
            c = r_frac_body(b, nc, lo, hi, j + 1, 0);
            if (c != -2) {
                alts[n][0] = S_cls_range(b, dl, dl);
                alts[n][1] = S_ref(c);
                na[n++] = 2;
            }
        } else {
            int from = dl, to = dh;

            if (lo) {
                c = r_frac_body(b, nc, lo, NULL, j + 1, 0);
                if (c != -2) {
                    alts[n][0] = S_cls_range(b, dl, dl);
                    alts[n][1] = S_ref(c);
                    na[n++] = 2;
                }
                from = dl + 1;
            }
            if (hi) {
                c = r_frac_body(b, nc, NULL, hi, j + 1, 0);
                if (c != -2) {
                    alts[n][0] = S_cls_range(b, dh, dh);
                    alts[n][1] = S_ref(c);
                    na[n++] = 2;
                }
                to = dh - 1;
            }
            if (from <= to) {
                alts[n][0] = S_cls_range(b, from, to);
                alts[n][1] = S_ref(r_frac_body(b, nc, NULL, NULL, j + 1, 0));
                na[n++] = 2;
            }
        }
    }
    if (n == 0 && !empty) {
        return -2;
    }
    r = rule_new(b);
    if (empty) {
        alt_add(b, r, NULL, 0);
    }
    for (int i = 0; i < n; i++) {
        alt_add(b, r, alts[i], na[i]);
    }
    return r;
}


/* ("." digits)? with lo <= 0.digits <= hi (NULL: no bound); -2: none */
static int32_t
r_frac(gbuild *b, gnum *nc, const char *lo, const char *hi)
{
    int32_t body = r_frac_body(b, nc, lo, hi, 0, 1), r;
    int     empty = lo == NULL || strspn(lo, "0") == strlen(lo);
    gsym    s[2];

    if (body == -2 && !empty) {
        return -2;
    }
    r = rule_new(b);
    if (empty) {
        alt_add(b, r, NULL, 0);
    }
    if (body != -2) {
        s[0] = S_ch(b, '.');
        s[1] = S_ref(body);
        alt_add(b, r, s, 2);
    }
    return r;
}


/* adds to r the magnitudes m (no sign) with a <= m <= z (a <= z): the
 * count of alternatives added (0: none has at most 15 fraction digits) */
static int
num_magnitudes(gbuild *b, gnum *nc, int32_t r, const gdec *a,
               const gdec *z)
{
    uint64_t ai = strtoull(a->ip, NULL, 10), zi = strtoull(z->ip, NULL, 10);
    int32_t  f;
    int      n = 0;
    gsym     s[2];

    if (ai == zi) {
        f = r_frac(b, nc, a->fp, z->fp);
        if (f != -2) {
            s[0] = S_ref(rule_literal(b, a->ip, strlen(a->ip)));
            s[1] = S_ref(f);
            alt_add(b, r, s, 2);
            n++;
        }
        return n;
    }
    f = r_frac(b, nc, a->fp, NULL);
    if (f != -2) {
        s[0] = S_ref(rule_literal(b, a->ip, strlen(a->ip)));
        s[1] = S_ref(f);
        alt_add(b, r, s, 2);
        n++;
    }
    if (ai + 1 <= zi - 1) {
        s[0] = S_ref(r_uint_range(b, nc, ai + 1, zi - 1));
        s[1] = S_ref(r_frac(b, nc, NULL, NULL));
        alt_add(b, r, s, 2);
        n++;
    }
    f = r_frac(b, nc, NULL, z->fp);
    if (f != -2) {
        s[0] = S_ref(rule_literal(b, z->ip, strlen(z->ip)));
        s[1] = S_ref(f);
        alt_add(b, r, s, 2);
        n++;
    }
    return n;
}


/* -1, 0, 1 as |x| compares with |y| (finite ones) */
static int
dec_cmp_mag(const gdec *x, const gdec *y)
{
    size_t lx = strlen(x->ip), ly = strlen(y->ip);
    int    c;

    if (lx != ly) {
        return lx < ly ? -1 : 1;
    }
    if ((c = strcmp(x->ip, y->ip)) != 0) {
        return c < 0 ? -1 : 1;
    }
    for (size_t j = 0; ; j++) {
        int dx = frac_digit(x->fp, j), dy = frac_digit(y->fp, j);

        if (dx != dy) {
            return dx < dy ? -1 : 1;
        }
        if (j >= strlen(x->fp) && j >= strlen(y->fp)) {
            return 0;
        }
    }
}


static int
dec_is_zero(const gdec *x)
{
    return strcmp(x->ip, "0") == 0 && x->fp[0] == '\0';
}


/* the numbers in [lo, hi] (inclusive decimal bounds, inf for none), no
 * exponent; -2 when there is none */
static int32_t
r_num_range(gbuild *b, const gdec *lo, const gdec *hi)
{
    static const gdec zero = { 0, 0, "0", "" },
                      tiny = { 0, 0, "0", "000000000000001" };
    gdec    maxm = { 0, 0, "999999999999999", "999999999999999" };
    gnum    nc;
    int32_t r, pos, neg;
    int     np, nn;

    memset(&nc, 0xff, sizeof(nc));
    if ((!lo->inf && strlen(lo->ip) >= 16)
        || (!hi->inf && strlen(hi->ip) >= 16))
    {
        memcpy(maxm.ip, "9999999999999999", 17);
    }
    /* x >= 0 written without a sign: [max(lo, 0), hi]; x < 0: "-" and a
     * magnitude in [max(|hi|, tiny), |lo|] (so never "-0") */
    const gdec *pa = lo->inf || lo->neg ? &zero : lo,
               *pz = hi->inf ? &maxm : hi,
               *na = hi->inf || !hi->neg ? &tiny : hi,
               *nz = lo->inf ? &maxm : lo;
    int         has_pos = (hi->inf || !hi->neg || dec_is_zero(hi))
                          && dec_cmp_mag(pa, pz) <= 0,
                has_neg;

    if (dec_cmp_mag(na, &tiny) < 0) {
        na = &tiny;
    }
    has_neg = (lo->inf || (lo->neg && !dec_is_zero(lo)))
              && dec_cmp_mag(na, nz) <= 0;
    /* a first pass counts what each side has (a side may have nothing of
     * at most 15 fraction digits; its rules then go unused), so that no
     * rule is left without an alternative */
    np = has_pos ? num_magnitudes(b, &nc, -1, pa, pz) : 0;
    nn = has_neg ? num_magnitudes(b, &nc, -1, na, nz) : 0;
    if (np + nn == 0) {
        return -2;
    }
    r = rule_new(b);
    if (np) {
        pos = rule_new(b);
        num_magnitudes(b, &nc, pos, pa, pz);
        alt_add(b, r, (gsym[]) { S_ref(pos) }, 1);
    }
    if (nn) {
        neg = rule_new(b);
        num_magnitudes(b, &nc, neg, na, nz);
        alt_add(b, r, (gsym[]) { S_ch(b, '-'), S_ref(neg) }, 2);
    }
    return b->failed ? -1 : r;
}


/* x as a decimal: exact for integers, else the shortest decimal that reads
 * back as x */
static void
dec_of_double(double x, gdec *d)
{
    char buf[64], m[32];
    int  e, nm = 0, p;

    memset(d, 0, sizeof(*d));
    d->neg = x < 0;
    if (x < 0) {
        x = -x;
    }
    if (x == floor(x) && x < 1e18) {
        snprintf(d->ip, sizeof(d->ip), "%.0f", x);
        return;
    }
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) {
            break;
        }
    }
    /* d[.ddd]e[+-]XX */
    for (char *c = buf; *c && *c != 'e'; c++) {
        if (*c >= '0' && *c <= '9') {
            m[nm++] = *c;
        }
    }
    m[nm] = '\0';
    e = atoi(strchr(buf, 'e') + 1);
    if (e >= 0) {
        for (int i = 0; i <= e && i < 23; i++) {
            d->ip[i] = i < nm ? m[i] : '0';
        }
        if (e + 1 < nm) {
            snprintf(d->fp, sizeof(d->fp), "%s", m + e + 1);
        }
    } else {
        int z = -e - 1;

        d->ip[0] = '0';
        if (z + nm < GR_DEC_FRAC) {
            memset(d->fp, '0', z);
            memcpy(d->fp + z, m, nm + 1);
        }
    }
    for (size_t n = strlen(d->fp); n > 0 && d->fp[n - 1] == '0'; n--) {
        d->fp[n - 1] = '\0';
    }
}


/*
 * One bound of a number (lower when lower) from minimum/maximum and
 * exclusiveMinimum/exclusiveMaximum (a number, or draft 4's boolean), as an
 * inclusive decimal: an exclusive bound x becomes the shortest decimal of
 * the next double past x, so that every number the grammar produces reads
 * back (as Python or JavaScript read JSON) as one past x.  Refuses bounds
 * beyond 2^53, where doubles skip integers.
 */
static int
num_bound(gbuild *b, json_t *sc, int lower, int integer, gdec *d,
          int64_t *iv, const char *path)
{
    const char *kin = lower ? "minimum" : "maximum",
               *kex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    json_t     *in = json_object_get(sc, kin), *ex = json_object_get(sc, kex),
               *v;
    int         excl = 0;
    double      x;

    d->inf = 1;
    if (ex != NULL && json_is_boolean(ex)) {
        excl = json_is_true(ex);
        ex = NULL;
    }
    if (in != NULL && !json_is_number(in)) {
        return bfail(b, "'%s' at %s must be a number", kin, path);
    }
    if (ex != NULL && !json_is_number(ex)) {
        return bfail(b, "'%s' at %s must be a number", kex, path);
    }
    /* both: the tighter one */
    v = in;
    if (ex != NULL) {
        if (in == NULL || (lower ? json_number_value(ex)
                                   >= json_number_value(in)
                                 : json_number_value(ex)
                                   <= json_number_value(in)))
        {
            v = ex;
            excl = 1;
        }
    }
    if (v == NULL) {
        return 0;
    }
    d->inf = 0;
    if (integer) {
        /* the closest integer inside */
        if (json_is_integer(v)) {
            int64_t n = json_integer_value(v);

            if (excl && (lower ? n == INT64_MAX : n == INT64_MIN)) {
                return bfail(b, "no integer satisfies '%s' at %s", kex,
                             path);
            }
            *iv = excl ? (lower ? n + 1 : n - 1) : n;
            return 0;
        }
        x = json_real_value(v);
        x = lower ? (excl ? floor(x) + 1 : ceil(x))
                  : (excl ? ceil(x) - 1 : floor(x));
        if (x >= 9223372036854775808.0) {
            if (lower) {
                return bfail(b, "no int64 satisfies '%s' at %s", kin, path);
            }
            *iv = INT64_MAX;
        } else if (x < -9223372036854775808.0) {
            if (!lower) {
                return bfail(b, "no int64 satisfies '%s' at %s", kin, path);
            }
            *iv = INT64_MIN;
        } else {
            *iv = (int64_t) x;
        }
        return 0;
    }
    if (json_is_integer(v)) {
        int64_t n = json_integer_value(v);

        if (n > (1LL << 53) || n < -(1LL << 53)) {
            return bfail(b, "'%s' at %s is beyond 2^53 (not supported for "
                         "numbers)", excl ? kex : kin, path);
        }
        x = (double) n;
    } else {
        x = json_real_value(v);
    }
    if (!isfinite(x) || fabs(x) > 9007199254740992.0) {
        return bfail(b, "'%s' at %s is beyond 2^53 (not supported for "
                     "numbers)", excl ? kex : kin, path);
    }
    if (excl) {
        x = nextafter(x, lower ? INFINITY : -INFINITY);
    }
    dec_of_double(x, d);
    return 0;
}


/* the bounded integer or number rule of sc, or -2 when sc has no bound */
static int32_t
compile_bounds(gbuild *b, json_t *sc, int integer, const char *path)
{
    gdec    lo, hi;
    int64_t ilo = 0, ihi = 0;
    int32_t r;

    if (num_bound(b, sc, 1, integer, &lo, &ilo, path) < 0
        || num_bound(b, sc, 0, integer, &hi, &ihi, path) < 0)
    {
        return -1;
    }
    if (lo.inf && hi.inf) {
        return -2;
    }
    if (integer) {
        /* an open side: 15 digits, as unbounded integers, or the int64
         * limit past the other bound */
        const int64_t m15 = 999999999999999LL;

        if (lo.inf) {
            ilo = ihi < -m15 ? INT64_MIN : -m15;
        }
        if (hi.inf) {
            ihi = ilo > m15 ? INT64_MAX : m15;
        }
        if (ilo > ihi) {
            return bfail(b, "no integer satisfies the bounds at %s%s", path,
                         "");
        }
        return r_int_range(b, ilo, ihi);
    }
    if (!lo.inf && !hi.inf
        && ((lo.neg && !hi.neg) ? 0
            : (!lo.neg && hi.neg) ? !(dec_is_zero(&lo) && dec_is_zero(&hi))
            : lo.neg ? dec_cmp_mag(&lo, &hi) < 0 : dec_cmp_mag(&lo, &hi) > 0))
    {
        return bfail(b, "no number satisfies the bounds at %s%s", path, "");
    }
    r = r_num_range(b, &lo, &hi);
    if (r == -2) {
        return bfail(b, "no number of at most 15 fraction digits satisfies "
                     "the bounds at %s%s", path, "");
    }
    return r;
}


#define GR_MAX_PRODUCT 200000    /* pattern states x lengths */

/*
 * A string whose content (between the quotes) the DFA accepts, of min..max
 * characters (max < 0: no limit): a rule per live (DFA state, characters
 * so far) pair, an alternative per successor (the bytes that lead there,
 * then its rule), and "" where the DFA accepts with at least min.  A byte
 * out of a state between two characters starts one; with no max, counts
 * stop at min.  Pairs that cannot reach acceptance within max are left
 * out, so no walk ends in a dead end.
 */
static int32_t
r_dfa_string(gbuild *b, const gr_dfa *d, int64_t min, int64_t max,
             const char *path)
{
    int64_t  K = max >= 0 ? max : min, P = (int64_t) d->n * (K + 1), E = 0;
    int32_t *tn = calloc(d->n + 1, sizeof(int32_t)), *tl = NULL, *tc = NULL;
    int32_t *id = NULL, *rhead = NULL, *rnext = NULL, *rfrom = NULL, *work;
    int32_t  nt = 0, r = -1, nid = 0;
    int64_t  nw = 0;
    uint8_t *live = NULL;
    gsym     s[3];

    if (P > GR_MAX_PRODUCT) {
        free(tn);
        return bfail(b, "'pattern' or 'format' with these lengths is too "
                     "large at %s%s", path, "");
    }
    /* each state's successors and the class of bytes to each */
    tl = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    tc = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    if (tn == NULL || tl == NULL || tc == NULL) {
        goto oom;
    }
    for (int32_t q = 0; q < d->n && !b->failed; q++) {
        const int32_t *nx = d->next + (int64_t) q * 256;
        uint8_t        done[256];

        tn[q] = nt;
        memset(done, 0, sizeof(done));
        for (int c = 0; c < 256; c++) {
            uint32_t set[8] = {0};

            if (nx[c] < 0 || done[c]) {
                continue;
            }
            for (int k = c; k < 256; k++) {
                if (nx[k] == nx[c]) {
                    set[k >> 5] |= 1u << (k & 31);
                    done[k] = 1;
                }
            }
            tl[nt] = nx[c];
            tc[nt++] = cls_new(b, set);
        }
    }
    tn[d->n] = nt;
    /* the pairs that reach acceptance: backwards from the accepting ones */
#define PAIR(q, k) ((int64_t) (q) * (K + 1) + (k))
#define NEXT_K(q, k) (d->mid[q] ? (k) : max < 0 && (k) == K ? (k) : (k) + 1)
    live = calloc(P, 1);
    id = malloc(P * sizeof(int32_t));
    rhead = malloc(P * sizeof(int32_t));
    rnext = malloc((int64_t) nt * (K + 1) * sizeof(int32_t));
    rfrom = malloc((int64_t) nt * (K + 1) * sizeof(int32_t));
    if (!live || !id || !rhead || !rnext || !rfrom) {
        goto oom;
    }
    work = id;               /* a worklist first, the rule ids after */
    for (int64_t p = 0; p < P; p++) {
        rhead[p] = -1;
    }
    for (int32_t q = 0; q < d->n; q++) {
        for (int64_t k = 0; k <= K; k++) {
            int64_t k2 = NEXT_K(q, k);

            for (int32_t t = tn[q]; t < tn[q + 1] && k2 <= K; t++) {
                int64_t to = PAIR(tl[t], k2);

                rfrom[E] = (int32_t) PAIR(q, k);
                rnext[E] = rhead[to];
                rhead[to] = (int32_t) E++;
            }
            if (d->accept[q] && k >= min) {
                live[PAIR(q, k)] = 1;
                work[nw++] = (int32_t) PAIR(q, k);
            }
        }
    }
    while (nw > 0) {
        int32_t p = work[--nw];

        for (int32_t e = rhead[p]; e >= 0; e = rnext[e]) {
            if (!live[rfrom[e]]) {
                live[rfrom[e]] = 1;
                work[nw++] = rfrom[e];
            }
        }
    }
    if (!live[PAIR(0, 0)]) {
        r = bfail(b, "no string of the lengths allowed matches 'pattern' or "
                  "'format' at %s%s", path, "");
        goto done;
    }
    /* a rule per live pair */
    for (int64_t p = 0; p < P; p++) {
        id[p] = live[p] ? rule_new(b) : -1;
        nid += live[p];
    }
    for (int32_t q = 0; q < d->n && !b->failed; q++) {
        for (int64_t k = 0; k <= K; k++) {
            int64_t k2 = NEXT_K(q, k);

            if (!live[PAIR(q, k)]) {
                continue;
            }
            if (d->accept[q] && k >= min) {
                alt_add(b, id[PAIR(q, k)], NULL, 0);
            }
            for (int32_t t = tn[q]; t < tn[q + 1] && k2 <= K; t++) {
                if (live[PAIR(tl[t], k2)]) {
                    s[0] = (gsym) { SYM_CLASS, tc[t] };
                    s[1] = S_ref(id[PAIR(tl[t], k2)]);
                    alt_add(b, id[PAIR(q, k)], s, 2);
                }
            }
        }
    }
#undef PAIR
#undef NEXT_K
    r = rule_new(b);
    s[0] = S_ch(b, '"');
    s[1] = S_ref(id[0]);
    s[2] = s[0];
    alt_add(b, r, s, 3);
    r = b->failed ? -1 : r;
    goto done;
oom:
    r = bfail(b, "out of memory%s%s", "", "");
done:
    free(tn); free(tl); free(tc); free(live); free(id); free(rhead);
    free(rnext); free(rfrom);
    return r;
}


/* formats JSON Schema defines that are not supported: refused, since a
 * validator may assert them; any other format is an annotation */
static const char *const gr_formats_refused[] = {
    "duration", "idn-email", "hostname", "idn-hostname", "uri-reference",
    "iri", "iri-reference", "uri-template", "json-pointer",
    "relative-json-pointer", "regex", NULL
};


/* a string with pattern or format (or -2 when it has neither) */
static int32_t
compile_string_pattern(gbuild *b, json_t *sc, const char *path)
{
    json_t     *pat = json_object_get(sc, "pattern"),
               *fmt = json_object_get(sc, "format");
    const char *p = NULL;
    size_t      plen = 0;
    gr_dfa      d;
    char        msg[200];
    int32_t     r;
    int64_t     min = 0, max = -1;

    if (pat != NULL && !json_is_string(pat)) {
        return bfail(b, "'pattern' at %s%s must be a string", path, "");
    }
    if (fmt != NULL && !json_is_string(fmt)) {
        return bfail(b, "'format' at %s%s must be a string", path, "");
    }
    if (fmt != NULL) {
        const char *f = json_string_value(fmt);

        for (int i = 0; gr_formats_refused[i]; i++) {
            if (strcmp(f, gr_formats_refused[i]) == 0) {
                return bfail(b, "unsupported format '%s' at %s (supported: "
                             "date, time, date-time, email, uri, ipv4, "
                             "ipv6, uuid)", f, path);
            }
        }
        p = gr_format_pattern(f);
        if (p == NULL) {
            fmt = NULL;      /* an annotation */
        } else {
            plen = strlen(p);
        }
    }
    if (pat == NULL && fmt == NULL) {
        return -2;
    }
    if (pat != NULL && fmt != NULL) {
        return bfail(b, "'pattern' with 'format' at %s%s is not supported",
                     path, "");
    }
    if (get_count(b, sc, "minLength", &min, path) < 0
        || get_count(b, sc, "maxLength", &max, path) < 0)
    {
        return -1;
    }
    if (max >= 0 && max < min) {
        return bfail(b, "maxLength < minLength at %s%s", path, "");
    }
    if (pat != NULL) {
        p = json_string_value(pat);
        plen = json_string_length(pat);
    }
    if (gr_regex_dfa(p, plen, &d, msg, sizeof(msg)) < 0) {
        return bfail(b, "%s at %s", msg, path);
    }
    r = r_dfa_string(b, &d, min, max, path);
    gr_dfa_free(&d);
    return r;
}


static int32_t
compile_type(gbuild *b, json_t *sc, const char *type, const char *path,
             int depth)
{
    char sub[512];

    if (strcmp(type, "object") == 0) {
        return compile_object(b, sc, path, depth);
    }
    if (strcmp(type, "array") == 0) {
        json_t *items = json_object_get(sc, "items");
        int64_t min = 0, max = -1;
        int32_t v = -1;

        if (get_count(b, sc, "minItems", &min, path) < 0
            || get_count(b, sc, "maxItems", &max, path) < 0)
        {
            return -1;
        }
        if (max >= 0 && max < min) {
            return bfail(b, "maxItems < minItems at %s%s", path, "");
        }
        if (items != NULL) {
            if (!json_is_object(items)) {
                return bfail(b, "'items' at %s%s must be a schema (tuple "
                             "items are not supported)", path, "");
            }
            path_join(sub, sizeof(sub), path, "items", NULL);
            v = compile_schema(b, items, sub, depth + 1);
            if (v < 0) {
                return -1;
            }
        }
        return r_array(b, v, min, max);
    }
    if (strcmp(type, "string") == 0) {
        int64_t     min = 0, max = -1;
        int32_t     r = compile_string_pattern(b, sc, path);

        if (r != -2) {
            return r;
        }
        if (get_count(b, sc, "minLength", &min, path) < 0
            || get_count(b, sc, "maxLength", &max, path) < 0)
        {
            return -1;
        }
        if (max >= 0 && max < min) {
            return bfail(b, "maxLength < minLength at %s%s", path, "");
        }
        return r_string(b, min, max);
    }
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        int     integer = type[0] == 'i';
        int32_t r = compile_bounds(b, sc, integer, path);

        if (r != -2) {
            return r;
        }
        return integer ? r_integer(b) : r_number(b);
    }
    if (strcmp(type, "boolean") == 0) {
        int32_t r = rule_new(b);
        gsym    s;

        s = S_ref(rule_literal(b, "true", 4));
        alt_add(b, r, &s, 1);
        s = S_ref(rule_literal(b, "false", 5));
        alt_add(b, r, &s, 1);
        return b->failed ? -1 : r;
    }
    if (strcmp(type, "null") == 0) {
        return rule_literal(b, "null", 4);
    }
    return bfail(b, "unsupported type '%s' at %s", type, path);
}


static int32_t
compile_schema(gbuild *b, json_t *sc, const char *path, int depth)
{
    const char *key;
    json_t     *val, *v;
    char        sub[512];

    if (b->failed) {
        return -1;
    }
    if (depth > 64) {
        return bfail(b, "the schema nests too deep at %s%s", path, "");
    }
    if (json_is_true(sc)) {
        return r_value_any(b);
    }
    if (!json_is_object(sc)) {
        return bfail(b, "the schema at %s%s must be an object", path, "");
    }
    json_object_foreach(sc, key, val) {
        if (!known_key(key)) {
            return bfail(b, "unsupported keyword '%s' at %s", key, path);
        }
    }
    if ((v = json_object_get(sc, "$ref")) != NULL) {
        if (!json_is_string(v)) {
            return bfail(b, "'$ref' at %s%s must be a string", path, "");
        }
        return ref_rule(b, json_string_value(v), path);
    }
    if ((v = json_object_get(sc, "const")) != NULL) {
        path_join(sub, sizeof(sub), path, "const", NULL);
        return rule_json_literal(b, v, sub);
    }
    if ((v = json_object_get(sc, "enum")) != NULL) {
        int32_t r;

        if (!json_is_array(v) || json_array_size(v) == 0) {
            return bfail(b, "'enum' at %s%s must be a non-empty array",
                         path, "");
        }
        r = rule_new(b);
        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            gsym s;

            path_join(sub, sizeof(sub), path, "enum", NULL);
            s = S_ref(rule_json_literal(b, json_array_get(v, i), sub));
            alt_add(b, r, &s, 1);
        }
        return b->failed ? -1 : r;
    }
    if ((v = json_object_get(sc, "anyOf")) != NULL) {
        int32_t r;

        if (!json_is_array(v) || json_array_size(v) == 0) {
            return bfail(b, "'anyOf' at %s%s must be a non-empty array",
                         path, "");
        }
        r = rule_new(b);
        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            char idx[24];
            gsym s;

            snprintf(idx, sizeof(idx), "%zu", i);
            path_join(sub, sizeof(sub), path, "anyOf", idx);
            s = S_ref(compile_schema(b, json_array_get(v, i), sub,
                                     depth + 1));
            alt_add(b, r, &s, 1);
        }
        return b->failed ? -1 : r;
    }
    v = json_object_get(sc, "type");
    if (v == NULL) {
        static const char *const typed[] = {
            "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "minLength", "maxLength", "pattern", "format", "minItems",
            "maxItems", "items", NULL
        };

        if (json_object_get(sc, "properties") != NULL) {
            return compile_object(b, sc, path, depth);
        }
        /* a bound on one type without a type: the value would be any
         * value, the bound unenforced */
        for (int i = 0; typed[i]; i++) {
            if (json_object_get(sc, typed[i]) != NULL) {
                return bfail(b, "'%s' at %s needs a 'type'", typed[i], path);
            }
        }
        return r_value_any(b);
    }
    if (json_is_string(v)) {
        return compile_type(b, sc, json_string_value(v), path, depth);
    }
    if (json_is_array(v) && json_array_size(v) > 0) {
        int32_t r = rule_new(b);

        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            json_t *t = json_array_get(v, i);
            gsym    s;

            if (!json_is_string(t)) {
                return bfail(b, "'type' at %s%s must hold strings", path, "");
            }
            s = S_ref(compile_type(b, sc, json_string_value(t), path, depth));
            alt_add(b, r, &s, 1);
        }
        return b->failed ? -1 : r;
    }
    return bfail(b, "'type' at %s%s must be a string or an array", path, "");
}


static void
build_free(gbuild *b)
{
    for (int32_t i = 0; !b->dry && i < b->n_rules; i++) {
        for (int32_t j = 0; j < b->rules[i].n_alt; j++) {
            free(b->rules[i].alt[j]);
        }
        free(b->rules[i].alt);
        free(b->rules[i].alt_len);
    }
    free(b->rules);
    free(b->cls);
    for (int32_t i = 0; i < b->n_refs; i++) {
        free(b->refs[i].ref);
    }
    free(b->refs);
    json_decref(b->ref_map);
    json_decref(b->lit_map);
}


/* ---- the grammar's recursion, checked ---- */

/*
 * The name of a $ref rule for a message ("#" where r is none's).
 */
static const char *
ref_name(const gbuild *b, int32_t r)
{
    for (int32_t i = 0; i < b->n_refs; i++) {
        if (b->refs[i].rule == r) {
            return b->refs[i].ref;
        }
    }
    return NULL;
}


/*
 * Marks the rules that derive something: when `nullable`, the empty string
 * (an alternative of references to nullable rules only); otherwise some
 * finite string of bytes (productive: an alternative whose references are
 * all productive).  A work list over the alternatives, each with the count
 * of its references not yet marked, so it is linear in the grammar's size
 * (a fixpoint by passes would be quadratic on a chain of 4096 rules).
 * 0, or -1 out of memory.
 */
static int
mark_rules(const gbuild *b, int nullable, uint8_t *mark)
{
    int64_t  n_alts = 0, n_occ = 0, k;
    int32_t *alt_rule, *cnt, *occ_first, *occ, *queue, nq = 0;
    int64_t *alt_base;
    int      rc = -1;

    for (int32_t r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alt;
        for (int32_t a = 0; a < b->rules[r].n_alt; a++) {
            n_occ += b->rules[r].alt_len[a];
        }
    }
    alt_rule = malloc((n_alts + 1) * sizeof(int32_t));
    cnt = malloc((n_alts + 1) * sizeof(int32_t));
    alt_base = malloc((b->n_rules + 1) * sizeof(int64_t));
    occ_first = calloc(b->n_rules + 2, sizeof(int32_t));
    occ = malloc((n_occ + 1) * sizeof(int32_t));
    queue = malloc((b->n_rules + 1) * sizeof(int32_t));
    if (!alt_rule || !cnt || !alt_base || !occ_first || !occ || !queue) {
        goto done;
    }
    memset(mark, 0, b->n_rules);
    /* the occurrences of each rule in alternatives, grouped by rule */
    k = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        alt_base[r] = k;
        for (int32_t a = 0; a < b->rules[r].n_alt; a++, k++) {
            alt_rule[k] = r;
            cnt[k] = 0;
            for (int32_t i = 0; i < b->rules[r].alt_len[a]; i++) {
                const gsym *y = &b->rules[r].alt[a][i];

                if (y->kind == SYM_REF) {
                    cnt[k]++;
                    occ_first[y->arg + 1]++;
                } else if (nullable) {
                    cnt[k] = -1;         /* a byte: never empty */
                    break;
                }
            }
        }
    }
    for (int32_t r = 0; r < b->n_rules; r++) {
        occ_first[r + 1] += occ_first[r];
    }
    {
        int32_t *fill = calloc(b->n_rules + 1, sizeof(int32_t));

        if (fill == NULL) {
            goto done;
        }
        for (int32_t r = 0; r < b->n_rules; r++) {
            for (int32_t a = 0; a < b->rules[r].n_alt; a++) {
                if (cnt[alt_base[r] + a] < 0) {
                    continue;
                }
                for (int32_t i = 0; i < b->rules[r].alt_len[a]; i++) {
                    const gsym *y = &b->rules[r].alt[a][i];

                    if (y->kind == SYM_REF) {
                        occ[occ_first[y->arg] + fill[y->arg]++] =
                            (int32_t) (alt_base[r] + a);
                    }
                }
            }
        }
        /* an alternative cut short by a byte (nullable) lists fewer
         * occurrences than occ_first made room for: those slots hold -1 */
        for (int32_t r = 0; r < b->n_rules; r++) {
            for (int32_t j = occ_first[r] + fill[r]; j < occ_first[r + 1];
                 j++)
            {
                occ[j] = -1;
            }
        }
        free(fill);
    }
    for (k = 0; k < n_alts; k++) {
        if (cnt[k] == 0 && !mark[alt_rule[k]]) {
            mark[alt_rule[k]] = 1;
            queue[nq++] = alt_rule[k];
        }
    }
    while (nq > 0) {
        int32_t r = queue[--nq];

        for (int32_t j = occ_first[r]; j < occ_first[r + 1]; j++) {
            int32_t a = occ[j];

            if (a < 0 || cnt[a] <= 0) {
                continue;
            }
            if (--cnt[a] == 0 && !mark[alt_rule[a]]) {
                mark[alt_rule[a]] = 1;
                queue[nq++] = alt_rule[a];
            }
        }
    }
    rc = 0;
done:
    free(alt_rule);
    free(cnt);
    free(alt_base);
    free(occ_first);
    free(occ);
    free(queue);
    return rc;
}


/*
 * Refuses (bfail) a grammar the automaton could not run:
 * - left recursion: a rule that can reach itself before any byte, through
 *   references at the start of alternatives or after nullable ones (e.g.
 *   {"anyOf": [{"$ref": "#"}, ...]}, or a -> b -> a through $defs).
 *   Expanding it would never produce a byte: the engine would loop.
 * - recursion that never ends: a rule reachable from the root that derives
 *   no finite value (e.g. {"$ref": "#"}, or an object that requires itself),
 *   where a model could start a value it can never complete.
 * Linear in the grammar's size: mark_rules, then an iterative depth-first
 * search of the left-corner graph.
 */
static int
grammar_check(gbuild *b, int32_t root)
{
    uint8_t *nul = NULL, *prod = NULL, *color = NULL;
    int32_t *stk_r = NULL, *stk_a = NULL, *stk_i = NULL;
    int32_t  sp;
    int      rc = -1;

    if (b->failed || b->dry || b->n_rules == 0) {
        return b->failed ? -1 : 0;
    }
    nul = malloc(b->n_rules);
    prod = malloc(b->n_rules);
    color = calloc(b->n_rules, 1);
    stk_r = malloc(b->n_rules * sizeof(int32_t));
    stk_a = malloc(b->n_rules * sizeof(int32_t));
    stk_i = malloc(b->n_rules * sizeof(int32_t));
    if (!nul || !prod || !color || !stk_r || !stk_a || !stk_i
        || mark_rules(b, 1, nul) < 0 || mark_rules(b, 0, prod) < 0)
    {
        bfail(b, "out of memory%s%s", "", "");
        goto done;
    }
    /* left recursion: a cycle of left-corner edges, found by depth-first
     * search from every rule (color 1: on the current path, 2: done; each
     * rule is pushed once, so the stack holds at most n_rules) */
    for (int32_t start = 0; start < b->n_rules; start++) {
        if (color[start] != 0) {
            continue;
        }
        sp = 0;
        stk_r[0] = start;
        stk_a[0] = 0;
        stk_i[0] = 0;
        color[start] = 1;
        while (sp >= 0) {
            int32_t r = stk_r[sp], a = stk_a[sp], i = stk_i[sp];
            brule  *ru = &b->rules[r];

            if (a >= ru->n_alt) {
                color[r] = 2;
                sp--;
                continue;
            }
            if (i >= ru->alt_len[a]
                || (i > 0 && (ru->alt[a][i - 1].kind != SYM_REF
                              || !nul[ru->alt[a][i - 1].arg])))
            {
                /* past the left corner of this alternative */
                stk_a[sp]++;
                stk_i[sp] = 0;
                continue;
            }
            stk_i[sp]++;
            if (ru->alt[a][i].kind != SYM_REF) {
                stk_a[sp]++;
                stk_i[sp] = 0;
                continue;
            }
            {
                int32_t s = ru->alt[a][i].arg;

                if (color[s] == 1) {
                    const char *nm = ref_name(b, s);

                    for (int32_t j = sp; nm == NULL && j >= 0; j--) {
                        nm = ref_name(b, stk_r[j]);
                    }
                    bfail(b, "the schema recurses without producing "
                          "anything (left recursion through $ref '%s')%s",
                          nm ? nm : "#", "");
                    goto done;
                }
                if (color[s] == 0) {
                    color[s] = 1;
                    sp++;
                    stk_r[sp] = s;
                    stk_a[sp] = 0;
                    stk_i[sp] = 0;
                }
            }
        }
    }
    /* every rule reachable from the root derives a finite value (each
     * rule is pushed once, so the stack holds at most n_rules) */
    memset(color, 0, b->n_rules);
    sp = 0;
    stk_r[sp++] = root;
    color[root] = 1;
    while (sp > 0) {
        int32_t r = stk_r[--sp];

        if (!prod[r]) {
            const char *nm = ref_name(b, r);

            bfail(b, "the schema recurses without end (%s%s can never "
                  "complete)", nm ? "$ref " : "a value", nm ? nm : "");
            goto done;
        }
        for (int32_t a = 0; a < b->rules[r].n_alt; a++) {
            for (int32_t i = 0; i < b->rules[r].alt_len[a]; i++) {
                const gsym *y = &b->rules[r].alt[a][i];

                if (y->kind == SYM_REF && color[y->arg] == 0) {
                    color[y->arg] = 1;
                    stk_r[sp++] = y->arg;
                }
            }
        }
    }
    rc = 0;
done:
    free(nul);
    free(prod);
    free(color);
    free(stk_r);
    free(stk_a);
    free(stk_i);
    return rc;
}


/* Compiles into b; the root rule, or -1 with b->err. */
static int32_t
build_grammar(gbuild *b, int kind, json_t *schema, int dry, char *err,
              size_t errlen)
{
    int32_t root;

    memset(b, 0, sizeof(*b));
    b->dry = dry;
    b->ws = b->strchar = b->string_any = b->value_any = b->object_any = -1;
    b->array_any = b->number = b->integer = b->digit_cls = -1;
    b->err = err;
    b->errlen = errlen;
    if (kind == NALAR_GRAMMAR_JSON_OBJECT) {
        root = r_value_any(b);
        root = b->object_any;
    } else {
        b->root_schema = schema;
        root = compile_schema(b, schema, "#", 0);
        /* the $ref targets, which may add more */
        for (int32_t i = 0; i < b->n_refs && !b->failed; i++) {
            int32_t t;
            gsym    s;

            if (b->refs[i].done) {
                continue;
            }
            b->refs[i].done = 1;
            t = compile_schema(b, b->refs[i].schema, b->refs[i].ref, 1);
            s = S_ref(t);
            alt_add(b, b->refs[i].rule, &s, 1);
        }
    }
    if (b->failed || root < 0) {
        if (!b->failed && errlen) {
            snprintf(err, errlen, "the schema cannot be compiled");
        }
        return -1;
    }
    /* a rule with no alternative could never match */
    for (int32_t i = 0; !b->dry && i < b->n_rules; i++) {
        if (b->rules[i].n_alt == 0) {
            snprintf(err, errlen, "the schema cannot be compiled (an empty "
                     "rule)");
            return -1;
        }
    }
    if (grammar_check(b, root) < 0) {
        return -1;
    }
    return root;
}


int
nalar_schema_check(const char *schema_json, size_t len, char *err,
                   size_t errlen)
{
    json_error_t je;
    json_t      *sc;
    gbuild       b;
    int32_t      root;

    if (errlen) {
        err[0] = '\0';
    }
    sc = json_loadb(schema_json, len, JSON_REJECT_DUPLICATES, &je);
    if (sc == NULL) {
        snprintf(err, errlen, "the schema is not JSON: %s", je.text);
        return -1;
    }
    /* built for real (not dry), so that its recursion is checked here,
     * at parse time: the cost is bounded by GR_MAX_SYMS like a compile's */
    root = build_grammar(&b, NALAR_GRAMMAR_JSON_SCHEMA, sc, 0, err, errlen);
    build_free(&b);
    json_decref(sc);
    return root < 0 ? -1 : 0;
}


/* ---- the compiled grammar and its states ---- */

static void
grammar_free(nalar_grammar *g)
{
    if (g == NULL) {
        return;
    }
    for (int32_t i = 0; i < g->n_st; i++) {
        free(g->st[i].next);
        free(g->st[i].mask);
    }
    free(g->st);
    free(g->zero);
    free(g->pool);
    free(g->ht);
    free(g->scr);
    free(g->ord);
    free(g->wk);
    free(g->wk_ht);
    free(g->wk_ep);
    free(g->sym);
    free(g->cls);
    free(g->rule_alts);
    free(g->rule_nalts);
    free(g->alts);
    free(g->canon);
    free(g);
}


/* Flattens the builder's rules into g. */
static int
grammar_flatten(nalar_grammar *g, gbuild *b, int32_t root)
{
    int32_t n_alts = 0, pos = 0, ai = 0;

    for (int32_t i = 0; i < b->n_rules; i++) {
        n_alts += b->rules[i].n_alt;
    }
    g->sym = malloc((b->n_syms + 1) * sizeof(gsym));
    g->alts = malloc((n_alts + 1) * sizeof(int32_t));
    g->rule_alts = malloc((b->n_rules + 1) * sizeof(int32_t));
    g->rule_nalts = malloc((b->n_rules + 1) * sizeof(int32_t));
    g->cls = malloc((b->n_cls + 1) * 32);
    if (!g->sym || !g->alts || !g->rule_alts || !g->rule_nalts || !g->cls) {
        return -1;
    }
    if (b->n_cls > 0) {
        memcpy(g->cls, b->cls, b->n_cls * 32);
    }
    g->n_cls = b->n_cls;
    for (int32_t i = 0; i < b->n_rules; i++) {
        g->rule_alts[i] = ai;
        g->rule_nalts[i] = b->rules[i].n_alt;
        for (int32_t j = 0; j < b->rules[i].n_alt; j++) {
            g->alts[ai++] = pos;
            if (b->rules[i].alt_len[j] > 0) {
                memcpy(&g->sym[pos], b->rules[i].alt[j],
                       b->rules[i].alt_len[j] * sizeof(gsym));
            }
            pos += b->rules[i].alt_len[j];
            g->sym[pos++] = (gsym) { SYM_END, 0 };
        }
    }
    g->n_sym = pos;
    g->n_alts = ai;
    g->n_rules = b->n_rules;
    g->root = root;
    return 0;
}


static uint32_t
hash_step(uint32_t h, uint32_t v)
{
    h ^= v;
    h *= 16777619u;
    return h ^ (h >> 15);
}


static uint32_t
hash_ints(const int32_t *v, int32_t n)
{
    uint32_t h = 2166136261u;

    for (int32_t i = 0; i < n; i++) {
        h = hash_step(h, (uint32_t) v[i]);
    }
    return h;
}


static int
scr_reserve(nalar_grammar *g, int64_t extra)
{
    if (g->n_scr + extra > g->cap_scr) {
        int64_t  nc = g->cap_scr ? g->cap_scr : 1024;
        int32_t *nv;

        while (nc < g->n_scr + extra) {
            nc *= 2;
        }
        nv = realloc(g->scr, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -1;
        }
        g->scr = nv;
        g->cap_scr = nc;
    }
    return 0;
}


static int
scr_push(nalar_grammar *g, int32_t v)
{
    if (scr_reserve(g, 1) < 0) {
        return -1;
    }
    g->scr[g->n_scr++] = v;
    return 0;
}


/*
 * Counts n stack words against the call's budget: 0, or -1 (with g->why)
 * past GR_MAX_CALL_WORK, so that no schema makes one mask or token cost
 * more than a bounded time.
 */
static int
call_work(nalar_grammar *g, int64_t n)
{
    g->call_work += n;
    if (g->call_work > GR_MAX_CALL_WORK) {
        g->why = "the grammar is too ambiguous here (one step passes its "
                 "work budget)";
        return -1;
    }
    return 0;
}


/* ---- expansion: an explicit work list, each distinct stack once ---- */

/* Starts an expansion: the work list and its set emptied. */
static void
xp_begin(nalar_grammar *g)
{
    g->n_wk = 0;
    g->wk_used = 0;
    if (++g->epoch == 0) {
        /* the epoch wrapped: every slot must read as empty again */
        if (g->wk_ep != NULL) {
            memset(g->wk_ep, 0, g->wk_ht_cap * sizeof(uint32_t));
        }
        g->epoch = 1;
    }
}


static int
xp_grow_set(nalar_grammar *g)
{
    int64_t   nc = g->wk_ht_cap ? g->wk_ht_cap * 2 : 1024;
    int64_t  *nh = malloc(nc * sizeof(int64_t));
    uint32_t *ne = calloc(nc, sizeof(uint32_t));

    if (nh == NULL || ne == NULL) {
        free(nh);
        free(ne);
        return -1;
    }
    for (int64_t k = 0; k < g->wk_ht_cap; k++) {
        int64_t o, j;

        if (g->wk_ep[k] != g->epoch) {
            continue;
        }
        o = g->wk_ht[k];
        j = hash_ints(&g->wk[o], g->wk[o] + 1) & (nc - 1);
        while (ne[j] == g->epoch) {
            j = (j + 1) & (nc - 1);
        }
        nh[j] = o;
        ne[j] = g->epoch;
    }
    free(g->wk_ht);
    free(g->wk_ep);
    g->wk_ht = nh;
    g->wk_ep = ne;
    g->wk_ht_cap = nc;
    return 0;
}


/*
 * Adds the stack stk[0..n) to the work list unless it is there already:
 * 0, -1 out of memory, -3 past the transition's budget (g->why).
 */
static int
xp_add(nalar_grammar *g, const int32_t *stk, int32_t n)
{
    uint32_t h;
    int64_t  k;

    if (g->n_wk + n + 1 > GR_MAX_WORK) {
        g->why = "the grammar is too ambiguous here (one transition passes "
                 "its expansion budget)";
        return -3;
    }
    if ((g->wk_used + 1) * 2 > g->wk_ht_cap && xp_grow_set(g) < 0) {
        return -1;
    }
    /* the hash of the run [n, stk...], as xp_grow_set hashes it */
    h = hash_step(2166136261u, (uint32_t) n);
    for (int32_t i = 0; i < n; i++) {
        h = hash_step(h, (uint32_t) stk[i]);
    }
    for (k = h & (g->wk_ht_cap - 1); g->wk_ep[k] == g->epoch;
         k = (k + 1) & (g->wk_ht_cap - 1))
    {
        const int32_t *o = &g->wk[g->wk_ht[k]];

        if (o[0] == n && (n == 0 || memcmp(o + 1, stk, n * sizeof(int32_t))
                                    == 0))
        {
            return 0;
        }
    }
    if (g->n_wk + n + 1 > g->cap_wk) {
        int64_t  nc = g->cap_wk ? g->cap_wk : 1024;
        int32_t *nv;

        while (nc < g->n_wk + n + 1) {
            nc *= 2;
        }
        nv = realloc(g->wk, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -1;
        }
        g->wk = nv;
        g->cap_wk = nc;
    }
    g->wk_ht[k] = g->n_wk;
    g->wk_ep[k] = g->epoch;
    g->wk_used++;
    g->wk[g->n_wk] = n;
    if (n > 0) {
        memcpy(&g->wk[g->n_wk + 1], stk, n * sizeof(int32_t));
    }
    g->n_wk += n + 1;
    return 0;
}


/*
 * Expands every stack on the work list until each top is a byte class,
 * appending the results to the scratch as [len, pos...] runs: 0, -1 out of
 * memory, -3 past a budget (g->why).  A reference's alternatives are added
 * to the list, never recursed into, so neither a long chain of optional
 * parts nor many paths to the same stack can exhaust the C stack or take
 * exponential time; the grammar has no left recursion (grammar_check), so
 * the list is finite.
 */
static int
xp_run(nalar_grammar *g)
{
    int32_t stk[GR_MAX_DEPTH + 2];

    for (int64_t off = 0; off < g->n_wk; off += g->wk[off] + 1) {
        int32_t n = g->wk[off], p;

        if (call_work(g, n + 1) < 0) {
            return -3;
        }
        /* the list may move as it grows: work on a copy */
        if (n > 0) {
            memcpy(stk, &g->wk[off + 1], n * sizeof(int32_t));
        }
        while (n > 0 && g->sym[stk[n - 1]].kind == SYM_END) {
            n--;
        }
        if (n == 0 || g->sym[stk[n - 1]].kind == SYM_CLASS) {
            if (scr_push(g, n) < 0) {
                return -1;
            }
            for (int32_t i = 0; i < n; i++) {
                if (scr_push(g, stk[i]) < 0) {
                    return -1;
                }
            }
            continue;
        }
        /* a reference: its return point (none for a tail call), then
         * each alternative's first position on top */
        p = stk[n - 1];
        {
            int32_t r = g->sym[p].arg, base = n - 1, rc;

            if (g->sym[p + 1].kind != SYM_END) {
                stk[base++] = p + 1;
            }
            if (base + 1 > GR_MAX_DEPTH) {
                continue;
            }
            for (int32_t a = 0; a < g->rule_nalts[r]; a++) {
                stk[base] = g->alts[g->rule_alts[r] + a];
                rc = xp_add(g, stk, base + 1);
                if (rc < 0) {
                    return rc;
                }
            }
        }
    }
    return 0;
}


static int
cmp_stack(const int32_t *a, const int32_t *b)
{
    if (a[0] != b[0]) {
        return a[0] < b[0] ? -1 : 1;
    }
    for (int32_t i = 1; i <= a[0]; i++) {
        if (a[i] != b[i]) {
            return a[i] < b[i] ? -1 : 1;
        }
    }
    return 0;
}


static int
cmp_stack_off(const void *x, const void *y, void *base)
{
    const int32_t *s = base;

    return cmp_stack(&s[*(const int64_t *) x], &s[*(const int64_t *) y]);
}


/* Counts n bytes against the automaton's budget: 0, or -1 past it. */
static int
gr_charge(nalar_grammar *g, size_t n)
{
    if (g->bytes + n > GR_MAX_BYTES) {
        g->why = "the grammar's automaton passes its memory budget";
        return -1;
    }
    g->bytes += n;
    return 0;
}


/*
 * Interns the stacks in the scratch from `from` on: the state id, -1 when
 * there are none, -2 out of memory or past a budget.  The stacks are
 * sorted by offset (offsets, not pointers: the scratch may move while the
 * state is written after them).
 */
static int32_t
intern(nalar_grammar *g, int64_t from)
{
    int64_t   n = 0, len = 0, i, start;
    int32_t   id;
    uint32_t  h;
    gstate   *st;

    for (i = from; i < g->n_scr; i += g->scr[i] + 1) {
        n++;
    }
    if (n == 0) {
        return -1;
    }
    if (n > g->cap_ord) {
        int64_t *nv = realloc(g->ord, n * sizeof(int64_t));

        if (nv == NULL) {
            return -2;
        }
        g->ord = nv;
        g->cap_ord = n;
    }
    n = 0;
    for (i = from; i < g->n_scr; i += g->scr[i] + 1) {
        g->ord[n++] = i;
    }
    /* room for the serialised state after the stacks */
    if (scr_reserve(g, g->n_scr - from) < 0) {
        return -2;
    }
    qsort_r(g->ord, n, sizeof(int64_t), cmp_stack_off, g->scr);
    start = g->n_scr;
    for (int64_t k = 0; k < n; k++) {
        const int32_t *sk = &g->scr[g->ord[k]];

        if (k > 0 && cmp_stack(&g->scr[g->ord[k - 1]], sk) == 0) {
            continue;
        }
        for (int32_t j = 0; j <= sk[0]; j++) {
            g->scr[g->n_scr++] = sk[j];
        }
    }
    len = g->n_scr - start;
    if (len > INT32_MAX / 2) {
        return -2;
    }
    h = hash_ints(&g->scr[start], (int32_t) len);
    /* look up */
    for (int64_t k = h & (g->ht_cap - 1);
         g->ht_cap > 0; k = (k + 1) & (g->ht_cap - 1))
    {
        int32_t e = g->ht[k];

        if (e == 0) {
            break;
        }
        st = &g->st[e - 1];
        if (st->hash == h && st->len == len
            && memcmp(&g->pool[st->off], &g->scr[start],
                      len * sizeof(int32_t)) == 0)
        {
            return e - 1;
        }
    }
    if (g->n_st >= GR_MAX_STATES || g->n_pool + len > INT32_MAX) {
        g->why = "the grammar's automaton passes its state budget";
        return -2;
    }
    if (gr_charge(g, len * sizeof(int32_t) + sizeof(gstate)
                     + 2 * sizeof(int32_t)) < 0)
    {
        return -2;
    }
    /* add */
    if (g->n_pool + len > g->cap_pool) {
        int64_t  nc = g->cap_pool ? g->cap_pool : 4096;
        int32_t *nv;

        while (nc < g->n_pool + len) {
            nc *= 2;
        }
        nv = realloc(g->pool, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -2;
        }
        g->pool = nv;
        g->cap_pool = nc;
    }
    if (g->n_st == g->cap_st) {
        int32_t nc = g->cap_st ? g->cap_st * 2 : 256;
        gstate *nv = realloc(g->st, nc * sizeof(gstate));

        if (nv == NULL) {
            return -2;
        }
        g->st = nv;
        g->cap_st = nc;
    }
    if ((int64_t) (g->n_st + 1) * 2 > g->ht_cap) {
        int64_t  nc = g->ht_cap ? g->ht_cap * 2 : 1024;
        int32_t *nh = calloc(nc, sizeof(int32_t));

        if (nh == NULL) {
            return -2;
        }
        for (int32_t s = 0; s < g->n_st; s++) {
            int64_t k = g->st[s].hash & (nc - 1);

            while (nh[k] != 0) {
                k = (k + 1) & (nc - 1);
            }
            nh[k] = s + 1;
        }
        free(g->ht);
        g->ht = nh;
        g->ht_cap = nc;
    }
    id = g->n_st++;
    st = &g->st[id];
    memset(st, 0, sizeof(*st));
    st->off = (int32_t) g->n_pool;
    st->len = len;
    st->hash = h;
    memcpy(&g->pool[g->n_pool], &g->scr[start], len * sizeof(int32_t));
    g->n_pool += len;
    {
        int64_t k = h & (g->ht_cap - 1);

        while (g->ht[k] != 0) {
            k = (k + 1) & (g->ht_cap - 1);
        }
        g->ht[k] = id + 1;
    }
    /* accepting, and the one allowed byte if there is one */
    {
        uint32_t any[8] = {0};
        int      cnt = 0, last = -1;

        st->forced = -1;
        st->forced_tok = -2;
        for (int32_t o = 0; o < len; o += g->pool[st->off + o] + 1) {
            int32_t sl = g->pool[st->off + o];

            if (sl == 0) {
                st->accepting = 1;
            } else {
                const uint32_t *c =
                    g->cls[g->sym[g->pool[st->off + o + sl]].arg];

                for (int w = 0; w < 8; w++) {
                    any[w] |= c[w];
                }
            }
        }
        for (int c = 0; c < 256; c++) {
            if (any[c >> 5] & (1u << (c & 31))) {
                cnt++;
                last = c;
            }
        }
        if (cnt == 1 && !st->accepting) {
            st->forced = (int16_t) last;
        }
    }
    return id;
}


/*
 * The state after byte c from state s: id, -1 refused, -2 out of memory or
 * past a budget (g->why; not cached, so a later call may try again).
 */
static int32_t
step_byte(nalar_grammar *g, int32_t s, int c)
{
    gstate *st = &g->st[s];
    int32_t r, off, len;

    if (st->next == NULL) {
        if (gr_charge(g, 256 * sizeof(int32_t)) < 0) {
            return -2;
        }
        st->next = malloc(256 * sizeof(int32_t));
        if (st->next == NULL) {
            g->bytes -= 256 * sizeof(int32_t);
            return -2;
        }
        for (int i = 0; i < 256; i++) {
            st->next[i] = -3;
        }
    }
    if (st->next[c] != -3) {
        return st->next[c];
    }
    off = st->off;
    len = st->len;
    if (call_work(g, len) < 0) {
        return -2;
    }
    g->n_scr = 0;
    xp_begin(g);
    for (int32_t o = 0; o < len; o += g->pool[off + o] + 1) {
        int32_t sl = g->pool[off + o], top;
        int32_t tmp[GR_MAX_DEPTH + 2];

        if (sl == 0) {
            continue;
        }
        top = g->pool[off + o + sl];
        if (!(g->cls[g->sym[top].arg][c >> 5] & (1u << (c & 31)))) {
            continue;
        }
        memcpy(tmp, &g->pool[off + o + 1], sl * sizeof(int32_t));
        tmp[sl - 1] = top + 1;
        if (xp_add(g, tmp, sl) < 0) {
            return -2;
        }
    }
    if (xp_run(g) < 0) {
        return -2;
    }
    r = intern(g, 0);
    if (r >= -1) {
        g->st[s].next[c] = r;     /* g->st may have moved */
    }
    return r;
}


static nalar_grammar *
grammar_compile(const gvocab *voc, int kind, json_t *schema, char *err,
                size_t errlen)
{
    gbuild         b;
    int32_t        root;
    nalar_grammar *g;
    int32_t        stk[1];

    root = build_grammar(&b, kind, schema, 0, err, errlen);
    if (root < 0) {
        build_free(&b);
        return NULL;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL || grammar_flatten(g, &b, root) < 0) {
        build_free(&b);
        grammar_free(g);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    build_free(&b);
    g->voc = voc;
    g->refs = 1;
    g->zero = calloc(voc->n_words + 1, sizeof(uint32_t));
    if (g->zero == NULL) {
        grammar_free(g);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* the start: the root rule's reference, expanded */
    {
        gsym *ns = realloc(g->sym, (g->n_sym + 2) * sizeof(gsym));

        if (ns == NULL) {
            grammar_free(g);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        g->sym = ns;
        g->sym[g->n_sym] = (gsym) { SYM_REF, root };
        g->sym[g->n_sym + 1] = (gsym) { SYM_END, 0 };
        stk[0] = g->n_sym;
        g->n_sym += 2;
    }
    g->base_bytes = sizeof(*g) + g->n_sym * sizeof(gsym) + g->n_cls * 32
                    + (g->n_rules * 2 + g->n_alts) * sizeof(int32_t)
                    + (voc->n_words + 1) * sizeof(uint32_t);
    g->n_scr = 0;
    xp_begin(g);
    if (xp_add(g, stk, 1) < 0 || xp_run(g) < 0
        || (g->start = intern(g, 0)) < 0)
    {
        snprintf(err, errlen, "the schema cannot be compiled (%s)",
                 g->why ? g->why : "out of memory, or it allows no value");
        grammar_free(g);
        return NULL;
    }
    return g;
}


/* ---- the vocabulary trie ---- */

static int
cmp_tok(const void *x, const void *y, void *voc)
{
    const gvocab *sv = voc;
    int32_t       a = *(const int32_t *) x, b = *(const int32_t *) y;
    int           la = sv->tok_len[a], lb = sv->tok_len[b];
    int           c = memcmp(sv->tok_bytes[a], sv->tok_bytes[b],
                             la < lb ? la : lb);

    if (c != 0) {
        return c;
    }
    if (la != lb) {
        return la < lb ? -1 : 1;
    }
    return a < b ? -1 : a > b;
}


/* The trie of the pieces, built from them in sorted order (each node's
 * children are then made in byte order, and tokens with one piece are
 * next to each other). */
static int
voc_build(gvocab *v, const nalar_tokenizer *tok)
{
    int32_t  n = nalar_tok_n_vocab(tok), cap_nodes = 1, n_toks = 0;
    int32_t  path[48], last_child[48];

    memset(v, 0, sizeof(*v));
    v->n_vocab = n;
    v->n_words = (n + 31) / 32;
    v->tok_len = calloc(n, 1);
    v->tok_bytes = calloc(n, 48);
    v->eog = calloc(n + 1, sizeof(int32_t));
    v->toks = malloc((n + 1) * sizeof(int32_t));
    if (!v->tok_len || !v->tok_bytes || !v->eog || !v->toks) {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        int len;

        if (nalar_tok_is_eog(tok, i)) {
            v->eog[v->n_eog++] = i;
            continue;
        }
        if (nalar_tok_is_control(tok, i)) {
            continue;
        }
        len = nalar_token_bytes(tok, i, v->tok_bytes[i], 47);
        if (len <= 0 || len > 47) {
            continue;
        }
        v->tok_len[i] = (uint8_t) len;
        v->toks[n_toks++] = i;
        cap_nodes += len;
    }
    /* the vocabulary goes to the comparator as its argument: engines
     * build their caches on their own threads at the same time */
    qsort_r(v->toks, n_toks, sizeof(int32_t), cmp_tok, v);
    v->nodes = malloc(cap_nodes * sizeof(tnode));
    if (v->nodes == NULL) {
        return -1;
    }
    v->nodes[0] = (tnode) { -1, -1, 0, 0, 0 };
    v->n_nodes = 1;
    path[0] = 0;
    last_child[0] = -1;
    {
        int32_t prev = -1;

        for (int32_t k = 0; k < n_toks; k++) {
            int32_t id = v->toks[k];
            int     len = v->tok_len[id], lcp = 0;
            int32_t nd;

            if (prev >= 0) {
                int pl = v->tok_len[prev];

                while (lcp < len && lcp < pl
                       && v->tok_bytes[prev][lcp] == v->tok_bytes[id][lcp])
                {
                    lcp++;
                }
            }
            /* path[0..lcp] are shared; make the nodes below */
            for (int j = lcp; j < len; j++) {
                nd = v->n_nodes++;
                v->nodes[nd] = (tnode) { -1, -1, k, 0,
                                         (uint8_t) v->tok_bytes[id][j] };
                if (v->nodes[path[j]].first_child < 0) {
                    v->nodes[path[j]].first_child = nd;
                } else {
                    v->nodes[last_child[j]].next_sibling = nd;
                }
                last_child[j] = nd;
                path[j + 1] = nd;
                last_child[j + 1] = -1;
            }
            nd = path[len];
            if (v->nodes[nd].n_toks == 0) {
                v->nodes[nd].first_tok = k;
            }
            v->nodes[nd].n_toks++;
            prev = id;
        }
    }
    return 0;
}


static void
voc_free(gvocab *v)
{
    free(v->nodes);
    free(v->toks);
    free(v->eog);
    free(v->tok_len);
    free(v->tok_bytes);
}


static int
trie_check(const gvocab *v, int32_t node, char *path, int depth,
           int32_t *seen)
{
    int bad = 0, prev = -1;

    for (int32_t t = 0; t < v->nodes[node].n_toks; t++) {
        int32_t id = v->toks[v->nodes[node].first_tok + t];

        seen[id]++;
        bad += v->tok_len[id] != depth
               || memcmp(v->tok_bytes[id], path, depth) != 0;
    }
    for (int32_t c = v->nodes[node].first_child; c >= 0;
         c = v->nodes[c].next_sibling)
    {
        bad += v->nodes[c].byte <= prev || depth >= 47;
        prev = v->nodes[c].byte;
        if (depth < 47) {
            path[depth] = (char) v->nodes[c].byte;
            bad += trie_check(v, c, path, depth + 1, seen);
        }
    }
    return bad;
}


int
nalar_grammar_cache_check(const nalar_grammar_cache *c)
{
    const gvocab *v = &c->voc;
    char          path[48];
    int32_t      *seen = calloc(v->n_vocab, sizeof(int32_t));
    int           bad;

    if (seen == NULL) {
        return -1;
    }
    bad = trie_check(v, 0, path, 0, seen);
    for (int32_t id = 0; id < v->n_vocab; id++) {
        bad += seen[id] != (v->tok_len[id] > 0);
    }
    free(seen);
    return bad;
}


/* ---- masks ---- */

static int
mask_walk(nalar_grammar *g, int32_t node, int32_t s, uint32_t *mask)
{
    const gvocab *v = g->voc;

    for (int32_t c = v->nodes[node].first_child; c >= 0;
         c = v->nodes[c].next_sibling)
    {
        const tnode *cn = &v->nodes[c];
        int32_t      s2 = step_byte(g, s, cn->byte);

        if (s2 == -2) {
            return -1;
        }
        if (s2 < 0) {
            continue;
        }
        for (int32_t t = 0; t < cn->n_toks; t++) {
            int32_t id = v->toks[cn->first_tok + t];

            mask[id >> 5] |= 1u << (id & 31);
        }
        if (cn->first_child >= 0 && mask_walk(g, c, s2, mask) < 0) {
            return -1;
        }
    }
    return 0;
}


static const uint32_t *
state_mask(nalar_grammar *g, int32_t s)
{
    uint32_t *m;

    if (g->st[s].mask != NULL) {
        return g->st[s].mask;
    }
    if (gr_charge(g, g->voc->n_words * sizeof(uint32_t)) < 0) {
        return NULL;
    }
    m = calloc(g->voc->n_words, sizeof(uint32_t));
    if (m == NULL) {
        g->bytes -= g->voc->n_words * sizeof(uint32_t);
        return NULL;
    }
    if (forced_tok(g, s) >= 0) {
        /* where the bytes are forced, so is their tokenization */
        int32_t id = forced_tok(g, s);

        m[id >> 5] |= 1u << (id & 31);
        g->st[s].mask = m;
        return m;
    }
    if (mask_walk(g, 0, s, m) < 0) {
        free(m);
        g->bytes -= g->voc->n_words * sizeof(uint32_t);
        return NULL;
    }
    if (g->st[s].accepting) {
        for (int32_t i = 0; i < g->voc->n_eog; i++) {
            int32_t id = g->voc->eog[i];

            m[id >> 5] |= 1u << (id & 31);
        }
    }
    g->st[s].mask = m;
    return m;
}


/* ---- cache ---- */

nalar_grammar_cache *
nalar_grammar_cache_create(const nalar_tokenizer *tok, int cap)
{
    nalar_grammar_cache *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    if (voc_build(&c->voc, tok) < 0) {
        voc_free(&c->voc);
        free(c);
        return NULL;
    }
    c->cap = cap > 0 ? cap : 64;
    return c;
}


void
nalar_grammar_release(nalar_grammar *g)
{
    if (g != NULL && --g->refs == 0) {
        grammar_free(g);
    }
}


void
nalar_grammar_cache_destroy(nalar_grammar_cache *c)
{
    nalar_grammar *g, *nx;

    if (c == NULL) {
        return;
    }
    for (g = c->head; g != NULL; g = nx) {
        nx = g->lru_next;
        nalar_grammar_release(g);
    }
    voc_free(&c->voc);
    free(c);
}


static uint64_t
fnv64(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char) s[i];
        h *= 1099511628211ULL;
    }
    return h;
}


nalar_grammar *
nalar_grammar_get(nalar_grammar_cache *c, int kind, const char *schema,
                  size_t len, double *compile_s, char *err, size_t errlen)
{
    json_t        *sc = NULL;
    json_error_t   je;
    char          *canon = NULL;
    size_t         clen = 0;
    uint64_t       dg;
    nalar_grammar *g, **pp;
    double         t0 = nalar_now_s();

    if (compile_s) {
        *compile_s = 0;
    }
    if (kind == NALAR_GRAMMAR_JSON_SCHEMA) {
        if (schema == NULL) {
            snprintf(err, errlen, "no schema");
            return NULL;
        }
        sc = json_loadb(schema, len, JSON_REJECT_DUPLICATES, &je);
        if (sc == NULL) {
            snprintf(err, errlen, "the schema is not JSON: %s", je.text);
            return NULL;
        }
        canon = json_dumps(sc, JSON_COMPACT | JSON_SORT_KEYS);
        if (canon == NULL) {
            json_decref(sc);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        clen = strlen(canon);
    } else if (kind != NALAR_GRAMMAR_JSON_OBJECT) {
        snprintf(err, errlen, "unknown grammar kind %d", kind);
        return NULL;
    }
    dg = fnv64(canon ? canon : "", clen, 14695981039346656037ULL ^ kind);
    for (pp = &c->head; *pp != NULL; pp = &(*pp)->lru_next) {
        g = *pp;
        if (g->kind == kind && g->digest == dg && g->canon_len == clen
            && (clen == 0 || memcmp(g->canon, canon, clen) == 0))
        {
            /* to the front */
            *pp = g->lru_next;
            g->lru_next = c->head;
            c->head = g;
            g->refs++;
            free(canon);
            json_decref(sc);
            return g;
        }
    }
    /* property order matters to the output, so the grammar is compiled
     * from the schema as written (the digest only keys the cache) */
    g = grammar_compile(&c->voc, kind, sc, err, errlen);
    json_decref(sc);
    if (g == NULL) {
        free(canon);
        return NULL;
    }
    g->kind = kind;
    g->digest = dg;
    g->canon = canon;
    g->canon_len = clen;
    g->lru_next = c->head;
    c->head = g;
    g->refs++;               /* the cache's */
    c->n++;
    /* drop the least recently used while there are more than cap, or
     * their memory (grammars and automata) passes GR_CACHE_BYTES; the new
     * one stays.  A grammar dropped here lives on while matchers use it. */
    for (;;) {
        size_t total = 0;

        for (nalar_grammar *x = c->head; x != NULL; x = x->lru_next) {
            total += x->base_bytes + x->bytes;
        }
        if (c->n <= 1 || (c->n <= c->cap && total <= GR_CACHE_BYTES)) {
            break;
        }
        for (pp = &c->head; (*pp)->lru_next != NULL; pp = &(*pp)->lru_next) {
        }
        nalar_grammar_release(*pp);
        *pp = NULL;
        c->n--;
    }
    if (compile_s) {
        *compile_s = nalar_now_s() - t0;
    }
    return g;
}


/* ---- matcher ---- */

/*
 * An API call starts: its work budget is whole again.  Where the automaton
 * has passed half its memory budget, its caches (masks, byte transitions)
 * are dropped first; the states stay, as matchers hold their ids.  Masks
 * handed out are valid until the next call (grammar.h), so this is the
 * one place they may go.
 */
static void
call_begin(nalar_grammar *g, int trim)
{
    g->call_work = 0;
    g->why = NULL;
    if (!trim || g->bytes <= GR_MAX_BYTES / 2) {
        return;
    }
    for (int32_t i = 0; i < g->n_st; i++) {
        if (g->st[i].next != NULL) {
            free(g->st[i].next);
            g->st[i].next = NULL;
            g->bytes -= 256 * sizeof(int32_t);
        }
        if (g->st[i].mask != NULL) {
            free(g->st[i].mask);
            g->st[i].mask = NULL;
            g->bytes -= g->voc->n_words * sizeof(uint32_t);
        }
    }
}


const char *
nalar_gmatcher_error(const nalar_gmatcher *m)
{
    return m->g->why ? m->g->why : "out of memory";
}


nalar_gmatcher *
nalar_gmatcher_create(nalar_grammar *g)
{
    nalar_gmatcher *m = calloc(1, sizeof(*m));

    if (m == NULL) {
        return NULL;
    }
    m->cap_hist = 64;
    m->hist = malloc(m->cap_hist * sizeof(int32_t));
    if (m->hist == NULL) {
        free(m);
        return NULL;
    }
    m->g = g;
    g->refs++;
    m->hist[0] = g->start;
    m->n_hist = 1;
    return m;
}


void
nalar_gmatcher_destroy(nalar_gmatcher *m)
{
    if (m == NULL) {
        return;
    }
    nalar_grammar_release(m->g);
    free(m->hist);
    free(m);
}


static int32_t
cur(const nalar_gmatcher *m)
{
    return m->hist[m->n_hist - 1];
}


const uint32_t *
nalar_gmatcher_mask(nalar_gmatcher *m, double *mask_s)
{
    int32_t         s = cur(m);
    double          t0;
    const uint32_t *r;

    if (mask_s) {
        *mask_s = 0;
    }
    if (s == GR_ENDED) {
        return m->g->zero;
    }
    call_begin(m->g, 1);
    if (m->g->st[s].mask != NULL) {
        return m->g->st[s].mask;
    }
    t0 = nalar_now_s();
    r = state_mask(m->g, s);
    if (mask_s) {
        *mask_s = nalar_now_s() - t0;
    }
    return r;
}


/* the state after token id from s: id, -1 refused, -2 out of memory */
static int32_t
step_token(nalar_grammar *g, int32_t s, int32_t id)
{
    const gvocab *v = g->voc;

    if (id < 0 || id >= v->n_vocab || v->tok_len[id] == 0) {
        return -1;
    }
    if (g->st[s].forced >= 0 && forced_tok(g, s) != id) {
        return -1;
    }
    for (int j = 0; j < v->tok_len[id] && s >= 0; j++) {
        s = step_byte(g, s, (unsigned char) v->tok_bytes[id][j]);
    }
    return s;
}


static int
is_eog(const gvocab *v, int32_t id)
{
    for (int32_t i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == id) {
            return 1;
        }
    }
    return 0;
}


int
nalar_gmatcher_allows(nalar_gmatcher *m, int32_t id)
{
    int32_t s = cur(m);

    if (s == GR_ENDED) {
        return 0;
    }
    if (is_eog(m->g->voc, id)) {
        return m->g->st[s].accepting;
    }
    call_begin(m->g, 0);
    return step_token(m->g, s, id) >= 0;
}


int
nalar_gmatcher_accept(nalar_gmatcher *m, int32_t id)
{
    int32_t s = cur(m), s2;

    if (s == GR_ENDED) {
        return -1;
    }
    if (is_eog(m->g->voc, id)) {
        if (!m->g->st[s].accepting) {
            return -1;
        }
        s2 = GR_ENDED;
    } else {
        call_begin(m->g, 0);
        s2 = step_token(m->g, s, id);
        if (s2 < 0) {
            return -1;
        }
    }
    if (m->n_hist == m->cap_hist) {
        int32_t *nv = realloc(m->hist, m->cap_hist * 2 * sizeof(int32_t));

        if (nv == NULL) {
            return -1;
        }
        m->hist = nv;
        m->cap_hist *= 2;
    }
    m->hist[m->n_hist++] = s2;
    return 0;
}


void
nalar_gmatcher_rollback(nalar_gmatcher *m, int32_t n)
{
    if (n >= m->n_hist) {
        n = m->n_hist - 1;
    }
    if (n > 0) {
        m->n_hist -= n;
    }
}


int32_t
nalar_gmatcher_n_accepted(const nalar_gmatcher *m)
{
    return m->n_hist - 1;
}


int
nalar_gmatcher_can_end(nalar_gmatcher *m)
{
    int32_t s = cur(m);

    return s == GR_ENDED || m->g->st[s].accepting;
}


int
nalar_gmatcher_done(nalar_gmatcher *m)
{
    int32_t s = cur(m);

    return s == GR_ENDED
           || (m->g->st[s].accepting && m->g->st[s].len == 1);
}


/*
 * The forced bytes from state s (while exactly one byte is allowed and the
 * value is not complete), tokenized greedily: the longest vocabulary piece
 * at each point.  Up to cap ids in out; the count, or -1 when a step
 * failed (out of memory or past a budget: g->why).
 */
static int
forced_tokens(nalar_grammar *g, int32_t s, int32_t *out, int cap)
{
    const gvocab *v = g->voc;
    char          fb[256];
    int           nf = 0, n = 0, pos = 0;

    while (nf < (int) sizeof(fb) && s >= 0 && g->st[s].forced >= 0) {
        int c = g->st[s].forced;

        fb[nf++] = (char) c;
        s = step_byte(g, s, c);
        if (s == -2) {
            return -1;       /* out of memory or past a budget (g->why) */
        }
    }
    while (pos < nf && n < cap) {
        int32_t node = 0, best = -1, best_len = 0;

        for (int j = pos; j < nf; j++) {
            int32_t nx = v->nodes[node].first_child;

            while (nx >= 0 && v->nodes[nx].byte != (unsigned char) fb[j]) {
                nx = v->nodes[nx].next_sibling;
            }
            if (nx < 0) {
                break;
            }
            node = nx;
            if (v->nodes[node].n_toks) {
                best = v->toks[v->nodes[node].first_tok];
                best_len = j - pos + 1;
            }
        }
        if (best < 0) {
            break;
        }
        out[n++] = best;
        pos += best_len;
    }
    return n;
}


/* The one token a forced state allows, or -1 where s is not forced. */
static int32_t
forced_tok(nalar_grammar *g, int32_t s)
{
    if (g->st[s].forced_tok == -2) {
        int32_t t;
        int     n = forced_tokens(g, s, &t, 1);

        if (n < 0) {
            return -1;       /* a failure is not remembered */
        }
        g->st[s].forced_tok = n == 1 ? t : -1;
    }
    return g->st[s].forced_tok;
}


int
nalar_gmatcher_forced(nalar_gmatcher *m, int32_t *out, int cap)
{
    int32_t s = cur(m);
    int     n;

    if (s == GR_ENDED) {
        return 0;
    }
    call_begin(m->g, 0);
    n = forced_tokens(m->g, s, out, cap);
    return n < 0 ? 0 : n;
}


int
nalar_grammar_match(nalar_grammar *g, const char *s, size_t n)
{
    int32_t st = g->start;

    call_begin(g, 0);
    for (size_t i = 0; i < n && st >= 0; i++) {
        st = step_byte(g, st, (unsigned char) s[i]);
    }
    return st >= 0 && g->st[st].accepting;
}
