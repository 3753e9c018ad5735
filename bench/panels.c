/*
 * The F16 panel product alone at the widths of small steps, one thread:
 * every weight matrix of a Llama's layers (random F16, each its own
 * memory, so a pass streams them all as a forward pass does: q, k, v, o,
 * gate, up, down), multiplied by N tokens through nalar_cpu_matmul over
 * the backend's own panels (nalar_cpu_mat_init).  For each N: the
 * thread's CPU time per token of one pass over every layer (best of
 * REPS; CPU time, not wall time, so a neighbour's share of the core
 * counts less) and its ratio to the last width's.  Default shape: the
 * ITL benchmark's model (dim 576, kv 192, ffn 1536, 30 layers).
 *   panels [WIDTHS [REPS [DIM KV FFN LAYERS]]]     e.g. panels 16,32,48,128
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_matmul.h"
#include "fp16.h"

#define N_MATS 7


static double
cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}


static float
rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float) ((int) (*s >> 16) % 2000 - 1000) * 1e-3f;
}


int
main(int argc, char **argv)
{
    const char    *list = argc > 1 ? argv[1] : "16,32,48,128";
    int            reps = argc > 2 ? atoi(argv[2]) : 5;
    int64_t        dim = argc > 6 ? atoll(argv[3]) : 576;
    int64_t        kv = argc > 6 ? atoll(argv[4]) : 192;
    int64_t        ffn = argc > 6 ? atoll(argv[5]) : 1536;
    int            nl = argc > 6 ? atoi(argv[6]) : 30;
    int64_t        shape[N_MATS][2] = { { dim, dim }, { kv, dim }, { kv, dim },
                                        { dim, dim }, { ffn, dim },
                                        { ffn, dim }, { dim, ffn } };
    int            widths[32], nw = 0, maxw = 1;
    double         ms[32];
    nalar_mat     *W;
    nalar_cpu_mat *M;
    float         *x, *y;
    unsigned       seed = 1;
    char          *dup = strdup(list), *tok;
    nalar_err      err;

    for (tok = strtok(dup, ","); tok != NULL && nw < 32;
         tok = strtok(NULL, ","))
    {
        widths[nw] = atoi(tok);
        if (widths[nw] < 1 || widths[nw] > 4096) {
            fprintf(stderr, "panels: bad width '%s'\n", tok);
            return 2;
        }
        maxw = widths[nw] > maxw ? widths[nw] : maxw;
        nw++;
    }
    free(dup);
    if (nw == 0 || reps < 1 || nl < 1 || dim < 1 || kv < 1 || ffn < 1) {
        fprintf(stderr, "usage: panels [WIDTHS [REPS [DIM KV FFN "
                "LAYERS]]]\n");
        return 2;
    }
    W = calloc((size_t) nl * N_MATS, sizeof(*W));
    M = calloc((size_t) nl * N_MATS, sizeof(*M));
    x = malloc((size_t) maxw * (size_t) (ffn > dim ? ffn : dim)
               * sizeof(float));
    y = malloc((size_t) maxw * (size_t) (ffn > dim ? ffn : dim)
               * sizeof(float));
    if (W == NULL || M == NULL || x == NULL || y == NULL) {
        fprintf(stderr, "panels: out of memory\n");
        return 1;
    }
    for (int i = 0; i < nl * N_MATS; i++) {
        int64_t   r = shape[i % N_MATS][0], c = shape[i % N_MATS][1];
        uint16_t *d = malloc((size_t) (r * c) * sizeof(uint16_t));

        if (d == NULL) {
            fprintf(stderr, "panels: out of memory\n");
            return 1;
        }
        for (int64_t k = 0; k < r * c; k++) {
            d[k] = nalar_f32_to_f16(0.1f * rnd(&seed));
        }
        W[i].type = GGML_F16;
        W[i].rows = r;
        W[i].cols = c;
        W[i].data = d;
        if (nalar_cpu_mat_init(&M[i], &W[i], 0, &err) != 0) {
            fprintf(stderr, "panels: %s\n", err.msg);
            return 1;
        }
    }
    for (int64_t k = 0; k < maxw * (ffn > dim ? ffn : dim); k++) {
        x[k] = rnd(&seed);
    }
    for (int w = 0; w < nw; w++) {
        int    n = widths[w];
        double best = 1e30;

        for (int rep = 0; rep < reps + 1; rep++) {    /* 1 warm-up */
            double t0 = cpu_now(), dt;

            for (int i = 0; i < nl * N_MATS; i++) {
                nalar_cpu_matmul(&M[i], x, n, (int) W[i].cols, y,
                                 (int) W[i].rows, 0, W[i].rows, 0);
            }
            dt = cpu_now() - t0;
            best = rep > 0 && dt < best ? dt : best;
        }
        ms[w] = best * 1e3 / n;
    }
    for (int w = 0; w < nw; w++) {
        printf("%d tokens: %.3f ms per token (%.3fx the %d-token pass)\n",
               widths[w], ms[w], ms[w] / ms[nw - 1], widths[nw - 1]);
    }
    for (int i = 0; i < nl * N_MATS; i++) {
        nalar_cpu_mat_free(&M[i]);
        free((void *) W[i].data);
    }
    free(W);
    free(M);
    free(x);
    free(y);
    return 0;
}
