/* Minimal TAP producer for the C unit tests run by prove. */
#ifndef NALAR_TAP_H
#define NALAR_TAP_H

#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...) do {                                              \
        int c_ = (cond) ? 1 : 0;                                         \
        flockfile(stdout);      /* one line, whole, whatever prints */   \
        tap_n++;                                                         \
        if (!c_) tap_failed++;                                           \
        printf("%sok %d - ", c_ ? "" : "not ", tap_n);                   \
        printf(__VA_ARGS__);                                             \
        printf("\n");                                                    \
        if (!c_) printf("#   failed at %s:%d\n", __FILE__, __LINE__);    \
        fflush(stdout);                                                  \
        funlockfile(stdout);                                             \
    } while (0)

#define is_int(got, want, ...) do {                                     \
        long long g_ = (long long) (got), w_ = (long long) (want);       \
        ok(g_ == w_, __VA_ARGS__);                                       \
        if (g_ != w_) printf("#   got %lld, want %lld\n", g_, w_);       \
    } while (0)

/* one skipped test, with its reason */
#define skip(...) do {                                                \
        flockfile(stdout);                                               \
        tap_n++;                                                         \
        printf("ok %d # skip ", tap_n);                                  \
        printf(__VA_ARGS__);                                             \
        printf("\n");                                                    \
        fflush(stdout);                                                  \
        funlockfile(stdout);                                             \
    } while (0)

#define diag(...) do {                                                \
        flockfile(stdout);                                               \
        printf("# "); printf(__VA_ARGS__); printf("\n");                 \
        funlockfile(stdout);                                             \
    } while (0)

static inline int
done_testing(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

#endif
