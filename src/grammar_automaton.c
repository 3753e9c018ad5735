/*
 * Structured output, run: the compiled grammar flattened, its stacks
 * expanded (an explicit work list, each distinct stack once), states
 * interned, and byte transitions, within the budgets of
 * grammar_internal.h.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar_internal.h"


/* ---- the compiled grammar and its states ---- */

void
gr_grammar_free(nalar_grammar *g)
{
    if (g == NULL) {
        return;
    }
    for (int32_t i = 0; i < g->n_st; i++) {
        free(g->st[i].next);
        free(g->st[i].mask);
    }
    free(g->st);
    free(g->zero);
    free(g->pool);
    free(g->ht);
    free(g->scr);
    free(g->ord);
    free(g->wk);
    free(g->wk_ht);
    free(g->wk_ep);
    free(g->sym);
    free(g->cls);
    free(g->rule_alts);
    free(g->rule_nalts);
    free(g->alts);
    free(g->canon);
    free(g);
}


/* Flattens the builder's rules into g. */
static int
grammar_flatten(nalar_grammar *g, gbuild *b, int32_t root)
{
    int32_t n_alts = 0, pos = 0, ai = 0;

    for (int32_t i = 0; i < b->n_rules; i++) {
        n_alts += b->rules[i].n_alt;
    }
    g->sym = malloc((b->n_syms + 1) * sizeof(gsym));
    g->alts = malloc((n_alts + 1) * sizeof(int32_t));
    g->rule_alts = malloc((b->n_rules + 1) * sizeof(int32_t));
    g->rule_nalts = malloc((b->n_rules + 1) * sizeof(int32_t));
    g->cls = malloc((b->n_cls + 1) * 32);
    if (!g->sym || !g->alts || !g->rule_alts || !g->rule_nalts || !g->cls) {
        return -1;
    }
    if (b->n_cls > 0) {
        memcpy(g->cls, b->cls, b->n_cls * 32);
    }
    g->n_cls = b->n_cls;
    for (int32_t i = 0; i < b->n_rules; i++) {
        g->rule_alts[i] = ai;
        g->rule_nalts[i] = b->rules[i].n_alt;
        for (int32_t j = 0; j < b->rules[i].n_alt; j++) {
            g->alts[ai++] = pos;
            if (b->rules[i].alt_len[j] > 0) {
                memcpy(&g->sym[pos], b->rules[i].alt[j],
                       b->rules[i].alt_len[j] * sizeof(gsym));
            }
            pos += b->rules[i].alt_len[j];
            g->sym[pos++] = (gsym) { SYM_END, 0 };
        }
    }
    g->n_sym = pos;
    g->n_alts = ai;
    g->n_rules = b->n_rules;
    g->root = root;
    return 0;
}


static uint32_t
hash_step(uint32_t h, uint32_t v)
{
    h ^= v;
    h *= 16777619u;
    return h ^ (h >> 15);
}


static uint32_t
hash_ints(const int32_t *v, int32_t n)
{
    uint32_t h = 2166136261u;

    for (int32_t i = 0; i < n; i++) {
        h = hash_step(h, (uint32_t) v[i]);
    }
    return h;
}


static int
scr_reserve(nalar_grammar *g, int64_t extra)
{
    if (g->n_scr + extra > g->cap_scr) {
        int64_t  nc = g->cap_scr ? g->cap_scr : 1024;
        int32_t *nv;

        while (nc < g->n_scr + extra) {
            nc *= 2;
        }
        nv = realloc(g->scr, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -1;
        }
        g->scr = nv;
        g->cap_scr = nc;
    }
    return 0;
}


static int
scr_push(nalar_grammar *g, int32_t v)
{
    if (scr_reserve(g, 1) < 0) {
        return -1;
    }
    g->scr[g->n_scr++] = v;
    return 0;
}


/*
 * Counts n stack words against the call's budget: 0, or -1 (with g->why)
 * past GR_MAX_CALL_WORK, so that no schema makes one mask or token cost
 * more than a bounded time.
 */
static int
call_work(nalar_grammar *g, int64_t n)
{
    g->call_work += n;
    if (g->call_work > GR_MAX_CALL_WORK) {
        g->why = "the grammar is too ambiguous here (one step passes its "
                 "work budget)";
        return -1;
    }
    return 0;
}


