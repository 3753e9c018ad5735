/*
 * The CPU backend: a Llama forward pass over a batch of tokens from many
 * sequences, reading K/V from the paged pool.
 *
 * The whole pass is one parallel region on the worker pool (or, for a
 * draft's small passes, the calling thread alone), run one of two ways
 * (choose_way measures both and runs the faster):
 *
 * - by rows (forward_worker): phases that depend on each other are
 *   separated by barriers, five per layer.  Work inside a phase is split
 *   by weight rows (matrix products, and the RoPE and KV store of the
 *   q/k/v rows a thread computed; for a pass of many sequences, by whole
 *   sequences), by token (embeddings) or by attention tile, so no two
 *   threads write the same bytes; each thread normalises every token into
 *   its own buffer.
 * - by tokens (forward_tokens, passes of two tokens or more): each thread
 *   runs the whole model over its own tokens, meeting the others once per
 *   layer, after the K/V stores.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "cpu_backend.h"
#include "clock.h"
#include "exp_neg.h"
#include "sampler.h"
#include "cpu_matmul.h"
#include "threadpool.h"

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define MODE_TOKENS 8    /* passes up to this size may run solo (choose_way) */
#define WAY_CLASSES 21   /* pass sizes 1 .. 16, then 17-32, ..., 257 or more */

/* how a pass runs (choose_way) */
enum {
    WAY_ROWS,            /* on the pool, phases split by weight rows */
    WAY_TOKENS,          /* on the pool, split by token (forward_tokens) */
    WAY_SOLO,            /* on the calling thread alone */
    N_WAYS
};

/* batch tokens t0 .. t0 + n - 1: one sequence at consecutive positions */
typedef struct {
    int32_t t0, n;
} tok_tile;

/* a layer's weights as the matrix kernels read them (see cpu_matmul.h) */
typedef struct {
    nalar_cpu_mat  wq, wk, wv, wo, w_gate, w_up, w_down;
} cpu_layer;

typedef struct {
    nalar_model   *m;
    cpu_layer     *layers;       /* (n_layers) */
    nalar_cpu_mat  output;       /* (n_vocab, dim) */
    nalar_pool    *pool;
    int            owns_pool;    /* 0: borrowed from another backend */
    int32_t        cap_tok;      /* scratch rows allocated */
    int32_t        q_dim;        /* n_heads * head_dim */
    int32_t        kv_dim;       /* n_kv_heads * head_dim */
    float         *x;            /* (cap_tok, dim) residual stream */
    float         *xb;           /* (n_threads, cap_tok, dim) normalised
                                    input: each thread's own copy */
    int            act_i16;      /* products over quantized weights take
                                    16-bit (NALAR_ACT_I16) or 8-bit
                                    (NALAR_ACT_Q8) activations */
    uint8_t       *xq;           /* act_i16: (n_threads, xq_bytes) each
                                    thread's int16 codes of its xb
                                    (nalar_quant_xq) or int8 codes
                                    (nalar_quant_x8), or NULL */
    int64_t        xq_bytes;     /* nalar_quant_xq_bytes(xq_cap, dim) or
                                    nalar_quant_x8_bytes */
    int32_t        xq_cap;       /* tokens xq holds per thread */
    float         *qkv;          /* (cap_tok, q_dim + 2 kv_dim) */
    float         *att;          /* (cap_tok, q_dim) attention output */
    float         *hg;           /* (cap_tok, ffn) gate, then silu(g) * u */
    float         *hu;           /* (cap_tok, ffn) up */
    float         *y;            /* (cap_tok, dim) a layer's attention or
                                    FFN output before its post-norm */
    float         *rope_cos;     /* (cap_tok, head_dim / 2) */
    float         *rope_sin;     /* (cap_tok, head_dim / 2) */
    float         *inv_freq;     /* (head_dim / 2) base^(-2i/head_dim)
                                    * rope_scale / rope_freqs[i] */
    float         *scores;       /* (n_threads, QTILE, scores_cap) */
    int32_t        scores_cap;   /* per query row */
    int32_t       *logit_rows;   /* (cap_tok) batch index of each logit */
    tok_tile      *tiles;        /* (cap_tok) attention's token tiles */
    int32_t        n_tiles;
    int            one_seq;      /* the tiles are all one sequence's */
    int32_t        max_run;      /* most tokens of one sequence in a row */
    /* the tiles' shape, from the model: a tile holds tile_heads heads of
     * one KV group and up to tile_tokens consecutive tokens; each KV head's
     * G heads make head_groups tiles per token tile */
    int            tile_heads, tile_tokens, head_groups;
    /* the ways a pass may run, by pass size class (way_class): measured
     * microseconds per token of each, passes measured and passes run (see
     * choose_way) */
    double         way_us[WAY_CLASSES][N_WAYS];
    int            way_n[WAY_CLASSES][N_WAYS];
    unsigned       way_passes[WAY_CLASSES];
    unsigned       way_probes[WAY_CLASSES];
    uint64_t       solo_passes;  /* passes run WAY_SOLO, for tests */
    /* a pass split by token: thread i's tokens, tiles and logit rows
     * start at tok_lo[i], tile_lo[i], logit_lo[i] (n_threads + 1 each) */
    int32_t       *tok_lo;
    int32_t       *tile_lo;
    int32_t       *logit_lo;
    /* the pass in flight */
    nalar_kv_pool     *kv;
    const nalar_batch *batch;
    float             *logits;
} cpu_backend;


/* --- small vector helpers (fixed order of operations) --- */

static inline float
dot(const float *a, const float *b, int n)
{
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    int    i = 0;

    for (; i + 16 <= n; i += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i),
                              acc);
    }
    if (i < n) {
        __mmask16 m = (__mmask16) ((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i),
                              _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;
    for (int i = 0; i < n; i++) {
        s = fmaf(a[i], b[i], s);
    }
    return s;
#endif
}


static void
rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = dot(x, x, n) / (float) n;
    float s = 1.0f / sqrtf(ss + eps);

    for (int i = 0; i < n; i++) {
        o[i] = x[i] * s * w[i];
    }
}


/* Rotate pairs of one head: normal pairing (x[2i], x[2i+1]) or NeoX
 * pairing (x[i], x[i + hd/2]). */
static void
rope_head(float *x, const float *cs, const float *sn, int hd, int neox)
{
    for (int i = 0; i < hd / 2; i++) {
        int   a = neox ? i : 2 * i;
        int   b = neox ? i + hd / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];

        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}


/* Contiguous share [lo, hi) of n items for thread tid of nth, with the
 * boundaries rounded to multiples of `align`. */
static void
split(int64_t n, int tid, int nth, int64_t align, int64_t *lo, int64_t *hi)
{
    int64_t units = (n + align - 1) / align;
    int64_t a = units * tid / nth, b = units * (tid + 1) / nth;

    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}


/* --- the forward pass, run by every thread --- */

/* sum of x[0..n), in 16 lanes (one dependent add per element would wait
 * on each add's latency) */
static float
sum_lanes(const float *x, int32_t n)
{
#if defined(__AVX512F__)
    __m512  acc = _mm512_setzero_ps();
    int32_t j = 0;

    for (; j + 16 <= n; j += 16) {
        acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + j));
    }
    if (j < n) {
        acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(
                                     (__mmask16) ((1u << (n - j)) - 1),
                                     x + j));
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;

    for (int32_t j = 0; j < n; j++) {
        s += x[j];
    }
    return s;
#endif
}


/* max of x[0..n), n >= 1, in 16 lanes (the compiler does not vectorise a
 * float max: it may not reorder it) */
static float
max_lanes(const float *x, int32_t n)
{
#if defined(__AVX512F__)
    __m512  mx = _mm512_set1_ps(-INFINITY);
    int32_t j = 0;

    for (; j + 16 <= n; j += 16) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + j));
    }
    if (j < n) {
        mx = _mm512_mask_max_ps(mx, (__mmask16) ((1u << (n - j)) - 1), mx,
                                _mm512_maskz_loadu_ps(
                                    (__mmask16) ((1u << (n - j)) - 1),
                                    x + j));
    }
    return _mm512_reduce_max_ps(mx);
#else
    float m = -INFINITY;

    for (int32_t j = 0; j < n; j++) {
        m = x[j] > m ? x[j] : m;
    }
    return m;
#endif
}


