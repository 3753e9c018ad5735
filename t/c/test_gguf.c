/*
 * GGUF reader/writer: the bundled models and vocabularies, a writer round
 * trip over every value and tensor type, and a table of malformed files that
 * must each be refused with a message naming the file and the problem.
 * Built with ASan, the malformed cases also prove the reader never reads
 * past the buffer: every one is parsed from an exactly-sized malloc.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "tap.h"

#define TARGET_F32 "models/nalar-kjv-target-f32.gguf"
#define TARGET_F16 "models/nalar-kjv-target-f16.gguf"
#define DRAFT_F32  "models/nalar-kjv-draft-f32.gguf"
#define VOCAB_SPM  "t/data/vocab/ggml-vocab-llama-spm.gguf"
#define VOCAB_GPT2 "t/data/vocab/ggml-vocab-gpt-2.gguf"

static char tmpdir[256];


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


/* ---------------------------------------------------------------- */
/* the bundled files                                                 */


static void
check_target(const char *path, ggml_type mat_type)
{
    nalar_err          err;
    gguf_file         *f = gguf_open(path, &err);
    const gguf_kv     *kv;
    const gguf_tensor *t;
    char              *s;
    int                types_ok = 1, aligned = 1;

    ok(f != NULL, "%s opens", path);
    if (f == NULL) {
        diag("%s", err.msg);
        return;
    }
    is_int(f->version, 3, "version 3");
    s = gguf_get_str(f, "general.architecture");
    ok(s != NULL && strcmp(s, "llama") == 0, "general.architecture = llama");
    free(s);
    is_int(gguf_get_int(f, "llama.embedding_length", -1), 128,
           "llama.embedding_length = 128");
    is_int(gguf_get_int(f, "llama.block_count", -1), 6, "6 layers");
    is_int(gguf_get_int(f, "general.alignment", -1), 32, "alignment 32");
    is_int(f->alignment, 32, "f->alignment 32");
    is_int(gguf_get_int(f, "tokenizer.ggml.add_bos_token", -1), 1,
           "bool read as integer 1");
    is_int(gguf_get_int(f, "general.architecture", -7), -7,
           "string key: get_int gives the default");
    is_int(gguf_get_int(f, "no.such.key", -9), -9, "missing key: default");
    ok(gguf_get_str(f, "llama.block_count") == NULL,
       "integer key: get_str gives NULL");
    ok(fabs(gguf_get_float(f, "llama.attention.layer_norm_rms_epsilon", 0)
            - 1e-5) < 1e-9, "rms eps 1e-5");
    ok(gguf_get_float(f, "llama.rope.freq_base", 0) == 10000.0,
       "rope base 10000");

    kv = gguf_find(f, "tokenizer.ggml.tokens");
    ok(kv != NULL && kv->type == GGUF_T_ARRAY
       && kv->arr_type == GGUF_T_STRING && kv->arr_len == 2048,
       "tokenizer.ggml.tokens: 2048 strings");
    if (kv != NULL && kv->arr_len == 2048) {
        ok(str_is(kv->arr_strs[0], "<unk>") && str_is(kv->arr_strs[1], "<s>")
           && str_is(kv->arr_strs[3], "<0x00>"),
           "tokens 0, 1, 3 are <unk> <s> <0x00>");
    }
    kv = gguf_find(f, "tokenizer.ggml.token_type");
    ok(kv != NULL && kv->arr_type == GGUF_T_INT32 && kv->arr_len == 2048
       && gguf_arr_int(kv, 3) == 6 && gguf_arr_int(kv, 1) == 3,
       "token_type: <0x00> is a byte token (6), <s> control (3)");
    kv = gguf_find(f, "tokenizer.ggml.scores");
    ok(kv != NULL && kv->arr_type == GGUF_T_FLOAT32 && kv->arr_len == 2048,
       "scores: 2048 f32");

    is_int(f->n_tensors, 2 + 6 * 9 + 1, "57 tensors");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        t = &f->tensors[i];
        ggml_type want = t->n_dims == 1 ? GGML_F32 : mat_type;
        if (t->type != want) {
            types_ok = 0;
        }
        if (((uintptr_t) t->data % 32) != 0
            || (const uint8_t *) t->data + t->nbytes > f->map + f->map_size)
        {
            aligned = 0;
        }
    }
    ok(types_ok, "matrices %s, norm vectors F32", ggml_type_name(mat_type));
    ok(aligned, "every tensor's data is 32-byte aligned and inside the file");

    t = gguf_tensor_find(f, "token_embd.weight");
    ok(t != NULL && t->n_dims == 2 && t->ne[0] == 128 && t->ne[1] == 2048
       && t->nbytes == ggml_row_size(mat_type, 128) * 2048,
       "token_embd.weight [128, 2048]");
    t = gguf_tensor_find(f, "blk.5.ffn_down.weight");
    ok(t != NULL && t->ne[0] == 384 && t->ne[1] == 128,
       "blk.5.ffn_down.weight [384, 128]");
    t = gguf_tensor_find(f, "blk.0.attn_k.weight");
    ok(t != NULL && t->ne[0] == 128 && t->ne[1] == 64,
       "blk.0.attn_k.weight [128, 64] (2 kv heads x 32)");
    ok(gguf_tensor_find(f, "blk.6.attn_q.weight") == NULL,
       "no blk.6 tensor");
    t = gguf_tensor_find(f, "output_norm.weight");
    if (t != NULL) {
        float first;
        memcpy(&first, t->data, 4);
        ok(isfinite(first) && first != 0.0f,
           "output_norm.weight[0] is a plausible weight (%g)", first);
    } else {
        ok(0, "output_norm.weight present");
    }
    gguf_close(f);
}


