/* libcgpu.so, the application side: the CUDA driver and NVML entry points it
 * interposes, and how programs reach them.
 *
 * A program reaches the driver in three ways, and each leads here:
 *   - linked directly against libcuda.so.1: LD_PRELOAD puts these exports first;
 *   - dlopen("libcuda.so.1") + dlsym (the CUDA runtime, ctypes): dlsym is interposed
 *     and answers a hooked name with the hook;
 *   - cuGetProcAddress / _v2 (CUDA >= 11.3 resolves every entry point through it):
 *     the hook asks the driver, then hands back the hook of the variant it chose
 *     (the _v2 ABI from the version that introduced it, _ptsz for per-thread streams).
 * Launches pass the slice gate (one clock read while the lease is valid); allocations
 * reserve against the instance's memory ledger first; memory queries report the
 * limit as the total. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT const char cgpu_shim_version[] = "0.1";

enum { LIB_CUDA, LIB_NVML };

/* name, base name for cuGetProcAddress, versions [min, max), per-thread-stream variant, library */
#define HOOKS(X)                                                                \
    X(cuLaunchKernel, "cuLaunchKernel", 0, 1 << 30, 0, LIB_CUDA)                \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 0, 1 << 30, 1, LIB_CUDA)           \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 0, 1 << 30, 0, LIB_CUDA)            \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 0, 1 << 30, 1, LIB_CUDA)       \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0, 1 << 30, 0, LIB_CUDA) \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 0, 1 << 30, 1, LIB_CUDA) \
    X(cuGraphLaunch, "cuGraphLaunch", 0, 1 << 30, 0, LIB_CUDA)                  \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 0, 1 << 30, 1, LIB_CUDA)             \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 1 << 30, 0, LIB_CUDA)                  \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 1 << 30, 0, LIB_CUDA)        \
    X(cuMemFree_v2, "cuMemFree", 3020, 1 << 30, 0, LIB_CUDA)                    \
    X(cuMemAllocAsync, "cuMemAllocAsync", 0, 1 << 30, 0, LIB_CUDA)              \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 0, 1 << 30, 1, LIB_CUDA)         \
    X(cuMemFreeAsync, "cuMemFreeAsync", 0, 1 << 30, 0, LIB_CUDA)                \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 0, 1 << 30, 1, LIB_CUDA)           \
    X(cuMemCreate, "cuMemCreate", 0, 1 << 30, 0, LIB_CUDA)                      \
    X(cuMemRelease, "cuMemRelease", 0, 1 << 30, 0, LIB_CUDA)                    \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 1 << 30, 0, LIB_CUDA)              \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 1 << 30, 0, LIB_CUDA)      \
    X(cuGetProcAddress, "cuGetProcAddress", 0, 12000, 0, LIB_CUDA)              \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 1 << 30, 0, LIB_CUDA)     \
    X(nvmlDeviceGetMemoryInfo, "", 0, 0, 0, LIB_NVML)                           \
    X(nvmlDeviceGetMemoryInfo_v2, "", 0, 0, 0, LIB_NVML)

/* driver functions the shim calls but does not interpose */
#define HELPERS(X)                                                              \
    X(cuCtxSynchronize, "", 0, 0, 0, LIB_CUDA)                                  \
    X(cuCtxGetCurrent, "", 0, 0, 0, LIB_CUDA)                                   \
    X(cuCtxGetDevice, "", 0, 0, 0, LIB_CUDA)                                    \
    X(cuCtxPushCurrent_v2, "", 0, 0, 0, LIB_CUDA)                               \
    X(cuCtxPopCurrent_v2, "", 0, 0, 0, LIB_CUDA)                                \
    X(cuStreamIsCapturing, "", 0, 0, 0, LIB_CUDA)                               \
    X(nvmlDeviceGetIndex, "", 0, 0, 0, LIB_NVML)

#define AS_ENUM(name, base, lo, hi, ptsz, lib) H_##name,
enum { HOOKS(AS_ENUM) N_HOOKS, HELPERS(AS_ENUM) N_ALL };

typedef struct {
    const char *name, *base;
    int lo, hi, ptsz, lib;
    void *hook;
    _Atomic(void *) real;
} entry;