/*
 * Attention works on tiles of Q <= QTILE query rows that read the same keys
 * and values: the heads of one KV group, and consecutive tokens of one
 * sequence (a verification's proposals, a prefill chunk), so each load of
 * keys or of a value row serves every row of the tile.
 *
 * K is stored transposed within each (block, layer) slab -- dimension d of
 * the block's key j at d * 16 + j -- so one load holds 16 keys' values of
 * one dimension and a row's 16 scores build up in one vector, without a
 * horizontal sum.  V is stored by row.
 *
 * Each row's arithmetic is the same whatever else shares its tile, so
 * results do not depend on the batch: a score is four accumulators over
 * d mod 4, combined as (0 + 1) + (2 + 3), in increasing d; an output (a
 * head of up to 64) is two accumulators over even and odd positions, in
 * increasing position, added and scaled by 1 / sum.  Q is a constant in each inlined copy, so the
 * accumulators stay in registers.
 *
 * A tile's cost follows the keys and values it reads far more than its
 * rows (a 2-row tile costs about as much as a 4-row one), so a
 * verification's tokens share as few tiles as the registers allow: up to
 * 8 rows where head_dim <= 32 (the demo target: 4 tokens of a KV group's
 * 2 heads; a 3-token verification then reads each head's keys once, not
 * twice), 4 rows for larger heads, whose rows need twice the registers
 * (tile_rows_max).
 */
#define QTILE 8    /* rows of a tile at most (tile_rows_max) */

typedef struct {
    float        scale;        /* score = q.k * scale */
    const float *q[QTILE];     /* (hd) query rows */
    float       *out[QTILE];   /* (hd) output rows */
    float       *sc[QTILE];    /* (scores_cap) scores, then weights */
    int32_t      n[QTILE];     /* positions each row attends to */
    int32_t      lo[QTILE];    /* the first of them in the window */
    int32_t      n_min, n_max;
} tile_rows;


static ALWAYS_INLINE void
tile_scores(const tile_rows *r, const nalar_kv_pool *kv,
            const nalar_seq_kv *s, int layer, int64_t col, int hd, int Q)
{
    float scale = r->scale;

    for (int32_t j0 = 0; j0 < r->n_max; j0 += NALAR_KV_BLOCK) {
        int32_t      b = s->blocks[j0 / NALAR_KV_BLOCK];
        const float *kt = kv->k + nalar_kv_offset(kv, b, layer, 0)
                          + col * NALAR_KV_BLOCK;

#if defined(__AVX512F__)
        if (hd % 4 == 0) {
            __m512 acc[QTILE][4];

            for (int i = 0; i < Q; i++) {
                for (int u = 0; u < 4; u++) {
                    acc[i][u] = _mm512_setzero_ps();
                }
            }
            for (int d = 0; d < hd; d += 4) {
                for (int u = 0; u < 4; u++) {
                    __m512 k16 = _mm512_loadu_ps(kt + (d + u)
                                                      * NALAR_KV_BLOCK);

                    for (int i = 0; i < Q; i++) {
                        acc[i][u] = _mm512_fmadd_ps(
                            _mm512_set1_ps(r->q[i][d + u]), k16, acc[i][u]);
                    }
                }
            }
            for (int i = 0; i < Q; i++) {
                __m512 s16 = _mm512_add_ps(
                    _mm512_add_ps(acc[i][0], acc[i][1]),
                    _mm512_add_ps(acc[i][2], acc[i][3]));

                _mm512_storeu_ps(r->sc[i] + j0,
                                 _mm512_mul_ps(s16, _mm512_set1_ps(scale)));
            }
            continue;
        }
#elif defined(__AVX2__) && defined(__FMA__)
        if (hd % 4 == 0) {
            /* a row at a time: its 16 scores in two vectors of 8, each
             * with the four accumulators over d mod 4 */
            for (int i = 0; i < Q; i++) {
                __m256 acc[2][4];

                for (int u = 0; u < 4; u++) {
                    acc[0][u] = _mm256_setzero_ps();
                    acc[1][u] = _mm256_setzero_ps();
                }
                for (int d = 0; d < hd; d += 4) {
                    for (int u = 0; u < 4; u++) {
                        const float *k = kt + (d + u) * NALAR_KV_BLOCK;
                        __m256       qv = _mm256_set1_ps(r->q[i][d + u]);

                        acc[0][u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k),
                                                    acc[0][u]);
                        acc[1][u] = _mm256_fmadd_ps(
                            qv, _mm256_loadu_ps(k + 8), acc[1][u]);
                    }
                }
                for (int h = 0; h < 2; h++) {
                    __m256 s8 = _mm256_add_ps(
                        _mm256_add_ps(acc[h][0], acc[h][1]),
                        _mm256_add_ps(acc[h][2], acc[h][3]));

                    _mm256_storeu_ps(r->sc[i] + j0 + 8 * h,
                                     _mm256_mul_ps(s8, _mm256_set1_ps(scale)));
                }
            }
            continue;
        }
#endif
        {
            int32_t jn = r->n_max - j0 < NALAR_KV_BLOCK ? r->n_max - j0
                                                        : NALAR_KV_BLOCK;

            for (int i = 0; i < Q; i++) {
                for (int32_t j = 0; j < jn; j++) {
                    float a[4] = { 0, 0, 0, 0 };
                    int   d = 0;

                    for (; d + 4 <= hd; d += 4) {
                        for (int u = 0; u < 4; u++) {
                            a[u] = fmaf(r->q[i][d + u],
                                        kt[(d + u) * NALAR_KV_BLOCK + j],
                                        a[u]);
                        }
                    }
                    for (; d < hd; d++) {
                        a[0] = fmaf(r->q[i][d], kt[d * NALAR_KV_BLOCK + j],
                                    a[0]);
                    }
                    r->sc[i][j0 + j] = ((a[0] + a[1]) + (a[2] + a[3]))
                                       * scale;
                }
            }
        }
    }
}


#if defined(__AVX512F__)
/* acc[i][u][*] += w_i[j] * v_j for the rows of the tile with j < n[i] */
static ALWAYS_INLINE void
tile_value(const tile_rows *r, __m512 (*acc)[2][4], const float *vj,
           int32_t j, int u, int nv, int Q, int all)
{
    __m512 v[4];

    for (int c = 0; c < nv; c++) {
        v[c] = _mm512_loadu_ps(vj + 16 * c);
        /* one load per value vector: folded into each FMA, Q loads */
        __asm__("" : "+v"(v[c]));
    }
    for (int i = 0; i < Q; i++) {
        __m512 w;

        if (!all && j >= r->n[i]) {
            continue;
        }
        w = _mm512_set1_ps(r->sc[i][j]);
        for (int c = 0; c < nv; c++) {
            acc[i][u][c] = _mm512_fmadd_ps(w, v[c], acc[i][u][c]);
        }
    }
}
#endif


