/*
 * Structured output (see grammar.h; how it works: grammar_internal.h):
 * the vocabulary's byte trie, token masks, the grammar cache and the
 * matcher a request holds.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar_internal.h"


static int32_t forced_tok(nalar_grammar *g, int32_t s);


/* ---- the vocabulary trie ---- */

static int
cmp_tok(const void *x, const void *y, void *voc)
{
    const gvocab *sv = voc;
    int32_t       a = *(const int32_t *) x, b = *(const int32_t *) y;
    int           la = sv->tok_len[a], lb = sv->tok_len[b];
    int           c = memcmp(sv->tok_bytes[a], sv->tok_bytes[b],
                             la < lb ? la : lb);

    if (c != 0) {
        return c;
    }
    if (la != lb) {
        return la < lb ? -1 : 1;
    }
    return a < b ? -1 : a > b;
}


/* The trie of the pieces, built from them in sorted order (each node's
 * children are then made in byte order, and tokens with one piece are
 * next to each other). */
static int
voc_build(gvocab *v, const nalar_tokenizer *tok)
{
    int32_t  n = nalar_tok_n_vocab(tok), cap_nodes = 1, n_toks = 0;
    int32_t  path[48], last_child[48];

    memset(v, 0, sizeof(*v));
    v->n_vocab = n;
    v->n_words = (n + 31) / 32;
    v->tok_len = calloc(n, 1);
    v->tok_bytes = calloc(n, 48);
    v->eog = calloc(n + 1, sizeof(int32_t));
    v->toks = malloc((n + 1) * sizeof(int32_t));
    if (!v->tok_len || !v->tok_bytes || !v->eog || !v->toks) {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        int len;

        if (nalar_tok_is_eog(tok, i)) {
            v->eog[v->n_eog++] = i;
            continue;
        }
        if (nalar_tok_is_control(tok, i)) {
            continue;
        }
        len = nalar_token_bytes(tok, i, v->tok_bytes[i], 47);
        if (len <= 0 || len > 47) {
            continue;
        }
        v->tok_len[i] = (uint8_t) len;
        v->toks[n_toks++] = i;
        cap_nodes += len;
    }
    /* the vocabulary goes to the comparator as its argument: engines
     * build their caches on their own threads at the same time */
    qsort_r(v->toks, n_toks, sizeof(int32_t), cmp_tok, v);
    v->nodes = malloc(cap_nodes * sizeof(tnode));
    if (v->nodes == NULL) {
        return -1;
    }
    v->nodes[0] = (tnode) { -1, -1, 0, 0, 0 };
    v->n_nodes = 1;
    path[0] = 0;
    last_child[0] = -1;
    {
        int32_t prev = -1;

        for (int32_t k = 0; k < n_toks; k++) {
            int32_t id = v->toks[k];
            int     len = v->tok_len[id], lcp = 0;
            int32_t nd;

            if (prev >= 0) {
                int pl = v->tok_len[prev];

                while (lcp < len && lcp < pl
                       && v->tok_bytes[prev][lcp] == v->tok_bytes[id][lcp])
                {
                    lcp++;
                }
            }
            /* path[0..lcp] are shared; make the nodes below */
            for (int j = lcp; j < len; j++) {
                nd = v->n_nodes++;
                v->nodes[nd] = (tnode) { -1, -1, k, 0,
                                         (uint8_t) v->tok_bytes[id][j] };
                if (v->nodes[path[j]].first_child < 0) {
                    v->nodes[path[j]].first_child = nd;
                } else {
                    v->nodes[last_child[j]].next_sibling = nd;
                }
                last_child[j] = nd;
                path[j + 1] = nd;
                last_child[j + 1] = -1;
            }
            nd = path[len];
            if (v->nodes[nd].n_toks == 0) {
                v->nodes[nd].first_tok = k;
            }
            v->nodes[nd].n_toks++;
            prev = id;
        }
    }
    return 0;
}


