/*
 * Structured output (see grammar.h): the insides its files share.
 *
 *   grammar_rules.c      the grammar under construction: rules, byte
 *                        classes, alternatives, literals, failure
 *   grammar_build.c      JSON Schema to rules: strings, objects, arrays,
 *                        $ref, anyOf, enum, const, the types
 *   grammar_bounds.c     bounded integers and numbers, string patterns
 *                        and formats (through grammar_regex.c's DFA)
 *   grammar_check.c      the rules' recursion checked; build_grammar,
 *                        nalar_schema_check
 *   grammar_automaton.c  the compiled grammar: stacks, states, expansion,
 *                        byte transitions, budgets
 *   grammar.c            the vocabulary trie, token masks, the grammar
 *                        cache and the matcher
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
#ifndef NALAR_GRAMMAR_INTERNAL_H
#define NALAR_GRAMMAR_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "grammar.h"

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


/* ---- building the grammar (grammar_rules.c; the schema's rules in
 * grammar_build.c, grammar_bounds.c) ---- */

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


/* Records the first failure (fmt with a, path) in b->err: -1. */
int gr_bfail(gbuild *b, const char *fmt, const char *a, const char *path);

/* A new rule with no alternatives: its index, or -1. */
int32_t gr_rule_new(gbuild *b);

/* The byte class of set (256 bits): its index, or -1. */
int32_t gr_cls_new(gbuild *b, const uint32_t set[8]);

/* Adds an alternative (n symbols) to rule r. */
void gr_alt_add(gbuild *b, int32_t r, const gsym *s, int32_t n);

/* A rule matching exactly the bytes s[0..n) (short literals made once). */
int32_t gr_rule_literal(gbuild *b, const char *s, size_t n);

/* at_least..n digits, as a chain of rules */
int32_t gr_r_digits(gbuild *b, int n, int at_least);

/* Any JSON value. */
int32_t gr_r_value_any(gbuild *b);

/* A count (minLength, maxItems, ...) of sc into out, left alone when
 * absent: 0, or -1 with b->err (not an integer 0..GR_MAX_UNROLL). */
int gr_get_count(gbuild *b, json_t *sc, const char *key, int64_t *out,
                 const char *path);

/* The rule of schema sc at path, or -1. */
int32_t gr_compile_schema(gbuild *b, json_t *sc, const char *path, int depth);

/* the bounded integer or number rule of sc, or -2 when sc has no bound */
int32_t gr_compile_bounds(gbuild *b, json_t *sc, int integer, const char *path);

/* a string with pattern or format (or -2 when it has neither) */
int32_t gr_compile_string_pattern(gbuild *b, json_t *sc, const char *path);

/* Frees what b holds (not b). */
void gr_build_free(gbuild *b);

/* Compiles into b; the root rule, or -1 with b->err. */
int32_t gr_build_grammar(gbuild *b, int kind, json_t *schema, int dry,
                         char *err, size_t errlen);

/* The symbol of byte class [lo, hi], of byte c, of a reference to rule r */
static inline gsym
S_cls_range(gbuild *b, int lo, int hi)
{
    uint32_t set[8] = {0};

    for (int c = lo; c <= hi; c++) {
        set[c >> 5] |= 1u << (c & 31);
    }
    return (gsym) { SYM_CLASS, gr_cls_new(b, set) };
}


static inline gsym
S_ch(gbuild *b, int c)
{
    return S_cls_range(b, c, c);
}


static inline gsym
S_ref(int32_t r)
{
    return (gsym) { SYM_REF, r };
}


/* ---- the automaton (grammar_automaton.c) ---- */

/* The grammar of a schema over voc, or NULL with err. */
nalar_grammar *gr_grammar_compile(const gvocab *voc, int kind, json_t *schema,
                                  char *err, size_t errlen);

void gr_grammar_free(nalar_grammar *g);

/* Counts n bytes against the automaton's budget: 0, or -1 past it. */
int gr_charge(nalar_grammar *g, size_t n);

/* The state after byte c from state s: id, -1 refused, -2 out of memory
 * or past a budget (g->why). */
int32_t gr_step_byte(nalar_grammar *g, int32_t s, int c);

#endif
