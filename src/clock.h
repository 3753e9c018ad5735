/*
 * Monotonic seconds, for measuring: the engine's cost tables and step
 * gate, the benchmarks and the timing tests.
 */
#ifndef NALAR_CLOCK_H
#define NALAR_CLOCK_H

#include <time.h>

static inline double
nalar_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

#endif
