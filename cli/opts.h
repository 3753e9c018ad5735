/*
 * Command-line options of the nalar tool's commands, from a table: each
 * option names where its value goes and of what kind, so that every
 * command answers a missing value, an unknown option and a number that is
 * not one the same way (a message on stderr naming the command, exit
 * status 2), and none reads "-n abc" as 0.
 */
#ifndef NALAR_CLI_OPTS_H
#define NALAR_CLI_OPTS_H

#include <stdint.h>

typedef enum {
    NALAR_OPT_FLAG,     /* no value: *(int *) dst = 1 */
    NALAR_OPT_STR,      /* *(const char **) dst = the argument */
    NALAR_OPT_STRS,     /* ((const char **) dst)[(*count)++], up to cap */
    NALAR_OPT_INT,      /* *(int *) dst: a decimal integer */
    NALAR_OPT_U64,      /* *(uint64_t *) dst: a decimal integer >= 0 */
    NALAR_OPT_FLOAT,    /* *(float *) dst: a finite number */
    NALAR_OPT_DOUBLE,   /* *(double *) dst: a finite number */
    NALAR_OPT_ARG       /* name NULL: *(const char **) dst = the first
                           argument that is no option (a second one is
                           refused); dst starts NULL */
} nalar_opt_kind;

typedef struct {
    const char     *name;       /* "-m", "--draft"; NULL: NALAR_OPT_ARG */
    const char     *alias;      /* a second spelling, or NULL */
    nalar_opt_kind  kind;
    void           *dst;
    int            *count;      /* NALAR_OPT_STRS: values so far */
    int             cap;        /* NALAR_OPT_STRS: at most this many */
} nalar_opt;

/* Options argv[1..argc) of command `cmd` ("generate") against opts[0..n).
 * Returns 0, or 2 after a message on stderr. */
int nalar_opts_parse(const char *cmd, int argc, char **argv,
                     const nalar_opt *opts, int n);
/* the same over an array of options (not a pointer: its size is taken) */
#define NALAR_OPTS_PARSE(cmd, argc, argv, opts)                               \
    nalar_opts_parse((cmd), (argc), (argv), (opts),                           \
                     (int) (sizeof(opts) / sizeof((opts)[0])))

/* --cpu-activations of command `cmd` for backend `backend` (NULL: the
 * CPU's): "f32" 0, "i16" 1, "q8" 2, "pairs" 3 (NALAR_ACT_*); not given:
 * the CPU backend's NALAR_ACT_DEFAULT, another backend's F32; else -1
 * after a message on stderr */
int nalar_opt_activations(const char *cmd, const char *s,
                          const char *backend);

/* --kv-type of command `cmd`: "f32" (also when not given), "f16" or
 * "bf16" as a ggml_type (GGML_F32, GGML_F16, GGML_BF16); else -1 after a
 * message on stderr */
int nalar_opt_kv_type(const char *cmd, const char *s);

#endif
