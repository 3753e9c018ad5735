/*
 * BF16 projections of 1..16 tokens on tensor cores (mma.sync m16n8k16).
 *
 * A block owns 16 weight rows; its sk warps split the columns into 32-wide
 * chunks (warp w takes chunks w, w + sk, ...), each chunk two MMAs.  The
 * A operand is the 16 rows' weights straight from global memory: lane
 * (g, q) (g = lane / 4, q = lane % 4) loads 8 consecutive weights of rows
 * g and g + 8 at column 8q of the chunk, one 16-byte load each.  The MMA's
 * k index is a permutation of the chunk's columns (the first MMA takes
 * columns 8q + 0..3 of every q, the second 8q + 4..7), and the B operand
 * follows the same permutation, so the product is the chunk's dot product.
 * B column n of n8 tile j is token (8j + n) / 2, its high half for even n
 * and its low half for odd n.  The warps' partial sums meet in shared
 * memory and are added in warp order; a token's result is its high
 * column's sum plus its low column's.
 */
#include "gemv_mma.cuh"

extern "C" {
#include "cuda_plan.h"
}

#define MMA_ROWS  16
#define MMA_CHUNK 32            /* columns per warp step */
#define MMA_MAXSK 8             /* warps per block */
#define MMA_U     4             /* chunks loaded before their MMAs */


/* d += A (16x16 bf16, row) * B (16x8 bf16, col), FP32 accumulation */
static __device__ __forceinline__ void
mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
         uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}


/* two floats' high (lo == 0) or low (lo == 1) BF16 halves, packed with the
 * first in the low 16 bits */
static __device__ __forceinline__ uint32_t
half2_of(float a, float b, int lo)
{
    __nv_bfloat16 ha = __float2bfloat16_rn(a), hb = __float2bfloat16_rn(b);

    if (lo) {
        ha = __float2bfloat16_rn(a - __bfloat162float(ha));
        hb = __float2bfloat16_rn(b - __bfloat162float(hb));
    }
    return (uint32_t) __bfloat16_as_ushort(ha)
           | ((uint32_t) __bfloat16_as_ushort(hb) << 16);
}


