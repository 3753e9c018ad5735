/*
 * Random-weights Llama model writer (`nalar mkmodel`).
 *
 * The model is meaningless but well-formed: every tensor llama.cpp expects
 * for arch "llama", weights at the scale of a freshly initialised network
 * (uniform, 1/sqrt(fan-in)) so activations stay finite through any number
 * of layers, and a vocabulary a real tokenizer can use:
 *
 *   SPM  (tokenizer.ggml.model "llama"): <unk> <s> </s>, the 256 byte
 *        tokens <0x00>..<0xFF>, then "▁", printable ASCII, "▁"+char and
 *        English-looking pieces with decreasing scores.
 *   BPE  (tokenizer.ggml.model "gpt2"): the 256 byte-level characters, then
 *        merged tokens, each made by one line of tokenizer.ggml.merges from
 *        two earlier tokens, then <|endoftext|> (BOS = EOS).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "cpu_quant.h"
#include "mkmodel.h"
#include "mkmodel_internal.h"
#include "vocab_hf.h"

#define MAX_VOCAB 1000000

/* llama.cpp's general.file_type numbering (LLAMA_FTYPE_*) */
enum { FTYPE_F32 = 0, FTYPE_F16 = 1, FTYPE_Q4_0 = 2, FTYPE_Q8_0 = 7,
       FTYPE_Q4_K_S = 14, FTYPE_Q4_K_M = 15, FTYPE_Q5_K_S = 16,
       FTYPE_Q5_K_M = 17, FTYPE_Q6_K = 18, FTYPE_BF16 = 32 };

/* token types, llama.cpp numbering */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };


void
nalar_mkmodel_defaults(nalar_mkmodel_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->dim = 128;
    o->n_layers = 2;
    o->n_heads = 4;
    o->n_kv_heads = 2;
    o->ffn_dim = 384;
    o->n_vocab = 2048;
    o->n_ctx = 512;
    o->type = GGML_F32;
    o->seed = 1;
    o->bpe = 0;
    o->chatml = 0;
    o->pre = NULL;
    o->control_tokens = NULL;
    o->vocab_from = NULL;
    o->chat_template = NULL;
    o->rope_base = 10000.0f;
}


/* ---------------------------------------------------------------- */
/* weights                                                           */


/* splitmix64: tiny, fast, and every seed (0 included) gives a good stream */
static uint64_t
rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}


