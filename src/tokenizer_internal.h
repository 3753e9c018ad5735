/*
 * What the tokenizer's files share (tokenizer.c: creation and encoding;
 * tokenizer_pretok.c: Unicode classes, NFC and the BPE pre-tokenizers;
 * tokenizer_merge.c: the SPM and BPE merge loops; tokenizer_decode.c: ids
 * back to text).  Not part of the engine's API.
 */
#ifndef NALAR_TOKENIZER_INTERNAL_H
#define NALAR_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* BPE pre-tokenizers (tokenizer.ggml.pre): the regexes llama.cpp's
 * llama-vocab.cpp lists for each (tekken: the regex of its
 * tokenizer.json, which llama.cpp approximates) */
enum {
    PRE_GPT2 = 0, PRE_LLAMA3, PRE_QWEN2, PRE_TEKKEN, PRE_STARCODER,
    PRE_DEEPSEEK_LLM, PRE_DEEPSEEK_CODER, PRE_FALCON, PRE_DEEPSEEK_V3
};

typedef struct {
    uint32_t off;     /* into merge_text: "left right\0" */
    uint32_t n_left;  /* right starts at off + n_left + 1 */
    uint32_t n_right;
} bpe_merge;

struct nalar_tokenizer {
    nalar_tok_kind kind;
    int32_t   n_vocab;
    char     *text;       /* every piece, NUL-terminated, back to back */
    uint32_t *text_off;   /* (n_vocab + 1) piece i is text[text_off[i] ..
                             text_off[i+1] - 1), the last byte its NUL */
    float    *score;      /* (n_vocab) SPM merge priority */
    uint8_t  *type;       /* (n_vocab) TOKT_*, 0 when undefined */
    uint8_t  *eog;        /* (n_vocab) 1: ends generation */
    int32_t  *vhash;      /* (vhash_mask + 1) ids by piece hash, -1 empty */
    uint32_t  vhash_mask;
    uint32_t  max_piece;  /* longest piece in bytes */

    /* BPE merges, rank = index */
    char      *merge_text;
    bpe_merge *merges;    /* (n_merges) */
    int32_t    n_merges;
    int32_t   *mhash;     /* (mhash_mask + 1) merge ranks by pair hash */
    uint32_t   mhash_mask;
    uint32_t   max_merge; /* longest left + right in bytes */

    /* tokens split out of the text before the tokenizer proper: CONTROL,
       USER_DEFINED and UNKNOWN ids, longest text first */
    int32_t  *special;    /* (n_special) */
    int32_t   n_special;

    int32_t   byte_tok[256]; /* SPM: id of "<0xXX>", -1 if missing */
    uint32_t  byte_cp[256];  /* BPE: byte -> printable code point */
    int16_t   cp_byte[512];  /* BPE: code point -> byte, -1 if none */

    int32_t   bos, eos, unk, eot, eom;
    int       add_bos;
    int       add_space_prefix;
    int       pre;           /* PRE_*: BPE pre-tokenizer */
    int       ignore_merges; /* BPE: a word that is a token is not merged */
    int       nfc;           /* BPE: text is normalized to NFC first */
};

static inline const char *
piece_of(const nalar_tokenizer *t, int32_t id, uint32_t *len)
{
    *len = t->text_off[id + 1] - t->text_off[id] - 1;
    return t->text + t->text_off[id];
}

/* Growable id list for the encoder's output; ids past `lim` are dropped
 * (the encoder stops soon after: see full()). */
typedef struct {
    int32_t *v;
    size_t   n, cap;
    size_t   lim;
    int      oom;
} idvec;

static inline int
full(const idvec *o)
{
    return o->n >= o->lim;
}

