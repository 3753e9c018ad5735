/*
 * GGUF reader and writer.
 *
 * File layout (all little-endian):
 *
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv    x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type,
 *                 u64 offset }
 *   padding to general.alignment (default 32)
 *   data section: tensor i at data_offset + offset_i
 *
 *   string = u64 len, len bytes (no NUL)
 *   array  = u32 elem type, u64 count, count values
 *
 * The reader trusts nothing: every read goes through need(), which compares
 * against the bytes left in the mapping, and every count is bounded by what
 * the remaining bytes could possibly hold before anything is allocated.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32

/* smallest encodings, used to bound counts by the bytes left */
#define KV_MIN_BYTES     13   /* u64 key len + u32 type + 1-byte value */
#define TENSOR_MIN_BYTES 32   /* u64 name len + u32 n_dims + u64 ne + u32 type
                                 + u64 offset */
#define STR_MIN_BYTES    8    /* u64 len */


/* What the reader hands out, plus what only the reader needs. */
typedef struct {
    gguf_file   f;
    int         mapped;      /* f.map came from mmap and is ours to unmap */
    uint32_t   *kv_hash;     /* (kv_hash_size) index + 1, 0 = empty */
    uint32_t   *t_hash;      /* (t_hash_size) index + 1, 0 = empty */
    size_t      kv_hash_size, t_hash_size;   /* powers of two */
} gguf_priv;


/* ---------------------------------------------------------------- */
/* small helpers                                                     */


static uint64_t
str_hash(const char *s, uint64_t len)
{
    uint64_t h = 1469598103934665603ull;     /* FNV-1a */

    for (uint64_t i = 0; i < len; i++) {
        h ^= (uint8_t) s[i];
        h *= 1099511628211ull;
    }
    return h;
}


static int
str_eq(gguf_str a, const char *b, uint64_t blen)
{
    return a.len == blen && (blen == 0 || memcmp(a.ptr, b, blen) == 0);
}


/*
 * A name from the file made safe to print: at most 64 bytes, anything that
 * is not printable ASCII shown as '?', "..." when cut.
 */
static const char *
shown(gguf_str s, char buf[80])
{
    uint64_t n = s.len < 64 ? s.len : 64;
    uint64_t i;

    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s.ptr[i];
        buf[i] = (c >= 0x20 && c < 0x7f) ? (char) c : '?';
    }
    if (s.len > 64) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}


static size_t
next_pow2(size_t n)
{
    size_t p = 1;

    while (p < n) {
        p <<= 1;
    }
    return p;
}


/*
 * Open-addressing table of names; returns the index of an equal name
 * already present, or -1 after inserting idx.
 */
static int64_t
hash_insert(uint32_t *tab, size_t size, const gguf_str *names, size_t stride,
            uint32_t idx)
{
    const gguf_str *s = (const gguf_str *)
                        ((const char *) names + (size_t) idx * stride);
    size_t h = (size_t) str_hash(s->ptr, s->len) & (size - 1);

    while (tab[h] != 0) {
        const gguf_str *o = (const gguf_str *)
                            ((const char *) names + (tab[h] - 1) * stride);
        if (str_eq(*o, s->ptr, s->len)) {
            return (int64_t) tab[h] - 1;
        }
        h = (h + 1) & (size - 1);
    }
    tab[h] = idx + 1;
    return -1;
}


static int64_t
hash_lookup(const uint32_t *tab, size_t size, const gguf_str *names,
            size_t stride, const char *key)
{
    size_t len = strlen(key);
    size_t h;

    if (tab == NULL) {
        return -1;
    }
    h = (size_t) str_hash(key, len) & (size - 1);
    while (tab[h] != 0) {
        const gguf_str *o = (const gguf_str *)
                            ((const char *) names + (tab[h] - 1) * stride);
        if (str_eq(*o, key, len)) {
            return (int64_t) tab[h] - 1;
        }
        h = (h + 1) & (size - 1);
    }
    return -1;
}


size_t
gguf_type_size(gguf_vtype t)
{
    switch (t) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL:
        return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16:
        return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32:
        return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64:
        return 8;
    default:
        return 0;
    }
}


static const char *
vtype_name(gguf_vtype t)
{
    static const char *names[GGUF_T_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
        "array", "u64", "i64", "f64"
    };

    return (unsigned) t < GGUF_T_COUNT ? names[t] : "?";
}


/* ---------------------------------------------------------------- */
/* tensor types                                                      */


static uint64_t
block_size(ggml_type t)
{
    switch (t) {
    case GGML_Q4_0:
    case GGML_Q8_0:
        return 32;
    case GGML_Q4_K:
    case GGML_Q5_K:
    case GGML_Q6_K:
        return QK_K;
    default:
        return 1;
    }
}


/* bytes per block of block_size() elements */
static uint64_t
block_bytes(ggml_type t)
{
    switch (t) {
    case GGML_F32:  return 4;
    case GGML_F16:  return 2;
    case GGML_BF16: return 2;
    case GGML_Q8_0: return 2 + QK8_0;        /* f16 d + 32 x int8 */
    case GGML_Q4_0: return 2 + QK4_0 / 2;    /* f16 d + 32 x 4 bits */
    case GGML_Q4_K: return QK4_K_BYTES;
    case GGML_Q5_K: return QK5_K_BYTES;
    case GGML_Q6_K: return QK6_K_BYTES;
    default:        return 0;
    }
}


