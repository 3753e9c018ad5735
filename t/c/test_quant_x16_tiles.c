/*
 * The 16-bit mode's tiles (cpu_quant_x16_tiles.c), for Q4_K, Q5_K and
 * Q6_K (Q8_0 and Q4_0 have none: cpu_quant_p32.c), on each instruction
 * set this CPU has: every window of 1 .. 40 tokens (tiles of each width,
 * ragged ones), rows over two row groups and a ragged third (3 rows),
 * columns in two passes (1024 and the rest), a ragged row range added
 * into y, both weight layouts, the tiles called alone and through
 * nalar_quant_matmul_x16: each output the scalar reference's bits
 * (nalar_quant_x16_scalar).  Weights: random blocks from the quantizer,
 * random bytes with extreme f16 scales and mins, and every code, 6-bit
 * scale and min at its largest magnitude; x: codes from nalar_quant_x16,
 * and codes made up at the extremes (+-32639, planes' bytes at -128 and
 * +-127, groups all at one extreme, zero scales).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_q8_tiles.h"
#include "cpu_quant_x16.h"
#include "cpu_quant_x16_tiles.h"
#include "fp16.h"
#include "gguf.h"
#include "tap.h"

static const ggml_type types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"



/* ------------------------------------------------------------------ */
/* x's 16-bit codes and the scalar reference (the contract's operations) */


/* x's codes: nalar_quant_x16's in buf, or made up in the other fields
 * (the codes per 256 alone: the K-quants read no others) */
typedef struct {
    int8_t    *kh, *kl;             /* planes */
    float     *dk;
    int32_t   *bh, *bl;             /* each plane's sums of 16 */
    int16_t   *c;                   /* the full codes */
    void      *buf;
    nalar_xq16 x;
} codes16;


static void
codes_free(codes16 *C)
{
    free(C->kh); free(C->kl); free(C->dk); free(C->bh); free(C->bl);
    free(C->c); free(C->buf);
}


/* planes and sums from the full codes */
static void
codes_split(codes16 *C, int n_tok, int64_t cols)
{
    for (int64_t i = 0; i < n_tok * cols; i++) {
        int hi = (C->c[i] + 128) >> 8;

        C->kh[i] = (int8_t) hi;
        C->kl[i] = (int8_t) (C->c[i] - 256 * hi);
    }
    for (int64_t j = 0; j < n_tok * cols / 16; j++) {
        int32_t sh = 0, sl = 0;

        for (int i = 0; i < 16; i++) {
            sh += C->kh[16 * j + i];
            sl += C->kl[16 * j + i];
        }
        C->bh[j] = sh;
        C->bl[j] = sl;
    }
    C->x.hi = (nalar_xq8) { NULL, NULL, C->kh, C->dk, C->bh, cols };
    C->x.lo = (nalar_xq8) { NULL, NULL, C->kl, C->dk, C->bl, cols };
}


/* x's codes: from activations by nalar_quant_x16 (kind 0: random, some
 * groups zero, some large), or made up at the extremes (kind 1: codes
 * +-32639, planes' bytes at -128 and +-127, groups all at one extreme,
 * scales zero) */
static int
codes_make(codes16 *C, int n_tok, int64_t cols, int kind)
{
    size_t n = (size_t) (n_tok * cols);

    memset(C, 0, sizeof(*C));
    if (kind == 0) {
        float *x = malloc(n * sizeof(float));

        C->buf = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
        if (x == NULL || C->buf == NULL) {
            free(x);
            codes_free(C);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            x[i] = frand() * ((i / 32) % 7 == 3 ? 1000.0f : 1.0f);
            if ((i / 32) % 11 == 5) {
                x[i] = 0;
            }
        }
        nalar_quant_x16(x, n_tok, (int) cols, cols, C->buf, &C->x);
        free(x);
        return 0;
    }
    C->kh = malloc(n);
    C->kl = malloc(n);
    C->dk = malloc(n / 256 * sizeof(float));
    C->bh = malloc(n / 16 * sizeof(int32_t));
    C->bl = malloc(n / 16 * sizeof(int32_t));
    C->c = malloc(n * sizeof(int16_t));
    if (C->kh == NULL || C->kl == NULL || C->dk == NULL || C->bh == NULL
        || C->bl == NULL || C->c == NULL)
    {
        codes_free(C);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        static const int16_t ext[] = { 32639, -32639, 128, -128, 127,
                                       -127, 32512, -32512, 0, 32383 };
        int16_t v = rnd() % 3 == 0 ? (int16_t) (rnd() % 65279 - 32639)
                    : ext[rnd() % (sizeof(ext) / sizeof(ext[0]))];

        /* some groups of 256 all at one extreme */
        if ((i / 256) % 5 == 2) {
            v = (i / 256) % 2 ? 32639 : -32639;
        }
        C->c[i] = v;
    }
    for (size_t b = 0; b < n / 256; b++) {
        C->dk[b] = b % 7 == 3 ? 0 : (float) (1 + b % 4) * 1e-4f;
    }
    codes_split(C, n_tok, cols);
    return 0;
}


