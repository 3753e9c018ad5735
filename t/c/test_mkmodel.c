/*
 * nalar_mkmodel: shapes, metadata, weight statistics, type conversions
 * against the F32 model of the same seed, determinism, both synthetic
 * vocabularies (checked structurally and through the real tokenizer),
 * copying a vocabulary from another file, the chat template key, and
 * refused options.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_backend.h"
#include "cpu_quant.h"
#include "fp16.h"
#include "gguf.h"
#include "model.h"
#include "mkmodel.h"
#include "model.h"
#include "tap.h"
#include "tokenizer.h"

#define VOCAB_SPM "t/data/vocab/ggml-vocab-llama-spm.gguf"
#define KJV       "models/nalar-kjv-target-f32.gguf"

static char tmpdir[256];


static const char *
tmp(const char *name)
{
    static char path[4][320];
    static int  k;

    k = (k + 1) % 4;
    snprintf(path[k], sizeof(path[k]), "%s/%s", tmpdir, name);
    return path[k];
}


static int
has(const char *hay, const char *needle)
{
    return strstr(hay, needle) != NULL;
}


static int
str_is(gguf_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}


/* Element i of a tensor as float (any type written by mkmodel). */
static float
elem(const gguf_tensor *t, uint64_t i)
{
    const uint8_t *p = t->data;
    uint16_t       h;
    float          f;

    switch (t->type) {
    case GGML_F32:
        memcpy(&f, p + 4 * i, 4);
        return f;
    case GGML_F16:
        memcpy(&h, p + 2 * i, 2);
        return nalar_f16_to_f32(h);
    case GGML_BF16:
        memcpy(&h, p + 2 * i, 2);
        return nalar_bf16_to_f32(h);
    case GGML_Q8_0: {
        const uint8_t *b = p + (i / 32) * 34;
        int8_t         q;
        memcpy(&h, b, 2);
        memcpy(&q, b + 2 + i % 32, 1);
        return nalar_f16_to_f32(h) * q;
    }
    case GGML_Q4_0: {
        const uint8_t *b = p + (i / 32) * 18;
        int            j = (int) (i % 32);
        int            q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        memcpy(&h, b, 2);
        return nalar_f16_to_f32(h) * (float) (q - 8);
    }
    default:
        return NAN;
    }
}


static uint64_t
n_elems(const gguf_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}


static nalar_mkmodel_opts
small_opts(ggml_type type)
{
    nalar_mkmodel_opts o;

    nalar_mkmodel_defaults(&o);
    o.dim = 64;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.ffn_dim = 96;
    o.n_vocab = 300;
    o.n_ctx = 256;
    o.seed = 7;
    o.type = type;
    return o;
}


static gguf_file *
make(const nalar_mkmodel_opts *o, const char *name)
{
    nalar_err  err;
    gguf_file *f;

    if (nalar_mkmodel(o, tmp(name), &err) != 0) {
        ok(0, "mkmodel %s: %s", name, err.msg);
        return NULL;
    }
    f = gguf_open(tmp(name), &err);
    ok(f != NULL, "%s written and reopened", name);
    if (f == NULL) {
        diag("%s", err.msg);
    }
    return f;
}


static void
test_defaults(void)
{
    nalar_mkmodel_opts o;

    memset(&o, 0x5a, sizeof(o));
    nalar_mkmodel_defaults(&o);
    ok(o.dim == 128 && o.n_layers == 2 && o.n_heads == 4 && o.n_kv_heads == 2
       && o.ffn_dim == 384 && o.n_vocab == 2048 && o.n_ctx == 512
       && o.type == GGML_F32 && o.seed == 1 && o.bpe == 0
       && o.vocab_from == NULL && o.chat_template == NULL
       && o.rope_base == 10000.0f,
       "defaults: 128/2/4/2/384, vocab 2048, ctx 512, F32, seed 1, SPM");
}


