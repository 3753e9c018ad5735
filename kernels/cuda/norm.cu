/*
 * RMSNorm, one block per row (as ggml-cuda's rms_norm_f32): the sum of
 * squares is reduced in FP32 over the block, then every thread scales its
 * share of the row.
 */
#include "norm.cuh"


template <int BLOCK>
static __global__ void
rmsnorm_kernel(float *out, int64_t ld_out, const float *x, int64_t ld_x,
               const int32_t *rows, const float *w, int32_t dim, float eps)
{
    __shared__ float sh[WARP];
    int32_t      i = blockIdx.x;
    int32_t      r = rows != NULL ? rows[i] : i;
    const float *xr = x + (int64_t) r * ld_x;
    float       *o = out + (int64_t) i * ld_out;
    float        ss = 0.0f, s;

    for (int32_t k = threadIdx.x; k < dim; k += BLOCK) {
        ss = fmaf(xr[k], xr[k], ss);
    }
    ss = block_sum(ss, sh);
    s = rsqrtf(ss / (float) dim + eps);
    for (int32_t k = threadIdx.x; k < dim; k += BLOCK) {
        o[k] = xr[k] * s * w[k];
    }
}


static void
rmsnorm_launch(cudaStream_t st, float *out, int64_t ld_out, const float *x,
               int64_t ld_x, const int32_t *rows, int32_t n, const float *w,
               int32_t dim, float eps)
{
    /* wide rows get a full block so the reduction is not the tail */
    if (dim >= 2048) {
        rmsnorm_kernel<1024><<<n, 1024, 0, st>>>(out, ld_out, x, ld_x, rows,
                                                 w, dim, eps);
    } else {
        rmsnorm_kernel<256><<<n, 256, 0, st>>>(out, ld_out, x, ld_x, rows, w,
                                               dim, eps);
    }
}


int
nalar_cuda_rmsnorm(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                   const float *x, int64_t ld_x, const int32_t *rows,
                   int32_t n, const float *w, int32_t dim, float eps,
                   nalar_err *err)
{
    if (n == 0) {
        return 0;
    }
    if (out == NULL || x == NULL || w == NULL || n < 0 || dim <= 0
        || ld_out < dim || ld_x < dim || !(eps >= 0.0f))
    {
        return nalar_fail(err, "cuda rmsnorm: bad arguments (n %d, dim %d, "
                          "ld_out %lld, ld_x %lld)", n, dim,
                          (long long) ld_out, (long long) ld_x);
    }
    rmsnorm_launch(c->stream, out, ld_out, x, ld_x, rows, n, w, dim, eps);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
