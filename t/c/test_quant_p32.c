/*
 * The 16-bit activations' Q8_0 and Q4_0 products on panels of 16 rows
 * (cpu_quant_p32.c):
 *   - the layout: packed from either row layout (il 0, il 1) the panels
 *     are the same bytes, each (row, block) reads back as the file's
 *     block, and unpacked they are the source again (il 1: with its
 *     zero padding rows, as nalar_quant_interleave lays them out);
 *   - the scalar reference against the contract restated here: L of
 *     each block in int64 from the file's bytes (Q8_0's int8 codes,
 *     Q4_0's nibbles less 8) and x's 16-bit codes, checked to fit in
 *     int32, then the fmaf chain; on every layout, the same bits;
 *   - the kernels of each instruction set this CPU has, on the panels:
 *     1 .. 19 tokens (whole tiles and ragged ones), rows in whole panels
 *     and ragged ranges added into y, weights from the quantizer, random
 *     bytes with extreme scales and every code at its largest magnitude,
 *     x random and at its largest codes: each output the reference's
 *     bits; through nalar_quant_matmul_x16 too;
 *   - a matrix of the CPU backend (nalar_cpu_mat_act): in panels while
 *     its activations are i16 or pairs, back in its own layout (the same
 *     bytes as before) for q8 and f32, each mode's products the bits of
 *     that mode's kernels on the source rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_matmul.h"
#include "cpu_quant.h"
#include "cpu_quant_p32.h"
#include "fp16.h"
#include "gguf.h"
#include "tap.h"

static uint64_t rng_state = 0x3c6ef372fe94f82bull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"

#define ROWS 37        /* two panels and a ragged third */
#define MAX_TOK 19


static const ggml_type types[] = { GGML_Q8_0, GGML_Q4_0 };


/* x's 16-bit codes of n tokens of cols values: random (kind 0), or every
 * value +-1, so each code is +-32639 (kind 1) */
static void *
codes(int n, int64_t cols, int kind, nalar_xq16 *x16)
{
    float *x = malloc((size_t) (n * cols) * sizeof(float));
    void  *buf = malloc((size_t) nalar_quant_x16_bytes(n, cols) + 64);

    if (x == NULL || buf == NULL) {
        free(x);
        free(buf);
        return NULL;
    }
    for (int64_t i = 0; i < n * cols; i++) {
        x[i] = kind == 0 ? frand() * (float) (1 + i % 5)
                         : (rnd() & 1) ? 1.0f : -1.0f;
    }
    nalar_quant_x16(x, n, cols, cols, buf, x16);
    free(x);
    return buf;
}


/* the contract, restated: y of row r, token tk (rows rs bytes apart) */
static float
contract(ggml_type t, const uint8_t *w, int64_t rs, int64_t cols,
         const nalar_xq16 *x16, int64_t r, int tk, int *wide)
{
    int64_t bytes = t == GGML_Q8_0 ? 34 : 18;
    float   acc = 0;

    for (int64_t b = 0; b < cols / 32; b++) {
        const uint8_t *blk = w + r * rs + b * bytes;
        int64_t        L = 0;
        uint16_t       h;
        float          dw;

        for (int i = 0; i < 32; i++) {
            int64_t q = t == GGML_Q8_0 ? (int8_t) blk[2 + i]
                        : (int64_t) ((blk[2 + i % 16] >> (i < 16 ? 0 : 4))
                                     & 0x0F) - 8;
            int64_t c = 256 * (int64_t) x16->hi.q[tk * cols + 32 * b + i]
                        + x16->lo.q[tk * cols + 32 * b + i];

            L += q * c;
        }
        *wide += L > INT32_MAX || L < INT32_MIN;
        memcpy(&h, blk, 2);
        dw = nalar_f16_to_f32(h);
        acc = fmaf(dw * x16->hi.d[tk * (cols / 32) + b], (float) L, acc);
    }
    return acc;
}


