/*
 * Tokenizing a rendered prompt given as pieces (template markup special,
 * user text not): the ids are those of the whole text, except that a
 * control token is recognised only inside special pieces; which tokens end
 * generation; NFC for qwen2 vocabularies; the deepseek-v3 pre-tokenizer;
 * a vocabulary converted from a small tokenizer.json.
 * A byte-level BPE vocabulary is written here: the 256 byte characters,
 * a few merges and the special tokens below.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tap.h"
#include "gguf.h"
#include "tokenizer.h"
#include "vocab_hf.h"

enum {
    NL2 = 256, NL3, HE, HEL, HELL, HELLO,      /* merged tokens */
    IM_START, IM_END,                           /* control */
    HTML_END_S, THINK,                          /* user-defined */
    END_OF_TURN,                                /* user-defined in the
                                                   file, an end of turn */
    CUSTOM_STOP, OTHER_CTL,                     /* control */
    N_TOKENS
};

/* GPT-2's bytes_to_unicode, as UTF-8 */
static void
byte_char(int b, char *out)
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC)
                    || (b >= 0xAE && b <= 0xFF);
    int cp = b, next = 256;

    if (!printable) {
        for (int i = 0; i < b; i++) {
            if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC)
                  || (i >= 0xAE && i <= 0xFF)))
                next++;
        }
        cp = next;
    }
    if (cp < 0x80) {
        out[0] = (char) cp;
        out[1] = '\0';
    } else {
        out[0] = (char) (0xC0 | (cp >> 6));
        out[1] = (char) (0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

static nalar_tokenizer *
make_vocab(const char *pre)
{
    static char bytes[256][4];
    const char *toks[N_TOKENS];
    int32_t types[N_TOKENS];
    const char *merges[] = {
        "\xc4\x8a \xc4\x8a", "\xc4\x8a\xc4\x8a \xc4\x8a", "h e", "he l",
        "hel l", "hell o"
    };
    char path[] = "/tmp/nalar_tokp_XXXXXX";
    gguf_writer *w = gguf_writer_create();
    nalar_err err = { { 0 } };
    nalar_tokenizer *t = NULL;
    gguf_file *f;
    int fd = mkstemp(path);

    if (fd < 0 || w == NULL) return NULL;
    close(fd);
    for (int b = 0; b < 256; b++) {
        byte_char(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = TOKT_NORMAL;
    }
    toks[NL2] = "\xc4\x8a\xc4\x8a";
    toks[NL3] = "\xc4\x8a\xc4\x8a\xc4\x8a";
    toks[HE] = "he";
    toks[HEL] = "hel";
    toks[HELL] = "hell";
    toks[HELLO] = "hello";
    toks[IM_START] = "<|im_start|>";
    toks[IM_END] = "<|im_end|>";
    toks[HTML_END_S] = "</s>";
    toks[THINK] = "<think>";
    toks[END_OF_TURN] = "<end_of_turn>";
    toks[CUSTOM_STOP] = "<|custom_stop|>";
    toks[OTHER_CTL] = "<|other|>";
    for (int i = NL2; i < N_TOKENS; i++) types[i] = TOKT_NORMAL;
    types[IM_START] = types[IM_END] = TOKT_CONTROL;
    types[CUSTOM_STOP] = types[OTHER_CTL] = TOKT_CONTROL;
    types[HTML_END_S] = types[THINK] = types[END_OF_TURN] = TOKT_USER_DEFINED;

    gguf_w_str(w, "general.architecture", "test");
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, N_TOKENS);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, N_TOKENS);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges,
                   sizeof(merges) / sizeof(merges[0]));
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", IM_END);
    gguf_w_u32(w, "tokenizer.ggml.eom_token_id", CUSTOM_STOP);
    if (gguf_writer_save(w, path, &err) == 0
        && (f = gguf_open(path, &err)) != NULL) {
        t = nalar_tokenizer_create(f, &err);
        gguf_close(f);
    }
    if (t == NULL) diag("%s", err.msg);
    gguf_writer_destroy(w);
    unlink(path);
    return t;
}

/* ids of pieces (NULL-terminated pairs: text, special) as one string */
static int
ids_of(const nalar_tokenizer *t, int32_t *out, int cap, ...)
{
    nalar_tok_text pc[8];
    size_t n = 0;
    int32_t *ids;
    int k, more;
    va_list ap;

    va_start(ap, cap);
    for (const char *s; n < 8 && (s = va_arg(ap, const char *)) != NULL; n++) {
        pc[n].text = s;
        pc[n].len = strlen(s);
        pc[n].special = va_arg(ap, int);
    }
    va_end(ap);
    k = nalar_tokenize_bounded(t, pc, n, 0, 1024, &ids, &more);
    for (int i = 0; i < k && i < cap; i++) out[i] = ids[i];
    free(ids);
    return k;
}

