/*
 * The CPU backend's insides, shared by its files: the backend's state,
 * the small vector helpers every phase uses (fixed order of operations,
 * so a result never depends on which file or thread computed it), and
 * the phases of a pass.
 *
 *   cpu_backend.c    creation, scratch, the KV pool, the way a pass runs
 *   cpu_forward.c    the forward pass (by weight rows, or by tokens)
 *   cpu_attention.c  attention over the paged KV pool, in tiles
 *   cpu_lora.c       LoRA adapters: attaching them, their products
 */
#ifndef NALAR_CPU_BACKEND_IMPL_H
#define NALAR_CPU_BACKEND_IMPL_H

#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "cpu_matmul.h"
#include "threadpool.h"

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define MODE_TOKENS 8    /* passes up to this size may run solo (choose_way) */
#define WAY_CLASSES 21   /* pass sizes 1 .. 16, then 17-32, ..., 257 or more */

/* how a pass runs (choose_way) */
enum {
    WAY_ROWS,            /* on the pool, phases split by weight rows */
    WAY_TOKENS,          /* on the pool, split by token */
    WAY_SOLO,            /* on the calling thread alone */
    N_WAYS
};

/* batch tokens t0 .. t0 + n - 1: one sequence at consecutive positions */
typedef struct {
    int32_t t0, n;
} tok_tile;

/* a layer's weights as the matrix kernels read them (see cpu_matmul.h) */
typedef struct {
    nalar_cpu_mat  wq, wk, wv, wo, w_gate, w_up, w_down;
} cpu_layer;

/* the matrices an adapter may adapt, in cpu_layer's order */
enum {
    LORA_WQ, LORA_WK, LORA_WV, LORA_WO, LORA_GATE, LORA_UP, LORA_DOWN,
    LORA_KINDS
};

/* the products that read one input (x_t), whose A products an adapter
 * makes together: q, k, v; output; gate, up; down */
enum {
    LORA_FAM_QKV, LORA_FAM_O, LORA_FAM_FFN, LORA_FAM_DOWN, LORA_FAMS
};

/*
 * One family's A of an adapter: the A of each matrix it adapts, stacked
 * by rows (rank rows each; one shared A once), so that u = A x of every
 * matrix of the family is one product.  Held as the base weights are
 * (nalar_cpu_mat: panels, or in place); `stack` owns the stacked copy
 * where there is more than one A, else W is the adapter's own A.
 * W.rows == 0: the adapter adapts no matrix of the family.
 */
typedef struct {
    nalar_mat      W;            /* (rank, cols) */
    void          *stack;        /* W.data when made here, or NULL */
    nalar_cpu_mat  a;
} cpu_lora_fam;

/* one adapted matrix: B (rows, rank) held as the base weights are; its
 * u is rank floats at u_off of its family's u; adapted 0: left alone */
typedef struct {
    nalar_cpu_mat  b;
    float          scale;
    int32_t        u_off;
    int            adapted;
} cpu_lora_mat;

/* an attached adapter (lora_attach) */
typedef struct {
    const struct nalar_lora *src;
    cpu_lora_mat            *mats;   /* (n_layers, LORA_KINDS) */
    cpu_lora_fam            *fams;   /* (n_layers, LORA_FAMS) */
} cpu_lora;

/* which family's u a thread holds (nalar_cpu_lora) */
typedef struct {
    uint64_t       pass;
    int32_t        layer, fam;
    int64_t        t0, t1;
} lora_ukey;

/* the pass's tokens under adapter `id`: lora_tok[start .. start + n) */
typedef struct {
    int32_t        id, start, n;
} lora_group;

/* tokens of one adapter the adapter products take at a time (the rows of
 * each thread's lora_buf) */
#define LORA_CHUNK 32

