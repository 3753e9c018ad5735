/*
 * 8-bit activations' integer kernels (cpu_quant_q8.c), for Q8_0, Q4_0,
 * Q4_K, Q5_K and Q6_K:
 *   - x's codes: in [-127, 127], each within half a step of x;
 *   - every instruction set this CPU has (VNNI, AVX2, forced narrower)
 *     gives the scalar reference's bits, on random blocks from the
 *     quantizer and on random bytes with extreme scales and mins (the
 *     largest f16, the smallest, negative, zero);
 *   - the products agree with a double-precision dot product of the
 *     dequantized rows with x's dequantized codes;
 *   - batch invariance: the same bits for a token alone, in a batch (the
 *     SIMD paths' tiles of 8 tokens, a partial tile, codes made 32
 *     tokens at a time), in any split of the rows, from codes made once
 *     or per call, and from the rows interleaved;
 *   - one token (decode's kernels, four rows at a time): every
 *     instruction set's bits are the scalar kernel's, in any split of
 *     the rows, added to y or not, from either layout;
 *   - the tiles (cpu_quant_q8_tiles.c) on each instruction set: every
 *     window of 1 .. 40 tokens (tiles of each width, ragged ones), rows
 *     over two groups and a ragged third, a ragged row range added into
 *     y, interleaved rows: each output the scalar row kernel's bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_q8_tiles.h"
#include "fp16.h"
#include "gguf.h"
#include "tap.h"

static const ggml_type types[] = {
    GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
};

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"



/* n_tok tokens of cols activations: random, with some tokens' groups
 * all zero and some large */
static float *
activations(int n_tok, int64_t cols)
{
    float *x = malloc((size_t) (n_tok * cols) * sizeof(float));

    if (x == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < n_tok * cols; i++) {
        x[i] = frand() * ((i / 32) % 7 == 3 ? 1000.0f : 1.0f);
        if ((i / 32) % 11 == 5) {
            x[i] = 0;
        }
    }
    return x;
}


static void
check_codes(int64_t cols)
{
    int       n_tok = 3, bad = 0;
    float    *x = activations(n_tok, cols);
    void     *buf = malloc((size_t) nalar_quant_x8_bytes(n_tok, cols));
    nalar_xq8 x8;

    if (x == NULL || buf == NULL) {
        ok(0, "codes: out of memory");
        free(x);
        free(buf);
        return;
    }
    nalar_quant_x8(x, n_tok, (int) cols, cols, buf, &x8);
    for (int64_t i = 0; i < n_tok * cols; i++) {
        float d = x8.d[i / 32], dk = x8.dk[i / 256];

        if (x8.q[i] == -128 || x8.qk[i] == -128
            || fabsf(x[i] - (float) x8.q[i] * d) > d * 0.5001f + 1e-30f
            || fabsf(x[i] - (float) x8.qk[i] * dk) > dk * 0.5001f + 1e-30f)
        {
            bad++;
        }
    }
    for (int64_t j = 0; j < n_tok * cols / 16; j++) {
        int32_t s = 0;

        for (int i = 0; i < 16; i++) {
            s += x8.qk[16 * j + i];
        }
        bad += s != x8.bs[j];
    }
    ok(bad == 0, "x's 8-bit codes lie in [-127, 127] within half a step, "
       "with their sums of 16 (%d bad)", bad);
    free(x);
    free(buf);
}


/* y (n_tok, rows) of W (w, il) with x's codes, on isa */
static void
product(ggml_type t, const uint8_t *w, int64_t rs, int il, int64_t rows,
        int64_t cols, const nalar_xq8 *x8, int n_tok, int isa, float *y)
{
    nalar_quant_q8_force(isa);
    nalar_quant_matmul_x8(t, w, rs, il, cols, x8, n_tok, y, (int) rows, 0,
                          rows, 0);
    nalar_quant_q8_force(-1);
}


