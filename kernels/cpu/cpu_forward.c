/*
 * The CPU backend's forward pass, run by every thread of a pass: one of
 * two ways (cpu_backend.c's choose_way measures both and runs the faster).
 *
 * - by rows (nalar_cpu_forward_rows): phases that depend on each other
 *   are separated by barriers, five per layer.  Work inside a phase is
 *   split by weight rows (matrix products, and the RoPE and KV store of
 *   the q/k/v rows a thread computed; for a pass of many sequences, by
 *   whole sequences), by token (embeddings) or by attention tile, so no
 *   two threads write the same bytes; each thread normalises every token
 *   into its own buffer.
 * - by tokens (nalar_cpu_forward_tokens, passes of two tokens or more):
 *   each thread runs the whole model over its own tokens, meeting the
 *   others once per layer, after the K/V stores.
 *
 * Either way, each product a token's LoRA adapter adapts gets the
 * adapter's low-rank product added into the same rows by the same thread
 * right after the base product (nalar_cpu_lora, cpu_lora.c): q, k and v
 * before finish_qkv (biases, norms, RoPE, the K/V stores), gate and up
 * before swiglu, the output and down products into the residual stream
 * (or, with post-norms, into y before its norm).
 */
#include <math.h>
#include <string.h>

#include "cpu_backend_impl.h"
#include "cpu_kv16.h"
#include "exp_neg.h"

/*
 * One head of a token's K (c < kd) or V (c >= kd: V's column c - kd), x
 * (hd floats), into its slot of the layer's slab in its block: V by row,
 * K transposed within the slab (dimension d of the block's 16 keys is one
 * line, cpu_attention.c); in a 16-bit pool rounded once, here
 * (kv16_narrow), every pass and thread alike.
 */
static void
store_kv(nalar_kv_pool *kv, int kind, int64_t slab, int32_t slot, int64_t c,
         int64_t kd, int hd, const float *x)
{
    uint16_t h[256];
    int64_t  at = c >= kd ? slab + (int64_t) slot * kd + (c - kd)
                          : slab + c * NALAR_KV_BLOCK + slot;

    if (kind == KV_F32) {
        if (c >= kd) {
            memcpy(kv->v + at, x, (size_t) hd * sizeof(float));
            return;
        }
        for (int d = 0; d < hd; d++) {
            kv->k[at + (int64_t) d * NALAR_KV_BLOCK] = x[d];
        }
        return;
    }
    if (c >= kd) {
        kv16_narrow((uint16_t *) kv->v + at, x, hd, kind);
        return;
    }
    for (int d0 = 0; d0 < hd; d0 += 256) {
        int n = hd - d0 < 256 ? hd - d0 : 256;

        kv16_narrow(h, x + d0, n, kind);
        for (int d = 0; d < n; d++) {
            ((uint16_t *) kv->k)[at + (int64_t) (d0 + d) * NALAR_KV_BLOCK] =
                h[d];
        }
    }
}


/*
 * The q/k/v rows [lo, hi) of every token, for whole heads: biases, RoPE,
 * then K and V into the sequences' blocks.  One thread owns these rows, so
 * it writes their K lines (dimension d of a block's 16 keys is one line)
 * and V bytes alone.
 */
static void
finish_qkv(cpu_backend *be, const nalar_layer *L, int l, int64_t t0,
           int64_t t1, int64_t lo, int64_t hi)
{
    const nalar_config *c = &be->m->cfg;
    const nalar_batch  *bt = be->batch;
    nalar_kv_pool      *kv = be->kv;
    int                 hd = c->head_dim;
    int64_t             qd = be->q_dim, kd = be->kv_dim;
    int64_t             ldqkv = qd + 2 * kd;
    int                 kind = cpu_kv_kind(kv);

    for (int64_t t = t0; t < t1; t++) {
        float       *row = be->qkv + t * ldqkv;
        const float *cs = be->rope_cos + t * (hd / 2);
        const float *sn = be->rope_sin + t * (hd / 2);
        int32_t      p = bt->pos[t];
        int32_t      b = bt->seq[t]->blocks[p / NALAR_KV_BLOCK];
        int32_t      slot = p % NALAR_KV_BLOCK;
        int64_t      slab = nalar_kv_offset(kv, b, l, 0);

        for (int64_t h0 = lo; h0 < hi; h0 += hd) {
            float *x = row + h0;

            if (L->bq != NULL) {
                const float *bias = h0 < qd ? L->bq + h0
                                    : h0 < qd + kd ? L->bk + (h0 - qd)
                                    : L->bv + (h0 - qd - kd);

                for (int i = 0; i < hd; i++) x[i] += bias[i];
            }
            if (L->q_norm != NULL && h0 < qd + kd) {
                rmsnorm(x, x, h0 < qd ? L->q_norm : L->k_norm, hd,
                        c->norm_eps);
            }
            if (h0 < qd + kd) {
                rope_head(x, cs, sn, hd, c->rope_neox);
            }
            if (h0 >= qd) {
                store_kv(kv, kind, slab, slot, h0 - qd, kd, hd, x);
            }
        }
    }
}


