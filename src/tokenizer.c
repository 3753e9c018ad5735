/*
 * Tokenizers from GGUF metadata, behaving as llama.cpp's:
 *
 *   SPM ("llama"): spaces become U+2581 "▁", a dummy "▁" is prefixed, the
 *     text is split into UTF-8 characters and adjacent symbols are merged
 *     greedily, highest vocabulary score first (leftmost on ties), as long
 *     as the merged string is a token.  What never became a token falls
 *     back to byte tokens <0xXX>.
 *
 *   BPE ("gpt2"): a regex pre-tokenizer cuts the text into words; each
 *     word's bytes are mapped to printable code points (GPT-2's
 *     bytes_to_unicode) and merged by the rank of the merge rules, lowest
 *     rank first.
 *
 * Both merge loops keep the symbols of a word in a linked list and the
 * candidate pairs in a binary heap: O(n log n) in the text length, with
 * every vocabulary or merge lookup a hash probe.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode_tables.h"

/* BPE pre-tokenizers (tokenizer.ggml.pre): the regexes llama.cpp's
 * llama-vocab.cpp lists for each (tekken: the regex of its
 * tokenizer.json, which llama.cpp approximates) */
enum {
    PRE_GPT2 = 0, PRE_LLAMA3, PRE_QWEN2, PRE_TEKKEN, PRE_STARCODER,
    PRE_DEEPSEEK_LLM, PRE_DEEPSEEK_CODER, PRE_FALCON
};

static const struct {
    const char *name;
    int         pre;
} pre_names[] = {
    { "gpt-2", PRE_GPT2 }, { "gpt2", PRE_GPT2 }, { "default", PRE_GPT2 },
    { "llama-bpe", PRE_LLAMA3 }, { "llama3", PRE_LLAMA3 },
    { "llama-v3", PRE_LLAMA3 }, { "falcon3", PRE_LLAMA3 },
    { "pixtral", PRE_LLAMA3 },
    { "qwen2", PRE_QWEN2 }, { "deepseek-r1-qwen", PRE_QWEN2 },
    { "tekken", PRE_TEKKEN },
    { "smollm", PRE_STARCODER }, { "starcoder", PRE_STARCODER },
    { "deepseek-llm", PRE_DEEPSEEK_LLM },
    { "deepseek-coder", PRE_DEEPSEEK_CODER },
    { "falcon", PRE_FALCON },
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
};

/* ---------------------------------------------------------------------- */
/* small helpers                                                          */

static uint64_t
hash_bytes(uint64_t h, const char *s, size_t n)
{
    /* FNV-1a, 64-bit */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t) s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

#define HASH_INIT 0xcbf29ce484222325ULL

static uint64_t
hash_pair(const char *l, size_t nl, const char *r, size_t nr)
{
    /* 0xFF never occurs in UTF-8, so it separates the halves */
    uint64_t h = hash_bytes(HASH_INIT, l, nl);
    h ^= 0xFF;
    h *= 0x100000001b3ULL;
    return hash_bytes(h, r, nr);
}

static uint32_t
table_size(uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return (uint32_t) cap;
}

static const char *
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

static int
full(const idvec *o)
{
    return o->n >= o->lim;
}

static void
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
static int
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
static int
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
static uint32_t
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

static int
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
 * \s, \p{P}, and tekken's two letter sets: C_UP [\p{Lu}\p{Lt}\p{Lm}
 * \p{Lo}\p{M}] and C_LO [\p{Ll}\p{Lm}\p{Lo}\p{M}]. */
enum {
    C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_VALID = 8, C_PUNCT = 16,
    C_UP = 32, C_LO = 64
};

static int
is_unicode_space(uint32_t cp)
{
    /* Unicode White_Space, which is what \s means in these regexes */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int
unicode_class(uint32_t cp)
{
    int lo = 0, hi = (int) (sizeof(unicode_ranges) / sizeof(unicode_ranges[0])) - 1;
    int f = C_VALID;

    if (is_unicode_space(cp)) f |= C_SPACE;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < unicode_ranges[mid].lo) hi = mid - 1;
        else if (cp > unicode_ranges[mid].hi) lo = mid + 1;
        else {
            switch (unicode_ranges[mid].cls) {
            case UCLS_LU: case UCLS_LT: f |= C_LETTER | C_UP; break;
            case UCLS_LL: f |= C_LETTER | C_LO; break;
            case UCLS_LM: case UCLS_LO: f |= C_LETTER | C_UP | C_LO; break;
            case UCLS_NUMBER: f |= C_NUMBER; break;
            case UCLS_MARK: f |= C_UP | C_LO; break;
            case UCLS_PUNCT: f |= C_PUNCT; break;
            }
            break;
        }
    }
    return f;
}

/* ---------------------------------------------------------------------- */
/* creation                                                               */

static int
kv_bool(const gguf_file *f, const char *key, int dflt)
{
    const gguf_kv *kv = gguf_find(f, key);

    if (kv == NULL) return dflt;
    switch (kv->type) {
    case GGUF_T_BOOL: case GGUF_T_UINT8: case GGUF_T_UINT16:
    case GGUF_T_UINT32: case GGUF_T_UINT64:
        return kv->v.u != 0;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32: case GGUF_T_INT64:
        return kv->v.i != 0;
    default:
        return dflt;
    }
}

static int32_t
kv_id(const nalar_tokenizer *t, const gguf_file *f, const char *key,
      int32_t dflt)
{
    int64_t v = gguf_get_int(f, key, dflt);

    return (v >= 0 && v < t->n_vocab) ? (int32_t) v : -1;
}

static int32_t
lookup(const nalar_tokenizer *t, const char *s, size_t len)
{
    uint32_t h, n;

    if (len > t->max_piece) return -1;
    h = (uint32_t) hash_bytes(HASH_INIT, s, len) & t->vhash_mask;
    for (;; h = (h + 1) & t->vhash_mask) {
        int32_t id = t->vhash[h];
        const char *p;
        if (id < 0) return -1;
        p = piece_of(t, id, &n);
        if (n == len && memcmp(p, s, len) == 0) return id;
    }
}

/* Rank of merging (l, r), or -1. */
static int32_t
merge_rank(const nalar_tokenizer *t, const char *l, size_t nl,
           const char *r, size_t nr)
{
    uint32_t h;

    if (t->n_merges == 0 || nl + nr > t->max_merge) return -1;
    h = (uint32_t) hash_pair(l, nl, r, nr) & t->mhash_mask;
    for (;; h = (h + 1) & t->mhash_mask) {
        int32_t rank = t->mhash[h];
        const bpe_merge *m;
        const char *ml;
        if (rank < 0) return -1;
        m = &t->merges[rank];
        ml = t->merge_text + m->off;
        if (m->n_left == nl && m->n_right == nr &&
            memcmp(ml, l, nl) == 0 && memcmp(ml + nl + 1, r, nr) == 0)
            return rank;
    }
}

