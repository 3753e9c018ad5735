/*
 * CPU kernels over block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
 * ggml's layouts: see gguf.h), read in their blocks with no dequantized
 * copy, F32 activations and F32 accumulation.
 *
 * Each block is split into sub-blocks of S weights (S = 32; 16 for Q6_K)
 * that share a scale a_j and (Q4_K, Q5_K) a min b_j: weight i of
 * sub-block j is a_j * q_i - b_j, q_i a small integer.  a_j and b_j are
 * the products ggml forms (d * sc_j, dmin * m_j), exact in float, and
 * a_j * q_i is exact too.  With AVX-512 each weight is dequantized as
 * ggml does (w_i = a_j * q_i - b_j rounded once: an fmsub, or a product
 * where there is no min) and the dot product is sum_i w_i x_i; otherwise
 * it is
 *   sum_j a_j * (sum_i q_i x_i) - sum_j b_j * (sum_i x_i).
 * Either way only float32 rounding enters the sums; activations are
 * never rounded.
 *
 * Batch invariance: every (row, token) output is computed by the same
 * operations in the same order whatever the batch:
 *   AVX-512: one 16-lane chain over the row's columns in order,
 *     acc = fma(w[c:c+16], x[c:c+16], acc) from 0, and y = hsum16(acc) =
 *     hsum8(acc[0:8] + acc[8:16]): the dot product of x with
 *     nalar_dequant_row's floats.
 *   AVX2: per sub-block, an 8-lane chain v = q[0:8] x[0:8],
 *     v = fma(q[8k:8k+8], x[8k:8k+8], v) for k = 1 .. S/8 - 1; then
 *     acc = fma(a_j, v, acc) over the sub-blocks in order (acc 8 lanes,
 *     from 0); for Q4_K and Q5_K, per block, m = fma(b[0:8], xs[0:8], m)
 *     (8 lanes, from 0; lane j holds sub-block j's min) where xs_j is
 *     the 8-lane sum ((x0 + x1) + (x2 + x3)) of the sub-block's four
 *     vectors reduced as hsum8; y = hsum8(acc) - hsum8(m).
 *     hsum8(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
 *   Portable: one lane: v a scalar fmaf chain over the sub-block,
 *     acc = fmaf(a_j, v, acc), m = fmaf(b_j, xs_j, m) over the
 *     sub-blocks in order, xs_j a scalar sum in order.
 * The three builds differ in their last bits, each agrees with itself.
 *
 * cpu_quant.c: these kernels and their dispatch by type;
 * cpu_quant_blocks.h: the block decoding; cpu_quantize.c:
 * nalar_quantize_row.  The activations' integer modes (below): 8-bit
 * (cpu_quant_q8*.c) and 16-bit (cpu_quant_x16*.c).
 */
#ifndef NALAR_CPU_QUANT_H
#define NALAR_CPU_QUANT_H

#include <stdint.h>

#include "gguf.h"

/* 1 when t is a block-quantized type these kernels compute with */
int nalar_quant_type(ggml_type t);

/* Weights per block (32 or 256) of a quantized type */
int64_t nalar_quant_block(ggml_type t);

/* n weights (a multiple of the block) from a row's bytes, dequantized as
 * ggml does (weight = a_j * q - b_j, rounded once to float) */
void nalar_dequant_row(ggml_type t, const void *src, int64_t n, float *out);

/*
 * A matrix's blocks at w: its rows as in the file, wstride bytes apart
 * (il 0), or as nalar_quant_interleave lays them out (il 1).  Every
 * product takes the same operations either way, so the bits are the
 * same.
 */

/* 1 when a matrix of rows of cols weights of type t can be interleaved
 * (cols a multiple of QK_K); its bytes interleaved are
 * nalar_quant_interleaved_bytes */
int nalar_quant_can_interleave(ggml_type t, int64_t cols);
int64_t nalar_quant_interleaved_bytes(ggml_type t, int64_t rows,
                                      int64_t cols);

