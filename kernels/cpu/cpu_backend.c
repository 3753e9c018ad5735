/*
 * The CPU backend: a Llama forward pass over a batch of tokens from many
 * sequences, reading K/V from the paged pool.  This file: creation and
 * destruction, the scratch a pass needs, the KV pool's storage, and the
 * way each pass runs.  The pass itself is in cpu_forward.c, attention in
 * cpu_attention.c, their shared state in cpu_backend_impl.h.
 *
 * The whole pass is one parallel region on the worker pool (or, for a
 * draft's small passes, the calling thread alone), run one of two ways
 * (choose_way measures both and runs the faster): by weight rows, five
 * barriers a layer, or by tokens, one barrier a layer (cpu_forward.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu_backend.h"
#include "cpu_backend_impl.h"
#include "clock.h"
#include "sampler.h"


static int
grow(cpu_backend *be, int32_t n_tok, int32_t max_pos, nalar_err *err)
{
    const nalar_config *c = &be->m->cfg;
    int                 nth = nalar_pool_size(be->pool);

    if (n_tok > be->cap_tok) {
        int32_t cap = be->cap_tok ? be->cap_tok : 16;
        int     ok = 1;

        while (cap < n_tok) {
            cap *= 2;
        }
        /* scratch: nothing in it outlives a pass, so no copy */
#define GROW(p, n) do {                                                     \
            void *q_ = nalar_alloc_lines((size_t) (n) * sizeof(*(p)));       \
            if (q_ == NULL) ok = 0; else { free(p); p = q_; }                \
        } while (0)
        GROW(be->x, (int64_t) cap * c->dim);
        GROW(be->xb, (int64_t) nth * cap * c->dim);
        GROW(be->qkv, (int64_t) cap * (be->q_dim + 2 * be->kv_dim));
        GROW(be->att, (int64_t) cap * be->q_dim);
        GROW(be->hg, (int64_t) cap * c->ffn_dim);
        GROW(be->hu, (int64_t) cap * c->ffn_dim);
        GROW(be->y, (int64_t) cap * c->dim);
        GROW(be->rope_cos, (int64_t) cap * (c->head_dim / 2));
        GROW(be->rope_sin, (int64_t) cap * (c->head_dim / 2));
        GROW(be->logit_rows, cap);
        GROW(be->tiles, cap);
        GROW(be->lora_tok, cap);
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory for %d "
                              "tokens", cap);
        }
        be->cap_tok = cap;
    }
    if (be->act_i16 && be->xq_cap < be->cap_tok) {
        int64_t bytes = be->act_i16 == NALAR_ACT_Q8
                        ? nalar_quant_x8_bytes(be->cap_tok, c->dim)
                        : be->act_i16 == NALAR_ACT_PAIRS
                        ? nalar_quant_xpairs_bytes(be->cap_tok, c->dim)
                        : nalar_quant_x16_bytes(be->cap_tok, c->dim);
        int     ok = 1;

        GROW(be->xq, (int64_t) nth * bytes);
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory for %d "
                              "tokens' activation codes", be->cap_tok);
        }
        be->xq_bytes = bytes;
        be->xq_cap = be->cap_tok;
    }
    if (max_pos + 1 > be->scores_cap) {
        int32_t cap = be->scores_cap ? be->scores_cap : 256;
        int     ok = 1;

        while (cap < max_pos + 1) {
            cap *= 2;
        }
        GROW(be->scores, (int64_t) cap * nth * QTILE);
#undef GROW
        if (!ok) {
            return nalar_fail(err, "cpu backend: out of memory");
        }
        be->scores_cap = cap;
    }
    return 0;
}


/* the class of a pass of n tokens: 1 .. 16 tokens one each, then one per
 * power of two */
static int
way_class(int32_t n)
{
    int c = 16;

    if (n <= 16) {
        return n - 1;
    }
    for (int32_t top = 32; top < n && c < WAY_CLASSES - 1; top *= 2) {
        c++;
    }
    return c;
}


