/*
 * CPU kernels over block-quantized weights with 16-bit activations (an
 * engine's opt-in mode, cpu_quant.h): x rounded per 32 floats to int16
 * codes (nalar_quant_x_i16, nalar_quant_xq), and the products from those
 * codes, one kernel per type (nalar_quant_i16_Q8_0 ..., dispatched by
 * cpu_quant.c), with the portable kernel every build has.
 *
 * Per (row, token) and sub-block j, the integer dot of the codes with
 * x's codes in 8 int32 lanes (vpmaddwd over 16 codes at a time, summed
 * with vpaddd: exact, so its order is free), then
 * acc = fma(a_j * dx, (float) lanes, acc) over the sub-blocks in order
 * (Q5_K: 8 sub-blocks at a time, i16_tile_k; Q4_K and Q6_K: read from
 * their bytes in 16-bit lanes, i16_tile_lanes); mins as the float path,
 * with xs the scaled sums of x's codes; y = hsum8(acc) - hsum8(m).
 * Decode (4 rows by 1 token) and prefill tiles (PR rows by PT tokens)
 * take these operations per (row, token).  x's codes come made (xq, made
 * once by a caller for all the products that read that x), or are made
 * per block of TOK_BLOCK tokens into the thread's scratch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"


void
nalar_quant_x_i16(const float *x, int64_t n, int16_t *q, float *d)
{
    for (int64_t g = 0; g < n / 32; g++) {
        const float *xg = x + 32 * g;
        float        amax = 0, id;

#if defined(__AVX2__) && defined(__FMA__)
        __m256 sgn = _mm256_set1_ps(-0.0f), mx = _mm256_setzero_ps();
        __m128 h;

        for (int k = 0; k < 32; k += 8) {
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sgn,
                                                    _mm256_loadu_ps(xg + k)));
        }
        h = _mm_max_ps(_mm256_castps256_ps128(mx),
                       _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        amax = _mm_cvtss_f32(h);
        d[g] = amax / 32767.0f;
        id = amax > 0 ? 32767.0f / amax : 0;
        {
            __m256  vi = _mm256_set1_ps(id);
            __m256i a, b;

            for (int k = 0; k < 32; k += 16) {
                a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + k),
                                                     vi));
                b = _mm256_cvtps_epi32(_mm256_mul_ps(
                        _mm256_loadu_ps(xg + k + 8), vi));
                _mm256_storeu_si256((__m256i *) (q + 32 * g + k),
                                    _mm256_permute4x64_epi64(
                                        _mm256_packs_epi32(a, b), 0xD8));
            }
        }
#else
        for (int i = 0; i < 32; i++) {
            amax = fabsf(xg[i]) > amax ? fabsf(xg[i]) : amax;
        }
        d[g] = amax / 32767.0f;
        id = amax > 0 ? 32767.0f / amax : 0;
        for (int i = 0; i < 32; i++) {
            long v = lrintf(xg[i] * id);

            q[32 * g + i] = (int16_t) (v < -32768 ? -32768
                                       : v > 32767 ? 32767 : v);
        }
#endif
    }
}


int64_t
nalar_quant_xq_bytes(int n_tok, int64_t cols)
{
    return (int64_t) n_tok * (cols * 4 + cols / 32 * 8) + 64;
}


/* the codes (32-byte aligned), then the scales, then the sums, then the
 * codes in the K-quants' order (32-byte aligned) */
void
nalar_quant_xq(const float *x, int n_tok, int ldx, int64_t cols, void *buf,
               nalar_xq *xq)
{
    uintptr_t a = ((uintptr_t) buf + 31) & ~(uintptr_t) 31;
    int64_t   ng = cols / 32;
    int16_t  *xqq = (int16_t *) a, *xe;
    float    *xd = (float *) (xqq + (int64_t) n_tok * cols);
    float    *xs = xd + (int64_t) n_tok * ng;

    for (int tk = 0; tk < n_tok; tk++) {
        int16_t *q = xqq + tk * cols;
        float   *d = xd + tk * ng, *s = xs + tk * ng;

        nalar_quant_x_i16(x + (int64_t) tk * ldx, cols, q, d);
        for (int64_t g = 0; g < ng; g++) {
            int32_t sum = 0;

            for (int i = 0; i < 32; i++) {
                sum += q[32 * g + i];
            }
            s[g] = d[g] * (float) sum;
        }
    }
    xe = (int16_t *) (((uintptr_t) (xs + (int64_t) n_tok * ng) + 31)
                      & ~(uintptr_t) 31);
    for (int64_t i = 0; i < (int64_t) n_tok * cols; i += 32) {
        for (int l = 0; l < 16; l++) {
            xe[i + l] = xqq[i + 2 * l];
            xe[i + 16 + l] = xqq[i + 2 * l + 1];
        }
    }
    xq->q = xqq;
    xq->d = xd;
    xq->s = xs;
    xq->e = xe;
}


/* ------------------------------------------------------------------ */
/* portable kernel                                                     */