uint64_t
ggml_row_size(ggml_type t, uint64_t n)
{
    return n / block_size(t) * block_bytes(t);
}


const char *
ggml_type_name(ggml_type t)
{
    switch (t) {
    case GGML_F32:  return "F32";
    case GGML_F16:  return "F16";
    case GGML_Q4_0: return "Q4_0";
    case GGML_Q8_0: return "Q8_0";
    case GGML_BF16: return "BF16";
    case GGML_Q4_K: return "Q4_K";
    case GGML_Q5_K: return "Q5_K";
    case GGML_Q6_K: return "Q6_K";
    default:        return "unknown";
    }
}


/* ---------------------------------------------------------------- */
/* reader                                                            */


typedef struct {
    const uint8_t *p;        /* (size) the whole file */
    size_t         size;
    size_t         pos;      /* next byte to read; always <= size */
    const char    *name;     /* for messages */
    nalar_err     *err;
    char           ctx[160]; /* what is being read, for messages */
} reader;


static int
need(reader *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos) {
        return nalar_fail(r->err, "%s: truncated in %s (%s): needs %llu "
                          "bytes at offset %zu, file has %zu bytes",
                          r->name, r->ctx, what, (unsigned long long) n,
                          r->pos, r->size);
    }
    return 0;
}


static int
rd_bytes(reader *r, void *dst, size_t n, const char *what)
{
    if (need(r, n, what) != 0) {
        return -1;
    }
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return 0;
}


static int
rd_u32(reader *r, uint32_t *v, const char *what)
{
    return rd_bytes(r, v, 4, what);
}


static int
rd_u64(reader *r, uint64_t *v, const char *what)
{
    return rd_bytes(r, v, 8, what);
}


static int
rd_str(reader *r, gguf_str *s, const char *what)
{
    uint64_t len;

    if (rd_u64(r, &len, what) != 0) {
        return -1;
    }
    if (len > r->size - r->pos) {
        return nalar_fail(r->err, "%s: truncated in %s (%s): string length "
                          "%llu at offset %zu runs past end of file "
                          "(%zu bytes)", r->name, r->ctx, what,
                          (unsigned long long) len, r->pos - 8, r->size);
    }
    s->ptr = (const char *) r->p + r->pos;
    s->len = len;
    r->pos += len;
    return 0;
}


/* A scalar of a fixed-size type into the value union. */
static int
rd_scalar(reader *r, gguf_kv *kv)
{
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32;
            int32_t i32; float f32; uint64_t u64; int64_t i64; double f64; }
        x;

    if (rd_bytes(r, &x, gguf_type_size(kv->type), "value") != 0) {
        return -1;
    }
    switch (kv->type) {
    case GGUF_T_UINT8:   kv->v.u = x.u8; break;
    case GGUF_T_BOOL:    kv->v.u = x.u8 != 0; break;
    case GGUF_T_INT8:    kv->v.i = x.i8; break;
    case GGUF_T_UINT16:  kv->v.u = x.u16; break;
    case GGUF_T_INT16:   kv->v.i = x.i16; break;
    case GGUF_T_UINT32:  kv->v.u = x.u32; break;
    case GGUF_T_INT32:   kv->v.i = x.i32; break;
    case GGUF_T_FLOAT32: kv->v.f = x.f32; break;
    case GGUF_T_UINT64:  kv->v.u = x.u64; break;
    case GGUF_T_INT64:   kv->v.i = x.i64; break;
    case GGUF_T_FLOAT64: kv->v.f = x.f64; break;
    default: break;
    }
    return 0;
}


static int
rd_value(reader *r, gguf_kv *kv)
{
    char     nb[80];
    uint32_t et;
    uint64_t n;
    size_t   esz;

    switch (kv->type) {
    case GGUF_T_STRING:
        return rd_str(r, &kv->v.s, "string value");

    case GGUF_T_ARRAY:
        if (rd_u32(r, &et, "array element type") != 0
            || rd_u64(r, &n, "array length") != 0)
        {
            return -1;
        }
        if (et == GGUF_T_ARRAY) {
            return nalar_fail(r->err, "%s: kv '%s': nested arrays are not "
                              "supported", r->name, shown(kv->key, nb));
        }
        if (et >= GGUF_T_COUNT) {
            return nalar_fail(r->err, "%s: kv '%s': unknown array element "
                              "type %u", r->name, shown(kv->key, nb), et);
        }
        kv->arr_type = (gguf_vtype) et;
        kv->arr_len = n;
        kv->v.u = n;

        if (et == GGUF_T_STRING) {
            /* each element is at least its u64 length: bound before
             * allocating */
            if (n > (r->size - r->pos) / STR_MIN_BYTES) {
                return nalar_fail(r->err, "%s: truncated in %s: array of %llu "
                                  "strings cannot fit in the %zu bytes left",
                                  r->name, r->ctx, (unsigned long long) n,
                                  r->size - r->pos);
            }
            kv->arr_strs = malloc((n ? n : 1) * sizeof(gguf_str));
            if (kv->arr_strs == NULL) {
                return nalar_fail(r->err, "%s: out of memory for %llu "
                                  "strings", r->name, (unsigned long long) n);
            }
            for (uint64_t i = 0; i < n; i++) {
                if (rd_str(r, &kv->arr_strs[i], "array string") != 0) {
                    return -1;
                }
            }
            return 0;
        }

        esz = gguf_type_size(kv->arr_type);
        if (n > (r->size - r->pos) / esz) {
            return nalar_fail(r->err, "%s: truncated in %s: array of %llu "
                              "%s runs past end of file (%zu bytes)",
                              r->name, r->ctx, (unsigned long long) n,
                              vtype_name(kv->arr_type), r->size);
        }
        kv->arr_data = r->p + r->pos;
        r->pos += n * esz;
        return 0;

    default:
        return rd_scalar(r, kv);
    }
}


