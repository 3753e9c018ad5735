/*
 * libFuzzer target for the structured-output grammar (src/grammar.c): a
 * schema is checked (nalar_schema_check), compiled for the demo model's
 * vocabulary (models/nalar-kjv-target-f32.gguf) and walked at random
 * through its token masks, with rollbacks.  Byte 0 picks how the rest is
 * read: even, as schema text (the seeds in fuzz/corpus/grammar, the
 * trial's hostile schemas among them, and their mutations); odd, as
 * choices for a generated schema (objects, arrays, strings, numbers,
 * enums, anyOf, $ref to the root or to $defs, bounds, patterns and
 * formats, nesting, ...), so that
 * random structure is reached without valid JSON to mutate.  The rest of
 * the input also seeds the walk.
 *
 * What must hold (abort otherwise):
 * - the parse-time check and the compile agree: a schema the check refuses
 *   does not compile; one it accepts compiles, or is refused only for a
 *   budget it names;
 * - each token's mask bit equals nalar_gmatcher_allows (sampled tokens);
 * - an allowed token is accepted, unless the grammar names a budget;
 * - a walk that completes wrote one JSON value (jansson parses it);
 * - rolling back n tokens gives back the mask seen n tokens before;
 * and no crash, leak, hang (-timeout) or sanitizer report.
 *
 *   make fuzz FUZZ_SECONDS=300 FUZZ_ONLY=grammar
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "grammar.h"
#include "tokenizer.h"

#define VOCAB     "models/nalar-kjv-target-f32.gguf"
#define MAX_STEPS 96
#define MAX_GEN   4096        /* generated schema text, bytes */

static nalar_tokenizer     *tok;
static nalar_grammar_cache *cache;
static int32_t              n_vocab;


static void
die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_grammar: %s: %s\n", what, detail ? detail : "");
    abort();
}


/* input bytes as a stream of choices (zeros once they run out) */
typedef struct {
    const uint8_t *p;
    size_t         n, i;
} src;

static unsigned
take(src *s)
{
    return s->i < s->n ? s->p[s->i++] : 0;
}


static json_t *gen(src *s, int depth);

static json_t *
gen_leaf(src *s)
{
    static const char *const types[] = {
        "string", "integer", "number", "boolean", "null"
    };
    json_t *o = json_object();

    json_object_set_new(o, "type", json_string(types[take(s) % 5]));
    return o;
}


static json_t *
gen(src *s, int depth)
{
    unsigned c = take(s);
    json_t  *o, *a;
    char     name[16];
    int      k;

    if (depth > 6) {
        return gen_leaf(s);
    }
    switch (c % 15) {
    case 0: {
        json_t *props = json_object(), *req = json_array();
        unsigned bits;

        k = take(s) % 5;
        bits = take(s);
        for (int i = 0; i < k; i++) {
            snprintf(name, sizeof(name), "k%u", take(s) % 8);
            json_object_set_new(props, name, gen(s, depth + 1));
            if (bits >> i & 1) {
                json_array_append_new(req, json_string(name));
            }
        }
        o = json_pack("{s:s, s:o}", "type", "object", "properties", props);
        json_object_set_new(o, "required", req);
        if (take(s) % 4 == 0) {
            json_object_set_new(o, "additionalProperties",
                                take(s) % 2 ? json_false()
                                            : gen(s, depth + 1));
        }
        return o;
    }
    case 1:
        o = json_pack("{s:s, s:o}", "type", "array", "items",
                      gen(s, depth + 1));
        if (take(s) % 2) {
            json_object_set_new(o, "minItems", json_integer(take(s) % 3));
        }
        if (take(s) % 2) {
            json_object_set_new(o, "maxItems", json_integer(take(s) % 5));
        }
        return o;
    case 2:
        o = json_pack("{s:s}", "type", "string");
        if (take(s) % 2) {
            json_object_set_new(o, "maxLength", json_integer(take(s) % 9));
        }
        if (take(s) % 3 == 0) {
            json_object_set_new(o, "minLength", json_integer(take(s) % 4));
        }
        return o;
    case 3:
        a = json_array();
        k = 1 + take(s) % 80;        /* past 64 at times */
        for (int i = 0; i < k; i++) {
            unsigned v = take(s);

            json_array_append_new(a, v % 3 == 0 ? json_integer(v)
                                     : v % 3 == 1 ? json_null()
                                     : json_sprintf("s%u", v));
        }
        return json_pack("{s:o}", "enum", a);
    case 4:
    case 5:
        a = json_array();
        k = 1 + take(s) % 4;
        for (int i = 0; i < k; i++) {
            json_array_append_new(a, gen(s, depth + 1));
        }
        return json_pack("{s:o}", "anyOf", a);
    case 6:
        snprintf(name, sizeof(name), "#/$defs/d%u", take(s) % 3);
        return json_pack("{s:s}", "$ref", take(s) % 4 ? name : "#");
    case 7:
        return json_pack("{s:o}", "const", take(s) % 2
                         ? json_sprintf("c%u", take(s)) : json_integer(7));
    case 8:
        a = json_pack("[s, s]", "null", take(s) % 2 ? "string" : "integer");
        return json_pack("{s:o}", "type", a);
    case 9:
        return json_object();
    case 10:
        return json_pack("{s:s, s:s}", "type", "string", "format", "uuid");
    case 11:
        return json_pack("{s:s}", "type", "object");
    case 12: {
        /* the bounded keywords: numbers, pattern, formats */
        static const char *const pats[] = {
            "^[a-z]{1,5}$", "^(ab|cd)*x?$", "^\\d{3}-\\d{2}$", "^.$"
        };
        static const char *const fmts[] = {
            "date", "time", "date-time", "email", "uri", "ipv4", "ipv6"
        };

        switch (take(s) % 4) {
        case 0:
            return json_pack("{s:s, s:i, s:i}", "type", "integer",
                             "minimum", (int) take(s) - 128,
                             "maximum", (int) take(s) * 7);
        case 1:
            return json_pack("{s:s, s:f}", "type", "number",
                             "exclusiveMinimum", (double) take(s) / 4);
        case 2:
            return json_pack("{s:s, s:s}", "type", "string", "pattern",
                             pats[take(s) % 4]);
        default:
            return json_pack("{s:s, s:s}", "type", "string", "format",
                             fmts[take(s) % 7]);
        }
    }
    default:
        return gen_leaf(s);
    }
}


