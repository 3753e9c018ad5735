/*
 * The block decoding of the quantized kernels (cpu_quant.c: F32
 * activations; the integer modes' scalar references, cpu_quant_q8.c and
 * cpu_quant_x16.c, through cpu_quant_q8_simd.h), as static inline
 * functions, with the list of the quantized types: a step of a row's
 * blocks decoded into int8 codes q[] and per sub-block float scales a[]
 * and mins b[].  Internal to the CPU kernels.
 */
#ifndef NALAR_CPU_QUANT_BLOCKS_H
#define NALAR_CPU_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "cpu_quant.h"
#include "fp16.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define TOK_BLOCK 24    /* tokens per pass over a row's blocks */
#define PR 3            /* rows of a batch's tile */
#define PT 3            /* tokens of a batch's tile */
#define QIL 4           /* rows of a group of an interleaved matrix */

/*
 * The quantized types, each once: X(name, weights per block, bytes per
 * block, weights per sub-block, has mins).  The type table, both
 * families' kernels and their dispatch (cpu_quant.c) are made from this
 * list; a new type is a line here plus its decoding below, its
 * dequantization (nalar_dequant_row) and its quantizer (cpu_quantize.c).
 */
#define QUANT_TYPES(X)                                                      \
    X(Q8_0, QK8_0, 2 + QK8_0, 32, 0)                                        \
    X(Q4_0, QK4_0, 2 + QK4_0 / 2, 32, 0)                                    \
    X(Q4_K, QK_K, QK4_K_BYTES, 32, 1)                                       \
    X(Q5_K, QK_K, QK5_K_BYTES, 32, 1)                                       \
    X(Q6_K, QK_K, QK6_K_BYTES, 16, 0)

/*
 * Where row r's block b lies: rows in the file's order, wstride bytes
 * apart (il 0), or interleaved (il 1, nalar_quant_interleave): the rows
 * in groups of QIL, each group's rows taking turns by QK_K weights, so
 * that one token's pass over QIL rows reads one stream.  Row r's block b
 * is at qrow_at(r) + qoff_at(b).
 */
static inline const uint8_t *
qrow_at(const uint8_t *w, int64_t wstride, int il, int64_t qk,
        int64_t bytes, int64_t r)
{
    if (!il) {
        return w + r * wstride;
    }
    return w + (r / QIL) * QIL * wstride + (r % QIL) * (QK_K / qk) * bytes;
}


static inline int64_t
qoff_at(int il, int64_t qk, int64_t bytes, int64_t b)
{
    int64_t per = QK_K / qk;    /* blocks per QK_K weights */

    if (!il) {
        return b * bytes;
    }
    return ((b / per) * QIL * per + b % per) * bytes;
}


static inline const uint8_t *
qblock_at(const uint8_t *w, int64_t wstride, int il, int64_t qk,
          int64_t bytes, int64_t r, int64_t b)
{
    return qrow_at(w, wstride, il, qk, bytes, r) + qoff_at(il, qk, bytes, b);
}


/* the rows r .. r + R - 1 one token's steps read, and the rows pf
 * groups of R further on that they prefetch (NULL past r_end) */
typedef struct {
    const uint8_t *row[4];
    const uint8_t *pf[4];
} qrows;

static inline void
qrows_at(qrows *Q, const uint8_t *w, int64_t wstride, int il, int64_t qk,
         int64_t bytes, int R, int pf, int64_t r, int64_t r_end)
{
    for (int i = 0; i < R; i++) {
        int64_t n = r + pf * R + i;

        Q->row[i] = qrow_at(w, wstride, il, qk, bytes, r + i);
        Q->pf[i] = n < r_end ? qrow_at(w, wstride, il, qk, bytes, n) : NULL;
    }
}


/* p[i]: the block at offset off of row Q->row[i], i < R */
static inline void
qrows_blocks(const qrows *Q, int R, int64_t off, const uint8_t **p)
{
    for (int i = 0; i < R; i++) {
        p[i] = Q->row[i] + off;
    }
}


/* a decoded step: up to QK_K codes, 16 scales, 8 mins */
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

/* t's qinfo; -1 when t is not a quantized type */
static inline int
qinfo_of(ggml_type t, qinfo *qi)
{
#define QUANT_INFO(N, QK, BYTES, SUB, MIN)                                  \
    case GGML_##N:                                                          \
        *qi = (qinfo) { QK, BYTES, SUB, MIN };                              \
        return 0;

    switch (t) {
    QUANT_TYPES(QUANT_INFO)
    default:
        return -1;
    }
#undef QUANT_INFO
}

/*
 * One type's F32 kernel: y[t * ldy + r] (+)= W[r, :] . x_t for r in
 * [r0, r1), t in [0, n_tok), x_t = x[t * ldx + :].
 */