static int
parse_kvs(reader *r, gguf_priv *g)
{
    gguf_file *f = &g->f;
    char       nb[80];
    uint32_t   type;

    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(gguf_kv));
    g->kv_hash_size = next_pow2(f->n_kv * 2 + 2);
    g->kv_hash = calloc(g->kv_hash_size, sizeof(uint32_t));
    if (f->kv == NULL || g->kv_hash == NULL) {
        return nalar_fail(r->err, "%s: out of memory for %llu kvs", r->name,
                          (unsigned long long) f->n_kv);
    }

    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];

        snprintf(r->ctx, sizeof(r->ctx), "kv %llu", (unsigned long long) i);
        if (rd_str(r, &kv->key, "key") != 0) {
            return -1;
        }
        snprintf(r->ctx, sizeof(r->ctx), "kv %llu '%s'",
                 (unsigned long long) i, shown(kv->key, nb));
        if (rd_u32(r, &type, "value type") != 0) {
            return -1;
        }
        if (type >= GGUF_T_COUNT) {
            return nalar_fail(r->err, "%s: kv '%s' has unknown value type %u",
                              r->name, shown(kv->key, nb), type);
        }
        kv->type = (gguf_vtype) type;
        if (rd_value(r, kv) != 0) {
            return -1;
        }
        if (hash_insert(g->kv_hash, g->kv_hash_size, &f->kv[0].key,
                        sizeof(gguf_kv), (uint32_t) i) >= 0)
        {
            return nalar_fail(r->err, "%s: duplicate key '%s'", r->name,
                              shown(kv->key, nb));
        }
    }
    return 0;
}


/* general.alignment: any non-negative integer type, a power of two. */
static int
get_alignment(reader *r, gguf_priv *g)
{
    const gguf_kv *kv = gguf_find(&g->f, "general.alignment");
    uint64_t       a;

    g->f.alignment = GGUF_DEFAULT_ALIGNMENT;
    if (kv == NULL) {
        return 0;
    }
    switch (kv->type) {
    case GGUF_T_UINT8: case GGUF_T_UINT16: case GGUF_T_UINT32:
    case GGUF_T_UINT64:
        a = kv->v.u;
        break;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32: case GGUF_T_INT64:
        if (kv->v.i < 0) {
            return nalar_fail(r->err, "%s: general.alignment %lld is not a "
                              "nonzero power of two", r->name,
                              (long long) kv->v.i);
        }
        a = (uint64_t) kv->v.i;
        break;
    default:
        return nalar_fail(r->err, "%s: general.alignment has type %s, "
                          "expected an integer", r->name,
                          vtype_name(kv->type));
    }
    if (a == 0 || (a & (a - 1)) != 0) {
        return nalar_fail(r->err, "%s: general.alignment %llu is not a "
                          "nonzero power of two", r->name,
                          (unsigned long long) a);
    }
    g->f.alignment = a;
    return 0;
}


/* Shape, type and size of one tensor; the data range is checked later,
 * once the data section's start is known. */
static int
check_tensor(reader *r, gguf_tensor *t)
{
    char     nb[80];
    uint64_t nel = 1, row, nbytes;

    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0) {
            return nalar_fail(r->err, "%s: tensor '%s' dimension %u is 0",
                              r->name, shown(t->name, nb), d);
        }
        if (__builtin_mul_overflow(nel, t->ne[d], &nel)
            || nel > (uint64_t) INT64_MAX)
        {
            return nalar_fail(r->err, "%s: tensor '%s' element count "
                              "overflows", r->name, shown(t->name, nb));
        }
    }
    if (block_bytes(t->type) == 0) {
        return nalar_fail(r->err, "%s: tensor '%s' has unsupported type %u "
                          "(supported: " GGML_TYPES_SUPPORTED ")",
                          r->name, shown(t->name, nb), (unsigned) t->type);
    }
    if (t->ne[0] % block_size(t->type) != 0) {
        return nalar_fail(r->err, "%s: tensor '%s' row length %llu is not a "
                          "multiple of the %s block size %llu", r->name,
                          shown(t->name, nb), (unsigned long long) t->ne[0],
                          ggml_type_name(t->type),
                          (unsigned long long) block_size(t->type));
    }
    /* ne[0] <= INT64_MAX and block_bytes / block_size <= 4: row fits */
    row = ggml_row_size(t->type, t->ne[0]);
    if (__builtin_mul_overflow(row, nel / t->ne[0], &nbytes)) {
        return nalar_fail(r->err, "%s: tensor '%s' byte size overflows",
                          r->name, shown(t->name, nb));
    }
    t->nbytes = nbytes;
    return 0;
}


