/*
 * The 16-bit activations' products of several tokens over the K-quants,
 * in tiles (cpu_quant_x16_tiles.h): each row's blocks decoded once for a
 * tile of tokens, with the integers and float operations of the 16-bit
 * mode's exactness contract, so that a token's outputs are the scalar
 * reference's bits in any tile, any batch and any split of the rows.
 * (Q8_0 and Q4_0 have none here: their products with 16-bit codes are
 * cpu_quant_p32.c's.)
 *
 * The contract's integers, per block and token:
 *   Q4_K, Q5_K: L[m] = 256 L_hi[m] + L_lo[m], L_p the 8-bit lanes with
 *     plane p's codes: the lanes of the full 16-bit codes c = 256 hi +
 *     lo, exact in int32.  So these tiles multiply the full codes: per
 *     call, each token's codes are rebuilt once as int16 (the tile
 *     codes, below), and a group of 32 weights is one 512-bit vpdpwssd
 *     per token on VNNI (two 256-bit vpmaddwd on AVX2), against the
 *     weights decoded once per block and row into int16 words times the
 *     group's scale, where the two planes would take two byte products
 *     and two word products.
 *   Q6_K: L_hi and L_lo apart (their sum can pass 2^31), each as the
 *     8-bit tiles make their L (vpmaddubsw of the unsigned codes with the
 *     plane's bytes, then vpdpwssd by the scales), and
 *     t[m] = fma(256, (float) L_hi[m], (float) L_lo[m]).
 *   Min terms: Q4_K/Q5_K I = 256 I_hi + I_lo in one int32 vector for the
 *     tile (vpdpwssd of the mins times 256 against the hi plane's sums,
 *     of the mins against the lo plane's); Q6_K I_hi and I_lo apart, and
 *     fma(256, I_hi, I_lo) as for L.
 * The pair multipliers' Q6_K (nalar_quant_pairs_tiles: x16 holds x' =
 * n c, |x'| <= 8128; cpu_quant_pairs_k6.c's contract): L = 256 L_hi +
 * L_lo exact in int32, acc = fma(s, (float) L, acc), mn = fma(s, 32
 * (float) J, mn) with J = 256 J_hi + J_lo.  On VNNI from the tile codes
 * x' as int16, as Q4_K's (one 512-bit vpdpwssd per group and token
 * against the weights' words times their sub-blocks' scales; 8 tokens a
 * tile, passes of XT_CHUNK columns): 0.85-0.91x the 16-bit Q6_K tile's
 * time in bench/tiles.c; on AVX2 from the planes as the 16-bit Q6_K
 * tile, L_hi and L_lo folded in integer (the int16 codes' way measured
 * 1.05-1.10x the 16-bit tile's time there, this one 0.96-1.02x).
 *
 * The tile codes of a group of 32 weights: 64 bytes, the 16 codes of the
 * even weights 0, 2, .., 30 as int16, then those of the odd ones.  In
 * vpdpwssd's lane m (int16 words 2m, 2m + 1 of a 256-bit vector: within
 * a 128-bit half, weights 4m, 4m + 2 of the evens, 4m + 1, 4m + 3 of the
 * odds) the two products add up weights 4m .. 4m + 3: the contract's
 * lane, with no shuffle of x or of the weights.  The weights' words come
 * the same way: the even bytes and the odd bytes of the group's 32 codes
 * (vpmaddubsw of the unsigned codes with (sc, 0) and (0, sc) pairs,
 * which multiplies in the scale).
 *
 * Per call, as in the 8-bit tiles: each tile's per-block scalars packed
 * once (x's scales as one vector, lane k the tile's token k; the sums of
 * each plane's codes that the min terms read, as int16 pairs per lane).
 * Per call too, each tile's codes are laid out interleaved (xt_codes):
 * per group of 32 weights the tile's tokens' 64 bytes one after another,
 * so that a group's loads for the tile are one run of aligned lines, and
 * no two tokens' codes compete for the same L1 sets (rows of codes a
 * multiple of 4 KB apart did: Q4_K 5.5 -> 4.5 ns per 256 weights and
 * token, Q5_K 6.1 -> 4.8 in bench/tiles.c).
 *
 * Order of the work: the rows in groups (nalar_quant_x8_tile_rows), each
 * tile of tokens over a group's rows in turn, the first tile streaming
 * them from memory with a prefetch XT_PF rows on.  A kernel's step takes
 * R rows (xt_step_rows): each load of x's codes feeds the R rows' lanes.
 * One row for Q4_K/Q5_K (on VNNI two rows' 16 512-bit lanes and 16
 * chains spill: no faster; AVX2 has 16 registers) and for Q6_K (two
 * measured slower).  In a step of two rows (XT_*_R4 2), a group's odd
 * last row goes as both rows of a step, the copy's outputs dropped.
 * Q4_K's and Q5_K's tiles go over a group's rows XT_CHUNK columns at a
 * time, keeping each row's chains (acc per token, mn) between passes: the
 * int16 codes of 8 tokens are 2 bytes a column each (128 KB for an
 * 8192-column row), and a pass's stay in L1 while the group's rows go by.
 * The chains take the same operations in the same order either way.
 *
 * What bounds them (perf on one thread, Zen 4): Q4_K/Q5_K's 512-bit
 * vpdpwssd, one per group and token, run at one a cycle, 8 cycles per
 * 256 weights and token, the 8-bit tiles' multiply count (vpmaddubsw and
 * vpdpwssd, 256-bit, two a cycle); the rest is the groups' decode, the
 * blocks' float steps and fold, and the mins' integers.  Q6_K multiplies
 * each plane apart (two byte products and two word products a group and
 * token: twice the 8-bit tiles'), since its lanes can pass 2^31 and the
 * contract rounds each plane's.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_q8_tiles.h"
#include "cpu_quant_x16_tiles.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define XT_X86 1
#endif

#define XT_PF 16                     /* rows ahead the first tile fetches */
#ifndef XT_CHUNK
#define XT_CHUNK 1024                /* columns of a tile's pass over rows */
#endif


