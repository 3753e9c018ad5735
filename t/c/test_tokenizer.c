/*
 * Tokenizer tests: llama.cpp's test-tokenizer-0 vectors for an SPM and a
 * GPT-2 vocabulary, the demo model's prompts and reference decodes, round
 * trips, streaming detokenization, special tokens and hostile input.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "gguf.h"
#include "tokenizer.h"
#include "mkmodel.h"
#include "clock.h"

#define VOCAB_DIR "t/data/vocab/"
#define DEMO "models/nalar-kjv-target-f32.gguf"


static char *
slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    char *buf;
    long n;

    if (fp == NULL) return NULL;
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = malloc(n + 1);
    if (buf == NULL || fread(buf, 1, n, fp) != (size_t) n) {
        fclose(fp);
        free(buf);
        return NULL;
    }
    fclose(fp);
    buf[n] = '\0';
    *len = (size_t) n;
    return buf;
}

static nalar_tokenizer *
load(const char *path, double *ms)
{
    nalar_err err = { { 0 } };
    gguf_file *f = gguf_open(path, &err);
    nalar_tokenizer *t;
    double t0;

    if (f == NULL) {
        diag("%s", err.msg);
        return NULL;
    }
    t0 = (1e3 * nalar_now_s());
    t = nalar_tokenizer_create(f, &err);
    if (ms) *ms = (1e3 * nalar_now_s()) - t0;
    if (t == NULL) diag("%s", err.msg);
    gguf_close(f);
    return t;
}

/* encode into a malloc'd array; *n gets the count */
static int32_t *
enc(const nalar_tokenizer *t, const char *s, size_t len, int bos, int special,
    int *n)
{
    int cap = 16, k;
    int32_t *ids = malloc(cap * sizeof(int32_t));

    k = nalar_tokenize(t, s, len, bos, special, ids, cap);
    if (k > cap) {
        ids = realloc(ids, k * sizeof(int32_t));
        k = nalar_tokenize(t, s, len, bos, special, ids, k);
    }
    *n = k;
    return ids;
}

static void
print_ids(const char *what, const int32_t *ids, int n)
{
    printf("#   %s:", what);
    for (int i = 0; i < n && i < 64; i++) printf(" %d", ids[i]);
    printf("%s\n", n > 64 ? " ..." : "");
}

/* Independent check of UTF-8 validity (Unicode Table 3-7). */
static int
valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *) s;
    size_t i = 0;

    while (i < n) {
        unsigned c = p[i];
        unsigned lo = 0x80, hi = 0xBF;
        int k;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else return 0;
        if (i + (size_t) k >= n) return 0;   /* cut short */
        for (int j = 1; j <= k; j++) {
            if (p[i + j] < (j == 1 ? lo : 0x80) || p[i + j] > (j == 1 ? hi : 0xBF))
                return 0;
        }
        i += k + 1;
    }
    return 1;
}

/* ---------------------------------------------------------------------- */

static void
test_vectors(const char *name)
{
    char path[256];
    size_t ilen, olen;
    char *inp, *outp, *ip, *op;
    const char *sep = "\n__ggml_vocab_test__\n";
    nalar_tokenizer *t;
    int n_case = 0, n_bad = 0;

    snprintf(path, sizeof(path), VOCAB_DIR "%s", name);
    t = load(path, NULL);
    ok(t != NULL, "%s loads", name);
    if (t == NULL) return;
    snprintf(path, sizeof(path), VOCAB_DIR "%s.inp", name);
    inp = slurp(path, &ilen);
    snprintf(path, sizeof(path), VOCAB_DIR "%s.out", name);
    outp = slurp(path, &olen);
    ok(inp && outp, "%s: .inp and .out read", name);
    if (!inp || !outp) goto done;

    /* each test text ends at a separator; .out has one line per test */
    ip = inp;
    op = outp;
    for (;;) {
        char *end = strstr(ip, sep), *eol;
        int32_t want[512];
        int nw = 0, ng;
        int32_t *got;

        if (end == NULL) break;
        eol = strchr(op, '\n');
        if (eol == NULL) {
            ok(0, "%s: .out has a line for test %d", name, n_case);
            break;
        }
        *eol = '\0';
        for (char *q = op; *q; ) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q) break;
            if (nw < 512) want[nw++] = (int32_t) v;
            q = e;
        }
        got = enc(t, ip, (size_t) (end - ip), 0, 0, &ng);
        n_case++;
        if (ng != nw || memcmp(got, want, nw * sizeof(int32_t)) != 0) {
            n_bad++;
            ok(0, "%s case %d: '%.*s'", name, n_case, (int) (end - ip), ip);
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        free(got);
        ip = end + strlen(sep);
        op = eol + 1;
    }
    ok(n_case == 46 && n_bad == 0, "%s: %d/%d test-tokenizer-0 cases match",
       name, n_case - n_bad, n_case);
done:
    free(inp);
    free(outp);
    nalar_tokenizer_destroy(t);
}

static void
test_demo(void)
{
    static const struct {
        const char *text;
        int32_t ids[8];
        int n;
    } prompts[] = {
        { "In the beginning", { 1, 780, 262, 1794, 1046 }, 5 },
        { "And it came to pass", { 1, 327, 337, 559, 292, 718 }, 6 },
        { "A wise man", { 1, 298, 1540, 416 }, 4 },
    };
    /* README.md, target model greedy continuations */
    static const int32_t ref1[] = { 272, 262, 893, 322, 261, 416, 517, 322,
        261, 416, 517, 322, 261, 416, 1978, 1953, 793, 1967, 13, 843, 356,
        388, 722, 323, 1962, 398, 2, 1, 375, 767, 823, 313, 262, 893, 322,
        349, 261, 416, 517, 322, 261, 416, 517, 322, 261, 13, 1965, 369 };
    static const char *txt1 = " of the world is a man who is a man who is a "
        "man's life.\n                -- Mark Twain The only thing that the "
        "world is not a man who is a man who is a\npro";
    static const int32_t ref2[] = { 1963, 313, 1963, 313, 1963, 313, 1963,
        463, 262, 581, 272, 262, 822, 389, 566, 292, 262, 485, 1963, 313, 306,
        389, 566, 292, 262, 485, 1963, 274, 292, 262, 485, 1963, 274, 292,
        262, 485, 1963, 274, 292, 262, 485, 1963, 274, 292, 262, 485, 1963,
        274 };
    static const char *txt2 = ", that, that, that, when the men of the city "
        "was come to the king, that he was come to the king, and to the king,"
        " and to the king, and to the king, and to the king, and";
    static const int32_t ref3[] = { 322, 261, 416, 517, 322, 261, 416, 517,
        322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416, 1978, 1953,
        793, 13, 329, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416, 517,
        322, 261, 416, 517, 322, 261, 416, 1978, 1953, 13, 1965, 369, 956 };
    static const char *txt3 = " is a man who is a man who is a man who is a "
        "man who is a man's life\nto a man who is a man who is a man who is a "
        "man who is a man's\nprogram";
    const struct { const int32_t *ids; int n; const char *text; } refs[] = {
        { ref1, 48, txt1 }, { ref2, 48, txt2 }, { ref3, 48, txt3 },
    };
    nalar_tokenizer *t = load(DEMO, NULL);

    ok(t != NULL, "demo model vocabulary loads");
    if (t == NULL) return;
    is_int(nalar_tok_n_vocab(t), 2048, "demo: 2048 tokens");
    is_int(nalar_tok_kind_of(t), TOK_SPM, "demo: SPM");
    is_int(nalar_tok_bos(t), 1, "demo: BOS 1");
    is_int(nalar_tok_eos(t), 2, "demo: EOS 2");
    ok(nalar_tok_add_bos(t), "demo: adds BOS");
    ok(nalar_tok_is_eog(t, 2) && !nalar_tok_is_eog(t, 1) &&
       !nalar_tok_is_eog(t, 262), "demo: only EOS ends generation");
    ok(nalar_tok_is_control(t, 1) && !nalar_tok_is_control(t, 262),
       "demo: <s> is control, ' the' is not");
    is_int(nalar_tok_lookup(t, "<0x41>", 6), 3 + 0x41, "demo: lookup <0x41>");
    is_int(nalar_tok_lookup(t, "no such piece", 13), -1, "demo: lookup miss");

    for (size_t i = 0; i < sizeof(prompts) / sizeof(prompts[0]); i++) {
        int n;
        int32_t *ids = enc(t, prompts[i].text, strlen(prompts[i].text),
                           nalar_tok_add_bos(t), 0, &n);
        int same = n == prompts[i].n &&
                   memcmp(ids, prompts[i].ids, n * sizeof(int32_t)) == 0;
        ok(same, "demo: '%s' encodes as llama.cpp", prompts[i].text);
        if (!same) {
            print_ids("want", prompts[i].ids, prompts[i].n);
            print_ids("got ", ids, n);
        }
        {
            char *s = nalar_detokenize(t, ids, n);
            ok(s && strcmp(s, prompts[i].text) == 0,
               "demo: BOS + '%s' decodes back (dummy space stripped)",
               prompts[i].text);
            free(s);
        }
        free(ids);
    }

    /* the README's continuations, streamed (no space stripping) */
    for (int r = 0; r < 3; r++) {
        nalar_detok d;
        char buf[4096] = "", chunk[512];
        size_t len = 0;
        nalar_detok_init(&d, t);
        for (int i = 0; i < refs[r].n; i++) {
            int k = nalar_detok_feed(&d, refs[r].ids[i], chunk, sizeof(chunk));
            if (k > 0) { memcpy(buf + len, chunk, k); len += k; }
        }
        len += nalar_detok_flush(&d, buf + len, 64);
        buf[len] = '\0';
        ok(strcmp(buf, refs[r].text) == 0, "demo: README continuation %d "
           "decodes to the listed text", r + 1);
        if (strcmp(buf, refs[r].text) != 0) diag("got '%s'", buf);
    }

    /* the cap contract: the count is returned even when it does not fit */
    {
        int32_t two[2] = { -7, -7 }, tail = -7;
        int32_t three[3];
        int n = nalar_tokenize(t, "In the beginning", 16, 1, 0, two, 2);
        is_int(n, 5, "cap 2: returns the full count");
        ok(two[0] == 1 && two[1] == 780, "cap 2: writes the first two");
        (void) tail;
        is_int(nalar_tokenize(t, "", 0, 1, 0, three, 3), 1,
               "empty text with BOS: just BOS");
        is_int(nalar_tokenize(t, "", 0, 0, 0, three, 3), 0,
               "empty text without BOS: nothing");
        is_int(nalar_tokenize(t, NULL, 0, 0, 0, NULL, 0), 0,
               "NULL empty text: nothing");
    }
    nalar_tokenizer_destroy(t);
}

