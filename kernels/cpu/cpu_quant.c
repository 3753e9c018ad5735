/*
 * CPU kernels over block-quantized weights.  See cpu_quant.h.
 *
 * A step of a row (one K-quant block of 256 weights, or Q8_0/Q4_0 blocks
 * of 32: two for one token, eight for a batch) is decoded into int8 q[]
 * plus per sub-block float scales a[] and mins b[] (a few byte
 * operations per 32 weights), then dotted with each token's x.  One
 * token: four rows at a time, each code vector widened to float as it is
 * used, each vector of x loaded once for the four rows, whose chains
 * overlap, and the rows PF_GROUPS fours further on prefetched.  A batch: a tile of PR rows by PT tokens, the rows' codes
 * widened to floats once per step and reused from registers for the
 * tile's tokens.  The values, and so the operations per (row, token), are
 * the same in both.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "fp16.h"

#define TOK_BLOCK 24    /* tokens per pass over a row's blocks */
#define PR 3            /* rows of a batch's tile */
#define PT 3            /* tokens of a batch's tile */

typedef struct {
    int8_t q[QK_K] __attribute__((aligned(32)));
    float  a[16];       /* scale per sub-block */
    float  b[8];        /* min per sub-block (Q4_K, Q5_K) */
} qblock;

typedef struct {
    int64_t qk;         /* weights per block */
    int64_t bytes;      /* bytes per block */
    int     sub;        /* weights per sub-block */
    int     has_min;
} qinfo;


static int
qinfo_of(ggml_type t, qinfo *qi)
{
    switch (t) {
    case GGML_Q8_0:
        *qi = (qinfo) { QK8_0, 2 + QK8_0, 32, 0 };
        return 0;
    case GGML_Q4_0:
        *qi = (qinfo) { QK4_0, 2 + QK4_0 / 2, 32, 0 };
        return 0;
    case GGML_Q4_K:
        *qi = (qinfo) { QK_K, QK4_K_BYTES, 32, 1 };
        return 0;
    case GGML_Q5_K:
        *qi = (qinfo) { QK_K, QK5_K_BYTES, 32, 1 };
        return 0;
    case GGML_Q6_K:
        *qi = (qinfo) { QK_K, QK6_K_BYTES, 16, 0 };
        return 0;
    default:
        return -1;
    }
}


int
nalar_quant_type(ggml_type t)
{
    qinfo qi;

    return qinfo_of(t, &qi) == 0;
}


int64_t
nalar_quant_block(ggml_type t)
{
    qinfo qi;

    return qinfo_of(t, &qi) == 0 ? qi.qk : 1;
}


#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* an f16 as float (exact either way) */
static inline float
f16_at(const uint8_t *p)
{
    uint16_t h;

    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return nalar_f16_to_f32(h);
#endif
}


/* sub-block j's 6-bit scale and min of a Q4_K/Q5_K block's scales[12] */
static void
k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}


/* ------------------------------------------------------------------ */
/* reference dequantization (ggml's formulas)                          */


void
nalar_dequant_row(ggml_type t, const void *src, int64_t n, float *out)
{
    const uint8_t *p = src;

    switch (t) {
    case GGML_Q8_0:
        for (int64_t i = 0; i < n; i += QK8_0, p += 2 + QK8_0) {
            float d = f16_at(p);

            for (int l = 0; l < QK8_0; l++) {
                out[i + l] = (float) (int8_t) p[2 + l] * d;
            }
        }
        return;
    case GGML_Q4_0:
        for (int64_t i = 0; i < n; i += QK4_0, p += 2 + QK4_0 / 2) {
            float d = f16_at(p);

            for (int l = 0; l < 16; l++) {
                out[i + l] = (float) ((p[2 + l] & 0xF) - 8) * d;
                out[i + l + 16] = (float) ((p[2 + l] >> 4) - 8) * d;
            }
        }
        return;
    case GGML_Q4_K:
    case GGML_Q5_K:
        for (int64_t i = 0; i < n; i += QK_K) {
            float          d = f16_at(p), dmin = f16_at(p + 2);
            const uint8_t *sc = p + 4;
            const uint8_t *qh = p + 16;
            const uint8_t *qs = t == GGML_Q4_K ? p + 16 : p + 48;

            for (int k = 0; k < 4; k++) {
                int   s0, m0, s1, m1;
                float d1, n1, d2, n2;

                k4_scale_min(sc, 2 * k, &s0, &m0);
                k4_scale_min(sc, 2 * k + 1, &s1, &m1);
                d1 = d * (float) s0;
                n1 = dmin * (float) m0;
                d2 = d * (float) s1;
                n2 = dmin * (float) m1;
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * k + l] & 0xF, hi = qs[32 * k + l] >> 4;

                    if (t == GGML_Q5_K) {
                        lo += (qh[l] >> (2 * k) & 1) << 4;
                        hi += (qh[l] >> (2 * k + 1) & 1) << 4;
                    }
                    out[i + 64 * k + l] = d1 * (float) lo - n1;
                    out[i + 64 * k + 32 + l] = d2 * (float) hi - n2;
                }
            }
            p += t == GGML_Q4_K ? QK4_K_BYTES : QK5_K_BYTES;
        }
        return;
    case GGML_Q6_K:
        for (int64_t i = 0; i < n; i += QK_K, p += QK6_K_BYTES) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t  *sc = (const int8_t *) (p + 192);
            float          d = f16_at(p + 208);

            for (int h = 0; h < 2; h++) {
                for (int l = 0; l < 32; l++) {
                    int q1 = ((ql[64 * h + l] & 0xF)
                              | ((qh[32 * h + l] & 3) << 4)) - 32;
                    int q2 = ((ql[64 * h + l + 32] & 0xF)
                              | ((qh[32 * h + l] >> 2 & 3) << 4)) - 32;
                    int q3 = ((ql[64 * h + l] >> 4)
                              | ((qh[32 * h + l] >> 4 & 3) << 4)) - 32;
                    int q4 = ((ql[64 * h + l + 32] >> 4)
                              | ((qh[32 * h + l] >> 6 & 3) << 4)) - 32;
                    int is = 8 * h + l / 16;

                    out[i + 128 * h + l] = d * (float) sc[is] * (float) q1;
                    out[i + 128 * h + l + 32] =
                        d * (float) sc[is + 2] * (float) q2;
                    out[i + 128 * h + l + 64] =
                        d * (float) sc[is + 4] * (float) q3;
                    out[i + 128 * h + l + 96] =
                        d * (float) sc[is + 6] * (float) q4;
                }
            }
        }
        return;
    default:
        return;
    }
}


