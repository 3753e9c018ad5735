/*
 * The tile kernels of one instruction set: included by
 * cpu_quant_q8_tiles.c once per set (AVX2, AVX-VNNI, AVX-512 VNNI), with
 *   QT(name)    this set's name for a function,
 *   QT_TGT      its target attribute,
 *   QT_NMAX     the most tokens of a tile,
 *   QT_DOT_S(u, s)       the 8 int32 lanes of 32 unsigned x signed bytes,
 *                        four products a lane,
 *   QT_DOT_U(L, u, s, c) L plus those of the unsigned codes u times x's
 *                        codes s, each pair's int16 sum times c's int16,
 *   QT_MADD(a, x, y)     a plus the int16 pairs' products x . y per lane,
 *   QT_XU       1: Q8_0's and Q4_0's kernels read x's codes + 128, as
 *               unsigned bytes (vpdpbusd with the signed weights),
 * so that the arithmetic is written once.  Every step is an exact integer
 * operation or one of the contract's float operations (cpu_quant_q8.c).
 * Not a header to include anywhere else.  It undefines those parameters
 * at its end, so the next set defines its own.
 */


/* two groups of 32 weights (codes w0, w1, scales c0, c1) into each of the
 * N tokens' L, x's codes of the two groups at X + k * cols (64 bytes) */
#define QT_GROUPS2(X, w0, c0, w1, c1)                                       \
    do {                                                                    \
        _Pragma("GCC unroll 8")                                             \
        for (int k = 0; k < N; k++) {                                       \
            const int8_t *xk_ = (X) + k * cols;                             \
                                                                            \
            L[k] = QT_DOT_U(L[k], w0, _mm256_loadu_si256(                   \
                                (const __m256i *) xk_), c0);                \
            L[k] = QT_DOT_U(L[k], w1, _mm256_loadu_si256(                   \
                                (const __m256i *) (xk_ + 32)), c1);         \
        }                                                                   \
    } while (0)


/*
 * Q4_K, Q5_K, Q6_K: one row against N tokens (a constant once inlined).
 * Per block: x's min sums of the tile (pk) against the block's mins (or
 * Q6_K scales) give the N integers I at once; each group of 32 weights is
 * decoded once and added into each token's lanes L with its scales; then
 * per token acc = fma(s, L, acc), and mn = fma(s', I, mn) for the tile in
 * one vector (lane k: token k).
 */
static INL QT_TGT void
QT(k256)(ggml_type T, const int N, const uint8_t *row, int il, int64_t nb,
         const int8_t *xq, int64_t cols, const uint8_t *pk, float *out,
         ptrdiff_t pf)
{
    const int64_t  bytes = T == GGML_Q4_K ? QK4_K_BYTES
                           : T == GGML_Q5_K ? QK5_K_BYTES : QK6_K_BYTES;
    const int64_t  bstride = qt_block_stride(T);
    const __m256i  f = _mm256_set1_epi8(0xF);
    __m256         acc[QT_NMAX], mn = _mm256_setzero_ps();
    float          mv[8] __attribute__((aligned(32)));
    const uint8_t *p = row;

#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        acc[k] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; p = q8_next_block(p, il, QK_K, bytes, b), b++) {
        const uint8_t *pb = pk + b * bstride;
        const int8_t  *xb = xq + b * QK_K;
        __m256         dx = _mm256_load_ps((const float *) pb), sv, s2;
        __m256i        L[QT_NMAX], I = _mm256_setzero_si256();
        float          sb[8] __attribute__((aligned(32)));

        q8_prefetch_block(p, pf, bytes);
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            L[k] = _mm256_setzero_si256();
        }
        if (T == GGML_Q6_K) {
            /* the 16 scales as int16 words; I = 32 sum_j sc_j xs_j, in
             * pairs j = 2i, 2i + 1 (dword i of s16) */
            __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                              (const __m128i *) (p + 192)));

