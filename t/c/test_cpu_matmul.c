/*
 * The CPU matrix product against its contract (kernels/cpu_matmul.h), on
 * awkward shapes: rows not a multiple of 16, row ranges starting and ending
 * inside a panel, 1-9 tokens (every tile width and its remainders) and a
 * prefill-sized block, strided x and y, accumulate or not.
 *   F32/F16/BF16: each output bit-identical to one fmaf chain over the
 *     columns in order (what makes results independent of the tiles).
 *   Q8_0: within 1e-5 (relative to the row's |w|.|x|) of a double sum.
 * Every y element outside the rows and tokens asked for keeps its poison.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "fp16.h"
#include "tap.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;


static uint32_t
next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t) (rng >> 16);
}


static float
frand(void)
{
    return (float) (next() % 2000001) / 1000000.0f - 1.0f;
}


/* a (rows, cols) matrix of `type` with random values; w[] gets them as
 * float (exact: every type widens to float exactly) */
static void *
make_mat(ggml_type type, int64_t rows, int64_t cols, float *w)
{
    size_t   rs = (size_t) ggml_row_size(type, (uint64_t) cols);
    uint8_t *d = malloc(rs * (size_t) rows);

    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = d + rs * (size_t) r;

        for (int64_t c = 0; c < cols; c++) {
            float    f = frand();
            uint16_t h;

            switch (type) {
            case GGML_F32:
                memcpy(row + 4 * c, &f, 4);
                w[r * cols + c] = f;
                break;
            case GGML_F16:
                /* sign, exponent 2^-6 .. 2^1, any mantissa */
                h = (uint16_t) ((next() & 0x8000) | ((9 + next() % 8) << 10)
                                | (next() & 0x3ff));
                memcpy(row + 2 * c, &h, 2);
                w[r * cols + c] = nalar_f16_to_f32(h);
                break;
            case GGML_BF16:
                h = nalar_f32_to_bf16(f);
                memcpy(row + 2 * c, &h, 2);
                w[r * cols + c] = nalar_bf16_to_f32(h);
                break;
            default:
                break;
            }
        }
        if (type == GGML_Q8_0) {
            for (int64_t b = 0; b < cols / QK8_0; b++) {
                uint8_t *blk = row + 34 * b;
                uint16_t h = (uint16_t) ((next() % 4 + 8) << 10
                                         | (next() & 0x3ff));

                memcpy(blk, &h, 2);
                for (int i = 0; i < QK8_0; i++) {
                    int8_t q = (int8_t) (next() % 255 - 127);

                    blk[2 + i] = (uint8_t) q;
                    w[r * cols + b * QK8_0 + i] = (float) q
                                                  * nalar_f16_to_f32(h);
                }
            }
        }
    }
    return d;
}


static int narrowed;    /* products whose F32 W was held as F16 */
static int paired;      /* products of W held as BF16 pair panels */


/* A product of BF16 pair panels (see cpu_matmul.h): each output bit for
 * bit that of its token alone over all rows (a 1-token tile of 8 panels:
 * so every tile shape gives the same bits), and within 1e-5 of the row's
 * |w|.|x| of the double sum of the weights and x rounded to BF16.
 * Returns the count of bad outputs. */
static int
check_pairs(const nalar_cpu_mat *M, const float *w, const float *x, int ldx,
            const float *y, const float *y0, int ldy, int64_t rows,
            int64_t cols, int n_tok, int64_t r0, int64_t r1, int acc)
{
    float *alone = malloc(sizeof(float) * (size_t) rows);
    int    bad = 0;

    for (int t = 0; t < n_tok; t++) {
        nalar_cpu_matmul(M, x + (int64_t) t * ldx, 1, ldx, alone, (int) rows,
                         0, rows, 0);
        for (int64_t r = 0; r < ldy; r++) {
            float  got = y[t * ldy + r], want;
            double s = 0, mag = 0;

            if (r < r0 || r >= r1) {
                bad += memcmp(&got, &y0[t * ldy + r], sizeof(float)) != 0;
                continue;
            }
            want = acc ? y0[t * ldy + r] + alone[r] : alone[r];
            for (int64_t c = 0; c < cols; c++) {
                double p = (double) nalar_bf16_to_f32(nalar_f32_to_bf16(
                               w[r * cols + c]))
                           * nalar_bf16_to_f32(nalar_f32_to_bf16(
                               x[t * ldx + c]));

                s += p;
                mag += fabs(p);
            }
            if (memcmp(&got, &want, sizeof(float)) != 0
                || fabs(alone[r] - s) > 1e-5 * mag + 1e-6)
            {
                if (bad++ < 3) {
                    diag("pairs %lldx%lld tok %d: y[%d,%lld] = %.9g, alone "
                         "%.9g, double %.9g", (long long) rows,
                         (long long) cols, n_tok, t, (long long) r, got,
                         alone[r], s);
                }
            }
        }
    }
    free(alone);
    return bad;
}

