/* A CUDA driver-API program for the shim's tests and the benchmarks, run against the fake libcuda or a real one.
 *
 * Built two ways: with -DDIRECT it links libcuda.so.1 and calls the driver by name;
 * without, it dlopen()s libcuda.so.1 and resolves every entry point with dlsym
 * (--resolve dlsym, the default) or through cuGetProcAddress_v2 (--resolve gpa, or
 * gpa-ptsz for the per-thread default stream variants).
 *
 * usage: cuda_job [--resolve MODE] [--api launch|ex|coop|graph] ACTION...
 *   (--api graph: spin and serve capture one batch of kernels into a graph and replay it; --graph HOW: how serve
 *   makes the graph it replays from the capture: capture (itself), clone (cuGraphClone of it), child (a graph of
 *   one child graph node holding it, cuGraphAddChildGraphNode), update (an executable graph of BATCH spin kernels
 *   given the captured graph's kernels by cuGraphExecUpdate))
 *   alloc=SIZE pitch=W,H async=SIZE create=SIZE   allocate (SIZE: bytes, or with K/M/G)
 *   freeall                                        free everything allocated so far
 *   info total                                     cuMemGetInfo / cuDeviceTotalMem
 *   spin=MS,BATCH,START_NS,END_NS                  from START to END: BATCH kernels of MS
 *                                                  queued at once, then a stream sync
 *   nulls=N                                        ns per launch of an empty kernel
 *   launch=MS                                      one kernel of MS and a stream sync; prints the launch's rc
 *   capture=N,MS                                   with the lease held (a kernel run first), capture N kernels of
 *                                                  1 ms in global mode, idle MS inside the capture, end it, then
 *                                                  replay the graph; prints the end's and the replay's rc
 *   xcapture=N,MS,R                                a second thread launches 1 ms kernels on a stream of its own
 *                                                  (each followed by a stream sync) while this one captures N
 *                                                  kernels of 1 ms in global mode and idles MS inside the capture
 *                                                  (the second thread's lease ends meanwhile: the shim syncs and
 *                                                  waits for its next turn); then the graph is replayed R times,
 *                                                  each a launch and a stream sync. Prints the end's rc, the first
 *                                                  failing replay's rc (0: none), and how many of the second
 *                                                  thread's launches waited 2 ms or more (a lease ended)
 *   collective                                     from here on, serve ends each batch with the collective of MS
 *                                                  in place of its last kernel (a training step's all-reduce; the
 *                                                  fake driver's collective, fakecoll.c: fake driver only)
 *   sleep=MS  ready
 *   serve=MS,BATCH[,LAG]                           on stdin commands: run (LAG ms of host work, BATCH kernels
 *                                                  of MS, a stream sync, again), pause, dump PATH (batch end
 *                                                  times, JSON), quit. With --api graph the BATCH kernels are
 *                                                  captured once (global mode, before ready) and each step is
 *                                                  one replay of that graph: a CUDA-graph decode step or
 *                                                  training step, its collective inside the graph
 * Each action prints one line: its name and results. Its kernels are real PTX (cgpu_spin busy-waits on
 * %globaltimer), so the same binary runs on a GPU; the fake driver runs them as CPU spins. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h"

#define API(X)                                                                                 \
    X(cuInit, CUresult (*)(unsigned))                                                          \
    X(cuDeviceGet, CUresult (*)(CUdevice *, int))                                              \
    X(cuDevicePrimaryCtxRetain, CUresult (*)(CUcontext *, CUdevice))                           \
    X(cuCtxSetCurrent, CUresult (*)(CUcontext))                                                \
    X(cuStreamCreate, CUresult (*)(CUstream *, unsigned))                                      \
    X(cuStreamSynchronize, CUresult (*)(CUstream))                                             \
    X(cuStreamBeginCapture_v2, CUresult (*)(CUstream, int))                                    \
    X(cuStreamEndCapture, CUresult (*)(CUstream, CUgraph *))                                   \
    X(cuGraphInstantiateWithFlags, CUresult (*)(CUgraphExec *, CUgraph, unsigned long long))   \
    X(cuGraphCreate, CUresult (*)(CUgraph *, unsigned))                                        \
    X(cuGraphClone, CUresult (*)(CUgraph *, CUgraph))                                          \
    X(cuGraphAddChildGraphNode, CUresult (*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph)) \
    X(cuGraphExecUpdate_v2, CUresult (*)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *)) \
    X(cuModuleLoadData, CUresult (*)(CUmodule *, const void *))                                \
    X(cuModuleGetFunction, CUresult (*)(CUfunction *, CUmodule, const char *))                 \
    X(cuModuleUnload, CUresult (*)(CUmodule))                                                  \
    X(cuGraphDestroy, CUresult (*)(CUgraph))                                                   \
    X(cuGraphExecDestroy, CUresult (*)(CUgraphExec))                                           \
    X(cuStreamDestroy_v2, CUresult (*)(CUstream))                                              \
    X(cuLaunchKernel, CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
                                   unsigned, CUstream, void **, void **))                      \
    X(cuLaunchKernelEx, CUresult (*)(const CUlaunchConfig *, CUfunction, void **, void **))    \
    X(cuLaunchCooperativeKernel, CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, \
                                              unsigned, unsigned, CUstream, void **))          \
    X(cuGraphLaunch, CUresult (*)(CUgraphExec, CUstream))                                      \
    X(cuMemAlloc_v2, CUresult (*)(CUdeviceptr *, size_t))                                      \
    X(cuMemAllocPitch_v2, CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))     \
    X(cuMemFree_v2, CUresult (*)(CUdeviceptr))                                                 \
    X(cuMemAllocAsync, CUresult (*)(CUdeviceptr *, size_t, CUstream))                          \
    X(cuMemFreeAsync, CUresult (*)(CUdeviceptr, CUstream))                                     \
    X(cuMemCreate, CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, \
                                unsigned long long))                                           \
    X(cuMemRelease, CUresult (*)(CUmemGenericAllocationHandle))                                \
    X(cuMemGetInfo_v2, CUresult (*)(size_t *, size_t *))                                       \
    X(cuDeviceTotalMem_v2, CUresult (*)(size_t *, CUdevice))

#define FIELD(name, type) __typeof__(type) name;
static struct { API(FIELD) } api;

#ifdef DIRECT
#define DECL(name, type) extern __typeof__(*(type)0) name;
API(DECL)
#endif

/* base name for cuGetProcAddress: drop a _v2 suffix */
__attribute__((unused)) static void base_name(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s", name);
    size_t n = strlen(out);
    if (n > 3 && strcmp(out + n - 3, "_v2") == 0)
        out[n - 3] = 0;
}

