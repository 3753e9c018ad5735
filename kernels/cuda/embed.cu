/*
 * Embedding gather, one block per token.
 */
#include "embed.cuh"
#include "gemv_kq.cuh"


static __global__ void
embed_kernel(ggml_type type, const void *data, const uint16_t *scales,
             int64_t rows, int64_t cols, const int32_t *tokens, float *out,
             int64_t ld_out)
{
    int32_t t = blockIdx.x;
    int32_t id = tokens[t];
    float  *o = out + (int64_t) t * ld_out;

    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
        int64_t i = (int64_t) id * cols + k;
        float   v;

        if (id < 0 || id >= rows) {
            o[k] = __int_as_float(0x7fc00000);
            continue;
        }
        switch (type) {
        case GGML_F32:  v = ((const float *) data)[i]; break;
        case GGML_F16:  v = f16_to_f32(((const uint16_t *) data)[i]); break;
        case GGML_BF16: v = bf16_to_f32(((const uint16_t *) data)[i]); break;
        default:        /* Q8_0, repacked */
            v = f16_to_f32(scales[i / QK8_0])
                * (float) ((const int8_t *) data)[i];
            break;
        }
        o[k] = v;
    }
}


int
nalar_cuda_embed(nalar_cuda_ctx *c, const nalar_cuda_mat *E,
                 const int32_t *tokens, int32_t n, float *out, int64_t ld_out,
                 nalar_err *err)
{
    if (n == 0) {
        return 0;
    }
    if (E != NULL && nalar_cuda_kq_type(E->type)) {
        return nalar_cuda_kq_embed(c, E, tokens, n, out, ld_out, err);
    }
    if (E == NULL || E->data == NULL || tokens == NULL || out == NULL
        || n < 0 || ld_out < E->cols
        || (E->type == GGML_Q8_0 && (E->scales == NULL
                                     || E->cols % QK8_0 != 0))
        || (E->type != GGML_F32 && E->type != GGML_F16
            && E->type != GGML_BF16 && E->type != GGML_Q8_0))
    {
        return nalar_fail(err, "cuda embed: bad arguments (n %d, type %d, "
                          "ld_out %lld)", n, E != NULL ? (int) E->type : -1,
                          (long long) ld_out);
    }
    embed_kernel<<<n, 256, 0, c->stream>>>(E->type, E->data, E->scales,
                                           E->rows, E->cols, tokens, out,
                                           ld_out);
    CUDA_CHECK_LAUNCH(err);
    return 0;
}