/*
 * Which way a pass runs.  Every pass may run on the pool split by weight
 * rows; a pass of two tokens or more may also split by token
 * (nalar_cpu_forward_tokens); a pass of MODE_TOKENS or fewer may also run
 * on the calling thread alone, which wins where waking the pool and its
 * barriers cost more than the pass (a draft's small passes) and where a
 * worker shares its core with another program, so that the barriers wait
 * for it to be scheduled again (a busy machine).
 * Each class of pass sizes measures its ways -- in turn, 5 passes each,
 * the first (cold) not counted -- then runs the fastest, and probes each
 * other way in turn one pass in 64 (a way that measured 25% slower than
 * the fastest, one in eight of its turns), so that a change of load or of
 * where the vCPUs sit is noticed.  A pooled pass whose workers were
 * asleep (after passes run alone) wakes them before it is timed
 * (cpu_forward), so a probe measures the pool, not its wake-up.  Which
 * thread computes a row changes no bit of it, nor do the tiles a split by
 * token forms.
 */
static int
choose_way(cpu_backend *be, int32_t n_tokens, int *alt)
{
    int      c = way_class(n_tokens), cand[N_WAYS], nc = 0, least, best;
    int      other[N_WAYS], no = 0, o;
    unsigned k, probe;

    if (nalar_pool_size(be->pool) == 1) {
        *alt = 0;
        return WAY_ROWS;
    }
    if (be->force_way >= 0) {
        *alt = 0;
        return be->force_way == WAY_TOKENS && n_tokens < 2 ? WAY_ROWS
                                                           : be->force_way;
    }
    cand[nc++] = WAY_ROWS;
    if (n_tokens >= 2) {
        cand[nc++] = WAY_TOKENS;
    }
    if (n_tokens <= MODE_TOKENS) {
        cand[nc++] = WAY_SOLO;
    }
    if (nc == 1) {
        *alt = 0;
        return WAY_ROWS;
    }
    *alt = 1;
    k = be->way_passes[c]++;
    least = cand[0];
    best = cand[0];
    for (int i = 1; i < nc; i++) {
        if (be->way_n[c][cand[i]] < be->way_n[c][least]) {
            least = cand[i];
        }
        if (be->way_us[c][cand[i]] < be->way_us[c][best]) {
            best = cand[i];
        }
    }
    if (be->way_n[c][least] < 5) {
        return least;
    }
    if (k % 64 != 63) {
        return best;
    }
    for (int i = 0; i < nc; i++) {
        if (cand[i] != best) {
            other[no++] = cand[i];
        }
    }
    probe = be->way_probes[c]++;
    o = other[probe % (unsigned) no];
    if (be->way_us[c][o] > 1.25 * be->way_us[c][best]
        && probe / (unsigned) no % 8 != 7)
    {
        return best;
    }
    return o;
}


/* an empty pooled run: wakes sleeping workers before a timed pass */
static void
wake_only(void *arg, int tid, int n)
{
    (void) arg;
    (void) tid;
    (void) n;
}


/* the measured time of a pass run `way` */
static void
learn_way(cpu_backend *be, int32_t n_tokens, int way, double us)
{
    int     c = way_class(n_tokens);
    double *est = &be->way_us[c][way];
    int    *n = &be->way_n[c][way];

    us /= n_tokens;
    if (*n == 0) {
        /* the first pass each way warms caches: not counted */
    } else if (*n < 5) {
        *est = (*est * (*n - 1) + us) / *n;
    } else {
        /* a moving average; a pass stalled by the OS counts at most
         * twice the estimate */
        *est = 0.9 * *est + 0.1 * (us < 2 * *est ? us : 2 * *est);
    }
    (*n)++;
}


uint64_t
nalar_cpu_backend_test_solo_passes(nalar_backend *b)
{
    return ((cpu_backend *) b->impl)->solo_passes;
}


void
nalar_cpu_backend_test_way(nalar_backend *b, int way)
{
    ((cpu_backend *) b->impl)->force_way = way;
}


