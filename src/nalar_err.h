/*
 * Error reporting.  A server never exits: every function that can fail
 * takes a nalar_err and returns -1 (or NULL) after filling it with a
 * message a person can act on ("FILE: what is wrong").
 *
 * What a client is told is a nalar_failure: one struct through every
 * layer, filled once where the error is found (the engine refusing or
 * failing a request, the protocol layer parsing its body, the server's
 * own checks) and written once into OpenAI's body
 * {"error":{"message","type","param","code"}} with its HTTP status
 * (api/error_json.h).  It is passed by pointer, or copied whole where it
 * crosses threads (an engine request's output), never field by field.
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

/*
 * Invariants: status 0 means no error, and then nothing else is read;
 * otherwise type is set.  type and code are static strings (they outlive
 * every copy); param and message are copies, cut to their size and
 * always NUL-terminated.
 */
typedef struct {
    int          status;        /* HTTP: 400, 404, 500, 503 ...; 0: none */
    const char  *type;          /* OpenAI's: "invalid_request_error",
                                   "server_error", ... */
    const char  *code;          /* OpenAI's ("context_length_exceeded")
                                   or NULL: null */
    char         param[64];     /* the request field at fault; "": null */
    char         message[1024];
} nalar_failure;

#define NALAR_INVALID_REQUEST  "invalid_request_error"
#define NALAR_SERVER_ERROR     "server_error"

/*
 * Fills *f whole (param NULL: none; the message printf-style, cut to
 * its size) and returns -1, so callers can `return nalar_failure_set()`.
 */
int nalar_failure_set(nalar_failure *f, int status, const char *type,
                      const char *param, const char *code,
                      const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
int nalar_failure_vset(nalar_failure *f, int status, const char *type,
                       const char *param, const char *code,
                       const char *fmt, va_list args);

/* Cuts a UTF-8 sequence that the message's size cut in two (the JSON
 * writer refuses invalid UTF-8 and would lose the whole message);
 * nalar_failure_vset calls it, and whoever formats a message itself. */
void nalar_failure_trim(nalar_failure *f);

#endif