static int
load_merges(nalar_tokenizer *t, const gguf_file *f, nalar_err *err)
{
    const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.merges");
    uint64_t total = 0;
    uint32_t off = 0;

    if (kv == NULL) return 0;  /* a byte-level vocab without merges */
    if (kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING)
        return nalar_fail(err, "%s: tokenizer.ggml.merges is not a string array",
                          f->path);
    if (kv->arr_len > INT32_MAX / 2)
        return nalar_fail(err, "%s: %llu merges is too many", f->path,
                          (unsigned long long) kv->arr_len);
    for (uint64_t i = 0; i < kv->arr_len; i++) total += kv->arr_strs[i].len + 1;
    if (total > UINT32_MAX)
        return nalar_fail(err, "%s: merges too large", f->path);

    t->merge_text = malloc(total ? total : 1);
    t->merges = malloc((kv->arr_len ? kv->arr_len : 1) * sizeof(bpe_merge));
    t->mhash_mask = table_size(kv->arr_len) - 1;
    t->mhash = malloc(((size_t) t->mhash_mask + 1) * sizeof(int32_t));
    if (!t->merge_text || !t->merges || !t->mhash)
        return nalar_fail(err, "%s: out of memory for merges", f->path);
    memset(t->mhash, 0xFF, ((size_t) t->mhash_mask + 1) * sizeof(int32_t));

    for (uint64_t i = 0; i < kv->arr_len; i++) {
        const gguf_str *s = &kv->arr_strs[i];
        const char *sp;
        bpe_merge *m = &t->merges[t->n_merges];
        uint32_t h;

        /* "left right", split at the first space after the first byte
           (as llama.cpp does); a rule without one can never apply */
        sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
        if (sp == NULL) {
            /* keep ranks equal to indices: store an impossible rule */
            m->off = off;
            m->n_left = UINT32_MAX / 4;
            m->n_right = 0;
            t->n_merges++;
            continue;
        }
        memcpy(t->merge_text + off, s->ptr, s->len);
        t->merge_text[off + s->len] = '\0';
        m->off = off;
        m->n_left = (uint32_t) (sp - s->ptr);
        m->n_right = (uint32_t) (s->len - m->n_left - 1);
        off += (uint32_t) s->len + 1;
        t->n_merges++;

        /* the first rule for a pair wins */
        if (merge_rank(t, s->ptr, m->n_left, sp + 1, m->n_right) >= 0)
            continue;
        if (m->n_left + m->n_right > t->max_merge)
            t->max_merge = m->n_left + m->n_right;
        h = (uint32_t) hash_pair(s->ptr, m->n_left, sp + 1, m->n_right)
            & t->mhash_mask;
        while (t->mhash[h] >= 0) h = (h + 1) & t->mhash_mask;
        t->mhash[h] = t->n_merges - 1;
    }
    return 0;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other
 * 68 to U+0100 onwards, in byte order. */
static void
init_byte_map(nalar_tokenizer *t)
{
    uint32_t next = 256;

    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                        (b >= 0xAE && b <= 0xFF);
        t->byte_cp[b] = printable ? (uint32_t) b : next++;
        t->cp_byte[t->byte_cp[b]] = (int16_t) b;
    }
}