/* ------------------------------------------------------------------ */
/* block decoding (q as int8, scales and mins as float)                */


/* the float scales and mins of a block (every build) */
static inline __attribute__((always_inline)) void
decode_scales(ggml_type t, const uint8_t *p, qblock *B)
{
    switch (t) {
    case GGML_Q8_0:
    case GGML_Q4_0:
        B->a[0] = f16_at(p);
        return;
    case GGML_Q4_K:
    case GGML_Q5_K: {
        float d = f16_at(p), dmin = f16_at(p + 2);

        for (int j = 0; j < 8; j++) {
            int sc, m;

            k4_scale_min(p + 4, j, &sc, &m);
            B->a[j] = d * (float) sc;
            B->b[j] = dmin * (float) m;
        }
        return;
    }
    default: {  /* GGML_Q6_K */
        float d = f16_at(p + 208);

        for (int j = 0; j < 16; j++) {
            B->a[j] = d * (float) (int8_t) p[192 + j];
        }
        return;
    }
    }
}


/* q[] of a block, scalar */
static void
decode_q_scalar(ggml_type t, const uint8_t *p, qblock *B)
{
    switch (t) {
    case GGML_Q8_0:
        memcpy(B->q, p + 2, QK8_0);
        return;
    case GGML_Q4_0:
        for (int l = 0; l < 16; l++) {
            B->q[l] = (int8_t) ((p[2 + l] & 0xF) - 8);
            B->q[l + 16] = (int8_t) ((p[2 + l] >> 4) - 8);
        }
        return;
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const uint8_t *qh = p + 16;
        const uint8_t *qs = t == GGML_Q4_K ? p + 16 : p + 48;

        for (int k = 0; k < 4; k++) {
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * k + l] & 0xF, hi = qs[32 * k + l] >> 4;

                if (t == GGML_Q5_K) {
                    lo += (qh[l] >> (2 * k) & 1) << 4;
                    hi += (qh[l] >> (2 * k + 1) & 1) << 4;
                }
                B->q[64 * k + l] = (int8_t) lo;
                B->q[64 * k + 32 + l] = (int8_t) hi;
            }
        }
        return;
    }
    default: {  /* GGML_Q6_K */
        const uint8_t *ql = p, *qh = p + 128;

        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                uint8_t a = ql[64 * h + l], b = ql[64 * h + l + 32];
                uint8_t e = qh[32 * h + l];
                int8_t *q = B->q + 128 * h + l;

                q[0] = (int8_t) (((a & 0xF) | ((e & 3) << 4)) - 32);
                q[32] = (int8_t) (((b & 0xF) | ((e >> 2 & 3) << 4)) - 32);
                q[64] = (int8_t) (((a >> 4) | ((e >> 4 & 3) << 4)) - 32);
                q[96] = (int8_t) (((b >> 4) | ((e >> 6 & 3) << 4)) - 32);
            }
        }
        return;
    }
    }
}


/* ------------------------------------------------------------------ */
/* portable kernel                                                     */


void
nalar_quant_matmul_portable(ggml_type t, const uint8_t *w, int64_t wstride,
                            int64_t cols, const float *x, int n_tok, int ldx,
                            float *y, int ldy, int64_t r0, int64_t r1,
                            int accumulate)
{
    qinfo  qi;
    qblock B;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            const float *xt = x + (int64_t) tk * ldx;
            float        acc = 0, m = 0, s;
            float       *o = y + (int64_t) tk * ldy + r;

            for (int64_t c = 0; c < cols; c += qi.qk) {
                const uint8_t *p = w + r * wstride + c / qi.qk * qi.bytes;

                decode_scales(t, p, &B);
                decode_q_scalar(t, p, &B);
                for (int j = 0; j < qi.qk / qi.sub; j++) {
                    const float *xs = xt + c + j * qi.sub;
                    float        v = 0, xsum = 0;

                    for (int i = 0; i < qi.sub; i++) {
                        v = fmaf((float) B.q[j * qi.sub + i], xs[i], v);
                    }
                    acc = fmaf(B.a[j], v, acc);
                    if (qi.has_min) {
                        for (int i = 0; i < qi.sub; i++) {
                            xsum += xs[i];
                        }
                        m = fmaf(B.b[j], xsum, m);
                    }
                }
            }
            s = acc - m;
            *o = accumulate ? *o + s : s;
        }
    }
}


/* ------------------------------------------------------------------ */
/* 16-bit activations (see the header)                                 */


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


/* x's codes (n_tok rows of cols, 32-byte aligned), scales and scaled
 * sums per 32 (xd, xs: n_tok rows of cols / 32) in one allocation of
 * the bytes i16_bytes gives */
static int64_t
i16_bytes(int n_tok, int64_t cols)
{
    return (int64_t) n_tok * (cols * 2 + cols / 32 * 8) + 32;
}


static void
i16_prepare(const float *x, int n_tok, int ldx, int64_t cols, void *buf,
            int16_t **xq, float **xd, float **xs)
{
    uintptr_t a = ((uintptr_t) buf + 31) & ~(uintptr_t) 31;
    int64_t   ng = cols / 32;

    *xq = (int16_t *) a;
    *xd = (float *) (*xq + (int64_t) n_tok * cols);
    *xs = *xd + (int64_t) n_tok * ng;
    for (int tk = 0; tk < n_tok; tk++) {
        int16_t *q = *xq + tk * cols;
        float   *d = *xd + tk * ng, *s = *xs + tk * ng;

        nalar_quant_x_i16(x + (int64_t) tk * ldx, cols, q, d);
        for (int64_t g = 0; g < ng; g++) {
            int32_t sum = 0;

            for (int i = 0; i < 32; i++) {
                sum += q[32 * g + i];
            }
            s[g] = d[g] * (float) sum;
        }
    }
}