/* ---- expansion: an explicit work list, each distinct stack once ---- */

/* Starts an expansion: the work list and its set emptied. */
static void
xp_begin(nalar_grammar *g)
{
    g->n_wk = 0;
    g->wk_used = 0;
    if (++g->epoch == 0) {
        /* the epoch wrapped: every slot must read as empty again */
        if (g->wk_ep != NULL) {
            memset(g->wk_ep, 0, g->wk_ht_cap * sizeof(uint32_t));
        }
        g->epoch = 1;
    }
}


static int
xp_grow_set(nalar_grammar *g)
{
    int64_t   nc = g->wk_ht_cap ? g->wk_ht_cap * 2 : 1024;
    int64_t  *nh = malloc(nc * sizeof(int64_t));
    uint32_t *ne = calloc(nc, sizeof(uint32_t));

    if (nh == NULL || ne == NULL) {
        free(nh);
        free(ne);
        return -1;
    }
    for (int64_t k = 0; k < g->wk_ht_cap; k++) {
        int64_t o, j;

        if (g->wk_ep[k] != g->epoch) {
            continue;
        }
        o = g->wk_ht[k];
        j = hash_ints(&g->wk[o], g->wk[o] + 1) & (nc - 1);
        while (ne[j] == g->epoch) {
            j = (j + 1) & (nc - 1);
        }
        nh[j] = o;
        ne[j] = g->epoch;
    }
    free(g->wk_ht);
    free(g->wk_ep);
    g->wk_ht = nh;
    g->wk_ep = ne;
    g->wk_ht_cap = nc;
    return 0;
}


/*
 * Adds the stack stk[0..n) to the work list unless it is there already:
 * 0, -1 out of memory, -3 past the transition's budget (g->why).
 */
static int
xp_add(nalar_grammar *g, const int32_t *stk, int32_t n)
{
    uint32_t h;
    int64_t  k;

    if (g->n_wk + n + 1 > GR_MAX_WORK) {
        g->why = "the grammar is too ambiguous here (one transition passes "
                 "its expansion budget)";
        return -3;
    }
    if ((g->wk_used + 1) * 2 > g->wk_ht_cap && xp_grow_set(g) < 0) {
        return -1;
    }
    /* the hash of the run [n, stk...], as xp_grow_set hashes it */
    h = hash_step(2166136261u, (uint32_t) n);
    for (int32_t i = 0; i < n; i++) {
        h = hash_step(h, (uint32_t) stk[i]);
    }
    for (k = h & (g->wk_ht_cap - 1); g->wk_ep[k] == g->epoch;
         k = (k + 1) & (g->wk_ht_cap - 1))
    {
        const int32_t *o = &g->wk[g->wk_ht[k]];

        if (o[0] == n && (n == 0 || memcmp(o + 1, stk, n * sizeof(int32_t))
                                    == 0))
        {
            return 0;
        }
    }
    if (g->n_wk + n + 1 > g->cap_wk) {
        int64_t  nc = g->cap_wk ? g->cap_wk : 1024;
        int32_t *nv;

        while (nc < g->n_wk + n + 1) {
            nc *= 2;
        }
        nv = realloc(g->wk, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -1;
        }
        g->wk = nv;
        g->cap_wk = nc;
    }
    g->wk_ht[k] = g->n_wk;
    g->wk_ep[k] = g->epoch;
    g->wk_used++;
    g->wk[g->n_wk] = n;
    if (n > 0) {
        memcpy(&g->wk[g->n_wk + 1], stk, n * sizeof(int32_t));
    }
    g->n_wk += n + 1;
    return 0;
}


/*
 * Expands every stack on the work list until each top is a byte class,
 * appending the results to the scratch as [len, pos...] runs: 0, -1 out of
 * memory, -3 past a budget (g->why).  A reference's alternatives are added
 * to the list, never recursed into, so neither a long chain of optional
 * parts nor many paths to the same stack can exhaust the C stack or take
 * exponential time; the grammar has no left recursion (grammar_check), so
 * the list is finite.
 */
