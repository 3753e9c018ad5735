/*
 * Structured output, compile: a JSON Schema becomes rules (see
 * grammar_internal.h).  Strings, objects, arrays, $ref, anyOf, enum,
 * const and the types; bounded numbers and patterns in grammar_bounds.c,
 * the rules' primitives in grammar_rules.c.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"


static int32_t
r_ws(gbuild *b)
{
    if (b->ws < 0) {
        gsym sp;

        b->ws = gr_rule_new(b);
        sp = S_ch(b, ' ');
        gr_alt_add(b, b->ws, &sp, 1);
    }
    return b->ws;
}


/* One character of a JSON string: printable ASCII but '"' and '\\', an
 * escape, or a well-formed multi-byte UTF-8 sequence. */
static int32_t
r_strchar(gbuild *b)
{
    if (b->strchar < 0) {
        int32_t  r = gr_rule_new(b), hex = gr_rule_new(b);
        uint32_t set[8] = {0};
        gsym     s[6];

        b->strchar = r;
        for (int c = 0x20; c < 0x80; c++) {
            if (c != '"' && c != '\\') {
                set[c >> 5] |= 1u << (c & 31);
            }
        }
        s[0] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        gr_alt_add(b, r, s, 1);
        memset(set, 0, sizeof(set));
        for (const char *e = "\"\\/bfnrt"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[0] = S_ch(b, '\\');
        s[1] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        gr_alt_add(b, r, s, 2);
        memset(set, 0, sizeof(set));
        for (const char *e = "0123456789abcdefABCDEF"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[0] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        gr_alt_add(b, hex, s, 1);
        /* \uXXXX but not a surrogate (D800-DFFF) */
        s[0] = S_ch(b, '\\');
        s[1] = S_ch(b, 'u');
        memset(set, 0, sizeof(set));
        for (const char *e = "0123456789abceABCEfF"; *e; e++) {
            set[(unsigned char) *e >> 5] |= 1u << (*e & 31);
        }
        s[2] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        s[3] = s[4] = s[5] = S_ref(hex);
        gr_alt_add(b, r, s, 6);
        memset(set, 0, sizeof(set));
        set['d' >> 5] |= 1u << ('d' & 31);
        set['D' >> 5] |= 1u << ('D' & 31);
        s[2] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        s[3] = S_cls_range(b, '0', '7');
        gr_alt_add(b, r, s, 6);
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
                gr_alt_add(b, r, s, seq[q][0]);
            }
            for (size_t q = 0; q < sizeof(seq4) / sizeof(seq4[0]); q++) {
                for (int j = 0; j < 4; j++) {
                    s[j] = S_cls_range(b, seq4[q][1 + 2 * j],
                                       seq4[q][2 + 2 * j]);
                }
                gr_alt_add(b, r, s, 4);
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
        int32_t ck = gr_rule_new(b);

        if (ck < 0) {
            return -1;
        }
        if (first < 0) {
            first = ck;
        }
        if (prev >= 0) {
            s[0] = S_ref(c);
            s[1] = S_ref(ck);
            gr_alt_add(b, prev, s, 2);
            if (k - 1 >= min) {
                gr_alt_add(b, prev, NULL, 0);
            }
        }
        prev = ck;
    }
    /* the last link */
    gr_alt_add(b, prev, NULL, 0);
    if (max < 0) {
        s[0] = S_ref(c);
        s[1] = S_ref(prev);
        gr_alt_add(b, prev, s, 2);
    }
    r = gr_rule_new(b);
    s[0] = S_ch(b, '"');
    s[1] = S_ref(first);
    s[2] = s[0];
    gr_alt_add(b, r, s, 3);
    if (min == 0 && max < 0) {
        b->string_any = r;
    }
    return b->failed ? -1 : r;
}


static int32_t
r_integer(gbuild *b)
{
    if (b->integer < 0) {
        int32_t r = gr_rule_new(b), mag = gr_rule_new(b), rest;
        gsym    s[3];

        b->integer = r;
        /* "0" | [1-9] digits{0..14} */
        s[0] = S_ch(b, '0');
        gr_alt_add(b, mag, s, 1);
        s[0] = S_cls_range(b, '1', '9');
        rest = gr_r_digits(b, GR_INT_DIGITS - 1, 0);
        s[1] = S_ref(rest);
        gr_alt_add(b, mag, s, 2);
        s[0] = S_ref(mag);
        gr_alt_add(b, r, s, 1);
        s[0] = S_ch(b, '-');
        s[1] = S_ref(mag);
        gr_alt_add(b, r, s, 2);
    }
    return b->integer;
}


static int32_t
r_number(gbuild *b)
{
    if (b->number < 0) {
        int32_t r = gr_rule_new(b), frac = gr_rule_new(b), ex = gr_rule_new(b),
                sign = gr_rule_new(b), in = r_integer(b);
        gsym    s[4];

        b->number = r;
        gr_alt_add(b, frac, NULL, 0);
        s[0] = S_ch(b, '.');
        s[1] = S_ref(gr_r_digits(b, GR_FRAC_DIGITS, 1));
        gr_alt_add(b, frac, s, 2);
        gr_alt_add(b, sign, NULL, 0);
        s[0] = S_ch(b, '-');
        gr_alt_add(b, sign, s, 1);
        s[0] = S_ch(b, '+');
        gr_alt_add(b, sign, s, 1);
        gr_alt_add(b, ex, NULL, 0);
        {
            uint32_t set[8] = {0};

            set['e' >> 5] |= 1u << ('e' & 31);
            set['E' >> 5] |= 1u << ('E' & 31);
            s[0] = (gsym) { SYM_CLASS, gr_cls_new(b, set) };
        }
        s[1] = S_ref(sign);
        s[2] = S_ref(gr_r_digits(b, GR_EXP_DIGITS, 1));
        gr_alt_add(b, ex, s, 3);
        s[0] = S_ref(in);
        s[1] = S_ref(frac);
        s[2] = S_ref(ex);
        gr_alt_add(b, r, s, 3);
    }
    return b->number;
}


/* "{" (string ": " V (", " string ": " V)*)? "}" with V the
 * value rule (any value when v < 0) */
static int32_t
r_object_map(gbuild *b, int32_t v)
{
    int32_t r = gr_rule_new(b), body = gr_rule_new(b), more = gr_rule_new(b),
            kv = gr_rule_new(b), ws = r_ws(b), str = r_string(b, 0, -1);
    gsym    s[5];

    if (v < 0) {
        v = gr_r_value_any(b);
    }
    s[0] = S_ref(str);
    s[1] = S_ch(b, ':');
    s[2] = S_ref(ws);
    s[3] = S_ref(v);
    gr_alt_add(b, kv, s, 4);
    gr_alt_add(b, more, NULL, 0);
    s[0] = S_ch(b, ',');
    s[1] = S_ref(ws);
    s[2] = S_ref(kv);
    s[3] = S_ref(more);
    gr_alt_add(b, more, s, 4);
    gr_alt_add(b, body, NULL, 0);
    s[0] = S_ref(kv);
    s[1] = S_ref(more);
    gr_alt_add(b, body, s, 2);
    s[0] = S_ch(b, '{');
    s[1] = S_ref(body);
    s[2] = S_ch(b, '}');
    gr_alt_add(b, r, s, 3);
    return b->failed ? -1 : r;
}


/* "[" (V (", " V){min-1..max-1})? "]"; max < 0 unbounded */
static int32_t
r_array(gbuild *b, int32_t v, int64_t min, int64_t max)
{
    int32_t r = gr_rule_new(b), ws = r_ws(b), first = -1, prev = -1;
    int64_t n = max >= 0 ? max : (min > 1 ? min : 1);
    gsym    s[5];

    if (v < 0) {
        v = gr_r_value_any(b);
    }
    /* A_k: k items so far; A_k ::= [sep] V A_k+1 | "" (k >= min) */
    for (int64_t k = 0; k <= n; k++) {
        int32_t ak = gr_rule_new(b);

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
            gr_alt_add(b, prev, s, i);
            if (k - 1 >= min) {
                gr_alt_add(b, prev, NULL, 0);
            }
        }
        prev = ak;
    }
    gr_alt_add(b, prev, NULL, 0);
    if (max < 0) {
        /* A_n loops: ", " V A_n (n >= 1 items are there) */
        s[0] = S_ch(b, ',');
        s[1] = S_ref(ws);
        s[2] = S_ref(v);
        s[3] = S_ref(prev);
        gr_alt_add(b, prev, s, 4);
    }
    s[0] = S_ch(b, '[');
    s[1] = S_ref(first);
    s[2] = S_ch(b, ']');
    gr_alt_add(b, r, s, 3);
    return b->failed ? -1 : r;
}


int32_t
gr_r_value_any(gbuild *b)
{
    if (b->failed) {
        /* no rule is made after a failure, so value_any would stay -1
         * and r_object_map would come back here without end */
        return -1;
    }
    if (b->value_any < 0) {
        int32_t r = gr_rule_new(b);
        gsym    s[1];

        b->value_any = r;
        b->object_any = r_object_map(b, r);
        b->array_any = r_array(b, r, 0, -1);
        s[0] = S_ref(b->object_any);
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(b->array_any);
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(r_string(b, 0, -1));
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(r_number(b));
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(gr_rule_literal(b, "true", 4));
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(gr_rule_literal(b, "false", 5));
        gr_alt_add(b, r, s, 1);
        s[0] = S_ref(gr_rule_literal(b, "null", 4));
        gr_alt_add(b, r, s, 1);
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
        return gr_bfail(b, "cannot serialise the value at %s%s", path, "");
    }
    r = gr_rule_literal(b, txt, strlen(txt));
    free(txt);
    return r;
}


static int32_t
ref_rule(gbuild *b, const char *ref, const char *path)
{
    json_t *target = NULL;
    int32_t r;

    /* known refs by name: a hash look-up, so many $defs stay linear */
    if (b->ref_map == NULL && (b->ref_map = json_object()) == NULL) {
        return gr_bfail(b, "out of memory%s%s", "", "");
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
        return gr_bfail(b, "unsupported $ref '%s' at %s (only #, #/$defs/NAME "
                        "and #/definitions/NAME)", ref, path);
    }
    if (target == NULL) {
        return gr_bfail(b, "$ref '%s' at %s points nowhere", ref, path);
    }
    if (b->n_refs == b->cap_refs) {
        int32_t nc = b->cap_refs ? b->cap_refs * 2 : 8;
        void   *nv = realloc(b->refs, nc * sizeof(*b->refs));

        if (nv == NULL) {
            return gr_bfail(b, "out of memory%s%s", "", "");
        }
        b->refs = nv;
        b->cap_refs = nc;
    }
    r = gr_rule_new(b);
    if (r < 0) {
        return -1;
    }
    b->refs[b->n_refs].ref = strdup(ref);
    if (b->refs[b->n_refs].ref == NULL) {
        return gr_bfail(b, "out of memory%s%s", "", "");
    }
    b->refs[b->n_refs].rule = r;
    b->refs[b->n_refs].schema = target;
    b->refs[b->n_refs].done = 0;
    if (json_object_set_new(b->ref_map, ref, json_integer(b->n_refs)) != 0) {
        free(b->refs[b->n_refs].ref);
        return gr_bfail(b, "out of memory%s%s", "", "");
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
        return gr_bfail(b, "'properties' at %s%s must be an object", path, "");
    }
    if (req != NULL && !json_is_array(req)) {
        return gr_bfail(b, "'required' at %s%s must be an array", path, "");
    }
    if (addl != NULL && !json_is_boolean(addl) && !json_is_object(addl)) {
        return gr_bfail(b, "'additionalProperties' at %s%s must be a boolean "
                        "or a schema", path, "");
    }
    /* every required name must be a property */
    for (i = 0; req && i < json_array_size(req); i++) {
        json_t *nm = json_array_get(req, i);

        if (!json_is_string(nm)) {
            return gr_bfail(b, "'required' at %s%s must hold strings", path,
                            "");
        }
        if (props == NULL || json_object_get(props, json_string_value(nm))
                             == NULL)
        {
            return gr_bfail(b, "required property '%s' at %s is not in "
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
            return r_object_map(b, gr_compile_schema(b, addl, sub, depth + 1));
        }
        return gr_rule_literal(b, "{}", 2);
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
        return gr_bfail(b, "out of memory%s%s", "", "");
    }
    i = 0;
    json_object_foreach(props, key, val) {
        char   *lit;
        json_t *ks = json_string(key);
        int32_t vr;

        optional[i] = reqset == NULL || json_object_get(reqset, key) == NULL;
        path_join(sub, sizeof(sub), path, "properties", key);
        vr = gr_compile_schema(b, val, sub, depth + 1);
        lit = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (lit == NULL) {
            gr_bfail(b, "out of memory%s%s", "", "");
            break;
        }
        kv[i] = gr_rule_new(b);
        s[0] = S_ref(gr_rule_literal(b, lit, strlen(lit)));
        s[1] = S_ch(b, ':');
        s[2] = S_ref(ws);
        s[3] = S_ref(vr);
        gr_alt_add(b, kv[i], s, 4);
        free(lit);
        i++;
    }
    /* first[i]: properties i.. with none written yet; rest[i]: some were */
    for (i = 0; i <= n; i++) {
        first[i] = gr_rule_new(b);
        rest[i] = gr_rule_new(b);
    }
    gr_alt_add(b, first[n], NULL, 0);
    gr_alt_add(b, rest[n], NULL, 0);
    for (i = 0; i < n && !b->failed; i++) {
        s[0] = S_ref(kv[i]);
        s[1] = S_ref(rest[i + 1]);
        gr_alt_add(b, first[i], s, 2);
        s[0] = S_ch(b, ',');
        s[1] = S_ref(ws);
        s[2] = S_ref(kv[i]);
        s[3] = S_ref(rest[i + 1]);
        gr_alt_add(b, rest[i], s, 4);
        if (optional[i]) {
            s[0] = S_ref(first[i + 1]);
            gr_alt_add(b, first[i], s, 1);
            s[0] = S_ref(rest[i + 1]);
            gr_alt_add(b, rest[i], s, 1);
        }
    }
    r = gr_rule_new(b);
    s[0] = S_ch(b, '{');
    s[1] = S_ref(first[0]);
    s[2] = S_ch(b, '}');
    gr_alt_add(b, r, s, 3);
    free(kv); free(first); free(rest); free(optional);
    json_decref(reqset);
    return b->failed ? -1 : r;
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

        if (gr_get_count(b, sc, "minItems", &min, path) < 0
            || gr_get_count(b, sc, "maxItems", &max, path) < 0)
        {
            return -1;
        }
        if (max >= 0 && max < min) {
            return gr_bfail(b, "maxItems < minItems at %s%s", path, "");
        }
        if (items != NULL) {
            if (!json_is_object(items)) {
                return gr_bfail(b, "'items' at %s%s must be a schema (tuple "
                                "items are not supported)", path, "");
            }
            path_join(sub, sizeof(sub), path, "items", NULL);
            v = gr_compile_schema(b, items, sub, depth + 1);
            if (v < 0) {
                return -1;
            }
        }
        return r_array(b, v, min, max);
    }
    if (strcmp(type, "string") == 0) {
        int64_t     min = 0, max = -1;
        int32_t     r = gr_compile_string_pattern(b, sc, path);

        if (r != -2) {
            return r;
        }
        if (gr_get_count(b, sc, "minLength", &min, path) < 0
            || gr_get_count(b, sc, "maxLength", &max, path) < 0)
        {
            return -1;
        }
        if (max >= 0 && max < min) {
            return gr_bfail(b, "maxLength < minLength at %s%s", path, "");
        }
        return r_string(b, min, max);
    }
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        int     integer = type[0] == 'i';
        int32_t r = gr_compile_bounds(b, sc, integer, path);

        if (r != -2) {
            return r;
        }
        return integer ? r_integer(b) : r_number(b);
    }
    if (strcmp(type, "boolean") == 0) {
        int32_t r = gr_rule_new(b);
        gsym    s;

        s = S_ref(gr_rule_literal(b, "true", 4));
        gr_alt_add(b, r, &s, 1);
        s = S_ref(gr_rule_literal(b, "false", 5));
        gr_alt_add(b, r, &s, 1);
        return b->failed ? -1 : r;
    }
    if (strcmp(type, "null") == 0) {
        return gr_rule_literal(b, "null", 4);
    }
    return gr_bfail(b, "unsupported type '%s' at %s", type, path);
}