/* the rows of a step (1 or 2) and the most tokens of a tile, per
 * instruction set and kernel (Q4_K/Q5_K, Q6_K), as measured (the file's
 * top); each a -D of its own for the next measurement */
#ifndef XT_VNNI_R4
#define XT_VNNI_R4 1
#endif
#ifndef XT_AVX2_R4
#define XT_AVX2_R4 1
#endif
#ifndef XT_VNNI_N4
#define XT_VNNI_N4 8
#endif
#ifndef XT_VNNI_N6
#define XT_VNNI_N6 6
#endif


/* measured (bench/tiles.c): Q6_K's 3N accumulators (L_hi, L_lo, acc)
 * take VNNI's 32 registers at 6 tokens; AVX2's 16 hold 4 of every type */
int
nalar_quant_x16_tile_max(ggml_type t, int isa)
{
    if (isa == NALAR_ISA_VNNI) {
        return t == GGML_Q6_K ? XT_VNNI_N6 : XT_VNNI_N4;
    }
    return 4;
}


/* the pairs' tiles: Q6_K's as Q4_K's (N int16-code lanes and N chains,
 * the same registers), Q4_K's and Q5_K's the 16-bit ones */
int
nalar_quant_pairs_tile_max(ggml_type t, int isa)
{
    if (t == GGML_Q6_K) {
        return nalar_quant_x16_tile_max(GGML_Q4_K, isa);
    }
    return nalar_quant_x16_tile_max(t, isa);
}


/* the rows of a tile kernel's step (cpu_quant_x16_tiles_isa.h): Q6_K
 * one, Q4_K and Q5_K XT_*_R4 */
static int
xt_step_rows(ggml_type t, int isa)
{
    if (t == GGML_Q6_K) {
        return 1;
    }
    return isa == NALAR_ISA_VNNI ? XT_VNNI_R4 : XT_AVX2_R4;
}


#if defined(XT_X86)

