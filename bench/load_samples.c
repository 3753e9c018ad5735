/*
 * The load clients' samples: latencies collected as they come, and their
 * nearest-rank percentiles (bench/nginx_load.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "load_samples.h"


void
die(const char *msg)
{
    fprintf(stderr, "nginx_load: %s\n", msg);
    exit(1);
}


void *
xrealloc(void *p, size_t n)
{
    p = realloc(p, n);
    if (p == NULL) {
        die("out of memory");
    }
    return p;
}


/* --- samples ------------------------------------------------------------- */



void
vec_push(vec *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = xrealloc(s->v, s->cap * sizeof(double));
    }
    s->v[s->n++] = x;
}


int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


/* nearest-rank percentile; -1 when there are no samples */
double
pct(vec *s, double q)
{
    size_t i;

    if (s->n == 0) {
        return -1;
    }
    qsort(s->v, s->n, sizeof(double), cmp_double);
    i = (size_t) (q * (double) s->n);
    return s->v[i < s->n ? i : s->n - 1];
}