typedef struct {
    nalar_model   *m;
    cpu_layer     *layers;       /* (n_layers) */
    nalar_cpu_mat  output;       /* (n_vocab, dim) */
    nalar_pool    *pool;
    int            owns_pool;    /* 0: borrowed from another backend */
    int32_t        cap_tok;      /* scratch rows allocated */
    int32_t        q_dim;        /* n_heads * head_dim */
    int32_t        kv_dim;       /* n_kv_heads * head_dim */
    float         *x;            /* (cap_tok, dim) residual stream */
    float         *xb;           /* (n_threads, cap_tok, dim) normalised
                                    input: each thread's own copy */
    int            act_i16;      /* products over quantized weights take
                                    16-bit (NALAR_ACT_I16), 8-bit
                                    (NALAR_ACT_Q8) or pair-multiplier
                                    (NALAR_ACT_PAIRS) activations */
    uint8_t       *xq;           /* act_i16: (n_threads, xq_bytes) each
                                    thread's 16-bit codes of its xb
                                    (nalar_quant_x16), 8-bit codes
                                    (nalar_quant_x8) or pair codes
                                    (nalar_quant_xpairs), or NULL */
    int64_t        xq_bytes;     /* nalar_quant_x16_bytes(xq_cap, dim),
                                    nalar_quant_x8_bytes or
                                    nalar_quant_xpairs_bytes */
    int32_t        xq_cap;       /* tokens xq holds per thread */
    int            xp_groups;    /* NALAR_ACT_PAIRS: the groupings of
                                    pair codes the model's quantized
                                    matrices read (NALAR_XP_G32,
                                    NALAR_XP_G256), the only ones made */
    float         *qkv;          /* (cap_tok, q_dim + 2 kv_dim) */
    float         *att;          /* (cap_tok, q_dim) attention output */
    float         *hg;           /* (cap_tok, ffn) gate, then silu(g) * u */
    float         *hu;           /* (cap_tok, ffn) up */
    float         *y;            /* (cap_tok, dim) a layer's attention or
                                    FFN output before its post-norm */
    float         *rope_cos;     /* (cap_tok, head_dim / 2) */
    float         *rope_sin;     /* (cap_tok, head_dim / 2) */
    float         *inv_freq;     /* (head_dim / 2) base^(-2i/head_dim)
                                    * rope_scale / rope_freqs[i] */
    float         *scores;       /* (n_threads, QTILE, scores_cap) */
    int32_t        scores_cap;   /* per query row */
    int32_t       *logit_rows;   /* (cap_tok) batch index of each logit */
    tok_tile      *tiles;        /* (cap_tok) attention's token tiles */
    int32_t        n_tiles;
    int            one_seq;      /* the tiles are all one sequence's */
    int32_t        max_run;      /* most tokens of one sequence in a row */
    /* the tiles' shape, from the model: a tile holds tile_heads heads of
     * one KV group and up to tile_tokens consecutive tokens; each KV head's
     * G heads make head_groups tiles per token tile */
    int            tile_heads, tile_tokens, head_groups;
    /* the ways a pass may run, by pass size class (way_class): measured
     * microseconds per token of each, passes measured and passes run (see
     * choose_way) */
    double         way_us[WAY_CLASSES][N_WAYS];
    int            way_n[WAY_CLASSES][N_WAYS];
    unsigned       way_passes[WAY_CLASSES];
    unsigned       way_probes[WAY_CLASSES];
    uint64_t       solo_passes;  /* passes run WAY_SOLO, for tests */
    /* a pass split by token: thread i's tokens, tiles and logit rows
     * start at tok_lo[i], tile_lo[i], logit_lo[i] (n_threads + 1 each) */
    int32_t       *tok_lo;
    int32_t       *tile_lo;
    int32_t       *logit_lo;
    /* LoRA adapters (cpu_lora.c): the attached ones, ids 1 .. n_lora */
    cpu_lora      *lora;         /* (n_lora) */
    int32_t        n_lora;
    int32_t        lora_urank;   /* the most rows of a family's A */
    float         *lora_buf;     /* (n_threads, lora_buf_floats): each
                                    thread's gathered x and B u */
    int64_t        lora_buf_floats;
    float         *lora_u;       /* (n_threads, lora_u_cap, lora_urank):
                                    each thread's u of the family in
                                    lora_key[tid], row j for token
                                    lora_tok[j] */
    int32_t        lora_u_cap;
    lora_ukey     *lora_key;     /* (n_threads) */
    uint64_t       lora_pass;    /* passes grouped, for lora_key */
    /* the pass's tokens that have an adapter, grouped by adapter (once per
     * pass, nalar_cpu_lora_group), ascending within a group */
    int32_t       *lora_tok;     /* (cap_tok) */
    lora_group    *lora_groups;  /* (n_lora) */
    int32_t        n_groups;     /* 0: no token of the pass has one */
    int            force_way;    /* for tests: -1, or the way every
                                    pooled pass runs */
    /* the pass in flight */
    nalar_kv_pool     *kv;
    const nalar_batch *batch;
    float             *logits;
} cpu_backend;

