/*
 * Block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K):
 *   - the block layouts are ggml's: every quantized tensor of the kit's
 *     llama3 files, which llama.cpp's quantizer made from the weights of
 *     llama3-F32.gguf, dequantizes to within that type's quantization
 *     error of the F32 tensor (a wrong layout lands far off);
 *   - the kernels (the build's own and the portable one) agree with a
 *     double-precision dot product of the dequantized rows;
 *   - batch invariance: every token's outputs have the same bits alone,
 *     in batches of any size and in any split of the rows;
 *   - 16-bit activations (cpu_quant_x16.c) through the backend's matrix:
 *     against a double product with x as its codes round it, batch
 *     invariance, codes made once read as made per call;
 *   - the quantizer's rows dequantize to within the type's error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "cpu_quant.h"
#include "gguf.h"
#include "tap.h"

#define DIR "t/data/conformance/"

static const ggml_type types[] = {
    GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
};


/* the largest RMS error of a dequantized tensor, relative to the RMS of
 * the original weights, that llama.cpp's quantizer (and this project's)
 * stays within; the bound is about twice what either reaches */
static double
rel_rms_bound(ggml_type t)
{
    switch (t) {
    case GGML_Q8_0: return 0.01;
    case GGML_Q4_0: return 0.15;
    case GGML_Q4_K: return 0.12;
    case GGML_Q5_K: return 0.06;
    default:        return 0.04;   /* Q6_K */
    }
}


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((double) (rng_state >> 11) / 9007199254740992.0) * 2.0f
           - 1.0f;
}


/* Every quantized tensor of DIR quant.gguf against DIR llama3-F32.gguf */
static void
check_layouts(const char *quant, const gguf_file *f32)
{
    char       path[256];
    nalar_err  err;
    gguf_file *q;
    int        n_checked = 0;

    snprintf(path, sizeof(path), DIR "%s.gguf", quant);
    q = gguf_open(path, &err);
    ok(q != NULL, "%s opens%s%s", quant, q == NULL ? ": " : "",
       q == NULL ? err.msg : "");
    if (q == NULL) {
        return;
    }
    for (uint64_t i = 0; i < q->n_tensors; i++) {
        const gguf_tensor *t = &q->tensors[i];
        const gguf_tensor *r;
        char               name[128];
        uint64_t           n = 1, row;
        float             *deq;
        double             se = 0, sx = 0, rel;

        if (!nalar_quant_type(t->type)) {
            continue;
        }
        snprintf(name, sizeof(name), "%.*s", (int) t->name.len, t->name.ptr);
        r = gguf_tensor_find(f32, name);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            n *= t->ne[d];
        }
        if (r == NULL || r->type != GGML_F32 || r->nbytes != n * 4) {
            ok(0, "%s: %s has an F32 twin of the same shape", quant, name);
            continue;
        }
        deq = malloc(n * sizeof(float));
        if (deq == NULL) {
            ok(0, "%s: out of memory", quant);
            break;
        }
        row = ggml_row_size(t->type, t->ne[0]);
        for (uint64_t k = 0; k < n / t->ne[0]; k++) {
            nalar_dequant_row(t->type, (const uint8_t *) t->data + k * row,
                              (int64_t) t->ne[0], deq + k * t->ne[0]);
        }
        for (uint64_t k = 0; k < n; k++) {
            float x;

            memcpy(&x, (const uint8_t *) r->data + 4 * k, 4);
            se += ((double) deq[k] - x) * ((double) deq[k] - x);
            sx += (double) x * x;
        }
        free(deq);
        rel = sqrt(se / sx);
        ok(rel <= rel_rms_bound(t->type), "%s: %s (%s) dequantizes to the "
           "F32 weights within %.3f RMS (relative %.4f)", quant, name,
           ggml_type_name(t->type), rel_rms_bound(t->type), rel);
        n_checked++;
    }
    ok(n_checked >= 15, "%s: %d quantized tensors checked", quant, n_checked);
    gguf_close(q);
}