static int
cmp_special(const void *a, const void *b, void *ctx)
{
    const nalar_tokenizer *t = ctx;
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
    uint32_t lx = t->text_off[x + 1] - t->text_off[x];
    uint32_t ly = t->text_off[y + 1] - t->text_off[y];

    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int
is_eog_name(const char *s, uint32_t n)
{
    static const char *names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "</s>",
        "<|eom_id|>", "<end_of_turn>", "<EOT>"
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return 1;
    return 0;
}

static int
is_chat_marker(const char *s, uint32_t n)
{
    static const char *names[] = {
        "<|im_start|>", "<|start_header_id|>", "<|end_header_id|>",
        "<start_of_turn>", "<|user|>", "<|assistant|>", "<|system|>",
        "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return 1;
    return 0;
}

nalar_tokenizer *
nalar_tokenizer_create(const gguf_file *f, nalar_err *err)
{
    nalar_tokenizer *t;
    const gguf_kv *toks, *scores, *types;
    char *model = NULL, *pre = NULL;
    uint64_t total = 0;

    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        nalar_fail(err, "%s: out of memory for tokenizer", f->path);
        return NULL;
    }

    model = gguf_get_str(f, "tokenizer.ggml.model");
    if (model == NULL) {
        nalar_fail(err, "%s: no tokenizer.ggml.model", f->path);
        goto fail;
    }
    if (strcmp(model, "llama") == 0) t->kind = TOK_SPM;
    else if (strcmp(model, "gpt2") == 0) t->kind = TOK_BPE;
    else {
        nalar_fail(err, "%s: tokenizer.ggml.model '%s' is not supported "
                   "(only 'llama' and 'gpt2')", f->path, model);
        goto fail;
    }

    /* the vocabulary */
    toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (toks == NULL || toks->type != GGUF_T_ARRAY ||
        toks->arr_type != GGUF_T_STRING || toks->arr_len == 0) {
        nalar_fail(err, "%s: tokenizer.ggml.tokens missing or not a string "
                   "array", f->path);
        goto fail;
    }
    if (toks->arr_len > INT32_MAX / 4) {
        nalar_fail(err, "%s: %llu tokens is too many", f->path,
                   (unsigned long long) toks->arr_len);
        goto fail;
    }
    t->n_vocab = (int32_t) toks->arr_len;
    for (int32_t i = 0; i < t->n_vocab; i++) total += toks->arr_strs[i].len + 1;
    if (total > UINT32_MAX) {
        nalar_fail(err, "%s: vocabulary text too large", f->path);
        goto fail;
    }
    t->text = malloc(total);
    t->text_off = malloc(((size_t) t->n_vocab + 1) * sizeof(uint32_t));
    t->score = calloc(t->n_vocab, sizeof(float));
    t->type = malloc(t->n_vocab);
    t->eog = calloc(t->n_vocab, 1);
    t->vhash_mask = table_size(t->n_vocab) - 1;
    t->vhash = malloc(((size_t) t->vhash_mask + 1) * sizeof(int32_t));
    t->special = malloc((size_t) t->n_vocab * sizeof(int32_t));
    if (!t->text || !t->text_off || !t->score || !t->type || !t->eog ||
        !t->vhash || !t->special) {
        nalar_fail(err, "%s: out of memory for the vocabulary", f->path);
        goto fail;
    }
    memset(t->vhash, 0xFF, ((size_t) t->vhash_mask + 1) * sizeof(int32_t));

    {
        uint32_t off = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            const gguf_str *s = &toks->arr_strs[i];
            t->text_off[i] = off;
            memcpy(t->text + off, s->ptr, s->len);
            t->text[off + s->len] = '\0';
            off += (uint32_t) s->len + 1;
            if (s->len > t->max_piece) t->max_piece = (uint32_t) s->len;
        }
        t->text_off[t->n_vocab] = off;
    }
    /* string -> id; a repeated string maps to its last id (llama.cpp) */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint32_t n, h;
        const char *p = piece_of(t, i, &n);
        int32_t old = lookup(t, p, n);
        if (old >= 0) {
            h = (uint32_t) hash_bytes(HASH_INIT, p, n) & t->vhash_mask;
            while (t->vhash[h] != old) h = (h + 1) & t->vhash_mask;
        } else {
            h = (uint32_t) hash_bytes(HASH_INIT, p, n) & t->vhash_mask;
            while (t->vhash[h] >= 0) h = (h + 1) & t->vhash_mask;
        }
        t->vhash[h] = i;
    }

    scores = gguf_find(f, "tokenizer.ggml.scores");
    if (scores != NULL) {
        if (scores->type != GGUF_T_ARRAY || scores->arr_type != GGUF_T_FLOAT32 ||
            scores->arr_len != toks->arr_len) {
            nalar_fail(err, "%s: tokenizer.ggml.scores must be %d float32s",
                       f->path, t->n_vocab);
            goto fail;
        }
        memcpy(t->score, scores->arr_data, (size_t) t->n_vocab * sizeof(float));
    }

    types = gguf_find(f, "tokenizer.ggml.token_type");
    if (types != NULL) {
        if (types->type != GGUF_T_ARRAY ||
            (types->arr_type != GGUF_T_INT32 && types->arr_type != GGUF_T_UINT32) ||
            types->arr_len != toks->arr_len) {
            nalar_fail(err, "%s: tokenizer.ggml.token_type must be %d int32s",
                       f->path, t->n_vocab);
            goto fail;
        }
        for (int32_t i = 0; i < t->n_vocab; i++) {
            int32_t v;
            memcpy(&v, (const char *) types->arr_data + 4 * (size_t) i, 4);
            t->type[i] = (v >= TOKT_NORMAL && v <= TOKT_BYTE) ? (uint8_t) v : 0;
        }
    } else {
        memset(t->type, TOKT_NORMAL, t->n_vocab);
    }

    /* special ids; SPM files without the keys use llama.cpp's defaults */
    if (t->kind == TOK_SPM) {
        t->bos = kv_id(t, f, "tokenizer.ggml.bos_token_id", 1);
        t->eos = kv_id(t, f, "tokenizer.ggml.eos_token_id", 2);
        t->unk = kv_id(t, f, "tokenizer.ggml.unknown_token_id", 0);
    } else {
        t->bos = kv_id(t, f, "tokenizer.ggml.bos_token_id", -1);
        t->eos = kv_id(t, f, "tokenizer.ggml.eos_token_id", -1);
        t->unk = kv_id(t, f, "tokenizer.ggml.unknown_token_id", -1);
    }
    t->eot = kv_id(t, f, "tokenizer.ggml.eot_token_id", -1);
    t->eom = kv_id(t, f, "tokenizer.ggml.eom_token_id", -1);

    if (t->kind == TOK_SPM) {
        t->add_space_prefix = kv_bool(f, "tokenizer.ggml.add_space_prefix", 1);
        t->add_bos = kv_bool(f, "tokenizer.ggml.add_bos_token", 1);
        for (int b = 0; b < 256; b++) {
            char buf[8];
            static const char hex[] = "0123456789ABCDEF";
            buf[0] = '<'; buf[1] = '0'; buf[2] = 'x';
            buf[3] = hex[b >> 4]; buf[4] = hex[b & 15]; buf[5] = '>';
            t->byte_tok[b] = lookup(t, buf, 6);
            if (t->byte_tok[b] < 0) {
                /* as llama.cpp: fall back to the byte as a piece */
                buf[0] = (char) b;
                t->byte_tok[b] = lookup(t, buf, 1);
            }
        }
    } else {
        pre = gguf_get_str(f, "tokenizer.ggml.pre");
        t->pre = pre == NULL ? PRE_GPT2 : -1;
        for (size_t i = 0; pre != NULL && t->pre < 0
                           && i < sizeof(pre_names) / sizeof(pre_names[0]); i++)
            if (strcmp(pre, pre_names[i].name) == 0) t->pre = pre_names[i].pre;
        if (t->pre < 0) {
            char list[512];
            size_t k = 0;
            for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]);
                 i++)
                k += (size_t) snprintf(list + k, sizeof(list) - k, "%s%s",
                                       i ? ", " : "", pre_names[i].name);
            nalar_fail(err, "%s: tokenizer.ggml.pre '%s' is not supported "
                       "(supported: %s)", f->path, pre, list);
            goto fail;
        }
        t->ignore_merges = t->pre == PRE_LLAMA3 || t->pre == PRE_TEKKEN;
        t->add_space_prefix = kv_bool(f, "tokenizer.ggml.add_space_prefix", 0);
        t->add_bos = kv_bool(f, "tokenizer.ggml.add_bos_token",
                             t->pre == PRE_LLAMA3 || t->pre == PRE_TEKKEN);
        init_byte_map(t);
        for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
        if (load_merges(t, f, err) < 0) goto fail;
    }

    /* specials, end-of-generation */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        uint32_t n;
        const char *p = piece_of(t, i, &n);
        /* an end-of-turn token or chat marker a file marks user-defined
           is a control token (as llama.cpp does for end-of-turn tokens):
           a user's text never turns into it */
        if (ty == TOKT_USER_DEFINED
            && (is_eog_name(p, n) || is_chat_marker(p, n)))
            t->type[i] = ty = TOKT_CONTROL;
        if ((ty == TOKT_CONTROL || ty == TOKT_USER_DEFINED ||
             ty == TOKT_UNKNOWN) && n > 0)
            t->special[t->n_special++] = i;
        if ((ty == TOKT_CONTROL || ty == TOKT_USER_DEFINED) && is_eog_name(p, n))
            t->eog[i] = 1;
    }
    qsort_r(t->special, t->n_special, sizeof(int32_t), cmp_special, t);
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    free(model);
    free(pre);
    return t;

fail:
    free(model);
    free(pre);
    nalar_tokenizer_destroy(t);
    return NULL;
}

void
nalar_tokenizer_destroy(nalar_tokenizer *t)
{
    if (t == NULL) return;
    free(t->text);
    free(t->text_off);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->vhash);
    free(t->merge_text);
    free(t->merges);
    free(t->mhash);
    free(t->special);
    free(t);
}

int32_t nalar_tok_n_vocab(const nalar_tokenizer *t) { return t->n_vocab; }
nalar_tok_kind nalar_tok_kind_of(const nalar_tokenizer *t) { return t->kind; }
int32_t nalar_tok_bos(const nalar_tokenizer *t) { return t->bos; }
int32_t nalar_tok_eos(const nalar_tokenizer *t) { return t->eos; }
int nalar_tok_add_bos(const nalar_tokenizer *t) { return t->add_bos; }

