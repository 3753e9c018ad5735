/*
 * Decode's products against a read loop, two threads, in one process:
 * the matrices of LAYERS layers of the ~1.1B Llama shape of
 * bench/quant.sh (dim 2048, 8 KV heads of 64, ffn 8192), in one weight
 * type, interleaved as the backend holds them, in huge pages, split
 * between the threads as the forward pass by rows splits them (q, k and
 * v one row space; gate and up the same rows; a barrier after each
 * phase), each thread's x codes its own.  Rounds alternate between a
 * read loop over the same bytes with the same split and barriers, the
 * 8-bit rows kernels and the 16-bit ones (the K-quants' rows kernels;
 * Q8_0's and Q4_0's are cpu_quant_p32.c's, on a copy of the weights in
 * panels).
 * Prints, in GB/s of weights, the medians and each kernel's median share
 * of its round's read loop, then the best round of each and the ratio of
 * those (on a shared machine the least disturbed round).
 *   stream [TYPE ...]    (q8_0 q4_0 q4_k q5_k q6_k; default q8_0 q4_0 q4_k)
 * The rates are of wall time; STREAM_CPU=1 divides by the threads' mean
 * CPU time instead (a thread descheduled by other work then costs
 * nothing, but the other runs alone meanwhile).  NALAR_CPU_PREFETCH
 * applies, so that one binary measures prefetch distances in alternated
 * runs.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_quant.h"
#include "cpu_quant_p32.h"
#include "cpu_quant_rows.h"
#include "cpu_quant_x16.h"
#include "gguf.h"
#include "bench_time.h"

#define DIM    2048
#define KVD    512
#define FFN    8192
#define LAYERS 8
#define ROUNDS 21
#define NTH    2

enum { M_Q, M_K, M_V, M_O, M_G, M_U, M_D, NMAT };

typedef struct {
    int64_t  rows, cols, rs;    /* rs: bytes of a row */
    uint8_t *w[LAYERS];
    uint8_t *p[LAYERS];         /* the same weights in panels (Q8_0, Q4_0) */
} mat;

typedef struct {
    ggml_type         t;
    int               isa;
    mat               m[NMAT];
    pthread_barrier_t bar;
    int               mode;     /* 0 read, 1 q8, 2 i16 */
    double            secs;
    double            cpu[NTH]; /* each thread's CPU time */
    uint64_t          sink[NTH];
    const float      *x;        /* DIM, then FFN floats */
} bench;

typedef struct {
    bench *b;
    int    tid;
} arg;


/* the rows [lo, hi) of n split in NTH shares at multiples of al */
static void
share(int64_t n, int tid, int64_t al, int64_t *lo, int64_t *hi)
{
    int64_t u = (n / al + NTH - 1) / NTH * al;

    *lo = tid * u < n ? tid * u : n;
    *hi = (tid + 1) * u < n ? (tid + 1) * u : n;
}


/* the sum of rows [r0, r1) of w's interleaved matrix as 64-bit words,
 * read 64 bytes at a time (AVX-512; else word by word) */
static uint64_t
read_rows(const mat *m, const uint8_t *w, int64_t r0, int64_t r1)
{
    int64_t n = (r1 - r0) * m->rs / 64, i = 0;
#if defined(__AVX512F__)
    const __m512i *p = (const __m512i *) (w + r0 * m->rs);
    __m512i        a = _mm512_setzero_si512(), b = a, c = a, d = a;

    for (; i + 4 <= n; i += 4) {
        a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
        b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 1));
        c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 2));
        d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 3));
    }
    for (; i < n; i++) {
        a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
    }
    a = _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d));
    return (uint64_t) _mm512_reduce_add_epi64(a);
#else
    const uint64_t *p = (const uint64_t *) (w + r0 * m->rs);
    uint64_t        s = 0;

    for (; i < n * 8; i++) {
        s += p[i];
    }
    return s;
#endif
}


/* rows [r0, r1) of matrix k of layer l, in b's mode */
static void
product(bench *b, int tid, int k, int l, int64_t r0, int64_t r1,
        const nalar_xq8 *x8, const nalar_xq16 *x16, float *y)
{
    const mat *m = &b->m[k];

    if (r0 >= r1) {
        return;
    }
    if (b->mode == 0) {
        b->sink[tid] += read_rows(m, m->w[l], r0, r1);
    } else if (b->mode == 1) {
        (void) nalar_quant_q8_rows(b->t, b->isa, m->w[l], m->rs, 1, m->cols,
                                   x8, y, r0, r1, 0);
    } else if (m->p[l] != NULL) {
        (void) nalar_quant_p32_kernel(b->isa, b->t, m->p[l], m->cols, x16, 1,
                                      y, 0, r0, r1, 0);
    } else {
        (void) nalar_quant_x16_rows(b->t, b->isa, m->w[l], m->rs, 1,
                                    m->cols, x16, y, r0, r1, 0);
    }
}


