/*
 * The grammar engine (grammar.h) on the demo model's vocabulary: schema
 * checks name what they refuse; random walks through the token masks of the
 * test schemas (t/data/grammar/schemas.json) give complete JSON that jansson
 * parses (and, written to $GRAMMAR_WALK_OUT as JSON lines, that the .t
 * validates with an independent validator); a mask equals the per-token
 * check for every token; rollback gives back the earlier masks; forced
 * tokens are allowed one after the other; compiled grammars are cached,
 * and caches built on two threads at once for two vocabularies have sound
 * vocabulary tries.
 * At a branching point, sampling from logits masked as the engine masks
 * them (-inf off the grammar) follows the model's distribution renormalised
 * over the allowed tokens, with temperature, top-k, top-p and logit_bias
 * composed: nalar_sampler_dist equals an independent reference, and a
 * chi-square test of 20000 draws passes.
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "grammar.h"
#include "sampler.h"
#include "tap.h"
#include "grammar_keywords.h"
#include "tokenizer.h"

#define MODEL "models/nalar-kjv-target-f32.gguf"
#define SCHEMAS "t/data/grammar/schemas.json"

static nalar_tokenizer *tok;


static void
test_check(void)
{
    static const struct { const char *schema; const char *needle; } bad[] = {
        { "{\"type\":\"object\",\"patternProperties\":{}}",
          "'patternProperties'" },
        { "{\"oneOf\":[{\"type\":\"string\"}]}", "'oneOf'" },
        { "{\"type\":\"integer\",\"minimum\":3,\"multipleOf\":2}",
          "'multipleOf'" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"int\"}}}",
          "'int' at #/properties/a" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{}},"
          "\"required\":[\"b\"]}", "'b'" },
        { "{\"$ref\":\"#/components/x\"}", "#/components/x" },
        { "{\"$ref\":\"#/$defs/missing\"}", "points nowhere" },
        { "{\"type\":\"string\",\"format\":\"duration\"}", "'duration'" },
        { "{\"type\":", "not JSON" },
        { "{\"type\":\"array\",\"items\":[{}]}", "tuple" },
        { "{\"type\":\"string\",\"maxLength\":1000000}", "'maxLength'" },
        /* recursion that can recur before a byte (left recursion) */
        { "{\"$defs\":{\"n\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},"
          "{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/n\"}",
          "left recursion through $ref '#/$defs/n'" },
    };
    static const char *good[] = {
        "{\"type\":\"object\"}",
        "{}",
        "{\"type\":[\"string\",\"null\"],\"description\":\"x\"}",
        "{\"type\":\"string\",\"format\":\"uuid\"}",
        "{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},"
        "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}]}},"
        "\"$ref\":\"#/$defs/n\"}",
    };
    char err[256];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = nalar_schema_check(bad[i].schema, strlen(bad[i].schema),
                                    err, sizeof(err));

        ok(rc == -1 && strstr(err, bad[i].needle) != NULL,
           "refused: %s (%s)", bad[i].schema, err);
    }
    /* 400 arrays of up to 4096 items: refused, whatever it unrolls to */
    {
        static char big[20000];
        int         n = sprintf(big, "{\"type\":\"object\","
                                "\"properties\":{");

        for (int i = 0; i < 400; i++) {
            n += sprintf(big + n, "%s\"p%d\":{\"type\":\"array\","
                         "\"maxItems\":4096}", i ? "," : "", i);
        }
        n += sprintf(big + n, "}}");
        ok(nalar_schema_check(big, n, err, sizeof(err)) == -1
           && strstr(err, "too large") != NULL, "refused: a schema that "
           "unrolls too far (%s)", err);
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        int rc = nalar_schema_check(good[i], strlen(good[i]), err,
                                    sizeof(err));

        ok(rc == 0, "accepted: %s %s", good[i], err);
    }
}


/* bytes of a token list */
static size_t
detok(const int32_t *ids, int n, char *out, size_t cap)
{
    size_t len = 0;

    for (int i = 0; i < n; i++) {
        char b[64];
        int  k = nalar_token_bytes(tok, ids[i], b, sizeof(b));

        if (k > 0 && len + k < cap) {
            memcpy(out + len, b, k);
            len += k;
        }
    }
    out[len] = '\0';
    return len;
}


static uint64_t
mask_hash(const uint32_t *m, int32_t n_words)
{
    uint64_t h = 1469598103934665603ULL;

    for (int32_t i = 0; i < n_words; i++) {
        h = (h ^ m[i]) * 1099511628211ULL;
    }
    return h;
}


#define MAX_WALK 1500

/*
 * A random walk: each step a token drawn uniformly from the mask (half of
 * the time from its one-byte tokens, so that strings end), the end where
 * allowed with probability 1/4.  Checks every token's bit against
 * nalar_gmatcher_allows on the way.  Returns 1 when the value completed.
 */
