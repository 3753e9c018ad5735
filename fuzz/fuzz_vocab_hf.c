/*
 * libFuzzer target for the conversion of Hugging Face tokenizer files
 * (src/vocab_hf.c), what `nalar mkmodel --vocab-from tokenizer.json`
 * reads.  Byte 0 holds the options: bit 0 skip_template, bit 1 whether a
 * tokenizer_config.json lies beside the tokenizer.json.  The rest is
 * tokenizer.json, then (with bit 1) a 0x00 byte and tokenizer_config.json
 * (JSON text holds no raw 0x00).  Both are written to a directory of this
 * process and converted as mkmodel converts them.
 *
 * Besides ASan/UBSan, it checks what vocab_hf.h promises: a refusal says
 * why; a conversion writes n_vocab > 0 tokens, one GGUF that reads back
 * with exactly that many tokens and token types (each a llama.cpp type,
 * 1 .. 6), no chat template when asked to skip it, and a vocabulary the
 * tokenizer loads (a converted file the server could not load would be a
 * model mkmodel made and nalar refuses); text tokenized with it gives
 * ids of the vocabulary.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=vocab_hf
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "tokenizer.h"
#include "vocab_hf.h"

static char dir[64], tj_path[96], cfg_path[96], out_path[96];


static void
die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_vocab_hf: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    abort();
}


static void
put(const char *path, const uint8_t *p, size_t n)
{
    FILE *fp = fopen(path, "wb");

    if (fp == NULL || fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
        die("cannot write", path);
    }
}


/* the directory goes when the run ends */
static void
cleanup(void)
{
    unlink(tj_path);
    unlink(cfg_path);
    unlink(out_path);
    rmdir(dir);
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void) argc;
    (void) argv;
    snprintf(dir, sizeof(dir), "/tmp/fuzz_vocab_hf.XXXXXX");
    if (mkdtemp(dir) == NULL) {
        die("mkdtemp", NULL);
    }
    snprintf(tj_path, sizeof(tj_path), "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof(cfg_path), "%s/tokenizer_config.json", dir);
    snprintf(out_path, sizeof(out_path), "%s/vocab.gguf", dir);
    atexit(cleanup);
    return 0;
}


/* the converted vocabulary read back: as many tokens as said, and one
 * the tokenizer loads and uses */
static void
check_back(int n_vocab, int skip_template)
{
    static const char text[] = "Hello world, 123 \xc3\xa1\xe2\x96\x81 "
                               "<|im_end|></s>\n\t  x";
    nalar_err        err;
    gguf_file       *f;
    const gguf_kv   *kv;
    nalar_tokenizer *t;
    int32_t          ids[256];
    int              n;

    f = gguf_open(out_path, &err);
    if (f == NULL) {
        die("the written GGUF does not open", err.msg);
    }
    kv = gguf_find(f, "tokenizer.ggml.tokens");
    if (kv == NULL || kv->type != GGUF_T_ARRAY
        || kv->arr_len != (uint64_t) n_vocab)
    {
        die("the token count read back differs", NULL);
    }
    kv = gguf_find(f, "tokenizer.ggml.token_type");
    if (kv == NULL || kv->type != GGUF_T_ARRAY
        || kv->arr_len != (uint64_t) n_vocab || kv->arr_type != GGUF_T_INT32)
    {
        die("the token types read back differ", NULL);
    }
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        int64_t tt = gguf_arr_int(kv, i);

        if (tt < 1 || tt > 6) {
            die("a token type that is not llama.cpp's", NULL);
        }
    }
    if (skip_template && gguf_find(f, "tokenizer.chat_template") != NULL) {
        die("a chat template written under skip_template", NULL);
    }
    t = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    if (t == NULL) {
        die("the converted vocabulary does not load", err.msg);
    }
    if (nalar_tok_n_vocab(t) != n_vocab) {
        die("the tokenizer counts other tokens", NULL);
    }
    n = nalar_tokenize(t, text, sizeof(text) - 1, 1, 1, ids, 256);
    for (int i = 0; i < n && i < 256; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            die("an id outside the vocabulary", NULL);
        }
    }
    nalar_tokenizer_destroy(t);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *json, *nul;
    size_t         n_json;
    int            skip, n_vocab = 0, rc;
    nalar_err      err;
    gguf_writer   *w;

    if (size < 1) {
        return 0;
    }
    skip = data[0] & 1;
    json = data + 1;
    n_json = size - 1;
    nul = memchr(json, 0, n_json);
    unlink(cfg_path);
    if (nul != NULL) {
        n_json = (size_t) (nul - json);
        if (data[0] & 2) {
            put(cfg_path, nul + 1, size - 1 - n_json - 1);
        }
    }
    put(tj_path, json, n_json);

    w = gguf_writer_create();
    if (w == NULL) {
        return 0;
    }
    gguf_w_str(w, "general.architecture", "fuzz");
    err.msg[0] = '\0';
    rc = nalar_vocab_hf_write(w, tj_path, skip, &n_vocab, &err);
    if (rc != 0) {
        if (rc != -1 || err.msg[0] == '\0') {
            die("a refusal without a reason", NULL);
        }
        gguf_writer_destroy(w);
        return 0;
    }
    if (n_vocab <= 0) {
        die("a conversion with no tokens", NULL);
    }
    if (gguf_writer_save(w, out_path, &err) != 0) {
        die("the converted vocabulary cannot be saved", err.msg);
    }
    gguf_writer_destroy(w);
    check_back(n_vocab, skip);
    unlink(out_path);
    return 0;
}