typedef CUresult(launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **, void **);
typedef CUresult(launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult(launch_coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, CUstream, void **);
typedef CUresult(graph_launch_t)(CUgraphExec, CUstream);
typedef CUresult(mem_alloc_t)(CUdeviceptr *, size_t);
typedef CUresult(mem_alloc_pitch_t)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult(mem_free_t)(CUdeviceptr);
typedef CUresult(mem_alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult(mem_free_async_t)(CUdeviceptr, CUstream);
typedef CUresult(mem_create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult(mem_release_t)(CUmemGenericAllocationHandle);
typedef CUresult(mem_get_info_t)(size_t *, size_t *);
typedef CUresult(total_mem_t)(size_t *, CUdevice);
typedef CUresult(gpa_t)(const char *, void **, int, cuuint64_t);
typedef CUresult(gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef nvmlReturn_t(nvml_mem_t)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t(nvml_mem2_t)(nvmlDevice_t, nvmlMemory_v2_t *);

EXPORT launch_t cuLaunchKernel, cuLaunchKernel_ptsz;
EXPORT launch_ex_t cuLaunchKernelEx, cuLaunchKernelEx_ptsz;
EXPORT launch_coop_t cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz;
EXPORT graph_launch_t cuGraphLaunch, cuGraphLaunch_ptsz;
EXPORT mem_alloc_t cuMemAlloc_v2;
EXPORT mem_alloc_pitch_t cuMemAllocPitch_v2;
EXPORT mem_free_t cuMemFree_v2;
EXPORT mem_alloc_async_t cuMemAllocAsync, cuMemAllocAsync_ptsz;
EXPORT mem_free_async_t cuMemFreeAsync, cuMemFreeAsync_ptsz;
EXPORT mem_create_t cuMemCreate;
EXPORT mem_release_t cuMemRelease;
EXPORT mem_get_info_t cuMemGetInfo_v2;
EXPORT total_mem_t cuDeviceTotalMem_v2;
EXPORT gpa_t cuGetProcAddress;
EXPORT gpa2_t cuGetProcAddress_v2;
EXPORT nvml_mem_t nvmlDeviceGetMemoryInfo;
EXPORT nvml_mem2_t nvmlDeviceGetMemoryInfo_v2;

/* The driver functions the shim only calls (HELPERS): declared for their types, never defined here. */
CUresult cuCtxSynchronize(void);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t, unsigned int *);

#define AS_ENTRY(name, base, lo, hi, ptsz, lib) [H_##name] = {#name, base, lo, hi, ptsz, lib, (void *)name, NULL},
#define AS_HELPER(name, base, lo, hi, ptsz, lib) [H_##name] = {#name, base, lo, hi, ptsz, lib, NULL, NULL},
static entry table[N_ALL] = {HOOKS(AS_ENTRY) HELPERS(AS_HELPER)};

/* ------------------------------------------------------------ resolution */

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym_p;

/* dlsym runs inside sanitizer runtimes' own start-up, before their shadow memory exists:
 * this path must not be instrumented when the shim is built with ASan for its tests. */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

NO_SANITIZE static dlsym_fn real_dlsym(void) {
    dlsym_fn f = atomic_load(&real_dlsym_p);
    if (!f) {
        static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
        for (size_t k = 0; !f && k < sizeof versions / sizeof versions[0]; k++)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[k]);
        atomic_store(&real_dlsym_p, f);
    }
    return f;
}

static void *lib_handle(int lib) {
    static _Atomic(void *) handles[2];
    static const char *names[2] = {"libcuda.so.1", "libnvidia-ml.so.1"};
    void *h = atomic_load(&handles[lib]);
    if (!h) {
        h = dlopen(names[lib], RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = dlopen(names[lib], RTLD_NOW | RTLD_LOCAL);
        if (h)
            atomic_store(&handles[lib], h);
    }
    return h;
}

static void *real_of(int idx) {
    entry *e = &table[idx];
    void *p = atomic_load_explicit(&e->real, memory_order_acquire);
    if (p)
        return p;
    void *h = lib_handle(e->lib);
    dlsym_fn rd = real_dlsym();
    if (h && rd && (p = rd(h, e->name)) != NULL && p != e->hook)
        atomic_store(&e->real, p);
    else
        p = NULL;
    return p;
}
/* The real entry point, typed like the declaration above (the hook's own, or the helper's). */
#define REAL(name) ((__typeof__(name) *)real_of(H_##name))

static int find_entry(const char *name) {
    for (int k = 0; k < N_HOOKS; k++)
        if (strcmp(table[k].name, name) == 0)
            return k;
    return -1;
}

/* dlsym: a hooked name looked up in the driver (or NVML) gets the hook. */
EXPORT NO_SANITIZE void *dlsym(void *handle, const char *name) {
    dlsym_fn rd = real_dlsym();
    void *r = rd ? rd(handle, name) : NULL;
    if (!r || !cgpu_env_ok || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return r;
    int k = find_entry(name);
    if (k < 0 || r == table[k].hook)
        return r;
    void *expected = NULL;
    atomic_compare_exchange_strong(&table[k].real, &expected, r);
    return table[k].hook;
}

/* The hook for what cuGetProcAddress(symbol, version, flags) resolved to, or p itself. */
static void *substitute(const char *symbol, int version, cuuint64_t flags, void *p) {
    if (!cgpu_env_ok || !symbol)
        return p;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, found = -1;
    for (int k = 0; k < N_HOOKS; k++) {
        entry *e = &table[k];
        if (strcmp(e->base, symbol) != 0 || version < e->lo || version >= e->hi)
            continue;
        if (e->ptsz == want_ptsz)
            found = k;
        else if (!e->ptsz && found < 0)
            found = k; /* no per-thread variant of this one */
    }
    if (found < 0 || p == table[found].hook)
        return p;
    void *expected = NULL;
    atomic_compare_exchange_strong(&table[found].real, &expected, p);
    return table[found].hook;
}


CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    __typeof__(cuGetProcAddress) *real = REAL(cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = substitute(symbol, version, flags, *pfn);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    __typeof__(cuGetProcAddress_v2) *real = REAL(cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = substitute(symbol, version, flags, *pfn);
    return r;
}

/* --------------------------------------------------------- context helpers */


CUcontext cgpu_current_context(void) {
    CUcontext c = NULL;
    __typeof__(cuCtxGetCurrent) *get = REAL(cuCtxGetCurrent);
    if (get && get(&c) != CUDA_SUCCESS)
        c = NULL;
    return c;
}

void cgpu_sync_context(CUcontext ctx) {
    __typeof__(cuCtxSynchronize) *sync = REAL(cuCtxSynchronize);
    if (!sync)
        return;
    if (cgpu_current_context() == ctx) {
        sync();
        return;
    }
    __typeof__(cuCtxPushCurrent_v2) *push = REAL(cuCtxPushCurrent_v2);
    __typeof__(cuCtxPopCurrent_v2) *pop = REAL(cuCtxPopCurrent_v2);
    if (push && pop && push(ctx) == CUDA_SUCCESS) {
        CUcontext popped;
        sync();
        pop(&popped);
    }
}

/* The visible position of the current context's device; -1 when not one of ours. */
static int current_pos(void) {
    if (cgpu_cfg.ngpus == 1)
        return 0;
    CUdevice dev = -1;
    __typeof__(cuCtxGetDevice) *get = REAL(cuCtxGetDevice);
    if (!get || get(&dev) != CUDA_SUCCESS || dev < 0 || dev >= cgpu_cfg.ngpus)
        return -1;
    return dev;
}

/* ------------------------------------------------------------------ launches */

static int slow(cgpu_gate *g, CUstream stream) {
    __typeof__(cuStreamIsCapturing) *capturing = REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (capturing && capturing(stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE)
        return 0; /* recorded into a graph, not run: the graph's launch is gated */
    return cgpu_gate_slow(g);
}

#define GATED(stream, call)                                          \
    do {                                                             \
        int pos_ = cgpu_env_ok ? current_pos() : -1;                 \
        if (pos_ < 0)                                                \
            return call;                                             \
        cgpu_gate *g_ = &cgpu_gates[pos_];                           \
        int counted_ = cgpu_gate_enter(g_) || slow(g_, stream);      \
        CUresult r_ = call;                                          \
        if (counted_)                                                \
            cgpu_gate_leave(g_);                                     \
        return r_;                                                   \
    } while (0)

#define REAL_OR_FAIL(name) \
    __typeof__(name) *real = REAL(name); \
    if (!real)                        \
        return CUDA_ERROR_NOT_FOUND


#define LAUNCH_KERNEL(name)                                                                               \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params, void **extra) {                              \
        REAL_OR_FAIL(name);                                                                               \
        GATED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                               \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name)                                                                   \
    CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) { \
        REAL_OR_FAIL(name);                                                               \
        GATED(cfg ? cfg->hStream : NULL, real(cfg, f, params, extra));                    \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name)                                                                                 \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params) {                                            \
        REAL_OR_FAIL(name);                                                                               \
        GATED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                                      \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define GRAPH_LAUNCH(name)                                \
    CUresult name(CUgraphExec exec, CUstream s) {         \
        REAL_OR_FAIL(name);                               \
        GATED(s, real(exec, s));                          \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* -------------------------------------------------------------------- memory */

/* What this process allocated: address (or cuMemCreate handle) -> bytes and GPU. */
typedef struct alloc {
    uint64_t key;
    int64_t bytes;
    int pos;
    struct alloc *next;
} alloc;

#define NBUCKETS 4096
static alloc *buckets[NBUCKETS];
static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(uint64_t key) { return (unsigned)((key * 0x9E3779B97F4A7C15ULL) >> 52) % NBUCKETS; }

static void track(uint64_t key, int64_t bytes, int pos) {
    alloc *a = malloc(sizeof *a);
    if (!a) { /* the ledger keeps it until this process exits */
        cgpu_log("cannot track an allocation of %lld bytes", (long long)bytes);
        return;
    }
    a->key = key;
    a->bytes = bytes;
    a->pos = pos;
    pthread_mutex_lock(&allocs_mu);
    unsigned b = bucket_of(key);
    a->next = buckets[b];
    buckets[b] = a;
    pthread_mutex_unlock(&allocs_mu);
}

/* Forget key; returns 1 and its size and GPU when it was tracked. */
static int untrack(uint64_t key, int64_t *bytes, int *pos) {
    pthread_mutex_lock(&allocs_mu);
    alloc **pp = &buckets[bucket_of(key)];
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    alloc *a = *pp;
    if (a)
        *pp = a->next;
    pthread_mutex_unlock(&allocs_mu);
    if (!a)
        return 0;
    *bytes = a->bytes;
    *pos = a->pos;
    free(a);
    return 1;
}

#define HANDLE_TAG (1ULL << 63) /* cuMemCreate handles live beside device addresses */


/* Reserve, allocate, track; give the reservation back when the driver fails. */
#define RESERVED_ALLOC(pos, bytes, key_expr, call)                         \
    do {                                                                   \
        if ((pos) < 0)                                                     \
            return call;                                                   \
        int got_ = cgpu_mem_reserve((pos), (int64_t)(bytes));              \
        if (got_ == 0)                                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                               \
        CUresult r_ = call;                                                \
        if (r_ != CUDA_SUCCESS) {                                          \
            cgpu_mem_free((pos), (int64_t)(bytes));                        \
            return r_;                                                     \
        }                                                                  \
        track((key_expr), (int64_t)(bytes), (pos));                        \
        return CUDA_SUCCESS;                                               \
    } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    REAL_OR_FAIL(cuMemAlloc_v2);
    int pos = cgpu_env_ok && dptr ? current_pos() : -1;
    RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes));
}

#define ALLOC_ASYNC(name)                                                       \
    CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream s) {                \
        REAL_OR_FAIL(name);                                                     \
        int pos = cgpu_env_ok && dptr ? current_pos() : -1;                     \
        RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes, s));      \
    }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    int pos = cgpu_env_ok && dptr && pitch ? current_pos() : -1;
    if (pos < 0)
        return real(dptr, pitch, width, height, elem);
    /* the pitch is known only afterwards: reserve the usual 512-byte alignment, then settle */
    int64_t guess = (int64_t)(((width + 511) / 512) * 512 * height);
    if (cgpu_mem_reserve(pos, guess) == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        cgpu_mem_free(pos, guess);
        return r;
    }
    int64_t actual = (int64_t)(*pitch * height);
    if (actual > guess && cgpu_mem_reserve(pos, actual - guess) == 0) {
        __typeof__(cuMemFree_v2) *rfree = REAL(cuMemFree_v2);
        if (rfree)
            rfree(*dptr);
        cgpu_mem_free(pos, guess);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < guess)
        cgpu_mem_free(pos, guess - actual);
    track((uint64_t)*dptr, actual, pos);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    REAL_OR_FAIL(cuMemCreate);
    int pos = -1;
    if (cgpu_env_ok && handle) {
        pos = prop && prop->location.type == 1 ? prop->location.id : current_pos();
        if (pos >= cgpu_cfg.ngpus)
            pos = -1;
    }
    RESERVED_ALLOC(pos, size, (uint64_t)*handle | HANDLE_TAG, real(handle, size, prop, flags));
}