static int
parse_tensors(reader *r, gguf_priv *g)
{
    gguf_file *f = &g->f;
    char       nb[80];
    uint32_t   type;

    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(gguf_tensor));
    g->t_hash_size = next_pow2(f->n_tensors * 2 + 2);
    g->t_hash = calloc(g->t_hash_size, sizeof(uint32_t));
    if (f->tensors == NULL || g->t_hash == NULL) {
        return nalar_fail(r->err, "%s: out of memory for %llu tensors",
                          r->name, (unsigned long long) f->n_tensors);
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];

        snprintf(r->ctx, sizeof(r->ctx), "tensor info %llu",
                 (unsigned long long) i);
        if (rd_str(r, &t->name, "name") != 0) {
            return -1;
        }
        snprintf(r->ctx, sizeof(r->ctx), "tensor info %llu '%s'",
                 (unsigned long long) i, shown(t->name, nb));
        if (rd_u32(r, &t->n_dims, "n_dims") != 0) {
            return -1;
        }
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
            return nalar_fail(r->err, "%s: tensor '%s' has %u dimensions "
                              "(must be 1..%d)", r->name, shown(t->name, nb),
                              t->n_dims, GGUF_MAX_DIMS);
        }
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
            t->ne[d] = 1;
        }
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (rd_u64(r, &t->ne[d], "ne") != 0) {
                return -1;
            }
        }
        if (rd_u32(r, &type, "type") != 0
            || rd_u64(r, &t->offset, "offset") != 0)
        {
            return -1;
        }
        t->type = (ggml_type) type;
        if (check_tensor(r, t) != 0) {
            return -1;
        }
        if (t->offset % f->alignment != 0) {
            return nalar_fail(r->err, "%s: tensor '%s' offset %llu is not a "
                              "multiple of the alignment %llu", r->name,
                              shown(t->name, nb),
                              (unsigned long long) t->offset,
                              (unsigned long long) f->alignment);
        }
        if (hash_insert(g->t_hash, g->t_hash_size, &f->tensors[0].name,
                        sizeof(gguf_tensor), (uint32_t) i) >= 0)
        {
            return nalar_fail(r->err, "%s: duplicate tensor name '%s'",
                              r->name, shown(t->name, nb));
        }
    }
    return 0;
}


static int
place_tensors(reader *r, gguf_file *f)
{
    char     nb[80];
    uint64_t pad, end;

    /* data section: the end of the tensor infos rounded up to alignment */
    pad = (f->alignment - r->pos % f->alignment) % f->alignment;
    if (__builtin_add_overflow((uint64_t) r->pos, pad, &f->data_offset)) {
        return nalar_fail(r->err, "%s: data section offset overflows",
                          r->name);
    }
    if (f->n_tensors == 0 && f->data_offset > r->size) {
        /* vocab-only files may end without the final padding */
        f->data_offset = r->size;
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];

        if (__builtin_add_overflow(f->data_offset, t->offset, &end)
            || __builtin_add_overflow(end, t->nbytes, &end)
            || end > r->size)
        {
            return nalar_fail(r->err, "%s: tensor '%s' data [offset %llu, "
                              "%llu bytes] runs past end of file (%zu bytes)",
                              r->name, shown(t->name, nb),
                              (unsigned long long) t->offset,
                              (unsigned long long) t->nbytes, r->size);
        }
        t->data = r->p + f->data_offset + t->offset;
    }
    return 0;
}


static int
parse(reader *r, gguf_priv *g)
{
    gguf_file *f = &g->f;
    char       magic[4];

    snprintf(r->ctx, sizeof(r->ctx), "header");
    if (rd_bytes(r, magic, 4, "magic") != 0) {
        return -1;
    }
    if (memcmp(magic, "GGUF", 4) != 0) {
        return nalar_fail(r->err, "%s: not a GGUF file (magic %02x %02x %02x "
                          "%02x, expected \"GGUF\")", r->name,
                          (uint8_t) magic[0], (uint8_t) magic[1],
                          (uint8_t) magic[2], (uint8_t) magic[3]);
    }
    if (rd_u32(r, &f->version, "version") != 0) {
        return -1;
    }
    if (f->version == 0x02000000u || f->version == 0x03000000u) {
        return nalar_fail(r->err, "%s: big-endian GGUF files are not "
                          "supported", r->name);
    }
    if (f->version != 2 && f->version != 3) {
        return nalar_fail(r->err, "%s: unsupported GGUF version %u (only 2 "
                          "and 3 are read)", r->name, f->version);
    }
    if (rd_u64(r, &f->n_tensors, "tensor count") != 0
        || rd_u64(r, &f->n_kv, "kv count") != 0)
    {
        return -1;
    }
    /* bound both counts by the file before allocating anything */
    if (f->n_kv > (r->size - r->pos) / KV_MIN_BYTES
        || f->n_kv >= UINT32_MAX)
    {
        return nalar_fail(r->err, "%s: kv count %llu cannot fit in the %zu "
                          "bytes after the header (truncated or corrupt)",
                          r->name, (unsigned long long) f->n_kv,
                          r->size - r->pos);
    }
    if (parse_kvs(r, g) != 0 || get_alignment(r, g) != 0) {
        return -1;
    }
    if (f->n_tensors > (r->size - r->pos) / TENSOR_MIN_BYTES
        || f->n_tensors >= UINT32_MAX)
    {
        return nalar_fail(r->err, "%s: tensor count %llu cannot fit in the "
                          "%zu bytes after the metadata (truncated or "
                          "corrupt)", r->name,
                          (unsigned long long) f->n_tensors,
                          r->size - r->pos);
    }
    if (parse_tensors(r, g) != 0 || place_tensors(r, f) != 0) {
        return -1;
    }
    return 0;
}


