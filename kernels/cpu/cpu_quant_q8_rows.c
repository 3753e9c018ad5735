/*
 * One token's products with 8-bit activations, four rows at a time
 * (cpu_quant_q8_rows.h): decode's kernels.  Per block, x's codes are
 * loaded once for the four rows, and the rows' blocks read as one stream
 * where the matrix is interleaved (nalar_quant_interleave: the four rows'
 * blocks of a step lie side by side).
 *
 * Exactness: each (row, token) output takes cpu_quant_q8.c's operations
 * (see the top of that file): per block the same eight int32 lanes L[m]
 * (integers: summed here in another order, to the same values), then
 * acc = fma(s, (float) L, acc) in 8 lanes and mn = fma(s', (float) I, mn)
 * over the blocks in order, y = hsum8(acc) - mn.  Four rows' mn are the
 * four lanes of one vector, each lane the scalar chain's fma, so the bits
 * are the row kernels' and the scalar reference's.
 *
 * AVX-512 VNNI: the K-quants' codes in 64-byte vectors, two groups of 32
 * weights each (vpmaddubsw, then vpdpwssd by the groups' scales, made by
 * vpermw from the block's scale bytes); Q8_0 and Q4_0 in 32-byte
 * vectors with vpdpbusd.  AVX2: 32-byte vectors, vpmaddubsw and
 * vpmaddwd.  The integer min terms of four rows are summed together
 * (vphaddd).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_rows.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_rows_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROWS_X86 1
#endif


#if defined(ROWS_X86)

#define T_AVX2 Q8_T_AVX2
#define T_VNNI Q8_T_VNNI
#define INL    Q8_INL

/* a kernel: R rows (row[0 .. R-1]) of one token, nb blocks each; pfo the
 * bytes from a block to the one it asks for (0: none) */
typedef void rows_fn(const uint8_t *const *row, int il, int64_t nb,
                     const nalar_xq8 *x8, ptrdiff_t pfo, float *out);


/* ------------------------------------------------------------------ */
/* Q4_K and Q5_K                                                       */


/* VNNI: Q4_K (Q5 0) or Q5_K (Q5 1), R rows */
static INL T_VNNI void
k4_rows_vnni(const int Q5, const int R, const uint8_t *const *row, int il,
             int64_t nb, const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q5 ? QK5_K_BYTES : QK4_K_BYTES;
    const __m512i F = _mm512_set1_epi8(0x0F);
    /* vpermw's picks of the scales of each 64-byte vector's two groups:
     * [0 | 2], [1 | 3], [4 | 6], [5 | 7] */
    const __m512i I0 = _mm512_inserti64x4(_mm512_set1_epi16(0),
                                          _mm256_set1_epi16(2), 1);
    const __m512i I1 = _mm512_inserti64x4(_mm512_set1_epi16(1),
                                          _mm256_set1_epi16(3), 1);
    const __m512i I2 = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(6), 1);
    const __m512i I3 = _mm512_inserti64x4(_mm512_set1_epi16(5),
                                          _mm256_set1_epi16(7), 1);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, bytes, b);
        const int8_t *xb = x8->qk + b * QK_K;
        __m512i       X0, X1, X2, X3;
        __m128i       xs = rows_k4_xsums(x8->bs + 16 * b), M[4];
        __m128        dx = _mm_set1_ps(x8->dk[b]), sv[4];
        __m256i       L8[4];
        float         s[4];

        /* x's groups as the codes' vectors hold them */
        X0 = _mm512_inserti64x4(_mm512_castsi256_si512(
                 _mm256_loadu_si256((const __m256i *) xb)),
                 _mm256_loadu_si256((const __m256i *) (xb + 64)), 1);
        X1 = _mm512_inserti64x4(_mm512_castsi256_si512(
                 _mm256_loadu_si256((const __m256i *) (xb + 32))),
                 _mm256_loadu_si256((const __m256i *) (xb + 96)), 1);
        X2 = _mm512_inserti64x4(_mm512_castsi256_si512(
                 _mm256_loadu_si256((const __m256i *) (xb + 128))),
                 _mm256_loadu_si256((const __m256i *) (xb + 192)), 1);
        X3 = _mm512_inserti64x4(_mm512_castsi256_si512(
                 _mm256_loadu_si256((const __m256i *) (xb + 160))),
                 _mm256_loadu_si256((const __m256i *) (xb + 224)), 1);
        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            sv[i] = _mm_setzero_ps();
        }
        rows_pf_step(R, row, il, QK_K, bytes, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            const uint8_t *qs = p + (Q5 ? 48 : 16);
            __m128i        h = _mm_loadu_si128((const __m128i *) p);
            __m128i        sm = rows_k4_sm(h);
            __m512i        S = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(sm));
            __m512i        q0 = _mm512_loadu_si512((const void *) qs);
            __m512i        q1 = _mm512_loadu_si512((const void *) (qs + 64));
            __m512i        c0 = _mm512_and_si512(q0, F);
            __m512i        c1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), F);
            __m512i        c2 = _mm512_and_si512(q1, F);
            __m512i        c3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), F);
            __m512i        L;

            if (Q5) {
                /* the fifth bit: bit G of qh[l] for weight l of group G */
                __m512i qh = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *) (p + 16)));
                __m512i k16 = _mm512_set1_epi8(16);