static void
check_vocab(const char *path, const char *model, uint64_t n_tokens,
            uint64_t n_merges)
{
    nalar_err      err;
    gguf_file     *f;
    const gguf_kv *kv;
    char          *s;

    /* the fixtures are in the repository: a missing one is a failure */
    if (access(path, R_OK) != 0) {
        ok(0, "%s present", path);
        return;
    }
    f = gguf_open(path, &err);
    ok(f != NULL, "vocab-only %s opens", path);
    if (f == NULL) {
        diag("%s", err.msg);
        return;
    }
    is_int(f->n_tensors, 0, "no tensors");
    s = gguf_get_str(f, "tokenizer.ggml.model");
    ok(s != NULL && strcmp(s, model) == 0, "tokenizer.ggml.model = %s", model);
    free(s);
    kv = gguf_find(f, "tokenizer.ggml.tokens");
    ok(kv != NULL && kv->arr_len == n_tokens, "%llu tokens",
       (unsigned long long) n_tokens);
    kv = gguf_find(f, "tokenizer.ggml.merges");
    is_int(kv ? kv->arr_len : 0, n_merges, "merges");
    gguf_close(f);
}


/* ---------------------------------------------------------------- */
/* writer round trip                                                 */


/* gguf_w_kv copies every kv of f faithfully */
static void
check_kv_copy(const gguf_file *f)
{
    char         path2[300];
    nalar_err    err;
    gguf_writer *w;
    gguf_file   *g;
    int          all_same;

    w = gguf_writer_create();
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_w_kv(w, &f->kv[i]);
    }
    snprintf(path2, sizeof(path2), "%s/rt2.gguf", tmpdir);
    ok(gguf_writer_save(w, path2, &err) == 0, "copy of every kv saves");
    gguf_writer_destroy(w);
    g = gguf_open(path2, &err);
    ok(g != NULL && g->n_kv == f->n_kv, "copy opens with the same kv count");
    if (g != NULL) {
        all_same = 1;
        for (uint64_t i = 0; i < f->n_kv && i < g->n_kv; i++) {
            const gguf_kv *a = &f->kv[i], *b = &g->kv[i];
            if (a->key.len != b->key.len
                || memcmp(a->key.ptr, b->key.ptr, a->key.len) != 0
                || a->type != b->type || a->arr_type != b->arr_type
                || a->arr_len != b->arr_len)
            {
                all_same = 0;
                continue;
            }
            if (a->type == GGUF_T_STRING) {
                all_same &= a->v.s.len == b->v.s.len
                            && memcmp(a->v.s.ptr, b->v.s.ptr, a->v.s.len) == 0;
            } else if (a->type == GGUF_T_ARRAY) {
                for (uint64_t j = 0; j < a->arr_len; j++) {
                    if (a->arr_type == GGUF_T_STRING) {
                        all_same &= a->arr_strs[j].len == b->arr_strs[j].len
                            && memcmp(a->arr_strs[j].ptr, b->arr_strs[j].ptr,
                                      a->arr_strs[j].len) == 0;
                    } else {
                        size_t sz = gguf_type_size(a->arr_type);
                        all_same &= memcmp((const char *) a->arr_data + j * sz,
                                           (const char *) b->arr_data + j * sz,
                                           sz) == 0;
                    }
                }
            } else {
                all_same &= a->v.u == b->v.u;
            }
        }
        ok(all_same, "copied kvs equal the originals, value for value");
        gguf_close(g);
    }
    unlink(path2);
}


