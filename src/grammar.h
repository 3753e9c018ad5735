/*
 * Structured output: a JSON Schema (the subset OpenAI's strict mode
 * accepts) or "any JSON object" compiled into a byte-level pushdown
 * automaton, and token masks over a model's vocabulary from it.
 *
 * Schema text -> context-free grammar (rules of alternatives of sequences of
 * byte classes and rule references) -> automaton whose state is a set of
 * stacks of grammar positions.  A token is allowed in a state when every
 * byte of its piece (nalar_token_bytes: SentencePiece and byte-level BPE
 * alike) advances the state; control and end-of-generation tokens are never
 * allowed inside the value, and end-of-generation only once the value is
 * complete.  States are interned per grammar, so a request's state is an
 * integer, rolling back is truncating a list of them, and masks are cached
 * per state.  Compiled grammars are cached per vocabulary by the schema's
 * digest.
 *
 * Where the grammar allows one continuation only (the bytes are forced),
 * it also allows one tokenization of it: the longest vocabulary piece at
 * each point.  The output text is the same either way; what this buys is
 * that a forced state allows exactly one token, so forced tokens proposed
 * for speculative verification are accepted with certainty.
 *
 * Whitespace is fixed, as Python's json.dumps writes it: one space after
 * ':' and after ',', none anywhere else (nor before or after the value).  So
 * a model cannot loop on whitespace, and the punctuation and key names
 * between values are forced (see nalar_gmatcher_forced).
 *
 * Threads: nalar_schema_check is pure.  A cache, its grammars and their
 * matchers are used by one thread at a time (the engine's).
 */
#ifndef NALAR_GRAMMAR_H
#define NALAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef enum {
    NALAR_GRAMMAR_NONE = 0,
    NALAR_GRAMMAR_JSON_OBJECT,   /* any JSON object */
    NALAR_GRAMMAR_JSON_SCHEMA    /* one JSON value matching a schema */
} nalar_grammar_kind;

/*
 * Checks a JSON Schema without a vocabulary (the request parser's check):
 * 0 when it compiles, -1 with a message in err that names the unsupported
 * keyword or the bad part (e.g. "unsupported keyword 'patternProperties' at
 * #/properties/a").
 */
int nalar_schema_check(const char *schema_json, size_t len, char *err,
                       size_t errlen);

typedef struct nalar_grammar       nalar_grammar;
typedef struct nalar_grammar_cache nalar_grammar_cache;
typedef struct nalar_gmatcher      nalar_gmatcher;

/* Compiled grammars for one vocabulary, at most `cap` kept (<= 0: 64). */
nalar_grammar_cache *nalar_grammar_cache_create(const nalar_tokenizer *tok,
                                                int cap);
void nalar_grammar_cache_destroy(nalar_grammar_cache *c);
/* Tests: the defects of the cache's vocabulary trie (children out of byte
 * order, a token under a node whose path is not its piece, a token listed
 * other than once); 0 for a sound trie. */
int nalar_grammar_cache_check(const nalar_grammar_cache *c);

/*
 * The compiled grammar of (kind, schema) from the cache, compiling it on a
 * miss; a reference the caller releases.  *compile_s (may be NULL) is set to
 * the seconds spent compiling (0 on a hit).  NULL with err on a bad schema.
 */
nalar_grammar *nalar_grammar_get(nalar_grammar_cache *c, int kind,
                                 const char *schema, size_t len,
                                 double *compile_s, char *err, size_t errlen);
void nalar_grammar_release(nalar_grammar *g);

/* Tests: 1 when the bytes s[0..n), walked byte by byte from the start,
 * are a complete value of g (no tokenization involved), else 0. */
int nalar_grammar_match(nalar_grammar *g, const char *s, size_t n);

/* A request's position in a grammar. */
nalar_gmatcher *nalar_gmatcher_create(nalar_grammar *g);
void nalar_gmatcher_destroy(nalar_gmatcher *m);

/*
 * The allowed tokens in the current state: a bitset of n_vocab bits (bit i
 * of word i / 32), valid until the next call on the matcher or its grammar.
 * NULL when out of memory.
 */
const uint32_t *nalar_gmatcher_mask(nalar_gmatcher *m);
/*
 * Why the last call on the matcher's grammar failed (a NULL mask, a token
 * refused for a reason other than the grammar): a budget it passed, or
 * "out of memory".
 */
const char *nalar_gmatcher_error(const nalar_gmatcher *m);
/* 1 when token id is allowed now */
int  nalar_gmatcher_allows(nalar_gmatcher *m, int32_t id);
/* Advances by one token: 0, or -1 (state unchanged) when not allowed.  An
 * end-of-generation token is accepted once the value is complete. */
int  nalar_gmatcher_accept(nalar_gmatcher *m, int32_t id);
/* Undoes the last n accepted tokens (n beyond the start: to the start). */
void nalar_gmatcher_rollback(nalar_gmatcher *m, int32_t n);
/* Tokens accepted so far. */
int32_t nalar_gmatcher_n_accepted(const nalar_gmatcher *m);
/* 1 when the value is complete (end of generation allowed) */
int  nalar_gmatcher_can_end(nalar_gmatcher *m);
/* 1 when the value is complete and nothing but the end may follow */
int  nalar_gmatcher_done(nalar_gmatcher *m);
/*
 * The bytes the grammar forces next (the one continuation while only one
 * byte is allowed), tokenized: up to cap token ids, each allowed in turn.
 * Returns the count (0: nothing forced).
 */
int  nalar_gmatcher_forced(nalar_gmatcher *m, int32_t *out, int cap);

#endif
