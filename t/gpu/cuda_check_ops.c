/*
 * nalar-cuda-check: the element-wise ops (RMSNorm, embedding, RoPE, the
 * activations) and the projections (matmul, GEMV, tensor-core and K-quant
 * kernels) against CPU references, by weight type.
 */
#include "cuda_check.h"


/* --- host matrices of each type --- */

typedef struct {
    ggml_type type;
    int64_t   rows, cols;
    void     *raw;         /* ggml layout (Q8_0: blocks) */
    float    *f;           /* the same values widened */
} hmat;


static size_t
esize(ggml_type t)
{
    return t == GGML_F32 ? 4 : 2;
}


static void
hmat_make(hmat *m, ggml_type t, int64_t rows, int64_t cols, float scale)
{
    int64_t n = rows * cols;

    m->type = t;
    m->rows = rows;
    m->cols = cols;
    m->f = xmalloc((size_t) n * sizeof(float));
    if (nalar_cuda_kq_type(t)) {
        /* the project's quantizer, and the CPU's exact dequantization as
         * the reference's weights */
        int64_t  rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
        uint8_t *b = xmalloc((size_t) (rows * rs));

        for (int64_t i = 0; i < n; i++) {
            m->f[i] = frand() * scale;
        }
        for (int64_t r = 0; r < rows; r++) {
            nalar_quantize_row(t, m->f + r * cols, cols, b + r * rs);
            nalar_dequant_row(t, b + r * rs, cols, m->f + r * cols);
        }
        m->raw = b;
        return;
    }
    if (t == GGML_Q8_0) {
        int64_t  nb = n / QK8_0;
        uint8_t *b = xmalloc((size_t) nb * (2 + QK8_0));

        for (int64_t k = 0; k < nb; k++) {
            uint16_t d = nalar_f32_to_f16(scale / 127.0f
                                          * (0.5f + 0.5f * fabsf(frand())));
            float    df = nalar_f16_to_f32(d);

            b[k * 34] = (uint8_t) (d & 0xff);
            b[k * 34 + 1] = (uint8_t) (d >> 8);
            for (int i = 0; i < QK8_0; i++) {
                int8_t q = (int8_t) lrintf(frand() * 127.0f);

                memcpy(b + k * 34 + 2 + i, &q, 1);
                m->f[k * QK8_0 + i] = df * (float) q;
            }
        }
        m->raw = b;
        return;
    }
    m->raw = xmalloc((size_t) n * esize(t));
    for (int64_t i = 0; i < n; i++) {
        float v = frand() * scale;

        if (t == GGML_F32) {
            ((float *) m->raw)[i] = v;
            m->f[i] = v;
        } else if (t == GGML_F16) {
            ((uint16_t *) m->raw)[i] = nalar_f32_to_f16(v);
            m->f[i] = nalar_f16_to_f32(((uint16_t *) m->raw)[i]);
        } else {
            ((uint16_t *) m->raw)[i] = nalar_f32_to_bf16(v);
            m->f[i] = nalar_bf16_to_f32(((uint16_t *) m->raw)[i]);
        }
    }
}


/* the device copy, as the backend uploads it */
static nalar_cuda_mat
hmat_upload(const hmat *m)
{
    nalar_cuda_mat d;
    nalar_err      err;

    memset(&d, 0, sizeof(d));
    d.type = m->type;
    d.rows = m->rows;
    d.cols = m->cols;
    if (nalar_cuda_kq_type(m->type)) {
        d.data = dup_to_dev(m->raw, (size_t) m->rows
                            * ggml_row_size(m->type, (uint64_t) m->cols));
    } else if (m->type == GGML_Q8_0) {
        int64_t   n = m->rows * m->cols;
        int8_t   *qs = xmalloc((size_t) n);
        uint16_t *sc = xmalloc((size_t) (n / QK8_0) * 2);

        op(nalar_q8_0_repack(m->raw, m->rows, m->cols, qs, sc, &err), &err);
        d.data = dup_to_dev(qs, (size_t) n);
        d.scales = dup_to_dev(sc, (size_t) (n / QK8_0) * 2);
        free(qs);
        free(sc);
    } else {
        d.data = dup_to_dev(m->raw, (size_t) (m->rows * m->cols)
                                    * esize(m->type));
    }
    return d;
}


