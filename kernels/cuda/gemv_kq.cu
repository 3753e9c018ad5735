/*
 * GEMV over ggml-blocked weights: one warp per weight row; each lane takes
 * 8 consecutive weights at a time (lane l: columns 8l .. 8l + 7 of every
 * 256), decodes them from their block, and keeps one partial sum per
 * token.  The decoding follows ggml's layouts (see gguf.h).
 */
#include "gemv_kq.cuh"
#include "kq_decode.cuh"

#define KQ_WARPS 8                 /* rows per block */


template <ggml_type T, int NT>
static __global__ void __launch_bounds__(KQ_WARPS * WARP)
gemv_kq_kernel(const uint8_t *W, int64_t rs, int64_t rows, int64_t cols,
               const float *x, int64_t ldx, int32_t n_tok, float *y,
               int64_t ldy, int acc)
{
    int          lane = threadIdx.x % WARP;
    int64_t      r = (int64_t) blockIdx.x * KQ_WARPS + threadIdx.x / WARP;
    int32_t      t0 = blockIdx.y * NT;
    int32_t      nt = n_tok - t0 < NT ? n_tok - t0 : NT;
    const float *xt = x + (int64_t) t0 * ldx;
    float        s[NT];

    if (r >= rows) {
        return;                           /* whole warp */
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        s[t] = 0.0f;
    }
    for (int64_t c = (int64_t) lane * 8; c < cols; c += 8 * WARP) {
        float w[8];

        dequant8<T>(W + r * rs, c, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float *xv = xt + t * ldx + c;

#pragma unroll
                for (int i = 0; i < 8; i++) {
                    s[t] = fmaf(w[i], xv[i], s[t]);
                }
            }
        }
    }
    gemv_row_store<NT>(s, nt, lane, y + (int64_t) t0 * ldy + r, ldy, acc);
}


template <ggml_type T>
static __global__ void
dequant_kq_kernel(const uint8_t *W, int64_t rs, int64_t rows, int64_t cols,
                  __nv_bfloat16 *out)
{
    int64_t n8 = rows * (cols / 8);

    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         i < n8; i += (int64_t) gridDim.x * blockDim.x)
    {
        int64_t r = i / (cols / 8), c = (i % (cols / 8)) * 8;
        float   w[8];

        dequant8<T>(W + r * rs, c, w);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            out[r * cols + c + k] = __float2bfloat16_rn(w[k]);
        }
    }
}


static int
kq_args_ok(const nalar_cuda_mat *W)
{
    return W != NULL && nalar_cuda_kq_type(W->type) && W->data != NULL
           && W->rows > 0 && W->cols > 0
           && W->cols % (W->type == GGML_Q4_0 ? 32 : QK_K) == 0;
}


/* out[t][:] = E[tokens[t]][:], one block per token; an id outside the
 * vocabulary gives a NaN row */
template <ggml_type T>
static __global__ void
embed_kq_kernel(const uint8_t *E, int64_t rs, int64_t rows, int64_t cols,
                const int32_t *tokens, float *out, int64_t ld_out)
{
    int32_t id = tokens[blockIdx.x];
    float  *o = out + (int64_t) blockIdx.x * ld_out;

    for (int64_t c = (int64_t) threadIdx.x * 8; c < cols;
         c += (int64_t) blockDim.x * 8)
    {
        float w[8];

        if (id < 0 || id >= rows) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                o[c + k] = __int_as_float(0x7fc00000);
            }
            continue;
        }
        dequant8<T>(E + (int64_t) id * rs, c, w);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            o[c + k] = w[k];
        }
    }
}


extern "C" int
nalar_cuda_kq_embed(nalar_cuda_ctx *c, const nalar_cuda_mat *E,
                    const int32_t *tokens, int32_t n, float *out,
                    int64_t ld_out, nalar_err *err)
{
    const uint8_t *e;
    int64_t        rs;

    if (n == 0) {
        return 0;
    }
    if (!kq_args_ok(E) || tokens == NULL || out == NULL || n < 0
        || ld_out < E->cols)
    {
        return nalar_fail(err, "cuda kq_embed: bad arguments");
    }
    e = (const uint8_t *) E->data;
    rs = (int64_t) ggml_row_size(E->type, (uint64_t) E->cols);
#define GO(T) embed_kq_kernel<T><<<n, 128, 0, c->stream>>>(e, rs, E->rows,     \
        E->cols, tokens, out, ld_out)
    switch (E->type) {
    case GGML_Q4_0: GO(GGML_Q4_0); break;
    case GGML_Q4_K: GO(GGML_Q4_K); break;
    case GGML_Q5_K: GO(GGML_Q5_K); break;
    default:        GO(GGML_Q6_K); break;
    }