/* Metadata and shapes of the small F32 model; weight statistics. */
static void
test_f32(gguf_file *f)
{
    static const struct { const char *name; uint64_t ne0, ne1; } shapes[] = {
        { "token_embd.weight", 64, 300 },
        { "output.weight", 64, 300 },
        { "output_norm.weight", 64, 1 },
        { "blk.0.attn_norm.weight", 64, 1 },
        { "blk.1.attn_q.weight", 64, 64 },
        { "blk.1.attn_k.weight", 64, 32 },
        { "blk.1.attn_v.weight", 64, 32 },
        { "blk.0.attn_output.weight", 64, 64 },
        { "blk.0.ffn_norm.weight", 64, 1 },
        { "blk.1.ffn_gate.weight", 64, 96 },
        { "blk.1.ffn_up.weight", 64, 96 },
        { "blk.1.ffn_down.weight", 96, 64 },
    };
    char              *s;
    const gguf_tensor *t;
    int                shapes_ok = 1, norms_ok = 1;

    s = gguf_get_str(f, "general.architecture");
    ok(s && strcmp(s, "llama") == 0, "general.architecture = llama");
    free(s);
    s = gguf_get_str(f, "general.name");
    ok(s && s[0] != '\0', "general.name set (%s)", s ? s : "");
    free(s);
    is_int(gguf_get_int(f, "general.alignment", 0), 32, "general.alignment");
    is_int(gguf_get_int(f, "general.file_type", -1), 0, "file_type 0 (F32)");
    is_int(gguf_get_int(f, "llama.context_length", 0), 256, "context_length");
    is_int(gguf_get_int(f, "llama.embedding_length", 0), 64,
           "embedding_length");
    is_int(gguf_get_int(f, "llama.block_count", 0), 2, "block_count");
    is_int(gguf_get_int(f, "llama.feed_forward_length", 0), 96,
           "feed_forward_length");
    is_int(gguf_get_int(f, "llama.attention.head_count", 0), 4, "head_count");
    is_int(gguf_get_int(f, "llama.attention.head_count_kv", 0), 2,
           "head_count_kv");
    is_int(gguf_get_int(f, "llama.rope.dimension_count", 0), 16,
           "rope.dimension_count = head_dim");
    ok(gguf_get_float(f, "llama.rope.freq_base", 0) == 10000.0,
       "rope.freq_base 10000");
    ok(fabs(gguf_get_float(f, "llama.attention.layer_norm_rms_epsilon", 0)
            - 1e-5) < 1e-10, "rms epsilon 1e-5");
    is_int(f->n_tensors, 3 + 2 * 9, "21 tensors");

    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        t = gguf_tensor_find(f, shapes[i].name);
        if (t == NULL || t->ne[0] != shapes[i].ne0 || t->ne[1] != shapes[i].ne1
            || (shapes[i].ne1 == 1) != (t->n_dims == 1))
        {
            diag("bad shape for %s", shapes[i].name);
            shapes_ok = 0;
        }
    }
    ok(shapes_ok, "tensor shapes as llama.cpp names them");

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        t = &f->tensors[i];
        if (t->n_dims == 1) {
            for (uint64_t j = 0; j < t->ne[0]; j++) {
                norms_ok &= t->type == GGML_F32 && elem(t, j) == 1.0f;
            }
        }
    }
    ok(norms_ok, "norm vectors are F32 ones");

    /* uniform in +-1/sqrt(cols): bounded, mean ~0, std ~ bound / sqrt(3) */
    t = gguf_tensor_find(f, "blk.0.ffn_down.weight");
    if (t != NULL) {
        double bound = 1.0 / sqrt(96.0), sum = 0, sq = 0, mx = 0;
        uint64_t n = n_elems(t);
        for (uint64_t j = 0; j < n; j++) {
            double x = elem(t, j);
            sum += x;
            sq += x * x;
            mx = fmax(mx, fabs(x));
        }
        ok(mx <= bound && mx > 0.95 * bound,
           "ffn_down weights within 1/sqrt(96) (max %.4f, bound %.4f)", mx,
           bound);
        ok(fabs(sum / n) < 0.05 * bound, "mean ~ 0 (%.5f)", sum / n);
        ok(fabs(sqrt(sq / n) / (bound / sqrt(3.0)) - 1.0) < 0.05,
           "std ~ bound/sqrt(3) (%.5f vs %.5f)", sqrt(sq / n),
           bound / sqrt(3.0));
    }
}


/* Every matrix of `g` decodes to the F32 model's values within `tol`. */
static void
compare_types(gguf_file *f32, gguf_file *g, ggml_type type, int ftype)
{
    double worst = 0;    /* error / allowed */
    int    types_ok = 1;

    is_int(gguf_get_int(g, "general.file_type", -1), ftype,
           "%s: general.file_type %d", ggml_type_name(type), ftype);
    is_int(g->n_tensors, f32->n_tensors, "%s: same tensor count",
           ggml_type_name(type));
    for (uint64_t i = 0; i < g->n_tensors && i < f32->n_tensors; i++) {
        const gguf_tensor *a = &f32->tensors[i], *b = &g->tensors[i];
        uint64_t           n = n_elems(a);

        types_ok &= a->name.len == b->name.len && n == n_elems(b)
                    && b->type == (b->n_dims == 1 ? GGML_F32 : type);
        if (!types_ok) {
            break;
        }
        for (uint64_t blk = 0; blk < n; blk += 32) {
            double amax = 0;
            for (uint64_t j = blk; j < blk + 32 && j < n; j++) {
                amax = fmax(amax, fabs(elem(a, j)));
            }
            for (uint64_t j = blk; j < blk + 32 && j < n; j++) {
                double x = elem(a, j), y = elem(b, j), allowed;
                switch (type) {
                case GGML_F16:  allowed = fabs(x) / 2048 + 6e-8; break;
                case GGML_BF16: allowed = fabs(x) / 256; break;
                /* half a step, plus the f16 rounding of the scale */
                case GGML_Q8_0: allowed = 0.57 * amax / 127 + 1e-9; break;
                /* the code 16 side is clamped to 15: up to a whole step */
                case GGML_Q4_0: allowed = 1.01 * amax / 8 + 1e-9; break;
                default:        allowed = 0; break;
                }
                worst = fmax(worst, fabs(x - y) / allowed);
            }
        }
    }
    ok(types_ok, "%s: matrices %s, norms F32, shapes equal",
       ggml_type_name(type), ggml_type_name(type));
    ok(worst <= 1.0 && worst > 0.0,
       "%s values match F32 of the same seed within tolerance (worst "
       "%.3f of allowed)", ggml_type_name(type), worst);
}