static int
walk(nalar_grammar *g, nalar_rng *rng, char *out, size_t cap, int *mask_bad,
     int *rollback_bad)
{
    nalar_gmatcher *m = nalar_gmatcher_create(g);
    int32_t         n_vocab = nalar_tok_n_vocab(tok), n_words;
    int32_t        *allowed = malloc(n_vocab * sizeof(int32_t));
    int32_t        *short_ok = malloc(n_vocab * sizeof(int32_t));
    int32_t         ids[MAX_WALK];
    uint64_t        hashes[MAX_WALK + 1];
    int             n = 0, completed = 0;

    n_words = (n_vocab + 31) / 32;
    while (n < MAX_WALK) {
        const uint32_t *mask = nalar_gmatcher_mask(m);
        int32_t         na = 0, ns = 0, pick;
        int             eog_ok = 0;

        if (mask == NULL) {
            break;
        }
        hashes[n] = mask_hash(mask, n_words);
        for (int32_t i = 0; i < n_vocab; i++) {
            int bit = (mask[i >> 5] >> (i & 31)) & 1;

            if (bit != nalar_gmatcher_allows(m, i)) {
                (*mask_bad)++;
            }
            if (!bit) {
                continue;
            }
            if (nalar_tok_is_eog(tok, i)) {
                eog_ok = 1;
                continue;
            }
            allowed[na++] = i;
            {
                char b[64];

                if (nalar_token_bytes(tok, i, b, sizeof(b)) == 1) {
                    short_ok[ns++] = i;
                }
            }
        }
        if (nalar_gmatcher_done(m)) {
            completed = 1;
            break;
        }
        if (eog_ok != nalar_gmatcher_can_end(m)) {
            (*mask_bad)++;
        }
        if (eog_ok && (na == 0 || nalar_rng_next(rng) % 4 == 0)) {
            completed = 1;
            break;
        }
        if (na == 0) {
            break;
        }
        if (ns > 0 && nalar_rng_next(rng) % 2 == 0) {
            pick = short_ok[nalar_rng_next(rng) % ns];
        } else {
            pick = allowed[nalar_rng_next(rng) % na];
        }
        if (nalar_gmatcher_accept(m, pick) != 0) {
            (*mask_bad)++;
            break;
        }
        ids[n++] = pick;
    }
    /* rolling back gives back the masks seen on the way */
    if (n > 2) {
        int32_t back = 1 + (int32_t) (nalar_rng_next(rng) % (n - 1));
        const uint32_t *mask;

        nalar_gmatcher_rollback(m, back);
        mask = nalar_gmatcher_mask(m);
        if (nalar_gmatcher_n_accepted(m) != n - back
            || mask_hash(mask, n_words) != hashes[n - back])
        {
            (*rollback_bad)++;
        }
    }
    detok(ids, n, out, cap);
    free(allowed);
    free(short_ok);
    nalar_gmatcher_destroy(m);
    return completed;
}


static void
test_walks(void)
{
    json_error_t         je;
    json_t              *all = json_load_file(SCHEMAS, 0, &je);
    nalar_grammar_cache *c = nalar_grammar_cache_create(tok, 0);
    const char          *walk_out = getenv("GRAMMAR_WALK_OUT");
    int                  walks = getenv("GRAMMAR_WALKS")
                                 ? atoi(getenv("GRAMMAR_WALKS")) : 20;
    FILE                *fo = walk_out ? fopen(walk_out, "w") : NULL;
    nalar_rng            rng;
    static char          out[65536];

    ok(all != NULL && json_array_size(all) == 10, "10 test schemas");
    ok(c != NULL, "grammar cache");
    if (all == NULL || c == NULL) {
        return;
    }
    nalar_rng_seed(&rng, 42);
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t        *e = json_array_get(all, i);
        const char    *name = json_string_value(json_object_get(e, "name"));
        char          *txt = json_dumps(json_object_get(e, "schema"),
                                        JSON_PRESERVE_ORDER | JSON_COMPACT);
        char           err[256];
        double         cs = -1, cs2 = -1;
        nalar_grammar *g, *g2;
        int            complete = 0, parsed = 0, mask_bad = 0,
                       rollback_bad = 0, forced_bad = 0;

        ok(nalar_schema_check(txt, strlen(txt), err, sizeof(err)) == 0,
           "%s: schema check %s", name, err);
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, txt, strlen(txt),
                              &cs, err, sizeof(err));
        ok(g != NULL, "%s: compiled in %.2f ms %s", name, cs * 1e3, err);
        if (g == NULL) {
            free(txt);
            continue;
        }
        g2 = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, txt, strlen(txt),
                               &cs2, err, sizeof(err));
        ok(g2 == g && cs2 == 0, "%s: the second get is a cache hit", name);
        nalar_grammar_release(g2);
        for (int w = 0; w < walks; w++) {
            json_t *v;

            if (walk(g, &rng, out, sizeof(out), &mask_bad, &rollback_bad)) {
                complete++;
            }
            v = json_loads(out, JSON_DECODE_ANY, &je);
            if (v != NULL) {
                parsed++;
                json_decref(v);
            } else if (parsed + 3 > w) {
                diag("%s: not JSON: %s", name, out);
            }
            if (fo != NULL) {
                json_t *line = json_pack("{s:s, s:s}", "schema", name,
                                         "output", out);
                char   *lt = json_dumps(line, JSON_COMPACT);

                fprintf(fo, "%s\n", lt);
                free(lt);
                json_decref(line);
            }
        }
        is_int(complete, walks, "%s: %d walks complete", name, walks);
        is_int(parsed, walks, "%s: every walk's output is JSON", name);
        is_int(mask_bad, 0, "%s: masks agree with per-token checks", name);
        is_int(rollback_bad, 0, "%s: rollback restores the masks", name);
        /* forced tokens from the start are allowed one after another */
        {
            nalar_gmatcher *m = nalar_gmatcher_create(g);
            int32_t         f[64];
            int             nf = nalar_gmatcher_forced(m, f, 64);

            for (int k = 0; k < nf; k++) {
                if (nalar_gmatcher_accept(m, f[k]) != 0) {
                    forced_bad++;
                }
            }
            detok(f, nf, out, sizeof(out));
            diag("%s: %d forced tokens at the start: %s", name, nf, out);
            ok(nf > 0 && forced_bad == 0, "%s: forced tokens accepted",
               name);
            nalar_gmatcher_destroy(m);
        }
        nalar_grammar_release(g);
        free(txt);
    }
    json_decref(all);
    /* json_object */
    {
        char           err[256];
        nalar_grammar *g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_OBJECT,
                                             NULL, 0, NULL, err, sizeof(err));
        int            objs = 0, mask_bad = 0, rollback_bad = 0;

        ok(g != NULL, "json_object grammar %s", err);
        for (int w = 0; g && w < walks; w++) {
            json_t *v;

            walk(g, &rng, out, sizeof(out), &mask_bad, &rollback_bad);
            v = json_loads(out, 0, &je);
            /* a walk that stopped at MAX_WALK is a prefix; count objects */
            if (v != NULL && json_is_object(v)) {
                objs++;
            }
            json_decref(v);
        }
        ok(objs > 0, "json_object: %d of %d walks are objects", objs, walks);
        is_int(mask_bad, 0, "json_object: masks agree");
        nalar_grammar_release(g);
    }
    if (fo != NULL) {
        fclose(fo);
    }
    nalar_grammar_cache_destroy(c);
}