/* uniform in [-1, 1) with 24 random bits */
float
nalar_mk_uniform(uint64_t *s)
{
    return (float) (rng_next(s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}


/* One block of 32: d = max|x| / 127, q = round(x / d). */
static void
quantize_q8_0(const float *x, uint8_t *out)
{
    float  amax = 0.0f, d, id;
    int8_t q;

    for (int j = 0; j < QK8_0; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    d = amax / 127.0f;
    id = d != 0.0f ? 1.0f / d : 0.0f;
    {
        uint16_t h = nalar_f32_to_f16(d);
        memcpy(out, &h, 2);
    }
    for (int j = 0; j < QK8_0; j++) {
        q = (int8_t) roundf(x[j] * id);
        memcpy(out + 2 + j, &q, 1);
    }
}


/*
 * One block of 32, as ggml: d = m / -8 where m is the value of largest
 * magnitude, so m itself maps to code 0 and the others to 0..15; element j
 * goes in the low nibble of byte j, element j + 16 in the high nibble.
 */
static void
quantize_q4_0(const float *x, uint8_t *out)
{
    float amax = 0.0f, m = 0.0f, d, id;

    for (int j = 0; j < QK4_0; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    }
    d = m / -8.0f;
    id = d != 0.0f ? 1.0f / d : 0.0f;
    {
        uint16_t h = nalar_f32_to_f16(d);
        memcpy(out, &h, 2);
    }
    for (int j = 0; j < QK4_0 / 2; j++) {
        int lo = (int) (x[j] * id + 8.5f), hi = (int) (x[j + 16] * id + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        out[2 + j] = (uint8_t) (lo | (hi << 4));
    }
}


/* n floats (a multiple of 32 for quantized types) into `type` at out. */
void
nalar_mk_convert(const float *x, size_t n, ggml_type type, void *out)
{
    uint8_t *o = out;

    switch (type) {
    case GGML_F32:
        memcpy(out, x, n * sizeof(float));
        break;
    case GGML_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = nalar_f32_to_f16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case GGML_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = nalar_f32_to_bf16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case GGML_Q8_0:
        for (size_t b = 0; b < n / QK8_0; b++) {
            quantize_q8_0(x + b * QK8_0, o + b * (2 + QK8_0));
        }
        break;
    case GGML_Q4_0:
        for (size_t b = 0; b < n / QK4_0; b++) {
            quantize_q4_0(x + b * QK4_0, o + b * (2 + QK4_0 / 2));
        }
        break;
    case GGML_Q4_K:
    case GGML_Q5_K:
    case GGML_Q6_K:
        (void) nalar_quantize_row(type, x, (int64_t) n, out);
        break;
    }
}


/*
 * W: (rows, cols), applied as y = W x: uniform / sqrt(cols) so each output
 * has variance ~ var(x) / 3 regardless of width.  ggml shape [cols, rows].
 */
static void
add_matrix(gguf_writer *w, const char *name, int rows, int cols,
           ggml_type type, uint64_t *rng, float *tmp, void *conv)
{
    size_t   n = (size_t) rows * (size_t) cols;
    uint64_t ne[2] = { (uint64_t) cols, (uint64_t) rows };
    float    scale = 1.0f / sqrtf((float) cols);

    for (size_t i = 0; i < n; i++) {
        tmp[i] = nalar_mk_uniform(rng) * scale;
    }
    nalar_mk_convert(tmp, n, type, conv);
    gguf_w_tensor(w, name, type, 2, ne, conv);
}


/* a bias vector: uniform in [-0.5, 0.5) */
static void
add_bias(gguf_writer *w, const char *name, int n, uint64_t *rng, float *tmp)
{
    uint64_t ne[1] = { (uint64_t) n };

    for (int i = 0; i < n; i++) {
        tmp[i] = 0.5f * nalar_mk_uniform(rng);
    }
    gguf_w_tensor(w, name, GGML_F32, 1, ne, tmp);
}


static void
add_norm(gguf_writer *w, const char *name, int dim, float *tmp)
{
    uint64_t ne[1] = { (uint64_t) dim };

    for (int i = 0; i < dim; i++) {
        tmp[i] = 1.0f;
    }
    gguf_w_tensor(w, name, GGML_F32, 1, ne, tmp);
}


/* ---------------------------------------------------------------- */
/* vocabulary                                                        */


/* A growing list of unique strings with a hash set over them. */
typedef struct {
    char    **s;          /* (cap) owned */
    int       n, cap;
    int32_t  *set;        /* (set_size) index + 1, 0 = empty */
    size_t    set_size;   /* power of two, > 2 * cap */
} strset;


static uint64_t
fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;

    for (; *s; s++) {
        h = (h ^ (uint8_t) *s) * 1099511628211ull;
    }
    return h;
}


static int
strset_init(strset *v, int cap)
{
    v->n = 0;
    v->cap = cap;
    v->set_size = 1;
    while (v->set_size < (size_t) cap * 2 + 2) {
        v->set_size <<= 1;
    }
    v->s = calloc((size_t) cap, sizeof(char *));
    v->set = calloc(v->set_size, sizeof(int32_t));
    return v->s && v->set ? 0 : -1;
}


static void
strset_free(strset *v)
{
    for (int i = 0; i < v->n; i++) {
        free(v->s[i]);
    }
    free(v->s);
    free(v->set);
}


/* slot of s: where it is, or the empty slot where it would go */
static size_t
strset_slot(const strset *v, const char *s)
{
    size_t h = (size_t) fnv(s) & (v->set_size - 1);

    while (v->set[h] != 0 && strcmp(v->s[v->set[h] - 1], s) != 0) {
        h = (h + 1) & (v->set_size - 1);
    }
    return h;
}


static int
strset_has(const strset *v, const char *s)
{
    return v->set[strset_slot(v, s)] != 0;
}


/* Appends s if new and there is room; 1 added, 0 present/full, -1 OOM. */
static int
strset_add(strset *v, const char *s)
{
    size_t h = strset_slot(v, s);

    if (v->set[h] != 0 || v->n == v->cap) {
        return 0;
    }
    v->s[v->n] = strdup(s);
    if (v->s[v->n] == NULL) {
        return -1;
    }
    v->set[h] = ++v->n;
    return 1;
}


/*
 * English-looking candidates, most "frequent" first: common bigrams, common
 * words after a space, then every lowercase 2-, 3-, 4- and 5-letter string,
 * bare and after a space.  `space` says whether the candidate follows a
 * space (the caller spells that "▁" or "Ġ").
 */
static const char *top_bigrams[] = {
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es",
    "or", "te", "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng",
    "se", "ha", "as", "ou", "io", "le", "ve", "co", "me", "de", "hi", "ri",
    "ro", "ic", "ne", "ea", "ra", "ce", "ll", "ss", "ee"
};

static const char *top_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on",
    "are", "as", "with", "his", "they", "at", "be", "this", "have", "from",
    "or", "one", "had", "by", "word", "but", "not", "what", "all", "were",
    "we", "when", "your", "can", "said", "there", "use", "an", "each",
    "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her",
    "would", "make", "like", "him", "into", "time", "has", "look", "two",
    "more", "write", "go", "see", "number", "no", "way", "could", "people",
    "my", "than", "first", "water", "been", "call", "who", "its", "now",
    "find", "long", "down", "day", "did", "get", "come", "made", "may",
    "part", "over", "new", "sound", "take", "only", "little", "work",
    "know", "place", "year", "live", "me", "back", "give", "most", "very",
    "after", "thing", "our", "just", "name", "good", "man", "think", "say",
    "great", "where", "help", "through", "much", "before", "line", "right",
    "too", "mean", "old", "any", "same", "tell", "boy", "follow", "came",
    "want", "show", "also", "around", "form", "three", "small", "set",
    "put", "end", "does", "another", "well", "large", "must", "big", "even",
    "such", "because", "turn", "here", "why", "ask", "went", "men", "read",
    "need", "land", "different", "home", "us", "move", "try", "kind",
    "hand", "picture", "again", "change", "off", "play", "spell", "air",
    "away", "animal", "house", "point", "page", "letter", "mother", "answer",
    "found", "study", "still", "learn", "should", "world", "high", "every",
    "near", "add", "food", "between", "own", "below", "country", "plant",
    "last", "school", "father", "keep", "tree", "never", "start", "city",
    "earth", "eye", "light", "thought", "head", "under", "story", "saw",
    "left", "few", "while", "along", "might", "close", "something", "seem",
    "next", "hard", "open", "example", "begin", "life", "always", "those",
    "both", "paper", "together", "got", "group", "often", "run", "important"
};

#define N_ARR(a) (sizeof(a) / sizeof((a)[0]))

typedef struct {
    int      stage;      /* 0 bigrams, 1 words, 2.. n-grams */
    uint64_t i;          /* position within the stage */
} cand_gen;


/* Next candidate into buf (lowercase ASCII); 0 when exhausted. */
static int
cand_next(cand_gen *g, char *buf, int *space)
{
    for (;;) {
        if (g->stage == 0) {
            if (g->i < N_ARR(top_bigrams)) {
                strcpy(buf, top_bigrams[g->i++]);
                *space = 0;
                return 1;
            }
        } else if (g->stage == 1) {
            if (g->i < N_ARR(top_words)) {
                strcpy(buf, top_words[g->i++]);
                *space = 1;
                return 1;
            }
        } else if (g->stage <= 9) {
            /* stages 2..9: length 2 + (stage - 2) / 2, bare then spaced */
            int      len = 2 + (g->stage - 2) / 2;
            uint64_t total = 1;

            for (int k = 0; k < len; k++) {
                total *= 26;
            }
            if (g->i < total) {
                uint64_t x = g->i++;
                for (int k = len - 1; k >= 0; k--) {
                    buf[k] = (char) ('a' + x % 26);
                    x /= 26;
                }
                buf[len] = '\0';
                *space = (g->stage - 2) % 2;
                return 1;
            }
        } else {
            return 0;
        }
        g->stage++;
        g->i = 0;
    }
}


typedef struct {
    strset   tok;        /* (n_vocab) token strings, id order */
    float   *scores;     /* (n_vocab) */
    int32_t *types;      /* (n_vocab) */
    strset   merges;     /* BPE only: "a b" per merged token */
} vocab;


static int
vocab_add(vocab *v, const char *s, float score, int32_t type)
{
    int id = v->tok.n;
    int rc = strset_add(&v->tok, s);

    if (rc == 1) {
        v->scores[id] = score;
        v->types[id] = type;
    }
    return rc;
}


static int
build_spm(vocab *v, int n_vocab)
{
    char     buf[64], piece[72];
    cand_gen g = { 0, 0 };
    int      space, rc = 0;
    float    score = 0.0f;   /* normal pieces: 0, -1, -2, ... by id */

    rc |= vocab_add(v, "<unk>", 0.0f, TT_UNKNOWN);
    rc |= vocab_add(v, "<s>", 0.0f, TT_CONTROL);
    rc |= vocab_add(v, "</s>", 0.0f, TT_CONTROL);
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof(buf), "<0x%02X>", b);
        rc |= vocab_add(v, buf, 0.0f, TT_BYTE);
    }
    /* then "▁", each printable ASCII char, "▁" + each; then candidates */
    rc |= vocab_add(v, "\xe2\x96\x81", score--, TT_NORMAL);
    for (int c = 0x21; c < 0x7f; c++) {
        snprintf(buf, sizeof(buf), "%c", c);
        rc |= vocab_add(v, buf, score--, TT_NORMAL);
    }
    for (int c = 0x21; c < 0x7f; c++) {
        snprintf(buf, sizeof(buf), "\xe2\x96\x81%c", c);
        rc |= vocab_add(v, buf, score--, TT_NORMAL);
    }
    while (rc >= 0 && v->tok.n < n_vocab && cand_next(&g, buf, &space)) {
        int added;

        snprintf(piece, sizeof(piece), "%s%s", space ? "\xe2\x96\x81" : "",
                 buf);
        added = vocab_add(v, piece, score, TT_NORMAL);
        if (added < 0) {
            return -1;
        }
        score -= (float) added;   /* duplicates skipped, scores stay dense */
    }
    return rc < 0 || v->tok.n < n_vocab ? -1 : 0;
}


