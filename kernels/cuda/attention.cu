/*
 * Paged attention: flash-decoding for single tokens, causal tiles for
 * prefill chunks.  Softmax is online (running max m, running sum l, output
 * rescaled by exp(m_old - m_new)), all in FP32.
 */
#include "attention.cuh"

extern "C" {
#include "kv.h"
}

#define ATT_WARPS 4                /* warps per block */
#define ATT_GC    8                /* most query heads per decode block */


/* --- decode --- */

/*
 * Lane mapping: each position's head_dim elements are spread over LP lanes,
 * E consecutive elements per lane (one float4 for hd 128), so a warp covers
 * PW = 32 / LP positions per step and each lane group of LP lanes keeps its
 * own softmax state; dot products reduce over the LP lanes with xor
 * shuffles (they stay inside the group).
 */
template <int HD>
struct att_lanes {
    static constexpr int E = HD >= WARP ? HD / WARP : 1;
    static constexpr int LP = HD / E;
    static constexpr int PW = WARP / LP;
    /* positions per lane group per step: loads in flight per lane */
    static constexpr int U = E >= 8 ? 2 : 4;
};


template <int E>
static __device__ __forceinline__ void
load_row(const float *p, float o[E])
{
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E / 4; i++) {
            float4 v = ((const float4 *) p)[i];

            o[4 * i] = v.x; o[4 * i + 1] = v.y;
            o[4 * i + 2] = v.z; o[4 * i + 3] = v.w;
        }
    } else if constexpr (E == 2) {
        float2 v = *(const float2 *) p;

        o[0] = v.x; o[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) {
            o[i] = p[i];
        }
    }
}


/* BF16 K/V (the pool's 16-bit elements): E widened to float */
template <int E>
static __device__ __forceinline__ void
load_row(const uint16_t *p, float o[E])
{
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E / 4; i++) {
            uint2 v = ((const uint2 *) p)[i];

            o[4 * i] = bf16_to_f32(v.x & 0xffffu);
            o[4 * i + 1] = bf16_to_f32(v.x >> 16);
            o[4 * i + 2] = bf16_to_f32(v.y & 0xffffu);
            o[4 * i + 3] = bf16_to_f32(v.y >> 16);
        }
    } else if constexpr (E == 2) {
        uint32_t v = *(const uint32_t *) p;

        o[0] = bf16_to_f32(v & 0xffffu);
        o[1] = bf16_to_f32(v >> 16);
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) {
            o[i] = bf16_to_f32(p[i]);
        }
    }
}


/* one K/V element as float */
static __device__ __forceinline__ float
kv_elem(const float *p, int64_t i)
{
    return p[i];
}


static __device__ __forceinline__ float
kv_elem(const uint16_t *p, int64_t i)
{
    return bf16_to_f32(p[i]);
}


/*
 * PF: the K/V loads of a warp's next step are issued before the scores of
 * this one are computed (software pipelining: two steps of rows in
 * registers), so each warp has a step of loads in flight while it works.
 * Either way every score and sum is computed in the same order.
 */
