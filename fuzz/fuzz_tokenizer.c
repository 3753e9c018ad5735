/*
 * libFuzzer target for the tokenizers' encode/decode round trip
 * (src/tokenizer.c).  Byte 0 picks the vocabulary (bit 0: the demo
 * model's SentencePiece vocabulary, models/nalar-kjv-target-f32.gguf, or
 * GPT-2's byte-level BPE, t/data/vocab/ggml-vocab-gpt-2.gguf), bit 1
 * whether control tokens written in the text are parsed, and for BPE
 * bits 2-5 the pre-tokenizer (GPT-2's vocabulary with another
 * tokenizer.ggml.pre); the rest is the text.  Every id must be in the vocabulary, add_bos must only prepend
 * BOS, and decoding (whole, and token by token through the streaming
 * decoder) must give valid UTF-8.  Without control-token parsing the round
 * trip is what the tokenizers promise for valid UTF-8 text:
 *   - SentencePiece (dummy prefix, byte fallback for every byte): the text
 *     itself, except that U+2581 "▁", which stands for a space inside
 *     pieces, comes back as a space;
 *   - byte-level BPE: the text itself (its NFC with the qwen2
 *     pre-tokenizer, which normalizes).
 * And the text cut in two pieces (nalar_tokenize_bounded), both user text
 * or both markup, gives the ids of the whole.
 * Invalid UTF-8 only has to decode to valid UTF-8 (the server takes text
 * from JSON strings, which are valid).
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=tokenizer
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <utf8proc.h>

#include "gguf.h"
#include "tokenizer.h"

#define SPM_VOCAB "models/nalar-kjv-target-f32.gguf"
#define BPE_VOCAB "t/data/vocab/ggml-vocab-gpt-2.gguf"

static const char *pres[] = {
    "gpt-2", "llama-bpe", "qwen2", "tekken", "smollm", "starcoder",
    "deepseek-llm", "deepseek-coder", "falcon", "deepseek-v3"
};
#define QWEN2 2     /* pres[QWEN2]: text normalized to NFC */
#define N_PRE (sizeof(pres) / sizeof(pres[0]))

static nalar_tokenizer *spm, *bpe[N_PRE];


static void
die(const char *what)
{
    fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    abort();
}


static nalar_tokenizer *
load(const char *path)
{
    nalar_err        err;
    gguf_file       *f = gguf_open(path, &err);
    nalar_tokenizer *t;

    if (f == NULL) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository "
                "root)\n", err.msg);
        abort();
    }
    t = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    if (t == NULL) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    return t;
}


/* GPT-2's vocabulary with tokenizer.ggml.pre set to `pre` */
static nalar_tokenizer *
load_pre(const char *pre)
{
    static const char key[] = "tokenizer.ggml.pre";
    char             path[] = "/tmp/fuzz_tokenizer_XXXXXX";
    nalar_err        err;
    gguf_file       *f = gguf_open(BPE_VOCAB, &err);
    gguf_writer     *w = gguf_writer_create();
    int              fd = mkstemp(path);

    if (f == NULL || w == NULL || fd < 0) {
        die("cannot copy the BPE vocabulary");
    }
    close(fd);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (!(f->kv[i].key.len == sizeof(key) - 1
              && memcmp(f->kv[i].key.ptr, key, sizeof(key) - 1) == 0))
        {
            gguf_w_kv(w, &f->kv[i]);
        }
    }
    gguf_w_str(w, key, pre);
    gguf_close(f);
    if (gguf_writer_save(w, path, &err) != 0) {
        die(err.msg);
    }
    gguf_writer_destroy(w);
    {
        nalar_tokenizer *t = load(path);

        unlink(path);
        return t;
    }
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char name[8];

    spm = load(SPM_VOCAB);
    for (size_t i = 0; i < N_PRE; i++) {
        bpe[i] = load_pre(pres[i]);
        if (nalar_tok_kind_of(bpe[i]) != TOK_BPE) {
            die("unexpected tokenizer kinds");
        }
    }
    /* the SPM promise rests on these */
    if (nalar_tok_kind_of(spm) != TOK_SPM || !nalar_tok_add_space_prefix(spm))
    {
        die("unexpected tokenizer kinds");
    }
    for (int b = 0; b < 256; b++) {
        snprintf(name, sizeof(name), "<0x%02X>", b);
        if (nalar_tok_lookup(spm, name, 6) < 0) {
            die("the SPM vocabulary lacks a byte token");
        }
    }
    return 0;
}


/* length of the valid UTF-8 sequence at s (RFC 3629), 0 if none */
static size_t
utf8_at(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    size_t  len;
    uint8_t lo = 0x80, hi = 0xBF;

    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    else return 0;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (len > n || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++) {
        if (s[k] < 0x80 || s[k] > 0xBF) return 0;
    }
    return len;
}


static int
utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k) {
        if ((k = utf8_at(s + i, n - i)) == 0) return 0;
    }
    return 1;
}


