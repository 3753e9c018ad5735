/*
 * 16-bit activations' kernels (cpu_quant_x16.c), for Q8_0, Q4_0, Q4_K,
 * Q5_K and Q6_K:
 *   - x's codes: each 16-bit code 256 * hi + lo is lrintf(x * 32639 /
 *     amax) clamped, within half a step (and x * id's rounding), the
 *     group's largest |x| at +-32639, hi in [-127, 127], lo in [-128,
 *     127], each plane's sums of 16;
 *   - the scalar reference (nalar_quant_x16_scalar; for Q8_0 and Q4_0
 *     nalar_quant_p32_scalar's bits, cpu_quant_p32.c's contract) against
 *     a plain int64 double-check (the blocks decoded here, from ggml's
 *     layouts, the exact integer sums per block, scaled in double), on
 *     random blocks from the quantizer, random bytes with extreme scales
 *     and mins, and saturated blocks (every code and scale at its
 *     largest) against codes at +-32639, where the int32 lanes reach
 *     their bounds;
 *   - nalar_quant_matmul_x16 on every instruction set this CPU has gives
 *     the scalar reference's bits; batch invariance: a token alone, in a
 *     batch, in any split of the rows, added to y or not, from rows
 *     interleaved;
 *   - one token of a K-quant (decode's kernels, four rows at a time):
 *     each instruction set's kernels run, and give the reference's bits
 *     in any split.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_p32.h"
#include "cpu_quant_x16.h"
#include "fp16.h"
#include "gguf.h"
#include "tap.h"

static const ggml_type types[] = {
    GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

#include "quant_test_blocks.h"
#include "quant_test_checks.h"



static float
h2f(const uint8_t *p)
{
    uint16_t h;

    memcpy(&h, p, 2);
    return nalar_f16_to_f32(h);
}






#define W_QUANT 0   /* rows from the quantizer */
#define W_BYTES 1   /* random bytes, extreme f16 scales and mins */
#define W_FULL  2   /* every code and scale at its largest magnitude */

static const char *wkind_name[] = { "quantized rows", "extreme blocks",
                                    "saturated blocks" };


/* a saturated block: the largest codes and scales (Q8_0: -128; Q6_K's
 * scales -128), f16 fields 1 or -1 */
static void
full_block(ggml_type t, uint8_t *p, int64_t bytes)
{
    int      off[2], n;
    uint16_t one = rnd() % 2 ? 0x3c00 : 0xbc00;

    memset(p, t == GGML_Q8_0 ? 0x80 : 0xff, (size_t) bytes);
    if (t == GGML_Q6_K) {
        memset(p + 192, 0x80, 16);
    }
    f16_fields(t, off, &n);
    for (int k = 0; k < n; k++) {
        memcpy(p + off[k], &one, 2);
    }
}


/* rows x cols weights of a kind: W_QUANT and W_BYTES as matrix() makes
 * its kinds 0 and 1; W_FULL every block a saturated one (full_block) */
static uint8_t *
weights(ggml_type t, int64_t rows, int64_t cols, int kind)
{
    int64_t  rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t  blocks = cols / nalar_quant_block(t), bytes = rs / blocks;
    uint8_t *w;

    if (kind != W_FULL) {
        return matrix(t, rows, cols, kind);
    }
    w = malloc((size_t) (rows * rs));
    /* the rows' blocks, one after another */
    for (int64_t b = 0; w != NULL && b < rows * blocks; b++) {
        full_block(t, w + b * bytes, bytes);
    }
    return w;
}


/* n_tok tokens of cols activations: random, with some groups all zero,
 * some large, some at +-A (every code at +-32639); all at +-A when full */
static float *
activations(int n_tok, int64_t cols, int full)
{
    float *x = malloc((size_t) (n_tok * cols) * sizeof(float));

    if (x == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < n_tok * cols; i++) {
        int64_t g = i / 32;

        x[i] = frand() * (g % 7 == 3 ? 1000.0f : 1.0f);
        if (full || g % 5 == 2) {
            x[i] = x[i] < 0 ? -3.0f : 3.0f;
        }
        if (!full && g % 11 == 5) {
            x[i] = 0;
        }
    }
    return x;
}


