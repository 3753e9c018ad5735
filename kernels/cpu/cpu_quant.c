/*
 * CPU kernels over block-quantized weights with F32 activations (see
 * cpu_quant.h), their dispatch by type, and the reference
 * dequantization.
 *
 * A step of a row (one K-quant block of 256 weights, or eight Q8_0/Q4_0
 * blocks of 32) is decoded into int8 q[]
 * plus per sub-block float scales a[] and mins b[] (a few byte
 * operations per 32 weights, cpu_quant_blocks.h), then dotted with each
 * token's x.  One token: four rows at a time, each code vector widened to
 * float as it is used, each vector of x loaded once for the four rows,
 * whose chains overlap, and the rows PF_GROUPS fours further on
 * prefetched.  A batch: a tile of PR rows by PT tokens, the rows' codes
 * widened to floats once per step and reused from registers for the
 * tile's tokens.  With AVX-512 the weights themselves are made: one
 * token's in registers as they are used (Q4_K's looked up from its
 * nibbles, q4k_pair), a batch's once per step into memory (step_dequant),
 * and a tile of PR rows by up to 8 tokens is then plain F32 FMAs.  The
 * values, and so the operations per (row, token), are the same in both,
 * and in either layout of the rows (qblock_at: the file's order, or
 * interleaved by 4, nalar_quant_interleave).
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



/* Per-thread scratch, in NALAR_SCRATCH_SLOTS independent buffers (slot 0:
 * x's sub-block sums (F32), 16-bit or 8-bit codes for a token block; slot
 * 1: the tiles' packed scalars, and the 16-bit tiles' int16 codes, used
 * while slot 0 holds the codes), each 64-byte aligned, grown as asked and
 * kept for the thread's life */
typedef struct {
    void   *buf[NALAR_SCRATCH_SLOTS];
    int64_t cap[NALAR_SCRATCH_SLOTS];
} q_scratch;

static pthread_key_t  scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int            scratch_key_ok;


static void
scratch_free(void *p)
{
    q_scratch *s = p;

    for (int i = 0; i < NALAR_SCRATCH_SLOTS; i++) {
        free(s->buf[i]);
    }
    free(s);
}


static void
scratch_key_init(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}


void *
nalar_quant_scratch_slot(int slot, int64_t bytes)
{
    q_scratch *s;
    void      *nb;

    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok || slot < 0 || slot >= NALAR_SCRATCH_SLOTS) {
        return NULL;
    }
    s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (bytes > s->cap[slot]) {
        if (posix_memalign(&nb, 64, (size_t) bytes) != 0) {
            return NULL;
        }
        free(s->buf[slot]);
        s->buf[slot] = nb;
        s->cap[slot] = bytes;
    }
    return s->buf[slot];
}


float *
nalar_quant_scratch(int64_t n)
{
    return nalar_quant_scratch_slot(0, n * (int64_t) sizeof(float));
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



/* v, held in a register (see in_reg) */
static ALWAYS_INLINE_Q __m256
in_reg8(__m256 v)
{
    __asm__("" : "+x"(v));
    return v;
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
            __m256 xv = in_reg8(_mm256_loadu_ps(x + j * SUB + k));

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


#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__)

/*
 * With AVX-512 each (row, token) has one 16-lane chain (the header's
 * order): an accumulator is one __m512, summed as hsum8 of its halves'
 * sum.
 */
#define QUANT_512 1

/* the weights are dequantized before the products: no sums of mins */
#define MIN_SUMS(HAS_MIN)  0

typedef __m512 qacc;

static ALWAYS_INLINE_Q qacc
qacc_zero(void)
{
    return _mm512_setzero_ps();
}


static ALWAYS_INLINE_Q float
qacc_sum(qacc v)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v),
                               _mm512_extractf32x8_ps(v, 1)));
}


/* 16 int8 codes at q as floats */
static ALWAYS_INLINE_Q __m512
q8x16_ps(const int8_t *q)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
               _mm_loadu_si128((const __m128i *) q)));
}


/* ggml's values of 16 weights of a sub-block of scale a and min b from
 * their codes: a * q - b rounded once (a * q is exact) */
static ALWAYS_INLINE_Q __m512
dq16(const int HAS_MIN, __m512 q, __m512 a, __m512 b)
{
    return HAS_MIN ? _mm512_fmsub_ps(a, q, b) : _mm512_mul_ps(a, q);
}