/* from x's codes */
static void
i16_portable(ggml_type t, const uint8_t *w, int64_t wstride, int il,
             int64_t cols, const nalar_xq *X, int n_tok, float *y, int ldy,
             int64_t r0, int64_t r1, int accumulate)
{
    qinfo  qi;
    qblock B;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            const int16_t *xt = X->q + tk * cols;
            const float   *dt = X->d + tk * (cols / 32);
            const float   *st = X->s + tk * (cols / 32);
            float          acc = 0, m = 0, s;
            float         *o = y + (int64_t) tk * ldy + r;

            for (int64_t c = 0; c < cols; c += qi.qk) {
                const uint8_t *p = qblock_at(w, wstride, il, qi.qk,
                                             qi.bytes, r, c / qi.qk);

                decode_scales(t, p, &B);
                decode_q_scalar(t, p, &B);
                for (int j = 0; j < qi.qk / qi.sub; j++) {
                    int64_t  c0 = c + j * qi.sub;
                    int32_t  v = 0;

                    for (int i = 0; i < qi.sub; i++) {
                        v += (int32_t) B.q[j * qi.sub + i] * xt[c0 + i];
                    }
                    acc = fmaf(B.a[j] * dt[c0 / 32], (float) v, acc);
                    if (qi.has_min) {
                        m = fmaf(B.b[j], st[c0 / 32], m);
                    }
                }
            }
            s = acc - m;
            *o = accumulate ? *o + s : s;
        }
    }
}


void
nalar_quant_matmul_i16_portable(ggml_type t, const uint8_t *w,
                                int64_t wstride, int il, int64_t cols,
                                const float *x, int n_tok, int ldx,
                                float *y, int ldy, int64_t r0, int64_t r1,
                                int accumulate)
{
    void    *buf;
    nalar_xq X;

    if (!nalar_quant_type(t)) {
        return;
    }
    buf = malloc((size_t) nalar_quant_xq_bytes(n_tok, cols));
    if (buf == NULL) {
        /* no room for x's codes: the float path */
        nalar_quant_matmul_portable(t, w, wstride, il, cols, x, n_tok, ldx, y,
                                    ldy, r0, r1, accumulate);
        return;
    }
    nalar_quant_xq(x, n_tok, ldx, cols, buf, &X);
    i16_portable(t, w, wstride, il, cols, &X, n_tok, y, ldy, r0, r1,
                 accumulate);
    free(buf);
}


#if defined(__AVX2__) && defined(__FMA__)

/*
 * Q4_K and Q6_K straight from their bytes, in 16-bit lanes.  A 32-byte
 * load of a block's codes, seen as 16 lanes of 16 bits, holds two bytes
 * per lane; masks and shifts give the codes of the even-indexed weights
 * (the lanes' low bytes) and of the odd-indexed ones (their high bytes)
 * as int16, each ready for vpmaddwd against x's codes in that order
 * (nalar_xq.e).  Nothing is decoded into memory or widened.
 */
#define LANES(t)  ((t) == GGML_Q4_K || (t) == GGML_Q6_K)


/* Q4_K's codes of weights 64k .. 64k + 63 (k = 0 .. 3): sub-block 2k's
 * even (*e0) and odd (*o0) weights, sub-block 2k + 1's (*e1, *o1) */
static ALWAYS_INLINE_Q void
q4k_lanes(const uint8_t *p, int k, __m256i *e0, __m256i *o0, __m256i *e1,
          __m256i *o1)
{
    const __m256i m4 = _mm256_set1_epi16(0x000F);
    __m256i       b = _mm256_loadu_si256((const __m256i *) (p + 16 + 32 * k));

    *e0 = _mm256_and_si256(b, m4);
    *o0 = _mm256_and_si256(_mm256_srli_epi16(b, 8), m4);
    *e1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    *o1 = _mm256_srli_epi16(b, 12);
}


/* Q6_K's codes (q - 32) of weights 32g .. 32g + 31 (g = 0 .. 7): the
 * even ones (*e) and the odd ones (*o).  Weight 128h + 32s + l (s =
 * 0 .. 3) has its low 4 bits in ql[64h + 32(s & 1) + l] (low nibble for
 * s < 2, high for s >= 2) and its high 2 in bits 2s, 2s + 1 of
 * qh[32h + l]. */
static ALWAYS_INLINE_Q void
q6k_lanes(const uint8_t *p, int g, __m256i *e, __m256i *o)
{
    const __m256i m4 = _mm256_set1_epi16(0x000F);
    const __m256i m30 = _mm256_set1_epi16(0x0030);
    const __m256i k32 = _mm256_set1_epi16(32);
    int           h = g / 4, s = g % 4;
    __m256i       a = _mm256_loadu_si256((const __m256i *)
                                         (p + 64 * h + 32 * (s & 1)));
    __m256i       qh = _mm256_loadu_si256((const __m256i *)
                                          (p + 128 + 32 * h));
    __m256i       le, lo, he, ho;

    if (s < 2) {
        le = _mm256_and_si256(a, m4);
        lo = _mm256_and_si256(_mm256_srli_epi16(a, 8), m4);
    } else {
        le = _mm256_and_si256(_mm256_srli_epi16(a, 4), m4);
        lo = _mm256_srli_epi16(a, 12);
    }
    switch (s) {    /* bits 2s, 2s + 1 of each byte to bits 4, 5 */
    case 0:
        he = _mm256_slli_epi16(qh, 4);
        ho = _mm256_srli_epi16(qh, 4);
        break;
    case 1:
        he = _mm256_slli_epi16(qh, 2);
        ho = _mm256_srli_epi16(qh, 6);
        break;
    case 2:
        he = qh;
        ho = _mm256_srli_epi16(qh, 8);
        break;
    default:
        he = _mm256_srli_epi16(qh, 2);
        ho = _mm256_srli_epi16(qh, 10);
        break;
    }
    *e = _mm256_sub_epi16(_mm256_or_si256(le, _mm256_and_si256(he, m30)),
                          k32);
    *o = _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_and_si256(ho, m30)),
                          k32);
}


