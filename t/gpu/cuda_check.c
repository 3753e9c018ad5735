/*
 * nalar-cuda-check: every CUDA op against a CPU reference on random inputs
 * of realistic and awkward shapes, then greedy generation with the CUDA
 * backend against the CPU backend, token for token.
 *
 *   build/nalar-cuda-check [--require-gpu] [--ops-only] [--models DIR]
 *                          [--conformance DIR]
 *
 * The model conformance kit's files (t/data/conformance) run teacher-forced
 * on the CUDA backend with FP32 activations: the logits at the reference's
 * top-16 ids of every position must be within the kit's tolerance for the
 * file's type, and the greedy ids equal the CPU backend's.
 *
 * Outputs are poisoned (all bits set: NaN) before every run, so an element
 * a kernel forgets to write fails the check.  Errors are normalised:
 * ||got - ref||_2 / ||ref||_2 over the output, with the reference computed
 * in double from the same (already rounded) inputs; thresholds are per
 * path: FP32-activation kernels 2e-5, cuBLAS with activations rounded to
 * F16 3e-3, to BF16 2e-2.
 *
 * Exit status: 0 all passed, 1 a check failed, 77 no GPU (skipped; with
 * --require-gpu that is a failure).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <jansson.h>

#include "act.cuh"
#include "attention.cuh"
#include "backend.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "cpu_quant.h"
#include "cuda_plan.h"
#include "embed.cuh"
#include "engine.h"
#include "fp16.h"
#include "gemv_kq.cuh"
#include "gemv_mma.cuh"
#include "gemv_q8.cuh"
#include "kv.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "sample.cuh"
#include "sampler.h"

#define THR_F32  2e-5
#define THR_KV_BF16 0.05          /* logits: a BF16 KV cache's extra error */
#define THR_MMA  1e-4             /* activations split into two BF16 halves */
#define THR_F16  3e-3
#define THR_BF16 2e-2

static int            n_pass, n_fail;
static nalar_cuda_ctx C;

/* 1: the attention and KV checks keep the device pool in BF16 (the host
 * reference reads the same rounded values) */
static int kv_bf16;


static uint64_t       rng_state = 0x243f6a8885a308d3ull;


/* --- small helpers (a check program: failing to allocate ends it) --- */

static void
die(const char *what, const char *msg)
{
    fprintf(stderr, "nalar-cuda-check: %s: %s\n", what, msg);
    exit(1);
}


static void
cu(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        die(what, cudaGetErrorString(e));
    }
}


static void
op(int rc, nalar_err *err)
{
    if (rc != 0) {
        die("op", err->msg);
    }
}


static uint64_t
rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}


static float
frand(void)
{
    return (float) (rnd() >> 40) * (2.0f / 16777216.0f) - 1.0f;
}


static void *
xmalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);

    if (p == NULL) {
        die("malloc", "out of memory");
    }
    return p;
}


static void *
dnew(size_t bytes)
{
    void *p;

    cu(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc");
    return p;
}


/* a cudaMemcpy from pageable memory may return before its DMA has
 * landed, and the ops' stream does not wait for it */
static void
upload_done(void)
{
    cu(cudaDeviceSynchronize(), "upload");
}


static void *
dup_to_dev(const void *h, size_t bytes)
{
    void *d = dnew(bytes);

    cu(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload");
    upload_done();
    return d;
}


/* outputs filled with NaN before an op writes them; on the ops' stream,
 * which does not wait for the legacy default stream */
static void
poison(void *d, size_t bytes)
{
    cu(cudaMemsetAsync(d, 0xff, bytes, C.stream), "poison");
}


static void
fetch(void *h, const void *d, size_t bytes)
{
    cu(cudaStreamSynchronize(C.stream), "kernel");
    cu(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "download");
}


/* ||got - ref|| / ||ref||; a NaN anywhere is infinitely wrong */
static double
nerr(const float *got, const double *ref, int64_t n)
{
    double num = 0, den = 0;

    for (int64_t i = 0; i < n; i++) {
        double d = (double) got[i] - ref[i];

        if (isnan(got[i])) {
            return INFINITY;
        }
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}


static void
report(const char *opname, const char *shape, double e, double thr)
{
    int good = e <= thr;

    if (good) {
        n_pass++;
    } else {
        n_fail++;
    }
    printf("%-4s %-14s %-58s err %.2e (max %.0e)\n", good ? "ok" : "FAIL",
           opname, shape, e, thr);
}


static void
report_eq(const char *opname, const char *shape, int good, const char *why)
{
    if (good) {
        n_pass++;
    } else {
        n_fail++;
    }
    printf("%-4s %-14s %-58s %s\n", good ? "ok" : "FAIL", opname, shape,
           good ? "exact" : why);
}


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

static void
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


static void
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


static void
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


static void
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


static void
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
static void
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


static void
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
static void
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


/* --- paged KV and attention --- */

/* f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as
 * __float2bfloat16_rn stores them */
static uint16_t
to_bf16(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t) (u >> 16);
}


static float
from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t) b << 16;
    float    f;

    memcpy(&f, &u, sizeof(f));
    return f;
}


/* a host pool's n values as the device keeps them: with kv_bf16 the
 * floats are rounded in place and a BF16 copy uploaded */
static float *
kv_to_dev(float *h, int64_t n)
{
    uint16_t *b;
    float    *d;

    if (!kv_bf16) {
        return dup_to_dev(h, (size_t) n * sizeof(float));
    }
    b = xmalloc((size_t) n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) {
        b[i] = to_bf16(h[i]);
        h[i] = from_bf16(b[i]);
    }
    d = dup_to_dev(b, (size_t) n * sizeof(uint16_t));
    free(b);
    return d;
}


typedef struct {
    int32_t n_heads, n_kv, hd;
} att_cfg;