static void
hmat_free(hmat *m, nalar_cuda_mat *d)
{
    free(m->raw);
    free(m->f);
    cudaFree(d->data);
    cudaFree(d->scales);
}


static const char *
tname(ggml_type t)
{
    return t == GGML_F32 ? "f32" : t == GGML_F16 ? "f16"
           : t == GGML_BF16 ? "bf16" : t == GGML_Q4_0 ? "q4_0"
           : t == GGML_Q4_K ? "q4_k" : t == GGML_Q5_K ? "q5_k"
           : t == GGML_Q6_K ? "q6_k" : "q8_0";
}


/* --- element-wise ops --- */

void
check_rmsnorm(void)
{
    static const int shapes[][2] = {
        { 1, 1 }, { 3, 7 }, { 5, 128 }, { 17, 4096 }, { 2, 5120 }, { 4, 4097 }
    };
    nalar_err err;

    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (int gather = 0; gather < 2; gather++) {
            int      n = shapes[s][0], dim = shapes[s][1], ld = dim + 3;
            float   *x = xmalloc((size_t) n * ld * sizeof(float));
            float   *w = xmalloc((size_t) dim * sizeof(float));
            float   *got = xmalloc((size_t) n * dim * sizeof(float));
            double  *ref = xmalloc((size_t) n * dim * sizeof(double));
            int32_t *rows = xmalloc((size_t) n * sizeof(int32_t));
            float   *dx, *dw, *dout;
            int32_t *drows = NULL;
            char     shape[96];

            for (int i = 0; i < n * ld; i++) x[i] = frand() * 3.0f;
            for (int i = 0; i < dim; i++) w[i] = frand();
            for (int i = 0; i < n; i++) rows[i] = gather ? n - 1 - i : i;
            for (int i = 0; i < n; i++) {
                const float *xr = x + (int64_t) rows[i] * ld;
                double       ss = 0;

                for (int k = 0; k < dim; k++) ss += (double) xr[k] * xr[k];
                ss = 1.0 / sqrt(ss / dim + 1e-5);
                for (int k = 0; k < dim; k++) {
                    ref[(int64_t) i * dim + k] = xr[k] * ss * w[k];
                }
            }
            dx = dup_to_dev(x, (size_t) n * ld * sizeof(float));
            dw = dup_to_dev(w, (size_t) dim * sizeof(float));
            dout = dnew((size_t) n * dim * sizeof(float));
            if (gather) {
                drows = dup_to_dev(rows, (size_t) n * sizeof(int32_t));
            }
            poison(dout, (size_t) n * dim * sizeof(float));
            op(nalar_cuda_rmsnorm(&C, dout, dim, dx, ld, drows, n, dw, dim,
                                  1e-5f, &err), &err);
            fetch(got, dout, (size_t) n * dim * sizeof(float));
            snprintf(shape, sizeof(shape), "rows %d dim %d%s", n, dim,
                     gather ? " gathered" : "");
            report("rmsnorm", shape, nerr(got, ref, (int64_t) n * dim),
                   THR_F32);
            cudaFree(dx); cudaFree(dw); cudaFree(dout); cudaFree(drows);
            free(x); free(w); free(got); free(ref); free(rows);
        }
    }
}


void
check_embed(void)
{
    static const ggml_type types[] = { GGML_F32, GGML_F16, GGML_BF16,
                                       GGML_Q8_0 };
    static const int dims[] = { 64, 4096 };
    nalar_err err;

    for (int ti = 0; ti < 4; ti++) {
        for (int di = 0; di < 2; di++) {
            int            vocab = 301, dim = dims[di], n = 9;
            hmat           E;
            nalar_cuda_mat dE;
            int32_t        tok[9] = { 0, 300, 7, 7, 150, 1, 299, 42, 0 };
            float         *got = xmalloc((size_t) n * dim * sizeof(float));
            double        *ref = xmalloc((size_t) n * dim * sizeof(double));
            int32_t       *dtok = dup_to_dev(tok, sizeof(tok));
            float         *dout = dnew((size_t) n * dim * sizeof(float));
            char           shape[96];

            hmat_make(&E, types[ti], vocab, dim, 1.0f);
            dE = hmat_upload(&E);
            for (int t = 0; t < n; t++) {
                for (int k = 0; k < dim; k++) {
                    ref[(int64_t) t * dim + k] =
                        E.f[(int64_t) tok[t] * dim + k];
                }
            }
            poison(dout, (size_t) n * dim * sizeof(float));
            op(nalar_cuda_embed(&C, &dE, dtok, n, dout, dim, &err), &err);
            fetch(got, dout, (size_t) n * dim * sizeof(float));
            snprintf(shape, sizeof(shape), "%s vocab %d dim %d",
                     tname(types[ti]), vocab, dim);
            report("embed", shape, nerr(got, ref, (int64_t) n * dim), 0.0);
            hmat_free(&E, &dE);
            cudaFree(dtok); cudaFree(dout);
            free(got); free(ref);
        }
    }
}


