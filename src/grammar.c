/*
 * Structured output: see grammar.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

int
nalar_schema_check(const char *schema_json, size_t len, char *err,
                   size_t errlen)
{
    (void) schema_json; (void) len;
    if (errlen) err[0] = '\0';
    return 0;
}

nalar_grammar_cache *
nalar_grammar_cache_create(const nalar_tokenizer *tok, int cap)
{
    (void) tok; (void) cap;
    return NULL;
}

void nalar_grammar_cache_destroy(nalar_grammar_cache *c) { (void) c; }

nalar_grammar *
nalar_grammar_get(nalar_grammar_cache *c, int kind, const char *schema,
                  size_t len, double *compile_s, char *err, size_t errlen)
{
    (void) c; (void) kind; (void) schema; (void) len; (void) compile_s;
    snprintf(err, errlen, "structured output is not built yet");
    return NULL;
}

void nalar_grammar_release(nalar_grammar *g) { (void) g; }
nalar_gmatcher *nalar_gmatcher_create(nalar_grammar *g) { (void) g; return NULL; }
void nalar_gmatcher_destroy(nalar_gmatcher *m) { (void) m; }
const uint32_t *nalar_gmatcher_mask(nalar_gmatcher *m, double *s)
{ (void) m; (void) s; return NULL; }
int nalar_gmatcher_allows(nalar_gmatcher *m, int32_t id)
{ (void) m; (void) id; return 0; }
int nalar_gmatcher_accept(nalar_gmatcher *m, int32_t id)
{ (void) m; (void) id; return -1; }
void nalar_gmatcher_rollback(nalar_gmatcher *m, int32_t n) { (void) m; (void) n; }
int32_t nalar_gmatcher_n_accepted(const nalar_gmatcher *m) { (void) m; return 0; }
int nalar_gmatcher_can_end(nalar_gmatcher *m) { (void) m; return 0; }
int nalar_gmatcher_done(nalar_gmatcher *m) { (void) m; return 0; }
int nalar_gmatcher_forced(nalar_gmatcher *m, int32_t *out, int cap)
{ (void) m; (void) out; (void) cap; return 0; }