void
nalar_quant_matmul_i16_portable(ggml_type t, const uint8_t *w,
                                int64_t wstride, int64_t cols,
                                const float *x, int n_tok, int ldx,
                                float *y, int ldy, int64_t r0, int64_t r1,
                                int accumulate)
{
    qinfo    qi;
    qblock   B;
    void    *buf;
    int16_t *xq;
    float   *xd, *xs;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    buf = malloc((size_t) i16_bytes(n_tok, cols));
    if (buf == NULL) {
        /* no room for x's codes: the float path */
        nalar_quant_matmul_portable(t, w, wstride, cols, x, n_tok, ldx, y,
                                    ldy, r0, r1, accumulate);
        return;
    }
    i16_prepare(x, n_tok, ldx, cols, buf, &xq, &xd, &xs);
    for (int64_t r = r0; r < r1; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            const int16_t *xt = xq + tk * cols;
            const float   *dt = xd + tk * (cols / 32);
            const float   *st = xs + tk * (cols / 32);
            float          acc = 0, m = 0, s;
            float         *o = y + (int64_t) tk * ldy + r;

            for (int64_t c = 0; c < cols; c += qi.qk) {
                const uint8_t *p = w + r * wstride + c / qi.qk * qi.bytes;

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
    free(buf);
}


#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define ALWAYS_INLINE_Q inline __attribute__((always_inline))

/*
 * Decoding one token reads each weight once, four rows at a time: four
 * short streams (a row of 2048 Q8_0 weights is 34 cache lines), too short
 * for the hardware prefetcher to get ahead of.  Each step therefore asks
 * for the same columns of the rows PF_GROUPS groups further on, so their
 * lines are on the way while this group computes.
 */
#define PF_GROUPS 4


static ALWAYS_INLINE_Q float
hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);

    lo = _mm_add_ps(lo, hi);                   /* v0+v4 v1+v5 v2+v6 v3+v7 */
    hi = _mm_movehl_ps(lo, lo);                /* v2+v6 v3+v7 */
    lo = _mm_add_ps(lo, hi);                   /* (04)+(26) (15)+(37) */
    hi = _mm_shuffle_ps(lo, lo, 1);
    return _mm_cvtss_f32(_mm_add_ss(lo, hi));
}


/* 8 int8 codes as floats, from the low 8 bytes of v */
static ALWAYS_INLINE_Q __m256
i8x8_ps(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}


/* codes 32 g .. 32 g + 31 of a K-quant block (g = 0 .. 7), as bytes */
static ALWAYS_INLINE_Q __m256i
group32(ggml_type t, const uint8_t *p, int g)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);

    if (t == GGML_Q4_K || t == GGML_Q5_K) {
        __m256i b = _mm256_loadu_si256((const __m256i *)
                                       (p + (t == GGML_Q4_K ? 16 : 48)
                                        + 32 * (g / 2)));
        __m256i q = (g & 1) ? _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)
                            : _mm256_and_si256(b, m4);

        if (t == GGML_Q5_K) {
            __m256i h = _mm256_loadu_si256((const __m256i *) (p + 16));
            __m256i u = _mm256_set1_epi8((char) (1 << g));

            q = _mm256_or_si256(q, _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(h, u), u),
                    _mm256_set1_epi8(0x10)));
        }
        return q;
    } else {    /* GGML_Q6_K */
        const __m256i m30 = _mm256_set1_epi8(0x30);
        int           h = g / 4, i = g % 4;
        __m256i       a = _mm256_loadu_si256((const __m256i *)
                                             (p + 64 * h + 32 * (i & 1)));
        __m256i       e = _mm256_loadu_si256((const __m256i *)
                                             (p + 128 + 32 * h));
        __m256i       lo = i < 2 ? _mm256_and_si256(a, m4)
                           : _mm256_and_si256(_mm256_srli_epi16(a, 4), m4);
        __m256i       hi;

        switch (i) {
        case 0:  hi = _mm256_slli_epi16(e, 4); break;
        case 1:  hi = _mm256_slli_epi16(e, 2); break;
        case 2:  hi = e; break;
        default: hi = _mm256_srli_epi16(e, 2); break;
        }
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hi, m30)),
                               _mm256_set1_epi8(32));
    }
}


/* decode_scales with vectors: the same products, exactly */
static ALWAYS_INLINE_Q void
decode_scales_avx2(ggml_type t, const uint8_t *p, qblock *B)
{
    if (t == GGML_Q4_K || t == GGML_Q5_K) {
        uint32_t w[3], sc[2], mn[2];
        __m256   d = _mm256_set1_ps(f16_at(p));
        __m256   dm = _mm256_set1_ps(f16_at(p + 2));

        memcpy(w, p + 4, 12);
        sc[0] = w[0] & 0x3f3f3f3fu;
        mn[0] = w[1] & 0x3f3f3f3fu;
        sc[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
        mn[1] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u)
                                                << 4);
        _mm256_storeu_ps(B->a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) sc)))));
        _mm256_storeu_ps(B->b, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) mn)))));
    } else if (t == GGML_Q6_K) {
        __m256  d = _mm256_set1_ps(f16_at(p + 208));
        __m128i v = _mm_loadu_si128((const __m128i *) (p + 192));

        _mm256_storeu_ps(B->a, _mm256_mul_ps(d, i8x8_ps(v)));
        _mm256_storeu_ps(B->a + 8, _mm256_mul_ps(d,
                                      i8x8_ps(_mm_srli_si128(v, 8))));
    } else {
        B->a[0] = f16_at(p);
    }
}


/* q[] of a block, with byte vectors, into q */
static ALWAYS_INLINE_Q void
decode_q_avx2(ggml_type t, const uint8_t *p, int8_t *q)
{
    switch (t) {
    case GGML_Q8_0:
        _mm256_store_si256((__m256i *) q,
                           _mm256_loadu_si256((const __m256i *) (p + 2)));
        return;
    case GGML_Q4_0: {
        __m128i v = _mm_loadu_si128((const __m128i *) (p + 2));
        __m128i e = _mm_set1_epi8(8), f = _mm_set1_epi8(0x0F);

        _mm_store_si128((__m128i *) q,
                        _mm_sub_epi8(_mm_and_si128(v, f), e));
        _mm_store_si128((__m128i *) (q + 16),
                        _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), f),
                                     e));
        return;
    }
    default:
        for (int g = 0; g < 8; g++) {
            _mm256_store_si256((__m256i *) (q + 32 * g), group32(t, p, g));
        }
        return;
    }
}


static ALWAYS_INLINE_Q __m256
q8_to_ps(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64((const __m128i *) q)));
}


