/*
 * CPU kernels over block-quantized weights with F32 activations (see
 * cpu_quant.h), the one dispatch of both families' kernels (the 16-bit
 * ones are in cpu_quant_i16.c), and the reference dequantization.
 *
 * A step of a row (one K-quant block of 256 weights, or Q8_0/Q4_0 blocks
 * of 32: two for one token, eight for a batch) is decoded into int8 q[]
 * plus per sub-block float scales a[] and mins b[] (a few byte
 * operations per 32 weights, cpu_quant_blocks.h), then dotted with each
 * token's x.  One token: four rows at a time, each code vector widened to
 * float as it is used, each vector of x loaded once for the four rows,
 * whose chains overlap, and the rows PF_GROUPS fours further on
 * prefetched.  A batch: a tile of PR rows by PT tokens, the rows' codes
 * widened to floats once per step and reused from registers for the
 * tile's tokens.  The values, and so the operations per (row, token), are
 * the same in both, and in either layout of the rows (qblock_at: the
 * file's order, or interleaved by 4, nalar_quant_interleave).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"


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


int
nalar_quant_can_interleave(ggml_type t, int64_t cols)
{
    qinfo qi;

    return qinfo_of(t, &qi) == 0 && cols % QK_K == 0;
}


int64_t
nalar_quant_interleaved_bytes(ggml_type t, int64_t rows, int64_t cols)
{
    qinfo qi;

    if (qinfo_of(t, &qi) != 0) {
        return 0;
    }
    return (rows + QIL - 1) / QIL * QIL * (cols / qi.qk) * qi.bytes;
}


void
nalar_quant_interleave(ggml_type t, const uint8_t *src, int64_t rows,
                       int64_t cols, uint8_t *dst)
{
    qinfo   qi;
    int64_t nblk, rb, n;

    if (qinfo_of(t, &qi) != 0) {
        return;
    }
    nblk = cols / qi.qk;
    rb = nblk * qi.bytes;
    n = (rows + QIL - 1) / QIL * QIL;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < nblk; b++) {
            uint8_t *d = (uint8_t *) qblock_at(dst, rb, 1, qi.qk, qi.bytes,
                                               r, b);

            if (r < rows) {
                memcpy(d, src + r * rb + b * qi.bytes, (size_t) qi.bytes);
            } else {
                memset(d, 0, (size_t) qi.bytes);
            }
        }
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



/* Per-thread scratch: x's sub-block sums (F32) or codes (16-bit) for a
 * token block */
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


float *
nalar_quant_scratch(int64_t n)
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


/* ------------------------------------------------------------------ */
/* portable kernel                                                     */


void
nalar_quant_matmul_portable(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const float *x, int n_tok,
                            int ldx, float *y, int ldy, int64_t r0, int64_t r1,
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
                const uint8_t *p = qblock_at(w, wstride, il, qi.qk,
                                             qi.bytes, r, c / qi.qk);

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



#if defined(__AVX2__) && defined(__FMA__)

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


#if defined(__AVX512F__) && defined(__AVX512DQ__)

/* two 8-lane vectors as one: lo in the low half, hi in the high */
static ALWAYS_INLINE_Q __m512
pair_ps(__m256 lo, __m256 hi)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}


/* pair_ps split back */
static ALWAYS_INLINE_Q void
unpair_ps(__m512 v, __m256 *lo, __m256 *hi)
{
    *lo = _mm512_castps512_ps256(v);
    *hi = _mm512_extractf32x8_ps(v, 1);
}


/* 8 bytes at p0, then 8 at p1 */
static ALWAYS_INLINE_Q __m128i
bytes2x8(const void *p0, const void *p1)
{
    return _mm_castpd_si128(_mm_loadh_pd(
               _mm_castsi128_pd(_mm_loadl_epi64((const __m128i *) p0)),
               (const double *) p1));
}