template <int HD, int GC, bool PF, typename KT>
static __global__ void __launch_bounds__(ATT_WARPS * WARP)
attn_decode_kernel(float *out, int64_t ld_out, const float *q, int64_t ld_q,
                   const KT *kc, const KT *vc, int32_t n_layers,
                   int32_t kv_dim, int32_t layer, const int32_t *pos,
                   const int32_t *tbl_off, const int32_t *tables,
                   int32_t n_heads, int32_t group, int32_t n_chunks,
                   int32_t n_splits, float *part, float scale, float softcap,
                   int32_t window)
{
    constexpr int E = att_lanes<HD>::E, LP = att_lanes<HD>::LP;
    constexpr int PW = att_lanes<HD>::PW, NS = ATT_WARPS * PW;
    constexpr int ATT_U = att_lanes<HD>::U;
    __shared__ float sm_m[NS][GC], sm_l[NS][GC];
    __shared__ float sm_o[NS][GC][HD];

    int32_t t = blockIdx.x;
    int32_t g = blockIdx.y / n_chunks, hc = blockIdx.y % n_chunks;
    int32_t s = blockIdx.z;
    int     lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int     sub = lane / LP, li = lane % LP, st = w * PW + sub;
    int32_t n = pos[t] + 1 > 0 ? pos[t] + 1 : 0;
    /* this split's range: a multiple of 16 positions */
    int32_t chunk = ((n + n_splits - 1) / n_splits + NALAR_KV_BLOCK - 1)
                    / NALAR_KV_BLOCK * NALAR_KV_BLOCK;
    int32_t j0 = s * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    /* the first position in the sliding window */
    int32_t jlo = window > 0 && n > window ? n - window : 0;
    int64_t blk_stride = (int64_t) n_layers * NALAR_KV_BLOCK * kv_dim;
    int64_t col = (int64_t) layer * NALAR_KV_BLOCK * kv_dim
                  + (int64_t) g * HD + li * E;
    const int32_t *tbl = tables + tbl_off[t];
    float   qv[GC][E], m[GC], l[GC], o[GC][E];

#pragma unroll
    for (int h = 0; h < GC; h++) {
        int32_t hg = hc * GC + h;
        int64_t qo = (int64_t) t * ld_q
                     + (int64_t) (g * group + hg) * HD + li * E;

        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            qv[h][e] = hg < group ? q[qo + e] * scale : 0.0f;
            o[h][e] = 0.0f;
        }
    }

    /* the loop bound is warp-uniform: every lane reaches the shuffles */
    constexpr int32_t STEP = ATT_WARPS * PW * ATT_U;
    float kn[ATT_U][E], vn[ATT_U][E];
    bool  okn[ATT_U];

    /* rows of the step at `base` (positions past j1: zeros, not ok) */
    auto fetch = [&](int32_t base, float (*kd)[E], float (*vd)[E],
                     bool *okd) {
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            int32_t j = base + u * PW + sub;

            okd[u] = j < j1 && j >= jlo;
            if (okd[u]) {
                int64_t off = tbl[j / NALAR_KV_BLOCK] * blk_stride + col
                              + (int64_t) (j % NALAR_KV_BLOCK) * kv_dim;

                load_row<E>(kc + off, kd[u]);
                load_row<E>(vc + off, vd[u]);
            } else {
#pragma unroll
                for (int e = 0; e < E; e++) {
                    kd[u][e] = 0.0f;
                    vd[u][e] = 0.0f;
                }
            }
        }
    };

    if (PF && j0 + w * PW * ATT_U < j1) {
        fetch(j0 + w * PW * ATT_U, kn, vn, okn);
    }
    for (int32_t base = j0 + w * PW * ATT_U; base < j1; base += STEP) {
        float kr[ATT_U][E], vr[ATT_U][E], sc[ATT_U][GC];
        bool  ok[ATT_U];

        if (PF) {
#pragma unroll
            for (int u = 0; u < ATT_U; u++) {
                ok[u] = okn[u];
#pragma unroll
                for (int e = 0; e < E; e++) {
                    kr[u][e] = kn[u][e];
                    vr[u][e] = vn[u][e];
                }
            }
            if (base + STEP < j1) {
                fetch(base + STEP, kn, vn, okn);
            }
        } else {
            fetch(base, kr, vr, ok);
        }
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
#pragma unroll
            for (int h = 0; h < GC; h++) {
                float d = 0.0f;

#pragma unroll
                for (int e = 0; e < E; e++) {
                    d = fmaf(qv[h][e], kr[u][e], d);
                }
#pragma unroll
                for (int x = LP / 2; x > 0; x >>= 1) {
                    d += __shfl_xor_sync(0xffffffffu, d, x);
                }
                if (softcap > 0.0f) {
                    d = softcap * tanhf(d / softcap);
                }
                sc[u][h] = ok[u] ? d : -INFINITY;
            }
        }
