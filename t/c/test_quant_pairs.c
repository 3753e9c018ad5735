/*
 * Pair-multiplier activations (cpu_quant_pairs.c), for Q8_0, Q4_0, Q4_K,
 * Q5_K and Q6_K:
 *   - x's codes on every instruction set path this CPU has: the scalar
 *     reference's bytes, every array of them, on random x with all-zero
 *     groups, huge, tiny and subnormal groups, one-hot groups, NaN and
 *     Inf;
 *   - the rule per 256 as cpu_quant_pairs.c's header writes it
 *     (restated here in its float operations): D, n and the codes per
 *     pair; the integer identity x' = n * c; n and c by brute force over
 *     the 8 candidates in double: no worse than the best candidate but
 *     for float rounding; |x - D n c| within half the pair's step; an
 *     all-zero group's D = 0, codes 0, n = 1; a NaN's code -127; per 32
 *     the 16-bit codes' bytes (nalar_quant_x16);
 *   - x16: the planes hi = (x' + 128) >> 8, lo = x' - 256 hi and the
 *     sums of 16 of each, as the 16-bit codes' maker lays out its codes;
 *     one grouping made alone: the same bytes, the other's arrays NULL;
 *   - the products: nalar_quant_matmul_xpairs (codes made per call) gives
 *     nalar_quant_matmul_pairs' bits from codes made once (Q8_0, Q4_0:
 *     the 16-bit mode's bits too), a token alone the same as in the
 *     batch, and sum_i w_i D x'_i of an int64/double check, from
 *     quantized, hostile and saturated weights (every x' at +-8128, every
 *     16-bit code at +-32639).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "gguf.h"
#include "tap.h"

static const ggml_type types[] = {
    GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
};

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

#include "quant_test_blocks.h"


/* n_tok tokens of cols values, each kg-group (32 or 256) of one kind:
 * random, huge (1e30), tiny (1e-30), subnormal, one-hot, zero, holding a
 * NaN or an Inf (special 0: random and zero groups only); token 1's
 * second 256 values all zero */
static float *
activations(int n_tok, int64_t cols, int special, int kg)
{
    float *x = malloc((size_t) (n_tok * cols) * sizeof(float));

    if (x == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < n_tok * cols; i++) {
        int64_t g = i / kg;
        int     kind = special ? (int) (g % 9) : (int) (g % 2) * 5;

        x[i] = frand();
        switch (kind) {
        case 1: x[i] *= 1e30f; break;
        case 2: x[i] *= 1e-30f; break;
        case 3: x[i] *= 1e-40f; break;
        case 4: x[i] = i % kg == (g * 7) % kg ? x[i] * 5 : 0; break;
        case 5: x[i] *= 1000.0f; break;
        case 6: x[i] = 0; break;
        case 7: x[i] = i % kg == 5 ? NAN : x[i]; break;
        case 8: x[i] = i % kg == 9 ? -INFINITY : x[i]; break;
        default: break;
        }
        if (n_tok > 1 && cols >= 512 && i / cols == 1 && i % cols >= 256
            && i % cols < 512)
        {
            x[i] = 0;
        }
    }
    return x;
}


/* ------------------------------------------------------------------ */
/* the rule, restated                                                   */


/* a pair's n and codes by the header's float operations */
static void
rule_pair(float x0, float x1, float iD, int *n, int *c0, int *c1)
{
    float u0 = x0 * iD, u1 = x1 * iD;
    float a = fabsf(u0) > 0 ? fabsf(u0) : 0, f, best = 0;

    a = fabsf(u1) > a ? fabsf(u1) : a;
    f = ceilf(a / 127.0f);
    f = f > 1 ? f : 1;
    f = f < 64 ? f : 64;
    for (int j = 0; j < 8 && f + (float) j <= 64; j++) {
        float k = f + (float) j, r = 1.0f / k;
        float q0 = rintf(u0 * r), q1 = rintf(u1 * r), e0, e1, err;

        q0 = q0 > -127.0f ? q0 : -127.0f;
        q0 = q0 < 127.0f ? q0 : 127.0f;
        q1 = q1 > -127.0f ? q1 : -127.0f;
        q1 = q1 < 127.0f ? q1 : 127.0f;
        e0 = u0 - k * q0;
        e1 = u1 - k * q1;
        err = e0 * e0 + e1 * e1;
        if (j == 0 || err < best) {
            best = err;
            *n = (int) k;
            *c0 = (int) q0;
            *c1 = (int) q1;
        }
    }
}


