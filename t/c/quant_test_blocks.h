/*
 * What the quantized kernels' unit tests share: a xorshift generator over
 * the includer's `rng_state` (each test keeps its own seed: define
 * `static uint64_t rng_state` before including), and weight matrices of
 * every block type, from the quantizer or hostile (random bytes with
 * extreme f16 scales, or every code and scale at its largest magnitude).
 */
#ifndef NALAR_T_QUANT_TEST_BLOCKS_H
#define NALAR_T_QUANT_TEST_BLOCKS_H

#include <stdint.h>
#include <stdlib.h>

#include "cpu_quant.h"
#include "gguf.h"

static inline uint64_t
rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}


static inline float
frand(void)
{
    return (float) ((double) (rnd() >> 11) / 9007199254740992.0) * 2.0f
           - 1.0f;
}


/* the f16 fields of a block (scales, mins) */
static inline void
f16_fields(ggml_type t, int *off, int *n)
{
    switch (t) {
    case GGML_Q8_0:
    case GGML_Q4_0: off[0] = 0; *n = 1; return;
    case GGML_Q4_K:
    case GGML_Q5_K: off[0] = 0; off[1] = 2; *n = 2; return;
    default:        off[0] = 208; *n = 1; return;   /* Q6_K */
    }
}


/* an extreme f16 scale: the largest finite, the smallest subnormal,
 * the smallest normal, their negatives, zero, one */
static inline uint16_t
extreme_f16(void)
{
    static const uint16_t v[] = { 0x7bff, 0x0001, 0x0400, 0xfbff, 0x8001,
                                  0x0000, 0x3c00, 0x5bff };

    return v[rnd() % (sizeof(v) / sizeof(v[0]))];
}


/* rows x cols weights: from the quantizer (kind 0), random bytes with
 * extreme scales (kind 1), or every code and scale at its largest
 * magnitude (kind 2: Q8_0's codes -128, Q4_0's -8, the K-quants' codes
 * and 6-bit scales and mins all ones, Q6_K's scales -128; f16 fields
 * one) */
static inline uint8_t *
matrix(ggml_type t, int64_t rows, int64_t cols, int kind)
{
    int64_t  rs = (int64_t) ggml_row_size(t, (uint64_t) cols);
    int64_t  qk = nalar_quant_block(t), bytes = rs / (cols / qk);
    uint8_t *w = malloc((size_t) (rows * rs));
    float   *x = malloc((size_t) cols * sizeof(float));

    if (w == NULL || x == NULL) {
        free(w);
        free(x);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        if (kind == 0) {
            float s = (float) (1 + r % 5) * 0.1f;
            float o = r % 3 == 0 ? 1.0f : 0.0f;

            for (int64_t c = 0; c < cols; c++) {
                x[c] = (frand() + o) * s;
            }
            (void) nalar_quantize_row(t, x, cols, w + r * rs);
            continue;
        }
        for (int64_t i = 0; i < rs; i++) {
            w[r * rs + i] = kind == 1 ? (uint8_t) rnd()
                            : t == GGML_Q8_0 ? 0x80 : t == GGML_Q4_0 ? 0
                            : t == GGML_Q6_K && i % bytes >= 192 ? 0x80
                            : 0xff;
        }
        for (int64_t b = 0; b < cols / qk; b++) {
            int off[2], n;

            f16_fields(t, off, &n);
            for (int k = 0; k < n; k++) {
                uint16_t h = kind == 2 ? 0x3c00 : extreme_f16();

                memcpy(w + r * rs + b * bytes + off[k], &h, 2);
            }
        }
    }
    free(x);
    return w;
}

#endif