/* Rows of the matrix at src (wstride bytes apart) into dst, interleaved:
 * in groups of 4 rows (the last padded with zero bytes), each group's
 * rows taking turns by 256 weights, so that a pass of one token over 4
 * rows reads one stream of memory */
void nalar_quant_interleave(ggml_type t, const uint8_t *src, int64_t rows,
                            int64_t cols, uint8_t *dst);

/* y[t * ldy + r] (+)= W[r, :] . x[t * ldx + :] for r in [r0, r1), t in
 * [0, n_tok) */
void nalar_quant_matmul(ggml_type t, const uint8_t *w, int64_t wstride,
                        int il, int64_t cols, const float *x, int n_tok,
                        int ldx, float *y, int ldy, int64_t r0, int64_t r1,
                        int accumulate);

/* The portable kernel, in every build (for tests) */
void nalar_quant_matmul_portable(ggml_type t, const uint8_t *w,
                                 int64_t wstride, int il, int64_t cols,
                                 const float *x, int n_tok, int ldx,
                                 float *y, int ldy, int64_t r0, int64_t r1,
                                 int accumulate);

/*
 * 8-bit activations (an engine's opt-in mode, cpu_quant_q8.c): each
 * token's x rounded to int8 codes, per 32 (Q8_0-like: read by Q8_0 and
 * Q4_0) and per 256 (Q8_K-like, with the sums of each 16 codes: read by
 * the K-quants), d = max |x| / 127, codes round(x / d) in [-127, 127];
 * the products are integer dot products with the weights' codes (AVX-512
 * VNNI, AVX2 or scalar, chosen at run time), and every path gives the
 * same bits (the operations are in cpu_quant_q8.c; one token's products
 * run four rows at a time, with the same operations per row, in
 * cpu_quant_rows.c).
 */
typedef struct {
    const int8_t  *q;    /* (n_tok, cols) codes per 32 */
    const float   *d;    /* (n_tok, cols / 32) their scales */
    const int8_t  *qk;   /* (n_tok, cols) codes per 256, or NULL when cols
                            is not a multiple of 256 */
    const float   *dk;   /* (n_tok, cols / 256) their scales */
    const int32_t *bs;   /* (n_tok, cols / 16) the sums of 16 codes of qk */
    int64_t        cols; /* 0: no codes made */
} nalar_xq8;

/* bytes nalar_quant_x8 takes for n_tok tokens of cols (a multiple of 32) */
int64_t nalar_quant_x8_bytes(int n_tok, int64_t cols);

/* the 8-bit codes of x (n_tok rows, ldx floats apart) into buf (any
 * alignment, nalar_quant_x8_bytes long), described by *x8 */
void nalar_quant_x8(const float *x, int n_tok, int ldx, int64_t cols,
                    void *buf, nalar_xq8 *x8);

/* 1 when a row of cols weights of type t takes 8-bit codes */
int nalar_quant_x8_fits(ggml_type t, int64_t cols);

/* nalar_quant_matmul from x's 8-bit codes (nalar_quant_x8) */
void nalar_quant_matmul_x8(ggml_type t, const uint8_t *w, int64_t wstride,
                           int il, int64_t cols, const nalar_xq8 *x8,
                           int n_tok, float *y, int ldy, int64_t r0,
                           int64_t r1, int accumulate);

/* nalar_quant_matmul with 8-bit activations: x's codes made here, the
 * same bits as nalar_quant_matmul_x8 from codes made once */
void nalar_quant_matmul_q8(ggml_type t, const uint8_t *w, int64_t wstride,
                           int il, int64_t cols, const float *x, int n_tok,
                           int ldx, float *y, int ldy, int64_t r0,
                           int64_t r1, int accumulate);

/* The instruction set the 8- and 16-bit activations' kernels run on
 * (cpu_quant_q8*.c, cpu_quant_x16*.c, cpu_quant_rows.c, cpu_quant_p32.c):
 * the widest this CPU has (nalar_quant_q8_isa_max), capped by the
 * environment's NALAR_CPU_ISA (scalar | avx2 | avxvnni | vnni) and by
 * nalar_quant_q8_force (tests; -1: none), then the widest at or below
 * the cap that this CPU runs.  The order is of width: AVX-VNNI is AVX2
 * with VEX-encoded vpdpbusd/vpdpwssd on 256 bits (CPUs without AVX-512
 * have it; not every AVX-512 VNNI CPU does).  The 8-bit activations'
 * kernels and the one-token rows kernels have an AVX-VNNI form; the
 * other kernels run their AVX2 form there.  Every one gives the same
 * bits. */
