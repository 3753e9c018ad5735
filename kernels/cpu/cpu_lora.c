/*
 * LoRA adapters on the CPU backend: attaching an adapter (lora.h) and the
 * low-rank products a pass adds for the tokens that have one.
 *
 * For each matrix W an adapter adapts, a token t under it gets
 *   y[t, :] = W x_t + scale * B (A x_t)
 * where A is (rank, cols) and B (rows, rank).  The base product is the
 * pass's as it always was (cpu_forward.c: every token of the pass, W read
 * once); the adapter's product is added after it into the same rows, by
 * the thread that owns them:
 *   u_t = A x_t         (rank floats; each thread computes it for the
 *                        tokens it needs, redundantly across threads in
 *                        the pass by rows: rank * cols per token, cheap)
 *   y[t, lo:hi] += scale * (B[lo:hi, :] u_t)
 * so no barrier is added.  Gather by adapter (the shape of S-LoRA's and
 * Punica's kernels): the pass's tokens are grouped by adapter once per
 * pass (nalar_cpu_lora_group), and each group's rows of x are gathered so
 * that one product over the group reads its A and B once (per
 * LORA_CHUNK tokens), not once per token.
 *
 * Batch invariance, as the base kernels keep it: u_t and (B u_t)[r] are
 * each one nalar_cpu_matmul element (the same operations whatever tile or
 * group it falls in, cpu_matmul.h), then y += scale * v: a token's numbers
 * do not depend on which other adapters share its pass, on how its prompt
 * was chunked, on the thread nor on the way the pass runs.  Tokens with no
 * adapter, and passes with none (batch.adapter NULL or all 0), run no
 * instruction here: their results are bit for bit the base model's.
 *
 * Activations: the adapter products always take the F32 normalised input
 * (and F32 attention output, F32 silu(g) * u), also when the base products
 * take 16- or 8-bit codes (act_i16): A and B are small and u is rank wide,
 * so rounding x buys nothing there.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend_impl.h"
#include "lora.h"


/* the adapter's view and the base's matrix of kind k */
static const nalar_lora_mat *
lora_view(const nalar_lora_layer *A, int k)
{
    const nalar_lora_mat *v[LORA_KINDS] = {
        &A->wq, &A->wk, &A->wv, &A->wo, &A->w_gate, &A->w_up, &A->w_down
    };

    return v[k];
}


static const nalar_mat *
base_view(const nalar_layer *L, int k)
{
    const nalar_mat *v[LORA_KINDS] = {
        &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down
    };

    return v[k];
}


static const char *
kind_name(int k)
{
    static const char *names[LORA_KINDS] = {
        "q", "k", "v", "output", "gate", "up", "down"
    };

    return names[k];
}


static int
lora_type_ok(ggml_type t)
{
    return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16
           || t == GGML_Q8_0;
}


static void
mats_free(cpu_lora_mat *mats, int32_t n)
{
    if (mats == NULL) {
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        if (!mats[i].shares_a) {
            nalar_cpu_mat_free(&mats[i].a);
        }
        nalar_cpu_mat_free(&mats[i].b);
    }
    free(mats);
}


/*
 * Kind k of layer l: checked against the base's matrix, then held as the
 * kernels read it.  A that is the previous kind's too (phi3's fused
 * q | k | v and gate | up: the adapter adapts the fused tensor, and each
 * view's B is its rows) is held once.
 */
static int
mat_attach(cpu_backend *be, const nalar_lora *a, int l, int k,
           cpu_lora_mat *mats, int32_t *rank, nalar_err *err)
{
    const nalar_lora_mat *s = lora_view(&a->layers[l], k);
    const nalar_mat      *W = base_view(&be->m->layers[l], k);
    cpu_lora_mat         *M = &mats[l * LORA_KINDS + k];

    if (s->a.data == NULL) {
        return 0;
    }
    if (s->b.data == NULL || s->a.rows <= 0 || s->a.cols != W->cols
        || s->b.rows != W->rows || s->b.cols != s->a.rows
        || !lora_type_ok(s->a.type) || !lora_type_ok(s->b.type)
        || !isfinite(s->scale))
    {
        return nalar_fail(err, "cpu backend: adapter '%s': layer %d's %s: "
                          "A (%lld, %lld) %s and B (%lld, %lld) %s do not "
                          "fit the base's (%lld, %lld), or scale %g",
                          a->name ? a->name : "", l, kind_name(k),
                          (long long) s->a.rows, (long long) s->a.cols,
                          ggml_type_name(s->a.type), (long long) s->b.rows,
                          (long long) s->b.cols, ggml_type_name(s->b.type),
                          (long long) W->rows, (long long) W->cols,
                          (double) s->scale);
    }
    if (k > 0 && M[-1].a.W != NULL && M[-1].a.W->data == s->a.data
        && M[-1].a.W->type == s->a.type && M[-1].a.W->rows == s->a.rows
        && M[-1].a.W->cols == s->a.cols)
    {
        M->a = M[-1].a;
        M->shares_a = 1;
    } else if (nalar_cpu_mat_init(&M->a, &s->a, 0, err) != 0) {
        return -1;
    }
    if (nalar_cpu_mat_init(&M->b, &s->b, 0, err) != 0) {
        return -1;
    }
    M->scale = s->scale;
    *rank = s->a.rows > *rank ? (int32_t) s->a.rows : *rank;
    return 0;
}