static inline void
push_id(idvec *o, int32_t id)
{
    if (full(o)) {
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (v == NULL) {
            o->oom = 1;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* ---------------------------------------------------------------------- */
/* UTF-8 and Unicode classes                                              */

/* Expected length for a valid lead byte, 0 if it cannot start one. */
static inline int
utf8_lead_len(uint8_t c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Is b acceptable as byte number `pos` (1..3) after lead? (RFC 3629:
 * no overlongs, no surrogates, nothing above U+10FFFF) */
static inline int
utf8_cont_ok(uint8_t lead, int pos, uint8_t b)
{
    if (pos == 1) {
        if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
        if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
        if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
        if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
    }
    return b >= 0x80 && b <= 0xBF;
}

/* Decodes one code point at s[*i]; a byte that does not start a complete
 * valid sequence decodes to U+FFFD and consumes only itself. */
static inline uint32_t
utf8_decode(const uint8_t *s, size_t n, size_t *i)
{
    uint8_t c = s[*i];
    int len = utf8_lead_len(c);
    uint32_t cp;

    if (len == 1) {
        (*i)++;
        return c;
    }
    if (len == 0 || *i + (size_t) len > n) goto bad;
    for (int k = 1; k < len; k++)
        if (!utf8_cont_ok(c, k, s[*i + k])) goto bad;
    cp = c & (0x7F >> len);
    for (int k = 1; k < len; k++) cp = (cp << 6) | (s[*i + k] & 0x3F);
    *i += len;
    return cp;
bad:
    (*i)++;
    return 0xFFFD;
}

static inline int
utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char) cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char) (0xC0 | (cp >> 6));
        out[1] = (char) (0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char) (0xE0 | (cp >> 12));
        out[1] = (char) (0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char) (0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char) (0xF0 | (cp >> 18));
    out[1] = (char) (0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char) (0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char) (0x80 | (cp & 0x3F));
    return 4;
}

/* Character classes the pre-tokenizer regexes ask about: \p{L}, \p{N},
 * \s, \p{P}, \p{S}, and tekken's two letter sets: C_UP [\p{Lu}\p{Lt}
 * \p{Lm}\p{Lo}\p{M}] and C_LO [\p{Ll}\p{Lm}\p{Lo}\p{M}].  A mark
 * (\p{M}) is C_UP | C_LO without C_LETTER. */
enum {
    C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_VALID = 8, C_PUNCT = 16,
    C_UP = 32, C_LO = 64, C_SYMBOL = 128
};


/* Code points of s[0..n) (an invalid byte reads as U+FFFD, as in
 * llama.cpp) and their classes; boff[i] is the byte offset of code point
 * i, boff[ncp] = n.  The pre-tokenizer cuts them into words: returns the
 * word count, ends[] the code point index after each word. */
typedef struct {
    uint32_t *cp;    /* (n + 1) */
    uint8_t  *cls;   /* (n + 1) C_* */
    size_t   *boff;  /* (n + 1) */
    size_t   *ends;  /* (n + 1) */
    size_t   *tmp;   /* (n + 1) the previous regex's pieces */
    size_t    ncp, nw;
} pretok;

/* the merge loop shared by SPM and BPE (tokenizer_merge.c) */

typedef struct {
    int32_t  prev, next;  /* neighbours in the word, -1 at the ends */
    uint32_t off, n;      /* bytes of the symbol in the word; n = 0: merged
                             into its left neighbour */
} symbol;

typedef struct {
    int32_t  key;         /* higher merges first: SPM score (as ordered
                             bits), BPE -rank */
    int32_t  left, right; /* symbol indices */
    uint32_t size;        /* left.n + right.n when pushed: stale if not */
} bigram;

typedef struct {
    bigram *v;
    size_t  n, cap;
} heap;

typedef struct {
    const nalar_tokenizer *t;
    const char *w;        /* the word being merged */
    symbol     *sym;      /* (cap) */
    size_t      cap;
    heap        q;
    int         oom;
} merger;

/* tokenizer.c */
int32_t ntok_lookup(const nalar_tokenizer *t, const char *s, size_t len);
int32_t ntok_merge_rank(const nalar_tokenizer *t, const char *l, size_t nl,
                        const char *r, size_t nr);

/* tokenizer_pretok.c */
char *ntok_nfc(const char *s, size_t n, size_t *out_n);
int  ntok_pretokenize(const nalar_tokenizer *t, const char *s, size_t n,
                      pretok *p);
void ntok_pretok_free(pretok *p);

/* tokenizer_merge.c: encode one fragment of text (no special tokens) */
int ntok_spm_fragment(const nalar_tokenizer *t, merger *m, const char *s,
                      size_t n, int prefix, idvec *out);
int ntok_bpe_fragment(const nalar_tokenizer *t, merger *m, const char *s,
                      size_t n, idvec *out);

#endif
