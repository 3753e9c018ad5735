/*
 * The 8-bit activations' products of several tokens, in tiles
 * (cpu_quant_q8_tiles.h): each row's blocks decoded once for a tile of up
 * to 8 tokens (4 on AVX2, which has 16 vector registers to AVX-512's 32),
 * with the integers and float operations of cpu_quant_q8.c's exactness
 * contract, so that a token's outputs are the row kernel's bits in any
 * tile, any batch and any split of the rows.
 *
 * Per call, each tile's per-block scalars are packed once (pack_tile):
 * its tokens' x scales d_x as one vector (lane k: the tile's token k),
 * and the sums of x's codes that the min term reads, as int16 pairs per
 * lane.  A block's integer min terms I for the whole tile are then a few
 * vpdpwssd (Q4_K/Q5_K: mins m_2i, m_2i+1 against the sums of sub-blocks
 * 2i, 2i + 1's 32 codes, four steps; Q6_K: its scales against the sums
 * of 16 codes, eight steps, times 32), and mn = fma(s', I, mn) is one
 * vector FMA whose lane k is token k's scalar chain, where the row kernel
 * spends a horizontal reduction per token.  s = d_w * d_x is one vector
 * product for the tile too.
 *
 * Each group of 32 weights is decoded once per block and row and added
 * into each token's 8 lanes L: vpmaddubsw, then vpmaddwd (AVX2) or
 * vpdpwssd (AVX-512 VNNI, and AVX-VNNI's VEX form on AVX2's tiles) by
 * the group's scales.  (Fewer multiplies, pairing two
 * groups' vpdpbusd sums in one vpdpwssd, or half the instructions, two
 * groups per 512-bit step, measured no faster on AMD Zen 4, whose vector
 * units, not its front end, bound this loop.)  Q8_0 and Q4_0 on VNNI
 * (QT_VNNI_XU) read x's codes + 128 as unsigned bytes (a copy made per
 * call), so that one vpdpbusd from minus 128 times the weights' sums of
 * four gives L, without vpsignb.
 *
 * Order of the work: the rows in groups (nalar_quant_x8_tile_rows: about
 * QT_GROUP_BYTES of blocks, which stay in L2), each tile of tokens over
 * the group's rows in turn.  The first tile streams the rows from memory,
 * prefetching the row QT_PF on as it goes; the others find them in
 * cache.  A tile's codes (its tokens x cols bytes) are read once per row,
 * from L1 or L2.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_q8_tiles.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QT_X86 1
#endif

#define QT_GROUP_BYTES (128 * 1024)  /* a group of rows' blocks */
#define QT_PF 16                     /* rows ahead the first tile fetches */
#ifndef QT_VNNI_XU
#define QT_VNNI_XU 1
#endif


int
nalar_quant_x8_tile_max(int isa)
{
    return isa == NALAR_ISA_VNNI ? 8 : 4;
}


int64_t
nalar_quant_x8_tile_rows(ggml_type t, int64_t cols)
{
    qinfo   qi = { 0, 0, 0, 0 };
    int64_t rb, n;

    if (qinfo_of(t, &qi) != 0 || cols < qi.qk) {
        return 1;
    }
    rb = cols / qi.qk * qi.bytes;
    n = QT_GROUP_BYTES / rb;
    return n < 4 ? 4 : n;
}


#if defined(QT_X86)

/* ------------------------------------------------------------------ */
/* the tiles' packed scalars                                            */


/* bytes per block of a tile's packed scalars: x's 8 scales (float), then
 * for the K-quants the min sums, 8 lanes of int16 pairs per step (4
 * steps for Q4_K/Q5_K, 8 for Q6_K) */
static inline int64_t
qt_block_stride(ggml_type t)
{
    switch (t) {
    case GGML_Q4_K:
    case GGML_Q5_K:
        return 32 + 4 * 32;
    case GGML_Q6_K:
        return 32 + 8 * 32;
    default:
        return 32;
    }
}


/* two int16 (each |v| < 2^15) as the int32 lane vpmaddwd reads as a pair,
 * a in the low half */
static inline uint32_t
qt_pair(int32_t a, int32_t b)
{
    return (uint32_t) (uint16_t) (int16_t) a
           | (uint32_t) (uint16_t) (int16_t) b << 16;
}


/*
 * The packed scalars of tokens t0 .. t0 + n - 1 (n <= 8) for type t into
 * pk: per block b, float dx[8] (lanes n .. 7 zero), and for the K-quants
 * uint32 ms[steps][8], lane k of step i:
 *   Q4_K/Q5_K: (xs_2i, xs_2i+1), xs_j the sum of sub-block j's 32 codes
 *              (|xs_j| <= 32 * 127);
 *   Q6_K:      (bs_2i, bs_2i+1), bs_j the sum of its 16 codes.
 */