/* 1 when the schema's grammar takes the JSON text v (byte by byte), 0 when
 * not, -1 when the schema does not compile */
static int
takes(nalar_grammar_cache *c, const char *schema, const char *v)
{
    char           err[256];
    nalar_grammar *g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, schema,
                                         strlen(schema), NULL, err,
                                         sizeof(err));
    int            r;

    if (g == NULL) {
        diag("%s: %s", schema, err);
        return -1;
    }
    r = nalar_grammar_match(g, v, strlen(v));
    nalar_grammar_release(g);
    return r;
}


/* every integer of [-1200, 1200] against ranges with ends at the digit
 * counts' edges, negative and across 0 */
static void
check_integer_ranges(nalar_grammar_cache *c)
{
    static const int ends[] = { -1000, -101, -100, -99, -10, -9, -1, 0,
                                1, 9, 10, 99, 100, 101, 999, 1000 };
    int  n = sizeof(ends) / sizeof(ends[0]), bad_n = 0, ranges = 0;
    char err[256];

    for (int a = 0; a < n; a++) {
        for (int z = a; z < n; z++) {
            char           sc[128], v[16];
            nalar_grammar *g;

            snprintf(sc, sizeof(sc), "{\"type\":\"integer\",\"minimum\":"
                     "%d,\"maximum\":%d}", ends[a], ends[z]);
            g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, sc,
                                  strlen(sc), NULL, err, sizeof(err));
            if (g == NULL) {
                bad_n++;
                continue;
            }
            ranges++;
            for (int x = -1200; x <= 1200; x++) {
                int want = x >= ends[a] && x <= ends[z];

                snprintf(v, sizeof(v), "%d", x);
                if (nalar_grammar_match(g, v, strlen(v)) != want) {
                    if (bad_n++ < 5) {
                        diag("%s: %s wrong", sc, v);
                    }
                }
                /* with a leading zero: never */
                snprintf(v, sizeof(v), "0%d", x < 0 ? -x : x);
                if (nalar_grammar_match(g, v, strlen(v))) {
                    bad_n++;
                }
            }
            nalar_grammar_release(g);
        }
    }
    is_int(bad_n, 0, "%d integer ranges: every value of [-1200, 1200] "
           "in or out as it should be", ranges);
}


/* number ranges: values of 0.05 steps against bounds with fractions */
static void
check_number_ranges(nalar_grammar_cache *c)
{
    static const char *ends[] = { "-2.5", "-1", "-0.25", "0", "0.1",
                                  "1", "1.75", "10" };
    int  n = sizeof(ends) / sizeof(ends[0]), bad_n = 0, ranges = 0;
    char err[256];

    for (int a = 0; a < n; a++) {
        for (int z = a; z < n; z++) {
            for (int ex = 0; ex < 2; ex++) {
                char           sc[160], v[32];
                nalar_grammar *g;
                double         lo = strtod(ends[a], NULL),
                               hi = strtod(ends[z], NULL);

                if (ex && lo == hi) {
                    continue;
                }
                snprintf(sc, sizeof(sc), "{\"type\":\"number\",\"%s\":%s"
                         ",\"%s\":%s}", ex ? "exclusiveMinimum"
                                           : "minimum", ends[a],
                         ex ? "exclusiveMaximum" : "maximum", ends[z]);
                g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, sc,
                                      strlen(sc), NULL, err,
                                      sizeof(err));
                if (g == NULL) {
                    diag("%s: %s", sc, err);
                    bad_n++;
                    continue;
                }
                ranges++;
                for (int k = -300; k <= 300; k++) {
                    double x = k * 0.05;
                    int    want = ex ? (x > lo + 1e-9 && x < hi - 1e-9)
                                     : (x >= lo - 1e-9 && x <= hi + 1e-9);

                    snprintf(v, sizeof(v), "%.2f", x);
                    if (strcmp(v, "-0.00") == 0) {
                        continue;
                    }
                    if (nalar_grammar_match(g, v, strlen(v)) != want) {
                        if (bad_n++ < 5) {
                            diag("%s: %s wrong", sc, v);
                        }
                    }
                }
                nalar_grammar_release(g);
            }
        }
    }
    is_int(bad_n, 0, "%d number ranges: values in 0.05 steps in or out "
           "as they should be", ranges);
}