/*
 * Make adapter `a` the one batches name by `id`: ids run 1, 2, ... in
 * order; attaching an id already attached replaces that adapter.  Called
 * while no pass runs.
 */
int
nalar_cpu_lora_attach(nalar_backend *b, int32_t id, const nalar_lora *a,
                      nalar_err *err)
{
    cpu_backend        *be = b->impl;
    const nalar_config *c = &be->m->cfg;
    int32_t             rank = 0, nl = c->n_layers;
    cpu_lora_mat       *mats;
    int64_t             wide;

    if (id < 1 || id > be->n_lora + 1) {
        return nalar_fail(err, "cpu backend: adapter id %d (ids run 1, 2, "
                          "... in order; %d attached)", id, be->n_lora);
    }
    if (a == NULL || a->n_layers != nl || a->layers == NULL) {
        return nalar_fail(err, "cpu backend: adapter '%s' has %d layers, "
                          "the model %d", a && a->name ? a->name : "",
                          a ? a->n_layers : 0, nl);
    }
    mats = calloc((size_t) nl * LORA_KINDS, sizeof(*mats));
    if (mats == NULL) {
        return nalar_fail(err, "cpu backend: out of memory");
    }
    for (int l = 0; l < nl; l++) {
        for (int k = 0; k < LORA_KINDS; k++) {
            if (mat_attach(be, a, l, k, mats, &rank, err) != 0) {
                mats_free(mats, nl * LORA_KINDS);
                return -1;
            }
        }
    }

    /* each thread's scratch: LORA_CHUNK rows of gathered x (cols up to
     * `wide`), of u (rank) and of B u (rows up to `wide`) */
    wide = c->dim > be->q_dim ? c->dim : be->q_dim;
    wide = c->ffn_dim > wide ? c->ffn_dim : wide;
    if (rank > be->lora_rank || be->lora_buf == NULL) {
        int32_t r = rank > be->lora_rank ? rank : be->lora_rank;
        int64_t n = ((LORA_CHUNK * (2 * wide + r)) + 15) & ~(int64_t) 15;
        float  *buf = nalar_alloc_lines((size_t) n * sizeof(float)
                                        * nalar_pool_size(be->pool));

        if (buf == NULL) {
            mats_free(mats, nl * LORA_KINDS);
            return nalar_fail(err, "cpu backend: out of memory");
        }
        free(be->lora_buf);
        be->lora_buf = buf;
        be->lora_buf_floats = n;
        be->lora_rank = r;
    }
    if (id > be->n_lora) {
        cpu_lora   *t = realloc(be->lora, (size_t) id * sizeof(*t));
        lora_group *g;

        if (t == NULL) {
            mats_free(mats, nl * LORA_KINDS);
            return nalar_fail(err, "cpu backend: out of memory");
        }
        be->lora = t;
        g = realloc(be->lora_groups, (size_t) id * sizeof(*g));
        if (g == NULL) {
            mats_free(mats, nl * LORA_KINDS);
            return nalar_fail(err, "cpu backend: out of memory");
        }
        be->lora_groups = g;
        be->lora[id - 1].mats = NULL;
        be->n_lora = id;
    }
    mats_free(be->lora[id - 1].mats, nl * LORA_KINDS);
    be->lora[id - 1].mats = mats;
    be->lora[id - 1].src = a;
    return 0;
}


void
nalar_cpu_lora_free(cpu_backend *be)
{
    for (int32_t i = 0; i < be->n_lora; i++) {
        mats_free(be->lora[i].mats, be->m->cfg.n_layers * LORA_KINDS);
    }
    free(be->lora);
    free(be->lora_groups);
    free(be->lora_buf);
    be->lora = NULL;
    be->lora_groups = NULL;
    be->lora_buf = NULL;
    be->n_lora = 0;
}


