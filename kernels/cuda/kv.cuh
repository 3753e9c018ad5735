/*
 * Paged KV cache on the device.  Pool layout (as the CPU backend's):
 *   k, v: (n_blocks, n_layers, NALAR_KV_BLOCK, kv_dim) floats, or with
 *   bf16 set BF16 elements (16 bits each, rounded to nearest even when
 *   stored; the attention kernels widen them to float as they read)
 * A token at position p of a sequence lives in block
 * tables[tbl_off[t] + p / NALAR_KV_BLOCK], slot p % NALAR_KV_BLOCK.
 *
 * kv_append: for each token t with pos[t] >= 0, copy its k and v rows
 *   (src + t * ld + k_off, + v_off; kv_dim floats each) into `layer`.
 * kv_copy_block: block dst = block src, all layers, K and V
 *   (copy-on-write of a shared partial block).
 */
#ifndef NALAR_CUDA_KV_CUH
#define NALAR_CUDA_KV_CUH

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float  *k;          /* (n_blocks, n_layers, 16, kv_dim) elements */
    float  *v;
    int32_t n_blocks;
    int32_t n_layers;
    int32_t kv_dim;
    int32_t bf16;       /* 1: the elements are BF16 (uint16_t) */
} nalar_cuda_kv;

/* Bytes of one K (or V) element. */
#define NALAR_CUDA_KV_ELEM(kv) ((kv)->bf16 ? (size_t) 2 : sizeof(float))

int nalar_cuda_kv_append(nalar_cuda_ctx *c, const nalar_cuda_kv *kv,
                         int32_t layer, const float *src, int64_t ld,
                         int64_t k_off, int64_t v_off, const int32_t *pos,
                         const int32_t *tbl_off, const int32_t *tables,
                         int32_t n_tok, nalar_err *err);

int nalar_cuda_kv_copy_block(nalar_cuda_ctx *c, const nalar_cuda_kv *kv,
                             int32_t dst, int32_t src, nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