typedef void quant_kernel_fn(const uint8_t *w, int64_t wstride, int il,
                             int64_t cols, const float *x, int ldx,
                             int n_tok, float *y, int ldy, int64_t r0,
                             int64_t r1, int accumulate);

/* this thread's scratch: `bytes` of slot `slot` (0 .. NALAR_SCRATCH_SLOTS
 * - 1; the slots are separate buffers, 64-byte aligned, kept for the
 * thread's life; a larger request may move a slot, never another), or NULL
 * (the caller then computes another way, with the same operations) */
#define NALAR_SCRATCH_SLOTS 2
void *nalar_quant_scratch_slot(int slot, int64_t bytes);
/* n floats of slot 0 */
float *nalar_quant_scratch(int64_t n);


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
static inline void
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
static inline void
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



#if defined(__AVX2__) && defined(__FMA__)

#define ALWAYS_INLINE_Q inline __attribute__((always_inline))

/*
 * Decoding one token reads each weight once, four rows at a time.  Rows
 * in the file's order are four short streams (a row of 2048 Q8_0 weights
 * is 34 cache lines), too short for the hardware prefetcher to get ahead
 * of; interleaved (qblock_at) they are one, which it follows.  Each step
 * also asks for the same columns of the rows PF_GROUPS groups further on,
 * so their lines are on the way while this group computes.
 */
#define PF_GROUPS 4


/* ask for the n bytes from offset off of the rows Q prefetches */
static ALWAYS_INLINE_Q void
qrows_prefetch(const qrows *Q, int R, int64_t off, int64_t n)
{
    for (int i = 0; i < R && Q->pf[i] != NULL; i++) {
        const char *pn = (const char *) Q->pf[i] + off;

        for (int64_t k = 0; k < n; k += 64) {
            _mm_prefetch(pn + k, _MM_HINT_T0);
        }
    }
}


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
        /* the 12 bytes of 6-bit codes in registers (a memcpy to an
         * array went through the stack), then to vectors: 8 scale codes
         * and 8 min codes, a byte each */
        uint64_t w01;
        uint32_t w0, w1, w2;
        uint64_t sc, mn;
        __m256   d = _mm256_set1_ps(f16_at(p));
        __m256   dm = _mm256_set1_ps(f16_at(p + 2));

        memcpy(&w01, p + 4, 8);
        memcpy(&w2, p + 12, 4);
        w0 = (uint32_t) w01;
        w1 = (uint32_t) (w01 >> 32);
        sc = (uint64_t) ((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u))
                 << 32
             | (w0 & 0x3f3f3f3fu);
        mn = (uint64_t) (((w2 >> 4) & 0x0f0f0f0fu)
                         | ((w1 >> 2) & 0x30303030u)) << 32
             | (w1 & 0x3f3f3f3fu);
        _mm256_storeu_ps(B->a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long) sc)))));
        _mm256_storeu_ps(B->b, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long) mn)))));
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


#if defined(__AVX512F__) && defined(__AVX512BW__)

/* Q6_K's codes (group32's values) of weights 64u .. 64u + 63 of the block
 * at p: half h = u / 2 of the block has 64 bytes of low nibbles, for
 * weights 0 .. 63 (low nibbles) and 64 .. 127 (high), and 32 bytes of
 * high bits, here in both 256-bit halves of a vector and shifted per half
 * (vpsllvw, vpsrlvw) so that each group's two bits land on bits 4 and 5 */
static ALWAYS_INLINE_Q __m512i
q6k_codes64(const uint8_t *p, int u)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    __m512i       l = _mm512_loadu_si512(p + 64 * (u / 2));
    __m512i       e = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                          (const __m256i *) (p + 128 + 32 * (u / 2))));
    __m512i       q;

    if (u % 2 == 0) {
        q = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(
                _mm512_sllv_epi16(e, _mm512_inserti64x4(
                    _mm512_set1_epi16(4), _mm256_set1_epi16(2), 1)), m30));
    } else {
        q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                            _mm512_and_si512(_mm512_srlv_epi16(e,
                                _mm512_inserti64x4(_mm512_setzero_si512(),
                                    _mm256_set1_epi16(2), 1)), m30));
    }
    return _mm512_sub_epi8(q, _mm512_set1_epi8(32));
}


/* Q6_K's 256 codes, 64 at a time */
static ALWAYS_INLINE_Q void
decode_q6k_512(const uint8_t *p, int8_t *q)
{
    for (int u = 0; u < 4; u++) {
        _mm512_storeu_si512(q + 64 * u, q6k_codes64(p, u));
    }
}

#endif


/* q[] of a block, with byte vectors, into q */
static ALWAYS_INLINE_Q void
decode_q_avx2(ggml_type t, const uint8_t *p, int8_t *q)
{
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (t == GGML_Q6_K) {
        decode_q6k_512(p, q);
        return;
    }
#endif
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

#endif

#endif
