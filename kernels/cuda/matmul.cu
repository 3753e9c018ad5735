/*
 * Projections: GEMV kernels for decode, cuBLAS for batches.
 *
 * GEMV: one warp per weight row; each lane streams 8 weights per step (one
 * 16-byte load for F16/BF16, two for F32) and keeps one FP32 partial sum per
 * token of its token group (up to 8); the warp reduces at the end.
 */
#include "act.cuh"
#include "gemv_kq.cuh"
#include "gemv_mma.cuh"
#include "gemv_q8.cuh"
#include "matmul.cuh"

extern "C" {
#include "cuda_plan.h"
}

#define GEMV_WARPS 8                  /* rows per block */


/* 8 consecutive weights widened to float; idx is 8-aligned */
template <int T>
static __device__ __forceinline__ void
load8(const void *w, int64_t idx, float o[8])
{
    if constexpr (T == GGML_F32) {
        const float4 *p = (const float4 *) ((const float *) w + idx);
        float4        a = p[0], b = p[1];

        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    } else {
        uint4    v = *(const uint4 *) ((const uint16_t *) w + idx);
        uint32_t u[4] = { v.x, v.y, v.z, v.w };

#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (T == GGML_BF16) {
                o[2 * i] = bf16_to_f32(u[i] & 0xffffu);
                o[2 * i + 1] = bf16_to_f32(u[i] >> 16);
            } else {
                o[2 * i] = f16_to_f32(u[i] & 0xffffu);
                o[2 * i + 1] = f16_to_f32(u[i] >> 16);
            }
        }
    }
}


template <int T>
static __device__ __forceinline__ float
load1(const void *w, int64_t idx)
{
    if constexpr (T == GGML_F32) {
        return ((const float *) w)[idx];
    } else if constexpr (T == GGML_BF16) {
        return bf16_to_f32(((const uint16_t *) w)[idx]);
    } else {
        return f16_to_f32(((const uint16_t *) w)[idx]);
    }
}


/*
 * Each warp computes R consecutive rows for up to NT tokens.  Per step of 8
 * columns a lane loads the tokens' 8 activations once and uses them for
 * all R rows: with one row per warp, the activation reads (NT x 4 bytes per
 * column, from L1/L2) outgrew the weight reads (2 bytes) NT-fold, and 8
 * tokens ran at 645 GB/s of weights on an H200 against 3.5 TB/s for one.
 * Every (row, token) sum runs over the same columns in the same order, and
 * reduces over the warp the same way, whatever R and NT: results do not
 * depend on how rows and tokens were grouped.
 */
template <int T, int NT, int R>
static __global__ void __launch_bounds__(GEMV_WARPS * WARP)
gemv_kernel(const void *W, int64_t rows, int64_t cols, const float *x,
            int64_t ldx, int32_t n_tok, float *y, int64_t ldy, int acc,
            int vec)
{
    int          lane = threadIdx.x % WARP;
    int64_t      r0 = ((int64_t) blockIdx.x * GEMV_WARPS
                       + threadIdx.x / WARP) * R;
    int32_t      t0 = blockIdx.y * NT;
    int32_t      nt = n_tok - t0 < NT ? n_tok - t0 : NT;
    const float *xt = x + (int64_t) t0 * ldx;
    int64_t      c0 = 0;
    float        s[R][NT];

    if (r0 >= rows) {
        return;                           /* whole warp */
    }
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            s[rr][t] = 0.0f;
        }
    }
    if (vec) {
#pragma unroll (R == 1 ? 4 : 2)
        for (int64_t c = lane * 8; c + 8 <= cols; c += 8 * WARP) {
            float xs[NT][8];

#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float4 *xv = (const float4 *) (xt + t * ldx + c);
                    float4        a = xv[0], b = xv[1];

                    xs[t][0] = a.x; xs[t][1] = a.y;
                    xs[t][2] = a.z; xs[t][3] = a.w;
                    xs[t][4] = b.x; xs[t][5] = b.y;
                    xs[t][6] = b.z; xs[t][7] = b.w;
                }
            }
#pragma unroll
            for (int rr = 0; rr < R; rr++) {
                float w[8];

                if (r0 + rr >= rows) {
                    break;                /* warp-uniform */
                }
                load8<T>(W, (r0 + rr) * cols + c, w);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
                        float p = s[rr][t];

                        p = fmaf(w[0], xs[t][0], p);
                        p = fmaf(w[1], xs[t][1], p);
                        p = fmaf(w[2], xs[t][2], p);
                        p = fmaf(w[3], xs[t][3], p);
                        p = fmaf(w[4], xs[t][4], p);
                        p = fmaf(w[5], xs[t][5], p);
                        p = fmaf(w[6], xs[t][6], p);
                        p = fmaf(w[7], xs[t][7], p);
                        s[rr][t] = p;
                    }
                }
            }
        }
        c0 = cols / 8 * 8;
    }
    /* scalar columns: all of them when unaligned, else the tail */
    for (int64_t c = c0 + lane; c < cols; c += WARP) {
#pragma unroll
        for (int rr = 0; rr < R; rr++) {
            float w;

            if (r0 + rr >= rows) {
                break;
            }
            w = load1<T>(W, (r0 + rr) * cols + c);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    s[rr][t] = fmaf(w, xt[t * ldx + c], s[rr][t]);
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        if (r0 + rr < rows) {
            gemv_row_store<NT>(s[rr], nt, lane,
                               y + (int64_t) t0 * ldy + r0 + rr, ldy, acc);
        }
    }
}