static void resolve(const char *mode) {
#ifdef DIRECT
    (void)mode;
#define SET(name, type) api.name = name;
    API(SET)
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cuda_job: %s\n", dlerror());
        exit(3);
    }
    typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    gpa_t gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    int use_gpa = strncmp(mode, "gpa", 3) == 0;
    cuuint64_t flags = strcmp(mode, "gpa-ptsz") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    char base[64];
#define SET(name, type)                                                                   \
    if (use_gpa) {                                                                        \
        void *p_ = NULL;                                                                  \
        base_name(#name, base, sizeof base);                                              \
        if (!gpa || gpa(base, &p_, 12040, flags, NULL) != CUDA_SUCCESS) {                 \
            fprintf(stderr, "cuda_job: cuGetProcAddress(%s) failed\n", base);             \
            exit(3);                                                                      \
        }                                                                                 \
        api.name = (type)p_;                                                              \
    } else {                                                                              \
        api.name = (type)dlsym(h, #name);                                                 \
    }
    API(SET)
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

#define CHECK(call)                                                        \
    do {                                                                   \
        CUresult r_ = (call);                                              \
        if (r_ != CUDA_SUCCESS) {                                          \
            fprintf(stderr, "cuda_job: %s failed: %d\n", #call, r_);       \
            exit(4);                                                       \
        }                                                                  \
    } while (0)

/* cgpu_spin(u64 ns): one thread waits until the GPU's global timer has moved ns; cgpu_null: nothing.
 * PTX 7.0 for sm_75 and newer, JIT-compiled by the driver for the GPU at hand (tests check it with ptxas). */
static const char SPIN_PTX[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry cgpu_spin(.param .u64 cgpu_spin_ns)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [cgpu_spin_ns];\n"
    "    mov.u64 %rd2, %globaltimer;\n"
    "$Lspin:\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    sub.s64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $Lspin;\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry cgpu_null()\n"
    "{\n"
    "    ret;\n"
    "}\n";

enum { KIND_PTR, KIND_ASYNC, KIND_HANDLE };
static struct { unsigned long long p; int kind; } allocs[4096];
static int nallocs;

static CUstream stream;
static CUfunction spin_fn, null_fn, last_fn; /* last_fn: each served batch's last kernel */
static const char *api_kind = "launch";
static const char *graph_how = "capture"; /* --graph */

static CUresult launch_one(CUfunction f, uint64_t *ns) {
    void *params[] = {ns};
    if (strcmp(api_kind, "ex") == 0) {
        CUlaunchConfig cfg = {1, 1, 1, 1, 1, 1, 0, stream, NULL, 0};
        return api.cuLaunchKernelEx(&cfg, f, params, NULL);
    }
    if (strcmp(api_kind, "coop") == 0)
        return api.cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params);
    return api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

static void spin_loop(double ms, int batch, int64_t start, int64_t end) {
    uint64_t ns = (uint64_t)(ms * 1e6);
    CUgraphExec exec = NULL;
    if (strcmp(api_kind, "graph") == 0) { /* one graph of BATCH kernels, launched as a whole */
        CUgraph g;
        CHECK(api.cuStreamBeginCapture_v2(stream, 0));
        for (int k = 0; k < batch; k++)
            CHECK(launch_one(spin_fn, &ns));
        CHECK(api.cuStreamEndCapture(stream, &g));
        CHECK(api.cuGraphInstantiateWithFlags(&exec, g, 0));
        CHECK(api.cuGraphDestroy(g));
    }
    while (now_ns() < start)
        usleep(200);
    long kernels = 0, batches = 0;
    int64_t first = 0, last = 0;
    while (now_ns() < end) {
        int64_t t0 = now_ns();
        if (exec)
            CHECK(api.cuGraphLaunch(exec, stream));
        else
            for (int k = 0; k < batch; k++)
                CHECK(launch_one(spin_fn, &ns));
        CHECK(api.cuStreamSynchronize(stream));
        int64_t t1 = now_ns();
        if (t1 <= end) {
            kernels += batch;
            batches++;
            if (!first)
                first = t0;
            last = t1;
        }
    }
    if (exec)
        CHECK(api.cuGraphExecDestroy(exec));
    printf("spin kernels=%ld batches=%ld kernel_ns=%lld first=%lld last=%lld\n", kernels, batches,
           (long long)(kernels * (long long)ns), (long long)first, (long long)last);
}

/* serve: a spinner thread runs batches while told to; the main thread reads commands */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 paused, 1 running, 2 quit */
    int64_t *ends;
    size_t n, cap;
    uint64_t ns;
    int batch;
    useconds_t lag_us; /* the host's part of a step, before its launches */
    CUcontext ctx;
    CUgraphExec step; /* --api graph: the step, captured */
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *serve_spin(void *arg) {
    (void)arg;
    CHECK(api.cuCtxSetCurrent(S.ctx));
    pthread_mutex_lock(&S.mu);
    for (;;) {
        while (S.state == 0)
            pthread_cond_wait(&S.cv, &S.mu);
        if (S.state == 2)
            break;
        pthread_mutex_unlock(&S.mu);
        if (S.lag_us)
            usleep(S.lag_us);
        if (S.step)
            CHECK(api.cuGraphLaunch(S.step, stream));
        else
            for (int k = 0; k < S.batch; k++)
                CHECK(launch_one(k == S.batch - 1 ? last_fn : spin_fn, &S.ns));
        CHECK(api.cuStreamSynchronize(stream));
        int64_t t = now_ns();
        pthread_mutex_lock(&S.mu);
        if (S.n == S.cap) {
            S.cap = S.cap ? 2 * S.cap : 4096;
            S.ends = realloc(S.ends, S.cap * sizeof *S.ends);
            if (!S.ends)
                exit(5);
        }
        S.ends[S.n++] = t;
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* A global-mode capture (PyTorch's default) of n kernels of S.ns, the last last_fn when `last` (else all spins). */
static CUgraph capture_step(int n, int last) {
    CUgraph g;
    CHECK(api.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int k = 0; k < n; k++)
        CHECK(launch_one(last && k == n - 1 ? last_fn : spin_fn, &S.ns));
    CHECK(api.cuStreamEndCapture(stream, &g));
    return g;
}

/* serve's step as an executable graph: one batch, its collective included, captured, then made into what it
 * replays as --graph says. */
static CUgraphExec step_graph(int batch) {
    CUgraph g = capture_step(batch, 1), made = g;
    CUgraphExec e;
    if (strcmp(graph_how, "clone") == 0) {
        CHECK(api.cuGraphClone(&made, g));
    } else if (strcmp(graph_how, "child") == 0) {
        CUgraphNode node;
        CHECK(api.cuGraphCreate(&made, 0));
        CHECK(api.cuGraphAddChildGraphNode(&node, made, NULL, 0, g));
    } else if (strcmp(graph_how, "update") == 0) {
        made = capture_step(batch, 0);
    } else if (strcmp(graph_how, "capture") != 0) {
        fprintf(stderr, "cuda_job: unknown --graph %s\n", graph_how);
        exit(2);
    }
    CHECK(api.cuGraphInstantiateWithFlags(&e, made, 0));
    if (strcmp(graph_how, "update") == 0) {
        CUgraphExecUpdateResultInfo info;
        CHECK(api.cuGraphExecUpdate_v2(e, g, &info));
    }
    if (made != g)
        CHECK(api.cuGraphDestroy(made));
    CHECK(api.cuGraphDestroy(g));
    return e;
}

static void serve(double ms, int batch, CUcontext ctx) {
    CUdeviceptr p;
    CHECK(api.cuMemAlloc_v2(&p, 1 << 20)); /* registers with the daemon before the first command */
    CHECK(api.cuMemFree_v2(p));
    S.ns = (uint64_t)(ms * 1e6);
    S.batch = batch;
    S.ctx = ctx;
    if (strcmp(api_kind, "graph") == 0)
        S.step = step_graph(batch);
    pthread_t t;
    if (pthread_create(&t, NULL, serve_spin, NULL) != 0)
        exit(5);
    printf("ready\n");
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        pthread_mutex_lock(&S.mu);
        if (strcmp(line, "run") == 0 || strcmp(line, "pause") == 0) {
            S.state = line[0] == 'r';
            pthread_cond_broadcast(&S.cv);
        } else if (strncmp(line, "dump ", 5) == 0) {
            FILE *f = fopen(line + 5, "w");
            if (!f)
                exit(5);
            fprintf(f, "{\"ends\": [");
            for (size_t k = 0; k < S.n; k++)
                fprintf(f, "%s%lld", k ? ", " : "", (long long)S.ends[k]);
            fprintf(f, "], \"leases\": []}\n");
            fclose(f);
            printf("dumped\n");
        } else if (strcmp(line, "quit") == 0) {
            pthread_mutex_unlock(&S.mu);
            break;
        }
        pthread_mutex_unlock(&S.mu);
    }
    pthread_mutex_lock(&S.mu);
    S.state = 2;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(t, NULL);
    if (S.step)
        CHECK(api.cuGraphExecDestroy(S.step));
    free(S.ends);
}

/* A global-mode capture (PyTorch's default) of n 1 ms kernels on the main stream, held open ms; then, where `stop`
 * is given, the thread `other` stopped and joined; then the graph replayed `replays` times, each synced. The end's
 * code; the replays' in *replay (CUDA_ERROR_INVALID_VALUE where the capture did not end valid). */
static CUresult capture(int n, double ms, int replays, _Atomic int *stop, pthread_t *other, CUresult *replay) {
    uint64_t one = 1000000;
    CUgraph g = NULL;
    CUgraphExec exec = NULL;
    CHECK(api.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int k = 0; k < n; k++)
        launch_one(spin_fn, &one);
    usleep((useconds_t)(ms * 1000));
    CUresult end = api.cuStreamEndCapture(stream, &g);
    if (stop) {
        *stop = 1;
        pthread_join(*other, NULL);
    }
    *replay = CUDA_ERROR_INVALID_VALUE;
    if (end == CUDA_SUCCESS && api.cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS) {
        *replay = CUDA_SUCCESS;
        for (int k = 0; k < replays && *replay == CUDA_SUCCESS; k++) {
            *replay = api.cuGraphLaunch(exec, stream);
            if (*replay == CUDA_SUCCESS)
                *replay = api.cuStreamSynchronize(stream);
        }
        CHECK(api.cuGraphExecDestroy(exec));
    }
    if (g)
        CHECK(api.cuGraphDestroy(g));
    return end;
}

/* xcapture: a thread that launches and syncs on a stream of its own while the main thread captures */
static struct {
    _Atomic int stop;
    CUcontext ctx;
    long waits, launches;
} X;

static void *xcapture_other(void *arg) {
    (void)arg;
    CUstream own;
    uint64_t one = 1000000;
    void *params[] = {&one};
    CHECK(api.cuCtxSetCurrent(X.ctx));
    CHECK(api.cuStreamCreate(&own, 0));
    while (!X.stop) {
        int64_t t = now_ns();
        CHECK(api.cuLaunchKernel(spin_fn, 1, 1, 1, 1, 1, 1, 0, own, params, NULL));
        X.waits += now_ns() - t >= 2000000; /* the launch waited: the lease had ended, and the next one came */
        X.launches++;
        CHECK(api.cuStreamSynchronize(own));
    }
    CHECK(api.cuStreamDestroy_v2(own));
    return NULL;
}

static void xcapture(int n, double ms, int replays, CUcontext ctx) {
    uint64_t one = 1000000;
    CHECK(launch_one(spin_fn, &one));
    CHECK(api.cuStreamSynchronize(stream));
    X.stop = 0;
    X.ctx = ctx;
    pthread_t t;
    if (pthread_create(&t, NULL, xcapture_other, NULL) != 0)
        exit(5);
    CUresult replay, end = capture(n, ms, replays, &X.stop, &t, &replay);
    printf("xcapture end_rc=%d replay_rc=%d other_waits=%ld other_launches=%ld\n", end, replay, X.waits,
           X.launches);
}

static void nulls(long n) {
    uint64_t zero = 0;
    double best = 1e18;
    for (int rep = 0; rep < 7; rep++) {
        int64_t t = now_ns();
        for (long k = 0; k < n; k++)
            launch_one(null_fn, &zero);
        double per = (double)(now_ns() - t) / (double)n;
        best = per < best ? per : best;
    }
    printf("nulls ns_per_launch=%.1f\n", best);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = "dlsym";
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc)
            return 2;
        if (strcmp(argv[i], "--resolve") == 0)
            mode = argv[i + 1];
        else if (strcmp(argv[i], "--api") == 0)
            api_kind = argv[i + 1];
        else if (strcmp(argv[i], "--graph") == 0)
            graph_how = argv[i + 1];
    }
    resolve(mode);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(api.cuInit(0));
    CHECK(api.cuDeviceGet(&dev, 0));
    CHECK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(api.cuCtxSetCurrent(ctx));
    CHECK(api.cuStreamCreate(&stream, 0));
    CHECK(api.cuModuleLoadData(&mod, SPIN_PTX));
    CHECK(api.cuModuleGetFunction(&spin_fn, mod, "cgpu_spin"));
    CHECK(api.cuModuleGetFunction(&null_fn, mod, "cgpu_null"));
    last_fn = spin_fn;

    for (; i < argc; i++) {
        char *a = argv[i], *v = strchr(a, '=');
        if (v)
            *v++ = 0;
        if (strcmp(a, "alloc") == 0 || strcmp(a, "async") == 0 || strcmp(a, "create") == 0) {
            size_t n = parse_size(v);
            CUresult r;
            if (a[0] == 'a' && a[1] == 'l') {
                r = api.cuMemAlloc_v2(&allocs[nallocs].p, n);
                allocs[nallocs].kind = KIND_PTR;
            } else if (a[0] == 'a') {
                r = api.cuMemAllocAsync(&allocs[nallocs].p, n, stream);
                allocs[nallocs].kind = KIND_ASYNC;
            } else {
                CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = 0}};
                r = api.cuMemCreate(&allocs[nallocs].p, n, &prop, 0);
                allocs[nallocs].kind = KIND_HANDLE;
            }
            if (r == CUDA_SUCCESS && nallocs < 4095)
                nallocs++;
            printf("%s bytes=%zu rc=%d\n", a, n, r);
        } else if (strcmp(a, "pitch") == 0) {
            size_t w = parse_size(v), h = parse_size(strchr(v, ',') + 1), pitch = 0;
            CUresult r = api.cuMemAllocPitch_v2(&allocs[nallocs].p, &pitch, w, h, 4);
            allocs[nallocs].kind = KIND_PTR;
            if (r == CUDA_SUCCESS && nallocs < 4095)
                nallocs++;
            printf("pitch pitch=%zu rc=%d\n", pitch, r);
        } else if (strcmp(a, "freeall") == 0) {
            int bad = 0;
            for (int k = 0; k < nallocs; k++) {
                CUresult r = allocs[k].kind == KIND_PTR     ? api.cuMemFree_v2(allocs[k].p)
                             : allocs[k].kind == KIND_ASYNC ? api.cuMemFreeAsync(allocs[k].p, stream)
                                                            : api.cuMemRelease(allocs[k].p);
                bad += r != CUDA_SUCCESS;
            }
            CHECK(api.cuStreamSynchronize(stream));
            printf("freeall count=%d failed=%d\n", nallocs, bad);
            nallocs = 0;
        } else if (strcmp(a, "info") == 0) {
            size_t f = 0, t = 0;
            CUresult r = api.cuMemGetInfo_v2(&f, &t);
            printf("info free=%zu total=%zu rc=%d\n", f, t, r);
        } else if (strcmp(a, "total") == 0) {
            size_t t = 0;
            CUresult r = api.cuDeviceTotalMem_v2(&t, dev);
            printf("total bytes=%zu rc=%d\n", t, r);
        } else if (strcmp(a, "spin") == 0) {
            double ms;
            int batch;
            long long start, end;
            if (sscanf(v, "%lf,%d,%lld,%lld", &ms, &batch, &start, &end) != 4)
                return 2;
            spin_loop(ms, batch, start, end);
        } else if (strcmp(a, "launch") == 0) {
            uint64_t ns = (uint64_t)(atof(v) * 1e6);
            CUresult r = launch_one(spin_fn, &ns);
            if (r == CUDA_SUCCESS)
                CHECK(api.cuStreamSynchronize(stream));
            printf("launch rc=%d\n", r);
        } else if (strcmp(a, "capture") == 0) {
            int n;
            double ms;
            if (sscanf(v, "%d,%lf", &n, &ms) != 2)
                return 2;
            uint64_t one = 1000000;
            CHECK(launch_one(spin_fn, &one));
            CHECK(api.cuStreamSynchronize(stream));
            CUresult replay, end = capture(n, ms, 1, NULL, NULL, &replay);
            printf("capture end_rc=%d replay_rc=%d\n", end, replay);
        } else if (strcmp(a, "xcapture") == 0) {
            int n, replays;
            double ms;
            if (sscanf(v, "%d,%lf,%d", &n, &ms, &replays) != 3)
                return 2;
            xcapture(n, ms, replays, ctx);
        } else if (strcmp(a, "nulls") == 0) {
            nulls(atol(v));
        } else if (strcmp(a, "sleep") == 0) {
            usleep((useconds_t)(atof(v) * 1000));
            printf("sleep\n");
        } else if (strcmp(a, "serve") == 0) {
            double ms, lag_ms = 0;
            int batch;
            if (sscanf(v, "%lf,%d,%lf", &ms, &batch, &lag_ms) < 2)
                return 2;
            S.lag_us = (useconds_t)(lag_ms * 1000);
            serve(ms, batch, ctx);
        } else if (strcmp(a, "collective") == 0) {
            CHECK(api.cuModuleGetFunction(&last_fn, mod, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
            printf("collective\n");
        } else if (strcmp(a, "ready") == 0) {
            printf("ready pid=%d\n", (int)getpid());
        } else {
            fprintf(stderr, "cuda_job: unknown action %s\n", a);
            return 2;
        }
    }
    CHECK(api.cuStreamDestroy_v2(stream));
    CHECK(api.cuModuleUnload(mod));
    return 0;
}
