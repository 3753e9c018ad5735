/*
 * Paged attention over the device KV pool (layout in kv.cuh).
 *
 * Token t (pos[t] >= 0) attends with each of its query heads to positions
 * [0, pos[t]] of its own sequence (table at tables + tbl_off[t]); query head
 * h reads KV head h / (n_heads / n_kv_heads) (GQA):
 *   out[t][h] = sum_j softmax_j(q[t][h] . k_j / sqrt(hd)) v_j
 *   q: (n_tok, ld_q) with head h at h * head_dim (the fused qkv rows)
 *   out: (n_tok, ld_out), same head layout; padding tokens (pos < 0) get 0
 * head_dim: 16, 32, 64, 128 or 256.
 *
 * attn_decode: flash-decoding.  One block per (token, KV head, head chunk,
 *   split): the query heads sharing a KV head are served by one pass over
 *   K/V; each token's context is cut into n_splits ranges (multiples of 16
 *   positions) whose partial softmax states (max, sum, unnormalised output)
 *   go to `part` and are merged by a second kernel.  n_splits == 1 writes
 *   out directly and needs no `part`.
 * attn_prefill: causal tiles.  tiles (n_tiles, 2) = (first token, count) are
 *   runs of consecutive tokens of one sequence, at most attn_tile_q of them;
 *   one block per (tile, KV head) stages each 16-position KV block in shared
 *   memory once for all tile_q * group query rows.
 */
#ifndef NALAR_CUDA_ATTENTION_CUH
#define NALAR_CUDA_ATTENTION_CUH

#include "common.cuh"
#include "kv.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of `part` that attn_decode needs. */
int64_t nalar_cuda_attn_part_floats(int32_t n_tok, int32_t n_heads,
                                    int32_t head_dim, int32_t n_splits);
/* Head-chunk count per KV head (query heads per block are <= 8). */
int32_t nalar_cuda_attn_head_chunks(int32_t n_heads, int32_t n_kv_heads);
/* Tokens per prefill tile for this shape; 0 when unsupported. */
int32_t nalar_cuda_attn_tile_q(int32_t head_dim, int32_t group);

int nalar_cuda_attn_decode(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                           const float *q, int64_t ld_q,
                           const nalar_cuda_kv *kv, int32_t layer,
                           const int32_t *pos, const int32_t *tbl_off,
                           const int32_t *tables, int32_t n_tok,
                           int32_t n_heads, int32_t n_kv_heads,
                           int32_t head_dim, int32_t n_splits, float *part,
                           nalar_err *err);

/* What a model changes in attention: score = q.k * scale, then, softcap
 * > 0, softcap * tanh(score / softcap); window > 0: the token at pos sees
 * positions pos - window < j <= pos only.  The functions without _opts
 * use scale 1 / sqrt(head_dim), no cap and no window. */
typedef struct {
    float   scale;
    float   softcap;
    int32_t window;
} nalar_cuda_attn_opts;

int nalar_cuda_attn_decode_opts(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                                const float *q, int64_t ld_q,
                                const nalar_cuda_kv *kv, int32_t layer,
                                const int32_t *pos, const int32_t *tbl_off,
                                const int32_t *tables, int32_t n_tok,
                                int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, int32_t n_splits,
                                float *part, const nalar_cuda_attn_opts *o,
                                nalar_err *err);

int nalar_cuda_attn_prefill_opts(nalar_cuda_ctx *c, float *out,
                                 int64_t ld_out, const float *q, int64_t ld_q,
                                 const nalar_cuda_kv *kv, int32_t layer,
                                 const int32_t *pos, const int32_t *tbl_off,
                                 const int32_t *tables, const int32_t *tiles,
                                 int32_t n_tiles, int32_t n_heads,
                                 int32_t n_kv_heads, int32_t head_dim,
                                 const nalar_cuda_attn_opts *o,
                                 nalar_err *err);

int nalar_cuda_attn_prefill(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                            const float *q, int64_t ld_q,
                            const nalar_cuda_kv *kv, int32_t layer,
                            const int32_t *pos, const int32_t *tbl_off,
                            const int32_t *tables, const int32_t *tiles,
                            int32_t n_tiles, int32_t n_heads,
                            int32_t n_kv_heads, int32_t head_dim,
                            nalar_err *err);

#ifdef __cplusplus
}
#endif

#endif