typedef struct {
    nalar_kv_pool  pool;      /* bookkeeping + host copy of K/V */
    nalar_cuda_kv  dkv;
    nalar_seq_kv  *seqs;
    int            n_seqs;
} att_world;


/* A pool of n_layers 2 whose sequences hold ctx[i] positions in shuffled
 * blocks; written slots random, every other slot NaN (a kernel that reads
 * past a sequence's end, or multiplies a masked weight by it, fails). */
static void
world_make(att_world *w, const att_cfg *a, const int32_t *ctx, int n)
{
    int32_t   need = 8;
    int32_t  *perm;
    int64_t   nf;
    nalar_err err;
    float     qnan = nanf("");

    memset(w, 0, sizeof(*w));
    for (int i = 0; i < n; i++) {
        need += (ctx[i] + 16 + NALAR_KV_BLOCK - 1) / NALAR_KV_BLOCK;
    }
    op(nalar_kv_pool_init(&w->pool, need, 2, a->n_kv * a->hd, &err), &err);
    /* shuffle the free list so tables are scattered */
    perm = w->pool.free_list;
    for (int32_t i = need - 1; i > 0; i--) {
        int32_t j = (int32_t) (rnd() % (uint64_t) (i + 1)), t = perm[i];

        perm[i] = perm[j];
        perm[j] = t;
    }
    nf = (int64_t) need * 2 * NALAR_KV_BLOCK * w->pool.kv_dim;
    w->pool.k = xmalloc((size_t) nf * sizeof(float));
    w->pool.v = xmalloc((size_t) nf * sizeof(float));
    for (int64_t i = 0; i < nf; i++) {
        w->pool.k[i] = qnan;
        w->pool.v[i] = qnan;
    }
    w->seqs = calloc((size_t) n, sizeof(nalar_seq_kv));
    w->n_seqs = n;
    for (int i = 0; i < n; i++) {
        nalar_seq_kv_init(&w->seqs[i]);
        if (nalar_seq_kv_reserve(&w->pool, &w->seqs[i], ctx[i] + 16) != 0) {
            die("world", "pool too small");
        }
        w->seqs[i].n_pos = ctx[i];
        for (int32_t p = 0; p < ctx[i]; p++) {
            for (int l = 0; l < 2; l++) {
                int64_t off = nalar_kv_offset(&w->pool,
                                              w->seqs[i].blocks[p / 16], l,
                                              p % 16);

                for (int k = 0; k < w->pool.kv_dim; k++) {
                    w->pool.k[off + k] = frand();
                    w->pool.v[off + k] = frand();
                }
            }
        }
    }
    w->dkv.k = kv_to_dev(w->pool.k, nf);
    w->dkv.v = kv_to_dev(w->pool.v, nf);
    w->dkv.n_blocks = need;
    w->dkv.n_layers = 2;
    w->dkv.kv_dim = w->pool.kv_dim;
    w->dkv.bf16 = kv_bf16;
}


static void
world_free(att_world *w)
{
    for (int i = 0; i < w->n_seqs; i++) {
        nalar_seq_kv_release(&w->pool, &w->seqs[i]);
    }
    free(w->seqs);
    cudaFree(w->dkv.k);
    cudaFree(w->dkv.v);
    free(w->pool.k);
    free(w->pool.v);
    w->pool.k = w->pool.v = NULL;
    nalar_kv_pool_free(&w->pool);
}


/* reference: layer 1, token at pos of seq s, head h */
static void
att_ref(const att_world *w, const att_cfg *a, const nalar_seq_kv *s,
        int32_t pos, const float *q, double *out)
{
    int     group = a->n_heads / a->n_kv, hd = a->hd;
    double *sc = xmalloc((size_t) (pos + 1) * sizeof(double));

    for (int h = 0; h < a->n_heads; h++) {
        int64_t col = (int64_t) (h / group) * hd;
        double  mx = -INFINITY, sum = 0;

        for (int32_t j = 0; j <= pos; j++) {
            const float *k = w->pool.k + nalar_kv_offset(&w->pool,
                                 s->blocks[j / 16], 1, j % 16) + col;
            double       d = 0;

            for (int e = 0; e < hd; e++) d += (double) q[h * hd + e] * k[e];
            sc[j] = d / sqrt((double) hd);
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int32_t j = 0; j <= pos; j++) {
            sc[j] = exp(sc[j] - mx);
            sum += sc[j];
        }
        for (int e = 0; e < hd; e++) {
            double o = 0;

            for (int32_t j = 0; j <= pos; j++) {
                o += sc[j] * w->pool.v[nalar_kv_offset(&w->pool,
                                 s->blocks[j / 16], 1, j % 16) + col + e];
            }
            out[h * hd + e] = o / sum;
        }
    }
    free(sc);
}


/* decode: one token per sequence at its last position, plus a second
 * token of sequence 0 at an earlier position; then prefill tiles: a run of
 * `run` tokens at the end of the longest sequence */