/*
 * rows_dot1 for four rows with AVX-512: rows 2i and 2i + 1 share a
 * vector, row 2i's 8 lanes in the low half and 2i + 1's in the high, so
 * each lane's chain and each row's acc are rows_dot1's (the same bits)
 * in half the instructions: x's 8 floats go to both halves, and the two
 * rows' 8 codes are loaded together.
 */
static ALWAYS_INLINE_Q void
rows_dot4_512(const int SUB, const int NSUB, const int QS, const int8_t **q,
              const qblock *B, const float *x, __m256 *acc)
{
    __m512 a[2];

    for (int h = 0; h < 2; h++) {
        a[h] = pair_ps(acc[2 * h], acc[2 * h + 1]);
    }
    for (int j = 0; j < NSUB; j++) {
        __m512 v[2];

        for (int k = 0; k < SUB; k += 8) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + j * SUB
                                                               + k));

            for (int h = 0; h < 2; h++) {
                __m512 qv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                bytes2x8(q[2 * h] + j * QS + k,
                                         q[2 * h + 1] + j * QS + k)));
                v[h] = k == 0 ? _mm512_mul_ps(qv, xv)
                              : _mm512_fmadd_ps(qv, xv, v[h]);
            }
        }
        for (int h = 0; h < 2; h++) {
            a[h] = _mm512_fmadd_ps(pair_ps(_mm256_set1_ps(B[2 * h].a[j]),
                                           _mm256_set1_ps(B[2 * h + 1].a[j])),
                                   v[h], a[h]);
        }
    }
    for (int h = 0; h < 2; h++) {
        unpair_ps(a[h], &acc[2 * h], &acc[2 * h + 1]);
    }
}


/*
 * rows_dot4_512 for Q4_K straight from the blocks' bytes: the two rows'
 * 8 bytes of nibbles, widened once, give sub-block 2k's 8 codes (the low
 * nibbles) and 2k + 1's (the high), with nothing decoded into memory;
 * the two sub-blocks' chains run side by side, then scale into acc in
 * order: rows_dot1's operations, so its bits.
 */
static ALWAYS_INLINE_Q void
rows_dot4_q4k_512(const uint8_t **p, const qblock *B, const float *x,
                  __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi32(0x0F);
    __m512        a[2];

    for (int h = 0; h < 2; h++) {
        a[h] = pair_ps(acc[2 * h], acc[2 * h + 1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512 v0[2], v1[2];

        for (int l = 0; l < 32; l += 8) {
            __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 64 * k
                                                               + l));
            __m512 x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 64 * k
                                                               + 32 + l));

            for (int h = 0; h < 2; h++) {
                __m512i b = _mm512_cvtepu8_epi32(
                                bytes2x8(p[2 * h] + 16 + 32 * k + l,
                                         p[2 * h + 1] + 16 + 32 * k + l));
                __m512  q0, q1;

                q0 = _mm512_cvtepi32_ps(_mm512_and_si512(b, m4));
                q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
                v0[h] = l == 0 ? _mm512_mul_ps(q0, x0)
                               : _mm512_fmadd_ps(q0, x0, v0[h]);
                v1[h] = l == 0 ? _mm512_mul_ps(q1, x1)
                               : _mm512_fmadd_ps(q1, x1, v1[h]);
            }
        }
        for (int h = 0; h < 2; h++) {
            for (int u = 0; u < 2; u++) {
                a[h] = _mm512_fmadd_ps(
                           pair_ps(_mm256_set1_ps(B[2 * h].a[2 * k + u]),
                                   _mm256_set1_ps(B[2 * h + 1].a[2 * k + u])),
                           u ? v1[h] : v0[h], a[h]);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        unpair_ps(a[h], &acc[2 * h], &acc[2 * h + 1]);
    }
}

#endif