/*
 * Rows per warp for a token group of nt (want > 0 forces it), as measured
 * on an H200 (the bench's GEMV sweep, BF16, us per product):
 *
 *   rows x cols     1 row per warp     2 rows per warp
 *                   (1 / 2 / 8 tokens)
 *   28672 x 4096    60 / 76 / 260      61 / 69 / 198
 *    6144 x 4096    14 / 25 /  60      21 / 22 /  59
 *    4096 x 14336   36 / 42 / 132      58 / 63 /  97
 *
 * Two rows share the activation loads but halve the warps: they pay from
 * eight tokens on, and from two when the matrix still gives every SM 20
 * warps.  (Warps per block, 8/4/2, made no difference: within 2%.)
 */
static int
gemv_rows_per_warp(int nt, int64_t rows, int sm_count, int want)
{
    if (want > 0) {
        return want >= 4 ? 4 : want == 2 ? 2 : 1;
    }
    return nt >= 8 || (nt >= 2 && rows / 2 >= 20 * (int64_t) sm_count)
           ? 2 : 1;
}


template <int T>
static void
gemv_launch_t(cudaStream_t st, int sm_count, const nalar_cuda_mat *W,
              const float *x, int64_t ldx, int32_t n_tok, float *y,
              int64_t ldy, int acc, int vec, int want_r)
{
    int  nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    int  R = gemv_rows_per_warp(nt, W->rows, sm_count, want_r);
    dim3 grid((unsigned) ((W->rows + GEMV_WARPS * R - 1) / (GEMV_WARPS * R)),
              (unsigned) ((n_tok + nt - 1) / nt));

#define GO(NT, R) gemv_kernel<T, NT, R><<<grid, GEMV_WARPS * WARP, 0, st>>>(  \
        W->data, W->rows, W->cols, x, ldx, n_tok, y, ldy, acc, vec)
#define BY_R(NT) do {                                                         \
        if (R >= 4) GO(NT, 4); else if (R == 2) GO(NT, 2); else GO(NT, 1);    \
    } while (0)
    switch (nt) {
    case 8: BY_R(8); break;
    case 4: BY_R(4); break;
    case 2: BY_R(2); break;
    default: BY_R(1); break;
    }
#undef BY_R
#undef GO
}


static int
check_args(const char *op, const nalar_cuda_mat *W, const float *x,
           int64_t ldx, int32_t n_tok, float *y, int64_t ldy, nalar_err *err)
{
    if (W == NULL || W->data == NULL || W->rows <= 0 || W->cols <= 0
        || W->rows > INT32_MAX || W->cols > INT32_MAX
        || x == NULL || y == NULL || n_tok < 0
        || ldx < W->cols || ldy < W->rows
        || (int64_t) n_tok > (int64_t) 65535 * 8
        || (W->type != GGML_F32 && W->type != GGML_F16
            && W->type != GGML_BF16 && W->type != GGML_Q8_0
            && !nalar_cuda_kq_type(W->type)))
    {
        return nalar_fail(err, "cuda %s: bad arguments (%lld x %lld type %d, "
                          "n_tok %d, ldx %lld, ldy %lld)", op,
                          W != NULL ? (long long) W->rows : 0LL,
                          W != NULL ? (long long) W->cols : 0LL,
                          W != NULL ? (int) W->type : -1, n_tok,
                          (long long) ldx, (long long) ldy);
    }
    return 0;
}