/* the 8-lane sum of a 32-float sub-block of x, reduced (see the header) */
static ALWAYS_INLINE_Q float
xsum32(const float *x)
{
    __m256 s0 = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
    __m256 s1 = _mm256_add_ps(_mm256_loadu_ps(x + 16),
                              _mm256_loadu_ps(x + 24));

    return hsum8(_mm256_add_ps(s0, s1));
}


/* the sums of x's eight 32-float sub-blocks from sub-block g0: from xs
 * (the sums of a row of x), or computed when xs is NULL */
static ALWAYS_INLINE_Q __m256
xsum256(const float *xs, const float *x, int64_t g0)
{
    float s[8];

    if (xs != NULL) {
        return _mm256_loadu_ps(xs + g0);
    }
    for (int j = 0; j < 8; j++) {
        s[j] = xsum32(x + 32 * (g0 + j));
    }
    return _mm256_loadu_ps(s);
}


/* Per-thread scratch: x's sub-block sums for a token block */
typedef struct {
    float  *buf;
    int64_t cap;
} q_scratch;

static pthread_key_t  scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;


static void
scratch_free(void *p)
{
    q_scratch *s = p;

    free(s->buf);
    free(s);
}


static void
scratch_key_init(void)
{
    (void) pthread_key_create(&scratch_key, scratch_free);
}


/* n floats of this thread's scratch, or NULL (the caller then sums x in
 * place, with the same operations) */
static float *
scratch_get(int64_t n)
{
    q_scratch *s;

    pthread_once(&scratch_once, scratch_key_init);
    s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->cap) {
        float *nb = realloc(s->buf, (size_t) n * sizeof(float));

        if (nb == NULL) {
            return NULL;
        }
        s->buf = nb;
        s->cap = n;
    }
    return s->buf;
}


/*
 * A step of NB blocks of a row (NB = 2 or 8 for the 32-weight types,
 * else 1):
 * its scales into B->a (mins into B->b), and its codes as int8, the
 * return value, sub-block j's at + j * QSTEP: Q8_0's read in place (34
 * bytes apart), the others decoded into B->q.
 */
#define QSTEP(t, SUB)  ((t) == GGML_Q8_0 ? 2 + QK8_0 : (SUB))

static ALWAYS_INLINE_Q const int8_t *
step_decode(ggml_type t, const int NB, const uint8_t *p, qblock *B)
{
    if (t == GGML_Q8_0 || t == GGML_Q4_0) {
        int64_t bytes = t == GGML_Q8_0 ? 2 + QK8_0 : 2 + QK4_0 / 2;

        for (int b = 0; b < NB; b++) {
            B->a[b] = f16_at(p + b * bytes);
            if (t == GGML_Q4_0) {
                decode_q_avx2(t, p + b * bytes, B->q + 32 * b);
            }
        }
        return t == GGML_Q8_0 ? (const int8_t *) (p + 2) : B->q;
    }
    decode_scales_avx2(t, p, B);
    decode_q_avx2(t, p, B->q);
    return B->q;
}


/*
 * One token, R rows (R <= 4), one step each: per sub-block j and row,
 * the 8-lane chain v over the sub-block, then acc = fma(a_j, v, acc) (the
 * header's order).  The rows' chains are independent, so they overlap,
 * and each vector of x is loaded once for the R rows.
 */
static ALWAYS_INLINE_Q void
rows_dot1(const int R, const int SUB, const int NSUB, const int QS,
          const int8_t **q, const qblock *B, const float *x, __m256 *acc)
{
    for (int j = 0; j < NSUB; j++) {
        __m256 v[4];

        for (int k = 0; k < SUB; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + j * SUB + k);

            for (int i = 0; i < R; i++) {
                __m256 qv = q8_to_ps(q[i] + j * QS + k);

                v[i] = k == 0 ? _mm256_mul_ps(qv, xv)
                              : _mm256_fmadd_ps(qv, xv, v[i]);
            }
        }
        for (int i = 0; i < R; i++) {
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(B[i].a[j]), v[i],
                                     acc[i]);
        }
    }
}


/* one step (NB blocks at column c) of rows r .. r + R - 1, one token */
static ALWAYS_INLINE_Q void
decode_step(ggml_type t, const qinfo *qi, const int R, const int NB,
            const int SUB, const int NSUB, const int HAS_MIN,
            const uint8_t *w, int64_t wstride, int64_t bi, const float *x,
            const float *xs, int64_t r, int64_t r_end, __m256 *acc,
            __m256 *m)
{
    qblock        B[4];
    const int8_t *q[4];
    int64_t       c = bi * qi->qk;

    for (int i = 0; i < R; i++) {
        q[i] = step_decode(t, NB, w + (r + i) * wstride + bi * qi->bytes,
                           &B[i]);
    }
    for (int i = 0; i < R && r + PF_GROUPS * R + i < r_end; i++) {
        const char *pn = (const char *) w + (r + PF_GROUPS * R + i) * wstride
                         + bi * qi->bytes;

        for (int64_t k = 0; k < NB * qi->bytes; k += 64) {
            _mm_prefetch(pn + k, _MM_HINT_T0);
        }
    }
    rows_dot1(R, SUB, NB * NSUB, QSTEP(t, SUB), q, B, x + c, acc);
    if (HAS_MIN) {
        __m256 s = xsum256(xs, x, c / 32);

        for (int i = 0; i < R; i++) {
            m[i] = _mm256_fmadd_ps(_mm256_loadu_ps(B[i].b), s, m[i]);
        }
    }
}


/* one token's outputs of rows r .. r + R - 1 */
static ALWAYS_INLINE_Q void
decode_rows(ggml_type t, const qinfo *qi, const int R, const int NB,
            const int SUB, const int NSUB, const int HAS_MIN,
            const uint8_t *w, int64_t wstride, int64_t nblk, const float *x,
            const float *xs, float *y, int64_t r, int64_t r_end,
            int accumulate)
{
    __m256  acc[4], m[4];
    int64_t bi = 0;

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
        m[i] = _mm256_setzero_ps();
    }
    for (; bi + NB <= nblk; bi += NB) {
        decode_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, bi, x, xs,
                    r, r_end, acc, m);
    }
    for (; bi < nblk; bi++) {
        decode_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, bi, x, xs,
                    r, r_end, acc, m);
    }
    for (int i = 0; i < R; i++) {
        float s = hsum8(acc[i]) - (HAS_MIN ? hsum8(m[i]) : 0);

        y[r + i] = accumulate ? y[r + i] + s : s;
    }
}