static void
test_roundtrip(void)
{
    char               path[300];
    nalar_err          err;
    gguf_writer       *w;
    gguf_file         *f;
    const gguf_kv     *kv;
    const gguf_tensor *t;
    const char        *strs[] = { "alpha", "", "\xe2\x96\x81gamma" };
    uint8_t            au8[] = { 1, 2, 255 };
    int16_t            ai16[] = { -3, 300 };
    uint64_t           au64[] = { 1, UINT64_MAX };
    double             af64[] = { 0.5, -1e300 };
    int32_t            ai32[] = { -1, 7, INT32_MAX };
    float              af32[] = { 1.5f, -2.25f };
    float              t32[8 * 3];
    uint16_t           t16[64];
    uint8_t            tq8[34 * 2 * 2], tq4[18 * 3], tb[40];
    uint64_t           ne2[] = { 8, 3 }, ne1[] = { 64 }, ne4[] = { 64, 1, 2, 1 },
                       neq4[] = { 32, 3 }, nebf[] = { 20 };
    int                all_same = 1;

    for (int i = 0; i < 24; i++) t32[i] = (float) i * 0.25f - 3.0f;
    for (int i = 0; i < 64; i++) t16[i] = (uint16_t) (i * 977);
    for (size_t i = 0; i < sizeof(tq8); i++) tq8[i] = (uint8_t) (i * 7 + 1);
    for (size_t i = 0; i < sizeof(tq4); i++) tq4[i] = (uint8_t) (i * 13);
    for (size_t i = 0; i < sizeof(tb); i++) tb[i] = (uint8_t) (255 - i);

    w = gguf_writer_create();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u8(w, "v.u8", 200);
    gguf_w_i8(w, "v.i8", -100);
    gguf_w_u16(w, "v.u16", 60000);
    gguf_w_i16(w, "v.i16", -30000);
    gguf_w_u32(w, "v.u32", 4000000000u);
    gguf_w_i32(w, "v.i32", -2000000000);
    gguf_w_f32(w, "v.f32", 0.125f);
    gguf_w_bool(w, "v.bool", 1);
    gguf_w_str(w, "v.str", "hello \xe2\x96\x81 world");
    gguf_w_u64(w, "v.u64", UINT64_MAX - 1);
    gguf_w_i64(w, "v.i64", INT64_MIN + 1);
    gguf_w_f64(w, "v.f64", 3.141592653589793);
    gguf_w_arr_str(w, "a.str", strs, 3);
    gguf_w_arr_i32(w, "a.i32", ai32, 3);
    gguf_w_arr_f32(w, "a.f32", af32, 2);
    gguf_w_arr(w, "a.u8", GGUF_T_UINT8, au8, 3);
    gguf_w_arr(w, "a.i16", GGUF_T_INT16, ai16, 2);
    gguf_w_arr(w, "a.u64", GGUF_T_UINT64, au64, 2);
    gguf_w_arr(w, "a.f64", GGUF_T_FLOAT64, af64, 2);
    gguf_w_arr(w, "a.empty", GGUF_T_INT32, NULL, 0);
    gguf_w_tensor(w, "t.f32", GGML_F32, 2, ne2, t32);
    gguf_w_tensor(w, "t.f16", GGML_F16, 1, ne1, t16);
    gguf_w_tensor(w, "t.q8", GGML_Q8_0, 4, ne4, tq8);
    gguf_w_tensor(w, "t.q4", GGML_Q4_0, 2, neq4, tq4);
    gguf_w_tensor(w, "t.bf16", GGML_BF16, 1, nebf, tb);
    gguf_w_tensor(w, "t.zero", GGML_F32, 1, ne1, NULL);
    snprintf(path, sizeof(path), "%s/rt.gguf", tmpdir);
    ok(gguf_writer_save(w, path, &err) == 0, "writer saves %s", path);
    gguf_writer_destroy(w);

    f = gguf_open(path, &err);
    ok(f != NULL, "round-trip file opens");
    if (f == NULL) {
        diag("%s", err.msg);
        return;
    }
    is_int(f->version, 3, "written as v3");
    is_int(f->n_kv, 21, "21 kvs");
    is_int(f->n_tensors, 6, "6 tensors");
    is_int(gguf_get_int(f, "v.u8", 0), 200, "u8");
    is_int(gguf_get_int(f, "v.i8", 0), -100, "i8");
    is_int(gguf_get_int(f, "v.u16", 0), 60000, "u16");
    is_int(gguf_get_int(f, "v.i16", 0), -30000, "i16");
    is_int(gguf_get_int(f, "v.u32", 0), 4000000000ll, "u32");
    is_int(gguf_get_int(f, "v.i32", 0), -2000000000, "i32");
    ok(gguf_get_float(f, "v.f32", 0) == 0.125, "f32");
    is_int(gguf_get_int(f, "v.bool", 0), 1, "bool");
    kv = gguf_find(f, "v.u64");
    ok(kv && kv->type == GGUF_T_UINT64 && kv->v.u == UINT64_MAX - 1, "u64");
    is_int(gguf_get_int(f, "v.u64", 5), 5,
           "u64 above INT64_MAX: get_int gives the default");
    is_int(gguf_get_int(f, "v.i64", 0), INT64_MIN + 1, "i64");
    ok(gguf_get_float(f, "v.f64", 0) == 3.141592653589793, "f64");
    {
        char *s = gguf_get_str(f, "v.str");
        ok(s && strcmp(s, "hello \xe2\x96\x81 world") == 0, "string");
        free(s);
    }
    kv = gguf_find(f, "a.str");
    ok(kv && kv->arr_type == GGUF_T_STRING && kv->arr_len == 3
       && str_is(kv->arr_strs[0], "alpha") && str_is(kv->arr_strs[1], "")
       && str_is(kv->arr_strs[2], "\xe2\x96\x81gamma"), "string array");
    kv = gguf_find(f, "a.i32");
    ok(kv && kv->arr_type == GGUF_T_INT32 && kv->arr_len == 3
       && gguf_arr_int(kv, 0) == -1 && gguf_arr_int(kv, 2) == INT32_MAX,
       "i32 array");
    kv = gguf_find(f, "a.f32");
    ok(kv && kv->arr_len == 2 && gguf_arr_float(kv, 1) == -2.25, "f32 array");
    kv = gguf_find(f, "a.u8");
    ok(kv && kv->arr_type == GGUF_T_UINT8 && gguf_arr_int(kv, 2) == 255,
       "u8 array");
    kv = gguf_find(f, "a.i16");
    ok(kv && gguf_arr_int(kv, 0) == -3 && gguf_arr_int(kv, 1) == 300,
       "i16 array");
    kv = gguf_find(f, "a.u64");
    ok(kv && (uint64_t) gguf_arr_int(kv, 1) == UINT64_MAX, "u64 array");
    kv = gguf_find(f, "a.f64");
    ok(kv && gguf_arr_float(kv, 1) == -1e300, "f64 array");
    kv = gguf_find(f, "a.empty");
    ok(kv && kv->type == GGUF_T_ARRAY && kv->arr_len == 0, "empty array");

    t = gguf_tensor_find(f, "t.f32");
    ok(t && t->type == GGML_F32 && t->n_dims == 2 && t->ne[0] == 8
       && t->ne[1] == 3 && t->nbytes == sizeof(t32)
       && memcmp(t->data, t32, sizeof(t32)) == 0, "F32 tensor [8, 3]");
    t = gguf_tensor_find(f, "t.f16");
    ok(t && t->type == GGML_F16 && t->nbytes == 128
       && memcmp(t->data, t16, 128) == 0, "F16 tensor [64]");
    t = gguf_tensor_find(f, "t.q8");
    ok(t && t->type == GGML_Q8_0 && t->n_dims == 4 && t->ne[2] == 2
       && t->nbytes == sizeof(tq8) && memcmp(t->data, tq8, sizeof(tq8)) == 0,
       "Q8_0 tensor [64, 1, 2, 1]: 4 blocks of 34 bytes");
    t = gguf_tensor_find(f, "t.q4");
    ok(t && t->type == GGML_Q4_0 && t->nbytes == sizeof(tq4)
       && memcmp(t->data, tq4, sizeof(tq4)) == 0, "Q4_0 tensor [32, 3]");
    t = gguf_tensor_find(f, "t.bf16");
    ok(t && t->type == GGML_BF16 && t->nbytes == 40
       && memcmp(t->data, tb, 40) == 0, "BF16 tensor [20]");
    t = gguf_tensor_find(f, "t.zero");
    ok(t && t->nbytes == 256 && ((const uint8_t *) t->data)[0] == 0
       && ((const uint8_t *) t->data)[255] == 0, "NULL data writes zeros");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (f->tensors[i].offset % 32 != 0) {
            all_same = 0;
        }
    }
    ok(all_same && f->data_offset % 32 == 0,
       "data section and tensor offsets aligned to 32");

    check_kv_copy(f);
    gguf_close(f);
    unlink(path);
}


