/*
 * Checks the quantized kernels' unit tests share: one token's rows
 * kernels over splits of the rows (test_quant_q8.c, test_quant_x16.c,
 * test_quant_pairs_rows.c), batch invariance of the 8- and 16-bit
 * dispatch (test_quant_q8.c, test_quant_x16.c), and products of windows
 * of tokens against the scalar reference's, over all rows and over a
 * ragged range added into y (test_quant_q8.c, test_quant_x16_tiles.c,
 * test_quant_pairs_k6.c).  The one-token and batch checks know the
 * families of kernels they run (TOKEN_X8, TOKEN_X16, TOKEN_PAIRS); the
 * tile checks take the test's kernels and reference as functions over
 * its own codes.  Each returns the outputs or products that are not the
 * reference's bits for the test's ok(), but the one-token check, which
 * makes its own.
 */
#ifndef NALAR_T_QUANT_TEST_CHECKS_H
#define NALAR_T_QUANT_TEST_CHECKS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_pairs_k6.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "gguf.h"
#include "tap.h"

/* ------------------------------------------------------------------ */
/* one token, rows in splits                                            */


#define TOKEN_X8    0   /* x's 8-bit codes (nalar_quant_x8) through
                           nalar_quant_matmul_x8, the scalar kernel the
                           reference */
#define TOKEN_X16   1   /* x's 16-bit codes (nalar_quant_x16) by
                           nalar_quant_x16_rows, nalar_quant_x16_scalar the
                           reference */
#define TOKEN_PAIRS 2   /* xp's pair codes by nalar_quant_pairs_rows,
                           nalar_quant_pairs_scalar the reference */

/* one matrix against one token, for a family of kernels */
typedef struct {
    ggml_type        t;
    int              kernels;  /* TOKEN_X8, TOKEN_X16 or TOKEN_PAIRS */
    const uint8_t   *w;        /* rows x cols weights of t, file order */
    int64_t          rows, cols;
    const float     *x;        /* X8, X16: the token's cols activations */
    const nalar_xqp *xp;       /* PAIRS: its codes (NULL for the others) */
} token_case;

/* a token's codes as the family takes them */
typedef struct {
    nalar_xq8  x8;
    nalar_xq16 x16;
    void      *buf;
} token_codes;


/* the codes of c's token in k (k->buf: the caller's to free): 0, or -1
 * when out of memory (or c's x or xp is NULL) */
static inline int
token_codes_make(const token_case *c, token_codes *k)
{
    k->buf = NULL;
    if (c->kernels == TOKEN_PAIRS) {
        return c->xp != NULL ? 0 : -1;
    }
    k->buf = malloc((size_t) (c->kernels == TOKEN_X8
                              ? nalar_quant_x8_bytes(1, c->cols)
                              : nalar_quant_x16_bytes(1, c->cols)));
    if (c->x == NULL || k->buf == NULL) {
        return -1;
    }
    if (c->kernels == TOKEN_X8) {
        nalar_quant_x8(c->x, 1, (int) c->cols, c->cols, k->buf, &k->x8);
    } else {
        nalar_quant_x16(c->x, 1, (int) c->cols, c->cols, k->buf, &k->x16);
    }
    return 0;
}


/* the token's product of rows [r0, r1) of m (c->w, or it interleaved:
 * layout lay 1) into y (y[r] += when acc, else =), by the family's kernels
 * on isa (forced by the caller, nalar_quant_q8_force), its reference on
 * NALAR_ISA_SCALAR: 0, or nonzero where the kernel did not run */
static inline int
token_run(const token_case *c, const token_codes *k, int isa,
          const uint8_t *m, int lay, float *y, int64_t r0, int64_t r1,
          int acc)
{
    int64_t rs = (int64_t) ggml_row_size(c->t, (uint64_t) c->cols);

    switch (c->kernels) {
    case TOKEN_X8:
        nalar_quant_matmul_x8(c->t, m, rs, lay, c->cols, &k->x8, 1, y,
                              (int) c->rows, r0, r1, acc);
        return 0;
    case TOKEN_X16:
        if (isa != NALAR_ISA_SCALAR) {
            return nalar_quant_x16_rows(c->t, isa, m, rs, lay, c->cols,
                                        &k->x16, y, r0, r1, acc);
        }
        nalar_quant_x16_scalar(c->t, m, rs, lay, c->cols, &k->x16, 1, y,
                               (int) c->rows, r0, r1, acc);
        return 0;
    default:
        if (isa != NALAR_ISA_SCALAR) {
            return nalar_quant_pairs_rows(c->t, isa, m, rs, lay, c->cols,
                                          c->xp, y, r0, r1, acc);
        }
        nalar_quant_pairs_scalar(c->t, m, rs, lay, c->cols, &c->xp->x16, 1,
                                 y, (int) c->rows, r0, r1, acc);
        return 0;
    }
}


