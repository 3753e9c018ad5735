/*
 * The merge loop shared by SPM and BPE, and the encoding of one fragment
 * of text with each (see tokenizer.c for the whole).
 */
#include "tokenizer_internal.h"

static int
bigram_before(const bigram *a, const bigram *b)
{
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

/* A float as an int32 with the same order (scores are finite). */
static int32_t
score_key(float f)
{
    int32_t i;

    if (f == 0.0f) return 0;  /* -0 == +0 */
    memcpy(&i, &f, 4);
    return i < 0 ? i ^ INT32_MAX : i;
}

/* 4-ary heap: shallower than binary, and a node's children share a cache
 * line, which matters with a million symbols in a word */
static int
heap_push(heap *h, bigram g)
{
    size_t i;

    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *v = realloc(h->v, cap * sizeof(*v));
        if (v == NULL) return -1;
        h->v = v;
        h->cap = cap;
    }
    i = h->n++;
    while (i > 0 && bigram_before(&g, &h->v[(i - 1) / 4])) {
        h->v[i] = h->v[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    h->v[i] = g;
    return 0;
}

static bigram
heap_pop(heap *h)
{
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;

    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= h->n) break;
        for (size_t j = c + 1; j < c + 4 && j < h->n; j++)
            if (bigram_before(&h->v[j], &h->v[best])) best = j;
        if (!bigram_before(&h->v[best], &last)) break;
        h->v[i] = h->v[best];
        i = best;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}


/* Queues (left, right) if merging them is allowed. */
static void
try_pair(merger *m, int32_t left, int32_t right)
{
    const symbol *l, *r;
    bigram g;

    if (left < 0 || right < 0) return;
    l = &m->sym[left];
    r = &m->sym[right];
    if (m->t->kind == TOK_SPM) {
        /* SPM: the concatenation must be a token; its score decides */
        int32_t id = ntok_lookup(m->t, m->w + l->off, l->n + r->n);
        if (id < 0) return;
        g.key = score_key(m->t->score[id]);
    } else {
        int32_t rank = ntok_merge_rank(m->t, m->w + l->off, l->n, m->w + r->off, r->n);
        if (rank < 0) return;
        g.key = -rank;
    }
    g.left = left;
    g.right = right;
    g.size = l->n + r->n;
    if (heap_push(&m->q, g) < 0) m->oom = 1;
}

/* Splits w[0..n) into UTF-8 characters and merges them; returns the index
 * of the first symbol (follow .next), or -1 for an empty word. */
static int
merge_word(merger *m, const char *w, size_t n)
{
    size_t off = 0;
    int32_t k = 0;

    m->w = w;
    m->q.n = 0;
    while (off < n) {
        /* a valid character is one symbol; an invalid byte is one on its
           own (llama.cpp would take the length its lead byte claims, which
           for valid text is the same) */
        size_t i = off, len;
        utf8_decode((const uint8_t *) w, n, &i);
        len = i - off;
        m->sym[k].off = (uint32_t) off;
        m->sym[k].n = (uint32_t) len;
        m->sym[k].prev = k - 1;
        off += len;
        m->sym[k].next = off == n ? -1 : k + 1;
        k++;
    }
    if (k == 0) return -1;
    for (int32_t i = 1; i < k; i++) try_pair(m, i - 1, i);

    while (m->q.n > 0) {
        bigram g = heap_pop(&m->q);
        symbol *l = &m->sym[g.left], *r = &m->sym[g.right];

        /* stale: one side was merged away or grew since g was queued */
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) m->sym[r->next].prev = g.left;
        try_pair(m, l->prev, g.left);
        try_pair(m, g.left, l->next);
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* SPM                                                                    */

int
ntok_spm_fragment(const nalar_tokenizer *t, merger *m, const char *s, size_t n,
             int prefix, idvec *out)
{
    /* "▁" for the dummy prefix and every space */
    size_t spaces = 0, k = 0;
    char *w;

    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    w = malloc(n + 2 * spaces + 3 * (prefix != 0) + 1);
    if (w == NULL) return -1;
    if (prefix) {
        memcpy(w, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            w[k++] = s[i];
        }
    }
    if (merge_word(m, w, k) == 0) {
        for (int32_t i = 0; i != -1; i = m->sym[i].next) {
            const symbol *y = &m->sym[i];
            int32_t id = ntok_lookup(t, w + y->off, y->n);
            if (id >= 0) {
                push_id(out, id);
                continue;
            }
            /* never became a token: one byte token per byte */
            for (uint32_t j = 0; j < y->n; j++) {
                int32_t b = t->byte_tok[(uint8_t) w[y->off + j]];
                if (b < 0) b = t->unk;
                if (b >= 0) push_id(out, b);
            }
        }
    }
    free(w);
    return m->oom ? -1 : 0;
}

int
ntok_bpe_fragment(const nalar_tokenizer *t, merger *m, const char *s,
                  size_t n, idvec *out)
{
    pretok p;
    char *w, *norm = NULL;
    size_t start = 0;
    int rc = -1;

    if (t->nfc) {
        norm = ntok_nfc(s, n, &n);
        if (norm == NULL) return -1;
        s = norm;
        /* one symbol per byte of a word, an invalid byte 3 of U+FFFD */
        if (3 * n + 2 > m->cap) {
            symbol *y = realloc(m->sym, (3 * n + 2) * sizeof(symbol));
            if (y == NULL) {
                free(norm);
                return -1;
            }
            m->sym = y;
            m->cap = 3 * n + 2;
        }
    }
    w = malloc(8 * n + 1);   /* each byte -> U+FFFD -> 2 bytes each */
    if (w == NULL || ntok_pretokenize(t, s, n, &p) < 0) {
        free(w);
        free(norm);
        return -1;
    }
    for (size_t k = 0; k < p.nw; k++) {
        size_t wn = 0;
        int32_t id;

        /* the word's bytes, each as its printable code point */
        for (size_t i = start; i < p.ends[k]; i++) {
            char u[4];
            int ul = utf8_encode(p.cp[i], u);
            for (int j = 0; j < ul; j++)
                wn += utf8_encode(t->byte_cp[(uint8_t) u[j]], w + wn);
        }
        start = p.ends[k];

        if (t->ignore_merges && (id = ntok_lookup(t, w, wn)) >= 0) {
            push_id(out, id);
            continue;
        }
        if (merge_word(m, w, wn) < 0) continue;
        for (int32_t i = 0; i != -1; i = m->sym[i].next) {
            const symbol *y = &m->sym[i];
            id = ntok_lookup(t, w + y->off, y->n);
            if (id >= 0) {
                push_id(out, id);
                continue;
            }
            /* as llama.cpp: try each byte of the symbol on its own */
            for (uint32_t j = 0; j < y->n; j++) {
                id = ntok_lookup(t, w + y->off + j, 1);
                if (id >= 0) push_id(out, id);
            }
        }
        if (m->oom) goto done;
        if (full(out)) break;
    }
    rc = 0;
done:
    ntok_pretok_free(&p);
    free(w);
    free(norm);
    return rc;
}