#pragma unroll
        for (int h = 0; h < GC; h++) {
            float mx = m[h], a;

#pragma unroll
            for (int u = 0; u < ATT_U; u++) {
                mx = fmaxf(mx, sc[u][h]);
            }
            if (mx == -INFINITY) {
                continue;                 /* nothing seen yet */
            }
            a = expf(m[h] - mx);
            l[h] *= a;
#pragma unroll
            for (int e = 0; e < E; e++) {
                o[h][e] *= a;
            }
#pragma unroll
            for (int u = 0; u < ATT_U; u++) {
                float pu = ok[u] ? expf(sc[u][h] - mx) : 0.0f;

                l[h] += pu;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    o[h][e] = fmaf(pu, vr[u][e], o[h][e]);
                }
            }
            m[h] = mx;
        }
    }

    /* merge the NS lane-group states of the block */
#pragma unroll
    for (int h = 0; h < GC; h++) {
        if (li == 0) {
            sm_m[st][h] = m[h];
            sm_l[st][h] = l[h];
        }
#pragma unroll
        for (int e = 0; e < E; e++) {
            sm_o[st][h][li * E + e] = o[h][e];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GC * HD; idx += ATT_WARPS * WARP) {
        int     h = idx / HD, d = idx % HD;
        int32_t head = g * group + hc * GC + h;
        float   M = -INFINITY, L = 0.0f, O = 0.0f;

        if (hc * GC + h >= group) {
            continue;
        }
        for (int k = 0; k < NS; k++) {
            M = fmaxf(M, sm_m[k][h]);
        }
        if (M > -INFINITY) {
            for (int k = 0; k < NS; k++) {
                float a = sm_m[k][h] > -INFINITY ? expf(sm_m[k][h] - M)
                                                 : 0.0f;

                L = fmaf(sm_l[k][h], a, L);
                O = fmaf(sm_o[k][h][d], a, O);
            }
        }
        if (part == NULL) {
            out[(int64_t) t * ld_out + (int64_t) head * HD + d] =
                L > 0.0f ? O / L : 0.0f;
        } else {
            float *pp = part + (((int64_t) t * n_heads + head) * n_splits
                                + s) * (HD + 2);

            pp[2 + d] = O;
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
        }
    }
}


#define RED_DIMS   32             /* output elements per reduce block */
#define RED_GROUPS 4              /* split groups per reduce block */

/*
 * out[t][h][d] = sum_s a_s O_s[d] / sum_s a_s l_s with a_s = exp(m_s - M)
 * over the n_splits partial states of (t, h) that saw a position (l_s > 0;
 * M is their largest m).  Block (t, h, 32 elements): the split weights a_s
 * go to shared memory first, one thread per split, then each of 4 groups of
 * 32 threads sums a quarter of the splits for the block's elements.  The
 * loads of a group are independent of each other, so they overlap: the
 * first version walked the splits one dependent load at a time (28 us per
 * layer at 64 splits on an H200, longer than the attention itself).
 */