/*
 * R rows by T tokens of one step, from the rows' codes widened to
 * floats (qf, QK_K apart): the same chains as rows_dot1 per (row,
 * token), each code vector loaded once for the T tokens.  acc holds the
 * tile's accumulators, TOK_BLOCK apart per row.
 */
static ALWAYS_INLINE_Q void
tile_dot(const int R, const int T, const int SUB, const int NSUB,
         const float *qf, const qblock *B, const float *x, int ldx,
         __m256 *acc)
{
    __m256 a[PR][PT];

    for (int i = 0; i < R; i++) {
        for (int u = 0; u < T; u++) {
            a[i][u] = acc[i * TOK_BLOCK + u];
        }
    }
    for (int j = 0; j < NSUB; j++) {
        __m256 v[PR][PT];

        for (int k = 0; k < SUB; k += 8) {
            __m256 qv[PR];

            for (int i = 0; i < R; i++) {
                qv[i] = _mm256_load_ps(qf + i * QK_K + j * SUB + k);
            }
            for (int u = 0; u < T; u++) {
                __m256 xv = _mm256_loadu_ps(x + (int64_t) u * ldx + j * SUB
                                            + k);

                for (int i = 0; i < R; i++) {
                    v[i][u] = k == 0 ? _mm256_mul_ps(qv[i], xv)
                                     : _mm256_fmadd_ps(qv[i], xv, v[i][u]);
                }
            }
        }
        for (int i = 0; i < R; i++) {
            __m256 s = _mm256_set1_ps(B[i].a[j]);

            for (int u = 0; u < T; u++) {
                a[i][u] = _mm256_fmadd_ps(s, v[i][u], a[i][u]);
            }
        }
    }
    for (int i = 0; i < R; i++) {
        for (int u = 0; u < T; u++) {
            acc[i * TOK_BLOCK + u] = a[i][u];
        }
    }
}


/* one step (NB blocks at column c) of rows r .. r + R - 1, tn tokens:
 * the rows' codes decoded and widened to floats once */
static ALWAYS_INLINE_Q void
prefill_step(ggml_type t, const qinfo *qi, const int R, const int NB,
             const int SUB, const int NSUB, const int HAS_MIN,
             const uint8_t *w, int64_t wstride, int64_t bi, const float *x,
             int ldx, int tn, const float *xs, int64_t n_xs, int64_t r,
             __m256 *acc, __m256 (*m)[TOK_BLOCK])
{
    qblock  B[PR];
    float   qf[PR * QK_K] __attribute__((aligned(32)));
    int64_t c = bi * qi->qk;
    int     ns = NB * NSUB;

    for (int i = 0; i < R; i++) {
        const int8_t *q = step_decode(t, NB, w + (r + i) * wstride
                                             + bi * qi->bytes, &B[i]);

        for (int j = 0; j < ns; j++) {
            for (int k = 0; k < SUB; k += 8) {
                _mm256_store_ps(qf + i * QK_K + j * SUB + k,
                                q8_to_ps(q + j * QSTEP(t, SUB) + k));
            }
        }
    }
    for (int tk = 0; tk < tn; tk += PT) {
        const float *xt = x + (int64_t) tk * ldx + c;

        switch (tn - tk) {
        case 1:
            tile_dot(R, 1, SUB, ns, qf, B, xt, ldx, acc + tk);
            break;
#if PT > 2
        case 2:
            tile_dot(R, 2, SUB, ns, qf, B, xt, ldx, acc + tk);
            break;
#endif
#if PT > 3
        case 3:
            tile_dot(R, 3, SUB, ns, qf, B, xt, ldx, acc + tk);
            break;
#endif
        default:
            tile_dot(R, PT, SUB, ns, qf, B, xt, ldx, acc + tk);
            break;
        }
    }
    for (int tk = 0; HAS_MIN && tk < tn; tk++) {
        __m256 s = xsum256(xs != NULL ? xs + tk * n_xs : NULL,
                           x + (int64_t) tk * ldx, c / 32);

        for (int i = 0; i < R; i++) {
            m[i][tk] = _mm256_fmadd_ps(_mm256_loadu_ps(B[i].b), s, m[i][tk]);
        }
    }
}


/* tn tokens' outputs of rows r .. r + R - 1 (R <= PR) */
static ALWAYS_INLINE_Q void
prefill_rows(ggml_type t, const qinfo *qi, const int R, const int NB,
             const int SUB, const int NSUB, const int HAS_MIN,
             const uint8_t *w, int64_t wstride, int64_t nblk, const float *x,
             int ldx, int tn, const float *xs, int64_t n_xs, float *y,
             int ldy, int64_t r, int accumulate)
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
        prefill_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, bi, x,
                     ldx, tn, xs, n_xs, r, acc, m);
    }
    for (; bi < nblk; bi++) {
        prefill_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, bi, x, ldx,
                     tn, xs, n_xs, r, acc, m);
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


/*
 * One type's kernel; SUB (weights per sub-block), NSUB (sub-blocks per
 * block) and HAS_MIN are constants of the instance.  One token: rows in
 * fours (decode_rows); a batch: tiles of PR rows by PT tokens within
 * token blocks of TOK_BLOCK (prefill_rows).  Every (row, token) output
 * takes the same operations in either.
 */
