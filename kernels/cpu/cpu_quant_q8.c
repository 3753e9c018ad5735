/*
 * CPU kernels over block-quantized weights with 8-bit activations (an
 * engine's opt-in mode, cpu_quant.h): x rounded once per token into int8
 * codes (nalar_quant_x8), and integer dot products of those codes with
 * the weights' codes, one kernel per type and instruction set:
 * AVX-512 VNNI (vpdpbusd, vpdpwssd on 256-bit vectors), AVX-VNNI (the
 * same, VEX-encoded), AVX2 (vpmaddubsw, vpmaddwd) and a scalar reference,
 * chosen at run time (cpuid, capped by NALAR_CPU_ISA or
 * nalar_quant_q8_force).
 *
 * Exactness.  Every path computes, per block, the same eight int32 lanes
 * L[0..7] (integers: exact, so the order in which a path sums them is
 * free), lane m holding the weights 4m .. 4m + 3 of each 32 weights of
 * the block:
 *   Q8_0, Q4_0:  L[m] = sum_{k<4} w[4m+k] x[4m+k]  (w signed codes,
 *                Q4_0's n - 8), x the block's per-32 codes
 *   Q4_K, Q5_K:  L[m] = sum_G sc_G sum_{k<4} q[32G+4m+k] x[32G+4m+k]
 *                (G = 0 .. 7 the sub-blocks, q unsigned 4- or 5-bit)
 *   Q6_K:        L[m] = sum_G sc_{(32G+4m)/16} sum_k q[..] x[..]
 *                (q the unsigned 6-bit code, 0 .. 63)
 * and then the same float operations in the same order:
 *   acc[m] = fma(s, (float) L[m], acc[m]) over the blocks in order, from
 *   0, s = d_w * d_x (the block's weight scale times x's scale);
 *   mn = fma(s', (float) I, mn) over the blocks in order, from 0, with
 *   I the integer min term: Q4_K/Q5_K s' = dmin * d_x,
 *   I = sum_j m_j * (sum of x's 32 codes of sub-block j); Q6_K s' = s,
 *   I = 32 * sum_j sc_j * (sum of x's 16 codes of sub-block j); Q8_0 and
 *   Q4_0 have none (mn = 0);
 *   y = hsum8(acc) - mn, hsum8(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5)
 *   + (v3 + v7)).
 * So every path gives the same bits, and each (row, token) output is
 * one function of that row and that token's codes: bit-identical whatever
 * the batch, its chunking or the threads' split of the rows.  A product
 * of one token runs cpu_quant_rows.c's kernels (four rows at a time),
 * products of two tokens or more cpu_quant_q8_tiles.c's tiles; both keep
 * these operations per (row, token), so a change to them changes those
 * kernels too.
 *
 * x's codes: Q8_0 and Q4_0 read x per 32 (Q8_0-like blocks: d = max|x| /
 * 127, codes round(x / d) in [-127, 127]); the K-quants per 256 (Q8_K-like:
 * one d per 256, and the sums of each 16 codes).  Codes never reach -128,
 * so vpsignb cannot overflow, and vpmaddubsw's pairs stay below 2^15.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "cpu_quant_q8_simd.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_q8_tiles.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define Q8_X86 1
#endif


/* ------------------------------------------------------------------ */
/* x's codes                                                            */


/* n floats as int8 codes per g (32 or 256): d = amax / 127 per group,
 * codes round(x * (127 / amax)) to nearest even, clamped to [-127, 127]
 * (with AVX2 the same values, eight at a time: vcvtps2dq rounds as
 * lrintf does, and the saturating packs and the clamp give the scalar
 * clamp's codes) */