#define NALAR_ISA_SCALAR  0
#define NALAR_ISA_AVX2    1
#define NALAR_ISA_AVXVNNI 2
#define NALAR_ISA_VNNI    3     /* AVX-512 VNNI (with VL and BW) */
int nalar_quant_q8_isa_max(void);
int nalar_quant_q8_isa(void);
void nalar_quant_q8_force(int isa);
/* 1 when this CPU runs isa's kernels */
int nalar_quant_isa_ok(int isa);
/* the name of isa ("scalar", "avx2", "avx-vnni", "avx512-vnni") */
const char *nalar_quant_isa_name(int isa);
/* the isa whose form a kernel family without an AVX-VNNI form runs:
 * its AVX2 form on AVX-VNNI */
static inline int
nalar_quant_isa_sans_avxvnni(int isa)
{
    return isa == NALAR_ISA_AVXVNNI ? NALAR_ISA_AVX2 : isa;
}

/*
 * 16-bit activations (an engine's opt-in mode, cpu_quant_x16.c): each
 * token's x rounded to 16-bit codes in the groups of the 8-bit codes
 * (per 32 and per 256), d = max |x| / 32639, codes round(x / d) in
 * [-32639, 32639], each split into two signed bytes, code = 256 * hi +
 * lo (hi in [-127, 127], lo in [-128, 127]), kept as two planes laid out
 * exactly as nalar_xq8's codes; the products are two 8-bit products per
 * block sharing the weights' decode, combined in integer (or, Q6_K, one
 * float fma), and every path gives the same bits (cpu_quant_x16.c; Q8_0
 * and Q4_0: cpu_quant_p32.c).
 */
typedef struct {
    nalar_xq8 hi;   /* the codes' high bytes: q, qk, and bs their sums of
                       16; d and dk the 16-bit codes' scales */
    nalar_xq8 lo;   /* the low bytes, with their own sums; d and dk the
                       same arrays as hi's */
} nalar_xq16;

/*
 * Pair multipliers (an activation mode, cpu_quant_pairs.c): per group of
 * 256 values of x (what one K-quant weight block reads) one float step
 * D = max |x| / (127 * 64), and per pair of values (x[2p], x[2p + 1]) an
 * integer n_p in [1, 64] and two int8 codes c in [-127, 127],
 * x ~ D * n_p * c.  x16 holds the products x' = n * c (|x'| <= 8128) as
 * the 16-bit mode's codes and planes, with D as their scales (dk), so
 * every 16-bit kernel reads them unchanged and gives the 16-bit
 * contract's bits for x'.  ck and nk are the 256-groups' c and n as they
 * are, for one token's K-quant rows (nalar_quant_pairs_rows): the same
 * integers, fewer products.  Per 32 (Q8_0 and Q4_0: q and d) x16 holds
 * the 16-bit mode's own codes of x (nalar_quant_x16's bytes).
 */
typedef struct {
    nalar_xq16     x16;  /* per 256 x' = n * c, scales D; per 32 the
                            16-bit codes of x */
    const int8_t  *ck;   /* (n_tok, cols) the 256-groups' codes c, in x's
                            order, or NULL when cols is not a multiple of
                            256 */
    const int16_t *nk;   /* (n_tok, cols / 2) n of the pair (x[2p],
                            x[2p + 1]) of those groups */
} nalar_xqp;

/* bytes nalar_quant_xpairs takes for n_tok tokens of cols (a multiple of
 * 32) */
int64_t nalar_quant_xpairs_bytes(int n_tok, int64_t cols);