void
nalar_cpu_backend_test_stall(nalar_backend *b, int us)
{
    nalar_pool_test_stall(((cpu_backend *) b->impl)->pool, us);
}


static int
cpu_forward(nalar_backend *b, nalar_kv_pool *kv, const nalar_batch *batch,
            float *logits, nalar_err *err)
{
    cpu_backend *be = b->impl;
    int32_t      max_pos = 0, n_logits = 0;
    int          way, timed, nth;
    double       t0;

    for (int32_t t = 0; t < batch->n_tokens; t++) {
        const nalar_seq_kv *s = batch->seq[t];

        if (batch->pos[t] < 0
            || batch->pos[t] >= s->n_blocks * NALAR_KV_BLOCK
            || batch->tokens[t] < 0
            || batch->tokens[t] >= be->m->cfg.n_vocab)
        {
            return nalar_fail(err, "cpu backend: token %d (id %d, pos %d) "
                              "outside its sequence's reserved KV or the "
                              "vocabulary", t, batch->tokens[t],
                              batch->pos[t]);
        }
        max_pos = batch->pos[t] > max_pos ? batch->pos[t] : max_pos;
    }
    if (grow(be, batch->n_tokens, max_pos, err) != 0
        || nalar_cpu_lora_group(be, batch, err) != 0)
    {
        return -1;
    }
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        if (batch->want_logits[t]) {
            be->logit_rows[n_logits++] = t;
        }
    }
    if (n_logits != batch->n_logits) {
        return nalar_fail(err, "cpu backend: batch says %d logits but marks "
                          "%d", batch->n_logits, n_logits);
    }
    if (batch->n_tokens == 0) {
        return 0;
    }
    way = choose_way(be, batch->n_tokens, &timed);
    nth = nalar_pool_size(be->pool);
    /* thread i's tokens start at tok_lo[i]: split by token, even shares;
     * otherwise thread 0 "owns" them all, so the tiles below span any
     * tokens */
    for (int i = 0; i <= nth; i++) {
        int64_t lo = i == 0 ? 0 : batch->n_tokens, hi;

        if (way == WAY_TOKENS && i < nth) {
            split(batch->n_tokens, i, nth, 1, &lo, &hi);
        }
        be->tok_lo[i] = (int32_t) lo;
    }
    /* attention's token tiles: runs of one sequence's consecutive
     * positions, tile_tokens at most (tile_rows_max rows with the KV
     * group's heads), within one thread's tokens; each thread's first
     * tile and logit row */
    {
        int32_t t = 0, owner = 0;

        be->n_tiles = 0;
        while (t < batch->n_tokens) {
            int32_t n = 1, end;

            while (be->tok_lo[owner + 1] <= t) {
                be->tile_lo[++owner] = be->n_tiles;
            }
            end = be->tok_lo[owner + 1];
            while (n < be->tile_tokens && t + n < end
                   && batch->seq[t + n] == batch->seq[t]
                   && batch->pos[t + n] == batch->pos[t] + n)
            {
                n++;
            }
            be->tiles[be->n_tiles].t0 = t;
            be->tiles[be->n_tiles].n = n;
            be->n_tiles++;
            t += n;
        }
        be->tile_lo[0] = 0;
        while (owner < nth) {
            be->tile_lo[++owner] = be->n_tiles;
        }
        for (int i = 0, li = 0; i <= nth; i++) {
            while (li < n_logits && be->logit_rows[li] < be->tok_lo[i]) {
                li++;
            }
            be->logit_lo[i] = li;
        }
        be->one_seq = 1;
        be->max_run = 1;
        for (int32_t run = 1, i = 1; i < batch->n_tokens; i++) {
            run = batch->seq[i] == batch->seq[i - 1] ? run + 1 : 1;
            be->max_run = run > be->max_run ? run : be->max_run;
            be->one_seq &= batch->seq[i] == batch->seq[0];
        }
    }
    be->kv = kv;
    be->batch = batch;
    be->logits = logits;
    if (timed && way != WAY_SOLO && nalar_pool_sleeping(be->pool)) {
        nalar_pool_run(be->pool, wake_only, NULL);
    }
    t0 = nalar_now_s();
    if (way == WAY_SOLO) {
        be->solo_passes++;
        nalar_cpu_forward_rows(be, 0, 1);
    } else {
        nalar_pool_run(be->pool, way == WAY_TOKENS ? nalar_cpu_forward_tokens
                                                   : nalar_cpu_forward_rows,
                       be);
    }
    if (timed) {
        learn_way(be, batch->n_tokens, way, (nalar_now_s() - t0) * 1e6);
    }
    return 0;
}