/* rows x cols weights of type t from the project's quantizer */
static uint8_t *
random_matrix(ggml_type t, int64_t rows, int64_t cols)
{
    int64_t  rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    uint8_t *w = malloc((size_t) (rows * rs));
    float   *x = malloc((size_t) cols * sizeof(float));

    if (w == NULL || x == NULL) {
        free(w);
        free(x);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        /* rows of different scales, some all-positive (min 0) */
        float s = (float) (1 + r % 5) * 0.1f, o = r % 3 == 0 ? 1.0f : 0.0f;

        for (int64_t c = 0; c < cols; c++) {
            x[c] = (frand() + o) * s;
        }
        (void) nalar_quantize_row(t, x, cols, w + r * rs);
    }
    free(x);
    return w;
}


/* The setup both kernel checks share: rows x cols weights of type t from
 * the quantizer (*w), their rows dequantized (*deq, rows x cols) and the
 * backend's matrix over them (M, over W); 0, or -1 (reported) */
static int
quant_setup(ggml_type t, int64_t rows, int64_t cols, uint8_t **w,
            float **deq, nalar_mat *W, nalar_cpu_mat *M)
{
    int64_t   rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    nalar_err err;

    *w = random_matrix(t, rows, cols);
    *deq = malloc((size_t) (rows * cols) * sizeof(float));
    if (*w == NULL || *deq == NULL) {
        ok(0, "%s: out of memory", ggml_type_name(t));
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        nalar_dequant_row(t, *w + r * rs, cols, *deq + r * cols);
    }
    W->type = t;
    W->rows = rows;
    W->cols = cols;
    W->data = *w;
    if (nalar_cpu_mat_init(M, W, 0, &err) != 0) {
        ok(0, "%s: mat init: %s", ggml_type_name(t), err.msg);
        return -1;
    }
    return 0;
}


/* 1 when M's copy holds w's blocks where the layout puts them: as they
 * are, or interleaved (cpu_quant.h): row r's block b at
 * (r / 4) * 4 * rs + ((b / per) * 4 + r % 4) * per * bytes
 * + (b % per) * bytes, per the blocks in 256 weights; the rows that
 * pad the last group of 4 all zero */
static int
own_copy(const nalar_cpu_mat *M, const uint8_t *w)
{
    const nalar_mat *W = M->W;
    int64_t          rs = (int64_t) ggml_row_size(W->type, (uint64_t) W->cols);
    int64_t          qk = nalar_quant_block(W->type);
    int64_t          bytes = rs / (W->cols / qk), per = 256 / qk;
    const uint8_t   *p = M->panels;

    if (!M->il) {
        return memcmp(p, w, (size_t) (W->rows * rs)) == 0;
    }
    for (int64_t r = 0; r < (W->rows + 3) / 4 * 4; r++) {
        for (int64_t b = 0; b < W->cols / qk; b++) {
            const uint8_t *at = p + (r / 4) * 4 * rs
                                + ((b / per) * 4 + r % 4) * per * bytes
                                + (b % per) * bytes;

            for (int64_t i = 0; i < bytes; i++) {
                if (at[i] != (r < W->rows ? w[r * rs + b * bytes + i] : 0)) {
                    return 0;
                }
            }
        }
    }
    return 1;
}


/* Kernel products against double dot products of the dequantized rows,
 * and batch invariance, for one type and shape */