static float
group_amax(const float *x, int g)
{
    float m = 0;

    for (int i = 0; i < g; i++) {
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    }
    return m;
}


/* the least squared residual over the pair's candidates, in double
 * (codes rounded from x / (D k) in double) */
static double
brute_best(double x0, double x1, double D, int n0)
{
    double best = INFINITY;

    for (int k = n0; k < n0 + 8 && k <= 64; k++) {
        double s = D * k, c0 = rint(x0 / s), c1 = rint(x1 / s), e0, e1;

        c0 = c0 < -127 ? -127 : c0 > 127 ? 127 : c0;
        c1 = c1 < -127 ? -127 : c1 > 127 ? 127 : c1;
        e0 = x0 - s * c0;
        e1 = x1 - s * c1;
        best = fmin(best, e0 * e0 + e1 * e1);
    }
    return best;
}


typedef struct {
    int bad_rule, bad_ident, bad_ls, bad_half, bad_zero, bad_nan;
    int bad_plane, bad_d, pairs, exact_ls, zero_groups, nan_codes;
} rule_counts;


/* one grouping (g 32 or 256) of token x's codes: x16 planes hi, lo, d,
 * and (g 256) ck, nk */
static void
check_grouping(const float *x, int64_t cols, int g, const int8_t *hi,
               const int8_t *lo, const float *d, const int8_t *ck,
               const int16_t *nk, rule_counts *k)
{
    for (int64_t b = 0; b < cols / g; b++) {
        const float *xb = x + b * g;
        float        amax = group_amax(xb, g);
        float        D = amax / 8128.0f, iD = amax > 0 ? 8128.0f / amax : 0;
        int          finite = isfinite(amax) && isfinite(iD) && D > 0;

        k->bad_d += memcmp(&d[b], &D, sizeof(D)) != 0;
        k->zero_groups += amax == 0;
        for (int p = 0; p < g / 2; p++) {
            int64_t i = b * g + 2 * p;
            int     n, c0, c1, x0, x1;
            double  e, best, ex0, ex1;

            rule_pair(xb[2 * p], xb[2 * p + 1], iD, &n, &c0, &c1);
            x0 = 256 * hi[i] + lo[i];
            x1 = 256 * hi[i + 1] + lo[i + 1];
            k->bad_ident += x0 != n * c0 || x1 != n * c1;
            for (int h = 0; h < 2; h++) {
                int v = (h ? n * c1 : n * c0), hh = (v + 128) >> 8;

                k->bad_plane += hi[i + h] != hh || lo[i + h] != v - 256 * hh;
            }
            if (ck != NULL) {
                k->bad_rule += ck[i] != c0 || ck[i + 1] != c1
                               || nk[i / 2] != n;
            }
            if (amax == 0) {
                k->bad_zero += n != 1 || c0 != 0 || c1 != 0 || D != 0;
            }
            for (int h = 0; h < 2; h++) {
                if (isnan(xb[2 * p + h])) {
                    k->nan_codes++;
                    k->bad_nan += (h ? c1 : c0) != -127 || n < 1 || n > 64;
                }
            }
            if (!finite || !isfinite(xb[2 * p]) || !isfinite(xb[2 * p + 1]))
            {
                continue;
            }
            /* least squares: no worse than the best of the candidates
             * (n0 the first the rule tried) but for float rounding:
             * the x * iD products' rounding moves a residual by a few
             * 1e-4 steps */
            {
                float a = fmaxf(fabsf(xb[2 * p] * iD),
                                fabsf(xb[2 * p + 1] * iD));
                int   n0 = (int) fminf(fmaxf(ceilf(a / 127.0f), 1), 64);

                ex0 = (double) xb[2 * p] - (double) D * n * c0;
                ex1 = (double) xb[2 * p + 1] - (double) D * n * c1;
                e = ex0 * ex0 + ex1 * ex1;
                best = brute_best(xb[2 * p], xb[2 * p + 1], D, n0);
                k->pairs++;
                k->exact_ls += e <= best * (1 + 1e-12);
                k->bad_ls += n < n0 || n > n0 + 7
                             || e > best + 0.1 * (double) D * D;
                k->bad_half += fabs(ex0) > 0.5 * D * n * (1 + 1e-5)
                               || fabs(ex1) > 0.5 * D * n * (1 + 1e-5);
            }
        }
    }
}


