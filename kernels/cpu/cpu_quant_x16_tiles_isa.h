/*
 * The 16-bit mode's tile kernels of one instruction set, for Q4_K, Q5_K
 * and Q6_K and the pairs' Q6_K: included twice by cpu_quant_x16_tiles.c,
 * once per set, with
 *   XT(name)    this set's name for a function,
 *   XT_TGT      its target attribute,
 *   XT_NMAX     the most tokens of a tile it compiles,
 *   XT_R4       the rows of a step (1 or 2) of Q4_K/Q5_K: each group's
 *               codes of x, loaded once, go into that many rows' lanes
 *               (Q6_K: one),
 *   XT_WIDE     1: Q4_K/Q5_K's groups in 512-bit steps (XT_GROUP),
 *   XT_MADD(a, x, y)     a plus the int16 pairs' products x . y per lane,
 *   XT_DOT_U(L, u, s, c) L plus the lanes of the unsigned codes u times
 *                        x's signed bytes s, each pair's int16 sum times
 *                        c's int16,
 * so that the arithmetic is written once.  Every step is an exact integer
 * operation (int32 sums wrap, and the contract bounds the final ones) or
 * one of the contract's float operations, each (row, token) chain on its
 * own in the contract's order.  Not a header to include anywhere else.
 */


/*
 * A block's lanes L of one row and token, and one group of 32 weights
 * (each row r's words wa[r] of the even weights, wb[r] of the odd ones)
 * into each of the R rows' and N tokens' L, the tile codes at X + 64 k
 * (xt_codes), each loaded once for the R rows:
 *   XT_WIDE 1 (VNNI): L is 16 int32 lanes, one 512-bit vpdpwssd a group
 *     (the group's 64 bytes of codes against wa | wb): lanes 0-7 the even
 *     weights' pairs, 8-15 the odd ones', added into 8 at the block's end
 *     (XT_LFOLD; exact).  Half the instructions of two 256-bit steps,
 *     measured faster on AMD Zen 4.
 *   XT_WIDE 0: two vpmaddwd and one add into L.
 */
#if XT_WIDE
#define XT_LT    __m512i
#define XT_LZERO _mm512_setzero_si512()
#define XT_LFOLD(L)                                                         \
    _mm256_add_epi32(_mm512_castsi512_si256(L),                             \
                     _mm512_extracti64x4_epi64(L, 1))
#define XT_GROUP(X, wa, wb)                                                 \
    do {                                                                    \
        __m512i w_[2];                                                   \
                                                                            \
        for (int r = 0; r < R; r++) {                                    \
            w_[r] = _mm512_inserti64x4(_mm512_castsi256_si512(wa[r]),       \
                                       wb[r], 1);                           \
        }                                                                   \
        _Pragma("GCC unroll 8")                                             \
        for (int k = 0; k < N; k++) {                                       \
            __m512i x_ = _mm512_load_si512((const void *) ((X) + 64 * k));  \
                                                                            \
            for (int r = 0; r < R; r++) {                                \
                L[r][k] = _mm512_dpwssd_epi32(L[r][k], x_, w_[r]);          \
            }                                                               \
        }                                                                   \
    } while (0)
#else
#define XT_LT    __m256i
#define XT_LZERO _mm256_setzero_si256()
#define XT_LFOLD(L) (L)
#define XT_GROUP(X, wa, wb)                                                 \
    do {                                                                    \
        _Pragma("GCC unroll 8")                                             \
        for (int k = 0; k < N; k++) {                                       \
            const uint8_t *xk_ = (X) + 64 * k;                              \
            __m256i        x0_ = _mm256_load_si256((const __m256i *) xk_);  \
            __m256i        x1_ = _mm256_load_si256((const __m256i *)        \
                                                   (xk_ + 32));             \
                                                                            \
            for (int r = 0; r < R; r++) {                                \
                L[r][k] = _mm256_add_epi32(L[r][k], _mm256_add_epi32(       \
                              _mm256_madd_epi16(x0_, wa[r]),                \
                              _mm256_madd_epi16(x1_, wb[r])));              \
            }                                                               \
        }                                                                   \
    } while (0)