static __global__ void __launch_bounds__(RED_DIMS * RED_GROUPS)
attn_reduce_kernel(float *out, int64_t ld_out, const float *part,
                   int32_t n_heads, int32_t head_dim, int32_t n_splits)
{
    extern __shared__ float a[];                  /* (n_splits) */
    __shared__ float sh[WARP], osum[RED_GROUPS][RED_DIMS];
    int32_t      t = blockIdx.x, h = blockIdx.y;
    int          dl = threadIdx.x % RED_DIMS, grp = threadIdx.x / RED_DIMS;
    int32_t      d = blockIdx.z * RED_DIMS + dl;
    int64_t      stride = head_dim + 2;
    const float *pp = part + ((int64_t) t * n_heads + h) * n_splits * stride;
    float        M = -INFINITY, L = 0.0f, O = 0.0f;

    for (int32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
        if (pp[s * stride + 1] > 0.0f) {
            M = fmaxf(M, pp[s * stride]);
        }
    }
    M = block_max(M, sh);
    for (int32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
        float l = pp[s * stride + 1];
        float w = M > -INFINITY && l > 0.0f ? expf(pp[s * stride] - M)
                                            : 0.0f;

        a[s] = w;
        L = fmaf(l, w, L);
    }
    L = block_sum(L, sh);                 /* its barriers publish a[] too */
    if (d < head_dim) {
#pragma unroll 4
        for (int32_t s = grp; s < n_splits; s += RED_GROUPS) {
            float w = a[s];

            if (w != 0.0f) {
                O = fmaf(pp[s * stride + 2 + d], w, O);
            }
        }
    }
    osum[grp][dl] = O;
    __syncthreads();
    if (grp == 0 && d < head_dim) {
        O = 0.0f;
#pragma unroll
        for (int g = 0; g < RED_GROUPS; g++) {
            O += osum[g][dl];
        }
        out[(int64_t) t * ld_out + (int64_t) h * head_dim + d] =
            L > 0.0f ? O / L : 0.0f;
    }
}


/* --- prefill tiles --- */

/* RMAX query rows (tile tokens x group heads) per block; each row's output
 * is owned by TPR threads, OPT elements each */
template <int HD>
struct tile_shape {
    static constexpr int RMAX = HD <= 128 ? 64 : 32;
    static constexpr int TPR = ATT_WARPS * WARP / RMAX;
    static constexpr int OPT = HD / TPR;
    static constexpr size_t SMEM = sizeof(float)
        * ((size_t) RMAX * HD + NALAR_KV_BLOCK * (HD + 1)
           + NALAR_KV_BLOCK * HD + (size_t) RMAX * NALAR_KV_BLOCK);
};


