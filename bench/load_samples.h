/*
 * The load clients' samples: a growing array of doubles (latencies, ms)
 * and its nearest-rank percentiles; and the clients' two ways to give up.
 */
#ifndef NALAR_BENCH_LOAD_SAMPLES_H
#define NALAR_BENCH_LOAD_SAMPLES_H

#include <stddef.h>

typedef struct {
    double *v;      /* (n) */
    size_t  n, cap;
} vec;

/* print "nginx_load: msg" on stderr and exit 1 */
void   die(const char *msg);
/* realloc, or die */
void  *xrealloc(void *p, size_t n);
/* qsort order of doubles, ascending */
int    cmp_double(const void *a, const void *b);
void   vec_push(vec *s, double x);
/* nearest-rank percentile q (0..1), sorting s; -1 when it is empty */
double pct(vec *s, double q);

#endif
