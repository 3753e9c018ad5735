#include <stdio.h>
#include <string.h>

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
    nalar_failure_trim(f);
    return -1;
}


void
nalar_failure_trim(nalar_failure *f)
{
    size_t        n = strlen(f->message), i = n, need;
    unsigned char c;

    /* back over at most three continuation bytes to their lead byte */
    while (i > 0 && n - i < 3 && ((unsigned char) f->message[i - 1] & 0xc0)
                                 == 0x80)
    {
        i--;
    }
    if (i == 0) {
        return;
    }
    c = (unsigned char) f->message[i - 1];
    if (c < 0xc0) {
        return;
    }
    need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    if (n - (i - 1) < need) {
        f->message[i - 1] = '\0';
    }
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