static void
check_kernel(ggml_type t, int64_t rows, int64_t cols, int n_tok)
{
    int64_t    rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    uint8_t   *w = NULL;
    float     *deq = NULL;
    nalar_mat  W;
    nalar_cpu_mat M;
    int        set = quant_setup(t, rows, cols, &w, &deq, &W, &M);
    float     *x = malloc((size_t) (n_tok * cols) * sizeof(float));
    float     *y = malloc((size_t) (n_tok * rows) * sizeof(float));
    float     *yp = malloc((size_t) (n_tok * rows) * sizeof(float));
    float     *y1 = malloc((size_t) (n_tok * rows) * sizeof(float));
    double     worst = 0, worst_p = 0;
    int        same = 1, same_split = 1, acc_ok = 1;
    const char *tn = ggml_type_name(t);

    if (set != 0) {
        goto done;
    }
    if (x == NULL || y == NULL || yp == NULL || y1 == NULL) {
        ok(0, "%s: out of memory", tn);
        nalar_cpu_mat_free(&M);
        goto done;
    }
    for (int64_t i = 0; i < n_tok * cols; i++) {
        x[i] = frand() * 2.0f;
    }
    ok(M.panels != NULL && M.panels != (void *) w && own_copy(&M, w),
       "%s %lldx%lld: the backend holds its own copy of the blocks (%s)",
       tn, (long long) rows, (long long) cols,
       M.il ? "interleaved by 4 rows" : "as they are");
    ok(M.il == (cols % 256 == 0), "%s %lldx%lld: interleaved where the "
       "columns are a multiple of 256 (%s)", tn, (long long) rows,
       (long long) cols, M.il ? "yes" : "no");
    nalar_cpu_matmul(&M, x, n_tok, (int) cols, y, (int) rows, 0, rows, 0);
    nalar_quant_matmul(t, w, rs, 0, cols, x, n_tok, (int) cols, y1,
                       (int) rows, 0, rows, 0);
    ok(memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0,
       "%s: the backend's copy gives the bits of the file's rows", tn);
    nalar_quant_matmul_portable(t, w, rs, 0, cols, x, n_tok, (int) cols, yp,
                                (int) rows, 0, rows, 0);
    for (int tk = 0; tk < n_tok; tk++) {
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, mag = 0, e, ep;

            for (int64_t c = 0; c < cols; c++) {
                s += (double) deq[r * cols + c] * x[tk * cols + c];
                mag += fabs((double) deq[r * cols + c] * x[tk * cols + c]);
            }
            e = fabs(y[tk * rows + r] - s) / (mag + 1e-30);
            ep = fabs(yp[tk * rows + r] - s) / (mag + 1e-30);
            worst = e > worst ? e : (isnan(e) ? INFINITY : worst);
            worst_p = ep > worst_p ? ep : (isnan(ep) ? INFINITY : worst_p);
        }
    }
    ok(worst <= 1e-5, "%s %lldx%lld, %d tokens: the kernel is within 1e-5 "
       "of the exact product (relative to sum |w x|: %.2e)", tn,
       (long long) rows, (long long) cols, n_tok, worst);
    ok(worst_p <= 1e-5, "%s %lldx%lld, %d tokens: the portable kernel too "
       "(%.2e)", tn, (long long) rows, (long long) cols, n_tok, worst_p);

    /* each token alone, and the rows in uneven pieces, give the same bits */
    for (int tk = 0; tk < n_tok; tk++) {
        nalar_cpu_matmul(&M, x + tk * cols, 1, (int) cols, y1 + tk * rows,
                         (int) rows, 0, rows, 0);
    }
    same = memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0;
    for (int64_t r0 = 0; r0 < rows; r0 += 3) {
        int64_t r1 = r0 + 3 < rows ? r0 + 3 : rows;

        nalar_cpu_matmul(&M, x, n_tok, (int) cols, y1, (int) rows, r0, r1, 0);
    }
    same_split = memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0;
    ok(same && same_split, "%s: batch invariant: %d tokens at once give the "
       "bits of each token alone (%s) and of rows in pieces of 3 (%s)", tn,
       n_tok, same ? "yes" : "no", same_split ? "yes" : "no");

    /* accumulate adds the product to what y holds */
    for (int64_t i = 0; i < n_tok * rows; i++) {
        y1[i] = 1.0f;
    }
    nalar_cpu_matmul(&M, x, n_tok, (int) cols, y1, (int) rows, 0, rows, 1);
    for (int64_t i = 0; i < n_tok * rows; i++) {
        acc_ok &= y1[i] == 1.0f + y[i];
    }
    ok(acc_ok, "%s: accumulate adds the product to y", tn);
    nalar_cpu_mat_free(&M);
done:
    free(w);
    free(x);
    free(deq);
    free(y);
    free(yp);
    free(y1);
}


/* batch invariance of M's product y of x (n_tok tokens): each token has
 * the bits it has alone and in batches of 5; rows in pieces of 5 give
 * the same bits (y1, y5: scratch) */