/* query rows of an attention tile at most (tile_rows_max; the tiles are
 * described in cpu_attention.c) */
#define QTILE 8

/* Query rows per attention tile: registers hold 8 rows of heads up to 32
 * wide, 4 of larger ones. */
static inline int
tile_rows_max(const nalar_config *c)
{
    return c->head_dim <= 32 ? QTILE : QTILE / 2;
}


/* --- small vector helpers (fixed order of operations) --- */

static inline float
dot(const float *a, const float *b, int n)
{
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    int    i = 0;

    for (; i + 16 <= n; i += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i),
                              acc);
    }
    if (i < n) {
        __mmask16 m = (__mmask16) ((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i),
                              _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;
    for (int i = 0; i < n; i++) {
        s = fmaf(a[i], b[i], s);
    }
    return s;
#endif
}


static inline void
rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = dot(x, x, n) / (float) n;
    float s = 1.0f / sqrtf(ss + eps);

    for (int i = 0; i < n; i++) {
        o[i] = x[i] * s * w[i];
    }
}


/* Rotate pairs of one head: normal pairing (x[2i], x[2i+1]) or NeoX
 * pairing (x[i], x[i + hd/2]). */
static inline void
rope_head(float *x, const float *cs, const float *sn, int hd, int neox)
{
    for (int i = 0; i < hd / 2; i++) {
        int   a = neox ? i : 2 * i;
        int   b = neox ? i + hd / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];

        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}


/* Contiguous share [lo, hi) of n items for thread tid of nth, with the
 * boundaries rounded to multiples of `align`. */
static inline void
split(int64_t n, int tid, int nth, int64_t align, int64_t *lo, int64_t *hi)
{
    int64_t units = (n + align - 1) / align;
    int64_t a = units * tid / nth, b = units * (tid + 1) / nth;

    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}


/* a pass run by one thread alone has no one to wait for */
static inline void
barrier(nalar_pool *pool, int nth)
{
    if (nth > 1) {
        nalar_pool_barrier(pool);
    }
}


/*
 * Attention of layer `layer` for items [lo, hi) of the pass's item order
 * (by_tile 0: every thread's share of all tiles, the pass by rows), or for
 * every item of token tiles [lo, hi) (by_tile 1: the pass by tokens).
 * Reads q from be->qkv, K/V from be->kv, writes be->att; thread tid's own
 * scores buffer.  (cpu_attention.c)
 */
void nalar_cpu_attention(cpu_backend *be, int layer, int tid, int64_t lo,
                         int64_t hi, int by_tile);

/* The pass as pool jobs (cpu_forward.c): split by weight rows, five
 * barriers a layer; or split by tokens (tok_lo, tile_lo, logit_lo set),
 * one barrier a layer.  arg: the cpu_backend with its pass in flight. */
void nalar_cpu_forward_rows(void *arg, int tid, int nth);
void nalar_cpu_forward_tokens(void *arg, int tid, int nth);

/* LoRA (cpu_lora.c).  The backend's lora_attach. */
int nalar_cpu_lora_attach(nalar_backend *b, int32_t id,
                          const struct nalar_lora *a, nalar_err *err);
/* Group the batch's tokens by adapter (lora_tok, lora_groups, n_groups),
 * checking each id; before the pass, on the calling thread. */
int nalar_cpu_lora_group(cpu_backend *be, const nalar_batch *batch,
                         nalar_err *err);
/* y[t, lo:hi] += scale * B[lo:hi, :] (A x_t) for the tokens t in [t0, t1)
 * of the pass that have an adapter adapting matrix `kind` of layer l;
 * x and y: token t0's rows (ldx, ldy apart).  Nothing when no token of
 * the pass has an adapter. */
void nalar_cpu_lora(cpu_backend *be, int l, int kind, int tid,
                    const float *x, int ldx, int64_t t0, int64_t t1,
                    float *y, int ldy, int64_t lo, int64_t hi);
void nalar_cpu_lora_free(cpu_backend *be);

#endif