static void
check_codes(int64_t cols)
{
    int        n_tok = 3, bad = 0, top = 0;
    float     *x = activations(n_tok, cols, 0);
    void      *buf = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
    nalar_xq16 c;

    if (x == NULL || buf == NULL) {
        ok(0, "codes: out of memory");
        free(x);
        free(buf);
        return;
    }
    nalar_quant_x16(x, n_tok, (int) cols, cols, buf, &c);
    for (int pass = 0; pass < 2; pass++) {
        int            g = pass ? 256 : 32;
        const int8_t  *hi = pass ? c.hi.qk : c.hi.q;
        const int8_t  *lo = pass ? c.lo.qk : c.lo.q;
        const float   *d = pass ? c.hi.dk : c.hi.d;
        const float   *d2 = pass ? c.lo.dk : c.lo.d;

        for (int64_t b = 0; b < n_tok * cols / g; b++) {
            float amax = 0, id;

            for (int i = 0; i < g; i++) {
                amax = fmaxf(amax, fabsf(x[b * g + i]));
            }
            id = amax > 0 ? 32639.0f / amax : 0;
            bad += d[b] != amax / 32639.0f || d2 != d;
            for (int i = 0; i < g; i++) {
                int64_t k = b * g + i;
                long    v = lrintf(x[k] * id);
                int32_t code = 256 * hi[k] + lo[k];

                v = v < -32639 ? -32639 : v > 32639 ? 32639 : v;
                /* half a step, and the rounding of id, x * id and code * d:
                 * a few 2^-9 of a step at codes near 2^15 */
                bad += code != v || hi[k] == -128
                       || fabsf(x[k] - (float) code * d[b])
                          > d[b] * 0.51f + 1e-30f;
                top += fabsf(x[k]) == amax && amax > 0
                       && (code == 32639 || code == -32639);
            }
        }
    }
    for (int pl = 0; pl < 2; pl++) {
        const nalar_xq8 *v = pl ? &c.lo : &c.hi;

        for (int64_t j = 0; j < n_tok * cols / 16; j++) {
            int32_t s = 0;

            for (int i = 0; i < 16; i++) {
                s += v->qk[16 * j + i];
            }
            bad += s != v->bs[j];
        }
    }
    ok(bad == 0 && top > 0, "x's 16-bit codes: lrintf's, split into hi in "
       "[-127, 127] and lo, within half a step, each plane's sums of 16, "
       "the largest |x| at +-32639 (%d bad, %d at the top)", bad, top);
    free(x);
    free(buf);
}


/* ------------------------------------------------------------------ */
/* the int64 double-check                                               */


/* a block's weights as integers, from ggml's layouts: weight i = d * s[i]
 * * q[i] - dmin * m[i] */
typedef struct {
    int    q[256], s[256], m[256];
    double d, dmin;
} ints;


static void
k4_sm(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}


static void
block_ints(ggml_type t, const uint8_t *p, ints *B)
{
    memset(B, 0, sizeof(*B));
    switch (t) {
    case GGML_Q8_0:
        B->d = h2f(p);
        for (int i = 0; i < 32; i++) {
            B->q[i] = (int8_t) p[2 + i];
            B->s[i] = 1;
        }
        return;
    case GGML_Q4_0:
        B->d = h2f(p);
        for (int i = 0; i < 16; i++) {
            B->q[i] = (p[2 + i] & 0xF) - 8;
            B->q[i + 16] = (p[2 + i] >> 4) - 8;
            B->s[i] = B->s[i + 16] = 1;
        }
        return;
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const uint8_t *qs = p + (t == GGML_Q4_K ? 16 : 48);

        B->d = h2f(p);
        B->dmin = h2f(p + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;

            k4_sm(p + 4, j, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int i = 32 * j + l;
                int n = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;

                if (t == GGML_Q5_K) {
                    n += 16 * ((p[16 + l] >> j) & 1);
                }
                B->q[i] = n;
                B->s[i] = sc;
                B->m[i] = m;
            }
        }
        return;
    }
    default: {  /* GGML_Q6_K */
        B->d = h2f(p + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
            const int8_t  *sc = (const int8_t *) (p + 192 + 8 * h);

            for (int l = 0; l < 32; l++) {
                int is = l / 16, o = 128 * h + l;

                B->q[o] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                B->q[o + 32] = ((ql[l + 32] & 0xF)
                                | (((qh[l] >> 2) & 3) << 4)) - 32;
                B->q[o + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4))
                               - 32;
                B->q[o + 96] = ((ql[l + 32] >> 4)
                                | (((qh[l] >> 6) & 3) << 4)) - 32;
                B->s[o] = sc[is];
                B->s[o + 32] = sc[is + 2];
                B->s[o + 64] = sc[is + 4];
                B->s[o + 96] = sc[is + 6];
            }
        }
        return;
    }
    }
}