#define Q5_BIT(c, lo, hi)                                                   \
                c = _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(qh,       \
                        _mm512_inserti64x4(_mm512_set1_epi8(lo),            \
                                           _mm256_set1_epi8(hi), 1)),       \
                        c, k16)
                Q5_BIT(c0, 1, 4);
                Q5_BIT(c1, 2, 8);
                Q5_BIT(c2, 16, 64);
                Q5_BIT(c3, 32, (char) 128);
#undef Q5_BIT
            }
            L = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                    _mm512_maddubs_epi16(c0, X0),
                                    _mm512_permutexvar_epi16(I0, S));
            L = _mm512_dpwssd_epi32(L, _mm512_maddubs_epi16(c1, X1),
                                    _mm512_permutexvar_epi16(I1, S));
            L = _mm512_dpwssd_epi32(L, _mm512_maddubs_epi16(c2, X2),
                                    _mm512_permutexvar_epi16(I2, S));
            L = _mm512_dpwssd_epi32(L, _mm512_maddubs_epi16(c3, X3),
                                    _mm512_permutexvar_epi16(I3, S));
            L8[i] = _mm256_add_epi32(_mm512_castsi512_si256(L),
                                     _mm512_extracti64x4_epi64(L, 1));
            M[i] = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)),
                                  xs);
            sv[i] = _mm_mul_ps(_mm_cvtph_ps(h), dx);    /* s, s', -, - */
            s[i] = _mm_cvtss_f32(sv[i]);
        }
        {
            __m128 u01 = _mm_unpacklo_ps(sv[0], sv[1]);
            __m128 u23 = _mm_unpacklo_ps(sv[2], sv[3]);

            rows_float(R, s, L8, _mm_movehl_ps(u23, u01),
                       rows_hsum4x4(M[0], M[1], M[2], M[3]), acc, &mn);
        }
    }
    rows_out(R, acc, mn, out);
}


