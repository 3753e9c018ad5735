/*
 * CPU matrix products over F32/F16/BF16/Q8_0 weights with F32 activations.
 *
 * y[t, r] = sum_c W[r, c] * x[t, c]  (+ y[t, r] when accumulate)
 * for rows r in [r0, r1) and tokens t in [0, n_tok).
 *   W: a nalar_cpu_mat over the model's (rows, cols) matrix
 *   x: (n_tok, ldx) floats, y: (n_tok, ldy) floats
 *
 * Batch invariance: every output element is computed by the same sequence
 * of operations whatever tile it falls in, so a sequence's numbers do not
 * depend on what else is in the batch or on how its prompt was chunked.
 *   F32, F16, BF16: one FMA chain over the columns in order, from 0:
 *     s = fma(W[r, c], x[t, c], s) for c = 0 .. cols - 1; then y (+)= s.
 *   Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: see cpu_quant.h.
 *   BF16 pairs (a narrowed W, see nalar_cpu_mat_init): x rounded to BF16,
 *     then one vdpbf16ps chain over the column pairs in order, from 0:
 *     s = dpbf16(s, (W[r, 2q], W[r, 2q + 1]), (x[t, 2q], x[t, 2q + 1])).
 */
#ifndef NALAR_CPU_MATMUL_H
#define NALAR_CPU_MATMUL_H

#include <stdint.h>

#include "cpu_quant.h"
#include "model.h"
#include "nalar_err.h"

/*
 * A weight matrix as the CPU kernels read it.  With AVX-512, F32/F16/BF16
 * weights are copied once into panels of 16 rows stored by column:
 * element (r, c) at panels[(r / 16) * cols * 16 + c * 16 + r % 16], in
 * ptype (W's, or F16 for a narrowed F32 W: see nalar_cpu_mat_init), the
 * last panel padded with zero rows.  One vector load then gives
 * one column of 16 rows, each token's x[t, c] is broadcast against it, and
 * 16 outputs build up in one vector with no horizontal sum -- so a pass of
 * a few tokens costs little more than one.  With AVX2 but no AVX-512 the
 * panels hold 8 rows (element (r, c) at panels[(r / 8) * cols * 8 + c * 8
 * + r % 8], in W's type; narrow is ignored).  Quantized weights (Q8_0,
 * Q4_0, Q4_K, Q5_K, Q6_K; cpu_quant.h) are copied in their blocks into
 * panels (ptype W's), memory the backend owns, interleaved by 4 rows
 * where the columns allow (il).  Without
 * AVX2, F32/F16/BF16 are read from the model's rows in place: panels is
 * NULL.
 */
typedef struct {
    const nalar_mat *W;
    void            *panels;   /* (ceil(rows / 16), cols, 16) or NULL */
    ggml_type        ptype;    /* the panels' element type: W's, or F16
                                  for an F32 W narrowed */
    int              pairs;    /* 1: BF16 pair panels (ptype BF16):
                                  element (r, c) at panels[(r / 16)
                                  * ceil(cols / 2) * 32 + (c / 2) * 32
                                  + (r % 16) * 2 + c % 2] */
    int              il;       /* 1: a quantized W's panels hold its
                                  blocks interleaved by 4 rows
                                  (nalar_quant_interleave); P32_IL (2):
                                  a Q8_0/Q4_0 W's, in panels of 16 rows
                                  (nalar_quant_p32_pack), while its
                                  activations are i16 or pairs */
    int              act_i16;  /* a quantized W's activations:
                                  NALAR_ACT_I16 (1): x's 16-bit codes
                                  (nalar_quant_matmul_i16);
                                  NALAR_ACT_Q8 (2): x's int8 codes
                                  (nalar_quant_matmul_q8);
                                  NALAR_ACT_PAIRS (3): x's pair codes
                                  (nalar_quant_matmul_xpairs); 0
                                  (init's default): F32 */
} nalar_cpu_mat;

/*
 * narrow: for a model whose exact numbers do not matter -- a draft's,
 * which only proposes tokens for the target to verify.  Where the CPU has
 * AVX512-BF16, W (F32, F16 or BF16) is held as BF16 pair panels (each
 * weight rounded to nearest) and x is rounded too: half the bytes of F32
 * and half the instructions of F16.  Elsewhere an F32 W's panels are held
 * as F16 (half the bytes), unless a weight lies outside F16's finite
 * range.
 */
int nalar_cpu_mat_init(nalar_cpu_mat *M, const nalar_mat *W, int narrow,
                       nalar_err *err);
void nalar_cpu_mat_free(nalar_cpu_mat *M);

/* Once the backend holds its copies: drop the resident pages of f's
 * matrices from the mapping (gguf_drop_resident).  What is still read
 * from the mapping (an embedding row; F32/F16/BF16 rows in builds without
 * panels) faults back in on its first read and stays. */
void nalar_cpu_drop_mapped(const gguf_file *f);

void nalar_cpu_matmul(const nalar_cpu_mat *M, const float *x, int n_tok,
                      int ldx, float *y, int ldy, int64_t r0, int64_t r1,
                      int accumulate);

/* 1 when M's products take integer activations (act_i16, a quantized
 * W) */
int nalar_cpu_mat_i16(const nalar_cpu_mat *M);

/* M's activations set to mode (act_i16's values), its blocks laid out as
 * that mode's products read them: a Q8_0/Q4_0 W in panels of 16 rows for
 * i16 and pairs (cpu_quant_p32.h), else as own_blocks lays them out.
 * Without the memory to move them they stay as they are, which every
 * product reads too (the panels' kernels then give way to the scalar
 * reference, the same bits). */
void nalar_cpu_mat_act(nalar_cpu_mat *M, int mode);

/* nalar_cpu_matmul with x's codes made already (xq: x's n_tok tokens,
 * nalar_quant_x16 into xq->x16, nalar_quant_x8 into xq->x8, or
 * nalar_quant_xpairs into xq->xp): where M takes those activations it
 * reads them, the bits it would make of x; otherwise, or with xq NULL,
 * x */
void nalar_cpu_matmul_xq(const nalar_cpu_mat *M, const float *x,
                         const nalar_xq *xq, int n_tok, int ldx, float *y,
                         int ldy, int64_t r0, int64_t r1, int accumulate);

/* out[c] = W[row, c] as float (embedding lookup), c in [0, cols) */
void nalar_cpu_get_row(const nalar_mat *W, int64_t row, float *out);

#endif