/*
 * GPT-2's byte-level alphabet: printable bytes stand for themselves, the
 * other 68 (controls, space, DEL, NBSP, SHY...) become U+0100 + n in byte
 * order, so every byte is a visible character and a space is "Ġ" (U+0120).
 * Token ids 0..255 follow GPT-2's order: printable ranges first.
 */
static void
byte_level(char chr[256][4], int order[256])
{
    int n = 0, k = 0;

    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac)
                        || (b >= 0xae && b <= 0xff);
        unsigned cp = printable ? (unsigned) b : 256u + (unsigned) n++;

        if (cp < 0x80) {
            chr[b][0] = (char) cp;
            chr[b][1] = '\0';
        } else {            /* all < 0x800: two UTF-8 bytes */
            chr[b][0] = (char) (0xc0 | (cp >> 6));
            chr[b][1] = (char) (0x80 | (cp & 0x3f));
            chr[b][2] = '\0';
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac)
                            || (b >= 0xae && b <= 0xff);
            if (printable == (pass == 0)) {
                order[k++] = b;
            }
        }
    }
}


/* rank of merge "a b", or -1 */
static int
merge_rank(const strset *merges, const char *a, const char *b)
{
    char   key[64];
    size_t na = strlen(a), nb = strlen(b);
    size_t h;

    if (na + nb + 2 > sizeof(key)) {
        return -1;
    }
    memcpy(key, a, na);
    key[na] = ' ';
    memcpy(key + na + 1, b, nb + 1);
    h = strset_slot(merges, key);
    return merges->set[h] - 1;
}