void
check_rope(void)
{
    static const int hds[] = { 16, 32, 64, 128, 256 };
    nalar_err err;

    for (int hi = 0; hi < 5; hi++) {
        for (int neox = 0; neox < 2; neox++) {
            int      hd = hds[hi], heads = 6, n = 5, ld = heads * hd + 5;
            int32_t  pos[5] = { 0, 1, 17, 8191, -1 };
            float   *x = xmalloc((size_t) n * ld * sizeof(float));
            float   *inv = xmalloc((size_t) hd / 2 * sizeof(float));
            float   *got = xmalloc((size_t) n * ld * sizeof(float));
            double  *ref = xmalloc((size_t) n * ld * sizeof(double));
            float   *dx, *dinv;
            int32_t *dpos;
            char     shape[96];

            for (int i = 0; i < n * ld; i++) {
                x[i] = frand();
                ref[i] = x[i];
            }
            for (int i = 0; i < hd / 2; i++) {
                inv[i] = powf(10000.0f, -2.0f * (float) i / (float) hd);
            }
            for (int t = 0; t < n; t++) {
                if (pos[t] < 0) {
                    continue;                  /* padding: untouched */
                }
                for (int h = 0; h < heads; h++) {
                    for (int i = 0; i < hd / 2; i++) {
                        int64_t a = (int64_t) t * ld + h * hd
                                    + (neox ? i : 2 * i);
                        int64_t b = (int64_t) t * ld + h * hd
                                    + (neox ? i + hd / 2 : 2 * i + 1);
                        float   th = (float) pos[t] * inv[i];
                        double  cs = cos((double) th), sn = sin((double) th);
                        double  x0 = x[a], x1 = x[b];

                        ref[a] = x0 * cs - x1 * sn;
                        ref[b] = x0 * sn + x1 * cs;
                    }
                }
            }
            dx = dup_to_dev(x, (size_t) n * ld * sizeof(float));
            dinv = dup_to_dev(inv, (size_t) hd / 2 * sizeof(float));
            dpos = dup_to_dev(pos, sizeof(pos));
            op(nalar_cuda_rope(&C, dx, ld, dpos, n, heads, hd, dinv, neox,
                               &err), &err);
            fetch(got, dx, (size_t) n * ld * sizeof(float));
            snprintf(shape, sizeof(shape), "head_dim %d %s, pos to 8191",
                     hd, neox ? "neox" : "normal");
            report("rope", shape, nerr(got, ref, (int64_t) n * ld), THR_F32);
            cudaFree(dx); cudaFree(dinv); cudaFree(dpos);
            free(x); free(inv); free(got); free(ref);
        }
    }
}