/* Call the real free; on success give the bytes back to the ledger. */
#define RELEASED_FREE(key_expr, call)                          \
    do {                                                       \
        CUresult r_ = call;                                    \
        int64_t bytes_;                                        \
        int pos_;                                              \
        if (r_ == CUDA_SUCCESS && untrack((key_expr), &bytes_, &pos_)) \
            cgpu_mem_free(pos_, bytes_);                       \
        return r_;                                             \
    } while (0)

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_FAIL(cuMemFree_v2);
    RELEASED_FREE((uint64_t)dptr, real(dptr));
}

#define FREE_ASYNC(name)                              \
    CUresult name(CUdeviceptr dptr, CUstream s) {     \
        REAL_OR_FAIL(name);                           \
        RELEASED_FREE((uint64_t)dptr, real(dptr, s)); \
    }
FREE_ASYNC(cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz)

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_FAIL(cuMemRelease);
    RELEASED_FREE((uint64_t)handle | HANDLE_TAG, real(handle));
}

/* The instance's limit on GPU pos, when it is below the device's total; 0 otherwise. */
static int limited(int pos, size_t total, int64_t *used, int64_t *limit) {
    return pos >= 0 && cgpu_mem_query(pos, used, limit) == 0 && *limit > 0 && (uint64_t)*limit < total;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    REAL_OR_FAIL(cuMemGetInfo_v2);
    CUresult r = real(free_b, total_b);
    int64_t used, limit;
    if (r == CUDA_SUCCESS && cgpu_env_ok && free_b && total_b && limited(current_pos(), *total_b, &used, &limit)) {
        size_t left = limit > used ? (size_t)(limit - used) : 0;
        *total_b = (size_t)limit;
        *free_b = left < *free_b ? left : *free_b;
    }
    return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    CUresult r = real(bytes, dev);
    int64_t used, limit;
    if (r == CUDA_SUCCESS && cgpu_env_ok && bytes && dev >= 0 && dev < cgpu_cfg.ngpus &&
        limited(dev, *bytes, &used, &limit))
        *bytes = (size_t)limit;
    return r;
}