int32_t
gr_compile_schema(gbuild *b, json_t *sc, const char *path, int depth)
{
    const char *key;
    json_t     *val, *v;
    char        sub[512];

    if (b->failed) {
        return -1;
    }
    if (depth > 64) {
        return gr_bfail(b, "the schema nests too deep at %s%s", path, "");
    }
    if (json_is_true(sc)) {
        return gr_r_value_any(b);
    }
    if (!json_is_object(sc)) {
        return gr_bfail(b, "the schema at %s%s must be an object", path, "");
    }
    json_object_foreach(sc, key, val) {
        if (!known_key(key)) {
            return gr_bfail(b, "unsupported keyword '%s' at %s", key, path);
        }
    }
    if ((v = json_object_get(sc, "$ref")) != NULL) {
        if (!json_is_string(v)) {
            return gr_bfail(b, "'$ref' at %s%s must be a string", path, "");
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
            return gr_bfail(b, "'enum' at %s%s must be a non-empty array",
                            path, "");
        }
        r = gr_rule_new(b);
        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            gsym s;

            path_join(sub, sizeof(sub), path, "enum", NULL);
            s = S_ref(rule_json_literal(b, json_array_get(v, i), sub));
            gr_alt_add(b, r, &s, 1);
        }
        return b->failed ? -1 : r;
    }
    if ((v = json_object_get(sc, "anyOf")) != NULL) {
        int32_t r;

        if (!json_is_array(v) || json_array_size(v) == 0) {
            return gr_bfail(b, "'anyOf' at %s%s must be a non-empty array",
                            path, "");
        }
        r = gr_rule_new(b);
        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            char idx[24];
            gsym s;

            snprintf(idx, sizeof(idx), "%zu", i);
            path_join(sub, sizeof(sub), path, "anyOf", idx);
            s = S_ref(gr_compile_schema(b, json_array_get(v, i), sub,
                                        depth + 1));
            gr_alt_add(b, r, &s, 1);
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
                return gr_bfail(b, "'%s' at %s needs a 'type'", typed[i], path);
            }
        }
        return gr_r_value_any(b);
    }
    if (json_is_string(v)) {
        return compile_type(b, sc, json_string_value(v), path, depth);
    }
    if (json_is_array(v) && json_array_size(v) > 0) {
        int32_t r = gr_rule_new(b);

        for (size_t i = 0; i < json_array_size(v) && !b->failed; i++) {
            json_t *t = json_array_get(v, i);
            gsym    s;

            if (!json_is_string(t)) {
                return gr_bfail(b, "'type' at %s%s must hold strings",
                                path, "");
            }
            s = S_ref(compile_type(b, sc, json_string_value(t), path, depth));
            gr_alt_add(b, r, &s, 1);
        }
        return b->failed ? -1 : r;
    }
    return gr_bfail(b, "'type' at %s%s must be a string or an array", path, "");
}
