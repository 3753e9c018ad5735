/*
 * Shared pieces of the CUDA backend: the per-backend context (device, stream,
 * cuBLAS handle, scratch), the device matrix descriptor, and the checks that
 * turn a failed CUDA or cuBLAS call into a nalar_err naming the call, the
 * file and the line (library code never aborts).
 *
 * This header is C-compatible (the check program is C); the device helpers
 * at the end are seen only by nvcc.
 */
#ifndef NALAR_CUDA_COMMON_CUH
#define NALAR_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "gguf.h"
#include "nalar_err.h"

/*
 * A weight matrix in device memory, applied as y = W x.
 *   F32/F16/BF16: data = (rows, cols) elements, rows contiguous.
 *   Q8_0: repacked at upload so that vector loads stay aligned:
 *         data = (rows, cols) int8 quants, scales = (rows, cols / 32) f16.
 */
typedef struct {
    ggml_type type;
    int64_t   rows;        /* output features */
    int64_t   cols;        /* input features (contiguous) */
    void     *data;
    uint16_t *scales;      /* Q8_0 only */
} nalar_cuda_mat;

typedef struct {
    int            device;
    int            sm_count;
    cudaStream_t   stream;       /* every launch and copy of the backend */
    cublasHandle_t blas;         /* bound to stream */
    void          *blas_ws;      /* fixed cuBLAS workspace (graph capture) */
    /* nalar_cuda_argmax's per-row keys (NALAR_CUDA_ARGMAX_ROWS) */
    unsigned long long *argmax_ws;
    /* growable device scratch for activation conversion and dequantised
     * weights; grown only outside graph capture */
    void          *scratch;
    size_t         scratch_bytes;
    /* matrix products with at most this many tokens use our GEMV kernels
     * (F32 activations); more go to cuBLAS.  8 unless the backend's
     * creator says otherwise */
    int32_t        gemv_max;
    /* 1: BF16 products of 1..NALAR_CUDA_MMA_MAX tokens on tensor cores
     * (gemv_mma.cu; nalar_cuda_mm_path decides); 0 by default */
    int            gemv_mma;
    /* decode attention issues a step's K/V loads before the previous
     * step's arithmetic (1, always in serving; 0: after, which the check
     * and bench programs also exercise) */
    int            attn_prefetch;
} nalar_cuda_ctx;

/* Fill err with "cuda: CALL failed at FILE:LINE: WHAT (code N)"; returns -1. */
int nalar_cuda_fail_call(nalar_err *err, const char *call, int code,
                         const char *what, const char *file, int line);

#define CUDA_CHECK(err, call) do {                                          \
        cudaError_t e_ = (call);                                             \
        if (e_ != cudaSuccess) {                                             \
            return nalar_cuda_fail_call((err), #call, (int) e_,              \
                                        cudaGetErrorString(e_),              \
                                        __FILE__, __LINE__);                 \
        }                                                                    \
    } while (0)

#define CUBLAS_CHECK(err, call) do {                                        \
        cublasStatus_t s_ = (call);                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
            return nalar_cuda_fail_call((err), #call, (int) s_,              \
                                        cublasGetStatusString(s_),           \
                                        __FILE__, __LINE__);                 \
        }                                                                    \
    } while (0)

/* After a launch: a bad configuration shows up here, not in the kernel. */
#define CUDA_CHECK_LAUNCH(err) CUDA_CHECK(err, cudaGetLastError())

#define NALAR_CUDA_ARGMAX_ROWS 4096

/* Select `device`, create the stream, cuBLAS handle and workspace. */
int  nalar_cuda_ctx_init(nalar_cuda_ctx *c, int device, nalar_err *err);
void nalar_cuda_ctx_free(nalar_cuda_ctx *c);

/* Device scratch of at least `bytes` (the old contents are lost). */
int  nalar_cuda_scratch(nalar_cuda_ctx *c, size_t bytes, void **p,
                        nalar_err *err);

/* Fill n elements of `type` (F32/F16/BF16, or Q8_0 with n = rows * cols
 * quants and n / 32 scales) with reproducible uniform values in
 * [-scale, scale] from `seed`.  For synthetic benchmark weights. */
int  nalar_cuda_fill_random(nalar_cuda_ctx *c, nalar_cuda_mat *w,
                            float scale, uint64_t seed, nalar_err *err);
int  nalar_cuda_fill_f32(nalar_cuda_ctx *c, float *p, int64_t n, float value,
                         nalar_err *err);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* --- device helpers --- */
#include <math.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define WARP 32

static __device__ __forceinline__ float
warp_sum(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}


/*
 * The end of a warp-per-row GEMV: each lane holds partial sums s[0..NT) of
 * one output row for NT tokens; sum them over the warp and let lane 0 store
 * (or, with acc, add) the nt valid ones: y[t * ldy] for t < nt.
 */
template <int NT>
static __device__ __forceinline__ void
gemv_row_store(float *s, int nt, int lane, float *y, int64_t ldy, int acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        s[t] = warp_sum(s[t]);
    }
    if (lane == 0) {
        for (int t = 0; t < nt; t++) {
            float *o = y + (int64_t) t * ldy;

            *o = acc ? *o + s[t] : s[t];
        }
    }
}


static __device__ __forceinline__ float
warp_max(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}


/* Sum over one block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result.  `sh` holds 32 floats. */
static __device__ __forceinline__ float
block_sum(float v, float *sh)
{
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int nw = blockDim.x / WARP;

    v = warp_sum(v);
    __syncthreads();             /* sh may still be read by a previous call */
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}


static __device__ __forceinline__ float
block_max(float v, float *sh)
{
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int nw = blockDim.x / WARP;

    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}


/* Weight element widening: bf16 is the top half of an f32; f16 via the
 * hardware conversion. */
static __device__ __forceinline__ float
bf16_to_f32(uint32_t b)
{
    return __uint_as_float(b << 16);
}


static __device__ __forceinline__ float
f16_to_f32(uint32_t h)
{
    float f;

    asm("{ .reg .b16 h; cvt.u16.u32 h, %1; cvt.f32.f16 %0, h; }"
        : "=f"(f) : "r"(h));
    return f;
}

#endif /* __CUDACC__ */

#endif
