/*
 * One token's products with 16-bit activations, four rows at a time
 * (cpu_quant_x16.h): decode's kernels.
 */
#include <stddef.h>
#include <stdint.h>

#include "cpu_quant.h"
#include "cpu_quant_x16.h"


int
nalar_quant_x16_rows(ggml_type t, int isa, const uint8_t *w, int64_t wstride,
                     int il, int64_t cols, const nalar_xq16 *x16, float *y,
                     int64_t r0, int64_t r1, int accumulate)
{
    (void) t;
    (void) isa;
    (void) w;
    (void) wstride;
    (void) il;
    (void) cols;
    (void) x16;
    (void) y;
    (void) r0;
    (void) r1;
    (void) accumulate;
    return -1;
}