int
nalar_cuda_gemv_rows(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                     const float *x, int64_t ldx, int32_t n_tok, float *y,
                     int64_t ldy, int accumulate, int rows_per_warp,
                     nalar_err *err)
{
    int vec;

    if (n_tok == 0) {
        return 0;
    }
    if (check_args("gemv", W, x, ldx, n_tok, y, ldy, err) != 0) {
        return -1;
    }
    if (W->type == GGML_Q8_0) {
        return nalar_cuda_gemv_q8(c, W, x, ldx, n_tok, y, ldy, accumulate,
                                  err);
    }
    if (nalar_cuda_kq_type(W->type)) {
        return nalar_cuda_gemv_kq(c, W, x, ldx, n_tok, y, ldy, accumulate,
                                  err);
    }
    /* 16-byte loads need 8-element-aligned weight rows and 4-float-aligned
     * activation rows */
    vec = W->cols % 8 == 0 && ldx % 4 == 0 && (uintptr_t) x % 16 == 0
          && (uintptr_t) W->data % 16 == 0;
    switch (W->type) {
    case GGML_F32:
        gemv_launch_t<GGML_F32>(c->stream, c->sm_count, W, x, ldx, n_tok,
                                y, ldy, accumulate, vec, rows_per_warp);
        break;
    case GGML_F16:
        gemv_launch_t<GGML_F16>(c->stream, c->sm_count, W, x, ldx, n_tok,
                                y, ldy, accumulate, vec, rows_per_warp);
        break;
    default:
        gemv_launch_t<GGML_BF16>(c->stream, c->sm_count, W, x, ldx, n_tok,
                                 y, ldy, accumulate, vec, rows_per_warp);
        break;
    }
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_gemv(nalar_cuda_ctx *c, const nalar_cuda_mat *W, const float *x,
                int64_t ldx, int32_t n_tok, float *y, int64_t ldy,
                int accumulate, nalar_err *err)
{
    return nalar_cuda_gemv_rows(c, W, x, ldx, n_tok, y, ldy, accumulate, 0,
                                err);
}


static size_t
align256(size_t n)
{
    return (n + 255) / 256 * 256;
}


size_t
nalar_cuda_matmul_scratch_bytes(const nalar_cuda_ctx *c,
                                const nalar_cuda_mat *W, int32_t n_tok)
{
    if (n_tok <= c->gemv_max || W->type == GGML_F32) {
        return 0;
    }
    return align256((size_t) n_tok * W->cols * 2)
           + (W->type == GGML_Q8_0 || nalar_cuda_kq_type(W->type)
              ? (size_t) W->rows * W->cols * 2 : 0);
}


int
nalar_cuda_matmul(nalar_cuda_ctx *c, const nalar_cuda_mat *W, const float *x,
                  int64_t ldx, int32_t n_tok, float *y, int64_t ldy,
                  int accumulate, nalar_err *err)
{
    float        one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    void        *s;
    uint16_t    *xh, *wh;
    const void  *wp;
    cudaDataType dt;

    if (n_tok == 0) {
        return 0;
    }
    if (check_args("matmul", W, x, ldx, n_tok, y, ldy, err) != 0) {
        return -1;
    }
    switch (nalar_cuda_mm_path(W->type, W->cols, n_tok, c->gemv_max,
                               c->gemv_mma
                               && nalar_cuda_gemv_mma_fits(W, x, ldx)))
    {
    case NALAR_CUDA_MM_MMA:
        return nalar_cuda_gemv_mma(c, W, x, ldx, n_tok, y, ldy, accumulate,
                                   err);
    case NALAR_CUDA_MM_GEMV:
        return nalar_cuda_gemv(c, W, x, ldx, n_tok, y, ldy, accumulate, err);
    default:
        break;
    }
    /* column-major view: W is (cols x rows) with ld cols, so y^T = W^T x^T
     * is op(A) = A^T (rows x cols) times x^T (cols x n_tok) */
    if (W->type == GGML_F32) {
        CUBLAS_CHECK(err, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N,
                                      (int) W->rows, n_tok, (int) W->cols,
                                      &one, (const float *) W->data,
                                      (int) W->cols, x, (int) ldx, &beta, y,
                                      (int) ldy));
        return 0;
    }
    if (nalar_cuda_scratch(c, nalar_cuda_matmul_scratch_bytes(c, W, n_tok),
                           &s, err) != 0)
    {
        return -1;
    }
    xh = (uint16_t *) s;
    wh = (uint16_t *) ((char *) s + align256((size_t) n_tok * W->cols * 2));
    wp = W->data;
    dt = W->type == GGML_BF16 || nalar_cuda_kq_type(W->type) ? CUDA_R_16BF
                                                             : CUDA_R_16F;
    if (W->type == GGML_Q8_0) {
        if (nalar_cuda_q8_dequant_f16(c, W, wh, err) != 0) {
            return -1;
        }
        wp = wh;
    }
    if (nalar_cuda_kq_type(W->type)) {
        /* ggml-blocked weights: dequantized to BF16 for the tensor cores */
        if (nalar_cuda_kq_dequant_bf16(c, W, wh, err) != 0) {
            return -1;
        }
        wp = wh;
    }
    if (nalar_cuda_to_half(c, dt == CUDA_R_16BF ? GGML_BF16 : GGML_F16,
                           xh, x, ldx, n_tok, W->cols, err) != 0)
    {
        return -1;
    }
    CUBLAS_CHECK(err, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N,
                                   (int) W->rows, n_tok, (int) W->cols, &one,
                                   wp, dt, (int) W->cols, xh, dt,
                                   (int) W->cols, &beta, y, CUDA_R_32F,
                                   (int) ldy, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return 0;
}