/* ------------------------------------------------------------------ */
/* the tiles' codes and packed scalars                                  */


/* bytes per block of a tile's packed scalars: x's 8 scales (float), then
 * each plane's min sums, hi then lo, 8 lanes of int16 pairs per step (4
 * steps a plane for Q4_K/Q5_K, 8 for Q6_K) */
static inline int64_t
xt_block_stride(ggml_type t)
{
    return t == GGML_Q6_K ? 32 + 2 * 8 * 32 : 32 + 2 * 4 * 32;
}


/* two int16 (each |v| < 2^15) as the int32 lane vpmaddwd reads as a pair,
 * a in the low half */
static inline uint32_t
xt_pair(int32_t a, int32_t b)
{
    return (uint32_t) (uint16_t) (int16_t) a
           | (uint32_t) (uint16_t) (int16_t) b << 16;
}


/*
 * The packed scalars of tokens t0 .. t0 + n - 1 (n <= 8) for type t into
 * pk: per block b, float dx[8] (lanes n .. 7 zero), and uint32
 * ms[2][steps][8] (plane hi, then lo), lane k of step i:
 *   Q4_K/Q5_K: (xs_2i, xs_2i+1), xs_j the sum of the plane's 32 codes of
 *              sub-block j (|xs_j| <= 32 * 128);
 *   Q6_K:      (bs_2i, bs_2i+1), bs_j the sum of its 16 codes.
 */
static void
xt_pack(ggml_type t, const nalar_xq16 *x, int t0, int n, int64_t cols,
        uint8_t *pk)
{
    int64_t nb = cols / QK_K, bstride = xt_block_stride(t);
    int     steps = t == GGML_Q6_K ? 8 : 4;

    memset(pk, 0, (size_t) (nb * bstride));
    for (int k = 0; k < n; k++) {
        int64_t tk = t0 + k;

        for (int64_t b = 0; b < nb; b++) {
            float *dx = (float *) (pk + b * bstride);

            dx[k] = x->hi.dk[tk * nb + b];
            for (int pl = 0; pl < 2; pl++) {
                const nalar_xq8 *xp = pl ? &x->lo : &x->hi;
                const int32_t   *bs = xp->bs + tk * (cols / 16) + 16 * b;
                uint32_t        *ms = (uint32_t *) (pk + b * bstride + 32
                                                   + pl * steps * 32);

                for (int i = 0; i < steps; i++) {
                    ms[i * 8 + k] = t == GGML_Q6_K
                        ? xt_pair(bs[2 * i], bs[2 * i + 1])
                        : xt_pair(bs[4 * i] + bs[4 * i + 1],
                                  bs[4 * i + 2] + bs[4 * i + 3]);
                }
            }
        }
    }
}


/*
 * The codes of tokens t0 .. t0 + n - 1 (one tile) into c, interleaved:
 * per group g of 32 weights, each token's 64 bytes in turn (token k at
 * c + (g n + k) 64), so that a group's codes for the whole tile are one
 * run of n lines, and a pass over columns reads one run of memory (the
 * tokens' rows a multiple of 4 KB apart would fall in the same L1 sets).
 *   Q6_K (but full): the planes' 32 bytes, hi then lo;
 *   Q4_K, Q5_K, and Q6_K where full (the pairs' on VNNI): the tile codes
 *     c = 256 hi + lo (|c| <= 32639), the even weights' 16 int16 then
 *     the odd ones'.  In int16 words of the
 *     planes' bytes, word i holds weight 2i's byte low and 2i + 1's high:
 *     a left shift by 8 gives 256 times the even byte, a mask 256 times
 *     the odd one, arithmetic shifts the bytes sign-extended.
 */