static ALWAYS_INLINE void
tile_values(const tile_rows *r, const float *inv, const nalar_kv_pool *kv,
            const nalar_seq_kv *s, int layer, int64_t col, int hd, int Q)
{
#if defined(__AVX512F__)
    if (hd % 16 == 0 && hd <= 64) {
        __m512 acc[QTILE][2][4];
        int    nv = hd / 16;

        for (int i = 0; i < Q; i++) {
            for (int u = 0; u < 2; u++) {
                for (int c = 0; c < nv; c++) {
                    acc[i][u][c] = _mm512_setzero_ps();
                }
            }
        }
        for (int32_t j0 = 0; j0 < r->n_max; j0 += NALAR_KV_BLOCK) {
            int32_t      b = s->blocks[j0 / NALAR_KV_BLOCK];
            const float *vb = kv->v + nalar_kv_offset(kv, b, layer, 0) + col;
            int32_t      jn = r->n_max - j0 < NALAR_KV_BLOCK ? r->n_max - j0
                                                             : NALAR_KV_BLOCK;
            int32_t      ja = r->n_min - j0 < jn ? r->n_min - j0 : jn;
            int32_t      j = 0;

            /* positions every row attends to, two at a time (even, odd) */
            for (; j + 2 <= ja; j += 2) {
                tile_value(r, acc, vb + (int64_t) j * kv->kv_dim, j0 + j, 0,
                           nv, Q, 1);
                tile_value(r, acc, vb + (int64_t) (j + 1) * kv->kv_dim,
                           j0 + j + 1, 1, nv, Q, 1);
            }
            /* then the rest, each row up to its own position */
            for (; j < jn; j++) {
                tile_value(r, acc, vb + (int64_t) j * kv->kv_dim, j0 + j,
                           j & 1, nv, Q, 0);
            }
        }
        for (int i = 0; i < Q; i++) {
            for (int c = 0; c < nv; c++) {
                _mm512_storeu_ps(r->out[i] + 16 * c, _mm512_mul_ps(
                    _mm512_add_ps(acc[i][0][c], acc[i][1][c]),
                    _mm512_set1_ps(inv[i])));
            }
        }
        return;
    }
    if (hd % 16 == 0 && hd <= 256) {
        /* larger heads: a row at a time, one accumulator per 16 lanes
         * (already hd / 16 chains), in increasing position */
        for (int i = 0; i < Q; i++) {
            __m512 acc[16];
            int    nv = hd / 16;

            for (int c = 0; c < nv; c++) {
                acc[c] = _mm512_setzero_ps();
            }
            for (int32_t j0 = 0; j0 < r->n[i]; j0 += NALAR_KV_BLOCK) {
                int32_t      b = s->blocks[j0 / NALAR_KV_BLOCK];
                const float *v = kv->v + nalar_kv_offset(kv, b, layer, 0)
                                 + col;
                int32_t      jn = r->n[i] - j0 < NALAR_KV_BLOCK
                                  ? r->n[i] - j0 : NALAR_KV_BLOCK;

                for (int32_t j = 0; j < jn; j++) {
                    __m512 w = _mm512_set1_ps(r->sc[i][j0 + j]);

                    for (int c = 0; c < nv; c++) {
                        acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 16 * c),
                                                 acc[c]);
                    }
                    v += kv->kv_dim;
                }
            }
            for (int c = 0; c < nv; c++) {
                _mm512_storeu_ps(r->out[i] + 16 * c, _mm512_mul_ps(
                    acc[c], _mm512_set1_ps(inv[i])));
            }
        }
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (hd % 8 == 0) {
        /* a row at a time, 32 of its columns at a time: the two
         * accumulators over even and odd positions, as below */
        for (int i = 0; i < Q; i++) {
            for (int c0 = 0; c0 < hd; c0 += 32) {
                __m256 acc[2][4];
                int    nv = hd - c0 < 32 ? (hd - c0) / 8 : 4;

                for (int c = 0; c < nv; c++) {
                    acc[0][c] = _mm256_setzero_ps();
                    acc[1][c] = _mm256_setzero_ps();
                }
                for (int32_t j0 = 0; j0 < r->n[i]; j0 += NALAR_KV_BLOCK) {
                    int32_t      b = s->blocks[j0 / NALAR_KV_BLOCK];
                    const float *v = kv->v + nalar_kv_offset(kv, b, layer, 0)
                                     + col + c0;
                    int32_t      jn = r->n[i] - j0 < NALAR_KV_BLOCK
                                      ? r->n[i] - j0 : NALAR_KV_BLOCK;

                    const float *sc = r->sc[i] + j0;
                    int32_t      j = 0;

                    /* j0 is even: j's parity is its position's */
                    for (; j + 2 <= jn; j += 2) {
                        __m256       w0 = _mm256_set1_ps(sc[j]);
                        __m256       w1 = _mm256_set1_ps(sc[j + 1]);
                        const float *v1 = v + kv->kv_dim;

                        for (int c = 0; c < nv; c++) {
                            acc[0][c] = _mm256_fmadd_ps(
                                w0, _mm256_loadu_ps(v + 8 * c), acc[0][c]);
                            acc[1][c] = _mm256_fmadd_ps(
                                w1, _mm256_loadu_ps(v1 + 8 * c), acc[1][c]);
                        }
                        v += 2 * kv->kv_dim;
                    }
                    if (j < jn) {
                        __m256 w0 = _mm256_set1_ps(sc[j]);

                        for (int c = 0; c < nv; c++) {
                            acc[0][c] = _mm256_fmadd_ps(
                                w0, _mm256_loadu_ps(v + 8 * c), acc[0][c]);
                        }
                    }
                }
                for (int c = 0; c < nv; c++) {
                    _mm256_storeu_ps(r->out[i] + c0 + 8 * c, _mm256_mul_ps(
                        _mm256_add_ps(acc[0][c], acc[1][c]),
                        _mm256_set1_ps(inv[i])));
                }
            }
        }
        return;
    }
#endif
    for (int i = 0; i < Q; i++) {
        for (int d = 0; d < hd; d++) {
            float a[2] = { 0, 0 };

            for (int32_t j = 0; j < r->n[i]; j++) {
                int32_t b = s->blocks[j / NALAR_KV_BLOCK];

                a[j & 1] = fmaf(r->sc[i][j],
                                kv->v[nalar_kv_offset(kv, b, layer,
                                                      j % NALAR_KV_BLOCK)
                                      + col + d], a[j & 1]);
            }
            r->out[i][d] = (a[0] + a[1]) * inv[i];
        }
    }
}


/* The tile `item`: (KV head, token tile, group of its heads) when the
 * pass is one sequence's (a verification, a prefill chunk), so a thread's
 * share reads few KV heads' keys and values, once from memory, then from
 * its cache; (token tile, KV head, group) otherwise, so a thread's share
 * is whole sequences, whose blocks no other thread reads */
static ALWAYS_INLINE void
attend_tile(cpu_backend *be, int layer, float *sc0, int64_t item, int hd)
{
    const nalar_config *c = &be->m->cfg;
    const nalar_batch  *bt = be->batch;
    int                 G = c->n_heads / c->n_kv_heads;
    int                 hp = be->tile_heads, ng = be->head_groups;
    int                 ldqkv = be->q_dim + 2 * be->kv_dim;
    int                 sub = (int) (item % ng);
    int                 g = (int) (be->one_seq ? item / ng / be->n_tiles
                                           : item / ng % c->n_kv_heads);
    const tok_tile     *tl = &be->tiles[be->one_seq ? item / ng % be->n_tiles
                                        : item / ng / c->n_kv_heads];
    int                 h0 = g * G + sub * hp;
    int                 nh = G - sub * hp < hp ? G - sub * hp : hp;
    int                 Q = tl->n * nh;
    int64_t             col = (int64_t) g * hd;
    const nalar_seq_kv *s = bt->seq[tl->t0];
    int32_t             window = nalar_layer_window(c, layer);
    float               cap = c->attn_softcap;
    tile_rows           r;
    float               inv[QTILE];

    r.scale = c->attn_scale;
    r.n_min = bt->pos[tl->t0] + 1;
    r.n_max = bt->pos[tl->t0 + tl->n - 1] + 1;
    for (int i = 0; i < Q; i++) {
        int t = tl->t0 + i / nh, h = h0 + i % nh;

        r.q[i] = be->qkv + (int64_t) t * ldqkv + (int64_t) h * hd;
        r.out[i] = be->att + (int64_t) t * be->q_dim + (int64_t) h * hd;
        r.sc[i] = sc0 + (int64_t) i * be->scores_cap;
        r.n[i] = bt->pos[t] + 1;
        r.lo[i] = window > 0 && r.n[i] > window ? r.n[i] - window : 0;
    }
    switch (Q) {
    case 1: tile_scores(&r, be->kv, s, layer, col, hd, 1); break;
    case 2: tile_scores(&r, be->kv, s, layer, col, hd, 2); break;
    case 3: tile_scores(&r, be->kv, s, layer, col, hd, 3); break;
    case 4: tile_scores(&r, be->kv, s, layer, col, hd, 4); break;
    case 5: tile_scores(&r, be->kv, s, layer, col, hd, 5); break;
    case 6: tile_scores(&r, be->kv, s, layer, col, hd, 6); break;
    case 7: tile_scores(&r, be->kv, s, layer, col, hd, 7); break;
    default: tile_scores(&r, be->kv, s, layer, col, hd, 8); break;
    }
    /* per row: soft-capped scores (gemma2), then softmax over its own
     * positions in the window (scores - max <= 0: the branch-free exp,
     * vectorised), weight 0 before the window; 1 / sum scales the output */
    for (int i = 0; i < Q; i++) {
        float   *sc = r.sc[i];
        int32_t  lo = r.lo[i];
        float    mx;

        if (cap > 0) {
            for (int32_t j = lo; j < r.n[i]; j++) {
                sc[j] = cap * tanhf(sc[j] / cap);
            }
        }
        mx = max_lanes(sc + lo, r.n[i] - lo);
        for (int32_t j = 0; j < lo; j++) {
            sc[j] = 0;
        }
        for (int32_t j = lo; j < r.n[i]; j++) {
            sc[j] = nalar_exp_neg(sc[j] - mx);
        }
        inv[i] = 1.0f / sum_lanes(sc, r.n[i]);
    }
    switch (Q) {
    case 1: tile_values(&r, inv, be->kv, s, layer, col, hd, 1); break;
    case 2: tile_values(&r, inv, be->kv, s, layer, col, hd, 2); break;
    case 3: tile_values(&r, inv, be->kv, s, layer, col, hd, 3); break;
    case 4: tile_values(&r, inv, be->kv, s, layer, col, hd, 4); break;
    case 5: tile_values(&r, inv, be->kv, s, layer, col, hd, 5); break;
    case 6: tile_values(&r, inv, be->kv, s, layer, col, hd, 6); break;
    case 7: tile_values(&r, inv, be->kv, s, layer, col, hd, 7); break;
    default: tile_values(&r, inv, be->kv, s, layer, col, hd, 8); break;
    }
}