static int
check(ggml_type type, int64_t rows, int64_t cols, int n_tok, int64_t r0,
      int64_t r1, int acc, int narrow, float big)
{
    int            ldx = (int) cols + 3, ldy = (int) rows + 5;
    float         *w = malloc(sizeof(float) * (size_t) (rows * cols));
    void          *data = make_mat(type, rows, cols, w);
    float         *x = malloc(sizeof(float) * (size_t) (n_tok * ldx));
    float         *y = malloc(sizeof(float) * (size_t) (n_tok * ldy));
    float         *y0 = malloc(sizeof(float) * (size_t) (n_tok * ldy));
    nalar_mat      W = { type, rows, cols, data };
    nalar_cpu_mat  M;
    nalar_err      err;
    int            bad = 0;

    for (int i = 0; i < n_tok * ldx; i++) x[i] = frand();
    for (int i = 0; i < n_tok * ldy; i++) y0[i] = y[i] = frand() + 7.0f;
    if (big != 0) {
        /* one weight outside F16's range: W must stay F32 */
        w[rows * cols / 2] = big;
        memcpy((uint8_t *) data + 4 * (rows * cols / 2), &big, 4);
    }
    if (nalar_cpu_mat_init(&M, &W, narrow, &err) != 0) {
        diag("%s", err.msg);
        return 1;
    }
    if (M.pairs) {
        paired++;
        nalar_cpu_matmul(&M, x, n_tok, ldx, y, ldy, r0, r1, acc);
        bad = check_pairs(&M, w, x, ldx, y, y0, ldy, rows, cols, n_tok, r0,
                          r1, acc);
        nalar_cpu_mat_free(&M);
        free(w); free(data); free(x); free(y); free(y0);
        return bad;
    }
    if (M.ptype != type) {
        /* narrowed: the products are those of the weights rounded to F16 */
        narrowed++;
        for (int64_t i = 0; i < rows * cols; i++) {
            w[i] = nalar_f16_to_f32(nalar_f32_to_f16(w[i]));
        }
    }
    nalar_cpu_matmul(&M, x, n_tok, ldx, y, ldy, r0, r1, acc);
    for (int t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < ldy; r++) {
            float got = y[t * ldy + r], want;

            if (r < r0 || r >= r1) {
                want = y0[t * ldy + r];     /* untouched */
            } else if (type != GGML_Q8_0) {
                float s = 0;

                for (int64_t c = 0; c < cols; c++) {
                    s = fmaf(w[r * cols + c], x[t * ldx + c], s);
                }
                want = acc ? y0[t * ldy + r] + s : s;
            } else {
                double s = 0, mag = 0;

                for (int64_t c = 0; c < cols; c++) {
                    s += (double) w[r * cols + c] * x[t * ldx + c];
                    mag += fabs((double) w[r * cols + c] * x[t * ldx + c]);
                }
                if (acc) s += y0[t * ldy + r];
                if (fabs(got - s) > 1e-5 * (mag + 8)) {
                    bad++;
                }
                continue;
            }
            if (memcmp(&got, &want, sizeof(float)) != 0) {
                if (bad++ < 3) {
                    diag("type %d %lldx%lld tok %d rows [%lld,%lld): y[%d,"
                         "%lld] = %.9g, want %.9g", (int) type,
                         (long long) rows, (long long) cols, n_tok,
                         (long long) r0, (long long) r1, t, (long long) r,
                         got, want);
                }
            }
        }
    }
    nalar_cpu_mat_free(&M);
    free(w); free(data); free(x); free(y); free(y0);
    return bad;
}