/* each plane's sums of 16 of the 256-codes */
static int
bad_sums(const nalar_xq8 *v, int64_t n16)
{
    int bad = 0;

    for (int64_t j = 0; j < n16; j++) {
        int32_t s = 0;

        for (int i = 0; i < 16; i++) {
            s += v->qk[16 * j + i];
        }
        bad += s != v->bs[j];
    }
    return bad;
}


/* the rule on x of random and zero groups (special 0) or of special
 * 256-groups (1; the least-squares checks then see the finite ones):
 * per 256 D, c and n as the header says, per 32 the 16-bit codes'
 * bytes (nalar_quant_x16) */
static void
check_rule(int64_t cols, int special)
{
    int         n_tok = 3, k256 = cols % 256 == 0;
    int64_t     nc = (int64_t) n_tok * cols;
    float      *x = activations(n_tok, cols, special, k256 ? 256 : 32);
    void       *buf = malloc((size_t) nalar_quant_xpairs_bytes(n_tok, cols));
    void       *b16 = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
    nalar_xqp   xp;
    nalar_xq16  x16;
    rule_counts k;

    memset(&k, 0, sizeof(k));
    if (x == NULL || buf == NULL || b16 == NULL) {
        ok(0, "rule: out of memory");
        free(x);
        free(buf);
        free(b16);
        return;
    }
    nalar_quant_q8_force(NALAR_ISA_SCALAR);
    nalar_quant_xpairs(x, n_tok, (int) cols, cols, buf, &xp);
    nalar_quant_x16(x, n_tok, (int) cols, cols, b16, &x16);
    nalar_quant_q8_force(-1);
    ok(memcmp(xp.x16.hi.q, x16.hi.q, (size_t) nc) == 0
       && memcmp(xp.x16.lo.q, x16.lo.q, (size_t) nc) == 0
       && memcmp(xp.x16.hi.d, x16.hi.d, (size_t) nc / 32 * 4) == 0
       && xp.x16.lo.d == xp.x16.hi.d,
       "%lld columns: per 32 (Q8_0, Q4_0) the 16-bit codes' bytes, planes "
       "and scales", (long long) cols);
    ok(xp.x16.lo.dk == xp.x16.hi.dk
       && xp.x16.hi.cols == cols && xp.x16.lo.cols == cols
       && (k256 ? xp.ck != NULL && xp.nk != NULL && xp.x16.hi.qk != NULL
                : xp.ck == NULL && xp.nk == NULL && xp.x16.hi.qk == NULL),
       "%lld columns: per-256 codes, c and n %s", (long long) cols,
       k256 ? "made, the planes sharing D" : "absent (NULL)");
    if (!k256) {
        goto out;
    }
    for (int t = 0; t < n_tok; t++) {
        int64_t o = (int64_t) t * cols;

        check_grouping(x + o, cols, 256, xp.x16.hi.qk + o, xp.x16.lo.qk + o,
                       xp.x16.hi.dk + t * (cols / 256), xp.ck + o,
                       xp.nk + o / 2, &k);
    }
    ok(k.bad_d == 0 && k.bad_rule == 0, "%lld columns: D = amax / 8128 "
       "and c and n by the header's float operations (%d, %d bad)",
       (long long) cols, k.bad_d, k.bad_rule);
    ok(k.bad_ident == 0 && k.bad_plane == 0, "%lld columns: x' = n * c, in "
       "the planes hi = (x' + 128) >> 8 and lo = x' - 256 hi (%d, %d bad)",
       (long long) cols, k.bad_ident, k.bad_plane);
    ok(k.pairs > 0 && k.bad_ls == 0 && k.bad_half == 0, "%lld columns: "
       "n among the 8 candidates, its residual no worse than the best one's "
       "in double (%d of %d pairs to the last bit), |x - D n c| <= D n / 2 "
       "(%d, %d bad)", (long long) cols, k.exact_ls, k.pairs, k.bad_ls,
       k.bad_half);
    ok(k.zero_groups > 0 && k.bad_zero == 0
       && (k.nan_codes > 0 || !special) && k.bad_nan == 0, "%lld columns: "
       "%d all-zero groups with D = 0, codes 0, n = 1; %d NaNs coded -127 "
       "(%d, %d bad)", (long long) cols,
       k.zero_groups, k.nan_codes, k.bad_zero, k.bad_nan);
    ok(bad_sums(&xp.x16.hi, n_tok * cols / 16) == 0
       && bad_sums(&xp.x16.lo, n_tok * cols / 16) == 0,
       "%lld columns: each plane's sums of 16 codes", (long long) cols);
out:
    free(x);
    free(buf);
    free(b16);
}


