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

#include "tokenizer_internal.h"

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
    { "falcon", PRE_FALCON }, { "deepseek-v3", PRE_DEEPSEEK_V3 },
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

int32_t
ntok_lookup(const nalar_tokenizer *t, const char *s, size_t len)
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
int32_t
ntok_merge_rank(const nalar_tokenizer *t, const char *l, size_t nl,
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
        if (ntok_merge_rank(t, s->ptr, m->n_left, sp + 1, m->n_right) >= 0)
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

/* The ends of turn llama.cpp's llama-vocab.cpp names (its EOG list and its
 * EOT detection): a control token with one of these texts ends
 * generation.  "</s>" is not among them: it is EOS in SentencePiece vocabs
 * by their metadata, and an ordinary HTML tag in Gemma 3's. */
static int
is_eog_name(const char *s, uint32_t n)
{
    static const char *names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
        "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "<|end_of_text|>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
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

/* tokenizer.ggml.model: "llama" (SPM) or "gpt2" (byte-level BPE) */
static int
load_kind(nalar_tokenizer *t, const gguf_file *f, nalar_err *err)
{
    char *model = gguf_get_str(f, "tokenizer.ggml.model");
    int rc = 0;

    if (model == NULL)
        return nalar_fail(err, "%s: no tokenizer.ggml.model", f->path);
    if (strcmp(model, "llama") == 0) t->kind = TOK_SPM;
    else if (strcmp(model, "gpt2") == 0) t->kind = TOK_BPE;
    else
        rc = nalar_fail(err, "%s: tokenizer.ggml.model '%s' is not supported "
                        "(only 'llama' and 'gpt2')", f->path, model);
    free(model);
    return rc;
}

/* The pieces, back to back in t->text, and the hash from piece to id. */
static int
load_pieces(nalar_tokenizer *t, const gguf_file *f, const gguf_kv *toks,
            nalar_err *err)
{
    uint64_t total = 0;
    uint32_t off = 0;

    if (toks->arr_len > INT32_MAX / 4)
        return nalar_fail(err, "%s: %llu tokens is too many", f->path,
                          (unsigned long long) toks->arr_len);
    t->n_vocab = (int32_t) toks->arr_len;
    for (int32_t i = 0; i < t->n_vocab; i++) total += toks->arr_strs[i].len + 1;
    if (total > UINT32_MAX)
        return nalar_fail(err, "%s: vocabulary text too large", f->path);
    t->text = malloc(total);
    t->text_off = malloc(((size_t) t->n_vocab + 1) * sizeof(uint32_t));
    t->score = calloc(t->n_vocab, sizeof(float));
    t->type = malloc(t->n_vocab);
    t->eog = calloc(t->n_vocab, 1);
    t->vhash_mask = table_size(t->n_vocab) - 1;
    t->vhash = malloc(((size_t) t->vhash_mask + 1) * sizeof(int32_t));
    t->special = malloc((size_t) t->n_vocab * sizeof(int32_t));
    if (!t->text || !t->text_off || !t->score || !t->type || !t->eog ||
        !t->vhash || !t->special)
        return nalar_fail(err, "%s: out of memory for the vocabulary", f->path);
    memset(t->vhash, 0xFF, ((size_t) t->vhash_mask + 1) * sizeof(int32_t));

    for (int32_t i = 0; i < t->n_vocab; i++) {
        const gguf_str *s = &toks->arr_strs[i];
        t->text_off[i] = off;
        memcpy(t->text + off, s->ptr, s->len);
        t->text[off + s->len] = '\0';
        off += (uint32_t) s->len + 1;
        if (s->len > t->max_piece) t->max_piece = (uint32_t) s->len;
    }
    t->text_off[t->n_vocab] = off;
    /* string -> id; a repeated string maps to its last id (llama.cpp) */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint32_t n, h;
        const char *p = piece_of(t, i, &n);
        int32_t old = ntok_lookup(t, p, n);
        h = (uint32_t) hash_bytes(HASH_INIT, p, n) & t->vhash_mask;
        if (old >= 0) {
            while (t->vhash[h] != old) h = (h + 1) & t->vhash_mask;
        } else {
            while (t->vhash[h] >= 0) h = (h + 1) & t->vhash_mask;
        }
        t->vhash[h] = i;
    }
    return 0;
}

/* tokenizer.ggml.scores and tokenizer.ggml.token_type, when present */
static int
load_scores_types(nalar_tokenizer *t, const gguf_file *f, nalar_err *err)
{
    const gguf_kv *scores = gguf_find(f, "tokenizer.ggml.scores");
    const gguf_kv *types = gguf_find(f, "tokenizer.ggml.token_type");

    if (scores != NULL) {
        if (scores->type != GGUF_T_ARRAY || scores->arr_type != GGUF_T_FLOAT32 ||
            scores->arr_len != (uint64_t) t->n_vocab)
            return nalar_fail(err, "%s: tokenizer.ggml.scores must be %d "
                              "float32s", f->path, t->n_vocab);
        memcpy(t->score, scores->arr_data, (size_t) t->n_vocab * sizeof(float));
    }
    if (types == NULL) {
        memset(t->type, TOKT_NORMAL, t->n_vocab);
        return 0;
    }
    if (types->type != GGUF_T_ARRAY ||
        (types->arr_type != GGUF_T_INT32 && types->arr_type != GGUF_T_UINT32) ||
        types->arr_len != (uint64_t) t->n_vocab)
        return nalar_fail(err, "%s: tokenizer.ggml.token_type must be %d "
                          "int32s", f->path, t->n_vocab);
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int32_t v;
        memcpy(&v, (const char *) types->arr_data + 4 * (size_t) i, 4);
        t->type[i] = (v >= TOKT_NORMAL && v <= TOKT_BYTE) ? (uint8_t) v : 0;
    }
    return 0;
}