template <int HD, typename KT>
static __global__ void __launch_bounds__(ATT_WARPS * WARP)
attn_tile_kernel(float *out, int64_t ld_out, const float *q, int64_t ld_q,
                 const KT *kc, const KT *vc, int32_t n_layers,
                 int32_t kv_dim, int32_t layer, const int32_t *pos,
                 const int32_t *tbl_off, const int32_t *tables,
                 const int32_t *tiles, int32_t group, float scale,
                 float softcap, int32_t window)
{
    constexpr int RMAX = tile_shape<HD>::RMAX, TPR = tile_shape<HD>::TPR;
    constexpr int OPT = tile_shape<HD>::OPT, KS = HD + 1;
    extern __shared__ float smem[];
    float   *Qs = smem;                          /* (RMAX, HD) */
    float   *Ks = Qs + RMAX * HD;                /* (16, HD + 1) padded */
    float   *Vs = Ks + NALAR_KV_BLOCK * KS;      /* (16, HD) */
    float   *Ps = Vs + NALAR_KV_BLOCK * HD;      /* (RMAX, 16) scores */
    __shared__ int32_t rpos[RMAX];

    int32_t  t0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    int32_t  g = blockIdx.y, R = nq * group, maxp = -1;
    int      r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    int64_t  blk_stride = (int64_t) n_layers * NALAR_KV_BLOCK * kv_dim;
    const int32_t *tbl = tables + tbl_off[t0];
    float    m = -INFINITY, l = 0.0f, acc[OPT];

    if (R > RMAX) {
        return;                 /* the launcher's tile_q keeps R <= RMAX */
    }
#pragma unroll
    for (int i = 0; i < OPT; i++) {
        acc[i] = 0.0f;
    }
    for (int idx = threadIdx.x; idx < R * HD; idx += ATT_WARPS * WARP) {
        int rr = idx / HD, d = idx % HD, qi = rr / group, h = rr % group;

        Qs[idx] = q[(int64_t) (t0 + qi) * ld_q
                    + (int64_t) (g * group + h) * HD + d] * scale;
    }
    for (int rr = threadIdx.x; rr < R; rr += ATT_WARPS * WARP) {
        rpos[rr] = pos[t0 + rr / group];
    }
    for (int qi = 0; qi < nq; qi++) {
        maxp = pos[t0 + qi] > maxp ? pos[t0 + qi] : maxp;
    }
    __syncthreads();

    for (int32_t jb = 0; jb * NALAR_KV_BLOCK <= maxp; jb++) {
        int64_t base = tbl[jb] * blk_stride
                       + (int64_t) layer * NALAR_KV_BLOCK * kv_dim
                       + (int64_t) g * HD;

        for (int idx = threadIdx.x; idx < NALAR_KV_BLOCK * HD;
             idx += ATT_WARPS * WARP)
        {
            int j = idx / HD, d = idx % HD;

            Ks[j * KS + d] = kv_elem(kc, base + (int64_t) j * kv_dim + d);
            Vs[j * HD + d] = kv_elem(vc, base + (int64_t) j * kv_dim + d);
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < R * NALAR_KV_BLOCK;
             idx += ATT_WARPS * WARP)
        {
            int          rr = idx / NALAR_KV_BLOCK, j = idx % NALAR_KV_BLOCK;
            const float *qr = Qs + rr * HD, *kr = Ks + j * KS;
            float        sdot = 0.0f;

#pragma unroll 8
            for (int d = 0; d < HD; d++) {
                sdot = fmaf(qr[d], kr[d], sdot);
            }
            int32_t      kp = jb * NALAR_KV_BLOCK + j;

            if (softcap > 0.0f) {
                sdot = softcap * tanhf(sdot / softcap);
            }
            /* causal mask (and the sliding window); slots past the
             * sequence may hold anything */
            Ps[idx] = kp <= rpos[rr] && (window <= 0 || kp > rpos[rr] - window)
                      ? sdot : -INFINITY;
        }
        __syncthreads();
        if (r < R) {
            const float *pr = Ps + r * NALAR_KV_BLOCK;
            float        mx = m;

            for (int j = 0; j < NALAR_KV_BLOCK; j++) {
                mx = fmaxf(mx, pr[j]);
            }
            if (mx > -INFINITY) {
                float a = expf(m - mx);

                l *= a;
#pragma unroll
                for (int i = 0; i < OPT; i++) {
                    acc[i] *= a;
                }
                for (int j = 0; j < NALAR_KV_BLOCK; j++) {
                    float pj;

                    if (pr[j] == -INFINITY) {
                        continue;         /* never 0 * (whatever is there) */
                    }
                    pj = expf(pr[j] - mx);
                    l += pj;
#pragma unroll
                    for (int i = 0; i < OPT; i++) {
                        acc[i] = fmaf(pj, Vs[j * HD + part + TPR * i],
                                      acc[i]);
                    }
                }
                m = mx;
            }
        }
        __syncthreads();                  /* before the next block lands */
    }
    if (r < R) {
        int   qi = r / group, h = r % group;
        float *o = out + (int64_t) (t0 + qi) * ld_out
                   + (int64_t) (g * group + h) * HD;

#pragma unroll
        for (int i = 0; i < OPT; i++) {
            o[part + TPR * i] = l > 0.0f ? acc[i] / l : 0.0f;
        }
    }
}


/* --- launchers --- */

static int
head_chunk_size(int32_t group)
{
    return group >= 8 ? 8 : group >= 4 ? (group == 4 ? 4 : 8)
                                       : group == 3 ? 4 : group;
}


int32_t
nalar_cuda_attn_head_chunks(int32_t n_heads, int32_t n_kv_heads)
{
    int32_t group = n_heads / n_kv_heads;
    int     gc = head_chunk_size(group);

    return (group + gc - 1) / gc;
}