/* one step (NB blocks at column c) of rows r .. r + R - 1, one token */
static ALWAYS_INLINE_Q void
decode_step(ggml_type t, const qinfo *qi, const int R, const int NB,
            const int SUB, const int NSUB, const int HAS_MIN, int il,
            const qrows *Q, int64_t bi, const float *x, const float *xs,
            __m256 *acc, __m256 *m)
{
    qblock        B[4];
    const int8_t *q[4];
    int64_t       c = bi * qi->qk;
    int64_t       off = qoff_at(il, qi->qk, qi->bytes, bi);

#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (t == GGML_Q4_K && R == 4) {
        const uint8_t *p[4];

        for (int i = 0; i < R; i++) {
            p[i] = Q->row[i] + off;
            decode_scales_avx2(t, p[i], &B[i]);
        }
        qrows_prefetch(Q, R, off, NB * qi->bytes);
        rows_dot4_q4k_512(p, B, x + c, acc);

    } else if (R == 4) {
        for (int i = 0; i < R; i++) {
            q[i] = step_decode(t, NB, Q->row[i] + off, &B[i]);
        }
        qrows_prefetch(Q, R, off, NB * qi->bytes);
        rows_dot4_512(SUB, NB * NSUB, QSTEP(t, SUB), q, B, x + c, acc);

    } else
#endif
    {
        for (int i = 0; i < R; i++) {
            q[i] = step_decode(t, NB, Q->row[i] + off, &B[i]);
        }
        qrows_prefetch(Q, R, off, NB * qi->bytes);
        rows_dot1(R, SUB, NB * NSUB, QSTEP(t, SUB), q, B, x + c, acc);
    }
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
            const uint8_t *w, int64_t wstride, int il, int64_t nblk,
            const float *x, const float *xs, float *y, int64_t r,
            int64_t r_end, int accumulate)
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
        decode_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, il, &Q, bi, x, xs, acc,
                    m);
    }
    for (; bi < nblk; bi++) {
        decode_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, il, &Q, bi, x, xs, acc,
                    m);
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


#if defined(__AVX512F__) && defined(__AVX512DQ__)

/*
 * tile_dot for T = 2 or 4 tokens with AVX-512: tokens 2h and 2h + 1
 * share a vector, 2h's 8 lanes in the low half and 2h + 1's in the
 * high, against the row's 8 codes in both halves: each (row, token)
 * chain is tile_dot's, so are the bits.
 */
static ALWAYS_INLINE_Q void
tile_dot_pairs(const int R, const int T, const int SUB, const int NSUB,
               const float *qf, const qblock *B, const float *x, int ldx,
               __m256 *acc)
{
    __m512 a[PR][2];

    for (int i = 0; i < R; i++) {
        for (int h = 0; h < T / 2; h++) {
            a[i][h] = pair_ps(acc[i * TOK_BLOCK + 2 * h],
                              acc[i * TOK_BLOCK + 2 * h + 1]);
        }
    }
    for (int j = 0; j < NSUB; j++) {
        __m512 v[PR][2];

        for (int k = 0; k < SUB; k += 8) {
            __m512 xv[2];

            for (int h = 0; h < T / 2; h++) {
                const float *xh = x + (int64_t) (2 * h) * ldx + j * SUB + k;

                xv[h] = pair_ps(_mm256_loadu_ps(xh),
                                _mm256_loadu_ps(xh + ldx));
            }
            for (int i = 0; i < R; i++) {
                __m512 qv = _mm512_broadcast_f32x8(
                                _mm256_load_ps(qf + i * QK_K + j * SUB + k));

                for (int h = 0; h < T / 2; h++) {
                    v[i][h] = k == 0 ? _mm512_mul_ps(qv, xv[h])
                                     : _mm512_fmadd_ps(qv, xv[h], v[i][h]);
                }
            }
        }
        for (int i = 0; i < R; i++) {
            __m512 s = _mm512_set1_ps(B[i].a[j]);

            for (int h = 0; h < T / 2; h++) {
                a[i][h] = _mm512_fmadd_ps(s, v[i][h], a[i][h]);
            }
        }
    }
    for (int i = 0; i < R; i++) {
        for (int h = 0; h < T / 2; h++) {
            unpair_ps(a[i][h], &acc[i * TOK_BLOCK + 2 * h],
                      &acc[i * TOK_BLOCK + 2 * h + 1]);
        }
    }
}

