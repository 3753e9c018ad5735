/*
 * Pair-multiplier codes made up for the tests of the pairs kernels
 * (test_quant_pairs_rows.c, test_quant_pairs_k6.c): ntok tokens of cols
 * values, per 256 a step D, per pair an n in [1, 64] and two codes c in
 * [-127, 127], the 16-bit planes of x' = n * c by cpu_quant_x16.c's split
 * rule and their sums of 16, laid out as nalar_quant_xpairs lays them
 * out.  Included after quant_test_blocks.h (rnd, frand), once per test.
 */
#ifndef NALAR_T_QUANT_TEST_PAIRS_H
#define NALAR_T_QUANT_TEST_PAIRS_H

#define X_RANDOM  0   /* random c and n */
#define X_EXTREME 1   /* c = +-127 (random signs), n = 64 */
#define X_MAX     2   /* c = 127 everywhere, n = 64 */
#define X_LANE    3   /* D = 1; each Q6_K lane's 16 pairs (x_lane) */

static const char *xkind_name[] = { "random codes", "c = +-127, n = 64",
                                    "c = 127, n = 64", "Q6_K's odd lanes" };

/* (n, c, c) of the 16 pairs of one Q6_K lane (2 pairs per group of 32)
 * whose L = 256 L_hi + L_lo (40005 against codes 63 and scales 127) is
 * not the 16-bit contract's fmaf(256, (float) L_hi, (float) L_lo): 7 x'
 * pairs (128, 128), 8 (-128, -128), one (132, 129) */
static const int x_lane[16][3] = {
    { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 },
    { 2, 64, 64 }, { 2, 64, 64 }, { 2, 64, 64 }, { 2, -64, -64 },
    { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 },
    { 2, -64, -64 }, { 2, -64, -64 }, { 2, -64, -64 }, { 3, 44, 43 }
};


/* ntok tokens' pair codes and x16's planes of x' = n * c (cols a multiple
 * of 256), laid out by nalar_quant_x16_layout with c and n after them, in
 * one allocation owned by the caller (*mem) */
static int
make_codes(int64_t cols, int ntok, int xkind, nalar_xqp *xp, void **mem)
{
    int64_t  nv = cols * ntok, nb = nv / QK_K;
    size_t   sz = (size_t) (nalar_quant_x16_bytes(ntok, cols) + nv * 2 + 64);
    uint8_t *p = calloc(1, sz), *end;
    int8_t  *c, *hi, *lo, *hi32, *lo32;
    int16_t *n;
    int32_t *bsh, *bsl;
    float   *d32, *dk;

    *mem = p;
    if (p == NULL) {
        return -1;
    }
    end = nalar_quant_x16_layout(p, ntok, cols, 1, &xp->x16);
    /* the arrays just laid out, written through */
    hi32 = (int8_t *) xp->x16.hi.q;
    lo32 = (int8_t *) xp->x16.lo.q;
    hi = (int8_t *) xp->x16.hi.qk;
    lo = (int8_t *) xp->x16.lo.qk;
    bsh = (int32_t *) xp->x16.hi.bs;
    bsl = (int32_t *) xp->x16.lo.bs;
    d32 = (float *) xp->x16.hi.d;
    dk = (float *) xp->x16.hi.dk;
    n = (int16_t *) end;
    c = (int8_t *) (n + nv / 2);
    for (int64_t b = 0; b < nb; b++) {
        uint64_t r = rnd() % 8;

        /* D: random, one group at 0, some tiny, some large */
        dk[b] = xkind == X_LANE ? 1.0f : r == 0 ? 0.0f
                : r == 1 ? 1e-30f * (1 + fabsf(frand()))
                : r == 2 ? 1e20f * fabsf(frand())
                : 1e-3f * (0.01f + fabsf(frand()));
    }
    for (int64_t i = 0; i < nv / 32; i++) {
        d32[i] = dk[i / 8];
    }
    for (int64_t p2 = 0; p2 < nv / 2; p2++) {
        /* X_LANE: value i of a group of 32 is in lane i % 32 / 4, as its
         * pair 2 (i / 32) + i % 4 / 2 of the lane's 16 */
        const int *xl = x_lane[2 * (p2 * 2 % QK_K / 32) + p2 * 2 % 4 / 2];

        n[p2] = (int16_t) (xkind == X_RANDOM ? 1 + (int) (rnd() % 64)
                           : xkind == X_LANE ? xl[0] : 64);
        for (int k = 0; k < 2; k++) {
            int v = xkind == X_MAX ? 127
                    : xkind == X_LANE ? xl[1 + k]
                    : xkind == X_EXTREME ? (rnd() % 2 ? 127 : -127)
                    : (int) (rnd() % 255) - 127;

            c[2 * p2 + k] = (int8_t) v;
        }
    }
    for (int64_t i = 0; i < nv; i++) {
        int32_t x = n[i / 2] * c[i];            /* |x'| <= 8128 */
        int32_t h = (x + 128) >> 8;             /* cpu_quant_x16.c's split */

        hi[i] = hi32[i] = (int8_t) h;
        lo[i] = lo32[i] = (int8_t) (x - 256 * h);
    }
    for (int64_t j = 0; j < nv / 16; j++) {
        bsh[j] = bsl[j] = 0;
        for (int k = 0; k < 16; k++) {
            bsh[j] += hi[16 * j + k];
            bsl[j] += lo[16 * j + k];
        }
    }
    xp->ck = c;
    xp->nk = n;
    return 0;
}


/* tokens s, s + 1, .. of xp's codes, as codes of their own */
static inline nalar_xqp
xp_window(const nalar_xqp *xp, int64_t s, int64_t cols)
{
    nalar_xqp  v = *xp;
    nalar_xq8 *p[2] = { &v.x16.hi, &v.x16.lo };

    for (int i = 0; i < 2; i++) {
        p[i]->q += s * cols;
        p[i]->d += s * (cols / 32);
        p[i]->qk += s * cols;
        p[i]->dk += s * (cols / QK_K);
        p[i]->bs += s * (cols / 16);
    }
    v.ck += s * cols;
    v.nk += s * (cols / 2);
    return v;
}

#endif