#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                I = QT_MADD(I, _mm256_load_si256((const __m256i *)
                                                 (pb + 32 + 32 * i)),
                            _mm256_permutevar8x32_epi32(
                                s16, _mm256_set1_epi32(i)));
            }
            I = _mm256_slli_epi32(I, 5);
            for (int h = 0; h < 2; h++) {
                /* scales 8h .. 8h + 7 in both halves; group 4h + g takes
                 * scale 8h + 2g in its low half, 8h + 2g + 1 above */
                __m256i sh = h ? _mm256_permute2x128_si256(s16, s16, 0x11)
                             : _mm256_permute2x128_si256(s16, s16, 0x00);
                __m256i a0 = _mm256_loadu_si256((const __m256i *)
                                                (p + 64 * h));
                __m256i a1 = _mm256_loadu_si256((const __m256i *)
                                                (p + 64 * h + 32));
                __m256i e = _mm256_loadu_si256((const __m256i *)
                                               (p + 128 + 32 * h));

                for (int g = 0; g < 4; g += 2) {
                    __m256i w0 = q8_k6_w(a0, a1, e, g);
                    __m256i w1 = q8_k6_w(a0, a1, e, g + 1);
                    __m256i c0 = _mm256_shuffle_epi8(sh, _mm256_set_m128i(
                                     _mm_set1_epi16(q8_b2(4 * g + 2)),
                                     _mm_set1_epi16(q8_b2(4 * g))));
                    __m256i c1 = _mm256_shuffle_epi8(sh, _mm256_set_m128i(
                                     _mm_set1_epi16(q8_b2(4 * g + 6)),
                                     _mm_set1_epi16(q8_b2(4 * g + 4))));

                    QT_GROUPS2(xb + 128 * h + 32 * g, w0, c0, w1, c1);
                }
            }
            sv = _mm256_mul_ps(_mm256_set1_ps(f16_at(p + 208)), dx);
            s2 = sv;
        } else {
            /* the 6-bit scales as int16 words in both halves, the mins
             * in the low one; I = sum_j m_j xs_j in pairs j = 2i,
             * 2i + 1 (dword i of m16) */
            const uint8_t *qs = p + (T == GGML_Q4_K ? 16 : 48);
            uint8_t        scm[16];
            __m128i        s8;
            __m256i        sc, m16, hb = _mm256_setzero_si256();

            q8_k4_scales(p, scm);
            s8 = _mm_loadu_si128((const __m128i *) scm);
            sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s8));
            m16 = _mm256_castsi128_si256(
                      _mm_cvtepu8_epi16(_mm_srli_si128(s8, 8)));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                I = QT_MADD(I, _mm256_load_si256((const __m256i *)
                                                 (pb + 32 + 32 * i)),
                            _mm256_permutevar8x32_epi32(
                                m16, _mm256_set1_epi32(i)));
            }
            if (T == GGML_Q5_K) {
                hb = _mm256_loadu_si256((const __m256i *) (p + 16));
            }
            for (int g2 = 0; g2 < 4; g2++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)
                                               (qs + 32 * g2));
                __m256i w0 = _mm256_and_si256(v, f);
                __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), f);
                __m256i c0 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(
                                 q8_b2(4 * g2)));
                __m256i c1 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(
                                 q8_b2(4 * g2 + 2)));

                if (T == GGML_Q5_K) {
                    __m256i b0 = _mm256_set1_epi8((char) (1 << (2 * g2)));
                    __m256i b1 = _mm256_set1_epi8((char) (1 << (2 * g2
                                                                + 1)));
                    __m256i sx = _mm256_set1_epi8(16);

                    w0 = _mm256_or_si256(w0, _mm256_and_si256(
                             _mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0),
                             sx));
                    w1 = _mm256_or_si256(w1, _mm256_and_si256(
                             _mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1),
                             sx));
                }
                QT_GROUPS2(xb + 64 * g2, w0, c0, w1, c1);
            }
            sv = _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), dx);
            s2 = _mm256_mul_ps(_mm256_set1_ps(f16_at(p + 2)), dx);
        }
        mn = _mm256_fmadd_ps(s2, _mm256_cvtepi32_ps(I), mn);
        _mm256_store_ps(sb, sv);
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(sb[k]),
                                     _mm256_cvtepi32_ps(L[k]), acc[k]);
        }
    }
    _mm256_store_ps(mv, mn);