static void
pack_tile(ggml_type t, const nalar_xq8 *x8, int t0, int n, int64_t cols,
          uint8_t *pk)
{
    int64_t qk = nalar_quant_block(t), nb = cols / qk;
    int64_t bstride = qt_block_stride(t);

    memset(pk, 0, (size_t) (nb * bstride));
    for (int k = 0; k < n; k++) {
        int64_t tk = t0 + k;

        for (int64_t b = 0; b < nb; b++) {
            float         *dx = (float *) (pk + b * bstride);
            uint32_t      *ms = (uint32_t *) (pk + b * bstride + 32);
            const int32_t *bs;

            if (qk != QK_K) {
                dx[k] = x8->d[tk * nb + b];
                continue;
            }
            dx[k] = x8->dk[tk * nb + b];
            bs = x8->bs + tk * (cols / 16) + 16 * b;
            if (t == GGML_Q6_K) {
                for (int i = 0; i < 8; i++) {
                    ms[i * 8 + k] = qt_pair(bs[2 * i], bs[2 * i + 1]);
                }
            } else {
                for (int i = 0; i < 4; i++) {
                    ms[i * 8 + k] = qt_pair(bs[4 * i] + bs[4 * i + 1],
                                            bs[4 * i + 2] + bs[4 * i + 3]);
                }
            }
        }
    }
}


/* ------------------------------------------------------------------ */
/* kernels                                                              */

#define INL    Q8_INL
#define T_AVX2 Q8_T_AVX2
#define T_VNNI Q8_T_VNNI

/* n tokens of one row: out[k] the row kernel's value for the tile's token
 * k; xq: the tile's first token's codes (token k's at xq + k * cols); pk:
 * the tile's packed scalars; pf: bytes from the row to the one whose
 * blocks are fetched ahead, or 0 */
typedef void qt_tile_fn(const uint8_t *row, int il, int64_t nb,
                        const int8_t *xq, int64_t cols, const uint8_t *pk,
                        int n, float *out, ptrdiff_t pf);


/* AVX2: vpmaddubsw's pairs (|u| <= 128, |s| <= 127: below 2^15), summed
 * in fours by vpmaddwd */
#define QT(name) qt_avx2_##name
#define QT_TGT T_AVX2
#define QT_NMAX 4
#define QT_XU 0
#define QT_DOT_S(u, s)                                                      \
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define QT_DOT_U(L, u, s, c)                                                \
    _mm256_add_epi32(L, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), c))
#define QT_MADD(a, x, y) _mm256_add_epi32(a, _mm256_madd_epi16(x, y))
#include "cpu_quant_q8_tiles_isa.h"

/* AVX-VNNI: AVX2's tiles (16 vector registers, so 4 tokens) with
 * vpdpbusd for the fours and vpdpwssd to scale and add, VEX-encoded */
#define QT(name) qt_avxvnni_##name
#define QT_TGT T_AVX2
#define QT_NMAX 4
#define QT_XU 0
#define QT_DOT_S(u, s) q8_vex_dpbusd(_mm256_setzero_si256(), u, s)
#define QT_DOT_U(L, u, s, c)                                                \
    q8_vex_dpwssd(L, _mm256_maddubs_epi16(u, s), c)
#define QT_MADD(a, x, y) q8_vex_dpwssd(a, x, y)
#include "cpu_quant_q8_tiles_isa.h"

/* AVX-512 VNNI on 256-bit vectors: vpdpbusd sums the fours in one step,
 * vpdpwssd scales and adds */
#define QT(name) qt_vnni_##name
#define QT_TGT T_VNNI
#define QT_NMAX 8
#define QT_XU QT_VNNI_XU
#define QT_DOT_S(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define QT_DOT_U(L, u, s, c)                                                \
    _mm256_dpwssd_epi32(L, _mm256_maddubs_epi16(u, s), c)
#define QT_MADD(a, x, y) _mm256_dpwssd_epi32(a, x, y)
#include "cpu_quant_q8_tiles_isa.h"


/* 1 when type t's tiles on isa read x's codes + 128 (QT_XU) */
static inline int
qt_xu(ggml_type t, int isa)
{
    return QT_VNNI_XU && isa == NALAR_ISA_VNNI
           && (t == GGML_Q8_0 || t == GGML_Q4_0);
}


