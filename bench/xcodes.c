/*
 * x's codes alone: the time each activation mode's code maker takes per
 * token (nalar_quant_x8, nalar_quant_x16, nalar_quant_xpairs; and the
 * pair codes per 256 alone, all that a K-quant model's backend makes,
 * nalar_quant_xpairs_groups) for rows
 * of cols values, one token at a time as decode makes them, on each
 * instruction set path this CPU has.  Medians of 21 timings of a loop.
 *
 *   make -f bench/bench.mk build/bench/xcodes && build/bench/xcodes [COLS..]
 *
 * Default COLS: 2048 and 5632 (the ~1.1B Llama shape's dim and ffn of
 * bench/quant.sh).  A token of that model makes 22 x (3 x 2048 + 5632) +
 * 2048 values' codes per thread.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_time.h"
#include "cpu_quant.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float) ((double) (rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}


/* seconds per call of mode m (0 q8, 1 i16, 2 pairs, 3 pairs per 256)
 * on x */
static double
time_mode(int m, const float *x, int64_t cols, void *buf)
{
    double    t[21];
    int       reps = (int) (2000000 / cols) + 1;
    nalar_xq8 c8;
    nalar_xq16 c16;
    nalar_xqp cp;

    for (int k = 0; k < 21; k++) {
        double t0 = now();

        for (int r = 0; r < reps; r++) {
            if (m == 0) {
                nalar_quant_x8(x, 1, (int) cols, cols, buf, &c8);
            } else if (m == 1) {
                nalar_quant_x16(x, 1, (int) cols, cols, buf, &c16);
            } else if (m == 2) {
                nalar_quant_xpairs(x, 1, (int) cols, cols, buf, &cp);
            } else {
                nalar_quant_xpairs_groups(x, 1, (int) cols, cols,
                                          NALAR_XP_G256, buf, &cp);
            }
        }
        t[k] = (now() - t0) / reps;
    }
    return median_of(t, 21);
}


int
main(int argc, char **argv)
{
    static const char *isa[] = { "scalar", "avx2", "avx-vnni", "avx512" };
    int64_t            def[] = { 2048, 5632 };
    int                n = argc > 1 ? argc - 1 : 2;

    printf("%-8s %6s %8s %8s %9s %9s %9s\n", "isa", "cols", "q8 us",
           "i16 us", "pairs us", "p256 us", "p256/i16");
    for (int i = 0; i < n; i++) {
        int64_t cols = argc > 1 ? atoll(argv[i + 1]) : def[i];
        float  *x = malloc((size_t) cols * sizeof(float));
        void   *buf = malloc((size_t) nalar_quant_xpairs_bytes(1, cols));

        if (x == NULL || buf == NULL || cols <= 0 || cols % 256 != 0) {
            fprintf(stderr, "xcodes: cols a positive multiple of 256\n");
            return 1;
        }
        for (int64_t k = 0; k < cols; k++) {
            x[k] = frand();
        }
        for (int s = nalar_quant_q8_isa_max(); s >= NALAR_ISA_SCALAR; s--) {
            double t8, t16, tp, tk;

            nalar_quant_q8_force(s);
            t8 = time_mode(0, x, cols, buf);
            t16 = time_mode(1, x, cols, buf);
            tp = time_mode(2, x, cols, buf);
            tk = time_mode(3, x, cols, buf);
            printf("%-8s %6lld %8.2f %8.2f %9.2f %9.2f %9.1f\n", isa[s],
                   (long long) cols, t8 * 1e6, t16 * 1e6, tp * 1e6,
                   tk * 1e6, tk / t16);
        }
        free(x);
        free(buf);
    }
    return 0;
}