/* row . token tk's codes, exactly in int64 per block, scaled in double;
 * *mag: the magnitude the float reference's rounding is relative to */
static double
int64_dot(ggml_type t, const uint8_t *row, int64_t cols,
          const nalar_xq16 *c, int tk, double *mag)
{
    int64_t qk = nalar_quant_block(t);
    int64_t bytes = (int64_t) ggml_row_size(t, (uint64_t) qk);
    int     k = qk == 256;
    double  y = 0;
    ints    B;

    *mag = 0;
    for (int64_t b = 0; b < cols / qk; b++) {
        int64_t L = 0, I = 0, aL = 0, aI = 0;
        double  dx = k ? c->hi.dk[tk * (cols / 256) + b]
                       : c->hi.d[tk * (cols / 32) + b];

        block_ints(t, row + b * bytes, &B);
        for (int64_t i = 0; i < qk; i++) {
            int64_t o = tk * cols + b * qk + i;
            int64_t code = k ? 256 * (int64_t) c->hi.qk[o] + c->lo.qk[o]
                             : 256 * (int64_t) c->hi.q[o] + c->lo.q[o];
            int64_t q = B.q[i];

            L += (int64_t) B.s[i] * q * code;
            I += (int64_t) B.m[i] * code;
            aL += llabs((int64_t) B.s[i] * code)
                  * (llabs(q) + (t == GGML_Q6_K ? 64 : 0));
            aI += llabs((int64_t) B.m[i] * code);
        }
        y += B.d * dx * (double) L - B.dmin * dx * (double) I;
        *mag += fabs(B.d * dx) * (double) aL + fabs(B.dmin * dx) * (double) aI;
    }
    return y;
}


/* y (n_tok, rows) of W (w, il) with x's codes, on isa (through the
 * dispatch) */
static void
product(ggml_type t, const uint8_t *w, int64_t rs, int il, int64_t rows,
        int64_t cols, const nalar_xq16 *c, int n_tok, int isa, float *y)
{
    nalar_quant_q8_force(isa);
    nalar_quant_matmul_x16(t, w, rs, il, cols, c, n_tok, y, (int) rows, 0,
                           rows, 0);
    nalar_quant_q8_force(-1);
}