/* embeddings and per-token RoPE angles of tokens [t0, t1) */
static void
embed(cpu_backend *be, int64_t t0, int64_t t1)
{
    const nalar_model *m = be->m;
    int                dim = m->cfg.dim, hd = m->cfg.head_dim;

    for (int64_t t = t0; t < t1; t++) {
        nalar_cpu_get_row(&m->tok_embd, be->batch->tokens[t], be->x + t * dim);
        if (m->cfg.embd_scale != 1.0f) {
            for (int i = 0; i < dim; i++) {
                be->x[t * dim + i] *= m->cfg.embd_scale;
            }
        }
        for (int i = 0; i < hd / 2; i++) {
            float theta = (float) be->batch->pos[t] * be->inv_freq[i];

            be->rope_cos[t * (hd / 2) + i] = cosf(theta);
            be->rope_sin[t * (hd / 2) + i] = sinf(theta);
        }
    }
}


/* hg = silu(hg) * hu (or gelu(hg) * hu) for tokens [t0, t1), rows
 * [lo, hi) */
static void
swiglu(cpu_backend *be, int64_t t0, int64_t t1, int64_t lo, int64_t hi)
{
    int64_t ffn = be->m->cfg.ffn_dim;

    for (int64_t t = t0; t < t1; t++) {
        float *g = be->hg + t * ffn;
        float *u = be->hu + t * ffn;

        if (be->m->cfg.ffn_gelu) {
            /* GELU, tanh form */
            for (int64_t i = lo; i < hi; i++) {
                float x = g[i];

                g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f
                                                * (x + 0.044715f * x * x
                                                       * x))) * u[i];
            }
            continue;
        }

        /* silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (the
         * branch-free exp, so the loop vectorises) */
        for (int64_t i = lo; i < hi; i++) {
            float e = nalar_exp_neg(-fabsf(g[i]));
            float sg = (g[i] >= 0 ? 1.0f : e) / (1.0f + e);

            g[i] = g[i] * sg * u[i];
        }
    }
}


/* x += rmsnorm(y) * w for tokens [t0, t1) (gemma2's post-norms) */
static void
post_norm_add(cpu_backend *be, const float *w, int64_t t0, int64_t t1)
{
    int   dim = be->m->cfg.dim;
    float eps = be->m->cfg.norm_eps;

    for (int64_t t = t0; t < t1; t++) {
        float *y = be->y + t * dim, *x = be->x + t * dim;

        rmsnorm(y, y, w, dim, eps);
        for (int i = 0; i < dim; i++) {
            x[i] += y[i];
        }
    }
}


/* logits [lo, hi) of rows [r0, r1) soft-capped (gemma2) */
static void
final_softcap(cpu_backend *be, int64_t r0, int64_t r1, int64_t lo, int64_t hi)
{
    float   cap = be->m->cfg.final_softcap;
    int64_t V = be->m->cfg.n_vocab;

    if (cap <= 0) {
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        float *z = be->logits + r * V;

        for (int64_t i = lo; i < hi; i++) {
            z[i] = cap * tanhf(z[i] / cap);
        }
    }
}


/*
 * With integer activations (16-bit, 8-bit or pair codes): the codes of
 * n normalised tokens x (dim
 * apart), made once into thread tid's own buffer for the products that
 * read x; NULL (each product then rounds x itself, to the same codes)
 * when none of those takes them (i16 0).
 */
