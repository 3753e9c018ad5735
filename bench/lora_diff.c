/*
 * Two model files compared tensor by tensor (bench/lora-peer.sh: a merged
 * model written by `nalar mkmodel --merge` against the one llama.cpp's
 * llama-export-lora writes from the same base and adapter).  For each
 * tensor of A, the tensor of B of that name must have A's shape; both are
 * read as floats (any type the engine reads), and the line says the
 * largest |a - b|, the largest |a| (the scale it is relative to), and,
 * where the types differ, the largest difference once A is rounded to B's
 * type (F16 or BF16), in units in the last place of that type: what
 * remains when the only difference is the type a merge writes.  Tensors
 * whose bytes are the same are counted, not listed.
 *   lora_diff A.gguf B.gguf
 * Exit status 0, or 1 when a tensor is missing or of another shape.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "fp16.h"
#include "gguf.h"
#include "model.h"


static nalar_mat
as_mat(const gguf_tensor *t)
{
    nalar_mat M;

    M.type = t->type;
    M.cols = (int64_t) t->ne[0];
    M.rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) {
        M.rows *= (int64_t) t->ne[d];
    }
    M.data = t->data;
    return M;
}


/* a rounded to type t (F16 or BF16) as a signed code: two codes' distance
 * is the distance in units in the last place (b, read from B, is of type
 * t already, so its code is its bits) */
static int32_t
code_of(float a, ggml_type t)
{
    uint16_t h = t == GGML_F16 ? nalar_f32_to_f16(a) : nalar_f32_to_bf16(a);
    int32_t  c = h & 0x7fff;

    return (h & 0x8000) ? -c : c;
}


/* One tensor pair: 0, or -1 when B has no such tensor or another shape. */
static int
one(const gguf_tensor *ta, const gguf_file *fb, double *worst,
    int64_t *worst_ulps, int *n_same)
{
    char               name[256];
    const gguf_tensor *tb;
    nalar_mat          A, B;
    float             *ra, *rb;
    double             d = 0, amax = 0;
    int64_t            ulps = 0;
    int                round = 0;

    snprintf(name, sizeof(name), "%.*s",
             (int) (ta->name.len < 255 ? ta->name.len : 255), ta->name.ptr);
    tb = gguf_tensor_find(fb, name);
    if (tb == NULL || tb->n_dims != ta->n_dims
        || memcmp(tb->ne, ta->ne, sizeof(ta->ne)) != 0)
    {
        printf("%-32s missing in B, or of another shape\n", name);
        return -1;
    }
    if (tb->type == ta->type && tb->nbytes == ta->nbytes
        && memcmp(tb->data, ta->data, ta->nbytes) == 0)
    {
        (*n_same)++;
        return 0;
    }
    A = as_mat(ta);
    B = as_mat(tb);
    round = ta->type != tb->type
            && (tb->type == GGML_F16 || tb->type == GGML_BF16);
    ra = malloc((size_t) A.cols * sizeof(float));
    rb = malloc((size_t) A.cols * sizeof(float));
    if (ra == NULL || rb == NULL) {
        free(ra);
        free(rb);
        printf("%-32s out of memory\n", name);
        return -1;
    }
    for (int64_t r = 0; r < A.rows; r++) {
        nalar_cpu_get_row(&A, r, ra);
        nalar_cpu_get_row(&B, r, rb);
        for (int64_t c = 0; c < A.cols; c++) {
            double e = fabs((double) ra[c] - rb[c]);

            d = e > d ? e : d;
            amax = fabs(ra[c]) > amax ? fabs(ra[c]) : amax;
            if (round) {
                int64_t u = llabs((int64_t) code_of(ra[c], tb->type)
                                  - code_of(rb[c], tb->type));

                ulps = u > ulps ? u : ulps;
            }
        }
    }
    free(ra);
    free(rb);
    printf("%-32s %-4s vs %-4s max |a - b| %.3g (max |a| %.3g)", name,
           ggml_type_name(ta->type), ggml_type_name(tb->type), d, amax);
    if (round) {
        printf(", A rounded to %s: %lld ulp", ggml_type_name(tb->type),
               (long long) ulps);
    }
    printf("\n");
    *worst = d > *worst ? d : *worst;
    *worst_ulps = ulps > *worst_ulps ? ulps : *worst_ulps;
    return 0;
}


int
main(int argc, char **argv)
{
    gguf_file *fa, *fb;
    nalar_err  err;
    double     worst = 0;
    int64_t    ulps = 0;
    int        rc = 0, n_same = 0;

    if (argc != 3) {
        fprintf(stderr, "usage: lora_diff A.gguf B.gguf\n");
        return 2;
    }
    fa = gguf_open(argv[1], &err);
    fb = fa != NULL ? gguf_open(argv[2], &err) : NULL;
    if (fb == NULL) {
        fprintf(stderr, "lora_diff: %s\n", err.msg);
        gguf_close(fa);
        return 2;
    }
    for (uint64_t i = 0; i < fa->n_tensors; i++) {
        rc |= one(&fa->tensors[i], fb, &worst, &ulps, &n_same);
    }
    printf("%llu tensors: %d with the same bytes; max |a - b| over the "
           "others %.3g; A rounded to B's type: at most %lld ulp\n",
           (unsigned long long) fa->n_tensors, n_same, worst,
           (long long) ulps);
    gguf_close(fa);
    gguf_close(fb);
    return rc != 0;
}
