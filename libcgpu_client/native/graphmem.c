/* Graph memory nodes against the ledger: what the device's graph memory pool holds from the device.
 *
 * How this works. An allocation node (cuMemAllocAsync or cuMemAllocFromPoolAsync on a capturing stream,
 * cuGraphAddMemAllocNode) takes no memory when it is made: the driver maps its memory from the device's graph
 * memory pool when the executable graph is uploaded (cuGraphUpload, or cuGraphInstantiateWithParams with
 * CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) or first launched, keeps the mapping between launches, and keeps the memory
 * in the pool after the graph is destroyed, until cuDeviceGraphMemTrim (CUDA Programming Guide, "Graph Memory
 * Nodes": "First Launch / cudaGraphUpload", "Physical Memory Footprint"). So the ledger is charged what the pool
 * reserves (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT of cuDeviceGetGraphMemAttribute), settled where it can change:
 *   - the shim counts each graph's device-located allocation nodes as they are made (its `bytes`), and each
 *     executable graph takes its graph's count at instantiation (`need`);
 *   - an upload or launch of an executable graph the shim has not seen mapped reserves, before the driver's call,
 *     what the pool lacks for it (need less what the pool holds unmapped, RESERVED - USED_MEM_CURRENT, rounded up
 *     to the 2 MiB granule); past the limit the call fails with CUDA_ERROR_OUT_OF_MEMORY, the graph is neither
 *     uploaded nor launched, and nothing changed. After the call the charge becomes what the pool reserves;
 *   - after cuDeviceGraphMemTrim and cuGraphExecDestroy the charge follows the pool down; a trim may unmap any idle
 *     executable graph, so each is treated as unmapped again (its next launch reserves ahead anew).
 * Child and cloned graphs need nothing: CUDA refuses to clone a graph holding memory nodes or to embed it in a child
 * graph node, and to add memory nodes to a child node's graph (cuGraphAddMemFreeNode, cuGraphClone,
 * cuGraphAddChildGraphNode and cuGraphChildGraphNodeGetGraph in the driver API reference), so every memory node is
 * made in a graph of its own by capture or cuGraphAddMemAllocNode, as counted here.
 * cuGraphExecUpdate_v2 (and CUDA 11's cuGraphExecUpdate, its result in two out-parameters) gives an executable
 * graph the node parameters of a "topologically identical" graph, its allocation nodes' sizes included: the driver
 * API reference (Graph Management, cuGraphExecUpdate) lists no limitation on memory nodes, and the Programming
 * Guide's "Graph Update Limitations" one only: "It is not possible to update a cudaGraphExec_t with a cudaGraph_t
 * if the cudaGraph_t is currently instantiated as a different cudaGraphExec_t" (a moved child graph cannot be an
 * argument either, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE; the node-level cuGraphExecNodeSetParams is "API
 * unsupported" for memory nodes). So an update may change what an executable graph maps: on success it takes its
 * new graph's count and is treated as unmapped, so that its next upload or launch reserves ahead; a refused update
 * (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) changes nothing. What the driver still maps for the previous parameters
 * (what the pool's USED_MEM_CURRENT did not give back at the update: `stale`) counts as room for that mapping, and
 * goes with the next mapping call or trim.
 * Growth the shim did not foresee (a graph instantiated through an entry point it does not hook, such as CUDA 11's
 * five-argument cuGraphInstantiate; a remap when a graph moves to another stream) is charged after the call if the
 * limit allows; otherwise it is logged and left to the daemon's NVML check, as a launch cannot be undone. A
 * host-located allocation node is not counted. One lock guards the records and is held across a mapping call (and
 * an update) and its reservations, so that the process maps one executable graph's memory at a time. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "memory.h"

#define GRANULE (2LL << 20)

typedef struct gm_graph {
    CUgraph g;
    int64_t bytes[CGPU_MAX_GPUS]; /* its device-located allocation nodes, by visible GPU */
    struct gm_graph *next;
} gm_graph;