static void
test_types(gguf_file *f32)
{
    static const struct { ggml_type t; int ftype; const char *name; } ty[] = {
        { GGML_F16, 1, "m-f16.gguf" }, { GGML_BF16, 32, "m-bf16.gguf" },
        { GGML_Q8_0, 7, "m-q8.gguf" }, { GGML_Q4_0, 2, "m-q4.gguf" },
    };

    for (size_t i = 0; i < sizeof(ty) / sizeof(ty[0]); i++) {
        nalar_mkmodel_opts o = small_opts(ty[i].t);
        gguf_file         *g = make(&o, ty[i].name);

        if (g != NULL) {
            compare_types(f32, g, ty[i].t, ty[i].ftype);
            if (ty[i].t == GGML_F16) {
                /* exactly the F32 values rounded to nearest-even f16 */
                const gguf_tensor *a = gguf_tensor_find(f32, "output.weight");
                const gguf_tensor *b = gguf_tensor_find(g, "output.weight");
                int exact = a && b;
                for (uint64_t j = 0; exact && j < n_elems(a); j++) {
                    uint16_t h;
                    memcpy(&h, (const uint8_t *) b->data + 2 * j, 2);
                    exact = h == nalar_f32_to_f16(elem(a, j));
                }
                ok(exact, "F16 output.weight = f32_to_f16(F32 output.weight)");
            }
            gguf_close(g);
        }
        unlink(tmp(ty[i].name));
    }
}


static int
files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int   ca, cb, eq = fa && fb;

    while (eq) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        eq = ca == cb;
        if (ca == EOF) {
            break;
        }
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}


static void
test_determinism(void)
{
    nalar_mkmodel_opts o = small_opts(GGML_Q8_0);
    nalar_err          err;

    ok(nalar_mkmodel(&o, tmp("d1.gguf"), &err) == 0
       && nalar_mkmodel(&o, tmp("d2.gguf"), &err) == 0, "two Q8_0 writes");
    ok(files_equal(tmp("d1.gguf"), tmp("d2.gguf")),
       "same seed: byte-identical files");
    o.seed = 8;
    ok(nalar_mkmodel(&o, tmp("d2.gguf"), &err) == 0
       && !files_equal(tmp("d1.gguf"), tmp("d2.gguf")),
       "another seed: different file");
    unlink(tmp("d1.gguf"));
    unlink(tmp("d2.gguf"));
}


/* 0 if all n strings are distinct */
static int
cmp_str(const void *a, const void *b)
{
    const gguf_str *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int    c = memcmp(x->ptr, y->ptr, n);

    return c ? c : (x->len > y->len) - (x->len < y->len);
}


static int
all_unique(const gguf_kv *kv)
{
    gguf_str *c = malloc(kv->arr_len * sizeof(gguf_str));
    int       uniq = 1;

    memcpy(c, kv->arr_strs, kv->arr_len * sizeof(gguf_str));
    qsort(c, kv->arr_len, sizeof(gguf_str), cmp_str);
    for (uint64_t i = 1; i < kv->arr_len; i++) {
        if (cmp_str(&c[i - 1], &c[i]) == 0) {
            uniq = 0;
        }
    }
    free(c);
    return uniq;
}


static void
roundtrip_text(gguf_file *f, const char *label, const char *text,
               int expect_n)
{
    nalar_err        err;
    nalar_tokenizer *tok = nalar_tokenizer_create(f, &err);
    int32_t          ids[256];
    int              n;
    char            *back;

    ok(tok != NULL, "%s: the tokenizer accepts the vocabulary", label);
    if (tok == NULL) {
        diag("%s", err.msg);
        return;
    }
    n = nalar_tokenize(tok, text, strlen(text), 0, 0, ids, 256);
    back = n > 0 ? nalar_detokenize(tok, ids, n) : NULL;
    ok(back && strcmp(back, text) == 0, "%s: \"%s\" encodes (%d ids) and "
       "decodes back", label, text, n);
    if (expect_n > 0) {
        is_int(n, expect_n, "%s: common words are single tokens", label);
    }
    free(back);
    nalar_tokenizer_destroy(tok);
}