/* this thread's CPU time, seconds */
static double
thread_cpu(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}


static void *
worker(void *a_)
{
    arg       *a = a_;
    bench     *b = a->b;
    int        tid = a->tid;
    void      *c8 = malloc((size_t) nalar_quant_x8_bytes(1, FFN));
    void      *c16 = malloc((size_t) nalar_quant_x16_bytes(1, FFN));
    void      *d8 = malloc((size_t) nalar_quant_x8_bytes(1, FFN));
    void      *d16 = malloc((size_t) nalar_quant_x16_bytes(1, FFN));
    float     *y = malloc(FFN * 2 * sizeof(float));
    nalar_xq8  x8, f8;
    nalar_xq16 x16, f16;
    double     t0 = 0, c0;

    nalar_quant_x8(b->x, 1, DIM, DIM, c8, &x8);
    nalar_quant_x16(b->x, 1, DIM, DIM, c16, &x16);
    nalar_quant_x8(b->x + DIM, 1, FFN, FFN, d8, &f8);
    nalar_quant_x16(b->x + DIM, 1, FFN, FFN, d16, &f16);
    pthread_barrier_wait(&b->bar);
    c0 = thread_cpu();
    if (tid == 0) {
        t0 = now();
    }
    for (int l = 0; l < LAYERS; l++) {
        int64_t lo, hi;

        /* q, k, v: one row space split by heads */
        share(DIM + 2 * KVD, tid, 64, &lo, &hi);
        for (int k = M_Q, base = 0; k <= M_V; base += (int) b->m[k].rows,
             k++)
        {
            int64_t a0 = lo - base > 0 ? lo - base : 0;
            int64_t a1 = hi - base < b->m[k].rows ? hi - base : b->m[k].rows;

            product(b, tid, k, l, a0, a1, &x8, &x16, y);
        }
        pthread_barrier_wait(&b->bar);
        share(DIM, tid, 16, &lo, &hi);
        product(b, tid, M_O, l, lo, hi, &x8, &x16, y);
        pthread_barrier_wait(&b->bar);
        share(FFN, tid, 16, &lo, &hi);
        product(b, tid, M_G, l, lo, hi, &x8, &x16, y);
        product(b, tid, M_U, l, lo, hi, &x8, &x16, y + FFN);
        pthread_barrier_wait(&b->bar);
        share(DIM, tid, 16, &lo, &hi);
        product(b, tid, M_D, l, lo, hi, &f8, &f16, y);
        pthread_barrier_wait(&b->bar);
    }
    b->cpu[tid] = thread_cpu() - c0;
    if (tid == 0) {
        b->secs = now() - t0;
    }
    free(c8);
    free(c16);
    free(d8);
    free(d16);
    free(y);
    return NULL;
}


static double
run(bench *b, int mode)
{
    pthread_t th[NTH];
    arg       a[NTH];

    b->mode = mode;
    for (int i = 0; i < NTH; i++) {
        a[i].b = b;
        a[i].tid = i;
        if (pthread_create(&th[i], NULL, worker, &a[i]) != 0) {
            exit(1);
        }
    }
    for (int i = 0; i < NTH; i++) {
        pthread_join(th[i], NULL);
    }
    if (getenv("STREAM_CPU") == NULL) {
        return b->secs;
    }
    {
        double c = 0;

        for (int i = 0; i < NTH; i++) {
            c += b->cpu[i];
        }
        return c / NTH;
    }
}


/* a matrix of rows x cols weights of type t, random, interleaved, in
 * huge pages, LAYERS copies */
static void
make_mat(mat *m, ggml_type t, int64_t rows, int64_t cols)
{
    float   *row = malloc((size_t) cols * sizeof(float));
    uint8_t *src;
    size_t   n;

    m->rows = rows;
    m->cols = cols;
    m->rs = (int64_t) ggml_row_size(t, cols);
    src = malloc((size_t) (rows * m->rs));
    n = (size_t) nalar_quant_interleaved_bytes(t, rows, cols);
    n = (n + (2u << 20) - 1) & ~(size_t) ((2u << 20) - 1);
    for (int64_t r = 0; r < 64; r++) {
        for (int64_t c = 0; c < cols; c++) {
            row[c] = (float) rand() / RAND_MAX - 0.5f;
        }
        (void) nalar_quantize_row(t, row, cols, src + r * m->rs);
    }
    for (int64_t r = 64; r < rows; r++) {
        memcpy(src + r * m->rs, src + (r % 64) * m->rs, (size_t) m->rs);
    }
    for (int l = 0; l < LAYERS; l++) {
        if (posix_memalign((void **) &m->w[l], 2u << 20, n) != 0) {
            exit(1);
        }
        (void) madvise(m->w[l], n, MADV_HUGEPAGE);
        nalar_quant_interleave(t, src, rows, cols, m->w[l]);
        if (nalar_quant_p32_type(t)) {
            n = (size_t) nalar_quant_p32_bytes(t, rows, cols);
            n = (n + (2u << 20) - 1) & ~(size_t) ((2u << 20) - 1);
            if (posix_memalign((void **) &m->p[l], 2u << 20, n) != 0) {
                exit(1);
            }
            (void) madvise(m->p[l], n, MADV_HUGEPAGE);
            nalar_quant_p32_pack(t, src, m->rs, 0, rows, cols, m->p[l]);
            n = (size_t) nalar_quant_interleaved_bytes(t, rows, cols);
            n = (n + (2u << 20) - 1) & ~(size_t) ((2u << 20) - 1);
        }
    }
    free(src);
    free(row);
}