/* the exact integer dot of a group of 32 weights (their even and odd
 * codes) with x's 32 codes at xe (16 even, then 16 odd): lane m holds
 * the sum over the group's weights 4m .. 4m + 3 */
static ALWAYS_INLINE_Q __m256i
lanes_dot(__m256i e, __m256i o, const int16_t *xe)
{
    return _mm256_add_epi32(
        _mm256_madd_epi16(e, _mm256_load_si256((const __m256i *) xe)),
        _mm256_madd_epi16(o, _mm256_load_si256((const __m256i *)
                                               (xe + 16))));
}


#if defined(__AVX512F__) && defined(__AVX512BW__)

/*
 * With AVX-512, two steps of the lane kernels below at once, with the
 * same integers and the same float operations in the same order, so
 * the bits are the AVX2 kernels'.  A 64-byte load holds the codes of
 * 128 weights: Q4_K's two steps k, k + 1 (sub-blocks 2k .. 2k + 3),
 * Q6_K's four groups 4h .. 4h + 3 (ql's 64 bytes; qh's 32 to both
 * halves, shifted by lane as q6k_lanes shifts them by group).  x's
 * codes are gathered to match: [16 codes at x | 16 at x + gap].
 */
#define LANES512  1

static ALWAYS_INLINE_Q __m512i
x512(const int16_t *x, int64_t gap)
{
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_load_si256((const __m256i *) x)),
        _mm256_load_si256((const __m256i *) (x + gap)), 1);
}


/* lanes_dot in each 256-bit half (exact integers either way) */
static ALWAYS_INLINE_Q __m512i
lanes_dot512(__m512i e, __m512i o, __m512i xe, __m512i xo)
{
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(e, xe), o, xo);
#else
    return _mm512_add_epi32(_mm512_madd_epi16(e, xe),
                            _mm512_madd_epi16(o, xo));
#endif
}


/* _mm256_hadd_epi32 of a's and b's low halves, then of their high */
static ALWAYS_INLINE_Q __m512i
hadd512(__m512i a, __m512i b)
{
    __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);

    return _mm512_add_epi32(
        _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
        _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xdd)));
}


/* acc = fma(v0, f's low half, acc), then fma(v1, its high half, acc) */
static ALWAYS_INLINE_Q __m256
fma2(__m256 v0, __m256 v1, __m512 f, __m256 acc)
{
    acc = _mm256_fmadd_ps(v0, _mm512_castps512_ps256(f), acc);
    return _mm256_fmadd_ps(v1, _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                   _mm512_castps_pd(f), 1)), acc);
}


static ALWAYS_INLINE_Q void
q4k_tile512(const int R, const int T, const uint8_t **p,
            float (*sd)[PT][16], const int16_t *xe, int64_t ldq, int64_t c,
            __m256 *acc, int as)
{
    const __m512i m4 = _mm512_set1_epi16(0x000F);
    const __m256i ix = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);

#pragma GCC unroll 2
    for (int k = 0; k < 4; k += 2) {
        const __m256i ik0 = _mm256_add_epi32(ix, _mm256_set1_epi32(2 * k));
        const __m256i ik1 = _mm256_add_epi32(ix, _mm256_set1_epi32(2 * k
                                                                   + 2));
        __m512i       X[PT][4];

        for (int u = 0; u < T; u++) {
            const int16_t *x = xe + u * ldq + c + 64 * k;

            for (int j = 0; j < 4; j++) {
                X[u][j] = x512(x + 16 * j, 64);
            }
        }
        for (int i = 0; i < R; i++) {
            __m512i b = _mm512_loadu_si512((const void *) (p[i] + 16
                                                           + 32 * k));
            __m512i e0 = _mm512_and_si512(b, m4);
            __m512i o0 = _mm512_and_si512(_mm512_srli_epi16(b, 8), m4);
            __m512i e1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
            __m512i o1 = _mm512_srli_epi16(b, 12);

            for (int u = 0; u < T; u++) {
                __m256  s = _mm256_load_ps(sd[i][u]);
                __m512i h = hadd512(lanes_dot512(e0, o0, X[u][0], X[u][1]),
                                    lanes_dot512(e1, o1, X[u][2], X[u][3]));

                acc[i * as + u] = fma2(_mm256_permutevar8x32_ps(s, ik0),
                                       _mm256_permutevar8x32_ps(s, ik1),
                                       _mm512_cvtepi32_ps(h),
                                       acc[i * as + u]);
            }
        }
    }
}


