/*
 * Writes the fuzzer's seed corpus: a few tiny valid GGUF files covering
 * every value type, every tensor type, a vocab-only file and a v2 header.
 *
 *   cc -std=c11 -D_GNU_SOURCE -Isrc fuzz/gen_corpus.c src/gguf.c \
 *       src/nalar_err.c -o /tmp/gen_corpus && /tmp/gen_corpus fuzz/corpus/gguf
 */
#include <stdio.h>
#include <string.h>

#include "gguf.h"


static int
save(gguf_writer *w, const char *dir, const char *name)
{
    char      path[512];
    nalar_err err;
    int       rc;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    rc = gguf_writer_save(w, path, &err);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err.msg);
    }
    gguf_writer_destroy(w);
    return rc;
}


int
main(int argc, char **argv)
{
    const char  *dir = argc > 1 ? argv[1] : "fuzz/corpus/gguf";
    const char  *toks[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81", "a",
                            "\xe2\x96\x81" "a", "ab" };
    float        scores[] = { 0, 0, 0, -1, -2, -3, -4 };
    int32_t      ttype[] = { 2, 3, 3, 1, 1, 1, 1 };
    uint64_t     u64s[] = { 1, 2 };
    uint8_t      raw[256];
    uint64_t     ne2[] = { 4, 2 }, ne32[] = { 32 }, ne4[] = { 2, 1, 1, 2 };
    gguf_writer *w;
    FILE        *fp;
    char         path[512];
    int          rc = 0;

    for (int i = 0; i < 256; i++) raw[i] = (uint8_t) (i * 37);

    /* a model-like file: llama metadata, F32 + Q8_0 tensors */
    w = gguf_writer_create();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "general.alignment", 32);
    gguf_w_u32(w, "llama.embedding_length", 4);
    gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 1);
    gguf_w_tensor(w, "token_embd.weight", GGML_F32, 2, ne2, raw);
    gguf_w_tensor(w, "output.weight", GGML_Q8_0, 1, ne32, raw);
    rc |= save(w, dir, "model.gguf");

    /* vocab only: string/f32/i32 arrays, no tensors */
    w = gguf_writer_create();
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 7);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, 7);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", ttype, 7);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    rc |= save(w, dir, "vocab.gguf");

    /* every scalar type, a u64 array, every tensor type, alignment 64 */
    w = gguf_writer_create();
    gguf_w_u32(w, "general.alignment", 64);
    gguf_w_u8(w, "u8", 1);
    gguf_w_i8(w, "i8", -1);
    gguf_w_u16(w, "u16", 2);
    gguf_w_i16(w, "i16", -2);
    gguf_w_i32(w, "i32", -3);
    gguf_w_u64(w, "u64", 4);
    gguf_w_i64(w, "i64", -4);
    gguf_w_f64(w, "f64", 0.5);
    gguf_w_arr(w, "a.u64", GGUF_T_UINT64, u64s, 2);
    gguf_w_tensor(w, "f16", GGML_F16, 4, ne4, raw);
    gguf_w_tensor(w, "bf16", GGML_BF16, 2, ne2, raw);
    gguf_w_tensor(w, "q4", GGML_Q4_0, 1, ne32, raw);
    rc |= save(w, dir, "types.gguf");

    /* the same model file with a version 2 header */
    snprintf(path, sizeof(path), "%s/model.gguf", dir);
    fp = fopen(path, "rb");
    if (fp != NULL) {
        size_t n = fread(raw, 1, sizeof(raw), fp);
        uint8_t rest[4096];
        size_t  m = fread(rest, 1, sizeof(rest), fp);
        fclose(fp);
        raw[4] = 2;
        snprintf(path, sizeof(path), "%s/model-v2.gguf", dir);
        fp = fopen(path, "wb");
        if (fp == NULL || fwrite(raw, 1, n, fp) != n
            || fwrite(rest, 1, m, fp) != m || fclose(fp) != 0)
        {
            rc = 1;
        }
    }
    return rc;
}