static void
check_kernel(ggml_type t, int64_t rows, int64_t cols, int n_tok, int kind)
{
    const char *tn = ggml_type_name(t);
    int64_t     rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int         isa_max = nalar_quant_q8_isa_max(), k = nalar_quant_block(t)
                                                     == 256;
    uint8_t    *w = matrix(t, rows, cols, kind);
    float      *x = activations(n_tok, cols);
    float      *deq = malloc((size_t) cols * sizeof(float));
    float      *ref = malloc((size_t) (n_tok * rows) * sizeof(float));
    float      *y = malloc((size_t) (n_tok * rows) * sizeof(float));
    void       *buf = malloc((size_t) nalar_quant_x8_bytes(n_tok, cols));
    nalar_xq8   x8;
    int         bad = 0, il = 0;

    if (w == NULL || x == NULL || deq == NULL || ref == NULL || y == NULL
        || buf == NULL)
    {
        ok(0, "%s: out of memory", tn);
        goto out;
    }
    nalar_quant_x8(x, n_tok, (int) cols, cols, buf, &x8);

    /* the scalar reference against double dot products */
    product(t, w, rs, 0, rows, cols, &x8, n_tok, NALAR_ISA_SCALAR, ref);
    for (int64_t r = 0; r < rows; r++) {
        nalar_dequant_row(t, w + r * rs, cols, deq);
        for (int tk = 0; tk < n_tok; tk++) {
            double s = 0, a = 0;

            for (int64_t c = 0; c < cols; c++) {
                int64_t i = tk * cols + c;
                double  xc = k ? (double) x8.qk[i] * x8.dk[i / 256]
                               : (double) x8.q[i] * x8.d[i / 32];

                s += (double) deq[c] * xc;
                a += fabs((double) deq[c] * xc);
            }
            if (!(fabs(ref[tk * rows + r] - s) <= 1e-5 * a + 1e-30)) {
                if (bad++ == 0) {
                    diag("%s row %lld tok %d: %g, want %g (|.| %g)", tn,
                         (long long) r, tk, ref[tk * rows + r], s, a);
                }
            }
        }
    }
    ok(bad == 0, "%s %s %lldx%lld, %d tokens: the scalar kernel agrees with "
       "a double product of the codes", tn, kind ? "extreme blocks"
       : "quantized rows", (long long) rows, (long long) cols, n_tok);

    /* every instruction set: the scalar bits */
    for (int isa = NALAR_ISA_AVX2; isa <= isa_max; isa++) {
        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }
        product(t, w, rs, 0, rows, cols, &x8, n_tok, isa, y);
        ok(memcmp(y, ref, (size_t) (n_tok * rows) * sizeof(float)) == 0,
           "%s %s: %s gives the scalar kernel's bits", tn,
           kind ? "extreme blocks" : "quantized rows",
           nalar_quant_isa_name(isa));
    }

    /* batch invariance: each token alone, split rows, codes made per
     * call, interleaved rows */
    bad = batch_bad(&(token_case) { t, TOKEN_X8, w, rows, cols, x, NULL },
                    n_tok, &x8, ref, y, &il);
    nalar_quant_matmul_q8(t, w, rs, 0, cols, x, n_tok, (int) cols, y,
                          (int) rows, 0, rows, 0);
    bad += memcmp(y, ref, (size_t) (n_tok * rows) * sizeof(float)) != 0;
    ok(bad == 0, "%s %s: the same bits for each token alone, in split rows, "
       "from codes made per call%s", tn, kind ? "extreme blocks"
       : "quantized rows", il ? ", from interleaved rows" : "");
out:
    free(w);
    free(x);
    free(deq);
    free(ref);
    free(y);
    free(buf);
}


/* one token (decode's kernels, four rows at a time and one): every
 * instruction set gives the scalar kernel's bits, for rows in any split
 * (groups of four and rows alone, their outputs added to y's or not),
 * from rows in the file's order and interleaved; the token: the second
 * of activations(), with its large and zero groups */
static void
check_one_token(ggml_type t, int64_t rows, int64_t cols, int kind)
{
    uint8_t *w = matrix(t, rows, cols, kind);
    float   *x = activations(2, cols);
    char     what[96];

    snprintf(what, sizeof(what), "%s %s %lldx%lld, one token",
             ggml_type_name(t), kind ? "extreme blocks" : "quantized rows",
             (long long) rows, (long long) cols);
    check_token_splits(&(token_case) { t, TOKEN_X8, w, rows, cols,
                                       x != NULL ? x + cols : NULL, NULL },
                       what);
    free(w);
    free(x);
}


/* tokens s .. s + n - 1 of x8's codes, as codes of n tokens */
static nalar_xq8
window(const nalar_xq8 *x8, int s, int64_t cols)
{
    nalar_xq8 v = *x8;

    v.q += s * cols;
    v.d += s * (cols / 32);
    if (v.qk != NULL) {
        v.qk += s * cols;
        v.dk += s * (cols / 256);
        v.bs += s * (cols / 16);
    }
    return v;
}