/*
 * Attention items [lo, hi) in the pass's item order (attend_tile), or,
 * `by_tile`, every item of token tiles [lo, hi): a thread that owns whole
 * tokens (forward_tokens) attends for their tiles alone.
 */
static ALWAYS_INLINE void
attend_range(cpu_backend *be, int layer, float *sc, int64_t lo, int64_t hi,
             int by_tile, int hd)
{
    int64_t nkv = be->m->cfg.n_kv_heads, ng = be->head_groups;

    if (!by_tile) {
        for (int64_t item = lo; item < hi; item++) {
            attend_tile(be, layer, sc, item, hd);
        }
        return;
    }
    for (int64_t tile = lo; tile < hi; tile++) {
        for (int64_t g = 0; g < nkv; g++) {
            for (int64_t sub = 0; sub < ng; sub++) {
                int64_t item = be->one_seq
                               ? (g * be->n_tiles + tile) * ng + sub
                               : (tile * nkv + g) * ng + sub;

                attend_tile(be, layer, sc, item, hd);
            }
        }
    }
}


static void
attention(cpu_backend *be, int layer, int tid, int64_t lo, int64_t hi,
          int by_tile)
{
    float *sc = be->scores + (int64_t) tid * QTILE * be->scores_cap;

    /* the common head sizes get their own copies of the loops */
    switch (be->m->cfg.head_dim) {
    case 16: attend_range(be, layer, sc, lo, hi, by_tile, 16); break;
    case 32: attend_range(be, layer, sc, lo, hi, by_tile, 32); break;
    case 64: attend_range(be, layer, sc, lo, hi, by_tile, 64); break;
    case 128: attend_range(be, layer, sc, lo, hi, by_tile, 128); break;
    default:
        attend_range(be, layer, sc, lo, hi, by_tile, be->m->cfg.head_dim);
    }
}


/*
 * The q/k/v rows [lo, hi) of every token, for whole heads: biases, RoPE,
 * then K and V into the sequences' blocks.  One thread owns these rows, so
 * it writes their K lines (dimension d of a block's 16 keys is one line)
 * and V bytes alone.
 */
static void
finish_qkv(cpu_backend *be, const nalar_layer *L, int l, int64_t t0,
           int64_t t1, int64_t lo, int64_t hi)
{
    const nalar_config *c = &be->m->cfg;
    const nalar_batch  *bt = be->batch;
    nalar_kv_pool      *kv = be->kv;
    int                 hd = c->head_dim;
    int64_t             qd = be->q_dim, kd = be->kv_dim;
    int64_t             ldqkv = qd + 2 * kd;

    for (int64_t t = t0; t < t1; t++) {
        float       *row = be->qkv + t * ldqkv;
        const float *cs = be->rope_cos + t * (hd / 2);
        const float *sn = be->rope_sin + t * (hd / 2);
        int32_t      p = bt->pos[t];
        int32_t      b = bt->seq[t]->blocks[p / NALAR_KV_BLOCK];
        int32_t      slot = p % NALAR_KV_BLOCK;
        int64_t      slab = nalar_kv_offset(kv, b, l, 0);

        for (int64_t h0 = lo; h0 < hi; h0 += hd) {
            float *x = row + h0;

            if (L->bq != NULL) {
                const float *bias = h0 < qd ? L->bq + h0
                                    : h0 < qd + kd ? L->bk + (h0 - qd)
                                    : L->bv + (h0 - qd - kd);

                for (int i = 0; i < hd; i++) x[i] += bias[i];
            }
            if (L->q_norm != NULL && h0 < qd + kd) {
                rmsnorm(x, x, h0 < qd ? L->q_norm : L->k_norm, hd,
                        c->norm_eps);
            }
            if (h0 < qd + kd) {
                rope_head(x, cs, sn, hd, c->rope_neox);
            }
            if (h0 >= qd + kd) {
                memcpy(kv->v + slab + (int64_t) slot * kd + (h0 - qd - kd),
                       x, (size_t) hd * sizeof(float));
            } else if (h0 >= qd) {
                /* K transposed within its slab (see attend_tile) */
                for (int d = 0; d < hd; d++) {
                    kv->k[slab + (h0 - qd + d) * NALAR_KV_BLOCK + slot] =
                        x[d];
                }
            }
        }
    }
}


/*
 * Five barriers per layer.  Each thread normalises every token into its
 * own xb (a few hundred floats per token: cheaper than a barrier), then
 * owns a share of the weight rows of the next product.  With 16-bit
 * activations it also rounds the tokens its products read to int16 codes
 * once (xb_codes) for all of them: Q, K and V; gate and up; the output.
 */
/* a pass run by one thread alone has no one to wait for */
static inline void
barrier(nalar_pool *pool, int nth)
{
    if (nth > 1) {
        nalar_pool_barrier(pool);
    }
}


/* embeddings and per-token RoPE angles of tokens [t0, t1) */
static void
embed(cpu_backend *be, int64_t t0, int64_t t1)
{
    const nalar_model *m = be->m;
    int                dim = m->cfg.dim, hd = m->cfg.head_dim;

    for (int64_t t = t0; t < t1; t++) {
        nalar_cpu_get_row(&m->tok_embd, be->batch->tokens[t], be->x + t * dim);
        if (m->cfg.embd_scale != 1.0f) {
            for (int i = 0; i < dim; i++) {
                be->x[t * dim + i] *= m->cfg.embd_scale;
            }
        }
        for (int i = 0; i < hd / 2; i++) {
            float theta = (float) be->batch->pos[t] * be->inv_freq[i];

            be->rope_cos[t * (hd / 2) + i] = cosf(theta);
            be->rope_sin[t * (hd / 2) + i] = sinf(theta);
        }
    }
}


/* hg = silu(hg) * hu (or gelu(hg) * hu) for tokens [t0, t1), rows
 * [lo, hi) */
static void
swiglu(cpu_backend *be, int64_t t0, int64_t t1, int64_t lo, int64_t hi)
{
    int64_t ffn = be->m->cfg.ffn_dim;

    for (int64_t t = t0; t < t1; t++) {
        float *g = be->hg + t * ffn;
        float *u = be->hu + t * ffn;

        if (be->m->cfg.ffn_gelu) {
            /* GELU, tanh form */
            for (int64_t i = lo; i < hi; i++) {
                float x = g[i];

                g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f
                                                * (x + 0.044715f * x * x
                                                       * x))) * u[i];
            }
            continue;
        }

        /* silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (the
         * branch-free exp, so the loop vectorises) */
        for (int64_t i = lo; i < hi; i++) {
            float e = nalar_exp_neg(-fabsf(g[i]));
            float sg = (g[i] >= 0 ? 1.0f : e) / (1.0f + e);

            g[i] = g[i] * sg * u[i];
        }
    }
}


/* x += rmsnorm(y) * w for tokens [t0, t1) (gemma2's post-norms) */
static void
post_norm_add(cpu_backend *be, const float *w, int64_t t0, int64_t t1)
{
    int   dim = be->m->cfg.dim;
    float eps = be->m->cfg.norm_eps;

    for (int64_t t = t0; t < t1; t++) {
        float *y = be->y + t * dim, *x = be->x + t * dim;

        rmsnorm(y, y, w, dim, eps);
        for (int i = 0; i < dim; i++) {
            x[i] += y[i];
        }
    }
}


