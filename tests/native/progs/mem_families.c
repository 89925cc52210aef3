/* Takes GPU memory every way a process can, one action per argument, linked against the fake libcuda.so.1
 * (tests/native/test_shim_memory.py runs it under libcgpu.so). After each action it prints one line:
 *
 *   ACTION rc=<the driver call's result> held=<bytes the fake device holds for this process>
 *          ledger=<bytes the instance's ledger holds: cuMemGetInfo's total - free, under the shim>
 *
 * held comes from the fake's fakecuda_used_bytes (contexts, allocations, what pools reserve), so a test can check
 * that the ledger says exactly what the device holds.
 *
 * usage: mem_families ACTION...
 *   pool=SIZE          cuMemAllocFromPoolAsync from a pool of device 0 (cuMemPoolCreate at first use, or at threshold)
 *   async=SIZE         cuMemAllocAsync (the device's current pool: its default)
 *   freeasync          cuMemFreeAsync of every pool allocation, no synchronisation
 *   poolfree           cuMemFree_v2 of every pool allocation
 *   sync ctxsync       cuStreamSynchronize of the stream / cuCtxSynchronize
 *   threshold=SIZE     CU_MEMPOOL_ATTR_RELEASE_THRESHOLD of the created pool (default=SIZE: of the default pool)
 *   trim=SIZE          cuMemPoolTrimTo(the created pool, SIZE)      destroy   cuMemPoolDestroy(the created pool)
 *   managed=SIZE       cuMemAllocManaged (CU_MEM_ATTACH_GLOBAL)
 *   array=W,H          cuArrayCreate_v2, 4 x float32 channels (16 bytes an element)
 *   array3d=W,H,D      cuArray3DCreate_v2, same format      mipmap=W,H,LEVELS   cuMipmappedArrayCreate, same
 *   vmm=SIZE,WHERE     cuMemCreate at device 0 (WHERE device) or in host memory (host, numa, numacur)
 *   alloc=SIZE         cuMemAlloc_v2
 *   newctx dropctx     cuCtxCreate_v2 on device 0 (it becomes current) / cuCtxDestroy_v2 of the last one made
 *   freeall            free everything but pool allocations (cuMemFree, cuArrayDestroy, ..., cuMemRelease)
 *   jax=FRACTION       a JAX-style preallocation: FRACTION of the total cuMemGetInfo shows, from the default pool
 *                      with its release threshold at the maximum (XLA's cuda_async allocator), allocated, freed
 *                      into the pool and synchronised; prints total= and bytes= too
 *   churn=N,SIZE       N cuMemAllocAsync + cuMemFreeAsync pairs of SIZE on the stream, then a synchronisation;
 *                      prints ns= per pair (what the pool accounting costs when the pool has room)
 *   capture=SIZE[,free][,auto][,upload]  a graph captured on the stream: cuMemAllocAsync of SIZE (an allocation
 *                      node), with free: cuMemFreeAsync of it too (a free node); instantiated (auto: with
 *                      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH; upload: by cuGraphInstantiateWithParams with
 *                      CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD into the stream); it becomes the last graph
 *   node=SIZE          a graph of one cuGraphAddMemAllocNode on device 0, instantiated
 *   empty              an empty graph (cuGraphCreate), instantiated
 *   clone              cuGraphClone of the last graph, instantiated; it becomes the last graph
 *   child[=SIZE]       a new graph with a cuGraphAddChildGraphNode of the last graph (and, with SIZE, a
 *                      cuGraphAddMemAllocNode of SIZE on device 0 of its own), instantiated; it becomes the last graph
 *   again              a second cuGraphInstantiateWithFlags of the last graph (destroyed at once if made)
 *   reinst             cuGraphExecDestroy of the last graph's executable graph, then cuGraphInstantiateWithFlags
 *   upload launch      cuGraphUpload / cuGraphLaunch of the last graph, on the stream
 *   update=SIZE[,free][,v1]  a new graph of one cuGraphAddMemAllocNode of SIZE on device 0 (free: and a
 *                      cuGraphAddMemFreeNode of it), then cuGraphExecUpdate_v2 (v1: CUDA 11's cuGraphExecUpdate) of
 *                      the last graph's executable graph with it: made, the new graph replaces the last graph's
 *                      (destroyed), else it is destroyed; update=prev: with the graph before the last one, which
 *                      its own executable graph instantiates. Prints result= (the CUgraphExecUpdateResult)
 *   gfree              cuMemFreeAsync of every graph allocation a launch left live (those without a free node)
 *   gtrim              cuDeviceGraphMemTrim(0)      gdestroy   cuGraphExecDestroy + cuGraphDestroy of the last graph
 *                      (graph actions print greserved=, the graph memory pool's CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
 *   export=SIZE        a pool exportable as a POSIX file descriptor, SIZE allocated from it and synchronised, the
 *                      pool and the allocation exported: prints pid=, fd= and data= (the export data, in hex)
 *   import=PID,FD,HEX  the pool imported from /proc/PID/fd/FD, then the allocation of export data HEX
 *                      (import=self: this process's own last export)
 *   importalloc=SIZE   cuMemAllocFromPoolAsync from the imported pool (which the driver refuses)
 *   importfree         cuMemFreeAsync of every imported allocation, then a stream synchronisation
 *   ready sleep=MS
 * SIZE: bytes, or with K/M/G (binary). The context is device 0's primary context; "ctx" is printed first. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, void *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphClone(CUgraph *, CUgraph);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphDestroy(CUgraph);
CUresult cuDeviceGraphMemTrim(CUdevice);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void *);
CUresult cuMemPoolExportToShareableHandle(void *, CUmemoryPool, CUmemAllocationHandleType, unsigned long long);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *, void *, CUmemAllocationHandleType, unsigned long long);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *, CUdeviceptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
int64_t fakecuda_used_bytes(int phys); /* the fake's, for tests */