static void
test_spm(void)
{
    nalar_mkmodel_opts o = small_opts(GGML_F32);
    gguf_file         *f;
    const gguf_kv     *tk, *sc, *ty;
    char               want[8], *s;
    int                bytes_ok = 1, dec = 1, normal = 1;
    clock_t            c0;
    double             secs;

    o.dim = 32; o.n_heads = 2; o.n_kv_heads = 1; o.ffn_dim = 32;
    o.n_layers = 1; o.n_vocab = 2048;
    f = make(&o, "spm.gguf");
    if (f == NULL) {
        return;
    }
    s = gguf_get_str(f, "tokenizer.ggml.model");
    ok(s && strcmp(s, "llama") == 0, "SPM: tokenizer.ggml.model = llama");
    free(s);
    tk = gguf_find(f, "tokenizer.ggml.tokens");
    sc = gguf_find(f, "tokenizer.ggml.scores");
    ty = gguf_find(f, "tokenizer.ggml.token_type");
    ok(tk && sc && ty && tk->arr_len == 2048 && sc->arr_len == 2048
       && ty->arr_len == 2048 && ty->arr_type == GGUF_T_INT32
       && sc->arr_type == GGUF_T_FLOAT32, "SPM: 2048 tokens, scores, types");
    if (!(tk && sc && ty && tk->arr_len == 2048)) {
        gguf_close(f);
        return;
    }
    ok(str_is(tk->arr_strs[0], "<unk>") && str_is(tk->arr_strs[1], "<s>")
       && str_is(tk->arr_strs[2], "</s>") && gguf_arr_int(ty, 0) == 2
       && gguf_arr_int(ty, 1) == 3 && gguf_arr_int(ty, 2) == 3,
       "SPM: <unk> (unknown), <s> </s> (control)");
    for (int b = 0; b < 256; b++) {
        snprintf(want, sizeof(want), "<0x%02X>", b);
        bytes_ok &= str_is(tk->arr_strs[3 + b], want)
                    && gguf_arr_int(ty, 3 + b) == 6;
    }
    ok(bytes_ok, "SPM: ids 3..258 are byte tokens <0x00>..<0xFF>");
    ok(str_is(tk->arr_strs[259], "\xe2\x96\x81")
       && str_is(tk->arr_strs[260], "!"), "SPM: then \"\xe2\x96\x81\", \"!\"");
    for (uint64_t i = 260; i < tk->arr_len; i++) {
        dec &= gguf_arr_float(sc, i) < gguf_arr_float(sc, i - 1);
        normal &= gguf_arr_int(ty, i) == 1;
    }
    ok(dec && normal, "SPM: normal pieces with strictly decreasing scores");
    ok(all_unique(tk), "SPM: every token is unique");
    {
        int found = 0;
        for (uint64_t i = 0; i < tk->arr_len; i++) {
            found |= str_is(tk->arr_strs[i], "\xe2\x96\x81the");
        }
        ok(found, "SPM: has \"\xe2\x96\x81the\"");
    }
    is_int(gguf_get_int(f, "tokenizer.ggml.bos_token_id", -1), 1, "bos 1");
    is_int(gguf_get_int(f, "tokenizer.ggml.eos_token_id", -1), 2, "eos 2");
    is_int(gguf_get_int(f, "tokenizer.ggml.unknown_token_id", -1), 0,
           "unk 0");
    is_int(gguf_get_int(f, "tokenizer.ggml.add_bos_token", -1), 1,
           "add_bos true");
    roundtrip_text(f, "SPM", "The quick brown fox, 42 times: \xc3\xa9t\xc3\xa9!",
                   0);
    gguf_close(f);
    unlink(tmp("spm.gguf"));

    /* a Llama-2-sized vocabulary is quick and still unique */
    o.n_vocab = 32000;
    c0 = clock();
    f = make(&o, "spm32k.gguf");
    secs = (double) (clock() - c0) / CLOCKS_PER_SEC;
    ok(secs < 2.0, "SPM 32000 tokens written in %.2f s (ASan build)", secs);
    if (f != NULL) {
        tk = gguf_find(f, "tokenizer.ggml.tokens");
        ok(tk && tk->arr_len == 32000 && all_unique(tk),
           "SPM 32000: all unique");
        gguf_close(f);
    }
    unlink(tmp("spm32k.gguf"));
}


/* UTF-8 length of the first character */
static int
utf8_chars(gguf_str s)
{
    int n = 0;

    for (uint64_t i = 0; i < s.len; i++) {
        n += ((uint8_t) s.ptr[i] & 0xc0) != 0x80;
    }
    return n;
}


