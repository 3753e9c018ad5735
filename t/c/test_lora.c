/*
 * LoRA adapters: the loader's checks (each bad file refused with a message
 * naming the file and what is wrong), the views it binds, and the digest.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp16.h"
#include "gguf.h"
#include "lora.h"
#include "mkmodel.h"
#include "model.h"
#include "tap.h"

static const char *BASE = "t/data/conformance/llama-F16.gguf";
static const char *PHI3 = "t/data/conformance/phi3-F16.gguf";

static char dir[64];

/* What to break in a written adapter (BAD_NONE: a good one). */
enum {
    BAD_NONE, BAD_GENERAL_TYPE, BAD_ADAPTER_TYPE, BAD_NO_GENERAL_TYPE,
    BAD_TOKEN_EMBD, BAD_UNPAIRED, BAD_RANK, BAD_SHAPE, BAD_ARCH, BAD_LAYER,
    BAD_TYPE, BAD_ALPHA_NAN, BAD_ALPHA_STR, BAD_FUSED_ON_LLAMA, BAD_EMPTY,
    BAD_NAME, BAD_TWICE
};

static uint64_t rng = 88172645463325252ull;

static float
frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float) ((rng >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
}


static void
add_pair(gguf_writer *w, const char *mat, int l, int64_t rows, int64_t cols,
         int rank, int rank_b, ggml_type type, int skip_b)
{
    char      name[96];
    uint64_t  ne[2];
    float    *buf;
    size_t    n = (size_t) ((rows > cols ? rows : cols) * (rank + rank_b));

    buf = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        buf[i] = frand() * 0.1f;
    }
    snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_a", l, mat);
    ne[0] = (uint64_t) cols;
    ne[1] = (uint64_t) rank;
    gguf_w_tensor(w, name, type, 2, ne, type == GGML_F32 ? buf : NULL);
    if (!skip_b) {
        snprintf(name, sizeof(name), "blk.%d.%s.weight.lora_b", l, mat);
        ne[0] = (uint64_t) rank_b;
        ne[1] = (uint64_t) rows;
        gguf_w_tensor(w, name, GGML_F32, 2, ne, buf);
    }
    free(buf);
}


/* Write an adapter of m (rank 4, F32, alpha 8) to dir/NAME, broken as
 * `bad` says; returns its path (static). */