int
nalar_tok_is_eog(const nalar_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int
nalar_tok_is_control(const nalar_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->type[id] == TOKT_CONTROL;
}

int
nalar_tok_add_space_prefix(const nalar_tokenizer *t)
{
    return t->add_space_prefix;
}

const char *
nalar_tok_piece(const nalar_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    return t->text + t->text_off[id];
}

int32_t
nalar_tok_lookup(const nalar_tokenizer *t, const char *s, size_t len)
{
    return lookup(t, s, len);
}

/* ---------------------------------------------------------------------- */
/* the merge loop shared by SPM and BPE                                   */

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

static int
bigram_before(const bigram *a, const bigram *b)
{
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

/* A float as an int32 with the same order (scores are finite). */
static int32_t
score_key(float f)
{
    int32_t i;

    if (f == 0.0f) return 0;  /* -0 == +0 */
    memcpy(&i, &f, 4);
    return i < 0 ? i ^ INT32_MAX : i;
}

/* 4-ary heap: shallower than binary, and a node's children share a cache
 * line, which matters with a million symbols in a word */
static int
heap_push(heap *h, bigram g)
{
    size_t i;

    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *v = realloc(h->v, cap * sizeof(*v));
        if (v == NULL) return -1;
        h->v = v;
        h->cap = cap;
    }
    i = h->n++;
    while (i > 0 && bigram_before(&g, &h->v[(i - 1) / 4])) {
        h->v[i] = h->v[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    h->v[i] = g;
    return 0;
}

static bigram
heap_pop(heap *h)
{
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;

    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= h->n) break;
        for (size_t j = c + 1; j < c + 4 && j < h->n; j++)
            if (bigram_before(&h->v[j], &h->v[best])) best = j;
        if (!bigram_before(&h->v[best], &last)) break;
        h->v[i] = h->v[best];
        i = best;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

typedef struct {
    const nalar_tokenizer *t;
    const char *w;        /* the word being merged */
    symbol     *sym;
    heap        q;
    int         oom;
} merger;

/* Queues (left, right) if merging them is allowed. */
static void
try_pair(merger *m, int32_t left, int32_t right)
{
    const symbol *l, *r;
    bigram g;

    if (left < 0 || right < 0) return;
    l = &m->sym[left];
    r = &m->sym[right];
    if (m->t->kind == TOK_SPM) {
        /* SPM: the concatenation must be a token; its score decides */
        int32_t id = lookup(m->t, m->w + l->off, l->n + r->n);
        if (id < 0) return;
        g.key = score_key(m->t->score[id]);
    } else {
        int32_t rank = merge_rank(m->t, m->w + l->off, l->n, m->w + r->off, r->n);
        if (rank < 0) return;
        g.key = -rank;
    }
    g.left = left;
    g.right = right;
    g.size = l->n + r->n;
    if (heap_push(&m->q, g) < 0) m->oom = 1;
}

/* Splits w[0..n) into UTF-8 characters and merges them; returns the index
 * of the first symbol (follow .next), or -1 for an empty word. */
static int
merge_word(merger *m, const char *w, size_t n)
{
    size_t off = 0;
    int32_t k = 0;

    m->w = w;
    m->q.n = 0;
    while (off < n) {
        /* a valid character is one symbol; an invalid byte is one on its
           own (llama.cpp would take the length its lead byte claims, which
           for valid text is the same) */
        size_t i = off, len;
        utf8_decode((const uint8_t *) w, n, &i);
        len = i - off;
        m->sym[k].off = (uint32_t) off;
        m->sym[k].n = (uint32_t) len;
        m->sym[k].prev = k - 1;
        off += len;
        m->sym[k].next = off == n ? -1 : k + 1;
        k++;
    }
    if (k == 0) return -1;
    for (int32_t i = 1; i < k; i++) try_pair(m, i - 1, i);

    while (m->q.n > 0) {
        bigram g = heap_pop(&m->q);
        symbol *l = &m->sym[g.left], *r = &m->sym[g.right];

        /* stale: one side was merged away or grew since g was queued */
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) m->sym[r->next].prev = g.left;
        try_pair(m, l->prev, g.left);
        try_pair(m, g.left, l->next);
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* SPM                                                                    */

static int
spm_fragment(const nalar_tokenizer *t, merger *m, const char *s, size_t n,
             int prefix, idvec *out)
{
    /* "▁" for the dummy prefix and every space */
    size_t spaces = 0, k = 0;
    char *w;

    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    w = malloc(n + 2 * spaces + 3 * (prefix != 0) + 1);
    if (w == NULL) return -1;
    if (prefix) {
        memcpy(w, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            w[k++] = s[i];
        }
    }
    if (merge_word(m, w, k) == 0) {
        for (int32_t i = 0; i != -1; i = m->sym[i].next) {
            const symbol *y = &m->sym[i];
            int32_t id = lookup(t, w + y->off, y->n);
            if (id >= 0) {
                push_id(out, id);
                continue;
            }
            /* never became a token: one byte token per byte */
            for (uint32_t j = 0; j < y->n; j++) {
                int32_t b = t->byte_tok[(uint8_t) w[y->off + j]];
                if (b < 0) b = t->unk;
                if (b >= 0) push_id(out, b);
            }
        }
    }
    free(w);
    return m->oom ? -1 : 0;
}

/* ---------------------------------------------------------------------- */
/* BPE pre-tokenizers: cut code points cp[0..n) into words, writing the
 * end index of each word to ends[]; return the number of words.  They
 * follow llama.cpp's hand-written versions of the regexes, including
 * their reading of \s+(?!\S). */

static int
cls_at(const uint8_t *cls, size_t n, size_t i)
{
    return i < n ? cls[i] : 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d, ASCII case-folded when `fold`; returns the
 * length matched at i (0: none) */
static size_t
match_contraction(const uint32_t *cp, size_t n, size_t i, int fold)
{
    uint32_t a, b;

    if (cp[i] != '\'' || i + 1 >= n) return 0;
    a = cp[i + 1];
    if (fold && a >= 'A' && a <= 'Z') a += 32;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    b = cp[i + 2];
    if (fold && b >= 'A' && b <= 'Z') b += 32;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t
pre_gpt2(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        size_t c = match_contraction(cp, n, pos, 0), ws;
        int f2 = cp[pos] == ' ' ? cls_at(cls, n, pos + 1) : cls[pos];

        if (c > 0) {
            pos += c;
        } else if (f2 & (C_LETTER | C_NUMBER)) {
            int want = f2 & C_LETTER ? C_LETTER : C_NUMBER;
            pos += cp[pos] == ' ';
            while (cls_at(cls, n, pos) & want) pos++;
        } else if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos += cp[pos] == ' ';
            for (;;) {
                int f = cls_at(cls, n, pos);
                if (!(f & C_VALID) || (f & (C_SPACE | C_LETTER | C_NUMBER))) break;
                pos++;
            }
        } else {
            for (ws = 0; cls_at(cls, n, pos + ws) & C_SPACE; ws++) {}
            if (ws > 1 && pos + ws < n) pos += ws - 1; /* leave one for " ?x" */
            else if (ws > 0) pos += ws;
            else pos++;
        }
        ends[nw++] = pos;
    }
    return nw;
}

/* ` ?[^\s\p{L}\p{N}]+` at pos (the caller has checked that it matches),
 * then [\r\n]* (with `slash`, [\r\n/]*): the end of the match */
static size_t
punct_end(const uint32_t *cp, const uint8_t *cls, size_t n, size_t pos,
          int slash)
{
    pos += cp[pos] == ' ';
    for (;;) {
        int g = cls_at(cls, n, pos);
        if (!(g & C_VALID) || (g & (C_SPACE | C_LETTER | C_NUMBER))) break;
        pos++;
    }
    while (pos < n && (cp[pos] == '\r' || cp[pos] == '\n'
                       || (slash && cp[pos] == '/')))
        pos++;
    return pos;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at pos, or the one character there where none
 * matches: the end of the match */
static size_t
space_end(const uint32_t *cp, const uint8_t *cls, size_t n, size_t pos)
{
    size_t ws = 0, last_nl = 0;

    while (cls_at(cls, n, pos + ws) & C_SPACE) {
        if (cp[pos + ws] == '\r' || cp[pos + ws] == '\n')
            last_nl = pos + ws + 1;
        ws++;
    }
    if (last_nl > 0) return last_nl;            /* \s*[\r\n]+ */
    if (ws > 1 && pos + ws < n) return pos + ws - 1;
    if (ws > 0) return pos + ws;
    return pos + 1;
}

/* llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * qwen2: the same with \p{N} one digit at a time. */
static size_t
pre_llama3(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends,
           size_t max_digits)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        size_t c = match_contraction(cp, n, pos, 1);
        uint32_t ch = cp[pos];
        int f = cls[pos], f2;

        if (c > 0) {
            pos += c;
            ends[nw++] = pos;
            continue;
        }
        if (!(ch == '\r' || ch == '\n' || (f & C_NUMBER)) &&
            ((f & C_LETTER) || (cls_at(cls, n, pos + 1) & C_LETTER))) {
            pos++;
            while (cls_at(cls, n, pos) & C_LETTER) pos++;
            ends[nw++] = pos;
            continue;
        }
        if (f & C_NUMBER) {
            size_t start = pos;
            while ((cls_at(cls, n, pos) & C_NUMBER) && pos - start < max_digits)
                pos++;
            ends[nw++] = pos;
            continue;
        }
        f2 = ch == ' ' ? cls_at(cls, n, pos + 1) : f;
        if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos = punct_end(cp, cls, n, pos, 0);
            ends[nw++] = pos;
            continue;
        }
        pos = space_end(cp, cls, n, pos);
        ends[nw++] = pos;
    }
    return nw;
}

/* tekken (Mistral Nemo and later), the regex of its tokenizer.json:
 *   [^\r\n\p{L}\p{N}]?[UP]*[LO]+|[^\r\n\p{L}\p{N}]?[UP]+[LO]*|\p{N}|
 *    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with UP = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], LO = [\p{Ll}\p{Lm}\p{Lo}\p{M}]
 * (alternatives tried in order, each with the regex's backtracking). */

/* [UP]*[LO]+ at q: the end of the match, or q when none */
static size_t
tekken_alt1(const uint8_t *cls, size_t n, size_t q)
{
    size_t e = q, k;

    while (cls_at(cls, n, e) & C_UP) e++;
    if (cls_at(cls, n, e) & C_LO) {
        while (cls_at(cls, n, e) & C_LO) e++;
        return e;
    }
    /* give back UP characters until one of them can start [LO]+ */
    for (k = e; k > q; k--)
        if (cls[k - 1] & C_LO) return k;
    return q;
}

/* [UP]+[LO]* at q */
static size_t
tekken_alt2(const uint8_t *cls, size_t n, size_t q)
{
    size_t e = q;

    while (cls_at(cls, n, e) & C_UP) e++;
    if (e == q) return q;
    while (cls_at(cls, n, e) & C_LO) e++;
    return e;
}

static size_t
pre_tekken(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        uint32_t ch = cp[pos];
        int f = cls[pos], f2;
        int pfx = (f & C_VALID) && ch != '\r' && ch != '\n'
                  && !(f & (C_LETTER | C_NUMBER));
        size_t e;

        if ((pfx && (e = tekken_alt1(cls, n, pos + 1)) > pos + 1)
            || (e = tekken_alt1(cls, n, pos)) > pos
            || (pfx && (e = tekken_alt2(cls, n, pos + 1)) > pos + 1)
            || (e = tekken_alt2(cls, n, pos)) > pos) {
            pos = e;
            ends[nw++] = pos;
            continue;
        }
        if (f & C_NUMBER) {
            ends[nw++] = ++pos;
            continue;
        }
        f2 = ch == ' ' ? cls_at(cls, n, pos + 1) : f;
        if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos = punct_end(cp, cls, n, pos, 1);
            ends[nw++] = pos;
            continue;
        }
        pos = space_end(cp, cls, n, pos);
        ends[nw++] = pos;
    }
    return nw;
}

