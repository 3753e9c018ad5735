/*
 * The 16-bit activations' products over Q8_0 and Q4_0 weights, on the
 * weights in panels of 16 rows (cpu_quant_p32.h).
 *
 * The contract.  x's codes are the 16-bit mode's per 32 (cpu_quant_x16.c:
 * c = 256 hi + lo, |c| <= 32639, a float scale d_x per 32).  For row r
 * and token t, over the row's blocks b in order, from acc = 0:
 *   L_b = sum_i w_i c_i over the block's 32 weights (w_i Q8_0's int8
 *         code, or Q4_0's nibble less 8), exact in int32
 *         (|L_b| <= 32 * 128 * 32639 < 2^31);
 *   s_b = d_w * d_x (float: d_w the block's f16 scale, exact in float);
 *   acc = fmaf(s_b, (float) L_b, acc);
 * and y = acc (y + acc when accumulating).  Each (row, token) output is a
 * function of that row and that token's codes alone, so every path (the
 * scalar reference, AVX2, AVX-512 VNNI; one token or a tile of them; any
 * split of the rows over threads) gives the same bits, whatever the batch.
 * A block is summed in integer before any float operation, so a block
 * costs one float step per row and token, which the panels spread over
 * 16 rows: a vector's lanes are 16 rows' chains.
 *
 * The panels (layout il = P32_IL).  Rows in groups of 16 (the last padded
 * with rows of zero scales and codes); a panel's blocks in order, each a
 * record of 16 * (the block's bytes):
 *   bytes 0 .. 31:  the 16 rows' f16 scales, row j's at 2j;
 *   then chunks of 64 bytes, bytes 4j .. 4j + 3 of chunk k being row j's
 *   code bytes 4k .. 4k + 3: Q4_0 4 chunks of its 16 bytes of nibbles
 *   (low nibble of byte i weight i, high nibble weight i + 16), Q8_0 8
 *   chunks of its 32 codes, each stored as w + 128 (an unsigned byte).
 * So one 64-byte load is a group of 4 weights of 16 rows, a 32-bit lane
 * a row: `vpdpbusd` of that (unsigned) against 4 of x's bytes broadcast
 * sums the 16 rows' 4 products at once.  The unsigned weights' offset
 * comes off per token and block: L = 256 A_hi + A_lo - K * sum_i c_i, A_p
 * the sums against plane p, K = 8 (Q4_0) or 128 (Q8_0), exact in int32.
 *
 * The kernels.  AVX-512 VNNI: per panel and block, the weights' 8
 * vectors made once (Q4_0's nibbles split by and/shift) for a tile of up
 * to 8 tokens, 16 `vpdpbusd` per token (8 groups of 4 weights, 2 planes),
 * then one convert, one multiply and one FMA for the 16 rows.  AVX2: a
 * panel's two halves of 8 rows, `vpmaddubsw` of the nibbles (Q8_0's w +
 * 128 as two nibbles, 16 uh + ul) against x's bytes, the 8 groups'
 * words summed (|sum| <= 8 * 2 * 15 * 128 < 2^15), one `vpmaddwd` by
 * ones (or 16) to int32.  Panels go in order, each tile of tokens over
 * a panel in turn, so a panel's blocks stay in cache for the tiles.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_p32.h"
#include "cpu_quant_q8_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define P32_X86 1
#endif

#define P32_TILE 8       /* tokens of a tile */
#ifndef P32_PF
#define P32_PF 16384     /* bytes ahead of a block that its step fetches
                            into L2, every line of the record (one token's
                            decode of Q8_0: 8, 32 or 64 KB, or into L1 or
                            past the caches, all within 4% of it) */
#endif


int
nalar_quant_p32_type(ggml_type t)
{
    return t == GGML_Q8_0 || t == GGML_Q4_0;
}


/* bytes of one block (the type's, cpu_quant_blocks.h), and of one
 * panel's record of a block */
static int64_t
p32_block_bytes(ggml_type t)
{
    qinfo qi = { 0, 0, 0, 0 };

    (void) qinfo_of(t, &qi);
    return qi.bytes;
}


static int64_t
p32_rec(ggml_type t)
{
    return P32_ROWS * p32_block_bytes(t);
}


int64_t
nalar_quant_p32_bytes(ggml_type t, int64_t rows, int64_t cols)
{
    if (!nalar_quant_p32_type(t) || cols % 32 != 0) {
        return 0;
    }
    return (rows + P32_ROWS - 1) / P32_ROWS * (cols / 32) * p32_rec(t);
}


