/*
 * What the `nalar mkmodel` writers share (src/mkmodel.c, the models;
 * src/mkmodel_lora.c, the adapters and merged files): the random stream
 * every weight is drawn from, and the conversion into a tensor type.
 */
#ifndef NALAR_MKMODEL_INTERNAL_H
#define NALAR_MKMODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* uniform in [-1, 1) with 24 random bits (splitmix64 state s) */
float nalar_mk_uniform(uint64_t *s);

/* n floats (a multiple of the block for quantized types) into `type`
 * at out (ggml_row_size(type, n) bytes) */
void nalar_mk_convert(const float *x, size_t n, ggml_type type, void *out);

#endif
