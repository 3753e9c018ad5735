/*
 * One token's products alone (decode's kernels), one thread: the 8-bit
 * rows kernels against the 16-bit mode's (cpu_quant_rows.c, one plane
 * of codes or two: Q4_K, Q5_K, Q6_K; Q8_0's and Q4_0's 16-bit products
 * are cpu_quant_p32.c's, on panels) and the pair multipliers' (one plane
 * of codes c and their n: Q4_K, Q5_K, Q6_K), for each weight type, over
 * the backend's
 * interleaved copy of a matrix of COLS columns: HOT rows held in cache
 * (called again and again) and ROWS rows streamed from memory (read once
 * a call).  x's codes are made once, as a forward pass makes them for
 * the products that share an input (the pair codes here by the nearest
 * n's rule: the kernels' speed does not depend on which n).  Rounds
 * alternate between the three; prints the median of ROUNDS rounds in ns
 * per 256 weights, and the ratios i16/q8, pairs/q8 and pairs/i16 ("prs":
 * the pairs; "-" where a type has no such kernel).
 *   rows [ISA]    (ISA: avx2, avxvnni or vnni; default the widest)
 */
#include <math.h>
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


/* the kinds of x's codes the kernels read */
#define K_Q8    0
#define K_I16   1
#define K_PAIRS 2

/* seconds per call of reps calls of the 8-bit, 16-bit or pair kernel
 * over rows rows; < 0 where there is none */
static double
timed(int kind, ggml_type t, int isa, const uint8_t *w, int64_t rs,
      int64_t rows, const nalar_xq8 *x8, const nalar_xq16 *x16,
      const nalar_xqp *xp, float *y, int reps)
{
    double a = now();
    int    rc = 0;

    /* Q8_0, Q4_0: the 8-bit kernels alone */
    if (kind != K_Q8 && nalar_quant_block(t) != QK_K) {
        return -1;
    }
    for (int k = 0; k < reps; k++) {
        if (kind == K_I16) {
            rc |= nalar_quant_x16_rows(t, isa, w, rs, 1, COLS, x16, y, 0,
                                       rows, 0);
        } else if (kind == K_PAIRS) {
            rc |= nalar_quant_pairs_rows(t, isa, w, rs, 1, COLS, xp, y, 0,
                                         rows, 0);
        } else {
            rc |= nalar_quant_q8_rows(t, isa, w, rs, 1, COLS, x8, y, 0, rows,
                                      0);
        }
    }
    return rc != 0 ? -1 : (now() - a) / reps;
}


/* x's pair codes (per 256: D = amax / (127 * 64); per pair n = ceil(64 *
 * max |pair| / amax), c = round(x / (D n)) clamped) and the 16-bit planes
 * of x' = n * c with their sums of 16 (cpu_quant_x16.c's split), in
 * buf (COLS * 8 bytes and more) */
static void
pair_codes(const float *x, void *buf, nalar_xqp *xp)
{
    int32_t *bs = buf;                          /* two planes' sums */
    float   *dk = (float *) (bs + 2 * COLS / 16);
    int16_t *n = (int16_t *) (dk + COLS / 256);
    int8_t  *c = (int8_t *) (n + COLS / 2), *hi = c + COLS, *lo = hi + COLS;

    for (int b = 0; b < COLS / 256; b++) {
        float amax = 0;

        for (int i = 0; i < 256; i++) {
            amax = fmaxf(amax, fabsf(x[256 * b + i]));
        }
        dk[b] = amax / (127.0f * 64);
        for (int p = 128 * b; p < 128 * (b + 1); p++) {
            float a = fmaxf(fabsf(x[2 * p]), fabsf(x[2 * p + 1]));
            int   k = amax > 0 ? (int) ceilf(64 * a / amax) : 1;

            n[p] = (int16_t) (k < 1 ? 1 : k > 64 ? 64 : k);
            for (int j = 2 * p; j < 2 * p + 2; j++) {
                long    v = dk[b] > 0 ? lrintf(x[j] / (dk[b] * n[p])) : 0;
                int32_t xq, h;

                c[j] = (int8_t) (v < -127 ? -127 : v > 127 ? 127 : v);
                xq = n[p] * c[j];
                h = (xq + 128) >> 8;
                hi[j] = (int8_t) h;
                lo[j] = (int8_t) (xq - 256 * h);
            }
        }
    }
    for (int j = 0; j < COLS / 16; j++) {
        bs[j] = bs[COLS / 16 + j] = 0;
        for (int k = 0; k < 16; k++) {
            bs[j] += hi[16 * j + k];
            bs[COLS / 16 + j] += lo[16 * j + k];
        }
    }
    /* the per-256 codes alone: the pair kernels read no others */
    xp->x16.hi = (nalar_xq8) { NULL, NULL, hi, dk, bs, COLS };
    xp->x16.lo = (nalar_xq8) { NULL, NULL, lo, dk, bs + COLS / 16, COLS };
    xp->ck = c;
    xp->nk = n;
}