#endif


/* the chains of a call's first block: from 0 at the row's first block,
 * else as the call before left them (row r's at sp->st + r XT_ST: token
 * k's acc at 8k, mn at 8 XT_NMAX) */
static INL XT_TGT void
XT(begin)(const int R, const int N, const xt_span *sp, __m256 (*acc)[XT_NMAX],
          __m256 *mn)
{
    for (int r = 0; r < R; r++) {
        const float *st = sp->st + r * XT_ST;

#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            acc[r][k] = sp->b0 == 0 ? _mm256_setzero_ps()
                        : _mm256_load_ps(st + 8 * k);
        }
        mn[r] = sp->b0 == 0 ? _mm256_setzero_ps()
                : _mm256_load_ps(st + 8 * XT_NMAX);
    }
}


/* after a call's last block: y = hsum8(acc) - mn at the row's last block
 * (row r's token k at out[8 r + k]), else the chains kept for the next
 * call */
static INL XT_TGT void
XT(end)(const int R, const int N, const xt_span *sp, __m256 (*acc)[XT_NMAX],
        const __m256 *mn, float *out)
{
    float mv[8] __attribute__((aligned(32)));

    for (int r = 0; r < R; r++) {
        float *st = sp->st + r * XT_ST;

        if (sp->b1 < sp->nb) {
#pragma GCC unroll 8
            for (int k = 0; k < N; k++) {
                _mm256_store_ps(st + 8 * k, acc[r][k]);
            }
            _mm256_store_ps(st + 8 * XT_NMAX, mn[r]);
            continue;
        }
        _mm256_store_ps(mv, mn[r]);
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            out[8 * r + k] = q8_hsum8(acc[r][k]) - mv[k];
        }
    }
}


/* per (row, token): acc = fma(s_k, L, acc), s_k lane k of sv */
static INL XT_TGT void
XT(fma)(const int N, __m256 sv, const XT_LT *L, __m256 *acc)
{
    float sb[8] __attribute__((aligned(32)));

    _mm256_store_ps(sb, sv);
#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(sb[k]),
                                 _mm256_cvtepi32_ps(XT_LFOLD(L[k])), acc[k]);
    }
}


/*
 * A Q4_K/Q5_K block's 6-bit scales as bytes in both halves (sc), and its
 * integers I for the tile from the packed sums pb (lane k: token k): the
 * mins as int16 words times 256 (at most 63 * 256) against plane hi's
 * sums, the mins against plane lo's, in pairs of sub-blocks 2i, 2i + 1
 * (dword i of m16), in two chains (integers: the order is free)
 */
static INL XT_TGT __m256i
XT(k4_head)(const uint8_t *p, const uint8_t *pb, __m256i *sc)
{
    __m256i I = _mm256_setzero_si256(), I2 = I, m16, m16h;
    uint8_t scm[16];
    __m128i s8;

    q8_k4_scales(p, scm);
    s8 = _mm_loadu_si128((const __m128i *) scm);
    *sc = _mm256_broadcastsi128_si256(s8);
    m16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(s8, 8)));
    m16h = _mm256_slli_epi16(m16, 8);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m256i s = _mm256_set1_epi32(i);

        I = XT_MADD(I, _mm256_load_si256((const __m256i *)
                                         (pb + 32 + 32 * i)),
                    _mm256_permutevar8x32_epi32(m16h, s));
        I2 = XT_MADD(I2, _mm256_load_si256((const __m256i *)
                                           (pb + 160 + 32 * i)),
                     _mm256_permutevar8x32_epi32(m16, s));
    }
    return _mm256_add_epi32(I, I2);
}