#undef GO
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


extern "C" int
nalar_cuda_kq_type(ggml_type t)
{
    return t == GGML_Q4_0 || t == GGML_Q4_K || t == GGML_Q5_K
           || t == GGML_Q6_K;
}


template <ggml_type T>
static void
gemv_kq_launch(cudaStream_t st, const nalar_cuda_mat *W, const float *x,
               int64_t ldx, int32_t n_tok, float *y, int64_t ldy, int acc)
{
    const uint8_t *w = (const uint8_t *) W->data;
    int64_t        rs = (int64_t) ggml_row_size(T, (uint64_t) W->cols);
    int            nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    dim3           grid((unsigned) ((W->rows + KQ_WARPS - 1) / KQ_WARPS),
                        (unsigned) ((n_tok + nt - 1) / nt));

#define GO(NT) gemv_kq_kernel<T, NT><<<grid, KQ_WARPS * WARP, 0, st>>>(       \
        w, rs, W->rows, W->cols, x, ldx, n_tok, y, ldy, acc)
    switch (nt) {
    case 8: GO(8); break;
    case 4: GO(4); break;
    case 2: GO(2); break;
    default: GO(1); break;
    }
#undef GO
}


extern "C" int
nalar_cuda_gemv_kq(nalar_cuda_ctx *c, const nalar_cuda_mat *W, const float *x,
                   int64_t ldx, int32_t n_tok, float *y, int64_t ldy,
                   int accumulate, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (!kq_args_ok(W) || x == NULL || y == NULL || n_tok < 0
        || ldx < W->cols || ldy < W->rows
        || (int64_t) n_tok > (int64_t) 65535 * 8)
    {
        return nalar_fail(err, "cuda gemv_kq: bad arguments (%lld x %lld "
                          "%s, n_tok %d, ldx %lld, ldy %lld)",
                          W != NULL ? (long long) W->rows : 0LL,
                          W != NULL ? (long long) W->cols : 0LL,
                          W != NULL ? ggml_type_name(W->type) : "-", n_tok,
                          (long long) ldx, (long long) ldy);
    }
    switch (W->type) {
    case GGML_Q4_0:
        gemv_kq_launch<GGML_Q4_0>(c->stream, W, x, ldx, n_tok, y, ldy,
                                  accumulate);
        break;
    case GGML_Q4_K:
        gemv_kq_launch<GGML_Q4_K>(c->stream, W, x, ldx, n_tok, y, ldy,
                                  accumulate);
        break;
    case GGML_Q5_K:
        gemv_kq_launch<GGML_Q5_K>(c->stream, W, x, ldx, n_tok, y, ldy,
                                  accumulate);
        break;
    default:
        gemv_kq_launch<GGML_Q6_K>(c->stream, W, x, ldx, n_tok, y, ldy,
                                  accumulate);
        break;
    }
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


extern "C" int
nalar_cuda_kq_dequant_bf16(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                           uint16_t *out, nalar_err *err)
{
    const uint8_t *w;
    int64_t        rs;
    __nv_bfloat16 *o = (__nv_bfloat16 *) out;
    int            g;

    if (!kq_args_ok(W) || out == NULL) {
        return nalar_fail(err, "cuda kq_dequant: bad arguments");
    }
    w = (const uint8_t *) W->data;
    rs = (int64_t) ggml_row_size(W->type, (uint64_t) W->cols);
    g = c->sm_count * 8;
    switch (W->type) {
    case GGML_Q4_0:
        dequant_kq_kernel<GGML_Q4_0><<<g, 256, 0, c->stream>>>(
            w, rs, W->rows, W->cols, o);
        break;
    case GGML_Q4_K:
        dequant_kq_kernel<GGML_Q4_K><<<g, 256, 0, c->stream>>>(
            w, rs, W->rows, W->cols, o);
        break;
    case GGML_Q5_K:
        dequant_kq_kernel<GGML_Q5_K><<<g, 256, 0, c->stream>>>(
            w, rs, W->rows, W->cols, o);
        break;
    default:
        dequant_kq_kernel<GGML_Q6_K><<<g, 256, 0, c->stream>>>(
            w, rs, W->rows, W->cols, o);
        break;
    }
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
