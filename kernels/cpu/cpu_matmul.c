/*
 * CPU matrix products.  See cpu_matmul.h for the contract.
 *
 * Panels (F32/F16/BF16): a tile is G panels (16 G rows) by C tokens, G * C
 * accumulators of 16 rows each; per column, G vector loads of weights and
 * C broadcasts of x feed G * C FMAs.  Each output lane is its own FMA
 * chain over the columns, so every tile shape gives the same bits.
 *
 * Pairs (narrowed, with AVX512-BF16): the same tiles over BF16 column
 * pairs, one vdpbf16ps chain per output lane (see "BF16 pair panels").
 *
 * Quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) go to cpu_quant.h's
 * kernels, in every build.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "cpu_matmul.h"
#include "cpu_quant.h"
#include "cpu_quant_p32.h"
#include "fp16.h"

#define TOK_BLOCK 64   /* tokens kept hot in L2 while W rows stream */
/* the next group of panels is fetched while the last token tile of this
 * one runs only where both groups and the token block's x fit this (an
 * L2 of 1 MB): else the fetch would evict what the tiles reuse */
#define PF_CACHE  (1024 * 1024)
#define HUGE_PAGE (2 * 1024 * 1024)


/*
 * Memory for a weight's copy, 64-byte aligned; a copy of 2 MB or more is
 * aligned to 2 MB and asked for in huge pages (MADV_HUGEPAGE, for a
 * kernel whose transparent huge pages are "madvise"): a pass streams
 * every weight once, and with 4 KB pages each 4 KB of it costs a TLB
 * miss, a nested page walk in a virtual machine.  0, or -1 (no memory).
 */
static int
weights_alloc(void **p, size_t bytes)
{
    if (bytes < HUGE_PAGE) {
        return posix_memalign(p, 64, bytes) == 0 ? 0 : -1;
    }
    if (posix_memalign(p, HUGE_PAGE, bytes) != 0) {
        return -1;
    }
#if defined(MADV_HUGEPAGE)
    (void) madvise(*p, bytes, MADV_HUGEPAGE);
#endif
    return 0;
}

/* the layout own_blocks gives W's blocks (il 1 where the columns
 * allow), and its bytes */
static int
own_layout(const nalar_mat *W, size_t *bytes)
{
    int il = nalar_quant_can_interleave(W->type, W->cols);

    *bytes = il ? (size_t) nalar_quant_interleaved_bytes(W->type, W->rows,
                                                         W->cols)
                : (size_t) W->rows
                  * ggml_row_size(W->type, (uint64_t) W->cols);
    return il;
}


/*
 * A quantized W's blocks copied into memory the backend owns (64-byte
 * aligned), so no step waits on a page of the mapped file
 * (nalar_cpu_drop_mapped then lets the mapping's copy go): interleaved
 * by 4 rows (nalar_quant_interleave) where its columns allow, so that a
 * token's pass over 4 rows reads one stream, else as they are.
 */
static int
own_blocks(nalar_cpu_mat *M, const nalar_mat *W, nalar_err *err)
{
    size_t bytes;
    int    il = own_layout(W, &bytes);

    if (weights_alloc(&M->panels, bytes) != 0) {
        M->panels = NULL;
        return nalar_fail(err, "cpu backend: out of memory for a %lld x "
                          "%lld %s weight", (long long) W->rows,
                          (long long) W->cols, ggml_type_name(W->type));
    }
    if (il) {
        nalar_quant_interleave(W->type, W->data, W->rows, W->cols,
                               M->panels);
    } else {
        memcpy(M->panels, W->data, bytes);
    }
    M->il = il;
    return 0;
}


void
nalar_cpu_mat_act(nalar_cpu_mat *M, int mode)
{
    const nalar_mat *W = M->W;
    int              want, il;
    size_t           bytes;
    void            *p;
    int64_t          rb;

    M->act_i16 = mode;
    if (W == NULL || M->panels == NULL || !nalar_quant_p32_type(W->type)
        || !nalar_quant_x8_fits(W->type, W->cols))
    {
        return;
    }
    want = mode == NALAR_ACT_I16 || mode == NALAR_ACT_PAIRS;
    if (want == (M->il == P32_IL)) {
        return;
    }
    rb = (int64_t) ggml_row_size(W->type, (uint64_t) W->cols);
    il = own_layout(W, &bytes);
    if (want) {
        bytes = (size_t) nalar_quant_p32_bytes(W->type, W->rows, W->cols);
    }
    if (weights_alloc(&p, bytes) != 0) {
        return;
    }
    if (want) {
        nalar_quant_p32_pack(W->type, M->panels, rb, M->il, W->rows, W->cols,
                             p);
        M->il = P32_IL;
    } else {
        nalar_quant_p32_unpack(W->type, M->panels, W->rows, W->cols, il, rb,
                               p);
        M->il = il;
    }
    free(M->panels);
    M->panels = p;
}


