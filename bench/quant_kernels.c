/*
 * The CPU's matrix products alone, one token and one thread, for each
 * weight type and every activations' mode (f32, i16, and q8 with its
 * 8-bit codes made in each call, as for the output projections): a
 * matrix held in cache (128 rows by 2048, called again and again) and
 * one streamed from memory (ROWS by 2048, read once a call), through
 * nalar_cpu_matmul over the backend's own copy (nalar_cpu_mat_init), as
 * a forward pass calls it.  Also a prefill's product: PREFILL tokens
 * against the PF_ROWS rows held in cache.  Prints billions of weights
 * (for the prefill, of weight x token products) a second and the bytes
 * read, medians of 5 calls.  bench/quant.sh builds and runs it.
 *   quant_kernels [ROWS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_matmul.h"
#include "cpu_quant.h"
#include "fp16.h"
#include "bench_time.h"

#define COLS  2048
#define HOT   128       /* rows of the matrix held in cache */
#define CALLS 5
#define PREFILL 32      /* tokens of the prefill's product */
#define PF_ROWS 512     /* its rows, held in cache */


/* seconds of the median of CALLS calls of n_reps products of n_tok
 * tokens over rows */
static double
median_call(const nalar_cpu_mat *M, const float *x, int n_tok, float *y,
            int64_t rows, int n_reps)
{
    double t[CALLS];

    for (int k = 0; k < CALLS; k++) {
        double t0 = now();

        for (int i = 0; i < n_reps; i++) {
            nalar_cpu_matmul(M, x, n_tok, COLS, y, (int) rows, 0, rows, 0);
        }
        t[k] = (now() - t0) / n_reps;
    }
    qsort(t, CALLS, sizeof(double), cmp_double);
    return t[CALLS / 2];
}


/* a rows x COLS matrix of type t with random weights (rows of 64 random
 * draws repeated), or NULL */
static uint8_t *
random_matrix(ggml_type t, int64_t rows)
{
    int64_t  rb = (int64_t) ggml_row_size(t, COLS);
    uint8_t *w = malloc((size_t) (rows * rb));
    float    row[COLS];

    if (w == NULL) {
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *d = w + r * rb;

        if (r < 64) {
            for (int c = 0; c < COLS; c++) {
                row[c] = (float) rand() / (float) RAND_MAX - 0.5f;
            }
        }
        if (t == GGML_F16) {
            for (int c = 0; c < COLS; c++) {
                uint16_t h = nalar_f32_to_f16(row[c]);

                memcpy(d + 2 * c, &h, 2);
            }
        } else if (r < 64) {
            nalar_quantize_row(t, row, COLS, d);
        } else {
            memcpy(d, w + (r % 64) * rb, (size_t) rb);
        }
    }
    return w;
}


int
main(int argc, char **argv)
{
    static const ggml_type types[] = { GGML_F16, GGML_Q8_0, GGML_Q4_K,
                                       GGML_Q6_K };
    int64_t   rows = argc > 1 ? atoll(argv[1]) : 65536;
    static float x[PREFILL * COLS];
    float    *y = malloc((size_t) (rows > PREFILL * PF_ROWS
                                   ? rows : PREFILL * PF_ROWS)
                         * sizeof(float));
    nalar_err err;

    if (y == NULL || rows < PF_ROWS) {
        fprintf(stderr, "quant_kernels: ROWS >= %d, and memory\n", PF_ROWS);
        return 1;
    }
    srand(1);
    for (int c = 0; c < PREFILL * COLS; c++) {
        x[c] = (float) rand() / (float) RAND_MAX - 0.5f;
    }
    printf("| weights | activations | in cache (Gw/s) | streamed (Gw/s) "
           "| streamed (GB/s) | prefill %d tokens (G products/s) |\n"
           "|---|---|---:|---:|---:|---:|\n", PREFILL);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        ggml_type     t = types[i];
        int64_t       rb = (int64_t) ggml_row_size(t, COLS);
        uint8_t      *w = random_matrix(t, rows);
        nalar_mat     W;
        nalar_cpu_mat M;

        if (w == NULL) {
            fprintf(stderr, "quant_kernels: out of memory\n");
            return 1;
        }
        memset(&W, 0, sizeof(W));
        W.type = t;
        W.rows = rows;
        W.cols = COLS;
        W.data = w;
        if (nalar_cpu_mat_init(&M, &W, 0, &err) != 0) {
            fprintf(stderr, "quant_kernels: %s\n", err.msg);
            return 1;
        }
        for (int i16 = 0; i16 <= 2 * nalar_quant_type(t); i16++) {
            double hot, cold, pf;

            M.act_i16 = i16;
            /* in cache: the first HOT rows, again and again */
            hot = median_call(&M, x, 1, y, HOT, 200);
            cold = median_call(&M, x, 1, y, rows, 1);
            pf = median_call(&M, x, PREFILL, y, PF_ROWS, 2);
            printf("| %s | %s | %.1f | %.1f | %.1f | %.1f |\n",
                   ggml_type_name(t), i16 == 2 ? "q8" : i16 ? "i16"
                                                       : "f32",
                   (double) HOT * COLS / hot / 1e9,
                   (double) rows * COLS / cold / 1e9,
                   (double) rows * rb / cold / 1e9,
                   (double) PREFILL * PF_ROWS * COLS / pf / 1e9);
        }
        nalar_cpu_mat_free(&M);
        free(w);
    }
    free(y);
    return 0;
}