/*
 * The keywords real schemas use, each value walked through the grammar
 * byte by byte: bounds of integers at their edges (lo-1, lo, hi, hi+1,
 * digit-count boundaries, negative ranges, ranges across 0, the int64
 * extremes) and of numbers, string lengths in code points, item counts,
 * patterns and formats.
 */
static void
test_keywords(void)
{
    nalar_grammar_cache *c = nalar_grammar_cache_create(tok, 256);
    int                  wrong = 0;
    char                 err[256];

    for (size_t i = 0; i < sizeof(kw_cases) / sizeof(kw_cases[0]); i++) {
        int r = takes(c, kw_cases[i].schema, kw_cases[i].v);

        if (r != kw_cases[i].want) {
            wrong++;
            diag("%s %s: %d, want %d", kw_cases[i].schema, kw_cases[i].v,
                 r, kw_cases[i].want);
        }
    }
    is_int(wrong, 0, "%zu values at the keywords' edges taken or refused as "
           "they should be", sizeof(kw_cases) / sizeof(kw_cases[0]));
    for (size_t i = 0; i < sizeof(kw_bad) / sizeof(kw_bad[0]); i++) {
        int rc = nalar_schema_check(kw_bad[i].schema,
                                    strlen(kw_bad[i].schema), err,
                                    sizeof(err));

        ok(rc == -1 && strstr(err, kw_bad[i].needle) != NULL,
           "refused: %s (%s)", kw_bad[i].schema, err);
    }
    check_integer_ranges(c);
    check_number_ranges(c);
    nalar_grammar_cache_destroy(c);
}


/* ---- hostile schemas: none crashes, hangs or loses a choice ---- */

/*
 * Produces `text` through g's masks: at each point the longest allowed
 * token whose bytes start the rest.  1 when all of it went in and the
 * value may end there.
 */
static const char *produce_why;     /* why the last produce stopped */

static int
produce(nalar_grammar *g, const char *text)
{
    nalar_gmatcher *m = nalar_gmatcher_create(g);
    int32_t         n_vocab = nalar_tok_n_vocab(tok);
    size_t          pos = 0, len = strlen(text);
    int             okk;

    produce_why = NULL;
    while (pos < len) {
        const uint32_t *mask = nalar_gmatcher_mask(m);
        int32_t         best = -1;
        int             best_len = 0;

        if (mask == NULL) {
            produce_why = nalar_gmatcher_error(m);
            break;
        }
        for (int32_t i = 0; i < n_vocab; i++) {
            char b[64];
            int  k;

            if (!((mask[i >> 5] >> (i & 31)) & 1)) {
                continue;
            }
            k = nalar_token_bytes(tok, i, b, sizeof(b));
            if (k > best_len && (size_t) k <= len - pos
                && memcmp(b, text + pos, k) == 0)
            {
                best = i;
                best_len = k;
            }
        }
        if (best < 0 || nalar_gmatcher_accept(m, best) != 0) {
            produce_why = best < 0 ? "no token" : nalar_gmatcher_error(m);
            break;
        }
        pos += best_len;
    }
    okk = pos == len && nalar_gmatcher_can_end(m);
    nalar_gmatcher_destroy(m);
    return okk;
}


/*
 * A random walk through g's masks (no per-token cross-check, so it is fast
 * enough for long values): the completed value in out, 1 when it
 * completed within max_steps.  A NULL mask ends it (err: the reason).
 */
static int
quick_walk(nalar_grammar *g, nalar_rng *rng, int max_steps, char *out,
           size_t cap, const char **why)
{
    nalar_gmatcher *m = nalar_gmatcher_create(g);
    int32_t         n_vocab = nalar_tok_n_vocab(tok);
    int32_t        *allowed = malloc(n_vocab * sizeof(int32_t));
    size_t          len = 0;
    int             done = 0;

    *why = NULL;
    for (int step = 0; step < max_steps && !done; step++) {
        const uint32_t *mask = nalar_gmatcher_mask(m);
        int32_t         na = 0, pick;
        char            b[64];
        int             k;

        if (mask == NULL) {
            *why = nalar_gmatcher_error(m);
            break;
        }
        if (nalar_gmatcher_done(m)
            || (nalar_gmatcher_can_end(m) && nalar_rng_next(rng) % 4 == 0))
        {
            done = 1;
            break;
        }
        for (int32_t w = 0; w * 32 < n_vocab; w++) {
            for (uint32_t x = mask[w]; x != 0; x &= x - 1) {
                int32_t i = w * 32 + __builtin_ctz(x);

                if (i < n_vocab && !nalar_tok_is_eog(tok, i)) {
                    allowed[na++] = i;
                }
            }
        }
        if (na == 0) {
            done = nalar_gmatcher_can_end(m);
            break;
        }
        /* short tokens half of the time, so that strings end */
        pick = allowed[nalar_rng_next(rng) % na];
        for (int t = 0; t < 8 && nalar_rng_next(rng) % 2; t++) {
            int32_t c = allowed[nalar_rng_next(rng) % na];

            if (nalar_token_bytes(tok, c, b, sizeof(b)) == 1) {
                pick = c;
                break;
            }
        }
        if (nalar_gmatcher_accept(m, pick) != 0) {
            *why = nalar_gmatcher_error(m);
            break;
        }
        k = nalar_token_bytes(tok, pick, b, sizeof(b));
        if (k > 0 && len + k < cap) {
            memcpy(out + len, b, k);
            len += k;
        }
    }
    out[len] = '\0';
    free(allowed);
    nalar_gmatcher_destroy(m);
    return done;
}


/* A growing string buffer for building schemas. */
typedef struct { char *s; size_t n, cap; } sbuf;