static ALWAYS_INLINE_Q void
q6k_tile512(const int R, const int T, const uint8_t **p,
            float (*sd)[PT][16], const int16_t *xe, int64_t ldq, int64_t c,
            __m256 *acc, int as)
{
    const __m512i m4 = _mm512_set1_epi16(0x000F);
    const __m512i m30 = _mm512_set1_epi16(0x0030);
    const __m512i k32 = _mm512_set1_epi16(32);
    const __m256i lo = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
    const __m256i hi = _mm256_setr_epi32(4, 4, 6, 6, 5, 5, 7, 7);
    /* q6k_lanes' shifts of qh, groups 4h, 4h + 2 in the low half and
     * 4h + 1, 4h + 3 in the high */
    const __m512i ea = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(2), 1);
    const __m512i oa = _mm512_inserti64x4(_mm512_set1_epi16(4),
                                          _mm256_set1_epi16(6), 1);
    const __m512i eb = _mm512_inserti64x4(_mm512_set1_epi16(0),
                                          _mm256_set1_epi16(2), 1);
    const __m512i ob = _mm512_inserti64x4(_mm512_set1_epi16(8),
                                          _mm256_set1_epi16(10), 1);

#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i X[PT][4];

        for (int u = 0; u < T; u++) {
            const int16_t *x = xe + u * ldq + c + 128 * h;

            X[u][0] = x512(x, 32);
            X[u][1] = x512(x + 16, 32);
            X[u][2] = x512(x + 64, 32);
            X[u][3] = x512(x + 80, 32);
        }
        for (int i = 0; i < R; i++) {
            __m512i a = _mm512_loadu_si512((const void *) (p[i] + 64 * h));
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                             (const __m256i *) (p[i] + 128 + 32 * h)));
            __m512i e0 = _mm512_sub_epi16(_mm512_or_si512(
                             _mm512_and_si512(a, m4),
                             _mm512_and_si512(_mm512_sllv_epi16(qh, ea),
                                              m30)), k32);
            __m512i o0 = _mm512_sub_epi16(_mm512_or_si512(
                             _mm512_and_si512(_mm512_srli_epi16(a, 8), m4),
                             _mm512_and_si512(_mm512_srlv_epi16(qh, oa),
                                              m30)), k32);
            __m512i e1 = _mm512_sub_epi16(_mm512_or_si512(
                             _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
                             _mm512_and_si512(_mm512_srlv_epi16(qh, eb),
                                              m30)), k32);
            __m512i o1 = _mm512_sub_epi16(_mm512_or_si512(
                             _mm512_srli_epi16(a, 12),
                             _mm512_and_si512(_mm512_srlv_epi16(qh, ob),
                                              m30)), k32);

            for (int u = 0; u < T; u++) {
                const float *s = sd[i][u] + 8 * h;
                __m512i      i0 = lanes_dot512(e0, o0, X[u][0], X[u][1]);
                __m512i      i1 = lanes_dot512(e1, o1, X[u][2], X[u][3]);
                __m512i      hs = hadd512(_mm512_shuffle_i64x2(i0, i1, 0x44),
                                          _mm512_shuffle_i64x2(i0, i1, 0xee));

                acc[i * as + u] = fma2(
                    _mm256_permutevar8x32_ps(_mm256_load_ps(s), lo),
                    _mm256_permutevar8x32_ps(_mm256_load_ps(s), hi),
                    _mm512_cvtepi32_ps(hs), acc[i * as + u]);
            }
        }
    }
}

#endif


/*
 * R rows by T tokens of one block at column c, from the rows' bytes p[]
 * and scales B: per two groups of 32 weights, g and g + 1 in order, with
 * I_g = lanes_dot (lane m: weights 4m .. 4m + 3 of the group) and
 * H = hadd(I_g, I_g+1) (each lane the exact sum of 8 weights' products,
 * exact as float too: at most 8 x 32 x 32767 < 2^24),
 * acc = fma(sd, (float) H, acc), sd each lane's sub-block scale times
 * x's: Q4_K (32-weight sub-blocks) a_g dx_g in lanes 0, 1, 4, 5 and
 * a_g+1 dx_g+1 in 2, 3, 6, 7; Q6_K (16-weight sub-blocks 2g .. 2g + 3)
 * a_2g dx_g in lanes 0, 1, a_2g+2 dx_g+1 in 2, 3, a_2g+1 dx_g in 4, 5,
 * a_2g+3 dx_g+1 in 6, 7.
 */
static ALWAYS_INLINE_Q void
i16_tile_lanes(ggml_type t, const int R, const int T, const uint8_t **p,
               const qblock *B, const int16_t *xe, int64_t ldq,
               const float *xd, int64_t ldd, int64_t c, __m256 *acc, int as)
{
    float sd[4][PT][16] __attribute__((aligned(32)));

    for (int i = 0; i < R; i++) {
        for (int u = 0; u < T; u++) {
            const float *d = xd + u * ldd + c / 32;

            if (t == GGML_Q4_K) {
                _mm256_store_ps(sd[i][u], _mm256_mul_ps(
                    _mm256_loadu_ps(B[i].a), _mm256_loadu_ps(d)));
            } else {
                const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);

                _mm256_store_ps(sd[i][u], _mm256_mul_ps(
                    _mm256_loadu_ps(B[i].a), _mm256_permutevar8x32_ps(
                        _mm256_castps128_ps256(_mm_loadu_ps(d)), dup)));
                _mm256_store_ps(sd[i][u] + 8, _mm256_mul_ps(
                    _mm256_loadu_ps(B[i].a + 8), _mm256_permutevar8x32_ps(
                        _mm256_castps128_ps256(_mm_loadu_ps(d + 4)), dup)));
            }
        }
    }