/* the code bytes of a block (after its f16 scale), and how many */
static int
p32_code_bytes(ggml_type t)
{
    return (int) p32_block_bytes(t) - 2;
}


/* where a record holds code byte i of its row j: chunk i / 4, lane j */
static inline int
p32_code_at(int i, int j)
{
    return 32 + (i / 4) * 64 + 4 * j + i % 4;
}


void
nalar_quant_p32_pack(ggml_type t, const uint8_t *src, int64_t wstride,
                     int il, int64_t rows, int64_t cols, uint8_t *dst)
{
    int64_t nb = cols / 32, np = (rows + P32_ROWS - 1) / P32_ROWS;
    int64_t bytes = p32_block_bytes(t);
    int     nc = p32_code_bytes(t), flip = t == GGML_Q8_0 ? 0x80 : 0;

    for (int64_t p = 0; p < np; p++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = dst + (p * nb + b) * p32_rec(t);

            memset(rec, 0, (size_t) p32_rec(t));
            for (int j = 0; j < P32_ROWS; j++) {
                int64_t        r = p * P32_ROWS + j;
                const uint8_t *blk;

                if (r >= rows) {
                    /* zero codes: Q8_0's stored w + 128 */
                    for (int i = 0; i < nc; i++) {
                        rec[p32_code_at(i, j)] = (uint8_t) flip;
                    }
                    continue;
                }
                blk = qblock_at(src, wstride, il, 32, bytes, r, b);
                memcpy(rec + 2 * j, blk, 2);
                for (int i = 0; i < nc; i++) {
                    rec[p32_code_at(i, j)] = (uint8_t) (blk[2 + i] ^ flip);
                }
            }
        }
    }
}


void
nalar_quant_p32_block(ggml_type t, const uint8_t *w, int64_t cols,
                      int64_t r, int64_t b, uint8_t *blk)
{
    int64_t        nb = cols / 32;
    int            j = (int) (r % P32_ROWS);
    int            nc = p32_code_bytes(t), flip = t == GGML_Q8_0 ? 0x80 : 0;
    const uint8_t *rec = w + ((r / P32_ROWS) * nb + b) * p32_rec(t);

    memcpy(blk, rec + 2 * j, 2);
    for (int i = 0; i < nc; i++) {
        blk[2 + i] = (uint8_t) (rec[p32_code_at(i, j)] ^ flip);
    }
}


void
nalar_quant_p32_unpack(ggml_type t, const uint8_t *src, int64_t rows,
                       int64_t cols, int il, int64_t wstride, uint8_t *dst)
{
    int64_t nb = cols / 32, bytes = p32_block_bytes(t);
    int64_t n = il ? (rows + QIL - 1) / QIL * QIL : rows;

    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *d = (uint8_t *) qblock_at(dst, wstride, il, 32, bytes,
                                               r, b);

            if (r < rows) {
                nalar_quant_p32_block(t, src, cols, r, b, d);
            } else {
                memset(d, 0, (size_t) bytes);
            }
        }
    }
}


/* ------------------------------------------------------------------ */
/* scalar reference                                                     */


/* the contract's L of one block (the file's bytes) against codes hi, lo */
static int32_t
p32_block_dot(ggml_type t, const uint8_t *blk, const int8_t *hi,
              const int8_t *lo)
{
    qblock  B;
    int32_t L = 0;

    decode_q_scalar(t, blk, &B);
    for (int i = 0; i < 32; i++) {
        L += (int32_t) B.q[i] * (256 * (int32_t) hi[i] + (int32_t) lo[i]);
    }
    return L;
}


void
nalar_quant_p32_scalar(ggml_type t, const uint8_t *w, int64_t wstride,
                       int il, int64_t cols, const nalar_xq16 *x16,
                       int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    int64_t nb = cols / 32, bytes = p32_block_bytes(t);

    if (!nalar_quant_p32_type(t) || cols % 32 != 0) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            const int8_t *hi = x16->hi.q + (int64_t) tk * cols;
            const int8_t *lo = x16->lo.q + (int64_t) tk * cols;
            const float  *dx = x16->hi.d + (int64_t) tk * nb;
            float         acc = 0, *yp = &y[(int64_t) tk * ldy + r];

            for (int64_t b = 0; b < nb; b++) {
                uint8_t        own[2 + QK8_0];
                const uint8_t *blk = own;
                int32_t        L;

                if (il == P32_IL) {
                    nalar_quant_p32_block(t, w, cols, r, b, own);
                } else {
                    blk = qblock_at(w, wstride, il, 32, bytes, r, b);
                }
                L = p32_block_dot(t, blk, hi + 32 * b, lo + 32 * b);
                acc = fmaf(f16_at(blk) * dx[b], (float) L, acc);
            }
            *yp = accumulate ? *yp + acc : acc;
        }
    }
}