/* logits [lo, hi) of rows [r0, r1) soft-capped (gemma2) */
static void
final_softcap(cpu_backend *be, int64_t r0, int64_t r1, int64_t lo, int64_t hi)
{
    float   cap = be->m->cfg.final_softcap;
    int64_t V = be->m->cfg.n_vocab;

    if (cap <= 0) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        float *z = be->logits + r * V;

        for (int64_t i = lo; i < hi; i++) {
            z[i] = cap * tanhf(z[i] / cap);
        }
    }
}


/*
 * With 16-bit activations: the int16 codes of n normalised tokens x (dim
 * apart), made once into thread tid's own buffer for the products that
 * read x; NULL (each product then rounds x itself, to the same codes)
 * when none of those takes them (i16 0).
 */
static const nalar_xq *
xb_codes(cpu_backend *be, int tid, const float *x, int n, int i16,
         nalar_xq *xq)
{
    int dim = be->m->cfg.dim;

    if (!i16 || n <= 0 || n > be->xq_cap) {
        return NULL;
    }
    if (be->act_i16 == NALAR_ACT_Q8) {
        memset(xq, 0, sizeof(*xq));
        nalar_quant_x8(x, n, dim, dim, be->xq + tid * be->xq_bytes, &xq->x8);
        return xq;
    }
    nalar_quant_xq(x, n, dim, dim, be->xq + tid * be->xq_bytes, xq);
    xq->x8.cols = 0;
    return xq;
}


static void
forward_worker(void *arg, int tid, int nth)
{
    cpu_backend        *be = arg;
    const nalar_model  *m = be->m;
    const nalar_config *c = &m->cfg;
    const nalar_batch  *bt = be->batch;
    nalar_pool         *pool = be->pool;
    int                 T = bt->n_tokens;
    int                 dim = c->dim, hd = c->head_dim;
    int                 ldqkv = be->q_dim + 2 * be->kv_dim;
    float              *xb = be->xb + (int64_t) tid * be->cap_tok * dim;
    int64_t             lo, hi, t0, t1;
    nalar_xq            codes;
    const nalar_xq     *xq;

    split(T, tid, nth, 1, &lo, &hi);
    embed(be, lo, hi);
    barrier(pool, nth);

    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        const cpu_layer   *W = &be->layers[l];

        /* xb = rmsnorm(x) * attn_norm */
        for (int t = 0; t < T; t++) {
            rmsnorm(xb + (int64_t) t * dim, be->x + (int64_t) t * dim,
                    L->attn_norm, dim, c->norm_eps);
        }

        /* q, k, v = xb Wq^T, xb Wk^T, xb Wv^T: one row space of
         * q_dim + 2 kv_dim rows, split over threads by whole heads.  A pass
         * of many sequences splits by token instead: a thread computes,
         * rotates and stores every head of its tokens, so the K stores
         * (each touches kv_dim cache lines) are shared out, and each
         * lands in the cache of the thread that then attends over it */
        if (!be->one_seq && T >= 4 * nth && be->max_run * 2 * nth <= T) {
            /* whole sequences per thread: no two threads store into one
             * block (no sequence is over half a thread's share) */
            split(T, tid, nth, 1, &t0, &t1);
            while (t0 > 0 && t0 < T && bt->seq[t0] == bt->seq[t0 - 1]) {
                t0++;
            }
            while (t1 > 0 && t1 < T && bt->seq[t1] == bt->seq[t1 - 1]) {
                t1++;
            }
            lo = 0;
            hi = ldqkv;
        } else {
            t0 = 0;
            t1 = T;
            split(ldqkv, tid, nth, hd, &lo, &hi);
        }
        if (t0 < t1) {
            int64_t      qd = be->q_dim, kd = be->kv_dim, a, b;
            const float *xt = xb + t0 * dim;
            float       *yt = be->qkv + t0 * ldqkv;
            int          n = (int) (t1 - t0);

            xq = xb_codes(be, tid, xt, n, nalar_cpu_mat_i16(&W->wq)
                                          || nalar_cpu_mat_i16(&W->wk)
                                          || nalar_cpu_mat_i16(&W->wv),
                          &codes);
            a = lo; b = hi < qd ? hi : qd;
            if (a < b) {
                nalar_cpu_matmul_xq(&W->wq, xt, xq, n, dim, yt, ldqkv, a, b,
                                    0);
            }
            a = lo > qd ? lo - qd : 0; b = hi - qd < kd ? hi - qd : kd;
            if (a < b) {
                nalar_cpu_matmul_xq(&W->wk, xt, xq, n, dim, yt + qd, ldqkv,
                                    a, b, 0);
            }
            a = lo > qd + kd ? lo - qd - kd : 0; b = hi - qd - kd;
            if (a < b) {
                nalar_cpu_matmul_xq(&W->wv, xt, xq, n, dim, yt + qd + kd,
                                    ldqkv, a, b, 0);
            }
        }
        finish_qkv(be, L, l, t0, t1, lo, hi);
        barrier(pool, nth);

        split((int64_t) be->n_tiles * c->n_kv_heads * be->head_groups, tid,
              nth, 1, &lo, &hi);
        attention(be, l, tid, lo, hi, 0);
        barrier(pool, nth);

        /* x += att Wo^T (gemma2: x += rmsnorm(att Wo^T) * post norm) */
        split(dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            nalar_cpu_matmul(&W->wo, be->att, T, be->q_dim,
                             L->post_attn_norm ? be->y : be->x, dim, lo,
                             hi, L->post_attn_norm == NULL);
        }
        barrier(pool, nth);
        if (L->post_attn_norm != NULL) {
            split(T, tid, nth, 1, &t0, &t1);
            post_norm_add(be, L->post_attn_norm, t0, t1);
            barrier(pool, nth);
        }

        for (int t = 0; t < T; t++) {
            rmsnorm(xb + (int64_t) t * dim, be->x + (int64_t) t * dim,
                    L->ffn_norm, dim, c->norm_eps);
        }

        /* h = silu(xb Wg^T) * (xb Wu^T); each thread owns the same rows of
         * both products, so it can combine them without a barrier */
        split(c->ffn_dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            xq = xb_codes(be, tid, xb, T, nalar_cpu_mat_i16(&W->w_gate)
                                          || nalar_cpu_mat_i16(&W->w_up),
                          &codes);
            nalar_cpu_matmul_xq(&W->w_gate, xb, xq, T, dim, be->hg,
                                c->ffn_dim, lo, hi, 0);
            nalar_cpu_matmul_xq(&W->w_up, xb, xq, T, dim, be->hu,
                                c->ffn_dim, lo, hi, 0);
            swiglu(be, 0, T, lo, hi);
        }
        barrier(pool, nth);

        /* x += h Wd^T (gemma2: post-normed, as above) */
        split(dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            nalar_cpu_matmul(&W->w_down, be->hg, T, c->ffn_dim,
                             L->post_ffn_norm ? be->y : be->x, dim, lo, hi,
                             L->post_ffn_norm == NULL);
        }
        barrier(pool, nth);
        if (L->post_ffn_norm != NULL) {
            split(T, tid, nth, 1, &t0, &t1);
            post_norm_add(be, L->post_ffn_norm, t0, t1);
            barrier(pool, nth);
        }
    }

    /* final norm of the rows that want logits, then the output head */
    for (int32_t i = 0; i < bt->n_logits; i++) {
        int32_t t = be->logit_rows[i];

        rmsnorm(xb + (int64_t) i * dim, be->x + (int64_t) t * dim,
                m->out_norm, dim, c->norm_eps);
    }
    split(c->n_vocab, tid, nth, 16, &lo, &hi);
    if (lo < hi) {
        xq = xb_codes(be, tid, xb, bt->n_logits,
                      nalar_cpu_mat_i16(&be->output), &codes);
        nalar_cpu_matmul_xq(&be->output, xb, xq, bt->n_logits, dim,
                            be->logits, c->n_vocab, lo, hi, 0);
        final_softcap(be, 0, bt->n_logits, lo, hi);
    }
}


/*
 * The pass split by token instead: thread tid runs every layer over its
 * own tokens [tok_lo[tid], tok_lo[tid + 1]) -- whole weight matrices, its
 * own rows of x, qkv, att and h, the attention tiles of its tokens (which
 * never straddle two threads' tokens) and the logits of its rows.  The
 * threads meet once per layer, after the K/V stores, since a later token
 * attends over earlier ones another thread stored: one barrier per layer
 * instead of five, and no activation row crosses between cores.  It pays
 * for long passes where a cache line's round trip between cores is
 * costly, since the row split exchanges every activation row at every
 * phase.  Short passes lose, since each thread reads every weight and a
 * pass's cost grows slowly with its tokens, and so may any pass where the
 * cores are close: choose_way measures both.
 */