static void
x8_groups(const float *x, int64_t n, int g, int8_t *q, float *d)
{
    for (int64_t b = 0; b < n / g; b++) {
        const float *xb = x + b * g;
        float        amax = 0, id;

#if defined(__AVX2__)
        __m256 sgn = _mm256_set1_ps(-0.0f), mx = _mm256_setzero_ps(), vi;
        __m128 h;

        for (int i = 0; i < g; i += 8) {
            /* a > m ? a : m, as the scalar loop: a NaN never enters */
            mx = _mm256_max_ps(_mm256_andnot_ps(sgn, _mm256_loadu_ps(xb + i)),
                               mx);
        }
        h = _mm_max_ps(_mm256_castps256_ps128(mx),
                       _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        amax = _mm_cvtss_f32(h);
        d[b] = amax / 127.0f;
        id = amax > 0 ? 127.0f / amax : 0;
        vi = _mm256_set1_ps(id);
        for (int i = 0; i < g; i += 32) {
            __m256i v[4], w;

            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(
                           _mm256_loadu_ps(xb + i + 8 * k), vi));
            }
            w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                   _mm256_packs_epi32(v[2], v[3]));
            w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(
                                                0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *) (q + b * g + i),
                                _mm256_max_epi8(w, _mm256_set1_epi8(-127)));
        }
#else
        for (int i = 0; i < g; i++) {
            float a = fabsf(xb[i]);

            amax = a > amax ? a : amax;
        }
        d[b] = amax / 127.0f;
        id = amax > 0 ? 127.0f / amax : 0;
        for (int i = 0; i < g; i++) {
            long v = lrintf(xb[i] * id);

            q[b * g + i] = (int8_t) (v < -127 ? -127 : v > 127 ? 127 : v);
        }
#endif
    }
}


int64_t
nalar_quant_x8_bytes(int n_tok, int64_t cols)
{
    /* codes per 32 and their scales; codes per 256, their scales and the
     * sums of 16; alignment */
    return (int64_t) n_tok * (cols + cols / 32 * 4 + cols + cols / 256 * 4
                              + cols / 16 * 4) + 4 * 32;
}


static uint8_t *
align32(uint8_t *p)
{
    return (uint8_t *) (((uintptr_t) p + 31) & ~(uintptr_t) 31);
}


void
nalar_quant_x8(const float *x, int n_tok, int ldx, int64_t cols, void *buf,
               nalar_xq8 *x8)
{
    uint8_t *p = align32(buf);
    int8_t  *q = (int8_t *) p, *qk = NULL;
    float   *d, *dk = NULL;
    int32_t *bs = NULL;
    int      k = cols % QK_K == 0;

    p = align32(p + (int64_t) n_tok * cols);
    d = (float *) p;
    p = align32(p + (int64_t) n_tok * (cols / 32) * 4);
    if (k) {
        qk = (int8_t *) p;
        p = align32(p + (int64_t) n_tok * cols);
        dk = (float *) p;
        p = align32(p + (int64_t) n_tok * (cols / QK_K) * 4);
        bs = (int32_t *) p;
    }
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (int64_t) t * ldx;

        x8_groups(xt, cols, 32, q + t * cols, d + t * (cols / 32));
        if (k) {
            int8_t  *c = qk + t * cols;
            int32_t *s = bs + t * (cols / 16);

            x8_groups(xt, cols, QK_K, c, dk + t * (cols / QK_K));
            q8_sums16(c, cols, s);
        }
    }
    x8->q = q;
    x8->d = d;
    x8->qk = qk;
    x8->dk = dk;
    x8->bs = bs;
    x8->cols = cols;
}


/* ------------------------------------------------------------------ */
/* one token's codes, and the blocks of one row                         */


typedef struct {
    const int8_t  *q;     /* per-32 codes (Q8_0, Q4_0) or per-256 */
    const float   *d;     /* their scales */
    const int32_t *bs;    /* per-256: the sums of 16 codes */
} x8_tok;

typedef float q8_row_fn(const uint8_t *row, int il, int64_t nb,
                        const x8_tok *x, ptrdiff_t pf);

/* tokens whose codes nalar_quant_matmul_q8 and nalar_quant_matmul_i16
 * make at once (their scratch: nalar_quant_x8_bytes or
 * nalar_quant_x16_bytes of Q8_CHUNK tokens) */
#define Q8_CHUNK 32