void
check_elementwise(void)
{
    int        n = 7, m = 1001, ld = 2 * m + 3;
    float     *a = xmalloc((size_t) n * ld * sizeof(float));
    float     *bias = xmalloc((size_t) m * sizeof(float));
    float     *got = xmalloc((size_t) n * ld * sizeof(float));
    double    *ref = xmalloc((size_t) n * ld * sizeof(double));
    float     *da, *db, *dy;
    uint16_t  *h = xmalloc((size_t) n * m * 2);
    nalar_err  err;
    int        bad;

    for (int i = 0; i < n * ld; i++) a[i] = frand() * 6.0f;
    for (int i = 0; i < m; i++) bias[i] = frand();
    da = dup_to_dev(a, (size_t) n * ld * sizeof(float));
    db = dup_to_dev(bias, (size_t) m * sizeof(float));

    /* swiglu: g = first m columns, u = next m */
    for (int i = 0; i < n * ld; i++) ref[i] = a[i];
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < m; i++) {
            double g = a[(int64_t) t * ld + i], u = a[(int64_t) t * ld + m + i];

            ref[(int64_t) t * ld + i] = g / (1.0 + exp(-g)) * u;
        }
    }
    op(nalar_cuda_swiglu(&C, da, da + m, ld, n, m, &err), &err);
    fetch(got, da, (size_t) n * ld * sizeof(float));
    report("swiglu", "7 x 1001, ld 2005", nerr(got, ref, (int64_t) n * ld),
           THR_F32);

    /* bias and residual add on the result */
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < m; i++) {
            ref[(int64_t) t * ld + i] = got[(int64_t) t * ld + i] + bias[i];
        }
    }
    for (int i = 0; i < n * ld; i++) {
        if (i % ld >= m) ref[i] = got[i];
    }
    op(nalar_cuda_add_bias(&C, da, ld, n, db, m, &err), &err);
    fetch(got, da, (size_t) n * ld * sizeof(float));
    report("add_bias", "7 x 1001", nerr(got, ref, (int64_t) n * ld),
           THR_F32);

    dy = dup_to_dev(a, (size_t) n * ld * sizeof(float));
    for (int i = 0; i < n * ld; i++) {
        ref[i] = i % ld < m ? (double) a[i] + got[i] : a[i];
    }
    op(nalar_cuda_add(&C, dy, ld, da, ld, n, m, &err), &err);
    fetch(got, dy, (size_t) n * ld * sizeof(float));
    report("add", "7 x 1001 residual", nerr(got, ref, (int64_t) n * ld),
           THR_F32);

    /* to_half: exactly the host's round-to-nearest-even */
    for (int bf = 0; bf < 2; bf++) {
        uint16_t *dh = dnew((size_t) n * m * 2);

        poison(dh, (size_t) n * m * 2);
        op(nalar_cuda_to_half(&C, bf ? GGML_BF16 : GGML_F16, dh, dy, ld, n,
                              m, &err), &err);
        fetch(h, dh, (size_t) n * m * 2);
        bad = 0;
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < m; i++) {
                float    v = got[(int64_t) t * ld + i];
                uint16_t want = bf ? nalar_f32_to_bf16(v)
                                   : nalar_f32_to_f16(v);

                bad += h[(int64_t) t * m + i] != want;
            }
        }
        report_eq("to_half", bf ? "bf16 7 x 1001" : "f16 7 x 1001", bad == 0,
                  "bits differ from the host rounding");
        cudaFree(dh);
    }
    cudaFree(da); cudaFree(db); cudaFree(dy);
    free(a); free(bias); free(got); free(ref); free(h);
}


/* --- projections --- */