static void
check_attention_cfg(const att_cfg *a, const int32_t *ctx, int n, int run)
{
    att_world     w;
    int           qd = a->n_heads * a->hd, ldq = qd + 7;
    int           T = n + 1;
    int32_t      *tok, *pos;
    nalar_seq_kv **seq;
    int8_t       *want;
    nalar_batch   b;
    nalar_cuda_plan plan;
    int32_t      *stage;
    int64_t       cap;
    float        *q, *got, *dq, *dout, *dpart;
    double       *ref;
    int32_t      *dstage;
    nalar_err     err;
    char          shape[128];
    int           splits[3], longest = 0;
    int           tile_q = nalar_cuda_attn_tile_q(a->hd, a->n_heads / a->n_kv);

    world_make(&w, a, ctx, n);
    for (int i = 1; i < n; i++) {
        longest = ctx[i] > ctx[longest] ? i : longest;
    }
    if (run > ctx[longest]) {
        run = ctx[longest];
    }
    T = n + 1 > run + 1 ? n + 1 : run + 1;
    tok = calloc((size_t) T, sizeof(int32_t));
    pos = calloc((size_t) T, sizeof(int32_t));
    seq = calloc((size_t) T, sizeof(*seq));
    want = calloc((size_t) T, 1);
    q = xmalloc((size_t) T * ldq * sizeof(float));
    got = xmalloc((size_t) T * qd * sizeof(float));
    ref = xmalloc((size_t) T * qd * sizeof(double));
    for (int i = 0; i < T * ldq; i++) q[i] = frand() * 2.0f;
    dq = dup_to_dev(q, (size_t) T * ldq * sizeof(float));
    dout = dnew((size_t) T * qd * sizeof(float));

    /* decode batch */
    for (int i = 0; i < n; i++) {
        seq[i] = &w.seqs[i];
        pos[i] = ctx[i] - 1;
    }
    seq[n] = &w.seqs[0];
    pos[n] = ctx[0] / 2;
    b.n_tokens = n + 1;
    b.tokens = tok;
    b.pos = pos;
    b.seq = seq;
    b.want_logits = want;
    b.n_logits = 0;
    cap = nalar_cuda_plan_ints(&b, T) + 16;
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, tile_q, n + 1, stage, cap, &plan, &err),
       &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    for (int t = 0; t < n + 1; t++) {
        att_ref(&w, a, seq[t], pos[t], q + (int64_t) t * ldq,
                ref + (int64_t) t * qd);
    }
    splits[0] = 1;
    splits[1] = 3;
    splits[2] = nalar_cuda_attn_splits(n + 1, a->n_kv
                    * nalar_cuda_attn_head_chunks(a->n_heads, a->n_kv),
                    C.sm_count, 0);
    for (int si = 0; si < 3; si++) {
        int64_t pf = nalar_cuda_attn_part_floats(n + 1, a->n_heads, a->hd,
                                                 splits[si]);

        dpart = pf > 0 ? dnew((size_t) pf * sizeof(float)) : NULL;
        if (dpart != NULL) {
            poison(dpart, (size_t) pf * sizeof(float));
        }
        poison(dout, (size_t) T * qd * sizeof(float));
        op(nalar_cuda_attn_decode(&C, dout, qd, dq, ldq, &w.dkv, 1,
                                  dstage + NALAR_CUDA_PLAN_POS(n + 1),
                                  dstage + NALAR_CUDA_PLAN_TBLOFF(n + 1),
                                  dstage + NALAR_CUDA_PLAN_TABLES(n + 1),
                                  n + 1, a->n_heads, a->n_kv, a->hd,
                                  splits[si], dpart, &err), &err);
        fetch(got, dout, (size_t) (n + 1) * qd * sizeof(float));
        snprintf(shape, sizeof(shape),
                 "decode h%d/%d hd%d ctx<=%d split %d%s%s", a->n_heads,
                 a->n_kv, a->hd, ctx[longest], splits[si],
                 C.attn_prefetch ? "" : " no-prefetch",
                 kv_bf16 ? " kv bf16" : "");
        report("attention", shape, nerr(got, ref, (int64_t) (n + 1) * qd),
               THR_F32);
        cudaFree(dpart);
    }
    cudaFree(dstage);
    free(stage);

    /* prefill tiles: `run` tokens of the longest sequence ending at its end,
     * then one decode token of another sequence (a mixed batch) */
    for (int t = 0; t < run; t++) {
        seq[t] = &w.seqs[longest];
        pos[t] = ctx[longest] - run + t;
    }
    b.n_tokens = run;
    if (n > 1) {
        int other = longest == 0 ? 1 : 0;

        seq[run] = &w.seqs[other];
        pos[run] = ctx[other] - 1;
        b.n_tokens = run + 1;
    }
    cap = nalar_cuda_plan_ints(&b, b.n_tokens) + 16;
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, tile_q, b.n_tokens, stage, cap, &plan,
                            &err), &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    for (int t = 0; t < b.n_tokens; t++) {
        att_ref(&w, a, seq[t], pos[t], q + (int64_t) t * ldq,
                ref + (int64_t) t * qd);
    }
    poison(dout, (size_t) T * qd * sizeof(float));
    {
        int32_t P = b.n_tokens;

        op(nalar_cuda_attn_prefill(&C, dout, qd, dq, ldq, &w.dkv, 1,
                                   dstage + NALAR_CUDA_PLAN_POS(P),
                                   dstage + NALAR_CUDA_PLAN_TBLOFF(P),
                                   dstage + NALAR_CUDA_PLAN_TABLES(P),
                                   dstage + NALAR_CUDA_PLAN_TILES(P),
                                   plan.n_tiles, a->n_heads, a->n_kv, a->hd,
                                   &err), &err);
    }
    fetch(got, dout, (size_t) b.n_tokens * qd * sizeof(float));
    snprintf(shape, sizeof(shape), "prefill h%d/%d hd%d run %d, %d tiles%s",
             a->n_heads, a->n_kv, a->hd, run, plan.n_tiles,
             kv_bf16 ? " kv bf16" : "");
    report("attention", shape, nerr(got, ref, (int64_t) b.n_tokens * qd),
           THR_F32);
    cudaFree(dstage);
    free(stage);

    cudaFree(dq); cudaFree(dout);
    free(tok); free(pos); free(seq); free(want); free(q); free(got);
    free(ref);
    world_free(&w);
}


