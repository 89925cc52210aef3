/* Stream-ordered memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync) against the ledger.
 *
 * How this works. A pool holds memory from its device ("reserved") beyond its live allocations: a free gives
 * the bytes back to the pool, and the pool gives them to the device only at a synchronisation, down to its release
 * threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), at cuMemPoolTrimTo, or when destroyed (CUDA Programming Guide,
 * "Stream Ordered Memory Allocator"). So the ledger is charged what each pool reserves, not what is allocated from
 * it. Per device-located pool the shim keeps `charged`, what the ledger holds for it, and settles it against the
 * driver's CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
 *   - an allocation the pool has no room for (reserved - used < bytes) reserves its size first, so that one past
 *     the limit fails with CUDA_ERROR_OUT_OF_MEMORY and nothing changed; after the driver's call the pool's growth
 *     (its own granularity) replaces that reservation; one that fits what the pool holds asks the daemon nothing;
 *   - after a free, a trim, a threshold change, and after the program's stream, event and context synchronisations
 *     (where the driver releases), what the pool no longer reserves is given back;
 *   - a destroyed pool gives back all it held once its last allocation is freed.
 * A host-located pool (CU_MEM_LOCATION_TYPE_HOST*) is not counted. An allocation made while its stream captures a
 * graph belongs to the graph, not the pool (cuMemAllocAsync in the driver API reference): graphmem.c counts it as
 * the graph's allocation node, charged when the graph memory pool maps it.
 *
 * An imported pool (cuMemPoolImportFromShareableHandle) holds memory another process exported: the exporter's
 * ledger counts it (its pool's reserved memory), so the importer's counts none of it, neither at the import, nor
 * for the allocations it imports (cuMemPoolImportPointer: not tracked, so their frees give nothing back), nor for
 * an allocation from it (which the driver refuses: "Allocating from an import pool is not allowed", CUDA
 * Programming Guide, "IPC Import Pool Limitations"): its record is uncounted from the start (pos -1). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "memory.h"

typedef struct pool_rec {
    CUmemoryPool pool;
    int pos;            /* the visible GPU it takes memory from; -1: not counted */
    CUdevice dev;       /* its CUDA device (when pos >= 0) */
    int64_t charged;    /* bytes the ledger holds for it */
    int64_t threshold;  /* its release threshold, as last set through the shim */
    int live;           /* allocations not yet freed */
    int destroyed;      /* its record stays (unmatched) so that a settle never meets a freed one */
    pthread_mutex_t mu; /* one settle or allocation at a time */
    struct pool_rec *next;
} pool_rec;

static pool_rec *recs;
static pthread_mutex_t recs_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int holding; /* pools whose charge is above their threshold: a synchronisation may release */

static int64_t attr(CUmemoryPool pool, CUmemPool_attribute which) {
    __typeof__(cuMemPoolGetAttribute) *get = REAL(cuMemPoolGetAttribute);
    cuuint64_t v = 0;
    return get && get(pool, which, &v) == CUDA_SUCCESS ? (int64_t)v : -1;
}

/* The record of pool; NULL when the shim has not seen it allocated from (nothing is charged for it). */
static pool_rec *rec_find(CUmemoryPool pool) {
    pthread_mutex_lock(&recs_mu);
    pool_rec *r = recs;
    while (r && (!pool || r->pool != pool))
        r = r->next;
    pthread_mutex_unlock(&recs_mu);
    return r;
}

/* The record of pool, made on first sight: pos is its GPU (the current one, for a pool the shim did not see
 * created: a device's default pool, or one imported). */
static pool_rec *rec_of(CUmemoryPool pool, int pos, CUdevice dev) {
    pthread_mutex_lock(&recs_mu);
    pool_rec *r = recs;
    while (r && r->pool != pool)
        r = r->next;
    if (!r && (r = calloc(1, sizeof *r)) != NULL) {
        r->pool = pool;
        r->pos = pos;
        r->dev = dev;
        int64_t t = attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
        r->threshold = t > 0 ? t : 0;
        pthread_mutex_init(&r->mu, NULL);
        r->next = recs;
        recs = r;
    }
    pthread_mutex_unlock(&recs_mu);
    if (!r)
        cgpu_log("cannot track a memory pool: its memory is not counted");
    return r;
}

/* Under r->mu: a new charge, or threshold, and the count of pools holding more than their threshold with it. */
static void set_charge(pool_rec *r, int64_t charged, int64_t threshold) {
    int was = r->charged > r->threshold;
    r->charged = charged;
    r->threshold = threshold;
    int now = r->charged > r->threshold;
    if (now != was)
        atomic_fetch_add(&holding, now - was);
}

/* Under r->mu: charged becomes `reserved` (what the pool holds now, from the driver). Growth the shim did not
 * reserve beforehand is reserved now (1), or, past the limit, left uncharged (0). */