static Q8_T_AVX2 void
xt_codes(ggml_type t, int full, const nalar_xq16 *x, int t0, int n,
         int64_t cols, uint8_t *c)
{
    const __m256i m = _mm256_set1_epi16((short) 0xFF00);
    const int8_t *ph = x->hi.qk, *pl = x->lo.qk;

    for (int k = 0; k < n; k++) {
        const int8_t *hi = ph + (int64_t) (t0 + k) * cols;
        const int8_t *lo = pl + (int64_t) (t0 + k) * cols;
        uint8_t      *ck = c + 64 * k;

        for (int64_t i = 0; i < cols; i += 32, ck += 64 * n) {
            __m256i h = _mm256_loadu_si256((const __m256i *) (hi + i));
            __m256i l = _mm256_loadu_si256((const __m256i *) (lo + i));

            if (t == GGML_Q6_K && !full) {
                _mm256_storeu_si256((__m256i *) ck, h);
                _mm256_storeu_si256((__m256i *) (ck + 32), l);
                continue;
            }
            _mm256_storeu_si256((__m256i *) ck, _mm256_add_epi16(
                                    _mm256_slli_epi16(h, 8),
                                    _mm256_srai_epi16(
                                        _mm256_slli_epi16(l, 8), 8)));
            _mm256_storeu_si256((__m256i *) (ck + 32), _mm256_add_epi16(
                                    _mm256_and_si256(h, m),
                                    _mm256_srai_epi16(l, 8)));
        }
    }
}


/* ------------------------------------------------------------------ */
/* kernels                                                              */

#define INL    Q8_INL
#define T_AVX2 Q8_T_AVX2
#define T_VNNI Q8_T_VNNI

/* the blocks of one call of a tile kernel: [b0, b1) of the row's nb, and
 * st, the chains of the call's rows (row r's at st + r XT_ST: each
 * token's acc, then the tile's mn, 32-byte aligned) kept from the call
 * before (b0 > 0) and for the call after (b1 < nb) */
typedef struct {
    int64_t b0, b1, nb;
    float  *st;
} xt_span;

#define XT_ST (8 * (8 + 1))

/* n tokens of the step's rows row[r] (xt_step_rows), the blocks of sp:
 * out[8 r + k] the reference's value for row r and the tile's token k
 * (when sp->b1 is the row's end); xa: the tile's codes (xt_codes); pk:
 * its packed scalars; pf[r]: bytes from row r to the one whose blocks are
 * fetched ahead, or 0 */
typedef void xt_tile_fn(const uint8_t *const *row, int il, const xt_span *sp,
                        const uint8_t *xa, const uint8_t *pk, int n,
                        float *out, const ptrdiff_t *pf);


/* AVX2: vpmaddwd, added; vpmaddubsw's pairs (|u| <= 63, |s| <= 128:
 * below 2^15) summed in fours by vpmaddwd */
#define XT(name) xt_avx2_##name
#define XT_TGT T_AVX2
#define XT_NMAX 4
#define XT_R4 XT_AVX2_R4
#define XT_WIDE 0
#define XT_MADD(a, x, y) _mm256_add_epi32(a, _mm256_madd_epi16(x, y))
#define XT_DOT_U(L, u, s, c)                                                \
    _mm256_add_epi32(L, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), c))
#include "cpu_quant_x16_tiles_isa.h"
#undef XT
#undef XT_TGT
#undef XT_NMAX
#undef XT_MADD
#undef XT_DOT_U
#undef XT_WIDE
#undef XT_R4

/* AVX-512 VNNI: vpdpwssd multiplies and adds; Q4_K/Q5_K's groups in
 * 512-bit steps (XT_WIDE) */
#define XT(name) xt_vnni_##name
#define XT_TGT T_VNNI
#define XT_NMAX 8
#define XT_R4 XT_VNNI_R4
#define XT_WIDE 1
#define XT_MADD(a, x, y) _mm256_dpwssd_epi32(a, x, y)
#define XT_DOT_U(L, u, s, c)                                                \
    _mm256_dpwssd_epi32(L, _mm256_maddubs_epi16(u, s), c)
#include "cpu_quant_x16_tiles_isa.h"
#undef XT
#undef XT_TGT
#undef XT_NMAX
#undef XT_MADD
#undef XT_DOT_U
#undef XT_WIDE
#undef XT_R4