static ALWAYS_INLINE_Q void
quant_kernel(ggml_type t, const qinfo *qi, const int SUB, const int NSUB,
             const int HAS_MIN, const uint8_t *w, int64_t wstride,
             int64_t cols, const float *x, int n_tok, int ldx, float *y,
             int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int64_t   nblk = cols / qi->qk;
    int64_t   n_xs = cols / 32;
    const int NB = t == GGML_Q8_0 || t == GGML_Q4_0 ? 8 : 1;
    const int NBD = NB == 8 ? 2 : 1;    /* one token's step */

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int          tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;
        const float *xb = x + (int64_t) t0 * ldx;
        float       *yb = y + (int64_t) t0 * ldy;
        float       *xs = NULL;
        int64_t      r = r0;

        if (HAS_MIN) {
            xs = scratch_get((int64_t) tn * n_xs);
            if (xs != NULL) {
                for (int tk = 0; tk < tn; tk++) {
                    for (int64_t g = 0; g < n_xs; g++) {
                        xs[tk * n_xs + g] = xsum32(xb + (int64_t) tk * ldx
                                                   + 32 * g);
                    }
                }
            }
        }
        if (tn == 1) {
            for (; r + 4 <= r1; r += 4) {
                decode_rows(t, qi, 4, NBD, SUB, NSUB, HAS_MIN, w, wstride,
                            nblk, xb, xs, yb, r, r1, accumulate);
            }
            for (; r < r1; r++) {
                decode_rows(t, qi, 1, NBD, SUB, NSUB, HAS_MIN, w, wstride,
                            nblk, xb, xs, yb, r, r1, accumulate);
            }
            continue;
        }
        for (; r + PR <= r1; r += PR) {
            prefill_rows(t, qi, PR, NB, SUB, NSUB, HAS_MIN, w, wstride,
                         nblk, xb, ldx, tn, xs, n_xs, yb, ldy, r, accumulate);
        }
        for (; r < r1; r++) {
            prefill_rows(t, qi, 1, NB, SUB, NSUB, HAS_MIN, w, wstride,
                         nblk, xb, ldx, tn, xs, n_xs, yb, ldy, r, accumulate);
        }
    }
}


void
nalar_quant_matmul(ggml_type t, const uint8_t *w, int64_t wstride,
                   int64_t cols, const float *x, int n_tok, int ldx,
                   float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    qinfo qi;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    switch (t) {
    case GGML_Q8_0:
        quant_kernel(GGML_Q8_0, &qi, 32, 1, 0, w, wstride, cols, x, n_tok,
                     ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q4_0:
        quant_kernel(GGML_Q4_0, &qi, 32, 1, 0, w, wstride, cols, x, n_tok,
                     ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q4_K:
        quant_kernel(GGML_Q4_K, &qi, 32, 8, 1, w, wstride, cols, x, n_tok,
                     ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q5_K:
        quant_kernel(GGML_Q5_K, &qi, 32, 8, 1, w, wstride, cols, x, n_tok,
                     ldx, y, ldy, r0, r1, accumulate);
        break;
    default:
        quant_kernel(GGML_Q6_K, &qi, 16, 16, 0, w, wstride, cols, x, n_tok,
                     ldx, y, ldy, r0, r1, accumulate);
        break;
    }
}

/*
 * 16-bit activations.  Per (row, token) and sub-block j, the integer dot
 * of the codes with x's codes in 8 int32 lanes (vpmaddwd over 16 codes at
 * a time, summed with vpaddd: exact, so its order is free), then
 * acc = fma(a_j * dx, (float) lanes, acc) over the sub-blocks in order
 * (the K-quants: 8 sub-blocks at a time, i16_tile_k); mins as the float
 * path, with xs the scaled sums of x's codes; y = hsum8(acc) - hsum8(m).
 * Decode (4 rows by 1 token) and prefill tiles (PR rows by PT tokens)
 * take these operations per (row, token).
 */
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
 * The K-quants (Q4_K, Q5_K: 8 sub-blocks of 32; Q6_K: 16 of 16): per
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
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);

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
            const float *d = xd + u * ldd + (c + j0 * SUB) / 32;
            __m256       dx = SUB == 32 ? _mm256_loadu_ps(d)
                              : _mm256_permutevar8x32_ps(
                                  _mm256_castps128_ps256(_mm_loadu_ps(d)),
                                  dup);

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
         const int NSUB, const int QS, const int8_t **q, const qblock *B,
         const int16_t *xq, int64_t ldq, const float *xd, int64_t ldd,
         int64_t c, __m256 *acc, int as)
{
    if (t == GGML_Q4_K || t == GGML_Q5_K || t == GGML_Q6_K) {
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
                const int SUB, const int NSUB, const int HAS_MIN,
                const uint8_t *w, int64_t wstride, int64_t bi,
                const int16_t *xq, const float *xd, const float *xs,
                int64_t r, int64_t r_end, __m256 *acc, __m256 *m)
{
    qblock        B[4];
    const int8_t *q[4];
    int64_t       c = bi * qi->qk;

    for (int i = 0; i < R; i++) {
        q[i] = step_decode(t, NB, w + (r + i) * wstride + bi * qi->bytes,
                           &B[i]);
    }
    for (int i = 0; i < R && r + PF_GROUPS * R + i < r_end; i++) {
        const char *pn = (const char *) w + (r + PF_GROUPS * R + i) * wstride
                         + bi * qi->bytes;

        for (int64_t k = 0; k < NB * qi->bytes; k += 64) {
            _mm_prefetch(pn + k, _MM_HINT_T0);
        }
    }
    i16_tile(t, R, 1, SUB, NB * NSUB, QSTEP(t, SUB), q, B, xq, 0, xd, 0, c,
             acc, 1);
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
                const uint8_t *w, int64_t wstride, int64_t nblk,
                const int16_t *xq, const float *xd, const float *xs,
                float *y, int64_t r, int64_t r_end, int accumulate)
{
    __m256  acc[4], m[4];
    int64_t bi = 0;

    for (int i = 0; i < R; i++) {
        acc[i] = _mm256_setzero_ps();
        m[i] = _mm256_setzero_ps();
    }
    for (; bi + NB <= nblk; bi += NB) {
        i16_decode_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, bi,
                        xq, xd, xs, r, r_end, acc, m);
    }
    for (; bi < nblk; bi++) {
        i16_decode_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, bi,
                        xq, xd, xs, r, r_end, acc, m);
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
                 const uint8_t *w, int64_t wstride, int64_t bi,
                 const int16_t *xq, const float *xd, const float *xs,
                 int64_t cols, int tn, int64_t r, __m256 *acc,
                 __m256 (*m)[TOK_BLOCK])
{
    qblock        B[PR];
    const int8_t *q[4];
    int64_t       c = bi * qi->qk, ng = cols / 32;
    int           ns = NB * NSUB;

    for (int i = 0; i < R; i++) {
        q[i] = step_decode(t, NB, w + (r + i) * wstride + bi * qi->bytes,
                           &B[i]);
    }
    for (int tk = 0; tk < tn; tk += PT) {
        const int16_t *xt = xq + tk * cols;
        const float   *dt = xd + tk * ng;

        switch (tn - tk) {
        case 1:
            i16_tile(t, R, 1, SUB, ns, QSTEP(t, SUB), q, B, xt, cols, dt, ng, c,
                     acc + tk, TOK_BLOCK);
            break;
#if PT > 2
        case 2:
            i16_tile(t, R, 2, SUB, ns, QSTEP(t, SUB), q, B, xt, cols, dt, ng, c,
                     acc + tk, TOK_BLOCK);
            break;
#endif
        default:
            i16_tile(t, R, PT, SUB, ns, QSTEP(t, SUB), q, B, xt, cols, dt, ng,
                     c, acc + tk, TOK_BLOCK);
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
                 const uint8_t *w, int64_t wstride, int64_t nblk,
                 const int16_t *xq, const float *xd, const float *xs,
                 int64_t cols, int tn, float *y, int ldy, int64_t r,
                 int accumulate)
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
        i16_prefill_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, bi,
                         xq, xd, xs, cols, tn, r, acc, m);
    }
    for (; bi < nblk; bi++) {
        i16_prefill_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, bi,
                         xq, xd, xs, cols, tn, r, acc, m);
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


static ALWAYS_INLINE_Q void
i16_kernel(ggml_type t, const qinfo *qi, const int SUB, const int NSUB,
           const int HAS_MIN, const uint8_t *w, int64_t wstride,
           int64_t cols, const float *x, int n_tok, int ldx, float *y,
           int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int64_t   nblk = cols / qi->qk;
    const int NB = t == GGML_Q8_0 || t == GGML_Q4_0 ? 8 : 1;
    const int NBD = NB == 8 ? 2 : 1;

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int          tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;
        const float *xb = x + (int64_t) t0 * ldx;
        float       *yb = y + (int64_t) t0 * ldy;
        float       *buf = scratch_get((i16_bytes(tn, cols) + 3) / 4);
        int16_t     *xq;
        float       *xd, *xs;
        int64_t      r = r0;

        if (buf == NULL) {
            /* no room for x's codes: each token alone (the same
             * operations), or where even that fails the float path */
            for (int tk = 0; tk < tn; tk++) {
                buf = scratch_get((i16_bytes(1, cols) + 3) / 4);
                if (buf == NULL) {
                    nalar_quant_matmul(t, w, wstride, cols,
                                       xb + (int64_t) tk * ldx, 1, ldx,
                                       yb + (int64_t) tk * ldy, ldy, r0, r1,
                                       accumulate);
                    continue;
                }
                i16_prepare(xb + (int64_t) tk * ldx, 1, ldx, cols, buf, &xq,
                            &xd, &xs);
                for (r = r0; r + 4 <= r1; r += 4) {
                    i16_decode_rows(t, qi, 4, NBD, SUB, NSUB, HAS_MIN, w,
                                    wstride, nblk, xq, xd, xs,
                                    yb + (int64_t) tk * ldy, r, r1,
                                    accumulate);
                }
                for (; r < r1; r++) {
                    i16_decode_rows(t, qi, 1, NBD, SUB, NSUB, HAS_MIN, w,
                                    wstride, nblk, xq, xd, xs,
                                    yb + (int64_t) tk * ldy, r, r1,
                                    accumulate);
                }
            }
            continue;
        }
        i16_prepare(xb, tn, ldx, cols, buf, &xq, &xd, &xs);
        if (tn == 1) {
            for (; r + 4 <= r1; r += 4) {
                i16_decode_rows(t, qi, 4, NBD, SUB, NSUB, HAS_MIN, w,
                                wstride, nblk, xq, xd, xs, yb, r, r1,
                                accumulate);
            }
            for (; r < r1; r++) {
                i16_decode_rows(t, qi, 1, NBD, SUB, NSUB, HAS_MIN, w,
                                wstride, nblk, xq, xd, xs, yb, r, r1,
                                accumulate);
            }
            continue;
        }
        for (; r + PR <= r1; r += PR) {
            i16_prefill_rows(t, qi, PR, NB, SUB, NSUB, HAS_MIN, w, wstride,
                             nblk, xq, xd, xs, cols, tn, yb, ldy, r,
                             accumulate);
        }
        for (; r < r1; r++) {
            i16_prefill_rows(t, qi, 1, NB, SUB, NSUB, HAS_MIN, w, wstride,
                             nblk, xq, xd, xs, cols, tn, yb, ldy, r,
                             accumulate);
        }
    }
}