gguf_file *
gguf_open_mem(const void *buf, size_t size, const char *name, nalar_err *err)
{
    gguf_priv *g;
    reader     r;

    if (name == NULL) {
        name = "(memory)";
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL || (g->f.path = strdup(name)) == NULL) {
        free(g);
        nalar_fail(err, "%s: out of memory", name);
        return NULL;
    }
    g->f.map = buf;
    g->f.map_size = size;

    memset(&r, 0, sizeof(r));
    r.p = buf;
    r.size = size;
    r.name = name;
    r.err = err;
    if (parse(&r, g) != 0) {
        gguf_close(&g->f);
        return NULL;
    }
    return &g->f;
}


gguf_file *
gguf_open(const char *path, nalar_err *err)
{
    struct stat st;
    gguf_file  *f;
    void       *map;
    int         fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        nalar_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        nalar_fail(err, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        nalar_fail(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < 24) {
        /* mmap refuses length 0; anything this short has no header */
        nalar_fail(err, "%s: truncated in header: file has %lld bytes, a "
                   "GGUF header needs 24", path, (long long) st.st_size);
        close(fd);
        return NULL;
    }
    map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);   /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        nalar_fail(err, "%s: mmap: %s", path, strerror(errno));
        return NULL;
    }

    f = gguf_open_mem(map, (size_t) st.st_size, path, err);
    if (f == NULL) {
        munmap(map, (size_t) st.st_size);
        return NULL;
    }
    ((gguf_priv *) f)->mapped = 1;
    return f;
}


void
gguf_drop_resident(const gguf_file *f, const void *p, uint64_t n)
{
    const gguf_priv *g = (const gguf_priv *) f;
    long             pg = sysconf(_SC_PAGESIZE);
    uintptr_t        lo, hi, m0, m1;

    if (!g->mapped || pg <= 0 || n == 0) {
        return;
    }
    m0 = (uintptr_t) f->map;
    m1 = m0 + f->map_size;
    lo = (uintptr_t) p;
    if (lo < m0 || lo >= m1 || n > m1 - lo) {
        return;
    }
    hi = (lo + n) & ~((uintptr_t) pg - 1);
    lo = (lo + (uintptr_t) pg - 1) & ~((uintptr_t) pg - 1);
    if (hi > lo) {
        (void) madvise((void *) lo, hi - lo, MADV_DONTNEED);
    }
}


void
gguf_close(gguf_file *f)
{
    gguf_priv *g = (gguf_priv *) f;

    if (f == NULL) {
        return;
    }
    if (f->kv != NULL) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free(f->kv[i].arr_strs);
        }
    }
    free(f->kv);
    free(f->tensors);
    free(g->kv_hash);
    free(g->t_hash);
    if (g->mapped) {
        munmap((void *) f->map, f->map_size);
    }
    free(f->path);
    free(g);
}


/* ---------------------------------------------------------------- */
/* lookups                                                           */


const gguf_kv *
gguf_find(const gguf_file *f, const char *key)
{
    const gguf_priv *g = (const gguf_priv *) f;
    int64_t          i;

    i = hash_lookup(g->kv_hash, g->kv_hash_size, &f->kv[0].key,
                    sizeof(gguf_kv), key);
    return i < 0 ? NULL : &f->kv[i];
}


const gguf_tensor *
gguf_tensor_find(const gguf_file *f, const char *name)
{
    const gguf_priv *g = (const gguf_priv *) f;
    int64_t          i;

    i = hash_lookup(g->t_hash, g->t_hash_size, &f->tensors[0].name,
                    sizeof(gguf_tensor), name);
    return i < 0 ? NULL : &f->tensors[i];
}


int64_t
gguf_get_int(const gguf_file *f, const char *key, int64_t dflt)
{
    const gguf_kv *kv = gguf_find(f, key);

    if (kv == NULL) {
        return dflt;
    }
    switch (kv->type) {
    case GGUF_T_UINT8: case GGUF_T_UINT16: case GGUF_T_UINT32:
    case GGUF_T_BOOL:
        return (int64_t) kv->v.u;
    case GGUF_T_UINT64:
        return kv->v.u > (uint64_t) INT64_MAX ? dflt : (int64_t) kv->v.u;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32:
    case GGUF_T_INT64:
        return kv->v.i;
    default:
        return dflt;
    }
}


double
gguf_get_float(const gguf_file *f, const char *key, double dflt)
{
    const gguf_kv *kv = gguf_find(f, key);

    if (kv == NULL) {
        return dflt;
    }
    switch (kv->type) {
    case GGUF_T_FLOAT32: case GGUF_T_FLOAT64:
        return kv->v.f;
    case GGUF_T_UINT8: case GGUF_T_UINT16: case GGUF_T_UINT32:
    case GGUF_T_UINT64: case GGUF_T_BOOL:
        return (double) kv->v.u;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32:
    case GGUF_T_INT64:
        return (double) kv->v.i;
    default:
        return dflt;
    }
}