/* every instruction set from AVX2 to this CPU's widest, both layouts (the
 * interleaved one where t's rows interleave, nalar_quant_can_interleave),
 * each split, added to y or not: each row a range covers the reference's
 * bits (plus y's 1 when added), the rows before them untouched; y, ref:
 * rows floats.  Returns the bad outputs (every output of a run that did
 * not run), *runs the runs made (none where the CPU has no AVX2) */
static inline int
token_splits_bad(const token_case *c, const token_codes *k,
                 const uint8_t *il, float *ref, float *y, int *runs)
{
    /* the ranges' cut points: one range; 0-5, 5-end; 0-2, 2-9, 9-end;
     * 1-3, 3-end (none on a turn of four rows but 0; row 0 before 1-3
     * untouched) */
    static const int64_t cut[][3] = { { 0, -1, -1 }, { 0, 5, -1 },
                                      { 0, 2, 9 }, { 1, 3, -1 } };
    int                  bad = 0;

    nalar_quant_q8_force(NALAR_ISA_SCALAR);
    (void) token_run(c, k, NALAR_ISA_SCALAR, c->w, 0, ref, 0, c->rows, 0);
    nalar_quant_q8_force(-1);
    for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max(); isa++) {
        /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
        if (!nalar_quant_isa_ok(isa)) {
            continue;
        }
        for (int lay = 0; lay < 2; lay++) {
            const uint8_t *m = lay ? il : c->w;

            if (m == NULL) {
                continue;
            }
            for (int j = 0; j < (int) (sizeof(cut) / sizeof(cut[0])); j++) {
                for (int acc = 0; acc < 2; acc++) {
                    float   y0 = acc ? 1.0f : -7.0f;
                    int64_t a = cut[j][0];
                    int     rc = 0;

                    for (int64_t r = 0; r < c->rows; r++) {
                        y[r] = y0;
                    }
                    nalar_quant_q8_force(isa);
                    for (int p = 0; p < 3 && a < c->rows; p++) {
                        int64_t e = p + 1 < 3 && cut[j][p + 1] > 0
                                    && cut[j][p + 1] < c->rows
                                    ? cut[j][p + 1] : c->rows;

                        rc |= token_run(c, k, isa, m, lay, y, a, e, acc);
                        a = e;
                    }
                    nalar_quant_q8_force(-1);
                    for (int64_t r = 0; r < c->rows; r++) {
                        float want = r < cut[j][0] ? y0
                                     : acc ? 1.0f + ref[r] : ref[r];

                        if ((rc != 0 || memcmp(&y[r], &want, sizeof(float)))
                            && bad++ == 0)
                        {
                            diag("%s isa %d layout %d split %d acc %d row "
                                 "%lld: %a, want %a (rc %d)",
                                 ggml_type_name(c->t), isa, lay, j, acc,
                                 (long long) r, (double) y[r],
                                 (double) want, rc);
                        }
                    }
                    (*runs)++;
                }
            }
        }
    }
    return bad;
}


/* the check of c's token over the splits (token_splits_bad): ok when no
 * output is bad and some ran, named "<what>: every instruction set's
 * kernels, split and layout give the reference's bits"; not ok when out of
 * memory (c's x or xp NULL, or here) */
static inline void
check_token_splits(const token_case *c, const char *what)
{
    int          can = nalar_quant_can_interleave(c->t, c->cols);
    size_t       out = (size_t) c->rows * sizeof(float);
    uint8_t     *il = can ? malloc((size_t) nalar_quant_interleaved_bytes(
                                       c->t, c->rows, c->cols))
                          : NULL;
    float       *ref = malloc(out), *y = malloc(out);
    int          bad = -1, runs = 0;
    token_codes  k;

    if (token_codes_make(c, &k) == 0 && c->w != NULL && ref != NULL
        && y != NULL && (il != NULL || !can))
    {
        if (il != NULL) {
            nalar_quant_interleave(c->t, c->w, c->rows, c->cols, il);
        }
        bad = token_splits_bad(c, &k, il, ref, y, &runs);
    } else {
        diag("%s: out of memory", what);
    }
    ok(bad == 0 && runs > 0, "%s: every instruction set's kernels, split "
       "and layout give the reference's bits (%d runs)", what, runs);
    free(k.buf);
    free(il);
    free(ref);
    free(y);
}


