/*
 * libFuzzer target for the LoRA adapter loader (src/lora.c): the input is
 * an adapter file's bytes, checked (nalar_lora_check_gguf, what `nginx -t`
 * runs) and loaded (nalar_lora_load_gguf, what the engine runs) against
 * two fixed bases of the conformance kit: llama (separate q, k, v, gate,
 * up) and phi3 (fused attn_qkv and gate | up ffn_up, whose views split
 * B).  The check and the load must agree; a loaded adapter's views must
 * lie inside the input and fit the base's matrices, and each is read at
 * both ends so that ASan sees one that does not.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=lora
 *
 * The bases are read from t/data/conformance/ under the current directory
 * (scripts/fuzz.sh runs from the tree's root), or from the directory in
 * NALAR_FUZZ_BASES.  Seeds (fuzz/corpus/lora): small adapters of both
 * bases written by `nalar mkmodel --lora-of`.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "lora.h"
#include "model.h"

#define N_BASES 2

static nalar_model      *bases[N_BASES];
static volatile uint64_t sink;


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char *const files[N_BASES] = {
        "llama-F16.gguf", "phi3-F16.gguf"
    };
    const char *dir = getenv("NALAR_FUZZ_BASES");
    char        path[512];
    nalar_err   err;

    (void) argc;
    (void) argv;
    for (int i = 0; i < N_BASES; i++) {
        snprintf(path, sizeof(path), "%s/%s",
                 dir != NULL ? dir : "t/data/conformance", files[i]);
        bases[i] = nalar_model_open_meta(path, &err);
        if (bases[i] == NULL) {
            fprintf(stderr, "fuzz_lora: the base model: %s (run from the "
                    "tree's root, or set NALAR_FUZZ_BASES)\n", err.msg);
            exit(1);
        }
    }
    return 0;
}


/* One view: inside [lo, hi), rows x cols as the base's matrix needs, and
 * read at both ends. */
static void
touch(const nalar_mat *v, const uint8_t *lo, const uint8_t *hi)
{
    const uint8_t *p = v->data;
    uint64_t       n = ggml_row_size(v->type, (uint64_t) v->cols)
                       * (uint64_t) v->rows;

    if (n == 0 || p < lo || p > hi || n > (uint64_t) (hi - p)) {
        abort();
    }
    sink += p[0] + p[n - 1];
}


static void
touch_mat(const nalar_lora_mat *a, const nalar_mat *W, const uint8_t *lo,
          const uint8_t *hi)
{
    if (a->a.data == NULL) {
        return;
    }
    /* A (rank, cols), B (rows, rank) against W (rows, cols) */
    if (a->a.cols != W->cols || a->b.rows != W->rows
        || a->b.cols != a->a.rows || a->a.rows < 1
        || a->a.rows > NALAR_LORA_MAX_RANK || !isfinite(a->scale)
        || a->scale < 0)
    {
        abort();
    }
    touch(&a->a, lo, hi);
    touch(&a->b, lo, hi);
}


static void
one_base(const nalar_model *m, const uint8_t *data, size_t size)
{
    const uint8_t *end = data + size;
    nalar_err      err;
    gguf_file     *f;
    nalar_lora    *a;
    int            rc;

    f = gguf_open_mem(data, size, "fuzz.gguf", &err);
    if (f == NULL) {
        return;
    }
    rc = nalar_lora_check_gguf(m, f, &err);
    /* the load takes f (and closes it when it refuses) */
    a = nalar_lora_load_gguf(m, "fuzz", f, 1.5f, &err);
    if ((rc == 0) != (a != NULL)) {
        fprintf(stderr, "fuzz_lora: the check says %d and the load %s: "
                "%s\n", rc, a != NULL ? "loads" : "refuses", err.msg);
        abort();
    }
    if (a == NULL) {
        sink += (uint8_t) err.msg[0];
        return;
    }
    if (a->n_layers != m->cfg.n_layers || a->rank < 1) {
        abort();
    }
    for (int32_t l = 0; l < a->n_layers; l++) {
        const nalar_lora_layer *A = &a->layers[l];
        const nalar_layer      *L = &m->layers[l];

        touch_mat(&A->wq, &L->wq, data, end);
        touch_mat(&A->wk, &L->wk, data, end);
        touch_mat(&A->wv, &L->wv, data, end);
        touch_mat(&A->wo, &L->wo, data, end);
        touch_mat(&A->w_gate, &L->w_gate, data, end);
        touch_mat(&A->w_up, &L->w_up, data, end);
        touch_mat(&A->w_down, &L->w_down, data, end);
    }
    sink += a->digest[0];
    nalar_lora_destroy(a);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int i = 0; i < N_BASES; i++) {
        one_base(bases[i], data, size);
    }
    return 0;
}