static void
check_layout(ggml_type t, const uint8_t *w, int64_t cols, const char *tn)
{
    int64_t  rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t  bytes = rs / (cols / 32), pb = nalar_quant_p32_bytes(t, ROWS,
                                                                  cols);
    int64_t  ib = nalar_quant_interleaved_bytes(t, ROWS, cols);
    uint8_t *p0 = malloc((size_t) pb), *p1 = malloc((size_t) pb);
    uint8_t *il = malloc((size_t) ib), *back = malloc((size_t) ib);
    int      bad_blk = 0;

    if (p0 == NULL || p1 == NULL || il == NULL || back == NULL) {
        ok(0, "%s: memory for the layouts", tn);
        goto out;
    }
    ok(pb == (ROWS + 15) / 16 * 16 * rs, "%s: panels of %d rows take %lld "
       "bytes (rows padded to 16)", tn, ROWS, (long long) pb);
    nalar_quant_interleave(t, w, ROWS, cols, il);
    nalar_quant_p32_pack(t, w, rs, 0, ROWS, cols, p0);
    nalar_quant_p32_pack(t, il, rs, 1, ROWS, cols, p1);
    ok(memcmp(p0, p1, (size_t) pb) == 0, "%s: packed from the file's rows "
       "and from the interleaved ones, the same panels", tn);
    for (int64_t r = 0; r < ROWS; r++) {
        for (int64_t b = 0; b < cols / 32; b++) {
            uint8_t blk[34];

            nalar_quant_p32_block(t, p0, cols, r, b, blk);
            bad_blk += memcmp(blk, w + r * rs + b * bytes,
                              (size_t) bytes) != 0;
        }
    }
    ok(bad_blk == 0, "%s: every (row, block) of the panels reads back as "
       "the file's block (%d differ)", tn, bad_blk);
    memset(back, 0xa5, (size_t) ib);
    nalar_quant_p32_unpack(t, p0, ROWS, cols, 0, rs, back);
    ok(memcmp(back, w, (size_t) (ROWS * rs)) == 0, "%s: unpacked into the "
       "file's layout, the source rows", tn);
    memset(back, 0xa5, (size_t) ib);
    nalar_quant_p32_unpack(t, p0, ROWS, cols, 1, rs, back);
    ok(memcmp(back, il, (size_t) ib) == 0, "%s: unpacked into the "
       "interleaved layout, nalar_quant_interleave's bytes", tn);
out:
    free(p0);
    free(p1);
    free(il);
    free(back);
}


/* the reference on each layout against the contract; the kernels on the
 * panels against the reference */
static void
check_products(ggml_type t, const uint8_t *w, int64_t cols, int xkind,
               const char *tn)
{
    int64_t     rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t     pb = nalar_quant_p32_bytes(t, ROWS, cols);
    uint8_t    *p = malloc((size_t) pb);
    uint8_t    *il = malloc((size_t) nalar_quant_interleaved_bytes(t, ROWS,
                                                                   cols));
    nalar_xq16  x16;
    void       *xb = codes(MAX_TOK, cols, xkind, &x16);
    float      *ref = malloc(sizeof(float) * MAX_TOK * ROWS);
    float      *y = malloc(sizeof(float) * MAX_TOK * ROWS);
    int         wide = 0, bad = 0, bad_il = 0;

    if (p == NULL || il == NULL || xb == NULL || ref == NULL || y == NULL) {
        ok(0, "%s: memory for the products", tn);
        goto out;
    }
    nalar_quant_p32_pack(t, w, rs, 0, ROWS, cols, p);
    nalar_quant_interleave(t, w, ROWS, cols, il);
    nalar_quant_p32_scalar(t, w, rs, 0, cols, &x16, MAX_TOK, ref, ROWS, 0,
                           ROWS, 0);
    for (int tk = 0; tk < MAX_TOK; tk++) {
        for (int64_t r = 0; r < ROWS; r++) {
            float v = contract(t, w, rs, cols, &x16, r, tk, &wide);

            bad += memcmp(&v, &ref[tk * ROWS + r], sizeof(v)) != 0;
        }
    }
    ok(bad == 0 && wide == 0, "%s: the scalar reference is the contract "
       "(%d outputs differ; %d blocks' L past int32)", tn, bad, wide);
    nalar_quant_p32_scalar(t, p, 0, P32_IL, cols, &x16, MAX_TOK, y, ROWS, 0,
                           ROWS, 0);
    bad = tokens_bad(y, ref, MAX_TOK, ROWS, tn, 0);
    nalar_quant_p32_scalar(t, il, rs, 1, cols, &x16, MAX_TOK, y, ROWS, 0,
                           ROWS, 0);
    bad_il = tokens_bad(y, ref, MAX_TOK, ROWS, tn, 0);
    ok(bad == 0 && bad_il == 0, "%s: the reference on the panels and on "
       "the interleaved rows, the same bits (%d, %d differ)", tn, bad,
       bad_il);
    for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max(); isa++) {
        int bad_n = 0, bad_r = 0, ran = 1;

        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }

        for (int n = 1; n <= MAX_TOK; n++) {
            ran &= nalar_quant_p32_kernel(isa, t, p, cols, &x16, n, y, ROWS,
                                          0, ROWS, 0) == 0;
            bad_n += tokens_bad(y, ref, n, ROWS, tn, isa);
            /* a ragged range, added into y */
            ragged_fill(y, n, ROWS);
            ran &= nalar_quant_p32_kernel(isa, t, p, cols, &x16, n, y, ROWS,
                                          3, 35, 1) == 0;
            bad_r += ragged_bad(y, ref, n, ROWS, 3, 35);
        }
        ok(ran && bad_n == 0 && bad_r == 0, "%s isa %d: 1 .. %d tokens over "
           "all rows, the reference's bits (%d differ); rows 3 .. 34 added "
           "into y (%d differ)", tn, isa, MAX_TOK, bad_n, bad_r);
    }
    nalar_quant_matmul_x16(t, p, 0, P32_IL, cols, &x16, 7, y, ROWS, 0, ROWS,
                           0);
    bad = tokens_bad(y, ref, 7, ROWS, tn, -1);
    nalar_quant_matmul_x16(t, w, rs, 0, cols, &x16, 7, y, ROWS, 0, ROWS, 0);
    bad_il = tokens_bad(y, ref, 7, ROWS, tn, -1);
    ok(bad == 0 && bad_il == 0, "%s: nalar_quant_matmul_x16 on the panels "
       "and on the file's rows, the reference's bits (%d, %d differ)", tn,
       bad, bad_il);
