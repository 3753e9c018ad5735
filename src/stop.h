/*
 * Stop sequences over streamed text.
 *
 * Generated text arrives a token at a time, and a stop string may straddle
 * tokens ("\n\nUser:" as "\n", "\nUser", ":").  The matcher emits text as soon
 * as it can no longer be part of a stop string and holds back the tail that
 * could still become one, so the client never sees any part of a stop string.
 */
#ifndef NALAR_STOP_H
#define NALAR_STOP_H

#include <stddef.h>

typedef struct nalar_stop nalar_stop;

/* Borrows the strings (not copied: they must outlive the matcher, so the
 * choices of one request share one copy); NULL and empty strings are
 * ignored (none left: every byte passes straight through).  NULL when out
 * of memory. */
nalar_stop *nalar_stop_create(const char *const *stops, int n);
void        nalar_stop_destroy(nalar_stop *s);

/*
 * Feed newly generated text (complete UTF-8).  Returns the number of bytes of
 * (held-back + new) text that are safe to emit now, at *emit (a pointer into
 * an internal buffer, valid until the next call).  When a stop string is
 * completed (the first to complete as if the text came a byte at a time;
 * of several ending on the same byte, the one starting first), sets
 * *stopped = 1: the text before the stop string is emitted
 * and the stop string and everything after it dropped; later feeds emit
 * nothing and keep *stopped = 1.  Out of memory (the text could not be
 * taken) ends the stream with *stopped = -1, after emitting what was held
 * back: the caller reports the failure, it is no stop.
 */
size_t nalar_stop_feed(nalar_stop *s, const char *text, size_t len,
                       const char **emit, int *stopped);

/* End of generation: release what is held back (nothing after a stop). */
size_t nalar_stop_flush(nalar_stop *s, const char **emit);

#endif