enum { K_PTR, K_ARRAY, K_MIPMAP, K_HANDLE };
typedef struct {
    int kind;
    uint64_t v;
} thing;
static thing things[1024];
static int nthings;
static CUcontext made[64];
static int nmade;
static CUdeviceptr pooled[1024];
static int npooled;

static size_t size_of(const char *s) {
    char *end;
    double v = strtod(s, &end);
    size_t mult = *end == 'K' ? 1ULL << 10 : *end == 'M' ? 1ULL << 20 : *end == 'G' ? 1ULL << 30 : 1;
    return (size_t)(v * (double)mult);
}

static void keep(int kind, uint64_t v) {
    if (nthings < 1024)
        things[nthings++] = (thing){kind, v};
}

static char extra[256]; /* more of the action's results, printed after its name */

/* Graphs: each made by capture=, node=, empty, clone or child, the last one acted on. */
static struct {
    CUgraph g;
    CUgraphExec e;
    CUdeviceptr p;  /* its allocation */
    int freed_in;   /* it has a free node for it */
} graphs[64];
static int ngraphs;
static CUdeviceptr glive[64]; /* graph allocations a launch left live */
static int nglive;
static char gextra[64]; /* a graph action's results, printed before greserved= */

/* The graph just built: kept with its executable graph where it was instantiated (r: success), else destroyed. */
static CUresult keep_graph(CUresult r, CUgraph g, CUgraphExec e, CUdeviceptr p, int freed) {
    if (r != CUDA_SUCCESS && g)
        cuGraphDestroy(g);
    if (r == CUDA_SUCCESS) {
        graphs[ngraphs].g = g;
        graphs[ngraphs].e = e;
        graphs[ngraphs].p = p;
        graphs[ngraphs++].freed_in = freed;
    }
    return r;
}

