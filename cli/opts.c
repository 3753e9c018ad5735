/*
 * Table-driven option parsing for the nalar tool; see opts.h.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "opts.h"


static const nalar_opt *
find(const nalar_opt *opts, int n, const char *a)
{
    for (int k = 0; k < n; k++) {
        if (opts[k].name == NULL) {
            continue;
        }
        if (strcmp(a, opts[k].name) == 0
            || (opts[k].alias != NULL && strcmp(a, opts[k].alias) == 0))
        {
            return &opts[k];
        }
    }
    return NULL;
}


/* the positional argument's entry, or NULL */
static const nalar_opt *
find_arg(const nalar_opt *opts, int n)
{
    for (int k = 0; k < n; k++) {
        if (opts[k].kind == NALAR_OPT_ARG) {
            return &opts[k];
        }
    }
    return NULL;
}


/* v as the option's kind, stored; 0, or -1 when v is not one */
static int
store(const nalar_opt *o, const char *v)
{
    char *end;

    errno = 0;
    switch (o->kind) {
    case NALAR_OPT_STR:
        *(const char **) o->dst = v;
        return 0;
    case NALAR_OPT_STRS:
        if (*o->count >= o->cap) {
            return -1;
        }
        ((const char **) o->dst)[(*o->count)++] = v;
        return 0;
    case NALAR_OPT_INT: {
        long x = strtol(v, &end, 10);

        if (end == v || *end != '\0' || errno != 0 || x < -2147483647L
            || x > 2147483647L)
        {
            return -1;
        }
        *(int *) o->dst = (int) x;
        return 0;
    }
    case NALAR_OPT_U64: {
        unsigned long long x;

        if (strchr(v, '-') != NULL) {   /* strtoull would negate it */
            return -1;
        }
        x = strtoull(v, &end, 10);
        if (end == v || *end != '\0' || errno != 0) {
            return -1;
        }
        *(uint64_t *) o->dst = (uint64_t) x;
        return 0;
    }
    case NALAR_OPT_FLOAT:
    case NALAR_OPT_DOUBLE: {
        double x = strtod(v, &end);

        if (end == v || *end != '\0' || errno != 0 || !isfinite(x)) {
            return -1;
        }
        if (o->kind == NALAR_OPT_FLOAT) {
            *(float *) o->dst = (float) x;
        } else {
            *(double *) o->dst = x;
        }
        return 0;
    }
    default:
        return -1;
    }
}


int
nalar_opts_parse(const char *cmd, int argc, char **argv,
                 const nalar_opt *opts, int n)
{
    for (int i = 1; i < argc; i++) {
        const nalar_opt *o = find(opts, n, argv[i]);

        if (o == NULL) {
            o = find_arg(opts, n);
            if (o == NULL || *(const char **) o->dst != NULL) {
                fprintf(stderr, "nalar %s: %s '%s'\n", cmd,
                        o == NULL ? "unknown option" : "unexpected argument",
                        argv[i]);
                return 2;
            }
            *(const char **) o->dst = argv[i];
            continue;
        }
        if (o->kind == NALAR_OPT_FLAG) {
            *(int *) o->dst = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "nalar %s: %s needs a value\n", cmd, argv[i]);
            return 2;
        }
        i++;
        if (store(o, argv[i]) != 0) {
            if (o->kind == NALAR_OPT_STRS) {
                fprintf(stderr, "nalar %s: %s at most %d times\n", cmd,
                        argv[i - 1], o->cap);
            } else {
                fprintf(stderr, "nalar %s: %s wants %s, not '%s'\n", cmd,
                        argv[i - 1],
                        o->kind == NALAR_OPT_INT ? "an integer"
                        : o->kind == NALAR_OPT_U64
                          ? "a non-negative integer" : "a number",
                        argv[i]);
            }
            return 2;
        }
    }
    return 0;
}


int
nalar_opt_activations(const char *cmd, const char *s, const char *backend)
{
    if (s == NULL) {
        return backend == NULL || strcmp(backend, "cpu") == 0
               ? NALAR_ACT_DEFAULT : NALAR_ACT_F32;
    }
    if (strcmp(s, "f32") == 0) {
        return NALAR_ACT_F32;
    }
    if (strcmp(s, "i16") == 0) {
        return NALAR_ACT_I16;
    }
    if (strcmp(s, "q8") == 0) {
        return NALAR_ACT_Q8;
    }
    if (strcmp(s, "pairs") == 0) {
        return NALAR_ACT_PAIRS;
    }
    fprintf(stderr, "nalar %s: --cpu-activations f32|i16|q8|pairs\n", cmd);
    return -1;
}


int
nalar_opt_kv_type(const char *cmd, const char *s)
{
    if (s == NULL || strcmp(s, "f32") == 0) {
        return GGML_F32;
    }
    if (strcmp(s, "f16") == 0) {
        return GGML_F16;
    }
    if (strcmp(s, "bf16") == 0) {
        return GGML_BF16;
    }
    fprintf(stderr, "nalar %s: --kv-type f32|f16|bf16\n", cmd);
    return -1;
}