static void
check_attention(void)
{
    static const att_cfg cfgs[] = {
        { 4, 2, 32 },     /* the kjv target model */
        { 4, 2, 16 },     /* the kjv draft model */
        { 32, 8, 128 },   /* llama3-8b: GQA 4:1 */
        { 8, 8, 64 },     /* MHA */
        { 12, 4, 64 },    /* group 3 */
        { 16, 2, 128 },   /* group 8 */
        { 24, 2, 64 },    /* group 12: two head chunks */
        { 8, 2, 256 }
    };
    static const int32_t small[] = { 1, 15, 16, 17, 100, 1000 };
    static const int32_t large[] = { 1, 17, 300, 8192 };

    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        check_attention_cfg(&cfgs[i], small, 6, 40);
    }
    check_attention_cfg(&cfgs[2], large, 4, 100);
    check_attention_cfg(&cfgs[0], large, 4, 33);
}


static void
check_kv(void)
{
    att_cfg    a = { 8, 2, 64 };
    int32_t    ctx[3] = { 5, 40, 33 };
    att_world  w;
    int        kd = a.n_kv * a.hd, ld = 3 * kd + 1, n = 5;
    nalar_seq_kv *seq[5];
    int32_t    tok[5] = { 0 }, pos[5] = { 5, 40, 41, 33, 6 };
    int8_t     want[5] = { 0 };
    nalar_batch b = { 5, tok, pos, seq, want, 0 };
    nalar_cuda_plan plan;
    int32_t   *stage, *dstage;
    int64_t    cap, nf;
    float     *src, *dsrc, *gk, *gv;
    nalar_err  err;
    int        bad = 0;

    world_make(&w, &a, ctx, 3);
    seq[0] = &w.seqs[0]; seq[1] = &w.seqs[1]; seq[2] = &w.seqs[1];
    seq[3] = &w.seqs[2]; seq[4] = &w.seqs[0];
    src = xmalloc((size_t) n * ld * sizeof(float));
    for (int i = 0; i < n * ld; i++) src[i] = frand();
    cap = nalar_cuda_plan_ints(&b, n);
    stage = xmalloc((size_t) cap * sizeof(int32_t));
    op(nalar_cuda_plan_fill(&b, 1, 4, n, stage, cap, &plan, &err), &err);
    dstage = dup_to_dev(stage, (size_t) plan.n_ints * sizeof(int32_t));
    dsrc = dup_to_dev(src, (size_t) n * ld * sizeof(float));
    op(nalar_cuda_kv_append(&C, &w.dkv, 1, dsrc, ld, kd, 2 * kd,
                            dstage + NALAR_CUDA_PLAN_POS(n),
                            dstage + NALAR_CUDA_PLAN_TBLOFF(n),
                            dstage + NALAR_CUDA_PLAN_TABLES(n), n, &err),
       &err);
    /* host: the same writes; then a copy-on-write of block b0 -> b1 */
    for (int t = 0; t < n; t++) {
        int64_t off = nalar_kv_offset(&w.pool,
                                      seq[t]->blocks[pos[t] / 16], 1,
                                      pos[t] % 16);

        memcpy(w.pool.k + off, src + (int64_t) t * ld + kd,
               (size_t) kd * sizeof(float));
        memcpy(w.pool.v + off, src + (int64_t) t * ld + 2 * kd,
               (size_t) kd * sizeof(float));
    }
    op(nalar_cuda_kv_copy_block(&C, &w.dkv, w.seqs[2].blocks[0],
                                w.seqs[1].blocks[2], &err), &err);
    nf = (int64_t) w.pool.n_blocks * 2 * 16 * kd;
    memcpy(w.pool.k + nalar_kv_offset(&w.pool, w.seqs[2].blocks[0], 0, 0),
           w.pool.k + nalar_kv_offset(&w.pool, w.seqs[1].blocks[2], 0, 0),
           (size_t) 2 * 16 * kd * sizeof(float));
    memcpy(w.pool.v + nalar_kv_offset(&w.pool, w.seqs[2].blocks[0], 0, 0),
           w.pool.v + nalar_kv_offset(&w.pool, w.seqs[1].blocks[2], 0, 0),
           (size_t) 2 * 16 * kd * sizeof(float));
    gk = xmalloc((size_t) nf * sizeof(float));
    gv = xmalloc((size_t) nf * sizeof(float));
    if (kv_bf16) {
        /* the device rounds what it appends; the host rounds the same
         * values, and compares bits */
        uint16_t *bk = xmalloc((size_t) nf * sizeof(uint16_t)),
                 *bv = xmalloc((size_t) nf * sizeof(uint16_t));

        fetch(bk, w.dkv.k, (size_t) nf * sizeof(uint16_t));
        fetch(bv, w.dkv.v, (size_t) nf * sizeof(uint16_t));
        for (int64_t i = 0; i < nf && !bad; i++) {
            bad = bk[i] != to_bf16(w.pool.k[i])
                  || bv[i] != to_bf16(w.pool.v[i]);
        }
        free(bk);
        free(bv);
    } else {
        fetch(gk, w.dkv.k, (size_t) nf * sizeof(float));
        fetch(gv, w.dkv.v, (size_t) nf * sizeof(float));
        /* bitwise: NaN slots must still be the same NaN */
        bad = memcmp(gk, w.pool.k, (size_t) nf * sizeof(float)) != 0
              || memcmp(gv, w.pool.v, (size_t) nf * sizeof(float)) != 0;
    }
    report_eq("kv_append", kv_bf16 ? "5 tokens, 3 sequences, + block copy, "
              "kv bf16" : "5 tokens, 3 sequences, + block copy", !bad,
              "pool differs from the host's");
    free(gk); free(gv); free(src); free(stage);
    cudaFree(dstage); cudaFree(dsrc);
    world_free(&w);
}


/* --- sampling --- */

static int
desc(const void *a, const void *b)
{
    float x = *(const float *) a, y = *(const float *) b;

    return x < y ? 1 : x > y ? -1 : 0;
}


/* The documented device semantics, on the host.  *slack: distance of the
 * draw target from the nearest CDF step, relative to the total (a pick
 * may differ from the device's only when it is ~0). */