/* ---------------------------------------------------------------------- NVML */


static int nvml_pos(nvmlDevice_t dev) {
    unsigned idx;
    __typeof__(nvmlDeviceGetIndex) *get = REAL(nvmlDeviceGetIndex);
    if (!cgpu_env_ok || !get || get(dev, &idx) != NVML_SUCCESS || idx >= (unsigned)cgpu_cfg.ngpus)
        return -1;
    return (int)idx;
}

/* NVML said (total, used, free) for dev: rewrite them as the instance's limit when that is lower.
 * 1 when it did. */
static int nvml_limit(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_b) {
    int64_t u, limit;
    if (!limited(nvml_pos(dev), *total, &u, &limit))
        return 0;
    *total = (unsigned long long)limit;
    *used = (unsigned long long)u;
    *free_b = limit > u ? (unsigned long long)(limit - u) : 0;
    return 1;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    __typeof__(nvmlDeviceGetMemoryInfo) *real = REAL(nvmlDeviceGetMemoryInfo);
    if (!real)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real(dev, m);
    if (r == NVML_SUCCESS && m)
        nvml_limit(dev, &m->total, &m->used, &m->free);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    __typeof__(nvmlDeviceGetMemoryInfo_v2) *real = REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!real)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real(dev, m);
    if (r == NVML_SUCCESS && m && nvml_limit(dev, &m->total, &m->used, &m->free))
        m->reserved = 0;
    return r;
}
