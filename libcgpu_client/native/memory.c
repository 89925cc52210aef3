/* libcgpu.so's memory hooks: allocations reserve against the instance's memory ledger first
 * and fail with CUDA_ERROR_OUT_OF_MEMORY past its limit; frees give the bytes back; the
 * driver's and NVML's memory queries report the limit as the total. Here: cuMemAlloc, pitched,
 * managed (counted whole, on the current GPU), cuMemCreate (device-located only), arrays and
 * mipmapped arrays (sized from their descriptors). Stream-ordered pools are pools.c's, the
 * context's own memory context.c's. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "memory.h"

/* What this process allocated: address (or tagged handle) -> bytes, GPU and owner (a pool, or NULL). */
typedef struct alloc {
    uint64_t key;
    int64_t bytes;
    int pos;
    void *owner;
    struct alloc *next;
} alloc;

#define NBUCKETS 4096
static alloc *buckets[NBUCKETS];
static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(uint64_t key) { return (unsigned)((key * 0x9E3779B97F4A7C15ULL) >> 52) % NBUCKETS; }

void cgpu_track(uint64_t key, int64_t bytes, int pos, void *owner) {
    alloc *a = malloc(sizeof *a);
    if (!a) { /* the ledger keeps it until this process exits */
        cgpu_log("cannot track an allocation of %lld bytes", (long long)bytes);
        return;
    }
    a->key = key;
    a->bytes = bytes;
    a->pos = pos;
    a->owner = owner;
    pthread_mutex_lock(&allocs_mu);
    unsigned b = bucket_of(key);
    a->next = buckets[b];
    buckets[b] = a;
    pthread_mutex_unlock(&allocs_mu);
}

int cgpu_untrack(uint64_t key, int64_t *bytes, int *pos, void **owner) {
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
    if (owner)
        *owner = a->owner;
    free(a);
    return 1;
}

CUresult cgpu_reserve_or_error(int pos, int64_t bytes) {
    int got = cgpu_mem_reserve(pos, bytes);
    return got == 0 ? CUDA_ERROR_OUT_OF_MEMORY : got == -2 ? CGPU_REFUSED_ERROR : CUDA_SUCCESS;
}

/* Reserve, allocate, track; give the reservation back when the driver fails. */
#define RESERVED_ALLOC(pos, bytes, key_expr, call)                         \
    do {                                                                   \
        if ((pos) < 0)                                                     \
            return call;                                                   \
        CUresult e_ = cgpu_reserve_or_error((pos), (int64_t)(bytes));      \
        if (e_ != CUDA_SUCCESS)                                            \
            return e_;                                                     \
        CUresult r_ = call;                                                \
        if (r_ != CUDA_SUCCESS) {                                          \
            cgpu_mem_free((pos), (int64_t)(bytes));                        \
            return r_;                                                     \
        }                                                                  \
        cgpu_track((key_expr), (int64_t)(bytes), (pos), NULL);             \
        return CUDA_SUCCESS;                                               \
    } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    REAL_OR_FAIL(cuMemAlloc_v2);
    int pos = cgpu_env_ok && dptr ? cgpu_current_pos() : -1;
    RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes));
}

/* Managed memory is counted whole against the current GPU: it may all be resident there (isolation holds
 * whatever the driver migrates), and a program that oversubscribes the device with it is held to its limit. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    REAL_OR_FAIL(cuMemAllocManaged);
    int pos = cgpu_env_ok && dptr && bytes ? cgpu_current_pos() : -1;
    RESERVED_ALLOC(pos, bytes, (uint64_t)*dptr, real(dptr, bytes, flags));
}

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
    cgpu_track((uint64_t)*dptr, actual, pos, NULL);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    REAL_OR_FAIL(cuMemCreate);
    int pos = -1;
    if (cgpu_env_ok && handle && prop) {
        int type = prop->location.type;
        if (type == CU_MEM_LOCATION_TYPE_DEVICE)
            pos = cgpu_device_pos(prop->location.id, -1);
        else if (type != CU_MEM_LOCATION_TYPE_HOST && type != CU_MEM_LOCATION_TYPE_HOST_NUMA &&
                 type != CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
            pos = cgpu_current_pos(); /* device memory by another name (a locality domain): the current GPU's */
    }
    RESERVED_ALLOC(pos, size, (uint64_t)*handle | HANDLE_TAG, real(handle, size, prop, flags));
}

/* Call the real free; on success give the bytes back to the ledger. */
#define RELEASED_FREE(key_expr, call)                          \
    do {                                                       \
        CUresult r_ = call;                                    \
        int64_t bytes_;                                        \
        int pos_;                                              \
        if (r_ == CUDA_SUCCESS && cgpu_untrack((key_expr), &bytes_, &pos_, NULL)) \
            cgpu_mem_free(pos_, bytes_);                       \
        return r_;                                             \
    } while (0)

