/*
 * KV append into paged blocks (one block per token) and block copies.
 */
#include "kv.cuh"

extern "C" {
#include "kv.h"
}


static __device__ __forceinline__ void
kv_store(float *p, float x)
{
    *p = x;
}


static __device__ __forceinline__ void
kv_store(uint16_t *p, float x)
{
    *p = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}


template <typename KT>
static __global__ void
kv_append_kernel(KT *kc, KT *vc, int32_t n_layers, int32_t kv_dim,
                 int32_t layer, const float *src, int64_t ld, int64_t k_off,
                 int64_t v_off, const int32_t *pos, const int32_t *tbl_off,
                 const int32_t *tables)
{
    int32_t      t = blockIdx.x;
    int32_t      p = pos[t];
    int32_t      b;
    int64_t      off;
    const float *row = src + (int64_t) t * ld;

    if (p < 0) {
        return;                        /* padding */
    }
    b = tables[tbl_off[t] + p / NALAR_KV_BLOCK];
    off = (((int64_t) b * n_layers + layer) * NALAR_KV_BLOCK
           + p % NALAR_KV_BLOCK) * kv_dim;
    for (int32_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kv_store(&kc[off + i], row[k_off + i]);
        kv_store(&vc[off + i], row[v_off + i]);
    }
}


int
nalar_cuda_kv_append(nalar_cuda_ctx *c, const nalar_cuda_kv *kv,
                     int32_t layer, const float *src, int64_t ld,
                     int64_t k_off, int64_t v_off, const int32_t *pos,
                     const int32_t *tbl_off, const int32_t *tables,
                     int32_t n_tok, nalar_err *err)
{
    if (n_tok == 0) {
        return 0;
    }
    if (kv == NULL || kv->k == NULL || kv->v == NULL || src == NULL
        || pos == NULL || tbl_off == NULL || tables == NULL || n_tok < 0
        || layer < 0 || layer >= kv->n_layers || kv->kv_dim <= 0
        || k_off < 0 || v_off < 0 || k_off + kv->kv_dim > ld
        || v_off + kv->kv_dim > ld)
    {
        return nalar_fail(err, "cuda kv_append: bad arguments (layer %d of "
                          "%d, n_tok %d, ld %lld)", layer,
                          kv != NULL ? kv->n_layers : 0, n_tok,
                          (long long) ld);
    }
    if (kv->bf16) {
        kv_append_kernel<uint16_t><<<n_tok, kv->kv_dim >= 256 ? 256 : 128,
                                     0, c->stream>>>(
            (uint16_t *) kv->k, (uint16_t *) kv->v, kv->n_layers, kv->kv_dim,
            layer, src, ld, k_off, v_off, pos, tbl_off, tables);
    } else {
        kv_append_kernel<float><<<n_tok, kv->kv_dim >= 256 ? 256 : 128, 0,
                                  c->stream>>>(
            kv->k, kv->v, kv->n_layers, kv->kv_dim, layer, src, ld, k_off,
            v_off, pos, tbl_off, tables);
    }
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_kv_copy_block(nalar_cuda_ctx *c, const nalar_cuda_kv *kv,
                         int32_t dst, int32_t src, nalar_err *err)
{
    size_t  n;
    int64_t od, os;

    if (kv == NULL || kv->k == NULL || dst < 0 || src < 0
        || dst >= kv->n_blocks || src >= kv->n_blocks)
    {
        return nalar_fail(err, "cuda kv_copy_block: block %d <- %d outside "
                          "a pool of %d", dst, src,
                          kv != NULL ? kv->n_blocks : 0);
    }
    if (dst == src) {
        return 0;
    }
    /* a block is contiguous: all layers, 16 slots, kv_dim elements */
    n = (size_t) kv->n_layers * NALAR_KV_BLOCK * kv->kv_dim
        * NALAR_CUDA_KV_ELEM(kv);
    od = (int64_t) dst * (int64_t) n;
    os = (int64_t) src * (int64_t) n;
    CUDA_CHECK(err, cudaMemcpyAsync((char *) kv->k + od,
                                    (const char *) kv->k + os, n,
                                    cudaMemcpyDeviceToDevice, c->stream));
    CUDA_CHECK(err, cudaMemcpyAsync((char *) kv->v + od,
                                    (const char *) kv->v + os, n,
                                    cudaMemcpyDeviceToDevice, c->stream));
    return 0;
}