/* the pair codes of x (n_tok rows, ldx floats apart) into buf (any
 * alignment, nalar_quant_xpairs_bytes long), described by *xp: x16 laid
 * out as nalar_quant_x16 lays out its codes, ck and nk where cols is a
 * multiple of 256 (the rule, in float operations: cpu_quant_pairs.c) */
void nalar_quant_xpairs(const float *x, int n_tok, int ldx, int64_t cols,
                        void *buf, nalar_xqp *xp);

/* The groupings of the pairs mode's codes (a mask): per 32 (x16's q and
 * d, the 16-bit codes, read by Q8_0 and Q4_0) and per 256 (x16's qk, bs
 * and dk, ck and nk: the K-quants) */
#define NALAR_XP_G32  1
#define NALAR_XP_G256 2

/* the grouping a row of type t reads */
int nalar_quant_xpairs_group(ggml_type t);

/* nalar_quant_xpairs making only the groupings in `groups` (each the
 * same bytes as nalar_quant_xpairs makes); those not made are NULL in
 * *xp (the codes per 256 also where cols is not a multiple of 256) */
void nalar_quant_xpairs_groups(const float *x, int n_tok, int ldx,
                               int64_t cols, int groups, void *buf,
                               nalar_xqp *xp);

/* nalar_quant_matmul from x's pair codes (nalar_quant_xpairs): the
 * 16-bit kernels' bits for x' (nalar_quant_matmul_x16 on xp->x16; Q6_K:
 * the pairs' own contract, cpu_quant_pairs_k6.c),
 * through nalar_quant_pairs_rows for one token of a K-quant where it has
 * a kernel; a row of cols weights of t takes them where
 * nalar_quant_x8_fits */
void nalar_quant_matmul_pairs(ggml_type t, const uint8_t *w,
                              int64_t wstride, int il, int64_t cols,
                              const nalar_xqp *xp, int n_tok, float *y,
                              int ldy, int64_t r0, int64_t r1,
                              int accumulate);

/* nalar_quant_matmul with pair-multiplier activations: x's codes made
 * here, the same bits as nalar_quant_matmul_pairs from codes made once */
void nalar_quant_matmul_xpairs(ggml_type t, const uint8_t *w,
                               int64_t wstride, int il, int64_t cols,
                               const float *x, int n_tok, int ldx, float *y,
                               int ldy, int64_t r0, int64_t r1,
                               int accumulate);

/* bytes nalar_quant_x16 takes for n_tok tokens of cols (a multiple of
 * 32) */
int64_t nalar_quant_x16_bytes(int n_tok, int64_t cols);

/* the 16-bit codes of x (n_tok rows, ldx floats apart) into buf (any
 * alignment, nalar_quant_x16_bytes long), described by *x16 */
void nalar_quant_x16(const float *x, int n_tok, int ldx, int64_t cols,
                     void *buf, nalar_xq16 *x16);

/* nalar_quant_matmul from x's 16-bit codes (nalar_quant_x16); a row of
 * cols weights of t takes them where nalar_quant_x8_fits */
void nalar_quant_matmul_x16(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const nalar_xq16 *x16,
                            int n_tok, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* x's codes for n_tok tokens, made once for the products that read
 * them: the 16-bit codes (x16.hi.cols != 0), the 8-bit ones (x8.cols !=
 * 0) or the pair codes (xp.x16.hi.cols != 0), the others zeroed */
typedef struct {
    nalar_xq8      x8;
    nalar_xq16     x16;
    nalar_xqp      xp;
} nalar_xq;

/* nalar_quant_matmul with 16-bit activations: x's codes made here, the
 * same bits as nalar_quant_matmul_x16 from codes made once */
void nalar_quant_matmul_i16(ggml_type t, const uint8_t *w, int64_t wstride,
                            int il, int64_t cols, const float *x, int n_tok,
                            int ldx, float *y, int ldy, int64_t r0,
                            int64_t r1, int accumulate);

/* Quantize n floats (a multiple of the block) into a row of type t, for
 * `nalar mkmodel` and tests; returns 0, or -1 for a type it cannot
 * write. */
int nalar_quantize_row(ggml_type t, const float *x, int64_t n, void *dst);

#endif
