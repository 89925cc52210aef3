/* A CPU-backed fake of libcuda.so.1, for tests only (never installed).
 *
 * What it models, function by function, is in README.md beside this file. In short:
 * devices, memory totals and SM counts come from the environment
 * (FAKECUDA_DEVICES, FAKECUDA_MEM_MB, FAKECUDA_SMS); each context has one worker
 * thread that runs the work of all its streams in launch order, so a launch
 * returns at once and its kernel runs later; the kernel "cgpu_spin" runs
 * for the nanoseconds in its first parameter (fake_busy_until: it sleeps most of
 * them, as a GPU takes no host CPU); synchronisation, queries and events follow
 * the driver API's rules; device memory is host memory, bounded by the device's
 * total. FAKECUDA_TRACE=path appends "pid start_ns end_ns" for
 * every kernel it runs (CLOCK_MONOTONIC), which lets tests check who ran when. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h" /* libcgpu_client/native, on the -I path */
#include "fakecoll.h" /* the collective kernel (fakecoll.c) */

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 16
#define QUEUE_DEPTH 1024 /* launches past this many pending block, as a full pushbuffer does */
#define STACK_DEPTH 16

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ model */

enum { OP_KERNEL, OP_EVENT, OP_GRAPH, OP_FREE, OP_COLLECTIVE };

struct gm_list { /* graph memory nodes (below): allocations or frees */
    int n, cap;
    struct gm_alloc **v;
};
/* A kernel node of a graph: a spin kernel (OP_KERNEL) or the collective (OP_COLLECTIVE), and its nanoseconds. To
 * CUDA both are kernel nodes (CU_GRAPH_NODE_TYPE_KERNEL): what kernel a node runs is one of its parameters. */
struct gnode {
    int kind;
    uint64_t ns;
};
struct CUgraph_st {
    int n, cap;
    struct gnode *nodes; /* the kernels captured, in order */
    struct gm_list allocs, frees; /* its memory nodes */
    struct CUgraphExec_st *inst;  /* its executable graph, if it has memory nodes (at most one: gm_instantiate) */
};
struct CUgraphExec_st {
    int n;
    struct gnode *nodes;
    struct gm_list allocs, frees; /* its graph's memory nodes, at instantiation */
    unsigned long long flags;
    int mapped, destroyed;        /* the graph memory pool backs its allocations; destroyed with some still live */
    int remap;                    /* updated while mapped (cuGraphExecUpdate): maps anew at its next upload/launch */
    size_t maps[MAX_DEVICES];     /* what its mapping takes of each device's graph memory pool */
    CUcontext ctx;                /* its last launch: (ctx, seq) */
    uint64_t seq;
    struct CUgraphExec_st *next;  /* every exec with memory nodes */
    struct CUgraph_st *from;      /* the graph it was instantiated from, while both exist (memory nodes only) */
};

typedef struct op {
    int kind;
    uint64_t seq;
    uint64_t ns;
    CUevent ev;
    struct CUgraphExec_st *graph;
    void *mem;
    struct pool_block *pb; /* OP_FREE of a pool allocation: it goes back to its pool */
    struct op *next;
} op;

struct CUstream_st {
    CUcontext ctx;
    uint64_t last_seq; /* the last op queued on this stream */
    int capturing;
    CUgraph graph;
    int mode;           /* the capture's CUstreamCaptureMode */
    pthread_t owner;    /* the thread that began it */
    int invalidated;
    int to_graph;       /* begun by cuStreamBeginCaptureToGraph: the graph is the caller's */
};

struct CUctx_st {
    int dev;
    int primary;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    int pending;
    uint64_t enq_seq, done_seq;
    int stop;
    pthread_t worker;
    struct CUstream_st null_stream;
};

struct CUevent_st {
    CUcontext ctx;
    uint64_t seq; /* 0: never recorded */
    int64_t when;
};

struct CUfunc_st {
    int kind; /* 0 spin, 1 null, 2 allreduce (fakecoll.c) */
    const char *name;
};
struct CUmod_st {
    int loaded;
};

/* The collective is named as NCCL (2.19 on) names its kernels, ncclDevKernel_<Func>_<RedOp>_<Type>_<Algo>_<Proto>,
 * so that what finds NCCL's kernels by name finds it. */