/* SPM: the dummy prefix and the byte tokens */
static void
setup_spm(nalar_tokenizer *t, const gguf_file *f)
{
    static const char hex[] = "0123456789ABCDEF";

    t->add_space_prefix = kv_bool(f, "tokenizer.ggml.add_space_prefix", 1);
    t->add_bos = kv_bool(f, "tokenizer.ggml.add_bos_token", 1);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        buf[0] = '<'; buf[1] = '0'; buf[2] = 'x';
        buf[3] = hex[b >> 4]; buf[4] = hex[b & 15]; buf[5] = '>';
        t->byte_tok[b] = ntok_lookup(t, buf, 6);
        if (t->byte_tok[b] < 0) {
            /* as llama.cpp: fall back to the byte as a piece */
            buf[0] = (char) b;
            t->byte_tok[b] = ntok_lookup(t, buf, 1);
        }
    }
}

/* BPE: the pre-tokenizer, the byte map and the merges */
static int
setup_bpe(nalar_tokenizer *t, const gguf_file *f, nalar_err *err)
{
    char *pre = gguf_get_str(f, "tokenizer.ggml.pre");
    size_t n_names = sizeof(pre_names) / sizeof(pre_names[0]);

    t->pre = pre == NULL ? PRE_GPT2 : -1;
    for (size_t i = 0; pre != NULL && t->pre < 0 && i < n_names; i++)
        if (strcmp(pre, pre_names[i].name) == 0) t->pre = pre_names[i].pre;
    if (t->pre < 0) {
        char list[512];
        size_t k = 0;
        for (size_t i = 0; i < n_names && k < sizeof(list); i++)
            k += (size_t) snprintf(list + k, sizeof(list) - k, "%s%s",
                                   i ? ", " : "", pre_names[i].name);
        nalar_fail(err, "%s: tokenizer.ggml.pre '%s' is not supported "
                   "(supported: %s)", f->path, pre, list);
        free(pre);
        return -1;
    }
    free(pre);
    t->ignore_merges = t->pre == PRE_LLAMA3 || t->pre == PRE_TEKKEN;
    /* Qwen2's tokenizer.json normalizes to NFC (so do the DeepSeek R1
       distills of Qwen, which share it) */
    t->nfc = t->pre == PRE_QWEN2;
    t->add_space_prefix = kv_bool(f, "tokenizer.ggml.add_space_prefix", 0);
    t->add_bos = kv_bool(f, "tokenizer.ggml.add_bos_token",
                         t->pre == PRE_LLAMA3 || t->pre == PRE_TEKKEN);
    init_byte_map(t);
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    return load_merges(t, f, err);
}