/* a quantized W's blocks as its products read them: the backend's copy,
 * or without one the mapping's rows; *wstride: a row's bytes */
static const uint8_t *
quant_blocks(const nalar_cpu_mat *M, int64_t *wstride, int *il)
{
    *wstride = (int64_t) ggml_row_size(M->W->type, (uint64_t) M->W->cols);
    *il = M->panels != NULL ? M->il : 0;
    return M->panels != NULL ? M->panels : M->W->data;
}


/* nalar_cpu_matmul of a quantized W through cpu_quant.h's kernels, in
 * M's activations' mode */
static void
quant_matmul(const nalar_cpu_mat *M, const float *x, int n_tok, int ldx,
             float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int64_t        ws;
    int            il;
    const uint8_t *w = quant_blocks(M, &ws, &il);

    (M->act_i16 == NALAR_ACT_PAIRS ? nalar_quant_matmul_xpairs
     : M->act_i16 == NALAR_ACT_Q8 ? nalar_quant_matmul_q8
     : M->act_i16 ? nalar_quant_matmul_i16 : nalar_quant_matmul)(
        M->W->type, w, ws, il, M->W->cols, x, n_tok, ldx, y, ldy, r0, r1,
        accumulate);
}



#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

typedef __m512 v16;


/* --- panels --- */

/* column c (element index c * 16) of one panel: 16 rows as float */
static ALWAYS_INLINE v16
load_panel(ggml_type type, const uint8_t *p, int64_t i)
{
    switch (type) {
    case GGML_F32:
        return _mm512_loadu_ps((const float *) p + i);
    case GGML_F16:
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *) ((const uint16_t *) p + i)));
    default:    /* GGML_BF16 */
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *) ((const uint16_t *) p + i))),
            16));
    }
}


/* rows of panel g that lie in [r0, r1) */
static ALWAYS_INLINE __mmask16
panel_mask(int64_t g, int64_t r0, int64_t r1)
{
    int64_t lo = r0 - 16 * g, hi = r1 - 16 * g;
    __mmask16 m = 0xffff;

    if (lo > 0) {
        m &= (__mmask16) (0xffffu << lo);
    }
    if (hi < 16) {
        m &= (__mmask16) ((1u << hi) - 1);
    }
    return m;
}


/* A tile's G x C accumulators into y: panel g0 + i's rows in [r0, r1), for
 * token j, added to y's when accumulating */
static ALWAYS_INLINE void
store_tile(v16 acc[8][10], const int G, const int C, int64_t g0, int64_t r0,
           int64_t r1, float *y, int ldy, int accumulate)
{
    for (int i = 0; i < G; i++) {
        __mmask16 m = panel_mask(g0 + i, r0, r1);

        for (int j = 0; j < C; j++) {
            float *o = y + (int64_t) j * ldy + 16 * (g0 + i);
            v16    v = acc[i][j];

            if (accumulate) {
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), v);
            }
            _mm512_mask_storeu_ps(o, m, v);
        }
    }
}


/* Panels g0 .. g0 + G - 1 by tokens 0 .. C - 1 of x (see the file's top);
 * with npf > 0, panels g0 + grp .. g0 + grp + npf - 1 (the next group's,
 * for groups of grp panels) fetched into cache on the way */