static struct CUfunc_st fn_spin = {0, "cgpu_spin"}, fn_null = {1, "cgpu_null"},
                        fn_allreduce = {2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"};

static struct {
    atomic_int inited;
    int ndev, sms;
    int nphys;                /* FAKECUDA_DEVICES */
    int phys[MAX_DEVICES];    /* the physical device behind each visible ordinal (CUDA_VISIBLE_DEVICES) */
    int64_t total;
    _Atomic int64_t used[MAX_DEVICES];
    CUcontext primary[MAX_DEVICES];
    int primary_refs[MAX_DEVICES];
    pthread_mutex_t mu;
    int trace_fd;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER, .trace_fd = -1};

static __thread CUcontext ctx_stack[STACK_DEPTH];
static __thread int ctx_depth;

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

#define CHECK_INIT()                      \
    do {                                  \
        if (!atomic_load(&D.inited))      \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

static CUcontext current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* Defined with the memory pools, the context footprint and the other memory kinds, below. */
struct pool_block;
static void pool_return(struct pool_block *pb);
static void pools_at_sync(int dev);
/* Graph memory nodes, defined with the memory pools. */
static CUresult gm_capture_alloc(CUstream s, size_t bytes, int dev, CUdeviceptr *out);
static CUresult gm_capture_free(CUstream s, CUdeviceptr p);
static CUresult gm_free_outside(CUdeviceptr p);
static void gm_graph_release(struct CUgraph_st *g);
static CUresult gm_instantiate(CUgraphExec e, CUgraph g, unsigned long long flags);
static CUresult gm_launch(CUgraphExec e);
static void gm_launched(CUgraphExec e, CUstream s);
static int gm_exec_destroy(CUgraphExec e);
static int footprint_take(int dev);
static void footprint_give(int dev);

/* ------------------------------------------------------------------ worker */

/* A GPU running a kernel takes none of its host's CPUs (a launch is asynchronous: CUDA Driver API, Execution
 * Control, cuLaunchKernel), but this model's device is a host thread: it sleeps until just before the kernel's end
 * and spins the rest, so that the kernel ends on time and the host's cores stay free for the threads that launch.
 * Spinning throughout, two busy devices on a 2-core host left the launching threads and the daemon a core's scraps:
 * a rank's launches came tens of ms late, and its gang's turn passed idle. */
#define SPIN_TAIL_NS 100000
void fake_busy_until(int64_t end) {
    int64_t wake = end - SPIN_TAIL_NS;
    if (now_ns() < wake) {
        struct timespec ts = {(time_t)(wake / 1000000000LL), (long)(wake % 1000000000LL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
    while (now_ns() < end) {
    }
}

static void spin(uint64_t ns) {
    int64_t start = now_ns();
    fake_busy_until(start + (int64_t)ns);
    if (D.trace_fd >= 0) {
        char line[80];
        int n = snprintf(line, sizeof line, "%d %lld %lld\n", (int)getpid(), (long long)start, (long long)now_ns());
        if (write(D.trace_fd, line, (size_t)n) < 0) {
            /* a test that asked for a trace will notice it is short */
        }
    }
}

static void *worker_main(void *arg) {
    CUcontext c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head)
            break;
        op *o = c->head;
        pthread_mutex_unlock(&c->mu);
        switch (o->kind) {
        case OP_KERNEL: spin(o->ns); break;
        case OP_GRAPH: /* its nodes in order, each as the kernel it is */
            for (int k = 0; k < o->graph->n; k++)
                if (o->graph->nodes[k].kind == OP_COLLECTIVE)
                    fakecoll_run(D.phys[c->dev], o->graph->nodes[k].ns);
                else
                    spin(o->graph->nodes[k].ns);
            break;
        case OP_EVENT: o->ev->when = now_ns(); break;
        case OP_FREE: break;
        case OP_COLLECTIVE: fakecoll_run(D.phys[c->dev], o->ns); break;
        }
        pthread_mutex_lock(&c->mu);
        if (o->kind == OP_FREE)
            free(o->mem);
        if (o->kind == OP_FREE && o->pb)
            pool_return(o->pb);
        c->head = o->next;
        if (!c->head)
            c->tail = NULL;
        c->pending--;
        c->done_seq = o->seq;
        if (o->kind == OP_GRAPH) {
            free(o->graph->nodes);
            free(o->graph);
        }
        free(o);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static CUstream resolve_stream(CUstream s) {
    if (s == NULL || s == (CUstream)0x1 || s == (CUstream)0x2) { /* legacy / per-thread default stream */
        CUcontext c = current();
        return c ? &c->null_stream : NULL;
    }
    return s;
}

static CUresult enqueue(CUstream s, op *o) {
    CUcontext c = s->ctx;
    pthread_mutex_lock(&c->mu);
    while (c->pending >= QUEUE_DEPTH)
        pthread_cond_wait(&c->cv, &c->mu);
    o->seq = ++c->enq_seq;
    o->next = NULL;
    s->last_seq = o->seq;
    if (c->tail)
        c->tail->next = o;
    else
        c->head = o;
    c->tail = o;
    c->pending++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return CUDA_SUCCESS;
}

static void wait_seq(CUcontext c, uint64_t seq) {
    pthread_mutex_lock(&c->mu);
    while (c->done_seq < seq)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static CUcontext new_context(int dev, int primary) {
    if (footprint_take(dev) != 0)
        return NULL;
    CUcontext c = calloc(1, sizeof *c);
    if (!c) {
        footprint_give(dev);
        return NULL;
    }
    c->dev = dev;
    c->primary = primary;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->null_stream.ctx = c;
    if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
        footprint_give(dev);
        free(c);
        return NULL;
    }
    return c;
}

static void destroy_context(CUcontext c) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->worker, NULL);
    footprint_give(c->dev);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* ------------------------------------------------------------ init, devices */

/* Physical device p's UUID, as nvidia-smi -L and NVML print it (the fake NVML and arbiterd's --sim-gpus give
 * device p the same one). */
static void uuid_text(int p, char *out, size_t cap) { snprintf(out, cap, "GPU-fa4e0000-0000-0000-0000-%012d", p); }

/* The physical device an entry of CUDA_VISIBLE_DEVICES names, or -1. As the CUDA Programming Guide (CUDA
 * Environment Variables, CUDA_VISIBLE_DEVICES) says: an integer index, or a GPU UUID in nvidia-smi's form or
 * any prefix of it (with "GPU-") that names one GPU alone. MIG entries are not modelled (-1). */
static int visible_entry(const char *e, size_t n) {
    char *end;
    if (n > 0 && ((e[0] >= '0' && e[0] <= '9') || e[0] == '-')) {
        long k = strtol(e, &end, 10);
        return (size_t)(end - e) == n && k >= 0 && k < D.nphys ? (int)k : -1;
    }
    if (n < 5 || strncmp(e, "GPU-", 4) != 0)
        return -1;
    int found = -1;
    for (int p = 0; p < D.nphys; p++) {
        char u[64];
        uuid_text(p, u, sizeof u);
        if (strlen(u) >= n && strncasecmp(u, e, n) == 0) {
            if (found >= 0)
                return -1; /* a prefix of more than one GPU names none */
            found = p;
        }
    }
    return found;
}

/* Fill D.phys from CUDA_VISIBLE_DEVICES and return the count: unset, every device in order; set, those it
 * names in its order, up to the first entry that is invalid (or names a device again); empty, none. */
static int visible_devices(const char *v) {
    if (!v) {
        for (int p = 0; p < D.nphys; p++)
            D.phys[p] = p;
        return D.nphys;
    }
    int n = 0;
    while (*v && n < MAX_DEVICES) {
        while (*v == ' ')
            v++;
        size_t len = strcspn(v, ",");
        size_t t = len;
        while (t && v[t - 1] == ' ')
            t--;
        int p = visible_entry(v, t);
        for (int k = 0; k < n && p >= 0; k++)
            if (D.phys[k] == p)
                p = -1;
        if (p < 0)
            break;
        D.phys[n++] = p;
        v += len + (v[len] == ',');
    }
    return n;
}

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&D.mu);
    if (!atomic_load(&D.inited)) {
        D.nphys = (int)env_long("FAKECUDA_DEVICES", 1);
        if (D.nphys > MAX_DEVICES)
            D.nphys = MAX_DEVICES;
        D.ndev = visible_devices(getenv("CUDA_VISIBLE_DEVICES"));
        D.sms = (int)env_long("FAKECUDA_SMS", 80);
        D.total = env_long("FAKECUDA_MEM_MB", 16384) * 1024LL * 1024LL;
        const char *trace = getenv("FAKECUDA_TRACE");
        if (trace && *trace)
            D.trace_fd = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        atomic_store(&D.inited, 1);
    }
    pthread_mutex_unlock(&D.mu);
    return D.ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    CHECK_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = D.ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    CHECK_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    CHECK_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "cgpu fake GPU %d", D.phys[d]);
    return CUDA_SUCCESS;
}

/* cuDeviceGetUuid (11.4 and later: _v2, which gives a MIG instance's own UUID; no MIG here, so the same) */
static CUresult device_uuid(CUuuid *uuid, CUdevice d) {
    CHECK_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    char text[64];
    uuid_text(D.phys[d], text, sizeof text);
    int k = 0;
    for (const char *c = text + 4; *c && k < 32; c++) {
        if (*c == '-')
            continue;
        int nib = *c <= '9' ? *c - '0' : (*c | 0x20) - 'a' + 10;
        uuid->bytes[k / 2] = (char)(k % 2 ? (uuid->bytes[k / 2] | nib) : nib << 4);
        k++;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d) { return device_uuid(uuid, d); }
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d) { return device_uuid(uuid, d); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    CHECK_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)D.total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice d) {
    CHECK_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (attrib != CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        return CUDA_ERROR_INVALID_VALUE; /* the only attribute modelled */
    *pi = D.sms;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */

static int push(CUcontext c) {
    if (ctx_depth == STACK_DEPTH)
        return -1;
    ctx_stack[ctx_depth++] = c;
    return 0;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d) {
    (void)flags;
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    CUcontext c = new_context(d, 0);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (push(c) < 0) {
        destroy_context(c);
        return CUDA_ERROR_UNKNOWN;
    }
    *pctx = c;
    return CUDA_SUCCESS;
}

/* CUDA 11.4's _v3 (execution affinity: SM counts) and 12.5's _v4 (CUctxCreateParams: affinity, CIG): their
 * parameters are not modelled; the context is cuCtxCreate_v2's. */
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *aff, int naff, unsigned int flags, CUdevice d) {
    if (naff < 0 || (naff > 0 && !aff))
        return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, d);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d) {
    (void)params;
    return cuCtxCreate_v2(pctx, flags, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    CHECK_INIT();
    if (!c || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int k = 0; k < ctx_depth; k++)
        if (ctx_stack[k] == c) { /* drop it from this thread's stack */
            memmove(&ctx_stack[k], &ctx_stack[k + 1], (size_t)(ctx_depth - k - 1) * sizeof c);
            ctx_depth--;
            k--;
        }
    wait_seq(c, c->enq_seq);
    destroy_context(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&D.mu);
    CUresult r = CUDA_SUCCESS;
    if (!D.primary[d])
        D.primary[d] = new_context(d, 1);
    else if (D.primary_refs[d] == 0 && footprint_take(d) != 0)
        r = CUDA_ERROR_OUT_OF_MEMORY; /* the reset context is made again (its footprint) */
    if (!D.primary[d])
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        D.primary_refs[d]++;
    *pctx = r == CUDA_SUCCESS ? D.primary[d] : NULL;
    pthread_mutex_unlock(&D.mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    CHECK_INIT();
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&D.mu);
    int ok = D.primary_refs[d] > 0;
    if (ok && --D.primary_refs[d] == 0)
        footprint_give(d); /* "the context is automatically reset once the last reference to it is released"
                            * (cuDevicePrimaryCtxRelease): its memory goes; the object is kept for the next retain */
    pthread_mutex_unlock(&D.mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    CHECK_INIT();
    if (!c) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth)
        ctx_stack[ctx_depth - 1] = c;
    else
        push(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    CHECK_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    return push(c) < 0 ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CHECK_INIT();
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    CHECK_INIT();
    CUcontext c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = c->dev;
    return CUDA_SUCCESS;
}

static int unsafe_call_prohibited(void);
static int context_capturing(CUcontext c);

EXPORT CUresult cuCtxSynchronize(void) {
    CHECK_INIT();
    CUcontext c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* both rules apply: a capture of this context forbids the sync in every mode (context_capturing), one of
     * another context only as the capture interaction modes say (unsafe_call_prohibited) */
    if (context_capturing(c) | unsafe_call_prohibited())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_seq(c, c->enq_seq);
    pools_at_sync(c->dev);
    return CUDA_SUCCESS;
}

/* ----------------------------------------------------------------- streams */

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
    (void)flags;
    CHECK_INIT();
    CUcontext c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ps)
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = c;
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!s || s == &s->ctx->null_stream)
        return CUDA_ERROR_INVALID_HANDLE;
    /* work already queued still runs; the stream object goes when it has */
    wait_seq(s->ctx, s->last_seq);
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    CHECK_INIT();
    int legacy = s == NULL || s == (CUstream)0x1;
    s = resolve_stream(s);
    if (!s)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (s->capturing)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (legacy && unsafe_call_prohibited())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_seq(s->ctx, s->last_seq);
    pools_at_sync(s->ctx->dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery(CUstream s) {
    CHECK_INIT();
    int legacy = s == NULL || s == (CUstream)0x1;
    s = resolve_stream(s);
    if (!s)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (legacy && unsafe_call_prohibited())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&s->ctx->mu);
    int done = s->ctx->done_seq >= s->last_seq;
    pthread_mutex_unlock(&s->ctx->mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* Stream capture's rules for "potentially unsafe" calls (cuThreadExchangeStreamCaptureMode in the driver API
 * reference): a thread in CU_STREAM_CAPTURE_MODE_GLOBAL (the default) may not make one while it has a capture of
 * its own not begun RELAXED, or while any other thread has a capture begun GLOBAL; in THREAD_LOCAL only its own
 * capture counts; in RELAXED nothing does. Such a call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the
 * capture it conflicts with is invalidated (its cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
 * Modelled for cuCtxSynchronize, and for cuStreamSynchronize and cuStreamQuery of the legacy stream. */
#define MAX_CAPTURES 64
static CUstream captures[MAX_CAPTURES];
static pthread_mutex_t captures_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int thread_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = thread_capture_mode;
    thread_capture_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

/* 1 when the calling thread may not make a potentially unsafe call now; the captures in the way are invalidated. */
static int unsafe_call_prohibited(void) {
    if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return 0;
    int prohibited = 0;
    pthread_mutex_lock(&captures_mu);
    for (int k = 0; k < MAX_CAPTURES; k++) {
        CUstream c = captures[k];
        if (!c)
            continue;
        int mine = pthread_equal(c->owner, pthread_self());
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
             thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            prohibited = 1;
        }
    }
    pthread_mutex_unlock(&captures_mu);
    return prohibited;
}

/* 1 when a stream of context c is being captured; those captures are invalidated. The CUDA Programming Guide, CUDA
 * Graphs, "Prohibited and Unhandled Operations": "It is also invalid to query the execution status of or synchronize
 * a broader handle which encompasses an active stream capture, such as a device or context handle when any
 * associated stream is in capture mode", and an invalid operation invalidates the capture. This holds whatever the
 * capture interaction mode: the modes govern potentially unsafe calls (above), not a sync of the capture's own
 * context (cuCtxSynchronize then fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture's
 * cuStreamEndCapture with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, as on a real driver). */
static int context_capturing(CUcontext c) {
    int found = 0;
    pthread_mutex_lock(&captures_mu);
    for (int k = 0; k < MAX_CAPTURES; k++)
        if (captures[k] && captures[k]->ctx == c) {
            captures[k]->invalidated = 1;
            found = 1;
        }
    pthread_mutex_unlock(&captures_mu);
    return found;
}

static void capture_list(CUstream s, int add) {
    pthread_mutex_lock(&captures_mu);
    for (int k = 0; k < MAX_CAPTURES; k++)
        if (captures[k] == (add ? NULL : s)) {
            captures[k] = add ? s : NULL;
            break;
        }
    pthread_mutex_unlock(&captures_mu);
}

static CUresult begin_capture(CUstream s, CUgraph into, int mode) {
    CHECK_INIT();
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    s = resolve_stream(s);
    if (!s || s == &s->ctx->null_stream)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (s->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    s->graph = into ? into : calloc(1, sizeof *s->graph);
    if (!s->graph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->to_graph = into != NULL;
    s->mode = mode;
    s->owner = pthread_self();
    s->invalidated = 0;
    s->capturing = 1;
    capture_list(s, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { return begin_capture(s, NULL, mode); }

/* CUDA 10.0's form, before the mode argument (cuGetProcAddress below version 10010): a global-mode capture. */
EXPORT CUresult cuStreamBeginCapture(CUstream s) { return begin_capture(s, NULL, CU_STREAM_CAPTURE_MODE_GLOBAL); }

/* CUDA 12.3: capture into the caller's graph (cuStreamBeginCaptureToGraph in the driver API reference), which
 * cuStreamEndCapture hands back. The fake's graph is a sequence of kernels: the dependencies are not modelled, the
 * captured kernels follow the graph's. */
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const void *deps, const void *data, size_t n,
                                            int mode) {
    (void)deps;
    (void)data;
    (void)n;
    return g ? begin_capture(s, g, mode) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *pg) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!s || !s->capturing || !pg)
        return CUDA_ERROR_INVALID_VALUE;
    capture_list(s, 0);
    s->capturing = 0;
    if (s->invalidated) {
        if (!s->to_graph) { /* the caller's own graph stays the caller's to destroy */
            gm_graph_release(s->graph);
            free(s->graph->nodes);
            free(s->graph);
        }
        s->graph = NULL;
        *pg = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *pg = s->graph;
    s->graph = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!s || !st)
        return CUDA_ERROR_INVALID_VALUE;
    *st = !s->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ events */

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
    (void)flags;
    CHECK_INIT();
    CUcontext c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    CUevent e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = c;
    *pe = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!e || !s)
        return CUDA_ERROR_INVALID_HANDLE;
    op *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_EVENT;
    o->ev = e;
    enqueue(s, o);
    e->seq = s->last_seq;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->ctx->mu);
    int done = e->ctx->done_seq >= e->seq; /* never recorded: complete, as the API says */
    pthread_mutex_unlock(&e->ctx->mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    wait_seq(e->ctx, e->seq);
    pools_at_sync(e->ctx->dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    CHECK_INIT();
    if (!ms || !start || !end)
        return CUDA_ERROR_INVALID_VALUE;
    if (!start->seq || !end->seq)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cuEventQuery(start) != CUDA_SUCCESS || cuEventQuery(end) != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(end->when - start->when) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    wait_seq(e->ctx, e->seq); /* the driver defers the free until the event completes */
    free(e);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ modules, launches */

EXPORT CUresult cuModuleLoadData(CUmodule *pm, const void *image) {
    CHECK_INIT();
    if (!pm || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    *pm = calloc(1, sizeof **pm);
    return *pm ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    CHECK_INIT();
    free(m);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *pf, CUmodule m, const char *name) {
    CHECK_INIT();
    if (!pf || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(name, fn_spin.name) == 0)
        *pf = &fn_spin;
    else if (strcmp(name, fn_null.name) == 0)
        *pf = &fn_null;
    else if (strcmp(name, fn_allreduce.name) == 0)
        *pf = &fn_allreduce;
    else
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

/* CUDA 12.3, cuFuncGetName: "Returns in **name the function name associated with the function handle hfunc";
 * CUDA_ERROR_INVALID_VALUE if either is NULL (CUDA Driver API, Execution Control). */
EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    CHECK_INIT();
    if (!name || !hfunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (hfunc != &fn_spin && hfunc != &fn_null && hfunc != &fn_allreduce)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = hfunc->name;
    return CUDA_SUCCESS;
}

/* Appends n kernel nodes to g's sequence. */
static CUresult graph_append(struct CUgraph_st *g, const struct gnode *nodes, int n) {
    if (g->n + n > g->cap) {
        int cap = g->cap ? g->cap : 16;
        while (cap < g->n + n)
            cap *= 2;
        struct gnode *grown = realloc(g->nodes, (size_t)cap * sizeof *grown);
        if (!grown)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = grown;
        g->cap = cap;
    }
    if (n)
        memcpy(g->nodes + g->n, nodes, (size_t)n * sizeof *nodes);
    g->n += n;
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, CUstream s, void **params) {
    CHECK_INIT();
    if (f != &fn_spin && f != &fn_null && f != &fn_allreduce)
        return CUDA_ERROR_INVALID_HANDLE;
    s = resolve_stream(s);
    if (!s)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (f == &fn_null)
        return CUDA_SUCCESS; /* no work: complete at launch */
    if (!params || !params[0])
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t ns = *(const uint64_t *)params[0]; /* parameters are copied at launch */
    if (s->capturing && s->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    int kind = f == &fn_allreduce ? OP_COLLECTIVE : OP_KERNEL;
    /* A capturing stream records the kernel as a node of its graph, the collective too: NCCL's collectives can be
     * captured since NCCL 2.9 (NCCL User Guide, "Using NCCL with CUDA Graphs": "NCCL's collective, P2P and group
     * operations all support CUDA Graph captures"; "The launch of a graph ... containing a captured NCCL operation
     * is considered collective for the same set of ranks that were present in the capture"). A replay runs it as
     * the collective it is: its k-th run on a device meets its peers' k-th collectives, captured or not. */
    if (s->capturing) {
        struct gnode node = {kind, ns};
        return graph_append(s->graph, &node, 1);
    }
    op *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = kind;
    o->ns = ns;
    return enqueue(s, o);
}

#define LAUNCH_KERNEL(name)                                                                                      \
    EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                         unsigned shmem, CUstream s, void **params, void **extra) {                              \
        (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;                    \
        return launch(f, s, params);                                                                             \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_COOP(name)                                                                                        \
    EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                         unsigned shmem, CUstream s, void **params) {                                            \
        (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;                                 \
        return launch(f, s, params);                                                                             \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                          \
    EXPORT CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) { \
        (void)extra;                                                                             \
        if (!cfg)                                                                                \
            return CUDA_ERROR_INVALID_VALUE;                                                     \
        return launch(f, cfg->hStream, params);                                                  \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags) {
    CHECK_INIT();
    if (!pe || !g)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraphExec e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->n = g->n;
    e->nodes = malloc((size_t)(g->n ? g->n : 1) * sizeof *e->nodes);
    if (!e->nodes) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (g->n)
        memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
    CUresult r = gm_instantiate(e, g, flags);
    if (r != CUDA_SUCCESS) {
        free(e->nodes);
        free(e);
        return r;
    }
    *pe = e;
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec e, CUstream s) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    s = resolve_stream(s);
    if (!s)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult mapped = gm_launch(e); /* its allocations backed by the graph memory pool, before it runs */
    if (mapped != CUDA_SUCCESS)
        return mapped;
    op *o = calloc(1, sizeof *o);
    struct CUgraphExec_st *copy = calloc(1, sizeof *copy); /* the queued launch owns a snapshot */
    struct gnode *nodes = malloc((size_t)(e->n ? e->n : 1) * sizeof *nodes);
    if (!o || !copy || !nodes) {
        free(o), free(copy), free(nodes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (e->n)
        memcpy(nodes, e->nodes, (size_t)e->n * sizeof *nodes);
    copy->n = e->n;
    copy->nodes = nodes;
    o->kind = OP_GRAPH;
    o->graph = copy;
    enqueue(s, o);
    gm_launched(e, s);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s); }

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    if (gm_exec_destroy(e)) /* kept until its live graph allocations are freed */
        return CUDA_SUCCESS;
    free(e->nodes);
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    CHECK_INIT();
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    gm_graph_release(g);
    free(g->nodes);
    free(g);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */

typedef struct block {
    void *p;
    size_t bytes;
    int dev;
    struct block *next;
} block;
static block *blocks;
static pthread_mutex_t blocks_mu = PTHREAD_MUTEX_INITIALIZER;

/* Take bytes of device dev's memory: 0, or -1 past its total. */
static int dev_take(int dev, size_t bytes) {
    int64_t before = atomic_fetch_add(&D.used[dev], (int64_t)bytes);
    if (before + (int64_t)bytes > D.total) {
        atomic_fetch_sub(&D.used[dev], (int64_t)bytes);
        return -1;
    }
    return 0;
}

/* A block of bytes on device dev, or in host memory (dev -1, not bounded by a device's total). */
static CUresult dev_alloc(int dev, size_t bytes, void **out) {
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0 && dev_take(dev, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    block *b = malloc(sizeof *b);
    void *p = malloc(bytes); /* pages are touched only when used */
    if (!b || !p) {
        free(b), free(p);
        if (dev >= 0)
            atomic_fetch_sub(&D.used[dev], (int64_t)bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->p = p;
    b->bytes = bytes;
    b->dev = dev;
    pthread_mutex_lock(&blocks_mu);
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&blocks_mu);
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult host_alloc(size_t bytes, void **out) { return dev_alloc(-1, bytes, out); }

/* Unlink the block at p; NULL when p is not an allocation. */
static block *take_block(void *p) {
    pthread_mutex_lock(&blocks_mu);
    block **pp = &blocks;
    while (*pp && (*pp)->p != p)
        pp = &(*pp)->next;
    block *b = *pp;
    if (b)
        *pp = b->next;
    pthread_mutex_unlock(&blocks_mu);
    if (b && b->dev >= 0)
        atomic_fetch_sub(&D.used[b->dev], (int64_t)b->bytes);
    return b;
}

static int current_dev(void) {
    CUcontext c = current();
    return c ? c->dev : -1;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    CHECK_INIT();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = current_dev();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    void *p;
    CUresult r = dev_alloc(dev, bytes, &p);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return r;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
    CHECK_INIT();
    if (!dptr || !pitch || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) / 512 * 512;
    CUresult r = cuMemAlloc_v2(dptr, p * height);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

static struct pool_block *take_pool_block(void *p);

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CHECK_INIT();
    CUresult graph = gm_free_outside(dptr); /* a graph allocation (graph memory nodes, below) */
    if (graph != CUDA_ERROR_NOT_FOUND)
        return graph;
    block *b = take_block((void *)(uintptr_t)dptr);
    struct pool_block *pb = b ? NULL : take_pool_block((void *)(uintptr_t)dptr);
    if (pb) { /* a pool's allocation, which the Programming Guide's Stream Ordered Memory Allocator lets cudaFree free:
               * back to its pool, after the work queued so far (a synchronous free) */
        CUcontext c = current();
        if (c)
            wait_seq(c, c->enq_seq);
        pool_return(pb);
        return CUDA_SUCCESS;
    }
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    free(b->p);
    free(b);
    return CUDA_SUCCESS;
}

/* cuMemAllocAsync and cuMemFreeAsync go through the stream's device's current memory pool (below). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUstream s);

static CUresult free_async(CUdeviceptr dptr, CUstream s) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!s)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (s->capturing) /* a free node of the graph (graph memory nodes, below) */
        return s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : gm_capture_free(s, dptr);
    CUresult graph = gm_free_outside(dptr);
    if (graph != CUDA_ERROR_NOT_FOUND)
        return graph;
    struct pool_block *pb = take_pool_block((void *)(uintptr_t)dptr);
    if (pb) {
        op *po = calloc(1, sizeof *po);
        if (!po) {
            pool_return(pb);
            return CUDA_SUCCESS;
        }
        po->kind = OP_FREE; /* back to its pool when the stream reaches this point */
        po->pb = pb;
        return enqueue(s, po);
    }
    block *b = take_block((void *)(uintptr_t)dptr);
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    op *o = calloc(1, sizeof *o);
    if (!o) {
        free(b->p);
        free(b);
        return CUDA_SUCCESS;
    }
    o->kind = OP_FREE; /* the memory goes when the stream reaches this point */
    o->mem = b->p;
    free(b);
    return enqueue(s, o);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { return free_async(d, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { return free_async(d, s); }

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    CHECK_INIT();
    if (!h || !prop || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* CUmemLocation (driver API reference, Virtual Memory Management): a device location's id is a device ordinal;
     * host memory (CU_MEM_LOCATION_TYPE_HOST, HOST_NUMA, HOST_NUMA_CURRENT: CUDA 12.2 and later) is the system's */
    int type = prop->location.type;
    if (type == CU_MEM_LOCATION_TYPE_HOST || type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
        type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        void *hp;
        CUresult hr = host_alloc(size, &hp);
        if (hr == CUDA_SUCCESS)
            *h = (CUmemGenericAllocationHandle)(uintptr_t)hp;
        return hr;
    }
    if (type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    void *p;
    CUresult r = dev_alloc(prop->location.id, size, &p);
    if (r == CUDA_SUCCESS)
        *h = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    CHECK_INIT();
    block *b = take_block((void *)(uintptr_t)h);
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    free(b->p);
    free(b);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    CHECK_INIT();
    int dev = current_dev();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    *total_b = (size_t)D.total;
    *free_b = (size_t)(D.total - atomic_load(&D.used[dev]));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CHECK_INIT();
    CUresult r = cuCtxSynchronize(); /* synchronous, ordered after earlier work */
    if (r == CUDA_SUCCESS)
        memcpy((void *)(uintptr_t)dst, src, n);
    return r;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CHECK_INIT();
    CUresult r = cuCtxSynchronize();
    if (r == CUDA_SUCCESS)
        memcpy(dst, (const void *)(uintptr_t)src, n);
    return r;
}

/* ------------------------------------------- memory pools, managed memory, arrays, context footprint
 *
 * Stream-ordered memory pools, as the CUDA Programming Guide ("Stream Ordered Memory Allocator": "Memory Pools",
 * "Physical Page Caching Behavior", "Explicit Release") and the driver API reference (Stream Ordered Memory
 * Allocator: cuMemAllocAsync, cuMemFreeAsync, cuMemPoolTrimTo, cuMemPoolDestroy; CUmemPool_attribute) describe them:
 *  - a pool holds memory from its device ("reserved"); an allocation takes from what the pool holds and the pool
 *    grows, at its own granularity ("the OS allocations may happen at different granularity from the user
 *    allocations"; 2 MiB here), when it lacks room; a free gives the bytes back to the pool, not to the device,
 *    in stream order: usable again at once by later work (its bytes leave "used" at the call), released to the
 *    device only once the stream has reached the free ("allocations that have been asynchronously freed but whose
 *    completion has not been observed on the host ... can count as outstanding": they do here, as `pending`);
 *  - "When more than the release threshold bytes of memory are held by the memory pool, the allocator will try to
 *    release memory back to the OS on the next call to stream, event or context synchronize" (the threshold is
 *    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0); it never releases what backs outstanding allocations;
 *  - cuMemPoolTrimTo(pool, keep) releases "until the pool contains fewer than minBytesToKeep reserved bytes, or
 *    there is no more memory that the allocator can safely release";
 *  - cuMemPoolDestroy: "if any pointers obtained from this pool haven't been freed ... the resources associated
 *    with the pool will be released automatically once there are no more outstanding allocations" (here at the
 *    last one's free: freed but not yet reached "can" count as outstanding, it need not); a device's default pool
 *    cannot be destroyed;
 *  - cuMemAllocAsync allocates from "the memory pool current to the stream's device", the device's default pool
 *    unless cuDeviceSetMemPool chose another (cuDeviceGetDefaultMemPool, cuDeviceGetMemPool).
 * Free space in a pool is one number (no fragmentation). A host-located pool (CU_MEM_LOCATION_TYPE_HOST*) takes
 * nothing from a device. */

#define POOL_GRANULE (2u << 20)

struct CUmemPoolHandle_st {
    int dev; /* visible ordinal; -1: host-located */
    int is_default, destroyed;
    size_t reserved, used, threshold, reserved_high, used_high;
    size_t pending; /* freed in stream order, the stream not there yet: still backed */
    int live;       /* allocations not yet freed */
    int reuse[4];
    int handle_types; /* CUmemPoolProps.handleTypes: exportable (IPC pools, below) */
    int imported;     /* cuMemPoolImportFromShareableHandle's: the exporter's memory, not this process's */
    struct CUmemPoolHandle_st *next;
};
struct pool_block {
    void *p;
    size_t bytes;
    struct CUmemPoolHandle_st *pool;
    struct pool_block *next;
};
static struct CUmemPoolHandle_st *pools, *default_pool[MAX_DEVICES], *current_pool[MAX_DEVICES];
static struct pool_block *pool_blocks;
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t round_granule(size_t n) { return (n + POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE; }

/* Under pools_mu: give back what pool holds beyond max(keep, what backs its live allocations). */
static void pool_release_to(struct CUmemPoolHandle_st *pool, size_t keep) {
    if (pool->handle_types || pool->imported)
        return; /* "IPC pools currently do not support releasing physical blocks back to the OS" */
    size_t floor_ = round_granule(pool->used + pool->pending);
    size_t target = keep > floor_ ? keep : floor_;
    if (pool->reserved <= target)
        return;
    if (pool->dev >= 0)
        atomic_fetch_sub(&D.used[pool->dev], (int64_t)(pool->reserved - target));
    pool->reserved = target;
}

/* Under pools_mu: a destroyed pool with nothing left allocated gives back all it holds. */
static void pool_release_all(struct CUmemPoolHandle_st *pool) {
    if (pool->dev >= 0 && !pool->imported)
        atomic_fetch_sub(&D.used[pool->dev], (int64_t)pool->reserved);
    pool->reserved = 0;
}

static void pool_unlink(struct CUmemPoolHandle_st *pool) {
    struct CUmemPoolHandle_st **pp = &pools;
    while (*pp && *pp != pool)
        pp = &(*pp)->next;
    if (*pp)
        *pp = pool->next;
}

/* Under pools_mu. */
static struct CUmemPoolHandle_st *pool_new(int dev, int is_default) {
    struct CUmemPoolHandle_st *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    pool->dev = dev;
    pool->is_default = is_default;
    pool->reuse[1] = pool->reuse[2] = pool->reuse[3] = 1;
    pool->next = pools;
    pools = pool;
    return pool;
}

/* Under pools_mu: the device's default pool, made at first use. */
static struct CUmemPoolHandle_st *default_of(int dev) {
    if (!default_pool[dev])
        default_pool[dev] = pool_new(dev, 1);
    return default_pool[dev];
}

static void pool_return(struct pool_block *pb) {
    pthread_mutex_lock(&pools_mu);
    struct CUmemPoolHandle_st *pool = pb->pool;
    pool->pending -= pb->bytes;
    if (pool->imported && !pool->destroyed) /* the import's mapping goes with it; the memory is the exporter's */
        pool->reserved -= pb->bytes;
    if (pool->destroyed && pool->live == 0 && pool->pending == 0) {
        pool_unlink(pool);
        free(pool);
    }
    pthread_mutex_unlock(&pools_mu);
    free(pb->p);
    free(pb);
}

static void pools_at_sync(int dev) {
    pthread_mutex_lock(&pools_mu);
    for (struct CUmemPoolHandle_st *pool = pools; pool; pool = pool->next)
        if (pool->dev == dev && pool->reserved > pool->threshold)
            pool_release_to(pool, pool->threshold);
    pthread_mutex_unlock(&pools_mu);
}

/* Unlink the pool allocation at p, freed in stream order: its bytes leave "used" for "pending" (pool_return ends
 * that when the stream reaches the free). NULL when p is none. */
static struct pool_block *take_pool_block(void *p) {
    pthread_mutex_lock(&pools_mu);
    struct pool_block **pp = &pool_blocks;
    while (*pp && (*pp)->p != p)
        pp = &(*pp)->next;
    struct pool_block *pb = *pp;
    if (pb) {
        struct CUmemPoolHandle_st *pool = pb->pool;
        *pp = pb->next;
        pool->used -= pb->bytes;
        pool->pending += pb->bytes;
        if (--pool->live == 0 && pool->destroyed)
            pool_release_all(pool);
    }
    pthread_mutex_unlock(&pools_mu);
    return pb;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t bytes, struct CUmemPoolHandle_st *pool, CUstream s) {
    if (!dptr || bytes == 0 || !pool || pool->imported)
        return CUDA_ERROR_INVALID_VALUE; /* "Allocating from an import pool is not allowed" (IPC Import Pool Limitations) */
    CUstream rs = resolve_stream(s);
    if (!rs)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (rs->capturing) /* an allocation node of the graph, not the pool's (graph memory nodes, below) */
        return rs->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : gm_capture_alloc(rs, bytes, pool->dev, dptr);
    struct pool_block *pb = malloc(sizeof *pb);
    void *p = malloc(bytes);
    if (!pb || !p) {
        free(pb), free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&pools_mu);
    size_t room = pool->reserved - pool->used;
    if (pool->destroyed) {
        pthread_mutex_unlock(&pools_mu);
        free(pb), free(p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (room < bytes) {
        size_t grow = round_granule(bytes - room);
        if (pool->dev >= 0 && dev_take(pool->dev, grow) != 0) {
            pthread_mutex_unlock(&pools_mu);
            free(pb), free(p);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pool->reserved += grow;
    }
    pool->used += bytes;
    pool->live++;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    pb->p = p;
    pb->bytes = bytes;
    pb->pool = pool;
    pb->next = pool_blocks;
    pool_blocks = pb;
    pthread_mutex_unlock(&pools_mu);
    *dptr = (CUdeviceptr)(uintptr_t)p; /* usable at once: earlier than stream order requires */
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    CHECK_INIT();
    CUstream rs = resolve_stream(s);
    if (!rs)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&pools_mu);
    int dev = rs->ctx->dev;
    struct CUmemPoolHandle_st *pool = current_pool[dev] ? current_pool[dev] : default_of(dev);
    pthread_mutex_unlock(&pools_mu);
    return pool ? pool_alloc(dptr, bytes, pool, s) : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s); }

#define ALLOC_FROM_POOL(name)                                                                    \
    EXPORT CUresult name(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s) {              \
        CHECK_INIT();                                                                            \
        return pool_alloc(d, n, pool, s);                                                        \
    }
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *out, const CUmemPoolProps *props) {
    CHECK_INIT();
    if (!out || !props || props->allocType != 1)
        return CUDA_ERROR_INVALID_VALUE;
    int type = props->location.type, dev = -1;
    if (type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (props->location.id < 0 || props->location.id >= D.ndev)
            return CUDA_ERROR_INVALID_DEVICE;
        dev = props->location.id;
    } else if (type != CU_MEM_LOCATION_TYPE_HOST && type != CU_MEM_LOCATION_TYPE_HOST_NUMA &&
               type != CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (props->handleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* the fake exports POSIX file descriptors only */
    pthread_mutex_lock(&pools_mu);
    *out = pool_new(dev, 0);
    if (*out)
        (*out)->handle_types = props->handleTypes;
    pthread_mutex_unlock(&pools_mu);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CHECK_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_mu);
    if (pool->is_default || pool->destroyed) {
        pthread_mutex_unlock(&pools_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (int d = 0; d < MAX_DEVICES; d++)
        if (current_pool[d] == pool)
            current_pool[d] = NULL; /* the device's current pool is its default again */
    pool->destroyed = 1;
    if (pool->live == 0)
        pool_release_all(pool);
    if (pool->live == 0 && pool->pending == 0) {
        pool_unlink(pool);
        free(pool);
    }
    pthread_mutex_unlock(&pools_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    CHECK_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_mu);
    if (pool->reserved > keep)
        pool_release_to(pool, keep);
    pthread_mutex_unlock(&pools_mu);
    return CUDA_SUCCESS;
}

/* The attributes' value types as CUmemPool_attribute lists them: int for the reuse flags, cuuint64_t for the rest;
 * the high-water marks may only be reset (to 0), the current amounts only read. */
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CHECK_INIT();
    if (!pool || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&pools_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: pool->reuse[attr] = *(const int *)value; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->threshold = (size_t) * (const cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
        break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pools_mu);
    return r;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CHECK_INIT();
    if (!pool || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&pools_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = pool->reuse[attr]; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pools_mu);
    return r;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *out, CUdevice d) {
    CHECK_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&pools_mu);
    *out = default_of(d);
    pthread_mutex_unlock(&pools_mu);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice d) {
    CHECK_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&pools_mu);
    *out = current_pool[d] ? current_pool[d] : default_of(d);
    pthread_mutex_unlock(&pools_mu);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* "The pool must be on the device": a pool of another device, or a host-located one, is refused. */
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
    CHECK_INIT();
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->dev != d || pool->destroyed || pool->imported) /* import pools "cannot be set current" */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_mu);
    current_pool[d] = pool;
    pthread_mutex_unlock(&pools_mu);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------- graph memory nodes
 *
 * The CUDA Programming Guide, "Graph Memory Nodes", and the driver API reference (Graph Management):
 *  - cuMemAllocAsync (or cuMemAllocFromPoolAsync) on a capturing stream, and cuGraphAddMemAllocNode, add an
 *    allocation node to the graph; "CUDA assigns virtual addresses for the graph allocation at node creation time"
 *    and they "are fixed for the lifetime of the allocation node" (the address is returned then; no device memory
 *    is taken). cuMemFreeAsync on a capturing stream, and cuGraphAddMemFreeNode, add a free node; it may free only
 *    an address "returned by an allocation node", once in a graph, else CUDA_ERROR_INVALID_VALUE
 *    (cuGraphAddMemFreeNode).
 *  - The memory comes from the device's graph memory pool, separate from the stream-ordered pools ("The graph
 *    memory pool is not exposed to the stream ordered memory allocator"). "Physical memory cannot be allocated or
 *    mapped during graph instantiation because the stream in which the graph will execute is unknown. Mapping is
 *    done instead during graph launch. Calling cudaGraphUpload can separate out the cost of allocation from the
 *    launch by performing all mappings for that graph immediately" (First Launch / cudaGraphUpload); "Physical
 *    mappings for a graph are retained between launches" (Performance Considerations). So the fake maps an
 *    executable graph's allocations at its upload or first launch: what the pool holds unmapped serves first, the
 *    rest is reserved from the device in 2 MiB granules (CUDA_ERROR_OUT_OF_MEMORY when the device lacks it, and the
 *    launch does not happen). Each executable graph maps its allocations' whole size: neither the reuse of an
 *    address within a graph nor the sharing of physical pages between graphs (both a "may") is modelled.
 *  - A launch makes the allocations without a free node in the graph live until freed outside it (cuMemFreeAsync,
 *    cuMemFree, or another graph's free node, taken at that graph's launch); "If any allocations created by
 *    hGraphExec remain unfreed (from a previous launch) and hGraphExec was not instantiated with
 *    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, the launch will fail with CUDA_ERROR_INVALID_VALUE"
 *    (cuGraphLaunch); with that flag the launch frees them first.
 *  - "destroying a graph which contains memory nodes (even if their allocations are free) will not immediately
 *    return physical memory to the OS"; cuDeviceGraphMemTrim "will unmap and release any physical memory reserved
 *    by graph memory nodes that is not actively in use. Allocations that have not been freed and graphs that are
 *    scheduled or running are considered to be actively using the physical memory" (Physical Memory Footprint):
 *    trim unmaps every executable graph of the device that is idle and has nothing live, then gives the device
 *    what the pool holds unmapped. A destroyed executable graph unmaps (its memory stays in the pool) once none of
 *    its allocations is live ("Graph destruction does not automatically free any live graph-allocated memory").
 *  - cuDeviceGetGraphMemAttribute: CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT "the amount of physical memory reserved
 *    by the driver for graph allocations", USED_MEM_CURRENT "the amount of physical memory currently mapped by at
 *    least one graph", and their high-water marks, which cuDeviceSetGraphMemAttribute may only reset to 0. */

struct gm_alloc {
    void *p;
    size_t bytes;
    int dev;                     /* -1: host-located (takes nothing from a device) */
    int refs;                    /* its graph and each executable graph instantiated from it */
    int live;                    /* made by a launch and not freed yet */
    struct CUgraphExec_st *by;   /* the executable graph whose launch made it live */
    struct gm_alloc *next;
};
static struct gm_alloc *gm_allocs;
static struct CUgraphExec_st *gm_execs;
static struct {
    size_t reserved, used, reserved_high, used_high;
} gm_pool[MAX_DEVICES];
static pthread_mutex_t gm_mu = PTHREAD_MUTEX_INITIALIZER;

static int gm_push(struct gm_list *l, struct gm_alloc *a) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        struct gm_alloc **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = a;
    return 0;
}

static int gm_has(const struct gm_list *l, const struct gm_alloc *a) {
    for (int k = 0; k < l->n; k++)
        if (l->v[k] == a)
            return 1;
    return 0;
}

/* Under gm_mu. */
static struct gm_alloc *gm_find(CUdeviceptr p) {
    struct gm_alloc *a = gm_allocs;
    while (a && (uintptr_t)a->p != (uintptr_t)p)
        a = a->next;
    return a;
}

/* Under gm_mu: one reference less; the allocation and its address go with the last. */
static void gm_unref(struct gm_alloc *a) {
    if (--a->refs > 0 || a->live)
        return;
    struct gm_alloc **pp = &gm_allocs;
    while (*pp != a)
        pp = &(*pp)->next;
    *pp = a->next;
    free(a->p);
    free(a);
}

static CUresult gm_node(struct CUgraph_st *g, size_t bytes, int dev, CUdeviceptr *out) {
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct gm_alloc *a = calloc(1, sizeof *a);
    void *p = malloc(bytes); /* the address range; pages are touched only when used */
    pthread_mutex_lock(&gm_mu);
    if (!a || !p || gm_push(&g->allocs, a) != 0) {
        pthread_mutex_unlock(&gm_mu);
        free(a), free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct gm_alloc){.p = p, .bytes = bytes, .dev = dev, .refs = 1, .next = gm_allocs};
    gm_allocs = a;
    pthread_mutex_unlock(&gm_mu);
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static CUresult gm_free_node(struct CUgraph_st *g, CUdeviceptr p) {
    pthread_mutex_lock(&gm_mu);
    struct gm_alloc *a = gm_find(p);
    CUresult r = !a || gm_has(&g->frees, a) ? CUDA_ERROR_INVALID_VALUE
                 : gm_push(&g->frees, a) != 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        a->refs++;
    pthread_mutex_unlock(&gm_mu);
    return r;
}

static CUresult gm_capture_alloc(CUstream s, size_t bytes, int dev, CUdeviceptr *out) {
    return gm_node(s->graph, bytes, dev, out);
}
static CUresult gm_capture_free(CUstream s, CUdeviceptr p) { return gm_free_node(s->graph, p); }

/* Under gm_mu: what exec e's allocations take on device dev. */
static size_t gm_need(const struct CUgraphExec_st *e, int dev) {
    size_t n = 0;
    for (int k = 0; k < e->allocs.n; k++)
        if (e->allocs.v[k]->dev == dev)
            n += e->allocs.v[k]->bytes;
    return n;
}

/* Under gm_mu: back e's allocations with the graph memory pool; CUDA_ERROR_OUT_OF_MEMORY, and nothing changed,
 * when a device lacks what the pool must reserve. An executable graph updated while mapped maps anew: what it
 * mapped before serves first. */
static CUresult gm_map(struct CUgraphExec_st *e) {
    if (e->mapped && !e->remap)
        return CUDA_SUCCESS;
    size_t grown[MAX_DEVICES] = {0};
    for (int d = 0; d < D.ndev; d++) {
        size_t need = gm_need(e, d), room = gm_pool[d].reserved - gm_pool[d].used + (e->mapped ? e->maps[d] : 0);
        if (need <= room)
            continue;
        grown[d] = round_granule(need - room);
        if (dev_take(d, grown[d]) != 0) {
            for (int u = 0; u < d; u++)
                atomic_fetch_sub(&D.used[u], (int64_t)grown[u]);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    for (int d = 0; d < D.ndev; d++) {
        gm_pool[d].reserved += grown[d];
        gm_pool[d].used -= e->mapped ? e->maps[d] : 0;
        e->maps[d] = gm_need(e, d);
        gm_pool[d].used += e->maps[d];
        if (gm_pool[d].reserved > gm_pool[d].reserved_high)
            gm_pool[d].reserved_high = gm_pool[d].reserved;
        if (gm_pool[d].used > gm_pool[d].used_high)
            gm_pool[d].used_high = gm_pool[d].used;
    }
    e->mapped = 1;
    e->remap = 0;
    return CUDA_SUCCESS;
}

/* Under gm_mu: e's mappings go back to the pool (which keeps the memory). */
static void gm_unmap(struct CUgraphExec_st *e) {
    if (!e->mapped)
        return;
    for (int d = 0; d < D.ndev; d++) {
        gm_pool[d].used -= e->maps[d];
        e->maps[d] = 0;
    }
    e->mapped = e->remap = 0;
}

static int gm_live_of(const struct CUgraphExec_st *e) {
    int n = 0;
    for (int k = 0; k < e->allocs.n; k++)
        n += e->allocs.v[k]->live && e->allocs.v[k]->by == e;
    return n;
}

/* Under gm_mu: forget e for good (unmapped, references dropped). */
/* e lets go of its allocation and free nodes (their lists freed; a node no graph or exec holds is gone). */
static void gm_exec_drop_nodes(struct CUgraphExec_st *e) {
    for (int k = 0; k < e->allocs.n; k++)
        gm_unref(e->allocs.v[k]);
    for (int k = 0; k < e->frees.n; k++)
        gm_unref(e->frees.v[k]);
    free(e->allocs.v);
    free(e->frees.v);
}

static void gm_exec_free(struct CUgraphExec_st *e) {
    gm_unmap(e);
    struct CUgraphExec_st **pp = &gm_execs;
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    gm_exec_drop_nodes(e);
}

/* Under gm_mu: allocation a is freed (its lifetime ends); a destroyed executable graph goes with its last. */
static void gm_end_life(struct gm_alloc *a) {
    struct CUgraphExec_st *by = a->by;
    a->live = 0;
    a->by = NULL;
    if (by && by->destroyed && gm_live_of(by) == 0) {
        gm_exec_free(by);
        free(by->nodes);
        free(by);
    }
}

static CUresult gm_free_outside(CUdeviceptr p) {
    pthread_mutex_lock(&gm_mu);
    struct gm_alloc *a = gm_find(p);
    CUresult r = !a ? CUDA_ERROR_NOT_FOUND : a->live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        a->refs++; /* held across gm_end_life, which may drop the executable graph's reference */
        gm_end_life(a);
        gm_unref(a);
    }
    pthread_mutex_unlock(&gm_mu);
    return r;
}

static void gm_graph_release(struct CUgraph_st *g) {
    pthread_mutex_lock(&gm_mu);
    if (g->inst)
        g->inst->from = NULL;
    g->inst = NULL;
    for (int k = 0; k < g->allocs.n; k++)
        gm_unref(g->allocs.v[k]);
    for (int k = 0; k < g->frees.n; k++)
        gm_unref(g->frees.v[k]);
    pthread_mutex_unlock(&gm_mu);
    free(g->allocs.v);
    free(g->frees.v);
    g->allocs = g->frees = (struct gm_list){0};
}

/* A graph with memory nodes has at most one executable graph at a time: "Only one instantiation of the graph may
 * exist at any point in time" (cuGraphAddMemFreeNode's restrictions on graphs with allocation or free nodes, driver
 * API reference); cuGraphInstantiate names no error code for a second one: CUDA_ERROR_INVALID_VALUE here. Once
 * cuGraphExecDestroy destroyed the first (even with allocations of it still live), another may be made. */
static CUresult gm_instantiate(CUgraphExec e, CUgraph g, unsigned long long flags) {
    e->flags = flags;
    if (!g->allocs.n && !g->frees.n)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&gm_mu);
    if (g->inst) {
        pthread_mutex_unlock(&gm_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int ok = 1;
    for (int k = 0; ok && k < g->allocs.n; k++)
        ok = gm_push(&e->allocs, g->allocs.v[k]) == 0;
    for (int k = 0; ok && k < g->frees.n; k++)
        ok = gm_push(&e->frees, g->frees.v[k]) == 0;
    if (ok) {
        for (int k = 0; k < e->allocs.n; k++)
            e->allocs.v[k]->refs++;
        for (int k = 0; k < e->frees.n; k++)
            e->frees.v[k]->refs++;
        e->next = gm_execs;
        gm_execs = e;
        e->from = g;
        g->inst = e;
    } else {
        free(e->allocs.v);
        free(e->frees.v);
    }
    pthread_mutex_unlock(&gm_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Before e's launch is queued: its unfreed allocations of a previous launch (an error, or freed with
 * AUTO_FREE_ON_LAUNCH), then its mappings. */
static CUresult gm_launch(CUgraphExec e) {
    if (!e->allocs.n && !e->frees.n)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&gm_mu);
    CUresult r = CUDA_SUCCESS;
    if (gm_live_of(e) && !(e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
        r = CUDA_ERROR_INVALID_VALUE;
    else
        r = gm_map(e);
    if (r == CUDA_SUCCESS) {
        for (int k = 0; k < e->allocs.n; k++)
            if (e->allocs.v[k]->live && e->allocs.v[k]->by == e)
                gm_end_life(e->allocs.v[k]); /* AUTO_FREE_ON_LAUNCH */
        for (int k = 0; k < e->frees.n; k++)
            if (!gm_has(&e->allocs, e->frees.v[k]) && e->frees.v[k]->live)
                gm_end_life(e->frees.v[k]); /* another graph's allocation, freed by this one */
        for (int k = 0; k < e->allocs.n; k++)
            if (!gm_has(&e->frees, e->allocs.v[k])) {
                e->allocs.v[k]->live = 1;
                e->allocs.v[k]->by = e;
            }
    }
    pthread_mutex_unlock(&gm_mu);
    return r;
}

static void gm_launched(CUgraphExec e, CUstream s) {
    if (!e->allocs.n && !e->frees.n)
        return;
    pthread_mutex_lock(&gm_mu);
    e->ctx = s->ctx;
    e->seq = s->last_seq;
    pthread_mutex_unlock(&gm_mu);
}

/* 1 when e stays (its live allocations keep it mapped): it is freed with the last of them. */
static int gm_exec_destroy(CUgraphExec e) {
    if (!e->allocs.n && !e->frees.n)
        return 0;
    pthread_mutex_lock(&gm_mu);
    if (e->from)
        e->from->inst = NULL;
    e->from = NULL;
    int stays = gm_live_of(e) > 0;
    if (stays)
        e->destroyed = 1;
    else
        gm_exec_free(e);
    pthread_mutex_unlock(&gm_mu);
    return stays;
}

EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags) {
    CHECK_INIT();
    if (!pg || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pg = calloc(1, sizeof **pg);
    return *pg ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The fake's graph has no dependencies: a memory node's node handle is its allocation's record. */
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    (void)deps, (void)ndeps;
    CHECK_INIT();
    if (!node || !g || !params || params->poolProps.allocType != 1)
        return CUDA_ERROR_INVALID_VALUE;
    int type = params->poolProps.location.type, dev = params->poolProps.location.id;
    if (type != CU_MEM_LOCATION_TYPE_DEVICE || dev < 0 || dev >= D.ndev)
        return CUDA_ERROR_INVALID_VALUE; /* device-located allocations only, as the Programming Guide shows them */
    CUresult r = gm_node(g, params->bytesize, dev, &params->dptr);
    if (r == CUDA_SUCCESS)
        *node = (CUgraphNode)(uintptr_t)params->dptr;
    return r;
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                      CUdeviceptr p) {
    (void)deps, (void)ndeps;
    CHECK_INIT();
    if (!node || !g)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = gm_free_node(g, p);
    if (r == CUDA_SUCCESS)
        *node = (CUgraphNode)(uintptr_t)p;
    return r;
}

/* Graphs holding memory nodes can be neither cloned nor embedded. cuGraphAddMemFreeNode in the driver API reference
 * (Graph Management): "The following restrictions apply to graphs which contain allocation and/or memory free
 * nodes: ... The graph cannot be used in a child node. ... The graph cannot be cloned."; cuGraphClone: "Cloning is
 * not supported for graphs which contain memory allocation nodes, memory free nodes, or conditional nodes";
 * cuGraphAddChildGraphNode: "If childGraph contains allocation nodes, free nodes, or conditional nodes, this call
 * will return an error" (its only listed error for a valid call is CUDA_ERROR_INVALID_VALUE, which both return
 * here). So every graph memory node belongs to a graph made by capture or cuGraphCreate, and the graph memory pool
 * serves only those graphs' executable graphs. */
static int gm_has_nodes(const struct CUgraph_st *g) { return g->allocs.n > 0 || g->frees.n > 0; }


/* cuGraphClone: "creates a copy of originalGraph ... All parameters are copied into the cloned graph. The original
 * graph may be modified after this call without affecting the clone." */
EXPORT CUresult cuGraphClone(CUgraph *pg, CUgraph orig) {
    CHECK_INIT();
    if (!pg || !orig || gm_has_nodes(orig))
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (graph_append(c, orig->nodes, orig->n) != CUDA_SUCCESS) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pg = c;
    return CUDA_SUCCESS;
}

/* cuGraphAddChildGraphNode: "The node executes an embedded child graph. The child graph is cloned in this call." The
 * fake's graph is a sequence: the child's kernels follow the graph's. Memory nodes may still be added to hGraph
 * (the restriction is on the child). The node handle is a non-null tag: the fake's graph keeps no nodes. */
EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                         CUgraph child) {
    (void)deps, (void)ndeps;
    CHECK_INIT();
    if (!node || !g || !child || gm_has_nodes(child))
        return CUDA_ERROR_INVALID_VALUE;
    struct gnode *nodes = malloc((size_t)(child->n ? child->n : 1) * sizeof *nodes); /* child may be g itself */
    if (!nodes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (child->n)
        memcpy(nodes, child->nodes, (size_t)child->n * sizeof *nodes);
    CUresult r = graph_append(g, nodes, child->n);
    free(nodes);
    if (r == CUDA_SUCCESS)
        *node = (CUgraphNode)(uintptr_t)(g->n + 1);
    return r;
}

/* CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD uploads into hUploadStream at instantiation; the result codes are not
 * modelled. */
static CUresult graph_upload(CUgraphExec e, CUstream s);
static CUresult instantiate_with_params(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CHECK_INIT();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuGraphInstantiateWithFlags(pe, g, p->flags & ~(cuuint64_t)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    if (r == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) &&
        (r = graph_upload(*pe, p->hUploadStream)) != CUDA_SUCCESS) {
        cuGraphExecDestroy(*pe);
        *pe = NULL;
    }
    return r;
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate_with_params(pe, g, p);
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate_with_params(pe, g, p);
}

static CUresult graph_upload(CUgraphExec e, CUstream s) {
    CHECK_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    if (!resolve_stream(s))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!e->allocs.n)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&gm_mu);
    CUresult r = gm_map(e);
    pthread_mutex_unlock(&gm_mu);
    return r;
}
EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) { return graph_upload(e, s); }
EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { return graph_upload(e, s); }

/* cuGraphExecUpdate (driver API reference, Graph Management) "Updates the node parameters in the instantiated graph
 * specified by hGraphExec with the node parameters in a topologically identical graph specified by hGraph";
 * CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED when "The count of nodes directly in hGraphExec and hGraph differ"
 * (errorNode NULL), CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED "if the type of a node changed", and
 * CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE for every refusal. The fake's graph is a sequence of kernels and its memory
 * nodes: the nodes are paired by kind and order (its dependencies are not modelled, nor is errorNode of a type
 * change). Its limitations list nothing for memory nodes, so an allocation node's size may change; the Programming
 * Guide's "Graph Update Limitations" has one for them: "It is not possible to update a cudaGraphExec_t with a
 * cudaGraph_t if the cudaGraph_t is currently instantiated as a different cudaGraphExec_t" (CU_GRAPH_EXEC_UPDATE_ERROR
 * here, no code being named). The executable graph then holds hGraph's allocations: hGraph counts as instantiated
 * as it (its previous graph no longer does). Mapping is done at upload or launch ("First Launch /
 * cudaGraphUpload"): an executable graph updated while mapped keeps its mapping until its next upload or launch
 * maps the new sizes (a trim may unmap it before). CUDA documents nothing for an update while allocations of the
 * executable graph's previous launch are live: the fake refuses it (CU_GRAPH_EXEC_UPDATE_ERROR) rather than guess
 * whose allocations they become. A node that runs the collective is a kernel node as a spin's is: the update's
 * limitations for kernel nodes (owning context, dynamic parallelism, device-side graph launch, cooperativeness)
 * leave the function free to change (CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED is for drivers before 11.2), so an update may turn a spin node into the collective or back, and the counts
 * compared by kind are kernel nodes and allocation nodes. */
static CUgraphExecUpdateResult gm_update(CUgraphExec e, CUgraph g) {
    if (!gm_has_nodes(g))
        return CU_GRAPH_EXEC_UPDATE_SUCCESS; /* nor has e: the counts matched */
    pthread_mutex_lock(&gm_mu);
    struct gm_list allocs = {0}, frees = {0};
    int ok = (!g->inst || g->inst == e) && gm_live_of(e) == 0;
    for (int k = 0; ok && k < g->allocs.n; k++)
        ok = gm_push(&allocs, g->allocs.v[k]) == 0;
    for (int k = 0; ok && k < g->frees.n; k++)
        ok = gm_push(&frees, g->frees.v[k]) == 0;
    if (ok) {
        for (int k = 0; k < allocs.n; k++)
            allocs.v[k]->refs++;
        for (int k = 0; k < frees.n; k++)
            frees.v[k]->refs++;
        gm_exec_drop_nodes(e);
        e->allocs = allocs;
        e->frees = frees;
        if (e->from)
            e->from->inst = NULL;
        e->from = g;
        g->inst = e;
        e->remap = e->mapped;
    } else {
        free(allocs.v);
        free(frees.v);
    }
    pthread_mutex_unlock(&gm_mu);
    return ok ? CU_GRAPH_EXEC_UPDATE_SUCCESS : CU_GRAPH_EXEC_UPDATE_ERROR;
}

static CUresult exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    CHECK_INIT();
    CUgraphExecUpdateResultInfo out = {.result = CU_GRAPH_EXEC_UPDATE_ERROR}; /* "if passed an invalid value" */
    if (e && g && e->n + e->allocs.n + e->frees.n != g->n + g->allocs.n + g->frees.n)
        out.result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    else if (e && g && (e->n != g->n || e->allocs.n != g->allocs.n))
        out.result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
    else if (e && g && (out.result = gm_update(e, g)) == CU_GRAPH_EXEC_UPDATE_SUCCESS && g->n)
        memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes); /* the kernels and their parameters */
    if (info)
        *info = out;
    return out.result == CU_GRAPH_EXEC_UPDATE_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}
EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    return exec_update(e, g, info);
}
/* CUDA 10.2 to 11's ABI, which cuda.h of CUDA 12 keeps under this name: the result in two out-parameters. */
EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *error_node,
                                  CUgraphExecUpdateResult *result) {
    CUgraphExecUpdateResultInfo info = {.result = CU_GRAPH_EXEC_UPDATE_ERROR};
    CUresult r = exec_update(e, g, &info);
    if (error_node)
        *error_node = info.errorNode;
    if (result)
        *result = info.result;
    return r;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
    CHECK_INIT();
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&gm_mu);
    for (struct CUgraphExec_st *e = gm_execs; e; e = e->next) {
        int busy = 0;
        if (e->ctx) {
            pthread_mutex_lock(&e->ctx->mu);
            busy = e->ctx->done_seq < e->seq; /* scheduled or running */
            pthread_mutex_unlock(&e->ctx->mu);
        }
        if (e->mapped && !busy && gm_live_of(e) == 0 && e->maps[d] > 0)
            gm_unmap(e);
    }
    size_t keep = round_granule(gm_pool[d].used);
    if (gm_pool[d].reserved > keep) {
        atomic_fetch_sub(&D.used[d], (int64_t)(gm_pool[d].reserved - keep));
        gm_pool[d].reserved = keep;
    }
    pthread_mutex_unlock(&gm_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void *value) {
    CHECK_INIT();
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || attr < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT || attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&gm_mu);
    size_t v[] = {gm_pool[d].used, gm_pool[d].used_high, gm_pool[d].reserved, gm_pool[d].reserved_high};
    pthread_mutex_unlock(&gm_mu);
    *(cuuint64_t *)value = v[attr];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void *value) {
    CHECK_INIT();
    if (d < 0 || d >= D.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || *(const cuuint64_t *)value != 0 ||
        (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))
        return CUDA_ERROR_INVALID_VALUE; /* "High watermark can only be reset to zero" */
    pthread_mutex_lock(&gm_mu);
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        gm_pool[d].used_high = gm_pool[d].used;
    else
        gm_pool[d].reserved_high = gm_pool[d].reserved;
    pthread_mutex_unlock(&gm_mu);
    return CUDA_SUCCESS;
}

/* The capture's status and graph (cuStreamGetCaptureInfo_v2 in the driver API reference); the id is the stream's
 * and the dependencies are not modelled (none). */
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps) {
    CHECK_INIT();
    s = resolve_stream(s);
    if (!s || !st)
        return CUDA_ERROR_INVALID_VALUE;
    cuStreamIsCapturing(s, st);
    if (id)
        *id = (cuuint64_t)(uintptr_t)s;
    if (graph)
        *graph = s->capturing ? s->graph : NULL;
    if (deps)
        *deps = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- IPC memory pools
 *
 * The CUDA Programming Guide, "Stream Ordered Memory Allocator", "IPC Memory Pools", and the driver API reference
 * (cuMemPoolExportToShareableHandle, cuMemPoolImportFromShareableHandle, cuMemPoolExportPointer,
 * cuMemPoolImportPointer):
 *  - a pool created with CUmemPoolProps.handleTypes can be exported as a shareable handle (here a POSIX file
 *    descriptor: a memfd naming the pool's device), and each of its allocations as CUmemPoolPtrExportData;
 *  - another process imports the pool from the handle and then the allocations from their export data; the memory
 *    stays the exporter's: the import takes nothing from the device (the fake's device books are per process, so
 *    the importer's books do not grow) and "The resource usage stat attribute queries only reflect the
 *    allocations imported into the process and the associated physical memory" (IPC Import Pool Limitations): an
 *    import pool's reserved and used memory are its imported allocations until they are freed;
 *  - "Allocating from an import pool is not allowed; specifically, import pools cannot be set current and cannot
 *    be used in the cudaMallocFromPoolAsync API" (CUDA_ERROR_INVALID_VALUE here);
 *  - "IPC pools currently do not support releasing physical blocks back to the OS. As a result the
 *    cudaMemPoolTrimTo API acts as a no-op and the cudaMemPoolAttrReleaseThreshold effectively gets ignored"
 *    (IPC Export Pool Limitations): an exportable pool gives memory back only when destroyed.
 * One process may import its own export (the handle is any descriptor of the memfd: /proc/PID/fd/N of the
 * exporter opened by another process, as the tests pass it). */

#define IPC_MAGIC 0x66616b65636d7070ULL /* "fakecmpp" */
struct ipc_pool_id {
    uint64_t magic;
    int32_t dev, pid;
};
struct ipc_ptr_id {
    uint64_t magic;
    uint64_t bytes;
};

EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType type,
                                                 unsigned long long flags) {
    CHECK_INIT();
    if (!handle_out || !pool || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !(pool->handle_types & type) || pool->dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fakecuda-pool", MFD_CLOEXEC);
    struct ipc_pool_id id = {IPC_MAGIC, pool->dev, (int32_t)getpid()};
    if (fd < 0 || write(fd, &id, sizeof id) != (ssize_t)sizeof id) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle_out = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *out, void *handle, CUmemAllocationHandleType type,
                                                   unsigned long long flags) {
    CHECK_INIT();
    struct ipc_pool_id id;
    int fd = (int)(intptr_t)handle;
    if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        pread(fd, &id, sizeof id, 0) != (ssize_t)sizeof id || id.magic != IPC_MAGIC || id.dev < 0 ||
        id.dev >= D.ndev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_mu);
    *out = pool_new(id.dev, 0);
    if (*out)
        (*out)->imported = 1;
    pthread_mutex_unlock(&pools_mu);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *out, CUdeviceptr p) {
    CHECK_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_mu);
    struct pool_block *pb = pool_blocks;
    while (pb && (uintptr_t)pb->p != (uintptr_t)p)
        pb = pb->next;
    int ok = pb && pb->pool->handle_types && !pb->pool->imported;
    struct ipc_ptr_id id = {IPC_MAGIC, ok ? pb->bytes : 0};
    pthread_mutex_unlock(&pools_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    memset(out, 0, sizeof *out);
    memcpy(out->reserved, &id, sizeof id);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *out, CUmemoryPool pool, CUmemPoolPtrExportData *data) {
    CHECK_INIT();
    struct ipc_ptr_id id;
    if (!out || !pool || !data || !pool->imported)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(&id, data->reserved, sizeof id);
    if (id.magic != IPC_MAGIC || id.bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool_block *pb = malloc(sizeof *pb);
    void *p = malloc(id.bytes); /* the importer's mapping of the exporter's memory */
    if (!pb || !p) {
        free(pb), free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&pools_mu);
    pool->reserved += id.bytes;
    pool->used += id.bytes;
    pool->live++;
    *pb = (struct pool_block){.p = p, .bytes = id.bytes, .pool = pool, .next = pool_blocks};
    pool_blocks = pb;
    pthread_mutex_unlock(&pools_mu);
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Managed memory (cuMemAllocManaged in the driver API reference: bytesize 0 and flags other than
 * CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST are CUDA_ERROR_INVALID_VALUE). Modelled as resident on the current
 * context's device for its whole life (no migration, no oversubscription); freed by cuMemFree. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    CHECK_INIT();
    if (!dptr || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    int dev = current_dev();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    void *p;
    CUresult r = dev_alloc(dev, bytes, &p);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return r;
}

/* Arrays. CUDA_ARRAY3D_DESCRIPTOR (driver API reference, cuArray3DCreate): Width, Height and Depth are "the width,
 * height, and depth of the CUDA array (in elements)" (Height 0 for a 1D array, Depth 0 for 1D and 2D); Format is
 * the type of each channel (CU_AD_FORMAT_UNSIGNED_INT8 ... CU_AD_FORMAT_FLOAT: 8-, 16- or 32-bit integers, 16-bit
 * half and 32-bit float) and NumChannels "the number of packed components per CUDA array element; it may be 1,
 * 2, or 4". An element is NumChannels channels of its format's size; an array holds Width x Height x Depth of
 * them, unpadded here. A mipmapped array (cuMipmappedArrayCreate) has numMipmapLevels levels, each half the
 * previous in every dimension (at least 1), at most 1 + floor(log2(the largest dimension)) of them. Only the
 * formats above are modelled; the others are CUDA_ERROR_INVALID_VALUE. */
static size_t channel_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

/* Bytes of the array the descriptor describes at mipmap level `level`; 0 when the descriptor is invalid. */
static size_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned level) {
    size_t cb = channel_bytes(f);
    if (w == 0 || cb == 0 || (ch != 1 && ch != 2 && ch != 4) || (d && !h))
        return 0;
    w = w >> level ? w >> level : 1;
    h = h ? (h >> level ? h >> level : 1) : 1;
    d = d ? (d >> level ? d >> level : 1) : 1;
    return w * h * d * cb * ch;
}

static CUresult array_alloc(CUarray *out, size_t bytes) {
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = current_dev();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    void *p;
    CUresult r = dev_alloc(dev, bytes, &p);
    if (r == CUDA_SUCCESS)
        *out = (CUarray)p;
    return r;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *a) {
    CHECK_INIT();
    return array_alloc(out, a ? array_bytes(a->Width, a->Height, 0, a->Format, a->NumChannels, 0) : 0);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *a) {
    CHECK_INIT();
    return array_alloc(out, a ? array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels, 0) : 0);
}

static CUresult array_free(void *p) {
    CHECK_INIT();
    block *b = take_block(p);
    if (!b)
        return CUDA_ERROR_INVALID_HANDLE;
    free(b->p);
    free(b);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return array_free(a); }

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels) {
    CHECK_INIT();
    if (!out || !a || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t big = a->Width > a->Height ? a->Width : a->Height;
    big = big > a->Depth ? big : a->Depth;
    unsigned most = 1;
    while (big >> most)
        most++;
    if (levels > most)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    for (unsigned l = 0; l < levels; l++) {
        size_t n = array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels, l);
        if (n == 0)
            return CUDA_ERROR_INVALID_VALUE;
        bytes += n;
    }
    return array_alloc((CUarray *)out, bytes);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return array_free(m); }

/* A context's own device memory (FAKECUDA_CTX_MB, default 0): what a real context takes at creation (code, local
 * memory, the printf FIFO, the malloc heap: 0.3 to 0.6 GB on current GPUs) and gives back when destroyed. */
static int footprint_take(int dev) {
    int64_t n = env_long("FAKECUDA_CTX_MB", 0) * 1024LL * 1024LL;
    return n > 0 && dev_take(dev, (size_t)n) != 0 ? -1 : 0;
}
static void footprint_give(int dev) {
    int64_t n = env_long("FAKECUDA_CTX_MB", 0) * 1024LL * 1024LL;
    if (n > 0)
        atomic_fetch_sub(&D.used[dev], n);
}

/* For the fake NVML only (not a driver entry point): what this process holds on physical device phys, so that
 * nvmlDeviceGetMemoryInfo counts it as the real NVML counts every context's and allocation's memory. */
EXPORT int64_t fakecuda_used_bytes(int phys) {
    int64_t n = 0;
    for (int k = 0; atomic_load(&D.inited) && k < D.ndev; k++)
        if (D.phys[k] == phys)
            n += atomic_load(&D.used[k]);
    return n;
}

/* ------------------------------------------------------------------- errors */

static const struct { CUresult code; const char *name, *text; } errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
};

static CUresult error_lookup(CUresult e, const char **out, int text) {
    for (size_t k = 0; k < sizeof errors / sizeof errors[0]; k++)
        if (errors[k].code == e) {
            *out = text ? errors[k].text : errors[k].name;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    return s ? error_lookup(e, s, 0) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    return s ? error_lookup(e, s, 1) : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------- cuGetProcAddress */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

/* base name -> (entry before `split`, entry from `split` on, per-thread-stream entry) */
static const struct {
    const char *base;
    void *old, *cur, *ptsz;
    int split;
} procs[] = {
#define P(name) {#name, NULL, (void *)name, NULL, 0}
#define PT(name) {#name, NULL, (void *)name, (void *)name##_ptsz, 0}
#define V2(name, split) {#name, NULL, (void *)name##_v2, NULL, split}
    PT(cuLaunchKernel), PT(cuLaunchKernelEx), PT(cuLaunchCooperativeKernel), PT(cuGraphLaunch),
    PT(cuMemAllocAsync), PT(cuMemFreeAsync), V2(cuMemAlloc, 3020), V2(cuMemAllocPitch, 3020),
    V2(cuMemFree, 3020), V2(cuMemGetInfo, 3020), V2(cuDeviceTotalMem, 3020), V2(cuCtxCreate, 3020),
    V2(cuCtxDestroy, 4000), V2(cuCtxPushCurrent, 4000), V2(cuCtxPopCurrent, 4000), V2(cuStreamDestroy, 4000),
    V2(cuEventDestroy, 4000), V2(cuMemcpyHtoD, 3020), V2(cuMemcpyDtoH, 3020),
    V2(cuDevicePrimaryCtxRelease, 11000), {"cuStreamBeginCapture", (void *)cuStreamBeginCapture,
                                           (void *)cuStreamBeginCapture_v2, NULL, 10010},
    {"cuGetProcAddress", (void *)cuGetProcAddress, (void *)cuGetProcAddress_v2, NULL, 12000},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid, (void *)cuDeviceGetUuid_v2, NULL, 11040},
    P(cuInit), P(cuDriverGetVersion), P(cuDeviceGet), P(cuDeviceGetCount), P(cuDeviceGetName),
    P(cuDeviceGetAttribute), P(cuDevicePrimaryCtxRetain), P(cuCtxSetCurrent), P(cuCtxGetCurrent),
    P(cuCtxGetDevice), P(cuCtxSynchronize), P(cuStreamCreate), P(cuStreamSynchronize), P(cuStreamQuery),
    P(cuStreamEndCapture), P(cuStreamBeginCaptureToGraph), P(cuStreamIsCapturing), P(cuEventCreate), P(cuEventRecord), P(cuEventQuery),
    P(cuEventSynchronize), P(cuEventElapsedTime), P(cuModuleLoadData), P(cuModuleUnload),
    P(cuModuleGetFunction), P(cuFuncGetName), P(cuGraphInstantiateWithFlags), P(cuGraphExecDestroy), P(cuGraphDestroy),
    P(cuMemCreate), P(cuMemRelease), P(cuGetErrorName), P(cuGetErrorString), P(cuThreadExchangeStreamCaptureMode),
    /* memory pools, managed memory, arrays */
    PT(cuMemAllocFromPoolAsync), P(cuMemPoolCreate), P(cuMemPoolDestroy), P(cuMemPoolTrimTo), P(cuMemPoolSetAttribute),
    P(cuMemPoolGetAttribute), P(cuDeviceGetDefaultMemPool), P(cuDeviceGetMemPool), P(cuDeviceSetMemPool),
    P(cuMemAllocManaged), V2(cuArrayCreate, 3020), V2(cuArray3DCreate, 3020), P(cuArrayDestroy),
    P(cuMipmappedArrayCreate), P(cuMipmappedArrayDestroy),
    /* graph memory nodes, IPC pools */
    PT(cuGraphUpload), PT(cuGraphInstantiateWithParams), P(cuGraphCreate), P(cuGraphAddMemAllocNode),
    P(cuGraphAddMemFreeNode), P(cuGraphClone), P(cuGraphAddChildGraphNode), P(cuDeviceGraphMemTrim),
    P(cuDeviceGetGraphMemAttribute), P(cuDeviceSetGraphMemAttribute), V2(cuStreamGetCaptureInfo, 11030),
    {"cuGraphExecUpdate", (void *)cuGraphExecUpdate, (void *)cuGraphExecUpdate_v2, NULL, 12000},
    P(cuMemPoolExportToShareableHandle),
    P(cuMemPoolImportFromShareableHandle), P(cuMemPoolExportPointer), P(cuMemPoolImportPointer),
#undef P
#undef PT
#undef V2
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (strcmp(symbol, "cuCtxCreate") == 0 && version >= 11040) { /* three ABIs: _v2 from 3020, _v3, _v4 */
        *pfn = version >= 12050 ? (void *)cuCtxCreate_v4 : (void *)cuCtxCreate_v3;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    for (size_t k = 0; k < sizeof procs / sizeof procs[0]; k++) {
        if (strcmp(procs[k].base, symbol) != 0)
            continue;
        void *f = version >= procs[k].split ? procs[k].cur : procs[k].old;
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && procs[k].ptsz)
            f = procs[k].ptsz;
        if (!f) { /* the fake has no pre-_v2 (32-bit) entry points */
            if (status)
                *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = f;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
