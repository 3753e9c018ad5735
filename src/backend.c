/*
 * The backend dispatcher: the engine names a backend ("cpu", "cuda") and
 * gets one bound to its model.  It knows each backend only by its create
 * function (kernels/cpu/cpu_backend.h, kernels/cuda/cuda_backend.h) and
 * the nalar_backend interface (backend.h); no backend calls back into it.
 *
 * With CUDA (-DNALAR_CUDA, cuda.mk) the CUDA backend's entry points are
 * weak references: binaries that do not link build/libnalar_cuda.a (the
 * unit tests) still link, and a request for "cuda" fails cleanly.
 */
#include <string.h>

#include "backend.h"
#include "cpu_backend.h"


#ifdef NALAR_CUDA
extern nalar_backend *nalar_cuda_backend_create(nalar_model *m, int device,
                                                int32_t gemv_max,
                                                nalar_err *err)
    __attribute__((weak));
extern int nalar_cuda_device_count(void) __attribute__((weak));


/* The CUDA backend on `device` (< 0: worker mod the devices visible). */
static nalar_backend *
cuda_create(nalar_model *m, int device, int worker, int32_t gemv_max,
            nalar_err *err)
{
    if (nalar_cuda_backend_create == NULL || nalar_cuda_device_count == NULL)
    {
        nalar_fail(err, "backend 'cuda': this binary was built without "
                   "linking build/libnalar_cuda.a");
        return NULL;
    }
    device = nalar_backend_pick_device(device, worker,
                                       nalar_cuda_device_count(), "cuda",
                                       err);
    return device < 0 ? NULL
                      : nalar_cuda_backend_create(m, device, gemv_max, err);
}
#endif


int
nalar_backend_pick_device(int device, int worker, int count,
                          const char *kind, nalar_err *err)
{
    if (count <= 0) {
        return nalar_fail(err, "backend '%s': no device is visible (no GPU, "
                          "no driver, or CUDA_VISIBLE_DEVICES hides them)",
                          kind);
    }
    if (device < 0) {
        /* one engine per nginx worker: worker i on GPU i mod count */
        return (worker > 0 ? worker : 0) % count;
    }
    if (device >= count) {
        return nalar_fail(err, "backend '%s': device %d asked for, but %d "
                          "device%s visible", kind, device, count,
                          count == 1 ? " is" : "s are");
    }
    return device;
}


nalar_backend *
nalar_backend_create(nalar_model *m, const nalar_backend_opts *o,
                     nalar_err *err)
{
    const char *name = o != NULL && o->name != NULL ? o->name : "cpu";
    ggml_type   kv_type = o != NULL ? o->kv_type : GGML_F32;

    if (nalar_kv_elem_bytes(kv_type) == 0) {
        nalar_fail(err, "KV cache type %d: F32, F16 or BF16", (int) kv_type);
        return NULL;
    }
    if (strcmp(name, "cpu") == 0) {
        nalar_backend *b;

        /* every KV type: F32, F16 and BF16 */
        b = nalar_cpu_backend_create(m, o != NULL ? o->n_threads : 0, err);
        if (b != NULL) {
            b->kv_type = kv_type;
        }
        if (b != NULL && o != NULL && o->act_i16) {
            nalar_cpu_backend_act_i16(b, o->act_i16);
        }
        return b;
    }
    if (o != NULL && o->act_i16) {
        nalar_fail(err, "16-bit, 8-bit and pair-multiplier activations "
                   "are modes of the 'cpu' backend, not of '%s'", name);
        return NULL;
    }
    if (kv_type == GGML_F16) {
        nalar_fail(err, "backend '%s' keeps its KV cache in F32 or BF16; an "
                   "F16 KV cache is the 'cpu' backend's", name);
        return NULL;
    }
#ifdef NALAR_CUDA
    if (strcmp(name, "cuda") == 0) {
        nalar_backend *b = cuda_create(m, o != NULL ? o->device : 0,
                                       o != NULL ? o->worker : 0,
                                       o != NULL ? o->gemv_max : 0, err);
        if (b != NULL) {
            b->kv_type = kv_type;
        }
        return b;
    }
    nalar_fail(err, "backend '%s' is not built into this binary (available: "
               "cpu, cuda)", name);
#else
    nalar_fail(err, "backend '%s' is not built into this binary (available: "
               "cpu)", name);
#endif
    return NULL;
}


nalar_backend *
nalar_backend_create_sharing(nalar_model *m, nalar_backend *other,
                             nalar_err *err)
{
#ifdef NALAR_CUDA
    if (strcmp(other->name, "cuda") == 0) {
        /* the draft on the target's device; the engine thread runs the
         * draft's passes and the target's one after the other; its KV in
         * the target's type */
        nalar_backend *b = cuda_create(m, other->device, 0, 0, err);

        if (b != NULL) {
            b->kv_type = other->kv_type;
        }
        return b;
    }
#endif
    if (strcmp(other->name, "cpu") != 0) {
        nalar_fail(err, "backend '%s' cannot share its workers",
                   other->name);
        return NULL;
    }
    {
        /* the draft's KV in the target's type */
        nalar_backend *b = nalar_cpu_backend_create_sharing(m, other, err);

        if (b != NULL) {
            b->kv_type = other->kv_type;
        }
        return b;
    }
}