int64_t
nalar_cuda_attn_part_floats(int32_t n_tok, int32_t n_heads,
                            int32_t head_dim, int32_t n_splits)
{
    return n_splits <= 1 ? 0
           : (int64_t) n_tok * n_heads * n_splits * (head_dim + 2);
}


int32_t
nalar_cuda_attn_tile_q(int32_t head_dim, int32_t group)
{
    int rmax;

    switch (head_dim) {
    case 16: case 32: case 64: case 128: rmax = 64; break;
    case 256: rmax = 32; break;
    default: return 0;
    }
    return group >= 1 && group <= rmax ? rmax / group : 0;
}


template <int HD>
static void
decode_launch_hd(cudaStream_t st, dim3 grid, int gc, int pf, float *out,
                 int64_t ld_out, const float *q, int64_t ld_q,
                 const nalar_cuda_kv *kv, int32_t layer, const int32_t *pos,
                 const int32_t *tbl_off, const int32_t *tables,
                 int32_t n_heads, int32_t group, int32_t n_chunks,
                 int32_t n_splits, float *part,
                 const nalar_cuda_attn_opts *o)
{
#define GO_T(GC, PF, KT) attn_decode_kernel<HD, GC, PF, KT>                  \
        <<<grid, ATT_WARPS * WARP, 0, st>>>(                                  \
        out, ld_out, q, ld_q, (const KT *) kv->k, (const KT *) kv->v,         \
        kv->n_layers, kv->kv_dim, layer,                                      \
        pos, tbl_off, tables, n_heads, group, n_chunks, n_splits, part,       \
        o->scale, o->softcap, o->window)
#define GO(GC, PF) do {                                                       \
        if (kv->bf16) GO_T(GC, PF, uint16_t); else GO_T(GC, PF, float);       \
    } while (0)
#define BY_PF(GC) do { if (pf) GO(GC, true); else GO(GC, false); } while (0)
    switch (gc) {
    case 1: BY_PF(1); break;
    case 2: BY_PF(2); break;
    case 4: BY_PF(4); break;
    default: BY_PF(8); break;
    }
#undef BY_PF
#undef GO
#undef GO_T
}


static int
check_shape(const char *op, const float *out, const float *q,
            const nalar_cuda_kv *kv, int32_t layer, const int32_t *pos,
            const int32_t *tbl_off, const int32_t *tables, int32_t n_tok,
            int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
            int64_t ld_out, int64_t ld_q, nalar_err *err)
{
    if (out == NULL || q == NULL || kv == NULL || kv->k == NULL
        || kv->v == NULL || pos == NULL || tbl_off == NULL || tables == NULL
        || n_tok < 0 || n_heads <= 0 || n_kv_heads <= 0
        || n_heads % n_kv_heads != 0 || layer < 0 || layer >= kv->n_layers
        || kv->kv_dim != n_kv_heads * head_dim
        || ld_out < (int64_t) n_heads * head_dim
        || ld_q < (int64_t) n_heads * head_dim
        || (head_dim != 16 && head_dim != 32 && head_dim != 64
            && head_dim != 128 && head_dim != 256))
    {
        return nalar_fail(err, "cuda %s: unsupported shape or bad arguments "
                          "(n_tok %d, heads %d/%d, head_dim %d, kv_dim %d, "
                          "layer %d)", op, n_tok, n_heads, n_kv_heads,
                          head_dim, kv != NULL ? kv->kv_dim : 0, layer);
    }
    return 0;
}


static void
default_opts(nalar_cuda_attn_opts *o, int32_t head_dim)
{
    o->scale = 1.0f / sqrtf((float) head_dim);
    o->softcap = 0.0f;
    o->window = 0;
}