static void
forward_tokens(void *arg, int tid, int nth)
{
    cpu_backend        *be = arg;
    const nalar_model  *m = be->m;
    const nalar_config *c = &m->cfg;
    int                 dim = c->dim, ffn = c->ffn_dim;
    int64_t             qd = be->q_dim, kd = be->kv_dim, ldqkv = qd + 2 * kd;
    int64_t             t0 = be->tok_lo[tid], t1 = be->tok_lo[tid + 1];
    int64_t             l0 = be->logit_lo[tid], l1 = be->logit_lo[tid + 1];
    int                 n = (int) (t1 - t0);
    float              *xb = be->xb + (int64_t) tid * be->cap_tok * dim;
    nalar_xq            codes;
    const nalar_xq     *xq;

    embed(be, t0, t1);
    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        const cpu_layer   *W = &be->layers[l];
        float             *qkv = be->qkv + t0 * ldqkv;

        for (int64_t t = t0; t < t1; t++) {
            rmsnorm(xb + (t - t0) * dim, be->x + t * dim, L->attn_norm, dim,
                    c->norm_eps);
        }
        if (n > 0) {
            xq = xb_codes(be, tid, xb, n, nalar_cpu_mat_i16(&W->wq)
                                          || nalar_cpu_mat_i16(&W->wk)
                                          || nalar_cpu_mat_i16(&W->wv),
                          &codes);
            nalar_cpu_matmul_xq(&W->wq, xb, xq, n, dim, qkv, ldqkv, 0, qd,
                                0);
            nalar_cpu_matmul_xq(&W->wk, xb, xq, n, dim, qkv + qd, ldqkv, 0,
                                kd, 0);
            nalar_cpu_matmul_xq(&W->wv, xb, xq, n, dim, qkv + qd + kd,
                                ldqkv, 0, kd, 0);
            finish_qkv(be, L, l, t0, t1, 0, ldqkv);
        }
        /* every token's K and V of this layer are stored */
        barrier(be->pool, nth);

        attention(be, l, tid, be->tile_lo[tid], be->tile_lo[tid + 1], 1);
        if (n == 0) {
            continue;
        }
        if (L->post_attn_norm != NULL) {
            nalar_cpu_matmul(&W->wo, be->att + t0 * qd, n, (int) qd,
                             be->y + t0 * dim, dim, 0, dim, 0);
            post_norm_add(be, L->post_attn_norm, t0, t1);
        } else {
            nalar_cpu_matmul(&W->wo, be->att + t0 * qd, n, (int) qd,
                             be->x + t0 * dim, dim, 0, dim, 1);
        }
        for (int64_t t = t0; t < t1; t++) {
            rmsnorm(xb + (t - t0) * dim, be->x + t * dim, L->ffn_norm, dim,
                    c->norm_eps);
        }
        xq = xb_codes(be, tid, xb, n, nalar_cpu_mat_i16(&W->w_gate)
                                      || nalar_cpu_mat_i16(&W->w_up),
                      &codes);
        nalar_cpu_matmul_xq(&W->w_gate, xb, xq, n, dim, be->hg + t0 * ffn,
                            ffn, 0, ffn, 0);
        nalar_cpu_matmul_xq(&W->w_up, xb, xq, n, dim, be->hu + t0 * ffn,
                            ffn, 0, ffn, 0);
        swiglu(be, t0, t1, 0, ffn);
        if (L->post_ffn_norm != NULL) {
            nalar_cpu_matmul(&W->w_down, be->hg + t0 * ffn, n, ffn,
                             be->y + t0 * dim, dim, 0, dim, 0);
            post_norm_add(be, L->post_ffn_norm, t0, t1);
        } else {
            nalar_cpu_matmul(&W->w_down, be->hg + t0 * ffn, n, ffn,
                             be->x + t0 * dim, dim, 0, dim, 1);
        }
    }
    for (int64_t i = l0; i < l1; i++) {
        rmsnorm(xb + (i - l0) * dim, be->x + (int64_t) be->logit_rows[i] * dim,
                m->out_norm, dim, c->norm_eps);
    }
    if (l1 > l0) {
        xq = xb_codes(be, tid, xb, (int) (l1 - l0),
                      nalar_cpu_mat_i16(&be->output), &codes);
        nalar_cpu_matmul_xq(&be->output, xb, xq, (int) (l1 - l0), dim,
                            be->logits + l0 * c->n_vocab, c->n_vocab, 0,
                            c->n_vocab, 0);
        final_softcap(be, l0, l1, 0, c->n_vocab);
    }
}


/* --- backend plumbing --- */

/* Query rows per attention tile (see the attention kernels' comment). */
static int
tile_rows_max(const nalar_config *c)
{
    return c->head_dim <= 32 ? QTILE : QTILE / 2;
}


static int
grow(cpu_backend *be, int32_t n_tok, int32_t max_pos, nalar_err *err)
{
    const nalar_config *c = &be->m->cfg;
    int                 nth = nalar_pool_size(be->pool);

    if (n_tok > be->cap_tok) {
        int32_t cap = be->cap_tok ? be->cap_tok : 16;
        int     ok = 1;

        while (cap < n_tok) {
            cap *= 2;
        }
        /* scratch: nothing in it outlives a pass, so no copy */
#define GROW(p, n) do {                                                     \
            void *q_ = nalar_alloc_lines((size_t) (n) * sizeof(*(p)));       \
            if (q_ == NULL) ok = 0; else { free(p); p = q_; }                \
        } while (0)
        GROW(be->x, (int64_t) cap * c->dim);
        GROW(be->xb, (int64_t) nth * cap * c->dim);
        GROW(be->qkv, (int64_t) cap * (be->q_dim + 2 * be->kv_dim));
        GROW(be->att, (int64_t) cap * be->q_dim);
        GROW(be->hg, (int64_t) cap * c->ffn_dim);
        GROW(be->hu, (int64_t) cap * c->ffn_dim);
        GROW(be->y, (int64_t) cap * c->dim);
        GROW(be->rope_cos, (int64_t) cap * (c->head_dim / 2));
        GROW(be->rope_sin, (int64_t) cap * (c->head_dim / 2));
        GROW(be->logit_rows, cap);
        GROW(be->tiles, cap);
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory for %d "
                              "tokens", cap);
        }
        be->cap_tok = cap;
    }
    if (be->act_i16 && be->xq_cap < be->cap_tok) {
        int64_t bytes = be->act_i16 == NALAR_ACT_Q8
                        ? nalar_quant_x8_bytes(be->cap_tok, c->dim)
                        : nalar_quant_xq_bytes(be->cap_tok, c->dim);
        int     ok = 1;

        GROW(be->xq, (int64_t) nth * bytes);
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory for %d "
                              "tokens' int16 codes", be->cap_tok);
        }
        be->xq_bytes = bytes;
        be->xq_cap = be->cap_tok;
    }
    if (max_pos + 1 > be->scores_cap) {
        int32_t cap = be->scores_cap ? be->scores_cap : 256;
        int     ok = 1;

        while (cap < max_pos + 1) {
            cap *= 2;
        }
        GROW(be->scores, (int64_t) cap * nth * QTILE);
#undef GROW
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory");
        }
        be->scores_cap = cap;
    }
    return 0;
}


/* the class of a pass of n tokens: 1 .. 16 tokens one each, then one per
 * power of two */
static int
way_class(int32_t n)
{
    int c = 16;

    if (n <= 16) {
        return n - 1;
    }
    for (int32_t top = 32; top < n && c < WAY_CLASSES - 1; top *= 2) {
        c++;
    }
    return c;
}


/*
 * Which way a pass runs.  Every pass may run on the pool split by weight
 * rows; a pass of two tokens or more may also split by token
 * (forward_tokens); a pass of MODE_TOKENS or fewer may also run on the
 * calling thread alone, which wins where waking the pool and its
 * barriers cost more than the pass (a draft's small passes) and where a
 * worker shares its core with another program, so that the barriers wait
 * for it to be scheduled again (a busy machine).
 * Each class of pass sizes measures its ways -- in turn, 5 passes each,
 * the first (cold) not counted -- then runs the fastest, and probes each
 * other way in turn one pass in 64 (a way that measured 25% slower than
 * the fastest, one in eight of its turns), so that a change of load or of
 * where the vCPUs sit is noticed.  A pooled pass whose workers were
 * asleep (after passes run alone) wakes them before it is timed
 * (cpu_forward), so a probe measures the pool, not its wake-up.  Which
 * thread computes a row changes no bit of it, nor do the tiles a split by
 * token forms.
 */