/* writer mistakes surface at save, naming the path; a writer-chosen
 * alignment is honoured */
static void
test_writer_checks(void)
{
    char         path2[300];
    nalar_err    err;
    gguf_writer *w;
    gguf_file   *g;
    uint64_t     ne1[] = { 64 }, nebf[] = { 20 };

    snprintf(path2, sizeof(path2), "%s/rt3.gguf", tmpdir);
    w = gguf_writer_create();
    gguf_w_u32(w, "k", 1);
    gguf_w_i32(w, "k", 2);
    ok(gguf_writer_save(w, path2, &err) != 0 && has(err.msg, path2)
       && has(err.msg, "duplicate key 'k'"), "writer: duplicate key refused");
    gguf_writer_destroy(w);
    w = gguf_writer_create();
    {
        uint64_t ne[] = { 33 };
        gguf_w_tensor(w, "q", GGML_Q8_0, 1, ne, NULL);
    }
    ok(gguf_writer_save(w, path2, &err) != 0
       && has(err.msg, "not a multiple of the Q8_0 block size"),
       "writer: Q8_0 row of 33 refused");
    gguf_writer_destroy(w);
    w = gguf_writer_create();
    gguf_w_tensor(w, "x", GGML_F32, 1, ne1, NULL);
    gguf_w_tensor(w, "x", GGML_F32, 1, ne1, NULL);
    ok(gguf_writer_save(w, path2, &err) != 0
       && has(err.msg, "duplicate tensor name 'x'"),
       "writer: duplicate tensor refused");
    gguf_writer_destroy(w);
    w = gguf_writer_create();
    ok(gguf_writer_save(w, "/nonexistent-dir/x.gguf", &err) != 0
       && has(err.msg, "/nonexistent-dir/x.gguf"),
       "writer: unwritable path reported");
    gguf_writer_destroy(w);

    /* a writer-chosen alignment is honoured */
    w = gguf_writer_create();
    gguf_w_u32(w, "general.alignment", 64);
    gguf_w_tensor(w, "a", GGML_F32, 1, nebf, NULL);
    gguf_w_tensor(w, "b", GGML_F32, 1, nebf, NULL);
    ok(gguf_writer_save(w, path2, &err) == 0, "alignment 64 file saves");
    gguf_writer_destroy(w);
    g = gguf_open(path2, &err);
    ok(g && g->alignment == 64 && g->data_offset % 64 == 0
       && g->tensors[1].offset == 128, "alignment 64: second tensor at 128");
    gguf_close(g);
    unlink(path2);
}