char *
gguf_get_str(const gguf_file *f, const char *key)
{
    const gguf_kv *kv = gguf_find(f, key);
    char          *s;

    if (kv == NULL || kv->type != GGUF_T_STRING
        || kv->v.s.len >= SIZE_MAX)
    {
        return NULL;
    }
    s = malloc((size_t) kv->v.s.len + 1);
    if (s == NULL) {
        return NULL;
    }
    if (kv->v.s.len > 0) {
        memcpy(s, kv->v.s.ptr, (size_t) kv->v.s.len);
    }
    s[kv->v.s.len] = '\0';
    return s;
}


int64_t
gguf_arr_int(const gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = (const uint8_t *) kv->arr_data
                       + i * gguf_type_size(kv->arr_type);
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32;
            int32_t i32; uint64_t u64; int64_t i64; } x;

    memcpy(&x, p, gguf_type_size(kv->arr_type));
    switch (kv->arr_type) {
    case GGUF_T_UINT8:  return x.u8;
    case GGUF_T_BOOL:   return x.u8 != 0;
    case GGUF_T_INT8:   return x.i8;
    case GGUF_T_UINT16: return x.u16;
    case GGUF_T_INT16:  return x.i16;
    case GGUF_T_UINT32: return x.u32;
    case GGUF_T_INT32:  return x.i32;
    case GGUF_T_UINT64: return (int64_t) x.u64;
    case GGUF_T_INT64:  return x.i64;
    default:            return 0;
    }
}


double
gguf_arr_float(const gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = (const uint8_t *) kv->arr_data
                       + i * gguf_type_size(kv->arr_type);
    float  f32;
    double f64;

    if (kv->arr_type == GGUF_T_FLOAT32) {
        memcpy(&f32, p, 4);
        return f32;
    }
    if (kv->arr_type == GGUF_T_FLOAT64) {
        memcpy(&f64, p, 8);
        return f64;
    }
    return (double) gguf_arr_int(kv, i);
}


/* ---------------------------------------------------------------- */
/* writer                                                            */


typedef struct {
    uint8_t *p;     /* (cap) */
    size_t   n, cap;
} buf;

typedef struct {
    char     *name;
    ggml_type type;
    uint32_t  n_dims;
    uint64_t  ne[GGUF_MAX_DIMS];
    uint64_t  nbytes;
    void     *data;      /* (nbytes) owned copy */
} w_tensor;

struct gguf_writer {
    buf       kvs;        /* the serialised kv section */
    uint64_t  n_kv;
    char    **keys;       /* (n_kv) for duplicate detection */
    w_tensor *tensors;    /* (n_tensors) */
    uint64_t  n_tensors, cap_tensors;
    uint64_t  alignment;
    char      error[256]; /* first problem; reported by save */
};


static void
w_fail(gguf_writer *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
w_fail(gguf_writer *w, const char *fmt, ...)
{
    va_list ap;

    if (w == NULL || w->error[0] != '\0') {
        return;   /* keep the first problem: later ones follow from it */
    }
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof(w->error), fmt, ap);
    va_end(ap);
}


static void
buf_put(gguf_writer *w, buf *b, const void *p, size_t n)
{
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        uint8_t *np;

        while (cap - b->n < n) {
            cap *= 2;
        }
        np = realloc(b->p, cap);
        if (np == NULL) {
            w_fail(w, "out of memory");
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n > 0) {
        memcpy(b->p + b->n, p, n);
    }
    b->n += n;
}


static void
put_u32(gguf_writer *w, buf *b, uint32_t v)
{
    buf_put(w, b, &v, 4);
}


static void
put_u64(gguf_writer *w, buf *b, uint64_t v)
{
    buf_put(w, b, &v, 8);
}


static void
put_str(gguf_writer *w, buf *b, const char *s, size_t len)
{
    put_u64(w, b, len);
    buf_put(w, b, s, len);
}


gguf_writer *
gguf_writer_create(void)
{
    gguf_writer *w = calloc(1, sizeof(*w));

    if (w != NULL) {
        w->alignment = GGUF_DEFAULT_ALIGNMENT;
    }
    return w;
}


void
gguf_writer_destroy(gguf_writer *w)
{
    if (w == NULL) {
        return;
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->keys[i]);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->keys);
    free(w->tensors);
    free(w->kvs.p);
    free(w);
}


/* Key and type of a new kv; 0 when the value may follow. */
static int
w_key(gguf_writer *w, const char *key, size_t key_len, gguf_vtype type)
{
    char **keys;

    if (w == NULL) {
        return -1;   /* gguf_writer_create failed; save will say so */
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strlen(w->keys[i]) == key_len
            && memcmp(w->keys[i], key, key_len) == 0)
        {
            w_fail(w, "duplicate key '%.*s'", (int) key_len, key);
            return -1;
        }
    }
    keys = realloc(w->keys, (w->n_kv + 1) * sizeof(char *));
    if (keys == NULL) {
        w_fail(w, "out of memory");
        return -1;
    }
    w->keys = keys;
    w->keys[w->n_kv] = strndup(key, key_len);
    if (w->keys[w->n_kv] == NULL) {
        w_fail(w, "out of memory");
        return -1;
    }
    w->n_kv++;
    put_str(w, &w->kvs, key, key_len);
    put_u32(w, &w->kvs, type);
    return 0;
}