static const char *
write_adapter(const nalar_model *m, const char *name, int bad)
{
    static char  path[128];
    gguf_writer *w = gguf_writer_create();
    nalar_err    err;
    int          phi3 = m->cfg.arch == ARCH_PHI3;
    int64_t      dim = m->cfg.dim, ffn = m->cfg.ffn_dim;
    int64_t      q = m->layers[0].wq.rows, kv = m->layers[0].wk.rows;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    gguf_w_str(w, "general.type", bad == BAD_GENERAL_TYPE ? "model"
                                  : "adapter");
    if (bad == BAD_NO_GENERAL_TYPE) {
        gguf_writer_destroy(w);
        w = gguf_writer_create();
    }
    gguf_w_str(w, "general.architecture",
               bad == BAD_ARCH ? "qwen2" : nalar_arch_name(m->cfg.arch));
    gguf_w_str(w, "adapter.type", bad == BAD_ADAPTER_TYPE ? "control_vector"
                                  : "lora");
    if (bad == BAD_ALPHA_STR) {
        gguf_w_str(w, "adapter.lora.alpha", "8");
    } else {
        gguf_w_f32(w, "adapter.lora.alpha", bad == BAD_ALPHA_NAN ? NAN : 8);
    }
    for (int l = 0; l < m->cfg.n_layers && bad != BAD_EMPTY; l++) {
        int rb = bad == BAD_RANK && l == 1 ? 5 : 4;

        if (phi3) {
            add_pair(w, "attn_qkv", l, q + 2 * kv, dim, 4, 4, GGML_F32, 0);
            add_pair(w, "ffn_up", l, 2 * ffn, dim, 4, 4, GGML_F32, 0);
        } else {
            add_pair(w, "attn_q", l, q, dim, 4, rb, GGML_F32, 0);
            add_pair(w, "attn_k", l, kv, dim, 4, 4, GGML_F32, 0);
            add_pair(w, "attn_v", l, kv,
                     bad == BAD_SHAPE && l == 0 ? dim + 32 : dim, 4, 4,
                     GGML_F32, bad == BAD_UNPAIRED && l == 1);
            add_pair(w, "ffn_gate", l, ffn, dim, 4, 4,
                     bad == BAD_TYPE ? GGML_Q4_0 : GGML_F32, 0);
            add_pair(w, "ffn_up", l, ffn, dim, 4, 4, GGML_F32, 0);
        }
        add_pair(w, "attn_output", l, dim, q, 4, 4, GGML_F32, 0);
        add_pair(w, "ffn_down", l, dim, ffn, 4, 4, GGML_F32, 0);
    }
    if (bad == BAD_TOKEN_EMBD) {
        uint64_t ne[2] = { (uint64_t) dim, 4 };

        gguf_w_tensor(w, "token_embd.weight.lora_a", GGML_F32, 2, ne, NULL);
    }
    if (bad == BAD_LAYER) {
        add_pair(w, "attn_q", m->cfg.n_layers, q, dim, 4, 4, GGML_F32, 0);
    }
    if (bad == BAD_FUSED_ON_LLAMA) {
        add_pair(w, "attn_qkv", 0, q + 2 * kv, dim, 4, 4, GGML_F32, 0);
    }
    if (bad == BAD_NAME) {
        uint64_t ne[2] = { (uint64_t) dim, 4 };

        gguf_w_tensor(w, "blk.0.attn_q.weight.lora_c", GGML_F32, 2, ne,
                      NULL);
    }
    if (bad == BAD_TWICE) {
        uint64_t ne[2] = { (uint64_t) dim, 4 };

        /* layer 1's attn_q lora_a again, spelled with a leading zero */
        gguf_w_tensor(w, "blk.01.attn_q.weight.lora_a", GGML_F32, 2, ne,
                      NULL);
    }
    if (gguf_writer_save(w, path, &err) != 0) {
        diag("write %s: %s", path, err.msg);
    }
    gguf_writer_destroy(w);
    return path;
}


static void
refused(const nalar_model *m, const char *name, int bad, const char *want)
{
    const char *path = write_adapter(m, name, bad);
    nalar_err   err;
    nalar_lora *a;
    int         rc;

    memset(&err, 0, sizeof(err));
    rc = nalar_lora_check(path, m->path, &err);
    ok(rc == -1 && strstr(err.msg, path) != NULL
       && strstr(err.msg, want) != NULL,
       "check refuses %s: %s", name, err.msg);
    memset(&err, 0, sizeof(err));
    rc = nalar_lora_check_model(m, path, &err);
    ok(rc == -1 && strstr(err.msg, want) != NULL, "check against the base "
       "opened once refuses %s", name);
    memset(&err, 0, sizeof(err));
    a = nalar_lora_load(m, name, path, 1, &err);
    ok(a == NULL && strstr(err.msg, want) != NULL, "load refuses %s",
       name);
    nalar_lora_destroy(a);
}


static void
test_refusals(const nalar_model *m)
{
    refused(m, "gtype.gguf", BAD_GENERAL_TYPE, "general.type is \"model\"");
    refused(m, "nogtype.gguf", BAD_NO_GENERAL_TYPE, "general.type is absent");
    refused(m, "atype.gguf", BAD_ADAPTER_TYPE, "adapter.type is "
            "\"control_vector\"");
    refused(m, "embd.gguf", BAD_TOKEN_EMBD, "'token_embd.weight.lora_a' is "
            "not the lora_a or lora_b of a matrix the engine adapts");
    refused(m, "name.gguf", BAD_NAME, "'blk.0.attn_q.weight.lora_c' is not");
    refused(m, "unpaired.gguf", BAD_UNPAIRED, "blk.1.attn_v.weight.lora_a "
            "has no lora_b");
    refused(m, "rank.gguf", BAD_RANK, "blk.1.attn_q.weight: lora_a has "
            "rank 4 but lora_b rank 5");
    refused(m, "shape.gguf", BAD_SHAPE, "blk.0.attn_v.weight: lora_a is");
    refused(m, "arch.gguf", BAD_ARCH, "adapter of architecture \"qwen2\"");
    refused(m, "layer.gguf", BAD_LAYER, "names layer");
    refused(m, "type.gguf", BAD_TYPE, "has type Q4_0");
    refused(m, "alpha.gguf", BAD_ALPHA_NAN, "adapter.lora.alpha is nan");
    refused(m, "alphas.gguf", BAD_ALPHA_STR, "adapter.lora.alpha is not a "
            "float");
    refused(m, "fused.gguf", BAD_FUSED_ON_LLAMA, "adapts a matrix the llama "
            "base model");
    refused(m, "empty.gguf", BAD_EMPTY, "adapts no matrix");
    refused(m, "twice.gguf", BAD_TWICE, "'blk.1.attn_q.weight.lora_a' is "
            "given twice");
}