/* update=: the last graph's executable graph updated with a new graph, or with the one before the last. */
static CUresult update(const char *v) {
    int prev = strcmp(v, "prev") == 0, freed = !prev && strstr(v, ",free") != NULL;
    if (prev && ngraphs < 2)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = prev ? graphs[ngraphs - 2].g : NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS params = {
        .poolProps = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}},
        .bytesize = size_of(v)};
    CUresult r = prev ? CUDA_SUCCESS : cuGraphCreate(&g, 0);
    CUgraphNode node;
    if (!prev && r == CUDA_SUCCESS)
        r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &params);
    if (!prev && r == CUDA_SUCCESS && freed)
        r = cuGraphAddMemFreeNode(&node, g, &node, 1, params.dptr);
    CUgraphExecUpdateResultInfo info = {.result = CU_GRAPH_EXEC_UPDATE_ERROR};
    if (r == CUDA_SUCCESS && strstr(v, ",v1")) {
        CUgraphNode error_node = NULL;
        r = cuGraphExecUpdate(graphs[ngraphs - 1].e, g, &error_node, &info.result);
    } else if (r == CUDA_SUCCESS) {
        r = cuGraphExecUpdate_v2(graphs[ngraphs - 1].e, g, &info);
    }
    snprintf(gextra, sizeof gextra, "result=%d ", (int)info.result);
    if (prev)
        return r;
    if (r == CUDA_SUCCESS) {
        cuGraphDestroy(graphs[ngraphs - 1].g);
        graphs[ngraphs - 1].g = g;
        graphs[ngraphs - 1].p = params.dptr;
        graphs[ngraphs - 1].freed_in = freed;
    } else if (g) {
        cuGraphDestroy(g);
    }
    return r;
}

static CUresult graph_action(const char *a, const char *v, CUstream stream) {
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    size_t n = v ? size_of(v) : 0;
    int derived = strcmp(a, "empty") == 0 || strcmp(a, "clone") == 0 || strcmp(a, "child") == 0;
    if (derived && a[1] != 'm' && ngraphs == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (derived) { /* a graph made empty or from the last one */
        if (ngraphs == 64)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUgraph g = NULL;
        CUdeviceptr p = 0;
        if (a[1] == 'l') {
            r = cuGraphClone(&g, graphs[ngraphs - 1].g);
        } else {
            r = cuGraphCreate(&g, 0);
            CUgraphNode node;
            if (r == CUDA_SUCCESS && a[1] == 'h')
                r = cuGraphAddChildGraphNode(&node, g, NULL, 0, graphs[ngraphs - 1].g);
            CUDA_MEM_ALLOC_NODE_PARAMS params = {
                .poolProps = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}},
                .bytesize = n};
            if (r == CUDA_SUCCESS && n)
                r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &params);
            p = params.dptr;
        }
        CUgraphExec e = NULL;
        if (r == CUDA_SUCCESS)
            r = cuGraphInstantiateWithFlags(&e, g, 0);
        r = keep_graph(r, g, e, p, p == 0);
    } else if (strcmp(a, "capture") == 0 || strcmp(a, "node") == 0) {
        if (ngraphs == 64)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUgraph g = NULL;
        CUdeviceptr p = 0;
        int freed = a[0] == 'c' && strstr(v, ",free") != NULL;
        if (a[0] == 'c') {
            r = cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
            CUresult in = r == CUDA_SUCCESS ? cuMemAllocAsync(&p, n, stream) : r;
            if (in == CUDA_SUCCESS && freed)
                in = cuMemFreeAsync(p, stream);
            if (r == CUDA_SUCCESS)
                r = cuStreamEndCapture(stream, &g);
            if (r == CUDA_SUCCESS)
                r = in;
        } else {
            CUgraphNode node;
            CUDA_MEM_ALLOC_NODE_PARAMS params = {
                .poolProps = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}},
                .bytesize = n};
            r = cuGraphCreate(&g, 0);
            if (r == CUDA_SUCCESS)
                r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &params);
            p = params.dptr;
        }
        CUgraphExec e = NULL;
        unsigned long long flags = strstr(v, ",auto") ? CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH : 0;
        CUDA_GRAPH_INSTANTIATE_PARAMS params = {.flags = flags | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
                                                .hUploadStream = stream};
        if (r == CUDA_SUCCESS)
            r = strstr(v, ",upload") ? cuGraphInstantiateWithParams(&e, g, &params)
                                     : cuGraphInstantiateWithFlags(&e, g, flags);
        r = keep_graph(r, g, e, p, freed);
    } else if (ngraphs == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    } else if (strcmp(a, "upload") == 0) {
        r = cuGraphUpload(graphs[ngraphs - 1].e, stream);
    } else if (strcmp(a, "launch") == 0) {
        r = cuGraphLaunch(graphs[ngraphs - 1].e, stream);
        int known = 0;
        for (int k = 0; k < nglive; k++)
            known |= glive[k] == graphs[ngraphs - 1].p;
        if (r == CUDA_SUCCESS && !graphs[ngraphs - 1].freed_in && !known && nglive < 64)
            glive[nglive++] = graphs[ngraphs - 1].p;
    } else if (strcmp(a, "update") == 0) {
        r = v ? update(v) : CUDA_ERROR_INVALID_VALUE;
    } else if (strcmp(a, "again") == 0) {
        CUgraphExec e = NULL;
        r = cuGraphInstantiateWithFlags(&e, graphs[ngraphs - 1].g, 0);
        if (r == CUDA_SUCCESS)
            cuGraphExecDestroy(e);
    } else if (strcmp(a, "reinst") == 0) {
        r = cuGraphExecDestroy(graphs[ngraphs - 1].e);
        if (r == CUDA_SUCCESS)
            r = cuGraphInstantiateWithFlags(&graphs[ngraphs - 1].e, graphs[ngraphs - 1].g, 0);
    } else if (strcmp(a, "gdestroy") == 0) {
        ngraphs--;
        r = cuGraphExecDestroy(graphs[ngraphs].e);
        if (r == CUDA_SUCCESS)
            r = cuGraphDestroy(graphs[ngraphs].g);
    }
    return r;
}