/* AVX2: Q4_K (Q5 0) or Q5_K (Q5 1), R rows */
static INL T_AVX2 void
k4_rows_avx2(const int Q5, const int R, const uint8_t *const *row, int il,
             int64_t nb, const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    const int64_t bytes = Q5 ? QK5_K_BYTES : QK4_K_BYTES;
    const __m256i F = _mm256_set1_epi8(0x0F);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, bytes, b);
        const int8_t *xb = x8->qk + b * QK_K;
        __m128i       xs = rows_k4_xsums(x8->bs + 16 * b), M[4];
        __m128        dx = _mm_set1_ps(x8->dk[b]), sv[4];
        __m256i       L8[4];
        float         s[4];

        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            sv[i] = _mm_setzero_ps();
        }
        rows_pf_step(R, row, il, QK_K, bytes, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            const uint8_t *qs = p + (Q5 ? 48 : 16);
            __m128i        h = _mm_loadu_si128((const __m128i *) p);
            __m128i        sm = rows_k4_sm(h);
            __m256i        S = _mm256_broadcastsi128_si256(
                                   _mm_cvtepu8_epi16(sm));
            __m256i        qh = _mm256_setzero_si256(), L = qh;

            if (Q5) {
                qh = _mm256_loadu_si256((const __m256i *) (p + 16));
            }
            for (int G = 0; G < 8; G++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)
                                               (qs + 32 * (G / 2)));
                __m256i c = (G & 1) ? _mm256_and_si256(
                                          _mm256_srli_epi16(q, 4), F)
                                    : _mm256_and_si256(q, F);
                __m256i sc = _mm256_shuffle_epi8(S, _mm256_set1_epi16(
                                 (short) (0x0100 + 0x0202 * G)));
                __m256i xv = _mm256_loadu_si256((const __m256i *)
                                                (xb + 32 * G));

                if (Q5) {
                    __m256i bit = _mm256_set1_epi8((char) (1 << G));

                    c = _mm256_or_si256(c, _mm256_and_si256(
                            _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                            _mm256_set1_epi8(16)));
                }
                L = _mm256_add_epi32(L, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(c, xv), sc));
            }
            L8[i] = L;
            M[i] = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)),
                                  xs);
            sv[i] = _mm_mul_ps(_mm_cvtph_ps(h), dx);
            s[i] = _mm_cvtss_f32(sv[i]);
        }
        {
            __m128 u01 = _mm_unpacklo_ps(sv[0], sv[1]);
            __m128 u23 = _mm_unpacklo_ps(sv[2], sv[3]);

            rows_float(R, s, L8, _mm_movehl_ps(u23, u01),
                       rows_hsum4x4(M[0], M[1], M[2], M[3]), acc, &mn);
        }
    }
    rows_out(R, acc, mn, out);
}


/* ------------------------------------------------------------------ */
/* Q6_K                                                                 */