/* The other pre-tokenizers are sequences of regexes, each splitting every
 * piece the ones before it made into its matches and the text between
 * them (HF tokenizers' Split with "isolated" behaviour; llama.cpp's
 * unicode_regex_split).  A regex is one of these: */
enum {
    RX_GPT2,        /* the GPT-2 regex above */
    RX_NEWLINE,     /* [\r\n] */
    RX_DIGIT,       /* \p{N} */
    RX_DIGITS,      /* \p{N}+ */
    RX_DIGITS3,     /* [0-9][0-9][0-9] */
    RX_FALCON_PUNCT,/* [\p{P}\$\+<=>\^~\|`]+ */
    RX_DS_LETTERS,  /* \s?[A-Za-zµÀ-ÖØ-ö...]+ (deepseek-llm's letters) */
    RX_DS_PUNCT,    /* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
    RX_TRAIL_SPACE, /* \s+$ */
    RX_CJK,         /* [一-龥ࠀ-一가-퟿]+ */
    RX_LETTERS,     /* \s?\p{L}+ */
    RX_PUNCT,       /* \s?\p{P}+ */
    RX_END = -1
};

static const signed char pre_regexes[][7] = {
    [PRE_STARCODER] = { RX_DIGIT, RX_GPT2, RX_END },
    [PRE_DEEPSEEK_LLM] = { RX_NEWLINE, RX_DS_LETTERS, RX_DS_PUNCT,
                           RX_TRAIL_SPACE, RX_CJK, RX_DIGITS, RX_END },
    [PRE_DEEPSEEK_CODER] = { RX_NEWLINE, RX_LETTERS, RX_PUNCT, RX_CJK,
                             RX_DIGIT, RX_END },
    [PRE_FALCON] = { RX_FALCON_PUNCT, RX_GPT2, RX_DIGITS3, RX_END },
};

/* deepseek-llm's letter class, as code point ranges */
static const uint32_t ds_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6},
    {0xF8, 0x1BA}, {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF},
    {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1},
    {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D},
    {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D},
    {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D},
    {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B},
    {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A},
    {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943}
};

static int
in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Does code point i belong to the class a run of regex rx repeats? */
static int
rx_class(int rx, const uint32_t *cp, const uint8_t *cls, size_t i)
{
    uint32_t c = cp[i];

    switch (rx) {
    case RX_DIGIT: case RX_DIGITS:
        return (cls[i] & C_NUMBER) != 0;
    case RX_FALCON_PUNCT:
        return (cls[i] & C_PUNCT) || (c < 128 && c != 0
                                      && strchr("$+<=>^~|`", (int) c));
    case RX_DS_LETTERS:
        return in_ranges(c, ds_letters,
                         sizeof(ds_letters) / sizeof(ds_letters[0]));
    case RX_DS_PUNCT:
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E)
               || (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF5E)
               || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
    case RX_CJK:
        return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x800 && c <= 0x4E00)
               || (c >= 0xAC00 && c <= 0xD7FF);
    case RX_LETTERS:
        return (cls[i] & C_LETTER) != 0;
    case RX_PUNCT:
        return (cls[i] & C_PUNCT) != 0;
    default:
        return 0;
    }
}

/* The length of regex rx's match at i (within [i, n)), 0 when none. */
static size_t
rx_match(int rx, const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
    size_t e = i;

    switch (rx) {
    case RX_NEWLINE:
        return cp[i] == '\r' || cp[i] == '\n';
    case RX_DIGIT:
        return rx_class(rx, cp, cls, i);
    case RX_DIGITS3:
        return i + 3 <= n && cp[i] >= '0' && cp[i] <= '9'
               && cp[i + 1] >= '0' && cp[i + 1] <= '9'
               && cp[i + 2] >= '0' && cp[i + 2] <= '9' ? 3 : 0;
    case RX_DS_LETTERS: case RX_DS_PUNCT: case RX_LETTERS: case RX_PUNCT:
        /* \s? then the class, greedy: the space only when a class
           character follows it */
        if ((cls[i] & C_SPACE) && i + 1 < n && rx_class(rx, cp, cls, i + 1))
            e++;
        /* fall through */
    default:
        while (e < n && rx_class(rx, cp, cls, e)) e++;
        return e - i;
    }
}

