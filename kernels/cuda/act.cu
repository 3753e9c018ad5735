/*
 * Element-wise ops: grid-stride loops over (token, column).
 */
#include "act.cuh"


static int
grid_for(const nalar_cuda_ctx *c, int64_t n)
{
    int64_t b = (n + 255) / 256, most = (int64_t) c->sm_count * 16;

    return (int) (b < most ? (b > 0 ? b : 1) : most);
}


static __global__ void
swiglu_kernel(float *g, const float *u, int64_t ld, int32_t n_tok, int32_t n)
{
    int64_t total = (int64_t) n_tok * n;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        int64_t t = k / n, i = k % n;
        float   a = g[t * ld + i];

        /* the CPU's expression, so both round the same way */
        g[t * ld + i] = a / (1.0f + expf(-a)) * u[t * ld + i];
    }
}


static __global__ void
geglu_kernel(float *g, const float *u, int64_t ld, int32_t n_tok, int32_t n)
{
    int64_t total = (int64_t) n_tok * n;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        int64_t t = k / n, i = k % n;
        float   x = g[t * ld + i];

        /* the CPU's expression */
        g[t * ld + i] = 0.5f * x * (1.0f + tanhf(0.7978845608f
                                                 * (x + 0.044715f * x * x
                                                        * x)))
                        * u[t * ld + i];
    }
}


static __global__ void
map_kernel(float *y, int64_t ld, int32_t n_tok, int32_t n, int op, float a)
{
    int64_t total = (int64_t) n_tok * n;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        float *p = y + (k / n) * ld + k % n;

        *p = op == 0 ? a * *p : a * tanhf(*p / a);
    }
}


static __global__ void
add_bias_kernel(float *y, int64_t ld, int32_t n_tok, const float *bias,
                int32_t n)
{
    int64_t total = (int64_t) n_tok * n;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        y[(k / n) * ld + k % n] += bias[k % n];
    }
}


static __global__ void
add_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, int32_t n_tok,
           int32_t n)
{
    int64_t total = (int64_t) n_tok * n;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        y[(k / n) * ldy + k % n] += x[(k / n) * ldx + k % n];
    }
}


static __global__ void
to_half_kernel(int bf16, uint16_t *out, const float *x, int64_t ldx,
               int32_t n_tok, int64_t cols)
{
    int64_t total = (int64_t) n_tok * cols;

    for (int64_t k = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
         k < total; k += (int64_t) gridDim.x * blockDim.x)
    {
        float v = x[(k / cols) * ldx + k % cols];

        out[k] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                      : __half_as_ushort(__float2half_rn(v));
    }
}


int
nalar_cuda_swiglu(nalar_cuda_ctx *c, float *g, const float *u, int64_t ld,
                  int32_t n_tok, int32_t n, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (g == NULL || u == NULL || n_tok < 0 || n <= 0 || ld < n) {
        return nalar_fail(err, "cuda swiglu: bad arguments (n_tok %d, n %d, "
                          "ld %lld)", n_tok, n, (long long) ld);
    }
    swiglu_kernel<<<grid_for(c, (int64_t) n_tok * n), 256, 0, c->stream>>>(
        g, u, ld, n_tok, n);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_geglu(nalar_cuda_ctx *c, float *g, const float *u, int64_t ld,
                 int32_t n_tok, int32_t n, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (g == NULL || u == NULL || n_tok < 0 || n <= 0 || ld < n) {
        return nalar_fail(err, "cuda geglu: bad arguments (n_tok %d, n %d, "
                          "ld %lld)", n_tok, n, (long long) ld);
    }
    geglu_kernel<<<grid_for(c, (int64_t) n_tok * n), 256, 0, c->stream>>>(
        g, u, ld, n_tok, n);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_map(nalar_cuda_ctx *c, float *y, int64_t ld, int32_t n_tok,
               int32_t n, int op, float a, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (y == NULL || n_tok < 0 || n <= 0 || ld < n || (op != 0 && op != 1)
        || (op == 1 && !(a > 0.0f)))
    {
        return nalar_fail(err, "cuda map: bad arguments (n_tok %d, n %d, op "
                          "%d)", n_tok, n, op);
    }
    map_kernel<<<grid_for(c, (int64_t) n_tok * n), 256, 0, c->stream>>>(
        y, ld, n_tok, n, op, a);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_add_bias(nalar_cuda_ctx *c, float *y, int64_t ld, int32_t n_tok,
                    const float *bias, int32_t n, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (y == NULL || bias == NULL || n_tok < 0 || n <= 0 || ld < n) {
        return nalar_fail(err, "cuda add_bias: bad arguments (n_tok %d, n "
                          "%d, ld %lld)", n_tok, n, (long long) ld);
    }
    add_bias_kernel<<<grid_for(c, (int64_t) n_tok * n), 256, 0,
                      c->stream>>>(y, ld, n_tok, bias, n);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_add(nalar_cuda_ctx *c, float *y, int64_t ldy, const float *x,
               int64_t ldx, int32_t n_tok, int32_t n, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (y == NULL || x == NULL || n_tok < 0 || n <= 0 || ldy < n
        || ldx < n)
    {
        return nalar_fail(err, "cuda add: bad arguments (n_tok %d, n %d)",
                          n_tok, n);
    }
    add_kernel<<<grid_for(c, (int64_t) n_tok * n), 256, 0, c->stream>>>(
        y, ldy, x, ldx, n_tok, n);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_to_half(nalar_cuda_ctx *c, ggml_type type, void *out,
                   const float *x, int64_t ldx, int32_t n_tok, int64_t cols,
                   nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (out == NULL || x == NULL || n_tok < 0 || cols <= 0 || ldx < cols
        || (type != GGML_F16 && type != GGML_BF16))
    {
        return nalar_fail(err, "cuda to_half: bad arguments (type %d, n_tok "
                          "%d, cols %lld)", (int) type, n_tok,
                          (long long) cols);
    }
    to_half_kernel<<<grid_for(c, (int64_t) n_tok * cols), 256, 0,
                     c->stream>>>(type == GGML_BF16, (uint16_t *) out, x, ldx,
                                  n_tok, cols);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