/*
 * Byte-level BPE: the 256 byte characters, then for each candidate word
 * run BPE with the merges so far; while it does not come out as a single
 * token, add a merge of its first two symbols.  A new merge has the lowest
 * priority, so encoding the word again retraces the same steps and then
 * takes the new merge: every word added encodes to exactly one token, the
 * way a trained BPE vocabulary behaves on its frequent words.
 */
static int
build_bpe(vocab *v, int n_vocab)
{
    char     chr[256][4], buf[64], sym[8][64], joined[64];
    int      order[256], space, k;
    cand_gen g = { 0, 0 };

    byte_level(chr, order);
    for (int i = 0; i < 256; i++) {
        vocab_add(v, chr[order[i]], 0.0f, TT_NORMAL);
    }

    while (v->tok.n < n_vocab - 1 && cand_next(&g, buf, &space)) {
        /* symbols: one byte-level char each ("Ġ" for the space) */
        k = 0;
        if (space) {
            strcpy(sym[k++], chr[' ']);
        }
        for (const char *c = buf; *c && k < 8; c++) {
            strcpy(sym[k++], chr[(uint8_t) *c]);
        }

        while (k > 1) {
            int best = -1, best_rank = 0;

            for (int i = 0; i + 1 < k; i++) {
                int r = merge_rank(&v->merges, sym[i], sym[i + 1]);
                if (r >= 0 && (best < 0 || r < best_rank)) {
                    best = i;
                    best_rank = r;
                }
            }
            if (best < 0) {
                /* no merge applies: teach it the first pair */
                size_t n0 = strlen(sym[0]), n1 = strlen(sym[1]);

                if (v->tok.n >= n_vocab - 1) {
                    break;
                }
                memcpy(joined, sym[0], n0);
                joined[n0] = ' ';
                memcpy(joined + n0 + 1, sym[1], n1 + 1);
                if (strset_add(&v->merges, joined) < 0) {
                    return -1;
                }
                best = 0;
            }
            /* apply: sym[best] absorbs sym[best + 1] */
            {
                size_t n0 = strlen(sym[best]), n1 = strlen(sym[best + 1]);

                memcpy(joined, sym[best], n0);
                memcpy(joined + n0, sym[best + 1], n1 + 1);
                if (!strset_has(&v->tok, joined)
                    && vocab_add(v, joined, 0.0f, TT_NORMAL) < 0)
                {
                    return -1;
                }
                strcpy(sym[best], joined);
                memmove(sym[best + 1], sym[best + 2],
                        (size_t) (k - best - 2) * sizeof(sym[0]));
                k--;
            }
        }
    }
    if (vocab_add(v, "<|endoftext|>", 0.0f, TT_CONTROL) != 1) {
        return -1;
    }
    return v->tok.n == n_vocab ? 0 : -1;
}


/* How many tokens the vocabulary gets after its base: ChatML's two and
 * the control_tokens list's. */
static int
n_extra(const nalar_mkmodel_opts *o)
{
    int n = o->chatml ? 2 : 0;

    if (o->control_tokens != NULL && o->control_tokens[0] != '\0') {
        n++;
        for (const char *c = o->control_tokens; *c; c++) {
            n += *c == ',';
        }
    }
    return n;
}


