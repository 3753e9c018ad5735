/*
 * One token's pair-multiplier kernels (nalar_quant_pairs_rows,
 * cpu_quant_rows.c) for Q4_K, Q5_K and Q6_K: x's codes made here (per
 * 256 values a step D, per pair an n in [1, 64] and two codes c in
 * [-127, 127]; random, and at the extremes c = +-127 with n = 64), the
 * 16-bit planes of x' = n * c and their sums of 16 built here by the
 * split rule of cpu_quant_x16.c; against the pairs mode's scalar
 * reference on those planes (nalar_quant_pairs_scalar: for Q4_K and
 * Q5_K the 16-bit one's, nalar_quant_x16_scalar), bit for bit, on each
 * instruction set this CPU has (AVX2, AVX-512 VNNI), rows in the file's
 * order and interleaved, row ranges starting and ending off the four-row
 * turns, added to y or not, weights from the quantizer, random bytes
 * with extreme scales and mins, and every code, scale and min at its
 * largest (Q6_K's lanes at -2,097,414,144).  And where there is no
 * kernel: -1, y untouched (scalar, Q8_0, Q4_0, no per-256 codes).  Q6_K's
 * pairs contract (cpu_quant_pairs_k6.c) is not the 16-bit one: a lane
 * where (float) L is not fmaf(256, (float) L_hi, (float) L_lo) is checked
 * here, and a matrix of such lanes in test_quant_pairs_k6.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_pairs_k6.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "gguf.h"
#include "tap.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"
#include "quant_test_pairs.h"

static const char *wkind_name[] = { "quantized rows", "extreme blocks",
                                    "saturated blocks" };


/* one matrix and one token's codes: each instruction set's pair kernels
 * give the pairs reference's bits on x' = n * c, rows in any split off
 * the four-row turns, added to y or not, both layouts (cols a multiple of
 * 256: the rows interleave) */
static void
check_rows(ggml_type t, int64_t rows, int64_t cols, int wkind, int xkind)
{
    uint8_t   *w = matrix(t, rows, cols, wkind);
    void      *mem = NULL;
    nalar_xqp  xp;
    int        made = make_codes(cols, 1, xkind, &xp, &mem) == 0;
    char       what[128];

    snprintf(what, sizeof(what), "%s %s, %s, %lldx%lld, x' = n * c",
             ggml_type_name(t), wkind_name[wkind], xkind_name[xkind],
             (long long) rows, (long long) cols);
    check_token_splits(&(token_case) { t, TOKEN_PAIRS, w, rows, cols, NULL,
                                       made ? &xp : NULL }, what);
    free(w);
    free(mem);
}


/* where there is no kernel: -1 and y untouched */
static void
check_none(void)
{
    static const ggml_type other[] = { GGML_Q8_0, GGML_Q4_0 };
    int64_t    cols = 512, rows = 8;
    int        bad = 0;
    void      *mem = NULL;
    nalar_xqp  xp;
    float      y[8];
    uint8_t   *w = matrix(GGML_Q4_K, rows, cols, 0);

    if (w == NULL || make_codes(cols, 1, X_RANDOM, &xp, &mem) != 0) {
        ok(0, "no kernel: out of memory");
        free(w);
        free(mem);
        return;
    }
    for (int i = 0; i < 8; i++) {
        y[i] = 3.0f;
    }
    bad |= nalar_quant_pairs_rows(GGML_Q4_K, NALAR_ISA_SCALAR, w,
                                  (int64_t) ggml_row_size(GGML_Q4_K, 512), 0,
                                  cols, &xp, y, 0, rows, 0) != -1;
    for (size_t k = 0; k < sizeof(other) / sizeof(other[0]); k++) {
        uint8_t *m = matrix(other[k], rows, cols, 0);

        bad |= m == NULL
               || nalar_quant_pairs_rows(other[k], NALAR_ISA_AVX2, m,
                                         (int64_t) ggml_row_size(other[k],
                                                                 512),
                                         0, cols, &xp, y, 0, rows, 0) != -1;
        free(m);
    }
    xp.ck = NULL;
    bad |= nalar_quant_pairs_rows(GGML_Q4_K, NALAR_ISA_AVX2, w,
                                  (int64_t) ggml_row_size(GGML_Q4_K, 512), 0,
                                  cols, &xp, y, 0, rows, 0) != -1;
    for (int i = 0; i < 8; i++) {
        bad |= y[i] != 3.0f;
    }
    ok(bad == 0, "no pair kernel (scalar, Q8_0, Q4_0, no codes c): "
       "-1, y untouched");
    free(w);
    free(mem);
}


/* Q6_K: a lane of one block (its 32 weights: 8 groups x 4, codes w 63,
 * scales 127) against x' = n * c of 16 pairs: 7 of (128, 128) (n 2, c
 * 64), 8 of (-128, -128) (n 2, c -64), one (132, 129) (n 3, c 44, 43).
 * L = 256 L_hi + L_lo is exact in int32, but the contract's fmaf(256,
 * (float) L_hi, (float) L_lo) rounds L_lo (odd, past 2^24) first */
static void
check_q6k_lane(void)
{
    static const int xs[16][3] = {
        { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 },
        { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 }, { 2, -64, -64 },
        { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 },
        { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 }, { 3, 44, 43 }
    };
    int32_t Lh = 0, Ll = 0, L = 0;

    for (int p = 0; p < 16; p++) {
        for (int k = 1; k < 3; k++) {
            int32_t x = xs[p][0] * xs[p][k], h = (x + 128) >> 8;

            Lh += 127 * 63 * h;
            Ll += 127 * 63 * (x - 256 * h);
            L += 127 * 63 * xs[p][0] * xs[p][k];
        }
    }
    ok(L == 256 * Lh + Ll && (float) L != fmaf(256.0f, (float) Lh,
                                                (float) Ll),
       "Q6_K: a lane where (float) L (%d: %.1f) is not the 16-bit "
       "contract's fmaf(256, (float) L_hi, (float) L_lo) (%d, %d: %.1f)",
       L, (double) (float) L, Lh, Ll,
       (double) fmaf(256.0f, (float) Lh, (float) Ll));
}


int
main(void)
{
    static const ggml_type types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
    const char *isa[] = { "scalar", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };

    diag("this CPU's widest path: %s", isa[nalar_quant_q8_isa_max()]);
    check_none();
    check_q6k_lane();
    if (nalar_quant_q8_isa_max() < NALAR_ISA_AVX2) {
        return done_testing();
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_rows(types[i], 13, 256, 0, X_RANDOM);
        check_rows(types[i], 13, 512, 1, X_RANDOM);
        check_rows(types[i], 18, 2304, 1, X_RANDOM);
        check_rows(types[i], 11, 4096, 0, X_RANDOM);
        check_rows(types[i], 9, 512, 2, X_EXTREME);
        check_rows(types[i], 9, 768, 2, X_MAX);
        check_rows(types[i], 9, 1024, 1, X_EXTREME);
        check_rows(types[i], 6, 512, 0, X_MAX);
    }
    return done_testing();
}