/* bytes of one of the pool's K or V arrays */
static size_t
kv_bytes(const nalar_kv_pool *p)
{
    return (size_t) p->n_blocks * p->n_layers * NALAR_KV_BLOCK * p->kv_dim
           * (size_t) p->elem_bytes;
}


static void
cpu_kv_copy(void *ctx, int32_t dst, int32_t src)
{
    nalar_kv_pool *p = ctx;
    size_t         n = (size_t) p->n_layers * NALAR_KV_BLOCK * p->kv_dim
                       * (size_t) p->elem_bytes;
    size_t         d = (size_t) nalar_kv_offset(p, dst, 0, 0) * p->elem_bytes;
    size_t         s = (size_t) nalar_kv_offset(p, src, 0, 0) * p->elem_bytes;

    memcpy((char *) p->k + d, (char *) p->k + s, n);
    memcpy((char *) p->v + d, (char *) p->v + s, n);
}


static float *
kv_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    return p == MAP_FAILED ? NULL : p;
}


static void
kv_unmap(float *p, size_t bytes)
{
    if (p != NULL) {
        munmap(p, bytes);
    }
}


/*
 * K and V of the pool in the backend's kv_type: F32, or F16 / BF16 (2
 * bytes an element: cpu_kv16.h rounds them when stored and widens them in
 * attention).  The pool records the type (p->type, p->elem_bytes), which
 * the passes read and the prefix cache's root names.
 */
static int
cpu_kv_alloc(nalar_backend *b, nalar_kv_pool *p, nalar_err *err)
{
    size_t n;

    p->elem_bytes = nalar_kv_elem_bytes(b->kv_type);
    p->type = (int32_t) b->kv_type;
    if (p->elem_bytes == 0) {
        p->elem_bytes = 4;
        p->type = GGML_F32;
        return nalar_fail(err, "cpu backend: KV cache type %d (F32, F16 or "
                          "BF16)", (int) b->kv_type);
    }
    n = kv_bytes(p);

    /* anonymous memory: page-aligned (see nalar_alloc_lines), zero, and
     * committed only as blocks are first written */
    p->k = kv_map(n);
    p->v = kv_map(n);
    if (p->k == NULL || p->v == NULL) {
        kv_unmap(p->k, n);
        kv_unmap(p->v, n);
        p->k = p->v = NULL;
        return nalar_fail(err, "cpu backend: cannot allocate %zu MiB of KV",
                          2 * n >> 20);
    }
    p->copy = cpu_kv_copy;
    p->copy_ctx = p;
    return 0;
}


static void
cpu_kv_free(nalar_backend *b, nalar_kv_pool *p)
{
    kv_unmap(p->k, kv_bytes(p));
    kv_unmap(p->v, kv_bytes(p));
    p->k = p->v = NULL;
}


