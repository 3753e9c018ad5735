/*
 * Decode with LoRA adapters on the CPU backend against decode without:
 * NSEQ sequences decoded together, one token each per pass, all base-only
 * (batch.adapter NULL) or spread over NADAPT adapters of rank RANK (F16,
 * or F32, A and B for every matrix an adapter may adapt, random values, attached as
 * the engine attaches a loaded adapter: lora_attach).  The two runs
 * alternate, ROUNDS rounds of STEPS passes each after a prefill (the
 * prefill untimed), so each round's pair shares the machine's state;
 * prints each round's aggregate decode tokens/s, the medians and the
 * median of the per-round ratios, and the load average.
 * bench/lora.sh builds and runs it.
 *   lora MODEL [THREADS] [ROUNDS] [STEPS] [f16|f32] [ADAPTERS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_backend.h"
#include "fp16.h"
#include "kv.h"
#include "lora.h"
#include "model.h"
#include "bench_time.h"

#define NSEQ    16
#define NADAPT  4       /* adapters at most */
#define RANK    16
#define PROMPT  4
#define MAXR    32


static uint64_t  rng = 88172645463325252ULL;
static ggml_type ad_type = GGML_F16;   /* the adapters' A and B */
static int       n_adapt = NADAPT;     /* adapters the sequences use */


/* a (rows, cols) matrix of ad_type (F16 or F32), random values in
 * (-amp, amp) */
static nalar_mat
rand_mat(int64_t rows, int64_t cols, float amp)
{
    nalar_mat  M = { ad_type, rows, cols, NULL };
    uint8_t   *p = malloc((size_t) (rows * cols) * 4);

    for (int64_t i = 0; p != NULL && i < rows * cols; i++) {
        float    f;
        uint16_t h;

        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        f = ((float) (rng >> 40) / 16777216.0f * 2 - 1) * amp;
        h = nalar_f32_to_f16(f);
        if (ad_type == GGML_F32) {
            memcpy(p + i * 4, &f, 4);
        } else {
            memcpy(p + i * 2, &h, 2);
        }
    }
    M.data = p;
    return M;
}


static nalar_lora_mat
one_mat(int64_t rows, int64_t cols)
{
    nalar_lora_mat m;

    m.a = rand_mat(RANK, cols, 0.02f);
    m.b = rand_mat(rows, RANK, 0.02f);
    m.scale = 2.0f;    /* alpha 32 / rank 16 */
    return m;
}


/* an adapter of every attention and FFN matrix of m (the memory is not
 * given back: the program ends after the runs) */
static nalar_lora *
make_adapter(const nalar_model *m, int i)
{
    const nalar_config *c = &m->cfg;
    nalar_lora         *a = calloc(1, sizeof(*a));
    int64_t             qd = (int64_t) c->n_heads * c->head_dim;
    int64_t             kd = (int64_t) c->n_kv_heads * c->head_dim;

    a->name = i == 0 ? "a1" : i == 1 ? "a2" : i == 2 ? "a3" : "a4";
    a->rank = RANK;
    a->scale = 1;
    a->n_layers = c->n_layers;
    a->layers = calloc((size_t) c->n_layers, sizeof(nalar_lora_layer));
    for (int l = 0; l < c->n_layers; l++) {
        nalar_lora_layer *L = &a->layers[l];

        L->wq = one_mat(qd, c->dim);
        L->wk = one_mat(kd, c->dim);
        L->wv = one_mat(kd, c->dim);
        L->wo = one_mat(c->dim, qd);
        L->w_gate = one_mat(c->ffn_dim, c->dim);
        L->w_up = one_mat(c->ffn_dim, c->dim);
        L->w_down = one_mat(c->dim, c->ffn_dim);
    }
    return a;
}


/*
 * One run: NSEQ prompts prefilled in one pass (untimed), then `steps`
 * passes of one greedy token per sequence; adapters: each sequence's
 * adapter (i % n_adapt + 1), or NULL for the base.  Decode tokens/s, or
 * -1.
 */
