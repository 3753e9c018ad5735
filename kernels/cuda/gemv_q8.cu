/*
 * Dequantising Q8_0 GEMV: one warp per weight row, each lane streams 16
 * quants (one 16-byte load) per step and keeps one partial sum per token;
 * the scale of each 32-quant block is applied to the 16-product partial.
 */
#include "gemv_q8.cuh"

#define Q8_WARPS 8                 /* rows per block */


template <int NT>
static __global__ void __launch_bounds__(Q8_WARPS * WARP)
gemv_q8_kernel(const int8_t *qs, const uint16_t *sc, int64_t rows,
               int64_t cols, const float *x, int64_t ldx, int32_t n_tok,
               float *y, int64_t ldy, int acc, int vec)
{
    int          lane = threadIdx.x % WARP;
    int64_t      r = (int64_t) blockIdx.x * Q8_WARPS + threadIdx.x / WARP;
    int32_t      t0 = blockIdx.y * NT;
    int32_t      nt = n_tok - t0 < NT ? n_tok - t0 : NT;
    const int8_t *q = qs + r * cols;
    const uint16_t *d = sc + r * (cols / QK8_0);
    const float  *xt = x + (int64_t) t0 * ldx;
    float         s[NT];

    if (r >= rows) {
        return;                           /* whole warp */
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        s[t] = 0.0f;
    }
    if (vec) {
#pragma unroll 2
        for (int64_t c = lane * 16; c < cols; c += 16 * WARP) {
            int4  qv = *(const int4 *) (q + c);
            float ds = f16_to_f32(d[c / QK8_0]);
            float w[16];
            const int8_t *qb = (const int8_t *) &qv;

#pragma unroll
            for (int i = 0; i < 16; i++) {
                w[i] = (float) qb[i];
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float4 *xv = (const float4 *) (xt + t * ldx + c);
                    float         p = 0.0f;

#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float4 a = xv[i];

                        p = fmaf(w[4 * i], a.x, p);
                        p = fmaf(w[4 * i + 1], a.y, p);
                        p = fmaf(w[4 * i + 2], a.z, p);
                        p = fmaf(w[4 * i + 3], a.w, p);
                    }
                    s[t] = fmaf(ds, p, s[t]);
                }
            }
        }
    } else {
        for (int64_t c = lane; c < cols; c += WARP) {
            float w = f16_to_f32(d[c / QK8_0]) * (float) q[c];

#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    s[t] = fmaf(w, xt[t * ldx + c], s[t]);
                }
            }
        }
    }
    gemv_row_store<NT>(s, nt, lane, y + (int64_t) t0 * ldy + r, ldy, acc);
}


static __global__ void
dequant_q8_kernel(const int8_t *qs, const uint16_t *sc, int64_t n,
                  __half *out)
{
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t) gridDim.x * blockDim.x)
    {
        out[i] = __float2half_rn(f16_to_f32(sc[i / QK8_0]) * (float) qs[i]);
    }
}


static void
gemv_q8_launch(cudaStream_t st, const nalar_cuda_mat *W, const float *x,
               int64_t ldx, int32_t n_tok, float *y, int64_t ldy, int acc,
               int vec)
{
    const int8_t   *q = (const int8_t *) W->data;
    int             nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    dim3            grid((unsigned) ((W->rows + Q8_WARPS - 1) / Q8_WARPS),
                         (unsigned) ((n_tok + nt - 1) / nt));

#define GO(NT) gemv_q8_kernel<NT><<<grid, Q8_WARPS * WARP, 0, st>>>(         \
        q, W->scales, W->rows, W->cols, x, ldx, n_tok, y, ldy, acc, vec)
    switch (nt) {
    case 8: GO(8); break;
    case 4: GO(4); break;
    case 2: GO(2); break;
    default: GO(1); break;
    }
#undef GO
}


int
nalar_cuda_gemv_q8(nalar_cuda_ctx *c, const nalar_cuda_mat *W, const float *x,
                   int64_t ldx, int32_t n_tok, float *y, int64_t ldy,
                   int accumulate, nalar_err *err)
{
    int vec;

    if (n_tok == 0) {
        return 0;
    }
    if (W == NULL || W->type != GGML_Q8_0 || W->data == NULL
        || W->scales == NULL || W->cols <= 0 || W->cols % QK8_0 != 0
        || W->rows <= 0 || x == NULL || y == NULL || n_tok < 0
        || ldx < W->cols || ldy < W->rows
        || (int64_t) n_tok > (int64_t) 65535 * 8)
    {
        return nalar_fail(err, "cuda gemv_q8: bad arguments (%lld x %lld, "
                          "n_tok %d, ldx %lld, ldy %lld)",
                          W != NULL ? (long long) W->rows : 0LL,
                          W != NULL ? (long long) W->cols : 0LL, n_tok,
                          (long long) ldx, (long long) ldy);
    }
    /* 16-byte loads of quants and activations need aligned rows */
    vec = ldx % 4 == 0 && (uintptr_t) x % 16 == 0
          && (uintptr_t) W->data % 16 == 0;
    gemv_q8_launch(c->stream, W, x, ldx, n_tok, y, ldy, accumulate, vec);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_q8_dequant_f16(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                          uint16_t *out, nalar_err *err)
{
    int64_t n;

    if (W == NULL || W->type != GGML_Q8_0 || W->data == NULL
        || W->scales == NULL || out == NULL || W->cols % QK8_0 != 0)
    {
        return nalar_fail(err, "cuda q8_dequant: bad arguments");
    }
    n = W->rows * W->cols;
    dequant_q8_kernel<<<c->sm_count * 8, 256, 0, c->stream>>>(
        (const int8_t *) W->data, W->scales, n, (__half *) out);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