/* block b of a row at row (qblock_at's offsets) */
static inline const uint8_t *
blk(const uint8_t *row, int il, int64_t qk, int64_t bytes, int64_t b)
{
    return row + qoff_at(il, qk, bytes, b);
}


/* ------------------------------------------------------------------ */
/* scalar reference                                                     */


static float
row_scalar(ggml_type t, const uint8_t *row, int il, int64_t nb,
           const x8_tok *x)
{
    qinfo qi = { 0, 0, 0, 0 };
    float acc[8] = { 0 }, mn = 0;
    int   w[QK_K], sc[64];

    (void) qinfo_of(t, &qi);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = blk(row, il, qi.qk, qi.bytes, b);
        const int8_t  *xq = x->q + b * qi.qk;
        int32_t        L[8] = { 0 };
        float          s, s2 = 0;
        int32_t        I = 0;

        q8_scalar_codes(t, p, w, sc);
        q8_scalar_lanes(qi.qk, w, sc, xq, L);
        switch (t) {
        case GGML_Q8_0:
        case GGML_Q4_0:
            s = f16_at(p) * x->d[b];
            break;
        case GGML_Q4_K:
        case GGML_Q5_K:
            s = f16_at(p) * x->d[b];
            s2 = f16_at(p + 2) * x->d[b];
            I = q8_k4_min_term(p, x->bs + 16 * b);
            break;
        default:
            s = f16_at(p + 208) * x->d[b];
            s2 = s;
            I = q8_k6_min_term(p, x->bs + 16 * b);
            break;
        }
        for (int m = 0; m < 8; m++) {
            acc[m] = fmaf(s, (float) L[m], acc[m]);
        }
        if (t != GGML_Q8_0 && t != GGML_Q4_0) {
            mn = fmaf(s2, (float) I, mn);
        }
    }
    return q8_hsum8_s(acc) - mn;
}


#define SCALAR_ROW(N, QK, BYTES, SUB, MIN)                                  \
static float                                                                \
row_scalar_##N(const uint8_t *row, int il, int64_t nb, const x8_tok *x,     \
               ptrdiff_t pf)                                                \
{                                                                           \
    (void) pf;                                                              \
    return row_scalar(GGML_##N, row, il, nb, x);                            \
}

QUANT_TYPES(SCALAR_ROW)


/* ------------------------------------------------------------------ */
/* AVX2 and AVX-512 VNNI                                                */

#if defined(Q8_X86)

#define T_AVX2 Q8_T_AVX2
#define T_VNNI Q8_T_VNNI
#define INL    Q8_INL

/* the 32 unsigned codes of group G (sub-block) of a Q4_K/Q5_K block */
static INL T_AVX2 __m256i
w32_k4(ggml_type t, const uint8_t *p, int G)
{
    const uint8_t *qs = t == GGML_Q4_K ? p + 16 : p + 48;
    __m256i        v = _mm256_loadu_si256((const __m256i *)
                                          (qs + 32 * (G / 2)));
    __m256i        f = _mm256_set1_epi8(0xF), q;

    q = (G & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), f)
                : _mm256_and_si256(v, f);
    if (t == GGML_Q5_K) {
        __m256i h = _mm256_loadu_si256((const __m256i *) (p + 16));
        __m256i bit = _mm256_set1_epi8((char) (1 << G));

        q = _mm256_or_si256(q, _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit),
                _mm256_set1_epi8(16)));
    }
    return q;
}


/* the 32 unsigned 6-bit codes of group G of a Q6_K block */
static INL T_AVX2 __m256i
w32_k6(const uint8_t *p, int G)
{
    int            h = G / 4, k = G % 4;
    const uint8_t *ql = p + 64 * h + (k & 1) * 32;
    __m256i        a = _mm256_loadu_si256((const __m256i *) ql);
    __m256i        e = _mm256_loadu_si256((const __m256i *)
                                          (p + 128 + 32 * h));
    __m256i        f = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
    __m256i        lo, hi;

    lo = (k & 2) ? _mm256_and_si256(_mm256_srli_epi16(a, 4), f)
                 : _mm256_and_si256(a, f);
    switch (k) {
    case 0:  hi = _mm256_and_si256(e, three); break;
    case 1:  hi = _mm256_and_si256(_mm256_srli_epi16(e, 2), three); break;
    case 2:  hi = _mm256_and_si256(_mm256_srli_epi16(e, 4), three); break;
    default: hi = _mm256_and_si256(_mm256_srli_epi16(e, 6), three); break;
    }
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}