static void
voc_free(gvocab *v)
{
    free(v->nodes);
    free(v->toks);
    free(v->eog);
    free(v->tok_len);
    free(v->tok_bytes);
}


static int
trie_check(const gvocab *v, int32_t node, char *path, int depth,
           int32_t *seen)
{
    int bad = 0, prev = -1;

    for (int32_t t = 0; t < v->nodes[node].n_toks; t++) {
        int32_t id = v->toks[v->nodes[node].first_tok + t];

        seen[id]++;
        bad += v->tok_len[id] != depth
               || memcmp(v->tok_bytes[id], path, depth) != 0;
    }
    for (int32_t c = v->nodes[node].first_child; c >= 0;
         c = v->nodes[c].next_sibling)
    {
        bad += v->nodes[c].byte <= prev || depth >= 47;
        prev = v->nodes[c].byte;
        if (depth < 47) {
            path[depth] = (char) v->nodes[c].byte;
            bad += trie_check(v, c, path, depth + 1, seen);
        }
    }
    return bad;
}


int
nalar_grammar_cache_check(const nalar_grammar_cache *c)
{
    const gvocab *v = &c->voc;
    char          path[48];
    int32_t      *seen = calloc(v->n_vocab, sizeof(int32_t));
    int           bad;

    if (seen == NULL) {
        return -1;
    }
    bad = trie_check(v, 0, path, 0, seen);
    for (int32_t id = 0; id < v->n_vocab; id++) {
        bad += seen[id] != (v->tok_len[id] > 0);
    }
    free(seen);
    return bad;
}


/* ---- masks ---- */

static int
mask_walk(nalar_grammar *g, int32_t node, int32_t s, uint32_t *mask)
{
    const gvocab *v = g->voc;

    for (int32_t c = v->nodes[node].first_child; c >= 0;
         c = v->nodes[c].next_sibling)
    {
        const tnode *cn = &v->nodes[c];
        int32_t      s2 = gr_step_byte(g, s, cn->byte);

        if (s2 == -2) {
            return -1;
        }
        if (s2 < 0) {
            continue;
        }
        for (int32_t t = 0; t < cn->n_toks; t++) {
            int32_t id = v->toks[cn->first_tok + t];

            mask[id >> 5] |= 1u << (id & 31);
        }
        if (cn->first_child >= 0 && mask_walk(g, c, s2, mask) < 0) {
            return -1;
        }
    }
    return 0;
}


static const uint32_t *
state_mask(nalar_grammar *g, int32_t s)
{
    uint32_t *m;

    if (g->st[s].mask != NULL) {
        return g->st[s].mask;
    }
    if (gr_charge(g, g->voc->n_words * sizeof(uint32_t)) < 0) {
        return NULL;
    }
    m = calloc(g->voc->n_words, sizeof(uint32_t));
    if (m == NULL) {
        g->bytes -= g->voc->n_words * sizeof(uint32_t);
        return NULL;
    }
    if (forced_tok(g, s) >= 0) {
        /* where the bytes are forced, so is their tokenization */
        int32_t id = forced_tok(g, s);

        m[id >> 5] |= 1u << (id & 31);
        g->st[s].mask = m;
        return m;
    }
    if (mask_walk(g, 0, s, m) < 0) {
        free(m);
        g->bytes -= g->voc->n_words * sizeof(uint32_t);
        return NULL;
    }
    if (g->st[s].accepting) {
        for (int32_t i = 0; i < g->voc->n_eog; i++) {
            int32_t id = g->voc->eog[i];

            m[id >> 5] |= 1u << (id & 31);
        }
    }
    g->st[s].mask = m;
    return m;
}


/* ---- cache ---- */