/* ------------------------------------------------------------------ */
/* batch invariance                                                     */


/* n tokens' product over rows [r0, r1) of m (layout lay) into y through
 * the dispatch of c's family (TOKEN_X8: nalar_quant_matmul_x8, TOKEN_X16:
 * nalar_quant_matmul_x16), codes an nalar_xq8 or an nalar_xq16 */
static inline void
batch_dispatch(const token_case *c, const void *codes, int n,
               const uint8_t *m, int lay, float *y, int64_t r0, int64_t r1)
{
    int64_t rs = (int64_t) ggml_row_size(c->t, (uint64_t) c->cols);

    if (c->kernels == TOKEN_X8) {
        nalar_quant_matmul_x8(c->t, m, rs, lay, c->cols, codes, n, y,
                              (int) c->rows, r0, r1, 0);
    } else {
        nalar_quant_matmul_x16(c->t, m, rs, lay, c->cols, codes, n, y,
                               (int) c->rows, r0, r1, 0);
    }
}


/* c's family (TOKEN_X8 or TOKEN_X16) on n_tok tokens of activations from
 * c->x (cols apart), whose products all at once, from the codes of all of
 * them (all), are ref: each token with its codes made alone, its rows in
 * two calls (split at rows / 3), and, where t's rows interleave
 * (*interleaved 1), all tokens from the rows interleaved, each bit for bit
 * ref's; y: n_tok * rows floats.  Returns the products that are not, one
 * for each allocation that failed */
static inline int
batch_bad(const token_case *c, int n_tok, const void *all, const float *ref,
          float *y, int *interleaved)
{
    int64_t  rows = c->rows, mid = rows / 3;
    uint8_t *il = NULL;
    int      bad = 0;

    for (int tk = 0; tk < n_tok; tk++) {
        token_case  one = *c;
        token_codes k;
        const void *alone;

        one.x = c->x + tk * c->cols;
        if (token_codes_make(&one, &k) != 0) {
            free(k.buf);
            bad++;
            break;
        }
        alone = c->kernels == TOKEN_X8 ? (const void *) &k.x8 : &k.x16;
        batch_dispatch(c, alone, 1, c->w, 0, y, 0, mid);
        batch_dispatch(c, alone, 1, c->w, 0, y, mid, rows);
        bad += memcmp(y, ref + tk * rows, (size_t) rows * sizeof(float))
               != 0;
        free(k.buf);
    }
    *interleaved = nalar_quant_can_interleave(c->t, c->cols);
    if (*interleaved) {
        il = malloc((size_t) nalar_quant_interleaved_bytes(c->t, rows,
                                                           c->cols));
        if (il == NULL) {
            bad++;
        } else {
            nalar_quant_interleave(c->t, c->w, rows, c->cols, il);
            batch_dispatch(c, all, n_tok, il, 1, y, 0, rows);
            bad += memcmp(y, ref, (size_t) (n_tok * rows) * sizeof(float))
                   != 0;
        }
    }
    free(il);
    return bad;
}


/* ------------------------------------------------------------------ */
/* windows of tokens, whole and ragged row ranges                       */


/* n tokens of rows outputs in y against want's: those not bit for bit
 * equal (a diag for the first, with tn, isa and n) */
static inline int
tokens_bad(const float *y, const float *want, int n, int64_t rows,
           const char *tn, int isa)
{
    int bad = 0;

    for (int64_t i = 0; i < n * rows; i++) {
        if (memcmp(&y[i], &want[i], sizeof(float)) != 0 && bad++ == 0) {
            diag("%s isa %d n %d tok %d row %d: %a, want %a", tn, isa, n,
                 (int) (i / rows), (int) (i % rows), (double) y[i],
                 (double) want[i]);
        }
    }
    return bad;
}


/* y's n tokens of rows outputs before a kernel adds a row range into
 * them: small integers, distinct from row to row */
static inline void
ragged_fill(float *y, int n, int64_t rows)
{
    for (int64_t i = 0; i < n * rows; i++) {
        y[i] = (float) (i % 7) - 3.0f;
    }
}


/* after rows [ra, rb) of n tokens were added into ragged_fill's y: those
 * rows' outputs not ragged_fill's value plus want's (the reference's for
 * the same tokens), bit for bit, and the other rows' not untouched */
