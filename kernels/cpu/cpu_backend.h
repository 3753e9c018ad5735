/*
 * The CPU backend's entry points: the dispatcher (src/backend.c) creates
 * it by name "cpu"; tests and the CLI's CPU-only benchmarks call these
 * directly.  Everything else goes through the interface in backend.h.
 */
#ifndef NALAR_CPU_BACKEND_H
#define NALAR_CPU_BACKEND_H

#include <stdint.h>

#include "backend.h"

/* n_threads <= 0: one worker per core */
nalar_backend *nalar_cpu_backend_create(nalar_model *m, int n_threads,
                                        nalar_err *err);

/* A draft's backend on `other`'s worker pool (both "cpu"): the two never
 * run at once; its weights are held narrowed (nalar_cpu_mat_init). */
nalar_backend *nalar_cpu_backend_create_sharing(nalar_model *m,
                                                nalar_backend *other,
                                                nalar_err *err);

/* A CPU backend's activations for its quantized weights from now on:
 * mode NALAR_ACT_F32, NALAR_ACT_I16, NALAR_ACT_Q8 or NALAR_ACT_PAIRS; set
 * while it runs no pass. */
void nalar_cpu_backend_act_i16(nalar_backend *b, int mode);

/* The instruction sets the CPU kernels run on, in words: the F32
 * kernels' (fixed when built) and the 8- and 16-bit activations' kernels'
 * (chosen at run time, capped by NALAR_CPU_ISA) */
const char *nalar_cpu_isa(void);

/* For tests: the passes a CPU backend has run on the calling thread alone
 * (choose_way in cpu_backend.c), and a stall of `us` microseconds for its
 * workers before each pooled pass (nalar_pool_test_stall). */
uint64_t nalar_cpu_backend_test_solo_passes(nalar_backend *b);
void nalar_cpu_backend_test_stall(nalar_backend *b, int us);

/* For tests: every pooled pass from now on runs split by weight rows
 * (way 0) or by tokens (way 1; a one-token pass by rows), or the way
 * choose_way picks (-1, the default). */
void nalar_cpu_backend_test_way(nalar_backend *b, int way);

#endif