/*
 * The tokens split out of text before the tokenizer proper, and the ones
 * that end generation: the eos, eot and eom ids of the metadata, and the
 * control tokens llama.cpp names as ends of turn (is_eog_name).  A normal
 * or user-defined token never ends generation, whatever its text: a
 * generated Gemma 3 "</s>" is an HTML tag.
 */
static void
mark_specials(nalar_tokenizer *t)
{
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
        if (ty == TOKT_CONTROL && is_eog_name(p, n))
            t->eog[i] = 1;
    }
    qsort_r(t->special, t->n_special, sizeof(int32_t), cmp_special, t);
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
}

nalar_tokenizer *
nalar_tokenizer_create(const gguf_file *f, nalar_err *err)
{
    nalar_tokenizer *t;
    const gguf_kv *toks;
    int spm;

    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        nalar_fail(err, "%s: out of memory for tokenizer", f->path);
        return NULL;
    }
    if (load_kind(t, f, err) < 0) goto fail;
    spm = t->kind == TOK_SPM;

    toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (toks == NULL || toks->type != GGUF_T_ARRAY ||
        toks->arr_type != GGUF_T_STRING || toks->arr_len == 0) {
        nalar_fail(err, "%s: tokenizer.ggml.tokens missing or not a string "
                   "array", f->path);
        goto fail;
    }
    if (load_pieces(t, f, toks, err) < 0 || load_scores_types(t, f, err) < 0)
        goto fail;

    /* special ids; SPM files without the keys use llama.cpp's defaults */
    t->bos = kv_id(t, f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1);
    t->eos = kv_id(t, f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1);
    t->unk = kv_id(t, f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
    t->eot = kv_id(t, f, "tokenizer.ggml.eot_token_id", -1);
    t->eom = kv_id(t, f, "tokenizer.ggml.eom_token_id", -1);

    if (spm) setup_spm(t, f);
    else if (setup_bpe(t, f, err) < 0) goto fail;
    mark_specials(t);
    return t;

fail:
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
    return ntok_lookup(t, s, len);
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

/*
 * Where control tokens may be recognised: everywhere (all = 1), nowhere
 * (all = 0, n = 0), or inside the pieces marked special: piece k covers
 * text[off[k], off[k + 1]).
 */
typedef struct {
    int                   all;
    const nalar_tok_text *pc;
    const size_t         *off;   /* (n + 1) */
    size_t                n;
} special_zone;

/*
 * The first place in text[from, end) where special token `id` (its text
 * sp[0..sl)) may stand, or NULL.  User-defined tokens may stand anywhere
 * (as Hugging Face splits every added token out of any text); control and
 * unknown tokens only where all of their text lies in special pieces, so
 * that no user text is part of one: they are searched for in the runs of
 * consecutive special pieces only, which keeps a long user message from
 * being scanned once per control token.
 */
static const char *
find_allowed(const nalar_tokenizer *t, const special_zone *z, int32_t id,
             const char *text, const char *sp, size_t sl, size_t from,
             size_t end)
{
    size_t lo = 0, hi = z->n, k;

    if (t->type[id] == TOKT_USER_DEFINED || z->all)
        return memmem(text + from, end - from, sp, sl);
    if (z->n == 0) return NULL;
    /* the piece holding `from`: the last k with off[k] <= from */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (z->off[mid] <= from) lo = mid;
        else hi = mid;
    }
    for (k = lo; k < z->n && z->off[k] < end; ) {
        size_t ra, rb;
        const char *p;

        if (!z->pc[k].special) {
            k++;
            continue;
        }
        /* a run of special pieces [k, j) */
        ra = z->off[k];
        while (k < z->n && (z->pc[k].special || z->off[k + 1] == z->off[k]))
            k++;
        rb = z->off[k];
        ra = ra > from ? ra : from;
        rb = rb < end ? rb : end;
        if (rb > ra && rb - ra >= sl
            && (p = memmem(text + ra, rb - ra, sp, sl)) != NULL)
            return p;
    }
    return NULL;
}

