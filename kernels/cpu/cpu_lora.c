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
 * so no barrier is added.  Why u is not shared between threads in the
 * pass by rows: every row a thread owns needs all of u_t, and u_t needs
 * all of x_t, which is complete only after the barrier that ends the
 * phase before (the output and down products write x by rows, attention
 * writes att by heads, gate and up write h by rows).  One thread making
 * u_t for the others would need a second barrier per product family;
 * each thread making a part of u_t from its own rows of x (split-K) would
 * sum u_t in an order that depends on the thread count, and a token's
 * numbers would then depend on how the pass runs.  What is repeated is
 * rank * cols per token per thread, against the base product's rows *
 * cols / threads; where the pass splits q, k and v by token (passes of
 * many sequences, qkv_by_rows) and in the pass by tokens nothing is
 * repeated.  Gather by adapter (the shape of S-LoRA's and
 * Punica's kernels): the pass's tokens are grouped by adapter once per
 * pass (nalar_cpu_lora_group), and each group's rows of x are gathered so
 * that one product over the group reads its A and B once (per
 * LORA_CHUNK tokens), not once per token.  The A of the matrices that
 * read one input (q, k and v; gate and up) are stacked at attach, so the
 * first of them a thread meets makes u for all (one gather, one product)
 * and keeps it for the others (lora_key).
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


/* the family of kind k: the products that read the same input */
static const int fam_of[LORA_KINDS] = {
    LORA_FAM_QKV, LORA_FAM_QKV, LORA_FAM_QKV, LORA_FAM_O, LORA_FAM_FFN,
    LORA_FAM_FFN, LORA_FAM_DOWN
};


static void
lora_free(cpu_lora *L, int32_t n_layers)
{
    if (L->mats != NULL) {
        for (int32_t i = 0; i < n_layers * LORA_KINDS; i++) {
            nalar_cpu_mat_free(&L->mats[i].b);
        }
    }
    if (L->fams != NULL) {
        for (int32_t i = 0; i < n_layers * LORA_FAMS; i++) {
            nalar_cpu_mat_free(&L->fams[i].a);
            free(L->fams[i].stack);
        }
    }
    free(L->mats);
    free(L->fams);
    L->mats = NULL;
    L->fams = NULL;
}


/* Kind k of layer l: B checked against the base's matrix and held as the
 * kernels read it (A: fam_attach). */
static int
mat_attach(cpu_backend *be, const nalar_lora *a, int l, int k,
           cpu_lora_mat *M, nalar_err *err)
{
    const nalar_lora_mat *s = lora_view(&a->layers[l], k);
    const nalar_mat      *W = base_view(&be->m->layers[l], k);

    if (s->a.data == NULL) {
        return 0;
    }
    if (s->b.data == NULL || s->a.rows <= 0 || s->a.cols != W->cols
        || s->b.rows != W->rows || s->b.cols != s->a.rows
        || !nalar_lora_type_ok(s->a.type)
        || !nalar_lora_type_ok(s->b.type)
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
    if (nalar_cpu_mat_init(&M->b, &s->b, 0, err) != 0) {
        return -1;
    }
    M->scale = s->scale;
    M->adapted = 1;
    return 0;
}


/*
 * Family f of layer l: the A of each kind it adapts, stacked by rows in
 * kind order, an A shared by two kinds (phi3's fused q | k | v and
 * gate | up: the adapter adapts the fused tensor, and each view's B is
 * its rows) once; each kind's u_off.  One A is held as it is; several
 * are copied into one matrix, of their type where they share it, else
 * F32 (each value as the kernels would widen it, so u is the same).
 */
static int
fam_attach(const nalar_lora *a, int l, int f, cpu_lora_mat *mats,
           cpu_lora_fam *F, int32_t *urank, nalar_err *err)
{
    const nalar_mat *A[LORA_KINDS];
    int32_t          off[LORA_KINDS], rows = 0;
    int              n = 0, same = 1;

    for (int k = 0; k < LORA_KINDS; k++) {
        const nalar_mat *s = &lora_view(&a->layers[l], k)->a;
        int              j = 0;

        if (fam_of[k] != f || !mats[k].adapted) {
            continue;
        }
        while (j < n && !(A[j]->data == s->data && A[j]->type == s->type
                          && A[j]->rows == s->rows)) {
            j++;
        }
        if (j == n) {
            A[n] = s;
            off[n++] = rows;
            rows += (int32_t) s->rows;
            same &= s->type == A[0]->type;
        }
        mats[k].u_off = off[j];
    }
    if (n == 0) {
        return 0;
    }
    F->W = *A[0];
    if (n > 1) {
        ggml_type t = same ? A[0]->type : GGML_F32;
        size_t    rb = ggml_row_size(t, (uint64_t) A[0]->cols);
        uint8_t  *p = malloc(rb * (size_t) rows);

        if (p == NULL) {
            return nalar_fail(err, "cpu backend: out of memory");
        }
        for (int j = 0, r = 0; j < n; r += (int) A[j]->rows, j++) {
            if (same) {
                memcpy(p + rb * (size_t) r, A[j]->data,
                       rb * (size_t) A[j]->rows);
                continue;
            }
            for (int64_t i = 0; i < A[j]->rows; i++) {
                nalar_cpu_get_row(A[j], i, (float *) (void *)
                                           (p + rb * (size_t) (r + i)));
            }
        }
        F->stack = p;
        F->W.type = t;
        F->W.rows = rows;
        F->W.data = p;
    }
    *urank = rows > *urank ? rows : *urank;
    return nalar_cpu_mat_init(&F->a, &F->W, 0, err);
}


/* each thread's scratch for up to `urank` rows of u per token */
static int
scratch(cpu_backend *be, int32_t urank, nalar_err *err)
{
    const nalar_config *c = &be->m->cfg;
    int                 nth = nalar_pool_size(be->pool);
    int64_t             wide, n;
    float              *buf;

    if (be->lora_buf != NULL && urank <= be->lora_urank) {
        return 0;
    }
    /* LORA_CHUNK rows of gathered x (cols up to `wide`) and of B u (rows
     * up to `wide`) */
    wide = c->dim > be->q_dim ? c->dim : be->q_dim;
    wide = c->ffn_dim > wide ? c->ffn_dim : wide;
    n = (2 * LORA_CHUNK * wide + 15) & ~(int64_t) 15;
    buf = nalar_alloc_lines((size_t) (n * nth) * sizeof(float));
    if (be->lora_key == NULL) {
        be->lora_key = calloc((size_t) nth, sizeof(lora_ukey));
    }
    if (buf == NULL || be->lora_key == NULL) {
        free(buf);
        return nalar_fail(err, "cpu backend: out of memory");
    }
    free(be->lora_buf);
    be->lora_buf = buf;
    be->lora_buf_floats = n;
    be->lora_urank = urank > be->lora_urank ? urank : be->lora_urank;
    /* u is sized for the next pass (nalar_cpu_lora_group) */
    free(be->lora_u);
    be->lora_u = NULL;
    be->lora_u_cap = 0;
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
    cpu_backend *be = b->impl;
    int32_t      urank = 0, nl = be->m->cfg.n_layers;
    cpu_lora     L = { a, NULL, NULL };

    if (id < 1 || id > be->n_lora + 1) {
        return nalar_fail(err, "cpu backend: adapter id %d (ids run 1, 2, "
                          "... in order; %d attached)", id, be->n_lora);
    }
    if (a == NULL || a->n_layers != nl || a->layers == NULL) {
        return nalar_fail(err, "cpu backend: adapter '%s' has %d layers, "
                          "the model %d", a && a->name ? a->name : "",
                          a ? a->n_layers : 0, nl);
    }
    L.mats = calloc((size_t) nl * LORA_KINDS, sizeof(*L.mats));
    L.fams = calloc((size_t) nl * LORA_FAMS, sizeof(*L.fams));
    if (L.mats == NULL || L.fams == NULL) {
        lora_free(&L, nl);
        return nalar_fail(err, "cpu backend: out of memory");
    }
    for (int l = 0; l < nl; l++) {
        cpu_lora_mat *M = &L.mats[l * LORA_KINDS];

        for (int k = 0; k < LORA_KINDS; k++) {
            if (mat_attach(be, a, l, k, &M[k], err) != 0) {
                lora_free(&L, nl);
                return -1;
            }
        }
        for (int f = 0; f < LORA_FAMS; f++) {
            if (fam_attach(a, l, f, M, &L.fams[l * LORA_FAMS + f], &urank,
                           err) != 0)
            {
                lora_free(&L, nl);
                return -1;
            }
        }
    }
    if (scratch(be, urank, err) != 0) {
        lora_free(&L, nl);
        return -1;
    }
    if (id > be->n_lora) {
        cpu_lora   *t = realloc(be->lora, (size_t) id * sizeof(*t));
        lora_group *g = t != NULL ? realloc(be->lora_groups,
                                            (size_t) id * sizeof(*g))
                                  : NULL;

        be->lora = t != NULL ? t : be->lora;
        be->lora_groups = g != NULL ? g : be->lora_groups;
        if (g == NULL) {
            lora_free(&L, nl);
            return nalar_fail(err, "cpu backend: out of memory");
        }
        be->lora[id - 1].mats = NULL;
        be->lora[id - 1].fams = NULL;
        be->n_lora = id;
    }
    lora_free(&be->lora[id - 1], nl);
    be->lora[id - 1] = L;
    return 0;
}


void
nalar_cpu_lora_free(cpu_backend *be)
{
    for (int32_t i = 0; i < be->n_lora; i++) {
        lora_free(&be->lora[i], be->m->cfg.n_layers);
    }
    free(be->lora);
    free(be->lora_groups);
    free(be->lora_buf);
    free(be->lora_u);
    free(be->lora_key);
    be->lora = NULL;
    be->lora_groups = NULL;
    be->lora_buf = NULL;
    be->lora_u = NULL;
    be->lora_key = NULL;
    be->n_lora = 0;
}


/*
 * A counting sort of the pass's tokens by adapter (stable: ascending
 * within a group), leaving out the base's (id 0); only the groups that
 * have tokens are kept.  lora_tok holds cap_tok >= n_tokens entries;
 * each thread's u room grows to the pass's adapted tokens.
 */
int
nalar_cpu_lora_group(cpu_backend *be, const nalar_batch *bt, nalar_err *err)
{
    lora_group *g = be->lora_groups;
    int32_t     start = 0, n = 0;

    be->n_groups = 0;
    be->lora_pass++;
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
    if (start > be->lora_u_cap) {
        int32_t cap = be->cap_tok;
        float  *u = nalar_alloc_lines((size_t) cap * be->lora_urank
                                      * nalar_pool_size(be->pool)
                                      * sizeof(float));

        if (u == NULL) {
            return nalar_fail(err, "cpu backend: out of memory");
        }
        free(be->lora_u);
        be->lora_u = u;
        be->lora_u_cap = cap;
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


/* the run [*i0, *i1) of a group's tokens (ascending) that lie in
 * [t0, t1) */
static void
group_run(const int32_t *tok, int32_t n, int64_t t0, int64_t t1,
          int32_t *i0, int32_t *i1)
{
    int32_t i = 0, j;

    while (i < n && tok[i] < t0) {
        i++;
    }
    j = i;
    while (j < n && tok[j] < t1) {
        j++;
    }
    *i0 = i;
    *i1 = j;
}


/*
 * u = A x of family f of layer l for every adapted token in [t0, t1):
 * row j of u (urank apart) for token lora_tok[j]; each group's x
 * gathered LORA_CHUNK tokens at a time into xg.
 */
static void
family_u(cpu_backend *be, int l, int f, const float *x, int ldx,
         int64_t t0, int64_t t1, float *u, float *xg)
{
    int64_t ur = be->lora_urank;

    for (int32_t g = 0; g < be->n_groups; g++) {
        const lora_group   *G = &be->lora_groups[g];
        const cpu_lora_fam *F = &be->lora[G->id - 1].fams[l * LORA_FAMS
                                                          + f];
        const int32_t      *tok = be->lora_tok + G->start;
        int                 cols = (int) F->W.cols;
        int32_t             i, end;

        if (F->W.rows == 0) {
            continue;
        }
        group_run(tok, G->n, t0, t1, &i, &end);
        while (i < end) {
            int k = 0;

            for (; k < LORA_CHUNK && i + k < end; k++) {
                memcpy(xg + (int64_t) k * cols,
                       x + (tok[i + k] - t0) * (int64_t) ldx,
                       (size_t) cols * sizeof(float));
            }
            nalar_cpu_matmul(&F->a, xg, k, cols, u + (G->start + i) * ur,
                             (int) ur, 0, F->W.rows, 0);
            i += k;
        }
    }
}


void
nalar_cpu_lora(cpu_backend *be, int l, int kind, int tid, const float *x,
               int ldx, int64_t t0, int64_t t1, float *y, int ldy,
               int64_t lo, int64_t hi)
{
    int        f = fam_of[kind];
    int64_t    ur = be->lora_urank;
    float     *xg, *v, *u;
    lora_ukey *key;

    if (be->n_groups == 0 || lo >= hi || t0 >= t1) {
        return;
    }
    xg = be->lora_buf + (int64_t) tid * be->lora_buf_floats;
    v = xg + be->lora_buf_floats / 2;
    u = be->lora_u + (int64_t) tid * be->lora_u_cap * ur;
    key = &be->lora_key[tid];
    if (key->pass != be->lora_pass || key->layer != l || key->fam != f
        || key->t0 != t0 || key->t1 != t1)
    {
        family_u(be, l, f, x, ldx, t0, t1, u, xg);
        key->pass = be->lora_pass;
        key->layer = l;
        key->fam = f;
        key->t0 = t0;
        key->t1 = t1;
    }
    for (int32_t g = 0; g < be->n_groups; g++) {
        const lora_group   *G = &be->lora_groups[g];
        const cpu_lora_mat *M = &be->lora[G->id - 1].mats[l * LORA_KINDS
                                                           + kind];
        const int32_t      *tok = be->lora_tok + G->start;
        int                 rows = M->adapted ? (int) M->b.W->rows : 0;
        int32_t             i, end;

        if (!M->adapted) {
            continue;
        }
        group_run(tok, G->n, t0, t1, &i, &end);
        while (i < end) {
            int k = end - i < LORA_CHUNK ? end - i : LORA_CHUNK;

            /* v = B[lo:hi] u, then y += scale * v */
            nalar_cpu_matmul(&M->b, u + (G->start + i) * ur + M->u_off, k,
                             (int) ur, v, rows, lo, hi, 0);
            for (int j = 0; j < k; j++) {
                float       *yr = y + (tok[i + j] - t0) * (int64_t) ldy;
                const float *vr = v + (int64_t) j * rows;

                for (int64_t r = lo; r < hi; r++) {
                    yr[r] += M->scale * vr[r];
                }
            }
            i += k;
        }
    }
}
