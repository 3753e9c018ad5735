/*
 * What the in-process benchmarks (the C files in bench/) time with: the
 * engine's monotonic clock, and the median of a set of timings.
 */
#ifndef NALAR_BENCH_TIME_H
#define NALAR_BENCH_TIME_H

#include <stdlib.h>

#include "clock.h"

/* seconds on the monotonic clock (the engine's nalar_now_s) */
static inline double
now(void)
{
    return nalar_now_s();
}


/* qsort's comparison of doubles, ascending */
static inline int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}


/* the median of v[0 .. n) (sorted in place; the mean of the middle two
 * for an even n) */
static inline double
median_of(double *v, int n)
{
    qsort(v, (size_t) n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