/* ---------------------------------------------------------------- */
/* malformed files                                                   */


typedef struct {
    uint8_t *p;
    size_t   n, cap;
} bb;


static void
bb_put(bb *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL) {
            abort();
        }
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void bb_u32(bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_put(b, &v, 8); }

static void
bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}


typedef struct {
    const char *name;
    uint32_t    n_dims;
    uint64_t    ne[5];
    uint32_t    type;
    uint64_t    offset;
} tspec;

/* A file described field by field; zero means "the valid default". */
typedef struct {
    const char *label;
    const char *expect;          /* substring the error must contain */
    const char *magic;
    uint32_t    version;
    uint64_t    n_kv, n_tensors; /* header counts overriding the real ones */
    int         align_kind;      /* 0: u32 32, 1: u32 align, 2: none,
                                    3: string */
    uint32_t    align;
    uint64_t    name_len;        /* general.name's length field */
    uint32_t    bad_vtype;       /* extra kv with this value type */
    int         nested;          /* extra kv: array of arrays */
    uint32_t    arr_elem;        /* extra kv: array with this element type */
    uint64_t    strs_count;      /* extra kv: string array claiming this */
    int         dup_key;
    int         n_t;             /* 0: the two default tensors */
    tspec       t[3];
    int64_t     data_delta;      /* bytes added to the default 98 of data */
} spec;