/* A good file cut short, and one with a tensor count beyond the file:
 * gguf.c refuses both before the loader looks at a tensor. */
static void
test_hostile(const nalar_model *m)
{
    const char *good = write_adapter(m, "cut.gguf", BAD_NONE);
    char        path[128];
    FILE       *f;
    long        size;
    nalar_err   err;
    uint64_t    big = 1ull << 40;

    snprintf(path, sizeof(path), "%s", good);
    f = fopen(path, "r+b");
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fclose(f);
    ok(truncate(path, size - 100) == 0, "truncated the adapter");
    memset(&err, 0, sizeof(err));
    ok(nalar_lora_check(path, m->path, &err) == -1
       && strstr(err.msg, path) != NULL, "truncated file refused: %s",
       err.msg);

    good = write_adapter(m, "count.gguf", BAD_NONE);
    snprintf(path, sizeof(path), "%s", good);
    f = fopen(path, "r+b");
    fseek(f, 8, SEEK_SET);      /* magic, version, then n_tensors */
    fwrite(&big, sizeof(big), 1, f);
    fclose(f);
    memset(&err, 0, sizeof(err));
    ok(nalar_lora_check(path, m->path, &err) == -1
       && strstr(err.msg, path) != NULL, "hostile tensor count refused: %s",
       err.msg);
}


static int
same_digest(const nalar_lora *a, const nalar_lora *b)
{
    return memcmp(a->digest, b->digest, sizeof(a->digest)) == 0;
}


/* The file's bytes parsed from memory (as the fuzzer gives them) load
 * the same adapter; a refused one closes what it was given (ASan). */
static void
test_from_memory(const nalar_model *m, const char *path, const nalar_lora *a)
{
    FILE       *f = fopen(path, "rb");
    long        size;
    uint8_t    *buf;
    gguf_file  *g;
    nalar_lora *b;
    nalar_err   err;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) <= 0) {
        ok(0, "read %s", path);
        if (f != NULL) {
            fclose(f);
        }
        return;
    }
    buf = malloc((size_t) size);
    rewind(f);
    if (buf == NULL || fread(buf, 1, (size_t) size, f) != (size_t) size) {
        ok(0, "read %s", path);
        fclose(f);
        free(buf);
        return;
    }
    fclose(f);
    g = gguf_open_mem(buf, (size_t) size, "mem.gguf", &err);
    ok(g != NULL && nalar_lora_check_gguf(m, g, &err) == 0, "from memory: "
       "check accepts it");
    b = g != NULL ? nalar_lora_load_gguf(m, "mem", g, 1, &err) : NULL;
    ok(b != NULL && same_digest(a, b) && strcmp(b->path, "mem.gguf") == 0,
       "from memory: loads, with the file's digest");
    nalar_lora_destroy(b);
    g = gguf_open_mem(buf, (size_t) size, "mem.gguf", &err);
    b = g != NULL ? nalar_lora_load_gguf(m, "mem", g, 0, &err) : NULL;
    ok(g != NULL && b == NULL && strstr(err.msg, "mem.gguf: scale 0")
       != NULL, "from memory: scale 0 refused (%s)", err.msg);
    free(buf);
}


