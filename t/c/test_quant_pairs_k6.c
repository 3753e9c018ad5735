/*
 * The pairs mode's Q6_K (cpu_quant_pairs_k6.c: its own contract, L of
 * x' = n * c exact in int32, acc = fma(s, (float) L, acc)): the pairs'
 * tiles (nalar_quant_pairs_tiles) on each instruction set this CPU has,
 * every window of 1 .. 40 tokens (tiles of each width, ragged ones),
 * rows over two row groups and a ragged third, columns in two passes
 * (1024 and the rest), a ragged row range added into y, both layouts,
 * alone and through nalar_quant_matmul_pairs: each output the pairs
 * scalar reference's bits (nalar_quant_pairs_scalar); codes made up
 * (random, c = +-127 with n = 64, all at 127), weights from the
 * quantizer, random bytes with extreme scales, every code and scale at
 * its largest.  A matrix whose every lane is one where (float) L is not
 * the 16-bit contract's fmaf(256, (float) L_hi, (float) L_lo): the
 * reference gives the contract's value, the 16-bit reference another,
 * and the rows, the tiles and the dispatch the pairs reference's.  And
 * end to end, every type: x's pair codes made by nalar_quant_xpairs and
 * nalar_quant_matmul_pairs over 1, 3 and 17 tokens give each token the
 * bits it gets alone, on each instruction set, scalar included.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_pairs_k6.h"
#include "cpu_quant_q8_tiles.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "cpu_quant_x16_tiles.h"
#include "gguf.h"
#include "tap.h"

static uint64_t rng_state = 0x6a09e667f3bcc909ull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"
#include "quant_test_pairs.h"


/* the pairs reference for all of the codes (x: an nalar_xqp) */
static void
refer_all(const tile_case *c, float *ref)
{
    const nalar_xqp *xp = c->x;

    nalar_quant_pairs_scalar(c->t, c->w, c->rs, 0, c->cols, &xp->x16,
                             c->n_max, ref, (int) c->rows, 0, c->rows, 0);
}


/* tokens s .. s + n - 1 of the codes (x: an nalar_xqp) by the pairs
 * tiles, or through nalar_quant_matmul_pairs (one token: the rows) */
static int
run_window(const tile_case *c, int isa, int dispatch, const uint8_t *m,
           int lay, int s, int n, float *y, int64_t r0, int64_t r1, int acc)
{
    nalar_xqp v = xp_window(c->x, s, c->cols);

    if (!dispatch) {
        return nalar_quant_pairs_tiles(c->t, isa, m, c->rs, lay, c->cols,
                                       &v.x16, n, y, (int) c->rows, r0, r1,
                                       acc);
    }
    nalar_quant_q8_force(isa);
    nalar_quant_matmul_pairs(c->t, m, c->rs, lay, c->cols, &v, n, y,
                             (int) c->rows, r0, r1, acc);
    nalar_quant_q8_force(-1);
    return 0;
}


/* the tiles against the pairs reference (see the file's top) */
static void
check_tiles(ggml_type t, int kind, int xkind)
{
    const char *tn = ggml_type_name(t);
    int64_t     cols = 1280, rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t     rows = 2 * nalar_quant_x8_tile_rows(t, cols) + 3;
    int         n_max = 40, bad[NALAR_ISA_VNNI + 1], ran[NALAR_ISA_VNNI + 1];
    uint8_t    *w = matrix(t, rows, cols, kind);
    void       *mem = NULL;
    nalar_xqp   xp;
    const char *wk = kind == 0 ? "quantized rows" : kind == 1
                     ? "extreme blocks" : "largest codes";

    if (w == NULL || make_codes(cols, n_max, xkind, &xp, &mem) != 0
        || tile_windows_bad(&(tile_case) { t, w, rs, rows, cols, 5, rows - 7,
                                           n_max, &xp, refer_all,
                                           run_window }, bad, ran) != 0)
    {
        ok(0, "%s pairs tiles: out of memory", tn);
        goto out;
    }
    for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max(); isa++) {
        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }
        ok(bad[isa] == 0 && ran[isa] == 2 * n_max, "%s %s, %s, %lld rows: "
           "the %s pairs tiles of 1 .. %d tokens give the pairs reference's "
           "bits, alone and through the dispatch, over whole and ragged row "
           "ranges, interleaved or not (%d bad, %d of %d ran)", tn, wk,
           xkind_name[xkind], (long long) rows,
           nalar_quant_isa_name(isa), n_max, bad[isa],
           ran[isa], 2 * n_max);
    }