/* the first token of tile i of nt over n tokens (even shares: 17 tokens
 * in tiles of 8 are 5 + 6 + 6, not 8 + 8 + 1) */
static inline int
tile_lo(int n, int nt, int i)
{
    return (int) ((int64_t) n * i / nt);
}


/* rows [r0, r1) by the nt tiles of n_tok tokens (see the file's top) */
static void
qt_rows(qt_tile_fn *f, ggml_type t, const uint8_t *w, int64_t wstride,
        int il, int64_t cols, const int8_t *codes, const uint8_t *pk,
        int64_t tstride, int nt, int n_tok, float *y, int ldy, int64_t r0,
        int64_t r1, int accumulate)
{
    qinfo   qi = { 0, 0, 0, 0 };
    int64_t nb, rg = nalar_quant_x8_tile_rows(t, cols);

    (void) qinfo_of(t, &qi);
    nb = cols / qi.qk;
    for (int64_t g0 = r0; g0 < r1; g0 += rg) {
        int64_t g1 = g0 + rg < r1 ? g0 + rg : r1;

        for (int i = 0; i < nt; i++) {
            int t0 = tile_lo(n_tok, nt, i);
            int n = tile_lo(n_tok, nt, i + 1) - t0;

            for (int64_t r = g0; r < g1; r++) {
                const uint8_t *row = qrow_at(w, wstride, il, qi.qk, qi.bytes,
                                             r);
                ptrdiff_t      pf = 0;
                float          out[8];

                if (i == 0 && r + QT_PF < r1) {
                    pf = qrow_at(w, wstride, il, qi.qk, qi.bytes, r + QT_PF)
                         - row;
                }
                f(row, il, nb, codes + (int64_t) t0 * cols, cols,
                  pk + i * tstride, n, out, pf);
                for (int k = 0; k < n; k++) {
                    float *yp = &y[(int64_t) (t0 + k) * ldy + r];

                    *yp = accumulate ? *yp + out[k] : out[k];
                }
            }
        }
    }
}

#endif


int
nalar_quant_x8_tiles(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                     int il, int64_t cols, const nalar_xq8 *x8, int n_tok,
                     float *y, int ldy, int64_t r0, int64_t r1,
                     int accumulate)
{
#if defined(QT_X86)
    qinfo         qi = { 0, 0, 0, 0 };
    qt_tile_fn   *f;
    int           nmax, nt;
    int64_t       tstride;
    uint8_t      *pk;
    const int8_t *codes;

    if (n_tok < 1 || qinfo_of(t, &qi) != 0 || cols % qi.qk != 0
        || cols % 32 != 0 || (qi.qk == QK_K && x8->qk == NULL))
    {
        return -1;
    }
    f = !nalar_quant_isa_ok(isa) ? NULL
        : isa == NALAR_ISA_VNNI ? qt_vnni_fn(t)
        : isa == NALAR_ISA_AVXVNNI ? qt_avxvnni_fn(t)
        : isa == NALAR_ISA_AVX2 ? qt_avx2_fn(t) : NULL;
    if (f == NULL) {
        return -1;
    }
    if (r0 >= r1) {
        return 0;
    }
    nmax = nalar_quant_x8_tile_max(isa);
    nt = (n_tok + nmax - 1) / nmax;
    tstride = cols / qi.qk * qt_block_stride(t);
    pk = nalar_quant_scratch_slot(1, nt * tstride
                                     + (qt_xu(t, isa)
                                        ? (int64_t) n_tok * cols : 0));
    if (pk == NULL) {
        return -1;
    }
    for (int i = 0; i < nt; i++) {
        int t0 = tile_lo(n_tok, nt, i);

        pack_tile(t, x8, t0, tile_lo(n_tok, nt, i + 1) - t0, cols,
                  pk + i * tstride);
    }
    codes = qi.qk == QK_K ? x8->qk : x8->q;
    if (qt_xu(t, isa)) {
        /* x's codes + 128, after the packed scalars */
        uint8_t *xu = pk + nt * tstride;

        for (int64_t i = 0; i < (int64_t) n_tok * cols; i++) {
            xu[i] = (uint8_t) (codes[i] + 128);
        }
        codes = (const int8_t *) xu;
    }
    qt_rows(f, t, w, wstride, il, cols, codes, pk, tstride, nt, n_tok, y,
            ldy, r0, r1, accumulate);
    return 0;
#else
    (void) t; (void) isa; (void) w; (void) wstride; (void) il; (void) cols;
    (void) x8; (void) n_tok; (void) y; (void) ldy; (void) r0; (void) r1;
    (void) accumulate;
    return -1;
#endif
}