/* VNNI: Q6_K, R rows */
static INL T_VNNI void
k6_rows_vnni(const int R, const uint8_t *const *row, int il, int64_t nb,
             const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    const __m512i F = _mm512_set1_epi8(0x0F), H = _mm512_set1_epi8(0x30);
    /* qh's shifts bringing group 4h + k's two bits to bits 4, 5: left 4
     * (k 0) | left 2 (k 1); right 0 (k 2) | right 2 (k 3) */
    const __m512i SL = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(2), 1);
    const __m512i SR = _mm512_inserti64x4(_mm512_set1_epi16(0),
                                          _mm256_set1_epi16(2), 1);
    __m512i       IW[4];
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    /* vpermw's picks of the 16-weight sub-blocks' scales: 128-bit lane j
     * of vector v holds sub-block 4v + j */
    for (int v = 0; v < 4; v++) {
        IW[v] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16((short) (4 * v + 1)),
                _mm_set1_epi16((short) (4 * v)))),
            _mm256_set_m128i(_mm_set1_epi16((short) (4 * v + 3)),
                             _mm_set1_epi16((short) (4 * v + 2))), 1);
    }
    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, QK6_K_BYTES, b);
        const int8_t *xb = x8->qk + b * QK_K;
        __m256i       xs = rows_k6_xsums(x8->bs + 16 * b), L8[4];
        __m128i       M[4];
        float         s[4], dx = x8->dk[b];

        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            s[i] = 0;
        }
        rows_pf_step(R, row, il, QK_K, QK6_K_BYTES, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            __m256i        W = _mm256_cvtepi8_epi16(
                                   _mm_loadu_si128((const __m128i *)
                                                   (p + 192)));
            __m512i        S = _mm512_zextsi256_si512(W);
            __m512i        L = _mm512_setzero_si512();
            __m256i        m;

            for (int h = 0; h < 2; h++) {
                __m512i ql = _mm512_loadu_si512((const void *) (p + 64 * h));
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                 (const __m256i *) (p + 128 + 32 * h)));
                __m512i c01 = _mm512_or_si512(
                    _mm512_and_si512(ql, F),
                    _mm512_and_si512(_mm512_sllv_epi16(qh, SL), H));
                __m512i c23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(ql, 4), F),
                    _mm512_and_si512(_mm512_srlv_epi16(qh, SR), H));

                L = _mm512_dpwssd_epi32(L, _mm512_maddubs_epi16(
                        c01, _mm512_loadu_si512((const void *)
                                                (xb + 128 * h))),
                        _mm512_permutexvar_epi16(IW[2 * h], S));
                L = _mm512_dpwssd_epi32(L, _mm512_maddubs_epi16(
                        c23, _mm512_loadu_si512((const void *)
                                                (xb + 128 * h + 64))),
                        _mm512_permutexvar_epi16(IW[2 * h + 1], S));
            }
            L8[i] = _mm256_add_epi32(_mm512_castsi512_si256(L),
                                     _mm512_extracti64x4_epi64(L, 1));
            m = _mm256_madd_epi16(W, xs);
            M[i] = _mm_add_epi32(_mm256_castsi256_si128(m),
                                 _mm256_extracti128_si256(m, 1));
            s[i] = f16_at(p + 208) * dx;
        }
        rows_float(R, s, L8, _mm_loadu_ps(s),
                   _mm_slli_epi32(rows_hsum4x4(M[0], M[1], M[2], M[3]), 5),
                   acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* AVX2: Q6_K, R rows */
static INL T_AVX2 void
k6_rows_avx2(const int R, const uint8_t *const *row, int il, int64_t nb,
             const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    const __m256i F = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    __m256        acc[4];
    __m128        mn = _mm_setzero_ps();

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t       off = qoff_at(il, QK_K, QK6_K_BYTES, b);
        const int8_t *xb = x8->qk + b * QK_K;
        __m256i       xs = rows_k6_xsums(x8->bs + 16 * b), L8[4];
        __m128i       M[4];
        float         s[4], dx = x8->dk[b];

        for (int i = 0; i < 4; i++) {
            M[i] = _mm_setzero_si128();
            s[i] = 0;
        }
        rows_pf_step(R, row, il, QK_K, QK6_K_BYTES, b, off, pfo);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row[i] + off;
            __m256i        W = _mm256_cvtepi8_epi16(
                                   _mm_loadu_si128((const __m128i *)
                                                   (p + 192)));
            __m256i        Wl = _mm256_permute2x128_si256(W, W, 0x00);
            __m256i        Wh = _mm256_permute2x128_si256(W, W, 0x11);
            __m256i        L = _mm256_setzero_si256(), m;

            for (int G = 0; G < 8; G++) {
                int            hh = G / 4, k = G % 4;
                const uint8_t *ql = p + 64 * hh + (k & 1) * 32;
                __m256i        a = _mm256_loadu_si256((const __m256i *) ql);
                __m256i        e = _mm256_loadu_si256((const __m256i *)
                                                      (p + 128 + 32 * hh));
                __m256i        lo = (k & 2) ? _mm256_and_si256(
                                                  _mm256_srli_epi16(a, 4), F)
                                            : _mm256_and_si256(a, F);
                __m256i        hi = _mm256_and_si256(
                                        _mm256_srli_epi16(e, 2 * k), three);
                /* [sub-block 2G's scale | 2G + 1's], as int16 */
                int            j = 2 * G % 8;
                __m256i        sc = _mm256_shuffle_epi8(
                                        G < 4 ? Wl : Wh,
                                        _mm256_set_m128i(
                                            _mm_set1_epi16((short)
                                                (0x0202 * (j + 1) + 0x0100)),
                                            _mm_set1_epi16((short)
                                                (0x0202 * j + 0x0100))));
                __m256i        c = _mm256_or_si256(lo,
                                                   _mm256_slli_epi16(hi, 4));

                L = _mm256_add_epi32(L, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(c, _mm256_loadu_si256(
                            (const __m256i *) (xb + 32 * G))), sc));
            }
            L8[i] = L;
            m = _mm256_madd_epi16(W, xs);
            M[i] = _mm_add_epi32(_mm256_castsi256_si128(m),
                                 _mm256_extracti128_si256(m, 1));
            s[i] = f16_at(p + 208) * dx;
        }
        rows_float(R, s, L8, _mm_loadu_ps(s),
                   _mm_slli_epi32(rows_hsum4x4(M[0], M[1], M[2], M[3]), 5),
                   acc, &mn);
    }
    rows_out(R, acc, mn, out);
}