template <int NT8>
static __global__ void __launch_bounds__(MMA_MAXSK * WARP)
gemv_mma_kernel(const uint16_t *W, int64_t rows, int64_t cols,
                const float *x, int64_t ldx, int32_t n_tok, float *y,
                int64_t ldy, int acc, int sk)
{
    __shared__ float red[MMA_MAXSK][MMA_ROWS][NT8 * 8];

    int          lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int          g = lane / 4, q = lane % 4, lo = g & 1;
    int64_t      r0 = (int64_t) blockIdx.x * MMA_ROWS;
    int64_t      ra = r0 + g, rb = r0 + g + 8;
    int64_t      step = (int64_t) sk * MMA_CHUNK;
    const float *xr[NT8];
    float        d[NT8][4];

#pragma unroll
    for (int j = 0; j < NT8; j++) {
        int32_t t = (8 * j + g) / 2;

        xr[j] = t < n_tok ? x + (int64_t) t * ldx : NULL;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            d[j][e] = 0.0f;
        }
    }

    /* the loop bounds are warp-uniform: every lane reaches the MMAs */
    for (int64_t k0 = (int64_t) w * MMA_CHUNK; k0 < cols;
         k0 += MMA_U * step)
    {
        uint4 va[MMA_U], vb[MMA_U];

#pragma unroll
        for (int u = 0; u < MMA_U; u++) {
            int64_t c = k0 + u * step + q * 8;

            va[u] = make_uint4(0, 0, 0, 0);
            vb[u] = make_uint4(0, 0, 0, 0);
            if (c < cols) {
                if (ra < rows) {
                    va[u] = *(const uint4 *) (W + ra * cols + c);
                }
                if (rb < rows) {
                    vb[u] = *(const uint4 *) (W + rb * cols + c);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < MMA_U; u++) {
            int64_t c = k0 + u * step + q * 8;

            if (k0 + u * step >= cols) {
                break;                    /* warp-uniform */
            }
#pragma unroll
            for (int j = 0; j < NT8; j++) {
                uint32_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;

                if (xr[j] != NULL && c < cols) {
                    float4 x0 = *(const float4 *) (xr[j] + c);
                    float4 x1 = *(const float4 *) (xr[j] + c + 4);

                    b0 = half2_of(x0.x, x0.y, lo);
                    b1 = half2_of(x0.z, x0.w, lo);
                    b2 = half2_of(x1.x, x1.y, lo);
                    b3 = half2_of(x1.z, x1.w, lo);
                }
                mma_bf16(d[j], va[u].x, vb[u].x, va[u].y, vb[u].y, b0, b1);
                mma_bf16(d[j], va[u].z, vb[u].z, va[u].w, vb[u].w, b2, b3);
            }
        }
    }

    /* D: rows g and g + 8, columns 2q and 2q + 1 of each n8 tile */
#pragma unroll
    for (int j = 0; j < NT8; j++) {
        red[w][g][8 * j + 2 * q] = d[j][0];
        red[w][g][8 * j + 2 * q + 1] = d[j][1];
        red[w][g + 8][8 * j + 2 * q] = d[j][2];
        red[w][g + 8][8 * j + 2 * q + 1] = d[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MMA_ROWS * n_tok; i += blockDim.x) {
        int     r = i % MMA_ROWS, t = i / MMA_ROWS;
        float   hi = 0.0f, lw = 0.0f, v;
        float  *yp;

        if (r0 + r >= rows) {
            continue;
        }
        for (int k = 0; k < sk; k++) {
            hi += red[k][r][2 * t];
            lw += red[k][r][2 * t + 1];
        }
        v = hi + lw;
        yp = y + (int64_t) t * ldy + r0 + r;
        *yp = acc ? *yp + v : v;
    }
}


int
nalar_cuda_gemv_mma_fits(const nalar_cuda_mat *W, const float *x,
                         int64_t ldx)
{
    return W != NULL && W->type == GGML_BF16 && W->data != NULL
           && W->cols % 8 == 0 && ldx % 4 == 0
           && (uintptr_t) x % 16 == 0 && (uintptr_t) W->data % 16 == 0;
}


int
nalar_cuda_gemv_mma(nalar_cuda_ctx *c, const nalar_cuda_mat *W,
                    const float *x, int64_t ldx, int32_t n_tok, float *y,
                    int64_t ldy, int accumulate, nalar_err *err)
{
    int32_t  sk;
    unsigned blocks;

    if (n_tok == 0) {
        return 0;
    }
    if (!nalar_cuda_gemv_mma_fits(W, x, ldx) || y == NULL || n_tok < 0
        || n_tok > NALAR_CUDA_MMA_MAX || W->rows <= 0 || ldx < W->cols
        || ldy < W->rows || (W->rows + MMA_ROWS - 1) / MMA_ROWS > INT32_MAX)
    {
        return nalar_fail(err, "cuda gemv_mma: bad arguments (%lld x %lld "
                          "type %d, n_tok %d, ldx %lld, ldy %lld)",
                          W != NULL ? (long long) W->rows : 0LL,
                          W != NULL ? (long long) W->cols : 0LL,
                          W != NULL ? (int) W->type : -1, n_tok,
                          (long long) ldx, (long long) ldy);
    }
    sk = nalar_cuda_mma_splits(W->rows, W->cols, c->sm_count);
    blocks = (unsigned) ((W->rows + MMA_ROWS - 1) / MMA_ROWS);

#define GO(NT8) gemv_mma_kernel<NT8><<<blocks, sk * WARP, 0, c->stream>>>(   \
        (const uint16_t *) W->data, W->rows, W->cols, x, ldx, n_tok, y, ldy, \
        accumulate, sk)
    switch ((2 * n_tok + 7) / 8) {
    case 1: GO(1); break;
    case 2: GO(2); break;
    case 3: GO(3); break;
    default: GO(4); break;
    }
#undef GO
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
