/*
 * Argmax of logit rows on the device (argmax.cuh): the backend's greedy
 * steps send back one id per row, not the row.
 */
#include <limits.h>

#include "argmax.cuh"


/* float -> unsigned with the same order; NaN maps below -inf */
static __device__ __forceinline__ uint32_t
fkey(float f)
{
    uint32_t u = __float_as_uint(f);

    if (f != f) {
        return 0;
    }
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}


/*
 * Argmax of whole rows, many blocks per row (one block scanned all of a
 * 128256-entry row in 203 us on an H200, more than a decode step's
 * attention): block (row, chunk) finds the best of ARGMAX_CHUNK entries and
 * its warps atomicMax a 64-bit key into the row's slot.  The key is fkey of
 * the value above the complement of the id, so the larger value wins, then
 * the lower id; NaN (key 0) never wins; -0 counts as +0 as comparisons do.
 */
#define ARGMAX_CHUNK 4096

static __device__ __forceinline__ unsigned long long
argmax_key(float v, int32_t i)
{
    uint32_t k = fkey(v == 0.0f ? 0.0f : v);

    return k == 0 ? 0ull
                  : (unsigned long long) k << 32 | (uint32_t) ~(uint32_t) i;
}


static __global__ void
argmax_part_kernel(const float *logits, int64_t ld, int32_t n_vocab,
                   unsigned long long *best)
{
    const float       *row = logits + (int64_t) blockIdx.x * ld;
    int32_t            k0 = blockIdx.y * ARGMAX_CHUNK;
    int32_t            k1 = k0 + ARGMAX_CHUNK < n_vocab ? k0 + ARGMAX_CHUNK
                                                        : n_vocab;
    unsigned long long key = 0;

    for (int32_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
        unsigned long long c = argmax_key(row[k], k);

        key = c > key ? c : key;
    }
    for (int o = WARP / 2; o > 0; o >>= 1) {
        unsigned long long c = __shfl_xor_sync(0xffffffffu, key, o);

        key = c > key ? c : key;
    }
    if (threadIdx.x % WARP == 0 && key != 0) {
        atomicMax(&best[blockIdx.x], key);
    }
}


/* ids from the keys (an all-NaN row: 0) */
static __global__ void
argmax_ids_kernel(const unsigned long long *best, int32_t n_rows,
                  int32_t *ids)
{
    int32_t r = blockIdx.x * blockDim.x + threadIdx.x;

    if (r < n_rows) {
        ids[r] = best[r] == 0 ? 0 : (int32_t) ~(uint32_t) best[r];
    }
}


static int
check_rows(const char *op, const float *logits, int64_t ld, int32_t n_rows,
           int32_t n_vocab, const void *ids, nalar_err *err)
{
    if (logits == NULL || ids == NULL || n_rows < 0 || n_vocab <= 0
        || ld < n_vocab || n_rows > INT_MAX / 2)
    {
        return nalar_fail(err, "cuda %s: bad arguments (rows %d, vocab %d, "
                          "ld %lld)", op, n_rows, n_vocab, (long long) ld);
    }
    return 0;
}


int
nalar_cuda_argmax(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                  int32_t n_rows, int32_t n_vocab, int32_t *ids,
                  nalar_err *err)
{
    if (check_rows("argmax", logits, ld, n_rows, n_vocab, ids, err) != 0) {
        return -1;
    }
    if (n_rows == 0) {
        return 0;
    }
    /* rows in groups of the workspace's slots */
    for (int32_t r0 = 0; r0 < n_rows; r0 += NALAR_CUDA_ARGMAX_ROWS) {
        int32_t n = n_rows - r0 < NALAR_CUDA_ARGMAX_ROWS
                    ? n_rows - r0 : NALAR_CUDA_ARGMAX_ROWS;

        CUDA_CHECK(err, cudaMemsetAsync(c->argmax_ws, 0,
                                        (size_t) n * sizeof(*c->argmax_ws),
                                        c->stream));
        argmax_part_kernel<<<dim3((unsigned) n,
                                  (unsigned) ((n_vocab + ARGMAX_CHUNK - 1)
                                              / ARGMAX_CHUNK)),
                             256, 0, c->stream>>>(logits + (int64_t) r0 * ld,
                                                  ld, n_vocab,
                                                  c->argmax_ws);
        CUDA_CHECK_LAUNCH(err);
        argmax_ids_kernel<<<(n + 255) / 256, 256, 0, c->stream>>>(
            c->argmax_ws, n, ids + r0);
        CUDA_CHECK_LAUNCH(err);
    }
    return 0;
}