out:
    free(mem);
    free(w);
}


/*
 * Q6_K blocks whose codes are 63, scales 127 and f16 scale 1, against
 * codes (D 1) whose every lane is x_lane's: per block each lane's L =
 * 40005, so y = 8 * 40005 * nb - I (the blocks' lanes, and their
 * sums, exact in float; I = 32 * 127 * sum of x', exact) where the
 * 16-bit contract's lanes are 40004; the rows, the tiles and the
 * dispatch (1 and 3 tokens), each instruction set, give the pairs
 * reference's value
 */
static void
check_lane(void)
{
    int64_t    cols = 512, rows = 6, nb = cols / QK_K;
    int64_t    rs = (int64_t) ggml_row_size(GGML_Q6_K, (uint64_t) cols);
    int        n_tok = 3, bad = 0, isa_max = nalar_quant_q8_isa_max();
    uint8_t   *w = malloc((size_t) (rows * rs));
    float      ref[3 * 6], r16[3 * 6], y[3 * 6], want;
    void      *mem = NULL;
    nalar_xqp  xp;
    int64_t    I = 0;

    if (w == NULL || make_codes(cols, n_tok, X_LANE, &xp, &mem) != 0) {
        ok(0, "Q6_K lanes: out of memory");
        free(w);
        free(mem);
        return;
    }
    for (int64_t i = 0; i < rows * rs; i++) {
        int64_t o = i % QK6_K_BYTES;

        w[i] = o < 192 ? 0xFF : o < 208 ? 127 : o == 208 ? 0x00 : 0x3C;
    }
    for (int64_t i = 0; i < cols; i++) {
        I += 32 * 127 * (xp.x16.hi.qk[i] * 256 + xp.x16.lo.qk[i]);
    }
    want = (float) (8 * 40005 * nb) - (float) I;
    nalar_quant_pairs_scalar(GGML_Q6_K, w, rs, 0, cols, &xp.x16, n_tok, ref,
                             (int) rows, 0, rows, 0);
    nalar_quant_x16_scalar(GGML_Q6_K, w, rs, 0, cols, &xp.x16, n_tok, r16,
                           (int) rows, 0, rows, 0);
    for (int i = 0; i < n_tok * rows; i++) {
        bad += memcmp(&ref[i], &want, sizeof(float)) != 0
               || memcmp(&r16[i], &want, sizeof(float)) == 0;
    }
    ok(bad == 0, "Q6_K lanes of L = 40005: the pairs reference gives %.1f, "
       "the contract's (the 16-bit reference %.1f)", (double) ref[0],
       (double) r16[0]);
    bad = 0;
    for (int isa = NALAR_ISA_AVX2; isa <= isa_max; isa++) {
        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }
        for (int i = 0; i < n_tok * rows; i++) {
            y[i] = 0.0f;
        }
        bad += nalar_quant_pairs_rows(GGML_Q6_K, isa, w, rs, 0, cols, &xp, y,
                                      0, rows, 0) != 0;
        bad += memcmp(y, ref, (size_t) rows * sizeof(float)) != 0;
        bad += nalar_quant_pairs_tiles(GGML_Q6_K, isa, w, rs, 0, cols,
                                       &xp.x16, n_tok, y, (int) rows, 0,
                                       rows, 0) != 0;
        bad += memcmp(y, ref, sizeof(ref)) != 0;
        for (int n = 1; n <= n_tok; n += 2) {
            nalar_quant_q8_force(isa);
            memset(y, 0, sizeof(y));
            nalar_quant_matmul_pairs(GGML_Q6_K, w, rs, 0, cols, &xp, n, y,
                                     (int) rows, 0, rows, 0);
            nalar_quant_q8_force(-1);
            bad += memcmp(y, ref, (size_t) (n * rows) * sizeof(float)) != 0;
        }
    }
    ok(bad == 0, "Q6_K lanes of L = 40005: the pair rows, the pairs tiles "
       "and nalar_quant_matmul_pairs (1 and 3 tokens) on every instruction "
       "set give the pairs reference's bits (%d bad)", bad);
    free(w);
    free(mem);
}