/* Splits the piece [a, b) by regex rx, appending the ends of its matches
 * and of the text between them to out; returns how many. */
static size_t
rx_split(int rx, const uint32_t *cp, const uint8_t *cls, size_t a, size_t b,
         size_t *out)
{
    size_t k = 0, gap = a, i;

    if (rx == RX_GPT2) {
        k = pre_gpt2(cp + a, cls + a, b - a, out);
        for (i = 0; i < k; i++) out[i] += a;
        return k;
    }
    if (rx == RX_TRAIL_SPACE) {
        /* one match at most: the whitespace that ends the piece */
        for (i = b; i > a && (cls[i - 1] & C_SPACE); i--) {}
        if (i > a && i < b) out[k++] = i;
        out[k++] = b;
        return k;
    }
    for (i = a; i < b; ) {
        size_t m = rx_match(rx, cp, cls, i, b);
        if (m == 0) {
            i++;
            continue;
        }
        if (i > gap) out[k++] = i;
        i += m;
        out[k++] = gap = i;
    }
    if (gap < b) out[k++] = b;
    return k;
}

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

static void
pretok_free(pretok *p)
{
    free(p->cp);
    free(p->cls);
    free(p->boff);
    free(p->ends);
    free(p->tmp);
}

static int
pretokenize(const nalar_tokenizer *t, const char *s, size_t n, pretok *p)
{
    memset(p, 0, sizeof(*p));
    p->cp = malloc((n + 1) * sizeof(uint32_t));
    p->cls = malloc(n + 1);
    p->boff = malloc((n + 1) * sizeof(size_t));
    p->ends = malloc((n + 1) * sizeof(size_t));
    p->tmp = malloc((n + 1) * sizeof(size_t));
    if (!p->cp || !p->cls || !p->boff || !p->ends || !p->tmp) {
        pretok_free(p);
        return -1;
    }
    for (size_t i = 0; i < n; ) {
        uint32_t c;
        int f = C_VALID;
        p->boff[p->ncp] = i;
        c = utf8_decode((const uint8_t *) s, n, &i);
        if (c >= 128) {
            f = unicode_class(c);
        } else if (c >= 'a' && c <= 'z') {
            f |= C_LETTER | C_LO;   /* ASCII fast path */
        } else if (c >= 'A' && c <= 'Z') {
            f |= C_LETTER | C_UP;
        } else if (c >= '0' && c <= '9') {
            f |= C_NUMBER;
        } else if ((c >= 9 && c <= 13) || c == ' ') {
            f |= C_SPACE;
        } else if (c > ' ' && c < 127 && strchr("$+<=>^`|~", (int) c) == NULL) {
            f |= C_PUNCT;   /* ASCII punctuation but the symbols (\p{S}) */
        }
        p->cp[p->ncp] = c;
        p->cls[p->ncp] = (uint8_t) f;
        p->ncp++;
    }
    p->boff[p->ncp] = n;
    switch (t->pre) {
    case PRE_LLAMA3:
        p->nw = pre_llama3(p->cp, p->cls, p->ncp, p->ends, 3);
        break;
    case PRE_QWEN2:
        p->nw = pre_llama3(p->cp, p->cls, p->ncp, p->ends, 1);
        break;
    case PRE_TEKKEN:
        p->nw = pre_tekken(p->cp, p->cls, p->ncp, p->ends);
        break;
    case PRE_GPT2:
        p->nw = pre_gpt2(p->cp, p->cls, p->ncp, p->ends);
        break;
    default:
        /* each regex splits every piece made so far */
        p->nw = 0;
        if (p->ncp > 0) p->ends[p->nw++] = p->ncp;
        for (const signed char *rx = pre_regexes[t->pre]; *rx != RX_END;
             rx++) {
            size_t *prev = p->ends, np = p->nw, a = 0;
            p->ends = p->tmp;
            p->tmp = prev;
            p->nw = 0;
            for (size_t k = 0; k < np; k++) {
                p->nw += rx_split(*rx, p->cp, p->cls, a, prev[k],
                                  p->ends + p->nw);
                a = prev[k];
            }
        }
        break;
    }
    return 0;
}

int
nalar_tok_pretokenize(const nalar_tokenizer *t, const char *text, size_t len,
                      size_t *ends, int cap)
{
    pretok p;
    int nw;

    if (t == NULL || t->kind != TOK_BPE || (text == NULL && len > 0) ||
        len > INT_MAX / 8 || pretokenize(t, text, len, &p) < 0)
        return -1;
    for (size_t k = 0; k < p.nw && k < (size_t) (cap > 0 ? cap : 0); k++)
        ends[k] = p.boff[p.ends[k]];
    nw = (int) p.nw;
    pretok_free(&p);
    return nw;
}

static int
bpe_fragment(const nalar_tokenizer *t, merger *m, const char *s, size_t n,
             idvec *out)
{
    pretok p;
    char *w = malloc(8 * n + 1);   /* each byte -> U+FFFD -> 2 bytes each */
    size_t start = 0;
    int rc = -1;

    if (w == NULL) return -1;
    if (pretokenize(t, s, n, &p) < 0) {
        free(w);
        return -1;
    }
    for (size_t k = 0; k < p.nw; k++) {
        size_t wn = 0;
        int32_t id;

        /* the word's bytes, each as its printable code point */
        for (size_t i = start; i < p.ends[k]; i++) {
            char u[4];
            int ul = utf8_encode(p.cp[i], u);
            for (int j = 0; j < ul; j++)
                wn += utf8_encode(t->byte_cp[(uint8_t) u[j]], w + wn);
        }
        start = p.ends[k];

        if (t->ignore_merges && (id = lookup(t, w, wn)) >= 0) {
            push_id(out, id);
            continue;
        }
        if (merge_word(m, w, wn) < 0) continue;
        for (int32_t i = 0; i != -1; i = m->sym[i].next) {
            const symbol *y = &m->sym[i];
            id = lookup(t, w + y->off, y->n);
            if (id >= 0) {
                push_id(out, id);
                continue;
            }
            /* as llama.cpp: try each byte of the symbol on its own */
            for (uint32_t j = 0; j < y->n; j++) {
                id = lookup(t, w + y->off + j, 1);
                if (id >= 0) push_id(out, id);
            }
        }
        if (m->oom) goto done;
        if (full(out)) break;
    }
    rc = 0;
done:
    pretok_free(&p);
    free(w);
    return rc;
}

/* ---------------------------------------------------------------------- */
/* encoding                                                               */

typedef struct {
    size_t  off, len;  /* raw text span when id < 0 */
    int32_t id;        /* special token */
} fragment;

typedef struct {
    fragment *v;
    size_t    n, cap;
} fragvec;

