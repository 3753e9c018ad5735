/*
 * A branch-free exp for the non-positive arguments of a softmax.
 */
#ifndef NALAR_EXP_NEG_H
#define NALAR_EXP_NEG_H

#include <stdint.h>

/*
 * exp(x) for x <= 0, within a few ulp of expf (Cody-Waite reduction to
 * x = n ln2 + r, |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, 2^n put
 * straight into the exponent bits).  Branch-free, so a loop over it
 * vectorises; glibc's expf does not, and it dominated the sampler and then
 * the CPU attention's softmax.  exp(0) is
 * exactly 1 (the top candidate's weight); below -87.3 it flushes to 0.
 */
static inline float
nalar_exp_neg(float x)
{
    union { float f; int32_t i; } b;
    float xc = x > -87.3f ? x : -87.3f;
    float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round */
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;

    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    b.i = ((int32_t) n + 127) << 23;
    return x > -87.3f ? p * b.f : 0.0f;
}

#endif