static void
test_good(const nalar_model *m)
{
    const char *path = write_adapter(m, "good.gguf", BAD_NONE);
    char        copy[128];
    nalar_err   err;
    nalar_lora *a, *b, *c, *d;
    FILE       *in, *out;
    int         ch;
    long        n = 0;

    ok(nalar_lora_check(path, m->path, &err) == 0, "check accepts a good "
       "adapter");
    ok(nalar_lora_check_model(m, path, &err) == 0
       && nalar_lora_check_model(m, path, &err) == 0, "and so does the "
       "check against the base opened once, twice");
    a = nalar_lora_load(m, "a", path, 1, &err);
    b = nalar_lora_load(m, "b", path, 1, &err);
    c = nalar_lora_load(m, "c", path, 2, &err);
    ok(a != NULL && b != NULL && c != NULL, "good adapter loads");
    if (a == NULL || b == NULL || c == NULL) {
        return;
    }
    is_int(a->rank, 4, "rank");
    ok(a->alpha == 8 && a->scale == 1, "alpha 8, scale 1");
    ok(a->layers[0].wq.scale == 2 && c->layers[0].wq.scale == 4,
       "effective scale = alpha / rank * scale");
    ok(a->layers[1].w_down.a.rows == 4 && a->layers[1].w_down.a.cols
       == m->cfg.ffn_dim && a->layers[1].w_down.b.rows == m->cfg.dim
       && a->layers[1].w_down.b.cols == 4, "w_down views: A (4, ffn), "
       "B (dim, 4)");
    ok(same_digest(a, b), "same file twice: same digest");
    ok(!same_digest(a, c), "scale changes the digest");

    /* flip one byte of the last tensor's data */
    snprintf(copy, sizeof(copy), "%s/flip.gguf", dir);
    in = fopen(path, "rb");
    out = fopen(copy, "wb");
    while ((ch = fgetc(in)) != EOF) {
        fputc(ch, out);
        n++;
    }
    fclose(in);
    fseek(out, n - 3, SEEK_SET);
    fputc(0x5a, out);
    fclose(out);
    d = nalar_lora_load(m, "d", copy, 1, &err);
    ok(d != NULL && !same_digest(a, d), "one byte changes the digest");
    test_from_memory(m, path, a);
    nalar_lora_destroy(a);
    nalar_lora_destroy(b);
    nalar_lora_destroy(c);
    nalar_lora_destroy(d);
}


/* phi3: fused qkv and gate|up adapters split into the model's views */
static void
test_phi3(void)
{
    nalar_err    err;
    nalar_model *m = nalar_model_load(PHI3, &err);
    const char  *path;
    nalar_lora  *a;

    if (m == NULL) {
        ok(0, "load %s: %s", PHI3, err.msg);
        return;
    }
    path = write_adapter(m, "phi3.gguf", BAD_NONE);
    err.msg[0] = '\0';
    ok(nalar_lora_check(path, PHI3, &err) == 0, "phi3 adapter checks%s%s",
       err.msg[0] ? ": " : "", err.msg);
    a = nalar_lora_load(m, "p", path, 1, &err);
    ok(a != NULL, "phi3 adapter loads");
    if (a != NULL) {
        const nalar_lora_layer *Y = &a->layers[0];
        const nalar_layer      *L = &m->layers[0];
        size_t                  row = 4 * sizeof(float);

        ok(Y->wq.b.rows == L->wq.rows && Y->wk.b.rows == L->wk.rows
           && Y->wv.b.rows == L->wv.rows
           && (const char *) Y->wk.b.data == (const char *) Y->wq.b.data
                                             + row * L->wq.rows
           && (const char *) Y->wv.b.data == (const char *) Y->wk.b.data
                                             + row * L->wk.rows
           && Y->wq.a.data == Y->wv.a.data, "attn_qkv: B split into q, k, "
           "v rows, A shared");
        ok(Y->w_gate.b.rows == L->w_gate.rows && Y->w_up.b.rows
           == L->w_up.rows && (const char *) Y->w_up.b.data
           == (const char *) Y->w_gate.b.data + row * L->w_gate.rows,
           "ffn_up: B split into gate and up rows");
        ok(Y->wo.a.data != NULL && Y->w_down.a.data != NULL,
           "attn_output and ffn_down adapted");
    }
    nalar_lora_destroy(a);
    nalar_model_destroy(m);
}


/* nalar mkmodel: a random adapter loads; the merged file holds W + s B A
 * in F32 for each adapted matrix and every other tensor as it was */