static void
w_scalar(gguf_writer *w, const char *key, gguf_vtype type, const void *v)
{
    if (w_key(w, key, strlen(key), type) == 0) {
        buf_put(w, &w->kvs, v, gguf_type_size(type));
    }
}


void gguf_w_u8(gguf_writer *w, const char *k, uint8_t v)
{ w_scalar(w, k, GGUF_T_UINT8, &v); }
void gguf_w_i8(gguf_writer *w, const char *k, int8_t v)
{ w_scalar(w, k, GGUF_T_INT8, &v); }
void gguf_w_u16(gguf_writer *w, const char *k, uint16_t v)
{ w_scalar(w, k, GGUF_T_UINT16, &v); }
void gguf_w_i16(gguf_writer *w, const char *k, int16_t v)
{ w_scalar(w, k, GGUF_T_INT16, &v); }
void gguf_w_i32(gguf_writer *w, const char *k, int32_t v)
{ w_scalar(w, k, GGUF_T_INT32, &v); }
void gguf_w_u64(gguf_writer *w, const char *k, uint64_t v)
{ w_scalar(w, k, GGUF_T_UINT64, &v); }
void gguf_w_i64(gguf_writer *w, const char *k, int64_t v)
{ w_scalar(w, k, GGUF_T_INT64, &v); }
void gguf_w_f32(gguf_writer *w, const char *k, float v)
{ w_scalar(w, k, GGUF_T_FLOAT32, &v); }
void gguf_w_f64(gguf_writer *w, const char *k, double v)
{ w_scalar(w, k, GGUF_T_FLOAT64, &v); }


void
gguf_w_u32(gguf_writer *w, const char *key, uint32_t v)
{
    if (w != NULL && strcmp(key, "general.alignment") == 0) {
        if (v == 0 || (v & (v - 1)) != 0) {
            w_fail(w, "general.alignment %u is not a nonzero power of two",
                   v);
            return;
        }
        w->alignment = v;
    }
    w_scalar(w, key, GGUF_T_UINT32, &v);
}


void
gguf_w_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;

    w_scalar(w, key, GGUF_T_BOOL, &b);
}


void
gguf_w_str(gguf_writer *w, const char *key, const char *v)
{
    if (w_key(w, key, strlen(key), GGUF_T_STRING) == 0) {
        put_str(w, &w->kvs, v, strlen(v));
    }
}


void
gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
           const void *data, size_t n)
{
    size_t esz = gguf_type_size(elem_type);

    if (esz == 0) {
        w_fail(w, "key '%s': array element type %d is not fixed-size", key,
               (int) elem_type);
        return;
    }
    if (w_key(w, key, strlen(key), GGUF_T_ARRAY) == 0) {
        put_u32(w, &w->kvs, elem_type);
        put_u64(w, &w->kvs, n);
        buf_put(w, &w->kvs, data, n * esz);
    }
}


void
gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n)
{
    gguf_w_arr(w, key, GGUF_T_FLOAT32, v, n);
}


void
gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n)
{
    gguf_w_arr(w, key, GGUF_T_INT32, v, n);
}


void
gguf_w_arr_str(gguf_writer *w, const char *key, const char **v, size_t n)
{
    if (w_key(w, key, strlen(key), GGUF_T_ARRAY) == 0) {
        put_u32(w, &w->kvs, GGUF_T_STRING);
        put_u64(w, &w->kvs, n);
        for (size_t i = 0; i < n; i++) {
            put_str(w, &w->kvs, v[i], strlen(v[i]));
        }
    }
}


void
gguf_w_kv(gguf_writer *w, const gguf_kv *kv)
{
    char   nb[80];
    size_t esz;

    if (kv->key.len > 65535) {
        w_fail(w, "key '%s' is too long", shown(kv->key, nb));
        return;
    }
    if (w_key(w, kv->key.ptr, (size_t) kv->key.len, kv->type) != 0) {
        return;
    }
    switch (kv->type) {
    case GGUF_T_STRING:
        put_str(w, &w->kvs, kv->v.s.ptr, (size_t) kv->v.s.len);
        break;
    case GGUF_T_ARRAY:
        put_u32(w, &w->kvs, kv->arr_type);
        put_u64(w, &w->kvs, kv->arr_len);
        if (kv->arr_type == GGUF_T_STRING) {
            for (uint64_t i = 0; i < kv->arr_len; i++) {
                put_str(w, &w->kvs, kv->arr_strs[i].ptr,
                        (size_t) kv->arr_strs[i].len);
            }
        } else {
            /* the reader bounded arr_len * size by the file size */
            buf_put(w, &w->kvs, kv->arr_data,
                    (size_t) kv->arr_len * gguf_type_size(kv->arr_type));
        }
        break;
    default: {
        /* the value union holds the widened scalar; narrow it back */
        union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16;
                uint32_t u32; int32_t i32; float f32; uint64_t u64;
                int64_t i64; double f64; } x;

        memset(&x, 0, sizeof(x));
        switch (kv->type) {
        case GGUF_T_UINT8: case GGUF_T_BOOL: x.u8 = (uint8_t) kv->v.u; break;
        case GGUF_T_INT8:    x.i8 = (int8_t) kv->v.i; break;
        case GGUF_T_UINT16:  x.u16 = (uint16_t) kv->v.u; break;
        case GGUF_T_INT16:   x.i16 = (int16_t) kv->v.i; break;
        case GGUF_T_UINT32:  x.u32 = (uint32_t) kv->v.u; break;
        case GGUF_T_INT32:   x.i32 = (int32_t) kv->v.i; break;
        case GGUF_T_FLOAT32: x.f32 = (float) kv->v.f; break;
        case GGUF_T_UINT64:  x.u64 = kv->v.u; break;
        case GGUF_T_INT64:   x.i64 = kv->v.i; break;
        case GGUF_T_FLOAT64: x.f64 = kv->v.f; break;
        default: break;
        }
        esz = gguf_type_size(kv->type);
        buf_put(w, &w->kvs, &x, esz);
        break;
    }
    }
}