/* Splits the raw fragments at every occurrence of each special token that
 * may stand there, longest tokens first (llama.cpp's
 * tokenizer_st_partition). */
static int
partition(const nalar_tokenizer *t, const char *text, const special_zone *z,
          fragvec *cur)
{
    fragvec nxt = { 0 };
    int rc = 0;

    for (int32_t s = 0; s < t->n_special && rc == 0; s++) {
        int32_t id = t->special[s];
        uint32_t sl;
        const char *sp = piece_of(t, id, &sl);
        int found = 0;

        if (t->type[id] != TOKT_USER_DEFINED && !z->all && z->n == 0)
            continue;
        for (size_t i = 0; i < cur->n && !found; i++)
            found = cur->v[i].id < 0
                    && find_allowed(t, z, id, text, sp, sl, cur->v[i].off,
                                    cur->v[i].off + cur->v[i].len) != NULL;
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
            while (rc == 0
                   && (p = find_allowed(t, z, id, text, sp, sl, pos, end))
                      != NULL) {
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
    m.cap = (t->kind == TOK_SPM ? len : 3 * len) + 2;
    m.sym = malloc(m.cap * sizeof(symbol));
    if (m.sym == NULL) goto done;

    for (size_t i = 0; i < fv->n && !full(ids); i++) {
        const fragment *fr = &fv->v[i];
        if (fr->id >= 0) {
            push_id(ids, fr->id);
            prev_special = 1;
            continue;
        }
        if (t->kind == TOK_SPM) {
            if (ntok_spm_fragment(t, &m, text + fr->off, fr->len,
                             t->add_space_prefix && prev_special, ids) < 0)
                goto done;
        } else {
            if (ntok_bpe_fragment(t, &m, text + fr->off, fr->len, ids) < 0)
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
    special_zone zone = { 0 };
    int rc = -1;

    if (t == NULL || (text == NULL && len > 0) || len > INT_MAX / 8) return -1;

    ids.lim = (size_t) INT_MAX + 1;
    if (len > 0 && push_frag(&fv, 0, len, -1) < 0) goto done;
    zone.all = parse_special;
    if (len > 0 && partition(t, text, &zone, &fv) < 0) goto done;
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
    fragvec fv = { 0 };
    idvec ids = { 0 };
    special_zone zone = { 0 };
    size_t total = 0, limit, used, off, *offs = NULL;
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
    if (t->nfc) {
        /* NFC composes at most three characters' bytes into one's
           (Hangul L V T, 9 bytes to 3) */
        limit *= 3;
    }
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

    /* the whole text is split at the special tokens that may stand where
       they are (control tokens only inside special pieces); the literal
       text between them is encoded as a whole, however it was cut into
       pieces */
    offs = malloc((n + 1) * sizeof(size_t));
    if (offs == NULL) goto done;
    off = 0;
    for (size_t i = 0; i < n; i++) {
        offs[i] = off < used ? off : used;
        off += pc[i].len;
    }
    offs[n] = used;
    zone.pc = pc;
    zone.off = offs;
    zone.n = n;
    if (used > 0 && (push_frag(&fv, 0, used, -1) < 0
                     || partition(t, text, &zone, &fv) < 0))
        goto done;

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
    free(offs);
    free(buf);
    return rc;
}