static void
test_mkmodel(const nalar_model *m)
{
    nalar_mklora_opts o;
    nalar_err         err;
    char              ad[128], mg[128];
    nalar_lora       *a;
    nalar_model      *mm;

    memset(&o, 0, sizeof(o));
    o.base = m->path;
    o.rank = 8;
    o.alpha = 4;
    o.seed = 7;
    o.type = GGML_F16;
    o.targets = "q,v,down";
    snprintf(ad, sizeof(ad), "%s/mk.gguf", dir);
    snprintf(mg, sizeof(mg), "%s/merged.gguf", dir);
    err.msg[0] = '\0';
    ok(nalar_mkmodel_lora(&o, ad, &err) == 0, "mkmodel writes an adapter%s%s",
       err.msg[0] ? ": " : "", err.msg);
    a = nalar_lora_load(m, "mk", ad, 2, &err);
    ok(a != NULL && a->rank == 8 && a->layers[0].wq.a.type == GGML_F16
       && a->layers[0].wk.a.data == NULL && a->layers[1].w_down.a.data
       != NULL && a->layers[0].wq.scale == 1.0f, "targets q, v, down at "
       "rank 8, F16, scale alpha / rank * 2");
    o.targets = "q,x";
    ok(nalar_mkmodel_lora(&o, ad, &err) == -1
       && strstr(err.msg, "unknown target 'x'") != NULL, "unknown target "
       "refused: %s", err.msg);
    o.targets = NULL;
    o.type = GGML_Q8_0;
    ok(nalar_mkmodel_lora(&o, ad, &err) == -1
       && strstr(err.msg, "multiple of 32") != NULL, "q8_0 at rank 8 "
       "refused: %s", err.msg);
    if (a == NULL) {
        return;
    }
    ok(nalar_mkmodel_merge(m->path, ad, 2, mg, &err) == 0, "merge: %s",
       err.msg);
    mm = nalar_model_load(mg, &err);
    ok(mm != NULL, "merged model loads");
    if (mm != NULL) {
        const nalar_lora_mat *V = &a->layers[0].wq;
        const nalar_mat      *W = &m->layers[0].wq, *M = &mm->layers[0].wq;
        double                want = 0, diff;
        int64_t               r = 5, c = 17;

        for (int64_t k = 0; k < V->a.rows; k++) {
            uint16_t hb, ha;

            memcpy(&hb, (const uint16_t *) V->b.data + r * V->b.cols + k, 2);
            memcpy(&ha, (const uint16_t *) V->a.data + k * V->a.cols + c, 2);
            want += (double) nalar_f16_to_f32(hb) * nalar_f16_to_f32(ha);
        }
        {
            uint16_t hw;

            memcpy(&hw, (const uint16_t *) W->data + r * W->cols + c, 2);
            want = nalar_f16_to_f32(hw) + V->scale * want;
        }
        diff = fabs(((const float *) M->data)[r * M->cols + c] - want);
        ok(M->type == GGML_F32 && diff < 1e-6, "merged wq[5][17] = W + s "
           "B A (off by %g)", diff);
        ok(mm->layers[0].wk.type == m->layers[0].wk.type
           && memcmp(mm->layers[0].wk.data, m->layers[0].wk.data,
                     (size_t) ggml_row_size(m->layers[0].wk.type,
                                            (uint64_t) m->layers[0].wk.cols)
                     * (size_t) m->layers[0].wk.rows) == 0,
           "an unadapted matrix is copied as it was");
        ok(memcmp(mm->layers[1].w_down.data, m->layers[1].w_down.data, 64)
           != 0 && mm->layers[1].w_down.type == GGML_F32,
           "an adapted matrix changed");
        nalar_model_destroy(mm);
    }
    nalar_lora_destroy(a);
}


int
main(void)
{
    nalar_err    err;
    nalar_model *m;

    snprintf(dir, sizeof(dir), "/tmp/nalar-lora-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        ok(0, "mkdtemp");
        return done_testing();
    }
    m = nalar_model_load(BASE, &err);
    if (m == NULL) {
        ok(0, "load %s: %s", BASE, err.msg);
        return done_testing();
    }
    test_refusals(m);
    test_hostile(m);
    test_good(m);
    test_phi3();
    test_mkmodel(m);
    nalar_model_destroy(m);
    {
        char cmd[96];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) {
            diag("could not remove %s", dir);
        }
    }
    return done_testing();
}
