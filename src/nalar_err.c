#include <stdio.h>

#include "nalar_err.h"


int
nalar_fail(nalar_err *err, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL) {
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return -1;
}


int
nalar_failure_vset(nalar_failure *f, int status, const char *type,
                   const char *param, const char *code, const char *fmt,
                   va_list args)
{
    f->status = status;
    f->type = type;
    f->code = code;
    snprintf(f->param, sizeof(f->param), "%s", param != NULL ? param : "");
    vsnprintf(f->message, sizeof(f->message), fmt, args);
    return -1;
}


int
nalar_failure_set(nalar_failure *f, int status, const char *type,
                  const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    nalar_failure_vset(f, status, type, param, code, fmt, ap);
    va_end(ap);
    return -1;
}