/*
 * Q4_K, Q5_K: R rows (XT_R4) against N tokens (constants once inlined),
 * from the tile codes.  Per block and row: the N integers I at once
 * (XT(k4_head)); each group of 32 weights decoded once into the even and
 * odd weights' words times the group's scale (vpmaddubsw with (sc, 0) and
 * (0, sc)), and added into each token's L; then per token
 * acc = fma(s, L, acc), and mn = fma(s', I, mn) for the tile in one
 * vector (lane k: token k).
 */
static INL XT_TGT void
XT(k4)(ggml_type T, const int R, const int N, const uint8_t *const *row,
       int il, const xt_span *sp, const uint8_t *xa, const uint8_t *pk,
       float *out, const ptrdiff_t *pf)
{
    const int64_t  bytes = T == GGML_Q4_K ? QK4_K_BYTES : QK5_K_BYTES;
    const int64_t  bstride = 32 + 2 * 4 * 32;
    const __m256i  f = _mm256_set1_epi8(0xF);
    __m256         acc[2][XT_NMAX], mn[2];
    const uint8_t *p[2];

    for (int r = 0; r < R; r++) {
        p[r] = row[r] + qoff_at(il, QK_K, bytes, sp->b0);
    }
    XT(begin)(R, N, sp, acc, mn);
    for (int64_t b = sp->b0; b < sp->b1; b++) {
        const uint8_t *pb = pk + b * bstride;
        const uint8_t *xb = xa + b * 8 * N * 64;
        __m256         dx = _mm256_load_ps((const float *) pb);
        XT_LT          L[2][XT_NMAX];
        __m256i        sc[2], hb[2];

        for (int r = 0; r < R; r++) {
            __m256i I;

            q8_prefetch_block(p[r], pf[r], bytes);
#pragma GCC unroll 8
            for (int k = 0; k < N; k++) {
                L[r][k] = XT_LZERO;
            }
            I = XT(k4_head)(p[r], pb, &sc[r]);
            mn[r] = _mm256_fmadd_ps(_mm256_mul_ps(
                                        _mm256_set1_ps(f16_at(p[r] + 2)),
                                        dx),
                                    _mm256_cvtepi32_ps(I), mn[r]);
            hb[r] = T == GGML_Q5_K
                    ? _mm256_loadu_si256((const __m256i *) (p[r] + 16))
                    : _mm256_setzero_si256();
        }
        /* unrolled: each group's scale patterns constants (Q4_K about
         * 5% faster) */
#pragma GCC unroll 4
        for (int g2 = 0; g2 < 4; g2++) {
            __m256i w[2][2];

            for (int r = 0; r < R; r++) {
                const uint8_t *qs = p[r] + (T == GGML_Q4_K ? 16 : 48);
                __m256i        v = _mm256_loadu_si256((const __m256i *)
                                                      (qs + 32 * g2));

                w[r][0] = _mm256_and_si256(v, f);
                w[r][1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), f);
            }
            for (int j = 0; j < 2; j++) {
                int     G = 2 * g2 + j;
                __m256i wa[2], wb[2];

                for (int r = 0; r < R; r++) {
                    __m256i u = w[r][j];

                    if (T == GGML_Q5_K) {
                        __m256i bit = _mm256_set1_epi8((char) (1 << G));

                        u = _mm256_or_si256(u, _mm256_and_si256(
                                _mm256_cmpeq_epi8(_mm256_and_si256(hb[r],
                                                                   bit),
                                                  bit),
                                _mm256_set1_epi8(16)));
                    }
                    /* (sc_G, 0) and (0, sc_G) byte pairs: pshufb's index
                     * bytes G, and 0x80 for a zero */
                    wa[r] = _mm256_maddubs_epi16(u, _mm256_shuffle_epi8(
                                sc[r], _mm256_set1_epi16((short) (0x8000
                                                                  | G))));
                    wb[r] = _mm256_maddubs_epi16(u, _mm256_shuffle_epi8(
                                sc[r], _mm256_set1_epi16((short) (G << 8
                                                                  | 0x80))));
                }
                XT_GROUP(xb + G * N * 64, wa, wb);
            }
        }
        for (int r = 0; r < R; r++) {
            XT(fma)(N, _mm256_mul_ps(_mm256_set1_ps(f16_at(p[r])), dx),
                    L[r], acc[r]);
            p[r] = q8_next_block(p[r], il, QK_K, bytes, b);
        }
    }
    XT(end)(R, N, sp, acc, mn, out);
}


