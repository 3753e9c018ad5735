/*
 * The CPU backend's 16-bit KV elements (kernels/cpu/cpu_kv16.h), on the
 * instruction set this file is compiled for: the Makefile builds it for
 * the machine (AVX-512 here), for AVX2 with F16C, for AVX2 without F16C
 * and for x86-64-v2 (no vectors), and t/53-kv16-paths.t runs each copy
 * the machine can run.  Each copy checks that a store rounds every kind
 * of float as the scalar nearest-even functions do, bit for bit, and that
 * the vector loads widen to kv_get's floats, so attention computes the
 * same numbers on every instruction set.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kv16.h"
#include "fp16.h"
#include "tap.h"


/*
 * A 16-bit pool's elements are rounded once, on store, by kv16_narrow:
 * its vector conversions give the scalar rounding's bits (nalar_f32_to_f16,
 * nalar_f32_to_bf16: to nearest, ties to even) for every float -- normal,
 * subnormal, at and past the largest half, signed zeros and infinities --
 * and a NaN for a NaN; and kv_get widens them back exactly.
 */
static void
check_narrowing(void)
{
    enum { N = 4096 };
    static float    x[N];
    static uint16_t got[N];
    uint64_t        s = 0x9e3779b97f4a7c15ULL;
    static const uint32_t edge[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x00000001u,
        0x33000000u, 0x33000001u, 0x387fe000u, 0x387ff000u, 0x38800000u,
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x3f808000u,
        0x3f818000u, 0x3f80c000u, 0x7f7fffffu, 0x00800000u, 0x3f7fffffu,
    };

    for (int kind = KV_F16; kind <= KV_BF16; kind++) {
        int bad = 0, nan_bad = 0, wide_bad = 0;

        for (int rep = 0; rep < 64; rep++) {
            for (int i = 0; i < N; i++) {
                uint32_t u;

                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                u = (uint32_t) (s >> 32);
                /* every exponent, and the values near the halves' range */
                if (i % 4 == 1) {
                    u = (u & 0x807fffffu) | ((uint32_t) (96 + i % 48) << 23);
                }
                if (i < (int) (sizeof(edge) / sizeof(edge[0]))) {
                    u = edge[i] ^ (rep & 1 ? 0x80000000u : 0);
                }
                x[i] = nalar_bits_f32(u);
            }
            /* an odd count and offset: the vector body and the tail */
            kv16_narrow(got + 1, x + 1, N - 3, kind);
            for (int i = 1; i < N - 2; i++) {
                uint16_t want = kind == KV_F16 ? nalar_f32_to_f16(x[i])
                                               : nalar_f32_to_bf16(x[i]);
                float    w = kv_get(got, i, kind);

                if (isnan(x[i])) {
                    nan_bad += !isnan(w);
                } else {
                    bad += got[i] != want;
                    wide_bad += nalar_f32_bits(w)
                                != nalar_f32_bits(kind == KV_F16
                                                  ? nalar_f16_to_f32(want)
                                                  : nalar_bf16_to_f32(want));
                }
            }
        }
        ok(bad == 0 && nan_bad == 0 && wide_bad == 0, "%s: the stores' "
           "rounding is nearest-even's, bit for bit, on 262,000 floats "
           "(%d differ, %d NaNs lost, %d widened wrong)",
           kind == KV_F16 ? "F16" : "BF16", bad, nan_bad, wide_bad);
    }
}


/* the vector loads (16 and 8 elements, any offset) widen to kv_get's
 * floats, for every 16-bit pattern and F32 values */
static void
check_loads(void)
{
    enum { N = 65536 + 40 };
    static uint16_t h[N];
    static float    f[N];
    const char     *isa = "scalar";

    for (int i = 0; i < N; i++) {
        h[i] = (uint16_t) (i * 40503u);         /* every pattern, shuffled */
        f[i] = (float) i * 0.37f - 5000.0f;
    }
#if defined(__AVX512F__)
    isa = "AVX-512";
#elif defined(__AVX2__) && defined(__F16C__)
    isa = "AVX2 + F16C";
#elif defined(__AVX2__)
    isa = "AVX2, no F16C";
#endif
    for (int kind = KV_F32; kind <= KV_BF16; kind++) {
        const void *base = kind == KV_F32 ? (const void *) f : h;
        int         bad = 0, n = 0;

        for (int i = 0; i + 16 <= N; i += 13) {
            float got[16];

#if defined(__AVX512F__)
            _mm512_storeu_ps(got, kv_load16(base, i, kind));
#elif defined(__AVX2__)
            _mm256_storeu_ps(got, kv_load8(base, i, kind));
            _mm256_storeu_ps(got + 8, kv_load8(base, i + 8, kind));
#else
            for (int k = 0; k < 16; k++) {
                got[k] = kv_get(base, i + k, kind);
            }
#endif
            for (int k = 0; k < 16; k++) {
                float want = kv_get(base, i + k, kind);

                n++;
                bad += !(isnan(want) ? isnan(got[k])
                         : nalar_f32_bits(got[k]) == nalar_f32_bits(want));
            }
        }
        ok(bad == 0, "%s loads of %s elements widen as kv_get does "
           "(%d of %d differ)", isa,
           kind == KV_F32 ? "F32" : kind == KV_F16 ? "F16" : "BF16", bad, n);
    }
}


int
main(void)
{
    check_narrowing();
    check_loads();
    return done_testing();
}