static int
push_frag(fragvec *fv, size_t off, size_t len, int32_t id)
{
    if (fv->n == fv->cap) {
        size_t cap = fv->cap ? 2 * fv->cap : 16;
        fragment *v = realloc(fv->v, cap * sizeof(*v));
        if (v == NULL) return -1;
        fv->v = v;
        fv->cap = cap;
    }
    fv->v[fv->n].off = off;
    fv->v[fv->n].len = len;
    fv->v[fv->n].id = id;
    fv->n++;
    return 0;
}

/* Splits the raw fragments at every occurrence of each special token,
 * longest tokens first (llama.cpp's tokenizer_st_partition). */
static int
partition(const nalar_tokenizer *t, const char *text, int parse_special,
          fragvec *cur)
{
    fragvec nxt = { 0 };
    int rc = 0;

    for (int32_t s = 0; s < t->n_special && rc == 0; s++) {
        int32_t id = t->special[s];
        uint32_t sl;
        const char *sp = piece_of(t, id, &sl);
        int found = 0;

        /* user-defined tokens always split; control and unknown only
           when asked to */
        if (!parse_special && t->type[id] != TOKT_USER_DEFINED) continue;
        for (size_t i = 0; i < cur->n && !found; i++)
            found = cur->v[i].id < 0 &&
                    memmem(text + cur->v[i].off, cur->v[i].len, sp, sl) != NULL;
        if (!found) continue;

        nxt.n = 0;
        for (size_t i = 0; i < cur->n && rc == 0; i++) {
            fragment fr = cur->v[i];
            size_t pos = fr.off, end = fr.off + fr.len;
            const char *p;

            if (fr.id >= 0) {
                rc = push_frag(&nxt, fr.off, fr.len, fr.id);
                continue;
            }
            while (rc == 0 && (p = memmem(text + pos, end - pos, sp, sl)) != NULL) {
                size_t at = (size_t) (p - text);
                if (at > pos) rc = push_frag(&nxt, pos, at - pos, -1);
                if (rc == 0) rc = push_frag(&nxt, at, sl, id);
                pos = at + sl;
            }
            if (rc == 0 && pos < end) rc = push_frag(&nxt, pos, end - pos, -1);
        }
        {
            fragvec tmp = *cur;
            *cur = nxt;
            nxt = tmp;
        }
    }
    free(nxt.v);
    return rc;
}

/* Encodes the fragments of `text` into ids (up to ids->lim). */
static int
encode(const nalar_tokenizer *t, const char *text, size_t len,
       const fragvec *fv, int add_bos, idvec *ids)
{
    merger m = { 0 };
    int prev_special = 1;   /* SPM: a dummy prefix before the first text */
    int rc = -1;

    if (add_bos && t->bos >= 0) push_id(ids, t->bos);

    /* symbols: SPM one per character (+1 for the prefix); BPE one per
       byte of a word, where an invalid byte became 3 bytes of U+FFFD */
    m.t = t;
    m.sym = malloc(((t->kind == TOK_SPM ? len : 3 * len) + 2) * sizeof(symbol));
    if (m.sym == NULL) goto done;

    for (size_t i = 0; i < fv->n && !full(ids); i++) {
        const fragment *fr = &fv->v[i];
        if (fr->id >= 0) {
            push_id(ids, fr->id);
            prev_special = 1;
            continue;
        }
        if (t->kind == TOK_SPM) {
            if (spm_fragment(t, &m, text + fr->off, fr->len,
                             t->add_space_prefix && prev_special, ids) < 0)
                goto done;
        } else {
            if (bpe_fragment(t, &m, text + fr->off, fr->len, ids) < 0)
                goto done;
        }
        prev_special = 0;
    }
    rc = ids->oom ? -1 : 0;
done:
    free(m.sym);
    free(m.q.v);
    return rc;
}

int
nalar_tokenize(const nalar_tokenizer *t, const char *text, size_t len,
               int add_bos, int parse_special, int32_t *out, int cap)
{
    fragvec fv = { 0 };
    idvec ids = { 0 };
    int rc = -1;

    if (t == NULL || (text == NULL && len > 0) || len > INT_MAX / 8) return -1;

    ids.lim = (size_t) INT_MAX + 1;
    if (len > 0 && push_frag(&fv, 0, len, -1) < 0) goto done;
    if (len > 0 && partition(t, text, parse_special, &fv) < 0) goto done;
    if (encode(t, text, len, &fv, add_bos, &ids) < 0 || ids.n > INT_MAX)
        goto done;

    if (out != NULL && cap > 0 && ids.n > 0)
        memcpy(out, ids.v, (ids.n < (size_t) cap ? ids.n : (size_t) cap)
                            * sizeof(int32_t));
    rc = (int) ids.n;
done:
    free(fv.v);
    free(ids.v);
    return rc;
}

int
nalar_tokenize_bounded(const nalar_tokenizer *t, const nalar_tok_text *pc,
                       size_t n, int add_bos, int max_ids, int32_t **out,
                       int *more)
{
    fragvec fv = { 0 }, one = { 0 };
    idvec ids = { 0 };
    size_t total = 0, limit, used, off;
    char *buf = NULL;
    const char *text;
    int over = 0, rc = -1;

    *out = NULL;
    *more = 0;
    if (t == NULL || max_ids < 0 || max_ids == INT_MAX || (pc == NULL && n > 0))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if ((pc[i].text == NULL && pc[i].len > 0) || pc[i].len > SIZE_MAX / 2
            || total + pc[i].len < total)
            return -1;
        total += pc[i].len;
    }

    /* no token stands for more bytes of text than its piece has (a space
       is one byte of text and three of "\xE2\x96\x81"; byte tokens stand
       for one), so text longer than this has more than max_ids tokens */
    limit = ((size_t) max_ids + 1) * (t->max_piece > 0 ? t->max_piece : 1);
    used = total;
    if (total > limit) {
        used = limit;
        over = 1;
    }
    if (used > INT_MAX / 8) return -1;

    /* the text the pieces make, up to `used` bytes, cut at a character */
    if (n == 1) {
        text = pc[0].text;
    } else {
        /* one byte more when cut: the character test below reads it */
        size_t want = over ? used + 1 : used;

        buf = malloc(want + 1);
        if (buf == NULL) return -1;
        off = 0;
        for (size_t i = 0; i < n && off < want; i++) {
            size_t k = pc[i].len < want - off ? pc[i].len : want - off;
            if (k > 0) memcpy(buf + off, pc[i].text, k);
            off += k;
        }
        text = buf;
    }
    while (over && used > 0 && ((uint8_t) text[used] & 0xC0) == 0x80) used--;

    /* each piece is split at the special tokens it may hold; literal text
       that continues across pieces is one fragment, encoded as a whole */
    off = 0;
    for (size_t i = 0; i < n && off < used; i++) {
        size_t len = pc[i].len < used - off ? pc[i].len : used - off;

        if (len == 0) continue;
        one.n = 0;
        if (push_frag(&one, off, len, -1) < 0
            || partition(t, text, pc[i].special, &one) < 0)
            goto done;
        for (size_t k = 0; k < one.n; k++) {
            fragment *last = fv.n > 0 ? &fv.v[fv.n - 1] : NULL;

            if (one.v[k].id < 0 && last != NULL && last->id < 0
                && last->off + last->len == one.v[k].off) {
                last->len += one.v[k].len;
            } else if (push_frag(&fv, one.v[k].off, one.v[k].len,
                                 one.v[k].id) < 0) {
                goto done;
            }
        }
        off += len;
    }

    ids.lim = (size_t) max_ids + 1;
    if (encode(t, text, used, &fv, add_bos, &ids) < 0) goto done;
    if (ids.n > (size_t) max_ids) {
        over = 1;
        ids.n = (size_t) max_ids;
    }
    *out = ids.v;
    ids.v = NULL;
    *more = over;
    rc = (int) ids.n;