static void
check_reference(ggml_type t, int64_t rows, int64_t cols, int n_tok,
                int wkind, int full)
{
    const char *tn = ggml_type_name(t);
    int64_t     rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int         isa_max = nalar_quant_q8_isa_max(), bad = 0, il = 0;
    uint8_t    *w = weights(t, rows, cols, wkind);
    float      *x = activations(n_tok, cols, full);
    float      *ref = malloc((size_t) (n_tok * rows) * sizeof(float));
    float      *y = malloc((size_t) (n_tok * rows) * sizeof(float));
    void       *buf = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
    nalar_xq16  c;

    if (w == NULL || x == NULL || ref == NULL || y == NULL || buf == NULL) {
        ok(0, "%s: out of memory", tn);
        goto out;
    }
    nalar_quant_x16(x, n_tok, (int) cols, cols, buf, &c);
    nalar_quant_x16_scalar(t, w, rs, 0, cols, &c, n_tok, ref, (int) rows, 0,
                           rows, 0);
    if (nalar_quant_p32_type(t)) {
        /* Q8_0, Q4_0: the reference is cpu_quant_p32.c's */
        nalar_quant_p32_scalar(t, w, rs, 0, cols, &c, n_tok, y, (int) rows,
                               0, rows, 0);
        ok(memcmp(y, ref, (size_t) (n_tok * rows) * sizeof(float)) == 0,
           "%s %s: the scalar reference is nalar_quant_p32_scalar's bits",
           tn, wkind_name[wkind]);
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            double a, s = int64_dot(t, w + r * rs, cols, &c, tk, &a);

            if (!(fabs(ref[tk * rows + r] - s) <= 1e-5 * a + 1e-30)) {
                if (bad++ == 0) {
                    diag("%s row %lld tok %d: %.9g, want %.9g (|.| %g)", tn,
                         (long long) r, tk, ref[tk * rows + r], s, a);
                }
            }
        }
    }
    ok(bad == 0, "%s %s%s %lldx%lld, %d tokens: the scalar reference agrees "
       "with the int64 double-check", tn, wkind_name[wkind],
       full ? ", codes at +-32639" : "", (long long) rows, (long long) cols,
       n_tok);

    /* every instruction set through the dispatch: the reference's bits */
    for (int isa = NALAR_ISA_SCALAR; isa <= isa_max; isa++) {
        product(t, w, rs, 0, rows, cols, &c, n_tok, isa, y);
        ok(memcmp(y, ref, (size_t) (n_tok * rows) * sizeof(float)) == 0,
           "%s %s: %s gives the reference's bits", tn, wkind_name[wkind],
           nalar_quant_isa_name(isa));
    }

    /* batch invariance: each token alone in split rows, codes made for
     * one token, rows interleaved */
    bad = batch_bad(&(token_case) { t, TOKEN_X16, w, rows, cols, x, NULL },
                    n_tok, &c, ref, y, &il);
    ok(bad == 0, "%s %s: the same bits for each token alone, in split rows"
       "%s", tn, wkind_name[wkind], il ? ", from interleaved rows" : "");
out:
    free(w);
    free(x);
    free(ref);
    free(y);
    free(buf);
}


/* one token (decode's kernels, four rows at a time and one): each
 * instruction set's kernels run and give the reference's bits, for rows
 * in any split (groups of four and rows alone, added to y or not), from
 * rows in the file's order and interleaved */
static void
check_one_token(ggml_type t, int64_t rows, int64_t cols, int wkind,
                int full)
{
    uint8_t *w = weights(t, rows, cols, wkind);
    float   *x = activations(2, cols, full);
    char     what[96];

    snprintf(what, sizeof(what), "%s %s%s %lldx%lld, one token",
             ggml_type_name(t), wkind_name[wkind],
             full ? ", codes at +-32639" : "", (long long) rows,
             (long long) cols);
    check_token_splits(&(token_case) { t, TOKEN_X16, w, rows, cols,
                                       x != NULL ? x + cols : NULL, NULL },
                       what);
    free(w);
    free(x);
}


int
main(void)
{
    const char *isa[] = { "scalar", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };

    diag("this CPU's widest path: %s", isa[nalar_quant_q8_isa_max()]);
    check_codes(1024);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_reference(types[i], 13, 512, 3, W_QUANT, 0);
        check_reference(types[i], 13, 512, 3, W_BYTES, 0);
        check_reference(types[i], 9, 2048, 2, W_BYTES, 0);
        check_reference(types[i], 6, 512, 2, W_FULL, 1);
        check_reference(types[i], 6, 512, 2, W_BYTES, 1);
    }
    if (nalar_quant_q8_isa_max() < NALAR_ISA_AVX2) {
        return done_testing();
    }
    /* the K-quants' one-token kernels (Q8_0's and Q4_0's products are
     * cpu_quant_p32.c's: one token through nalar_quant_matmul_x16 above,
     * in the batch invariance checks) */
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (nalar_quant_p32_type(types[i])) {
            continue;
        }
        check_one_token(types[i], 13, 512, W_QUANT, 0);
        check_one_token(types[i], 13, 512, W_BYTES, 0);
        check_one_token(types[i], 18, 2048, W_BYTES, 0);
        check_one_token(types[i], 9, 512, W_FULL, 1);
    }
    return done_testing();
}