/*
 * v, held in a register.  Left alone, the compiler folds a vector of x
 * that several rows use into each row's FMA as a memory operand, so it
 * is loaded once per row, and the loads rather than the FMAs bound the
 * loop: held once, the 3 x 8 tile ran 9-12% faster, one token 3-13%.
 */
static ALWAYS_INLINE_Q __m512
in_reg(__m512 v)
{
    __asm__("" : "+v"(v));
    return v;
}


/* weights j * SUB + k .. + 15 of a step decoded into q and B (sub-block
 * j): ggml's values */
static ALWAYS_INLINE_Q __m512
step_w16(ggml_type t, const int SUB, const int HAS_MIN, const int8_t *q,
         const qblock *B, int j, int k)
{
    __m512 a = _mm512_set1_ps(B->a[j]);

    return dq16(HAS_MIN, q8x16_ps(q + j * QSTEP(t, SUB) + k), a,
                HAS_MIN ? _mm512_set1_ps(B->b[j]) : a);
}


/*
 * The scales and mins of the Q4_K blocks at p[0 .. 3] (p[i] for i >= R
 * repeats p[0]): ab[i][j] = d * sc_j and ab[i][8 + j] = dmin * m_j, the
 * products decode_scales forms.  The four blocks' first 16 bytes (d,
 * dmin and the 12 bytes of 6-bit codes) are one vector, a block to each
 * 128-bit lane, so vpshufb unpacks the four blocks' codes at once:
 *   sc_j = s_j & 63, m_j = s_(j+4) & 63                      (j < 4)
 *   sc_j = (s_(j+4) & 15) | (s_(j-4) >> 6) << 4,
 *   m_j = (s_(j+4) >> 4) | (s_j >> 6) << 4                   (j >= 4)
 * (s_k the block's byte 4 + k; k4_scale_min).
 */
static ALWAYS_INLINE_Q void
q4k_scales4(const int R, const uint8_t **p, float (*ab)[16])
{
#define Z -128
    const __m512i lo = _mm512_broadcast_i32x4(_mm_setr_epi8(
                           4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11,
                           Z, Z, Z, Z));
    const __m512i lo_mask = _mm512_broadcast_i32x4(_mm_setr_epi8(
                                63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63,
                                63, 0, 0, 0, 0));
    const __m512i nib = _mm512_broadcast_i32x4(_mm_setr_epi8(
                            Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z,
                            12, 13, 14, 15));
    const __m512i top = _mm512_broadcast_i32x4(_mm_setr_epi8(
                            Z, Z, Z, Z, 4, 5, 6, 7, Z, Z, Z, Z,
                            8, 9, 10, 11));
#undef Z
    __m512i v, h4, h6, c;
    uint8_t codes[64] __attribute__((aligned(64)));

    v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *) p[0]));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)
                                              p[R > 1 ? 1 : 0]), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)
                                              p[R > 2 ? 2 : 0]), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)
                                              p[R > 3 ? 3 : 0]), 3);
    h4 = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
    h6 = _mm512_and_si512(_mm512_srli_epi16(v, 6), _mm512_set1_epi8(3));
    c = _mm512_or_si512(
            _mm512_or_si512(_mm512_and_si512(_mm512_shuffle_epi8(v, lo),
                                             lo_mask),
                            _mm512_shuffle_epi8(h4, nib)),
            _mm512_slli_epi16(_mm512_shuffle_epi8(h6, top), 4));
    _mm512_store_si512(codes, c);
    for (int i = 0; i < R; i++) {
        /* d 8 times, then dmin 8 times: words 8i and 8i + 1 of v */
        const __m256i dd = _mm256_set_epi16(
                               8 * i + 1, 8 * i + 1, 8 * i + 1, 8 * i + 1,
                               8 * i + 1, 8 * i + 1, 8 * i + 1, 8 * i + 1,
                               8 * i, 8 * i, 8 * i, 8 * i, 8 * i, 8 * i,
                               8 * i, 8 * i);
        __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(
                       _mm512_permutexvar_epi16(
                           _mm512_castsi256_si512(dd), v)));
        __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                       _mm_load_si128((const __m128i *) codes + i)));

        _mm512_storeu_ps(ab[i], _mm512_mul_ps(d, q));
    }
}