static void
test_bpe(int n_vocab)
{
    nalar_mkmodel_opts o = small_opts(GGML_F16);
    gguf_file         *f;
    const gguf_kv     *tk, *mg, *ty;
    char              *s, *p;
    int                first_ok = 1, merges_ok = 1, made_ok = 1;
    uint8_t           *made;
    int32_t            eot = n_vocab - 1;

    o.dim = 32; o.n_heads = 2; o.n_kv_heads = 1; o.ffn_dim = 32;
    o.n_layers = 1; o.n_vocab = n_vocab; o.bpe = 1;
    f = make(&o, "bpe.gguf");
    if (f == NULL) {
        return;
    }
    s = gguf_get_str(f, "tokenizer.ggml.model");
    p = gguf_get_str(f, "tokenizer.ggml.pre");
    ok(s && p && strcmp(s, "gpt2") == 0 && strcmp(p, "gpt2") == 0,
       "BPE %d: model gpt2, pre gpt2", n_vocab);
    free(s);
    free(p);
    tk = gguf_find(f, "tokenizer.ggml.tokens");
    mg = gguf_find(f, "tokenizer.ggml.merges");
    ty = gguf_find(f, "tokenizer.ggml.token_type");
    ok(tk && mg && ty && tk->arr_len == (uint64_t) n_vocab
       && mg->arr_type == GGUF_T_STRING && mg->arr_len > 0,
       "BPE %d: tokens, merges (%llu), token_type", n_vocab,
       mg ? (unsigned long long) mg->arr_len : 0ull);
    if (!(tk && mg && ty && tk->arr_len == (uint64_t) n_vocab)) {
        gguf_close(f);
        return;
    }
    ok(all_unique(tk), "BPE %d: every token unique", n_vocab);
    for (int i = 0; i < 256; i++) {
        first_ok &= utf8_chars(tk->arr_strs[i]) == 1;
    }
    ok(first_ok && str_is(tk->arr_strs[0], "!")
       && str_is(tk->arr_strs[220], "\xc4\xa0")
       && str_is(tk->arr_strs[255], "\xc5\x83"),
       "BPE %d: first 256 are the byte-level characters in GPT-2 order",
       n_vocab);
    ok(str_is(tk->arr_strs[eot], "<|endoftext|>")
       && gguf_arr_int(ty, eot) == 3
       && gguf_get_int(f, "tokenizer.ggml.bos_token_id", -1) == eot
       && gguf_get_int(f, "tokenizer.ggml.eos_token_id", -1) == eot,
       "BPE %d: <|endoftext|> last, control, bos = eos", n_vocab);

    /* every merge joins two tokens into a token; every merged token is
     * made by some merge whose parts come earlier */
    made = calloc((size_t) n_vocab, 1);
    for (uint64_t m = 0; m < mg->arr_len && merges_ok; m++) {
        gguf_str ms = mg->arr_strs[m];
        const char *sp = memchr(ms.ptr, ' ', ms.len);
        int64_t ia = -1, ib = -1, ic = -1;
        gguf_str a, b;

        if (sp == NULL) {
            merges_ok = 0;
            break;
        }
        a.ptr = ms.ptr;
        a.len = (uint64_t) (sp - ms.ptr);
        b.ptr = sp + 1;
        b.len = ms.len - a.len - 1;
        for (uint64_t i = 0; i < tk->arr_len; i++) {
            gguf_str t = tk->arr_strs[i];
            if (cmp_str(&t, &a) == 0) ia = (int64_t) i;
            if (cmp_str(&t, &b) == 0) ib = (int64_t) i;
            if (t.len == a.len + b.len && memcmp(t.ptr, a.ptr, a.len) == 0
                && memcmp(t.ptr + a.len, b.ptr, b.len) == 0)
            {
                ic = (int64_t) i;
            }
        }
        merges_ok = ia >= 0 && ib >= 0 && ic >= 0 && ia < ic && ib < ic;
        if (!merges_ok) {
            diag("bad merge %llu: %.*s", (unsigned long long) m,
                 (int) ms.len, ms.ptr);
        } else {
            made[ic] = 1;
        }
    }
    ok(merges_ok, "BPE %d: each merge \"a b\" joins earlier tokens into a "
       "token", n_vocab);
    for (int i = 256; i < eot; i++) {
        made_ok &= made[i];
    }
    ok(made_ok, "BPE %d: every merged token is reachable by a merge",
       n_vocab);
    free(made);
    roundtrip_text(f, "BPE", " the world is a great place that people find",
                   n_vocab >= 2048 ? 9 : 0);
    gguf_close(f);
    unlink(tmp("bpe.gguf"));
}


static void
test_vocab_from(void)
{
    nalar_mkmodel_opts o = small_opts(GGML_F32);
    nalar_err          err;
    gguf_file         *src, *f;
    const gguf_kv     *a, *b;
    const gguf_tensor *t;
    int                same = 1, n_tok_keys = 0, n_copied = 0;
    const char        *from = access(VOCAB_SPM, R_OK) == 0 ? VOCAB_SPM : KJV;

    o.vocab_from = from;
    o.n_vocab = 5;   /* ignored */
    f = make(&o, "from.gguf");
    src = gguf_open(from, &err);
    if (f == NULL || src == NULL) {
        ok(0, "vocab_from %s", from);
        gguf_close(f);
        gguf_close(src);
        return;
    }
    a = gguf_find(src, "tokenizer.ggml.tokens");
    b = gguf_find(f, "tokenizer.ggml.tokens");
    ok(a && b && a->arr_len == b->arr_len, "vocab_from %s: %llu tokens",
       from, b ? (unsigned long long) b->arr_len : 0ull);
    for (uint64_t i = 0; a && b && i < a->arr_len && i < b->arr_len; i++) {
        same &= cmp_str(&a->arr_strs[i], &b->arr_strs[i]) == 0;
    }
    ok(same, "vocab_from: tokens identical");
    for (uint64_t i = 0; i < src->n_kv; i++) {
        if (src->kv[i].key.len > 10
            && memcmp(src->kv[i].key.ptr, "tokenizer.", 10) == 0)
        {
            char key[128];
            n_tok_keys++;
            snprintf(key, sizeof(key), "%.*s", (int) src->kv[i].key.len,
                     src->kv[i].key.ptr);
            if (gguf_find(f, key) != NULL
                && gguf_find(f, key)->type == src->kv[i].type)
            {
                n_copied++;
            }
        }
    }
    ok(n_tok_keys > 5 && n_copied == n_tok_keys,
       "vocab_from: all %d tokenizer.* keys copied", n_tok_keys);
    is_int(gguf_get_int(f, "llama.vocab_size", 0), (int64_t) a->arr_len,
           "vocab_from: llama.vocab_size from the source");
    t = gguf_tensor_find(f, "token_embd.weight");
    ok(t && t->ne[1] == a->arr_len && gguf_tensor_find(f, "output.weight")
       ->ne[1] == a->arr_len, "vocab_from: embedding and output sized to it");
    gguf_close(src);
    gguf_close(f);
    unlink(tmp("from.gguf"));

    o.vocab_from = "/nonexistent/vocab.gguf";
    ok(nalar_mkmodel(&o, tmp("x.gguf"), &err) != 0
       && has(err.msg, "/nonexistent/vocab.gguf")
       && has(err.msg, tmp("x.gguf")), "vocab_from a missing file: %s",
       err.msg);
    ok(access(tmp("x.gguf"), F_OK) != 0, "nothing written on failure");
}


/*
 * tokenizer.chat_template: written as a string, byte for byte; absent
 * without the option; copied along with vocab_from, and replaced (not
 * duplicated, which would make the file unwritable) when both are given.
 */