/* tokens s .. s + n - 1 of the codes, as codes of n tokens (the codes
 * per 32, where there are some, too) */
static nalar_xq16
window(const nalar_xq16 *x, int s, int64_t cols)
{
    nalar_xq16 v = *x;
    nalar_xq8 *p[2] = { &v.hi, &v.lo };

    for (int i = 0; i < 2; i++) {
        if (p[i]->q != NULL) {
            p[i]->q += s * cols;
            p[i]->d += s * (cols / 32);
        }
        p[i]->qk += s * cols;
        p[i]->dk += s * (cols / 256);
        p[i]->bs += s * (cols / 16);
    }
    return v;
}


/* the scalar reference for all of the codes (x: an nalar_xq16) */
static void
refer_all(const tile_case *c, float *ref)
{
    nalar_quant_x16_scalar(c->t, c->w, c->rs, 0, c->cols, c->x, c->n_max,
                           ref, (int) c->rows, 0, c->rows, 0);
}


/* tokens s .. s + n - 1 of the codes (x: an nalar_xq16) by the 16-bit
 * tiles, or through nalar_quant_matmul_x16 */
static int
run_window(const tile_case *c, int isa, int dispatch, const uint8_t *m,
           int lay, int s, int n, float *y, int64_t r0, int64_t r1, int acc)
{
    nalar_xq16 v = window(c->x, s, c->cols);

    if (!dispatch) {
        return nalar_quant_x16_tiles(c->t, isa, m, c->rs, lay, c->cols, &v,
                                     n, y, (int) c->rows, r0, r1, acc);
    }
    nalar_quant_q8_force(isa);
    nalar_quant_matmul_x16(c->t, m, c->rs, lay, c->cols, &v, n, y,
                           (int) c->rows, r0, r1, acc);
    nalar_quant_q8_force(-1);
    return 0;
}


/* the tiles against the scalar reference (see the file's top); cols a
 * multiple of 256, and a pass of the tiles over the rows 1024 columns at
 * a time and a ragged rest */
static void
check_tiles(ggml_type t, int kind, int ckind)
{
    const char *tn = ggml_type_name(t);
    int64_t     cols = 1280, rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t     rows = 2 * nalar_quant_x8_tile_rows(t, cols) + 3;
    int         n_max = 40, bad[NALAR_ISA_VNNI + 1], ran[NALAR_ISA_VNNI + 1];
    uint8_t    *w = matrix(t, rows, cols, kind);
    codes16     C;
    const char *wk = kind == 0 ? "quantized rows" : kind == 1
                     ? "extreme blocks" : "largest codes";

    if (codes_make(&C, n_max, cols, ckind) != 0) {
        ok(0, "%s tiles: out of memory", tn);
        free(w);
        return;
    }
    if (w == NULL
        || tile_windows_bad(&(tile_case) { t, w, rs, rows, cols, 5, rows - 7,
                                           n_max, &C.x, refer_all,
                                           run_window }, bad, ran) != 0)
    {
        ok(0, "%s tiles: out of memory", tn);
        goto out;
    }
    for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max(); isa++) {
        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }
        ok(bad[isa] == 0 && ran[isa] == 2 * n_max, "%s %s, %s codes, %lld "
           "rows: the %s tiles of 1 .. %d tokens give the scalar "
           "reference's bits, alone and through the dispatch, over whole "
           "and ragged row ranges, interleaved or not (%d bad, %d of %d "
           "ran)", tn, wk, ckind ? "extreme" : "quantized", (long long) rows,
           nalar_quant_isa_name(isa), n_max, bad[isa],
           ran[isa], 2 * n_max);
    }
out:
    codes_free(&C);
    free(w);
}


int
main(void)
{
    const char *isa[] = { "scalar", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };

    diag("this CPU's widest path: %s", isa[nalar_quant_q8_isa_max()]);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int ckind = 0; ckind < 2; ckind++) {
                check_tiles(types[i], kind, ckind);
            }
        }
    }
    return done_testing();
}