static const nalar_xq *
xb_codes(cpu_backend *be, int tid, const float *x, int n, int i16,
         nalar_xq *xq)
{
    int dim = be->m->cfg.dim;

    if (!i16 || n <= 0 || n > be->xq_cap) {
        return NULL;
    }
    if (be->act_i16 == NALAR_ACT_Q8) {
        memset(xq, 0, sizeof(*xq));
        nalar_quant_x8(x, n, dim, dim, be->xq + tid * be->xq_bytes, &xq->x8);
        return xq;
    }
    if (be->act_i16 == NALAR_ACT_PAIRS) {
        memset(xq, 0, sizeof(*xq));
        nalar_quant_xpairs_groups(x, n, dim, dim, be->xp_groups,
                                  be->xq + tid * be->xq_bytes, &xq->xp);
        return xq;
    }
    memset(xq, 0, sizeof(*xq));
    nalar_quant_x16(x, n, dim, dim, be->xq + tid * be->xq_bytes, &xq->x16);
    return xq;
}


/*
 * The pass by rows, layer l: q, k, v of every token from its normalised
 * xb, then RoPE and the K/V stores (finish_qkv), this thread's share.
 */
static void
qkv_by_rows(cpu_backend *be, const cpu_layer *W, const nalar_layer *L,
            int l, const float *xb, int tid, int nth)
{
    const nalar_batch *bt = be->batch;
    int                T = bt->n_tokens;
    int                dim = be->m->cfg.dim, hd = be->m->cfg.head_dim;
    int                ldqkv = be->q_dim + 2 * be->kv_dim;
    int64_t            lo, hi, t0, t1;
    nalar_xq           codes;
    const nalar_xq    *xq;

    /* q, k, v = xb Wq^T, xb Wk^T, xb Wv^T: one row space of
     * q_dim + 2 kv_dim rows, split over threads by whole heads.  A pass
     * of many sequences splits by token instead: a thread computes,
     * rotates and stores every head of its tokens, so the K stores
     * (each touches kv_dim cache lines) are shared out, and each
     * lands in the cache of the thread that then attends over it */
    if (!be->one_seq && T >= 4 * nth && be->max_run * 2 * nth <= T) {
        /* whole sequences per thread: no two threads store into one
         * block (no sequence is over half a thread's share) */
        split(T, tid, nth, 1, &t0, &t1);
        while (t0 > 0 && t0 < T && bt->seq[t0] == bt->seq[t0 - 1]) {
            t0++;
        }
        while (t1 > 0 && t1 < T && bt->seq[t1] == bt->seq[t1 - 1]) {
            t1++;
        }
        lo = 0;
        hi = ldqkv;
    } else {
        t0 = 0;
        t1 = T;
        split(ldqkv, tid, nth, hd, &lo, &hi);
    }
    if (t0 < t1) {
        int64_t      qd = be->q_dim, kd = be->kv_dim, a, b;
        const float *xt = xb + t0 * dim;
        float       *yt = be->qkv + t0 * ldqkv;
        int          n = (int) (t1 - t0);

        xq = xb_codes(be, tid, xt, n, nalar_cpu_mat_i16(&W->wq)
                                      || nalar_cpu_mat_i16(&W->wk)
                                      || nalar_cpu_mat_i16(&W->wv),
                      &codes);
        a = lo; b = hi < qd ? hi : qd;
        if (a < b) {
            nalar_cpu_matmul_xq(&W->wq, xt, xq, n, dim, yt, ldqkv, a, b,
                                0);
            nalar_cpu_lora(be, l, LORA_WQ, tid, xt, dim, t0, t1, yt, ldqkv,
                           a, b);
        }
        a = lo > qd ? lo - qd : 0; b = hi - qd < kd ? hi - qd : kd;
        if (a < b) {
            nalar_cpu_matmul_xq(&W->wk, xt, xq, n, dim, yt + qd, ldqkv,
                                a, b, 0);
            nalar_cpu_lora(be, l, LORA_WK, tid, xt, dim, t0, t1, yt + qd,
                           ldqkv, a, b);
        }
        a = lo > qd + kd ? lo - qd - kd : 0; b = hi - qd - kd;
        if (a < b) {
            nalar_cpu_matmul_xq(&W->wv, xt, xq, n, dim, yt + qd + kd,
                                ldqkv, a, b, 0);
            nalar_cpu_lora(be, l, LORA_WV, tid, xt, dim, t0, t1,
                           yt + qd + kd, ldqkv, a, b);
        }
    }
    finish_qkv(be, L, l, t0, t1, lo, hi);
}


