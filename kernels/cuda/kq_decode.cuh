/*
 * ggml's block types decoded 8 weights at a time, exactly as the CPU
 * dequantizes them (nalar_dequant_row: a * q - m rounded after each
 * operation, never fused), for gemv_kq.cu's kernels.  The same code also
 * builds as host C++ (t/gpu/kq_decode_host.cc), which holds it to the
 * CPU's values on every block-type tensor of the conformance kit and on
 * random blocks, with no GPU.
 */
#ifndef NALAR_CUDA_KQ_DECODE_CUH
#define NALAR_CUDA_KQ_DECODE_CUH

#include <stdint.h>

#ifdef __CUDACC__
#include "common.cuh"
#define KQ_FN         static __device__ __forceinline__
#define KQ_UNROLL     _Pragma("unroll")
#define KQ_MUL(a, b)  __fmul_rn(a, b)
#define KQ_SUB(a, b)  __fsub_rn(a, b)
#define KQ_F16(h)     f16_to_f32(h)
#else
extern "C" {
#include "fp16.h"
#include "gguf.h"
}
#define KQ_FN         static inline
#define KQ_UNROLL
#define KQ_MUL(a, b)  ((a) * (b))    /* built with -ffp-contract=off */
#define KQ_SUB(a, b)  ((a) - (b))
#define KQ_F16(h)     nalar_f16_to_f32((uint16_t) (h))
#endif


KQ_FN float
ld_f16(const uint8_t *p)
{
    return KQ_F16((uint32_t) p[0] | ((uint32_t) p[1] << 8));
}


/* sub-block j's 6-bit scale and min of a Q4_K/Q5_K block's scales[12] */
KQ_FN void
k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}


/* weights c .. c + 7 (c a multiple of 8) of a row, exactly */
template <ggml_type T>
KQ_FN void
dequant8(const uint8_t *row, int64_t c, float *w)
{
    if constexpr (T == GGML_Q4_0) {
        const uint8_t *b = row + (c / 32) * 18;
        int            o = (int) (c % 32);
        float          d = ld_f16(b);

KQ_UNROLL
        for (int i = 0; i < 8; i++) {
            int q = o < 16 ? (b[2 + o + i] & 0xF) : (b[2 + o - 16 + i] >> 4);

            w[i] = (float) (q - 8) * d;
        }
    } else if constexpr (T == GGML_Q4_K || T == GGML_Q5_K) {
        const int      nb = T == GGML_Q4_K ? QK4_K_BYTES : QK5_K_BYTES;
        const uint8_t *b = row + (c / QK_K) * nb;
        int            o = (int) (c % QK_K), j = o / 32, k = o / 64;
        int            l0 = o % 32, sc, m;
        const uint8_t *qs = b + (T == GGML_Q4_K ? 16 : 48) + 32 * k;
        float          a, mn;

        k4_scale_min(b + 4, j, &sc, &m);
        a = ld_f16(b) * (float) sc;
        mn = ld_f16(b + 2) * (float) m;
KQ_UNROLL
        for (int i = 0; i < 8; i++) {
            int q = (j & 1) ? qs[l0 + i] >> 4 : qs[l0 + i] & 0xF;

            if constexpr (T == GGML_Q5_K) {
                q += ((b[16 + l0 + i] >> j) & 1) << 4;
            }
            /* no contraction: the bits of the CPU's a * q - mn */
            w[i] = KQ_SUB(KQ_MUL(a, (float) q), mn);
        }
    } else {    /* GGML_Q6_K */
        const uint8_t *b = row + (c / QK_K) * QK6_K_BYTES;
        int            o = (int) (c % QK_K), h = o / 128, g = (o % 128) / 32;
        int            l0 = o % 32;
        const uint8_t *ql = b + 64 * h + (g & 1) * 32;
        const uint8_t *qh = b + 128 + 32 * h;
        float          d = ld_f16(b + 208);

KQ_UNROLL
        for (int i = 0; i < 8; i++) {
            int l = l0 + i;
            int lo = g < 2 ? ql[l] & 0xF : ql[l] >> 4;
            int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
            int is = 8 * h + l / 16 + 2 * g;

            w[i] = d * (float) (int8_t) b[192 + is] * (float) q;
        }
    }
}

#endif
