/*
 * A worker pool for data-parallel forward passes.
 *
 * nalar_pool_run(p, fn, arg) runs fn(arg, tid, n) on all n threads at once
 * (the caller is tid 0) and returns when every thread has returned.  Inside
 * fn, nalar_pool_barrier() synchronises all n threads, so a whole forward
 * pass is one parallel region with a barrier between dependent phases.
 *
 * Every wait (idle workers between passes, the barrier, the caller's wait
 * for the workers at the end of a run) spins briefly, yielding its core
 * after the first microseconds, then sleeps on a futex: a pass's short
 * waits stay out of the kernel on an idle machine, a thread never burns a
 * core another of ours needs for more than a bounded spin, and an idle
 * server burns no CPU.
 */
#ifndef NALAR_THREADPOOL_H
#define NALAR_THREADPOOL_H

typedef struct nalar_pool nalar_pool;
typedef void (*nalar_par_fn)(void *arg, int tid, int n);

/* n <= 0: number of online CPUs.  Returns NULL on failure. */
nalar_pool *nalar_pool_create(int n);
void nalar_pool_destroy(nalar_pool *p);
int  nalar_pool_size(const nalar_pool *p);
void nalar_pool_run(nalar_pool *p, nalar_par_fn fn, void *arg);
void nalar_pool_barrier(nalar_pool *p);
/* 1 if a worker sleeps waiting for the next run (the pool has been idle
 * for longer than its spin): the next run first pays for waking it */
int  nalar_pool_sleeping(nalar_pool *p);

/* For tests: every worker but the caller sleeps `us` microseconds before
 * each run's fn, as a thread descheduled by a busy machine would; 0 ends
 * it.  Set it while the pool runs nothing. */
void nalar_pool_test_stall(nalar_pool *p, int us);

#endif
