/*
 * Argmax, seeded top-k/top-p/min-p sampling and greedy speculative
 * verification on the device.  Thresholds come from radix selection over
 * the order-preserving integer image of the logits: four passes of 8 bits,
 * each a 256-bin histogram (of counts for top-k, of weight for top-p) in
 * shared memory, so nothing is sorted.
 */
#include <limits.h>

#include "sample.cuh"

#define SAMPLE_THREADS 1024


static __host__ __device__ __forceinline__ uint64_t
mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}


static __host__ __device__ __forceinline__ double
uniform(uint64_t seed, uint64_t counter)
{
    return (double) (mix64(seed ^ mix64(counter)) >> 11) * 0x1.0p-53;
}


double
nalar_cuda_uniform(uint64_t seed, uint64_t counter)
{
    return uniform(seed, counter);
}


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


/* (value, id) pairs: larger value wins, then the lower id */
static __device__ __forceinline__ void
better(float *v, int32_t *i, float v2, int32_t i2)
{
    if (v2 > *v || (v2 == *v && i2 < *i)) {
        *v = v2;
        *i = i2;
    }
}


static __device__ int32_t
block_argmax(const float *row, int32_t n)
{
    __shared__ float   sv[WARP];
    __shared__ int32_t si[WARP];
    float   v = -INFINITY;
    int32_t i = INT_MAX;
    int     lane = threadIdx.x % WARP, w = threadIdx.x / WARP;

    for (int32_t k = threadIdx.x; k < n; k += blockDim.x) {
        if (row[k] == row[k]) {           /* NaN never wins */
            better(&v, &i, row[k], k);
        }
    }
    for (int o = WARP / 2; o > 0; o >>= 1) {
        better(&v, &i, __shfl_xor_sync(0xffffffffu, v, o),
               __shfl_xor_sync(0xffffffffu, i, o));
    }
    __syncthreads();
    if (lane == 0) {
        sv[w] = v;
        si[w] = i;
    }
    __syncthreads();
    v = lane < (int) (blockDim.x / WARP) ? sv[lane] : -INFINITY;
    i = lane < (int) (blockDim.x / WARP) ? si[lane] : INT_MAX;
    for (int o = WARP / 2; o > 0; o >>= 1) {
        better(&v, &i, __shfl_xor_sync(0xffffffffu, v, o),
               __shfl_xor_sync(0xffffffffu, i, o));
    }
    return i == INT_MAX ? 0 : i;
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


/*
 * Radix select from the top: the key of the element where the running
 * weight (counts: 1 each; mass: exp((l - mx) / T)) from the largest keys
 * down first reaches `need`, among elements with key >= floor_key.
 */
static __device__ uint32_t
select_key(const float *row, int32_t n, int mass, float mx, float inv_t,
           uint32_t floor_key, double need)
{
    __shared__ double   hist[256];
    __shared__ uint32_t chosen;
    __shared__ double   carry;
    uint32_t prefix = 0, mask = 0;

    if (threadIdx.x == 0) {
        carry = need;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {
            hist[b] = 0.0;
        }
        __syncthreads();
        for (int32_t k = threadIdx.x; k < n; k += blockDim.x) {
            uint32_t key = fkey(row[k]);

            if (key > 0 && key >= floor_key && (key & mask) == prefix) {
                double wgt = mass ? (double) expf((row[k] - mx) * inv_t)
                                  : 1.0;

                atomicAdd(&hist[(key >> shift) & 255], wgt);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int    pick = -1, lowest = 0;
            double left = carry;

            for (int b = 255; b >= 0; b--) {
                if (hist[b] > 0.0) {
                    lowest = b;
                    if (hist[b] >= left) {
                        pick = b;
                        break;
                    }
                    left -= hist[b];
                }
            }
            /* rounding left `need` above the total: take everything */
            chosen = pick >= 0 ? (uint32_t) pick : (uint32_t) lowest;
            carry = pick >= 0 ? left : 0.0;
        }
        __syncthreads();
        prefix |= chosen << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}


static __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(const float *logits, int64_t ld, int32_t n,
              const nalar_cuda_sampling *params, int32_t *ids)
{
    __shared__ float  shf[WARP];
    __shared__ double scan[SAMPLE_THREADS];
    const float         *row = logits + blockIdx.x * ld;
    nalar_cuda_sampling  p = params[blockIdx.x];
    float                mx, inv_t;
    uint32_t             kkey = 0, pkey = 0, lo;
    double               total, target, mine = 0.0, before;
    int32_t              per = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    int32_t              k0 = threadIdx.x * per;
    int32_t              k1 = k0 + per < n ? k0 + per : n;
    __shared__ int32_t   pick;
    int                  found;

    if (!(p.temperature > 0.0f)) {
        int32_t id = block_argmax(row, n);

        if (threadIdx.x == 0) {
            ids[blockIdx.x] = id;
        }
        return;
    }
    inv_t = 1.0f / p.temperature;
    mx = -INFINITY;
    for (int32_t k = threadIdx.x; k < n; k += blockDim.x) {
        mx = row[k] == row[k] ? fmaxf(mx, row[k]) : mx;
    }
    mx = block_max(mx, shf);
    if (p.top_k > 0 && p.top_k < n) {
        kkey = select_key(row, n, 0, mx, inv_t, 0, (double) p.top_k);
    }
    if (p.top_p < 1.0f) {
        double z = 0.0;

        for (int32_t k = threadIdx.x; k < n; k += blockDim.x) {
            if (fkey(row[k]) >= kkey && fkey(row[k]) > 0) {
                z += (double) expf((row[k] - mx) * inv_t);
            }
        }
        scan[threadIdx.x] = z;
        __syncthreads();
        for (int s = SAMPLE_THREADS / 2; s > 0; s >>= 1) {
            if ((int) threadIdx.x < s) {
                scan[threadIdx.x] += scan[threadIdx.x + s];
            }
            __syncthreads();
        }
        z = scan[0];
        __syncthreads();
        pkey = select_key(row, n, 1, mx, inv_t, kkey,
                          (double) p.top_p * z);
    }
    lo = kkey > pkey ? kkey : pkey;
    lo = lo > 1 ? lo : 1;                 /* NaN (key 0) is never kept */

    /* kept weights in id order: this thread's contiguous slice */
    for (int32_t k = k0; k < k1; k++) {
        float e = expf((row[k] - mx) * inv_t);

        if (fkey(row[k]) >= lo && e > 0.0f && e >= p.min_p) {
            mine += (double) e;
        }
    }
    /* inclusive scan over the block (Hillis-Steele) */
    scan[threadIdx.x] = mine;
    __syncthreads();
    for (int s = 1; s < SAMPLE_THREADS; s <<= 1) {
        double add = (int) threadIdx.x >= s ? scan[threadIdx.x - s] : 0.0;

        __syncthreads();
        scan[threadIdx.x] += add;
        __syncthreads();
    }
    total = scan[SAMPLE_THREADS - 1];
    before = scan[threadIdx.x] - mine;
    target = uniform(p.seed, p.counter) * total;
    if (threadIdx.x == 0) {
        pick = -1;
    }
    __syncthreads();
    if (mine > 0.0 && target >= before
        && (target < before + mine || threadIdx.x == SAMPLE_THREADS - 1))
    {
        double  run = before;
        int32_t last = -1;

        for (int32_t k = k0; k < k1; k++) {
            float e = expf((row[k] - mx) * inv_t);

            if (fkey(row[k]) >= lo && e > 0.0f && e >= p.min_p) {
                last = k;
                run += (double) e;
                if (run > target) {
                    break;
                }
            }
        }
        atomicMax(&pick, last);
    }
    __syncthreads();
    found = pick >= 0;
    __syncthreads();                      /* everyone read it: now write */
    if (!found && mine > 0.0) {
        /* rounding put the target past every slice: the last kept id */
        for (int32_t k = k1 - 1; k >= k0; k--) {
            float e = expf((row[k] - mx) * inv_t);

            if (fkey(row[k]) >= lo && e > 0.0f && e >= p.min_p) {
                atomicMax(&pick, k);
                break;
            }
        }
    }
    __syncthreads();
    if (pick < 0) {
        /* nothing kept (min_p > 1, a row of NaN): the argmax */
        int32_t id = block_argmax(row, n);

        if (threadIdx.x == 0) {
            pick = id;
        }
    }
    if (threadIdx.x == 0) {
        ids[blockIdx.x] = pick;
    }
}


static __global__ void
verify_kernel(const int32_t *ids, const int32_t *row0, const int32_t *n,
              const int32_t *proposals, int32_t n_groups, int32_t *accepted,
              int32_t *next)
{
    int32_t g = blockIdx.x * blockDim.x + threadIdx.x;
    int32_t a = 0;

    if (g >= n_groups || n[g] < 1) {
        return;
    }
    while (a < n[g] - 1 && ids[row0[g] + a] == proposals[row0[g] + a]) {
        a++;
    }
    accepted[g] = a;
    next[g] = ids[row0[g] + a];
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


int
nalar_cuda_sample(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                  int32_t n_rows, int32_t n_vocab,
                  const nalar_cuda_sampling *params, int32_t *ids,
                  nalar_err *err)
{
    if (check_rows("sample", logits, ld, n_rows, n_vocab, ids, err) != 0) {
        return -1;
    }
    if (params == NULL) {
        return nalar_fail(err, "cuda sample: no parameters");
    }
    if (n_rows == 0) {
        return 0;
    }
    sample_kernel<<<n_rows, SAMPLE_THREADS, 0, c->stream>>>(logits, ld,
                                                            n_vocab, params,
                                                            ids);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_verify_greedy(nalar_cuda_ctx *c, const float *logits, int64_t ld,
                         int32_t n_vocab, const int32_t *row0,
                         const int32_t *n, const int32_t *proposals,
                         int32_t n_groups, int32_t n_rows, int32_t *ids,
                         int32_t *accepted, int32_t *next, nalar_err *err)
{
    if (check_rows("verify_greedy", logits, ld, n_rows, n_vocab, ids, err)
        != 0)
    {
        return -1;
    }
    if (row0 == NULL || n == NULL || proposals == NULL || accepted == NULL
        || next == NULL || n_groups < 0)
    {
        return nalar_fail(err, "cuda verify_greedy: bad arguments");
    }
    if (n_groups == 0 || n_rows == 0) {
        return 0;
    }
    if (nalar_cuda_argmax(c, logits, ld, n_rows, n_vocab, ids, err) != 0) {
        return -1;
    }
    verify_kernel<<<(n_groups + 127) / 128, 128, 0, c->stream>>>(
        ids, row0, n, proposals, n_groups, accepted, next);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