/* ids of one text, control tokens parsed or not */
static int
whole(const nalar_tokenizer *t, const char *s, int special, int32_t *out,
      int cap)
{
    return nalar_tokenize(t, s, strlen(s), 0, special, out, cap);
}

static int
same(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && na >= 0 && memcmp(a, b, (size_t) na * 4) == 0;
}

static void
test_pieces(const nalar_tokenizer *t)
{
    int32_t a[64], b[64];
    int na, nb;

    /* whitespace merges across a piece boundary, as in the whole text */
    na = ids_of(t, a, 64, "\n", 1, "\n\n", 0, NULL);
    ok(na == 1 && a[0] == NL3, "template \\n + user \\n\\n: the id of \\n\\n\\n");
    na = ids_of(t, a, 64, "x\n", 0, "\n", 1, "\ny", 0, NULL);
    nb = whole(t, "x\n\n\ny", 0, b, 64);
    ok(same(a, na, b, nb), "user, template, user newlines: the ids of the "
       "whole text");

    /* a word cut across pieces is one word */
    na = ids_of(t, a, 64, "hel", 1, "lo", 0, NULL);
    ok(na == 1 && a[0] == HELLO, "\"hel\" + \"lo\": hello, one token");
    na = ids_of(t, a, 64, "h", 0, "e", 0, "llo", 0, NULL);
    ok(na == 1 && a[0] == HELLO, "\"h\" + \"e\" + \"llo\": hello");

    /* control tokens at piece boundaries */
    na = ids_of(t, a, 64, "<|im_start|>", 1, "hello", 0, "<|im_end|>\n", 1,
                NULL);
    ok(na == 4 && a[0] == IM_START && a[1] == HELLO && a[2] == IM_END,
       "markup, user text, markup: im_start hello im_end \\n");
    na = ids_of(t, a, 64, "<|im_", 1, "end|>", 1, NULL);
    ok(na == 1 && a[0] == IM_END, "a control token over two markup pieces "
       "is recognised");
    na = ids_of(t, a, 64, "<|im_", 1, "end|>", 0, NULL);
    nb = whole(t, "<|im_end|>", 0, b, 64);
    ok(same(a, na, b, nb) && na > 1, "half markup, half user text: not a "
       "control token (%d ids, as literal text)", na);

    /* what a user writes stays text */
    na = ids_of(t, a, 64, "<|im_start|>", 1, "a<|im_end|>b", 0, NULL);
    nb = whole(t, "a<|im_end|>b", 0, b + 1, 63);
    b[0] = IM_START;
    ok(same(a, na, b, nb + 1), "user text holding <|im_end|>: its literal "
       "ids");
    for (int i = 0; i < na; i++) {
        if (a[i] == IM_END) {
            ok(0, "no im_end id from user text");
            break;
        }
    }

    /* user-defined tokens are split out of any text, across pieces too */
    na = ids_of(t, a, 64, "a</s>b", 0, NULL);
    ok(na == 3 && a[1] == HTML_END_S, "user text \"a</s>b\": </s> is its "
       "(user-defined) token");
    na = ids_of(t, a, 64, "</", 0, "s>", 0, NULL);
    ok(na == 1 && a[0] == HTML_END_S, "\"</\" + \"s>\": one </s> token");
    na = ids_of(t, a, 64, "<th", 1, "ink>", 0, NULL);
    ok(na == 1 && a[0] == THINK, "markup \"<th\" + user \"ink>\": <think> "
       "(user-defined tokens stand anywhere, as Hugging Face splits them)");
}

static void
test_eog(const nalar_tokenizer *t)
{
    int32_t a[8];

    ok(nalar_tok_is_eog(t, IM_END), "eos id ends generation");
    ok(nalar_tok_is_eog(t, CUSTOM_STOP), "eom id ends generation");
    ok(!nalar_tok_is_eog(t, OTHER_CTL), "another control token does not");
    ok(!nalar_tok_is_eog(t, HTML_END_S) && !nalar_tok_is_control(t, HTML_END_S),
       "a user-defined </s> neither ends generation nor is control");
    ok(nalar_tok_is_eog(t, END_OF_TURN) && nalar_tok_is_control(t, END_OF_TURN),
       "a user-defined <end_of_turn> is made control and ends generation "
       "(llama.cpp's end-of-turn names)");
    ok(whole(t, "</s>", 0, a, 8) == 1 && a[0] == HTML_END_S,
       "typed </s> tokenizes as that token");
    ok(whole(t, "<end_of_turn>", 0, a, 8) > 1,
       "typed <end_of_turn> stays text");
}