/* Default: 3 kvs, tensors a F32 [8, 2] at 0 and b Q8_0 [32] at 64. */
static void
build(const spec *s, bb *b, size_t *ti_start, size_t *ti_end)
{
    static const tspec dflt[2] = {
        { "a", 2, { 8, 2 }, GGML_F32, 0 },
        { "b", 1, { 32 }, GGML_Q8_0, 64 },
    };
    const tspec *t = s->n_t ? s->t : dflt;
    int          n_t = s->n_t ? s->n_t : 2;
    uint64_t     n_kv = 3 + (s->dup_key != 0) + (s->bad_vtype != 0)
                        + (s->nested != 0) + (s->arr_elem != 0)
                        + (s->strs_count != 0) - (s->align_kind == 2);
    int64_t      data = 98 + s->data_delta;

    memset(b, 0, sizeof(*b));
    bb_put(b, s->magic ? s->magic : "GGUF", 4);
    bb_u32(b, s->version ? s->version : 3);
    bb_u64(b, s->n_tensors ? s->n_tensors : (uint64_t) n_t);
    bb_u64(b, s->n_kv ? s->n_kv : n_kv);

    bb_str(b, "general.architecture");
    bb_u32(b, GGUF_T_STRING);
    bb_str(b, "llama");
    if (s->align_kind != 2) {
        bb_str(b, "general.alignment");
        if (s->align_kind == 3) {
            bb_u32(b, GGUF_T_STRING);
            bb_str(b, "32");
        } else {
            bb_u32(b, GGUF_T_UINT32);
            bb_u32(b, s->align_kind == 1 ? s->align : 32);
        }
    }
    bb_str(b, "general.name");
    bb_u32(b, GGUF_T_STRING);
    bb_u64(b, s->name_len ? s->name_len : 4);
    bb_put(b, "tiny", 4);
    if (s->dup_key) {
        bb_str(b, "general.name");
        bb_u32(b, GGUF_T_STRING);
        bb_str(b, "again");
    }
    if (s->bad_vtype) {
        bb_str(b, "x.bad");
        bb_u32(b, s->bad_vtype);
        bb_u32(b, 0);
    }
    if (s->nested) {
        bb_str(b, "x.nested");
        bb_u32(b, GGUF_T_ARRAY);
        bb_u32(b, GGUF_T_ARRAY);
        bb_u64(b, 1);
        bb_u32(b, GGUF_T_UINT8);
        bb_u64(b, 0);
    }
    if (s->arr_elem) {
        bb_str(b, "x.arr");
        bb_u32(b, GGUF_T_ARRAY);
        bb_u32(b, s->arr_elem);
        bb_u64(b, 1);
        bb_u64(b, 0);
    }
    if (s->strs_count) {
        bb_str(b, "x.strs");
        bb_u32(b, GGUF_T_ARRAY);
        bb_u32(b, GGUF_T_STRING);
        bb_u64(b, s->strs_count);
        bb_str(b, "a");
    }

    *ti_start = b->n;
    for (int i = 0; i < n_t; i++) {
        bb_str(b, t[i].name);
        bb_u32(b, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims && d < 5; d++) {
            bb_u64(b, t[i].ne[d]);
        }
        bb_u32(b, t[i].type);
        bb_u64(b, t[i].offset);
    }
    *ti_end = b->n;
    while (b->n % 32 != 0) {
        bb_put(b, "", 1);
    }
    for (int64_t i = 0; i < data; i++) {
        uint8_t x = (uint8_t) i;
        bb_put(b, &x, 1);
    }
}


/* Parse `size` bytes from an exact-size copy so ASan sees any over-read. */
static gguf_file *
open_exact(const uint8_t *p, size_t size, const char *name, nalar_err *err)
{
    uint8_t   *copy = malloc(size ? size : 1);
    gguf_file *f;

    memcpy(copy, p, size);
    f = gguf_open_mem(copy, size, name, err);
    if (f != NULL) {
        /* walk everything the reader handed out */
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            sink ^= ((const uint8_t *) f->tensors[i].data)[0];
            sink ^= ((const uint8_t *) f->tensors[i].data)
                    [f->tensors[i].nbytes - 1];
        }
        (void) sink;
        gguf_close(f);
    }
    free(copy);
    return f;
}


static void
expect_fail(const uint8_t *p, size_t size, const char *name,
            const char *expect, const char *label)
{
    nalar_err err;
    gguf_file *f;

    err.msg[0] = '\0';
    f = open_exact(p, size, name, &err);
    ok(f == NULL && has(err.msg, name) && has(err.msg, expect),
       "%s: refused with \"%s\"", label, expect);
    diag("  %s", f ? "(opened)" : err.msg);
}


#define T1(nm, nd, n0, n1, ty, off) { nm, nd, { n0, n1 }, ty, off }

