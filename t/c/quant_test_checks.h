/*
 * Checks the quantized kernels' unit tests share: one token's rows
 * kernels over splits of the rows (test_quant_q8.c, test_quant_x16.c,
 * test_quant_pairs_rows.c), and products of windows of tokens against the
 * scalar reference's, over all rows and over a ragged range added into y
 * (test_quant_q8.c, test_quant_x16_tiles.c, test_quant_pairs_k6.c).
 * Each test supplies its kernels as a run function over its own codes;
 * each check returns the outputs that are not the reference's bits (a
 * diag for the first), for the test's ok().
 */
#ifndef NALAR_T_QUANT_TEST_CHECKS_H
#define NALAR_T_QUANT_TEST_CHECKS_H

#include <stdint.h>
#include <string.h>

#include "cpu_quant.h"
#include "gguf.h"
#include "tap.h"

/* ------------------------------------------------------------------ */
/* one token, rows in splits                                            */


typedef struct token_case token_case;

/* one token's product of rows [r0, r1) of m (c->w or c->il, layout lay:
 * 0 the file's order, 1 interleaved) into y (y[r] += when acc, else =),
 * on isa (also forced, nalar_quant_q8_force, while it runs): 0, or
 * nonzero where the kernel did not run */
typedef int token_run_fn(const token_case *c, int isa, const uint8_t *m,
                         int lay, float *y, int64_t r0, int64_t r1, int acc);

/* one matrix against one token's codes */
struct token_case {
    ggml_type      t;
    const uint8_t *w;     /* rows x cols weights of t, the file's order */
    const uint8_t *il;    /* the same interleaved, or NULL: not run */
    int64_t        rs, rows, cols;
    const void    *x;     /* the token's codes, as run takes them */
    const float   *ref;   /* the rows' outputs of the scalar reference */
    token_run_fn  *run;
};

/* every instruction set from AVX2 to this CPU's widest, both layouts, each
 * split, added to y or not: each row a range covers the reference's bits
 * (plus y's 1 when added), the rows before them untouched; y: rows floats
 * of scratch.  Returns the bad outputs (every output of a run that did not
 * run), *runs the runs made (none where the CPU has no AVX2) */
static inline int
token_splits_bad(const token_case *c, float *y, int *runs)
{
    /* the ranges' cut points: one range; 0-5, 5-end; 0-2, 2-9, 9-end;
     * 1-3, 3-end (none on a turn of four rows but 0; row 0 before 1-3
     * untouched) */
    static const int64_t cut[][3] = { { 0, -1, -1 }, { 0, 5, -1 },
                                      { 0, 2, 9 }, { 1, 3, -1 } };
    int                  bad = 0;

    for (int isa = NALAR_ISA_AVX2; isa <= nalar_quant_q8_isa_max(); isa++) {
        for (int lay = 0; lay < 2; lay++) {
            const uint8_t *m = lay ? c->il : c->w;

            if (m == NULL) {
                continue;
            }
            for (int k = 0; k < (int) (sizeof(cut) / sizeof(cut[0])); k++) {
                for (int acc = 0; acc < 2; acc++) {
                    float   y0 = acc ? 1.0f : -7.0f;
                    int64_t a = cut[k][0];
                    int     rc = 0;

                    for (int64_t r = 0; r < c->rows; r++) {
                        y[r] = y0;
                    }
                    nalar_quant_q8_force(isa);
                    for (int j = 0; j < 3 && a < c->rows; j++) {
                        int64_t e = j + 1 < 3 && cut[k][j + 1] > 0
                                    && cut[k][j + 1] < c->rows
                                    ? cut[k][j + 1] : c->rows;

                        rc |= c->run(c, isa, m, lay, y, a, e, acc);
                        a = e;
                    }
                    nalar_quant_q8_force(-1);
                    for (int64_t r = 0; r < c->rows; r++) {
                        float want = r < cut[k][0] ? y0
                                     : acc ? 1.0f + c->ref[r] : c->ref[r];

                        if ((rc != 0 || memcmp(&y[r], &want, sizeof(float)))
                            && bad++ == 0)
                        {
                            diag("%s isa %d layout %d split %d acc %d row "
                                 "%lld: %a, want %a (rc %d)",
                                 ggml_type_name(c->t), isa, lay, k, acc,
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

/* tokens s .. s + n - 1 of the test's codes, rows [r0, r1) of m (c->w or
 * c->il, layout lay) into y (n tokens of c->rows floats; += when acc):
 * by the tiles alone on isa (dispatch 0: 0, or nonzero where they did not
 * run), or through the test's dispatch with isa forced (dispatch 1: 0) */
typedef int tile_run_fn(const tile_case *c, int isa, int dispatch,
                        const uint8_t *m, int lay, int s, int n, float *y,
                        int64_t r0, int64_t r1, int acc);

/* one matrix against n_max tokens' codes */
struct tile_case {
    ggml_type      t;
    const uint8_t *w, *il;    /* rows x cols weights: the file's order,
                                 interleaved */
    int64_t        rs, rows, cols;
    int64_t        ra, rb;    /* the ragged range: 0 < ra < rb < rows */
    int            n_max;
    const void    *x;         /* n_max tokens' codes, as run takes them */
    const float   *ref;       /* n_max tokens' reference outputs */
    tile_run_fn   *run;
};

/* on isa, every window of n = 1 .. n_max tokens (from token (5 n) mod
 * (n_max - n + 1)): the tiles alone from layout n % 2 and the dispatch
 * from the other, over all rows, and the tiles adding [ra, rb) of the
 * interleaved rows into y, each output the reference's bits; y: n_max *
 * rows floats of scratch.  Returns the bad outputs, *ran the tiles' runs
 * that ran (2 n_max when all did) */
static inline int
tile_windows_bad(const tile_case *c, int isa, float *y, int *ran)
{
    int64_t rows = c->rows;
    int     bad = 0;

    for (int n = 1; n <= c->n_max; n++) {
        int          s = (n * 5) % (c->n_max - n + 1);
        const float *want = c->ref + s * rows;

        for (int64_t i = 0; i < n * rows; i++) {
            y[i] = 1.0f;
        }
        *ran += c->run(c, isa, 0, n % 2 ? c->il : c->w, n % 2, s, n, y, 0,
                       rows, 0) == 0;
        bad += tokens_bad(y, want, n, rows, ggml_type_name(c->t), isa);

        (void) c->run(c, isa, 1, n % 2 ? c->w : c->il, 1 - n % 2, s, n, y,
                      0, rows, 0);
        bad += tokens_bad(y, want, n, rows, ggml_type_name(c->t), isa);

        ragged_fill(y, n, rows);
        *ran += c->run(c, isa, 0, c->il, 1, s, n, y, c->ra, c->rb, 1) == 0;
        bad += ragged_bad(y, want, n, rows, c->ra, c->rb);
    }
    return bad;
}

#endif
