/*
 * Quantizers of rows into the block formats (for `nalar mkmodel` and the
 * tests): a plain min/max fit per sub-block, scales rounded to their
 * stored width, then every weight rounded to the nearest code.
 */
#include <math.h>
#include <string.h>

#include "cpu_quant.h"
#include "cpu_quant_blocks.h"
#include "fp16.h"


static uint16_t
put_f16(uint8_t *p, float v)
{
    uint16_t h = nalar_f32_to_f16(v);

    memcpy(p, &h, 2);
    return h;
}


static int
clampi(float v, int lo, int hi)
{
    int i = (int) lrintf(v);

    return i < lo ? lo : i > hi ? hi : i;
}


static void
quant_q8_0(const float *x, uint8_t *p)
{
    float amax = 0, d;

    for (int i = 0; i < QK8_0; i++) {
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    }
    d = nalar_f16_to_f32(put_f16(p, amax / 127.0f));
    for (int i = 0; i < QK8_0; i++) {
        p[2 + i] = (uint8_t) (int8_t) (d != 0 ? clampi(x[i] / d, -127, 127)
                                              : 0);
    }
}


static void
quant_q4_0(const float *x, uint8_t *p)
{
    float amax = 0, m = 0, d;

    for (int i = 0; i < QK4_0; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    d = nalar_f16_to_f32(put_f16(p, m / -8.0f));
    for (int l = 0; l < 16; l++) {
        int lo = d != 0 ? clampi(x[l] / d + 8.0f, 0, 15) : 8;
        int hi = d != 0 ? clampi(x[l + 16] / d + 8.0f, 0, 15) : 8;

        p[2 + l] = (uint8_t) (lo | (hi << 4));
    }
}


/* Q4_K (levels 15) or Q5_K (levels 31): 8 sub-blocks of 32 */
static void
quant_k45(const float *x, uint8_t *p, int q5)
{
    float    sc[8], mn[8], maxs = 0, maxm = 0, d, dmin;
    int      is[8], im[8], levels = q5 ? 31 : 15;
    uint8_t *s = p + 4, *qh = p + 16, *qs = q5 ? p + 48 : p + 16;

    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = x[32 * j];

        for (int i = 0; i < 32; i++) {
            lo = x[32 * j + i] < lo ? x[32 * j + i] : lo;
            hi = x[32 * j + i] > hi ? x[32 * j + i] : hi;
        }
        hi = hi > lo ? hi : lo;
        sc[j] = (hi - lo) / (float) levels;
        mn[j] = -lo;
        maxs = sc[j] > maxs ? sc[j] : maxs;
        maxm = mn[j] > maxm ? mn[j] : maxm;
    }
    d = nalar_f16_to_f32(put_f16(p, maxs / 63.0f));
    dmin = nalar_f16_to_f32(put_f16(p + 2, maxm / 63.0f));
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        is[j] = d > 0 ? clampi(sc[j] / d, 0, 63) : 0;
        im[j] = dmin > 0 ? clampi(mn[j] / dmin, 0, 63) : 0;
        if (j < 4) {
            s[j] = (uint8_t) is[j];
            s[j + 4] = (uint8_t) im[j];
        } else {
            s[j + 4] = (uint8_t) ((is[j] & 0xF) | ((im[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t) ((is[j] >> 4) << 6);
            s[j] |= (uint8_t) ((im[j] >> 4) << 6);
        }
    }
    if (q5) {
        memset(qh, 0, 32);
    }
    for (int k = 0; k < 4; k++) {
        for (int l = 0; l < 32; l++) {
            int v[2];

            for (int h = 0; h < 2; h++) {
                int   j = 2 * k + h;
                float a = d * (float) is[j], b = dmin * (float) im[j];

                v[h] = a > 0 ? clampi((x[32 * j + l] + b) / a, 0, levels)
                             : 0;
                if (q5 && v[h] > 15) {
                    qh[l] |= (uint8_t) (1 << j);
                }
            }
            qs[32 * k + l] = (uint8_t) ((v[0] & 0xF) | ((v[1] & 0xF) << 4));
        }
    }
}


/* Q6_K: 16 sub-blocks of 16, signed codes -32 .. 31 */
static void
quant_q6_k(const float *x, uint8_t *p)
{
    float   sc[16], maxs = 0, d;
    int     is[16], q[QK_K];
    uint8_t *ql = p, *qh = p + 128;
    int8_t  *s = (int8_t *) (p + 192);

    for (int j = 0; j < 16; j++) {
        float amax = 0, m = 0;

        for (int i = 0; i < 16; i++) {
            if (fabsf(x[16 * j + i]) > amax) {
                amax = fabsf(x[16 * j + i]);
                m = x[16 * j + i];
            }
        }
        sc[j] = m / -32.0f;
        maxs = fabsf(sc[j]) > maxs ? fabsf(sc[j]) : maxs;
    }
    d = nalar_f16_to_f32(put_f16(p + 208, maxs / 127.0f));
    for (int j = 0; j < 16; j++) {
        float a;

        is[j] = d > 0 ? clampi(sc[j] / d, -127, 127) : 0;
        s[j] = (int8_t) is[j];
        a = d * (float) is[j];
        for (int i = 0; i < 16; i++) {
            q[16 * j + i] = (a != 0 ? clampi(x[16 * j + i] / a, -32, 31) : 0)
                            + 32;
        }
    }
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            const int *v = q + 128 * h + l;

            ql[64 * h + l] = (uint8_t) ((v[0] & 0xF) | ((v[64] & 0xF) << 4));
            ql[64 * h + l + 32] = (uint8_t) ((v[32] & 0xF)
                                             | ((v[96] & 0xF) << 4));
            qh[32 * h + l] = (uint8_t) ((v[0] >> 4) | ((v[32] >> 4) << 2)
                                        | ((v[64] >> 4) << 4)
                                        | ((v[96] >> 4) << 6));
        }
    }
}


int
nalar_quantize_row(ggml_type t, const float *x, int64_t n, void *dst)
{
    qinfo    qi;
    uint8_t *p = dst;

    if (qinfo_of(t, &qi) != 0 || n % qi.qk != 0) {
        return -1;
    }
    for (int64_t i = 0; i < n; i += qi.qk, p += qi.bytes) {
        switch (t) {
        case GGML_Q8_0: quant_q8_0(x + i, p); break;
        case GGML_Q4_0: quant_q4_0(x + i, p); break;
        case GGML_Q4_K: quant_k45(x + i, p, 0); break;
        case GGML_Q5_K: quant_k45(x + i, p, 1); break;
        default:        quant_q6_k(x + i, p); break;
        }
    }
    return 0;
}