static int charge_to(pool_rec *r, int64_t reserved) {
    if (reserved < r->charged) {
        cgpu_mem_free(r->pos, r->charged - reserved);
        set_charge(r, reserved, r->threshold);
    } else if (reserved > r->charged) {
        if (cgpu_reserve_or_error(r->pos, reserved - r->charged) != CUDA_SUCCESS)
            return 0;
        set_charge(r, reserved, r->threshold);
    }
    return 1;
}

static void settle(pool_rec *r) {
    pthread_mutex_lock(&r->mu);
    int64_t reserved = r->destroyed ? -1 : attr(r->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    if (reserved >= 0)
        charge_to(r, reserved);
    pthread_mutex_unlock(&r->mu);
}

void cgpu_pools_settle(void) {
    if (atomic_load_explicit(&holding, memory_order_relaxed) <= 0)
        return;
    pthread_mutex_lock(&recs_mu); /* lock order: recs_mu, then a record's mu */
    for (pool_rec *r = recs; r; r = r->next)
        if (r->pos >= 0 && !r->destroyed && r->charged > r->threshold)
            settle(r);
    pthread_mutex_unlock(&recs_mu);
}

/* An allocation node captured on s (result r): graphmem.c counts it for device dev (-1: none, not counted). */
static CUresult captured(CUresult r, CUstream s, CUdevice dev, size_t bytes) {
    if (r == CUDA_SUCCESS && dev >= 0)
        cgpu_graph_mem_captured(s, dev, bytes);
    return r;
}

/* The CUDA device of pool's memory: the one it was created on, or the current one for a pool the shim did not see
 * created; -1 for a host-located or imported pool. */
static CUdevice pool_device(CUmemoryPool pool) {
    pool_rec *r = rec_find(pool);
    if (!r)
        return cgpu_current_device();
    return r->pos >= 0 ? r->dev : -1;
}

/* Allocate bytes from pool r with call; the ledger charged for what the pool reserves afterwards. */
#define POOL_ALLOC(r, bytes, dptr, call)                                                          \
    do {                                                                                         \
        pthread_mutex_lock(&(r)->mu);                                                            \
        int64_t reserved_ = attr((r)->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);               \
        int64_t used_ = attr((r)->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);                       \
        if (reserved_ >= 0)                                                                      \
            charge_to((r), reserved_); /* what a synchronisation released meanwhile */           \
        int64_t ahead_ = reserved_ < 0 || used_ < 0 || reserved_ - used_ < (int64_t)(bytes)      \
                             ? (int64_t)(bytes) : 0;                                             \
        CUresult e_ = ahead_ ? cgpu_reserve_or_error((r)->pos, ahead_) : CUDA_SUCCESS;           \
        if (e_ != CUDA_SUCCESS) {                                                                \
            pthread_mutex_unlock(&(r)->mu);                                                      \
            return e_;                                                                           \
        }                                                                                        \
        set_charge((r), (r)->charged + ahead_, (r)->threshold);                                 \
        CUresult res_ = call;                                                                    \
        int64_t now_ = attr((r)->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);                    \
        if (!charge_to((r), now_ >= 0 ? now_ : (r)->charged) && res_ == CUDA_SUCCESS) {          \
            cgpu_log("out of memory on GPU %d: a memory pool grew by more than the %zu bytes asked " \
                     "for, past the instance's limit", (r)->pos, (size_t)(bytes));               \
            __typeof__(cuMemFreeAsync) *undo_ = REAL(cuMemFreeAsync);                            \
            if (undo_)                                                                           \
                undo_(*(dptr), s);                                                               \
            res_ = CUDA_ERROR_OUT_OF_MEMORY;                                                     \
        }                                                                                        \
        if (res_ == CUDA_SUCCESS) {                                                              \
            (r)->live++;                                                                         \
            cgpu_track((uint64_t)*(dptr), (int64_t)(bytes), (r)->pos, (r));                      \
        }                                                                                        \
        pthread_mutex_unlock(&(r)->mu);                                                          \
        return res_;                                                                             \
    } while (0)

#define ALLOC_ASYNC(name)                                                              \
    CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream s) {                       \
        REAL_OR_FAIL(name);                                                            \
        __typeof__(cuDeviceGetMemPool) *current_ = REAL(cuDeviceGetMemPool);           \
        CUdevice dev_ = cgpu_env_ok && dptr && bytes ? cgpu_current_device() : -1;     \
        if (dev_ >= 0 && cgpu_stream_capturing(s))                                     \
            return captured(real(dptr, bytes, s), s, dev_, bytes);                     \
        int pos_ = dev_ >= 0 ? cgpu_device_pos(dev_, -1) : -1;                         \
        CUmemoryPool pool_ = NULL;                                                     \
        pool_rec *r_ = pos_ >= 0 && current_ && current_(&pool_, dev_) == CUDA_SUCCESS \
                           ? rec_of(pool_, pos_, dev_) : NULL;                         \
        if (!r_ || r_->pos < 0)                                                        \
            return real(dptr, bytes, s);                                               \
        POOL_ALLOC(r_, bytes, dptr, real(dptr, bytes, s));                             \
    }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