static ALWAYS_INLINE void
panel_tile(ggml_type type, const uint8_t *panels, int64_t pbytes, int64_t g0,
           const float *x, int ldx, float *y, int ldy, int64_t cols,
           int64_t r0, int64_t r1, int accumulate, const int G, const int C,
           int64_t grp, int npf)
{
    v16            acc[8][10];
    const uint8_t *pg = panels + g0 * pbytes;
    const uint8_t *pf = panels + (g0 + grp) * pbytes;
    const int64_t  cb = type == GGML_F32 ? 64 : 32;   /* bytes a column */

    for (int i = 0; i < G; i++) {
        for (int j = 0; j < C; j++) {
            acc[i][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t c = 0; c < cols; c++) {
        v16 xb[10];

        for (int j = 0; j < C; j++) {
            xb[j] = _mm512_set1_ps(x[(int64_t) j * ldx + c]);
        }
        if (npf > 0 && (c * cb) % 64 == 0) {
            for (int i = 0; i < G && i < npf; i++) {
                _mm_prefetch((const char *) pf + i * pbytes + c * cb,
                             _MM_HINT_T1);
            }
        }
        for (int i = 0; i < G; i++) {
            v16 wv = load_panel(type, pg + i * pbytes, c * 16);

            for (int j = 0; j < C; j++) {
                acc[i][j] = _mm512_fmadd_ps(wv, xb[j], acc[i][j]);
            }
        }
    }
    store_tile(acc, G, C, g0, r0, r1, y, ldy, accumulate);
}


/* Tiles of GMAX panels (then 2, then 1) by C tokens over panels [g, g1):
 * TILE(g0, G, C) computes one */
#define PANEL_RUN(TILE, C, GMAX)                                              \
    do {                                                                      \
        int64_t g_ = g;                                                       \
                                                                              \
        while (g_ < g1) {                                                     \
            int64_t left_ = g1 - g_;                                          \
                                                                              \
            if (left_ >= (GMAX)) {                                            \
                TILE(g_, GMAX, C);                                            \
                g_ += (GMAX);                                                 \
            } else if (left_ >= 2) {                                          \
                TILE(g_, 2, C);                                               \
                g_ += 2;                                                      \
            } else {                                                          \
                TILE(g_, 1, C);                                               \
                g_ += 1;                                                      \
            }                                                                 \
        }                                                                     \
    } while (0)


/*
 * Panels in a group for token tiles of up to w tokens: a multiple of the
 * tile's panels (PANEL_RUN's GMAX, as DEFINE_PANEL_MATMUL's switch
 * gives it per width) near 8, so no group ends in a narrower tile: 8
 * panels in tiles of 3 ran 3 + 3 + 2, and a 2-panel tile of 8 tokens
 * does 16 FMAs per 10 loads where a 3-panel one does 24 per 11.
 */
static inline int64_t
group_panels(int w)
{
    static const int gmax[11] = { 8, 8, 8, 6, 4, 4, 4, 3, 3, 2, 2 };
    int              g = gmax[w < 10 ? w : 10];

    return g * (8 / g);
}


/*
 * One panel layout (PBYTES: bytes per panel; TILE: its tile, see
 * PANEL_RUN): the compiler specialises the tile per (G, C).  Up to 10
 * tokens (a verification of up to 9 proposals) make one tile, so each
 * weight is read once per pass (a second tile would read the group again,
 * from L2 at best); more tokens split into tiles of at most 8, of equal
 * width (17 = 6 + 6 + 5, not 8 + 8 + 1).  Groups of about 8 panels
 * (group_panels: 6 for tiles of 3, 7 or 8 tokens) are the outer loop, so
 * a group's weights serve every token tile from cache.  G * C
 * stays within 24 accumulators (of 32 vector registers).  While a group's
 * last token tile runs, it fetches the next group's weights into cache
 * (where they fit, PF_CACHE): otherwise the next group's first tile would
 * wait on memory at each panel it starts, which costs most where a step
 * has few tokens (a decode batch, a step sized to an ITL target).
 */
#define DEFINE_PANEL_MATMUL(NAME, PBYTES, TILE)                               \
static void                                                                   \
NAME(const uint8_t *p, int64_t cols, const float *x, int n_tok, int ldx,      \
     float *y, int ldy, int64_t r0, int64_t r1, int acc)                      \
{                                                                             \
    int64_t pbytes = (PBYTES);                                                \
    int64_t ga = r0 / 16, gb = (r1 + 15) / 16;                                \
                                                                              \
    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {                          \
    int     tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;             \
    int     nt = tn <= 10 ? 1 : (tn + 7) / 8;                                 \
    int64_t grp = group_panels((tn + nt - 1) / nt);                           \
    int     pf_fits = 2 * grp * pbytes + (int64_t) tn * cols * 4 <= PF_CACHE; \
                                                                              \
    for (int64_t g = ga; g < gb; g += grp) {                                  \
        int64_t g1 = g + grp < gb ? g + grp : gb;                             \
                                                                              \
        for (int k = 0; k < nt; k++) {                                        \
            /* the last token tile fetches the next group's weights */       \
            int          pfl = k == nt - 1 && g1 < gb && pf_fits;             \
            int          t = t0 + tn * k / nt;                                \
            int          w = t0 + tn * (k + 1) / nt - t;                      \
            const float *xt = x + (int64_t) t * ldx;                          \
            float       *yt = y + (int64_t) t * ldy;                          \
                                                                              \
            switch (w) {                                                      \
            case 1: PANEL_RUN(TILE, 1, 8); break;                             \
            case 2: PANEL_RUN(TILE, 2, 8); break;                             \
            case 3: PANEL_RUN(TILE, 3, 6); break;                             \
            case 4: PANEL_RUN(TILE, 4, 4); break;                             \
            case 5: PANEL_RUN(TILE, 5, 4); break;                             \
            case 6: PANEL_RUN(TILE, 6, 4); break;                             \
            case 7: PANEL_RUN(TILE, 7, 3); break;                             \
            case 8: PANEL_RUN(TILE, 8, 3); break;                             \
            case 9: PANEL_RUN(TILE, 9, 2); break;                             \
            default: PANEL_RUN(TILE, 10, 2); break;                           \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    }                                                                         \
}

/* panels of the next group that exist, for the last token tile */
#define NPF(g0)                                                               \
    (pfl ? (int) (gb - (g0) - grp < grp ? gb - (g0) - grp : grp) : 0)
#define TILE_F32(g0, G, C)                                                    \
    panel_tile(GGML_F32, p, pbytes, g0, xt, ldx, yt, ldy, cols, r0, r1, acc, \
               G, C, grp, NPF(g0))
#define TILE_F16(g0, G, C)                                                    \
    panel_tile(GGML_F16, p, pbytes, g0, xt, ldx, yt, ldy, cols, r0, r1, acc, \
               G, C, grp, NPF(g0))
#define TILE_BF16(g0, G, C)                                                   \
    panel_tile(GGML_BF16, p, pbytes, g0, xt, ldx, yt, ldy, cols, r0, r1,     \
               acc, G, C, grp, NPF(g0))

DEFINE_PANEL_MATMUL(panels_f32, cols * 16 * 4, TILE_F32)
DEFINE_PANEL_MATMUL(panels_f16, cols * 16 * 2, TILE_F16)
DEFINE_PANEL_MATMUL(panels_bf16, cols * 16 * 2, TILE_BF16)


#if defined(__AVX512BF16__)

/*
 * --- BF16 pair panels: a draft's weights (narrowed), with vdpbf16ps ---
 *
 * A 64-byte column of a pair panel holds columns 2q and 2q + 1 of 16 rows,
 * interleaved (row i's two weights in 32-bit lane i); x is rounded to BF16
 * and each token's pair (x[2q], x[2q + 1]) broadcast against it, so one
 * vdpbf16ps does 32 multiply-adds where an F32 FMA does 16, from half the
 * bytes.  Only for weights whose exact products do not matter: a draft
 * only proposes, and the target verifies every proposal.
 */

#define PAIR_CHUNK 128   /* column pairs of x rounded to BF16 at a time */

/* x[0 .. n) (n <= 2 * PAIR_CHUNK) rounded to BF16, as pairs: out[q] holds
 * x[2q] in its low half and x[2q + 1] in its high half (0 past n) */
static ALWAYS_INLINE void
x_pairs(const float *x, int64_t n, uint32_t *out)
{
    for (int64_t c = 0; c < n; c += 32) {
        int64_t   left = n - c;
        __mmask16 lo = left >= 16 ? 0xffff
                                  : (__mmask16) ((1u << left) - 1);
        __mmask16 hi = left >= 32 ? 0xffff
                       : left <= 16 ? 0
                       : (__mmask16) ((1u << (left - 16)) - 1);
        __m512    a = _mm512_maskz_loadu_ps(lo, x + c);
        __m512    b = _mm512_maskz_loadu_ps(hi, x + c + 16);
        __m512bh  v = _mm512_cvtne2ps_pbh(b, a);    /* a's in the low half */

        _mm512_storeu_si512(out + c / 2, (__m512i) v);
    }
}


/* Pair panels g0 .. g0 + G - 1 by tokens 0 .. C - 1 of x: each output lane
 * is one chain of vdpbf16ps over the column pairs in order, whatever the
 * tile */
static ALWAYS_INLINE void
pair_tile(const uint8_t *panels, int64_t pbytes, int64_t g0, const float *x,
          int ldx, float *y, int ldy, int64_t cols, int64_t r0, int64_t r1,
          int accumulate, const int G, const int C)
{
    __m512         acc[8][10];
    uint32_t       xp[10][PAIR_CHUNK] __attribute__((aligned(64)));
    const uint8_t *pg = panels + g0 * pbytes;
    int64_t        n_pairs = (cols + 1) / 2;

    for (int i = 0; i < G; i++) {
        for (int j = 0; j < C; j++) {
            acc[i][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t q0 = 0; q0 < n_pairs; q0 += PAIR_CHUNK) {
        int64_t qn = n_pairs - q0 < PAIR_CHUNK ? n_pairs - q0 : PAIR_CHUNK;
        int64_t xn = cols - 2 * q0 < 2 * qn ? cols - 2 * q0 : 2 * qn;

        for (int j = 0; j < C; j++) {
            x_pairs(x + (int64_t) j * ldx + 2 * q0, xn, xp[j]);
        }
        for (int64_t q = 0; q < qn; q++) {
            __m512bh xb[10];

            for (int j = 0; j < C; j++) {
                xb[j] = (__m512bh) _mm512_set1_epi32((int) xp[j][q]);
            }
            for (int i = 0; i < G; i++) {
                __m512bh wv = (__m512bh) _mm512_loadu_si512(
                                  pg + i * pbytes + (q0 + q) * 64);

                for (int j = 0; j < C; j++) {
                    acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, xb[j]);
                }
            }
        }
    }
    store_tile(acc, G, C, g0, r0, r1, y, ldy, accumulate);
}

#define TILE_PAIRS(g0, G, C)                                                  \
    ((void) pfl, (void) grp,                                                  \
     pair_tile(p, pbytes, g0, xt, ldx, yt, ldy, cols, r0, r1, acc, G, C))

DEFINE_PANEL_MATMUL(panels_pairs, (cols + 1) / 2 * 64, TILE_PAIRS)

#endif


/* Every weight of an F32 matrix within F16's finite range. */
static int
fits_f16(const nalar_mat *W)
{
    const float *w = W->data;

    for (int64_t i = 0; i < W->rows * W->cols; i++) {
        if (!(fabsf(w[i]) <= 65504.0f)) {
            return 0;
        }
    }
    return 1;
}


#if defined(__AVX512BF16__)
/* W (F32, F16 or BF16) as BF16 pair panels: element (r, c) at
 * panels[(r / 16) * n_pairs * 32 + (c / 2) * 32 + (r % 16) * 2 + c % 2] */
static int
pairs_init(nalar_cpu_mat *M, const nalar_mat *W, nalar_err *err)
{
    int64_t n_pairs = (W->cols + 1) / 2, n_panels = (W->rows + 15) / 16;
    size_t  bytes = (size_t) (n_panels * n_pairs * 64);
    float  *row = malloc((size_t) W->cols * sizeof(float));

    if (row == NULL || weights_alloc(&M->panels, bytes) != 0) {
        free(row);
        M->panels = NULL;
        return nalar_fail(err, "cpu backend: out of memory for a %lld x "
                          "%lld weight's panels", (long long) W->rows,
                          (long long) W->cols);
    }
    memset(M->panels, 0, bytes);
    for (int64_t r = 0; r < W->rows; r++) {
        uint16_t *pan = (uint16_t *) M->panels + (r / 16) * n_pairs * 32;

        nalar_cpu_get_row(W, r, row);
        for (int64_t c = 0; c < W->cols; c++) {
            pan[(c / 2) * 32 + (r % 16) * 2 + c % 2] =
                nalar_f32_to_bf16(row[c]);
        }
    }
    free(row);
    M->ptype = GGML_BF16;
    M->pairs = 1;
    return 0;
}
#endif


int
nalar_cpu_mat_init(nalar_cpu_mat *M, const nalar_mat *W, int narrow,
                   nalar_err *err)
{
    int64_t esz, n_panels, wstride;

    M->W = W;
    M->panels = NULL;
    M->ptype = W->type;
    M->pairs = 0;
    M->act_i16 = 0;
    M->il = 0;
    if (nalar_quant_type(W->type)) {
        return own_blocks(M, W, err);
    }
    if (W->type != GGML_F32 && W->type != GGML_F16 && W->type != GGML_BF16) {
        return 0;
    }
#if defined(__AVX512BF16__)
    if (narrow) {
        return pairs_init(M, W, err);
    }
#endif
    if (W->type == GGML_F32 && narrow && fits_f16(W)) {
        M->ptype = GGML_F16;
    }
    esz = M->ptype == GGML_F32 ? 4 : 2;
    n_panels = (W->rows + 15) / 16;
    wstride = (int64_t) ggml_row_size(W->type, (uint64_t) W->cols);
    /* 64-byte aligned: each column of a panel is one cache line (F32) */
    if (weights_alloc(&M->panels,
                      (size_t) (n_panels * W->cols * 16 * esz)) != 0)
    {
        M->panels = NULL;
        return nalar_fail(err, "cpu backend: out of memory for a %lld x "
                          "%lld weight's panels", (long long) W->rows,
                          (long long) W->cols);
    }
    memset(M->panels, 0, (size_t) (n_panels * W->cols * 16 * esz));
    for (int64_t r = 0; r < W->rows; r++) {
        const uint8_t *src = (const uint8_t *) W->data + r * wstride;
        uint8_t       *dst = (uint8_t *) M->panels
                             + ((r / 16) * W->cols * 16 + r % 16) * esz;

        for (int64_t c = 0; c < W->cols; c++) {
            if (M->ptype != W->type) {      /* F32 narrowed to F16 */
                float    f;
                uint16_t h;

                memcpy(&f, src + c * 4, 4);
                h = nalar_f32_to_f16(f);
                memcpy(dst + c * 16 * esz, &h, 2);
            } else {
                memcpy(dst + c * 16 * esz, src + c * esz, (size_t) esz);
            }
        }
    }
    return 0;
}


void
nalar_cpu_matmul(const nalar_cpu_mat *M, const float *x, int n_tok, int ldx,
                 float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    const nalar_mat *W = M->W;
    const uint8_t   *p = M->panels;

    if (nalar_quant_type(W->type)) {
        quant_matmul(M, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        return;
    }
#if defined(__AVX512BF16__)
    if (M->pairs) {
        panels_pairs(p, W->cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        return;
    }
#endif
    switch (p != NULL ? M->ptype : W->type) {
    case GGML_F32:
        panels_f32(p, W->cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_F16:
        panels_f16(p, W->cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_BF16:
        panels_bf16(p, W->cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        break;
    default:
        break;
    }
}

#else  /* no AVX-512: AVX2 panels where the CPU has them, else scalar;
        * each type's order of operations as above */

#include <math.h>

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

static float
w_at(ggml_type type, const uint8_t *w, int64_t c)
{
    uint16_t h;

    switch (type) {
    case GGML_F32:
        return ((const float *) w)[c];
    case GGML_F16:
        memcpy(&h, w + 2 * c, 2);
        return nalar_f16_to_f32(h);
    case GGML_BF16:
        memcpy(&h, w + 2 * c, 2);
        return nalar_bf16_to_f32(h);
    default: {
        const uint8_t *blk = w + (c / QK8_0) * 34;

        memcpy(&h, blk, 2);
        return (float) (int8_t) blk[2 + c % QK8_0] * nalar_f16_to_f32(h);
    }
    }
}


#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/*
 * AVX2 panels (F32/F16/BF16): 8 rows stored by column, element (r, c) at
 * panels[(r / 8) * cols * 8 + c * 8 + r % 8] in W's type, the last panel
 * padded with zero rows.  A tile is G panels by C tokens: per column, G
 * loads of 8 rows and C broadcasts of x feed G * C FMAs, and each output
 * lane is its own FMA chain over the columns in order, from 0 -- the
 * scalar path's arithmetic, in every tile shape.
 */

static ALWAYS_INLINE __m256
load_p8(ggml_type type, const uint8_t *p, int64_t i)
{
    switch (type) {
    case GGML_F32:
        return _mm256_loadu_ps((const float *) p + i);
    case GGML_F16:
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *) ((const uint16_t *) p + i)));
    default:    /* GGML_BF16 */
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *) ((const uint16_t *) p + i))),
            16));
    }
}


static ALWAYS_INLINE void
p8_tile(ggml_type type, const uint8_t *panels, int64_t pbytes, int64_t g0,
        const float *x, int ldx, float *y, int ldy, int64_t cols, int64_t r0,
        int64_t r1, int accumulate, const int G, const int C)
{
    __m256         acc[8][4];
    const uint8_t *pg = panels + g0 * pbytes;

    for (int i = 0; i < G; i++) {
        for (int j = 0; j < C; j++) {
            acc[i][j] = _mm256_setzero_ps();
        }
    }
    for (int64_t c = 0; c < cols; c++) {
        __m256 xb[4];

        for (int j = 0; j < C; j++) {
            xb[j] = _mm256_broadcast_ss(x + (int64_t) j * ldx + c);
        }
        for (int i = 0; i < G; i++) {
            __m256 wv = load_p8(type, pg + i * pbytes, c * 8);

            for (int j = 0; j < C; j++) {
                acc[i][j] = _mm256_fmadd_ps(wv, xb[j], acc[i][j]);
            }
        }
    }
    for (int i = 0; i < G; i++) {
        int64_t base = 8 * (g0 + i);

        for (int j = 0; j < C; j++) {
            float *o = y + (int64_t) j * ldy + base;

            if (base >= r0 && base + 8 <= r1) {
                __m256 v = acc[i][j];

                if (accumulate) {
                    v = _mm256_add_ps(_mm256_loadu_ps(o), v);
                }
                _mm256_storeu_ps(o, v);
            } else {
                float tmp[8];

                _mm256_storeu_ps(tmp, acc[i][j]);
                for (int k = 0; k < 8; k++) {
                    if (base + k >= r0 && base + k < r1) {
                        o[k] = accumulate ? o[k] + tmp[k] : tmp[k];
                    }
                }
            }
        }
    }
}


#define P8_RUN(C, GMAX)                                                       \
    do {                                                                      \
        int64_t g_ = g;                                                       \
                                                                              \
        while (g_ < g1) {                                                     \
            if (g1 - g_ >= (GMAX)) {                                          \
                p8_tile(type, p, pbytes, g_, xt, ldx, yt, ldy, cols, r0, r1,  \
                        acc, GMAX, C);                                        \
                g_ += (GMAX);                                                 \
            } else if (g1 - g_ >= 2) {                                        \
                p8_tile(type, p, pbytes, g_, xt, ldx, yt, ldy, cols, r0, r1,  \
                        acc, 2, C);                                           \
                g_ += 2;                                                      \
            } else {                                                          \
                p8_tile(type, p, pbytes, g_, xt, ldx, yt, ldy, cols, r0, r1,  \
                        acc, 1, C);                                           \
                g_ += 1;                                                      \
            }                                                                 \
        }                                                                     \
    } while (0)


/* Groups of 8 panels are the outer loop, so a group's weights serve every
 * token tile (of up to 4) from cache. */
static ALWAYS_INLINE void
panels8_t(ggml_type type, const uint8_t *p, int64_t cols, const float *x,
          int n_tok, int ldx, float *y, int ldy, int64_t r0, int64_t r1,
          int acc)
{
    int64_t pbytes = cols * 8 * (type == GGML_F32 ? 4 : 2);
    int64_t ga = r0 / 8, gb = (r1 + 7) / 8;

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;

        for (int64_t g = ga; g < gb; g += 8) {
            int64_t g1 = g + 8 < gb ? g + 8 : gb;

            for (int t = 0; t < tn; t += 4) {
                const float *xt = x + (int64_t) (t0 + t) * ldx;
                float       *yt = y + (int64_t) (t0 + t) * ldy;

                switch (tn - t) {
                case 1: P8_RUN(1, 8); break;
                case 2: P8_RUN(2, 4); break;
                case 3: P8_RUN(3, 2); break;
                default: P8_RUN(4, 2); break;
                }
            }
        }
    }
}


static void
panels8(ggml_type type, const uint8_t *p, int64_t cols, const float *x,
        int n_tok, int ldx, float *y, int ldy, int64_t r0, int64_t r1,
        int acc)
{
    switch (type) {
    case GGML_F32:
        panels8_t(GGML_F32, p, cols, x, n_tok, ldx, y, ldy, r0, r1, acc);
        break;
    case GGML_F16:
        panels8_t(GGML_F16, p, cols, x, n_tok, ldx, y, ldy, r0, r1, acc);
        break;
    default:
        panels8_t(GGML_BF16, p, cols, x, n_tok, ldx, y, ldy, r0, r1, acc);
        break;
    }
}

#endif


int
nalar_cpu_mat_init(nalar_cpu_mat *M, const nalar_mat *W, int narrow,
                   nalar_err *err)
{
    (void) narrow;      /* weights are held in W's type */
    M->W = W;
    M->panels = NULL;
    M->ptype = W->type;
    M->pairs = 0;
    M->act_i16 = 0;
    M->il = 0;
    if (nalar_quant_type(W->type)) {
        return own_blocks(M, W, err);
    }
#if defined(__AVX2__) && defined(__FMA__)
    if (W->type == GGML_F32 || W->type == GGML_F16 || W->type == GGML_BF16) {
        int64_t esz = W->type == GGML_F32 ? 4 : 2;
        int64_t n_panels = (W->rows + 7) / 8;
        int64_t wstride = (int64_t) ggml_row_size(W->type,
                                                  (uint64_t) W->cols);
        size_t  bytes = (size_t) (n_panels * W->cols * 8 * esz);

        if (weights_alloc(&M->panels, bytes) != 0) {
            M->panels = NULL;
            return nalar_fail(err, "cpu backend: out of memory for a %lld x "
                              "%lld weight's panels", (long long) W->rows,
                              (long long) W->cols);
        }
        memset(M->panels, 0, bytes);
        for (int64_t r = 0; r < W->rows; r++) {
            const uint8_t *src = (const uint8_t *) W->data + r * wstride;
            uint8_t       *dst = (uint8_t *) M->panels
                                 + ((r / 8) * W->cols * 8 + r % 8) * esz;

            for (int64_t c = 0; c < W->cols; c++) {
                memcpy(dst + c * 8 * esz, src + c * esz, (size_t) esz);
            }
        }
    }
#endif
    return 0;
}


void
nalar_cpu_matmul(const nalar_cpu_mat *M, const float *x, int n_tok, int ldx,
                 float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    const nalar_mat *W = M->W;
    int64_t wstride = (int64_t) ggml_row_size(W->type, (uint64_t) W->cols);

    if (nalar_quant_type(W->type)) {
        quant_matmul(M, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
        return;
    }
#if defined(__AVX2__) && defined(__FMA__)
    if (M->panels != NULL) {
        panels8(W->type, M->panels, W->cols, x, n_tok, ldx, y, ldy, r0, r1,
                accumulate);
        return;
    }
#endif
    for (int t = 0; t < n_tok; t++) {
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *w = (const uint8_t *) W->data + r * wstride;
            const float   *xt = x + (int64_t) t * ldx;
            float          s = 0;

            /* one FMA chain in column order, as the panels' lanes */
            for (int64_t c = 0; c < W->cols; c++) {
                s = fmaf(w_at(W->type, w, c), xt[c], s);
            }
            y[(int64_t) t * ldy + r] = accumulate
                                       ? y[(int64_t) t * ldy + r] + s : s;
        }
    }
}

#endif


int
nalar_cpu_mat_i16(const nalar_cpu_mat *M)
{
    return M->act_i16 && nalar_quant_type(M->W->type);
}


void
nalar_cpu_matmul_xq(const nalar_cpu_mat *M, const float *x,
                    const nalar_xq *xq, int n_tok, int ldx, float *y,
                    int ldy, int64_t r0, int64_t r1, int accumulate)
{
    const nalar_mat *W = M->W;

    if (xq != NULL && nalar_cpu_mat_i16(M)) {
        int64_t        ws;
        int            il;
        const uint8_t *w = quant_blocks(M, &ws, &il);

        const nalar_xq8 *c = M->act_i16 == NALAR_ACT_Q8 ? &xq->x8
                             : M->act_i16 == NALAR_ACT_PAIRS ? &xq->xp.x16.hi
                             : &xq->x16.hi;

        /* codes made for x's columns (a K-quant needs its per-256
         * codes); else quant_matmul makes them, to the same bits */
        if (c->cols == W->cols && nalar_quant_x8_fits(W->type, W->cols)
            && (nalar_quant_block(W->type) == 256 ? c->qk != NULL
                                                  : c->q != NULL))
        {
            if (M->act_i16 == NALAR_ACT_Q8) {
                nalar_quant_matmul_x8(W->type, w, ws, il, W->cols, &xq->x8,
                                      n_tok, y, ldy, r0, r1, accumulate);
            } else if (M->act_i16 == NALAR_ACT_PAIRS) {
                nalar_quant_matmul_pairs(W->type, w, ws, il, W->cols,
                                         &xq->xp, n_tok, y, ldy, r0, r1,
                                         accumulate);
            } else {
                nalar_quant_matmul_x16(W->type, w, ws, il, W->cols,
                                       &xq->x16, n_tok, y, ldy, r0, r1,
                                       accumulate);
            }
            return;
        }
    }
    nalar_cpu_matmul(M, x, n_tok, ldx, y, ldy, r0, r1, accumulate);
}


void
nalar_cpu_drop_mapped(const gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (f->tensors[i].n_dims >= 2) {
            gguf_drop_resident(f, f->tensors[i].data, f->tensors[i].nbytes);
        }
    }
}


void
nalar_cpu_mat_free(nalar_cpu_mat *M)
{
    free(M->panels);
    M->panels = NULL;
}


void
nalar_cpu_get_row(const nalar_mat *W, int64_t row, float *out)
{
    int64_t        wstride = (int64_t) ggml_row_size(W->type,
                                                     (uint64_t) W->cols);
    const uint8_t *w = (const uint8_t *) W->data + row * wstride;

    if (nalar_quant_type(W->type)) {
        nalar_dequant_row(W->type, w, W->cols, out);
        return;
    }
    for (int64_t c = 0; c < W->cols; c++) {
        uint16_t h;

        switch (W->type) {
        case GGML_F32:
            memcpy(&out[c], w + 4 * c, 4);
            break;
        case GGML_F16:
            memcpy(&h, w + 2 * c, 2);
            out[c] = nalar_f16_to_f32(h);
            break;
        case GGML_BF16:
            memcpy(&h, w + 2 * c, 2);
            out[c] = nalar_bf16_to_f32(h);
            break;
        default: {
            const uint8_t *blk = w + (c / QK8_0) * 34;

            memcpy(&h, blk, 2);
            out[c] = (float) (int8_t) blk[2 + c % QK8_0]
                     * nalar_f16_to_f32(h);
        }
        }
    }
}