static inline int
ragged_bad(const float *y, const float *want, int n, int64_t rows,
           int64_t ra, int64_t rb)
{
    int bad = 0;

    for (int k = 0; k < n; k++) {
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = k * rows + r;
            float   v = (float) (i % 7) - 3.0f;

            if (r >= ra && r < rb) {
                v = v + want[i];
            }
            bad += memcmp(&y[i], &v, sizeof(float)) != 0;
        }
    }
    return bad;
}


typedef struct tile_case tile_case;

/* tokens s .. s + n - 1 of the test's codes, rows [r0, r1) of m (c->w, or
 * it interleaved: layout lay 1) into y (n tokens of c->rows floats; +=
 * when acc): by the tiles alone on isa (dispatch 0: 0, or nonzero where
 * they did not run), or through the test's dispatch with isa forced
 * (dispatch 1: 0) */
typedef int tile_run_fn(const tile_case *c, int isa, int dispatch,
                        const uint8_t *m, int lay, int s, int n, float *y,
                        int64_t r0, int64_t r1, int acc);

/* the scalar reference's outputs of c's rows for its n_max tokens, into
 * ref (token k at k * rows) */
typedef void tile_ref_fn(const tile_case *c, float *ref);

/* one matrix against n_max tokens' codes */
struct tile_case {
    ggml_type      t;
    const uint8_t *w;        /* rows x cols weights of t, the file's order
                                (rows interleave: cols a multiple of 256) */
    int64_t        rs, rows, cols;
    int64_t        ra, rb;   /* the ragged range: 0 < ra < rb < rows */
    int            n_max;
    const void    *x;        /* n_max tokens' codes, as run and refer take
                                them */
    tile_ref_fn   *refer;
    tile_run_fn   *run;
};

/* on isa, every window of n = 1 .. n_max tokens (from token (5 n) mod
 * (n_max - n + 1)): the tiles alone from layout n % 2 and the dispatch
 * from the other, over all rows, and the tiles adding [ra, rb) of the
 * interleaved rows il into y, each output ref's bits; y: n_max * rows
 * floats of scratch.  Returns the bad outputs, *ran the tiles' runs that
 * ran (2 n_max when all did) */
static inline int
tile_windows_on(const tile_case *c, const uint8_t *il, const float *ref,
                int isa, float *y, int *ran)
{
    int64_t rows = c->rows;
    int     bad = 0;

    for (int n = 1; n <= c->n_max; n++) {
        int          s = (n * 5) % (c->n_max - n + 1);
        const float *want = ref + s * rows;

        for (int64_t i = 0; i < n * rows; i++) {
            y[i] = 1.0f;
        }
        *ran += c->run(c, isa, 0, n % 2 ? il : c->w, n % 2, s, n, y, 0,
                       rows, 0) == 0;
        bad += tokens_bad(y, want, n, rows, ggml_type_name(c->t), isa);

        (void) c->run(c, isa, 1, n % 2 ? c->w : il, 1 - n % 2, s, n, y, 0,
                      rows, 0);
        bad += tokens_bad(y, want, n, rows, ggml_type_name(c->t), isa);

        ragged_fill(y, n, rows);
        *ran += c->run(c, isa, 0, il, 1, s, n, y, c->ra, c->rb, 1) == 0;
        bad += ragged_bad(y, want, n, rows, c->ra, c->rb);
    }
    return bad;
}


/* tile_windows_on for each instruction set isa from AVX2 to this CPU's
 * widest: bad[isa] and ran[isa] (both NALAR_ISA_VNNI + 1 long).  Returns
 * 0, or -1 (a diag) when out of memory */
static inline int
tile_windows_bad(const tile_case *c, int *bad, int *ran)
{
    size_t   out = (size_t) (c->n_max * c->rows) * sizeof(float);
    uint8_t *il = malloc((size_t) nalar_quant_interleaved_bytes(c->t,
                                                                c->rows,
                                                                c->cols));
    float   *ref = malloc(out), *y = malloc(out);
    int      rc = 0;

    if (il == NULL || ref == NULL || y == NULL) {
        diag("%s tiles: out of memory", ggml_type_name(c->t));
        rc = -1;
    } else {
        nalar_quant_interleave(c->t, c->w, c->rows, c->cols, il);
        c->refer(c, ref);
        for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max();
             isa++)
        {
            /* a level this CPU lacks (AVX-VNNI on some AVX-512 CPUs) */
            if (!nalar_quant_isa_ok(isa)) {
                continue;
            }
            ran[isa] = 0;
            bad[isa] = tile_windows_on(c, il, ref, isa, y, &ran[isa]);
        }
    }
    free(il);
    free(ref);
    free(y);
    return rc;
}

#endif
