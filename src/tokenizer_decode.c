/*
 * Ids back to text: each token's bytes, and the streaming detokenizer that
 * only ever hands out complete UTF-8.
 */
#include "tokenizer_internal.h"

/* ---------------------------------------------------------------------- */
/* decoding                                                               */

/* The bytes of one token into out (up to cap); returns the full length,
 * which may exceed cap. */
static int
piece_bytes(const nalar_tokenizer *t, int32_t id, char *out, int cap)
{
    uint32_t n;
    const char *p;
    int k = 0;

    if (t == NULL || id < 0 || id >= t->n_vocab) return 0;
    p = piece_of(t, id, &n);

#define EMIT(c) do { if (k < cap) out[k] = (char) (c); k++; } while (0)
    switch (t->type[id]) {
    case TOKT_USER_DEFINED:
        /* verbatim */
        for (uint32_t i = 0; i < n; i++) EMIT(p[i]);
        return k;
    case TOKT_NORMAL:
        break;
    case TOKT_BYTE:
        if (t->kind == TOK_SPM && n == 6 && memcmp(p, "<0x", 3) == 0) {
            int v = 0;
            for (int i = 3; i < 5; i++) {
                char c = p[i];
                v <<= 4;
                if (c >= '0' && c <= '9') v |= c - '0';
                else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
                else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
                else return 0;
            }
            EMIT(v);
            return k;
        }
        break;
    case TOKT_UNKNOWN:
        if (t->kind == TOK_SPM) {
            /* llama.cpp shows an unknown piece as U+2585 "▅" */
            EMIT(0xE2); EMIT(0x96); EMIT(0x85);
        }
        return k;
    default:
        /* control, unused, undefined: nothing */
        return 0;
    }

    if (t->kind == TOK_SPM) {
        for (uint32_t i = 0; i < n; i++) {
            if (i + 2 < n && memcmp(p + i, "\xE2\x96\x81", 3) == 0) {
                EMIT(' ');
                i += 2;
            } else {
                EMIT(p[i]);
            }
        }
    } else {
        /* byte-level: each code point back to its byte; code points
           outside the map pass through as their UTF-8 */
        for (size_t i = 0; i < n; ) {
            size_t i0 = i;
            uint32_t c = utf8_decode((const uint8_t *) p, n, &i);
            if (c < 512 && t->cp_byte[c] >= 0 && !(c == 0xFFFD)) {
                EMIT(t->cp_byte[c]);
            } else {
                for (size_t j = i0; j < i; j++) EMIT(p[j]);
            }
        }
    }
#undef EMIT
    return k;
}

int
nalar_token_bytes(const nalar_tokenizer *t, int32_t id, char *out, int cap)
{
    int n = piece_bytes(t, id, out, cap);
    return n < cap ? n : cap;
}

void
nalar_detok_init(nalar_detok *d, const nalar_tokenizer *t)
{
    memset(d, 0, sizeof(*d));
    d->tok = t;
}

/* Runs bytes through the UTF-8 assembler in state (pend, *np), writing
 * complete characters to out; an invalid byte or a sequence cut short
 * becomes one U+FFFD per byte.  Returns bytes written, or -1 if more than
 * cap would be needed. */
static int
utf8_stream(char *pend, int *np, const uint8_t *in, size_t n, char *out,
            int cap)
{
    int k = 0;

#define PUT(p, len) do {                                   \
        if (k + (len) > cap) return -1;                    \
        memcpy(out + k, (p), (len));                       \
        k += (len);                                        \
    } while (0)

    for (size_t i = 0; i < n; i++) {
        uint8_t b = in[i];
    again:
        if (*np == 0) {
            int need = utf8_lead_len(b);
            if (need == 1) PUT(&b, 1);
            else if (need == 0) PUT("\xEF\xBF\xBD", 3);
            else pend[(*np)++] = (char) b;
            continue;
        }
        if (utf8_cont_ok((uint8_t) pend[0], *np, b)) {
            pend[(*np)++] = (char) b;
            if (*np == utf8_lead_len((uint8_t) pend[0])) {
                PUT(pend, *np);
                *np = 0;
            }
            continue;
        }
        /* the held bytes cannot complete: each becomes U+FFFD */
        for (int j = 0; j < *np; j++) PUT("\xEF\xBF\xBD", 3);
        *np = 0;
        goto again;
    }
#undef PUT
    return k;
}

int
nalar_detok_feed(nalar_detok *d, int32_t id, char *out, int cap)
{
    char small[256], *buf = small, pend[8];
    int n, np = d->n_pending, k;
    uint8_t *b;

    if (cap < 1) return -1;
    n = piece_bytes(d->tok, id, NULL, 0);
    if (n > (int) sizeof(small)) {
        buf = malloc(n);
        if (buf == NULL) return -1;
    }
    piece_bytes(d->tok, id, buf, n);
    b = (uint8_t *) buf;
    if (d->strip_space && n > 0 && b[0] == ' ') {
        b++;
        n--;
    }
    memcpy(pend, d->pending, sizeof(pend));
    k = utf8_stream(pend, &np, b, (size_t) n, out, cap - 1);
    if (buf != small) free(buf);
    if (k < 0) return -1;           /* state untouched: retry bigger */
    if (n > 0 || b != (uint8_t *) buf) d->strip_space = 0;
    memcpy(d->pending, pend, sizeof(pend));
    d->n_pending = np;
    out[k] = '\0';
    return k;
}

int
nalar_detok_flush(nalar_detok *d, char *out, int cap)
{
    int k = 0;

    if (cap < 1) return -1;
    if (3 * d->n_pending + 1 > cap) return -1;
    for (int j = 0; j < d->n_pending; j++) {
        memcpy(out + k, "\xEF\xBF\xBD", 3);
        k += 3;
    }
    d->n_pending = 0;
    out[k] = '\0';
    return k;
}

char *
nalar_detokenize(const nalar_tokenizer *t, const int32_t *ids, int n)
{
    nalar_detok d;
    size_t cap = 64, len = 0;
    char *s = malloc(cap);

    if (s == NULL || t == NULL || (ids == NULL && n > 0)) {
        free(s);
        return NULL;
    }
    nalar_detok_init(&d, t);
    d.strip_space = t->kind == TOK_SPM && t->add_space_prefix;
    for (int i = 0; i <= n; i++) {
        /* room for the piece, its U+FFFDs and what was held back */
        size_t need = i < n ? 3 * (size_t) piece_bytes(t, ids[i], NULL, 0) + 32
                            : 32;
        int k;
        if (len + need > cap) {
            char *r;
            while (len + need > cap) cap *= 2;
            r = realloc(s, cap);
            if (r == NULL) {
                free(s);
                return NULL;
            }
            s = r;
        }
        k = i < n ? nalar_detok_feed(&d, ids[i], s + len, (int) (cap - len))
                  : nalar_detok_flush(&d, s + len, (int) (cap - len));
        if (k < 0) {
            free(s);
            return NULL;
        }
        len += k;
    }
    s[len] = '\0';
    return s;
}