#if defined(LANES512)
    if (t == GGML_Q4_K) {
        q4k_tile512(R, T, p, sd, xe, ldq, c, acc, as);
    } else {
        q6k_tile512(R, T, p, sd, xe, ldq, c, acc, as);
    }
    return;
#endif
    if (t == GGML_Q4_K) {
        /* sub-blocks 2k and 2k + 1 at once: their lanes' sums, pairwise
         * (exact: at most 8 x 15 x 32767 < 2^24), hold 2k in lanes 0, 1,
         * 4, 5 and 2k + 1 in 2, 3, 6, 7 */
        const __m256i ix = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);

#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i ik = _mm256_add_epi32(ix, _mm256_set1_epi32(2 * k));

            for (int i = 0; i < R; i++) {
                __m256i e0, o0, e1, o1;

                q4k_lanes(p[i], k, &e0, &o0, &e1, &o1);
                for (int u = 0; u < T; u++) {
                    const int16_t *x = xe + u * ldq + c + 64 * k;
                    __m256        *a = &acc[i * as + u];
                    __m256         v = _mm256_permutevar8x32_ps(
                                           _mm256_load_ps(sd[i][u]), ik);

                    *a = _mm256_fmadd_ps(v, _mm256_cvtepi32_ps(
                             _mm256_hadd_epi32(lanes_dot(e0, o0, x),
                                               lanes_dot(e1, o1, x + 32))),
                             *a);
                }
            }
        }
        return;
    }
    /* Q6_K: groups g and g + 1 at once; their lanes' sums, pairwise
     * (_mm256_hadd_epi32, exact: at most 8 x 32 x 32767 < 2^24), hold
     * sub-blocks 2g, 2g + 2 in lanes 0-3 and 2g + 1, 2g + 3 in 4-7 */
    {
        const __m256i lo = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
        const __m256i hi = _mm256_setr_epi32(4, 4, 6, 6, 5, 5, 7, 7);

#pragma GCC unroll 4
        for (int g = 0; g < 8; g += 2) {
            for (int i = 0; i < R; i++) {
                __m256i e0, o0, e1, o1;

                q6k_lanes(p[i], g, &e0, &o0);
                q6k_lanes(p[i], g + 1, &e1, &o1);
                for (int u = 0; u < T; u++) {
                    const int16_t *x = xe + u * ldq + c + 32 * g;
                    __m256        *a = &acc[i * as + u];
                    __m256         v = _mm256_permutevar8x32_ps(
                                           _mm256_load_ps(sd[i][u]
                                                          + (g & 4) * 2),
                                           g & 2 ? hi : lo);

                    *a = _mm256_fmadd_ps(v, _mm256_cvtepi32_ps(
                             _mm256_hadd_epi32(lanes_dot(e0, o0, x),
                                               lanes_dot(e1, o1, x + 32))),
                             *a);
                }
            }
        }
    }
}


/* the integer dot of sub-block j's codes with x's, in 8 int32 lanes, for
 * R rows by T tokens */
static ALWAYS_INLINE_Q void
i16_dot(const int R, const int T, const int SUB, const int QS,
        const int8_t **q, const int16_t *xq, int64_t ldq, int64_t cj, int j,
        __m256i (*v)[PT])
{
    for (int k = 0; k < SUB; k += 16) {
        __m256i qv[4];

        for (int i = 0; i < R; i++) {
            qv[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                        (const __m128i *) (q[i] + j * QS + k)));
        }
        for (int u = 0; u < T; u++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)
                                            (xq + u * ldq + cj + k));

            for (int i = 0; i < R; i++) {
                __m256i p = _mm256_madd_epi16(qv[i], xv);

                v[i][u] = k == 0 ? p : _mm256_add_epi32(v[i][u], p);
            }
        }
    }
}


/*
 * Q5_K (8 sub-blocks of 32; Q4_K and Q6_K take i16_tile_lanes): per
 * group of 8 sub-blocks, their integer dots reduced to one vector whose
 * lane j is sub-block j's sum (exact), then acc = fma(a[j] * dx_j,
 * (float) sums, acc): one FMA per 8 sub-blocks.
 */