static void
check_i16_invariant(nalar_cpu_mat *M, const float *x, const float *y,
                    float *y1, float *y5, int n_tok, int64_t rows,
                    int64_t cols, const char *tn)
{
    int alone, five = 1, split;

    for (int tk = 0; tk < n_tok; tk++) {
        nalar_cpu_matmul(M, x + tk * cols, 1, (int) cols, y1 + tk * rows,
                         (int) rows, 0, rows, 0);
    }
    alone = memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0;
    for (int t0 = 0; t0 + 5 <= n_tok; t0 += 7) {
        nalar_cpu_matmul(M, x + t0 * cols, 5, (int) cols, y5, (int) rows,
                         0, rows, 0);
        five &= memcmp(y + t0 * rows, y5, (size_t) (5 * rows)
                                          * sizeof(float)) == 0;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += 5) {
        int64_t r1 = r0 + 5 < rows ? r0 + 5 : rows;

        nalar_cpu_matmul(M, x, n_tok, (int) cols, y1, (int) rows, r0, r1,
                         0);
    }
    split = memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0;
    ok(alone && five && split, "%s i16: batch invariant: each token of %d "
       "has the bits it has alone (%s) and in batches of 5 (%s); rows in "
       "pieces of 5 (%s)", tn, n_tok, alone ? "yes" : "no",
       five ? "yes" : "no", split ? "yes" : "no");
}


/* token tk's 16-bit codes times their scales: x as the 16-bit mode
 * rounds it for a row of type t (per 32, or per 256 for the K-quants) */
static void
x16_rounded(const nalar_xq16 *X, ggml_type t, int64_t cols, int tk,
            float *xr)
{
    int     k = nalar_quant_block(t) == 256;
    int64_t g = k ? 256 : 32;

    for (int64_t c = 0; c < cols; c++) {
        int64_t i = tk * cols + c;
        int32_t code = k ? 256 * X->hi.qk[i] + X->lo.qk[i]
                         : 256 * X->hi.q[i] + X->lo.q[i];

        xr[c] = (float) code * (k ? X->hi.dk : X->hi.d)[i / g];
    }
}


/*
 * 16-bit activations: against a double product of the dequantized rows
 * with x as rounded (its 16-bit codes times their scales); each token of
 * a batch of n_tok has the bits it has alone and in a batch of 5, and
 * rows in pieces give the same bits.  x's codes made once
 * (nalar_quant_x16) and read by nalar_cpu_matmul_xq give the bits of x
 * itself, whole or as views of 5 tokens; given another x's codes, the
 * product is that x's, not x's.
 */
