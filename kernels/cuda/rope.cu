/*
 * RoPE: one block per token.  The angle of each pair index i is the same in
 * every head, so the block first puts cos and sin of p * inv_freq[i] in
 * shared memory (one thread per i), then one thread per (head, pair)
 * rotates.  cosf/sinf (not the fast intrinsics): positions reach thousands
 * of radians, where __sinf loses digits.  (The first version computed them
 * in every head: 8.5 us per launch on an H200 for 40 heads of 128.)
 */
#include "rope.cuh"


static __global__ void
rope_kernel(float *x, int64_t ld, const int32_t *pos, int32_t n_heads,
            int32_t head_dim, const float *inv_freq, int neox)
{
    extern __shared__ float cs[];         /* (head_dim / 2, 2): cos, sin */
    int32_t t = blockIdx.x;
    int32_t half = head_dim / 2;
    int32_t p = pos[t];
    float  *row = x + (int64_t) t * ld;

    if (p < 0) {
        return;                           /* padding: the whole block */
    }
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = (float) p * inv_freq[i];

        cs[2 * i] = cosf(theta);
        cs[2 * i + 1] = sinf(theta);
    }
    __syncthreads();
    for (int32_t k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int32_t h = k / half, i = k % half;
        float  *hx = row + (int64_t) h * head_dim;
        int32_t a = neox ? i : 2 * i;
        int32_t b = neox ? i + half : 2 * i + 1;
        float   c = cs[2 * i], sn = cs[2 * i + 1];
        float   x0 = hx[a], x1 = hx[b];

        hx[a] = x0 * c - x1 * sn;
        hx[b] = x0 * sn + x1 * c;
    }
}


int
nalar_cuda_rope(nalar_cuda_ctx *c, float *x, int64_t ld, const int32_t *pos,
                int32_t n_tok, int32_t n_heads, int32_t head_dim,
                const float *inv_freq, int neox, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (x == NULL || pos == NULL || inv_freq == NULL || n_tok < 0
        || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0
        || head_dim > 4096
        || ld < (int64_t) n_heads * head_dim)
    {
        return nalar_fail(err, "cuda rope: bad arguments (n_tok %d, heads "
                          "%d, head_dim %d, ld %lld)", n_tok, n_heads,
                          head_dim, (long long) ld);
    }
    rope_kernel<<<n_tok, 256, (size_t) head_dim * sizeof(float),
                  c->stream>>>(x, ld, pos, n_heads, head_dim, inv_freq,
                               neox);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