/* the tiles against the scalar row kernel (see the file's top); cols a
 * multiple of 256 */
static void
check_tiles(ggml_type t, int kind)
{
    const char *tn = ggml_type_name(t);
    int64_t     cols = 512, rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t     rows = 2 * nalar_quant_x8_tile_rows(t, cols) + 3;
    int64_t     ra = 5, rb = rows - 7;
    int         n_max = 40, isa_max = nalar_quant_q8_isa_max();
    uint8_t    *w = matrix(t, rows, cols, kind);
    uint8_t    *il = malloc((size_t) nalar_quant_interleaved_bytes(t, rows,
                                                                    cols));
    float      *x = activations(n_max, cols);
    float      *ref = malloc((size_t) (n_max * rows) * sizeof(float));
    float      *y = malloc((size_t) (n_max * rows) * sizeof(float));
    void       *buf = malloc((size_t) nalar_quant_x8_bytes(n_max, cols));
    nalar_xq8   x8;

    if (w == NULL || il == NULL || x == NULL || ref == NULL || y == NULL
        || buf == NULL)
    {
        ok(0, "%s tiles: out of memory", tn);
        goto out;
    }
    nalar_quant_x8(x, n_max, (int) cols, cols, buf, &x8);
    nalar_quant_interleave(t, w, rows, cols, il);
    product(t, w, rs, 0, rows, cols, &x8, n_max, NALAR_ISA_SCALAR, ref);
    for (int isa = NALAR_ISA_AVX2; isa <= isa_max; isa++) {
        int bad = 0, ran = 0;

        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }

        for (int n = 1; n <= n_max; n++) {
            int       s = (n * 5) % (n_max - n + 1);
            nalar_xq8 v = window(&x8, s, cols);

            /* the tiles themselves, then through the dispatch */
            for (int i = 0; i < n * rows; i++) {
                y[i] = 1.0f;
            }
            ran += nalar_quant_x8_tiles(t, isa, w, rs, 0, cols, &v, n, y,
                                        (int) rows, 0, rows, 0) == 0;
            bad += tokens_bad(y, ref + s * rows, n, rows, tn, isa);
            product(t, n % 2 ? il : w, rs, n % 2, rows, cols, &v, n, isa,
                    y);
            bad += tokens_bad(y, ref + s * rows, n, rows, tn, isa);

            /* rows [ra, rb) added into y; the others untouched */
            ragged_fill(y, n, rows);
            ran += nalar_quant_x8_tiles(t, isa, il, rs, 1, cols, &v, n, y,
                                        (int) rows, ra, rb, 1) == 0;
            bad += ragged_bad(y, ref + s * rows, n, rows, ra, rb);
        }
        ok(bad == 0 && ran == 2 * n_max, "%s %s, %lld rows: the %s tiles "
           "of 1 .. %d tokens give the scalar kernel's bits, over whole "
           "and ragged row ranges, interleaved or not (%d bad, %d of %d "
           "ran)", tn, kind ? "extreme blocks" : "quantized rows",
           (long long) rows, nalar_quant_isa_name(isa), n_max, bad, ran,
           2 * n_max);
    }
out:
    free(w);
    free(il);
    free(x);
    free(ref);
    free(y);
    free(buf);
}


int
main(void)
{
    const char *isa[] = { "scalar", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };

    diag("this CPU's widest path: %s", isa[nalar_quant_q8_isa_max()]);
    check_codes(1024);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_kernel(types[i], 13, 512, 3, 0);
        check_kernel(types[i], 13, 512, 3, 1);
        check_kernel(types[i], 9, 2048, 2, 1);
        /* tiles of 8 tokens and a partial one, in chunks of 32 codes */
        check_kernel(types[i], 7, 512, 37, 1);
        check_one_token(types[i], 13, 512, 0);
        check_one_token(types[i], 13, 512, 1);
        check_one_token(types[i], 18, 2048, 1);
        if (nalar_quant_block(types[i]) == 32) {
            /* rows of 11 and of 1 block: a turn of eight blocks cut
             * short, pairs and a block alone */
            check_one_token(types[i], 7, 352, 1);
            check_one_token(types[i], 6, 32, 0);
        }
        check_tiles(types[i], 0);
        check_tiles(types[i], 1);
    }
    return done_testing();
}
