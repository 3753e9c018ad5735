/*
 * Worker pool: generation-counted dispatch, sense-reversing barrier.
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void) 0)
#endif

/* how long an idle worker spins before sleeping (pause iterations) */
#define SPIN_BEFORE_SLEEP 20000

typedef struct {
    nalar_pool *pool;
    int         tid;
    pthread_t   thread;
} worker;

struct nalar_pool {
    int              n;
    worker          *workers;      /* (n - 1) */
    /* dispatch */
    nalar_par_fn     fn;
    void            *arg;
    unsigned         generation;   /* bumped per run (atomic) */
    int              remaining;    /* workers still in fn (atomic) */
    int              stop;
    pthread_mutex_t  mu;
    pthread_cond_t   wake;
    int              n_sleeping;   /* under mu */
    /* barrier */
    int              bar_count;    /* atomic */
    unsigned         bar_sense;    /* atomic */
};


static void *
worker_main(void *a)
{
    worker     *w = a;
    nalar_pool *p = w->pool;
    unsigned    seen = 0;

    for ( ;; ) {
        unsigned g;
        long     spins = 0;

        while ((g = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE))
               == seen)
        {
            if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
                return NULL;
            }
            if (++spins < SPIN_BEFORE_SLEEP) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            p->n_sleeping++;
            while (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) == seen
                   && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
            {
                pthread_cond_wait(&p->wake, &p->mu);
            }
            p->n_sleeping--;
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = g;
        p->fn(p->arg, w->tid, p->n);
        __atomic_sub_fetch(&p->remaining, 1, __ATOMIC_ACQ_REL);
    }
}


nalar_pool *
nalar_pool_create(int n)
{
    nalar_pool *p;

    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int) c : 1;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t) n, sizeof(worker));
    if (p->workers == NULL) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main,
                           &p->workers[i]) != 0)
        {
            p->n = i;  /* join what started */
            nalar_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}


void
nalar_pool_destroy(nalar_pool *p)
{
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) {
        pthread_join(p->workers[i].thread, NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}


int
nalar_pool_size(const nalar_pool *p)
{
    return p->n;
}


void
nalar_pool_run(nalar_pool *p, nalar_par_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    __atomic_store_n(&p->remaining, p->n - 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&p->mu);
    if (p->n_sleeping > 0) {
        pthread_cond_broadcast(&p->wake);
    }
    pthread_mutex_unlock(&p->mu);

    fn(arg, 0, p->n);

    while (__atomic_load_n(&p->remaining, __ATOMIC_ACQUIRE) != 0) {
        cpu_relax();
    }
}


void
nalar_pool_barrier(nalar_pool *p)
{
    unsigned sense;

    if (p->n == 1) {
        return;
    }
    sense = __atomic_load_n(&p->bar_sense, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&p->bar_count, 1, __ATOMIC_ACQ_REL) == p->n) {
        __atomic_store_n(&p->bar_count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->bar_sense, sense + 1, __ATOMIC_RELEASE);
        return;
    }
    while (__atomic_load_n(&p->bar_sense, __ATOMIC_ACQUIRE) == sense) {
        cpu_relax();
    }
}
