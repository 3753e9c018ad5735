/*
 * nalar-cuda-check: every CUDA op against a CPU reference on random inputs
 * of realistic and awkward shapes, then greedy generation with the CUDA
 * backend against the CPU backend, token for token.
 *
 *   build/nalar-cuda-check [--require-gpu] [--ops-only] [--models DIR]
 *                          [--conformance DIR]
 *
 * The model conformance kit's files (t/data/conformance) run teacher-forced
 * on the CUDA backend with FP32 activations: the logits at the reference's
 * top-16 ids of every position must be within the kit's tolerance for the
 * file's type, and the greedy ids equal the CPU backend's.
 *
 * Outputs are poisoned (all bits set: NaN) before every run, so an element
 * a kernel forgets to write fails the check.  Errors are normalised:
 * ||got - ref||_2 / ||ref||_2 over the output, with the reference computed
 * in double from the same (already rounded) inputs; thresholds are per
 * path: FP32-activation kernels 2e-5, cuBLAS with activations rounded to
 * F16 3e-3, to BF16 2e-2.
 *
 * Exit status: 0 all passed, 1 a check failed, 77 no GPU (skipped; with
 * --require-gpu that is a failure).
 */
#include "cuda_check.h"

int            n_pass, n_fail;
nalar_cuda_ctx C;

int kv_bf16;


static uint64_t       rng_state = 0x243f6a8885a308d3ull;


/* --- small helpers (a check program: failing to allocate ends it) --- */

void
die(const char *what, const char *msg)
{
    fprintf(stderr, "nalar-cuda-check: %s: %s\n", what, msg);
    exit(1);
}


void
cu(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        die(what, cudaGetErrorString(e));
    }
}


void
op(int rc, nalar_err *err)
{
    if (rc != 0) {
        die("op", err->msg);
    }
}


uint64_t
rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}


float
frand(void)
{
    return (float) (rnd() >> 40) * (2.0f / 16777216.0f) - 1.0f;
}


void *
xmalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);

    if (p == NULL) {
        die("malloc", "out of memory");
    }
    return p;
}


