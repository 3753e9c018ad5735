/*
 * The worker pool: nalar_pool_run and nalar_pool_barrier are correct with
 * more threads than cores, through waits long enough that the threads go
 * to sleep (no wake-up lost: a lost one hangs, and the alarm fails the
 * test); and a thread waiting -- at a barrier, at the end of a run, for
 * the next pass, or an idle engine's threads -- sleeps rather than spins:
 * the process's CPU time over a second of such waiting stays under a
 * generous bound (a spinning thread costs a large part of that second,
 * however loaded the machine; a sleeping one next to nothing).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "threadpool.h"
#include "collect.h"
#include "tap.h"

#define MAX_T    8
#define PHASES   4
#define WAIT_S   1.0
#define CPU_MAX  0.05      /* CPU seconds in WAIT_S of waiting */


static double
cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6
           + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}


static double
now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


static void
sleep_s(double s)
{
    struct timespec ts;

    ts.tv_sec = (time_t) s;
    ts.tv_nsec = (long) ((s - (double) ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0) {
        /* interrupted: the rest */
    }
}


/* --- correctness: each phase every thread writes its slot, then (after a
 * barrier) reads everyone's --- */

typedef struct {
    nalar_pool *pool;
    int         iter;
    int         slow_tid;    /* this thread sleeps before its barriers */
    int         slot[MAX_T][16];   /* a line each */
    int         ran[MAX_T];
    int         bad;         /* atomic */
} rig;


static void
phases(void *arg, int tid, int n)
{
    rig *g = arg;

    g->ran[tid]++;
    for (int ph = 0; ph < PHASES; ph++) {
        int want = g->iter * PHASES + ph;

        g->slot[tid][0] = want;
        if (tid == g->slow_tid && ph == 1) {
            /* past every spin: the others sleep in the barrier */
            sleep_s(0.002);
        }
        nalar_pool_barrier(g->pool);
        for (int t = 0; t < n; t++) {
            if (g->slot[t][0] != want) {
                __atomic_add_fetch(&g->bad, 1, __ATOMIC_RELAXED);
            }
        }
        nalar_pool_barrier(g->pool);
    }
}


static void
check_pool(int n, int iters)
{
    rig  g;
    int  runs_ok = 1;

    memset(&g, 0, sizeof(g));
    g.pool = nalar_pool_create(n);
    ok(g.pool != NULL && nalar_pool_size(g.pool) == n, "pool of %d", n);
    if (g.pool == NULL) {
        return;
    }
    for (g.iter = 0; g.iter < iters; g.iter++) {
        /* every 16th pass one thread (in turn) is slow at a barrier;
         * every 32nd the caller waits before the pass, so the workers
         * fall asleep between passes */
        g.slow_tid = g.iter % 16 == 5 ? (g.iter / 16) % n : -1;
        if (g.iter % 32 == 17) {
            sleep_s(0.003);
        }
        nalar_pool_run(g.pool, phases, &g);
        for (int t = 0; t < n; t++) {
            runs_ok &= g.ran[t] == g.iter + 1;
        }
    }
    is_int(__atomic_load_n(&g.bad, __ATOMIC_RELAXED), 0,
           "%d threads, %d runs of %d barrier phases: every thread saw "
           "every write of its phase", n, iters, PHASES);
    ok(runs_ok, "%d threads: every thread ran every pass, and each run "
       "returned after all of them", n);
    nalar_pool_destroy(g.pool);
}


/* --- waiting costs no CPU --- */

typedef struct {
    nalar_pool *pool;
    int         sleeper;     /* this thread sleeps WAIT_S */
    int         barrier;     /* then meets the others at a barrier */
} wait_rig;


static void
one_sleeps(void *arg, int tid, int n)
{
    wait_rig *w = arg;

    if (tid == w->sleeper) {
        sleep_s(WAIT_S);
    }
    if (w->barrier) {
        nalar_pool_barrier(w->pool);
    }
}


static void
check_wait_cpu(int n, int sleeper, int barrier, const char *what)
{
    wait_rig w;
    double   c0, c1;

    w.pool = nalar_pool_create(n);
    w.sleeper = sleeper;
    w.barrier = barrier;
    if (w.pool == NULL) {
        ok(0, "pool of %d", n);
        return;
    }
    w.sleeper = -1;
    nalar_pool_run(w.pool, one_sleeps, &w);     /* threads started */
    w.sleeper = sleeper;
    c0 = cpu_s();
    nalar_pool_run(w.pool, one_sleeps, &w);
    c1 = cpu_s();
    ok(c1 - c0 < CPU_MAX, "%s: %.3f CPU s while %d threads waited %.1f s "
       "(bound %.2f)", what, c1 - c0, n - 1, WAIT_S, CPU_MAX);
    nalar_pool_destroy(w.pool);
}


static void
check_idle_pool(int n)
{
    wait_rig    w;
    double      c0, c1;

    w.pool = nalar_pool_create(n);
    w.sleeper = -1;
    w.barrier = 1;
    if (w.pool == NULL) {
        ok(0, "pool of %d", n);
        return;
    }
    nalar_pool_run(w.pool, one_sleeps, &w);
    c0 = cpu_s();
    sleep_s(WAIT_S);
    c1 = cpu_s();
    ok(c1 - c0 < CPU_MAX, "idle pool of %d: %.3f CPU s in %.1f s (bound "
       "%.2f)", n, c1 - c0, WAIT_S, CPU_MAX);
    nalar_pool_destroy(w.pool);
}


static void
check_idle_engine(void)
{
    nalar_engine_opts    o;
    nalar_request_params p;
    nalar_engine        *e;
    nalar_request       *r;
    nalar_err            err;
    collected           *c = calloc(1, sizeof(*c));
    int32_t              prompt[] = { 1, 780, 262, 1794, 1046 };
    double               c0, c1, deadline;

    memset(&o, 0, sizeof(o));
    o.model_path = "models/nalar-kjv-target-f32.gguf";
    o.n_threads = 2;
    e = c != NULL ? nalar_engine_create(&o, &err) : NULL;
    if (e == NULL || nalar_engine_start(e, &err) != 0) {
        ok(0, "engine: %s", c != NULL ? err.msg : "out of memory");
        nalar_engine_destroy(e);
        free(c);
        return;
    }
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = prompt;
    p.n_prompt = 5;
    p.max_tokens = 16;
    p.ignore_eos = 1;
    r = nalar_request_create(&p, collect, c, &err);
    if (r == NULL || nalar_engine_submit(e, r, &err) != 0) {
        ok(0, "submit: %s", err.msg);
        nalar_engine_destroy(e);
        free(c);
        return;
    }
    /* wait on the request's finish, generously */
    deadline = now_s() + 120;
    while (__atomic_load_n(&c->finish, __ATOMIC_ACQUIRE)
           == NALAR_FINISH_NONE && now_s() < deadline)
    {
        sleep_s(0.001);
    }
    ok(__atomic_load_n(&c->finish, __ATOMIC_ACQUIRE) != NALAR_FINISH_NONE
       && c->n == 16, "engine answered (%d tokens)", c->n);
    c0 = cpu_s();
    sleep_s(WAIT_S);
    c1 = cpu_s();
    ok(c1 - c0 < CPU_MAX, "idle engine (2 threads): %.3f CPU s in %.1f s "
       "(bound %.2f)", c1 - c0, WAIT_S, CPU_MAX);
    nalar_request_unref(r);
    nalar_engine_destroy(e);
    free(c);
}


int
main(void)
{
    /* a lost wake-up hangs: fail instead */
    alarm(600);

    check_pool(2, 3000);
    check_pool(3, 1000);
    check_pool(5, 500);
    check_pool(8, 300);

    check_wait_cpu(2, 1, 1, "barrier (2 threads)");
    check_wait_cpu(4, 0, 1, "barrier (4 threads, the caller late)");
    check_wait_cpu(2, 1, 0, "end of a run (2 threads)");
    check_wait_cpu(4, 3, 0, "end of a run (4 threads)");
    check_idle_pool(4);
    check_idle_engine();
    return done_testing();
}