#define ALLOC_FROM_POOL(name)                                                         \
    CUresult name(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {   \
        REAL_OR_FAIL(name);                                                           \
        if (cgpu_env_ok && dptr && bytes && pool && cgpu_stream_capturing(s))         \
            return captured(real(dptr, bytes, pool, s), s, pool_device(pool), bytes); \
        int pos_ = cgpu_env_ok && dptr && bytes && pool ? cgpu_current_pos() : -1;    \
        pool_rec *r_ = pos_ >= 0 ? rec_of(pool, pos_, cgpu_current_device()) : NULL;  \
        if (!r_ || r_->pos < 0)                                                       \
            return real(dptr, bytes, pool, s);                                        \
        POOL_ALLOC(r_, bytes, dptr, real(dptr, bytes, pool, s));                      \
    }
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)

/* A freed pool allocation stays in its pool: the ledger changes only by what the pool gave back. */
void cgpu_pool_freed(void *owner) {
    pool_rec *r = owner;
    pthread_mutex_lock(&r->mu);
    r->live--;
    if (r->destroyed && r->live == 0) { /* "released automatically once there are no more outstanding allocations" */
        charge_to(r, 0);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    pthread_mutex_unlock(&r->mu);
    settle(r);
}

#define FREE_ASYNC(name)                                                                         \
    CUresult name(CUdeviceptr dptr, CUstream s) {                                                \
        REAL_OR_FAIL(name);                                                                      \
        CUresult r_ = real(dptr, s);                                                             \
        int64_t bytes_;                                                                          \
        int pos_;                                                                                \
        void *owner_ = NULL;                                                                     \
        if (r_ == CUDA_SUCCESS && cgpu_untrack((uint64_t)dptr, &bytes_, &pos_, &owner_)) {        \
            if (owner_)                                                                          \
                cgpu_pool_freed(owner_);                                                         \
            else                                                                                 \
                cgpu_mem_free(pos_, bytes_); /* cuMemAlloc's memory, freed in stream order */    \
        }                                                                                        \
        return r_;                                                                               \
    }
FREE_ASYNC(cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz)

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    REAL_OR_FAIL(cuMemPoolCreate);
    CUresult r = real(pool, props);
    if (r == CUDA_SUCCESS && cgpu_env_ok && props)
        rec_of(*pool, props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? cgpu_device_pos(props->location.id, -1)
                                                                           : -1, props->location.id);
    return r;
}

/* Another process's memory: never counted here (above). */
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, CUmemAllocationHandleType type,
                                            unsigned long long flags) {
    REAL_OR_FAIL(cuMemPoolImportFromShareableHandle);
    CUresult r = real(pool, handle, type, flags);
    if (r == CUDA_SUCCESS && cgpu_env_ok && pool)
        rec_of(*pool, -1, -1);
    return r;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    REAL_OR_FAIL(cuMemPoolDestroy);
    pool_rec *r = cgpu_env_ok ? rec_find(pool) : NULL;
    if (!r)
        return real(pool);
    pthread_mutex_lock(&r->mu);
    CUresult res = real(pool);
    if (res != CUDA_SUCCESS) {
        pthread_mutex_unlock(&r->mu);
        return res;
    }
    r->destroyed = 1;
    r->pool = NULL; /* the driver may hand the same handle to a new pool */
    if (r->live == 0 && r->pos >= 0) /* else released when the last is freed (pool_freed) */
        charge_to(r, 0);
    pthread_mutex_unlock(&r->mu);
    return res;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    REAL_OR_FAIL(cuMemPoolTrimTo);
    CUresult res = real(pool, keep);
    pool_rec *r = res == CUDA_SUCCESS && cgpu_env_ok ? rec_find(pool) : NULL;
    if (r && r->pos >= 0)
        settle(r);
    return res;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute which, void *value) {
    REAL_OR_FAIL(cuMemPoolSetAttribute);
    CUresult res = real(pool, which, value);
    pool_rec *r = res == CUDA_SUCCESS && cgpu_env_ok ? rec_find(pool) : NULL;
    if (r && r->pos >= 0 && which == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        pthread_mutex_lock(&r->mu);
        cuuint64_t t = *(const cuuint64_t *)value;
        set_charge(r, r->charged, t > (cuuint64_t)INT64_MAX ? INT64_MAX : (int64_t)t);
        pthread_mutex_unlock(&r->mu);
        settle(r);
    }
    return res;
}

/* The synchronisations at which a pool over its threshold releases memory. */
#define SYNC_HOOK(name, params, args)           \
    CUresult name params {                      \
        REAL_OR_FAIL(name);                     \
        CUresult res = real args;               \
        if (res == CUDA_SUCCESS && cgpu_env_ok) \
            cgpu_pools_settle();                \
        return res;                             \
    }
SYNC_HOOK(cuStreamSynchronize, (CUstream s), (s))
SYNC_HOOK(cuStreamSynchronize_ptsz, (CUstream s), (s))
SYNC_HOOK(cuEventSynchronize, (CUevent e), (e))
SYNC_HOOK(cuCtxSynchronize, (void), ())