static void report(const char *what, CUresult r) {
    size_t free_b = 0, total = 0;
    cuMemGetInfo_v2(&free_b, &total);
    printf("%s %src=%d held=%lld ledger=%lld\n", what, extra, r, (long long)fakecuda_used_bytes(0),
           (long long)(total - free_b));
    extra[0] = 0;
    fflush(stdout);
}

/* IPC pools: this process's last export, and what it imported. */
static int export_fd = -1;
static CUmemPoolPtrExportData export_data;
static CUmemoryPool ipool;
static CUdeviceptr imported[64];
static int nimported;

/* import=PID,FD,HEX or import=self */
static CUresult import_from(const char *v) {
    CUmemPoolPtrExportData data = export_data;
    int fd = export_fd, opened = -1;
    if (strcmp(v, "self") != 0) {
        int pid = 0, xfd = 0, used = 0;
        if (sscanf(v, "%d,%d,%n", &pid, &xfd, &used) < 2 || strlen(v + used) != 2 * sizeof data.reserved)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < sizeof data.reserved; k++) {
            unsigned byte;
            sscanf(v + used + 2 * k, "%2x", &byte);
            data.reserved[k] = (unsigned char)byte;
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, xfd);
        fd = opened = open(path, O_RDONLY | O_CLOEXEC);
    }
    CUresult r = cuMemPoolImportFromShareableHandle(&ipool, (void *)(intptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (opened >= 0)
        close(opened);
    CUdeviceptr p = 0;
    if (r == CUDA_SUCCESS)
        r = cuMemPoolImportPointer(&p, ipool, &data);
    if (r == CUDA_SUCCESS && nimported < 64)
        imported[nimported++] = p;
    return r;
}

int main(int argc, char **argv) {
    CUcontext ctx;
    CUstream stream;
    CUmemoryPool pool = NULL, dflt = NULL;
    if (cuInit(0) != CUDA_SUCCESS)
        return 3;
    CUresult r = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (r != CUDA_SUCCESS) {
        printf("ctx rc=%d\n", r);
        return 0;
    }
    cuCtxSetCurrent(ctx);
    cuStreamCreate(&stream, 0);
    cuDeviceGetDefaultMemPool(&dflt, 0);
    report("ctx", CUDA_SUCCESS);
    for (int i = 1; i < argc; i++) {
        char *a = argv[i], *v = strchr(a, '=');
        if (v)
            *v++ = 0;
        size_t n = v ? size_of(v) : 0;
        const char *second = v && strchr(v, ',') ? strchr(v, ',') + 1 : "";
        CUdeviceptr p = 0;
        if (!pool && (strcmp(a, "pool") == 0 || strcmp(a, "threshold") == 0)) {
            CUmemPoolProps props = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
            cuMemPoolCreate(&pool, &props);
        }
        if (strcmp(a, "pool") == 0) {
            r = cuMemAllocFromPoolAsync(&p, n, pool, stream);
            if (r == CUDA_SUCCESS && npooled < 1024)
                pooled[npooled++] = p;
        } else if (strcmp(a, "async") == 0) {
            r = cuMemAllocAsync(&p, n, stream);
            if (r == CUDA_SUCCESS && npooled < 1024)
                pooled[npooled++] = p;
        } else if (strcmp(a, "freeasync") == 0) {
            r = CUDA_SUCCESS;
            for (int k = 0; k < npooled; k++)
                r |= cuMemFreeAsync(pooled[k], stream);
            npooled = 0;
        } else if (strcmp(a, "poolfree") == 0) {
            r = CUDA_SUCCESS;
            for (int k = 0; k < npooled; k++)
                r |= cuMemFree_v2(pooled[k]);
            npooled = 0;
        } else if (strcmp(a, "sync") == 0) {
            r = cuStreamSynchronize(stream);
        } else if (strcmp(a, "ctxsync") == 0) {
            r = cuCtxSynchronize();
        } else if (strcmp(a, "threshold") == 0 || strcmp(a, "default") == 0) {
            cuuint64_t t = n;
            r = cuMemPoolSetAttribute(a[0] == 'd' ? dflt : pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t);
        } else if (strcmp(a, "trim") == 0) {
            r = cuMemPoolTrimTo(pool, n);
        } else if (strcmp(a, "destroy") == 0) {
            r = cuMemPoolDestroy(pool);
            pool = NULL;
        } else if (strcmp(a, "managed") == 0) {
            r = cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL);
            if (r == CUDA_SUCCESS)
                keep(K_PTR, p);
        } else if (strcmp(a, "alloc") == 0) {
            r = cuMemAlloc_v2(&p, n);
            if (r == CUDA_SUCCESS)
                keep(K_PTR, p);
        } else if (strcmp(a, "array") == 0 || strcmp(a, "array3d") == 0 || strcmp(a, "mipmap") == 0) {
            size_t w = n, h = size_of(second), d = strchr(second, ',') ? size_of(strchr(second, ',') + 1) : 0;
            CUarray arr = NULL;
            if (strcmp(a, "array") == 0) {
                CUDA_ARRAY_DESCRIPTOR desc = {.Width = w, .Height = h, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
                r = cuArrayCreate_v2(&arr, &desc);
            } else {
                CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = w, .Height = h, .Depth = a[5] == '3' ? d : 0,
                                                .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
                r = a[0] == 'm' ? cuMipmappedArrayCreate((CUmipmappedArray *)&arr, &desc, (unsigned)d)
                                : cuArray3DCreate_v2(&arr, &desc);
            }
            if (r == CUDA_SUCCESS)
                keep(a[0] == 'm' ? K_MIPMAP : K_ARRAY, (uint64_t)(uintptr_t)arr);
        } else if (strcmp(a, "vmm") == 0) {
            int type = strcmp(second, "device") == 0 ? CU_MEM_LOCATION_TYPE_DEVICE
                       : strcmp(second, "host") == 0 ? CU_MEM_LOCATION_TYPE_HOST
                       : strcmp(second, "numa") == 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA
                                                     : CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
            CUmemAllocationProp prop = {.type = 1, .location = {.type = type, .id = 0}};
            CUmemGenericAllocationHandle h = 0;
            r = cuMemCreate(&h, n, &prop, 0);
            if (r == CUDA_SUCCESS)
                keep(K_HANDLE, h);
        } else if (strcmp(a, "freeall") == 0) {
            r = CUDA_SUCCESS;
            for (int k = 0; k < nthings; k++) {
                thing t = things[k];
                r |= t.kind == K_PTR      ? cuMemFree_v2(t.v)
                     : t.kind == K_ARRAY  ? cuArrayDestroy((CUarray)(uintptr_t)t.v)
                     : t.kind == K_MIPMAP ? cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)t.v)
                                          : cuMemRelease(t.v);
            }
            nthings = 0;
        } else if (strcmp(a, "jax") == 0) {
            size_t free_b = 0, total = 0;
            cuMemGetInfo_v2(&free_b, &total);
            size_t want = (size_t)(strtod(v, NULL) * (double)total);
            cuuint64_t most = UINT64_MAX;
            r = cuMemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &most);
            if (r == CUDA_SUCCESS)
                r = cuMemAllocAsync(&p, want, stream);
            if (r == CUDA_SUCCESS)
                r = cuMemFreeAsync(p, stream);
            if (r == CUDA_SUCCESS)
                r = cuStreamSynchronize(stream);
            snprintf(extra, sizeof extra, "total=%zu bytes=%zu ", total, want);
        } else if (strcmp(a, "newctx") == 0) {
            CUcontext c = NULL;
            r = cuCtxCreate_v2(&c, 0, 0);
            if (r == CUDA_SUCCESS && nmade < 64)
                made[nmade++] = c;
        } else if (strcmp(a, "dropctx") == 0) {
            r = nmade ? cuCtxDestroy_v2(made[--nmade]) : CUDA_ERROR_INVALID_CONTEXT;
        } else if (strcmp(a, "churn") == 0) {
            struct timespec t0, t1;
            size_t size = size_of(second);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            r = CUDA_SUCCESS;
            for (size_t k = 0; k < n && r == CUDA_SUCCESS; k++) {
                r = cuMemAllocAsync(&p, size, stream);
                if (r == CUDA_SUCCESS)
                    r = cuMemFreeAsync(p, stream);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (r == CUDA_SUCCESS)
                r = cuStreamSynchronize(stream);
            double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
            snprintf(extra, sizeof extra, "ns=%.0f ", n ? ns / (double)n : 0.0);
        } else if (strcmp(a, "capture") == 0 || strcmp(a, "node") == 0 || strcmp(a, "upload") == 0 ||
                   strcmp(a, "launch") == 0 || strcmp(a, "gdestroy") == 0 || strcmp(a, "gfree") == 0 ||
                   strcmp(a, "gtrim") == 0 || strcmp(a, "empty") == 0 || strcmp(a, "clone") == 0 ||
                   strcmp(a, "child") == 0 || strcmp(a, "again") == 0 || strcmp(a, "reinst") == 0 ||
                   strcmp(a, "update") == 0) {
            if (strcmp(a, "gfree") == 0) {
                r = CUDA_SUCCESS;
                for (int k = 0; k < nglive; k++)
                    r |= cuMemFreeAsync(glive[k], stream);
                nglive = 0;
            } else {
                r = strcmp(a, "gtrim") == 0 ? cuDeviceGraphMemTrim(0) : graph_action(a, v, stream);
            }
            cuuint64_t reserved = 0;
            cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
            snprintf(extra, sizeof extra, "%sgreserved=%llu ", gextra, (unsigned long long)reserved);
            gextra[0] = 0;
        } else if (strcmp(a, "export") == 0) {
            CUmemPoolProps props = {.allocType = 1, .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
            CUmemoryPool xpool = NULL;
            r = cuMemPoolCreate(&xpool, &props);
            if (r == CUDA_SUCCESS)
                r = cuMemAllocFromPoolAsync(&p, n, xpool, stream);
            if (r == CUDA_SUCCESS)
                r = cuStreamSynchronize(stream);
            if (r == CUDA_SUCCESS)
                r = cuMemPoolExportToShareableHandle(&export_fd, xpool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (r == CUDA_SUCCESS)
                r = cuMemPoolExportPointer(&export_data, p);
            char hex[2 * sizeof export_data.reserved + 1];
            for (size_t k = 0; k < sizeof export_data.reserved; k++)
                snprintf(hex + 2 * k, 3, "%02x", export_data.reserved[k]);
            snprintf(extra, sizeof extra, "pid=%d fd=%d data=%s ", (int)getpid(), export_fd, hex);
        } else if (strcmp(a, "import") == 0) {
            r = import_from(v);
        } else if (strcmp(a, "importalloc") == 0) {
            r = cuMemAllocFromPoolAsync(&p, n, ipool, stream);
        } else if (strcmp(a, "importfree") == 0) {
            r = CUDA_SUCCESS;
            for (int k = 0; k < nimported; k++)
                r |= cuMemFreeAsync(imported[k], stream);
            nimported = 0;
            if (r == CUDA_SUCCESS)
                r = cuStreamSynchronize(stream);
        } else if (strcmp(a, "ready") == 0) {
            r = CUDA_SUCCESS;
        } else if (strcmp(a, "sleep") == 0) {
            usleep((useconds_t)n * 1000);
            r = CUDA_SUCCESS;
        } else {
            fprintf(stderr, "mem_families: unknown action %s\n", a);
            return 2;
        }
        report(a, r);
    }
    cuCtxSynchronize(); /* pool frees reach their pools before the process ends */
    cuStreamDestroy_v2(stream);
    return 0;
}
