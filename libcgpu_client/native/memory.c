/* libcgpu.so's memory hooks: allocations reserve against the instance's memory ledger first
 * and fail with CUDA_ERROR_OUT_OF_MEMORY past its limit; frees give the bytes back; the
 * driver's and NVML's memory queries report the limit as the total. Managed memory
 * (cuMemAllocManaged) is not isolated. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "hooks.h"

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
        if (got_ == 0 || got_ == -2)                                       \
            return got_ ? CGPU_REFUSED_ERROR : CUDA_ERROR_OUT_OF_MEMORY;   \
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
    int pos = cgpu_env_ok && dptr ? cgpu_current_pos() : -1;
    RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes));
}

#define ALLOC_ASYNC(name)                                                       \
    CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream s) {                \
        REAL_OR_FAIL(name);                                                     \
        int pos = cgpu_env_ok && dptr ? cgpu_current_pos() : -1;                     \
        RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes, s));      \
    }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    int pos = cgpu_env_ok && dptr && pitch ? cgpu_current_pos() : -1;
    if (pos < 0)
        return real(dptr, pitch, width, height, elem);
    /* the pitch is known only afterwards: reserve the usual 512-byte alignment, then settle */
    int64_t guess = (int64_t)(((width + 511) / 512) * 512 * height);
    int got = cgpu_mem_reserve(pos, guess);
    if (got == 0 || got == -2)
        return got ? CGPU_REFUSED_ERROR : CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        cgpu_mem_free(pos, guess);
        return r;
    }
    int64_t actual = (int64_t)(*pitch * height);
    if (actual > guess && ((got = cgpu_mem_reserve(pos, actual - guess)) == 0 || got == -2)) {
        __typeof__(cuMemFree_v2) *rfree = REAL(cuMemFree_v2);
        if (rfree)
            rfree(*dptr);
        cgpu_mem_free(pos, guess);
        return got ? CGPU_REFUSED_ERROR : CUDA_ERROR_OUT_OF_MEMORY;
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
        pos = prop && prop->location.type == 1 ? cgpu_device_pos(prop->location.id, -1) : cgpu_current_pos();
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
    if (r == CUDA_SUCCESS && cgpu_env_ok && free_b && total_b &&
        limited(cgpu_device_pos(cgpu_current_device(), 2000), *total_b, &used, &limit)) {
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
    if (r == CUDA_SUCCESS && cgpu_env_ok && bytes && limited(cgpu_device_pos(dev, 2000), *bytes, &used, &limit))
        *bytes = (size_t)limit;
    return r;
}

/* ---------------------------------------------------------------------- NVML */

/* NVML numbers GPUs as the daemon does (behaviour §1), whatever CUDA_VISIBLE_DEVICES says. */
static int nvml_pos(nvmlDevice_t dev) {
    unsigned idx;
    __typeof__(nvmlDeviceGetIndex) *get = REAL(nvmlDeviceGetIndex);
    if (!cgpu_env_ok || !get || get(dev, &idx) != NVML_SUCCESS)
        return -1;
    cgpu_start();
    cgpu_conn_wait(2000);
    for (int p = 0; p < cgpu_cfg.ngpus; p++)
        if (cgpu_conn_gpu(p) == (int)idx)
            return p;
    return cgpu_conn_gpu(0) < 0 && idx < (unsigned)cgpu_cfg.ngpus ? (int)idx : -1; /* never registered */
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