/* the int16 scales of group G's lanes (lanes 0-3 one 16-weight
 * sub-block, 4-7 the next) */
static INL T_AVX2 __m256i
sc16_k6(const uint8_t *p, int G)
{
    return _mm256_set_m128i(_mm_set1_epi16((int8_t) p[192 + 2 * G + 1]),
                            _mm_set1_epi16((int8_t) p[192 + 2 * G]));
}


/* the sum of v's 8 int32 lanes (exact) */
static INL T_AVX2 int32_t
hsum8_i(__m256i v)
{
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v),
                              _mm256_extracti128_si256(v, 1));

    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return _mm_cvtsi128_si32(h);
}


/* k4_min_term from the mins m[0..7]: the same integer */
static INL T_AVX2 int32_t
k4_min_term_v(const uint8_t *m, const int32_t *bs)
{
    __m256i a = _mm256_loadu_si256((const __m256i *) bs);
    __m256i b = _mm256_loadu_si256((const __m256i *) (bs + 8));
    __m256i s = _mm256_hadd_epi32(a, b);  /* sub-blocks 0 1 4 5 2 3 6 7 */
    __m128i mv;
    __m256i mm;
    int64_t m8;

    memcpy(&m8, m, 8);
    mv = _mm_cvtsi64_si128(m8);
    mm = _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(mv),
                                     _mm256_setr_epi32(0, 1, 4, 5, 2, 3,
                                                       6, 7));
    return hsum8_i(_mm256_mullo_epi32(s, mm));
}


/* k6_min_term: the same integer */
static INL T_AVX2 int32_t
k6_min_term_v(const uint8_t *p, const int32_t *bs)
{
    __m128i sc = _mm_loadu_si128((const __m128i *) (p + 192));
    __m256i lo = _mm256_cvtepi8_epi32(sc);
    __m256i hi = _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8));
    __m256i v = _mm256_add_epi32(
        _mm256_mullo_epi32(lo, _mm256_loadu_si256((const __m256i *) bs)),
        _mm256_mullo_epi32(hi, _mm256_loadu_si256((const __m256i *)
                                                  (bs + 8))));

    return 32 * hsum8_i(v);
}


/* The row functions, written once for the instruction sets: DOT_S (the
 * signed codes' lanes), DOT_U (unsigned codes' lanes, scaled by int16
 * scales and added to an accumulator) differ. */
