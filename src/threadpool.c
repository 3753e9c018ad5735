/*
 * Worker pool: generation-counted dispatch, sense-reversing barrier, each
 * wait a bounded spin and then a futex sleep.
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void) 0)
#endif

/*
 * Every wait here spins a bounded number of pause iterations (a pause is
 * tens of nanoseconds), then sleeps on a futex.  The spin keeps a pass's
 * many short waits out of the kernel on an idle machine; the bound keeps a
 * waiting thread from burning a core that the thread it waits for needs
 * when something else wants the cores.
 *
 * A wait first spins SPIN_PURE iterations (a barrier's usual wait, for a
 * thread a little behind), then yields its core every SPIN_YIELD
 * iterations (when a thread of ours waits to run on the same core, it runs
 * now rather than at the end of our time slice; alone on its core, a
 * yield returns at once), and sleeps after SPIN_WAIT in all, or SPIN_IDLE
 * for a worker waiting for the next pass (a decode step follows the
 * previous one within microseconds; an idle server sleeps).
 */
#define SPIN_PURE   200
#define SPIN_YIELD  32
#define SPIN_WAIT   4000
#define SPIN_IDLE   20000

typedef struct {
    nalar_pool *pool;
    int         tid;
    pthread_t   thread;
} worker;

/*
 * A word threads wait on to change, and the number of threads that may be
 * asleep on it.  No wake-up is lost: a waiter adds itself to `sleepers`
 * before it last reads `word` and sleeps only while `word` still holds
 * the value it saw (FUTEX_WAIT compares in the kernel); a waker changes
 * `word` before it reads `sleepers`.  Both sides are sequentially
 * consistent, so either the waker sees the sleeper and wakes the word, or
 * the waiter sees the new value and never sleeps.
 */
typedef struct {
    unsigned word;
    int      sleepers;
} wait_word;

struct nalar_pool {
    int              n;
    worker          *workers;      /* (n - 1) */
    /* dispatch */
    nalar_par_fn     fn;
    void            *arg;
    wait_word        gen;          /* bumped per run and at stop */
    int              stop;
    /* workers still in fn: the caller waits for 0 (the word is the
     * count) */
    wait_word        remaining;
    /* barrier: arrivals, and the sense bumped by the last one */
    int              bar_count;    /* atomic */
    wait_word        bar_sense;
    int              stall_us;     /* nalar_pool_test_stall */
};


static void
sleep_on(unsigned *word, unsigned val)
{
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void) word;
    (void) val;
    sched_yield();
#endif
}


static void
wake_all(unsigned *word)
{
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void) word;
#endif
}


/* wait until w->word != val: spin up to `spin` iterations, then sleep;
 * returns the new value */
static unsigned
wait_change(wait_word *w, unsigned val, long spin)
{
    unsigned v;

    for (long i = 0; i < spin; i++) {
        v = __atomic_load_n(&w->word, __ATOMIC_ACQUIRE);
        if (v != val) {
            return v;
        }
        if (i >= SPIN_PURE && i % SPIN_YIELD == 0) {
            sched_yield();
        } else {
            cpu_relax();
        }
    }
    __atomic_add_fetch(&w->sleepers, 1, __ATOMIC_SEQ_CST);
    while ((v = __atomic_load_n(&w->word, __ATOMIC_SEQ_CST)) == val) {
        sleep_on(&w->word, val);
    }
    __atomic_sub_fetch(&w->sleepers, 1, __ATOMIC_RELAXED);
    return v;
}


/* after changing w->word (seq_cst): wake whoever may sleep on it */
static void
wake_changed(wait_word *w)
{
    if (__atomic_load_n(&w->sleepers, __ATOMIC_SEQ_CST) > 0) {
        wake_all(&w->word);
    }
}


static void *
worker_main(void *a)
{
    worker     *w = a;
    nalar_pool *p = w->pool;
    unsigned    seen = 0;

    for ( ;; ) {
        seen = wait_change(&p->gen, seen, SPIN_IDLE);
        if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
            return NULL;
        }
        if (p->stall_us > 0) {
            usleep((useconds_t) p->stall_us);
        }
        p->fn(p->arg, w->tid, p->n);
        if (__atomic_sub_fetch(&p->remaining.word, 1, __ATOMIC_SEQ_CST)
            == 0)
        {
            wake_changed(&p->remaining);
        }
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
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->gen.word, 1, __ATOMIC_SEQ_CST);
    wake_changed(&p->gen);
    for (int i = 1; i < p->n; i++) {
        pthread_join(p->workers[i].thread, NULL);
    }
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
    unsigned left;

    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    __atomic_store_n(&p->remaining.word, (unsigned) p->n - 1,
                     __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gen.word, 1, __ATOMIC_SEQ_CST);
    wake_changed(&p->gen);

    fn(arg, 0, p->n);

    /* the count only falls, so each change is a step towards 0 */
    left = __atomic_load_n(&p->remaining.word, __ATOMIC_ACQUIRE);
    while (left != 0) {
        left = wait_change(&p->remaining, left, SPIN_WAIT);
    }
}


void
nalar_pool_barrier(nalar_pool *p)
{
    unsigned sense;

    if (p->n == 1) {
        return;
    }
    sense = __atomic_load_n(&p->bar_sense.word, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&p->bar_count, 1, __ATOMIC_ACQ_REL) == p->n) {
        __atomic_store_n(&p->bar_count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->bar_sense.word, sense + 1, __ATOMIC_SEQ_CST);
        wake_changed(&p->bar_sense);
        return;
    }
    wait_change(&p->bar_sense, sense, SPIN_WAIT);
}


int
nalar_pool_sleeping(nalar_pool *p)
{
    return __atomic_load_n(&p->gen.sleepers, __ATOMIC_SEQ_CST) > 0;
}


void
nalar_pool_test_stall(nalar_pool *p, int us)
{
    p->stall_us = us;
}
