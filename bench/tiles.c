/*
 * The tiles' products alone (two tokens or more), one thread: the 8-bit
 * tiles (cpu_quant_q8_tiles.c) against the 16-bit mode's
 * (cpu_quant_x16_tiles.c: the K-quants'; Q8_0's and Q4_0's 16-bit
 * products are cpu_quant_p32.c's, on panels: "-") and, for Q6_K, the
 * pair multipliers' (their own Q6_K tiles, nalar_quant_pairs_tiles; Q4_K's
 * and Q5_K's pairs tiles are the 16-bit ones: "-"), for each weight
 * type, ROWS x COLS weights held
 * in L2-sized row groups as the tiles take them, N tokens.  Rounds
 * alternate between them; prints the median of ROUNDS rounds in ns per
 * 256 weights and token, and the ratios.
 *   tiles [N [ISA [TYPE]]]    (ISA: avx2, avxvnni or vnni, default the widest;
 *                              TYPE: one type's rows only, e.g. q4_k,
 *                              as for perf record on one kernel)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cpu_quant.h"
#include "cpu_quant_q8_tiles.h"
#include "cpu_quant_x16_tiles.h"
#include "gguf.h"
#include "bench_time.h"

#ifndef ROWS
#define ROWS   1024
#endif
#ifndef COLS
#define COLS   2048
#endif
#define ROUNDS 7


int
main(int argc, char **argv)
{
    static const ggml_type types[] = {
        GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
    };
    int        n = argc > 1 ? atoi(argv[1]) : 16;
    int        isa = nalar_quant_q8_isa_max();
    float     *x, *y, *row;
    void      *b8;
    nalar_xq8  x8;
    nalar_xq16 x16;

    if (argc > 2) {
        isa = strcmp(argv[2], "avx2") == 0 ? NALAR_ISA_AVX2
              : strcmp(argv[2], "avxvnni") == 0 ? NALAR_ISA_AVXVNNI
              : NALAR_ISA_VNNI;
    }
    if (n < 2 || isa < NALAR_ISA_AVX2 || !nalar_quant_isa_ok(isa)) {
        fprintf(stderr, "usage: tiles [N >= 2 [avx2|avxvnni|vnni [TYPE]]] "
                "(this CPU: %s)\n",
                nalar_quant_isa_name(nalar_quant_q8_isa_max()));
        return 1;
    }
    x = malloc((size_t) n * COLS * sizeof(float));
    y = malloc((size_t) n * ROWS * sizeof(float));
    row = malloc(COLS * sizeof(float));
    b8 = malloc((size_t) nalar_quant_x8_bytes(n, COLS));
    if (x == NULL || y == NULL || row == NULL || b8 == NULL) {
        return 1;
    }
    srand(1);
    for (int64_t i = 0; i < (int64_t) n * COLS; i++) {
        x[i] = (float) rand() / RAND_MAX - 0.5f;
    }
    nalar_quant_x8(x, n, COLS, COLS, b8, &x8);
    /* the 16-bit and pairs tiles' time does not depend on the codes'
     * values: the 8-bit codes stand in for both planes */
    x16.hi = x8;
    x16.lo = x8;
    printf("# %d tokens, %d x %d weights, one thread, %s; ns per 256 "
           "weights and token, median of %d alternated rounds\n", n, ROWS,
           COLS, nalar_quant_isa_name(isa), ROUNDS);
    printf("%-5s %8s %8s %8s %7s %7s %7s\n", "type", "q8", "i16", "prs",
           "i16/q8", "prs/q8", "prs/i16");
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ggml_type t = types[k];
        int64_t   rs = (int64_t) ggml_row_size(t, COLS);
        uint8_t  *w = malloc((size_t) (ROWS * rs));
        double    t8[ROUNDS], t16[ROUNDS], tp[ROUNDS];
        double    per = (double) n * ROWS * COLS / 256;
        int       k16 = nalar_quant_block(t) == QK_K;   /* 16-bit tiles */

        if (argc > 3 && strcasecmp(argv[3], ggml_type_name(t)) != 0) {
            free(w);
            continue;
        }
        if (w == NULL) {
            return 1;
        }
        for (int r = 0; r < ROWS; r++) {
            for (int c = 0; c < COLS; c++) {
                row[c] = (float) rand() / RAND_MAX - 0.5f;
            }
            (void) nalar_quantize_row(t, row, COLS, w + r * rs);
        }
        for (int i = -1; i < ROUNDS; i++) {
            double a = now(), b, c, d;

            (void) nalar_quant_x8_tiles(t, isa, w, rs, 0, COLS, &x8, n, y,
                                        ROWS, 0, ROWS, 0);
            b = now();
            if (k16) {
                (void) nalar_quant_x16_tiles(t, isa, w, rs, 0, COLS, &x16, n,
                                             y, ROWS, 0, ROWS, 0);
            }
            c = now();
            if (t == GGML_Q6_K) {
                (void) nalar_quant_pairs_tiles(t, isa, w, rs, 0, COLS, &x16,
                                               n, y, ROWS, 0, ROWS, 0);
            }
            d = now();
            if (i >= 0) {
                t8[i] = (b - a) * 1e9 / per;
                t16[i] = (c - b) * 1e9 / per;
                tp[i] = (d - c) * 1e9 / per;
            }
        }
        qsort(t8, ROUNDS, sizeof(double), cmp_double);
        qsort(t16, ROUNDS, sizeof(double), cmp_double);
        qsort(tp, ROUNDS, sizeof(double), cmp_double);
        printf("%-5s %8.2f", ggml_type_name(t), t8[ROUNDS / 2]);
        if (!k16) {
            printf(" %8s %8s %7s %7s %7s\n", "-", "-", "-", "-", "-");
        } else if (t == GGML_Q6_K) {
            printf(" %8.2f %8.2f %7.2f %7.2f %7.2f\n", t16[ROUNDS / 2],
                   tp[ROUNDS / 2], t16[ROUNDS / 2] / t8[ROUNDS / 2],
                   tp[ROUNDS / 2] / t8[ROUNDS / 2],
                   tp[ROUNDS / 2] / t16[ROUNDS / 2]);
        } else {
            printf(" %8.2f %8s %7.2f %7s %7s\n", t16[ROUNDS / 2], "-",
                   t16[ROUNDS / 2] / t8[ROUNDS / 2], "-", "-");
        }
        free(w);
    }
    free(x);
    free(y);
    free(row);
    free(b8);
    return 0;
}