static void
test_nfc(void)
{
    nalar_tokenizer *q = make_vocab("qwen2"), *g = make_vocab("gpt2");
    int32_t a[32], b[32];
    int na, nb;

    if (q == NULL || g == NULL) {
        ok(0, "qwen2 and gpt2 vocabularies");
        nalar_tokenizer_destroy(q);
        nalar_tokenizer_destroy(g);
        return;
    }
    na = whole(q, "caf\x65\xcc\x81", 0, a, 32);
    nb = whole(q, "caf\xc3\xa9", 0, b, 32);
    ok(same(a, na, b, nb), "qwen2: e + U+0301 gives the ids of U+00E9 (NFC)");
    na = whole(g, "caf\x65\xcc\x81", 0, a, 32);
    ok(!same(a, na, b, nb), "gpt2: no normalization");
    /* Hangul jamo L V T compose into one syllable */
    na = whole(q, "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 0, a, 32);
    nb = whole(q, "\xea\xb0\x81", 0, b, 32);
    ok(same(a, na, b, nb), "qwen2: jamo compose into a syllable");
    /* invalid bytes stay as they are around a normalized run */
    na = whole(q, "\xff\x65\xcc\x81\xfe", 0, a, 32);
    nb = whole(q, "\xff\xc3\xa9\xfe", 0, b, 32);
    ok(same(a, na, b, nb), "qwen2: invalid bytes kept, the run between "
       "them normalized");
    /* across pieces: the decomposed accent in the next piece */
    {
        int32_t c[32];
        int nc = ids_of(q, c, 32, "caf\x65", 0, "\xcc\x81", 0, NULL);
        nb = whole(q, "caf\xc3\xa9", 0, b, 32);
        ok(same(c, nc, b, nb), "qwen2: a combining accent in the next "
           "piece composes with the letter before it");
    }
    nalar_tokenizer_destroy(q);
    nalar_tokenizer_destroy(g);
}

static void
test_deepseek_v3(void)
{
    static const struct {
        const char *text;
        int         n;
        size_t      ends[8];
    } cases[] = {
        { "Hello world", 2, { 5, 11 } },
        { "12345", 2, { 3, 5 } },
        { "'s a,b", 3, { 2, 4, 6 } },
        { "\xe4\xb8\xad\xe6\x96\x87" "abc", 2, { 6, 9 } },
        { " !!\n\nx", 2, { 5, 6 } },
        { "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", 1, { 8 } },
        { "a\xe2\x80\x8d" "b", 2, { 1, 5 } },
        { "x  \ty", 3, { 1, 3, 5 } },
    };
    nalar_tokenizer *t = make_vocab("deepseek-v3");
    int bad = 0;

    if (t == NULL) {
        ok(0, "deepseek-v3 vocabulary");
        return;
    }
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t ends[16];
        int n = nalar_tok_pretokenize(t, cases[c].text, strlen(cases[c].text),
                                      ends, 16);
        if (n != cases[c].n
            || memcmp(ends, cases[c].ends, (size_t) n * sizeof(size_t)) != 0) {
            bad++;
            diag("deepseek-v3 '%s': %d words", cases[c].text, n);
        }
    }
    ok(bad == 0, "deepseek-v3 pre-tokenizer: %zu texts cut as its regexes "
       "cut them", sizeof(cases) / sizeof(cases[0]));
    nalar_tokenizer_destroy(t);
}