/*
 * Five barriers per layer.  Each thread normalises every token into its
 * own xb (a few hundred floats per token: cheaper than a barrier), then
 * owns a share of the weight rows of the next product.  With 16-bit
 * activations it also rounds the tokens its products read to int16 codes
 * once (xb_codes) for all of them: Q, K and V; gate and up; the output.
 */
void
nalar_cpu_forward_rows(void *arg, int tid, int nth)
{
    cpu_backend        *be = arg;
    const nalar_model  *m = be->m;
    const nalar_config *c = &m->cfg;
    const nalar_batch  *bt = be->batch;
    nalar_pool         *pool = be->pool;
    int                 T = bt->n_tokens;
    int                 dim = c->dim;
    float              *xb = be->xb + (int64_t) tid * be->cap_tok * dim;
    int64_t             lo, hi, t0, t1;
    nalar_xq            codes;
    const nalar_xq     *xq;

    split(T, tid, nth, 1, &lo, &hi);
    embed(be, lo, hi);
    barrier(pool, nth);

    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        const cpu_layer   *W = &be->layers[l];

        /* xb = rmsnorm(x) * attn_norm */
        for (int t = 0; t < T; t++) {
            rmsnorm(xb + (int64_t) t * dim, be->x + (int64_t) t * dim,
                    L->attn_norm, dim, c->norm_eps);
        }

        qkv_by_rows(be, W, L, l, xb, tid, nth);
        barrier(pool, nth);

        split((int64_t) be->n_tiles * c->n_kv_heads * be->head_groups, tid,
              nth, 1, &lo, &hi);
        nalar_cpu_attention(be, l, tid, lo, hi, 0);
        barrier(pool, nth);

        /* x += att Wo^T (gemma2: x += rmsnorm(att Wo^T) * post norm) */
        split(dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            nalar_cpu_matmul(&W->wo, be->att, T, be->q_dim,
                             L->post_attn_norm ? be->y : be->x, dim, lo,
                             hi, L->post_attn_norm == NULL);
            nalar_cpu_lora(be, l, LORA_WO, tid, be->att, be->q_dim, 0, T,
                           L->post_attn_norm ? be->y : be->x, dim, lo, hi);
        }
        barrier(pool, nth);
        if (L->post_attn_norm != NULL) {
            split(T, tid, nth, 1, &t0, &t1);
            post_norm_add(be, L->post_attn_norm, t0, t1);
            barrier(pool, nth);
        }

        for (int t = 0; t < T; t++) {
            rmsnorm(xb + (int64_t) t * dim, be->x + (int64_t) t * dim,
                    L->ffn_norm, dim, c->norm_eps);
        }

        /* h = silu(xb Wg^T) * (xb Wu^T); each thread owns the same rows of
         * both products, so it can combine them without a barrier */
        split(c->ffn_dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            xq = xb_codes(be, tid, xb, T, nalar_cpu_mat_i16(&W->w_gate)
                                          || nalar_cpu_mat_i16(&W->w_up),
                          &codes);
            nalar_cpu_matmul_xq(&W->w_gate, xb, xq, T, dim, be->hg,
                                c->ffn_dim, lo, hi, 0);
            nalar_cpu_matmul_xq(&W->w_up, xb, xq, T, dim, be->hu,
                                c->ffn_dim, lo, hi, 0);
            nalar_cpu_lora(be, l, LORA_GATE, tid, xb, dim, 0, T, be->hg,
                           c->ffn_dim, lo, hi);
            nalar_cpu_lora(be, l, LORA_UP, tid, xb, dim, 0, T, be->hu,
                           c->ffn_dim, lo, hi);
            swiglu(be, 0, T, lo, hi);
        }
        barrier(pool, nth);

        /* x += h Wd^T (gemma2: post-normed, as above) */
        split(dim, tid, nth, 16, &lo, &hi);
        if (lo < hi) {
            nalar_cpu_matmul(&W->w_down, be->hg, T, c->ffn_dim,
                             L->post_ffn_norm ? be->y : be->x, dim, lo, hi,
                             L->post_ffn_norm == NULL);
            nalar_cpu_lora(be, l, LORA_DOWN, tid, be->hg, c->ffn_dim, 0, T,
                           L->post_ffn_norm ? be->y : be->x, dim, lo, hi);
        }
        barrier(pool, nth);
        if (L->post_ffn_norm != NULL) {
            split(T, tid, nth, 1, &t0, &t1);
            post_norm_add(be, L->post_ffn_norm, t0, t1);
            barrier(pool, nth);
        }
    }

    /* final norm of the rows that want logits, then the output head */
    for (int32_t i = 0; i < bt->n_logits; i++) {
        int32_t t = be->logit_rows[i];

        rmsnorm(xb + (int64_t) i * dim, be->x + (int64_t) t * dim,
                m->out_norm, dim, c->norm_eps);
    }
    split(c->n_vocab, tid, nth, 16, &lo, &hi);
    if (lo < hi) {
        xq = xb_codes(be, tid, xb, bt->n_logits,
                      nalar_cpu_mat_i16(&be->output), &codes);
        nalar_cpu_matmul_xq(&be->output, xb, xq, bt->n_logits, dim,
                            be->logits, c->n_vocab, lo, hi, 0);
        final_softcap(be, 0, bt->n_logits, lo, hi);
    }
}