/* ---------------------------------------------------------------------- */

static const char *corpus[] = {
    "Hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\tmixed \t \n whitespace",
    "déjà vu, naïve café, Ångström, Straße, Ελληνικά, русский",
    "中文测试：你好，世界！日本語のテキスト、한국어 텍스트",
    "emoji 🙂🚀👍🏽 and 👨‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵",
    "math ∀x∈ℝ: x² ≥ 0 ½ ¼ ⅞ 𝔸𝔹",
    "numbers 1234567890 3.14159 -42 1e10",
    "punctuation!!! ??? ... --- (brackets) [x] {y} <z> \"quotes\" 'single'",
    "contractions: I'm, you're, it's, we've, they'll, he'd, DON'T",
    "\x01\x02\x7f control bytes \x1b[0m",
    "",
    " ",
    "\n",
    "a",
    "ü",
    "𝄞",
};

static void
check_roundtrip(const nalar_tokenizer *t, const char *name, const char *s,
                size_t len, int *bad)
{
    int n;
    int32_t *ids = enc(t, s, len, 0, 0, &n);
    char *d = nalar_detokenize(t, ids, n);

    if (d == NULL || strlen(d) != len || memcmp(d, s, len) != 0) {
        (*bad)++;
        ok(0, "%s: round trip of '%.*s'", name, (int) len, s);
        diag("got '%s'", d ? d : "(null)");
    }
    free(d);
    free(ids);
}

static void
test_roundtrip(const nalar_tokenizer *t, const char *name)
{
    int bad = 0;

    for (size_t i = 0; i < sizeof(corpus) / sizeof(corpus[0]); i++)
        check_roundtrip(t, name, corpus[i], strlen(corpus[i]), &bad);
    /* every code point class: a sweep of scalars in steps */
    for (unsigned cp = 1; cp < 0x110000; cp += 97) {
        char s[8];
        int k;
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (cp < 0x80) { s[0] = (char) cp; k = 1; }
        else if (cp < 0x800) {
            s[0] = (char) (0xC0 | (cp >> 6)); s[1] = (char) (0x80 | (cp & 63));
            k = 2;
        } else if (cp < 0x10000) {
            s[0] = (char) (0xE0 | (cp >> 12));
            s[1] = (char) (0x80 | ((cp >> 6) & 63));
            s[2] = (char) (0x80 | (cp & 63)); k = 3;
        } else {
            s[0] = (char) (0xF0 | (cp >> 18));
            s[1] = (char) (0x80 | ((cp >> 12) & 63));
            s[2] = (char) (0x80 | ((cp >> 6) & 63));
            s[3] = (char) (0x80 | (cp & 63)); k = 4;
        }
        s[k] = 'x';
        check_roundtrip(t, name, s, k + 1, &bad);
        if (bad > 10) break;
    }
    ok(bad == 0, "%s: decode(encode(x)) == x over the UTF-8 corpus and a "
       "code point sweep", name);
}

/* Streams ids one at a time: every chunk must be valid UTF-8 and the
 * concatenation must equal the whole decode. */
static int
stream_matches(const nalar_tokenizer *t, const int32_t *ids, int n,
               const char *whole)
{
    nalar_detok d;
    char chunk[512], *acc = malloc(strlen(whole) + 1024);
    size_t len = 0;
    int good = 1, k;

    nalar_detok_init(&d, t);
    d.strip_space = nalar_tok_add_space_prefix(t);
    for (int i = 0; i < n; i++) {
        k = nalar_detok_feed(&d, ids[i], chunk, sizeof(chunk));
        if (k < 0 || !valid_utf8(chunk, k) || strlen(chunk) != (size_t) k)
            good = 0;
        if (k > 0 && len + k < strlen(whole) + 1000) {
            memcpy(acc + len, chunk, k);
            len += k;
        }
    }
    k = nalar_detok_flush(&d, chunk, sizeof(chunk));
    if (k < 0 || !valid_utf8(chunk, k)) good = 0;
    if (k > 0) { memcpy(acc + len, chunk, k); len += k; }
    acc[len] = '\0';
    if (strcmp(acc, whole) != 0) good = 0;
    free(acc);
    return good;
}

static void
test_streaming(const nalar_tokenizer *t, const char *name)
{
    const char *s = "中文 🙂 déjà 👨‍👩‍👧 x";
    int n, split = 0;
    int32_t *ids = enc(t, s, strlen(s), 0, 0, &n);
    char *whole = nalar_detokenize(t, ids, n);

    /* some character must actually be cut across tokens for this to test
       anything: look for a token whose bytes are not complete UTF-8 */
    for (int i = 0; i < n; i++) {
        char b[64];
        int k = nalar_token_bytes(t, ids[i], b, sizeof(b));
        if (k > 0 && !valid_utf8(b, k)) split = 1;
    }
    ok(split, "%s: the test string has characters split across tokens", name);
    ok(whole && strcmp(whole, s) == 0, "%s: whole decode equals the text", name);
    ok(whole && stream_matches(t, ids, n, whole),
       "%s: streamed chunks are valid UTF-8 and concatenate to the whole",
       name);
    free(whole);
    free(ids);

    /* a piece that stops half way through a character holds it back */
    {
        nalar_detok d;
        char out[64];
        int32_t e4 = -1, b8 = -1, ad = -1;
        if (nalar_tok_kind_of(t) == TOK_SPM) {
            e4 = nalar_tok_lookup(t, "<0xE4>", 6);
            b8 = nalar_tok_lookup(t, "<0xB8>", 6);
            ad = nalar_tok_lookup(t, "<0xAD>", 6);
        } else {
            /* byte-level: 0xE4 -> U+00E4, 0xB8 -> U+00B8, 0xAD -> U+0143 */
            e4 = nalar_tok_lookup(t, "\xC3\xA4", 2);
            b8 = nalar_tok_lookup(t, "\xC2\xB8", 2);
            ad = nalar_tok_lookup(t, "\xC5\x83", 2);
        }
        ok(e4 >= 0 && b8 >= 0 && ad >= 0, "%s: byte tokens for E4 B8 AD", name);
        nalar_detok_init(&d, t);
        is_int(nalar_detok_feed(&d, e4, out, sizeof(out)), 0,
               "%s: E4 is held back", name);
        is_int(nalar_detok_feed(&d, b8, out, sizeof(out)), 0,
               "%s: E4 B8 is held back", name);
        ok(nalar_detok_feed(&d, ad, out, sizeof(out)) == 3 &&
           strcmp(out, "中") == 0, "%s: E4 B8 AD emits 中", name);
        /* broken: E4 B8 then 'a' -> two U+FFFD then 'a' */
        nalar_detok_init(&d, t);
        nalar_detok_feed(&d, e4, out, sizeof(out));
        nalar_detok_feed(&d, b8, out, sizeof(out));
        {
            int32_t a = nalar_tok_kind_of(t) == TOK_SPM
                        ? nalar_tok_lookup(t, "a", 1) : nalar_tok_lookup(t, "a", 1);
            int k = nalar_detok_feed(&d, a, out, sizeof(out));
            ok(k == 7 && strcmp(out, "\xEF\xBF\xBD\xEF\xBF\xBD" "a") == 0,
               "%s: E4 B8 'a' emits U+FFFD U+FFFD 'a'", name);
        }
        /* cut short at the end: flush gives U+FFFD per held byte */
        nalar_detok_init(&d, t);
        nalar_detok_feed(&d, e4, out, sizeof(out));
        ok(nalar_detok_flush(&d, out, sizeof(out)) == 3 &&
           strcmp(out, "\xEF\xBF\xBD") == 0, "%s: flush of E4 is U+FFFD", name);
        ok(nalar_detok_flush(&d, out, sizeof(out)) == 0 && out[0] == '\0',
           "%s: second flush is empty", name);
        /* too small a buffer: refused, state kept */
        nalar_detok_init(&d, t);
        nalar_detok_feed(&d, e4, out, sizeof(out));
        nalar_detok_feed(&d, b8, out, sizeof(out));
        is_int(nalar_detok_feed(&d, ad, out, 2), -1,
               "%s: feed into 2 bytes is refused", name);
        ok(nalar_detok_feed(&d, ad, out, sizeof(out)) == 3 &&
           strcmp(out, "中") == 0, "%s: and succeeds on retry", name);
    }
}