/* ------------------------------------------------------------------ */
/* every instruction set: the scalar reference's bytes                  */


/* the bytes of every array of xp, in order, into out (NULL: counted) */
static int64_t
flatten(const nalar_xqp *xp, int n_tok, int64_t cols, uint8_t *out)
{
    int64_t nc = (int64_t) n_tok * cols, o = 0;
    struct { const void *p; int64_t n; } a[] = {
        { xp->x16.hi.q, nc }, { xp->x16.lo.q, nc },
        { xp->x16.hi.d, nc / 32 * 4 },
        { xp->x16.hi.qk, nc }, { xp->x16.lo.qk, nc },
        { xp->x16.hi.bs, nc / 16 * 4 }, { xp->x16.lo.bs, nc / 16 * 4 },
        { xp->x16.hi.dk, nc / 256 * 4 },
        { xp->ck, nc }, { xp->nk, nc },
    };

    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++) {
        if (a[i].p == NULL) {
            continue;
        }
        if (out != NULL) {
            memcpy(out + o, a[i].p, (size_t) a[i].n);
        }
        o += a[i].n;
    }
    return o;
}


static void
check_isas(int64_t cols, int kg)
{
    int       n_tok = 5, bad = 0, runs = 0;
    float    *x = activations(n_tok, cols, 1, kg);
    void     *buf = malloc((size_t) nalar_quant_xpairs_bytes(n_tok, cols));
    uint8_t  *ref = malloc((size_t) (8 * n_tok * cols));
    uint8_t  *got = malloc((size_t) (8 * n_tok * cols));
    int64_t   nref = 0;
    nalar_xqp xp;

    if (x == NULL || buf == NULL || ref == NULL || got == NULL) {
        ok(0, "isas: out of memory");
        goto out;
    }
    for (int isa = NALAR_ISA_SCALAR; isa <= nalar_quant_q8_isa_max(); isa++)
    {
        /* poison: every byte is written */
        memset(buf, 0x5a, (size_t) nalar_quant_xpairs_bytes(n_tok, cols));
        nalar_quant_q8_force(isa);
        nalar_quant_xpairs(x, n_tok, (int) cols, cols, buf, &xp);
        if (isa == NALAR_ISA_SCALAR) {
            nref = flatten(&xp, n_tok, cols, ref);
        } else {
            bad += flatten(&xp, n_tok, cols, got) != nref
                   || memcmp(got, ref, (size_t) nref) != 0;
        }
        runs++;
    }
    nalar_quant_q8_force(-1);
    ok(bad == 0 && runs == nalar_quant_q8_isa_max() + 1, "%lld columns: "
       "x's codes on each of %d instruction set paths are the scalar "
       "reference's bytes (zeros, huge, tiny, subnormal, one-hot, NaN and "
       "Inf groups of %d)", (long long) cols, runs, kg);
out:
    nalar_quant_q8_force(-1);
    free(x);
    free(buf);
    free(ref);
    free(got);
}