#define ROW_BODY(T, DOT_S, DOT_U)                                           \
    qinfo  qi = { 0, 0, 0, 0 };                                             \
    __m256 acc = _mm256_setzero_ps();                                       \
    float  mn = 0;                                                          \
                                                                            \
    (void) qinfo_of(T, &qi);                                                \
    const uint8_t *p = row;                                                 \
                                                                            \
    for (int64_t b = 0; b < nb;                                             \
         p = q8_next_block(p, il, qi.qk, qi.bytes, b), b++)                      \
    {                                                                       \
        const int8_t  *xq = x->q + b * qi.qk;                               \
        __m256i        L = _mm256_setzero_si256();                          \
        float          s;                                                   \
                                                                            \
        q8_prefetch_block(p, pf, qi.bytes);                                       \
        if (T == GGML_Q8_0 || T == GGML_Q4_0) {                             \
            __m256i w = q8_w32_signed(T, p);                                   \
            __m256i xv = _mm256_loadu_si256((const __m256i *) xq);          \
                                                                            \
            L = DOT_S(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));         \
            s = f16_at(p) * x->d[b];                                        \
        } else {                                                            \
            uint8_t scm[16];                                                \
                                                                            \
            if (T != GGML_Q6_K) {                                           \
                q8_k4_scales(p, scm);                                          \
            }                                                               \
            for (int G = 0; G < 8; G++) {                                   \
                __m256i xv = _mm256_loadu_si256(                            \
                    (const __m256i *) (xq + 32 * G));                       \
                __m256i w, sc;                                              \
                                                                            \
                if (T == GGML_Q6_K) {                                       \
                    w = w32_k6(p, G);                                       \
                    sc = sc16_k6(p, G);                                     \
                } else {                                                    \
                    w = w32_k4(T, p, G);                                    \
                    sc = _mm256_set1_epi16((short) scm[G]);                 \
                }                                                           \
                L = DOT_U(L, w, xv, sc);                                    \
            }                                                               \
            if (T == GGML_Q6_K) {                                           \
                s = f16_at(p + 208) * x->d[b];                              \
                mn = fmaf(s, (float) k6_min_term_v(p, x->bs + 16 * b), mn); \
            } else {                                                        \
                s = f16_at(p) * x->d[b];                                    \
                mn = fmaf(f16_at(p + 2) * x->d[b],                          \
                          (float) k4_min_term_v(scm + 8, x->bs + 16 * b),   \
                          mn);                                              \
            }                                                               \
        }                                                                   \
        acc = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(L),     \
                              acc);                                         \
    }                                                                       \
    return q8_hsum8(acc) - mn;


/* AVX2: vpmaddubsw pairs (|u| <= 128, |s| <= 127: below 2^15), summed in
 * fours by vpmaddwd */
#define DOT_S_AVX2(u, s)                                                    \
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define DOT_U_AVX2(L, u, s, sc)                                             \
    _mm256_add_epi32(L, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc))

/* AVX-VNNI: the same two steps, VEX-encoded (q8_vex_dpbusd) */
#define DOT_S_AVXVNNI(u, s)                                                 \
    q8_vex_dpbusd(_mm256_setzero_si256(), u, s)
#define DOT_U_AVXVNNI(L, u, s, sc)                                          \
    q8_vex_dpwssd(L, _mm256_maddubs_epi16(u, s), sc)

/* VNNI: vpdpbusd sums the fours in one step; vpdpwssd scales and adds */
#define DOT_S_VNNI(u, s)                                                    \
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define DOT_U_VNNI(L, u, s, sc)                                             \
    _mm256_dpwssd_epi32(L, _mm256_maddubs_epi16(u, s), sc)