static int32_t
sample_ref(const float *l, int32_t n, const nalar_cuda_sampling *p,
           double *slack)
{
    float  *s = xmalloc((size_t) n * sizeof(float));
    float   kth = -INFINITY, pth = -INFINITY, mx;
    float   inv_t = 1.0f / p->temperature;      /* as the device does */
    double  z = 0, total = 0, target, run = 0;
    int32_t pick = -1;

    memcpy(s, l, (size_t) n * sizeof(float));
    qsort(s, (size_t) n, sizeof(float), desc);
    mx = s[0];
    if (p->top_k > 0 && p->top_k < n) {
        kth = s[p->top_k - 1];                 /* ties at it all kept */
    }
    for (int32_t i = 0; i < n && s[i] >= kth; i++) {
        z += expf((s[i] - mx) * inv_t);
    }
    if (p->top_p < 1.0f) {
        double cum = 0;

        for (int32_t i = 0; i < n && s[i] >= kth; i++) {
            cum += expf((s[i] - mx) * inv_t);
            if ((i == n - 1 || s[i + 1] != s[i])
                && cum >= (double) p->top_p * z)
            {
                pth = s[i];
                break;
            }
        }
    }
    free(s);
#define KEPT(i) (l[i] >= kth && l[i] >= pth                                  \
                 && expf((l[i] - mx) * inv_t) > 0.0f               \
                 && expf((l[i] - mx) * inv_t) >= p->min_p)
    for (int32_t i = 0; i < n; i++) {
        if (KEPT(i)) total += expf((l[i] - mx) * inv_t);
    }
    target = nalar_cuda_uniform(p->seed, p->counter) * total;
    *slack = INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (KEPT(i)) {
            run += expf((l[i] - mx) * inv_t);
            if (fabs(run - target) < *slack) *slack = fabs(run - target);
            if (pick < 0 && run > target) pick = i;
        }
    }
#undef KEPT
    *slack /= total > 0 ? total : 1;
    return pick;
}