static int
xp_run(nalar_grammar *g)
{
    int32_t stk[GR_MAX_DEPTH + 2];

    for (int64_t off = 0; off < g->n_wk; off += g->wk[off] + 1) {
        int32_t n = g->wk[off], p;

        if (call_work(g, n + 1) < 0) {
            return -3;
        }
        /* the list may move as it grows: work on a copy */
        if (n > 0) {
            memcpy(stk, &g->wk[off + 1], n * sizeof(int32_t));
        }
        while (n > 0 && g->sym[stk[n - 1]].kind == SYM_END) {
            n--;
        }
        if (n == 0 || g->sym[stk[n - 1]].kind == SYM_CLASS) {
            if (scr_push(g, n) < 0) {
                return -1;
            }
            for (int32_t i = 0; i < n; i++) {
                if (scr_push(g, stk[i]) < 0) {
                    return -1;
                }
            }
            continue;
        }
        /* a reference: its return point (none for a tail call), then
         * each alternative's first position on top */
        p = stk[n - 1];
        {
            int32_t r = g->sym[p].arg, base = n - 1, rc;

            if (g->sym[p + 1].kind != SYM_END) {
                stk[base++] = p + 1;
            }
            if (base + 1 > GR_MAX_DEPTH) {
                continue;
            }
            for (int32_t a = 0; a < g->rule_nalts[r]; a++) {
                stk[base] = g->alts[g->rule_alts[r] + a];
                rc = xp_add(g, stk, base + 1);
                if (rc < 0) {
                    return rc;
                }
            }
        }
    }
    return 0;
}


static int
cmp_stack(const int32_t *a, const int32_t *b)
{
    if (a[0] != b[0]) {
        return a[0] < b[0] ? -1 : 1;
    }
    for (int32_t i = 1; i <= a[0]; i++) {
        if (a[i] != b[i]) {
            return a[i] < b[i] ? -1 : 1;
        }
    }
    return 0;
}


static int
cmp_stack_off(const void *x, const void *y, void *base)
{
    const int32_t *s = base;

    return cmp_stack(&s[*(const int64_t *) x], &s[*(const int64_t *) y]);
}


/* Counts n bytes against the automaton's budget: 0, or -1 past it. */
int
gr_charge(nalar_grammar *g, size_t n)
{
    if (g->bytes + n > GR_MAX_BYTES) {
        g->why = "the grammar's automaton passes its memory budget";
        return -1;
    }
    g->bytes += n;
    return 0;
}


/*
 * The stacks in the scratch from `from` on, sorted (by offset: the
 * scratch may move while the state is written after them) and without
 * repeats, serialised after them at *start: the length, 0 when there are
 * none, -2 out of memory or too long.
 */
static int64_t
serialise_stacks(nalar_grammar *g, int64_t from, int64_t *start)
{
    int64_t n = 0, i, len;

    for (i = from; i < g->n_scr; i += g->scr[i] + 1) {
        n++;
    }
    if (n == 0) {
        return 0;
    }
    if (n > g->cap_ord) {
        int64_t *nv = realloc(g->ord, n * sizeof(int64_t));

        if (nv == NULL) {
            return -2;
        }
        g->ord = nv;
        g->cap_ord = n;
    }
    n = 0;
    for (i = from; i < g->n_scr; i += g->scr[i] + 1) {
        g->ord[n++] = i;
    }
    /* room for the serialised state after the stacks */
    if (scr_reserve(g, g->n_scr - from) < 0) {
        return -2;
    }
    qsort_r(g->ord, n, sizeof(int64_t), cmp_stack_off, g->scr);
    *start = g->n_scr;
    for (int64_t k = 0; k < n; k++) {
        const int32_t *sk = &g->scr[g->ord[k]];

        if (k > 0 && cmp_stack(&g->scr[g->ord[k - 1]], sk) == 0) {
            continue;
        }
        for (int32_t j = 0; j <= sk[0]; j++) {
            g->scr[g->n_scr++] = sk[j];
        }
    }
    len = g->n_scr - *start;
    return len > INT32_MAX / 2 ? -2 : len;
}