int
nalar_cuda_attn_decode(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                       const float *q, int64_t ld_q, const nalar_cuda_kv *kv,
                       int32_t layer, const int32_t *pos,
                       const int32_t *tbl_off, const int32_t *tables,
                       int32_t n_tok, int32_t n_heads, int32_t n_kv_heads,
                       int32_t head_dim, int32_t n_splits, float *part,
                       nalar_err *err)
{
    nalar_cuda_attn_opts o;

    default_opts(&o, head_dim);
    return nalar_cuda_attn_decode_opts(c, out, ld_out, q, ld_q, kv, layer,
                                       pos, tbl_off, tables, n_tok, n_heads,
                                       n_kv_heads, head_dim, n_splits, part,
                                       &o, err);
}


int
nalar_cuda_attn_decode_opts(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                            const float *q, int64_t ld_q,
                            const nalar_cuda_kv *kv, int32_t layer,
                            const int32_t *pos, const int32_t *tbl_off,
                            const int32_t *tables, int32_t n_tok,
                            int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim, int32_t n_splits, float *part,
                            const nalar_cuda_attn_opts *o, nalar_err *err)
{
    int32_t group, n_chunks;
    int     gc;
    float  *p;
    dim3    grid;

    if (n_tok == 0) {
        return 0;
    }
    if (check_shape("attn_decode", out, q, kv, layer, pos, tbl_off, tables,
                    n_tok, n_heads, n_kv_heads, head_dim, ld_out, ld_q,
                    err) != 0)
    {
        return -1;
    }
    /* the merge keeps one weight per split in shared memory */
    if (n_splits < 1 || n_splits > 4096 || (n_splits > 1 && part == NULL)) {
        return nalar_fail(err, "cuda attn_decode: %d splits (partials %s)",
                          n_splits, part != NULL ? "given" : "missing");
    }
    group = n_heads / n_kv_heads;
    gc = head_chunk_size(group);
    n_chunks = (group + gc - 1) / gc;
    grid = dim3((unsigned) n_tok, (unsigned) (n_kv_heads * n_chunks),
                (unsigned) n_splits);
    p = n_splits > 1 ? part : NULL;
    switch (head_dim) {
#define HD_CASE(HD) case HD:                                                   \
        decode_launch_hd<HD>(c->stream, grid, gc, c->attn_prefetch, out,    \
                             ld_out, q, ld_q, kv,                             \
                             layer, pos, tbl_off, tables, n_heads, group,     \
                             n_chunks, n_splits, p, o);                       \
        break
    HD_CASE(16);
    HD_CASE(32);
    HD_CASE(64);
    HD_CASE(128);
    default: HD_CASE(256);
#undef HD_CASE
    }
    CUDA_CHECK_LAUNCH(err);
    if (n_splits > 1) {
        attn_reduce_kernel<<<dim3((unsigned) n_tok, (unsigned) n_heads,
                                  (unsigned) ((head_dim + RED_DIMS - 1)
                                              / RED_DIMS)),
                             RED_DIMS * RED_GROUPS,
                             (size_t) n_splits * sizeof(float), c->stream>>>(
            out, ld_out, part, n_heads, head_dim, n_splits);
        CUDA_CHECK_LAUNCH(err);
    }
    return 0;
}