nalar_grammar_cache *
nalar_grammar_cache_create(const nalar_tokenizer *tok, int cap)
{
    nalar_grammar_cache *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    if (voc_build(&c->voc, tok) < 0) {
        voc_free(&c->voc);
        free(c);
        return NULL;
    }
    c->cap = cap > 0 ? cap : 64;
    return c;
}


void
nalar_grammar_release(nalar_grammar *g)
{
    if (g != NULL && --g->refs == 0) {
        gr_grammar_free(g);
    }
}


void
nalar_grammar_cache_destroy(nalar_grammar_cache *c)
{
    nalar_grammar *g, *nx;

    if (c == NULL) {
        return;
    }
    for (g = c->head; g != NULL; g = nx) {
        nx = g->lru_next;
        nalar_grammar_release(g);
    }
    voc_free(&c->voc);
    free(c);
}


static uint64_t
fnv64(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char) s[i];
        h *= 1099511628211ULL;
    }
    return h;
}


nalar_grammar *
nalar_grammar_get(nalar_grammar_cache *c, int kind, const char *schema,
                  size_t len, double *compile_s, char *err, size_t errlen)
{
    json_t        *sc = NULL;
    json_error_t   je;
    char          *canon = NULL;
    size_t         clen = 0;
    uint64_t       dg;
    nalar_grammar *g, **pp;
    double         t0 = nalar_now_s();

    if (compile_s) {
        *compile_s = 0;
    }
    if (kind == NALAR_GRAMMAR_JSON_SCHEMA) {
        if (schema == NULL) {
            snprintf(err, errlen, "no schema");
            return NULL;
        }
        sc = json_loadb(schema, len, JSON_REJECT_DUPLICATES, &je);
        if (sc == NULL) {
            snprintf(err, errlen, "the schema is not JSON: %s", je.text);
            return NULL;
        }
        canon = json_dumps(sc, JSON_COMPACT | JSON_SORT_KEYS);
        if (canon == NULL) {
            json_decref(sc);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        clen = strlen(canon);
    } else if (kind != NALAR_GRAMMAR_JSON_OBJECT) {
        snprintf(err, errlen, "unknown grammar kind %d", kind);
        return NULL;
    }
    dg = fnv64(canon ? canon : "", clen, 14695981039346656037ULL ^ kind);
    for (pp = &c->head; *pp != NULL; pp = &(*pp)->lru_next) {
        g = *pp;
        if (g->kind == kind && g->digest == dg && g->canon_len == clen
            && (clen == 0 || memcmp(g->canon, canon, clen) == 0))
        {
            /* to the front */
            *pp = g->lru_next;
            g->lru_next = c->head;
            c->head = g;
            g->refs++;
            free(canon);
            json_decref(sc);
            return g;
        }
    }
    /* property order matters to the output, so the grammar is compiled
     * from the schema as written (the digest only keys the cache) */
    g = gr_grammar_compile(&c->voc, kind, sc, err, errlen);
    json_decref(sc);
    if (g == NULL) {
        free(canon);
        return NULL;
    }
    g->kind = kind;
    g->digest = dg;
    g->canon = canon;
    g->canon_len = clen;
    g->lru_next = c->head;
    c->head = g;
    g->refs++;               /* the cache's */
    c->n++;
    /* drop the least recently used while there are more than cap, or
     * their memory (grammars and automata) passes GR_CACHE_BYTES; the new
     * one stays.  A grammar dropped here lives on while matchers use it. */
    for (;;) {
        size_t total = 0;

        for (nalar_grammar *x = c->head; x != NULL; x = x->lru_next) {
            total += x->base_bytes + x->bytes;
        }
        if (c->n <= 1 || (c->n <= c->cap && total <= GR_CACHE_BYTES)) {
            break;
        }
        for (pp = &c->head; (*pp)->lru_next != NULL; pp = &(*pp)->lru_next) {
        }
        nalar_grammar_release(*pp);
        *pp = NULL;
        c->n--;
    }
    if (compile_s) {
        *compile_s = nalar_now_s() - t0;
    }
    return g;
}


/* ---- matcher ---- */

/*
 * An API call starts: its work budget is whole again.  Where the automaton
 * has passed half its memory budget, its caches (masks, byte transitions)
 * are dropped first; the states stay, as matchers hold their ids.  Masks
 * handed out are valid until the next call (grammar.h), so this is the
 * one place they may go.
 */
static void
call_begin(nalar_grammar *g, int trim)
{
    g->call_work = 0;
    g->why = NULL;
    if (!trim || g->bytes <= GR_MAX_BYTES / 2) {
        return;
    }
    for (int32_t i = 0; i < g->n_st; i++) {
        if (g->st[i].next != NULL) {
            free(g->st[i].next);
            g->st[i].next = NULL;
            g->bytes -= 256 * sizeof(int32_t);
        }
        if (g->st[i].mask != NULL) {
            free(g->st[i].mask);
            g->st[i].mask = NULL;
            g->bytes -= g->voc->n_words * sizeof(uint32_t);
        }
    }
}


const char *
nalar_gmatcher_error(const nalar_gmatcher *m)
{
    return m->g->why ? m->g->why : "out of memory";
}


nalar_gmatcher *
nalar_gmatcher_create(nalar_grammar *g)
{
    nalar_gmatcher *m = calloc(1, sizeof(*m));

    if (m == NULL) {
        return NULL;
    }
    m->cap_hist = 64;
    m->hist = malloc(m->cap_hist * sizeof(int32_t));
    if (m->hist == NULL) {
        free(m);
        return NULL;
    }
    m->g = g;
    g->refs++;
    m->hist[0] = g->start;
    m->n_hist = 1;
    return m;
}


void
nalar_gmatcher_destroy(nalar_gmatcher *m)
{
    if (m == NULL) {
        return;
    }
    nalar_grammar_release(m->g);
    free(m->hist);
    free(m);
}


static int32_t
cur(const nalar_gmatcher *m)
{
    return m->hist[m->n_hist - 1];
}


const uint32_t *
nalar_gmatcher_mask(nalar_gmatcher *m)
{
    int32_t s = cur(m);

    if (s == GR_ENDED) {
        return m->g->zero;
    }
    call_begin(m->g, 1);
    if (m->g->st[s].mask != NULL) {
        return m->g->st[s].mask;
    }
    return state_mask(m->g, s);
}


/* the state after token id from s: id, -1 refused, -2 out of memory */
static int32_t
step_token(nalar_grammar *g, int32_t s, int32_t id)
{
    const gvocab *v = g->voc;

    if (id < 0 || id >= v->n_vocab || v->tok_len[id] == 0) {
        return -1;
    }
    if (g->st[s].forced >= 0 && forced_tok(g, s) != id) {
        return -1;
    }
    for (int j = 0; j < v->tok_len[id] && s >= 0; j++) {
        s = gr_step_byte(g, s, (unsigned char) v->tok_bytes[id][j]);
    }
    return s;
}


static int
is_eog(const gvocab *v, int32_t id)
{
    for (int32_t i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == id) {
            return 1;
        }
    }
    return 0;
}