/* ------------------------------------------------------------------ */
/* kernels                                                              */


/* K * sum_i c_i per block of each token (the unsigned weights' offset) */
static void
p32_offsets(ggml_type t, const nalar_xq16 *x16, int n_tok, int64_t cols,
            int32_t *off)
{
    int64_t nb = cols / 32;
    int32_t K = t == GGML_Q8_0 ? 128 : 8;

    for (int64_t tk = 0; tk < n_tok; tk++) {
        const int8_t *hi = x16->hi.q + tk * cols, *lo = x16->lo.q + tk * cols;

        for (int64_t b = 0; b < nb; b++) {
            int32_t s = 0;

            for (int i = 0; i < 32; i++) {
                s += 256 * (int32_t) hi[32 * b + i] + (int32_t) lo[32 * b + i];
            }
            off[tk * nb + b] = K * s;
        }
    }
}


#if defined(P32_X86)

/* what a tile reads: the panel's records, its tokens' codes (cols
 * apart), scales (nb apart) and offsets (nb apart) */
typedef struct {
    const uint8_t *pan;
    int64_t        nb, cols;
    const int8_t  *hi, *lo;
    const float   *dx;
    const int32_t *off;
} p32_tile;


/* panel p's records and tokens t0 .. of the codes, for a tile */
static inline p32_tile
p32_tile_at(ggml_type t, const uint8_t *w, int64_t cols,
            const nalar_xq16 *x16, const int32_t *off, int64_t p, int t0)
{
    int64_t  nb = cols / 32;
    p32_tile T = { w + p * nb * p32_rec(t), nb, cols,
                   x16->hi.q + (int64_t) t0 * cols,
                   x16->lo.q + (int64_t) t0 * cols,
                   x16->hi.d + (int64_t) t0 * nb, off + (int64_t) t0 * nb };

    return T;
}


static inline int32_t
p32_x4(const int8_t *p)
{
    int32_t v;

    memcpy(&v, p, 4);
    return v;
}


/* N tokens over one panel (VNNI): acc[n] the 16 rows' chains of token n */
static Q8_INL Q8_T_VNNI void
p32_vnni_tile(ggml_type t, const p32_tile *T, const int N, __m512 *acc)
{
    const int64_t rec = p32_rec(t);
    const __m512i m4 = _mm512_set1_epi8(0x0F);

#pragma GCC unroll 8
    for (int n = 0; n < N; n++) {
        acc[n] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < T->nb; b++) {
        const uint8_t *p = T->pan + b * rec;
        __m512i        wv[8];
        __m512         dw = _mm512_cvtph_ps(
                               _mm256_loadu_si256((const __m256i *) p));

        for (int64_t o = 0; o < rec; o += 64) {
            _mm_prefetch((const char *) p + P32_PF + o, _MM_HINT_T1);
        }
        if (t == GGML_Q4_0) {
            for (int k = 0; k < 4; k++) {
                __m512i c = _mm512_loadu_si512(p + 32 + 64 * k);

                wv[k] = _mm512_and_si512(c, m4);
                wv[k + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
            }
        } else {
            for (int k = 0; k < 8; k++) {
                wv[k] = _mm512_loadu_si512(p + 32 + 64 * k);
            }
        }
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *h = T->hi + n * T->cols + 32 * b;
            const int8_t *l = T->lo + n * T->cols + 32 * b;
            __m512i       a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0;
            __m512i       a3 = a0, L;
            __m512        s;

            for (int g = 0; g < 8; g += 2) {
                a0 = _mm512_dpbusd_epi32(a0, wv[g],
                                         _mm512_set1_epi32(p32_x4(h + 4 * g)));
                a1 = _mm512_dpbusd_epi32(a1, wv[g + 1], _mm512_set1_epi32(
                                             p32_x4(h + 4 * g + 4)));
                a2 = _mm512_dpbusd_epi32(a2, wv[g],
                                         _mm512_set1_epi32(p32_x4(l + 4 * g)));
                a3 = _mm512_dpbusd_epi32(a3, wv[g + 1], _mm512_set1_epi32(
                                             p32_x4(l + 4 * g + 4)));
            }
            L = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(a0, a1),
                                                   8),
                                 _mm512_add_epi32(a2, a3));
            L = _mm512_sub_epi32(L, _mm512_set1_epi32(T->off[n * T->nb + b]));
            s = _mm512_mul_ps(dw, _mm512_set1_ps(T->dx[n * T->nb + b]));
            acc[n] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(L), acc[n]);
        }
    }
}