static void
test_chat_template(void)
{
    static const char llama3[] =
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>"
        "\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
        "<|end_header_id|>\n\n' }}{% endif %}";
    static const char zephyr[] =
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' "
        "+ message['content'] + eos_token + '\n' }}{% endfor %}";
    nalar_mkmodel_opts o = small_opts(GGML_F32);
    gguf_file         *f;
    const gguf_kv     *kv;
    char              *s, from[320];

    f = make(&o, "plain.gguf");
    ok(f && gguf_find(f, "tokenizer.chat_template") == NULL,
       "chat template: no key without the option");
    gguf_close(f);
    unlink(tmp("plain.gguf"));

    o.chat_template = llama3;
    f = make(&o, "tmpl.gguf");
    kv = f ? gguf_find(f, "tokenizer.chat_template") : NULL;
    ok(kv && kv->type == GGUF_T_STRING, "chat template: a string key");
    s = f ? gguf_get_str(f, "tokenizer.chat_template") : NULL;
    ok(s && strcmp(s, llama3) == 0, "chat template: read back byte for byte "
       "(%zu bytes)", s ? strlen(s) : 0);
    free(s);
    gguf_close(f);

    /* copied from a file that has one, with the rest of the vocabulary */
    snprintf(from, sizeof(from), "%s", tmp("tmpl.gguf"));   /* tmp() rotates */
    o.vocab_from = from;
    o.chat_template = NULL;
    f = make(&o, "copied.gguf");
    s = f ? gguf_get_str(f, "tokenizer.chat_template") : NULL;
    ok(s && strcmp(s, llama3) == 0, "chat template: copied by vocab_from");
    free(s);
    gguf_close(f);
    unlink(tmp("copied.gguf"));

    /* replaced: one key, the new text */
    o.chat_template = zephyr;
    f = make(&o, "replaced.gguf");
    s = f ? gguf_get_str(f, "tokenizer.chat_template") : NULL;
    ok(s && strcmp(s, zephyr) == 0,
       "chat template: the option replaces the one of vocab_from");
    free(s);
    if (f != NULL) {
        int n = 0;

        for (uint64_t i = 0; i < f->n_kv; i++) {
            n += str_is(f->kv[i].key, "tokenizer.chat_template");
        }
        is_int(n, 1, "chat template: the key appears once");
    }
    gguf_close(f);
    unlink(tmp("replaced.gguf"));
    unlink(tmp("tmpl.gguf"));
}


static void
test_bad_opts(void)
{
    static const struct {
        const char *label, *expect;
        int dim, heads, kv, ffn, vocab, bpe;
        ggml_type type;
    } bad[] = {
        { "heads 3 with dim 64", "n_heads 3", 64, 3, 1, 96, 300, 0, GGML_F32 },
        { "odd head size", "even head size", 48, 16, 4, 96, 300, 0, GGML_F32 },
        { "kv heads 3", "n_kv_heads 3 does not divide n_heads 4", 64, 4, 3,
          96, 300, 0, GGML_F32 },
        { "Q8_0 with ffn 100", "multiples of 32", 64, 4, 2, 100, 300, 0,
          GGML_Q8_0 },
        { "SPM vocab 100", "n_vocab 100 out of range", 64, 4, 2, 96, 100, 0,
          GGML_F32 },
        { "BPE vocab 256", "n_vocab 256 out of range", 64, 4, 2, 96, 256, 1,
          GGML_F32 },
        { "type 3", "cannot write tensor type 3", 64, 4, 2, 96, 300, 0,
          (ggml_type) 3 },
        { "Q4_K with dim 64", "multiples of 256", 64, 4, 2, 256, 300, 0,
          GGML_Q4_K },
        { "dim 0", "all must be positive", 0, 4, 2, 96, 300, 0, GGML_F32 },
    };
    nalar_err err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        nalar_mkmodel_opts o = small_opts(bad[i].type);

        o.dim = bad[i].dim;
        o.n_heads = bad[i].heads;
        o.n_kv_heads = bad[i].kv;
        o.ffn_dim = bad[i].ffn;
        o.n_vocab = bad[i].vocab;
        o.bpe = bad[i].bpe;
        err.msg[0] = '\0';
        ok(nalar_mkmodel(&o, tmp("bad.gguf"), &err) != 0
           && has(err.msg, tmp("bad.gguf")) && has(err.msg, bad[i].expect),
           "refused: %s (%s)", bad[i].label, err.msg);
    }
    ok(access(tmp("bad.gguf"), F_OK) != 0, "no file left behind");
}


/* pre and control_tokens: the BPE pre-tokenizer's name, and control
 * tokens that end the vocabulary; a list with an empty or repeated name
 * is refused. */