/* Adds the control_tokens list; -1 for an empty or repeated name. */
static int
add_control_tokens(vocab *v, const char *list)
{
    char        name[64];
    const char *p = list, *e;
    size_t      n;

    if (list == NULL || *list == '\0') {
        return 0;
    }
    for ( ;; ) {
        e = strchr(p, ',');
        n = e ? (size_t) (e - p) : strlen(p);
        if (n == 0 || n >= sizeof(name)) {
            return -1;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (vocab_add(v, name, 0.0f, TT_CONTROL) != 1) {
            return -1;
        }
        if (e == NULL) {
            return 0;
        }
        p = e + 1;
    }
}


static int
write_vocab(gguf_writer *w, const nalar_mkmodel_opts *o, const char *path,
            nalar_err *err)
{
    vocab v;
    int   rc, n_base;

    memset(&v, 0, sizeof(v));
    v.scores = calloc((size_t) o->n_vocab, sizeof(float));
    v.types = calloc((size_t) o->n_vocab, sizeof(int32_t));
    if (v.scores == NULL || v.types == NULL
        || strset_init(&v.tok, o->n_vocab) != 0
        || strset_init(&v.merges, o->n_vocab) != 0)
    {
        rc = nalar_fail(err, "%s: out of memory for a %d-token vocabulary",
                        path, o->n_vocab);
        goto done;
    }

    /* the ChatML tokens come last: every other id is the same as without */
    n_base = o->n_vocab - n_extra(o);
    if (o->bpe) {
        rc = build_bpe(&v, n_base);
    } else {
        rc = build_spm(&v, n_base);
    }
    if (rc == 0 && o->chatml
        && (vocab_add(&v, "<|im_start|>", 0.0f, TT_CONTROL) != 1
            || vocab_add(&v, "<|im_end|>", 0.0f, TT_CONTROL) != 1))
    {
        rc = -1;
    }
    if (rc == 0 && add_control_tokens(&v, o->control_tokens) != 0) {
        rc = -1;
    }
    if (rc != 0) {
        rc = nalar_fail(err, "%s: could not build a %d-token %s vocabulary",
                        path, o->n_vocab, o->bpe ? "BPE" : "SPM");
        goto done;
    }

    if (o->bpe) {
        gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_w_str(w, "tokenizer.ggml.pre", o->pre ? o->pre : "gpt2");
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char **) v.tok.s,
                       (size_t) v.tok.n);
        gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.types,
                       (size_t) v.tok.n);
        gguf_w_arr_str(w, "tokenizer.ggml.merges",
                       (const char **) v.merges.s, (size_t) v.merges.n);
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t) n_base - 1);
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t) n_base - 1);
        for (int i = n_base; i < v.tok.n; i++) {
            /* a control </s> ends turns, as Mistral's files say with their
               eos id: here the end-of-turn id (EOS stays <|endoftext|>) */
            if (strcmp(v.tok.s[i], "</s>") == 0) {
                gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t) i);
            }
        }
        gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 0);
        gguf_w_bool(w, "tokenizer.ggml.add_eos_token", 0);
    } else {
        gguf_w_str(w, "tokenizer.ggml.model", "llama");
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char **) v.tok.s,
                       (size_t) v.tok.n);
        gguf_w_arr_f32(w, "tokenizer.ggml.scores", v.scores,
                       (size_t) v.tok.n);
        gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.types,
                       (size_t) v.tok.n);
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
        gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 1);
        gguf_w_bool(w, "tokenizer.ggml.add_eos_token", 0);
    }
    rc = 0;

done:
    strset_free(&v.tok);
    strset_free(&v.merges);
    free(v.scores);
    free(v.types);
    return rc;
}


/*
 * Copies tokenizer.* from another GGUF; sets *n_vocab from its tokens.
 * With skip_template its tokenizer.chat_template stays behind: the caller
 * writes its own (a key may appear only once).
 */
static int
copy_vocab(gguf_writer *w, const char *from, const char *path, int *n_vocab,
           int skip_template, nalar_err *err)
{
    static const char tmpl_key[] = "tokenizer.chat_template";

    gguf_file     *src;
    const gguf_kv *tok;
    nalar_err      e2;

    src = gguf_open(from, &e2);
    if (src == NULL) {
        return nalar_fail(err, "%s: vocab_from %s", path, e2.msg);
    }
    tok = gguf_find(src, "tokenizer.ggml.tokens");
    if (tok == NULL || tok->type != GGUF_T_ARRAY
        || tok->arr_type != GGUF_T_STRING || tok->arr_len == 0
        || tok->arr_len > MAX_VOCAB)
    {
        gguf_close(src);
        return nalar_fail(err, "%s: vocab_from %s has no usable "
                          "tokenizer.ggml.tokens array", path, from);
    }
    *n_vocab = (int) tok->arr_len;
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const gguf_kv *kv = &src->kv[i];

        if (skip_template && kv->key.len == sizeof(tmpl_key) - 1
            && memcmp(kv->key.ptr, tmpl_key, kv->key.len) == 0)
        {
            continue;
        }
        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0) {
            gguf_w_kv(w, kv);   /* copies the bytes: src may close */
        }
    }
    gguf_close(src);
    return 0;
}