/*
 * Q6_K: one row against N tokens, from the two planes (xt_codes), a
 * step of one row (two rows' steps measured slower): per block I_hi and
 * I_lo for the tile from the packed sums; each group of 32 weights
 * decoded once and added into each token's L_hi and L_lo with its
 * scales; then t = fma(256, L_hi, L_lo) per token,
 * acc = fma(s, t, acc), and mn = fma(s, fma(256, I_hi, I_lo), mn).
 * PF 1 (the pairs' Q6_K, cpu_quant_pairs_k6.c's contract: |x'| <= 8128)
 * folds the planes in integer instead: L = 256 L_hi + L_lo, acc = fma(s,
 * (float) L, acc), and J = 256 J_hi + J_lo (I = 32 J), mn = fma(s, 32
 * (float) J, mn), all exact in int32.
 */
static INL XT_TGT void
XT(k6)(const int PF, const int N, const uint8_t *const *row, int il,
       const xt_span *sp, const uint8_t *xa, const uint8_t *pk, float *out,
       const ptrdiff_t *pf)
{
    const int64_t  bstride = 32 + 2 * 8 * 32;
    const __m256   k256 = _mm256_set1_ps(256.0f);
    __m256         acc[1][XT_NMAX], mn[1];
    const uint8_t *p = row[0] + qoff_at(il, QK_K, QK6_K_BYTES, sp->b0);

    XT(begin)(1, N, sp, acc, mn);
    for (int64_t b = sp->b0; b < sp->b1;
         p = q8_next_block(p, il, QK_K, QK6_K_BYTES, b), b++)
    {
        const uint8_t *pb = pk + b * bstride;
        const uint8_t *xb = xa + b * 8 * N * 64;
        __m256         dx = _mm256_load_ps((const float *) pb), sv;
        __m256i        Lh[XT_NMAX], Ll[XT_NMAX];
        __m256i        Ih = _mm256_setzero_si256(), Il = Ih, Ih2 = Ih;
        __m256i        Il2 = Ih;
        float          sb[8] __attribute__((aligned(32)));
        /* the 16 scales as int16 words; I_p = 32 sum_j sc_j bs_j in
         * pairs j = 2i, 2i + 1 (dword i of s16), each in two chains */
        __m256i        s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                 (const __m128i *) (p + 192)));

        q8_prefetch_block(p, pf[0], QK6_K_BYTES);
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            Lh[k] = _mm256_setzero_si256();
            Ll[k] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i += 2) {
            __m256i s = _mm256_permutevar8x32_epi32(s16,
                                                    _mm256_set1_epi32(i));
            __m256i s1 = _mm256_permutevar8x32_epi32(
                             s16, _mm256_set1_epi32(i + 1));

            Ih = XT_MADD(Ih, _mm256_load_si256((const __m256i *)
                                               (pb + 32 + 32 * i)), s);
            Il = XT_MADD(Il, _mm256_load_si256((const __m256i *)
                                               (pb + 288 + 32 * i)), s);
            Ih2 = XT_MADD(Ih2, _mm256_load_si256((const __m256i *)
                                                 (pb + 64 + 32 * i)), s1);
            Il2 = XT_MADD(Il2, _mm256_load_si256((const __m256i *)
                                                 (pb + 320 + 32 * i)), s1);
        }
        Ih = _mm256_add_epi32(Ih, Ih2);
        Il = _mm256_add_epi32(Il, Il2);
        for (int h = 0; h < 2; h++) {
            /* scales 8h .. 8h + 7 in both halves; group 4h + g takes
             * scale 8h + 2g in its low half, 8h + 2g + 1 above */
            __m256i sh = h ? _mm256_permute2x128_si256(s16, s16, 0x11)
                         : _mm256_permute2x128_si256(s16, s16, 0x00);
            __m256i a0 = _mm256_loadu_si256((const __m256i *) (p + 64 * h));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)
                                            (p + 64 * h + 32));
            __m256i e = _mm256_loadu_si256((const __m256i *)
                                           (p + 128 + 32 * h));

            for (int g = 0; g < 4; g++) {
                const uint8_t *xg = xb + (4 * h + g) * N * 64;
                __m256i        w = q8_k6_w(a0, a1, e, g);
                __m256i c = _mm256_shuffle_epi8(sh, _mm256_set_m128i(
                                _mm_set1_epi16(q8_b2(4 * g + 2)),
                                _mm_set1_epi16(q8_b2(4 * g))));

#pragma GCC unroll 8
                for (int k = 0; k < N; k++) {
                    Lh[k] = XT_DOT_U(Lh[k], w, _mm256_load_si256(
                                         (const __m256i *) (xg + 64 * k)),
                                     c);
                    Ll[k] = XT_DOT_U(Ll[k], w, _mm256_load_si256(
                                         (const __m256i *) (xg + 64 * k
                                                            + 32)), c);
                }
            }
        }
        sv = _mm256_mul_ps(_mm256_set1_ps(f16_at(p + 208)), dx);
        _mm256_store_ps(sb, sv);
        if (PF) {
            __m256i J = _mm256_add_epi32(_mm256_slli_epi32(Ih, 8), Il);

            mn[0] = _mm256_fmadd_ps(sv, _mm256_mul_ps(_mm256_cvtepi32_ps(J),
                                                      _mm256_set1_ps(32.0f)),
                                    mn[0]);
#pragma GCC unroll 8
            for (int k = 0; k < N; k++) {
                __m256i L = _mm256_add_epi32(_mm256_slli_epi32(Lh[k], 8),
                                             Ll[k]);

                acc[0][k] = _mm256_fmadd_ps(_mm256_set1_ps(sb[k]),
                                            _mm256_cvtepi32_ps(L),
                                            acc[0][k]);
            }
            continue;
        }
        mn[0] = _mm256_fmadd_ps(sv, _mm256_fmadd_ps(
                                        k256,
                                        _mm256_cvtepi32_ps(
                                            _mm256_slli_epi32(Ih, 5)),
                                        _mm256_cvtepi32_ps(
                                            _mm256_slli_epi32(Il, 5))),
                                mn[0]);