/* one grouping alone: the bytes of both, the other NULL */
static void
check_groups(void)
{
    int64_t   cols = 512;
    int       n_tok = 2, bad = 0;
    int64_t   nc = n_tok * cols;
    float    *x = activations(n_tok, cols, 1, 32);
    void     *b0 = malloc((size_t) nalar_quant_xpairs_bytes(n_tok, cols));
    void     *b1 = malloc((size_t) nalar_quant_xpairs_bytes(n_tok, cols));
    nalar_xqp a, g;

    if (x == NULL || b0 == NULL || b1 == NULL) {
        ok(0, "groups: out of memory");
        goto out;
    }
    nalar_quant_xpairs(x, n_tok, (int) cols, cols, b0, &a);
    nalar_quant_xpairs_groups(x, n_tok, (int) cols, cols, NALAR_XP_G32, b1,
                              &g);
    bad += g.x16.hi.qk != NULL || g.x16.lo.qk != NULL || g.x16.hi.bs != NULL
           || g.x16.hi.dk != NULL || g.ck != NULL || g.nk != NULL
           || g.x16.hi.q == NULL
           || memcmp(g.x16.hi.q, a.x16.hi.q, (size_t) nc) != 0
           || memcmp(g.x16.lo.q, a.x16.lo.q, (size_t) nc) != 0
           || memcmp(g.x16.hi.d, a.x16.hi.d, (size_t) nc / 32 * 4) != 0;
    nalar_quant_xpairs_groups(x, n_tok, (int) cols, cols, NALAR_XP_G256, b1,
                              &g);
    bad += g.x16.hi.q != NULL || g.x16.lo.q != NULL || g.x16.hi.d != NULL
           || g.ck == NULL || g.x16.hi.qk == NULL
           || memcmp(g.x16.hi.qk, a.x16.hi.qk, (size_t) nc) != 0
           || memcmp(g.x16.lo.qk, a.x16.lo.qk, (size_t) nc) != 0
           || memcmp(g.x16.hi.bs, a.x16.hi.bs, (size_t) nc / 16 * 4) != 0
           || memcmp(g.x16.lo.bs, a.x16.lo.bs, (size_t) nc / 16 * 4) != 0
           || memcmp(g.x16.hi.dk, a.x16.hi.dk, (size_t) nc / 256 * 4) != 0
           || memcmp(g.ck, a.ck, (size_t) nc) != 0
           || memcmp(g.nk, a.nk, (size_t) nc) != 0;
    ok(bad == 0 && nalar_quant_xpairs_group(GGML_Q8_0) == NALAR_XP_G32
       && nalar_quant_xpairs_group(GGML_Q4_0) == NALAR_XP_G32
       && nalar_quant_xpairs_group(GGML_Q4_K) == NALAR_XP_G256
       && nalar_quant_xpairs_group(GGML_Q6_K) == NALAR_XP_G256,
       "one grouping alone: its bytes as both made together, the other's "
       "arrays NULL; Q8_0 and Q4_0 read per 32, the K-quants per 256");
out:
    free(x);
    free(b0);
    free(b1);
}


/* ------------------------------------------------------------------ */
/* products                                                             */


