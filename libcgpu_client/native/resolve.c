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
#include <string.h>

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

int cgpu_current_pos(void) {
    if (cgpu_cfg.ngpus == 1)
        return 0;
    CUdevice dev = -1;
    __typeof__(cuCtxGetDevice) *get = REAL(cuCtxGetDevice);
    if (!get || get(&dev) != CUDA_SUCCESS || dev < 0 || dev >= cgpu_cfg.ngpus)
        return -1;
    return dev;
}