static double
run(nalar_backend *be, nalar_kv_pool *kv, int steps, int adapters,
    float *logits)
{
    const nalar_config *c = &be->model->cfg;
    nalar_seq_kv        s[NSEQ], *seq[NSEQ * PROMPT];
    int32_t             tok[NSEQ * PROMPT], pos[NSEQ * PROMPT];
    int32_t             ad[NSEQ * PROMPT];
    int8_t              want[NSEQ * PROMPT];
    nalar_err           err;
    double              t0 = 0, tps = -1;
    int                 rc = 0;

    for (int i = 0; i < NSEQ; i++) {
        nalar_seq_kv_init(&s[i]);
        rc |= nalar_seq_kv_reserve(kv, &s[i], PROMPT + steps + 1);
    }
    for (int step = 0; step <= steps && rc == 0; step++) {
        int         len = step == 0 ? PROMPT : 1, n = 0;
        nalar_batch b;

        for (int i = 0; i < NSEQ; i++) {
            for (int k = 0; k < len; k++) {
                int32_t prev = 1;

                if (step > 0) {
                    const float *z = logits + (size_t) i * c->n_vocab;

                    for (int32_t v = 1; v < c->n_vocab; v++) {
                        prev = z[v] > z[prev] ? v : prev;
                    }
                }
                tok[n] = step == 0 ? 3 + (i * 131 + k * 37) % (c->n_vocab
                                                                 - 3)
                                   : prev;
                pos[n] = step == 0 ? k : PROMPT + step - 1;
                seq[n] = &s[i];
                want[n] = k == len - 1;
                ad[n] = i % n_adapt + 1;
                n++;
            }
        }
        b.n_tokens = n; b.tokens = tok; b.pos = pos; b.seq = seq;
        b.want_logits = want; b.n_logits = NSEQ;
        b.adapter = adapters ? ad : NULL;
        if (step == 1) {
            t0 = now();
        }
        if (be->forward(be, kv, &b, logits, &err) != 0) {
            fprintf(stderr, "lora: %s\n", err.msg);
            rc = -1;
        }
    }
    if (rc == 0 && steps > 0) {
        tps = (double) NSEQ * steps / (now() - t0);
    }
    for (int i = 0; i < NSEQ; i++) {
        nalar_seq_kv_release(kv, &s[i]);
    }
    return tps;
}


int
main(int argc, char **argv)
{
    int            threads = argc > 2 ? atoi(argv[2]) : 2;
    int            rounds = argc > 3 ? atoi(argv[3]) : 5;
    int            steps = argc > 4 ? atoi(argv[4]) : 8;
    double         base[MAXR], lora[MAXR], ratio[MAXR], load[3] = { 0 };
    nalar_model   *m;
    nalar_backend *be;
    nalar_kv_pool  kv;
    nalar_err      err;
    float         *logits;
    FILE          *f;

    if (argc > 5 && strcmp(argv[5], "f32") == 0) {
        ad_type = GGML_F32;
    }
    if (argc > 6) {
        n_adapt = atoi(argv[6]);
        n_adapt = n_adapt < 1 ? 1 : n_adapt > NADAPT ? NADAPT : n_adapt;
    }
    if (argc < 2 || rounds < 1 || rounds > MAXR || steps < 1) {
        fprintf(stderr, "usage: lora MODEL [THREADS] [ROUNDS <= %d] "
                "[STEPS] [f16|f32] [ADAPTERS <= %d]\n", MAXR, NADAPT);
        return 2;
    }
    m = nalar_model_load(argv[1], &err);
    be = m != NULL ? nalar_cpu_backend_create(m, threads, &err) : NULL;
    if (be == NULL
        || nalar_kv_pool_init(&kv, NSEQ * ((PROMPT + steps) / 16 + 2),
                              m->cfg.n_layers,
                              m->cfg.n_kv_heads * m->cfg.head_dim, &err) != 0
        || be->kv_alloc(be, &kv, &err) != 0)
    {
        fprintf(stderr, "lora: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < NADAPT; i++) {
        if (be->lora_attach(be, i + 1, make_adapter(m, i), &err) != 0) {
            fprintf(stderr, "lora: %s\n", err.msg);
            return 1;
        }
    }
    if (getenv("LORA_WAY") != NULL) {
        /* rows (0) or tokens (1) for every pass, as the tests force it */
        nalar_cpu_backend_test_way(be, atoi(getenv("LORA_WAY")));
    }
    logits = malloc((size_t) NSEQ * m->cfg.n_vocab * sizeof(float));
    /* one of each first: the ways' first measurements, warm caches */
    if (logits == NULL || run(be, &kv, 2, 0, logits) < 0
        || run(be, &kv, 2, 1, logits) < 0)
    {
        return 1;
    }
    for (int r = 0; r < rounds; r++) {
        base[r] = run(be, &kv, steps, 0, logits);
        lora[r] = run(be, &kv, steps, 1, logits);
        if (base[r] <= 0 || lora[r] <= 0) {
            return 1;
        }
        ratio[r] = lora[r] / base[r];
        printf("round %d: base %.2f tokens/s, %d adapters %.2f tokens/s, "
               "ratio %.3f\n", r + 1, base[r], n_adapt, lora[r], ratio[r]);
    }
    f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) {
            load[0] = -1;
        }
        fclose(f);
    }
    printf("%s: dim %d, %d layers, ffn %d; %d sequences, %d threads, "
           "%d rounds of %d passes; load average %.2f %.2f %.2f\n",
           argv[1], m->cfg.dim, m->cfg.n_layers, m->cfg.ffn_dim, NSEQ,
           threads, rounds, steps, load[0], load[1], load[2]);
    printf("median: base %.2f tokens/s, %d rank-%d %s adapters %.2f "
           "tokens/s, same-round ratio %.3f\n", median_of(base, rounds),
           n_adapt, RANK, ggml_type_name(ad_type), median_of(lora, rounds),
           median_of(ratio, rounds));
    free(logits);
    be->kv_free(be, &kv);
    nalar_kv_pool_free(&kv);
    be->destroy(be);
    nalar_model_destroy(m);
    return 0;
}
