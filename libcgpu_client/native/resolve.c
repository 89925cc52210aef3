/* libcgpu.so's view of the real driver. A program reaches the driver in three ways, and each
 * leads to the hooks:
 *   - linked directly against libcuda.so.1: LD_PRELOAD puts the shim's exports first;
 *   - dlopen("libcuda.so.1") + dlsym (the CUDA runtime, ctypes): dlsym is interposed
 *     and answers a hooked name with the hook;
 *   - cuGetProcAddress / _v2 (CUDA >= 11.3 resolves every entry point through it):
 *     the hook asks the driver, then hands back the hook of the variant it chose
 *     (the _v2 ABI from the version that introduced it, _ptsz for per-thread streams).
 * The shim itself calls the real entry points (cgpu_real) and the context helpers here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hooks.h"

typedef struct {
    const char *name, *base;
    int lo, hi, ptsz, lib;
    void *hook;
    _Atomic(void *) real;
} entry;

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

void *cgpu_real(int idx) {
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

/* Whether stream s is capturing into a graph (cuStreamIsCapturing): what is launched on it is recorded, not run. */
int cgpu_stream_capturing(CUstream s) {
    __typeof__(cuStreamIsCapturing) *is = REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return is && is(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Wait for ctx's queued work. A sync of a context while any of its streams is being captured is invalid in every
 * capture mode, and invalidates the capture (capture.c): it runs only once no capture is open, and holds new ones
 * back meanwhile. It is also a "potentially unsafe" call for captures of other contexts, which the default (global)
 * interaction mode would let it invalidate: it runs in relaxed mode (cuThreadExchangeStreamCaptureMode, push-pop as
 * the driver API reference advises). */
void cgpu_sync_context(CUcontext ctx) {
    __typeof__(cuCtxSynchronize) *sync = REAL(cuCtxSynchronize);
    if (!sync || !cgpu_captures_hold())
        return;
    __typeof__(cuThreadExchangeStreamCaptureMode) *xchg = REAL(cuThreadExchangeStreamCaptureMode);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    int relaxed = xchg && xchg(&mode) == CUDA_SUCCESS;
    if (cgpu_current_context() == ctx) {
        sync();
    } else {
        __typeof__(cuCtxPushCurrent_v2) *push = REAL(cuCtxPushCurrent_v2);
        __typeof__(cuCtxPopCurrent_v2) *pop = REAL(cuCtxPopCurrent_v2);
        if (push && pop && push(ctx) == CUDA_SUCCESS) {
            CUcontext popped;
            sync();
            pop(&popped);
        }
    }
    if (relaxed)
        xchg(&mode); /* the thread's own mode back */
    cgpu_captures_release();
}

/* CUDA device ordinal -> visible position + 1, -1 when none of ours; 0 until known. The ordinals are the
 * driver's, after CUDA_VISIBLE_DEVICES: a UUID is the one name both the driver and the daemon (NVML) give a GPU. */
static _Atomic int pos_of[CGPU_MAX_GPUS * 4];

static int uuid_of(CUdevice dev, char *out, size_t cap) {
    __typeof__(cuDeviceGetUuid_v2) *get = REAL(cuDeviceGetUuid_v2);
    if (!get)
        get = REAL(cuDeviceGetUuid);
    CUuuid u;
    if (!get || get(&u, dev) != CUDA_SUCCESS)
        return -1;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return 0;
}

int cgpu_device_pos(CUdevice dev, int wait_ms) {
    if (dev < 0 || dev >= (int)(sizeof pos_of / sizeof pos_of[0]))
        return -1;
    int known = atomic_load_explicit(&pos_of[dev], memory_order_relaxed);
    if (known)
        return known > 0 ? known - 1 : -1;
    cgpu_start(); /* the daemon names the instance's GPUs when it registers this process */
    if (!cgpu_conn_wait(wait_ms >= 0 ? wait_ms : cgpu_cfg.on_loss_run ? 0 : -1) && !cgpu_conn_uuid(0)[0])
        return dev < cgpu_cfg.ngpus ? dev : -1; /* never registered (refused, or running unchecked): by ordinal */
    char uuid[48];
    if (uuid_of(dev, uuid, sizeof uuid) < 0)
        return dev < cgpu_cfg.ngpus ? dev : -1; /* a driver without device UUIDs */
    int pos = -1;
    for (int p = 0; p < cgpu_cfg.ngpus && pos < 0; p++)
        if (strcasecmp(cgpu_conn_uuid(p), uuid) == 0)
            pos = p;
    if (pos < 0)
        cgpu_log("CUDA device %d (%s) is none of this instance's GPUs: its work is not gated or counted; set "
                 "CUDA_VISIBLE_DEVICES to the GPUs of ALIYUN_COM_GPU_VISIBLE_DEVICES (cgpu-run --gpus does)",
                 dev, uuid);
    atomic_store(&pos_of[dev], pos >= 0 ? pos + 1 : -1);
    return pos;
}

CUdevice cgpu_current_device(void) {
    CUdevice dev = -1;
    __typeof__(cuCtxGetDevice) *get = REAL(cuCtxGetDevice);
    if (!get || get(&dev) != CUDA_SUCCESS)
        return -1;
    return dev;
}

int cgpu_current_pos(void) { return cgpu_device_pos(cgpu_current_device(), -1); }