#pragma GCC unroll 8
        for (int k = 0; k < N; k++) {
            __m256 t = _mm256_fmadd_ps(k256, _mm256_cvtepi32_ps(Lh[k]),
                                       _mm256_cvtepi32_ps(Ll[k]));

            acc[0][k] = _mm256_fmadd_ps(_mm256_set1_ps(sb[k]), t,
                                        acc[0][k]);
        }
    }
    XT(end)(1, N, sp, acc, mn, out);
}


#if XT_WIDE
/*
 * The pairs' Q6_K (cpu_quant_pairs_k6.c's contract), VNNI: a block's J for
 * the tile from the packed sums pb (lane k: token k; J = 256 J_hi + J_lo, the
 * scales as int16 words times 256, exact: -128 * 256 = -32768, against
 * plane hi's sums of 16, the scales against plane lo's, in pairs of
 * sub-blocks 2i, 2i + 1 (dword i of s16), in two chains)
 */
static INL XT_TGT __m256i
XT(k6p_head)(__m256i s16, const uint8_t *pb)
{
    __m256i J = _mm256_setzero_si256(), J2 = J;
    __m256i s16h = _mm256_slli_epi16(s16, 8);

#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        __m256i s = _mm256_set1_epi32(i);

        J = XT_MADD(J, _mm256_load_si256((const __m256i *) (pb + 32
                                                             + 32 * i)),
                    _mm256_permutevar8x32_epi32(s16h, s));
        J2 = XT_MADD(J2, _mm256_load_si256((const __m256i *) (pb + 288
                                                               + 32 * i)),
                     _mm256_permutevar8x32_epi32(s16, s));
    }
    return _mm256_add_epi32(J, J2);
}