typedef struct gm_exec {
    CUgraphExec e;
    int64_t need[CGPU_MAX_GPUS];
    int64_t stale[CGPU_MAX_GPUS]; /* mapped for its parameters before a cuGraphExecUpdate, until it maps again */
    int mapped; /* uploaded or launched through the shim, and no trim or update since */
    struct gm_exec *next;
} gm_exec;

static gm_graph *graphs;
static gm_exec *execs;
static int64_t charged[CGPU_MAX_GPUS]; /* what the ledger holds for each GPU's graph memory pool */
static CUdevice dev_of[CGPU_MAX_GPUS]; /* the CUDA device of each GPU seen, + 1 (0: none yet) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* all of the above; held across a mapping call */
static _Atomic int seen; /* a memory node was made: until then a launch goes straight to the driver */

static int64_t pool_attr(int pos, CUgraphMem_attribute which) {
    __typeof__(cuDeviceGetGraphMemAttribute) *get = REAL(cuDeviceGetGraphMemAttribute);
    cuuint64_t v = 0;
    return dev_of[pos] && get && get(dev_of[pos] - 1, which, &v) == CUDA_SUCCESS ? (int64_t)v : -1;
}

/* Under mu: the charge of GPU pos becomes what its pool reserves. Growth past the limit is left uncharged (0). */
static int settle(int pos) {
    int64_t reserved = pool_attr(pos, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    if (reserved < 0 || reserved == charged[pos])
        return 1;
    if (reserved < charged[pos]) {
        cgpu_mem_free(pos, charged[pos] - reserved);
    } else if (cgpu_reserve_or_error(pos, reserved - charged[pos]) != CUDA_SUCCESS) {
        cgpu_log("GPU %d: the graph memory pool grew by %lld bytes more than foreseen, past the instance's limit; "
                 "left to the daemon's memory check", pos, (long long)(reserved - charged[pos]));
        return 0;
    }
    charged[pos] = reserved;
    return 1;
}

/* Under mu. */
static gm_graph *graph_rec(CUgraph g, int make) {
    gm_graph *r = graphs;
    while (r && r->g != g)
        r = r->next;
    if (!r && make && (r = calloc(1, sizeof *r)) != NULL) {
        r->g = g;
        r->next = graphs;
        graphs = r;
    }
    return r;
}

static gm_exec *exec_rec(CUgraphExec e) {
    gm_exec *r = execs;
    while (r && r->e != e)
        r = r->next;
    return r;
}

/* An allocation node of bytes on CUDA device dev was added to graph g. */
static void node_added(CUgraph g, CUdevice dev, size_t bytes) {
    int pos = cgpu_device_pos(dev, -1);
    if (pos < 0 || !g)
        return;
    atomic_store(&seen, 1);
    pthread_mutex_lock(&mu);
    dev_of[pos] = dev + 1;
    gm_graph *r = graph_rec(g, 1);
    if (r)
        r->bytes[pos] += (int64_t)bytes;
    else
        cgpu_log("cannot track a graph's memory nodes: its memory is charged only once the driver reserves it");
    pthread_mutex_unlock(&mu);
}

CUgraph cgpu_graph_mem_capture_graph(CUstream s) {
    __typeof__(cuStreamGetCaptureInfo_v2) *info = REAL(cuStreamGetCaptureInfo_v2);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph g = NULL;
    return info && info(s, &st, NULL, &g, NULL, NULL) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE ? g
                                                                                                           : NULL;
}

void cgpu_graph_mem_captured(CUstream s, CUdevice dev, size_t bytes) {
    node_added(cgpu_graph_mem_capture_graph(s), dev, bytes);
}

void cgpu_graph_mem_forget(CUgraph g) {
    pthread_mutex_lock(&mu);
    gm_graph **pp = &graphs;
    while (*pp && (*pp)->g != g)
        pp = &(*pp)->next;
    gm_graph *gone = *pp;
    if (gone) {
        *pp = gone->next;
        free(gone);
    }
    pthread_mutex_unlock(&mu);
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    REAL_OR_FAIL(cuGraphAddMemAllocNode);
    CUresult r = real(node, g, deps, ndeps, params);
    if (r == CUDA_SUCCESS && cgpu_env_ok && params && params->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        node_added(g, params->poolProps.location.id, params->bytesize);
    return r;
}

/* A new executable graph e of g: it needs what g's nodes count. */
static void instantiated(CUgraphExec e, CUgraph g) {
    pthread_mutex_lock(&mu);
    gm_graph *gr = graph_rec(g, 0);
    gm_exec *r = gr ? calloc(1, sizeof *r) : NULL;
    if (r) {
        r->e = e;
        for (int p = 0; p < CGPU_MAX_GPUS; p++)
            r->need[p] = gr->bytes[p];
        r->next = execs;
        execs = r;
    }
    pthread_mutex_unlock(&mu);
}

/* Under mu: reserve what mapping need may take from each device beyond what the pools hold unmapped and what the
 * executable graph still maps (stale, or NULL); into ahead. CUDA_SUCCESS, or the error to return with nothing
 * changed. */
static CUresult reserve_ahead(const int64_t *need, const int64_t *stale, int64_t *ahead) {
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        ahead[p] = 0;
        if (need[p] <= 0)
            continue;
        settle(p); /* what a trim or a destroy released meanwhile */
        int64_t reserved = pool_attr(p, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
        int64_t used = pool_attr(p, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
        int64_t room = (reserved >= 0 && used >= 0 && reserved > used ? reserved - used : 0) + (stale ? stale[p] : 0);
        int64_t lack = need[p] > room ? (need[p] - room + GRANULE - 1) / GRANULE * GRANULE : 0;
        CUresult e = lack ? cgpu_reserve_or_error(p, lack) : CUDA_SUCCESS;
        if (e != CUDA_SUCCESS) {
            for (int q = 0; q < p; q++)
                if (ahead[q])
                    cgpu_mem_free(q, ahead[q]);
            return e;
        }
        ahead[p] = lack;
    }
    return CUDA_SUCCESS;
}

/* Under mu, after the driver's call: the reservations ahead become what the pools reserve. */
static void settle_after(const int64_t *need, const int64_t *ahead) {
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        if (need[p] <= 0)
            continue;
        charged[p] += ahead[p];
        settle(p);
    }
}

/* Settle every GPU whose graph memory pool the shim has seen. */
static void settle_seen(void) {
    pthread_mutex_lock(&mu);
    for (int p = 0; p < CGPU_MAX_GPUS; p++)
        if (dev_of[p])
            settle(p);
    pthread_mutex_unlock(&mu);
}

/* A mapping call (upload, launch) of e, made with call; the ledger charged what the pools reserve after it. */
#define MAPPING(e, call)                                                        \
    do {                                                                        \
        if (!cgpu_env_ok || !atomic_load_explicit(&seen, memory_order_relaxed)) \
            return call;                                                        \
        pthread_mutex_lock(&mu);                                                \
        gm_exec *r_ = exec_rec(e);                                              \
        if (!r_) { /* no memory nodes seen; or instantiated unseen: settled after */ \
            int any_ = graphs != NULL;                                          \
            pthread_mutex_unlock(&mu);                                          \
            CUresult plain_ = call;                                             \
            if (any_)                                                           \
                settle_seen();                                                  \
            return plain_;                                                      \
        }                                                                       \
        int64_t none_[CGPU_MAX_GPUS] = {0}, ahead_[CGPU_MAX_GPUS];              \
        const int64_t *need_ = r_->mapped ? none_ : r_->need;                   \
        CUresult res_ = reserve_ahead(need_, r_->stale, ahead_);                \
        if (res_ == CUDA_SUCCESS) {                                             \
            res_ = call;                                                        \
            if (res_ == CUDA_SUCCESS) {                                         \
                r_->mapped = 1;                                                 \
                memset(r_->stale, 0, sizeof r_->stale);                         \
            }                                                                   \
            settle_after(r_->need, ahead_);                                     \
        }                                                                       \
        pthread_mutex_unlock(&mu);                                              \
        return res_;                                                            \
    } while (0)

CUresult cgpu_graph_mem_launch(CUgraphExec e, CUstream s, graph_launch_t *real) { MAPPING(e, real(e, s)); }

CUresult cuGraphUpload(CUgraphExec e, CUstream s) {
    REAL_OR_FAIL(cuGraphUpload);
    MAPPING(e, real(e, s));
}

CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) {
    REAL_OR_FAIL(cuGraphUpload_ptsz);
    MAPPING(e, real(e, s));
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags) {
    REAL_OR_FAIL(cuGraphInstantiateWithFlags);
    CUresult r = real(pe, g, flags);
    if (r == CUDA_SUCCESS && cgpu_env_ok && pe) {
        instantiated(*pe, g);
        cgpu_graph_coll_exec_from(*pe, g);
    }
    return r;
}

/* With CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD the instantiation maps, as an upload does: it reserves ahead what the
 * graph's nodes need. */
#define INSTANTIATE_WITH_PARAMS(name)                                                                    \
    CUresult name(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {                   \
        REAL_OR_FAIL(name);                                                                              \
        if (!cgpu_env_ok || !pe || !params || !(params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {   \
            CUresult r_ = real(pe, g, params);                                                           \
            if (r_ == CUDA_SUCCESS && cgpu_env_ok && pe) {                                               \
                instantiated(*pe, g);                                                                    \
                cgpu_graph_coll_exec_from(*pe, g);                                                       \
            }                                                                                            \
            return r_;                                                                                   \
        }                                                                                                \
        pthread_mutex_lock(&mu);                                                                         \
        gm_graph *gr_ = graph_rec(g, 0);                                                                 \
        int64_t none_[CGPU_MAX_GPUS] = {0}, ahead_[CGPU_MAX_GPUS];                                       \
        const int64_t *need_ = gr_ ? gr_->bytes : none_;                                                 \
        CUresult r_ = reserve_ahead(need_, NULL, ahead_);                                                \
        if (r_ == CUDA_SUCCESS) {                                                                        \
            r_ = real(pe, g, params);                                                                    \
            settle_after(need_, ahead_);                                                                 \
        }                                                                                                \
        pthread_mutex_unlock(&mu);                                                                       \
        if (r_ == CUDA_SUCCESS) {                                                                        \
            instantiated(*pe, g);                                                                        \
            cgpu_graph_coll_exec_from(*pe, g);                                                           \
            pthread_mutex_lock(&mu);                                                                     \
            gm_exec *er_ = exec_rec(*pe);                                                                \
            if (er_)                                                                                     \
                er_->mapped = 1;                                                                         \
            pthread_mutex_unlock(&mu);                                                                   \
        }                                                                                                \
        return r_;                                                                                       \
    }
INSTANTIATE_WITH_PARAMS(cuGraphInstantiateWithParams)
INSTANTIATE_WITH_PARAMS(cuGraphInstantiateWithParams_ptsz)

CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    REAL_OR_FAIL(cuDeviceGraphMemTrim);
    CUresult r = real(dev);
    int pos = r == CUDA_SUCCESS && cgpu_env_ok ? cgpu_device_pos(dev, -1) : -1;
    if (pos < 0)
        return r;
    pthread_mutex_lock(&mu);
    for (gm_exec *e = execs; e; e = e->next) {
        if (e->need[pos] > 0)
            e->mapped = 0;
        e->stale[pos] = 0;
    }
    settle(pos);
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
    REAL_OR_FAIL(cuGraphExecDestroy);
    CUresult r = real(e);
    if (r != CUDA_SUCCESS || !cgpu_env_ok)
        return r;
    cgpu_graph_coll_exec_gone(e);
    pthread_mutex_lock(&mu);
    gm_exec **pp = &execs;
    while (*pp && (*pp)->e != e)
        pp = &(*pp)->next;
    gm_exec *gone = *pp;
    if (gone) {
        *pp = gone->next;
        for (int p = 0; p < CGPU_MAX_GPUS; p++)
            if (gone->need[p] > 0)
                settle(p);
        free(gone);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult cuGraphDestroy(CUgraph g) {
    REAL_OR_FAIL(cuGraphDestroy);
    CUresult r = real(g);
    if (r == CUDA_SUCCESS && cgpu_env_ok) {
        cgpu_graph_mem_forget(g);
        cgpu_graph_coll_graph_gone(g);
    }
    return r;
}

/* Under mu: what each GPU's graph memory pool maps (USED_MEM_CURRENT; -1 where unknown). */
static void pool_used(int64_t *used) {
    for (int p = 0; p < CGPU_MAX_GPUS; p++)
        used[p] = dev_of[p] ? pool_attr(p, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) : -1;
}

/* Under mu, after cuGraphExecUpdate(e, g) succeeded (the pools mapped used_before when it began): e needs what g's
 * nodes count, at its next mapping call; what it mapped before stays stale unless the update gave it back. */
static void updated(CUgraphExec e, CUgraph g, const int64_t *used_before) {
    gm_exec *r = exec_rec(e);
    gm_graph *gr = graph_rec(g, 0);
    if (!r && !gr)
        return;
    if (!r && (r = calloc(1, sizeof *r)) != NULL) {
        r->e = e;
        r->next = execs;
        execs = r;
    }
    if (!r) {
        cgpu_log("cannot track an updated executable graph: its memory is charged only once the driver reserves it");
        return;
    }
    int64_t used_after[CGPU_MAX_GPUS];
    pool_used(used_after);
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        int64_t held = r->mapped ? r->need[p] : r->stale[p];
        int64_t given_back = used_before[p] >= 0 && used_after[p] >= 0 ? used_before[p] - used_after[p] : 0;
        int64_t kept = held - (given_back > 0 ? given_back : 0);
        r->stale[p] = kept > 0 ? kept : 0;
        r->need[p] = gr ? gr->bytes[p] : 0;
        if (held > 0)
            settle(p);
    }
    r->mapped = 0;
}

/* After an update of e with g: e holds g's collectives from now on (graphcoll.c). */
static CUresult update_done(CUgraphExec e, CUgraph g, CUresult r) {
    if (r == CUDA_SUCCESS && cgpu_env_ok)
        cgpu_graph_coll_exec_from(e, g);
    return r;
}

/* An update of e with g, made with call, under mu (it may change what e maps). */
#define UPDATE(e, g, call)                                                      \
    do {                                                                        \
        if (!cgpu_env_ok || !atomic_load_explicit(&seen, memory_order_relaxed)) \
            return update_done(e, g, call);                                     \
        int64_t used_[CGPU_MAX_GPUS];                                           \
        pthread_mutex_lock(&mu);                                                \
        pool_used(used_);                                                       \
        CUresult res_ = call;                                                   \
        if (res_ == CUDA_SUCCESS)                                               \
            updated(e, g, used_);                                               \
        pthread_mutex_unlock(&mu);                                              \
        return update_done(e, g, res_);                                         \
    } while (0)

CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    REAL_OR_FAIL(cuGraphExecUpdate_v2);
    UPDATE(e, g, real(e, g, info));
}

CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *error_node, CUgraphExecUpdateResult *result) {
    REAL_OR_FAIL(cuGraphExecUpdate);
    UPDATE(e, g, real(e, g, error_node, result));
}