static int
is_json(const char *path)
{
    size_t n = strlen(path);

    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}


/* ---------------------------------------------------------------- */
/* the model                                                         */


static int
check_opts(const nalar_mkmodel_opts *o, const char *path, nalar_err *err)
{
    if (o->dim <= 0 || o->dim > 65536 || o->n_layers <= 0
        || o->n_layers > 4096 || o->n_heads <= 0 || o->n_kv_heads <= 0
        || o->ffn_dim <= 0 || o->ffn_dim > 1 << 20 || o->n_ctx <= 0)
    {
        return nalar_fail(err, "%s: dim %d, layers %d, heads %d, kv heads %d, "
                          "ffn %d, ctx %d: all must be positive (dim <= "
                          "65536, ffn <= 2^20, layers <= 4096)", path,
                          o->dim, o->n_layers, o->n_heads, o->n_kv_heads,
                          o->ffn_dim, o->n_ctx);
    }
    if (o->dim % o->n_heads != 0 || (o->dim / o->n_heads) % 2 != 0) {
        return nalar_fail(err, "%s: dim %d must be n_heads %d times an even "
                          "head size (RoPE rotates pairs)", path, o->dim,
                          o->n_heads);
    }
    if (o->n_heads % o->n_kv_heads != 0) {
        return nalar_fail(err, "%s: n_kv_heads %d does not divide n_heads %d",
                          path, o->n_kv_heads, o->n_heads);
    }
    if (o->type != GGML_F32 && o->type != GGML_F16 && o->type != GGML_BF16
        && o->type != GGML_Q8_0 && o->type != GGML_Q4_0
        && o->type != GGML_Q4_K && o->type != GGML_Q5_K
        && o->type != GGML_Q6_K)
    {
        return nalar_fail(err, "%s: cannot write tensor type %d", path,
                          (int) o->type);
    }
    if (o->kmix && o->type != GGML_Q4_K && o->type != GGML_Q5_K) {
        return nalar_fail(err, "%s: a K-quant mix is Q4_K or Q5_K, not %s",
                          path, ggml_type_name(o->type));
    }
    if ((o->type == GGML_Q4_K || o->type == GGML_Q5_K
         || o->type == GGML_Q6_K)
        && (o->dim % QK_K != 0 || o->ffn_dim % QK_K != 0))
    {
        return nalar_fail(err, "%s: %s needs dim (%d) and ffn (%d) to be "
                          "multiples of %d", path, ggml_type_name(o->type),
                          o->dim, o->ffn_dim, QK_K);
    }
    if ((o->type == GGML_Q8_0 || o->type == GGML_Q4_0)
        && (o->dim % 32 != 0 || o->ffn_dim % 32 != 0))
    {
        return nalar_fail(err, "%s: %s needs dim (%d) and ffn (%d) to be "
                          "multiples of 32", path, ggml_type_name(o->type),
                          o->dim, o->ffn_dim);
    }
    if (o->vocab_from == NULL
        && (o->n_vocab < (o->bpe ? 257 : 260) + n_extra(o)
            || o->n_vocab > MAX_VOCAB))
    {
        return nalar_fail(err, "%s: n_vocab %d out of range (%d..%d for a "
                          "%s vocabulary)", path, o->n_vocab,
                          (o->bpe ? 257 : 260) + n_extra(o),
                          MAX_VOCAB, o->bpe ? "BPE" : "SPM");
    }
    if (o->vocab_from != NULL && n_extra(o) > 0) {
        return nalar_fail(err, "%s: chatml and control_tokens add tokens to "
                          "a vocabulary made here, not to one copied from "
                          "%s", path,
                          o->vocab_from);
    }
    if (!(o->rope_base > 0.0f)) {
        return nalar_fail(err, "%s: rope_base must be positive", path);
    }
    if (o->arch != NULL && strcmp(o->arch, "llama") != 0
        && strcmp(o->arch, "qwen2") != 0 && strcmp(o->arch, "qwen3") != 0
        && strcmp(o->arch, "gemma2") != 0 && strcmp(o->arch, "phi3") != 0)
    {
        return nalar_fail(err, "%s: unknown architecture '%s' (llama, qwen2, "
                          "qwen3, gemma2, phi3)", path, o->arch);
    }
    if (o->window < 0) {
        return nalar_fail(err, "%s: negative sliding window", path);
    }
    return 0;
}