/* decode through the streaming decoder; malloc'd, length in *len */
static char *
decode(const nalar_tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    nalar_detok d;
    size_t      cap = 64, at = 0;
    char       *s = malloc(cap);
    int         k;

    nalar_detok_init(&d, t);
    d.strip_space = nalar_tok_kind_of(t) == TOK_SPM
                    && nalar_tok_add_space_prefix(t);
    for (int i = 0; i <= n && s != NULL; i++) {
        char   piece[4096];   /* longer than any vocabulary piece */
        size_t need = (i < n ? 3 * (size_t) nalar_token_bytes(t, ids[i],
                                                              piece,
                                                              sizeof(piece))
                             : 0) + 64;

        while (at + need > cap) {
            char *r = realloc(s, cap *= 2);

            if (r == NULL) {
                free(s);
                return NULL;
            }
            s = r;
        }
        k = i < n ? nalar_detok_feed(&d, ids[i], s + at, (int) (cap - at))
                  : nalar_detok_flush(&d, s + at, (int) (cap - at));
        if (k < 0) {
            die("the streaming decoder refused room it was given");
        }
        at += (size_t) k;
    }
    *len = at;
    return s;
}


/* the text as two pieces of user text (or of template markup, with
 * special), cut at a character in the middle, gives the ids of the whole */
static void
check_pieces(const nalar_tokenizer *t, const char *text, size_t n,
             int special, const int32_t *ids, int cnt)
{
    size_t         cut = n / 2;
    nalar_tok_text pc[2];
    int32_t       *got = NULL;
    int            k, more = 0;

    while (cut > 0 && cut < n && ((uint8_t) text[cut] & 0xC0) == 0x80) {
        cut--;
    }
    pc[0] = (nalar_tok_text) { text, cut, special };
    pc[1] = (nalar_tok_text) { text + cut, n - cut, special };
    k = nalar_tokenize_bounded(t, pc, 2, 0, (int) (3 * n + 2), &got, &more);
    if (k != cnt || more
        || (k > 0 && memcmp(got, ids, (size_t) k * sizeof(int32_t)) != 0))
    {
        die("two pieces did not give the ids of the whole");
    }
    free(got);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const nalar_tokenizer *t;
    const char            *text = (const char *) data + 1;
    size_t                 n = size - 1, dlen, at = 0;
    int32_t               *ids, *ids_bos;
    int                    special, cnt, cnt_bos;
    char                  *dec, *whole;

    if (size == 0) {
        return 0;
    }
    t = data[0] & 1 ? bpe[(data[0] >> 2) % N_PRE] : spm;
    special = (data[0] & 2) != 0;
    /* at most 3 tokens a byte: BPE reads an invalid byte as U+FFFD */
    ids = malloc((3 * n + 2) * sizeof(int32_t));
    ids_bos = malloc((3 * n + 3) * sizeof(int32_t));
    if (ids == NULL || ids_bos == NULL) {
        die("out of memory");
    }
    cnt = nalar_tokenize(t, text, n, 0, special, ids, (int) (3 * n + 2));
    cnt_bos = nalar_tokenize(t, text, n, 1, special, ids_bos,
                             (int) (3 * n + 3));
    if (cnt < 0 || cnt > (int) (3 * n + 2) || (n > 0 && cnt == 0 && !special))
    {
        die("token count out of range");
    }
    if (nalar_tok_bos(t) >= 0 && nalar_tok_add_bos(t)
        && (cnt_bos != cnt + 1 || ids_bos[0] != nalar_tok_bos(t)
            || memcmp(ids_bos + 1, ids, (size_t) cnt * sizeof(int32_t)) != 0))
    {
        die("add_bos did more than prepend BOS");
    }
    for (int i = 0; i < cnt; i++) {
        if (ids[i] < 0 || ids[i] >= nalar_tok_n_vocab(t)) {
            die("id outside the vocabulary");
        }
    }
    dec = decode(t, ids, cnt, &dlen);
    if (dec == NULL) {
        die("decode failed");
    }
    if (!utf8_valid((const uint8_t *) dec, dlen)) {
        die("decoded text is not valid UTF-8");
    }
    if (memchr(dec, '\0', dlen) == NULL) {
        whole = nalar_detokenize(t, ids, cnt);
        if (whole == NULL || strlen(whole) != dlen
            || memcmp(whole, dec, dlen) != 0)
        {
            die("nalar_detokenize differs from the streaming decoder");
        }
        free(whole);
    }
    check_pieces(t, text, n, special, ids, cnt);
    if (!special && t == bpe[QWEN2] && utf8_valid(data + 1, n)) {
        /* the round trip gives the text's NFC */
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t  k = utf8proc_map(data + 1, (utf8proc_ssize_t) n,
                                           &nfc, UTF8PROC_STABLE
                                                 | UTF8PROC_COMPOSE);
        if (k < 0 || (size_t) k != dlen || memcmp(nfc, dec, dlen) != 0) {
            die("qwen2 round trip is not the text's NFC");
        }
        free(nfc);
    } else if (!special && utf8_valid(data + 1, n)) {
        /* the promised round trip */
        for (size_t i = 0; i < n; ) {
            size_t k = utf8_at(data + 1 + i, n - i);

            if (t == spm && k == 3 && memcmp(text + i, "\xE2\x96\x81", 3) == 0)
            {
                if (at >= dlen || dec[at] != ' ') {
                    die("SPM round trip: U+2581 did not come back as a "
                        "space");
                }
                at++;
            } else {
                if (at + k > dlen || memcmp(dec + at, text + i, k) != 0) {
                    die("round trip lost or changed text");
                }
                at += k;
            }
            i += k;
        }
        if (at != dlen) {
            die("round trip added text");
        }
    }
    free(dec);
    free(ids);
    free(ids_bos);
    return 0;
}