static void
check_matmul_one(ggml_type t, int rows, int cols, int n_tok, int pad,
                 int acc, int force_gemv)
{
    int            ldx = cols + pad, ldy = rows + 1;
    hmat           W;
    nalar_cuda_mat dW;
    float         *x = xmalloc((size_t) n_tok * ldx * sizeof(float));
    float         *y0 = xmalloc((size_t) n_tok * ldy * sizeof(float));
    float         *got = xmalloc((size_t) n_tok * ldy * sizeof(float));
    double        *ref = xmalloc((size_t) n_tok * rows * sizeof(double));
    float         *gr = xmalloc((size_t) n_tok * rows * sizeof(float));
    float         *dx, *dy;
    double         thr;
    char           shape[96];
    nalar_err      err;
    int            blas = !force_gemv && n_tok > C.gemv_max;

    hmat_make(&W, t, rows, cols, 1.0f / sqrtf((float) cols));
    dW = hmat_upload(&W);
    for (int i = 0; i < n_tok * ldx; i++) x[i] = frand();
    for (int i = 0; i < n_tok * ldy; i++) y0[i] = frand();
    for (int tk = 0; tk < n_tok; tk++) {
        for (int r = 0; r < rows; r++) {
            const float *w = W.f + (int64_t) r * cols;
            const float *xt = x + (int64_t) tk * ldx;
            double       s = acc ? y0[(int64_t) tk * ldy + r] : 0.0;

            for (int c = 0; c < cols; c++) s += (double) w[c] * xt[c];
            ref[(int64_t) tk * rows + r] = s;
        }
    }
    dx = dup_to_dev(x, (size_t) n_tok * ldx * sizeof(float));
    dy = dup_to_dev(y0, (size_t) n_tok * ldy * sizeof(float));
    if (!acc) {
        poison(dy, (size_t) n_tok * ldy * sizeof(float));
    }
    if (force_gemv) {
        op(nalar_cuda_gemv(&C, &dW, dx, ldx, n_tok, dy, ldy, acc, &err),
           &err);
    } else {
        op(nalar_cuda_matmul(&C, &dW, dx, ldx, n_tok, dy, ldy, acc, &err),
           &err);
    }
    fetch(got, dy, (size_t) n_tok * ldy * sizeof(float));
    for (int tk = 0; tk < n_tok; tk++) {
        memcpy(gr + (int64_t) tk * rows, got + (int64_t) tk * ldy,
               (size_t) rows * sizeof(float));
    }
    thr = !blas || t == GGML_F32 ? THR_F32
          : t == GGML_BF16 || nalar_cuda_kq_type(t) ? THR_BF16 : THR_F16;
    snprintf(shape, sizeof(shape), "%s %dx%d tok %d ldx+%d%s %s",
             tname(t), rows, cols, n_tok, pad, acc ? " acc" : "",
             blas ? "cublas" : "gemv");
    report("matmul", shape, nerr(gr, ref, (int64_t) n_tok * rows), thr);
    hmat_free(&W, &dW);
    cudaFree(dx); cudaFree(dy);
    free(x); free(y0); free(got); free(ref); free(gr);
}


void
check_matmul(void)
{
    static const ggml_type types[] = { GGML_F32, GGML_F16, GGML_BF16,
                                       GGML_Q8_0 };
    static const int shapes[][2] = {
        { 1, 32 }, { 33, 96 }, { 100, 100 }, { 257, 4096 }, { 1000, 384 },
        { 4096, 4096 }
    };
    static const int toks[] = { 1, 2, 3, 5, 8, 9, 33, 128 };

    for (int ti = 0; ti < 4; ti++) {
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int rows = shapes[s][0], cols = shapes[s][1];

            if (types[ti] == GGML_Q8_0 && cols % QK8_0 != 0) {
                continue;
            }
            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
                int n = toks[k];

                /* keep the double reference affordable */
                if ((double) rows * cols * n > 4e8) {
                    continue;
                }
                check_matmul_one(types[ti], rows, cols, n, (int) (k % 2) * 3,
                                 (int) (k % 3 == 1), 0);
                if (n > C.gemv_max && n <= 33) {
                    check_matmul_one(types[ti], rows, cols, n, 0, 0, 1);
                }
            }
        }
    }
}


/* ggml-blocked weights (Q4_0, Q4_K, Q5_K, Q6_K): embedding rows exactly,
 * GEMV in FP32 and cuBLAS on BF16 dequantized weights, against the CPU's
 * dequantization */
/*
 * The tensor-core GEMV (BF16 weights, 1..16 tokens): against the double
 * reference, through nalar_cuda_matmul with gemv_mma on; and each token's
 * row bitwise the same whatever the pass's size (1, 5, 16 tokens), which
 * is what keeps speculative verification equal to plain decoding.
 */