static ALWAYS_INLINE_Q void
i16_tile_k(const int R, const int T, const int SUB, const int NSUB,
           const int8_t **q, const qblock *B, const int16_t *xq,
           int64_t ldq, const float *xd, int64_t ldd, int64_t c,
           __m256 *acc, int as)
{
    for (int j0 = 0; j0 < NSUB; j0 += 8) {
        __m256i h[4][PT][4];

        for (int jp = 0; jp < 4; jp++) {
            __m256i va[4][PT], vb[4][PT];
            int     j = j0 + 2 * jp;

            i16_dot(R, T, SUB, SUB, q, xq, ldq, c + j * SUB, j, va);
            i16_dot(R, T, SUB, SUB, q, xq, ldq, c + (j + 1) * SUB, j + 1,
                    vb);
            for (int i = 0; i < R; i++) {
                for (int u = 0; u < T; u++) {
                    h[i][u][jp] = _mm256_hadd_epi32(va[i][u], vb[i][u]);
                }
            }
        }
        for (int u = 0; u < T; u++) {
            __m256 dx = _mm256_loadu_ps(xd + u * ldd + (c + j0 * SUB) / 32);

            for (int i = 0; i < R; i++) {
                __m256i b0 = _mm256_hadd_epi32(h[i][u][0], h[i][u][1]);
                __m256i b1 = _mm256_hadd_epi32(h[i][u][2], h[i][u][3]);
                __m256i s = _mm256_add_epi32(
                                _mm256_permute2x128_si256(b0, b1, 0x20),
                                _mm256_permute2x128_si256(b0, b1, 0x31));

                acc[i * as + u] = _mm256_fmadd_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(B[i].a + j0), dx),
                    _mm256_cvtepi32_ps(s), acc[i * as + u]);
            }
        }
    }
}


static ALWAYS_INLINE_Q void
i16_tile(ggml_type t, const int R, const int T, const int SUB,
         const int NSUB, const int QS, const int8_t **q,
         const uint8_t **p, const qblock *B, const int16_t *xq,
         const int16_t *xe, int64_t ldq, const float *xd, int64_t ldd,
         int64_t c, __m256 *acc, int as)
{
    if (LANES(t)) {
        i16_tile_lanes(t, R, T, p, B, xe, ldq, xd, ldd, c, acc, as);
        return;
    }
    if (t == GGML_Q5_K) {
        i16_tile_k(R, T, SUB, NSUB, q, B, xq, ldq, xd, ldd, c, acc, as);
        return;
    }
    for (int j = 0; j < NSUB; j++) {
        __m256i v[4][PT];
        int64_t cj = c + j * SUB;

        for (int k = 0; k < SUB; k += 16) {
            __m256i qv[4];

            for (int i = 0; i < R; i++) {
                qv[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                            (const __m128i *) (q[i] + j * QS + k)));
            }
            for (int u = 0; u < T; u++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)
                                                (xq + u * ldq + cj + k));

                for (int i = 0; i < R; i++) {
                    __m256i p = _mm256_madd_epi16(qv[i], xv);

                    v[i][u] = k == 0 ? p : _mm256_add_epi32(v[i][u], p);
                }
            }
        }
        for (int u = 0; u < T; u++) {
            float dx = xd[u * ldd + cj / 32];

            for (int i = 0; i < R; i++) {
                acc[i * as + u] = _mm256_fmadd_ps(
                    _mm256_set1_ps(B[i].a[j] * dx),
                    _mm256_cvtepi32_ps(v[i][u]), acc[i * as + u]);
            }
        }
    }
}


/* one step of R rows (R <= 4), one token, with the prefetch of
 * decode_step */
static ALWAYS_INLINE_Q void
i16_decode_step(ggml_type t, const qinfo *qi, const int R, const int NB,
                const int SUB, const int NSUB, const int HAS_MIN, int il,
                const qrows *Q, int64_t bi, const int16_t *xq,
                const int16_t *xe, const float *xd, const float *xs,
                __m256 *acc, __m256 *m)
{
    qblock         B[4];
    const int8_t  *q[4];
    const uint8_t *p[4];
    int64_t        c = bi * qi->qk;
    int64_t        off = qoff_at(il, qi->qk, qi->bytes, bi);

    for (int i = 0; i < R; i++) {
        p[i] = Q->row[i] + off;
        if (LANES(t)) {
            decode_scales_avx2(t, p[i], &B[i]);
        } else {
            q[i] = step_decode(t, NB, p[i], &B[i]);
        }
    }
    qrows_prefetch(Q, R, off, NB * qi->bytes);
    i16_tile(t, R, 1, SUB, NB * NSUB, QSTEP(t, SUB), q, p, B, xq, xe, 0, xd,
             0, c, acc, 1);
    if (HAS_MIN) {
        __m256 s = _mm256_loadu_ps(xs + c / 32);

        for (int i = 0; i < R; i++) {
            m[i] = _mm256_fmadd_ps(_mm256_loadu_ps(B[i].b), s, m[i]);
        }
    }
}


static ALWAYS_INLINE_Q void
i16_decode_rows(ggml_type t, const qinfo *qi, const int R, const int NB,
                const int SUB, const int NSUB, const int HAS_MIN,
                const uint8_t *w, int64_t wstride, int il, int64_t nblk,
                const int16_t *xq, const int16_t *xe, const float *xd,
                const float *xs, float *y, int64_t r, int64_t r_end,
                int accumulate)
{
    __m256  acc[4], m[4];
    int64_t bi = 0;
    qrows   Q;

    qrows_at(&Q, w, wstride, il, qi->qk, qi->bytes, R, PF_GROUPS, r, r_end);
    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
        m[i] = _mm256_setzero_ps();
    }
    for (; bi + NB <= nblk; bi += NB) {
        i16_decode_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, il, &Q, bi, xq, xe,
                        xd, xs, acc, m);
    }
    for (; bi < nblk; bi++) {
        i16_decode_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, il, &Q, bi, xq, xe,
                        xd, xs, acc, m);
    }
    for (int i = 0; i < R; i++) {
        float s = hsum8(acc[i]) - (HAS_MIN ? hsum8(m[i]) : 0);

        y[r + i] = accumulate ? y[r + i] + s : s;
    }
}