/* The state whose serialised stacks are v[0..len) (hash h), or -1. */
static int32_t
lookup_state(const nalar_grammar *g, const int32_t *v, int64_t len,
             uint32_t h)
{
    for (int64_t k = h & (g->ht_cap - 1);
         g->ht_cap > 0; k = (k + 1) & (g->ht_cap - 1))
    {
        int32_t       e = g->ht[k];
        const gstate *st;

        if (e == 0) {
            break;
        }
        st = &g->st[e - 1];
        if (st->hash == h && st->len == len
            && memcmp(&g->pool[st->off], v, len * sizeof(int32_t)) == 0)
        {
            return e - 1;
        }
    }
    return -1;
}


/* Room for one more state of len words: pool, states and hash table
 * (rehashed at half full); 0, or -2 out of memory. */
static int
grow_states(nalar_grammar *g, int64_t len)
{
    if (g->n_pool + len > g->cap_pool) {
        int64_t  nc = g->cap_pool ? g->cap_pool : 4096;
        int32_t *nv;

        while (nc < g->n_pool + len) {
            nc *= 2;
        }
        nv = realloc(g->pool, nc * sizeof(int32_t));
        if (nv == NULL) {
            return -2;
        }
        g->pool = nv;
        g->cap_pool = nc;
    }
    if (g->n_st == g->cap_st) {
        int32_t nc = g->cap_st ? g->cap_st * 2 : 256;
        gstate *nv = realloc(g->st, nc * sizeof(gstate));

        if (nv == NULL) {
            return -2;
        }
        g->st = nv;
        g->cap_st = nc;
    }
    if ((int64_t) (g->n_st + 1) * 2 > g->ht_cap) {
        int64_t  nc = g->ht_cap ? g->ht_cap * 2 : 1024;
        int32_t *nh = calloc(nc, sizeof(int32_t));

        if (nh == NULL) {
            return -2;
        }
        for (int32_t s = 0; s < g->n_st; s++) {
            int64_t k = g->st[s].hash & (nc - 1);

            while (nh[k] != 0) {
                k = (k + 1) & (nc - 1);
            }
            nh[k] = s + 1;
        }
        free(g->ht);
        g->ht = nh;
        g->ht_cap = nc;
    }
    return 0;
}


/* A new state's facts: accepting (it holds an empty stack), and the one
 * allowed byte if there is one. */
static void
state_facts(const nalar_grammar *g, gstate *st)
{
    uint32_t any[8] = {0};
    int      cnt = 0, last = -1;

    st->forced = -1;
    st->forced_tok = -2;
    for (int32_t o = 0; o < st->len; o += g->pool[st->off + o] + 1) {
        int32_t sl = g->pool[st->off + o];

        if (sl == 0) {
            st->accepting = 1;
        } else {
            const uint32_t *c = g->cls[g->sym[g->pool[st->off + o + sl]].arg];

            for (int w = 0; w < 8; w++) {
                any[w] |= c[w];
            }
        }
    }
    for (int c = 0; c < 256; c++) {
        if (any[c >> 5] & (1u << (c & 31))) {
            cnt++;
            last = c;
        }
    }
    if (cnt == 1 && !st->accepting) {
        st->forced = (int16_t) last;
    }
}


/*
 * Interns the stacks in the scratch from `from` on: the state id, -1 when
 * there are none, -2 out of memory or past a budget.
 */
static int32_t
intern(nalar_grammar *g, int64_t from)
{
    int64_t  len, start = 0, k;
    int32_t  id;
    uint32_t h;
    gstate  *st;

    len = serialise_stacks(g, from, &start);
    if (len <= 0) {
        return len == 0 ? -1 : -2;
    }
    h = hash_ints(&g->scr[start], (int32_t) len);
    id = lookup_state(g, &g->scr[start], len, h);
    if (id >= 0) {
        return id;
    }
    if (g->n_st >= GR_MAX_STATES || g->n_pool + len > INT32_MAX) {
        g->why = "the grammar's automaton passes its state budget";
        return -2;
    }
    if (gr_charge(g, len * sizeof(int32_t) + sizeof(gstate)
                     + 2 * sizeof(int32_t)) < 0
        || grow_states(g, len) < 0)
    {
        return -2;
    }
    id = g->n_st++;
    st = &g->st[id];
    memset(st, 0, sizeof(*st));
    st->off = (int32_t) g->n_pool;
    st->len = len;
    st->hash = h;
    memcpy(&g->pool[g->n_pool], &g->scr[start], len * sizeof(int32_t));
    g->n_pool += len;
    k = h & (g->ht_cap - 1);
    while (g->ht[k] != 0) {
        k = (k + 1) & (g->ht_cap - 1);
    }
    g->ht[k] = id + 1;
    state_facts(g, st);
    return id;
}


