/*
 * Structured output, compile: the grammar under construction (gbuild,
 * grammar_internal.h) -- rules, byte classes, alternatives, literals,
 * digit chains, counts read from a schema, the first failure -- which
 * every compile step (grammar_build.c, grammar_bounds.c,
 * grammar_check.c) builds with.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"


int
gr_bfail(gbuild *b, const char *fmt, const char *a, const char *path)
{
    if (!b->failed) {
        b->failed = 1;
        if (b->errlen) {
            snprintf(b->err, b->errlen, fmt, a, path);
        }
    }
    return -1;
}


int32_t
gr_rule_new(gbuild *b)
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
            return gr_bfail(b, "out of memory%s%s", "", "");
        }
        b->rules = nr;
        b->cap_rules = nc;
    }
    memset(&b->rules[b->n_rules], 0, sizeof(brule));
    return b->n_rules++;
}


int32_t
gr_cls_new(gbuild *b, const uint32_t set[8])
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
            return gr_bfail(b, "out of memory%s%s", "", "");
        }
        b->cls = nv;
        b->cap_cls = nc;
    }
    memcpy(b->cls[b->n_cls], set, 32);
    return b->n_cls++;
}





/* Adds an alternative (n symbols) to rule r. */
void
gr_alt_add(gbuild *b, int32_t r, const gsym *s, int32_t n)
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
        gr_bfail(b, "the schema is too large%s%s", "", "");
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
            gr_bfail(b, "out of memory%s%s", "", "");
            return;
        }
        ru->alt = na;
        nl = realloc(ru->alt_len, nc * sizeof(int32_t));
        if (nl == NULL) {
            gr_bfail(b, "out of memory%s%s", "", "");
            return;
        }
        ru->alt_len = nl;
        ru->cap_alt = nc;
    }
    copy = malloc((n + 1) * sizeof(gsym));
    if (copy == NULL) {
        gr_bfail(b, "out of memory%s%s", "", "");
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
int32_t
gr_rule_literal(gbuild *b, const char *s, size_t n)
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
            return gr_bfail(b, "out of memory%s%s", "", "");
        }
        known = json_object_get(b->lit_map, key);
        if (known != NULL) {
            return (int32_t) json_integer_value(known);
        }
    }
    r = gr_rule_new(b);
    if (r < 0) {
        return -1;
    }
    if (key[0] != '\0'
        && json_object_set_new(b->lit_map, key, json_integer(r)) != 0)
    {
        return gr_bfail(b, "out of memory%s%s", "", "");
    }
    v = malloc((n ? n : 1) * sizeof(gsym));
    if (v == NULL) {
        return gr_bfail(b, "out of memory%s%s", "", "");
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = S_ch(b, (unsigned char) s[i]);
    }
    gr_alt_add(b, r, v, (int32_t) n);
    free(v);
    return b->failed ? -1 : r;
}


/* at_least..n digits, as a chain D_0 .. D_n (D_k: k digits so far) */
int32_t
gr_r_digits(gbuild *b, int n, int at_least)
{
    int32_t first = -1, prev = -1;
    gsym    s[2];

    s[0] = S_cls_range(b, '0', '9');
    for (int k = 0; k <= n; k++) {
        int32_t dk = gr_rule_new(b);

        if (dk < 0) {
            return -1;
        }
        if (first < 0) {
            first = dk;
        }
        if (prev >= 0) {
            s[1] = S_ref(dk);
            gr_alt_add(b, prev, s, 2);
            if (k - 1 >= at_least) {
                gr_alt_add(b, prev, NULL, 0);
            }
        }
        prev = dk;
    }
    gr_alt_add(b, prev, NULL, 0);
    return b->failed ? -1 : first;
}


int
gr_get_count(gbuild *b, json_t *sc, const char *key, int64_t *out,
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
        return gr_bfail(b, "unsupported value of %s at %s", k, path);
    }
    *out = json_integer_value(v);
    return 0;
}


void
gr_build_free(gbuild *b)
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