static void
sb_add(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    int     k;

    for (;;) {
        va_start(ap, fmt);
        k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (b->s != NULL && (size_t) k < b->cap - b->n) {
            b->n += k;
            return;
        }
        b->cap = (b->cap ? b->cap * 2 : 4096) + (size_t) k;
        b->s = realloc(b->s, b->cap);
    }
}


/* the trial's schemas (also fuzz/corpus/grammar's seeds) */
static char *
nested_objects(int depth)
{
    sbuf b = {0};

    for (int i = 0; i < depth; i++) {
        sb_add(&b, "{\"type\":\"object\",\"properties\":{\"a\":");
    }
    sb_add(&b, "{\"type\":\"integer\"}");
    for (int i = 0; i < depth; i++) {
        sb_add(&b, "},\"required\":[\"a\"]}");
    }
    return b.s;
}


static void
test_hostile(void)
{
    nalar_grammar_cache *c = nalar_grammar_cache_create(tok, 0);
    nalar_rng            rng;
    char                 err[256];
    static char          out[1 << 20];
    const char          *why;
    nalar_grammar       *g;

    nalar_rng_seed(&rng, 7);
    /* nested objects, 20 to 32 deep: compile, and a walk gives a document
     * with the integer at the bottom */
    for (int depth = 20; depth <= 32; depth += 4) {
        char   *s = nested_objects(depth);
        int     complete, deep = 0;
        json_t *v, *x;

        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, s, strlen(s),
                              NULL, err, sizeof(err));
        ok(g != NULL, "%d nested objects compile %s", depth,
           g ? "" : err);
        complete = g && quick_walk(g, &rng, 4000, out, sizeof(out), &why);
        v = json_loads(out, 0, NULL);
        for (x = v; json_is_object(x); x = json_object_get(x, "a")) {
            deep++;
        }
        ok(complete && deep == depth && json_is_integer(x), "%d nested "
           "objects: a walk gives a valid document (%s)", depth, out);
        json_decref(v);
        nalar_grammar_release(g);
        free(s);
    }
    /* an enum of 200 short strings: every entry reachable, the 200th too */
    {
        sbuf b = {0};
        int  bad = 0;

        sb_add(&b, "{\"enum\":[");
        for (int i = 0; i < 200; i++) {
            sb_add(&b, "%s\"s%d\"", i ? "," : "", i);
        }
        sb_add(&b, "]}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g != NULL, "an enum of 200 strings compiles %s", g ? "" : err);
        for (int i = 0; g && i < 200; i++) {
            char want[16];

            snprintf(want, sizeof(want), "\"s%d\"", i);
            bad += !produce(g, want);
        }
        ok(g && bad == 0, "every one of the 200 entries can be produced "
           "(%d cannot)", bad);
        ok(g && produce(g, "\"s199\"") && !produce(g, "\"s200\""),
           "the 200th entry is produced, a 201st is not");
        nalar_grammar_release(g);
        free(b.s);
    }
    /* "type": ["null", ...] x 1000 */
    {
        sbuf b = {0};

        sb_add(&b, "{\"type\":[");
        for (int i = 0; i < 1000; i++) {
            sb_add(&b, "%s\"null\"", i ? "," : "");
        }
        sb_add(&b, "]}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g != NULL, "type: [\"null\" x 1000] compiles %s", g ? "" : err);
        ok(g && quick_walk(g, &rng, 100, out, sizeof(out), &why)
           && strcmp(out, "null") == 0, "and a walk gives null (%s)", out);
        nalar_grammar_release(g);
        free(b.s);
    }
    /* an anyOf chain through $defs with 2^18 paths to the same integer */
    {
        sbuf b = {0};

        sb_add(&b, "{\"$defs\":{");
        for (int i = 0; i < 18; i++) {
            sb_add(&b, "\"d%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\"},"
                   "{\"$ref\":\"#/$defs/d%d\"}]},", i, i + 1, i + 1);
        }
        sb_add(&b, "\"d18\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/d0\"}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g != NULL, "an anyOf chain with 2^18 paths compiles %s",
           g ? "" : err);
        ok(g && produce(g, "-12345"), "and produces an integer");
        nalar_grammar_release(g);
        free(b.s);
    }
    /* anyOf of 100 tool calls (tool_choice "required" with 100 tools): the
     * 100th reachable */
    {
        sbuf b = {0};
        char want[128];

        sb_add(&b, "{\"anyOf\":[");
        for (int i = 0; i < 100; i++) {
            sb_add(&b, "%s{\"type\":\"object\",\"properties\":{\"name\":"
                   "{\"const\":\"tool_%d\"},\"arguments\":{\"type\":\"object\","
                   "\"properties\":{\"x\":{\"type\":\"integer\"}},"
                   "\"required\":[\"x\"]}},\"required\":[\"name\","
                   "\"arguments\"]}", i ? "," : "", i);
        }
        sb_add(&b, "]}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g != NULL, "anyOf of 100 tool calls compiles %s", g ? "" : err);
        snprintf(want, sizeof(want),
                 "{\"name\": \"tool_99\", \"arguments\": {\"x\": 7}}");
        ok(g && produce(g, want), "the 100th tool can be called");
        snprintf(want, sizeof(want),
                 "{\"name\": \"tool_64\", \"arguments\": {\"x\": 7}}");
        ok(g && produce(g, want), "so can the 65th");
        nalar_grammar_release(g);
        free(b.s);
    }
    /* an anyOf of 65 consts */
    {
        sbuf b = {0};

        sb_add(&b, "{\"anyOf\":[");
        for (int i = 0; i < 65; i++) {
            sb_add(&b, "%s{\"const\":%d}", i ? "," : "", 1000 + i);
        }
        sb_add(&b, "]}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g && produce(g, "1064") && !produce(g, "1065"),
           "anyOf: the 65th const is produced");
        nalar_grammar_release(g);
        free(b.s);
    }
    nalar_grammar_cache_destroy(c);
}


/* hostile schemas, continued: 10k required properties, recursion refused
 * or walked, an ambiguity that doubles per level */
static void
test_hostile_large(void)
{
    nalar_grammar_cache *c = nalar_grammar_cache_create(tok, 0);
    nalar_rng            rng;
    char                 err[256];
    static char          out[1 << 20];
    const char          *why;
    nalar_grammar       *g;

    nalar_rng_seed(&rng, 7);
    /* 10k required properties: linear compile, and a walk writes them all */
    {
        sbuf    b = {0};
        json_t *v;
        double  cs = 0;

        sb_add(&b, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < 10000; i++) {
            sb_add(&b, "%s\"p%d\":{\"type\":\"boolean\"}", i ? "," : "", i);
        }
        sb_add(&b, "},\"required\":[");
        for (int i = 0; i < 10000; i++) {
            sb_add(&b, "%s\"p%d\"", i ? "," : "", i);
        }
        sb_add(&b, "]}");
        ok(nalar_schema_check(b.s, b.n, err, sizeof(err)) == 0,
           "10k required properties pass the check %s", err);
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, &cs,
                              err, sizeof(err));
        ok(g != NULL, "and compile (%.1f ms) %s", cs * 1e3, g ? "" : err);
        v = g && quick_walk(g, &rng, 200000, out, sizeof(out), &why)
            ? json_loads(out, 0, NULL) : NULL;
        ok(v != NULL && json_object_size(v) == 10000
           && json_is_boolean(json_object_get(v, "p9999")),
           "a walk writes all 10000 (%s)", why ? why : "");
        json_decref(v);
        nalar_grammar_release(g);
        free(b.s);
    }
    /* recursion that cannot produce a byte, or never ends: a 400 */
    {
        static const struct { const char *s, *needle; } rec[] = {
            { "{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"}]}",
              "left recursion" },
            { "{\"$ref\":\"#\"}", "left recursion" },
            { "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":"
              "[{\"type\":\"null\"},{\"$ref\":\"#/$defs/a\"}]}},"
              "\"$ref\":\"#/$defs/a\"}", "left recursion" },
            { "{\"anyOf\":[{\"type\":\"null\"},{\"anyOf\":[{\"$ref\":\"#\"},"
              "{\"type\":\"string\"}]}]}", "left recursion" },
            { "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
              "\"required\":[\"a\"]}", "without end" },
            { "{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":"
              "{\"$ref\":\"#/$defs/a\"},\"minItems\":1}},"
              "\"$ref\":\"#/$defs/a\"}", "without end" },
        };

        for (size_t i = 0; i < sizeof(rec) / sizeof(rec[0]); i++) {
            int rc = nalar_schema_check(rec[i].s, strlen(rec[i].s), err,
                                        sizeof(err));

            ok(rc == -1 && strstr(err, rec[i].needle) != NULL,
               "refused at parse time: %s (%s)", rec[i].s, err);
            g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, rec[i].s,
                                  strlen(rec[i].s), NULL, err, sizeof(err));
            ok(g == NULL && strstr(err, rec[i].needle) != NULL,
               "and at compile time (%s)", err);
            nalar_grammar_release(g);
        }
    }
    /* recursion that makes progress still compiles and walks */
    {
        const char *s = "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\","
                        "\"items\":{\"$ref\":\"#\"}}]}";

        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, s, strlen(s),
                              NULL, err, sizeof(err));
        ok(g && produce(g, "[[null, []], null]"), "recursive arrays "
           "compile and produce nesting %s", g ? "" : err);
        nalar_grammar_release(g);
    }
    /* ambiguity that doubles per level: a clear error past the budget,
     * never a hang (2^k stacks alive after k levels of {"a": ...) */
    {
        sbuf b = {0};
        char text[4096];
        int  n = 0, produced;


        sb_add(&b, "{\"$defs\":{");
        for (int i = 0; i < 30; i++) {
            sb_add(&b, "\"d%d\":{\"anyOf\":[{\"type\":\"object\","
                   "\"properties\":{\"a\":{\"$ref\":\"#/$defs/d%d\"}}},"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":"
                   "\"#/$defs/d%d\"},\"b\":{\"type\":\"null\"}}}]},",
                   i, i + 1, i + 1);
        }
        sb_add(&b, "\"d30\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
        g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA, b.s, b.n, NULL,
                              err, sizeof(err));
        ok(g != NULL, "a doubling ambiguity compiles %s", g ? "" : err);
        for (int i = 0; i < 30; i++) {
            n += snprintf(text + n, sizeof(text) - n, "{\"a\": ");
        }
        n += snprintf(text + n, sizeof(text) - n, "null");
        for (int i = 0; i < 30; i++) {
            n += snprintf(text + n, sizeof(text) - n, "}");
        }
        produced = g ? produce(g, text) : 0;
        why = produce_why;
        diag("30 levels: %s", produced ? "produced" : why);
        ok(produced || (why != NULL && strstr(why, "budget") != NULL),
           "30 levels: produced (%d), or stopped with a named budget",
           produced);
        nalar_grammar_release(g);
        free(b.s);
    }
    nalar_grammar_cache_destroy(c);
}