/* ------------------------------------------------------------------ */
/* Q8_0 and Q4_0                                                        */


/* Q8_0 or Q4_0, R rows: DOT(u, s) the lanes of |w| and sign(x, w) */
#define S_ROWS(Q4, DOT)                                                     \
    const int64_t bytes = Q4 ? 2 + QK4_0 / 2 : 2 + QK8_0;                    \
    __m256        acc[4];                                                   \
    __m128        mn = _mm_setzero_ps();                                    \
                                                                            \
    for (int i = 0; i < R; i++) {                                           \
        acc[i] = _mm256_setzero_ps();                                       \
    }                                                                       \
    for (int64_t b = 0; b < nb; b++) {                                      \
        int64_t off = qoff_at(il, 32, bytes, b);                            \
        __m256i xv = _mm256_loadu_si256((const __m256i *)                   \
                                        (x8->q + 32 * b));                  \
        float   dx = x8->d[b];                                              \
                                                                            \
        rows_pf_step(R, row, il, 32, bytes, b, off, pfo);                   \
        for (int i = 0; i < R; i++) {                                       \
            const uint8_t *p = row[i] + off;                                \
            __m256i        w = q8_w32_signed(Q4 ? GGML_Q4_0 : GGML_Q8_0,    \
                                             p);                            \
            __m256i        L = DOT(_mm256_abs_epi8(w),                      \
                                   _mm256_sign_epi8(xv, w));                \
                                                                            \
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p) * dx),        \
                                     _mm256_cvtepi32_ps(L), acc[i]);        \
        }                                                                   \
    }                                                                       \
    rows_out(R, acc, mn, out);

#define DOT_S_AVX2(u, s)                                                    \
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define DOT_S_VNNI(u, s)                                                    \
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)

static INL T_AVX2 void
s_rows_avx2(const int Q4, const int R, const uint8_t *const *row, int il,
            int64_t nb, const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    S_ROWS(Q4, DOT_S_AVX2)
}


static INL T_VNNI void
s_rows_vnni(const int Q4, const int R, const uint8_t *const *row, int il,
            int64_t nb, const nalar_xq8 *x8, ptrdiff_t pfo, float *out)
{
    S_ROWS(Q4, DOT_S_VNNI)
}


/* ------------------------------------------------------------------ */
/* the kernels, four rows and one                                       */


#define ROWS_KERNELS(NAME, TGT, CALL)                                       \
static TGT void                                                             \
NAME##_4(const uint8_t *const *row, int il, int64_t nb,                     \
         const nalar_xq8 *x8, ptrdiff_t pfo, float *out)                    \
{                                                                           \
    const int R = 4;                                                        \
    CALL;                                                                   \
}                                                                           \
static TGT void                                                             \
NAME##_1(const uint8_t *const *row, int il, int64_t nb,                     \
         const nalar_xq8 *x8, ptrdiff_t pfo, float *out)                    \
{                                                                           \
    const int R = 1;                                                        \
    CALL;                                                                   \
}