/*
 * Q4_K's sub-blocks 2k and 2k + 1 of the block at p (ab: its scales, then
 * its mins) as ggml's values: w[0], w[1] sub-block 2k's 32, w[2], w[3]
 * 2k + 1's.  Each sub-block has 16 possible values, a * q - b for
 * q = 0 .. 15: a vector of them is the sub-block's table, and vpermps,
 * which reads an index's low 4 bits, looks a nibble up in it.  So 16
 * bytes, widened once, give 32 weights in two lookups, with nothing
 * decoded into memory.
 */
static ALWAYS_INLINE_Q void
q4k_pair(const uint8_t *p, const float *ab, int k, __m512 *w)
{
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                       11, 12, 13, 14, 15);
    __m512       t0, t1;

    t0 = dq16(1, iota, _mm512_set1_ps(ab[2 * k]),
              _mm512_set1_ps(ab[8 + 2 * k]));
    t1 = dq16(1, iota, _mm512_set1_ps(ab[2 * k + 1]),
              _mm512_set1_ps(ab[8 + 2 * k + 1]));
    for (int l = 0; l < 2; l++) {
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        (const __m128i *) (p + 16 + 32 * k + 16 * l)));

        w[l] = _mm512_permutexvar_ps(c, t0);
        w[2 + l] = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), t1);
    }
}


/* a step of NB blocks of rows p[0 .. R - 1] (R <= 4), as ggml's values,
 * into wf (QK_K floats apart per row) */
static ALWAYS_INLINE_Q void
step_dequant(ggml_type t, const int R, const int NB, const int SUB,
             const int NSUB, const int HAS_MIN, const uint8_t **p, float *wf)
{
    if (t == GGML_Q4_K) {
        float ab[4][16];

        q4k_scales4(R, p, ab);
        for (int i = 0; i < R; i++) {
            for (int k = 0; k < 4; k++) {
                __m512 w[4];

                q4k_pair(p[i], ab[i], k, w);
                for (int l = 0; l < 4; l++) {
                    _mm512_store_ps(wf + i * QK_K + 64 * k + 16 * l, w[l]);
                }
            }
        }
        return;
    }
    for (int i = 0; i < R; i++) {
        qblock        B;
        const int8_t *q = step_decode(t, NB, p[i], &B);

        for (int j = 0; j < NB * NSUB; j++) {
            for (int k = 0; k < SUB; k += 16) {
                _mm512_store_ps(wf + i * QK_K + j * SUB + k,
                                step_w16(t, SUB, HAS_MIN, q, &B, j, k));
            }
        }
    }
}


/*
 * One token, R rows (R <= 4), one step each: each row's chain
 * acc = fma(w[c:c+16], x[c:c+16], acc) over the step's columns in order
 * (the header's), the rows' chains side by side, each vector of x loaded
 * once for the R rows, each weight made in a register from the int8
 * codes of the step (Q8_0's read in place).  Q4_K's: q4k_rows_dot16.
 */
static ALWAYS_INLINE_Q void
rows_dot16(ggml_type t, const int R, const int NB, const int SUB,
           const int NSUB, const int HAS_MIN, const uint8_t **p,
           const float *x, qacc *acc)
{
    qblock        B[4];
    const int8_t *q[4];

    /* Q8_0's scales straight from the blocks, with no stop in memory
     * (B->a) to be waited for: 2-8% faster */
    if (t == GGML_Q8_0) {
        for (int j = 0; j < NB; j++) {
            __m512 a[4];

            for (int i = 0; i < R; i++) {
                a[i] = _mm512_set1_ps(f16_at(p[i] + j * (2 + QK8_0)));
            }
            for (int k = 0; k < QK8_0; k += 16) {
                __m512 xv = in_reg(_mm512_loadu_ps(x + j * QK8_0 + k));

                for (int i = 0; i < R; i++) {
                    acc[i] = _mm512_fmadd_ps(
                                 dq16(0, q8x16_ps((const int8_t *) p[i]
                                                  + j * (2 + QK8_0) + 2 + k),
                                      a[i], a[i]),
                                 xv, acc[i]);
                }
            }
        }
        return;
    }
    for (int i = 0; i < R; i++) {
        q[i] = step_decode(t, NB, p[i], &B[i]);
    }
    for (int j = 0; j < NB * NSUB; j++) {
        for (int k = 0; k < SUB; k += 16) {
            __m512 xv = in_reg(_mm512_loadu_ps(x + j * SUB + k));

            for (int i = 0; i < R; i++) {
                acc[i] = _mm512_fmadd_ps(step_w16(t, SUB, HAS_MIN, q[i],
                                                  &B[i], j, k),
                                         xv, acc[i]);
            }
        }
    }
}