/* the first token of tile i of nt over n tokens (even shares) */
static inline int
tile_lo(int n, int nt, int i)
{
    return (int) ((int64_t) n * i / nt);
}


/* rows [r0, r1) by the nt tiles of n_tok tokens (see the file's top),
 * each tile over a group's rows XT_CHUNK columns at a time where chunk
 * (the int16 tile codes of Q4_K, Q5_K and the pairs' Q6_K on VNNI); xc:
 * the tiles' codes (token t0's tile at t0 * 2 cols bytes); st: XT_ST
 * floats for each row of a group */
static void
xt_rows(xt_tile_fn *f, int R, ggml_type t, int chunk, const uint8_t *w,
        int64_t wstride, int il, int64_t cols, const uint8_t *xc,
        const uint8_t *pk, int64_t tstride, int nt, int n_tok, float *st,
        float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    qinfo   qi = { 0, 0, 0, 0 };
    int64_t nb, cb, rg = nalar_quant_x8_tile_rows(t, cols);

    (void) qinfo_of(t, &qi);
    nb = cols / qi.qk;
    /* Q4_K/Q5_K (and the pairs' Q6_K, whose codes are as theirs) in
     * passes of XT_CHUNK columns; the 16-bit Q6_K in one (the chains'
     * loads and stores per pass measured slower there: 6.3-6.5 against
     * 6.0-6.1 ns per 256 weights and token in bench/tiles.c; Q4_K 5.0-5.6
     * against 5.8-6.1; a busy machine) */
    cb = chunk ? XT_CHUNK / qi.qk : nb;
    for (int64_t g0 = r0; g0 < r1; g0 += rg) {
        int64_t g1 = g0 + rg < r1 ? g0 + rg : r1;

        for (int i = 0; i < nt; i++) {
            int     t0 = tile_lo(n_tok, nt, i);
            int     n = tile_lo(n_tok, nt, i + 1) - t0;
            xt_span sp;

            sp.nb = nb;
            for (sp.b0 = 0; sp.b0 < nb; sp.b0 = sp.b1) {
                sp.b1 = sp.b0 + cb < nb ? sp.b0 + cb : nb;
                for (int64_t r = g0; r < g1; r += R) {
                    const uint8_t *row[2];
                    ptrdiff_t      pf[2];
                    float          out[2 * 8];

                    /* a group's odd last row: twice, its copy's outputs
                     * dropped */
                    for (int j = 0; j < R; j++) {
                        int64_t rj = r + j < g1 ? r + j : r;

                        /* one expression each (zeroing pf apart became a
                         * rep stos per call: 3-7% of the time) */
                        row[j] = qrow_at(w, wstride, il, qi.qk, qi.bytes, rj);
                        pf[j] = i == 0 && rj + XT_PF < r1
                                ? qrow_at(w, wstride, il, qi.qk, qi.bytes,
                                          rj + XT_PF) - row[j]
                                : 0;
                    }
                    sp.st = st + (r - g0) * XT_ST;
                    f(row, il, &sp, xc + (int64_t) t0 * 2 * cols,
                      pk + i * tstride, n, out, pf);
                    for (int j = 0; j < R && r + j < g1 && sp.b1 == nb;
                         j++)
                    {
                        for (int k = 0; k < n; k++) {
                            float *yp = &y[(int64_t) (t0 + k) * ldy + r + j];

                            *yp = accumulate ? *yp + out[8 * j + k]
                                  : out[8 * j + k];
                        }
                    }
                }
            }
        }
    }
}

#endif


/* the tiles of t (pairs: the pairs mode's Q6_K, cpu_quant_pairs_k6.c),
 * as nalar_quant_x16_tiles */