/* the chains of a tile into y's rows [lo, hi) of panel row0 */
static Q8_INL Q8_T_VNNI void
p32_vnni_store(const __m512 *acc, int N, float *y, int ldy, int64_t row0,
               int64_t lo, int64_t hi, int accumulate)
{
    __mmask16 m = (__mmask16) (((1u << (hi - row0)) - 1)
                               & ~((1u << (lo - row0)) - 1));

    for (int n = 0; n < N; n++) {
        float *yp = y + (int64_t) n * ldy + row0;
        __m512 v = acc[n];

        if (accumulate) {
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yp), v);
        }
        _mm512_mask_storeu_ps(yp, m, v);
    }
}


static Q8_T_VNNI void
p32_vnni(ggml_type t, const uint8_t *w, int64_t cols, const nalar_xq16 *x16,
         const int32_t *off, int n_tok, float *y, int ldy, int64_t r0,
         int64_t r1, int accumulate)
{
    for (int64_t p = r0 / P32_ROWS; p * P32_ROWS < r1; p++) {
        int64_t row0 = p * P32_ROWS;
        int64_t lo = r0 > row0 ? r0 : row0;
        int64_t hi = r1 < row0 + P32_ROWS ? r1 : row0 + P32_ROWS;

        for (int t0 = 0; t0 < n_tok; t0 += P32_TILE) {
            int      N = n_tok - t0 < P32_TILE ? n_tok - t0 : P32_TILE;
            __m512   acc[P32_TILE] = { 0 };
            p32_tile T = p32_tile_at(t, w, cols, x16, off, p, t0);

            switch (N) {
            case 1: p32_vnni_tile(t, &T, 1, acc); break;
            case 2: p32_vnni_tile(t, &T, 2, acc); break;
            case 3: p32_vnni_tile(t, &T, 3, acc); break;
            case 4: p32_vnni_tile(t, &T, 4, acc); break;
            case 5: p32_vnni_tile(t, &T, 5, acc); break;
            case 6: p32_vnni_tile(t, &T, 6, acc); break;
            case 7: p32_vnni_tile(t, &T, 7, acc); break;
            default: p32_vnni_tile(t, &T, 8, acc); break;
            }
            p32_vnni_store(acc, N, y + (int64_t) t0 * ldy, ldy, row0, lo, hi,
                           accumulate);
        }
    }
}


/* AVX2: the 8-row half h of a panel; the words of nibbles q (8 groups)
 * against x's bytes of one plane, summed to int32 per row */
static Q8_INL Q8_T_AVX2 __m256i
p32_avx2_plane(const __m256i *q, const int8_t *x, __m256i by)
{
    __m256i s = _mm256_setzero_si256();

    for (int g = 0; g < 8; g++) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(
                                    q[g], _mm256_set1_epi32(p32_x4(x + 4 * g))));
    }
    return _mm256_madd_epi16(s, by);
}


static Q8_INL Q8_T_AVX2 void
p32_avx2_tile(ggml_type t, const p32_tile *T, int h, const int N,
              __m256 *acc)
{
    const int64_t rec = p32_rec(t);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);

    for (int n = 0; n < N; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < T->nb; b++) {
        const uint8_t *p = T->pan + b * rec;
        __m256i        lo4[8], hi4[8];
        __m256         dw = _mm256_cvtph_ps(
                               _mm_loadu_si128((const __m128i *) p + h));

        /* the first half streams the panel; the second finds it cached */
        for (int64_t o = 0; h == 0 && o < rec; o += 64) {
            _mm_prefetch((const char *) p + P32_PF + o, _MM_HINT_T1);
        }
        if (t == GGML_Q4_0) {
            for (int k = 0; k < 4; k++) {
                __m256i c = _mm256_loadu_si256(
                                (const __m256i *) (p + 32 + 64 * k + 32 * h));

                lo4[k] = _mm256_and_si256(c, m4);
                lo4[k + 4] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
            }
        } else {
            for (int k = 0; k < 8; k++) {
                __m256i c = _mm256_loadu_si256(
                                (const __m256i *) (p + 32 + 64 * k + 32 * h));

                lo4[k] = _mm256_and_si256(c, m4);
                hi4[k] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
            }
        }
        for (int n = 0; n < N; n++) {
            const int8_t *xh = T->hi + n * T->cols + 32 * b;
            const int8_t *xl = T->lo + n * T->cols + 32 * b;
            __m256i       Ah, Al, L;
            __m256        s;

            Ah = p32_avx2_plane(lo4, xh, one);
            Al = p32_avx2_plane(lo4, xl, one);
            if (t == GGML_Q8_0) {
                Ah = _mm256_add_epi32(Ah, p32_avx2_plane(hi4, xh, sixteen));
                Al = _mm256_add_epi32(Al, p32_avx2_plane(hi4, xl, sixteen));
            }
            L = _mm256_add_epi32(_mm256_slli_epi32(Ah, 8), Al);
            L = _mm256_sub_epi32(L, _mm256_set1_epi32(T->off[n * T->nb + b]));
            s = _mm256_mul_ps(dw, _mm256_set1_ps(T->dx[n * T->nb + b]));
            acc[n] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(L), acc[n]);
        }
    }
}