/* rows_dot16 for one Q4_K block of each row, its weights looked up from
 * the nibbles (q4k_pair); ab: the rows' scales and mins (q4k_scales4) */
static ALWAYS_INLINE_Q void
q4k_rows_dot16(const int R, const uint8_t **p, const float (*ab)[16],
               const float *x, qacc *acc)
{
#pragma GCC unroll 1
    for (int k = 0; k < 4; k++) {
        __m512 xv[4];

        for (int l = 0; l < 4; l++) {
            xv[l] = in_reg(_mm512_loadu_ps(x + 64 * k + 16 * l));
        }
        for (int i = 0; i < R; i++) {
            __m512 w[4];

            q4k_pair(p[i], ab[i], k, w);
            for (int l = 0; l < 4; l++) {
                acc[i] = _mm512_fmadd_ps(w[l], xv[l], acc[i]);
            }
        }
    }
}


/*
 * One token's Q4_K chains of rows Q->row[0 .. R - 1] over their nblk
 * blocks.  Each block's scales and mins are unpacked (q4k_scales4) while
 * the block before runs, into the other half of sc: read back at once,
 * as q4k_pair broadcasts them from memory, they were waited for on every
 * block, and the product ran 20% slower.
 */
static ALWAYS_INLINE_Q void
q4k_decode_blocks(const qinfo *qi, const int R, int il, const qrows *Q,
                  int64_t nblk, const float *x, qacc *acc)
{
    float          sc[2][4][16] __attribute__((aligned(64)));
    const uint8_t *p[4], *pn[4];

    qrows_blocks(Q, R, 0, pn);
    q4k_scales4(R, pn, sc[0]);
    for (int64_t bi = 0; bi < nblk; bi++) {
        memcpy(p, pn, sizeof(p));
        qrows_prefetch(Q, R, qoff_at(il, qi->qk, qi->bytes, bi), qi->bytes);
        if (bi + 1 < nblk) {
            qrows_blocks(Q, R, qoff_at(il, qi->qk, qi->bytes, bi + 1), pn);
            q4k_scales4(R, pn, sc[(bi + 1) & 1]);
        }
        q4k_rows_dot16(R, p, (const float (*)[16]) sc[bi & 1],
                       x + bi * QK_K, acc);
    }
}

#else

#define MIN_SUMS(HAS_MIN)  (HAS_MIN)

typedef __m256 qacc;

static ALWAYS_INLINE_Q qacc
qacc_zero(void)
{
    return _mm256_setzero_ps();
}


static ALWAYS_INLINE_Q float
qacc_sum(qacc v)
{
    return hsum8(v);
}

#endif