/* the medians of ROUNDS alternated rounds, ns per 256 weights: med[k]
 * in cache and med[3 + k] streamed, k a kind (< 0: no kernel) */
static void
measure(ggml_type t, int isa, const uint8_t *w, int64_t rs,
        const nalar_xq8 *x8, const nalar_xq16 *x16, const nalar_xqp *xp,
        float *y, double *med)
{
    double v[6][ROUNDS];
    double hot = (double) HOT * COLS / 256, mem = (double) ROWS * COLS / 256;

    for (int i = -1; i < ROUNDS; i++) {
        for (int k = 0; k < 3; k++) {
            double a = timed(k, t, isa, w, rs, HOT, x8, x16, xp, y, 200);

            if (i >= 0) {
                v[k][i] = a < 0 ? -1 : a * 1e9 / hot;
            }
        }
        for (int k = 0; k < 3; k++) {
            double a = timed(k, t, isa, w, rs, ROWS, x8, x16, xp, y, 2);

            if (i >= 0) {
                v[3 + k][i] = a < 0 ? -1 : a * 1e9 / mem;
            }
        }
    }
    for (int k = 0; k < 6; k++) {
        med[k] = median_of(v[k], ROUNDS);
    }
}


/* a time, or a ratio of two, or "-" where a kernel is missing */
static void
cell(double a, double b)
{
    if (a < 0 || b < 0) {
        printf(" %7s", "-");
    } else {
        printf(" %7.2f", b > 0 ? a / b : a);
    }
}


int
main(int argc, char **argv)
{
    static const ggml_type types[] = {
        GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
    };
    int        isa = nalar_quant_q8_isa_max();
    float     *x, *y, *row;
    void      *b8, *b16, *bp;
    nalar_xq8  x8;
    nalar_xq16 x16;
    nalar_xqp  xp;

    if (argc > 1) {
        isa = strcmp(argv[1], "avx2") == 0 ? NALAR_ISA_AVX2
              : strcmp(argv[1], "avxvnni") == 0 ? NALAR_ISA_AVXVNNI
              : NALAR_ISA_VNNI;
    }
    if (isa < NALAR_ISA_AVX2 || !nalar_quant_isa_ok(isa)) {
        fprintf(stderr, "usage: rows [avx2|avxvnni|vnni] (this CPU: %s)\n",
                nalar_quant_isa_name(nalar_quant_q8_isa_max()));
        return 1;
    }
    x = malloc(COLS * sizeof(float));
    y = malloc(ROWS * sizeof(float));
    row = malloc(COLS * sizeof(float));
    b8 = malloc((size_t) nalar_quant_x8_bytes(1, COLS));
    b16 = malloc((size_t) nalar_quant_x16_bytes(1, COLS));
    bp = malloc(COLS * 8);
    if (x == NULL || y == NULL || row == NULL || b8 == NULL || b16 == NULL
        || bp == NULL)
    {
        return 1;
    }
    srand(1);
    for (int i = 0; i < COLS; i++) {
        x[i] = (float) rand() / RAND_MAX - 0.5f;
    }
    nalar_quant_x8(x, 1, COLS, COLS, b8, &x8);
    nalar_quant_x16(x, 1, COLS, COLS, b16, &x16);
    pair_codes(x, bp, &xp);
    printf("# one token, %d columns, one thread, %s; ns per 256 weights, "
           "median of %d alternated rounds\n", COLS,
           nalar_quant_isa_name(isa), ROUNDS);
    printf("%-5s", "type");
    for (int m = 0; m < 2; m++) {
        static const char *col[] = { "q8", "i16", "prs", "i16/q8",
                                     "prs/q8", "prs/i16" };

        for (int k = 0; k < 6; k++) {
            char h[16];

            snprintf(h, sizeof(h), "%s%s", k < 3 ? (m ? "mem " : "hot ")
                                                 : "", col[k]);
            printf(" %7s", h);
        }
    }
    printf("\n");
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ggml_type t = types[k];
        int64_t   rs = (int64_t) ggml_row_size(t, COLS);
        uint8_t  *src = malloc((size_t) (ROWS * rs));
        uint8_t  *w = malloc((size_t) nalar_quant_interleaved_bytes(
                                 t, ROWS, COLS));
        double    med[6];

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
        measure(t, isa, w, rs, &x8, &x16, &xp, y, med);
        printf("%-5s", ggml_type_name(t));
        for (int m = 0; m < 2; m++) {
            const double *d = med + 3 * m;

            cell(d[0], 0);
            cell(d[1], 0);
            cell(d[2], 0);
            cell(d[1], d[0]);
            cell(d[2], d[0]);
            cell(d[2], d[1]);
        }
        printf("\n");
        free(w);
    }
    free(x);
    free(y);
    free(row);
    free(b8);
    free(b16);
    free(bp);
    return 0;
}