static void
cpu_destroy(nalar_backend *b)
{
    cpu_backend *be;

    if (b == NULL) {
        return;
    }
    be = b->impl;
    if (be != NULL) {
        if (be->pool != NULL && be->owns_pool) {
            nalar_pool_destroy(be->pool);
        }
        free(be->x);
        free(be->xb);
        free(be->xq);
        free(be->qkv);
        free(be->att);
        free(be->hg);
        free(be->hu);
        free(be->y);
        free(be->rope_cos);
        free(be->rope_sin);
        free(be->inv_freq);
        free(be->scores);
        free(be->logit_rows);
        free(be->tiles);
        free(be->lora_tok);
        nalar_cpu_lora_free(be);
        free(be->tok_lo);
        free(be->tile_lo);
        free(be->logit_lo);
        if (be->layers != NULL) {
            for (int l = 0; l < be->m->cfg.n_layers; l++) {
                cpu_layer *W = &be->layers[l];

                nalar_cpu_mat_free(&W->wq);
                nalar_cpu_mat_free(&W->wk);
                nalar_cpu_mat_free(&W->wv);
                nalar_cpu_mat_free(&W->wo);
                nalar_cpu_mat_free(&W->w_gate);
                nalar_cpu_mat_free(&W->w_up);
                nalar_cpu_mat_free(&W->w_down);
            }
        }
        free(be->layers);
        nalar_cpu_mat_free(&be->output);
        free(be);
    }
    free(b);
}


static nalar_backend *cpu_create(nalar_model *m, int n_threads,
                                 nalar_pool *shared, nalar_err *err);


nalar_backend *
nalar_cpu_backend_create(nalar_model *m, int n_threads, nalar_err *err)
{
    return cpu_create(m, n_threads, NULL, err);
}


void
nalar_cpu_backend_act_i16(nalar_backend *b, int on)
{
    cpu_backend *be = b->impl;

    if (be->act_i16 != on) {
        /* the codes' buffers are sized for one mode: made anew */
        be->xq_cap = 0;
    }
    be->xp_groups = 0;
    for (int l = 0; l < be->m->cfg.n_layers; l++) {
        cpu_layer            *W = &be->layers[l];
        const nalar_cpu_mat *mats[] = { &W->wq, &W->wk, &W->wv, &W->w_gate,
                                         &W->w_up };

        nalar_cpu_mat *all[] = { &W->wq, &W->wk, &W->wv, &W->wo,
                                 &W->w_gate, &W->w_up, &W->w_down };

        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
            nalar_cpu_mat_act(all[i], on);
        }
        /* the shared codes' readers (wo and w_down make their own) */
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (mats[i]->W != NULL && nalar_quant_type(mats[i]->W->type)) {
                be->xp_groups |= nalar_quant_xpairs_group(mats[i]->W->type);
            }
        }
    }
    if (be->output.W != NULL && nalar_quant_type(be->output.W->type)) {
        be->xp_groups |= nalar_quant_xpairs_group(be->output.W->type);
    }
    nalar_cpu_mat_act(&be->output, on);
    be->act_i16 = on;
}


nalar_backend *
nalar_cpu_backend_create_sharing(nalar_model *m, nalar_backend *other,
                                 nalar_err *err)
{
    if (strcmp(other->name, "cpu") != 0) {
        nalar_fail(err, "cpu backend: cannot share the workers of backend "
                   "'%s'", other->name);
        return NULL;
    }
    return cpu_create(m, 0, ((cpu_backend *) other->impl)->pool, err);
}


/* The pass into scratch, then each logit row's argmax.  The engine takes
 * this path for its greedy steps on any backend that has it: on a GPU it
 * saves moving the logits; here it is the same work as the sampler's
 * greedy pick, and it keeps the engine's path tested where no GPU is. */
static int
cpu_forward_argmax(nalar_backend *b, nalar_kv_pool *kv,
                   const nalar_batch *batch, int32_t *ids, float *scratch,
                   nalar_err *err)
{
    cpu_backend *be = b->impl;
    int32_t      V = be->m->cfg.n_vocab;

    if (scratch == NULL) {
        return nalar_fail(err, "cpu backend: forward_argmax needs room for "
                          "the logits");
    }
    if (cpu_forward(b, kv, batch, scratch, err) != 0) {
        return -1;
    }
    for (int32_t i = 0; i < batch->n_logits; i++) {
        ids[i] = nalar_argmax(scratch + (size_t) i * V, V);
    }
    return 0;
}


