/*
 * The CPU backend's attention over the paged KV pool: a layer's queries
 * in tiles that share keys and values, scores, softmax and the weighted
 * sum of values, in a fixed order of operations (see the tiles below).
 */
#include <math.h>
#include <string.h>

#include "cpu_backend_impl.h"
#include "cpu_kv16.h"
#include "exp_neg.h"

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
 * horizontal sum.  V is stored by row.  Both in the pool's element type:
 * F32, or F16 / BF16 widened exactly as they are loaded (cpu_kv16.h), so
 * the arithmetic below is F32 whatever the type.
 *
 * Each row's arithmetic is the same whatever else shares its tile, so
 * results do not depend on the batch: a score is four accumulators over
 * d mod 4, combined as (0 + 1) + (2 + 3), in increasing d; an output (a
 * head of up to 64) is two accumulators over even and odd positions, in
 * increasing position, added and scaled by 1 / sum.  Q is a constant in
 * each inlined copy, so the accumulators stay in registers.
 *
 * A tile's cost follows the keys and values it reads far more than its
 * rows (a 2-row tile costs about as much as a 4-row one), so a
 * verification's tokens share as few tiles as the registers allow: up to
 * 8 rows where head_dim <= 32 (the demo target: 4 tokens of a KV group's
 * 2 heads; a 3-token verification then reads each head's keys once, not
 * twice), 4 rows for larger heads, whose rows need twice the registers
 * (tile_rows_max).
 */

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
            const nalar_seq_kv *s, int layer, int64_t col, int hd, int Q,
            int E)
{
    float scale = r->scale;

    for (int32_t j0 = 0; j0 < r->n_max; j0 += NALAR_KV_BLOCK) {
        int32_t      b = s->blocks[j0 / NALAR_KV_BLOCK];
        /* the block's keys of this head, from element kt of kv->k */
        int64_t      kt = nalar_kv_offset(kv, b, layer, 0)
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
                    __m512 k16 = kv_load16(kv->k, kt + (d + u)
                                                       * NALAR_KV_BLOCK, E);

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
                        int64_t k = kt + (d + u) * NALAR_KV_BLOCK;
                        __m256  qv = _mm256_set1_ps(r->q[i][d + u]);

                        acc[0][u] = _mm256_fmadd_ps(
                            qv, kv_load8(kv->k, k, E), acc[0][u]);
                        acc[1][u] = _mm256_fmadd_ps(
                            qv, kv_load8(kv->k, k + 8, E), acc[1][u]);
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
                                        kv_get(kv->k, kt + (d + u)
                                                      * NALAR_KV_BLOCK + j,
                                               E),
                                        a[u]);
                        }
                    }
                    for (; d < hd; d++) {
                        a[0] = fmaf(r->q[i][d],
                                    kv_get(kv->k, kt + d * NALAR_KV_BLOCK
                                                  + j, E),
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
tile_value(const tile_rows *r, __m512 (*acc)[2][4], const void *vbase,
           int64_t vj, int32_t j, int u, int nv, int Q, int all, int E)
{
    __m512 v[4];

    for (int c = 0; c < nv; c++) {
        v[c] = kv_load16(vbase, vj + 16 * c, E);
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


#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* the output rows with AVX2 (hd a multiple of 8) */
static ALWAYS_INLINE void
tile_values_avx2(const tile_rows *r, const float *inv,
                 const nalar_kv_pool *kv, const nalar_seq_kv *s, int layer,
                 int64_t col, int hd, int Q, int E)
{
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
                int64_t      v = nalar_kv_offset(kv, b, layer, 0) + col + c0;
                int32_t      jn = r->n[i] - j0 < NALAR_KV_BLOCK
                                  ? r->n[i] - j0 : NALAR_KV_BLOCK;

                const float *sc = r->sc[i] + j0;
                int32_t      j = 0;

                /* j0 is even: j's parity is its position's */
                for (; j + 2 <= jn; j += 2) {
                    __m256  w0 = _mm256_set1_ps(sc[j]);
                    __m256  w1 = _mm256_set1_ps(sc[j + 1]);
                    int64_t v1 = v + kv->kv_dim;

                    for (int c = 0; c < nv; c++) {
                        acc[0][c] = _mm256_fmadd_ps(
                            w0, kv_load8(kv->v, v + 8 * c, E), acc[0][c]);
                        acc[1][c] = _mm256_fmadd_ps(
                            w1, kv_load8(kv->v, v1 + 8 * c, E), acc[1][c]);
                    }
                    v += 2 * kv->kv_dim;
                }
                if (j < jn) {
                    __m256 w0 = _mm256_set1_ps(sc[j]);

                    for (int c = 0; c < nv; c++) {
                        acc[0][c] = _mm256_fmadd_ps(
                            w0, kv_load8(kv->v, v + 8 * c, E), acc[0][c]);
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
}
#endif


/* the output rows, one scalar at a time (any head size) */
static ALWAYS_INLINE void
tile_values_scalar(const tile_rows *r, const float *inv,
                   const nalar_kv_pool *kv, const nalar_seq_kv *s, int layer,
                   int64_t col, int hd, int Q, int E)
{
    for (int i = 0; i < Q; i++) {
        for (int d = 0; d < hd; d++) {
            float a[2] = { 0, 0 };

            for (int32_t j = 0; j < r->n[i]; j++) {
                int32_t b = s->blocks[j / NALAR_KV_BLOCK];

                a[j & 1] = fmaf(r->sc[i][j],
                                kv_get(kv->v,
                                       nalar_kv_offset(kv, b, layer,
                                                       j % NALAR_KV_BLOCK)
                                       + col + d, E), a[j & 1]);
            }
            r->out[i][d] = (a[0] + a[1]) * inv[i];
        }
    }
}


static ALWAYS_INLINE void
tile_values(const tile_rows *r, const float *inv, const nalar_kv_pool *kv,
            const nalar_seq_kv *s, int layer, int64_t col, int hd, int Q,
            int E)
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
            int64_t      vb = nalar_kv_offset(kv, b, layer, 0) + col;
            int32_t      jn = r->n_max - j0 < NALAR_KV_BLOCK ? r->n_max - j0
                                                             : NALAR_KV_BLOCK;
            int32_t      ja = r->n_min - j0 < jn ? r->n_min - j0 : jn;
            int32_t      j = 0;

            /* positions every row attends to, two at a time (even, odd) */
            for (; j + 2 <= ja; j += 2) {
                tile_value(r, acc, kv->v, vb + (int64_t) j * kv->kv_dim,
                           j0 + j, 0, nv, Q, 1, E);
                tile_value(r, acc, kv->v,
                           vb + (int64_t) (j + 1) * kv->kv_dim, j0 + j + 1,
                           1, nv, Q, 1, E);
            }
            /* then the rest, each row up to its own position */
            for (; j < jn; j++) {
                tile_value(r, acc, kv->v, vb + (int64_t) j * kv->kv_dim,
                           j0 + j, j & 1, nv, Q, 0, E);
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
                int32_t b = s->blocks[j0 / NALAR_KV_BLOCK];
                int64_t v = nalar_kv_offset(kv, b, layer, 0) + col;
                int32_t jn = r->n[i] - j0 < NALAR_KV_BLOCK
                             ? r->n[i] - j0 : NALAR_KV_BLOCK;

                for (int32_t j = 0; j < jn; j++) {
                    __m512 w = _mm512_set1_ps(r->sc[i][j0 + j]);

                    for (int c = 0; c < nv; c++) {
                        acc[c] = _mm512_fmadd_ps(
                            w, kv_load16(kv->v, v + 16 * c, E), acc[c]);
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
        tile_values_avx2(r, inv, kv, s, layer, col, hd, Q, E);
        return;
    }
#endif
    tile_values_scalar(r, inv, kv, s, layer, col, hd, Q, E);
}


/* The tile `item`: (KV head, token tile, group of its heads) when the
 * pass is one sequence's (a verification, a prefill chunk), so a thread's
 * share reads few KV heads' keys and values, once from memory, then from
 * its cache; (token tile, KV head, group) otherwise, so a thread's share
 * is whole sequences, whose blocks no other thread reads */
static ALWAYS_INLINE void
attend_tile(cpu_backend *be, int layer, float *sc0, int64_t item, int hd,
            int E)
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
    case 1: tile_scores(&r, be->kv, s, layer, col, hd, 1, E); break;
    case 2: tile_scores(&r, be->kv, s, layer, col, hd, 2, E); break;
    case 3: tile_scores(&r, be->kv, s, layer, col, hd, 3, E); break;
    case 4: tile_scores(&r, be->kv, s, layer, col, hd, 4, E); break;
    case 5: tile_scores(&r, be->kv, s, layer, col, hd, 5, E); break;
    case 6: tile_scores(&r, be->kv, s, layer, col, hd, 6, E); break;
    case 7: tile_scores(&r, be->kv, s, layer, col, hd, 7, E); break;
    default: tile_scores(&r, be->kv, s, layer, col, hd, 8, E); break;
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
    case 1: tile_values(&r, inv, be->kv, s, layer, col, hd, 1, E); break;
    case 2: tile_values(&r, inv, be->kv, s, layer, col, hd, 2, E); break;
    case 3: tile_values(&r, inv, be->kv, s, layer, col, hd, 3, E); break;
    case 4: tile_values(&r, inv, be->kv, s, layer, col, hd, 4, E); break;
    case 5: tile_values(&r, inv, be->kv, s, layer, col, hd, 5, E); break;
    case 6: tile_values(&r, inv, be->kv, s, layer, col, hd, 6, E); break;
    case 7: tile_values(&r, inv, be->kv, s, layer, col, hd, 7, E); break;
    default: tile_values(&r, inv, be->kv, s, layer, col, hd, 8, E); break;
    }
}


/*
 * Attention items [lo, hi) in the pass's item order (attend_tile), or,
 * `by_tile`, every item of token tiles [lo, hi): a thread that owns whole
 * tokens (nalar_cpu_forward_tokens) attends for their tiles alone.
 */
static ALWAYS_INLINE void
attend_range(cpu_backend *be, int layer, float *sc, int64_t lo, int64_t hi,
             int by_tile, int hd, int E)
{
    int64_t nkv = be->m->cfg.n_kv_heads, ng = be->head_groups;

    if (!by_tile) {
        for (int64_t item = lo; item < hi; item++) {
            attend_tile(be, layer, sc, item, hd, E);
        }
        return;
    }
    for (int64_t tile = lo; tile < hi; tile++) {
        for (int64_t g = 0; g < nkv; g++) {
            for (int64_t sub = 0; sub < ng; sub++) {
                int64_t item = be->one_seq
                               ? (g * be->n_tiles + tile) * ng + sub
                               : (tile * nkv + g) * ng + sub;

                attend_tile(be, layer, sc, item, hd, E);
            }
        }
    }
}


/*
 * The loops for one element kind, a copy for each common head size: every
 * size for F32, the two of most models (64, 128) for the 16-bit kinds, and
 * under the sanitizers, whose instrumented copies take minutes to compile,
 * none.  A head size without a copy runs the same loops with the size a
 * variable: the same operations in the same order, so the same bits.
 */
#if defined(__SANITIZE_ADDRESS__)
#define HEAD_COPIES(E) 0
#else
#define HEAD_COPIES(E) ((E) == KV_F32 ? 2 : 1)
#endif

static ALWAYS_INLINE void
attend_kind(cpu_backend *be, int layer, float *sc, int64_t lo, int64_t hi,
            int by_tile, int E)
{
    int hd = be->m->cfg.head_dim;

    if (HEAD_COPIES(E) >= 2 && hd == 16) {
        attend_range(be, layer, sc, lo, hi, by_tile, 16, E);
    } else if (HEAD_COPIES(E) >= 2 && hd == 32) {
        attend_range(be, layer, sc, lo, hi, by_tile, 32, E);
    } else if (HEAD_COPIES(E) >= 1 && hd == 64) {
        attend_range(be, layer, sc, lo, hi, by_tile, 64, E);
    } else if (HEAD_COPIES(E) >= 1 && hd == 128) {
        attend_range(be, layer, sc, lo, hi, by_tile, 128, E);
    } else {
        attend_range(be, layer, sc, lo, hi, by_tile, hd, E);
    }
}


void
nalar_cpu_attention(cpu_backend *be, int layer, int tid, int64_t lo, int64_t hi,
          int by_tile)
{
    float *sc = be->scores + (int64_t) tid * QTILE * be->scores_cap;

    /* each KV element kind gets its own copies of the loops */
    switch (cpu_kv_kind(be->kv)) {
    case KV_F16: attend_kind(be, layer, sc, lo, hi, by_tile, KV_F16); break;
    case KV_BF16: attend_kind(be, layer, sc, lo, hi, by_tile, KV_BF16); break;
    default: attend_kind(be, layer, sc, lo, hi, by_tile, KV_F32);
    }
}