static uint32_t
file_type(ggml_type t, int kmix)
{
    switch (t) {
    case GGML_Q4_K: return kmix ? FTYPE_Q4_K_M : FTYPE_Q4_K_S;
    case GGML_Q5_K: return kmix ? FTYPE_Q5_K_M : FTYPE_Q5_K_S;
    case GGML_Q6_K: return FTYPE_Q6_K;
    case GGML_F16:  return FTYPE_F16;
    case GGML_BF16: return FTYPE_BF16;
    case GGML_Q8_0: return FTYPE_Q8_0;
    case GGML_Q4_0: return FTYPE_Q4_0;
    default:        return FTYPE_F32;
    }
}


/* The architecture's hyperparameters (keys "ARCH.*"). */
static void
add_hparams(gguf_writer *w, const nalar_mkmodel_opts *o, const char *a,
            int n_vocab)
{
    int  hd = o->dim / o->n_heads;
    int  qwen3 = strcmp(a, "qwen3") == 0, gemma2 = strcmp(a, "gemma2") == 0;
    int  phi3 = strcmp(a, "phi3") == 0;
    char key[128];

#define KEY(k) (snprintf(key, sizeof(key), "%s." k, a), key)
    gguf_w_u32(w, KEY("vocab_size"), (uint32_t) n_vocab);
    gguf_w_u32(w, KEY("context_length"), (uint32_t) o->n_ctx);
    gguf_w_u32(w, KEY("embedding_length"), (uint32_t) o->dim);
    gguf_w_u32(w, KEY("block_count"), (uint32_t) o->n_layers);
    gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t) o->ffn_dim);
    gguf_w_u32(w, KEY("attention.head_count"), (uint32_t) o->n_heads);
    gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t) o->n_kv_heads);
    gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t) hd);
    gguf_w_f32(w, KEY("rope.freq_base"), o->rope_base);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (qwen3 || gemma2) {
        gguf_w_u32(w, KEY("attention.key_length"), (uint32_t) hd);
        gguf_w_u32(w, KEY("attention.value_length"), (uint32_t) hd);
    }
    if (gemma2) {
        gguf_w_f32(w, KEY("attn_logit_softcapping"), 50.0f);
        gguf_w_f32(w, KEY("final_logit_softcapping"), 30.0f);
    }
    if (gemma2 || (phi3 && o->window > 0)) {
        gguf_w_u32(w, KEY("attention.sliding_window"),
                   (uint32_t) (o->window > 0 ? o->window : 4096));
    }
#undef KEY
}


/* Layer l's tensors, drawn from rng in a fixed order (same seed, same
 * floats, whatever the type); tmp and conv hold the largest matrix. */
static void
add_layer(gguf_writer *w, const nalar_mkmodel_opts *o, const char *a, int l,
          uint64_t *rng, float *tmp, void *conv)
{
    int       hd = o->dim / o->n_heads, kv_dim = o->n_kv_heads * hd;
    int       qwen2 = strcmp(a, "qwen2") == 0, qwen3 = strcmp(a, "qwen3") == 0;
    int       gemma2 = strcmp(a, "gemma2") == 0, phi3 = strcmp(a, "phi3") == 0;
    char      name[96];
    /* llama.cpp's use_more_bits(l, n_layers), for a K-quant mix */
    int       more = l < o->n_layers / 8 || l >= 7 * o->n_layers / 8
                     || (l - o->n_layers / 8) % 3 == 2;
    ggml_type tv = o->kmix && more ? GGML_Q6_K : o->type;

#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, l), name)
    add_norm(w, BLK("attn_norm.weight"), o->dim, tmp);
    if (phi3) {
        /* [q; k; v] and [gate; up] as llama.cpp's phi3 reads them */
        add_matrix(w, BLK("attn_qkv.weight"), o->dim + 2 * kv_dim,
                   o->dim, o->type, rng, tmp, conv);
        add_matrix(w, BLK("attn_output.weight"), o->dim, o->dim, o->type,
                   rng, tmp, conv);
        add_norm(w, BLK("ffn_norm.weight"), o->dim, tmp);
        add_matrix(w, BLK("ffn_down.weight"), o->dim, o->ffn_dim,
                   tv, rng, tmp, conv);
        add_matrix(w, BLK("ffn_up.weight"), 2 * o->ffn_dim, o->dim,
                   o->type, rng, tmp, conv);
        return;
    }
    add_matrix(w, BLK("attn_q.weight"), o->dim, o->dim, o->type, rng,
               tmp, conv);
    add_matrix(w, BLK("attn_k.weight"), kv_dim, o->dim, o->type, rng,
               tmp, conv);
    add_matrix(w, BLK("attn_v.weight"), kv_dim, o->dim, tv, rng, tmp,
               conv);
    add_matrix(w, BLK("attn_output.weight"), o->dim, o->dim, o->type,
               rng, tmp, conv);
    add_norm(w, BLK("ffn_norm.weight"), o->dim, tmp);
    add_matrix(w, BLK("ffn_gate.weight"), o->ffn_dim, o->dim, o->type,
               rng, tmp, conv);
    add_matrix(w, BLK("ffn_down.weight"), o->dim, o->ffn_dim, tv, rng,
               tmp, conv);
    add_matrix(w, BLK("ffn_up.weight"), o->ffn_dim, o->dim, o->type,
               rng, tmp, conv);
    if (qwen2) {
        add_bias(w, BLK("attn_q.bias"), o->dim, rng, tmp);
        add_bias(w, BLK("attn_k.bias"), kv_dim, rng, tmp);
        add_bias(w, BLK("attn_v.bias"), kv_dim, rng, tmp);
    }
    if (qwen3) {
        add_norm(w, BLK("attn_q_norm.weight"), hd, tmp);
        add_norm(w, BLK("attn_k_norm.weight"), hd, tmp);
    }
    if (gemma2) {
        add_norm(w, BLK("post_attention_norm.weight"), o->dim, tmp);
        add_norm(w, BLK("post_ffw_norm.weight"), o->dim, tmp);
    }
#undef BLK
}