void *
dnew(size_t bytes)
{
    void *p;

    cu(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc");
    return p;
}


/* a cudaMemcpy from pageable memory may return before its DMA has
 * landed, and the ops' stream does not wait for it */
void
upload_done(void)
{
    cu(cudaDeviceSynchronize(), "upload");
}


void *
dup_to_dev(const void *h, size_t bytes)
{
    void *d = dnew(bytes);

    cu(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload");
    upload_done();
    return d;
}


/* outputs filled with NaN before an op writes them; on the ops' stream,
 * which does not wait for the legacy default stream */
void
poison(void *d, size_t bytes)
{
    cu(cudaMemsetAsync(d, 0xff, bytes, C.stream), "poison");
}


void
fetch(void *h, const void *d, size_t bytes)
{
    cu(cudaStreamSynchronize(C.stream), "kernel");
    cu(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "download");
}


/* ||got - ref|| / ||ref||; a NaN anywhere is infinitely wrong */
double
nerr(const float *got, const double *ref, int64_t n)
{
    double num = 0, den = 0;

    for (int64_t i = 0; i < n; i++) {
        double d = (double) got[i] - ref[i];

        if (isnan(got[i])) {
            return INFINITY;
        }
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}


void
report(const char *opname, const char *shape, double e, double thr)
{
    int good = e <= thr;

    if (good) {
        n_pass++;
    } else {
        n_fail++;
    }
    printf("%-4s %-14s %-58s err %.2e (max %.0e)\n", good ? "ok" : "FAIL",
           opname, shape, e, thr);
}


void
report_eq(const char *opname, const char *shape, int good, const char *why)
{
    if (good) {
        n_pass++;
    } else {
        n_fail++;
    }
    printf("%-4s %-14s %-58s %s\n", good ? "ok" : "FAIL", opname, shape,
           good ? "exact" : why);
}


/* --- argmax --- */

static void
check_argmax(void)
{
    enum { NR = 12 };
    int32_t   big = 128256;
    float    *l = xmalloc((size_t) NR * big * sizeof(float));
    int32_t   ids[NR], *dids, bad = 0;
    float    *dl;
    nalar_err err;

    /* argmax: ties to the lowest id, NaN never wins, all-NaN gives 0 */
    for (int r = 0; r < NR; r++) {
        for (int32_t i = 0; i < big; i++) {
            l[(int64_t) r * big + i] = frand() * 10.0f;
        }
    }
    l[(int64_t) 1 * big + 5] = 50.0f;
    l[(int64_t) 1 * big + 70000] = 50.0f;      /* tie: 5 wins */
    l[(int64_t) 2 * big + 3] = nanf("");
    l[(int64_t) 2 * big + 9] = 60.0f;
    for (int32_t i = 0; i < big; i++) {
        l[(int64_t) 3 * big + i] = nanf("");
    }
    l[(int64_t) 4 * big + big - 1] = INFINITY;
    dl = dup_to_dev(l, (size_t) NR * big * sizeof(float));
    dids = dnew(NR * sizeof(int32_t));
    poison(dids, NR * sizeof(int32_t));
    op(nalar_cuda_argmax(&C, dl, big, NR, big, dids, &err), &err);
    fetch(ids, dids, sizeof(ids));
    for (int r = 0; r < NR; r++) {
        bad += ids[r] != nalar_argmax(l + (int64_t) r * big, big);
    }
    report_eq("argmax", "12 rows x 128256, ties, NaN, inf", bad == 0,
              "differs from nalar_argmax");

    cudaFree(dids);
    cudaFree(dl);
    free(l);
}


int
main(int argc, char **argv)
{
    int         require = 0, ops = 1, models = 1, n_dev;
    const char *dir = "models", *conf = "t/data/conformance";
    nalar_err   err;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--require-gpu") == 0) {
            require = 1;
        } else if (strcmp(argv[i], "--ops-only") == 0) {
            models = 0;
        } else if (strcmp(argv[i], "--models-only") == 0) {
            ops = 0;
        } else if (strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--conformance") == 0 && i + 1 < argc) {
            conf = argv[++i];
        } else {
            fprintf(stderr, "usage: nalar-cuda-check [--require-gpu] "
                    "[--ops-only|--models-only] [--models DIR] "
                    "[--conformance DIR]\n");
            return 2;
        }
    }
    n_dev = nalar_cuda_device_count();
    if (n_dev == 0) {
        printf("nalar-cuda-check: no CUDA device visible: %s\n",
               require ? "FAILED (--require-gpu)" : "skipped");
        return require ? 1 : 77;
    }
    if (nalar_cuda_ctx_init(&C, 0, &err) != 0) {
        die("init", err.msg);
    }
    if (ops) {
        check_rmsnorm();
        check_embed();
        check_rope();
        check_elementwise();
        check_kv();
        check_attention();
        /* the decode kernel's other loop shape too (prefill repeats) */
        C.attn_prefetch = !C.attn_prefetch;
        check_attention();
        C.attn_prefetch = !C.attn_prefetch;
        /* a BF16 pool: the same kernels reading 16-bit K/V; the reference
         * reads the same rounded values, so the F32 tolerance holds */
        kv_bf16 = 1;
        check_kv();
        check_attention();
        kv_bf16 = 0;
        check_matmul();
        check_mma();
        check_kq();
        check_gemv_rows();
        check_argmax();
    }
    if (models) {
        /* the default path (cuBLAS for batches over 8 tokens) ... */
        check_greedy(dir, "nalar-kjv-target-f32.gguf", 1, 0);
        check_greedy(dir, "nalar-kjv-target-f16.gguf", 0, 0);
        /* ... and FP32 activations throughout: must match exactly */
        check_greedy(dir, "nalar-kjv-target-f32.gguf", 1, 1000000);
        check_greedy(dir, "nalar-kjv-target-f16.gguf", 1, 1000000);
        check_conformance(conf);
        /* ggml-blocked weights (Q4_K + Q6_K), GEMV and cuBLAS paths */
        check_greedy("t/data/conformance", "llama-Q4_K_M.gguf", 0, 0);
        check_greedy("t/data/conformance", "llama-Q4_K_M.gguf", 0, 1000000);
    }
    nalar_cuda_ctx_free(&C);
    printf("nalar-cuda-check: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