/*
 * The pairs' Q6_K: R rows against N tokens, from the tile codes (the full
 * codes x' as int16, as Q4_K's: |x'| <= 8128), the 16-bit planes folded
 * in integer: per block and row J at once (XT(k6p_head)) and mn = fma(s,
 * 32 (float) J, mn) for the tile; each group of 32 weights decoded once
 * into the even and odd weights' words times their sub-blocks' scales
 * (vpmaddubsw of the unsigned codes with (sc, 0) and (0, sc) pairs:
 * |w sc| <= 63 * 128), added into each token's L (XT_GROUP: vpdpwssd of
 * x' against them, exact: |L| < 2^31); then acc = fma(s, L, acc).
 */
static INL XT_TGT void
XT(k6p)(const int R, const int N, const uint8_t *const *row, int il,
        const xt_span *sp, const uint8_t *xa, const uint8_t *pk, float *out,
        const ptrdiff_t *pf)
{
    const int64_t  bstride = 32 + 2 * 8 * 32;
    __m256         acc[2][XT_NMAX], mn[2];
    const uint8_t *p[2];

    for (int r = 0; r < R; r++) {
        p[r] = row[r] + qoff_at(il, QK_K, QK6_K_BYTES, sp->b0);
    }
    XT(begin)(R, N, sp, acc, mn);
    for (int64_t b = sp->b0; b < sp->b1; b++) {
        const uint8_t *pb = pk + b * bstride;
        const uint8_t *xb = xa + b * 8 * N * 64;
        __m256         dx = _mm256_load_ps((const float *) pb), sv[2];
        XT_LT          L[2][XT_NMAX];
        __m256i        sc[2];

        for (int r = 0; r < R; r++) {
            __m128i s8 = _mm_loadu_si128((const __m128i *) (p[r] + 192));
            __m256i J = XT(k6p_head)(_mm256_cvtepi8_epi16(s8), pb);

            q8_prefetch_block(p[r], pf[r], QK6_K_BYTES);
#pragma GCC unroll 8
            for (int k = 0; k < N; k++) {
                L[r][k] = XT_LZERO;
            }
            sc[r] = _mm256_broadcastsi128_si256(s8);
            sv[r] = _mm256_mul_ps(_mm256_set1_ps(f16_at(p[r] + 208)), dx);
            mn[r] = _mm256_fmadd_ps(sv[r], _mm256_mul_ps(
                                        _mm256_cvtepi32_ps(J),
                                        _mm256_set1_ps(32.0f)), mn[r]);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i a0[2], a1[2], e[2];

            for (int r = 0; r < R; r++) {
                a0[r] = _mm256_loadu_si256((const __m256i *)
                                           (p[r] + 64 * h));
                a1[r] = _mm256_loadu_si256((const __m256i *)
                                           (p[r] + 64 * h + 32));
                e[r] = _mm256_loadu_si256((const __m256i *)
                                          (p[r] + 128 + 32 * h));
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                /* group 4h + g: sub-block 8h + 2g in the low half,
                 * 8h + 2g + 1 above; (sc, 0) and (0, sc) byte pairs by
                 * pshufb (index 0x80: a zero) */
                int     j = 8 * h + 2 * g;
                __m256i ia = _mm256_set_m128i(
                                 _mm_set1_epi16((short) (0x8000 | (j + 1))),
                                 _mm_set1_epi16((short) (0x8000 | j)));
                __m256i ib = _mm256_set_m128i(
                                 _mm_set1_epi16((short) ((j + 1) << 8
                                                         | 0x80)),
                                 _mm_set1_epi16((short) (j << 8 | 0x80)));
                __m256i wa[2], wb[2];

                for (int r = 0; r < R; r++) {
                    __m256i u = q8_k6_w(a0[r], a1[r], e[r], g);

                    wa[r] = _mm256_maddubs_epi16(u, _mm256_shuffle_epi8(
                                                        sc[r], ia));
                    wb[r] = _mm256_maddubs_epi16(u, _mm256_shuffle_epi8(
                                                        sc[r], ib));
                }
                XT_GROUP(xb + (4 * h + g) * N * 64, wa, wb);
            }
        }
        for (int r = 0; r < R; r++) {
            XT(fma)(N, sv[r], L[r], acc[r]);
            p[r] = q8_next_block(p[r], il, QK_K, QK6_K_BYTES, b);
        }
    }
    XT(end)(R, N, sp, acc, mn, out);
}
#endif