done:
    free(ids.v);
    free(fv.v);
    free(one.v);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------------- */
/* decoding                                                               */

/* The bytes of one token into out (up to cap); returns the full length,
 * which may exceed cap. */
static int
piece_bytes(const nalar_tokenizer *t, int32_t id, char *out, int cap)
{
    uint32_t n;
    const char *p;
    int k = 0;

    if (t == NULL || id < 0 || id >= t->n_vocab) return 0;
    p = piece_of(t, id, &n);

#define EMIT(c) do { if (k < cap) out[k] = (char) (c); k++; } while (0)
    switch (t->type[id]) {
    case TOKT_USER_DEFINED:
        /* verbatim */
        for (uint32_t i = 0; i < n; i++) EMIT(p[i]);
        return k;
    case TOKT_NORMAL:
        break;
    case TOKT_BYTE:
        if (t->kind == TOK_SPM && n == 6 && memcmp(p, "<0x", 3) == 0) {
            int v = 0;
            for (int i = 3; i < 5; i++) {
                char c = p[i];
                v <<= 4;
                if (c >= '0' && c <= '9') v |= c - '0';
                else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
                else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
                else return 0;
            }
            EMIT(v);
            return k;
        }
        break;
    case TOKT_UNKNOWN:
        if (t->kind == TOK_SPM) {
            /* llama.cpp shows an unknown piece as U+2585 "▅" */
            EMIT(0xE2); EMIT(0x96); EMIT(0x85);
        }
        return k;
    default:
        /* control, unused, undefined: nothing */
        return 0;
    }

    if (t->kind == TOK_SPM) {
        for (uint32_t i = 0; i < n; i++) {
            if (i + 2 < n && memcmp(p + i, "\xE2\x96\x81", 3) == 0) {
                EMIT(' ');
                i += 2;
            } else {
                EMIT(p[i]);
            }
        }
    } else {
        /* byte-level: each code point back to its byte; code points
           outside the map pass through as their UTF-8 */
        for (size_t i = 0; i < n; ) {
            size_t i0 = i;
            uint32_t c = utf8_decode((const uint8_t *) p, n, &i);
            if (c < 512 && t->cp_byte[c] >= 0 && !(c == 0xFFFD)) {
                EMIT(t->cp_byte[c]);
            } else {
                for (size_t j = i0; j < i; j++) EMIT(p[j]);
            }
        }
    }
#undef EMIT
    return k;
}

int
nalar_token_bytes(const nalar_tokenizer *t, int32_t id, char *out, int cap)
{
    int n = piece_bytes(t, id, out, cap);
    return n < cap ? n : cap;
}

void
nalar_detok_init(nalar_detok *d, const nalar_tokenizer *t)
{
    memset(d, 0, sizeof(*d));
    d->tok = t;
}

/* Runs bytes through the UTF-8 assembler in state (pend, *np), writing
 * complete characters to out; an invalid byte or a sequence cut short
 * becomes one U+FFFD per byte.  Returns bytes written, or -1 if more than
 * cap would be needed. */
static int
utf8_stream(char *pend, int *np, const uint8_t *in, size_t n, char *out,
            int cap)
{
    int k = 0;

#define PUT(p, len) do {                                   \
        if (k + (len) > cap) return -1;                    \
        memcpy(out + k, (p), (len));                       \
        k += (len);                                        \
    } while (0)

    for (size_t i = 0; i < n; i++) {
        uint8_t b = in[i];
    again:
        if (*np == 0) {
            int need = utf8_lead_len(b);
            if (need == 1) PUT(&b, 1);
            else if (need == 0) PUT("\xEF\xBF\xBD", 3);
            else pend[(*np)++] = (char) b;
            continue;
        }
        if (utf8_cont_ok((uint8_t) pend[0], *np, b)) {
            pend[(*np)++] = (char) b;
            if (*np == utf8_lead_len((uint8_t) pend[0])) {
                PUT(pend, *np);
                *np = 0;
            }
            continue;
        }
        /* the held bytes cannot complete: each becomes U+FFFD */
        for (int j = 0; j < *np; j++) PUT("\xEF\xBF\xBD", 3);
        *np = 0;
        goto again;
    }
#undef PUT
    return k;
}

int
nalar_detok_feed(nalar_detok *d, int32_t id, char *out, int cap)
{
    char small[256], *buf = small, pend[8];
    int n, np = d->n_pending, k;
    uint8_t *b;

    if (cap < 1) return -1;
    n = piece_bytes(d->tok, id, NULL, 0);
    if (n > (int) sizeof(small)) {
        buf = malloc(n);
        if (buf == NULL) return -1;
    }
    piece_bytes(d->tok, id, buf, n);
    b = (uint8_t *) buf;
    if (d->strip_space && n > 0 && b[0] == ' ') {
        b++;
        n--;
    }
    memcpy(pend, d->pending, sizeof(pend));
    k = utf8_stream(pend, &np, b, (size_t) n, out, cap - 1);
    if (buf != small) free(buf);
    if (k < 0) return -1;           /* state untouched: retry bigger */
    if (n > 0 || b != (uint8_t *) buf) d->strip_space = 0;
    memcpy(d->pending, pend, sizeof(pend));
    d->n_pending = np;
    out[k] = '\0';
    return k;
}

int
nalar_detok_flush(nalar_detok *d, char *out, int cap)
{
    int k = 0;

    if (cap < 1) return -1;
    if (3 * d->n_pending + 1 > cap) return -1;
    for (int j = 0; j < d->n_pending; j++) {
        memcpy(out + k, "\xEF\xBF\xBD", 3);
        k += 3;
    }
    d->n_pending = 0;
    out[k] = '\0';
    return k;
}

char *
nalar_detokenize(const nalar_tokenizer *t, const int32_t *ids, int n)
{
    nalar_detok d;
    size_t cap = 64, len = 0;
    char *s = malloc(cap);

    if (s == NULL || t == NULL || (ids == NULL && n > 0)) {
        free(s);
        return NULL;
    }
    nalar_detok_init(&d, t);
    d.strip_space = t->kind == TOK_SPM && t->add_space_prefix;
    for (int i = 0; i <= n; i++) {
        /* room for the piece, its U+FFFDs and what was held back */
        size_t need = i < n ? 3 * (size_t) piece_bytes(t, ids[i], NULL, 0) + 32
                            : 32;
        int k;
        if (len + need > cap) {
            char *r;
            while (len + need > cap) cap *= 2;
            r = realloc(s, cap);
            if (r == NULL) {
                free(s);
                return NULL;
            }
            s = r;
        }
        k = i < n ? nalar_detok_feed(&d, ids[i], s + len, (int) (cap - len))
                  : nalar_detok_flush(&d, s + len, (int) (cap - len));
        if (k < 0) {
            free(s);
            return NULL;
        }
        len += k;
    }
    s[len] = '\0';
    return s;
}