template <int HD>
static int
tile_launch_hd(nalar_cuda_ctx *c, dim3 grid, float *out, int64_t ld_out,
               const float *q, int64_t ld_q, const nalar_cuda_kv *kv,
               int32_t layer, const int32_t *pos, const int32_t *tbl_off,
               const int32_t *tables, const int32_t *tiles, int32_t group,
               const nalar_cuda_attn_opts *o, nalar_err *err)
{
    size_t smem = tile_shape<HD>::SMEM;

    /* above 48 KiB of dynamic shared memory a kernel must opt in */
    if (kv->bf16) {
        CUDA_CHECK(err, cudaFuncSetAttribute(attn_tile_kernel<HD, uint16_t>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) smem));
        attn_tile_kernel<HD, uint16_t>
            <<<grid, ATT_WARPS * WARP, smem, c->stream>>>(
            out, ld_out, q, ld_q, (const uint16_t *) kv->k,
            (const uint16_t *) kv->v, kv->n_layers, kv->kv_dim, layer, pos,
            tbl_off, tables, tiles, group, o->scale, o->softcap, o->window);
    } else {
        CUDA_CHECK(err, cudaFuncSetAttribute(attn_tile_kernel<HD, float>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) smem));
        attn_tile_kernel<HD, float>
            <<<grid, ATT_WARPS * WARP, smem, c->stream>>>(
            out, ld_out, q, ld_q, kv->k, kv->v, kv->n_layers, kv->kv_dim,
            layer, pos, tbl_off, tables, tiles, group, o->scale, o->softcap,
            o->window);
    }
    CUDA_CHECK_LAUNCH(err);
    return 0;
}


int
nalar_cuda_attn_prefill(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                        const float *q, int64_t ld_q,
                        const nalar_cuda_kv *kv, int32_t layer,
                        const int32_t *pos, const int32_t *tbl_off,
                        const int32_t *tables, const int32_t *tiles,
                        int32_t n_tiles, int32_t n_heads, int32_t n_kv_heads,
                        int32_t head_dim, nalar_err *err)
{
    nalar_cuda_attn_opts o;

    default_opts(&o, head_dim);
    return nalar_cuda_attn_prefill_opts(c, out, ld_out, q, ld_q, kv, layer,
                                        pos, tbl_off, tables, tiles, n_tiles,
                                        n_heads, n_kv_heads, head_dim, &o,
                                        err);
}


int
nalar_cuda_attn_prefill_opts(nalar_cuda_ctx *c, float *out, int64_t ld_out,
                             const float *q, int64_t ld_q,
                             const nalar_cuda_kv *kv, int32_t layer,
                             const int32_t *pos, const int32_t *tbl_off,
                             const int32_t *tables, const int32_t *tiles,
                             int32_t n_tiles, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim,
                             const nalar_cuda_attn_opts *o, nalar_err *err)
{
    int32_t group;
    dim3    grid;

    if (n_tiles == 0) {
        return 0;
    }
    if (check_shape("attn_prefill", out, q, kv, layer, pos, tbl_off, tables,
                    n_tiles, n_heads, n_kv_heads, head_dim, ld_out, ld_q,
                    err) != 0)
    {
        return -1;
    }
    group = n_heads / n_kv_heads;
    if (tiles == NULL || nalar_cuda_attn_tile_q(head_dim, group) == 0
        || n_kv_heads > 65535)
    {
        return nalar_fail(err, "cuda attn_prefill: no tile shape for "
                          "head_dim %d with %d query heads per KV head",
                          head_dim, group);
    }
    grid = dim3((unsigned) n_tiles, (unsigned) n_kv_heads);
    switch (head_dim) {
    case 16:
        return tile_launch_hd<16>(c, grid, out, ld_out, q, ld_q, kv, layer,
                                  pos, tbl_off, tables, tiles, group, o,
                                  err);
    case 32:
        return tile_launch_hd<32>(c, grid, out, ld_out, q, ld_q, kv, layer,
                                  pos, tbl_off, tables, tiles, group, o,
                                  err);
    case 64:
        return tile_launch_hd<64>(c, grid, out, ld_out, q, ld_q, kv, layer,
                                  pos, tbl_off, tables, tiles, group, o,
                                  err);
    case 128:
        return tile_launch_hd<128>(c, grid, out, ld_out, q, ld_q, kv, layer,
                                   pos, tbl_off, tables, tiles, group, o,
                                   err);
    default:
        return tile_launch_hd<256>(c, grid, out, ld_out, q, ld_q, kv, layer,
                                   pos, tbl_off, tables, tiles, group, o,
                                   err);
    }
}
