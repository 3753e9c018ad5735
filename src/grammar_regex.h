/*
 * Private to grammar.c: a JSON Schema `pattern` (or a `format`, written as
 * an anchored pattern) compiled into a deterministic automaton over the
 * bytes of a JSON string's content, the text between the quotes.
 *
 * The automaton accepts the JSON-escaped forms of the strings the pattern
 * matches, with ECMA-262 search semantics: an unanchored branch may have
 * anything before and after it.  Each character is produced in one JSON
 * form: '"' as \", '\' as \\, a control character as \uXXXX (lowercase
 * hex) or its short escape (\b \t \n \f \r), anything else as itself in
 * UTF-8 (no surrogate code point).  Every state it keeps can reach an
 * accepting state, so a walk never ends in a dead end.
 */
#ifndef NALAR_GRAMMAR_REGEX_H
#define NALAR_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define GR_REGEX_MAX_NFA  60000     /* NFA states of one pattern */
#define GR_REGEX_MAX_DFA  6000      /* DFA states of one pattern */

typedef struct {
    int32_t  n;          /* states; 0 is the start */
    int32_t *next;       /* n * 256 byte transitions, -1: none */
    uint8_t *accept;     /* n flags */
    uint8_t *mid;        /* n flags: inside a character's JSON form (its
                            next byte does not start a character) */
} gr_dfa;

/*
 * Compiles pattern (UTF-8, len bytes) into *out: 0, or -1 with a message
 * in err naming what is not supported (a backreference, a lookaround, an
 * anchor inside the pattern, ...) or what is too large.
 */
int  gr_regex_dfa(const char *pat, size_t len, gr_dfa *out, char *err,
                  size_t errlen);
void gr_dfa_free(gr_dfa *d);

/* The anchored pattern of a supported `format`, or NULL. */
const char *gr_format_pattern(const char *format);

#endif