static void
check_kernel_i16(ggml_type t, int64_t rows, int64_t cols, int n_tok)
{
    int64_t       rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    uint8_t      *w = NULL;
    float        *deq = NULL;
    nalar_mat     W;
    nalar_cpu_mat M;
    int           set = quant_setup(t, rows, cols, &w, &deq, &W, &M);
    float        *x = malloc((size_t) (n_tok * cols) * sizeof(float));
    float        *x2 = malloc((size_t) (n_tok * cols) * sizeof(float));
    float        *xr = malloc((size_t) (n_tok * cols) * sizeof(float));
    void         *cb = malloc((size_t) nalar_quant_x16_bytes(n_tok, cols));
    float        *y = malloc((size_t) (n_tok * rows) * sizeof(float));
    float        *yf = malloc((size_t) (n_tok * rows) * sizeof(float));
    float        *y1 = malloc((size_t) (n_tok * rows) * sizeof(float));
    float        *y2 = malloc((size_t) (n_tok * rows) * sizeof(float));
    float        *y5 = malloc((size_t) (5 * rows) * sizeof(float));
    nalar_xq      X, X5;
    double        worst = 0, worst_f = 0;
    int           codes = 1, made = 1;
    const char   *tn = ggml_type_name(t);

    if (set != 0) {
        goto done;
    }
    if (x == NULL || x2 == NULL || xr == NULL || cb == NULL || y == NULL
        || yf == NULL || y1 == NULL || y2 == NULL || y5 == NULL)
    {
        ok(0, "%s: out of memory", tn);
        nalar_cpu_mat_free(&M);
        goto done;
    }
    for (int64_t i = 0; i < n_tok * cols; i++) {
        /* sub-blocks of very different magnitudes, one all zero */
        x[i] = frand() * (float) (1 + (i / 32) % 7)
               * ((i / 32) % 11 == 3 ? 0.0f : 1.0f);
        x2[i] = x[i] + 0.25f;
    }
    memset(&X, 0, sizeof(X));
    nalar_quant_x16(x, n_tok, (int) cols, cols, cb, &X.x16);
    for (int tk = 0; tk < n_tok; tk++) {
        x16_rounded(&X.x16, t, cols, tk, xr + tk * cols);
        for (int64_t c = 0; c < cols; c++) {
            int64_t i = tk * cols + c;
            float   d = nalar_quant_block(t) == 256
                        ? X.x16.hi.dk[i / 256] : X.x16.hi.d[i / 32];

            /* to nearest, but for the rounding of x / d near 2^15 */
            codes &= fabsf(xr[i] - x[i]) <= 0.51f * d;
        }
    }
    ok(codes, "%s: x's 16-bit codes are within half a step of x", tn);
    nalar_cpu_matmul(&M, x, n_tok, (int) cols, yf, (int) rows, 0, rows, 0);
    M.act_i16 = 1;
    nalar_cpu_matmul(&M, x, n_tok, (int) cols, y, (int) rows, 0, rows, 0);
    nalar_quant_matmul_i16(t, w, rs, 0, cols, x, n_tok, (int) cols, y1,
                           (int) rows, 0, rows, 0);
    ok(memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0,
       "%s i16: the backend's copy (%s) gives the bits of the file's rows",
       tn, M.il ? "interleaved" : "as they are");
    for (int tk = 0; tk < n_tok; tk++) {
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, mag = 0, e, ef;

            for (int64_t c = 0; c < cols; c++) {
                double p = (double) deq[r * cols + c] * xr[tk * cols + c];

                s += p;
                mag += fabs(p);
            }
            e = fabs(y[tk * rows + r] - s) / (mag + 1e-30);
            ef = fabs(yf[tk * rows + r] - s) / (mag + 1e-30);
            worst = e > worst ? e : (isnan(e) ? INFINITY : worst);
            worst_f = ef > worst_f ? ef : worst_f;
        }
    }
    ok(worst <= 1e-6, "%s %lldx%lld i16: within 1e-6 of the exact product "
       "with x as rounded (relative to sum |w x|: %.2e; the F32 path: "
       "%.2e)", tn, (long long) rows, (long long) cols, worst, worst_f);
    ok(worst_f > 4 * worst, "%s i16: the F32 path is farther from it "
       "(%.2e > 4 x %.2e): the mode changes the computation", tn, worst_f,
       worst);

    check_i16_invariant(&M, x, y, y1, y5, n_tok, rows, cols, tn);

    /* x's codes made once: the bits of x, whole and 5 tokens at a time */
    memset(y1, 0, (size_t) (n_tok * rows) * sizeof(float));
    nalar_cpu_matmul_xq(&M, x, &X, n_tok, (int) cols, y1, (int) rows, 0,
                        rows, 0);
    made = memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0;
    for (int t0 = 0; t0 + 5 <= n_tok; t0 += 7) {
        X5 = X;
        for (int pl = 0; pl < 2; pl++) {
            nalar_xq8 *v = pl ? &X5.x16.lo : &X5.x16.hi;

            v->q += t0 * cols;
            v->d += t0 * (cols / 32);
            if (v->qk != NULL) {
                v->qk += t0 * cols;
                v->dk += t0 * (cols / 256);
                v->bs += t0 * (cols / 16);
            }
        }
        nalar_cpu_matmul_xq(&M, x + t0 * cols, &X5, 5, (int) cols, y5,
                            (int) rows, 0, rows, 0);
        made &= memcmp(y + t0 * rows, y5, (size_t) (5 * rows)
                                          * sizeof(float)) == 0;
    }
    ok(made, "%s i16: x's codes made once give the bits of x, whole and "
       "as views of 5 tokens", tn);
    /* another x's codes: that x's product, whatever x is passed */
    nalar_cpu_matmul(&M, x2, n_tok, (int) cols, y2, (int) rows, 0, rows, 0);
    nalar_quant_x16(x2, n_tok, (int) cols, cols, cb, &X.x16);
    nalar_cpu_matmul_xq(&M, x, &X, n_tok, (int) cols, y1, (int) rows, 0,
                        rows, 0);
    ok(memcmp(y2, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0
       && memcmp(y, y1, (size_t) (n_tok * rows) * sizeof(float)) != 0,
       "%s i16: the product reads the codes it is given (another x's "
       "codes: that x's bits, not x's)", tn);
    /* the float path ignores codes */
    M.act_i16 = 0;
    nalar_cpu_matmul_xq(&M, x, &X, n_tok, (int) cols, y1, (int) rows, 0,
                        rows, 0);
    ok(memcmp(yf, y1, (size_t) (n_tok * rows) * sizeof(float)) == 0,
       "%s: F32 activations read x, not the codes", tn);
    nalar_cpu_mat_free(&M);
done:
    free(w);
    free(x);
    free(x2);
    free(xr);
    free(cb);
    free(deq);
    free(y);
    free(yf);
    free(y1);
    free(y2);
    free(y5);
}