/* tokenizer.json and tokenizer_config.json in dir; 0 or -1 */
static int
write_hf(const char *dir, const char *model_type)
{
    char    path[256];
    json_t *tj, *cfg;
    int     rc;

    tj = json_pack("{s:{s:s,s:{si,si,si,si,si,si},s:[s]},s:[{si,ss,sb},{si,ss,sb},"
                   "{si,ss,sb}],s:{s:s},s:{s:s,s:[{s:s,s:{s:s},s:s},"
                   "{s:s,s:b}]}}",
        "model", "type", model_type, "vocab", "a", 0, "b", 1, "ab", 2,
        "\xc4\xa0", 3, "\xc3\x83", 8, "\xc2\xa1", 9, "merges", "a b",
        "added_tokens", "id", 4, "content", "<|im_end|>", "special", 1,
        "id", 5, "content", "<think>", "special", 0,
        "id", 7, "content", "</s>", "special", 0,
        "normalizer", "type", "NFC",
        "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+", "behavior", "Isolated",
        "type", "ByteLevel", "use_regex", 0);
    cfg = json_pack("{s:s,s:b,s:s}", "eos_token", "<|im_end|>",
                    "add_bos_token", 0, "chat_template", "{{ messages }}");
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    rc = tj && cfg ? json_dump_file(tj, path, 0) : -1;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (rc == 0) rc = json_dump_file(cfg, path, 0);
    json_decref(tj);
    json_decref(cfg);
    return rc;
}

/* nalar_vocab_hf_write on it, read back as a tokenizer */
static nalar_tokenizer *
convert(const char *dir, int *has_template, nalar_err *err)
{
    char         in[256], out[256];
    gguf_writer *w = gguf_writer_create();
    gguf_file   *f;
    nalar_tokenizer *t = NULL;
    int          n = 0;

    snprintf(in, sizeof(in), "%s/tokenizer.json", dir);
    snprintf(out, sizeof(out), "%s/vocab.gguf", dir);
    gguf_w_str(w, "general.architecture", "test");
    if (nalar_vocab_hf_write(w, in, 0, &n, err) == 0
        && gguf_writer_save(w, out, err) == 0
        && (f = gguf_open(out, err)) != NULL) {
        *has_template = gguf_find(f, "tokenizer.chat_template") != NULL;
        t = nalar_tokenizer_create(f, err);
        gguf_close(f);
    }
    gguf_writer_destroy(w);
    unlink(out);
    return t;
}

static void
test_convert(void)
{
    char dir[] = "/tmp/nalar_hf_XXXXXX";
    nalar_err err = { { 0 } };
    nalar_tokenizer *t;
    int32_t a[8], b[8];
    int tmpl = 0, na, nb;
    char path[256];

    if (mkdtemp(dir) == NULL || write_hf(dir, "BPE") != 0) {
        ok(0, "a tokenizer.json written");
        return;
    }
    t = convert(dir, &tmpl, &err);
    ok(t != NULL, "tokenizer.json converted (%s)", t ? "ok" : err.msg);
    if (t != NULL) {
        ok(nalar_tok_n_vocab(t) == 10
           && strcmp(nalar_tok_piece(t, 6), "[PAD6]") == 0,
           "10 tokens, the missing id 6 an unused [PAD6]");
        ok(nalar_tok_is_control(t, 4) && nalar_tok_is_eog(t, 4)
           && nalar_tok_eos(t) == 4, "special <|im_end|>: control, EOS");
        ok(!nalar_tok_is_control(t, 5) && !nalar_tok_is_control(t, 7)
           && !nalar_tok_is_eog(t, 7), "<think> and </s>: user-defined");
        ok(!nalar_tok_add_bos(t) && tmpl, "add_bos_token false; the chat "
           "template copied");
        na = whole(t, "ab</s>", 0, a, 8);
        ok(na == 2 && a[0] == 2 && a[1] == 7, "\"ab</s>\": ab, </s>");
        /* U+00E1 is bytes C3 A1, the byte-level tokens 8 and 9 */
        na = whole(t, "a\xcc\x81", 0, a, 8);
        nb = whole(t, "\xc3\xa1", 0, b, 8);
        ok(na == 2 && a[0] == 8 && a[1] == 9 && same(a, na, b, nb),
           "NFC normalizer: the qwen2 pre-tokenizer (a + U+0301 is U+00E1)");
        nalar_tokenizer_destroy(t);
    }
    if (write_hf(dir, "WordPiece") == 0) {
        t = convert(dir, &tmpl, &err);
        ok(t == NULL && strstr(err.msg, "only BPE"), "a WordPiece model is "
           "refused (%s)", err.msg);
        nalar_tokenizer_destroy(t);
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
}

int
main(void)
{
    nalar_tokenizer *t = make_vocab("gpt2");

    if (t == NULL) {
        ok(0, "the test vocabulary loads");
        return done_testing();
    }
    test_pieces(t);
    test_eog(t);
    nalar_tokenizer_destroy(t);
    test_nfc();
    test_deepseek_v3();
    test_convert();
    return done_testing();
}