#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        out[k] = q8_hsum8(acc[k]) - mv[k];
    }
}


/* Q8_0, Q4_0: one row against N tokens; per block the signed codes once,
 * then per token L = the codes' dot products and acc = fma(s, L, acc) */
static INL QT_TGT void
QT(k32)(ggml_type T, const int N, const uint8_t *row, int il, int64_t nb,
        const int8_t *xq, int64_t cols, const uint8_t *pk, float *out,
        ptrdiff_t pf)
{
    const int64_t  bytes = T == GGML_Q8_0 ? 2 + QK8_0 : 2 + QK4_0 / 2;
    __m256         acc[QT_NMAX];
    const uint8_t *p = row;

#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        acc[k] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; p = q8_next_block(p, il, 32, bytes, b), b++) {
        __m256  dx = _mm256_load_ps((const float *) (pk + 32 * b));
        __m256i w = q8_w32_signed(T, p);
        float   sb[8] __attribute__((aligned(32)));
#if QT_XU
        /* xq holds x's codes + 128 (unsigned): L = those codes' lanes
         * with w, less 128 times w's sums of four, an exact integer */
        __m256i nc = _mm256_sub_epi32(_mm256_setzero_si256(),
                                      QT_DOT_S(_mm256_set1_epi8(
                                                   (char) 0x80), w));
#else
        __m256i u = _mm256_abs_epi8(w);
#endif

        q8_prefetch_block(p, pf, bytes);
        _mm256_store_ps(sb, _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), dx));
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)
                                            (xq + k * cols + 32 * b));
#if QT_XU
            __m256i L = _mm256_dpbusd_epi32(nc, xv, w);
#else
            __m256i L = QT_DOT_S(u, _mm256_sign_epi8(xv, w));
#endif

            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(sb[k]),
                                     _mm256_cvtepi32_ps(L), acc[k]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        out[k] = q8_hsum8(acc[k]);
    }
}


/* one type's tile: n tokens (1 .. QT_NMAX), each count its own code */
#define QT_CASE(NAME, QK, K)                                                \
    case K:                                                                 \
        if ((K) <= QT_NMAX) {                                               \
            if ((QK) == QK_K) {                                             \
                QT(k256)(GGML_##NAME, K, row, il, nb, xq, cols, pk, out,    \
                         pf);                                               \
            } else {                                                        \
                QT(k32)(GGML_##NAME, K, row, il, nb, xq, cols, pk, out,     \
                        pf);                                                \
            }                                                               \
        }                                                                   \
        break;

#define QT_TYPE(NAME, QK, BYTES, SUB, MIN)                                  \
static QT_TGT void                                                          \
QT(tile_##NAME)(const uint8_t *row, int il, int64_t nb, const int8_t *xq,   \
                int64_t cols, const uint8_t *pk, int n, float *out,         \
                ptrdiff_t pf)                                               \
{                                                                           \
    switch (n) {                                                            \
    QT_CASE(NAME, QK, 1) QT_CASE(NAME, QK, 2) QT_CASE(NAME, QK, 3)          \
    QT_CASE(NAME, QK, 4) QT_CASE(NAME, QK, 5) QT_CASE(NAME, QK, 6)          \
    QT_CASE(NAME, QK, 7) QT_CASE(NAME, QK, 8)                               \
    default:                                                                \
        break;                                                              \
    }                                                                       \
}

QUANT_TYPES(QT_TYPE)


static qt_tile_fn *
QT(fn)(ggml_type t)
{
#define QT_FN_CASE(NAME, QK, BYTES, SUB, MIN)                               \
    case GGML_##NAME:                                                       \
        return QT(tile_##NAME);

    switch (t) {
    QUANT_TYPES(QT_FN_CASE)
    default:
        return NULL;
    }
#undef QT_FN_CASE
}

#undef QT_TYPE
#undef QT_CASE
#undef QT_GROUPS2
#undef QT
#undef QT_TGT
#undef QT_NMAX
#undef QT_DOT_S
#undef QT_DOT_U
#undef QT_MADD
#undef QT_XU