#define SIMD_ROWS(N, QK, BYTES, SUB, MIN)                                   \
static T_AVX2 float                                                         \
row_avx2_##N(const uint8_t *row, int il, int64_t nb, const x8_tok *x,       \
             ptrdiff_t pf)                                                  \
{                                                                           \
    ROW_BODY(GGML_##N, DOT_S_AVX2, DOT_U_AVX2)                              \
}                                                                           \
static T_AVX2 float                                                         \
row_avxvnni_##N(const uint8_t *row, int il, int64_t nb, const x8_tok *x,    \
                ptrdiff_t pf)                                               \
{                                                                           \
    ROW_BODY(GGML_##N, DOT_S_AVXVNNI, DOT_U_AVXVNNI)                        \
}                                                                           \
static T_VNNI float                                                         \
row_vnni_##N(const uint8_t *row, int il, int64_t nb, const x8_tok *x,       \
             ptrdiff_t pf)                                                  \
{                                                                           \
    ROW_BODY(GGML_##N, DOT_S_VNNI, DOT_U_VNNI)                              \
}

QUANT_TYPES(SIMD_ROWS)

#endif


/* ------------------------------------------------------------------ */
/* dispatch                                                             */


static int q8_forced = -1;   /* nalar_quant_q8_force's cap, or -1 */


int
nalar_quant_isa_ok(int isa)
{
    switch (isa) {
    case NALAR_ISA_SCALAR:
        return 1;
#if defined(Q8_X86)
    case NALAR_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case NALAR_ISA_AVXVNNI:
        return nalar_quant_isa_ok(NALAR_ISA_AVX2)
               && __builtin_cpu_supports("avxvnni");
    case NALAR_ISA_VNNI:
        return nalar_quant_isa_ok(NALAR_ISA_AVX2)
               && __builtin_cpu_supports("avx512vnni")
               && __builtin_cpu_supports("avx512vl")
               && __builtin_cpu_supports("avx512bw");
#endif
    default:
        return 0;
    }
}


const char *
nalar_quant_isa_name(int isa)
{
    switch (isa) {
    case NALAR_ISA_AVX2:
        return "avx2";
    case NALAR_ISA_AVXVNNI:
        return "avx-vnni";
    case NALAR_ISA_VNNI:
        return "avx512-vnni";
    default:
        return "scalar";
    }
}


int
nalar_quant_q8_isa_max(void)
{
    int isa = NALAR_ISA_VNNI;

    while (!nalar_quant_isa_ok(isa)) {
        isa--;
    }
    return isa;
}


void
nalar_quant_q8_force(int isa)
{
    q8_forced = isa;
}


int
nalar_quant_q8_isa(void)
{
    int         isa = nalar_quant_q8_isa_max();
    const char *e = getenv("NALAR_CPU_ISA");
    int         cap = NALAR_ISA_VNNI;

    if (e != NULL) {
        cap = strcmp(e, "scalar") == 0 ? NALAR_ISA_SCALAR
              : strcmp(e, "avx2") == 0 ? NALAR_ISA_AVX2
              : strcmp(e, "avxvnni") == 0 ? NALAR_ISA_AVXVNNI
              : NALAR_ISA_VNNI;
    }
    if (q8_forced >= 0 && q8_forced < cap) {
        cap = q8_forced;
    }
    isa = isa < cap ? isa : cap;
    while (!nalar_quant_isa_ok(isa)) {
        isa--;
    }
    return isa;
}


const char *
nalar_cpu_isa(void)
{
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define BUILT "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define BUILT "avx2"
#else
#define BUILT "portable"
#endif
    switch (nalar_quant_q8_isa()) {
    case NALAR_ISA_VNNI:
        return "f32 kernels " BUILT ", 8- and 16-bit kernels avx512-vnni";
    case NALAR_ISA_AVXVNNI:
        return "f32 kernels " BUILT ", 8- and 16-bit kernels avx-vnni";
    case NALAR_ISA_AVX2:
        return "f32 kernels " BUILT ", 8- and 16-bit kernels avx2";
    default:
        return "f32 kernels " BUILT ", 8- and 16-bit kernels scalar";
    }
#undef BUILT
}


static q8_row_fn *
row_fn(ggml_type t, int isa)
{
#if defined(Q8_X86)
#define ROW_CASE(N, QK, BYTES, SUB, MIN)                                    \
    case GGML_##N:                                                          \
        return isa == NALAR_ISA_VNNI ? row_vnni_##N                         \
               : isa == NALAR_ISA_AVXVNNI ? row_avxvnni_##N                 \
               : isa == NALAR_ISA_AVX2 ? row_avx2_##N : row_scalar_##N;
#else
#define ROW_CASE(N, QK, BYTES, SUB, MIN)                                    \
    case GGML_##N:                                                          \
        return row_scalar_##N;
#endif
    switch (t) {
    QUANT_TYPES(ROW_CASE)
    default:
        return NULL;
    }
#undef ROW_CASE
}


int
nalar_quant_x8_fits(ggml_type t, int64_t cols)
{
    qinfo qi = { 0, 0, 0, 0 };

    return qinfo_of(t, &qi) == 0 && cols % qi.qk == 0 && cols % 32 == 0;
}


void
nalar_quant_matmul_x8(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                      int64_t cols, const nalar_xq8 *x8, int n_tok, float *y,
                      int ldy, int64_t r0, int64_t r1, int accumulate)
{
    qinfo      qi;
    int        isa = nalar_quant_q8_isa();
    q8_row_fn *f = row_fn(t, isa);
    int        k;

    if (f == NULL || qinfo_of(t, &qi) != 0) {
        return;
    }
    /* one token: four rows at a time (cpu_quant_rows.c); two or
     * more: the tiles (cpu_quant_q8_tiles.c); either the row kernel's
     * bits, where they can run (else the row kernel per row and token,
     * to the same bits) */
    if (n_tok == 1
        && nalar_quant_q8_rows(t, isa, w, wstride, il, cols, x8, y, r0, r1,
                               accumulate) == 0)
    {
        return;
    }
    if (n_tok > 1
        && nalar_quant_x8_tiles(t, isa, w, wstride, il, cols, x8, n_tok, y,
                                ldy, r0, r1, accumulate) == 0)
    {
        return;
    }
    k = qi.qk == QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = qrow_at(w, wstride, il, qi.qk, qi.bytes, r);
        ptrdiff_t      pf = r + 16 < r1
                            ? qrow_at(w, wstride, il, qi.qk, qi.bytes, r + 16)
                              - row
                            : 0;

        for (int64_t tk = 0; tk < n_tok; tk++) {
            x8_tok xt;
            float  s, *yp = &y[tk * ldy + r];

            if (k) {
                xt.q = x8->qk + tk * cols;
                xt.d = x8->dk + tk * (cols / QK_K);
                xt.bs = x8->bs + tk * (cols / 16);
            } else {
                xt.q = x8->q + tk * cols;
                xt.d = x8->d + tk * (cols / 32);
                xt.bs = NULL;
            }
            s = f(row, il, cols / qi.qk, &xt, pf);
            *yp = accumulate ? *yp + s : s;
        }
    }
}