int
main(void)
{
    static const ggml_type types[] = { GGML_F32, GGML_F16, GGML_BF16,
                                       GGML_Q8_0 };
    static const char *names[] = { "f32", "f16", "bf16", "q8_0" };

    for (int ti = 0; ti < 4; ti++) {
        ggml_type type = types[ti];
        int       fails = 0, runs = 0;

        /* rows: under a panel, panels plus a part, many panels (groups of
         * 8 and their remainders); cols: Q8_0 needs multiples of 32 */
        static const int64_t shapes[][2] = {
            { 5, 64 }, { 16, 32 }, { 37, 96 }, { 130, 128 }, { 200, 160 },
            { 384, 64 },
        };

        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            int64_t rows = shapes[si][0];
            int64_t cols = shapes[si][1] + (type == GGML_Q8_0 ? 0 : 3);

            for (int n_tok = 1; n_tok <= 9; n_tok++) {
                int64_t r0 = n_tok % 3 == 0 ? 0 : (rows * n_tok / 11);
                int64_t r1 = n_tok % 2 ? rows : rows - rows / 7;

                fails += check(type, rows, cols, n_tok, r0, r1, n_tok & 1,
                               0, 0) != 0;
                runs++;
            }
            fails += check(type, rows, cols, 70, 0, rows, 0, 0, 0) != 0;
            runs++;
            /* the steps of an ITL target: tiles of 8 in groups of 6
             * panels, a row range that starts and ends inside them */
            for (int n_tok = 16; n_tok <= 48; n_tok += 8) {
                fails += check(type, rows, cols, n_tok, rows / 5,
                               rows - rows / 9, n_tok == 24, 0, 0) != 0;
                runs++;
            }
        }
        ok(fails == 0, "%s: %d of %d products as the contract says",
           names[ti], runs - fails, runs);
    }

    /* a draft's weights (narrow): BF16 pair panels where the CPU has
     * AVX512-BF16, else an F32 W held as F16 */
    {
        int fails = 0, runs = 0;

        narrowed = paired = 0;
        for (int n_tok = 1; n_tok <= 9; n_tok += 4) {
            fails += check(GGML_F32, 130, 131, n_tok, 3, 127, 0, 1, 0) != 0;
            fails += check(GGML_F32, 37, 64, n_tok, 0, 37, 1, 1, 0) != 0;
            runs += 2;
        }
#if defined(__AVX512BF16__)
        for (int n_tok = 1; n_tok <= 10; n_tok++) {
            fails += check(GGML_F32, 384, 67, n_tok, n_tok % 3 ? 16 : 0,
                           384 - n_tok, n_tok & 1, 1, 0) != 0;
            fails += check(GGML_F16, 40, 193, n_tok, 0, 40, 0, 1, 0) != 0;
            fails += check(GGML_BF16, 17, 300, n_tok, 1, 17, 1, 1, 0) != 0;
            runs += 3;
        }
        fails += check(GGML_F32, 130, 96, 70, 0, 130, 0, 1, 0) != 0;
        runs++;
        ok(fails == 0, "narrowed: %d of %d products as the pair contract "
           "says (bits of each token alone; within 1e-5 of the BF16 "
           "products)", runs - fails, runs);
        ok(paired == runs && narrowed == 0, "narrowed: held as bf16 pair "
           "panels (%d of %d)", paired, runs);
        paired = 0;
        fails = check(GGML_F32, 37, 64, 3, 0, 37, 0, 1, 70000.0f) != 0;
        ok(fails == 0 && paired == 1, "narrowed: a weight beyond f16's "
           "range fits bf16 pair panels");
#else
        ok(fails == 0, "f32 narrowed: %d of %d products are those of the "
           "weights rounded to f16", runs - fails, runs);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
        ok(narrowed == runs, "f32 narrowed: held as f16 panels (%d of %d)",
           narrowed, runs);
#else
        ok(narrowed == 0, "f32 narrowed: held as f32 without AVX-512");
#endif
        narrowed = 0;
        fails = check(GGML_F32, 37, 64, 3, 0, 37, 0, 1, 70000.0f) != 0;
        ok(fails == 0 && narrowed == 0, "f32 with a weight beyond f16's "
           "range stays f32 when narrowed");
#endif
    }
    return done_testing();
}
