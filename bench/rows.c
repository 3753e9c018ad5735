/*
 * One token's products alone (decode's kernels), one thread: the 8-bit
 * rows kernels against the 16-bit mode's (cpu_quant_rows.c, one plane
 * of codes or two), for each weight type, over the backend's
 * interleaved copy of a matrix of COLS columns: HOT rows held in cache
 * (called again and again) and ROWS rows streamed from memory (read once
 * a call).  x's codes are made once, as a forward pass makes them for
 * the products that share an input.  Rounds alternate between the two;
 * prints the median of ROUNDS rounds in ns per 256 weights, and the
 * ratio.
 *   rows [ISA]    (ISA: avx2 or vnni; default the widest)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_quant.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "gguf.h"
#include "bench_time.h"

#define COLS   2048
#define HOT    128
#define ROWS   32768
#define ROUNDS 9


/* seconds per call of reps calls of the 8-bit (i16 0) or 16-bit kernel
 * over rows rows */
static double
timed(int i16, ggml_type t, int isa, const uint8_t *w, int64_t rs,
      int64_t rows, const nalar_xq8 *x8, const nalar_xq16 *x16, float *y,
      int reps)
{
    double a = now();

    for (int k = 0; k < reps; k++) {
        if (i16) {
            (void) nalar_quant_x16_rows(t, isa, w, rs, 1, COLS, x16, y, 0,
                                        rows, 0);
        } else {
            (void) nalar_quant_q8_rows(t, isa, w, rs, 1, COLS, x8, y, 0,
                                       rows, 0);
        }
    }
    return (now() - a) / reps;
}


int
main(int argc, char **argv)
{
    static const ggml_type types[] = {
        GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
    };
    int        isa = nalar_quant_q8_isa_max();
    float     *x, *y, *row;
    void      *b8, *b16;
    nalar_xq8  x8;
    nalar_xq16 x16;

    if (argc > 1) {
        isa = strcmp(argv[1], "avx2") == 0 ? NALAR_ISA_AVX2 : NALAR_ISA_VNNI;
    }
    if (isa < NALAR_ISA_AVX2 || isa > nalar_quant_q8_isa_max()) {
        fprintf(stderr, "usage: rows [avx2|vnni] (this CPU: %d)\n",
                nalar_quant_q8_isa_max());
        return 1;
    }
    x = malloc(COLS * sizeof(float));
    y = malloc(ROWS * sizeof(float));
    row = malloc(COLS * sizeof(float));
    b8 = malloc((size_t) nalar_quant_x8_bytes(1, COLS));
    b16 = malloc((size_t) nalar_quant_x16_bytes(1, COLS));
    if (x == NULL || y == NULL || row == NULL || b8 == NULL || b16 == NULL) {
        return 1;
    }
    srand(1);
    for (int i = 0; i < COLS; i++) {
        x[i] = (float) rand() / RAND_MAX - 0.5f;
    }
    nalar_quant_x8(x, 1, COLS, COLS, b8, &x8);
    nalar_quant_x16(x, 1, COLS, COLS, b16, &x16);
    printf("# one token, %d columns, one thread, %s; ns per 256 weights, "
           "median of %d alternated rounds\n", COLS,
           isa == NALAR_ISA_VNNI ? "AVX-512 VNNI" : "AVX2", ROUNDS);
    printf("%-5s %9s %9s %7s %9s %9s %7s\n", "type", "hot q8", "hot i16",
           "i16/q8", "mem q8", "mem i16", "i16/q8");
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ggml_type t = types[k];
        int64_t   rs = (int64_t) ggml_row_size(t, COLS);
        uint8_t  *src = malloc((size_t) (ROWS * rs));
        uint8_t  *w = malloc((size_t) nalar_quant_interleaved_bytes(
                                 t, ROWS, COLS));
        double    h8[ROUNDS], h16[ROUNDS], m8[ROUNDS], m16[ROUNDS];
        double    hot = (double) HOT * COLS / 256, mem = (double) ROWS
                                                       * COLS / 256;

        if (src == NULL || w == NULL) {
            return 1;
        }
        /* rows of 64 random draws, repeated */
        for (int r = 0; r < 64; r++) {
            for (int c = 0; c < COLS; c++) {
                row[c] = (float) rand() / RAND_MAX - 0.5f;
            }
            (void) nalar_quantize_row(t, row, COLS, src + r * rs);
        }
        for (int r = 64; r < ROWS; r++) {
            memcpy(src + r * rs, src + (r % 64) * rs, (size_t) rs);
        }
        nalar_quant_interleave(t, src, ROWS, COLS, w);
        free(src);
        for (int i = -1; i < ROUNDS; i++) {
            double a8 = timed(0, t, isa, w, rs, HOT, &x8, &x16, y, 200);
            double a16 = timed(1, t, isa, w, rs, HOT, &x8, &x16, y, 200);
            double b8s = timed(0, t, isa, w, rs, ROWS, &x8, &x16, y, 2);
            double b16s = timed(1, t, isa, w, rs, ROWS, &x8, &x16, y, 2);

            if (i >= 0) {
                h8[i] = a8 * 1e9 / hot;
                h16[i] = a16 * 1e9 / hot;
                m8[i] = b8s * 1e9 / mem;
                m16[i] = b16s * 1e9 / mem;
            }
        }
        {
            double a = median_of(h8, ROUNDS), b = median_of(h16, ROUNDS);
            double c = median_of(m8, ROUNDS), d = median_of(m16, ROUNDS);

            printf("%-5s %9.2f %9.2f %7.2f %9.2f %9.2f %7.2f\n",
                   ggml_type_name(t), a, b, b / a, c, d, d / c);
        }
        free(w);
    }
    free(x);
    free(y);
    free(row);
    free(b8);
    free(b16);
    return 0;
}