void
check_mma(void)
{
    static const int shapes[][2] = {
        { 16, 32 }, { 33, 96 }, { 100, 104 }, { 257, 4096 }, { 1000, 384 },
        { 4096, 4096 }, { 6144, 4096 }, { 4096, 14336 }
    };
    static const int toks[] = { 1, 2, 3, 4, 5, 8, 9, 13, 16 };
    int              saved = C.gemv_mma;

    C.gemv_mma = 1;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int            rows = shapes[s][0], cols = shapes[s][1];
        int            ldy = rows + 1, ldx = cols + 4;
        hmat           W;
        nalar_cuda_mat dW;
        float         *x = xmalloc((size_t) 16 * ldx * sizeof(float));
        float         *y0 = xmalloc((size_t) 16 * ldy * sizeof(float));
        float         *got = xmalloc((size_t) 16 * ldy * sizeof(float));
        float         *one = xmalloc((size_t) ldy * sizeof(float));
        double        *ref = xmalloc((size_t) 16 * rows * sizeof(double));
        float         *gr = xmalloc((size_t) 16 * rows * sizeof(float));
        float         *dx, *dy;
        char           shape[96];
        nalar_err      err;
        int            same = 1;

        hmat_make(&W, GGML_BF16, rows, cols, 1.0f / sqrtf((float) cols));
        dW = hmat_upload(&W);
        for (int i = 0; i < 16 * ldx; i++) x[i] = frand();
        for (int i = 0; i < 16 * ldy; i++) y0[i] = frand();
        dx = dup_to_dev(x, (size_t) 16 * ldx * sizeof(float));
        dy = dnew((size_t) 16 * ldy * sizeof(float));
        for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
            int n = toks[k], acc = (int) (k % 2);

            if ((double) rows * cols * n > 4e8) {
                continue;
            }
            for (int tk = 0; tk < n; tk++) {
                for (int r = 0; r < rows; r++) {
                    const float *w = W.f + (int64_t) r * cols;
                    const float *xt = x + (int64_t) tk * ldx;
                    double       sum = acc ? y0[(int64_t) tk * ldy + r] : 0.0;

                    for (int c = 0; c < cols; c++) {
                        sum += (double) w[c] * xt[c];
                    }
                    ref[(int64_t) tk * rows + r] = sum;
                }
            }
            if (acc) {
                cu(cudaMemcpy(dy, y0, (size_t) n * ldy * sizeof(float),
                              cudaMemcpyHostToDevice), "upload");
                upload_done();
            } else {
                poison(dy, (size_t) n * ldy * sizeof(float));
            }
            op(nalar_cuda_matmul(&C, &dW, dx, ldx, n, dy, ldy, acc, &err),
               &err);
            fetch(got, dy, (size_t) n * ldy * sizeof(float));
            for (int tk = 0; tk < n; tk++) {
                memcpy(gr + (int64_t) tk * rows, got + (int64_t) tk * ldy,
                       (size_t) rows * sizeof(float));
            }
            snprintf(shape, sizeof(shape), "BF16 %dx%d tok %d%s mma",
                     rows, cols, n, acc ? " acc" : "");
            report("matmul", shape, nerr(gr, ref, (int64_t) n * rows),
                   THR_MMA);
        }
        /* batch invariance: token t alone equals token t of 5 and of 16 */
        for (int n = 5; n <= 16 && same; n += 11) {
            poison(dy, (size_t) n * ldy * sizeof(float));
            op(nalar_cuda_matmul(&C, &dW, dx, ldx, n, dy, ldy, 0, &err),
               &err);
            fetch(got, dy, (size_t) n * ldy * sizeof(float));
            for (int tk = 0; tk < n && same; tk++) {
                poison(dy, (size_t) ldy * sizeof(float));
                op(nalar_cuda_matmul(&C, &dW, dx + (int64_t) tk * ldx, ldx,
                                     1, dy, ldy, 0, &err), &err);
                fetch(one, dy, (size_t) rows * sizeof(float));
                same = memcmp(one, got + (int64_t) tk * ldy,
                              (size_t) rows * sizeof(float)) == 0;
            }
        }
        snprintf(shape, sizeof(shape), "BF16 %dx%d: 1 token = its row of "
                 "5 and of 16", rows, cols);
        report_eq("mma", shape, same, "a token's result depends on the "
                  "pass's size");
        hmat_free(&W, &dW);
        cudaFree(dx); cudaFree(dy);
        free(x); free(y0); free(got); free(one); free(ref); free(gr);
    }
    C.gemv_mma = saved;
}