/* the generated schema's text (a root with three $defs), or NULL */
static char *
gen_schema(src *s)
{
    json_t *root = gen(s, 0), *defs = json_object();
    char   *txt;

    if (!json_is_object(root)) {
        json_decref(root);
        json_decref(defs);
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        char name[8];

        snprintf(name, sizeof(name), "d%d", i);
        json_object_set_new(defs, name, gen(s, 1));
    }
    json_object_set_new(root, "$defs", defs);
    txt = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (txt != NULL && strlen(txt) > MAX_GEN) {
        free(txt);
        return NULL;
    }
    return txt;
}


static uint64_t
rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}


static uint64_t
mask_hash(const uint32_t *m)
{
    uint64_t h = 1469598103934665603ULL;

    for (int32_t w = 0; w < (n_vocab + 31) / 32; w++) {
        h = (h ^ m[w]) * 1099511628211ULL;
    }
    return h;
}


/* 1 when the grammar stopped for a budget it names */
static int
budget(const char *why)
{
    return why != NULL && strstr(why, "budget") != NULL;
}


static void
walk(nalar_grammar *g, uint64_t seed)
{
    nalar_gmatcher *m = nalar_gmatcher_create(g);
    static int32_t  allowed[1 << 17];
    static char     out[MAX_STEPS * 64 + 1];
    uint64_t        hist[MAX_STEPS + 1];
    size_t          len = 0;
    int             n = 0, completed = 0;
    uint64_t        x = seed | 1;

    if (m == NULL) {
        die("matcher", "out of memory");
    }
    while (n < MAX_STEPS) {
        const uint32_t *mask = nalar_gmatcher_mask(m);
        int32_t         na = 0, pick;
        char            b[64];
        int             k, eog = 0;

        if (mask == NULL) {
            if (!budget(nalar_gmatcher_error(m))) {
                die("mask failed", nalar_gmatcher_error(m));
            }
            break;
        }
        hist[n] = mask_hash(mask);
        for (int32_t w = 0; w * 32 < n_vocab; w++) {
            for (uint32_t v = mask[w]; v != 0; v &= v - 1) {
                int32_t i = w * 32 + __builtin_ctz(v);

                if (nalar_tok_is_eog(tok, i)) {
                    eog = 1;
                } else if (na < (int32_t) (sizeof(allowed) / 4)) {
                    allowed[na++] = i;
                }
            }
        }
        /* a few tokens' bits against the per-token check */
        for (int t = 0; t < 4; t++) {
            int32_t i = (int32_t) (rng_next(&x) % n_vocab);
            int     bit = (mask[i >> 5] >> (i & 31)) & 1;

            if (bit != nalar_gmatcher_allows(m, i)
                && !budget(nalar_gmatcher_error(m)))
            {
                die("mask and allows disagree", NULL);
            }
        }
        if (eog != nalar_gmatcher_can_end(m)) {
            die("end-of-generation in the mask and can_end disagree", NULL);
        }
        if (eog && (na == 0 || rng_next(&x) % 4 == 0)) {
            completed = 1;
            break;
        }
        if (na == 0) {
            die("a state allows nothing", NULL);
        }
        pick = allowed[rng_next(&x) % na];
        /* prefer one-byte tokens half of the time, so that strings end */
        for (int t = 0; t < 6 && rng_next(&x) % 2; t++) {
            int32_t c = allowed[rng_next(&x) % na];

            if (nalar_token_bytes(tok, c, b, sizeof(b)) == 1) {
                pick = c;
                break;
            }
        }
        if (nalar_gmatcher_accept(m, pick) != 0) {
            if (!budget(nalar_gmatcher_error(m))) {
                die("an allowed token was refused", nalar_gmatcher_error(m));
            }
            break;
        }
        k = nalar_token_bytes(tok, pick, b, sizeof(b));
        if (k > 0 && len + k < sizeof(out)) {
            memcpy(out + len, b, k);
            len += k;
        }
        n++;
        /* now and then, roll back and check the mask comes back */
        if (n > 2 && rng_next(&x) % 16 == 0) {
            int32_t         back = 1 + (int32_t) (rng_next(&x) % (n - 1));
            const uint32_t *mk;

            nalar_gmatcher_rollback(m, back);
            mk = nalar_gmatcher_mask(m);
            if (mk != NULL && mask_hash(mk) != hist[n - back]) {
                die("rollback did not restore the mask", NULL);
            }
            if (nalar_gmatcher_n_accepted(m) != n - back) {
                die("rollback: wrong count", NULL);
            }
            /* the text no longer matches the state: stop the walk */
            break;
        }
    }
    out[len] = '\0';
    if (completed) {
        json_error_t je;
        json_t      *v = json_loads(out, JSON_DECODE_ANY, &je);

        if (v == NULL) {
            die("a completed walk is not JSON", out);
        }
        json_decref(v);
    }
    nalar_gmatcher_destroy(m);
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    nalar_err  err;
    gguf_file *f = gguf_open(VOCAB, &err);

    (void) argc;
    (void) argv;
    if (f == NULL) {
        die("open " VOCAB " (run from the repository root)", err.msg);
    }
    tok = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    if (tok == NULL) {
        die("tokenizer", err.msg);
    }
    n_vocab = nalar_tok_n_vocab(tok);
    /* a small cache, so that eviction runs too */
    cache = nalar_grammar_cache_create(tok, 4);
    if (cache == NULL) {
        die("grammar cache", "out of memory");
    }
    return 0;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char           err[512], err2[512];
    char          *txt;
    size_t         len;
    int            rc;
    nalar_grammar *g;
    uint64_t       seed = 88172645463325252ULL;

    if (size == 0) {
        return 0;
    }
    for (size_t i = 0; i < size; i++) {
        seed = (seed ^ data[i]) * 1099511628211ULL;
    }
    if (data[0] % 2 == 0) {
        txt = malloc(size);
        if (txt == NULL) {
            return 0;
        }
        memcpy(txt, data + 1, size - 1);
        txt[size - 1] = '\0';
        len = size - 1;
    } else {
        src s = { data + 1, size - 1, 0 };

        txt = gen_schema(&s);
        if (txt == NULL) {
            return 0;
        }
        len = strlen(txt);
    }
    rc = nalar_schema_check(txt, len, err, sizeof(err));
    g = nalar_grammar_get(cache, NALAR_GRAMMAR_JSON_SCHEMA, txt, len, NULL,
                          err2, sizeof(err2));
    if (rc != 0 && g != NULL) {
        die("the check refused what compiled", err);
    }
    if (rc == 0 && g == NULL && !budget(err2)) {
        die("the check accepted what did not compile", err2);
    }
    if (g != NULL) {
        walk(g, seed);
        nalar_grammar_release(g);
    }
    free(txt);
    return 0;
}