static void
check_products(ggml_type t, int wkind, int full)
{
    const char *tn = ggml_type_name(t);
    int64_t     rows = 9, cols = 512;
    int         n_tok = 3, bad_bits = 0, bad_ref = 0, bad_alone = 0;
    int64_t     rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t     qk = nalar_quant_block(t);
    uint8_t    *w = matrix(t, rows, cols, wkind);
    float      *x = activations(n_tok, cols, 0, 32);
    float      *y = calloc((size_t) (n_tok * rows), sizeof(float));
    float      *y2 = calloc((size_t) (n_tok * rows), sizeof(float));
    float      *y1 = calloc((size_t) rows, sizeof(float));
    float      *dq = malloc((size_t) cols * sizeof(float));
    void       *buf = malloc((size_t) nalar_quant_xpairs_bytes(n_tok, cols));
    nalar_xqp   xp;

    if (w == NULL || x == NULL || y == NULL || y2 == NULL || y1 == NULL
        || dq == NULL || buf == NULL)
    {
        ok(0, "%s: out of memory", tn);
        goto out;
    }
    for (int64_t i = 0; full && i < n_tok * cols; i++) {
        x[i] = x[i] < 0 ? -2.0f : 2.0f;
    }
    nalar_quant_matmul_xpairs(t, w, rs, 0, cols, x, n_tok, (int) cols, y,
                              (int) rows, 0, rows, 0);
    nalar_quant_xpairs(x, n_tok, (int) cols, cols, buf, &xp);
    nalar_quant_matmul_pairs(t, w, rs, 0, cols, &xp, n_tok, y2, (int) rows,
                             0, rows, 0);
    bad_bits = memcmp(y, y2, (size_t) (n_tok * rows) * sizeof(float)) != 0;
    if (qk == 32) {
        /* per 32 the 16-bit mode's codes, so its products' bits */
        void       *b16 = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
        nalar_xq16  x16;

        if (b16 == NULL) {
            ok(0, "%s: out of memory", tn);
            goto out;
        }
        nalar_quant_x16(x, n_tok, (int) cols, cols, b16, &x16);
        nalar_quant_matmul_x16(t, w, rs, 0, cols, &x16, n_tok, y2,
                               (int) rows, 0, rows, 0);
        bad_bits += memcmp(y, y2, (size_t) (n_tok * rows) * sizeof(float))
                    != 0;
        free(b16);
    }
    for (int tk = 0; tk < n_tok; tk++) {
        nalar_quant_matmul_xpairs(t, w, rs, 0, cols, x + tk * cols, 1,
                                  (int) cols, y1, (int) rows, 0, rows, 0);
        bad_alone += memcmp(y1, y + tk * rows, (size_t) rows
                                                * sizeof(float)) != 0;
        for (int64_t r = 0; r < rows; r++) {
            const int8_t *hi = (qk == 256 ? xp.x16.hi.qk : xp.x16.hi.q)
                               + tk * cols;
            const int8_t *lo = (qk == 256 ? xp.x16.lo.qk : xp.x16.lo.q)
                               + tk * cols;
            const float  *D = qk == 256 ? xp.x16.hi.dk + tk * (cols / 256)
                                        : xp.x16.hi.d + tk * (cols / 32);
            double        s = 0, mag = 0;

            nalar_dequant_row(t, w + r * rs, cols, dq);
            for (int64_t i = 0; i < cols; i++) {
                double v = (double) dq[i] * D[i / qk]
                           * (256 * hi[i] + lo[i]);

                s += v;
                mag += fabs(v);
            }
            bad_ref += !(fabs(y[tk * rows + r] - s) <= 1e-4 * mag + 1e-30);
        }
    }
    ok(bad_bits == 0 && bad_alone == 0 && bad_ref == 0, "%s %s%s: the "
       "products from codes made per call and made once%s, a token alone "
       "and in the batch the same bits, and sum w D x' within 1e-4 of the "
       "sum of |terms| (%d, %d, %d bad)", tn,
       wkind == 0 ? "quantized" : wkind == 1 ? "hostile" : "saturated",
       !full ? "" : qk == 256 ? ", every x' at +-8128"
                              : ", every code at +-32639",
       qk == 256 ? "" : " and the 16-bit mode's", bad_bits, bad_alone,
       bad_ref);
out:
    free(w);
    free(x);
    free(y);
    free(y2);
    free(y1);
    free(dq);
    free(buf);
}


int
main(void)
{
    check_rule(1024, 1);
    check_rule(512, 0);
    check_rule(96, 1);
    check_isas(512, 32);
    check_isas(1024, 256);
    check_isas(96, 32);
    check_groups();
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_products(types[i], 0, 0);
        check_products(types[i], 1, 0);
        check_products(types[i], 2, 1);
    }
    return done_testing();
}