ROWS_KERNELS(q4k_vnni, T_VNNI, k4_rows_vnni(0, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q5k_vnni, T_VNNI, k4_rows_vnni(1, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q6k_vnni, T_VNNI, k6_rows_vnni(R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q80_vnni, T_VNNI, s_rows_vnni(0, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q40_vnni, T_VNNI, s_rows_vnni(1, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q4k_avx2, T_AVX2, k4_rows_avx2(0, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q5k_avx2, T_AVX2, k4_rows_avx2(1, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q6k_avx2, T_AVX2, k6_rows_avx2(R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q80_avx2, T_AVX2, s_rows_avx2(0, R, row, il, nb, x8, pfo, out))
ROWS_KERNELS(q40_avx2, T_AVX2, s_rows_avx2(1, R, row, il, nb, x8, pfo, out))


/* the kernels of t on isa: f[0] one row, f[1] four; 0, or -1 for none */
static int
rows_fns(ggml_type t, int isa, rows_fn **f)
{
    int v = isa == NALAR_ISA_VNNI;

    if (isa != NALAR_ISA_VNNI && isa != NALAR_ISA_AVX2) {
        return -1;
    }
    switch (t) {
    case GGML_Q4_K:
        f[0] = v ? q4k_vnni_1 : q4k_avx2_1;
        f[1] = v ? q4k_vnni_4 : q4k_avx2_4;
        return 0;
    case GGML_Q5_K:
        f[0] = v ? q5k_vnni_1 : q5k_avx2_1;
        f[1] = v ? q5k_vnni_4 : q5k_avx2_4;
        return 0;
    case GGML_Q6_K:
        f[0] = v ? q6k_vnni_1 : q6k_avx2_1;
        f[1] = v ? q6k_vnni_4 : q6k_avx2_4;
        return 0;
    case GGML_Q8_0:
        f[0] = v ? q80_vnni_1 : q80_avx2_1;
        f[1] = v ? q80_vnni_4 : q80_avx2_4;
        return 0;
    case GGML_Q4_0:
        f[0] = v ? q40_vnni_1 : q40_avx2_1;
        f[1] = v ? q40_vnni_4 : q40_avx2_4;
        return 0;
    default:
        return -1;
    }
}


#endif


int
nalar_quant_q8_rows(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                    int il, int64_t cols, const nalar_xq8 *x8, float *y,
                    int64_t r0, int64_t r1, int accumulate)
{
#if defined(ROWS_X86)
    rows_fn *f[2];
    qinfo    qi;
    int64_t  nb;

    if (rows_fns(t, isa, f) != 0 || qinfo_of(t, &qi) != 0
        || (qi.qk == QK_K && x8->qk == NULL))
    {
        return -1;
    }
    nb = cols / qi.qk;
    /* groups of 4 rows (aligned: an interleaved matrix's groups), the
     * rows before and after one at a time; each row's output is the same
     * whichever kernel makes it */
    for (int64_t r = r0; r < r1;) {
        int            R = r % 4 == 0 && r + 4 <= r1 ? 4 : 1;
        const uint8_t *row[4];
        float          s[4];
        ptrdiff_t      pfo;

        for (int i = 0; i < R; i++) {
            row[i] = qrow_at(w, wstride, il, qi.qk, qi.bytes, r + i);
        }
        if (il) {
            pfo = rows_pf_ahead();
        } else {
            pfo = r + 16 + R <= r1 ? 16 * wstride : 0;
        }
        f[R == 4](row, il, nb, x8, pfo, s);
        for (int i = 0; i < R; i++) {
            y[r + i] = accumulate ? y[r + i] + s[i] : s[i];
        }
        r += R;
    }
    return 0;
#else
    (void) t;
    (void) isa;
    (void) w;
    (void) wstride;
    (void) il;
    (void) cols;
    (void) x8;
    (void) y;
    (void) r0;
    (void) r1;
    (void) accumulate;
    return -1;
#endif
}
