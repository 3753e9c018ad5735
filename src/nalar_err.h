/*
 * Error reporting for the engine.  A server never exits: every function that
 * can fail takes a nalar_err and returns -1 (or NULL) after filling it with a
 * message a person can act on ("FILE: what is wrong").
 */
#ifndef NALAR_ERR_H
#define NALAR_ERR_H

#include <stdarg.h>

typedef struct {
    char msg[512];
} nalar_err;

/* printf-style; always returns -1 so callers can `return nalar_fail(...)`. */
int nalar_fail(nalar_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