static int
choose_way(cpu_backend *be, int32_t n_tokens, int *alt)
{
    int      c = way_class(n_tokens), cand[N_WAYS], nc = 0, least, best;
    int      other[N_WAYS], no = 0, o;
    unsigned k, probe;

    if (nalar_pool_size(be->pool) == 1) {
        *alt = 0;
        return WAY_ROWS;
    }
    cand[nc++] = WAY_ROWS;
    if (n_tokens >= 2) {
        cand[nc++] = WAY_TOKENS;
    }
    if (n_tokens <= MODE_TOKENS) {
        cand[nc++] = WAY_SOLO;
    }
    if (nc == 1) {
        *alt = 0;
        return WAY_ROWS;
    }
    *alt = 1;
    k = be->way_passes[c]++;
    least = cand[0];
    best = cand[0];
    for (int i = 1; i < nc; i++) {
        if (be->way_n[c][cand[i]] < be->way_n[c][least]) {
            least = cand[i];
        }
        if (be->way_us[c][cand[i]] < be->way_us[c][best]) {
            best = cand[i];
        }
    }
    if (be->way_n[c][least] < 5) {
        return least;
    }
    if (k % 64 != 63) {
        return best;
    }
    for (int i = 0; i < nc; i++) {
        if (cand[i] != best) {
            other[no++] = cand[i];
        }
    }
    probe = be->way_probes[c]++;
    o = other[probe % (unsigned) no];
    if (be->way_us[c][o] > 1.25 * be->way_us[c][best]
        && probe / (unsigned) no % 8 != 7)
    {
        return best;
    }
    return o;
}


/* an empty pooled run: wakes sleeping workers before a timed pass */
static void
wake_only(void *arg, int tid, int n)
{
    (void) arg;
    (void) tid;
    (void) n;
}


/* the measured time of a pass run `way` */
static void
learn_way(cpu_backend *be, int32_t n_tokens, int way, double us)
{
    int     c = way_class(n_tokens);
    double *est = &be->way_us[c][way];
    int    *n = &be->way_n[c][way];

    us /= n_tokens;
    if (*n == 0) {
        /* the first pass each way warms caches: not counted */
    } else if (*n < 5) {
        *est = (*est * (*n - 1) + us) / *n;
    } else {
        /* a moving average; a pass stalled by the OS counts at most
         * twice the estimate */
        *est = 0.9 * *est + 0.1 * (us < 2 * *est ? us : 2 * *est);
    }
    (*n)++;
}


uint64_t
nalar_cpu_backend_test_solo_passes(nalar_backend *b)
{
    return ((cpu_backend *) b->impl)->solo_passes;
}


void
nalar_cpu_backend_test_stall(nalar_backend *b, int us)
{
    nalar_pool_test_stall(((cpu_backend *) b->impl)->pool, us);
}


static int
cpu_forward(nalar_backend *b, nalar_kv_pool *kv, const nalar_batch *batch,
            float *logits, nalar_err *err)
{
    cpu_backend *be = b->impl;
    int32_t      max_pos = 0, n_logits = 0;
    int          way, timed, nth;
    double       t0;

    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const nalar_seq_kv *s = batch->seq[t];

        if (batch->pos[t] < 0
            || batch->pos[t] >= s->n_blocks * NALAR_KV_BLOCK
            || batch->tokens[t] < 0
            || batch->tokens[t] >= be->m->cfg.n_vocab)
        {
            return nalar_fail(err, "cpu backend: token %d (id %d, pos %d) "
                              "outside its sequence's reserved KV or the "
                              "vocabulary", t, batch->tokens[t],
                              batch->pos[t]);
        }
        max_pos = batch->pos[t] > max_pos ? batch->pos[t] : max_pos;
    }
    if (grow(be, batch->n_tokens, max_pos, err) != 0) {
        return -1;
    }
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        if (batch->want_logits[t]) {
            be->logit_rows[n_logits++] = t;
        }
    }
    if (n_logits != batch->n_logits) {
        return nalar_fail(err, "cpu backend: batch says %d logits but marks "
                          "%d", batch->n_logits, n_logits);
    }
    if (batch->n_tokens == 0) {
        return 0;
    }
    way = choose_way(be, batch->n_tokens, &timed);
    nth = nalar_pool_size(be->pool);
    /* thread i's tokens start at tok_lo[i]: split by token, even shares;
     * otherwise thread 0 "owns" them all, so the tiles below span any
     * tokens */
    for (int i = 0; i <= nth; i++) {
        int64_t lo = i == 0 ? 0 : batch->n_tokens, hi;

        if (way == WAY_TOKENS && i < nth) {
            split(batch->n_tokens, i, nth, 1, &lo, &hi);
        }
        be->tok_lo[i] = (int32_t) lo;
    }
    /* attention's token tiles: runs of one sequence's consecutive
     * positions, tile_tokens at most (tile_rows_max rows with the KV
     * group's heads), within one thread's tokens; each thread's first
     * tile and logit row */
    {
        int32_t t = 0, owner = 0;

        be->n_tiles = 0;
        while (t < batch->n_tokens) {
            int32_t n = 1, end;

            while (be->tok_lo[owner + 1] <= t) {
                be->tile_lo[++owner] = be->n_tiles;
            }
            end = be->tok_lo[owner + 1];
            while (n < be->tile_tokens && t + n < end
                   && batch->seq[t + n] == batch->seq[t]
                   && batch->pos[t + n] == batch->pos[t] + n)
            {
                n++;
            }
            be->tiles[be->n_tiles].t0 = t;
            be->tiles[be->n_tiles].n = n;
            be->n_tiles++;
            t += n;
        }
        be->tile_lo[0] = 0;
        while (owner < nth) {
            be->tile_lo[++owner] = be->n_tiles;
        }
        for (int i = 0, li = 0; i <= nth; i++) {
            while (li < n_logits && be->logit_rows[li] < be->tok_lo[i]) {
                li++;
            }
            be->logit_lo[i] = li;
        }
        be->one_seq = 1;
        be->max_run = 1;
        for (int32_t run = 1, i = 1; i < batch->n_tokens; i++) {
            run = batch->seq[i] == batch->seq[i - 1] ? run + 1 : 1;
            be->max_run = run > be->max_run ? run : be->max_run;
            be->one_seq &= batch->seq[i] == batch->seq[0];
        }
    }
    be->kv = kv;
    be->batch = batch;
    be->logits = logits;
    if (timed && way != WAY_SOLO && nalar_pool_sleeping(be->pool)) {
        nalar_pool_run(be->pool, wake_only, NULL);
    }
    t0 = nalar_now_s();
    if (way == WAY_SOLO) {
        be->solo_passes++;
        forward_worker(be, 0, 1);
    } else {
        nalar_pool_run(be->pool, way == WAY_TOKENS ? forward_tokens
                                                   : forward_worker, be);
    }
    if (timed) {
        learn_way(be, batch->n_tokens, way, (nalar_now_s() - t0) * 1e6);
    }
    return 0;
}


static void
cpu_kv_copy(void *ctx, int32_t dst, int32_t src)
{
    nalar_kv_pool *p = ctx;
    size_t n = (size_t) p->n_layers * NALAR_KV_BLOCK * p->kv_dim;

    memcpy(p->k + nalar_kv_offset(p, dst, 0, 0),
           p->k + nalar_kv_offset(p, src, 0, 0), n * sizeof(float));
    memcpy(p->v + nalar_kv_offset(p, dst, 0, 0),
           p->v + nalar_kv_offset(p, src, 0, 0), n * sizeof(float));
}


static float *
kv_map(size_t n)
{
    void *p = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    return p == MAP_FAILED ? NULL : p;
}


static void
kv_unmap(float *p, size_t n)
{
    if (p != NULL) {
        munmap(p, n * sizeof(float));
    }
}


static size_t
kv_floats(const nalar_kv_pool *p)
{
    return (size_t) p->n_blocks * p->n_layers * NALAR_KV_BLOCK * p->kv_dim;
}