/* one step (NB blocks at column c) of rows r .. r + R - 1, one token */
static ALWAYS_INLINE_Q void
decode_step(ggml_type t, const qinfo *qi, const int R, const int NB,
            const int SUB, const int NSUB, const int HAS_MIN, int il,
            const qrows *Q, int64_t bi, const float *x, const float *xs,
            qacc *acc, __m256 *m)
{
    qblock        B[4];
    int64_t       c = bi * qi->qk;
    int64_t       off = qoff_at(il, qi->qk, qi->bytes, bi);

#ifdef QUANT_512
    const uint8_t *p[4];

    qrows_blocks(Q, R, off, p);
    qrows_prefetch(Q, R, off, NB * qi->bytes);
    rows_dot16(t, R, NB, SUB, NSUB, HAS_MIN, p, x + c, acc);
#else
    const int8_t *q[4];

    for (int i = 0; i < R; i++) {
        q[i] = step_decode(t, NB, Q->row[i] + off, &B[i]);
    }
    qrows_prefetch(Q, R, off, NB * qi->bytes);
    rows_dot1(R, SUB, NB * NSUB, QSTEP(t, SUB), q, B, x + c, acc);
#endif
    if (MIN_SUMS(HAS_MIN)) {
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
    qacc    acc[4];
    __m256  m[4];
    int64_t bi = 0;
    qrows   Q;

    qrows_at(&Q, w, wstride, il, qi->qk, qi->bytes, R, PF_GROUPS, r, r_end);
    for (int i = 0; i < R; i++) {
        acc[i] = qacc_zero();
        m[i] = _mm256_setzero_ps();
    }
#ifdef QUANT_512
    if (t == GGML_Q4_K) {
        q4k_decode_blocks(qi, R, il, &Q, nblk, x, acc);
        bi = nblk;
    }
#endif
    for (; bi + NB <= nblk; bi += NB) {
        decode_step(t, qi, R, NB, SUB, NSUB, HAS_MIN, il, &Q, bi, x, xs, acc,
                    m);
    }
    for (; bi < nblk; bi++) {
        decode_step(t, qi, R, 1, SUB, NSUB, HAS_MIN, il, &Q, bi, x, xs, acc,
                    m);
    }
    for (int i = 0; i < R; i++) {
        float s = qacc_sum(acc[i]) - (MIN_SUMS(HAS_MIN) ? hsum8(m[i]) : 0);

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
                __m256 xv = in_reg8(_mm256_loadu_ps(x + (int64_t) u * ldx
                                                    + j * SUB + k));

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


#ifdef QUANT_512

/*
 * R rows by T tokens (T <= 8) of one step with AVX-512, from the rows'
 * weights dequantized (wf, QK_K apart, n of them): rows_dot16's chain
 * per (row, token), each vector of weights loaded once for the T tokens
 * and each vector of x once for the R rows.  acc holds the tile's
 * accumulators, TOK_BLOCK apart per row.
 */
static ALWAYS_INLINE_Q void
tile_dot16(const int R, const int T, int n, const float *wf, const float *x,
           int ldx, qacc *acc)
{
    __m512 a[PR][8];

    for (int i = 0; i < R; i++) {
        for (int u = 0; u < T; u++) {
            a[i][u] = acc[i * TOK_BLOCK + u];
        }
    }
#pragma GCC unroll 1
    for (int c = 0; c < n; c += 16) {
        __m512 wv[PR];

        for (int i = 0; i < R; i++) {
            wv[i] = _mm512_load_ps(wf + i * QK_K + c);
        }
        for (int u = 0; u < T; u++) {
            __m512 xv = in_reg(_mm512_loadu_ps(x + (int64_t) u * ldx + c));

            for (int i = 0; i < R; i++) {
                a[i][u] = _mm512_fmadd_ps(wv[i], xv, a[i][u]);
            }
        }
    }
    for (int i = 0; i < R; i++) {
        for (int u = 0; u < T; u++) {
            acc[i * TOK_BLOCK + u] = a[i][u];
        }
    }
}

/*
 * The tiles as functions of their own: inlined into a kernel, whose
 * other steps keep constants in vector registers, a tile of 3 x 8 was
 * left short of registers and spilled its accumulators.
 */
#define TILE16(R, T)                                                        \
static __attribute__((noinline)) void                                       \
tile16_##R##x##T(int n, const float *wf, const float *x, int ldx,           \
                 qacc *acc)                                                 \
{                                                                           \
    tile_dot16(R, T, n, wf, x, ldx, acc);                                   \
}

TILE16(3, 8) TILE16(3, 4) TILE16(3, 2) TILE16(3, 1)
TILE16(1, 8) TILE16(1, 4) TILE16(1, 2) TILE16(1, 1)
#undef TILE16


_Static_assert(PR == 3, "the AVX-512 tiles are of 3 rows or 1");

/* R (PR or 1) rows by T (8, 4, 2 or 1) tokens */
static ALWAYS_INLINE_Q void
tile16(const int R, const int T, int n, const float *wf, const float *x,
       int ldx, qacc *acc)
{
#define TILE16_CASE(T_)                                                     \
    case T_:                                                                \
        (R == 1 ? tile16_1x##T_ : tile16_3x##T_)(n, wf, x, ldx, acc);       \
        return;

    switch (T) {
    TILE16_CASE(8)
    TILE16_CASE(4)
    TILE16_CASE(2)
    default:
    TILE16_CASE(1)
    }
#undef TILE16_CASE
}


#endif


/* one step (NB blocks at column c) of rows r .. r + R - 1, tn tokens:
 * the rows' codes decoded and widened to floats once */
static ALWAYS_INLINE_Q void
prefill_step(ggml_type t, const qinfo *qi, const int R, const int NB,
             const int SUB, const int NSUB, const int HAS_MIN,
             const uint8_t *w, int64_t wstride, int il, int64_t bi,
             const float *x, int ldx, int tn, const float *xs, int64_t n_xs,
             int64_t r, qacc *acc, __m256 (*m)[TOK_BLOCK])
{
    qblock         B[PR];
    float          qf[PR * QK_K] __attribute__((aligned(64)));
    const uint8_t *p[PR];
    int64_t        c = bi * qi->qk;
    int64_t        pf = qoff_at(il, qi->qk, qi->bytes, bi + 2 * NB)
                        - qoff_at(il, qi->qk, qi->bytes, bi);
    int            ns = NB * NSUB;

    /* the rows' blocks, and the same two steps on (past a row's end, a
     * prefetch does not fault), which would otherwise be waited for */
    for (int i = 0; i < R; i++) {
        p[i] = qblock_at(w, wstride, il, qi->qk, qi->bytes, r + i, bi);
        for (int64_t k = 0; k < NB * qi->bytes; k += 64) {
            _mm_prefetch((const char *) p[i] + pf + k, _MM_HINT_T0);
        }
    }
#ifdef QUANT_512
    step_dequant(t, R, NB, SUB, NSUB, HAS_MIN, p, qf);
    for (int tk = 0; tk < tn; ) {
        const float *xt = x + (int64_t) tk * ldx + c;

        if (tn - tk >= 8) {
            tile16(R, 8, ns * SUB, qf, xt, ldx, acc + tk);
            tk += 8;
        } else if (tn - tk >= 4) {
            tile16(R, 4, ns * SUB, qf, xt, ldx, acc + tk);
            tk += 4;
        } else if (tn - tk >= 2) {
            tile16(R, 2, ns * SUB, qf, xt, ldx, acc + tk);
            tk += 2;
        } else {
            tile16(R, 1, ns * SUB, qf, xt, ldx, acc + tk);
            tk += 1;
        }
    }
#else
    for (int i = 0; i < R; i++) {
        const int8_t *q = step_decode(t, NB, p[i], &B[i]);

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
#endif
    for (int tk = 0; MIN_SUMS(HAS_MIN) && tk < tn; tk++) {
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
    qacc    acc[PR * TOK_BLOCK];
    __m256  m[PR][TOK_BLOCK];
    int64_t bi = 0;

    for (int i = 0; i < R; i++) {
        for (int tk = 0; tk < tn; tk++) {
            acc[i * TOK_BLOCK + tk] = qacc_zero();
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
            float  s = qacc_sum(acc[i * TOK_BLOCK + tk])
                       - (MIN_SUMS(HAS_MIN) ? hsum8(m[i][tk]) : 0);

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

    for (int t0 = 0; t0 < n_tok; t0 += TOK_BLOCK) {
        int          tn = n_tok - t0 < TOK_BLOCK ? n_tok - t0 : TOK_BLOCK;
        const float *xb = x + (int64_t) t0 * ldx;
        float       *yb = y + (int64_t) t0 * ldy;
        float       *xs = NULL;
        int64_t      r = r0;

        if (MIN_SUMS(HAS_MIN)) {
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
                decode_rows(t, qi, 4, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
                            nblk, xb, xs, yb, r, r1, accumulate);
            }
            for (; r < r1; r++) {
                decode_rows(t, qi, 1, NB, SUB, NSUB, HAS_MIN, w, wstride, il,
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
        const float *x, int ldx, int n_tok, float *y, int ldy, int64_t r0,  \
        int64_t r1, int accumulate)                                         \
{                                                                           \
    static const qinfo qi = { QK, BYTES, SUB, MIN };                        \
                                                                            \
    quant_kernel(GGML_##N, &qi, SUB, (QK) / (SUB), MIN, w, wstride, il,     \
                 cols, x, n_tok, ldx, y, ldy, r0, r1, accumulate);          \
}

#else  /* no AVX2: the portable kernel */

#define F32_KERNEL(N, QK, BYTES, SUB, MIN)                                  \
static void                                                                 \
f32_##N(const uint8_t *w, int64_t wstride, int il, int64_t cols,          \
        const float *x, int ldx, int n_tok, float *y, int ldy, int64_t r0,  \
        int64_t r1, int accumulate)                                         \
{                                                                           \
    nalar_quant_matmul_portable(GGML_##N, w, wstride, il, cols, x, n_tok,   \
                                ldx, y, ldy, r0, r1, accumulate);           \
}

#endif

QUANT_TYPES(F32_KERNEL)


/* ------------------------------------------------------------------ */
/* dispatch by type                                                     */


typedef struct {
    ggml_type        type;
    quant_kernel_fn *f32;
} quant_kernels;

#define KERNELS(N, QK, BYTES, SUB, MIN)                                     \
    { GGML_##N, f32_##N },

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
        k->f32(w, wstride, il, cols, x, ldx, n_tok, y, ldy, r0, r1,
               accumulate);
    }
}