/* upper 1 - 1e-6 quantile of chi-square with df degrees of freedom
 * (Wilson-Hilferty, above the exact value for these df).  20000 draws
 * at this false-alarm rate have power 0.99 against a draw mechanism that
 * moves a total variation distance of 0.03 or more (noncentrality
 * N sum (q - p)^2 / p >= 4 N delta^2; 70.4 needed at 8 degrees of
 * freedom): the calculation is test_sampler.c's check_dist's */
static double
chi2_q1e6(int df)
{
    double z = 4.7534, k = df;

    return k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
}


static int
cmp_desc(const void *a, const void *b, void *ctx)
{
    const double *l = ctx;
    int32_t       x = *(const int32_t *) a, y = *(const int32_t *) b;

    if (l[x] != l[y]) {
        return l[x] > l[y] ? -1 : 1;
    }
    return x < y ? -1 : 1;
}


static void
check_masked(const char *name, const uint32_t *mask, const float *logits,
             const nalar_sampling *sp)
{
    enum { N = 20000 };
    int32_t        V = nalar_tok_n_vocab(tok), na = 0, kept;
    int32_t       *ids = malloc(V * sizeof(int32_t));
    double        *l = malloc(V * sizeof(double)), *ref = calloc(V,
                                                            sizeof(double));
    float         *row = malloc(V * sizeof(float));
    int           *cnt = calloc(V, sizeof(int));
    double         z = 0, mx = -INFINITY, maxdiff = 0, chi2 = 0, rest_e = 0;
    int            bins = 0, rest_n = 0, outside = 0;
    nalar_sampler  s;

    /* the reference: bias, then the allowed tokens only */
    for (int32_t i = 0; i < V; i++) {
        l[i] = logits[i];
    }
    for (int32_t b = 0; b < sp->n_bias; b++) {
        l[sp->bias_id[b]] += sp->bias[b];
    }
    for (int32_t i = 0; i < V; i++) {
        if (mask[i >> 5] >> (i & 31) & 1) {
            ids[na++] = i;
        }
    }
    qsort_r(ids, na, sizeof(int32_t), cmp_desc, l);
    kept = sp->top_k > 0 && sp->top_k < na ? sp->top_k : na;
    mx = l[ids[0]];
    for (int32_t j = 0; j < kept; j++) {
        z += exp((l[ids[j]] - mx) / sp->temperature);
    }
    if (sp->top_p < 1) {
        double c = 0;

        for (int32_t j = 0; j < kept; j++) {
            c += exp((l[ids[j]] - mx) / sp->temperature) / z;
            if (c >= sp->top_p) {
                kept = j + 1;
                break;
            }
        }
        z = 0;
        for (int32_t j = 0; j < kept; j++) {
            z += exp((l[ids[j]] - mx) / sp->temperature);
        }
    }
    for (int32_t j = 0; j < kept; j++) {
        ref[ids[j]] = exp((l[ids[j]] - mx) / sp->temperature) / z;
    }

    /* the sampler on masked logits, as the engine gives them */
    nalar_sampler_init(&s, sp, V);
    for (int32_t i = 0; i < V; i++) {
        row[i] = mask[i >> 5] >> (i & 31) & 1 ? logits[i] : -INFINITY;
    }
    nalar_sampler_dist(&s, row);
    for (int32_t i = 0; i < V; i++) {
        maxdiff = fmax(maxdiff, fabs(s.probs[i] - ref[i]));
    }
    ok(maxdiff < 1e-5, "%s: %d allowed, %d kept; the sampler's distribution "
       "is the reference (max diff %.2g)", name, na, kept, maxdiff);
    for (int k = 0; k < N; k++) {
        int32_t t;

        for (int32_t i = 0; i < V; i++) {
            row[i] = mask[i >> 5] >> (i & 31) & 1 ? logits[i] : -INFINITY;
        }
        t = nalar_sample(&s, row, NULL);
        if (t < 0 || t >= V || ref[t] == 0) {
            outside++;
            continue;
        }
        cnt[t]++;
    }
    for (int32_t i = 0; i < V; i++) {
        double e = N * ref[i];

        if (e == 0) {
            continue;
        }
        if (e >= 5) {
            chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
            bins++;
        } else {
            rest_e += e;
            rest_n += cnt[i];
        }
    }
    if (rest_e > 0) {
        chi2 += (rest_n - rest_e) * (rest_n - rest_e) / fmax(rest_e, 1);
        bins++;
    }
    is_int(outside, 0, "%s: no draw outside the grammar and the kept set",
           name);
    ok(bins >= 2 && chi2 < chi2_q1e6(bins - 1), "%s: chi2 = %.2f over %d "
       "bins (1 - 1e-6 quantile %.2f)", name, chi2, bins,
       chi2_q1e6(bins > 1 ? bins - 1 : 1));
    nalar_sampler_free(&s);
    free(ids);
    free(l);
    free(ref);
    free(row);
    free(cnt);
}