static void
check_sampling(void)
{
    enum { NR = 12 };
    int32_t              vocab = 1000, big = 128256;
    float               *l = xmalloc((size_t) NR * big * sizeof(float));
    nalar_cuda_sampling  p[NR];
    int32_t              ids[NR], *dids, bad = 0, close = 0;
    float               *dl;
    nalar_cuda_sampling *dp;
    nalar_err            err;

    /* argmax: ties to the lowest id, NaN never wins, all-NaN gives 0 */
    for (int r = 0; r < NR; r++) {
        for (int32_t i = 0; i < big; i++) {
            l[(int64_t) r * big + i] = frand() * 10.0f;
        }
    }
    l[(int64_t) 1 * big + 5] = 50.0f;
    l[(int64_t) 1 * big + 70000] = 50.0f;      /* tie: 5 wins */
    l[(int64_t) 2 * big + 3] = nanf("");
    l[(int64_t) 2 * big + 9] = 60.0f;
    for (int32_t i = 0; i < big; i++) {
        l[(int64_t) 3 * big + i] = nanf("");
    }
    l[(int64_t) 4 * big + big - 1] = INFINITY;
    dl = dup_to_dev(l, (size_t) NR * big * sizeof(float));
    dids = dnew(NR * sizeof(int32_t));
    poison(dids, NR * sizeof(int32_t));
    op(nalar_cuda_argmax(&C, dl, big, NR, big, dids, &err), &err);
    fetch(ids, dids, sizeof(ids));
    for (int r = 0; r < NR; r++) {
        bad += ids[r] != nalar_argmax(l + (int64_t) r * big, big);
    }
    report_eq("argmax", "12 rows x 128256, ties, NaN, inf", bad == 0,
              "differs from nalar_argmax");

    /* speculative verification: groups of rows, leading matches */
    {
        int32_t row0[4] = { 0, 3, 4, 8 }, nn[4] = { 3, 1, 4, 4 };
        int32_t prop[NR], acc[4], next[4], want_a[4], want_n[4];
        int32_t *d0, *dn, *dprop, *dacc, *dnext;

        for (int r = 0; r < NR; r++) {
            prop[r] = nalar_argmax(l + (int64_t) r * big, big);
        }
        prop[1] = 17;                 /* group 0: 1 accepted, then 0's ... */
        prop[6] = 4;                  /* group 2: 2 accepted */
        for (int g = 0; g < 4; g++) {
            int a = 0;

            while (a < nn[g] - 1
                   && nalar_argmax(l + (int64_t) (row0[g] + a) * big, big)
                      == prop[row0[g] + a])
            {
                a++;
            }
            want_a[g] = a;
            want_n[g] = nalar_argmax(l + (int64_t) (row0[g] + a) * big, big);
        }
        d0 = dup_to_dev(row0, sizeof(row0));
        dn = dup_to_dev(nn, sizeof(nn));
        dprop = dup_to_dev(prop, sizeof(prop));
        dacc = dnew(sizeof(acc));
        dnext = dnew(sizeof(next));
        poison(dacc, sizeof(acc));
        poison(dnext, sizeof(next));
        op(nalar_cuda_verify_greedy(&C, dl, big, big, d0, dn, dprop, 4, NR,
                                    dids, dacc, dnext, &err), &err);
        fetch(acc, dacc, sizeof(acc));
        fetch(next, dnext, sizeof(next));
        report_eq("verify_greedy", "4 groups, accepted 1/0/2/3",
                  memcmp(acc, want_a, sizeof(acc)) == 0
                  && memcmp(next, want_n, sizeof(next)) == 0,
                  "accepted counts or next tokens differ");
        cudaFree(d0); cudaFree(dn); cudaFree(dprop); cudaFree(dacc);
        cudaFree(dnext);
    }

    /* sampling: each row its own parameters; picks equal the host's
     * semantics except where the draw lands on a CDF step */
    for (int r = 0; r < NR; r++) {
        for (int32_t i = 0; i < vocab; i++) {
            l[(int64_t) r * vocab + i] = frand() * 4.0f;
        }
        p[r].temperature = r == 0 ? 0.0f : 0.3f + 0.2f * (float) (r % 5);
        p[r].top_k = r % 3 == 1 ? 1 + r * 7 : 0;
        p[r].top_p = r % 4 == 2 ? 0.5f + 0.04f * (float) r : 1.0f;
        p[r].min_p = r % 5 == 3 ? 0.05f : 0.0f;
        p[r].seed = 1234 + (uint64_t) r;
        p[r].counter = (uint64_t) r * 3;
    }
    p[11].top_k = 40; p[11].top_p = 0.9f; p[11].min_p = 0.02f;
    cudaFree(dl);
    dl = dup_to_dev(l, (size_t) NR * vocab * sizeof(float));
    dp = dup_to_dev(p, sizeof(p));
    poison(dids, NR * sizeof(int32_t));
    op(nalar_cuda_sample(&C, dl, vocab, NR, vocab, dp, dids, &err), &err);
    fetch(ids, dids, sizeof(ids));
    bad = 0;
    for (int r = 0; r < NR; r++) {
        double  slack = 1;
        int32_t want = p[r].temperature > 0
                       ? sample_ref(l + (int64_t) r * vocab, vocab, &p[r],
                                    &slack)
                       : nalar_argmax(l + (int64_t) r * vocab, vocab);

        if (ids[r] != want) {
            if (slack < 1e-6) {
                close++;
            } else {
                bad++;
                printf("#    row %d: device %d, host %d\n", r, ids[r], want);
            }
        }
    }
    report_eq("sample", "12 rows x 1000, top-k/top-p/min-p/T", bad == 0,
              "picks differ from the host semantics");
    cudaFree(dp);
    cudaFree(dids);

    /* distribution: 20000 draws of one row of 8 logits */
    {
        enum { ND = 20000, V = 8 };
        float               row[V] = { 1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f,
                                       -3.0f, 0.7f };
        float              *rows = xmalloc((size_t) ND * V * sizeof(float));
        nalar_cuda_sampling *pp = xmalloc((size_t) ND * sizeof(*pp));
        int32_t            *out = xmalloc((size_t) ND * sizeof(int32_t));
        double              prob[V], sum = 0, worst = 0;
        int                 cnt[V] = { 0 };

        for (int i = 0; i < ND; i++) {
            memcpy(rows + (int64_t) i * V, row, sizeof(row));
            pp[i].temperature = 0.8f;
            pp[i].top_k = 6;
            pp[i].top_p = 0.95f;
            pp[i].min_p = 0.0f;
            pp[i].seed = 99;
            pp[i].counter = (uint64_t) i;
        }
        /* expected: the kept set by the host semantics, renormalised */
        {
            double e[V], z = 0, tot = 0, cum = 0;
            float  s[V], kth, pth = -INFINITY;

            memcpy(s, row, sizeof(s));
            qsort(s, V, sizeof(float), desc);
            kth = s[5];
            for (int i = 0; i < V; i++) {
                e[i] = row[i] >= kth ? exp((row[i] - s[0]) / 0.8) : 0;
                z += e[i];
            }
            for (int i = 0; i < V && s[i] >= kth; i++) {
                cum += exp((s[i] - s[0]) / 0.8);
                if (cum >= 0.95 * z) { pth = s[i]; break; }
            }
            for (int i = 0; i < V; i++) {
                prob[i] = row[i] >= pth ? e[i] : 0;
                tot += prob[i];
            }
            for (int i = 0; i < V; i++) prob[i] /= tot;
        }
        dl = (float *) (cudaFree(dl), dup_to_dev(rows, (size_t) ND * V
                                                       * sizeof(float)));
        dp = dup_to_dev(pp, (size_t) ND * sizeof(*pp));
        dids = dnew((size_t) ND * sizeof(int32_t));
        op(nalar_cuda_sample(&C, dl, V, ND, V, dp, dids, &err), &err);
        fetch(out, dids, (size_t) ND * sizeof(int32_t));
        for (int i = 0; i < ND; i++) {
            if (out[i] >= 0 && out[i] < V) cnt[out[i]]++;
        }
        for (int i = 0; i < V; i++) {
            double d = fabs((double) cnt[i] / ND - prob[i]);

            worst = d > worst ? d : worst;
            sum += cnt[i];
        }
        report("sample", "20000 draws, 8 logits, top-k 6, top-p .95",
               sum == ND ? worst : INFINITY, 0.015);
        cudaFree(dp); cudaFree(dids);
        free(rows); free(pp); free(out);
    }
    if (close > 0) {
        printf("#    %d picks on a CDF step (rounding), not counted\n",
               close);
    }
    cudaFree(dl);
    free(l);
}


/* --- greedy generation: the CUDA backend against the CPU backend --- */

#include "collect.h"


/* four prompts (5..300 tokens, chunked at 64 tokens a step, so prefill
 * chunks meet decode steps in one batch) generating 48 tokens each */