static const spec bad[] = {
    { .label = "wrong magic", .magic = "GGUX",
      .expect = "not a GGUF file (magic 47 47 55 58" },
    { .label = "version 1", .version = 1,
      .expect = "unsupported GGUF version 1 " },
    { .label = "version 99", .version = 99,
      .expect = "unsupported GGUF version 99" },
    { .label = "big-endian v3", .version = 0x03000000,
      .expect = "big-endian GGUF files are not supported" },
    { .label = "n_kv 2^62", .n_kv = 1ull << 62,
      .expect = "kv count 4611686018427387904 cannot fit" },
    { .label = "n_tensors 2^62", .n_tensors = 1ull << 62,
      .expect = "tensor count 4611686018427387904 cannot fit" },
    { .label = "n_kv one too many", .n_kv = 4,
      .expect = "truncated in tensor info" },
    { .label = "string length 2^63", .name_len = 1ull << 63,
      .expect = "string length 9223372036854775808" },
    { .label = "value type 77", .bad_vtype = 77,
      .expect = "kv 'x.bad' has unknown value type 77" },
    { .label = "nested array", .nested = 1,
      .expect = "kv 'x.nested': nested arrays are not supported" },
    { .label = "array element type 50", .arr_elem = 50,
      .expect = "unknown array element type 50" },
    { .label = "string array count 2^40", .strs_count = 1ull << 40,
      .expect = "array of 1099511627776 strings cannot fit" },
    { .label = "duplicate key", .dup_key = 1,
      .expect = "duplicate key 'general.name'" },
    { .label = "alignment 0", .align_kind = 1, .align = 0,
      .expect = "general.alignment 0 is not a nonzero power of two" },
    { .label = "alignment 3", .align_kind = 1, .align = 3,
      .expect = "general.alignment 3 is not a nonzero power of two" },
    { .label = "alignment as string", .align_kind = 3,
      .expect = "general.alignment has type string" },
    { .label = "alignment 64, offset 32", .align_kind = 1, .align = 64,
      .n_t = 1, .t = { T1("a", 1, 8, 0, GGML_F32, 32) },
      .expect = "tensor 'a' offset 32 is not a multiple of the alignment 64" },
    { .label = "n_dims 0", .n_t = 1, .t = { T1("a", 0, 8, 0, GGML_F32, 0) },
      .expect = "tensor 'a' has 0 dimensions (must be 1..4)" },
    { .label = "n_dims 5", .n_t = 1,
      .t = { { "a", 5, { 1, 1, 1, 1, 1 }, GGML_F32, 0 } },
      .expect = "tensor 'a' has 5 dimensions (must be 1..4)" },
    { .label = "ne[1] = 0", .n_t = 1, .t = { T1("a", 2, 8, 0, GGML_F32, 0) },
      .expect = "tensor 'a' dimension 1 is 0" },
    { .label = "ne 2^40 x 2^40", .n_t = 1,
      .t = { T1("big", 2, 1ull << 40, 1ull << 40, GGML_F32, 0) },
      .expect = "tensor 'big' element count overflows" },
    { .label = "bytes 2^63 x 2", .n_t = 1,
      .t = { T1("big", 2, 1ull << 61, 2, GGML_F32, 0) },
      .expect = "tensor 'big' byte size overflows" },
    { .label = "tensor type 99", .n_t = 1,
      .t = { T1("a", 1, 8, 0, 99, 0) },
      .expect = "tensor 'a' has unsupported type 99" },
    { .label = "tensor type 3 (Q4_1)", .n_t = 1,
      .t = { T1("a", 1, 32, 0, 3, 0) },
      .expect = "tensor 'a' has unsupported type 3" },
    { .label = "Q8_0 row of 33", .n_t = 1,
      .t = { T1("q", 1, 33, 0, GGML_Q8_0, 0) },
      .expect = "tensor 'q' row length 33 is not a multiple of the Q8_0 "
                "block size 32" },
    { .label = "offset misaligned", .n_t = 1,
      .t = { T1("a", 1, 8, 0, GGML_F32, 3) },
      .expect = "tensor 'a' offset 3 is not a multiple of the alignment 32" },
    { .label = "offset past end", .n_t = 1,
      .t = { T1("a", 1, 16, 0, GGML_F32, 1 << 20) },
      .expect = "tensor 'a' data [offset 1048576, 64 bytes] runs past end "
                "of file" },
    { .label = "offset + size overflowing", .n_t = 1,
      .t = { T1("a", 1, 16, 0, GGML_F32, 0xffffffffffffffe0ull) },
      .expect = "tensor 'a' data [offset 18446744073709551584, 64 bytes] "
                "runs past end" },
    { .label = "huge tensor", .n_t = 1,
      .t = { T1("a", 2, 1ull << 30, 1ull << 30, GGML_F32, 0) },
      .expect = "tensor 'a' data [offset 0, 4611686018427387904 bytes] runs "
                "past end" },
    { .label = "data one byte short", .data_delta = -1,
      .expect = "tensor 'b' data [offset 64, 34 bytes] runs past end of file" },
    { .label = "duplicate tensor name", .n_t = 2,
      .t = { T1("a", 1, 8, 0, GGML_F32, 0), T1("a", 1, 8, 0, GGML_F32, 32) },
      .expect = "duplicate tensor name 'a'" },
};


static void
test_malformed(void)
{
    char       name[64];
    bb         b;
    size_t     ti_start, ti_end;
    spec       good;
    nalar_err  err;
    gguf_file *f;

    /* the default spec itself is valid */
    memset(&good, 0, sizeof(good));
    build(&good, &b, &ti_start, &ti_end);
    f = gguf_open_mem(b.p, b.n, "good.gguf", &err);
    ok(f != NULL && f->n_tensors == 2 && f->n_kv == 3
       && f->tensors[1].nbytes == 34, "the unmodified builder file is valid");
    if (f == NULL) {
        diag("%s", err.msg);
    }
    gguf_close(f);
    free(b.p);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(name, sizeof(name), "bad-%zu.gguf", i);
        build(&bad[i], &b, &ti_start, &ti_end);
        expect_fail(b.p, b.n, name, bad[i].expect, bad[i].label);
        free(b.p);
    }

    /* every truncation of the valid file fails, with the right story */
    build(&good, &b, &ti_start, &ti_end);
    for (size_t cut = 0; cut < b.n; cut++) {
        const char *region, *expect;

        if (cut < 24) {
            region = "header";
            expect = "truncated in header";
        } else if (cut < ti_start) {
            region = "kv";
            expect = cut < 24 + 3 * 13 ? "kv count 3 cannot fit"
                                       : "truncated in kv ";
        } else if (cut < ti_end) {
            region = "tensor info";
            expect = cut < ti_start + 2 * 32 ? "tensor count 2 cannot fit"
                                             : "truncated in tensor info ";
        } else {
            region = "padding/data";
            expect = "runs past end of file";
        }
        snprintf(name, sizeof(name), "cut-%zu.gguf", cut);
        {
            char label[96];
            snprintf(label, sizeof(label), "cut at %zu (in %s)", cut, region);
            expect_fail(b.p, cut, name, expect, label);
        }
    }
    free(b.p);
}