void
check_kq(void)
{
    static const ggml_type types[] = { GGML_Q4_0, GGML_Q4_K, GGML_Q5_K,
                                       GGML_Q6_K };
    static const int shapes[][2] = {
        { 1, 256 }, { 33, 512 }, { 257, 4096 }, { 1000, 768 }
    };
    static const int toks[] = { 1, 2, 3, 5, 8, 9, 33, 128 };
    nalar_err err;

    for (int ti = 0; ti < 4; ti++) {
        ggml_type t = types[ti];

        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int rows = shapes[s][0], cols = shapes[s][1];

            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
                int n = toks[k];

                if ((double) rows * cols * n > 4e8) {
                    continue;
                }
                check_matmul_one(t, rows, cols, n, (int) (k % 2) * 4,
                                 (int) (k % 3 == 1), 0);
                if (n > C.gemv_max && n <= 33) {
                    check_matmul_one(t, rows, cols, n, 0, 0, 1);
                }
            }
        }
        {
            int            vocab = 301, dim = 512, n = 9;
            hmat           E;
            nalar_cuda_mat dE;
            int32_t        tok[9] = { 0, 300, 7, 7, 150, 1, 299, 42, 0 };
            float         *got = xmalloc((size_t) n * dim * sizeof(float));
            double        *ref = xmalloc((size_t) n * dim * sizeof(double));
            int32_t       *dtok = dup_to_dev(tok, sizeof(tok));
            float         *dout = dnew((size_t) n * dim * sizeof(float));
            char           shape[96];

            hmat_make(&E, t, vocab, dim, 1.0f);
            dE = hmat_upload(&E);
            for (int i = 0; i < n; i++) {
                for (int k = 0; k < dim; k++) {
                    ref[(int64_t) i * dim + k] =
                        E.f[(int64_t) tok[i] * dim + k];
                }
            }
            poison(dout, (size_t) n * dim * sizeof(float));
            op(nalar_cuda_embed(&C, &dE, dtok, n, dout, dim, &err), &err);
            fetch(got, dout, (size_t) n * dim * sizeof(float));
            snprintf(shape, sizeof(shape), "%s vocab %d dim %d", tname(t),
                     vocab, dim);
            report("embed", shape, nerr(got, ref, (int64_t) n * dim), 0.0);
            hmat_free(&E, &dE);
            cudaFree(dtok); cudaFree(dout);
            free(got); free(ref);
        }
    }
}


/* GEMV rows per warp: 1, 2 and 4 must give the same bits (each (row,
 * token) sum runs over the same columns in the same order) -- what keeps a
 * speculative verification pass's logits equal to plain decoding's. */
void
check_gemv_rows(void)
{
    static const ggml_type types[] = { GGML_F32, GGML_F16, GGML_BF16 };
    static const int shapes[][2] = { { 33, 96 }, { 257, 4096 },
                                     { 1000, 384 }, { 61, 100 } };
    static const int toks[] = { 1, 2, 3, 5, 8, 9 };

    for (int ti = 0; ti < 3; ti++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            int    rows = shapes[si][0], cols = shapes[si][1];
            int    ldx = cols + 4, ldy = rows + 3;
            hmat   W;
            nalar_cuda_mat dW;
            float *x, *dx, *dy, *want, *got;
            char   shape[96];
            int    good = 1;
            nalar_err err;

            hmat_make(&W, types[ti], rows, cols, 1.0f / sqrtf((float) cols));
            dW = hmat_upload(&W);
            x = xmalloc((size_t) 9 * ldx * sizeof(float));
            want = xmalloc((size_t) 9 * ldy * sizeof(float));
            got = xmalloc((size_t) 9 * ldy * sizeof(float));
            for (int i = 0; i < 9 * ldx; i++) x[i] = frand();
            dx = dup_to_dev(x, (size_t) 9 * ldx * sizeof(float));
            dy = dnew((size_t) 9 * ldy * sizeof(float));
            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
                int    n = toks[k];
                size_t bytes = (size_t) n * ldy * sizeof(float);

                for (int R = 1; R <= 4; R *= 2) {
                    poison(dy, bytes);
                    op(nalar_cuda_gemv_rows(&C, &dW, dx, ldx, n, dy, ldy, 0,
                                            R, &err), &err);
                    fetch(R == 1 ? want : got, dy, bytes);
                    for (int t = 0; t < n && R > 1; t++) {
                        good &= memcmp(want + (int64_t) t * ldy,
                                       got + (int64_t) t * ldy,
                                       (size_t) rows * sizeof(float)) == 0;
                    }
                }
            }
            snprintf(shape, sizeof(shape), "%s %dx%d, 1-9 tokens, 1/2/4 rows",
                     tname(types[ti]), rows, cols);
            report_eq("gemv_rows", shape, good,
                      "rows per warp changed the results");
            hmat_free(&W, &dW);
            cudaFree(dx);
            cudaFree(dy);
            free(x);
            free(want);
            free(got);
        }
    }
}