static nalar_backend *
cpu_create(nalar_model *m, int n_threads, nalar_pool *shared, nalar_err *err)
{
    nalar_backend      *b;
    cpu_backend        *be;
    const nalar_config *c = &m->cfg;
    int                 narrow;

    b = calloc(1, sizeof(*b));
    be = calloc(1, sizeof(*be));
    if (b == NULL || be == NULL) {
        free(b);
        free(be);
        nalar_fail(err, "cpu backend: out of memory");
        return NULL;
    }
    b->name = "cpu";
    b->device = -1;
    b->model = m;
    b->kv_alloc = cpu_kv_alloc;
    b->kv_free = cpu_kv_free;
    b->forward = cpu_forward;
    b->forward_argmax = cpu_forward_argmax;
    b->lora_attach = nalar_cpu_lora_attach;
    b->destroy = cpu_destroy;
    b->impl = be;
    be->m = m;
    be->force_way = -1;
    be->q_dim = c->n_heads * c->head_dim;
    be->kv_dim = c->n_kv_heads * c->head_dim;
    {
        int G = c->n_heads / c->n_kv_heads, rows = tile_rows_max(c);

        be->tile_heads = G < rows ? G : rows;
        be->tile_tokens = rows / be->tile_heads;
        be->head_groups = (G + be->tile_heads - 1) / be->tile_heads;
    }
    be->inv_freq = malloc((size_t) (c->head_dim / 2) * sizeof(float));
    be->pool = shared != NULL ? shared : nalar_pool_create(n_threads);
    be->owns_pool = shared == NULL;
    if (be->inv_freq == NULL || be->pool == NULL) {
        cpu_destroy(b);
        nalar_fail(err, "cpu backend: cannot start %d worker threads",
                   n_threads);
        return NULL;
    }
    {
        size_t n = (size_t) nalar_pool_size(be->pool) + 1;

        be->tok_lo = malloc(n * sizeof(int32_t));
        be->tile_lo = malloc(n * sizeof(int32_t));
        be->logit_lo = malloc(n * sizeof(int32_t));
        if (be->tok_lo == NULL || be->tile_lo == NULL || be->logit_lo == NULL)
        {
            cpu_destroy(b);
            nalar_fail(err, "cpu backend: out of memory");
            return NULL;
        }
    }
    for (int i = 0; i < c->head_dim / 2; i++) {
        be->inv_freq[i] = powf(c->rope_base,
                               -2.0f * (float) i / (float) c->head_dim);
        if (c->rope_scale != 1.0f) {
            be->inv_freq[i] *= c->rope_scale;
        }
        if (m->rope_freqs != NULL) {
            be->inv_freq[i] /= m->rope_freqs[i];
        }
    }
    /* a draft (the backend that borrows the target's pool) holds its
     * weights narrowed (nalar_cpu_mat_init): it only proposes, so a
     * rounded weight costs at most a rejected proposal, never a token,
     * and its passes are bound by reading weights that the target's pass
     * between two of them has pushed out of L2 and by the products'
     * instructions, both of which narrower weights cut */
    narrow = shared != NULL;
    be->layers = calloc((size_t) c->n_layers, sizeof(cpu_layer));
    if (be->layers == NULL) {
        cpu_destroy(b);
        nalar_fail(err, "cpu backend: out of memory");
        return NULL;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        cpu_layer         *W = &be->layers[l];

        if (nalar_cpu_mat_init(&W->wq, &L->wq, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wk, &L->wk, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wv, &L->wv, narrow, err) != 0
            || nalar_cpu_mat_init(&W->wo, &L->wo, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_gate, &L->w_gate, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_up, &L->w_up, narrow, err) != 0
            || nalar_cpu_mat_init(&W->w_down, &L->w_down, narrow, err) != 0)
        {
            cpu_destroy(b);
            return NULL;
        }
    }
    if (nalar_cpu_mat_init(&be->output, &m->output, narrow, err) != 0) {
        cpu_destroy(b);
        return NULL;
    }
    nalar_cpu_drop_mapped(m->gguf);
    return b;
}