static int
xt_run(ggml_type t, int pairs, int isa, const uint8_t *w, int64_t wstride,
       int il, int64_t cols, const nalar_xq16 *x, int n_tok, float *y,
       int ldy, int64_t r0, int64_t r1, int accumulate)
{
#if defined(XT_X86)
    qinfo          qi = { 0, 0, 0, 0 };
    xt_tile_fn    *f;
    int            nmax, nt, full;
    int64_t        tstride, cbytes, sbytes, pbytes;
    uint8_t       *pk, *xc;
    float         *st;

    /* the K-quants alone (Q8_0, Q4_0: cpu_quant_p32.c) */
    if (n_tok < 1 || qinfo_of(t, &qi) != 0 || qi.qk != QK_K
        || cols % QK_K != 0 || x->hi.qk == NULL || x->lo.qk == NULL)
    {
        return -1;
    }
    if (!nalar_quant_isa_ok(isa)) {
        return -1;
    }
    isa = nalar_quant_isa_sans_avxvnni(isa);
    pairs = pairs && t == GGML_Q6_K;
    /* the pairs' Q6_K from the int16 tile codes on VNNI, from the planes
     * on AVX2 (cpu_quant_x16_tiles_isa.h) */
    full = pairs && isa == NALAR_ISA_VNNI;
    f = isa == NALAR_ISA_VNNI ? (pairs ? xt_vnni_tile_q6k_pairs
                                 : xt_vnni_fn(t))
        : isa == NALAR_ISA_AVX2 ? (pairs ? xt_avx2_tile_q6k_pairs
                                   : xt_avx2_fn(t))
        : NULL;
    if (f == NULL) {
        return -1;
    }
    if (r0 >= r1) {
        return 0;
    }
    nmax = pairs ? nalar_quant_pairs_tile_max(t, isa)
           : nalar_quant_x16_tile_max(t, isa);
    nt = (n_tok + nmax - 1) / nmax;
    tstride = cols / qi.qk * xt_block_stride(t);
    /* the rows' chains, the packed scalars, then the tiles' codes, each
     * on a cache line of its own (a tile's codes for a group: 64-byte
     * loads, none split across lines) */
    cbytes = (int64_t) n_tok * cols * 2;
    sbytes = ((nalar_quant_x8_tile_rows(t, cols) + 1) * XT_ST * 4 + 63) & ~63;
    pbytes = (nt * tstride + 63) & ~63;
    st = nalar_quant_scratch_slot(1, sbytes + pbytes + cbytes);
    if (st == NULL) {
        return -1;
    }
    pk = (uint8_t *) st + sbytes;
    xc = pk + pbytes;
    for (int i = 0; i < nt; i++) {
        int t0 = tile_lo(n_tok, nt, i);
        int n = tile_lo(n_tok, nt, i + 1) - t0;

        xt_pack(t, x, t0, n, cols, pk + i * tstride);
        xt_codes(t, full, x, t0, n, cols, xc + (int64_t) t0 * 2 * cols);
    }
    xt_rows(f, pairs ? 1 : xt_step_rows(t, isa), t,
            full || t == GGML_Q4_K || t == GGML_Q5_K, w, wstride, il, cols,
            xc, pk, tstride, nt, n_tok, st, y, ldy, r0, r1, accumulate);
    return 0;
#else
    (void) t; (void) pairs; (void) isa; (void) w; (void) wstride; (void) il;
    (void) cols; (void) x; (void) n_tok; (void) y; (void) ldy; (void) r0;
    (void) r1; (void) accumulate;
    return -1;
#endif
}


int
nalar_quant_x16_tiles(ggml_type t, int isa, const uint8_t *w,
                      int64_t wstride, int il, int64_t cols,
                      const nalar_xq16 *x, int n_tok, float *y, int ldy,
                      int64_t r0, int64_t r1, int accumulate)
{
    return xt_run(t, 0, isa, w, wstride, il, cols, x, n_tok, y, ldy, r0, r1,
                  accumulate);
}


int
nalar_quant_pairs_tiles(ggml_type t, int isa, const uint8_t *w,
                        int64_t wstride, int il, int64_t cols,
                        const nalar_xq16 *x, int n_tok, float *y, int ldy,
                        int64_t r0, int64_t r1, int accumulate)
{
    return xt_run(t, 1, isa, w, wstride, il, cols, x, n_tok, y, ldy, r0, r1,
                  accumulate);
}