/* one K-quant's tile: n tokens (1 .. XT_NMAX), each count its own code */
#define XT_CASE(NAME, K)                                                    \
    case K:                                                                 \
        if ((K) <= XT_NMAX) {                                               \
            if (GGML_##NAME == GGML_Q6_K) {                                 \
                XT(k6)(0, K, row, il, sp, xa, pk, out, pf);                 \
            } else {                                                        \
                XT(k4)(GGML_##NAME, XT_R4, K, row, il, sp, xa, pk, out,     \
                       pf);                                                 \
            }                                                               \
        }                                                                   \
        break;

#define XT_TYPE(NAME)                                                       \
static XT_TGT void                                                          \
XT(tile_##NAME)(const uint8_t *const *row, int il, const xt_span *sp,      \
                const uint8_t *xa, const uint8_t *pk, int n, float *out,    \
                const ptrdiff_t *pf)                                        \
{                                                                           \
    switch (n) {                                                            \
    XT_CASE(NAME, 1) XT_CASE(NAME, 2) XT_CASE(NAME, 3) XT_CASE(NAME, 4)     \
    XT_CASE(NAME, 5) XT_CASE(NAME, 6) XT_CASE(NAME, 7) XT_CASE(NAME, 8)     \
    default:                                                                \
        break;                                                              \
    }                                                                       \
}

XT_TYPE(Q4_K)
XT_TYPE(Q5_K)
XT_TYPE(Q6_K)


/* the tile of a K-quant t; NULL for the other types */
static xt_tile_fn *
XT(fn)(ggml_type t)
{
    switch (t) {
    case GGML_Q4_K:
        return XT(tile_Q4_K);
    case GGML_Q5_K:
        return XT(tile_Q5_K);
    case GGML_Q6_K:
        return XT(tile_Q6_K);
    default:
        return NULL;
    }
}

/* the pairs' Q6_K tile, n tokens, a step of one row: VNNI XT(k6p), from
 * the int16 tile codes; AVX2 XT(k6) from the planes, folded (measured:
 * the int16 codes' two vpmaddwd a group and token, with the weights'
 * words made per group, ran 1.05-1.10x the 16-bit tile's time there) */
#if XT_WIDE
#define XT_PCASE(K)                                                         \
    case K:                                                                 \
        if ((K) <= XT_NMAX) {                                               \
            XT(k6p)(1, K, row, il, sp, xa, pk, out, pf);                    \
        }                                                                   \
        break;
#else
#define XT_PCASE(K)                                                         \
    case K:                                                                 \
        if ((K) <= XT_NMAX) {                                               \
            XT(k6)(1, K, row, il, sp, xa, pk, out, pf);                     \
        }                                                                   \
        break;
#endif

static XT_TGT void
XT(tile_q6k_pairs)(const uint8_t *const *row, int il, const xt_span *sp,
                   const uint8_t *xa, const uint8_t *pk, int n, float *out,
                   const ptrdiff_t *pf)
{
    switch (n) {
    XT_PCASE(1) XT_PCASE(2) XT_PCASE(3) XT_PCASE(4)
    XT_PCASE(5) XT_PCASE(6) XT_PCASE(7) XT_PCASE(8)
    default:
        break;
    }
}

#undef XT_PCASE
#undef XT_TYPE
#undef XT_CASE
#undef XT_GROUP
#undef XT_LT
#undef XT_LZERO
#undef XT_LFOLD