int
nalar_gmatcher_allows(nalar_gmatcher *m, int32_t id)
{
    int32_t s = cur(m);

    if (s == GR_ENDED) {
        return 0;
    }
    if (is_eog(m->g->voc, id)) {
        return m->g->st[s].accepting;
    }
    call_begin(m->g, 0);
    return step_token(m->g, s, id) >= 0;
}


int
nalar_gmatcher_accept(nalar_gmatcher *m, int32_t id)
{
    int32_t s = cur(m), s2;

    if (s == GR_ENDED) {
        return -1;
    }
    if (is_eog(m->g->voc, id)) {
        if (!m->g->st[s].accepting) {
            return -1;
        }
        s2 = GR_ENDED;
    } else {
        call_begin(m->g, 0);
        s2 = step_token(m->g, s, id);
        if (s2 < 0) {
            return -1;
        }
    }
    if (m->n_hist == m->cap_hist) {
        int32_t *nv = realloc(m->hist, m->cap_hist * 2 * sizeof(int32_t));

        if (nv == NULL) {
            return -1;
        }
        m->hist = nv;
        m->cap_hist *= 2;
    }
    m->hist[m->n_hist++] = s2;
    return 0;
}


void
nalar_gmatcher_rollback(nalar_gmatcher *m, int32_t n)
{
    if (n >= m->n_hist) {
        n = m->n_hist - 1;
    }
    if (n > 0) {
        m->n_hist -= n;
    }
}