static void
test_control_tokens(void)
{
    nalar_mkmodel_opts  o = small_opts(GGML_F32);
    nalar_err           err;
    gguf_file          *f;
    const gguf_kv      *toks, *types;
    char               *pre;
    int32_t             ty[2];

    o.bpe = 1;
    o.n_vocab = 300;
    o.pre = "tekken";
    o.control_tokens = "<a>,<b>";
    ok(nalar_mkmodel(&o, tmp("ct.gguf"), &err) == 0, "control_tokens: "
       "written");
    f = gguf_open(tmp("ct.gguf"), &err);
    ok(f != NULL, "control_tokens: opens");
    if (f != NULL) {
        pre = gguf_get_str(f, "tokenizer.ggml.pre");
        ok(pre != NULL && strcmp(pre, "tekken") == 0,
           "tokenizer.ggml.pre is tekken");
        free(pre);
        toks = gguf_find(f, "tokenizer.ggml.tokens");
        types = gguf_find(f, "tokenizer.ggml.token_type");
        if (toks != NULL && types != NULL && toks->arr_len == 300) {
            memcpy(ty, (const char *) types->arr_data + 4 * 298, 8);
        }
        ok(toks != NULL && types != NULL && toks->arr_len == 300
           && toks->arr_strs[298].len == 3
           && memcmp(toks->arr_strs[298].ptr, "<a>", 3) == 0
           && toks->arr_strs[299].len == 3
           && memcmp(toks->arr_strs[299].ptr, "<b>", 3) == 0
           && ty[0] == 3 && ty[1] == 3,
           "the last two tokens are the control tokens <a> <b>");
        gguf_close(f);
    }
    unlink(tmp("ct.gguf"));

    {
        static const char *bad[] = { "<a>,", ",<a>", "<a>,,<b>", "<a>,<a>" };

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            o.control_tokens = bad[i];
            ok(nalar_mkmodel(&o, tmp("ct.gguf"), &err) != 0,
               "control_tokens '%s' refused (%s)", bad[i], err.msg);
            unlink(tmp("ct.gguf"));
        }
    }
}


/* every architecture the engine serves: the file names it, loads with its
 * parts, and a CPU pass over 20 tokens gives finite logits */
static void
test_archs(void)
{
    static const char *const archs[] = {
        "llama", "qwen2", "qwen3", "gemma2", "phi3",
    };
    nalar_mkmodel_opts o;
    nalar_err          err;

    for (size_t a = 0; a < sizeof(archs) / sizeof(archs[0]); a++) {
        nalar_model   *m;
        nalar_backend *be;
        nalar_kv_pool  kv;
        nalar_seq_kv   s;
        nalar_batch    b;
        int32_t        tok[20], pos[20];
        int8_t         want[20];
        nalar_seq_kv  *seq[20];
        float         *logits;
        int            finite = 1, rc = -1;

        o = small_opts(GGML_F16);
        o.arch = archs[a];
        o.window = 8;
        if (nalar_mkmodel(&o, tmp("arch.gguf"), &err) != 0) {
            ok(0, "mkmodel --arch %s: %s", archs[a], err.msg);
            continue;
        }
        m = nalar_model_load(tmp("arch.gguf"), &err);
        ok(m != NULL && strcmp(nalar_arch_name(m->cfg.arch), archs[a]) == 0,
           "%s: written and loaded as %s", archs[a], archs[a]);
        if (m == NULL) {
            diag("%s", err.msg);
            continue;
        }
        ok((m->layers[0].bq != NULL) == (strcmp(archs[a], "qwen2") == 0)
           && (m->layers[0].q_norm != NULL) == (strcmp(archs[a], "qwen3")
                                                == 0)
           && (m->layers[1].post_ffn_norm != NULL) == (strcmp(archs[a],
                                                              "gemma2") == 0)
           && (m->cfg.swa_window == 8) == (strcmp(archs[a], "gemma2") == 0
                                           || strcmp(archs[a], "phi3") == 0)
           && (m->output.data == m->tok_embd.data)
              == (strcmp(archs[a], "qwen2") == 0
                  || strcmp(archs[a], "qwen3") == 0
                  || strcmp(archs[a], "gemma2") == 0),
           "%s: its biases, norms, window and output head", archs[a]);
        memset(&kv, 0, sizeof(kv));
        nalar_seq_kv_init(&s);
        be = nalar_cpu_backend_create(m, 1, &err);
        logits = malloc(20 * 300 * sizeof(float));
        if (be != NULL && logits != NULL
            && nalar_kv_pool_init(&kv, 2, m->cfg.n_layers,
                                  m->cfg.n_kv_heads * m->cfg.head_dim,
                                  &err) == 0
            && be->kv_alloc(be, &kv, &err) == 0
            && nalar_seq_kv_reserve(&kv, &s, 20) == 0)
        {
            for (int i = 0; i < 20; i++) {
                tok[i] = 5 + 13 * i;
                pos[i] = i;
                want[i] = 1;
                seq[i] = &s;
            }
            b.n_tokens = 20;
            b.tokens = tok;
            b.pos = pos;
            b.seq = seq;
            b.want_logits = want;
            b.n_logits = 20;
            b.adapter = NULL;
            rc = be->forward(be, &kv, &b, logits, &err);
            for (int i = 0; rc == 0 && i < 20 * 300; i++) {
                finite &= isfinite(logits[i]);
            }
        }
        ok(rc == 0 && finite, "%s: a pass of 20 tokens, finite logits",
           archs[a]);
        nalar_seq_kv_release(&kv, &s);
        if (be != NULL) {
            if (kv.k != NULL) {
                be->kv_free(be, &kv);
            }
            be->destroy(be);
        }
        nalar_kv_pool_free(&kv);
        free(logits);
        nalar_model_destroy(m);
    }
    o = small_opts(GGML_F16);
    o.arch = "mamba";
    ok(nalar_mkmodel(&o, tmp("arch.gguf"), &err) != 0
       && strstr(err.msg, "unknown architecture 'mamba'") != NULL,
       "an unknown architecture is refused: %s", err.msg);
    unlink(tmp("arch.gguf"));
}