#endif


/* one step (NB blocks at column c) of rows r .. r + R - 1, tn tokens:
 * the rows' codes decoded and widened to floats once */
static ALWAYS_INLINE_Q void
prefill_step(ggml_type t, const qinfo *qi, const int R, const int NB,
             const int SUB, const int NSUB, const int HAS_MIN,
             const uint8_t *w, int64_t wstride, int il, int64_t bi,
             const float *x, int ldx, int tn, const float *xs, int64_t n_xs,
             int64_t r, __m256 *acc, __m256 (*m)[TOK_BLOCK])
{
    qblock  B[PR];
    float   qf[PR * QK_K] __attribute__((aligned(32)));
    int64_t c = bi * qi->qk;
    int     ns = NB * NSUB;

    for (int i = 0; i < R; i++) {
        const int8_t *q = step_decode(t, NB, qblock_at(w, wstride, il,
                                                       qi->qk, qi->bytes,
                                                       r + i, bi), &B[i]);

        for (int j = 0; j < ns; j++) {
            for (int k = 0; k < SUB; k += 8) {
                _mm256_store_ps(qf + i * QK_K + j * SUB + k,
                                q8_to_ps(q + j * QSTEP(t, SUB) + k));
            }
        }
    }
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    for (int tk = 0; tk < tn; ) {
        const float *xt = x + (int64_t) tk * ldx + c;

        if (tn - tk >= 4) {
            tile_dot_pairs(R, 4, SUB, ns, qf, B, xt, ldx, acc + tk);
            tk += 4;
        } else if (tn - tk >= 2) {
            tile_dot_pairs(R, 2, SUB, ns, qf, B, xt, ldx, acc + tk);
            tk += 2;
        } else {
            tile_dot(R, 1, SUB, ns, qf, B, xt, ldx, acc + tk);
            tk += 1;
        }
    }
#else
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
#endif
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
             const uint8_t *w, int64_t wstride, int il, int64_t nblk,
             const float *x, int ldx, int tn, const float *xs, int64_t n_xs,
             float *y, int ldy, int64_t r, int accumulate)
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
        prefill_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, w, wstride, il, bi, x,
                     ldx, tn, xs, n_xs, r, acc, m);
    }
    for (; bi < nblk; bi++) {
        prefill_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, w, wstride, il, bi, x,
                     ldx, tn, xs, n_xs, r, acc, m);
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
             const int HAS_MIN, const uint8_t *w, int64_t wstride, int il,
             int64_t cols, const float *x, int n_tok, int ldx, float *y,
             int ldy, int64_t r0, int64_t r1, int accumulate)
{
    int64_t   nblk = cols / qi->qk;
    int64_t   n_xs = cols / 32;
    const int NB = qi->qk == 32 ? 8 : 1;    /* the 32-weight types */
    const int NBD = NB == 8 ? 2 : 1;    /* one token's step */

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int          tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;
        const float *xb = x + (int64_t) t0 * ldx;
        float       *yb = y + (int64_t) t0 * ldy;
        float       *xs = NULL;
        int64_t      r = r0;

        if (HAS_MIN) {
            xs = nalar_quant_scratch((int64_t) tn * n_xs);
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
                decode_rows(t, qi, 4, NBD, SUB, NSUB, HAS_MIN, w, wstride, il,
                            nblk, xb, xs, yb, r, r1, accumulate);
            }
            for (; r < r1; r++) {
                decode_rows(t, qi, 1, NBD, SUB, NSUB, HAS_MIN, w, wstride, il,
                            nblk, xb, xs, yb, r, r1, accumulate);
            }
            continue;
        }
        for (; r + PR <= r1; r += PR) {
            prefill_rows(t, qi, PR, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
                         nblk, xb, ldx, tn, xs, n_xs, yb, ldy, r, accumulate);
        }
        for (; r < r1; r++) {
            prefill_rows(t, qi, 1, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
                         nblk, xb, ldx, tn, xs, n_xs, yb, ldy, r, accumulate);
        }
    }
}