int
nalar_mkmodel(const nalar_mkmodel_opts *o, const char *path, nalar_err *err)
{
    gguf_writer *w;
    int          n_vocab = o->n_vocab, hd, kv_dim, rc = -1;
    size_t       biggest;
    float       *tmp = NULL;
    void        *conv = NULL;
    uint64_t     rng = o->seed;
    char         name[96];
    const char  *a = o->arch != NULL ? o->arch : "llama";
    int          qwen2 = strcmp(a, "qwen2") == 0;
    int          qwen3 = strcmp(a, "qwen3") == 0;
    int          gemma2 = strcmp(a, "gemma2") == 0;

    if (check_opts(o, path, err) != 0) {
        return -1;
    }
    hd = o->dim / o->n_heads;
    kv_dim = o->n_kv_heads * hd;

    w = gguf_writer_create();
    if (w == NULL) {
        return nalar_fail(err, "%s: out of memory", path);
    }
    snprintf(name, sizeof(name), "nalar-random-%s%s-d%d-l%d",
             ggml_type_name(o->type), o->kmix ? "_M" : "", o->dim,
             o->n_layers);
    gguf_w_str(w, "general.architecture", a);
    gguf_w_str(w, "general.name", name);
    gguf_w_u32(w, "general.alignment", 32);
    gguf_w_u32(w, "general.file_type", file_type(o->type, o->kmix));

    /* the vocabulary first: vocab_from decides n_vocab */
    if (o->vocab_from != NULL && is_json(o->vocab_from)) {
        /* Hugging Face's tokenizer.json (+ tokenizer_config.json) */
        if (nalar_vocab_hf_write(w, o->vocab_from, o->chat_template != NULL,
                                 &n_vocab, err) != 0)
        {
            goto done;
        }
    } else if (o->vocab_from != NULL) {
        if (copy_vocab(w, o->vocab_from, path, &n_vocab,
                       o->chat_template != NULL, err) != 0)
        {
            goto done;
        }
    } else if (write_vocab(w, o, path, err) != 0) {
        goto done;
    }
    if (o->chat_template != NULL) {
        /* Jinja text, read by servers to pick the prompt layout */
        gguf_w_str(w, "tokenizer.chat_template", o->chat_template);
    }

    add_hparams(w, o, a, n_vocab);

    /* one scratch pair big enough for the largest matrix */
    biggest = (size_t) n_vocab * (size_t) o->dim;
    if ((size_t) 2 * o->ffn_dim * (size_t) o->dim > biggest) {
        biggest = (size_t) 2 * o->ffn_dim * (size_t) o->dim;
    }
    if ((size_t) (o->dim + 2 * kv_dim) * (size_t) o->dim > biggest) {
        biggest = (size_t) (o->dim + 2 * kv_dim) * (size_t) o->dim;
    }
    tmp = malloc(biggest * sizeof(float));
    conv = malloc(biggest * sizeof(float));
    if (tmp == NULL || conv == NULL) {
        rc = nalar_fail(err, "%s: out of memory for a %zu-element matrix",
                        path, biggest);
        goto done;
    }

    /* draw order is fixed (and type-independent): same seed, same floats */
    /* a K-quant mix keeps the output head in Q6_K: the tied ones' is
     * token_embd */
    add_matrix(w, "token_embd.weight", n_vocab, o->dim,
               o->kmix && (qwen2 || qwen3 || gemma2) ? GGML_Q6_K : o->type,
               &rng, tmp, conv);
    for (int l = 0; l < o->n_layers; l++) {
        add_layer(w, o, a, l, &rng, tmp, conv);
    }
    add_norm(w, "output_norm.weight", o->dim, tmp);
    if (!qwen2 && !qwen3 && !gemma2) {
        /* the others tie the output head to token_embd */
        add_matrix(w, "output.weight", n_vocab, o->dim,
                   o->kmix ? GGML_Q6_K : o->type, &rng, tmp, conv);
    }

    rc = gguf_writer_save(w, path, err);

done:
    free(tmp);
    free(conv);
    gguf_writer_destroy(w);
    return rc;
}
