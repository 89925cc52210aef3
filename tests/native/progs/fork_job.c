/* A parent that asks NVML about the GPU (which starts libcgpu.so's connection: the process registers) and then
 * fork()s a child that uses CUDA, as a server that checks its GPUs and then forks its workers does. CUDA is first
 * initialised in the child: CUDA carries none of its state or threads into a child made by fork(), and a child may
 * not use CUDA its parent initialised (PyTorch says "Cannot re-initialize CUDA in forked subprocess"), so the
 * parent does not call cuInit before the fork.
 *
 *   fork_job ALLOC1 ALLOC2 MS END_NS HOLD_MS
 *
 * The child allocates ALLOC1 then ALLOC2 bytes (cuMemAlloc_v2), prints "child pid=P alloc1=RC alloc2=RC", then
 * launches 4 spin kernels of MS and a cuCtxSynchronize, again and again until CLOCK_MONOTONIC END_NS, prints
 * "spin kernels=N", holds its memory HOLD_MS more and exits 0. The parent prints "nvml rc=RC total=BYTES" before
 * the fork and "parent child_status=S" after it. Linked against libcuda.so.1 (the fake's, in tests). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h"

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define CHECK(call)                                                  \
    do {                                                             \
        CUresult r_ = (call);                                        \
        if (r_ != CUDA_SUCCESS) {                                    \
            fprintf(stderr, "fork_job: %s failed: %d\n", #call, r_); \
            _exit(4);                                                \
        }                                                            \
    } while (0)

/* NVML as a program reaches it once it is loaded: through the global scope, where a preloaded libcgpu.so's
 * nvmlDeviceGetMemoryInfo comes first. */
static void ask_nvml(void) {
    if (!dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "fork_job: %s\n", dlerror());
        exit(3);
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(RTLD_DEFAULT, "nvmlInit_v2");
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(RTLD_DEFAULT, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo");
    nvmlDevice_t dev;
    nvmlMemory_t m = {0, 0, 0};
    nvmlReturn_t r = init && handle && info ? init() : -1;
    if (r == 0)
        r = handle(0, &dev);
    if (r == 0)
        r = info(dev, &m);
    printf("nvml rc=%d total=%llu\n", r, m.total);
}

static void child(size_t a1, size_t a2, double ms, int64_t end, int hold_ms) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CUdeviceptr p1 = 0, p2 = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ".version 7.0\n.target sm_75\n.address_size 64\n"));
    CHECK(cuModuleGetFunction(&spin, mod, "cgpu_spin"));
    CUresult r1 = cuMemAlloc_v2(&p1, a1), r2 = cuMemAlloc_v2(&p2, a2);
    printf("child pid=%d alloc1=%d alloc2=%d\n", (int)getpid(), r1, r2);
    uint64_t ns = (uint64_t)(ms * 1e6);
    void *params[] = {&ns};
    long kernels = 0;
    while (now_ns() < end) {
        for (int k = 0; k < 4; k++)
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        CHECK(cuCtxSynchronize());
        kernels += 4;
    }
    printf("spin kernels=%ld\n", kernels);
    fflush(stdout);
    usleep((useconds_t)hold_ms * 1000);
    _exit(0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 6)
        return 2;
    ask_nvml();
    pid_t pid = fork();
    if (pid < 0)
        return 5;
    if (pid == 0)
        child((size_t)strtoull(argv[1], NULL, 10), (size_t)strtoull(argv[2], NULL, 10), atof(argv[3]),
              strtoll(argv[4], NULL, 10), atoi(argv[5]));
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent child_status=%d\n", status);
    return 0;
}
