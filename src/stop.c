/*
 * Stop-sequence matching over a stream.  The state is one buffer:
 *
 *   buf[0 .. emitted)      what the last call handed out (still readable by
 *                          the caller until the next call)
 *   buf[emitted .. end)    held back: a suffix that is a proper prefix of
 *                          some stop string, shorter than the longest one
 *
 * Each feed appends the new text after the held tail and looks for the
 * first stop string to complete.  Without one, everything before the earliest
 * position from which the rest of the buffer could still grow into a stop
 * string is safe: no stop string can start there any more.  Matches only
 * start at UTF-8 character boundaries, so the emitted text never ends inside
 * a character (stop strings are text, and text starts with a lead byte).
 */
#include <stdlib.h>
#include <string.h>

#include "stop.h"


struct nalar_stop {
    const char **stop; /* (n) the caller's strings, borrowed, none empty */
    size_t *len;       /* (n) strlen of each */
    int     n;
    size_t  max_len;   /* longest stop string; held tail is < this */
    char   *buf;       /* (cap) see above */
    size_t  cap;
    size_t  emitted;
    size_t  end;
    int     stopped;   /* 1: a stop string completed, -1: out of memory;
                          either way emit nothing more */
};


nalar_stop *
nalar_stop_create(const char *const *stops, int n)
{
    nalar_stop *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    if (stops != NULL && n > 0) {
        s->stop = calloc((size_t) n, sizeof(*s->stop));
        s->len = calloc((size_t) n, sizeof(*s->len));
        if (s->stop == NULL || s->len == NULL) {
            nalar_stop_destroy(s);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            size_t l;

            if (stops[i] == NULL || stops[i][0] == '\0') {
                continue;
            }
            l = strlen(stops[i]);
            s->stop[s->n] = stops[i];
            s->len[s->n] = l;
            s->n++;
            if (l > s->max_len) {
                s->max_len = l;
            }
        }
    }

    /* room for a held tail plus a few tokens before the first realloc */
    s->cap = 2 * s->max_len + 256;
    s->buf = malloc(s->cap);
    if (s->buf == NULL) {
        nalar_stop_destroy(s);
        return NULL;
    }
    return s;
}


void
nalar_stop_destroy(nalar_stop *s)
{
    if (s == NULL) {
        return;
    }
    free(s->stop);
    free(s->len);
    free(s->buf);
    free(s);
}


static int
char_start(const char *p)
{
    return ((unsigned char) *p & 0xC0) != 0x80;
}


size_t
nalar_stop_feed(nalar_stop *s, const char *text, size_t len,
                const char **emit, int *stopped)
{
    size_t held, pos, safe;

    *stopped = s->stopped;
    *emit = s->buf;
    if (s->stopped != 0) {
        return 0;
    }

    /* forget what the last call emitted; the held tail moves to the front */
    held = s->end - s->emitted;
    memmove(s->buf, s->buf + s->emitted, held);
    s->emitted = 0;
    s->end = held;

    if (len > s->cap - held) {
        size_t need = held + len, cap = 2 * s->cap;
        char  *nb;

        if (need < held) {
            nb = NULL;                            /* size_t overflow */
        } else {
            if (cap < need) {
                cap = need;
            }
            nb = realloc(s->buf, cap);
        }
        if (nb == NULL) {
            /* cannot take the text: the stream ends, and the caller
             * learns why (*stopped < 0) */
            s->emitted = s->end;
            s->stopped = -1;
            *stopped = -1;
            return held;
        }
        s->buf = nb;
        s->cap = cap;
        *emit = s->buf;
    }
    if (len > 0) {
        memcpy(s->buf + s->end, text, len);
        s->end += len;
    }

    /*
     * The first stop string to be completed ends the stream, as if the text
     * had arrived a byte at a time: scan by end position, and among stops
     * ending at the same byte take the one starting first.  So the outcome
     * never depends on how the text was cut into feeds.
     */
    for (size_t e = 1; e <= s->end; e++) {
        size_t best = e;

        for (int i = 0; i < s->n; i++) {
            size_t start;

            if (s->len[i] > e) {
                continue;
            }
            start = e - s->len[i];
            if (start < best && char_start(s->buf + start)
                && memcmp(s->buf + start, s->stop[i], s->len[i]) == 0)
            {
                best = start;
            }
        }
        if (best < e) {
            s->emitted = best;
            s->end = best;
            s->stopped = 1;
            *stopped = 1;
            return best;
        }
    }

    /* hold back from the earliest position whose rest is a stop's prefix;
     * only the last max_len - 1 bytes can be one */
    safe = s->end;
    pos = s->end >= s->max_len ? s->end - s->max_len + 1 : 0;
    for (; pos < s->end && safe == s->end; pos++) {
        size_t rest = s->end - pos;

        if (!char_start(s->buf + pos)) {
            continue;
        }
        for (int i = 0; i < s->n; i++) {
            if (s->len[i] > rest
                && memcmp(s->buf + pos, s->stop[i], rest) == 0)
            {
                safe = pos;
                break;
            }
        }
    }

    s->emitted = safe;
    return safe;
}


size_t
nalar_stop_flush(nalar_stop *s, const char **emit)
{
    size_t n = s->end - s->emitted;

    *emit = s->buf + s->emitted;
    if (s->stopped != 0) {
        return 0;
    }
    s->emitted = s->end;
    return n;
}