#define F32_KERNEL(N, QK, BYTES, SUB, MIN)                                  \
static void                                                                 \
f32_##N(const uint8_t *w, int64_t wstride, int il, int64_t cols,          \
        const float *x, int ldx, const nalar_xq *xq, int n_tok, float *y,   \
        int ldy, int64_t r0, int64_t r1, int accumulate)                    \
{                                                                           \
    static const qinfo qi = { QK, BYTES, SUB, MIN };                        \
                                                                            \
    (void) xq;                                                              \
    quant_kernel(GGML_##N, &qi, SUB, (QK) / (SUB), MIN, w, wstride, il,     \
                 cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);          \
}

#else  /* no AVX2: the portable kernel */

#define F32_KERNEL(N, QK, BYTES, SUB, MIN)                                  \
static void                                                                 \
f32_##N(const uint8_t *w, int64_t wstride, int il, int64_t cols,          \
        const float *x, int ldx, const nalar_xq *xq, int n_tok, float *y,   \
        int ldy, int64_t r0, int64_t r1, int accumulate)                    \
{                                                                           \
    (void) xq;                                                              \
    nalar_quant_matmul_portable(GGML_##N, w, wstride, il, cols, x, n_tok,   \
                                ldx, y, ldy, r0, r1, accumulate);           \
}

#endif

QUANT_TYPES(F32_KERNEL)


/* ------------------------------------------------------------------ */
/* dispatch: each type's kernel for either activations' mode            */


typedef struct {
    ggml_type        type;
    quant_kernel_fn *f32;      /* F32 activations (this file) */
    quant_kernel_fn *i16;      /* 16-bit (cpu_quant_i16.c) */
} quant_kernels;

#define KERNELS(N, QK, BYTES, SUB, MIN)                                     \
    { GGML_##N, f32_##N, nalar_quant_i16_##N },

static const quant_kernels kernels[] = { QUANT_TYPES(KERNELS) };


static const quant_kernels *
kernels_of(ggml_type t)
{
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
        if (kernels[i].type == t) {
            return &kernels[i];
        }
    }
    return NULL;
}


void
nalar_quant_matmul(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                   int64_t cols, const float *x, int n_tok, int ldx,
                   float *y, int ldy, int64_t r0, int64_t r1, int accumulate)
{
    const quant_kernels *k = kernels_of(t);

    if (k != NULL) {
        k->f32(w, wstride, il, cols, x, ldx, NULL, n_tok, y, ldy, r0, r1,
               accumulate);
    }
}


void
nalar_quant_matmul_i16(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                       int64_t cols, const float *x, int n_tok, int ldx,
                       float *y, int ldy, int64_t r0, int64_t r1,
                       int accumulate)
{
    const quant_kernels *k = kernels_of(t);

    if (k != NULL) {
        k->i16(w, wstride, il, cols, x, ldx, NULL, n_tok, y, ldy, r0, r1,
               accumulate);
    }
}


void
nalar_quant_matmul_xq(ggml_type t, const uint8_t *w, int64_t wstride, int il,
                      int64_t cols, const nalar_xq *xq, int n_tok, float *y,
                      int ldy, int64_t r0, int64_t r1, int accumulate)
{
    const quant_kernels *k = kernels_of(t);

    if (k != NULL) {
        k->i16(w, wstride, il, cols, NULL, 0, xq, n_tok, y, ldy, r0, r1,
               accumulate);
    }
}
