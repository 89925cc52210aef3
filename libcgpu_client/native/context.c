/* A process's own context memory against the ledger: the primary context of each device (what the CUDA runtime,
 * PyTorch, JAX, TensorFlow and CuPy create) is measured when it is created and charged until its last release;
 * a context of cuCtxCreate (each has its own memory) until cuCtxDestroy.
 *
 * How it is measured. No driver call can tell the device's free memory without a context, so the shim asks NVML
 * (the daemon's index of the GPU is NVML's) for the device's used memory just before and just after the driver
 * creates the context; the difference is the context (code, local memory, printf FIFO, malloc heap: 0.3 to 0.6
 * GB). Another process allocating in the same instant adds to it: the measure is capped at CTX_CAP. Past the
 * instance's limit the context is released again and the retain fails with CUDA_ERROR_OUT_OF_MEMORY. Without NVML
 * nothing is charged (the daemon's NVML check still sees the context). */
#define _GNU_SOURCE
#include "memory.h"

#define CTX_CAP (2LL << 30)
#define MAX_DEVICES 64

static struct {
    int refs;        /* retains seen, less releases */
    int pos;
    int64_t charged;
} ctx_of[MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;

/* NVML's used bytes of GPU pos (as the daemon numbers it); -1 when NVML cannot say. */
static int64_t device_used(int pos) {
    static _Atomic int inited; /* 1 ok, -1 failed */
    int idx = cgpu_conn_gpu(pos);
    __typeof__(nvmlDeviceGetHandleByIndex_v2) *handle = REAL(nvmlDeviceGetHandleByIndex_v2);
    __typeof__(nvmlDeviceGetMemoryInfo) *info = REAL(nvmlDeviceGetMemoryInfo);
    if (idx < 0 || !handle || !info)
        return -1;
    if (!atomic_load(&inited)) {
        __typeof__(nvmlInit_v2) *init = REAL(nvmlInit_v2);
        atomic_store(&inited, init && init() == NVML_SUCCESS ? 1 : -1);
    }
    nvmlDevice_t dev;
    nvmlMemory_t m;
    if (atomic_load(&inited) < 0 || handle((unsigned)idx, &dev) != NVML_SUCCESS || info(dev, &m) != NVML_SUCCESS)
        return -1;
    return (int64_t)m.used;
}

/* Make a context with call between two NVML readings of GPU pos (under ctx_mu, so that the shim's own creations
 * do not overlap) and reserve the difference: out_bytes is what the ledger now holds for it (0 when nothing could
 * be measured, or the registration is refused); past the limit undo runs and out_err is CUDA_ERROR_OUT_OF_MEMORY. */
#define MEASURED_CREATE(pos, call, undo, out_bytes, out_err)                        \
    do {                                                                          \
        int64_t before_ = (pos) >= 0 ? device_used(pos) : -1;                     \
        (out_err) = call;                                                         \
        int64_t after_ = (out_err) == CUDA_SUCCESS && before_ >= 0 ? device_used(pos) : -1; \
        int64_t n_ = after_ > before_ ? after_ - before_ : 0;                     \
        (out_bytes) = n_ < CTX_CAP ? n_ : CTX_CAP;                                \
        if ((out_err) == CUDA_SUCCESS && (out_bytes) > 0) {                       \
            int got_ = cgpu_mem_reserve((pos), (out_bytes));                      \
            if (got_ == 0) { /* past the limit: as if it had not been made */     \
                undo;                                                             \
                (out_err) = CUDA_ERROR_OUT_OF_MEMORY;                             \
            }                                                                     \
            (out_bytes) = got_ == 1 || got_ == -1 ? (out_bytes) : 0;              \
        }                                                                         \
    } while (0)

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REAL_OR_FAIL(cuDevicePrimaryCtxRetain);
    if (!cgpu_env_ok || !pctx || dev < 0 || dev >= MAX_DEVICES)
        return real(pctx, dev);
    pthread_mutex_lock(&ctx_mu);
    if (ctx_of[dev].refs > 0) { /* the context exists: no new memory */
        CUresult r = real(pctx, dev);
        ctx_of[dev].refs += r == CUDA_SUCCESS;
        pthread_mutex_unlock(&ctx_mu);
        return r;
    }
    int pos = cgpu_device_pos(dev, -1);
    __typeof__(cuDevicePrimaryCtxRelease_v2) *release = REAL(cuDevicePrimaryCtxRelease_v2);
    int64_t bytes;
    CUresult r;
    MEASURED_CREATE(pos, real(pctx, dev), if (release) release(dev), bytes, r);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&ctx_mu);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            *pctx = NULL;
        return r;
    }
    ctx_of[dev].refs = 1;
    ctx_of[dev].pos = pos;
    ctx_of[dev].charged = bytes;
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REAL_OR_FAIL(cuDevicePrimaryCtxRelease_v2);
    CUresult r = real(dev);
    if (r != CUDA_SUCCESS || !cgpu_env_ok || dev < 0 || dev >= MAX_DEVICES)
        return r;
    pthread_mutex_lock(&ctx_mu);
    /* "The context is automatically reset once the last reference to it is released" (driver API reference) */
    if (ctx_of[dev].refs > 0 && --ctx_of[dev].refs == 0 && ctx_of[dev].charged > 0) {
        cgpu_mem_free(ctx_of[dev].pos, ctx_of[dev].charged);
        ctx_of[dev].charged = 0;
    }
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

/* A context of its own (cuCtxCreate, every version): measured as the primary one, charged until cuCtxDestroy. */
#define CTX_CREATE(name, params, args)                                                            \
    CUresult name params {                                                                        \
        REAL_OR_FAIL(name);                                                                       \
        if (!cgpu_env_ok || !pctx)                                                                \
            return real args;                                                                     \
        int pos = cgpu_device_pos(dev, -1);                                                       \
        __typeof__(cuCtxDestroy_v2) *destroy = REAL(cuCtxDestroy_v2);                             \
        int64_t bytes;                                                                            \
        CUresult r;                                                                               \
        pthread_mutex_lock(&ctx_mu);                                                              \
        MEASURED_CREATE(pos, real args, if (destroy) destroy(*pctx), bytes, r);                    \
        pthread_mutex_unlock(&ctx_mu);                                                            \
        if (r == CUDA_SUCCESS && bytes > 0)                                                       \
            cgpu_track((uint64_t)(uintptr_t)*pctx | CONTEXT_TAG, bytes, pos, NULL);               \
        if (r == CUDA_ERROR_OUT_OF_MEMORY)                                                        \
            *pctx = NULL;                                                                         \
        return r;                                                                                 \
    }
CTX_CREATE(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
CTX_CREATE(cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *aff, int naff, unsigned int flags, CUdevice dev),
           (pctx, aff, naff, flags, dev))
CTX_CREATE(cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *cp, unsigned int flags, CUdevice dev),
           (pctx, cp, flags, dev))

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    REAL_OR_FAIL(cuCtxDestroy_v2);
    CUresult r = real(ctx);
    int64_t bytes;
    int pos;
    if (r == CUDA_SUCCESS && cgpu_env_ok && cgpu_untrack((uint64_t)(uintptr_t)ctx | CONTEXT_TAG, &bytes, &pos, NULL))
        cgpu_mem_free(pos, bytes);
    return r;
}