static Q8_T_AVX2 void
p32_avx2(ggml_type t, const uint8_t *w, int64_t cols, const nalar_xq16 *x16,
         const int32_t *off, int n_tok, float *y, int ldy, int64_t r0,
         int64_t r1, int accumulate)
{
    for (int64_t p = r0 / P32_ROWS; p * P32_ROWS < r1; p++) {
        for (int h = 0; h < 2; h++) {
            int64_t row0 = p * P32_ROWS + 8 * h;

            if (row0 + 8 <= r0 || row0 >= r1) {
                continue;
            }
            for (int t0 = 0; t0 < n_tok; t0 += P32_TILE / 2) {
                int      N = n_tok - t0 < P32_TILE / 2 ? n_tok - t0
                                                       : P32_TILE / 2;
                __m256   acc[P32_TILE / 2] = { 0 };
                p32_tile T = p32_tile_at(t, w, cols, x16, off, p, t0);

                switch (N) {
                case 1: p32_avx2_tile(t, &T, h, 1, acc); break;
                case 2: p32_avx2_tile(t, &T, h, 2, acc); break;
                case 3: p32_avx2_tile(t, &T, h, 3, acc); break;
                default: p32_avx2_tile(t, &T, h, 4, acc); break;
                }
                for (int n = 0; n < N; n++) {
                    float  v[8], *yp = y + (int64_t) (t0 + n) * ldy;

                    _mm256_storeu_ps(v, acc[n]);
                    for (int j = 0; j < 8; j++) {
                        int64_t r = row0 + j;

                        if (r >= r0 && r < r1) {
                            yp[r] = accumulate ? yp[r] + v[j] : v[j];
                        }
                    }
                }
            }
        }
    }
}

#endif


int
nalar_quant_p32_kernel(int isa, ggml_type t, const uint8_t *w, int64_t cols,
                       const nalar_xq16 *x16, int n_tok, float *y, int ldy,
                       int64_t r0, int64_t r1, int accumulate)
{
#if defined(P32_X86)
    int32_t  stack[1024], *off = stack;
    int64_t  n = (int64_t) n_tok * (cols / 32);

    if (!nalar_quant_p32_type(t) || cols % 32 != 0 || n_tok <= 0
        || !nalar_quant_isa_ok(isa))
    {
        return -1;
    }
    isa = nalar_quant_isa_sans_avxvnni(isa);
    if (isa != NALAR_ISA_VNNI && isa != NALAR_ISA_AVX2) {
        return -1;
    }
    if (n > (int64_t) (sizeof(stack) / sizeof(stack[0]))) {
        off = malloc((size_t) n * sizeof(int32_t));
        if (off == NULL) {
            return -1;
        }
    }
    p32_offsets(t, x16, n_tok, cols, off);
    (isa == NALAR_ISA_VNNI ? p32_vnni : p32_avx2)(t, w, cols, x16, off, n_tok,
                                                  y, ldy, r0, r1, accumulate);
    if (off != stack) {
        free(off);
    }
    return 0;
#else
    (void) isa; (void) t; (void) w; (void) cols; (void) x16; (void) n_tok;
    (void) y; (void) ldy; (void) r0; (void) r1; (void) accumulate;
    return -1;
#endif
}


void
nalar_quant_p32_matmul(ggml_type t, const uint8_t *w, int64_t wstride,
                       int il, int64_t cols, const nalar_xq16 *x16,
                       int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    if (il == P32_IL
        && nalar_quant_p32_kernel(nalar_quant_q8_isa(), t, w, cols, x16,
                                  n_tok, y, ldy, r0, r1, accumulate) == 0)
    {
        return;
    }
    nalar_quant_p32_scalar(t, w, wstride, il, cols, x16, n_tok, y, ldy, r0,
                           r1, accumulate);
}