/*
 * K-quants: dim and ffn multiples of 256.  Each file's matrices are the
 * F32 file's of the same seed within the type's error (relative RMS),
 * with the mix's types per tensor, and the engine loads it.
 */
static void
test_kquants(void)
{
    static const struct {
        ggml_type t; int kmix, ftype; const char *name; double bound;
    } ty[] = {
        { GGML_Q4_K, 0, 14, "k-q4k.gguf", 0.075 },
        { GGML_Q5_K, 0, 16, "k-q5k.gguf", 0.04 },
        { GGML_Q6_K, 0, 18, "k-q6k.gguf", 0.02 },
        { GGML_Q4_K, 1, 15, "k-q4km.gguf", 0.075 },
        { GGML_Q5_K, 1, 17, "k-q5km.gguf", 0.04 },
        { GGML_Q4_0, 0, 2, "k-q40.gguf", 0.08 },
        { GGML_Q8_0, 0, 7, "k-q80.gguf", 0.005 },
    };
    nalar_mkmodel_opts o = small_opts(GGML_F32);
    gguf_file         *f32;

    o.dim = 256;
    o.ffn_dim = 512;
    f32 = make(&o, "k-f32.gguf");
    if (f32 == NULL) {
        return;
    }
    for (size_t i = 0; i < sizeof(ty) / sizeof(ty[0]); i++) {
        nalar_mkmodel_opts q = o;
        gguf_file         *g;
        nalar_model       *m;
        nalar_err          err;
        double             worst = 0;
        int                types_ok = 1;
        const char        *tn = ggml_type_name(ty[i].t);

        q.type = ty[i].t;
        q.kmix = ty[i].kmix;
        g = make(&q, ty[i].name);
        if (g == NULL) {
            continue;
        }
        is_int(gguf_get_int(g, "general.file_type", -1), ty[i].ftype,
               "%s%s: general.file_type %d", tn, q.kmix ? "_M" : "",
               ty[i].ftype);
        for (uint64_t k = 0; k < g->n_tensors; k++) {
            const gguf_tensor *b = &g->tensors[k];
            const gguf_tensor *a = &f32->tensors[k];
            char               nm[96];
            ggml_type          want;
            uint64_t           n = n_elems(b), rs;
            float             *d;
            double             se = 0, sx = 0;

            snprintf(nm, sizeof(nm), "%.*s", (int) b->name.len, b->name.ptr);
            want = b->n_dims == 1 ? GGML_F32
                   : q.kmix && (strcmp(nm, "output.weight") == 0
                                || strcmp(nm, "blk.1.attn_v.weight") == 0
                                || strcmp(nm, "blk.1.ffn_down.weight") == 0)
                   ? GGML_Q6_K : q.type;
            types_ok &= b->type == want && n == n_elems(a);
            if (b->n_dims == 1 || !types_ok) {
                continue;
            }
            d = malloc(n * sizeof(float));
            if (d == NULL) {
                types_ok = 0;
                break;
            }
            rs = ggml_row_size(b->type, b->ne[0]);
            for (uint64_t r = 0; r < n / b->ne[0]; r++) {
                nalar_dequant_row(b->type, (const uint8_t *) b->data + r * rs,
                                  (int64_t) b->ne[0], d + r * b->ne[0]);
            }
            for (uint64_t j = 0; j < n; j++) {
                double x = elem(a, j);

                se += (d[j] - x) * (d[j] - x);
                sx += x * x;
            }
            free(d);
            worst = fmax(worst, sqrt(se / sx));
        }
        ok(types_ok, "%s%s: every tensor has the mix's type", tn,
           q.kmix ? "_M" : "");
        ok(worst <= ty[i].bound && worst > 0, "%s%s: matrices are the F32 "
           "ones within %.3f relative RMS (worst %.4f)", tn,
           q.kmix ? "_M" : "", ty[i].bound, worst);
        gguf_close(g);
        m = nalar_model_load(tmp(ty[i].name), &err);
        ok(m != NULL, "%s%s: the engine loads it%s%s", tn, q.kmix ? "_M" : "",
           m == NULL ? ": " : "", m == NULL ? err.msg : "");
        nalar_model_destroy(m);
        unlink(tmp(ty[i].name));
    }
    gguf_close(f32);
    unlink(tmp("k-f32.gguf"));
}


int
main(void)
{
    const char         *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    nalar_mkmodel_opts  o;
    gguf_file          *f32;

    snprintf(tmpdir, sizeof(tmpdir), "%s/test_mkmodel.XXXXXX", base);
    if (mkdtemp(tmpdir) == NULL) {
        printf("Bail out! mkdtemp %s\n", tmpdir);
        return 1;
    }

    test_defaults();
    o = small_opts(GGML_F32);
    f32 = make(&o, "m-f32.gguf");
    if (f32 != NULL) {
        test_f32(f32);
        test_types(f32);
        gguf_close(f32);
    }
    test_kquants();
    unlink(tmp("m-f32.gguf"));
    test_determinism();
    test_spm();
    test_bpe(300);
    test_bpe(2048);
    test_vocab_from();
    test_chat_template();
    test_bad_opts();
    test_control_tokens();
    test_archs();

    rmdir(tmpdir);
    return done_testing();
}