static int
generate(const char *path, const char *backend, int32_t gemv_max,
         collected out[4])
{
    static const int   lens[4] = { 5, 40, 120, 300 };
    nalar_engine_opts  o;
    nalar_engine      *e;
    nalar_request     *reqs[4];
    int32_t            prompt[300];
    nalar_err          err;
    int                rc = 0;

    prompt[0] = 1;                              /* BOS */
    for (int i = 1; i < 300; i++) {
        prompt[i] = 259 + (i * 37 + 11) % 1700;
    }
    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.backend = backend;
    o.max_batch_tokens = 64;
    o.gpu_gemv_max = gemv_max;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        printf("#    %s on %s: %s\n", backend, path, err.msg);
        nalar_engine_destroy(e);
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        nalar_request_params p;

        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = 0;
        p.prompt = prompt;
        p.n_prompt = lens[k];
        p.max_tokens = 48;
        p.ignore_eos = 1;
        memset(&out[k], 0, sizeof(out[k]));
        reqs[k] = nalar_request_create(&p, collect, &out[k], &err);
        if (reqs[k] == NULL) {
            die("request", err.msg);
        }
    }
    if (nalar_engine_run_sync(e, reqs, 4, &err) != 0) {
        printf("#    %s run: %s\n", backend, err.msg);
        rc = -1;
    }
    for (int k = 0; k < 4; k++) {
        nalar_request_unref(reqs[k]);
    }
    nalar_engine_destroy(e);
    return rc;
}


static void
check_greedy(const char *dir, const char *file, int strict,
             int32_t gemv_max)
{
    char      path[1024], shape[128];
    collected cpu[4], gpu[4];
    int       first = -1, which = -1;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    if (generate(path, "cpu", 0, cpu) != 0
        || generate(path, "cuda", gemv_max, gpu) != 0)
    {
        report_eq("greedy", file, 0, "generation failed");
        return;
    }
    for (int k = 0; k < 4 && first < 0; k++) {
        for (int i = 0; i < 48; i++) {
            if (i >= cpu[k].n || i >= gpu[k].n
                || cpu[k].ids[i] != gpu[k].ids[i])
            {
                first = i;
                which = k;
                break;
            }
        }
    }
    snprintf(shape, sizeof(shape), "%s, 4 prompts x 48 tokens, gemv<=%d",
             file, gemv_max > 0 ? (int) gemv_max : 8);
    if (first >= 0 && !strict) {
        printf("WARN %-14s %-58s prompt %d differs from token %d (not "
               "counted)\n", "greedy", shape, which, first);
        return;
    }
    report_eq("greedy", shape, first < 0, "token ids differ from the CPU");
    if (first >= 0) {
        printf("#    prompt %d, first difference at token %d: cpu %d, cuda "
               "%d\n", which, first, cpu[which].ids[first],
               gpu[which].ids[first]);
    }
}


/*
 * The kit's files and their types' tolerances (t/c/test_conformance.c's).
 * blocked: ggml's block types (Q4_0, Q4_K, Q5_K, Q6_K; a Q4_K_M file
 * mixes Q4_K and Q6_K, its output head and fused q|k|v parts included):
 * their greedy run is compared with the CPU's but not counted, as the two
 * backends' products of dequantized weights sum in different orders and
 * a random-weight model's near-ties may fall either way; the logits'
 * tolerance is what holds them.
 */
static const struct {
    const char *file;
    double      tol;
    int         blocked;
} conf_files[] = {
    { "llama-F16", 0.027, 0 }, { "llama3-F32", 0.015, 0 },
    { "llama3-F16", 0.027, 0 }, { "llama3-BF16", 0.083, 0 },
    { "llama3-Q8_0", 0.25, 0 }, { "qwen2-F16", 0.027, 0 },
    { "qwen3-F16", 0.027, 0 }, { "gemma2-F16", 0.027, 0 },
    { "phi3-F16", 0.027, 0 },
    { "llama-Q4_K_M", 0.65, 1 }, { "qwen2-Q4_K_M", 0.65, 1 },
    { "llama3-Q4_0", 0.27, 1 }, { "llama3-Q4_K_M", 0.65, 1 },
    { "llama3-Q5_K_M", 0.37, 1 }, { "llama3-Q6_K", 0.38, 1 },
    { "qwen3-Q4_K_M", 0.65, 1 }, { "gemma2-Q4_K_M", 0.65, 1 },
    { "phi3-Q4_K_M", 0.65, 1 },
};


/* One file's three 64-position sequences on the CUDA backend, one pass
 * each; the largest |logit - reference| at the reference's top-16 ids
 * (INFINITY when something fails) */