/* A real model cut inside each section; also through gguf_open. */
static void
test_truncated_model(void)
{
    nalar_err  err;
    gguf_file *f = gguf_open(DRAFT_F32, &err);
    uint8_t   *all;
    size_t     size, cuts[16];
    int        n = 0;
    char       path[300];
    FILE      *fp;

    if (f == NULL) {
        ok(0, "draft opens: %s", err.msg);
        return;
    }
    size = f->map_size;
    all = malloc(size);
    memcpy(all, f->map, size);
    cuts[n++] = 10;                                   /* header */
    cuts[n++] = 100;                                  /* kvs */
    cuts[n++] = (size_t) ((const uint8_t *)
                          gguf_find(f, "tokenizer.ggml.tokens")
                          ->arr_strs[1000].ptr - f->map);  /* token strings */
    cuts[n++] = (size_t) f->data_offset - 700;        /* tensor infos */
    cuts[n++] = (size_t) f->data_offset - 1;          /* padding */
    cuts[n++] = (size_t) f->data_offset + 1000;       /* data */
    cuts[n++] = size - 1;                             /* last byte */
    gguf_close(f);

    for (int i = 0; i < n; i++) {
        char label[64];
        snprintf(label, sizeof(label), "draft model cut at %zu", cuts[i]);
        err.msg[0] = '\0';
        f = open_exact(all, cuts[i], "draft-cut.gguf", &err);
        ok(f == NULL && has(err.msg, "draft-cut.gguf")
           && (has(err.msg, "truncated") || has(err.msg, "runs past end")),
           "%s refused", label);
        if (f != NULL) diag("opened");
        else diag("%s", err.msg);
    }

    /* the same through a real file, and a file shorter than a header */
    snprintf(path, sizeof(path), "%s/short.gguf", tmpdir);
    fp = fopen(path, "wb");
    fwrite(all, 1, size / 2, fp);
    fclose(fp);
    f = gguf_open(path, &err);
    ok(f == NULL && has(err.msg, path) && has(err.msg, "runs past end of file"),
       "half a model file on disk is refused: %s", f ? "" : err.msg);
    fp = fopen(path, "wb");
    fwrite(all, 1, 0, fp);
    fclose(fp);
    f = gguf_open(path, &err);
    ok(f == NULL && has(err.msg, path) && has(err.msg, "truncated in header"),
       "empty file on disk is refused");
    unlink(path);
    f = gguf_open(path, &err);
    ok(f == NULL && has(err.msg, path) && has(err.msg, "No such file"),
       "missing file reported");
    f = gguf_open(tmpdir, &err);
    ok(f == NULL && has(err.msg, "not a regular file"),
       "a directory is refused");
    free(all);
}


int
main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

    snprintf(tmpdir, sizeof(tmpdir), "%s/test_gguf.XXXXXX", base);
    if (mkdtemp(tmpdir) == NULL) {
        printf("Bail out! mkdtemp %s\n", tmpdir);
        return 1;
    }

    check_target(TARGET_F32, GGML_F32);
    check_target(TARGET_F16, GGML_F16);
    check_vocab(VOCAB_SPM, "llama", 32000, 0);
    check_vocab(VOCAB_GPT2, "gpt2", 50257, 50000);
    test_roundtrip();
    test_writer_checks();
    test_malformed();
    test_truncated_model();

    ok(ggml_row_size(GGML_Q8_0, 64) == 68 && ggml_row_size(GGML_Q4_0, 64) == 36
       && ggml_row_size(GGML_BF16, 3) == 6 && ggml_row_size(99, 4) == 0,
       "ggml_row_size");
    ok(strcmp(ggml_type_name(GGML_Q8_0), "Q8_0") == 0
       && strcmp(ggml_type_name(GGML_BF16), "BF16") == 0,
       "ggml_type_name");

    rmdir(tmpdir);
    return done_testing();
}
