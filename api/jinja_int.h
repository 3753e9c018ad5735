/*
 * The Jinja interpreter's internals, shared by its files: the arena every
 * compile and render allocates from (freed whole; an error longjmps out of
 * any depth and the arena goes with it), values, the syntax tree, and the
 * entry points of each part.
 */
#ifndef NALAR_JINJA_INT_H
#define NALAR_JINJA_INT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* --- arena and failure --- */

typedef struct jj_chunk {
    struct jj_chunk  *next;
    size_t            used;
    size_t            cap;
    _Alignas(16) unsigned char data[];
} jj_chunk;

typedef struct {
    jj_chunk   *chunks;
    size_t      total;      /* bytes taken from malloc */
    size_t      limit;      /* ... at most this many, else a failure */
    jmp_buf     jb;         /* where jj_fail lands */
    char       *err;
    size_t      err_len;
    int         rc;         /* -1, or NALAR_JINJA_RAISED */
} jj_base;

void *jj_alloc(jj_base *b, size_t n);       /* zeroed */
void  jj_arena_free(jj_chunk *c);
_Noreturn void jj_fail(jj_base *b, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
char *jj_strdup(jj_base *b, const char *s, size_t n);

/* --- values --- */

enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS, JV_MACRO, JV_FUNC, JV_METHOD
};

/* Immutable once made.  taint: NULL when no byte is user text, else one
 * flag per byte (1: user text). */
typedef struct {
    size_t          len;
    char           *s;          /* NUL-terminated */
    unsigned char  *taint;
} jj_str;

typedef struct jv jv;

typedef struct {
    size_t       n, cap;
    jv          *v;
    const char  *raise;     /* a generator that fails when iterated (|items
                               of a non-mapping): the message */
    int64_t      start, stop, step;     /* a range's arguments */
} jj_list;

/* insertion-ordered; a namespace is one too (JV_NS, mutable) */
typedef struct {
    size_t  n, cap;
    jv     *k;
    jv     *v;
} jj_dict;

struct jj_node;
typedef struct jj_method jj_method;

struct jv {
    uint8_t t;
    uint8_t safe;       /* JV_STR: markupsafe.Markup (|safe) */
    uint8_t tuple;      /* JV_LIST: 1 a tuple (repr with parentheses), 2 a
                           generator (what map/select give: no len, no
                           JSON, always true), 3 a range (its own repr,
                           no JSON), 4 5 6 a dict's keys(), values(),
                           items() view (their repr, no index, no JSON) */
    union {
        int64_t       i;
        double        f;
        int           b;
        jj_str       *s;
        jj_list      *l;
        jj_dict      *d;
        struct jj_node    *m;        /* JV_MACRO */
        int           fn;       /* JV_FUNC: JJ_FN_* */
        const char   *name;     /* JV_UNDEF: what was looked up, or NULL */
        jj_method    *meth;
    } u;
};

struct jj_method {
    jv          self;
    const char *name;
};

enum { JJ_FN_RAISE, JJ_FN_STRFTIME, JJ_FN_NAMESPACE, JJ_FN_RANGE,
       JJ_FN_DICT };

/* a string being built: bytes plus their taint flags */
typedef struct {
    char           *s;
    unsigned char  *t;
    size_t          len, cap;
    int             tainted;    /* some flag set */
    size_t          max;        /* longer fails: the output cap */
} jj_sb;

/* --- syntax tree --- */

enum {
    /* statements */
    JN_BODY, JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK,
    JN_FILTERBLOCK, JN_MACRO, JN_CALLBLOCK, JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_LIT, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_NEG, JN_POS, JN_NOT, JN_AND, JN_OR, JN_BIN, JN_CMP,
    JN_CONCAT, JN_COND, JN_LIST, JN_TUPLE, JN_DICTLIT
};

/* JN_BIN / JN_CMP operators */
enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
};

typedef struct jj_node {
    int            k;
    int            line;
    int            op;          /* operator; JN_TEST: negated; JN_FOR: has
                                   an else */
    struct jj_node     *a, *b, *c, *d;
    struct jj_node    **args;        /* positional args, items, statements */
    int            nargs;
    struct jj_node    **kwv;         /* keyword arguments (values) */
    const char   **kwn;         /* ... and their names */
    int            nkw;
    const char    *name;        /* a name, attribute, filter, test, macro */
    const char   **names;       /* targets, parameters */
    int            nnames;
    jv             lit;         /* JN_LIT, JN_TEXT */
} jj_node;

struct nalar_jinja_tmpl {
    jj_chunk   *arena;
    jj_node         *root;
};

/* --- the render's state --- */

typedef struct jj_scope {
    struct jj_scope *up;
    jj_dict          vars;
} jj_scope;

typedef struct {
    jj_base      b;
    uint64_t     steps, max_steps;
    int          depth, max_depth;
    size_t       max_output;
    int64_t      now;
    jj_sb       *out;
    jj_scope    *root;          /* the template's own variables */
    jj_scope    *scope;         /* the innermost: a loop's, a macro's */
    jj_node          *caller;        /* a {% call %} block for the next macro */
    jj_dict      ctxvars;       /* the caller's */
    int          line;          /* of the statement running, for errors */
} jj_ctx;