void
gguf_w_tensor(gguf_writer *w, const char *name, ggml_type type,
              uint32_t n_dims, const uint64_t *ne, const void *data)
{
    w_tensor *t;
    uint64_t  nel = 1;

    if (w == NULL) {
        return;
    }
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS) {
        w_fail(w, "tensor '%s': %u dimensions (must be 1..%d)", name, n_dims,
               GGUF_MAX_DIMS);
        return;
    }
    if (block_bytes(type) == 0) {
        w_fail(w, "tensor '%s': unsupported type %d", name, (int) type);
        return;
    }
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || __builtin_mul_overflow(nel, ne[d], &nel)
            || nel > ((uint64_t) 1 << 48))
        {
            w_fail(w, "tensor '%s': bad shape", name);
            return;
        }
    }
    if (ne[0] % block_size(type) != 0) {
        w_fail(w, "tensor '%s': row length %llu is not a multiple of the %s "
               "block size", name, (unsigned long long) ne[0],
               ggml_type_name(type));
        return;
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            w_fail(w, "duplicate tensor name '%s'", name);
            return;
        }
    }
    if (w->n_tensors == w->cap_tensors) {
        uint64_t  cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        w_tensor *nt = realloc(w->tensors, cap * sizeof(w_tensor));

        if (nt == NULL) {
            w_fail(w, "out of memory");
            return;
        }
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
    }
    t->nbytes = ggml_row_size(type, ne[0]) * (nel / ne[0]);
    t->name = strdup(name);
    t->data = data ? malloc(t->nbytes) : calloc(1, t->nbytes);
    if (t->name == NULL || t->data == NULL) {
        free(t->name);
        free(t->data);
        w_fail(w, "out of memory for tensor '%s'", name);
        return;
    }
    if (data != NULL) {
        memcpy(t->data, data, t->nbytes);
    }
    w->n_tensors++;
}


static uint64_t
align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}


/* 1 when n zero bytes were written */
static int
write_zeros(FILE *fp, uint64_t n)
{
    static const uint8_t zeros[256];

    while (n > 0) {
        size_t k = n < sizeof(zeros) ? (size_t) n : sizeof(zeros);

        if (fwrite(zeros, 1, k, fp) != k) {
            return 0;
        }
        n -= k;
    }
    return 1;
}


int
gguf_writer_save(gguf_writer *w, const char *path, nalar_err *err)
{
    buf       hdr = { NULL, 0, 0 };
    uint64_t  off = 0;
    FILE     *fp;
    int       ok;

    if (w == NULL) {
        return nalar_fail(err, "%s: out of memory", path);
    }
    if (w->error[0] != '\0') {
        return nalar_fail(err, "%s: %s", path, w->error);
    }

    /* header, kvs and tensor infos; offsets packed at the alignment */
    buf_put(w, &hdr, "GGUF", 4);
    put_u32(w, &hdr, 3);
    put_u64(w, &hdr, w->n_tensors);
    put_u64(w, &hdr, w->n_kv);
    buf_put(w, &hdr, w->kvs.p, w->kvs.n);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        w_tensor *t = &w->tensors[i];

        put_str(w, &hdr, t->name, strlen(t->name));
        put_u32(w, &hdr, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            put_u64(w, &hdr, t->ne[d]);
        }
        put_u32(w, &hdr, t->type);
        put_u64(w, &hdr, off);
        off = align_up(off + t->nbytes, w->alignment);
    }
    if (w->error[0] != '\0') {
        free(hdr.p);
        return nalar_fail(err, "%s: %s", path, w->error);
    }

    fp = fopen(path, "wb");
    if (fp == NULL) {
        free(hdr.p);
        return nalar_fail(err, "%s: %s", path, strerror(errno));
    }
    ok = fwrite(hdr.p, 1, hdr.n, fp) == hdr.n
         && write_zeros(fp, align_up(hdr.n, w->alignment) - hdr.n);
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        w_tensor *t = &w->tensors[i];

        ok = fwrite(t->data, 1, t->nbytes, fp) == t->nbytes;
        if (ok && i + 1 < w->n_tensors) {
            ok = write_zeros(fp, align_up(t->nbytes, w->alignment)
                                 - t->nbytes);
        }
    }
    free(hdr.p);
    if (fclose(fp) != 0) {
        ok = 0;
    }
    if (!ok) {
        nalar_fail(err, "%s: write failed: %s", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}