/*
 * The pass split by token instead: thread tid runs every layer over its
 * own tokens [tok_lo[tid], tok_lo[tid + 1]) -- whole weight matrices, its
 * own rows of x, qkv, att and h, the attention tiles of its tokens (which
 * never straddle two threads' tokens) and the logits of its rows.  The
 * threads meet once per layer, after the K/V stores, since a later token
 * attends over earlier ones another thread stored: one barrier per layer
 * instead of five, and no activation row crosses between cores.  It pays
 * for long passes where a cache line's round trip between cores is
 * costly, since the row split exchanges every activation row at every
 * phase.  Short passes lose, since each thread reads every weight and a
 * pass's cost grows slowly with its tokens, and so may any pass where the
 * cores are close: choose_way measures both.
 */
void
nalar_cpu_forward_tokens(void *arg, int tid, int nth)
{
    cpu_backend        *be = arg;
    const nalar_model  *m = be->m;
    const nalar_config *c = &m->cfg;
    int                 dim = c->dim, ffn = c->ffn_dim;
    int64_t             qd = be->q_dim, kd = be->kv_dim, ldqkv = qd + 2 * kd;
    int64_t             t0 = be->tok_lo[tid], t1 = be->tok_lo[tid + 1];
    int64_t             l0 = be->logit_lo[tid], l1 = be->logit_lo[tid + 1];
    int                 n = (int) (t1 - t0);
    float              *xb = be->xb + (int64_t) tid * be->cap_tok * dim;
    nalar_xq            codes;
    const nalar_xq     *xq;

    embed(be, t0, t1);
    for (int l = 0; l < c->n_layers; l++) {
        const nalar_layer *L = &m->layers[l];
        const cpu_layer   *W = &be->layers[l];
        float             *qkv = be->qkv + t0 * ldqkv;

        for (int64_t t = t0; t < t1; t++) {
            rmsnorm(xb + (t - t0) * dim, be->x + t * dim, L->attn_norm, dim,
                    c->norm_eps);
        }
        if (n > 0) {
            xq = xb_codes(be, tid, xb, n, nalar_cpu_mat_i16(&W->wq)
                                          || nalar_cpu_mat_i16(&W->wk)
                                          || nalar_cpu_mat_i16(&W->wv),
                          &codes);
            nalar_cpu_matmul_xq(&W->wq, xb, xq, n, dim, qkv, ldqkv, 0, qd,
                                0);
            nalar_cpu_matmul_xq(&W->wk, xb, xq, n, dim, qkv + qd, ldqkv, 0,
                                kd, 0);
            nalar_cpu_matmul_xq(&W->wv, xb, xq, n, dim, qkv + qd + kd,
                                ldqkv, 0, kd, 0);
            nalar_cpu_lora(be, l, LORA_WQ, tid, xb, dim, t0, t1, qkv, ldqkv,
                           0, qd);
            nalar_cpu_lora(be, l, LORA_WK, tid, xb, dim, t0, t1, qkv + qd,
                           ldqkv, 0, kd);
            nalar_cpu_lora(be, l, LORA_WV, tid, xb, dim, t0, t1,
                           qkv + qd + kd, ldqkv, 0, kd);
            finish_qkv(be, L, l, t0, t1, 0, ldqkv);
        }
        /* every token's K and V of this layer are stored */
        barrier(be->pool, nth);

        nalar_cpu_attention(be, l, tid, be->tile_lo[tid],
                            be->tile_lo[tid + 1], 1);
        if (n == 0) {
            continue;
        }
        if (L->post_attn_norm != NULL) {
            nalar_cpu_matmul(&W->wo, be->att + t0 * qd, n, (int) qd,
                             be->y + t0 * dim, dim, 0, dim, 0);
            nalar_cpu_lora(be, l, LORA_WO, tid, be->att + t0 * qd, (int) qd,
                           t0, t1, be->y + t0 * dim, dim, 0, dim);
            post_norm_add(be, L->post_attn_norm, t0, t1);
        } else {
            nalar_cpu_matmul(&W->wo, be->att + t0 * qd, n, (int) qd,
                             be->x + t0 * dim, dim, 0, dim, 1);
            nalar_cpu_lora(be, l, LORA_WO, tid, be->att + t0 * qd, (int) qd,
                           t0, t1, be->x + t0 * dim, dim, 0, dim);
        }
        for (int64_t t = t0; t < t1; t++) {
            rmsnorm(xb + (t - t0) * dim, be->x + t * dim, L->ffn_norm, dim,
                    c->norm_eps);
        }
        xq = xb_codes(be, tid, xb, n, nalar_cpu_mat_i16(&W->w_gate)
                                      || nalar_cpu_mat_i16(&W->w_up),
                      &codes);
        nalar_cpu_matmul_xq(&W->w_gate, xb, xq, n, dim, be->hg + t0 * ffn,
                            ffn, 0, ffn, 0);
        nalar_cpu_matmul_xq(&W->w_up, xb, xq, n, dim, be->hu + t0 * ffn,
                            ffn, 0, ffn, 0);
        nalar_cpu_lora(be, l, LORA_GATE, tid, xb, dim, t0, t1,
                       be->hg + t0 * ffn, ffn, 0, ffn);
        nalar_cpu_lora(be, l, LORA_UP, tid, xb, dim, t0, t1,
                       be->hu + t0 * ffn, ffn, 0, ffn);
        swiglu(be, t0, t1, 0, ffn);
        if (L->post_ffn_norm != NULL) {
            nalar_cpu_matmul(&W->w_down, be->hg + t0 * ffn, n, ffn,
                             be->y + t0 * dim, dim, 0, dim, 0);
            nalar_cpu_lora(be, l, LORA_DOWN, tid, be->hg + t0 * ffn, ffn, t0,
                           t1, be->y + t0 * dim, dim, 0, dim);
            post_norm_add(be, L->post_ffn_norm, t0, t1);
        } else {
            nalar_cpu_matmul(&W->w_down, be->hg + t0 * ffn, n, ffn,
                             be->x + t0 * dim, dim, 0, dim, 1);
            nalar_cpu_lora(be, l, LORA_DOWN, tid, be->hg + t0 * ffn, ffn, t0,
                           t1, be->x + t0 * dim, dim, 0, dim);
        }
    }
    for (int64_t i = l0; i < l1; i++) {
        rmsnorm(xb + (i - l0) * dim, be->x + (int64_t) be->logit_rows[i] * dim,
                m->out_norm, dim, c->norm_eps);
    }
    if (l1 > l0) {
        xq = xb_codes(be, tid, xb, (int) (l1 - l0),
                      nalar_cpu_mat_i16(&be->output), &codes);
        nalar_cpu_matmul_xq(&be->output, xb, xq, (int) (l1 - l0), dim,
                            be->logits + l0 * c->n_vocab, c->n_vocab, 0,
                            c->n_vocab, 0);
        final_softcap(be, l0, l1, 0, c->n_vocab);
    }
}
