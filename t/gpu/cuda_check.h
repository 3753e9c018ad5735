/*
 * nalar-cuda-check's parts (cuda_check.c): what they share -- the CUDA
 * context, the thresholds, the helpers that allocate, upload, poison,
 * fetch and report, and each part's checks.
 *
 *   cuda_check.c         the helpers, argmax, main
 *   cuda_check_ops.c     element-wise ops and projections, by weight type
 *   cuda_check_attn.c    the paged KV pool and attention
 *   cuda_check_models.c  greedy generation and the conformance kit, CUDA
 *                        against the CPU backend
 */
#ifndef NALAR_CUDA_CHECK_H
#define NALAR_CUDA_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <jansson.h>

#include "act.cuh"
#include "argmax.cuh"
#include "attention.cuh"
#include "backend.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "cpu_quant.h"
#include "cuda_plan.h"
#include "embed.cuh"
#include "engine.h"
#include "fp16.h"
#include "gemv_kq.cuh"
#include "gemv_mma.cuh"
#include "gemv_q8.cuh"
#include "kv.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "sampler.h"

#define THR_F32  2e-5
#define THR_KV_BF16 0.05          /* logits: a BF16 KV cache's extra error */
#define THR_MMA  1e-4             /* activations split into two BF16 halves */
#define THR_F16  3e-3
#define THR_BF16 2e-2

extern int            n_pass, n_fail;
extern nalar_cuda_ctx C;

/* 1: the attention and KV checks keep the device pool in BF16 (the host
 * reference reads the same rounded values) */
extern int kv_bf16;

/* --- helpers (a check program: failing to allocate ends it) --- */

void die(const char *what, const char *msg);
void cu(cudaError_t e, const char *what);
void op(int rc, nalar_err *err);
uint64_t rnd(void);
float frand(void);
void *xmalloc(size_t n);
void *dnew(size_t bytes);
void upload_done(void);
void *dup_to_dev(const void *h, size_t bytes);
void poison(void *d, size_t bytes);
void fetch(void *h, const void *d, size_t bytes);
double nerr(const float *got, const double *ref, int64_t n);
void report(const char *opname, const char *shape, double e, double thr);
void report_eq(const char *opname, const char *shape, int good,
               const char *why);

/* --- the checks --- */

void check_rmsnorm(void);
void check_embed(void);
void check_rope(void);
void check_elementwise(void);
void check_matmul(void);
void check_mma(void);
void check_kq(void);
void check_gemv_rows(void);
void check_kv(void);
void check_attention(void);
void check_greedy(const char *dir, const char *file, int strict,
                  int32_t gemv_max);
void check_conformance(const char *dir);

#endif