void
nalar_quant_matmul_i16(ggml_type t, const uint8_t *w, int64_t wstride,
                       int64_t cols, const float *x, int n_tok, int ldx,
                       float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    qinfo qi;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    switch (t) {
    case GGML_Q8_0:
        i16_kernel(GGML_Q8_0, &qi, 32, 1, 0, w, wstride, cols, x, n_tok,
                   ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q4_0:
        i16_kernel(GGML_Q4_0, &qi, 32, 1, 0, w, wstride, cols, x, n_tok,
                   ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q4_K:
        i16_kernel(GGML_Q4_K, &qi, 32, 8, 1, w, wstride, cols, x, n_tok,
                   ldx, y, ldy, r0, r1, accumulate);
        break;
    case GGML_Q5_K:
        i16_kernel(GGML_Q5_K, &qi, 32, 8, 1, w, wstride, cols, x, n_tok,
                   ldx, y, ldy, r0, r1, accumulate);
        break;
    default:
        i16_kernel(GGML_Q6_K, &qi, 16, 16, 0, w, wstride, cols, x, n_tok,
                   ldx, y, ldy, r0, r1, accumulate);
        break;
    }
}

#else  /* no AVX2: the portable kernel */

void
nalar_quant_matmul_i16(ggml_type t, const uint8_t *w, int64_t wstride,
                       int64_t cols, const float *x, int n_tok, int ldx,
                       float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    nalar_quant_matmul_i16_portable(t, w, wstride, cols, x, n_tok, ldx, y,
                                    ldy, r0, r1, accumulate);
}

void
nalar_quant_matmul(ggml_type t, const uint8_t *w, int64_t wstride,
                   int64_t cols, const float *x, int n_tok, int ldx,
                   float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    nalar_quant_matmul_portable(t, w, wstride, cols, x, n_tok, ldx, y, ldy,
                                r0, r1, accumulate);
}

#endif


/* ------------------------------------------------------------------ */
/* quantizers: a plain min/max fit per sub-block, scales rounded to     */
/* their stored width, then every weight rounded to the nearest code    */


static uint16_t
put_f16(uint8_t *p, float v)
{
    uint16_t h = nalar_f32_to_f16(v);

    memcpy(p, &h, 2);
    return h;
}


static int
clampi(float v, int lo, int hi)
{
    int i = (int) lrintf(v);

    return i < lo ? lo : i > hi ? hi : i;
}


static void
quant_q8_0(const float *x, uint8_t *p)
{
    float amax = 0, d;

    for (int i = 0; i < QK8_0; i++) {
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    }
    d = nalar_f16_to_f32(put_f16(p, amax / 127.0f));
    for (int i = 0; i < QK8_0; i++) {
        p[2 + i] = (uint8_t) (int8_t) (d != 0 ? clampi(x[i] / d, -127, 127)
                                              : 0);
    }
}


static void
quant_q4_0(const float *x, uint8_t *p)
{
    float amax = 0, m = 0, d;

    for (int i = 0; i < QK4_0; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    d = nalar_f16_to_f32(put_f16(p, m / -8.0f));
    for (int l = 0; l < 16; l++) {
        int lo = d != 0 ? clampi(x[l] / d + 8.0f, 0, 15) : 8;
        int hi = d != 0 ? clampi(x[l + 16] / d + 8.0f, 0, 15) : 8;

        p[2 + l] = (uint8_t) (lo | (hi << 4));
    }
}


/* Q4_K (levels 15) or Q5_K (levels 31): 8 sub-blocks of 32 */
static void
quant_k45(const float *x, uint8_t *p, int q5)
{
    float    sc[8], mn[8], maxs = 0, maxm = 0, d, dmin;
    int      is[8], im[8], levels = q5 ? 31 : 15;
    uint8_t *s = p + 4, *qh = p + 16, *qs = q5 ? p + 48 : p + 16;

    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = x[32 * j];

        for (int i = 0; i < 32; i++) {
            lo = x[32 * j + i] < lo ? x[32 * j + i] : lo;
            hi = x[32 * j + i] > hi ? x[32 * j + i] : hi;
        }
        hi = hi > lo ? hi : lo;
        sc[j] = (hi - lo) / (float) levels;
        mn[j] = -lo;
        maxs = sc[j] > maxs ? sc[j] : maxs;
        maxm = mn[j] > maxm ? mn[j] : maxm;
    }
    d = nalar_f16_to_f32(put_f16(p, maxs / 63.0f));
    dmin = nalar_f16_to_f32(put_f16(p + 2, maxm / 63.0f));
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        is[j] = d > 0 ? clampi(sc[j] / d, 0, 63) : 0;
        im[j] = dmin > 0 ? clampi(mn[j] / dmin, 0, 63) : 0;
        if (j < 4) {
            s[j] = (uint8_t) is[j];
            s[j + 4] = (uint8_t) im[j];
        } else {
            s[j + 4] = (uint8_t) ((is[j] & 0xF) | ((im[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t) ((is[j] >> 4) << 6);
            s[j] |= (uint8_t) ((im[j] >> 4) << 6);
        }
    }
    if (q5) {
        memset(qh, 0, 32);
    }
    for (int k = 0; k < 4; k++) {
        for (int l = 0; l < 32; l++) {
            int v[2];

            for (int h = 0; h < 2; h++) {
                int   j = 2 * k + h;
                float a = d * (float) is[j], b = dmin * (float) im[j];

                v[h] = a > 0 ? clampi((x[32 * j + l] + b) / a, 0, levels)
                             : 0;
                if (q5 && v[h] > 15) {
                    qh[l] |= (uint8_t) (1 << j);
                }
            }
            qs[32 * k + l] = (uint8_t) ((v[0] & 0xF) | ((v[1] & 0xF) << 4));
        }
    }
}


/* Q6_K: 16 sub-blocks of 16, signed codes -32 .. 31 */
static void
quant_q6_k(const float *x, uint8_t *p)
{
    float   sc[16], maxs = 0, d;
    int     is[16], q[QK_K];
    uint8_t *ql = p, *qh = p + 128;
    int8_t  *s = (int8_t *) (p + 192);

    for (int j = 0; j < 16; j++) {
        float amax = 0, m = 0;

        for (int i = 0; i < 16; i++) {
            if (fabsf(x[16 * j + i]) > amax) {
                amax = fabsf(x[16 * j + i]);
                m = x[16 * j + i];
            }
        }
        sc[j] = m / -32.0f;
        maxs = fabsf(sc[j]) > maxs ? fabsf(sc[j]) : maxs;
    }
    d = nalar_f16_to_f32(put_f16(p + 208, maxs / 127.0f));
    for (int j = 0; j < 16; j++) {
        float a;

        is[j] = d > 0 ? clampi(sc[j] / d, -127, 127) : 0;
        s[j] = (int8_t) is[j];
        a = d * (float) is[j];
        for (int i = 0; i < 16; i++) {
            q[16 * j + i] = (a != 0 ? clampi(x[16 * j + i] / a, -32, 31) : 0)
                            + 32;
        }
    }
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            const int *v = q + 128 * h + l;

            ql[64 * h + l] = (uint8_t) ((v[0] & 0xF) | ((v[64] & 0xF) << 4));
            ql[64 * h + l + 32] = (uint8_t) ((v[32] & 0xF)
                                             | ((v[96] & 0xF) << 4));
            qh[32 * h + l] = (uint8_t) ((v[0] >> 4) | ((v[32] >> 4) << 2)
                                        | ((v[64] >> 4) << 4)
                                        | ((v[96] >> 4) << 6));
        }
    }
}


int
nalar_quantize_row(ggml_type t, const float *x, int64_t n, void *dst)
{
    qinfo    qi;
    uint8_t *p = dst;

    if (qinfo_of(t, &qi) != 0 || n % qi.qk != 0) {
        return -1;
    }
    for (int64_t i = 0; i < n; i += qi.qk, p += qi.bytes) {
        switch (t) {
        case GGML_Q8_0: quant_q8_0(x + i, p); break;
        case GGML_Q4_0: quant_q4_0(x + i, p); break;
        case GGML_Q4_K: quant_k45(x + i, p, 0); break;
        case GGML_Q5_K: quant_k45(x + i, p, 1); break;
        default:        quant_q6_k(x + i, p); break;
        }
    }
    return 0;
}