/* nalar_quant_matmul in an integer mode, planes 1 (8-bit codes) or 2
 * (16-bit): x's codes made Q8_CHUNK tokens at a time into the scratch,
 * each token's codes its own, the same as made for the whole batch */
static void
matmul_codes(int planes, ggml_type t, const uint8_t *w, int64_t wstride,
             int il, int64_t cols, const float *x, int n_tok, int ldx,
             float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int      chunk = n_tok < Q8_CHUNK ? n_tok : Q8_CHUNK;
    int64_t  bytes = planes == 2 ? nalar_quant_x16_bytes(chunk, cols)
                                 : nalar_quant_x8_bytes(chunk, cols);
    float   *buf = nalar_quant_scratch((bytes + 3) / 4);

    if (buf == NULL || !nalar_quant_x8_fits(t, cols)) {
        nalar_quant_matmul(t, w, wstride, il, cols, x, n_tok, ldx, y, ldy,
                           r0, r1, accumulate);
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += chunk) {
        int          n = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        const float *xc = x + (int64_t) t0 * ldx;
        float       *yc = y + (int64_t) t0 * ldy;

        if (planes == 2) {
            nalar_xq16 c;

            nalar_quant_x16(xc, n, ldx, cols, buf, &c);
            nalar_quant_matmul_x16(t, w, wstride, il, cols, &c, n, yc, ldy,
                                   r0, r1, accumulate);
        } else {
            nalar_xq8 c;

            nalar_quant_x8(xc, n, ldx, cols, buf, &c);
            nalar_quant_matmul_x8(t, w, wstride, il, cols, &c, n, yc, ldy,
                                  r0, r1, accumulate);
        }
    }
}


void
nalar_quant_matmul_q8(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                      int64_t cols, const float *x, int n_tok, int ldx,
                      float *y, int ldy, int64_t r0, int64_t r1,
                      int accumulate)
{
    matmul_codes(1, t, w, wstride, il, cols, x, n_tok, ldx, y, ldy, r0, r1,
                 accumulate);
}


void
nalar_quant_matmul_i16(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                       int64_t cols, const float *x, int n_tok, int ldx,
                       float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    matmul_codes(2, t, w, wstride, il, cols, x, n_tok, ldx, y, ldy, r0, r1,
                 accumulate);
}
