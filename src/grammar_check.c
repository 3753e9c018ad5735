/*
 * Structured output, compile: the rules' recursion checked (no left
 * recursion, none that cannot end), and a schema built into rules from
 * its JSON text (build_grammar, nalar_schema_check).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"


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
 * Refuses (gr_bfail) a grammar the automaton could not run:
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
        gr_bfail(b, "out of memory%s%s", "", "");
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
                    gr_bfail(b, "the schema recurses without producing "
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

            gr_bfail(b, "the schema recurses without end (%s%s can never "
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
int32_t
gr_build_grammar(gbuild *b, int kind, json_t *schema, int dry, char *err,
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
        root = gr_r_value_any(b);
        root = b->object_any;
    } else {
        b->root_schema = schema;
        root = gr_compile_schema(b, schema, "#", 0);
        /* the $ref targets, which may add more */
        for (int32_t i = 0; i < b->n_refs && !b->failed; i++) {
            int32_t t;
            gsym    s;

            if (b->refs[i].done) {
                continue;
            }
            b->refs[i].done = 1;
            t = gr_compile_schema(b, b->refs[i].schema, b->refs[i].ref, 1);
            s = S_ref(t);
            gr_alt_add(b, b->refs[i].rule, &s, 1);
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
    root = gr_build_grammar(&b, NALAR_GRAMMAR_JSON_SCHEMA, sc, 0, err, errlen);
    gr_build_free(&b);
    json_decref(sc);
    return root < 0 ? -1 : 0;
}