static int
cpu_kv_alloc(nalar_backend *b, nalar_kv_pool *p, nalar_err *err)
{
    size_t n = kv_floats(p);

    if (b->kv_type != GGML_F32) {
        return nalar_fail(err, "cpu backend: the KV cache is F32 here (a "
                          "BF16 KV cache needs a GPU backend)");
    }

    /* anonymous memory: page-aligned (see nalar_alloc_lines), zero, and
     * committed only as blocks are first written */
    p->k = kv_map(n);
    p->v = kv_map(n);
    if (p->k == NULL || p->v == NULL) {
        kv_unmap(p->k, n);
        kv_unmap(p->v, n);
        p->k = p->v = NULL;
        return nalar_fail(err, "cpu backend: cannot allocate %zu MiB of KV",
                          2 * n * sizeof(float) >> 20);
    }
    p->copy = cpu_kv_copy;
    p->copy_ctx = p;
    return 0;
}


static void
cpu_kv_free(nalar_backend *b, nalar_kv_pool *p)
{
    kv_unmap(p->k, kv_floats(p));
    kv_unmap(p->v, kv_floats(p));
    p->k = p->v = NULL;
}


static void
cpu_destroy(nalar_backend *b)
{
    cpu_backend *be;

    if (b == NULL) {
        return;
    }
    be = b->impl;
    if (be != NULL) {
        if (be->pool != NULL && be->owns_pool) {
            nalar_pool_destroy(be->pool);
        }
        free(be->x);
        free(be->xb);
        free(be->xq);
        free(be->qkv);
        free(be->att);
        free(be->hg);
        free(be->hu);
        free(be->y);
        free(be->rope_cos);
        free(be->rope_sin);
        free(be->inv_freq);
        free(be->scores);
        free(be->logit_rows);
        free(be->tiles);
        free(be->tok_lo);
        free(be->tile_lo);
        free(be->logit_lo);
        if (be->layers != NULL) {
            for (int l = 0; l < be->m->cfg.n_layers; l++) {
                cpu_layer *W = &be->layers[l];

                nalar_cpu_mat_free(&W->wq);
                nalar_cpu_mat_free(&W->wk);
                nalar_cpu_mat_free(&W->wv);
                nalar_cpu_mat_free(&W->wo);
                nalar_cpu_mat_free(&W->w_gate);
                nalar_cpu_mat_free(&W->w_up);
                nalar_cpu_mat_free(&W->w_down);
            }
        }
        free(be->layers);
        nalar_cpu_mat_free(&be->output);
        free(be);
    }
    free(b);
}


static nalar_backend *cpu_create(nalar_model *m, int n_threads,
                                 nalar_pool *shared, nalar_err *err);


nalar_backend *
nalar_cpu_backend_create(nalar_model *m, int n_threads, nalar_err *err)
{
    return cpu_create(m, n_threads, NULL, err);
}


void
nalar_cpu_backend_act_i16(nalar_backend *b, int on)
{
    cpu_backend *be = b->impl;

    if (be->act_i16 != on) {
        /* the codes' buffers are sized for one mode: made anew */
        be->xq_cap = 0;
    }
    for (int l = 0; l < be->m->cfg.n_layers; l++) {
        cpu_layer *W = &be->layers[l];

        W->wq.act_i16 = W->wk.act_i16 = W->wv.act_i16 = on;
        W->wo.act_i16 = W->w_gate.act_i16 = W->w_up.act_i16 = on;
        W->w_down.act_i16 = on;
    }
    be->output.act_i16 = on;
    be->act_i16 = on;
}


nalar_backend *
nalar_cpu_backend_create_sharing(nalar_model *m, nalar_backend *other,
                                 nalar_err *err)
{
    if (strcmp(other->name, "cpu") != 0) {
        nalar_fail(err, "cpu backend: cannot share the workers of backend "
                   "'%s'", other->name);
        return NULL;
    }
    return cpu_create(m, 0, ((cpu_backend *) other->impl)->pool, err);
}


/* The pass into scratch, then each logit row's argmax.  The engine takes
 * this path for its greedy steps on any backend that has it: on a GPU it
 * saves moving the logits; here it is the same work as the sampler's
 * greedy pick, and it keeps the engine's path tested where no GPU is. */
static int
cpu_forward_argmax(nalar_backend *b, nalar_kv_pool *kv,
                   const nalar_batch *batch, int32_t *ids, float *scratch,
                   nalar_err *err)
{
    cpu_backend *be = b->impl;
    int32_t      V = be->m->cfg.n_vocab;

    if (scratch == NULL) {
        return nalar_fail(err, "cpu backend: forward_argmax needs room for "
                          "the logits");
    }
    if (cpu_forward(b, kv, batch, scratch, err) != 0) {
        return -1;
    }
    for (int32_t i = 0; i < batch->n_logits; i++) {
        ids[i] = nalar_argmax(scratch + (size_t) i * V, V);
    }
    return 0;
}


static nalar_backend *
cpu_create(nalar_model *m, int n_threads, nalar_pool *shared, nalar_err *err)
{
    nalar_backend      *b;
    cpu_backend        *be;
    const nalar_config *c = &m->cfg;
    int                 narrow;

    b = calloc(1, sizeof(*b));
    be = calloc(1, sizeof(*be));
    if (b == NULL || be == NULL) {
        free(b);
        free(be);
        nalar_fail(err, "cpu backend: out of memory");
        return NULL;
    }
    b->name = "cpu";
    b->device = -1;
    b->model = m;
    b->kv_alloc = cpu_kv_alloc;
    b->kv_free = cpu_kv_free;
    b->forward = cpu_forward;
    b->forward_argmax = cpu_forward_argmax;
    b->destroy = cpu_destroy;
    b->impl = be;
    be->m = m;
    be->q_dim = c->n_heads * c->head_dim;
    be->kv_dim = c->n_kv_heads * c->head_dim;
    {
        int G = c->n_heads / c->n_kv_heads, rows = tile_rows_max(c);

        be->tile_heads = G < rows ? G : rows;
        be->tile_tokens = rows / be->tile_heads;
        be->head_groups = (G + be->tile_heads - 1) / be->tile_heads;
    }
    be->inv_freq = malloc((size_t) (c->head_dim / 2) * sizeof(float));
    be->pool = shared != NULL ? shared : nalar_pool_create(n_threads);
    be->owns_pool = shared == NULL;
    if (be->inv_freq == NULL || be->pool == NULL) {
        cpu_destroy(b);
        nalar_fail(err, "cpu backend: cannot start %d worker threads",
                   n_threads);
        return NULL;
    }
    {
        size_t n = (size_t) nalar_pool_size(be->pool) + 1;

        be->tok_lo = malloc(n * sizeof(int32_t));
        be->tile_lo = malloc(n * sizeof(int32_t));
        be->logit_lo = malloc(n * sizeof(int32_t));
        if (be->tok_lo == NULL || be->tile_lo == NULL || be->logit_lo == NULL)
        {
            cpu_destroy(b);
            nalar_fail(err, "cpu backend: out of memory");
            return NULL;
        }
    }
    for (int i = 0; i < c->head_dim / 2; i++) {
        be->inv_freq[i] = powf(c->rope_base,
                               -2.0f * (float) i / (float) c->head_dim);
        if (c->rope_scale != 1.0f) {
            be->inv_freq[i] *= c->rope_scale;
        }
        if (m->rope_freqs != NULL) {
            be->inv_freq[i] /= m->rope_freqs[i];
        }
    }
    /* a draft (the backend that borrows the target's pool) holds its
     * weights narrowed (nalar_cpu_mat_init): it only proposes, so a
     * rounded weight costs at most a rejected proposal, never a token,
     * and its passes are bound by reading weights that the target's pass
     * between two of them has pushed out of L2 and by the products'
     * instructions, both of which narrower weights cut */
    narrow = shared != NULL;
    be->layers = calloc((size_t) c->n_layers, sizeof(cpu_layer));
    if (be->layers == NULL) {
        cpu_destroy(b);
        nalar_fail(err, "cpu backend: out of memory");
        return NULL;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        cpu_layer         *W = &be->layers[l];

        if (nalar_cpu_mat_init(&W->wq, &L->wq, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wk, &L->wk, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wv, &L->wv, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wo, &L->wo, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_gate, &L->w_gate, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_up, &L->w_up, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_down, &L->w_down, narrow, err) != 0)
        {
            cpu_destroy(b);
            return NULL;
        }
    }
    if (nalar_cpu_mat_init(&be->output, &m->output, narrow, err) != 0) {
        cpu_destroy(b);
        return NULL;
    }
    nalar_cpu_drop_mapped(m->gguf);
    return b;
}