/* one step of rows r .. r + R - 1 (R <= PR), tn tokens in tiles of PT */
static ALWAYS_INLINE_Q void
i16_prefill_step(ggml_type t, const qinfo *qi, const int R, const int NB,
                 const int SUB, const int NSUB, const int HAS_MIN,
                 const uint8_t *w, int64_t wstride, int il, int64_t bi,
                 const int16_t *xq, const int16_t *xe, const float *xd,
                 const float *xs, int64_t cols, int tn, int64_t r,
                 __m256 *acc, __m256 (*m)[TOK_BLOCK])
{
    qblock         B[PR];
    const int8_t  *q[4];
    const uint8_t *p[4];
    int64_t        c = bi * qi->qk, ng = cols / 32;
    int            ns = NB * NSUB;

    for (int i = 0; i < R; i++) {
        p[i] = qblock_at(w, wstride, il, qi->qk, qi->bytes, r + i, bi);
        if (LANES(t)) {
            decode_scales_avx2(t, p[i], &B[i]);
        } else {
            q[i] = step_decode(t, NB, p[i], &B[i]);
        }
    }
    for (int tk = 0; tk < tn; tk += PT) {
        const int16_t *xt = xq + tk * cols, *et = xe + tk * cols;
        const float   *dt = xd + tk * ng;

        switch (tn - tk) {
        case 1:
            i16_tile(t, R, 1, SUB, ns, QSTEP(t, SUB), q, p, B, xt, et, cols,
                     dt, ng, c, acc + tk, TOK_BLOCK);
            break;
#if PT > 2
        case 2:
            i16_tile(t, R, 2, SUB, ns, QSTEP(t, SUB), q, p, B, xt, et, cols,
                     dt, ng, c, acc + tk, TOK_BLOCK);
            break;
#endif
        default:
            i16_tile(t, R, PT, SUB, ns, QSTEP(t, SUB), q, p, B, xt, et, cols,
                     dt, ng, c, acc + tk, TOK_BLOCK);
            break;
        }
    }
    for (int tk = 0; HAS_MIN && tk < tn; tk++) {
        __m256 s = _mm256_loadu_ps(xs + tk * ng + c / 32);

        for (int i = 0; i < R; i++) {
            m[i][tk] = _mm256_fmadd_ps(_mm256_loadu_ps(B[i].b), s, m[i][tk]);
        }
    }
}


static ALWAYS_INLINE_Q void
i16_prefill_rows(ggml_type t, const qinfo *qi, const int R, const int NB,
                 const int SUB, const int NSUB, const int HAS_MIN,
                 const uint8_t *w, int64_t wstride, int il, int64_t nblk,
                 const int16_t *xq, const int16_t *xe, const float *xd,
                 const float *xs, int64_t cols, int tn, float *y, int ldy,
                 int64_t r, int accumulate)
{
    __m256  acc[PR * TOK_BLOCK];
    __m256  m[PR][TOK_BLOCK];
    int64_t bi = 0;

    for (int i = 0; i < R; i++) {
        for (int tk = 0; tk < tn; tk++) {
            acc[i * TOK_BLOCK + tk] = _mm256_setzero_ps();
            m[i][tk] = _mm256_setzero_ps();
        }
    }
    for (; bi + NB <= nblk; bi += NB) {
        i16_prefill_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, il, bi,
                         xq, xe, xd, xs, cols, tn, r, acc, m);
    }
    for (; bi < nblk; bi++) {
        i16_prefill_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, il, bi,
                         xq, xe, xd, xs, cols, tn, r, acc, m);
    }
    for (int i = 0; i < R; i++) {
        for (int tk = 0; tk < tn; tk++) {
            float *o = y + (int64_t) tk * ldy + r + i;
            float  s = hsum8(acc[i * TOK_BLOCK + tk])
                       - (HAS_MIN ? hsum8(m[i][tk]) : 0);

            *o = accumulate ? *o + s : s;
        }
    }
}


/* rows r0 .. r1 - 1 of tn tokens from their codes (X: from token t0,
 * cols and cols / 32 apart per token) */
