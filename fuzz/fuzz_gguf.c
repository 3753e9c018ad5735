/*
 * libFuzzer target for the GGUF reader: parse arbitrary bytes, and when they
 * are accepted, touch everything the reader handed out (every key, string,
 * array element and the first and last byte of every tensor) so ASan sees
 * any pointer that escapes the input.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=gguf
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static volatile uint64_t sink;


/* the bits of a double: a cast of NaN or 1e300 to an integer is UB */
static uint64_t
bits(double d)
{
    uint64_t u;

    memcpy(&u, &d, sizeof(u));
    return u;
}


static void
touch_str(gguf_str s)
{
    if (s.len > 0) {
        sink += (uint8_t) s.ptr[0] + (uint8_t) s.ptr[s.len - 1];
    }
}


/* Look a name up again through the public API; it must be found. */
static void
lookup(const gguf_file *f, gguf_str s, int tensor)
{
    char *name = malloc(s.len + 1);

    if (name == NULL) {
        return;
    }
    memcpy(name, s.ptr, s.len);
    name[s.len] = '\0';
    if (memchr(name, '\0', s.len) == NULL) {
        /* a name without NULs must be found (duplicates were refused) */
        if (tensor ? gguf_tensor_find(f, name) == NULL
                   : gguf_find(f, name) == NULL)
        {
            abort();
        }
    }
    free(name);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nalar_err  err;
    gguf_file *f = gguf_open_mem(data, size, "fuzz.gguf", &err);
    char      *s;

    if (f == NULL) {
        return 0;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];

        touch_str(kv->key);
        lookup(f, kv->key, 0);
        if (kv->type == GGUF_T_STRING) {
            touch_str(kv->v.s);
        } else if (kv->type == GGUF_T_ARRAY) {
            for (uint64_t j = 0; j < kv->arr_len; j++) {
                if (kv->arr_type == GGUF_T_STRING) {
                    touch_str(kv->arr_strs[j]);
                } else {
                    sink += (uint64_t) gguf_arr_int(kv, j);
                    sink += bits(gguf_arr_float(kv, j));
                }
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];

        touch_str(t->name);
        lookup(f, t->name, 1);
        sink += ((const uint8_t *) t->data)[0];
        sink += ((const uint8_t *) t->data)[t->nbytes - 1];
    }
    sink += (uint64_t) gguf_get_int(f, "general.alignment", 0);
    sink += bits(gguf_get_float(f, "llama.rope.freq_base", 0));
    s = gguf_get_str(f, "general.architecture");
    free(s);
    gguf_close(f);
    return 0;
}
