/*
 * CUDA backend context: device, stream, cuBLAS handle, scratch; error
 * reporting; reproducible random fills for synthetic weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"

/* cuBLAS allocates nothing during graph capture when given a workspace;
 * 32 MiB is what NVIDIA recommends for Hopper. */
#define BLAS_WS_BYTES ((size_t) 32 << 20)


int
nalar_cuda_fail_call(nalar_err *err, const char *call, int code,
                     const char *what, const char *file, int line)
{
    const char *base = file;

    for (const char *p = file; *p != '\0'; p++) {
        if (*p == '/') {
            base = p + 1;
        }
    }
    return nalar_fail(err, "cuda: %s failed at %s:%d: %s (code %d)", call,
                      base, line, what != NULL ? what : "?", code);
}


int
nalar_cuda_ctx_init(nalar_cuda_ctx *c, int device, nalar_err *err)
{
    int n = 0;

    memset(c, 0, sizeof(*c));
    c->device = device;
    c->gemv_max = 8;
    c->attn_prefetch = 1;
    CUDA_CHECK(err, cudaGetDeviceCount(&n));
    if (device < 0 || device >= n) {
        return nalar_fail(err, "cuda: device %d requested but %d device%s "
                          "present", device, n, n == 1 ? " is" : "s are");
    }
    CUDA_CHECK(err, cudaSetDevice(device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&c->sm_count,
                                           cudaDevAttrMultiProcessorCount,
                                           device));
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&c->stream,
                                              cudaStreamNonBlocking));
    CUBLAS_CHECK(err, cublasCreate(&c->blas));
    CUBLAS_CHECK(err, cublasSetStream(c->blas, c->stream));
    CUDA_CHECK(err, cudaMalloc(&c->blas_ws, BLAS_WS_BYTES));
    CUDA_CHECK(err, cudaMalloc((void **) &c->argmax_ws,
                               NALAR_CUDA_ARGMAX_ROWS
                               * sizeof(*c->argmax_ws)));
    CUBLAS_CHECK(err, cublasSetWorkspace(c->blas, c->blas_ws,
                                         BLAS_WS_BYTES));
    /* FP32 accumulation everywhere: no TF32 shortcut for F32 weights */
    CUBLAS_CHECK(err, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    return 0;
}


void
nalar_cuda_ctx_free(nalar_cuda_ctx *c)
{
    if (c->stream != NULL) {
        cudaStreamSynchronize(c->stream);
    }
    if (c->blas != NULL) {
        cublasDestroy(c->blas);
    }
    cudaFree(c->blas_ws);
    cudaFree(c->argmax_ws);
    cudaFree(c->scratch);
    if (c->stream != NULL) {
        cudaStreamDestroy(c->stream);
    }
    memset(c, 0, sizeof(*c));
}


int
nalar_cuda_scratch(nalar_cuda_ctx *c, size_t bytes, void **p, nalar_err *err)
{
    if (bytes > c->scratch_bytes) {
        /* the stream may still read the old scratch */
        CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
        cudaFree(c->scratch);
        c->scratch = NULL;
        c->scratch_bytes = 0;
        CUDA_CHECK(err, cudaMalloc(&c->scratch, bytes));
        c->scratch_bytes = bytes;
    }
    *p = c->scratch;
    return 0;
}


/* --- random fills --- */

/* splitmix64 of the element index: independent of the launch shape */
static __device__ __forceinline__ uint64_t
mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}


static __device__ __forceinline__ float
uniform_pm1(uint64_t seed, int64_t i)
{
    uint64_t r = mix64(seed ^ mix64((uint64_t) i));

    return (float) (r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}


static __global__ void
fill_random_kernel(ggml_type type, void *data, uint16_t *scales, int64_t n,
                   float scale, uint64_t seed)
{
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t) gridDim.x * blockDim.x)
    {
        float v = uniform_pm1(seed, i) * scale;

        switch (type) {
        case GGML_F32:
            ((float *) data)[i] = v;
            break;
        case GGML_F16:
            ((__half *) data)[i] = __float2half_rn(v);
            break;
        case GGML_BF16:
            ((__nv_bfloat16 *) data)[i] = __float2bfloat16_rn(v);
            break;
        case GGML_Q8_0:
            /* quants uniform in [-127, 127]; scale per 32 so that the
             * dequantised values span [-scale, scale] */
            ((int8_t *) data)[i] = (int8_t) lrintf(uniform_pm1(seed, i)
                                                   * 127.0f);
            if (i % QK8_0 == 0) {
                scales[i / QK8_0] =
                    __half_as_ushort(__float2half_rn(scale / 127.0f));
            }
            break;
        default:
            break;
        }
    }
}


static __global__ void
fill_f32_kernel(float *p, int64_t n, float v)
{
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t) gridDim.x * blockDim.x)
    {
        p[i] = v;
    }
}


int
nalar_cuda_fill_random(nalar_cuda_ctx *c, nalar_cuda_mat *w, float scale,
                       uint64_t seed, nalar_err *err)
{
    int64_t n = w->rows * w->cols;
    int     blocks = c->sm_count * 8;

    if (w->data == NULL || n <= 0
        || (w->type == GGML_Q8_0 && (w->scales == NULL || n % QK8_0 != 0))
        || (w->type != GGML_F32 && w->type != GGML_F16
            && w->type != GGML_BF16 && w->type != GGML_Q8_0))
    {
        return nalar_fail(err, "cuda fill_random: bad matrix (%lld x %lld, "
                          "type %d)", (long long) w->rows,
                          (long long) w->cols, (int) w->type);
    }
    fill_random_kernel<<<blocks, 256, 0, c->stream>>>(w->type, w->data,
                                                      w->scales, n, scale,
                                                      seed);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_fill_f32(nalar_cuda_ctx *c, float *p, int64_t n, float value,
                    nalar_err *err)
{
    if (p == NULL || n <= 0) {
        return nalar_fail(err, "cuda fill_f32: empty buffer");
    }
    fill_f32_kernel<<<c->sm_count * 4, 256, 0, c->stream>>>(p, n, value);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
