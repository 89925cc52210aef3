/* The collectives inside CUDA graphs: how many each graph holds, so that a replay counts them on the board (board.c;
 * behaviour §11, "Where a turn stops").
 *
 * How this works. A collective kernel launched into a capturing stream runs nothing then: it becomes a node of the
 * graph being captured (the capture graph, cuStreamGetCaptureInfo_v2), and it runs at each launch of an executable
 * graph instantiated from it. NCCL supports this ("Using NCCL with CUDA Graphs", NCCL User Guide: "The launch of a
 * graph ... containing a captured NCCL operation is considered collective for the same set of ranks that were
 * present in the capture, and each of those ranks must be using the graph derived from that collective capture"),
 * so every rank's replay holds the same collectives, in the same order. So:
 *   - launch.c reports each collective captured: the capture graph's count grows by one (a cuGraphLaunch captured
 *     into another capture adds its executable graph's count);
 *   - cuGraphClone gives the clone the original's count, cuGraphAddChildGraphNode adds the child's count to the
 *     parent (the child graph is cloned into the node: later changes to the child do not reach the parent);
 *   - an executable graph takes its graph's count at instantiation (cuGraphInstantiateWithFlags,
 *     cuGraphInstantiateWithParams), and its new graph's at a successful cuGraphExecUpdate (a kernel node's function
 *     may change there since CUDA 11.2: the driver API reference lists the owning context, CUDA dynamic
 *     parallelism, device-side launch and cooperativeness as what may not, not the function);
 *   - a launch of an executable graph holding n collectives counts n on the board before its gate (launch.c).
 * Not counted: a collective kernel node added by hand (cuGraphAddKernelNode, cuGraphExecKernelNodeSetParams, nodes
 * removed or disabled: NCCL only captures), a graph instantiated through an entry point not hooked (CUDA 11's
 * five-argument cuGraphInstantiate), and the device a node runs on: a replay's collectives count on the GPU whose
 * gate the launch passes (the current context's), as a kernel's do.
 *
 * Records exist only for graphs and executable graphs with collectives, in two small hash tables under one lock;
 * until a collective has been captured (`any`), a graph's launch does not look. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "memory.h"

#define BUCKETS 256

typedef struct rec {
    const void *key; /* a CUgraph or a CUgraphExec */
    int n;           /* its collectives, > 0 */
    struct rec *next;
} rec;

static rec *graphs[BUCKETS], *execs[BUCKETS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* both tables */
static _Atomic int any;                                /* a collective was captured: launches look */

static rec **bucket(rec **table, const void *key) {
    uint64_t h = (uint64_t)(uintptr_t)key;
    return &table[(h >> 4) * 0x9E3779B97F4A7C15ull >> 56];
}

/* Under mu. */
static int count_of(rec **table, const void *key) {
    for (rec *r = *bucket(table, key); r; r = r->next)
        if (r->key == key)
            return r->n;
    return 0;
}

/* Under mu: key's count becomes n (its record dropped at 0). */
static void set(rec **table, const void *key, int n) {
    rec **pp = bucket(table, key);
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    if (*pp && n > 0) {
        (*pp)->n = n;
    } else if (*pp) {
        rec *gone = *pp;
        *pp = gone->next;
        free(gone);
    } else if (n > 0) {
        rec *r = malloc(sizeof *r);
        if (!r) {
            cgpu_log("cannot count a CUDA graph's collectives: its replays may end a gang turn between them");
            return;
        }
        r->key = key;
        r->n = n;
        r->next = *pp;
        *pp = r;
        atomic_store(&any, 1);
    }
}

void cgpu_graph_coll_captured(CUstream s, int n) {
    CUgraph g = n > 0 ? cgpu_graph_mem_capture_graph(s) : NULL;
    if (!g)
        return;
    pthread_mutex_lock(&mu);
    set(graphs, g, count_of(graphs, g) + n);
    pthread_mutex_unlock(&mu);
}

int cgpu_graph_coll_of(CUgraphExec e) {
    if (!e || !atomic_load_explicit(&any, memory_order_relaxed))
        return 0;
    pthread_mutex_lock(&mu);
    int n = count_of(execs, e);
    pthread_mutex_unlock(&mu);
    return n;
}

void cgpu_graph_coll_exec_from(CUgraphExec e, CUgraph g) {
    if (!atomic_load_explicit(&any, memory_order_relaxed))
        return;
    pthread_mutex_lock(&mu);
    set(execs, e, count_of(graphs, g));
    pthread_mutex_unlock(&mu);
}

/* key's record, if it has one, is dropped (its graph or executable graph destroyed). */
static void forget(rec **table, const void *key) {
    if (!atomic_load_explicit(&any, memory_order_relaxed))
        return;
    pthread_mutex_lock(&mu);
    set(table, key, 0);
    pthread_mutex_unlock(&mu);
}

void cgpu_graph_coll_exec_gone(CUgraphExec e) { forget(execs, e); }

void cgpu_graph_coll_graph_gone(CUgraph g) { forget(graphs, g); }

CUresult cuGraphClone(CUgraph *clone, CUgraph orig) {
    REAL_OR_FAIL(cuGraphClone);
    CUresult r = real(clone, orig);
    if (r == CUDA_SUCCESS && clone && cgpu_env_ok && atomic_load(&any)) {
        pthread_mutex_lock(&mu);
        set(graphs, *clone, count_of(graphs, orig));
        pthread_mutex_unlock(&mu);
    }
    return r;
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  CUgraph child) {
    REAL_OR_FAIL(cuGraphAddChildGraphNode);
    CUresult r = real(node, g, deps, ndeps, child);
    if (r == CUDA_SUCCESS && cgpu_env_ok && atomic_load(&any)) {
        pthread_mutex_lock(&mu);
        set(graphs, g, count_of(graphs, g) + count_of(graphs, child));
        pthread_mutex_unlock(&mu);
    }
    return r;
}
