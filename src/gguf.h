/*
 * GGUF reader (versions 2 and 3, little-endian, mmapped).
 *
 * Everything the file says is distrusted: counts, string lengths, offsets
 * and tensor sizes are checked against the mapping before use, so a
 * truncated or hostile file is refused with a message naming the file and
 * the problem, never read past its end.
 *
 * Metadata values and tensor data point into the mapping; they live as long
 * as the gguf_file.
 */
#ifndef NALAR_GGUF_H
#define NALAR_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "nalar_err.h"

/* Metadata value types, as numbered by the GGUF spec. */
typedef enum {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
    GGUF_T_COUNT
} gguf_vtype;

/* Tensor element types (ggml numbering); only these are accepted. */
typedef enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
} ggml_type;

/* The names of the accepted types, for messages that list them. */
#define GGML_TYPES_SUPPORTED "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K"

#define QK8_0 32  /* Q8_0 block: f16 scale + 32 int8 = 34 bytes */
#define QK4_0 32  /* Q4_0 block: f16 scale + 16 bytes of nibbles = 18 bytes */
/*
 * K-quants: super-blocks of 256 weights (ggml's layouts, little-endian).
 *   Q4_K (144 bytes): f16 d, f16 dmin, scales[12], qs[128].  8 sub-blocks
 *     of 32; sub-block j has a 6-bit scale sc_j and min m_j packed in
 *     scales[], weight = d * sc_j * q - dmin * m_j, q a 4-bit value: the
 *     low nibbles of qs[32 k .. 32 k + 31] are sub-block 2k, the high
 *     nibbles sub-block 2k + 1.
 *   Q5_K (176 bytes): f16 d, f16 dmin, scales[12], qh[32], qs[128]; as
 *     Q4_K with a fifth bit: bit 2k (2k + 1) of qh[l] is bit 4 of the
 *     weight l of sub-block 2k (2k + 1).
 *   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], f16 d.  16
 *     sub-blocks of 16, weight = d * scales[j] * (q - 32), q 6 bits.
 */
#define QK_K   256
#define QK4_K_BYTES 144
#define QK5_K_BYTES 176
#define QK6_K_BYTES 210

typedef struct {
    const char *ptr;  /* not NUL-terminated; points into the mapping */
    uint64_t    len;
} gguf_str;

typedef struct {
    gguf_str    key;
    gguf_vtype  type;
    /* scalar value (for arrays: the element type and count) */
    union {
        uint64_t u;     /* all unsigned ints and bool */
        int64_t  i;     /* all signed ints */
        double   f;     /* float32 and float64 */
        gguf_str s;
    } v;
    gguf_vtype  arr_type;   /* GGUF_T_ARRAY only */
    uint64_t    arr_len;    /* GGUF_T_ARRAY only */
    const void *arr_data;   /* GGUF_T_ARRAY of fixed-size type: raw LE data,
                               NOT aligned: read it with gguf_arr_int/_float
                               or memcpy */
    gguf_str   *arr_strs;   /* GGUF_T_ARRAY of strings: arr_len entries */
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct {
    gguf_str    name;
    uint32_t    n_dims;
    uint64_t    ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) length */
    ggml_type   type;
    uint64_t    offset;            /* relative to the data section */
    uint64_t    nbytes;
    const void *data;              /* into the mapping */
} gguf_tensor;

typedef struct {
    char        *path;
    const uint8_t *map;
    size_t       map_size;
    uint32_t     version;
    uint64_t     alignment;
    uint64_t     n_kv;
    gguf_kv     *kv;
    uint64_t     n_tensors;
    gguf_tensor *tensors;
    uint64_t     data_offset;
} gguf_file;

/* Open and validate; on failure returns NULL and err says "PATH: problem". */
gguf_file *gguf_open(const char *path, nalar_err *err);

/* Parse from memory the caller keeps alive (fuzzer, tests); `name` is used
 * in messages. */
gguf_file *gguf_open_mem(const void *buf, size_t size, const char *name,
                         nalar_err *err);

void gguf_close(gguf_file *f);

/* The whole pages of [p, p + n) that lie in f's file mapping leave this
 * process's resident set (madvise MADV_DONTNEED: the bytes stay in the
 * page cache and a later read faults them back in).  Nothing for a file
 * parsed from memory (gguf_open_mem), whose bytes the caller owns. */
void gguf_drop_resident(const gguf_file *f, const void *p, uint64_t n);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* Typed lookups; return `dflt` when absent or of a non-numeric type. */
int64_t  gguf_get_int(const gguf_file *f, const char *key, int64_t dflt);
double   gguf_get_float(const gguf_file *f, const char *key, double dflt);
/* Returns a malloc'd NUL-terminated copy, or NULL when absent. */
char    *gguf_get_str(const gguf_file *f, const char *key);

/* Element i of a numeric array (any integer type or bool / any float type);
 * the caller checks i < kv->arr_len and the element type. */
int64_t  gguf_arr_int(const gguf_kv *kv, uint64_t i);
double   gguf_arr_float(const gguf_kv *kv, uint64_t i);

/* Size in bytes of one value of a fixed-size type; 0 for string/array. */
size_t   gguf_type_size(gguf_vtype t);

/* Bytes needed for n elements of type t (n must be a multiple of the block
 * size for quantized types); 0 for an unknown type. */
uint64_t ggml_row_size(ggml_type t, uint64_t n);
const char *ggml_type_name(ggml_type t);

/* GGUF writer used by `nalar mkmodel` and tests. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_create(void);
void gguf_writer_destroy(gguf_writer *w);
/* Setters never fail on the spot: an allocation failure or a bad argument
 * (duplicate key or tensor name, unknown type, row length not a multiple of
 * the block size) is remembered and reported by gguf_writer_save.
 * A general.alignment set with gguf_w_u32 is honoured (default 32). */
void gguf_w_u8(gguf_writer *w, const char *key, uint8_t v);
void gguf_w_i8(gguf_writer *w, const char *key, int8_t v);
void gguf_w_u16(gguf_writer *w, const char *key, uint16_t v);
void gguf_w_i16(gguf_writer *w, const char *key, int16_t v);
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_w_i64(gguf_writer *w, const char *key, int64_t v);
void gguf_w_f64(gguf_writer *w, const char *key, double v);
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_bool(gguf_writer *w, const char *key, int v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(gguf_writer *w, const char *key, const char **v, size_t n);
void gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n);
void gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v,
                    size_t n);
/* Array of any fixed-size element type; data is n raw LE elements. */
void gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                const void *data, size_t n);
/* Copy one parsed key/value (any type, arrays included) from a reader. */
void gguf_w_kv(gguf_writer *w, const gguf_kv *kv);
/* data is copied (NULL: zeros); ne[0] is the row length. */
void gguf_w_tensor(gguf_writer *w, const char *name, ggml_type type,
                   uint32_t n_dims, const uint64_t *ne, const void *data);
int gguf_writer_save(gguf_writer *w, const char *path, nalar_err *err);

#endif