out:
    free(p);
    free(il);
    free(xb);
    free(ref);
    free(y);
}


/* a backend matrix through the modes: its layout and its products */
static void
check_modes(ggml_type t, const uint8_t *w, int64_t cols, const char *tn)
{
    int64_t       rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t       ib = nalar_quant_interleaved_bytes(t, ROWS, cols);
    nalar_mat     W = { .type = t, .rows = ROWS, .cols = cols, .data = w };
    nalar_cpu_mat M;
    nalar_err     err;
    float        *x = malloc(sizeof(float) * 5 * cols);
    float        *y = malloc(sizeof(float) * 5 * ROWS);
    float        *want = malloc(sizeof(float) * 5 * ROWS);
    uint8_t      *il = malloc((size_t) ib);
    nalar_xq16    x16;
    void         *xb = NULL;

    memset(&M, 0, sizeof(M));
    if (x == NULL || y == NULL || want == NULL || il == NULL
        || nalar_cpu_mat_init(&M, &W, 0, &err) != 0)
    {
        ok(0, "%s: a backend matrix", tn);
        goto out;
    }
    for (int64_t i = 0; i < 5 * cols; i++) {
        x[i] = frand();
    }
    nalar_quant_interleave(t, w, ROWS, cols, il);
    ok(M.il == 1 && memcmp(M.panels, il, (size_t) ib) == 0, "%s: f32 "
       "activations: the rows interleaved by 4", tn);
    for (int pass = 0; pass < 2; pass++) {
        int mode = pass ? NALAR_ACT_PAIRS : NALAR_ACT_I16;

        nalar_cpu_mat_act(&M, mode);
        xb = malloc((size_t) nalar_quant_x16_bytes(5, cols) + 64);
        if (xb == NULL) {
            ok(0, "%s: memory for the codes", tn);
            goto out;
        }
        nalar_quant_x16(x, 5, cols, cols, xb, &x16);
        nalar_quant_p32_scalar(t, w, rs, 0, cols, &x16, 5, want, ROWS, 0,
                               ROWS, 0);
        nalar_cpu_matmul(&M, x, 5, (int) cols, y, ROWS, 0, ROWS, 0);
        ok(M.il == P32_IL && tokens_bad(y, want, 5, ROWS, tn, mode) == 0,
           "%s: %s activations: the matrix in panels, its products the "
           "reference's bits", tn, nalar_act_name(mode));
        free(xb);
        xb = NULL;
        nalar_cpu_mat_act(&M, NALAR_ACT_Q8);
        nalar_quant_matmul_q8(t, w, rs, 0, cols, x, 5, (int) cols, want,
                              ROWS, 0, ROWS, 0);
        nalar_cpu_matmul(&M, x, 5, (int) cols, y, ROWS, 0, ROWS, 0);
        ok(M.il == 1 && memcmp(M.panels, il, (size_t) ib) == 0
           && tokens_bad(y, want, 5, ROWS, tn, NALAR_ACT_Q8) == 0,
           "%s: then q8: back to the interleaved rows, the same bytes, and "
           "q8's products on the file's rows", tn);
    }
    nalar_cpu_mat_act(&M, NALAR_ACT_F32);
    ok(M.il == 1 && memcmp(M.panels, il, (size_t) ib) == 0, "%s: f32 again: "
       "the interleaved rows", tn);
out:
    nalar_cpu_mat_free(&M);
    free(x);
    free(y);
    free(want);
    free(il);
    free(xb);
}


int
main(void)
{
    static const char *kinds[] = { "quantizer", "random extreme",
                                   "largest" };

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        ggml_type t = types[i];

        for (int kind = 0; kind < 3; kind++) {
            for (int xkind = 0; xkind < 2; xkind++) {
                int64_t  cols = kind == 0 && xkind == 0 ? 512 : 256;
                uint8_t *w = matrix(t, ROWS, cols, kind);
                char     tn[96];

                snprintf(tn, sizeof(tn), "%s %s weights, %s x, %lld cols",
                         ggml_type_name(t), kinds[kind],
                         xkind ? "largest" : "random", (long long) cols);
                if (w == NULL) {
                    ok(0, "%s: memory", tn);
                    continue;
                }
                if (xkind == 0) {
                    check_layout(t, w, cols, tn);
                }
                check_products(t, w, cols, xkind, tn);
                if (xkind == 0 && kind == 0) {
                    check_modes(t, w, cols, tn);
                }
                free(w);
            }
        }
    }
    return done_testing();
}