/* The quantizer: rows of each type dequantize to within its error */
static void
check_quantizer(ggml_type t)
{
    int64_t  n = 4096;
    float   *x = malloc((size_t) n * sizeof(float));
    float   *d = malloc((size_t) n * sizeof(float));
    uint8_t *q = malloc((size_t) ggml_row_size(t, (uint64_t) n));
    double   se = 0, sx = 0;

    if (x == NULL || d == NULL || q == NULL) {
        ok(0, "out of memory");
        free(x);
        free(d);
        free(q);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = frand() * 0.05f + (i % 512 < 64 ? 0.03f : 0.0f);
    }
    ok(nalar_quantize_row(t, x, n, q) == 0, "%s: quantized", 
       ggml_type_name(t));
    nalar_dequant_row(t, q, n, d);
    for (int64_t i = 0; i < n; i++) {
        se += ((double) d[i] - x[i]) * ((double) d[i] - x[i]);
        sx += (double) x[i] * x[i];
    }
    ok(sqrt(se / sx) <= rel_rms_bound(t) / 2, "%s: the quantizer's row "
       "dequantizes within %.3f RMS (relative %.4f)", ggml_type_name(t),
       rel_rms_bound(t) / 2, sqrt(se / sx));
    free(x);
    free(d);
    free(q);
}


int
main(void)
{
    nalar_err  err;
    gguf_file *f32 = gguf_open(DIR "llama3-F32.gguf", &err);

    ok(f32 != NULL, "llama3-F32.gguf opens");
    if (f32 != NULL) {
        check_layouts("llama3-Q8_0", f32);
        check_layouts("llama3-Q4_0", f32);
        check_layouts("llama3-Q4_K_M", f32);
        check_layouts("llama3-Q5_K_M", f32);
        check_layouts("llama3-Q6_K", f32);
        gguf_close(f32);
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_quantizer(types[i]);
        check_kernel(types[i], 37, 512, 1);
        check_kernel(types[i], 37, 512, 5);
        check_kernel(types[i], 21, 768, 19);
        /* two token blocks, and for the 32-weight types a last step of
         * one block (25 blocks a row) */
        check_kernel(types[i], 23, nalar_quant_block(types[i]) == 32
                                   ? 800 : 1024, 29);
        check_kernel_i16(types[i], 37, 512, 19);
        /* two token blocks */
        check_kernel_i16(types[i], 23, nalar_quant_block(types[i]) == 32
                                       ? 800 : 1024, 29);
    }
    {
        gguf_file *q = gguf_open(DIR "llama3-Q4_0.gguf", &err);

        ok(q != NULL && ggml_row_size(GGML_Q4_K, 512) == 2 * 144
           && ggml_row_size(GGML_Q5_K, 256) == 176
           && ggml_row_size(GGML_Q6_K, 768) == 3 * 210
           && ggml_row_size(GGML_Q4_0, 64) == 36,
           "row sizes are ggml's (Q4_K 144, Q5_K 176, Q6_K 210, Q4_0 18 "
           "bytes a block)");
        if (q != NULL) {
            gguf_close(q);
        }
    }
    return done_testing();
}