/*
 * The state after byte c from state s: id, -1 refused, -2 out of memory or
 * past a budget (g->why; not cached, so a later call may try again).
 */
int32_t
gr_step_byte(nalar_grammar *g, int32_t s, int c)
{
    gstate *st = &g->st[s];
    int32_t r, off, len;

    if (st->next == NULL) {
        if (gr_charge(g, 256 * sizeof(int32_t)) < 0) {
            return -2;
        }
        st->next = malloc(256 * sizeof(int32_t));
        if (st->next == NULL) {
            g->bytes -= 256 * sizeof(int32_t);
            return -2;
        }
        for (int i = 0; i < 256; i++) {
            st->next[i] = -3;
        }
    }
    if (st->next[c] != -3) {
        return st->next[c];
    }
    off = st->off;
    len = st->len;
    if (call_work(g, len) < 0) {
        return -2;
    }
    g->n_scr = 0;
    xp_begin(g);
    for (int32_t o = 0; o < len; o += g->pool[off + o] + 1) {
        int32_t sl = g->pool[off + o], top;
        int32_t tmp[GR_MAX_DEPTH + 2];

        if (sl == 0) {
            continue;
        }
        top = g->pool[off + o + sl];
        if (!(g->cls[g->sym[top].arg][c >> 5] & (1u << (c & 31)))) {
            continue;
        }
        memcpy(tmp, &g->pool[off + o + 1], sl * sizeof(int32_t));
        tmp[sl - 1] = top + 1;
        if (xp_add(g, tmp, sl) < 0) {
            return -2;
        }
    }
    if (xp_run(g) < 0) {
        return -2;
    }
    r = intern(g, 0);
    if (r >= -1) {
        g->st[s].next[c] = r;     /* g->st may have moved */
    }
    return r;
}


nalar_grammar *
gr_grammar_compile(const gvocab *voc, int kind, json_t *schema, char *err,
                   size_t errlen)
{
    gbuild         b;
    int32_t        root;
    nalar_grammar *g;
    int32_t        stk[1];

    root = gr_build_grammar(&b, kind, schema, 0, err, errlen);
    if (root < 0) {
        gr_build_free(&b);
        return NULL;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL || grammar_flatten(g, &b, root) < 0) {
        gr_build_free(&b);
        gr_grammar_free(g);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    gr_build_free(&b);
    g->voc = voc;
    g->refs = 1;
    g->zero = calloc(voc->n_words + 1, sizeof(uint32_t));
    if (g->zero == NULL) {
        gr_grammar_free(g);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* the start: the root rule's reference, expanded */
    {
        gsym *ns = realloc(g->sym, (g->n_sym + 2) * sizeof(gsym));

        if (ns == NULL) {
            gr_grammar_free(g);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        g->sym = ns;
        g->sym[g->n_sym] = (gsym) { SYM_REF, root };
        g->sym[g->n_sym + 1] = (gsym) { SYM_END, 0 };
        stk[0] = g->n_sym;
        g->n_sym += 2;
    }
    g->base_bytes = sizeof(*g) + g->n_sym * sizeof(gsym) + g->n_cls * 32
                    + (g->n_rules * 2 + g->n_alts) * sizeof(int32_t)
                    + (voc->n_words + 1) * sizeof(uint32_t);
    g->n_scr = 0;
    xp_begin(g);
    if (xp_add(g, stk, 1) < 0 || xp_run(g) < 0
        || (g->start = intern(g, 0)) < 0)
    {
        snprintf(err, errlen, "the schema cannot be compiled (%s)",
                 g->why ? g->why : "out of memory, or it allows no value");
        gr_grammar_free(g);
        return NULL;
    }
    return g;
}