static void
test_special(const nalar_tokenizer *spm, const nalar_tokenizer *bpe)
{
    int n;
    int32_t *ids;
    int has;

    /* SPM: "<s>" and "</s>" */
    ids = enc(spm, "a<s>b</s>", 9, 0, 1, &n);
    {
        int32_t want[16];
        int nw = 0, na, nb;
        int32_t *a = enc(spm, "a", 1, 0, 0, &na);
        int32_t *b = enc(spm, "b", 1, 0, 0, &nb);
        /* "a" <s> then "b" gets a dummy prefix again (after a special) */
        for (int i = 0; i < na; i++) want[nw++] = a[i];
        want[nw++] = 1;
        for (int i = 0; i < nb; i++) want[nw++] = b[i];
        want[nw++] = 2;
        ok(n == nw && memcmp(ids, want, nw * sizeof(int32_t)) == 0,
           "spm parse_special: 'a<s>b</s>' splits out BOS and EOS");
        if (!(n == nw && memcmp(ids, want, nw * sizeof(int32_t)) == 0)) {
            print_ids("want", want, nw);
            print_ids("got ", ids, n);
        }
        free(a);
        free(b);
    }
    free(ids);
    ids = enc(spm, "a<s>b</s>", 9, 0, 0, &n);
    has = 0;
    for (int i = 0; i < n; i++) has |= ids[i] == 1 || ids[i] == 2;
    ok(!has && n > 4, "spm without parse_special: '<s>' is plain text");
    {
        char *d = nalar_detokenize(spm, ids, n);
        ok(d && strcmp(d, "a<s>b</s>") == 0, "spm: literal '<s>' round trips");
        free(d);
    }
    free(ids);

    /* BPE: <|endoftext|> */
    ids = enc(bpe, "hi<|endoftext|>there", 20, 0, 1, &n);
    has = 0;
    for (int i = 0; i < n; i++) has += ids[i] == 50256;
    ok(has == 1 && n == 3, "gpt2 parse_special: <|endoftext|> is one token "
       "(%d ids)", n);
    free(ids);
    ids = enc(bpe, "hi<|endoftext|>there", 20, 0, 0, &n);
    has = 0;
    for (int i = 0; i < n; i++) has += ids[i] == 50256;
    ok(has == 0 && n > 3, "gpt2 without parse_special: text only");
    {
        char *d = nalar_detokenize(bpe, ids, n);
        ok(d && strcmp(d, "hi<|endoftext|>there") == 0,
           "gpt2: literal <|endoftext|> round trips");
        free(d);
    }
    free(ids);
    {
        char b[16];
        is_int(nalar_token_bytes(bpe, 50256, b, sizeof(b)), 0,
               "gpt2: control token decodes to nothing");
        is_int(nalar_token_bytes(spm, 1, b, sizeof(b)), 0,
               "spm: <s> decodes to nothing");
        ok(nalar_tok_is_eog(bpe, 50256), "gpt2: <|endoftext|> ends generation");
        is_int(nalar_tok_add_bos(bpe), 0, "gpt2: no BOS by default");
        is_int(nalar_token_bytes(spm, nalar_tok_lookup(spm, "<0x41>", 6), b,
                                 sizeof(b)), 1, "spm: <0x41> is one byte");
        ok(b[0] == 'A', "spm: <0x41> is 'A'");
        {
            int32_t id = nalar_tok_lookup(spm, "\xE2\x96\x81the", 6);
            int k = nalar_token_bytes(spm, id, b, sizeof(b));
            ok(id >= 0 && k == 4 && memcmp(b, " the", 4) == 0,
               "spm: '▁the' decodes as ' the'");
            k = nalar_token_bytes(spm, id, b, 2);
            ok(k == 2 && memcmp(b, " t", 2) == 0, "spm: cap 2 truncates");
        }
        {
            int32_t id = nalar_tok_lookup(bpe, "\xC4\xA0the", 5);
            int k = nalar_token_bytes(bpe, id, b, sizeof(b));
            ok(id >= 0 && k == 4 && memcmp(b, " the", 4) == 0,
               "gpt2: 'Ġthe' decodes as ' the'");
        }
        is_int(nalar_token_bytes(spm, -1, b, sizeof(b)), 0, "bad id: nothing");
        is_int(nalar_token_bytes(spm, 1 << 30, b, sizeof(b)), 0,
               "huge id: nothing");
        ok(nalar_tok_piece(spm, 1 << 30) == NULL && nalar_tok_piece(spm, -3)
           == NULL && strcmp(nalar_tok_piece(spm, 1), "<s>") == 0,
           "piece lookup by id, out of range is NULL");
    }
}

/* What a correct decoder turns arbitrary bytes into: valid UTF-8 kept,
 * every other byte one U+FFFD (written independently of the library). */