/*
 * A counting sort of the pass's tokens by adapter (stable: ascending
 * within a group), leaving out the base's (id 0); only the groups that
 * have tokens are kept.  lora_tok holds cap_tok >= n_tokens entries.
 */
int
nalar_cpu_lora_group(cpu_backend *be, const nalar_batch *bt, nalar_err *err)
{
    lora_group *g = be->lora_groups;
    int32_t     start = 0, n = 0;

    be->n_groups = 0;
    if (bt->adapter == NULL) {
        return 0;
    }
    for (int32_t i = 0; i < be->n_lora; i++) {
        g[i].id = i + 1;
        g[i].n = 0;
    }
    for (int32_t t = 0; t < bt->n_tokens; t++) {
        int32_t id = bt->adapter[t];

        if (id < 0 || id > be->n_lora) {
            return nalar_fail(err, "cpu backend: token %d names adapter %d "
                              "(%d attached)", t, id, be->n_lora);
        }
        if (id > 0) {
            g[id - 1].n++;
        }
    }
    for (int32_t i = 0; i < be->n_lora; i++) {
        g[i].start = start;
        start += g[i].n;
        g[i].n = 0;
    }
    for (int32_t t = 0; t < bt->n_tokens; t++) {
        int32_t id = bt->adapter[t];

        if (id > 0) {
            be->lora_tok[g[id - 1].start + g[id - 1].n++] = t;
        }
    }
    for (int32_t i = 0; i < be->n_lora; i++) {
        if (g[i].n > 0) {
            g[n++] = g[i];
        }
    }
    be->n_groups = n;
    return 0;
}


/*
 * One group's tokens in [t0, t1) (ascending: a run of its list), up to
 * LORA_CHUNK at a time: gather their x, u = A x, v = B[lo:hi] u, then
 * y += scale * v.  xg, u, v: thread tid's scratch.
 */
static void
group_product(const cpu_lora_mat *M, const int32_t *tok, int32_t n,
              const float *x, int ldx, int64_t t0, int64_t t1, float *y,
              int ldy, int64_t lo, int64_t hi, float *xg, float *u,
              float *v)
{
    int     cols = (int) M->a.W->cols, rank = (int) M->a.W->rows;
    int     rows = (int) M->b.W->rows;
    float   s = M->scale;
    int32_t i = 0;

    while (i < n && tok[i] < t0) {
        i++;
    }
    while (i < n && tok[i] < t1) {
        int k = 0;

        for (; k < LORA_CHUNK && i + k < n && tok[i + k] < t1; k++) {
            memcpy(xg + (int64_t) k * cols,
                   x + (tok[i + k] - t0) * (int64_t) ldx,
                   (size_t) cols * sizeof(float));
        }
        nalar_cpu_matmul(&M->a, xg, k, cols, u, rank, 0, rank, 0);
        nalar_cpu_matmul(&M->b, u, k, rank, v, rows, lo, hi, 0);
        for (int j = 0; j < k; j++) {
            float       *yr = y + (tok[i + j] - t0) * (int64_t) ldy;
            const float *vr = v + (int64_t) j * rows;

            for (int64_t r = lo; r < hi; r++) {
                yr[r] += s * vr[r];
            }
        }
        i += k;
    }
}


void
nalar_cpu_lora(cpu_backend *be, int l, int kind, int tid, const float *x,
               int ldx, int64_t t0, int64_t t1, float *y, int ldy,
               int64_t lo, int64_t hi)
{
    const nalar_config *c = &be->m->cfg;
    float              *xg, *u, *v;
    int64_t             wide;

    if (be->n_groups == 0 || lo >= hi || t0 >= t1) {
        return;
    }
    wide = c->dim > be->q_dim ? c->dim : be->q_dim;
    wide = c->ffn_dim > wide ? c->ffn_dim : wide;
    xg = be->lora_buf + (int64_t) tid * be->lora_buf_floats;
    v = xg + LORA_CHUNK * wide;
    u = v + LORA_CHUNK * wide;
    for (int32_t g = 0; g < be->n_groups; g++) {
        const lora_group   *G = &be->lora_groups[g];
        const cpu_lora_mat *M = &be->lora[G->id - 1].mats[l * LORA_KINDS
                                                           + kind];

        if (M->a.W != NULL) {
            group_product(M, be->lora_tok + G->start, G->n, x, ldx, t0, t1,
                          y, ldy, lo, hi, xg, u, v);
        }
    }
}