/* x's pair codes from floats: the whole batch's outputs and each token's
 * alone (its codes made alone), bit for bit, on every instruction set */
static void
check_alone(ggml_type t)
{
    const char *tn = ggml_type_name(t);
    int64_t     cols = 768, rows = 11;
    int64_t     rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int         n_max = 17, bad = 0, runs = 0;
    uint8_t    *w = matrix(t, rows, cols, 0);
    float      *x = malloc((size_t) (n_max * cols) * sizeof(float));
    float      *y = malloc((size_t) (n_max * rows) * sizeof(float));
    float      *y1 = malloc((size_t) rows * sizeof(float));
    void       *buf = malloc((size_t) nalar_quant_xpairs_bytes(n_max, cols));
    void       *b1 = malloc((size_t) nalar_quant_xpairs_bytes(1, cols));
    static const int counts[] = { 1, 3, 17 };

    if (w == NULL || x == NULL || y == NULL || y1 == NULL || buf == NULL
        || b1 == NULL)
    {
        ok(0, "%s pairs end to end: out of memory", tn);
        goto out;
    }
    for (int64_t i = 0; i < n_max * cols; i++) {
        x[i] = frand() * (i % 97 == 0 ? 40.0f : 1.0f);
    }
    for (int isa = NALAR_ISA_SCALAR; isa <= nalar_quant_q8_isa_max(); isa++) {
        nalar_quant_q8_force(isa);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            int       n = counts[c];
            nalar_xqp xp, x1;

            nalar_quant_xpairs(x, n, (int) cols, cols, buf, &xp);
            nalar_quant_matmul_pairs(t, w, rs, 0, cols, &xp, n, y,
                                     (int) rows, 0, rows, 0);
            for (int k = 0; k < n; k++) {
                nalar_quant_xpairs(x + k * cols, 1, (int) cols, cols, b1,
                                   &x1);
                nalar_quant_matmul_pairs(t, w, rs, 0, cols, &x1, 1, y1,
                                         (int) rows, 0, rows, 0);
                if (memcmp(y1, y + k * rows, (size_t) rows * sizeof(float))
                    != 0 && bad++ == 0)
                {
                    diag("%s isa %d, %d tokens: token %d differs from its "
                         "own", tn, isa, n, k);
                }
            }
            runs++;
        }
    }
    nalar_quant_q8_force(-1);
    ok(bad == 0 && runs > 0, "%s: nalar_quant_matmul_pairs over 1, 3 and 17 "
       "tokens gives each token the bits it gets alone, on every "
       "instruction set (%d runs)", tn, runs);
out:
    free(w);
    free(x);
    free(y);
    free(y1);
    free(buf);
    free(b1);
}


int
main(void)
{
    static const ggml_type all[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                     GGML_Q8_0, GGML_Q4_0 };
    const char *isa[] = { "scalar", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };

    diag("this CPU's widest path: %s", isa[nalar_quant_q8_isa_max()]);
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        check_alone(all[i]);
    }
    if (nalar_quant_q8_isa_max() < NALAR_ISA_AVX2) {
        return done_testing();
    }
    check_lane();
    for (int kind = 0; kind < 3; kind++) {
        for (int xkind = 0; xkind < 3; xkind++) {
            check_tiles(GGML_Q6_K, kind, xkind);
        }
    }
    /* the other types' pairs tiles: the 16-bit ones */
    check_tiles(GGML_Q4_K, 0, X_RANDOM);
    return done_testing();
}