static char *
sanitize(const unsigned char *s, size_t n)
{
    char *o = malloc(3 * n + 1);
    size_t k = 0, i = 0;

    while (i < n) {
        size_t L = 0;
        for (size_t j = 1; j <= 4 && i + j <= n; j++)
            if (valid_utf8((const char *) s + i, j)) { L = j; break; }
        if (L) {
            memcpy(o + k, s + i, L);
            k += L;
            i += L;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    o[k] = '\0';
    return o;
}

static void
test_hostile(const nalar_tokenizer *t, const char *name)
{
    size_t big = 1 << 20;
    char *s = malloc(big + 8);
    double t0, ms;
    int n, bad = 0;
    int32_t *ids;
    char *d;
    unsigned rnd = 12345;

    /* 1 MB of one character, of spaces, of a 3-byte character */
    memset(s, 'a', big);
    t0 = (1e3 * nalar_now_s());
    ids = enc(t, s, big, 0, 0, &n);
    ms = (1e3 * nalar_now_s()) - t0;
    d = nalar_detokenize(t, ids, n);
    ok(n > 0 && d && strlen(d) == big && memcmp(d, s, big) == 0,
       "%s: 1 MB of 'a' round trips (%d ids, %.0f ms)", name, n, ms);
    free(ids);
    free(d);

    memset(s, ' ', big);
    ids = enc(t, s, big, 0, 0, &n);
    d = nalar_detokenize(t, ids, n);
    ok(n > 0 && d && strlen(d) == big && memcmp(d, s, big) == 0,
       "%s: 1 MB of spaces round trips (%d ids)", name, n);
    free(ids);
    free(d);

    for (size_t i = 0; i + 3 <= big; i += 3) memcpy(s + i, "中", 3);
    ids = enc(t, s, big - big % 3, 0, 0, &n);
    d = nalar_detokenize(t, ids, n);
    ok(n > 0 && d && strlen(d) == big - big % 3 &&
       memcmp(d, s, big - big % 3) == 0,
       "%s: 1 MB of 中 round trips (%d ids)", name, n);
    free(ids);
    free(d);

    /* invalid UTF-8: decode(encode(x)) is x with U+FFFD per bad byte */
    {
        static const char *cases[] = {
            "\xff", "\xc3", "a\xe4\xb8", ("\xe4\xb8" "a"), "\xed\xa0\x80",
            "\xc0\xaf", "\xf4\x90\x80\x80", "\x80\x80 x", "\xf0\x9f\x99",
            "ok \xfe\xff ok",
        };
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            size_t len = strlen(cases[c]);
            char *want = sanitize((const unsigned char *) cases[c], len);
            ids = enc(t, cases[c], len, 0, 0, &n);
            d = nalar_detokenize(t, ids, n);
            if (n < 0 || d == NULL || strcmp(d, want) != 0) {
                bad++;
                ok(0, "%s: invalid case %zu", name, c);
            }
            free(want);
            free(ids);
            free(d);
        }
        for (int r = 0; r < 300; r++) {
            unsigned char buf[40];
            size_t len = r % 40;
            char *want;
            for (size_t i = 0; i < len; i++) {
                rnd = rnd * 1103515245u + 12345u;
                buf[i] = (unsigned char) (rnd >> 16);
                if ((rnd >> 8) % 4 == 0) buf[i] = ' ';
            }
            want = sanitize(buf, len);
            ids = enc(t, (const char *) buf, len, 0, r % 2, &n);
            d = nalar_detokenize(t, ids, n);
            if (n < 0 || d == NULL || !valid_utf8(d, strlen(d)) ||
                strcmp(d, want) != 0) {
                bad++;
                ok(0, "%s: random bytes %d", name, r);
            }
            free(want);
            free(ids);
            free(d);
        }
    }
    ok(bad == 0, "%s: invalid UTF-8 decodes to U+FFFD per bad byte, no "
       "crash", name);
    free(s);
}

/* Word boundaries (byte offsets) generated with Python's `regex` module
 * (2026.5.9), regex.finditer over these texts with the real patterns:
 *   gpt-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 *           \s+(?!\S)|\s+
 *   llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
 *           \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2:  llama3 with \p{N} instead of \p{N}{1,3}
 *   tekken: [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
 *           [\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?
 *           [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
 *           \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * and, as sequences of regexes each splitting every piece the ones before
 * made into its matches and the text between them (HF tokenizers' Split,
 * "isolated"; the lists of llama.cpp's llama-vocab.cpp):
 *   smollm, starcoder: \p{N}; gpt-2
 *   deepseek-llm:   [\r\n]; \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+ (its cased letters);
 *                   \s?[!-/:-~！-／：-～‘-‟　-。]+; \s+$; [一-龥ࠀ-一가-퟿]+;
 *                   \p{N}+
 *   deepseek-coder: [\r\n]; \s?\p{L}+; \s?\p{P}+; [一-龥ࠀ-一가-퟿]+; \p{N}
 *   falcon:         [\p{P}\$\+<=>\^~\|`]+; gpt-2;
 *                   [0-9][0-9][0-9] */
static const struct { const char *pre; const char *text; int n; size_t ends[64]; } pre_cases[] = {
    { "gpt-2", "Hello world's 12345\x0a""\x0a""  x", 6, { 5, 11, 13, 19, 22, 24 } },
    { "gpt-2", "I'M HERE, you'Re 'LL 'd", 12, { 1, 2, 3, 8, 9, 13, 14, 16, 18, 20, 22, 23 } },
    { "gpt-2", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 10, { 1, 9, 10, 13, 14, 15, 19, 25, 29, 31 } },
    { "gpt-2", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 13, { 6, 7, 9, 10, 17, 23, 24, 32, 34, 35, 40, 43, 46 } },
    { "gpt-2", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 8, { 12, 15, 21, 24, 30, 33, 34, 44 } },
    { "gpt-2", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 7, { 5, 14, 18, 20, 24, 27, 31 } },
    { "gpt-2", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 22, { 1, 3, 5, 6, 7, 9, 10, 11, 18, 19, 22, 30, 31, 32, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "gpt-2", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 14, { 3, 7, 11, 13, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "gpt-2", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 7, { 3, 7, 11, 13, 16, 17, 19 } },
    { "gpt-2", " ", 1, { 1 } },
    { "gpt-2", "", 0, { 0 } },
    { "gpt-2", "'", 1, { 1 } },
    { "gpt-2", "'s", 1, { 2 } },
    { "llama3", "Hello world's 12345\x0a""\x0a""  x", 9, { 5, 11, 13, 14, 17, 19, 21, 22, 24 } },
    { "llama3", "I'M HERE, you'Re 'LL 'd", 10, { 1, 3, 8, 9, 13, 16, 18, 20, 22, 23 } },
    { "llama3", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 9, { 1, 9, 13, 14, 19, 24, 25, 29, 31 } },
    { "llama3", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 16, { 6, 9, 10, 17, 23, 24, 32, 33, 34, 35, 38, 40, 41, 43, 44, 46 } },
    { "llama3", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 6, { 12, 21, 30, 33, 34, 44 } },
    { "llama3", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 5, { 5, 14, 18, 24, 31 } },
    { "llama3", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 22, { 1, 3, 5, 7, 9, 10, 11, 14, 17, 18, 19, 22, 30, 31, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "llama3", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 12, { 3, 7, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "llama3", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 4, { 7, 11, 16, 19 } },
    { "llama3", " ", 1, { 1 } },
    { "llama3", "", 0, { 0 } },
    { "llama3", "'", 1, { 1 } },
    { "llama3", "'s", 1, { 2 } },
    { "qwen2", "Hello world's 12345\x0a""\x0a""  x", 12, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 21, 22, 24 } },
    { "qwen2", "I'M HERE, you'Re 'LL 'd", 10, { 1, 3, 8, 9, 13, 16, 18, 20, 22, 23 } },
    { "qwen2", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 9, { 1, 9, 13, 14, 19, 24, 25, 29, 31 } },
    { "qwen2", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 19, { 6, 9, 10, 17, 23, 24, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 43, 44, 46 } },
    { "qwen2", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 6, { 12, 21, 30, 33, 34, 44 } },
    { "qwen2", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 5, { 5, 14, 18, 24, 31 } },
    { "qwen2", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 26, { 1, 3, 5, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 22, 30, 31, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "qwen2", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 12, { 3, 7, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "qwen2", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 4, { 7, 11, 16, 19 } },
    { "qwen2", " ", 1, { 1 } },
    { "qwen2", "", 0, { 0 } },
    { "qwen2", "'", 1, { 1 } },
    { "qwen2", "'s", 1, { 2 } },    { "tekken", "Hello world's 12345\x0a""\x0a""  x", 12, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 21, 22, 24 } },
    { "tekken", "I'M HERE, you'Re 'LL 'd", 10, { 1, 3, 8, 9, 13, 16, 18, 20, 22, 23 } },
    { "tekken", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 9, { 1, 9, 13, 14, 19, 24, 25, 29, 31 } },
    { "tekken", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 19, { 6, 9, 10, 17, 23, 24, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 43, 44, 46 } },
    { "tekken", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 6, { 12, 21, 30, 33, 34, 44 } },
    { "tekken", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 5, { 5, 14, 18, 24, 31 } },
    { "tekken", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 26, { 1, 3, 5, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 22, 30, 31, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "tekken", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 12, { 3, 7, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "tekken", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 4, { 7, 11, 16, 19 } },
    { "tekken", " ", 1, { 1 } },
    { "tekken", "", 0, { 0 } },
    { "tekken", "'", 1, { 1 } },
    { "tekken", "'s", 1, { 2 } },
    { "tekken", "HTTPServer getURLPath \xc3""\x89""COLE \xc3""\xa9""cole \xce""\xa3""\xce""\x8a""\xce""\xa3""\xce""\xa5""\xce""\xa6""\xce""\x9f""\xce""\xa3""", 6, { 10, 14, 21, 28, 35, 50 } },
    { "tekken", "e\xcc""\x81""te\xcc""\x81"" MAKE\xcc""\x81"" \xca""\xb0""ello x\xcc""\x81""", 4, { 7, 14, 21, 25 } },
    { "tekken", "path/to/file.c!\x0a""/x //\x0a""\x0a"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" abc\xed""\x95""\x9c""\xea""\xb5""\xad""", 9, { 4, 7, 12, 14, 17, 18, 23, 33, 43 } },
    { "tekken", "<|im_start|> 2024-06-01 $5+3=8 `a|b` ~^", 26, { 2, 4, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 25, 26, 27, 28, 29, 30, 32, 33, 35, 36, 39 } },
    { "tekken", "hello   \x0a""  ", 3, { 5, 9, 11 } },
    { "tekken", "\xe3""\x80""\x82""\xe3""\x80""\x8c""\xe5""\xbc""\x95""\xe7""\x94""\xa8""\xe3""\x80""\x8d""\xef""\xbc""\x8c""\xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""\xef""\xbc""\xa1""\xef""\xbc""\xa2""\xef""\xbc""\xa3""", 7, { 6, 12, 18, 21, 24, 27, 36 } },
    { "smollm", "Hello world's 12345\x0a""\x0a""  x", 11, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 22, 24 } },
    { "smollm", "I'M HERE, you'Re 'LL 'd", 12, { 1, 2, 3, 8, 9, 13, 14, 16, 18, 20, 22, 23 } },
    { "smollm", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 10, { 1, 9, 10, 13, 14, 15, 19, 25, 29, 31 } },
    { "smollm", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 20, { 6, 7, 9, 10, 17, 23, 24, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 43, 44, 46 } },
    { "smollm", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 8, { 12, 15, 21, 24, 30, 33, 34, 44 } },
    { "smollm", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 7, { 5, 14, 18, 20, 24, 27, 31 } },
    { "smollm", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 28, { 1, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 22, 30, 31, 32, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "smollm", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 14, { 3, 7, 11, 13, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "smollm", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 7, { 3, 7, 11, 13, 16, 17, 19 } },
    { "smollm", " ", 1, { 1 } },
    { "smollm", "", 0, { 0 } },
    { "smollm", "'", 1, { 1 } },
    { "smollm", "'s", 1, { 2 } },
    { "smollm", "HTTPServer getURLPath \xc3""\x89""COLE \xc3""\xa9""cole \xce""\xa3""\xce""\x8a""\xce""\xa3""\xce""\xa5""\xce""\xa6""\xce""\x9f""\xce""\xa3""", 5, { 10, 21, 28, 35, 50 } },
    { "smollm", "e\xcc""\x81""te\xcc""\x81"" MAKE\xcc""\x81"" \xca""\xb0""ello x\xcc""\x81""", 9, { 1, 3, 5, 7, 12, 14, 21, 23, 25 } },
    { "smollm", "path/to/file.c!\x0a""/x //\x0a""\x0a"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" abc\xed""\x95""\x9c""\xea""\xb5""\xad""", 15, { 4, 5, 7, 8, 12, 13, 14, 15, 16, 17, 18, 21, 23, 33, 43 } },
    { "smollm", "<|im_start|> 2024-06-01 $5+3=8 `a|b` ~^", 28, { 2, 4, 5, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 25, 26, 27, 28, 29, 30, 32, 33, 34, 35, 36, 39 } },
    { "smollm", "hello   \x0a""  ", 2, { 5, 11 } },
    { "smollm", "\xe3""\x80""\x82""\xe3""\x80""\x8c""\xe5""\xbc""\x95""\xe7""\x94""\xa8""\xe3""\x80""\x8d""\xef""\xbc""\x8c""\xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""\xef""\xbc""\xa1""\xef""\xbc""\xa2""\xef""\xbc""\xa3""", 7, { 6, 12, 18, 21, 24, 27, 36 } },
    { "deepseek-llm", "Hello world's 12345\x0a""\x0a""  x", 10, { 5, 11, 12, 13, 14, 19, 20, 21, 22, 24 } },
    { "deepseek-llm", "I'M HERE, you'Re 'LL 'd", 12, { 1, 2, 3, 8, 9, 13, 14, 16, 18, 20, 22, 23 } },
    { "deepseek-llm", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 12, { 1, 9, 13, 14, 19, 21, 22, 23, 24, 25, 29, 31 } },
    { "deepseek-llm", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 24, { 1, 3, 4, 6, 7, 9, 10, 13, 15, 17, 21, 23, 24, 29, 31, 32, 33, 34, 35, 40, 41, 43, 44, 46 } },
    { "deepseek-llm", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 8, { 12, 15, 21, 24, 30, 33, 35, 44 } },
    { "deepseek-llm", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 6, { 5, 14, 18, 24, 27, 31 } },
    { "deepseek-llm", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 21, { 1, 3, 5, 6, 7, 9, 10, 11, 18, 19, 22, 30, 31, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "deepseek-llm", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 15, { 3, 7, 11, 12, 13, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "deepseek-llm", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 5, { 3, 7, 11, 16, 19 } },
    { "deepseek-llm", " ", 1, { 1 } },
    { "deepseek-llm", "", 0, { 0 } },
    { "deepseek-llm", "'", 1, { 1 } },
    { "deepseek-llm", "'s", 2, { 1, 2 } },
    { "deepseek-llm", "HTTPServer getURLPath \xc3""\x89""COLE \xc3""\xa9""cole \xce""\xa3""\xce""\x8a""\xce""\xa3""\xce""\xa5""\xce""\xa6""\xce""\x9f""\xce""\xa3""", 7, { 10, 21, 24, 28, 31, 35, 50 } },
    { "deepseek-llm", "e\xcc""\x81""te\xcc""\x81"" MAKE\xcc""\x81"" \xca""\xb0""ello x\xcc""\x81""", 9, { 1, 3, 5, 7, 12, 17, 21, 23, 25 } },
    { "deepseek-llm", "path/to/file.c!\x0a""/x //\x0a""\x0a"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" abc\xed""\x95""\x9c""\xea""\xb5""\xad""", 18, { 4, 5, 7, 8, 12, 13, 14, 15, 16, 17, 18, 21, 22, 23, 24, 33, 37, 43 } },
    { "deepseek-llm", "<|im_start|> 2024-06-01 $5+3=8 `a|b` ~^", 23, { 2, 4, 5, 10, 12, 13, 17, 18, 20, 21, 23, 25, 26, 27, 28, 29, 30, 32, 33, 34, 35, 36, 39 } },
    { "deepseek-llm", "hello   \x0a""  ", 4, { 5, 8, 9, 11 } },
    { "deepseek-llm", "\xe3""\x80""\x82""\xe3""\x80""\x8c""\xe5""\xbc""\x95""\xe7""\x94""\xa8""\xe3""\x80""\x8d""\xef""\xbc""\x8c""\xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""\xef""\xbc""\xa1""\xef""\xbc""\xa2""\xef""\xbc""\xa3""", 5, { 3, 15, 18, 27, 36 } },
    { "deepseek-coder", "Hello world's 12345\x0a""\x0a""  x", 14, { 5, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 24 } },
    { "deepseek-coder", "I'M HERE, you'Re 'LL 'd", 12, { 1, 2, 3, 8, 9, 13, 14, 16, 18, 20, 22, 23 } },
    { "deepseek-coder", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 12, { 1, 9, 13, 14, 19, 21, 22, 23, 24, 25, 29, 31 } },
    { "deepseek-coder", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 20, { 6, 7, 9, 10, 17, 23, 24, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 43, 44, 46 } },
    { "deepseek-coder", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 9, { 12, 15, 21, 24, 30, 33, 34, 35, 44 } },
    { "deepseek-coder", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 6, { 5, 14, 18, 24, 27, 31 } },
    { "deepseek-coder", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 27, { 1, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 22, 30, 31, 34, 36, 37, 38, 40, 47, 48, 50 } },
    { "deepseek-coder", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 15, { 3, 7, 11, 12, 13, 14, 17, 18, 22, 24, 25, 26, 27, 28, 29 } },
    { "deepseek-coder", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 5, { 3, 7, 11, 16, 19 } },
    { "deepseek-coder", " ", 1, { 1 } },
    { "deepseek-coder", "", 0, { 0 } },
    { "deepseek-coder", "'", 1, { 1 } },
    { "deepseek-coder", "'s", 2, { 1, 2 } },
    { "deepseek-coder", "HTTPServer getURLPath \xc3""\x89""COLE \xc3""\xa9""cole \xce""\xa3""\xce""\x8a""\xce""\xa3""\xce""\xa5""\xce""\xa6""\xce""\x9f""\xce""\xa3""", 5, { 10, 21, 28, 35, 50 } },
    { "deepseek-coder", "e\xcc""\x81""te\xcc""\x81"" MAKE\xcc""\x81"" \xca""\xb0""ello x\xcc""\x81""", 9, { 1, 3, 5, 7, 12, 14, 21, 23, 25 } },
    { "deepseek-coder", "path/to/file.c!\x0a""/x //\x0a""\x0a"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" abc\xed""\x95""\x9c""\xea""\xb5""\xad""", 18, { 4, 5, 7, 8, 12, 13, 14, 15, 16, 17, 18, 21, 22, 23, 24, 33, 37, 43 } },
    { "deepseek-coder", "<|im_start|> 2024-06-01 $5+3=8 `a|b` ~^", 26, { 2, 4, 5, 10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 25, 26, 27, 28, 29, 30, 32, 33, 34, 35, 39 } },
    { "deepseek-coder", "hello   \x0a""  ", 4, { 5, 8, 9, 11 } },
    { "deepseek-coder", "\xe3""\x80""\x82""\xe3""\x80""\x8c""\xe5""\xbc""\x95""\xe7""\x94""\xa8""\xe3""\x80""\x8d""\xef""\xbc""\x8c""\xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""\xef""\xbc""\xa1""\xef""\xbc""\xa2""\xef""\xbc""\xa3""", 8, { 6, 12, 15, 18, 21, 24, 27, 36 } },
    { "falcon", "Hello world's 12345\x0a""\x0a""  x", 9, { 5, 11, 12, 13, 14, 17, 19, 22, 24 } },
    { "falcon", "I'M HERE, you'Re 'LL 'd", 14, { 1, 2, 3, 8, 9, 13, 14, 16, 17, 18, 20, 21, 22, 23 } },
    { "falcon", "  leading\x09""and\x09""\x09""tabs \x09""\x0a""\x0d""\x0a""  end  ", 10, { 1, 9, 10, 13, 14, 15, 19, 25, 29, 31 } },
    { "falcon", "d\xc3""\xa9""j\xc3""\xa0""-vu: na\xc3""\xaf""ve caf\xc3""\xa9""; Stra\xc3""\x9f""e 3.14159 \xc2""\xbd"" \xc2""\xb2""", 14, { 6, 7, 9, 10, 17, 23, 24, 32, 34, 35, 38, 40, 43, 46 } },
    { "falcon", "\xe4""\xb8""\xad""\xe6""\x96""\x87""\xe6""\xb5""\x8b""\xe8""\xaf""\x95""\xef""\xbc""\x9a""\xe4""\xbd""\xa0""\xe5""\xa5""\xbd""\xef""\xbc""\x8c""\xe4""\xb8""\x96""\xe7""\x95""\x8c""\xef""\xbc""\x81""  \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""", 8, { 12, 15, 21, 24, 30, 33, 34, 44 } },
    { "falcon", "emoji \xf0""\x9f""\x99""\x82""\xf0""\x9f""\x9a""\x80"" and\xc2""\xa0""nbsp\xe3""\x80""\x80""ideo", 7, { 5, 14, 18, 20, 24, 27, 31 } },
    { "falcon", "x = a+b*(c-1234567) // comment\x0a""\x09""if (y) { return; }", 29, { 1, 2, 3, 5, 6, 7, 9, 10, 11, 14, 17, 18, 19, 20, 22, 30, 31, 32, 34, 35, 36, 37, 38, 39, 40, 47, 48, 49, 50 } },
    { "falcon", "$$$ !!! \x3f""\x3f""\x3f""\x0a""\x0a""\x0a""...  ,,, a1b2c3", 15, { 3, 4, 7, 8, 11, 14, 17, 19, 22, 24, 25, 26, 27, 28, 29 } },
    { "falcon", "\xe2""\x80""\xa8""line sep\xc2""\x85""nel\x0b""vt", 7, { 3, 7, 11, 13, 16, 17, 19 } },
    { "falcon", " ", 1, { 1 } },
    { "falcon", "", 0, { 0 } },
    { "falcon", "'", 1, { 1 } },
    { "falcon", "'s", 2, { 1, 2 } },
    { "falcon", "HTTPServer getURLPath \xc3""\x89""COLE \xc3""\xa9""cole \xce""\xa3""\xce""\x8a""\xce""\xa3""\xce""\xa5""\xce""\xa6""\xce""\x9f""\xce""\xa3""", 5, { 10, 21, 28, 35, 50 } },
    { "falcon", "e\xcc""\x81""te\xcc""\x81"" MAKE\xcc""\x81"" \xca""\xb0""ello x\xcc""\x81""", 9, { 1, 3, 5, 7, 12, 14, 21, 23, 25 } },
    { "falcon", "path/to/file.c!\x0a""/x //\x0a""\x0a"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" abc\xed""\x95""\x9c""\xea""\xb5""\xad""", 16, { 4, 5, 7, 8, 12, 13, 14, 15, 16, 17, 18, 19, 21, 23, 33, 43 } },
    { "falcon", "<|im_start|> 2024-06-01 $5+3=8 `a|b` ~^", 27, { 2, 4, 5, 10, 12, 13, 16, 17, 18, 20, 21, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 39 } },
    { "falcon", "hello   \x0a""  ", 2, { 5, 11 } },
    { "falcon", "\xe3""\x80""\x82""\xe3""\x80""\x8c""\xe5""\xbc""\x95""\xe7""\x94""\xa8""\xe3""\x80""\x8d""\xef""\xbc""\x8c""\xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""\xef""\xbc""\xa1""\xef""\xbc""\xa2""\xef""\xbc""\xa3""", 5, { 6, 12, 18, 27, 36 } },
};

/* A tokenizer from a GGUF written here; NULL (err filled) if refused. */
static nalar_tokenizer *
make_typed(const char *model, const char *pre, const char **toks, size_t n,
           int bad_scores, const int32_t *types, nalar_err *err)
{
    char path[] = "/tmp/nalar_tok_XXXXXX";
    gguf_writer *w = gguf_writer_create();
    gguf_file *f;
    nalar_tokenizer *t = NULL;
    int fd = mkstemp(path);

    if (fd < 0) return NULL;
    close(fd);
    gguf_w_str(w, "general.architecture", "test");
    if (model) gguf_w_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_w_str(w, "tokenizer.ggml.pre", pre);
    if (n) gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, n);
    if (types) gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, n);
    if (bad_scores) {
        float sc[2] = { 0, 0 };
        gguf_w_arr_f32(w, "tokenizer.ggml.scores", sc, 2);
    }
    if (gguf_writer_save(w, path, err) == 0 && (f = gguf_open(path, err))) {
        t = nalar_tokenizer_create(f, err);
        gguf_close(f);
    }
    gguf_writer_destroy(w);
    unlink(path);
    return t;
}

static nalar_tokenizer *
make(const char *model, const char *pre, const char **toks, size_t n,
     int bad_scores, nalar_err *err)
{
    return make_typed(model, pre, toks, n, bad_scores, NULL, err);
}


/* Whole encodes with each pre-tokenizer, on a BPE vocabulary from
 * nalar_mkmodel with that tokenizer.ggml.pre: the text's words are those
 * of the pre-tokenizer's regexes (Python's `regex`, as pre_cases), and
 * its ids are those of its words encoded one by one (no merge crosses a
 * word; each word is one word to every pre-tokenizer here). */
static const char encode_text[] =
    "Hello world's 12345 HTTPServer na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87"
    " x=a+b;\n\n  end";
static const struct { const char *pre; int n; size_t ends[32]; } encode_cases[] = {
    { "gpt-2", 15, { 5, 11, 13, 19, 30, 37, 44, 46, 47, 48, 49, 50, 51, 54, 58 } },
    { "llama-bpe", 15, { 5, 11, 13, 14, 17, 19, 30, 37, 44, 46, 48, 50, 53, 54, 58 } },
    { "qwen2", 18, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 30, 37, 44, 46, 48, 50, 53, 54, 58 } },
    { "tekken", 18, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 30, 37, 44, 46, 48, 50, 53, 54, 58 } },
    { "smollm", 20, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 30, 37, 44, 46, 47, 48, 49, 50, 51, 54, 58 } },
    { "starcoder", 20, { 5, 11, 13, 14, 15, 16, 17, 18, 19, 30, 37, 44, 46, 47, 48, 49, 50, 51, 54, 58 } },
    { "deepseek-llm", 22, { 5, 11, 12, 13, 14, 19, 30, 33, 35, 37, 38, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 58 } },
    { "deepseek-coder", 24, { 5, 11, 12, 13, 14, 15, 16, 17, 18, 19, 30, 37, 38, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 58 } },
    { "falcon", 18, { 5, 11, 12, 13, 14, 17, 19, 30, 37, 44, 46, 47, 48, 49, 50, 51, 54, 58 } },
};

static void
test_encode_per_pre(void)
{
    for (size_t c = 0; c < sizeof(encode_cases) / sizeof(encode_cases[0]);
         c++) {
        const char *pre = encode_cases[c].pre;
        nalar_mkmodel_opts o;
        nalar_err err = { { 0 } };
        nalar_tokenizer *t = NULL;
        gguf_file *f;
        char path[] = "/tmp/nalar_pre_XXXXXX";
        int fd = mkstemp(path), n, nw, k = 0, same = 1;
        size_t ends[64], start = 0, len = sizeof(encode_text) - 1;
        int32_t ids[256], want[256];

        if (fd < 0) continue;
        close(fd);
        nalar_mkmodel_defaults(&o);
        o.dim = 32;
        o.n_layers = 1;
        o.n_heads = 2;
        o.n_kv_heads = 1;
        o.ffn_dim = 32;
        o.n_vocab = 1024;
        o.bpe = 1;
        o.pre = pre;
        if (nalar_mkmodel(&o, path, &err) == 0
            && (f = gguf_open(path, &err)) != NULL) {
            t = nalar_tokenizer_create(f, &err);
            gguf_close(f);
        }
        unlink(path);
        if (t == NULL) {
            ok(0, "%s: a vocabulary with this pre-tokenizer loads (%s)", pre,
               err.msg);
            continue;
        }
        nw = nalar_tok_pretokenize(t, encode_text, len, ends, 64);
        ok(nw == encode_cases[c].n
           && memcmp(ends, encode_cases[c].ends, nw * sizeof(size_t)) == 0,
           "%s: %d words, as its regexes cut the text", pre, nw);
        for (int w = 0; w < nw && w < 64; w++) {
            size_t e1[4];
            int m = nalar_tokenize(t, encode_text + start, ends[w] - start,
                                   0, 0, want + k, 256 - k);
            same &= nalar_tok_pretokenize(t, encode_text + start,
                                          ends[w] - start, e1, 4) == 1;
            k += m > 0 ? m : 0;
            start = ends[w];
        }
        n = nalar_tokenize(t, encode_text, len, 0, 0, ids, 256);
        ok(same && n == k && memcmp(ids, want, n * sizeof(int32_t)) == 0,
           "%s: the text encodes as its words one by one (%d ids)", pre, n);
        nalar_tokenizer_destroy(t);
    }
}

/* Gemma-style SentencePiece: add_space_prefix false, byte fallback, and
 * chat markers the file marks user-defined, which are control tokens
 * (llama.cpp does the same for end-of-turn tokens): text never becomes
 * them unasked. */
static void
test_spm_gemma_style(void)
{
    const char *toks[] = { "<unk>", "<s>", "</s>", "<0x21>", "h", "i",
                           "\xE2\x96\x81", "hi", "\xE2\x96\x81hi",
                           "<end_of_turn>", "<start_of_turn>", "<mask>" };
    int32_t types[] = { TOKT_UNKNOWN, TOKT_CONTROL, TOKT_CONTROL, TOKT_BYTE,
                        TOKT_NORMAL, TOKT_NORMAL, TOKT_NORMAL, TOKT_NORMAL,
                        TOKT_NORMAL, TOKT_USER_DEFINED, TOKT_USER_DEFINED,
                        TOKT_USER_DEFINED };
    float sc[12] = { 0, 0, 0, 0, -1, -1, -1, -2, -3, 0, 0, 0 };
    char path[] = "/tmp/nalar_gemma_XXXXXX";
    gguf_writer *w = gguf_writer_create();
    nalar_err err = { { 0 } };
    nalar_tokenizer *t = NULL;
    gguf_file *f;
    int fd = mkstemp(path), n;
    int32_t ids[16];

    if (fd < 0) return;
    close(fd);
    gguf_w_str(w, "general.architecture", "test");
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 12);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", sc, 12);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 12);
    gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", 0);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 1);
    if (gguf_writer_save(w, path, &err) == 0 && (f = gguf_open(path, &err))) {
        t = nalar_tokenizer_create(f, &err);
        gguf_close(f);
    }
    gguf_writer_destroy(w);
    unlink(path);
    ok(t != NULL, "Gemma-style SPM vocabulary loads");
    if (t == NULL) return;
    {
        int32_t want[] = { 1, 7, 3, 8 };
        n = nalar_tokenize(t, "hi! hi", 6, 1, 0, ids, 16);
        ok(n == 4 && memcmp(ids, want, sizeof(want)) == 0,
           "no space prefix: 'hi! hi' -> BOS hi <0x21> ▁hi");
    }
    ok(nalar_tok_is_control(t, 9) && nalar_tok_is_eog(t, 9),
       "<end_of_turn> marked user-defined is a control, end-of-turn token");
    ok(nalar_tok_is_control(t, 10) && !nalar_tok_is_eog(t, 10),
       "<start_of_turn> marked user-defined is a control token");
    n = nalar_tokenize(t, "<mask>", 6, 0, 0, ids, 16);
    ok(!nalar_tok_is_control(t, 11) && n == 1 && ids[0] == 11,
       "another user-defined token stays one, parsed in any text");
    n = nalar_tokenize(t, "<end_of_turn>", 13, 0, 0, ids, 16);
    ok(n > 1 && ids[0] != 9, "text '<end_of_turn>' stays text (%d ids)", n);
    n = nalar_tokenize(t, "<end_of_turn>", 13, 0, 1, ids, 16);
    ok(n == 1 && ids[0] == 9, "and is the token when parsed as markup");
    nalar_tokenizer_destroy(t);
}

static void
test_pretokenizers(void)
{
    const char *toks[] = { "a", "b" };
    nalar_err err = { { 0 } };
    nalar_tokenizer *t;
    int bad = 0;

    for (size_t c = 0; c < sizeof(pre_cases) / sizeof(pre_cases[0]); c++) {
        size_t ends[128];
        int n;
        t = make("gpt2", pre_cases[c].pre, toks, 2, 0, &err);
        if (t == NULL) {
            ok(0, "%s tokenizer: %s", pre_cases[c].pre, err.msg);
            return;
        }
        n = nalar_tok_pretokenize(t, pre_cases[c].text,
                                  strlen(pre_cases[c].text), ends, 128);
        if (n != pre_cases[c].n ||
            memcmp(ends, pre_cases[c].ends, n * sizeof(size_t)) != 0) {
            bad++;
            ok(0, "%s pre-tokenizer on '%s'", pre_cases[c].pre,
               pre_cases[c].text);
            printf("#   want:");
            for (int i = 0; i < pre_cases[c].n; i++)
                printf(" %zu", pre_cases[c].ends[i]);
            printf("\n#   got: ");
            for (int i = 0; i < n && i < 128; i++) printf(" %zu", ends[i]);
            printf("\n");
        }
        nalar_tokenizer_destroy(t);
    }
    ok(bad == 0, "every pre-tokenizer cuts %zu texts as "
       "the real regexes do", sizeof(pre_cases) / sizeof(pre_cases[0]));

    /* files the tokenizer must refuse, saying why */
    t = make(NULL, NULL, toks, 2, 0, &err);
    ok(t == NULL && strstr(err.msg, "tokenizer.ggml.model"),
       "no model: refused (%s)", err.msg);
    t = make("bert", NULL, toks, 2, 0, &err);
    ok(t == NULL && strstr(err.msg, "bert"), "unknown model: refused (%s)",
       err.msg);
    t = make("gpt2", "nonesuch", toks, 2, 0, &err);
    ok(t == NULL && strstr(err.msg, "nonesuch")
       && strstr(err.msg, "supported: ") && strstr(err.msg, "llama-bpe")
       && strstr(err.msg, "deepseek-coder") && strstr(err.msg, "tekken"),
       "unknown pre-tokenizer: refused, listing the supported ones (%s)",
       err.msg);
    t = make("llama", NULL, toks, 0, 0, &err);
    ok(t == NULL && strstr(err.msg, "tokenizer.ggml.tokens"),
       "no tokens: refused (%s)", err.msg);
    {
        const char *three[] = { "a", "b", "c" };
        t = make("llama", NULL, three, 3, 1, &err);
        ok(t == NULL && strstr(err.msg, "scores"),
           "scores of the wrong length: refused (%s)", err.msg);
    }
    /* SPM without byte tokens: a character that is not a piece becomes
       the unknown id (llama.cpp's defaults: unk 0, bos 1, eos 2) */
    {
        const char *few[] = { "\xE2\x96\x81", "a", ("\xE2\x96\x81" "a") };
        int32_t ids[16], want[] = { 1, 2, 0, 0, 1 };
        int n;
        t = make("llama", NULL, few, 3, 0, &err);
        ok(t != NULL, "tiny SPM vocab loads");
        if (t) {
            n = nalar_tokenize(t, "a xa", 4, 1, 0, ids, 16);
            ok(n == 5 && memcmp(ids, want, sizeof(want)) == 0,
               "tiny SPM vocab: 'a xa' -> BOS ▁a ▁ unk(x) a");
            nalar_tokenizer_destroy(t);
        }
    }
    /* user-defined tokens split the text even without parse_special;
       control tokens only with it (llama.cpp's tokenizer_st_partition) */
    {
        const char *v[] = { "\xE2\x96\x81", "a", "<ctl>", "<usr>", "<",
                            ">", "c", "t", "l", "u", "s", "r" };
        int32_t ty[] = { 1, 1, TOKT_CONTROL, TOKT_USER_DEFINED, 1, 1, 1, 1,
                         1, 1, 1, 1 };
        int32_t ids[32];
        int n, has_ctl = 0, has_usr = 0;
        t = make_typed("llama", NULL, v, 12, 0, ty, &err);
        ok(t != NULL, "SPM vocab with control and user-defined tokens");
        if (t) {
            n = nalar_tokenize(t, "a<usr>a<ctl>", 12, 0, 0, ids, 32);
            for (int i = 0; i < n && i < 32; i++) {
                has_ctl |= ids[i] == 2;
                has_usr |= ids[i] == 3;
            }
            ok(has_usr && !has_ctl, "parse_special off: <usr> splits, <ctl> "
               "does not");
            n = nalar_tokenize(t, "a<usr>a<ctl>", 12, 0, 1, ids, 32);
            ok(n == 6 && ids[0] == 0 && ids[1] == 1 && ids[2] == 3 &&
               ids[3] == 0 && ids[4] == 1 && ids[5] == 2,
               "parse_special on: ▁ a <usr> ▁ a <ctl> (%d ids)", n);
            {
                char b[16];
                ok(nalar_token_bytes(t, 3, b, 16) == 5 &&
                   memcmp(b, "<usr>", 5) == 0 &&
                   nalar_token_bytes(t, 2, b, 16) == 0,
                   "user-defined decodes verbatim, control to nothing");
            }
            nalar_tokenizer_destroy(t);
        }
    }
}

/* The largest vocabulary here (50k tokens, 50k merges) builds whole; how
 * long it takes is printed, not asserted (bench/ measures speed). */
static void
test_large_vocab(void)
{
    double ms = 0;
    nalar_tokenizer *t = load(VOCAB_DIR "ggml-vocab-gpt-2.gguf", &ms);
    ok(t != NULL, "gpt2 vocab loads (%.1f ms)", ms);
    if (t != NULL) {
        is_int(nalar_tok_n_vocab(t), 50257, "gpt2: 50257 tokens");
    }
    nalar_tokenizer_destroy(t);
}

/* nalar_tokenize_bounded: pieces, the special flag per piece, the bound */
static void
test_bounded(const nalar_tokenizer *t, const char *name)
{
    static const char text[] = "Hello world, it's a <s>test</s> of "
                               "pieces:  tabs\tand\nnewlines  here ";
    size_t   len = sizeof(text) - 1, n_big = 8 << 20;
    int32_t  whole[256], *ids;
    int      n, k, more, cuts = 0, bad = 0;
    char    *big;
    nalar_tok_text pc[3];

    /* one literal piece: nalar_tokenize's ids */
    n = nalar_tokenize(t, text, len, 1, 0, whole, 256);
    pc[0] = (nalar_tok_text) { text, len, 0 };
    k = nalar_tokenize_bounded(t, pc, 1, 1, 256, &ids, &more);
    ok(k == n && !more && memcmp(ids, whole, n * sizeof(int32_t)) == 0,
       "%s: one piece = nalar_tokenize (%d ids)", name, k);
    free(ids);

    /* literal text cut into three pieces anywhere: the same ids */
    for (size_t a = 0; a <= len; a += 3) {
        for (size_t b = a; b <= len; b += 7) {
            pc[0] = (nalar_tok_text) { text, a, 0 };
            pc[1] = (nalar_tok_text) { text + a, b - a, 0 };
            pc[2] = (nalar_tok_text) { text + b, len - b, 0 };
            k = nalar_tokenize_bounded(t, pc, 3, 1, 256, &ids, &more);
            bad += k != n || more
                   || memcmp(ids, whole, n * sizeof(int32_t)) != 0;
            cuts++;
            free(ids);
        }
    }
    ok(bad == 0, "%s: literal text in 3 pieces, %d cuts: the same ids "
       "(%d differ)", name, cuts, bad);

    /* special per piece: BOS written in markup is BOS, in content text */
    {
        const char *bos = nalar_tok_piece(t, nalar_tok_bos(t));

        pc[0] = (nalar_tok_text) { bos, strlen(bos), 1 };
        pc[1] = (nalar_tok_text) { bos, strlen(bos), 0 };
    }
    k = nalar_tokenize_bounded(t, pc, 2, 0, 256, &ids, &more);
    n = 0;
    for (int i = 0; i < k; i++) {
        n += ids[i] == nalar_tok_bos(t);
    }
    ok(k > 0 && ids[0] == nalar_tok_bos(t) && n == 1,
       "%s: BOS in markup is BOS, in content it is text", name);
    free(ids);

    /* the bound: at most max_ids ids, their first ones */
    pc[0] = (nalar_tok_text) { text, len, 0 };
    n = nalar_tokenize(t, text, len, 1, 0, whole, 256);
    k = nalar_tokenize_bounded(t, pc, 1, 1, 5, &ids, &more);
    ok(k == 5 && more && memcmp(ids, whole, 4 * sizeof(int32_t)) == 0,
       "%s: max_ids 5 of %d: 5 ids, more", name, n);
    free(ids);
    k = nalar_tokenize_bounded(t, pc, 1, 1, n, &ids, &more);
    ok(k == n && !more, "%s: max_ids = the count: all, no more", name);
    free(ids);

    /* 8 MB: stops at the bound, having read a bounded prefix */
    big = malloc(n_big);
    if (big == NULL) return;
    for (size_t i = 0; i < n_big; i++) big[i] = "In the beginning "[i % 17];
    pc[0] = (nalar_tok_text) { big, n_big, 0 };
    pc[1] = (nalar_tok_text) { big, 100, 1 };
    k = nalar_tokenize_bounded(t, pc, 2, 1, 512, &ids, &more);
    ok(k == 512 && more, "%s: 8 MB of text, max_ids 512: 512 ids and more",
       name);
    free(ids);
    free(big);

    ok(nalar_tokenize_bounded(t, NULL, 0, 0, 16, &ids, &more) == 0
       && ids == NULL && !more, "%s: no pieces, no BOS: no ids", name);
}

int
main(void)
{
    nalar_tokenizer *spm, *bpe;

    test_vectors("ggml-vocab-llama-spm.gguf");
    test_vectors("ggml-vocab-gpt-2.gguf");
    test_demo();
    test_large_vocab();
    test_pretokenizers();
    test_encode_per_pre();
    test_spm_gemma_style();

    spm = load(VOCAB_DIR "ggml-vocab-llama-spm.gguf", NULL);
    bpe = load(VOCAB_DIR "ggml-vocab-gpt-2.gguf", NULL);
    if (spm && bpe) {
        nalar_tokenizer *demo = load(DEMO, NULL);
        test_roundtrip(spm, "llama-spm");
        test_roundtrip(bpe, "gpt2");
        if (demo) test_roundtrip(demo, "demo");
        test_streaming(spm, "llama-spm");
        test_streaming(bpe, "gpt2");
        if (demo) test_streaming(demo, "demo");
        test_special(spm, bpe);
        test_bounded(spm, "llama-spm");
        test_bounded(bpe, "gpt2");
        if (demo) test_bounded(demo, "demo");
        test_hostile(spm, "llama-spm");
        test_hostile(bpe, "gpt2");
        nalar_tokenizer_destroy(demo);
    } else {
        ok(0, "vocabularies in " VOCAB_DIR " load");
    }
    nalar_tokenizer_destroy(spm);
    nalar_tokenizer_destroy(bpe);
    return done_testing();
}