/* the enums schema after {"color": " -- red, green or blue */
static void
test_chi2(void)
{
    nalar_grammar_cache *c = nalar_grammar_cache_create(tok, 0);
    const char          *sc = "{\"type\":\"object\",\"properties\":"
                              "{\"color\":{\"enum\":[\"red\",\"green\","
                              "\"blue\",\"black\",\"brown\",\"grey\"]}},"
                              "\"required\":[\"color\"]}";
    char                 err[256];
    nalar_grammar       *g = nalar_grammar_get(c, NALAR_GRAMMAR_JSON_SCHEMA,
                                                sc, strlen(sc), NULL, err,
                                                sizeof(err));
    nalar_gmatcher      *m = g ? nalar_gmatcher_create(g) : NULL;
    int32_t              V = nalar_tok_n_vocab(tok), f[32], nf, dis = -1;
    float               *logits = malloc(V * sizeof(float));
    const uint32_t      *mask;
    uint32_t            *mcopy;
    nalar_rng            rng;
    nalar_sampling       sp;

    ok(m != NULL, "chi2: grammar %s", err);
    if (m == NULL) {
        return;
    }
    nf = nalar_gmatcher_forced(m, f, 32);
    for (int k = 0; k < nf; k++) {
        nalar_gmatcher_accept(m, f[k]);
    }
    mask = nalar_gmatcher_mask(m);
    mcopy = malloc(((V + 31) / 32) * sizeof(uint32_t));
    memcpy(mcopy, mask, ((V + 31) / 32) * sizeof(uint32_t));
    /* logits of a model that prefers prose: normal(0, 2) */
    nalar_rng_seed(&rng, 7);
    for (int32_t i = 0; i < V; i++) {
        double u1 = nalar_rng_uniform(&rng) + 1e-12,
               u2 = nalar_rng_uniform(&rng);

        logits[i] = (float) (2 * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
        if (dis < 0 && !(mcopy[i >> 5] >> (i & 31) & 1)
            && !nalar_tok_is_control(tok, i))
        {
            dis = i;
        }
    }
    nalar_sampling_default(&sp);
    sp.seed = 11;
    check_masked("T=1", mcopy, logits, &sp);
    sp.temperature = 0.7f;
    sp.top_k = 3;
    check_masked("T=0.7 top_k=3", mcopy, logits, &sp);
    sp.temperature = 1.3f;
    sp.top_k = 0;
    sp.top_p = 0.8f;
    check_masked("T=1.3 top_p=0.8", mcopy, logits, &sp);
    sp.temperature = 1;
    sp.top_p = 1;
    sp.n_bias = 2;
    sp.bias_id[0] = dis;          /* +100 off the grammar: still never */
    sp.bias[0] = 100;
    for (int32_t i = 0; i < V; i++) {
        if (mcopy[i >> 5] >> (i & 31) & 1) {
            sp.bias_id[1] = i;    /* +1.5 on an allowed one */
            sp.bias[1] = 1.5f;
            break;
        }
    }
    check_masked("logit_bias", mcopy, logits, &sp);
    free(mcopy);
    free(logits);
    nalar_gmatcher_destroy(m);
    nalar_grammar_release(g);
    nalar_grammar_cache_destroy(c);
}


/*
 * Engines build their grammar caches (the vocabulary trie) on their own
 * threads at the same time.  Caches built on two threads at once, each for
 * its own vocabulary (GPT-2's 50k pieces and Llama's 32k SentencePiece
 * ones), have sound tries.
 */
#define N_BUILDS 12

static const char *const race_vocab[2] = {
    "t/data/vocab/ggml-vocab-gpt-2.gguf",
    "t/data/vocab/ggml-vocab-llama-spm.gguf"
};

typedef struct {
    const nalar_tokenizer *tok;
    pthread_barrier_t     *start;
    nalar_grammar_cache   *caches[N_BUILDS];
} build_job;


static void *
build_caches(void *arg)
{
    build_job *j = arg;

    pthread_barrier_wait(j->start);
    for (int i = 0; i < N_BUILDS; i++) {
        j->caches[i] = nalar_grammar_cache_create(j->tok, 0);
    }
    return NULL;
}


static void
test_concurrent_caches(void)
{
    nalar_err          err;
    nalar_tokenizer   *vt[2];
    build_job          jobs[2];
    pthread_t          th[2];
    pthread_barrier_t  start;
    int                built = 0, bad = 0;

    for (int t = 0; t < 2; t++) {
        gguf_file *f = gguf_open(race_vocab[t], &err);

        vt[t] = f != NULL ? nalar_tokenizer_create(f, &err) : NULL;
        gguf_close(f);
        ok(vt[t] != NULL, "tokenizer of %s", race_vocab[t]);
        if (vt[t] == NULL) {
            return;
        }
    }
    memset(jobs, 0, sizeof(jobs));
    pthread_barrier_init(&start, NULL, 2);
    for (int t = 0; t < 2; t++) {
        jobs[t].tok = vt[t];
        jobs[t].start = &start;
        pthread_create(&th[t], NULL, build_caches, &jobs[t]);
    }
    for (int t = 0; t < 2; t++) {
        pthread_join(th[t], NULL);
    }
    pthread_barrier_destroy(&start);
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < N_BUILDS; i++) {
            if (jobs[t].caches[i] != NULL) {
                built++;
                bad += nalar_grammar_cache_check(jobs[t].caches[i]) != 0;
            }
            nalar_grammar_cache_destroy(jobs[t].caches[i]);
        }
        nalar_tokenizer_destroy(vt[t]);
    }
    is_int(built, 2 * N_BUILDS, "caches built on two threads at once");
    is_int(bad, 0, "each one's vocabulary trie is sound (children in byte "
           "order, every piece once, under its own bytes)");
}

int
main(void)
{
    nalar_err  err;
    gguf_file *f;

    test_check();
    f = gguf_open(MODEL, &err);
    ok(f != NULL, "open %s", MODEL);
    if (f == NULL) {
        return done_testing();
    }
    tok = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    ok(tok != NULL, "tokenizer");
    test_keywords();
    test_chi2();
    test_walks();
    test_concurrent_caches();
    test_hostile();
    test_hostile_large();
    nalar_tokenizer_destroy(tok);
    return done_testing();
}
