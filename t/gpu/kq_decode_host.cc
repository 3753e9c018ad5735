/*
 * The CUDA kernels' block decoding (kernels/cuda/kq_decode.cuh) built as
 * host C++, with no GPU: every weight a GEMV lane decodes (lane l takes
 * columns 8l .. 8l + 7 of every 256, as gemv_kq.cu walks a row) has the
 * bits of the CPU's nalar_dequant_row, for
 *   - random bytes (every scale, min and code pattern; the f16 scales kept
 *     finite),
 *   - rows from the project's quantizer,
 *   - every Q4_0/Q4_K/Q5_K/Q6_K tensor of the conformance kit's files
 *     (made by the reference quantizer).
 * Run from the repository root (t/75-cuda-kq-host.t).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kq_decode.cuh"

extern "C" {
#include "cpu_quant.h"
#include "tap.h"
}

#define KIT "t/data/conformance"


static int
kq_type(ggml_type t)
{
    return t == GGML_Q4_0 || t == GGML_Q4_K || t == GGML_Q5_K
           || t == GGML_Q6_K;
}


/* a row as the kernels decode it, in the order their lanes walk it */
static void
kernel_row(ggml_type t, const uint8_t *row, int64_t cols, float *out)
{
    for (int lane = 0; lane < 32; lane++) {
        for (int64_t c = 8 * lane; c < cols; c += 256) {
            switch (t) {
            case GGML_Q4_0: dequant8<GGML_Q4_0>(row, c, out + c); break;
            case GGML_Q4_K: dequant8<GGML_Q4_K>(row, c, out + c); break;
            case GGML_Q5_K: dequant8<GGML_Q5_K>(row, c, out + c); break;
            default:        dequant8<GGML_Q6_K>(row, c, out + c); break;
            }
        }
    }
}


/* weights whose bits differ between the kernels' decoding and the CPU's
 * over rows x cols of type t at data */
static long
differing(ggml_type t, const uint8_t *data, int64_t rows, int64_t cols)
{
    int64_t rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    float  *a = (float *) malloc((size_t) cols * sizeof(float));
    float  *b = (float *) malloc((size_t) cols * sizeof(float));
    long    n = 0;

    for (int64_t r = 0; a != NULL && b != NULL && r < rows; r++) {
        kernel_row(t, data + r * rs, cols, a);
        nalar_dequant_row(t, data + r * rs, cols, b);
        for (int64_t c = 0; c < cols; c++) {
            n += memcmp(&a[c], &b[c], sizeof(float)) != 0;
        }
    }
    if (a == NULL || b == NULL) {
        n = -1;
    }
    free(a);
    free(b);
    return n;
}


/* the byte offsets of a block's f16 scales: d, and dmin (-1: none) */
static void
f16_fields(ggml_type t, int *d, int *dmin)
{
    *d = t == GGML_Q6_K ? 208 : 0;
    *dmin = t == GGML_Q4_K || t == GGML_Q5_K ? 2 : -1;
}


int
main(void)
{
    static const ggml_type types[] = { GGML_Q4_0, GGML_Q4_K, GGML_Q5_K,
                                       GGML_Q6_K };
    const int64_t rows = 37, cols = 1024;
    int           files = 0, tensors = 0;
    DIR          *dir;
    struct dirent *e;

    srand(1);
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ggml_type t = types[k];
        int64_t   rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
        uint8_t  *w = (uint8_t *) malloc((size_t) (rows * rs));
        float     x[1024];
        int       bytes = (int) ggml_row_size(t, t == GGML_Q4_0 ? QK4_0
                                                                 : QK_K);
        int       d, dmin;
        long      n;

        if (w == NULL) {
            ok(0, "memory");
            return 1;
        }
        f16_fields(t, &d, &dmin);
        for (int64_t i = 0; i < rows * rs; i++) {
            w[i] = (uint8_t) rand();
        }
        /* finite scales: an f16 exponent below 31 */
        for (int64_t o = 0; o < rows * rs; o += bytes) {
            w[o + d + 1] &= 0xBB;
            if (dmin >= 0) {
                w[o + dmin + 1] &= 0xBB;
            }
        }
        n = differing(t, w, rows, cols);
        ok(n == 0, "%s: random blocks, %lld x %lld: the kernels' decoding "
           "has the CPU's bits (%ld differ)", ggml_type_name(t),
           (long long) rows, (long long) cols, n);

        /* the comparison sees a change: one code byte of row 0 moved */
        w[bytes - 1] ^= 0x11;
        {
            float a[1024], b[1024];

            kernel_row(t, w, cols, a);
            w[bytes - 1] ^= 0x11;
            nalar_dequant_row(t, w, cols, b);
            ok(memcmp(a, b, sizeof(a)) != 0, "%s: a changed byte shows",
               ggml_type_name(t));
        }

        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) {
                x[c] = (float) rand() / (float) RAND_MAX * 2.0f - 1.0f;
            }
            nalar_quantize_row(t, x, cols, w + r * rs);
        }
        n = differing(t, w, rows, cols);
        ok(n == 0, "%s: the project's quantizer's rows: the CPU's bits (%ld "
           "differ)", ggml_type_name(t), n);
        free(w);
    }

    dir = opendir(KIT);
    if (dir == NULL) {
        ok(0, "%s can be read", KIT);
        return 1;
    }
    while ((e = readdir(dir)) != NULL) {
        char       path[512];
        size_t     len = strlen(e->d_name);
        nalar_err  err;
        gguf_file *g;

        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", KIT, e->d_name);
        g = gguf_open(path, &err);
        if (g == NULL) {
            ok(0, "%s: %s", path, err.msg);
            continue;
        }
        files++;
        for (uint64_t k = 0; k < g->n_tensors; k++) {
            const gguf_tensor *t = &g->tensors[k];
            int64_t            trows = 1;
            long               n;

            if (!kq_type(t->type)) {
                continue;
            }
            for (uint32_t q = 1; q < t->n_dims; q++) {
                trows *= (int64_t) t->ne[q];
            }
            n = differing(t->type, (const uint8_t *) t->data, trows,
                          (int64_t) t->ne[0]);
            ok(n == 0, "%s: %.*s (%s, %lld x %lld): the CPU's bits (%ld "
               "differ)", e->d_name, (int) t->name.len, t->name.ptr,
               ggml_type_name(t->type), (long long) trows,
               (long long) t->ne[0], n);
            tensors++;
        }
        gguf_close(g);
    }
    closedir(dir);
    ok(files > 0 && tensors >= 100, "the kit's files were read: %d files, "
       "%d block-type tensors", files, tensors);
    return done_testing();
}