static double
conformance_err(const char *dir, const char *base, ggml_type kv_type)
{
    char               path[1024];
    json_t            *ref, *seqs, *tch;
    json_error_t       jerr;
    nalar_model       *m;
    nalar_backend     *be = NULL;
    nalar_backend_opts bo;
    nalar_kv_pool      kv;
    nalar_err          err;
    float             *logits = NULL;
    double             worst = 0;
    int32_t            V;

    snprintf(path, sizeof(path), "%s/%s.ref.json", dir, base);
    ref = json_load_file(path, 0, &jerr);
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, base);
    m = ref != NULL ? nalar_model_load(path, &err) : NULL;
    if (m == NULL) {
        printf("#    %s: %s\n", base, ref == NULL ? jerr.text : err.msg);
        json_decref(ref);
        return INFINITY;
    }
    memset(&bo, 0, sizeof(bo));
    memset(&kv, 0, sizeof(kv));
    bo.name = "cuda";
    bo.gemv_max = 1000000;                 /* FP32 activations */
    bo.kv_type = kv_type;
    V = m->cfg.n_vocab;
    seqs = json_object_get(ref, "sequences");
    tch = json_object_get(ref, "teacher");
    be = nalar_backend_create(m, &bo, &err);
    logits = malloc((size_t) 64 * V * sizeof(float));
    if (be == NULL || logits == NULL
        || nalar_kv_pool_init(&kv, 4, m->cfg.n_layers,
                              m->cfg.n_kv_heads * m->cfg.head_dim, &err) != 0
        || be->kv_alloc(be, &kv, &err) != 0)
    {
        printf("#    %s: %s\n", base, err.msg);
        worst = INFINITY;
    }
    for (size_t s = 0; worst < INFINITY && s < json_array_size(seqs); s++) {
        json_t       *ids = json_object_get(json_array_get(seqs, s), "ids");
        json_t       *ti = json_object_get(json_array_get(tch, s), "top_ids");
        json_t       *tl = json_object_get(json_array_get(tch, s),
                                           "top_logits");
        int32_t       tok[64], pos[64];
        int8_t        want[64];
        nalar_seq_kv *seq[64], sq;
        nalar_batch   b;

        nalar_seq_kv_init(&sq);
        if (json_array_size(ids) != 64 || nalar_seq_kv_reserve(&kv, &sq, 64))
        {
            worst = INFINITY;
            break;
        }
        for (int i = 0; i < 64; i++) {
            tok[i] = (int32_t) json_integer_value(json_array_get(ids, i));
            pos[i] = i;
            want[i] = 1;
            seq[i] = &sq;
        }
        b.n_tokens = 64;
        b.tokens = tok;
        b.pos = pos;
        b.seq = seq;
        b.want_logits = want;
        b.n_logits = 64;
        if (be->forward(be, &kv, &b, logits, &err) != 0) {
            printf("#    %s: %s\n", base, err.msg);
            worst = INFINITY;
        }
        for (int p = 0; worst < INFINITY && p < 64; p++) {
            for (int k = 0; k < 16; k++) {
                json_int_t id = json_integer_value(
                    json_array_get(json_array_get(ti, p), k));
                double     want_l = json_number_value(
                    json_array_get(json_array_get(tl, p), k));
                double     e = id >= 0 && id < V
                               ? fabs(logits[(size_t) p * V + id] - want_l)
                               : INFINITY;

                worst = e <= worst ? worst : (isnan(e) ? INFINITY : e);
            }
        }
        nalar_seq_kv_release(&kv, &sq);
    }
    if (kv.k != NULL) {
        be->kv_free(be, &kv);
    }
    nalar_kv_pool_free(&kv);
    if (be != NULL) {
        be->destroy(be);
    }
    free(logits);
    nalar_model_destroy(m);
    json_decref(ref);
    return worst;
}


static void
check_conformance(const char *dir)
{
    for (size_t i = 0; i < sizeof(conf_files) / sizeof(conf_files[0]); i++)
    {
        char gguf[256];

        report("conformance", conf_files[i].file,
               conformance_err(dir, conf_files[i].file, GGML_F32),
               conf_files[i].tol);
        snprintf(gguf, sizeof(gguf), "%s.gguf", conf_files[i].file);
        check_greedy(dir, gguf, !conf_files[i].blocked, 1000000);
    }
    /* a BF16 KV cache: K and V rounded to 8 significant bits (relative
     * error up to 2^-9) before attention reads them; the logits may move
     * by that much of their attention's share more than the type's own
     * tolerance */
    for (size_t i = 0; i < sizeof(conf_files) / sizeof(conf_files[0]); i++)
    {
        char name[128];

        snprintf(name, sizeof(name), "%s, kv bf16", conf_files[i].file);
        report("conformance", name,
               conformance_err(dir, conf_files[i].file, GGML_BF16),
               conf_files[i].tol + THR_KV_BF16);
    }
}


int
main(int argc, char **argv)
{
    int         require = 0, ops = 1, models = 1, n_dev;
    const char *dir = "models", *conf = "t/data/conformance";
    nalar_err   err;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--require-gpu") == 0) {
            require = 1;
        } else if (strcmp(argv[i], "--ops-only") == 0) {
            models = 0;
        } else if (strcmp(argv[i], "--models-only") == 0) {
            ops = 0;
        } else if (strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--conformance") == 0 && i + 1 < argc) {
            conf = argv[++i];
        } else {
            fprintf(stderr, "usage: nalar-cuda-check [--require-gpu] "
                    "[--ops-only|--models-only] [--models DIR] "
                    "[--conformance DIR]\n");
            return 2;
        }
    }
    n_dev = nalar_cuda_device_count();
    if (n_dev == 0) {
        printf("nalar-cuda-check: no CUDA device visible: %s\n",
               require ? "FAILED (--require-gpu)" : "skipped");
        return require ? 1 : 77;
    }
    if (nalar_cuda_ctx_init(&C, 0, &err) != 0) {
        die("init", err.msg);
    }
    if (ops) {
        check_rmsnorm();
        check_embed();
        check_rope();
        check_elementwise();
        check_kv();
        check_attention();
        /* the decode kernel's other loop shape too (prefill repeats) */
        C.attn_prefetch = !C.attn_prefetch;
        check_attention();
        C.attn_prefetch = !C.attn_prefetch;
        /* a BF16 pool: the same kernels reading 16-bit K/V; the reference
         * reads the same rounded values, so the F32 tolerance holds */
        kv_bf16 = 1;
        check_kv();
        check_attention();
        kv_bf16 = 0;
        check_matmul();
        check_mma();
        check_kq();
        check_gemv_rows();
        check_sampling();
    }
    if (models) {
        /* the default path (cuBLAS for batches over 8 tokens) ... */
        check_greedy(dir, "nalar-kjv-target-f32.gguf", 1, 0);
        check_greedy(dir, "nalar-kjv-target-f16.gguf", 0, 0);
        /* ... and FP32 activations throughout: must match exactly */
        check_greedy(dir, "nalar-kjv-target-f32.gguf", 1, 1000000);
        check_greedy(dir, "nalar-kjv-target-f16.gguf", 1, 1000000);
        check_conformance(conf);
        /* ggml-blocked weights (Q4_K + Q6_K), GEMV and cuBLAS paths */
        check_greedy("t/data/conformance", "llama-Q4_K_M.gguf", 0, 0);
        check_greedy("t/data/conformance", "llama-Q4_K_M.gguf", 0, 1000000);
    }
    nalar_cuda_ctx_free(&C);
    printf("nalar-cuda-check: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