static ggml_type
type_named(const char *s)
{
    static const ggml_type all[] = {
        GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K
    };

    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (strcasecmp(s, ggml_type_name(all[i])) == 0) {
            return all[i];
        }
    }
    fprintf(stderr, "stream: unknown type %s\n", s);
    exit(1);
}


int
main(int argc, char **argv)
{
    const char *def[] = { "q8_0", "q4_0", "q4_k" };
    const char **names = argc > 1 ? (const char **) argv + 1 : def;
    int          n = argc > 1 ? argc - 1 : 3;
    float       *x = malloc((DIM + FFN) * sizeof(float));

    srand(1);
    for (int i = 0; i < DIM + FFN; i++) {
        x[i] = (float) rand() / RAND_MAX - 0.5f;
    }
    printf("# %d layers of dim %d, ffn %d, %d threads; GB/s of weights, "
           "medians of %d alternated rounds (ratios: of each round's)\n", LAYERS, DIM, FFN, NTH,
           ROUNDS);
    printf("%-5s %8s %8s %8s %7s %7s\n", "type", "read", "q8", "i16",
           "q8/rd", "i16/rd");
    for (int k = 0; k < n; k++) {
        static bench b;
        double       g[3][ROUNDS], bytes = 0;
        int          modes;

        memset(&b, 0, sizeof(b));
        b.t = type_named(names[k]);
        /* read, q8, i16 */
        modes = 3;
        b.isa = nalar_quant_q8_isa_max();
        b.x = x;
        pthread_barrier_init(&b.bar, NULL, NTH);
        make_mat(&b.m[M_Q], b.t, DIM, DIM);
        make_mat(&b.m[M_K], b.t, KVD, DIM);
        make_mat(&b.m[M_V], b.t, KVD, DIM);
        make_mat(&b.m[M_O], b.t, DIM, DIM);
        make_mat(&b.m[M_G], b.t, FFN, DIM);
        make_mat(&b.m[M_U], b.t, FFN, DIM);
        make_mat(&b.m[M_D], b.t, DIM, FFN);
        for (int i = 0; i < NMAT; i++) {
            bytes += (double) b.m[i].rows * b.m[i].rs * LAYERS;
        }
        for (int i = -1; i < ROUNDS; i++) {
            for (int mode = 0; mode < modes; mode++) {
                double s = run(&b, mode);

                if (i >= 0) {
                    g[mode][i] = bytes / s / 1e9;
                }
            }
        }
        {
            double q[2][ROUNDS], r, a, c = 0, qc = 0;

            for (int i = 0; i < ROUNDS; i++) {
                q[0][i] = g[1][i] / g[0][i];
                q[1][i] = modes > 2 ? g[2][i] / g[0][i] : 0;
            }
            r = median_of(g[0], ROUNDS);
            a = median_of(g[1], ROUNDS);
            if (modes > 2) {
                c = median_of(g[2], ROUNDS);
                qc = median_of(q[1], ROUNDS);
            }
            printf("%-5s %8.1f %8.1f", ggml_type_name(b.t), r, a);
            if (modes > 2) {
                printf(" %8.1f %7.2f %7.2f   best %5.1f %5.1f %5.1f %5.2f "
                       "%5.2f\n", c, median_of(q[0], ROUNDS), qc,
                       g[0][ROUNDS - 1], g[1][ROUNDS - 1], g[2][ROUNDS - 1],
                       g[1][ROUNDS - 1] / g[0][ROUNDS - 1],
                       g[2][ROUNDS - 1] / g[0][ROUNDS - 1]);
            } else {
                printf(" %8s %7.2f %7s   best %5.1f %5.1f %5s %5.2f %5s\n",
                       "-", median_of(q[0], ROUNDS), "-", g[0][ROUNDS - 1],
                       g[1][ROUNDS - 1], "-",
                       g[1][ROUNDS - 1] / g[0][ROUNDS - 1], "-");
            }
            fflush(stdout);
        }
        for (int i = 0; i < NMAT; i++) {
            for (int l = 0; l < LAYERS; l++) {
                free(b.m[i].w[l]);
                free(b.m[i].p[l]);
            }
        }
        pthread_barrier_destroy(&b.bar);
    }
    free(x);
    return 0;
}