int32_t
nalar_gmatcher_n_accepted(const nalar_gmatcher *m)
{
    return m->n_hist - 1;
}


int
nalar_gmatcher_can_end(nalar_gmatcher *m)
{
    int32_t s = cur(m);

    return s == GR_ENDED || m->g->st[s].accepting;
}


int
nalar_gmatcher_done(nalar_gmatcher *m)
{
    int32_t s = cur(m);

    return s == GR_ENDED
           || (m->g->st[s].accepting && m->g->st[s].len == 1);
}


/*
 * The forced bytes from state s (while exactly one byte is allowed and the
 * value is not complete), tokenized greedily: the longest vocabulary piece
 * at each point.  Up to cap ids in out; the count, or -1 when a step
 * failed (out of memory or past a budget: g->why).
 */
static int
forced_tokens(nalar_grammar *g, int32_t s, int32_t *out, int cap)
{
    const gvocab *v = g->voc;
    char          fb[256];
    int           nf = 0, n = 0, pos = 0;

    while (nf < (int) sizeof(fb) && s >= 0 && g->st[s].forced >= 0) {
        int c = g->st[s].forced;

        fb[nf++] = (char) c;
        s = gr_step_byte(g, s, c);
        if (s == -2) {
            return -1;       /* out of memory or past a budget (g->why) */
        }
    }
    while (pos < nf && n < cap) {
        int32_t node = 0, best = -1, best_len = 0;

        for (int j = pos; j < nf; j++) {
            int32_t nx = v->nodes[node].first_child;

            while (nx >= 0 && v->nodes[nx].byte != (unsigned char) fb[j]) {
                nx = v->nodes[nx].next_sibling;
            }
            if (nx < 0) {
                break;
            }
            node = nx;
            if (v->nodes[node].n_toks) {
                best = v->toks[v->nodes[node].first_tok];
                best_len = j - pos + 1;
            }
        }
        if (best < 0) {
            break;
        }
        out[n++] = best;
        pos += best_len;
    }
    return n;
}


/* The one token a forced state allows, or -1 where s is not forced. */
static int32_t
forced_tok(nalar_grammar *g, int32_t s)
{
    if (g->st[s].forced_tok == -2) {
        int32_t t;
        int     n = forced_tokens(g, s, &t, 1);

        if (n < 0) {
            return -1;       /* a failure is not remembered */
        }
        g->st[s].forced_tok = n == 1 ? t : -1;
    }
    return g->st[s].forced_tok;
}


int
nalar_gmatcher_forced(nalar_gmatcher *m, int32_t *out, int cap)
{
    int32_t s = cur(m);
    int     n;

    if (s == GR_ENDED) {
        return 0;
    }
    call_begin(m->g, 0);
    n = forced_tokens(m->g, s, out, cap);
    return n < 0 ? 0 : n;
}


int
nalar_grammar_match(nalar_grammar *g, const char *s, size_t n)
{
    int32_t st = g->start;

    call_begin(g, 0);
    for (size_t i = 0; i < n && st >= 0; i++) {
        st = gr_step_byte(g, st, (unsigned char) s[i]);
    }
    return st >= 0 && g->st[st].accepting;
}