/* jinja_value.c */
jv      jv_undef(const char *name);
jv      jv_none(void);
jv      jv_bool(int b);
jv      jv_int(int64_t i);
jv      jv_float(double f);
jv      jv_str(jj_base *b, const char *s, size_t n, int tainted);
jv      jv_strz(jj_base *b, const char *s);
jv      jv_sb(jj_base *b, const jj_sb *sb);
jv      jv_list(jj_base *b, size_t cap);
jv      jv_dict(jj_base *b, size_t cap);
void    jj_list_push(jj_base *b, jj_list *l, jv v);
jv     *jj_dict_get(const jj_dict *d, jv key);
jv     *jj_dict_gets(const jj_dict *d, const char *key);
void    jj_dict_set(jj_base *b, jj_dict *d, jv key, jv val);
void    jj_sb_init(jj_sb *sb, size_t max);
void    jj_sb_put(jj_base *b, jj_sb *sb, const char *s, size_t n, int taint);
void    jj_sb_putz(jj_base *b, jj_sb *sb, const char *s);
void    jj_sb_put_str(jj_base *b, jj_sb *sb, const jj_str *s, size_t off,
                      size_t n);
void    jj_sb_put_escaped(jj_base *b, jj_sb *sb, const jj_str *s);
int     jv_truthy(jv v);
int     jv_equal(jv a, jv b);
int     jv_compare(jj_ctx *c, jv a, jv b);      /* <0, 0, >0; fails */
const char *jv_type_name(jv v);
void    jv_print(jj_ctx *c, jj_sb *sb, jv v);   /* Python str() */
void    jv_repr(jj_ctx *c, jj_sb *sb, jv v);    /* Python repr() */
jv      jv_to_string(jj_ctx *c, jv v);          /* str(v), a JV_STR */
int     jv_is_number(jv v);
double  jv_num(jv v);
size_t  jj_utf8_len(const char *s, size_t n);
size_t  jj_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp);
int     jj_py_space(uint32_t cp);
jv      jv_substr(jj_base *b, const jj_str *s, size_t off, size_t n);

/* jinja_json.c */
jv      jj_from_json(jj_base *b, json_t *j, int tainted, int depth);
void    jj_tojson(jj_ctx *c, jj_sb *sb, jv v, int indent, int sort_keys,
                  int ascii, int level);
void    jj_format_float(char *buf, size_t n, double f);

/* jinja_lex.c + jinja_parse.c */
typedef struct jj_tok jj_tok;
jj_node     *jj_parse(jj_base *b, const char *src, size_t len);

/* jinja_eval.c */
jv      jj_eval(jj_ctx *c, jj_node *n);
void    jj_exec_body(jj_ctx *c, jj_node *body, int *ctl);
jv      jj_call_macro(jj_ctx *c, jj_node *m, jv *args, int nargs,
                      const char **kwn, jv *kwv, int nkw, int line);
jv      jj_getattr(jj_ctx *c, jv obj, const char *name, int line);
jv      jj_getitem(jj_ctx *c, jv obj, jv key, int line);
void    jj_step(jj_ctx *c);
jv      jj_iter_list(jj_ctx *c, jv v, int line);   /* a JV_LIST to iterate */
void    jj_not_undef(jj_ctx *c, jv v, int line);
jv      jj_binop(jj_ctx *c, int op, jv a, jv b, int line);
void    jj_hashable(jj_ctx *c, jv v, int line);     /* fails if not */

/* jinja_filters.c */
jv      jj_filter(jj_ctx *c, const char *name, jv v, jv *args, int nargs,
                  const char **kwn, jv *kwv, int nkw, int line);
int     jj_test(jj_ctx *c, const char *name, jv v, jv *args, int nargs,
                int line);
int     jj_filter_known(const char *name);
int     jj_test_known(const char *name);

/* jinja_methods.c */
int     jj_is_method(jv obj, const char *name);
jv      jj_call_method(jj_ctx *c, jv self, const char *name, jv *args,
                       int nargs, const char **kwn, jv *kwv, int nkw,
                       int line);
jv      jj_call_func(jj_ctx *c, int fn, jv *args, int nargs,
                     const char **kwn, jv *kwv, int nkw, int line);
jv      jj_str_strip(jj_ctx *c, jv s, jv chars, int left, int right);
jv      jj_str_replace(jj_ctx *c, jv s, jv old, jv new_, int64_t count);
jv      jj_str_case(jj_ctx *c, jv s, int how);   /* 0 lower 1 upper 2 title
                                                   3 capitalize 4 jinja2's
                                                   |title */
jv      jj_str_split(jj_ctx *c, jv s, jv sep, int64_t maxsplit);
jv      jj_str_percent(jj_ctx *c, jv fmt, jv args);


/* --- tokens (jinja_lex.c, read by jinja_parse.c) --- */

enum {
    T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT,
    T_FLOAT, T_OP, T_EOF
};

struct jj_tok {
    int         type;
    int         line;
    const char *s;          /* T_TEXT, T_NAME, T_STR (unescaped), T_OP */
    size_t      len;
    int64_t     i;
    double      f;
};

typedef struct {
    jj_tok     *v;
    size_t      n, cap;
} jj_toks;

void jj_lex(jj_base *b, const char *src, size_t len, jj_toks *out);
#endif