static ALWAYS_INLINE_Q void
i16_rows(ggml_type t, const qinfo *qi, const int NB, const int SUB,
         const int NSUB, const int HAS_MIN, const uint8_t *w,
         int64_t wstride, int il, int64_t cols, const nalar_xq *X, int t0,
         int tn, float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int64_t        ng = cols / 32;
    const int16_t *xq = X->q + t0 * cols, *xe = X->e + t0 * cols;
    const float   *xd = X->d + t0 * ng, *xs = X->s + t0 * ng;
    int64_t   nblk = cols / qi->qk;
    const int NBD = NB == 8 ? 2 : 1;
    int64_t   r = r0;

    if (tn == 1) {
        for (; r + 4 <= r1; r += 4) {
            i16_decode_rows(t, qi, 4, NBD, SUB, NSUB, HAS_MIN, w, wstride, il,
                            nblk, xq, xe, xd, xs, y, r, r1, accumulate);
        }
        for (; r < r1; r++) {
            i16_decode_rows(t, qi, 1, NBD, SUB, NSUB, HAS_MIN, w, wstride, il,
                            nblk, xq, xe, xd, xs, y, r, r1, accumulate);
        }
        return;
    }
    for (; r + PR <= r1; r += PR) {
        i16_prefill_rows(t, qi, PR, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
                         nblk, xq, xe, xd, xs, cols, tn, y, ldy, r,
                         accumulate);
    }
    for (; r < r1; r++) {
        i16_prefill_rows(t, qi, 1, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
                         nblk, xq, xe, xd, xs, cols, tn, y, ldy, r,
                         accumulate);
    }
}


/*
 * One type's kernel; SUB, NSUB and HAS_MIN are constants of the
 * instance.  Tokens in blocks of TOK_BLOCK, each block's codes from X or
 * made into the thread's scratch.
 */
static ALWAYS_INLINE_Q void
i16_kernel(ggml_type t, const qinfo *qi, const int SUB, const int NSUB,
           const int HAS_MIN, const uint8_t *w, int64_t wstride, int il,
           int64_t cols, const float *x, int ldx, const nalar_xq *X,
           int n_tok, float *y, int ldy, int64_t r0, int64_t r1,
           int accumulate)
{
    const int NB = qi->qk == 32 ? 8 : 1;    /* the 32-weight types */

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int          tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;
        const float *xb = x + (int64_t) t0 * ldx;
        float       *yb = y + (int64_t) t0 * ldy;
        float       *buf;
        nalar_xq     B;

        if (X != NULL) {
            i16_rows(t, qi, NB, SUB, NSUB, HAS_MIN, w, wstride, il, cols, X,
                     t0, tn, yb, ldy, r0, r1, accumulate);
            continue;
        }
        buf = nalar_quant_scratch((nalar_quant_xq_bytes(tn, cols) + 3) / 4);
        if (buf == NULL) {
            /* no room for x's codes: each token alone (the same
             * operations), or where even that fails the float path */
            for (int tk = 0; tk < tn; tk++) {
                buf = nalar_quant_scratch((nalar_quant_xq_bytes(1, cols)
                                           + 3) / 4);
                if (buf == NULL) {
                    nalar_quant_matmul(t, w, wstride, il, cols,
                                       xb + (int64_t) tk * ldx, 1, ldx,
                                       yb + (int64_t) tk * ldy, ldy, r0, r1,
                                       accumulate);
                    continue;
                }
                nalar_quant_xq(xb + (int64_t) tk * ldx, 1, ldx, cols, buf,
                               &B);
                i16_rows(t, qi, NB, SUB, NSUB, HAS_MIN, w, wstride, il, cols,
                         &B, 0, 1, yb + (int64_t) tk * ldy, ldy, r0, r1,
                         accumulate);
            }
            continue;
        }
        nalar_quant_xq(xb, tn, ldx, cols, buf, &B);
        i16_rows(t, qi, NB, SUB, NSUB, HAS_MIN, w, wstride, il, cols, &B, 0,
                 tn, yb, ldy, r0, r1, accumulate);
    }
}


#define I16_KERNEL(N, QK, BYTES, SUB, MIN)                                  \
void                                                                        \
nalar_quant_i16_##N(const uint8_t *w, int64_t wstride, int il,            \
                    int64_t cols, const float *x, int ldx,                  \
                    const nalar_xq *xq, int n_tok, float *y, int ldy,       \
                    int64_t r0, int64_t r1,                                 \
                    int accumulate)                                         \
{                                                                           \
    static const qinfo qi = { QK, BYTES, SUB, MIN };                        \
                                                                            \
    i16_kernel(GGML_##N, &qi, SUB, (QK) / (SUB), MIN, w, wstride, il,       \
               cols, x, ldx, xq, n_tok, y, ldy, r0, r1, accumulate);        \
}

#else  /* no AVX2: the portable kernel */

#define I16_KERNEL(N, QK, BYTES, SUB, MIN)                                  \
void                                                                        \
nalar_quant_i16_##N(const uint8_t *w, int64_t wstride, int il,            \
                    int64_t cols, const float *x, int ldx,                  \
                    const nalar_xq *xq, int n_tok, float *y, int ldy,       \
                    int64_t r0, int64_t r1,                                 \
                    int accumulate)                                         \
{                                                                           \
    if (xq != NULL) {                                                       \
        i16_portable(GGML_##N, w, wstride, il, cols, xq, n_tok, y, ldy, r0, \
                     r1, accumulate);                                       \
    } else {                                                                \
        nalar_quant_matmul_i16_portable(GGML_##N, w, wstride, il, cols,     \
                                        x, n_tok, ldx, y, ldy, r0, r1,      \
                                        accumulate);                        \
    }                                                                       \
}

#endif

QUANT_TYPES(I16_KERNEL)