/* cuMemFree also frees a pool's allocation (into its pool, which keeps the bytes as cuMemFreeAsync's would). */
CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_FAIL(cuMemFree_v2);
    CUresult r = real(dptr);
    int64_t bytes;
    int pos;
    void *pool = NULL;
    if (r == CUDA_SUCCESS && cgpu_untrack((uint64_t)dptr, &bytes, &pos, &pool)) {
        if (pool)
            cgpu_pool_freed(pool);
        else
            cgpu_mem_free(pos, bytes);
    }
    return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_FAIL(cuMemRelease);
    RELEASED_FREE((uint64_t)handle | HANDLE_TAG, real(handle));
}

/* ------------------------------------------------------------------ arrays */

/* Bytes of one channel of format f. CUDA_ARRAY3D_DESCRIPTOR (driver API reference, cuArray3DCreate): Format is
 * the type of each channel (CU_AD_FORMAT_UNSIGNED_INT8 ... CU_AD_FORMAT_FLOAT: 8-, 16-, 32-bit integers, 16-bit
 * half, 32-bit float) and NumChannels "the number of packed components per CUDA array element". The normalized
 * formats name their channels (..._INT8X4: 4 of 1 byte), so their element size is whole: returned with *whole
 * set. Block-compressed and YUV formats (at most 8 bytes an element) are charged 8. */
static size_t channel_bytes(int f, int *whole) {
    *whole = 0;
    switch (f) {
    case 0x01: case 0x08: return 1;                  /* UNSIGNED_INT8, SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2;       /* UNSIGNED_INT16, SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4;       /* UNSIGNED_INT32, SIGNED_INT32, FLOAT */
    }
    *whole = 1;
    switch (f) {
    case 0xc0: case 0xc6: return 1;                  /* UNORM_INT8X1, SNORM_INT8X1 */
    case 0xc1: case 0xc7: case 0xc3: case 0xc9: return 2;
    case 0xc2: case 0xc8: case 0xc4: case 0xca: return 4;
    case 0xc5: case 0xcb: return 8;                  /* UNORM_INT16X4, SNORM_INT16X4 */
    default: return 8;
    }
}

/* Bytes of an array of Width x Height x Depth elements ("in elements"; Height 0 for 1D, Depth 0 for 1D and 2D) at
 * mipmap level `level` (each level halves every dimension, to at least 1). */
static int64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned level) {
    int whole;
    size_t elem = channel_bytes(format, &whole) * (whole ? 1 : (channels ? channels : 1));
    w = w >> level ? w >> level : 1;
    h = h ? (h >> level ? h >> level : 1) : 1;
    d = d ? (d >> level ? d >> level : 1) : 1;
    return (int64_t)(w * h * d * elem);
}

CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *a) {
    REAL_OR_FAIL(cuArrayCreate_v2);
    int pos = cgpu_env_ok && out && a && a->Width ? cgpu_current_pos() : -1;
    int64_t bytes = pos >= 0 ? array_bytes(a->Width, a->Height, 0, (int)a->Format, a->NumChannels, 0) : 0;
    RESERVED_ALLOC(pos, bytes, (uint64_t)(uintptr_t)*out | ARRAY_TAG, real(out, a));
}

CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *a) {
    REAL_OR_FAIL(cuArray3DCreate_v2);
    int pos = cgpu_env_ok && out && a && a->Width ? cgpu_current_pos() : -1;
    int64_t bytes = pos >= 0 ? array_bytes(a->Width, a->Height, a->Depth, (int)a->Format, a->NumChannels, 0) : 0;
    RESERVED_ALLOC(pos, bytes, (uint64_t)(uintptr_t)*out | ARRAY_TAG, real(out, a));
}

CUresult cuArrayDestroy(CUarray a) {
    REAL_OR_FAIL(cuArrayDestroy);
    RELEASED_FREE((uint64_t)(uintptr_t)a | ARRAY_TAG, real(a));
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned int levels) {
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    int pos = cgpu_env_ok && out && a && a->Width && levels && levels <= 64 ? cgpu_current_pos() : -1;
    int64_t bytes = 0;
    for (unsigned l = 0; pos >= 0 && l < levels; l++)
        bytes += array_bytes(a->Width, a->Height, a->Depth, (int)a->Format, a->NumChannels, l);
    RESERVED_ALLOC(pos, bytes, (uint64_t)(uintptr_t)*out | MIPMAP_TAG, real(out, a, levels));
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    REAL_OR_FAIL(cuMipmappedArrayDestroy);
    RELEASED_FREE((uint64_t)(uintptr_t)m | MIPMAP_TAG, real(m));
}

/* The instance's limit on GPU pos, when it is below the device's total; 0 otherwise. */
static int limited(int pos, size_t total, int64_t *used, int64_t *limit) {
    return pos >= 0 && cgpu_mem_query(pos, used, limit) == 0 && *limit > 0 && (uint64_t)*limit < total;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    REAL_OR_FAIL(cuMemGetInfo_v2);
    cgpu_pools_settle();
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
