/* libcgpu.so's capture hooks: which stream captures are open in this process, so that the shim's own syncs (a
 * lease's end, the idle thread's wait for queued work) never run while one is.
 *
 * The CUDA Programming Guide (CUDA Graphs, "Prohibited and Unhandled Operations") makes it invalid "to query the
 * execution status of or synchronize a broader handle which encompasses an active stream capture, such as a device
 * or context handle when any associated stream is in capture mode", and an invalid operation invalidates the
 * capture. That holds in every capture interaction mode: cuThreadExchangeStreamCaptureMode's relaxed mode lets a
 * thread make potentially unsafe calls, not sync a capturing context. So a shim sync waits until no capture of the
 * process is open (PyTorch's and vLLM's captures take milliseconds), and holds captures from beginning while it
 * runs. It does not wait for a capture of its own thread (a thread that captures and launches on another stream),
 * nor for one still open after CAPTURE_WAIT_MS: the sync is then skipped, and the work it would have waited for
 * runs past the lease's end, which the daemon bills as an overrun. One count for the whole process, not per
 * context: a capture in one context holds back a sync of another, for as long as it lasts. */
#define _GNU_SOURCE
#include <errno.h>

#include "memory.h"

#define CAPTURE_WAIT_MS 1000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static int open_captures;           /* under mu */
static __thread int thread_captures; /* begun by this thread and not ended */

static void init_cv(void) { cgpu_cond_init(&cv); }

/* Begin under mu, so that no capture begins while a shim sync runs; count it when it began. */
#define BEGIN(call)                        \
    do {                                   \
        pthread_mutex_lock(&mu);           \
        CUresult r_ = call;                \
        if (r_ == CUDA_SUCCESS) {          \
            open_captures++;               \
            thread_captures++;             \
        }                                  \
        pthread_mutex_unlock(&mu);         \
        return r_;                         \
    } while (0)

CUresult cuStreamBeginCapture(CUstream s) {
    REAL_OR_FAIL(cuStreamBeginCapture);
    BEGIN(real(s));
}

CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    REAL_OR_FAIL(cuStreamBeginCapture_ptsz);
    BEGIN(real(s));
}

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    REAL_OR_FAIL(cuStreamBeginCapture_v2);
    BEGIN(real(s, mode));
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    REAL_OR_FAIL(cuStreamBeginCapture_v2_ptsz);
    BEGIN(real(s, mode));
}

CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                                     size_t n, CUstreamCaptureMode mode) {
    REAL_OR_FAIL(cuStreamBeginCaptureToGraph);
    BEGIN(real(s, g, deps, data, n, mode));
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                          const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
    REAL_OR_FAIL(cuStreamBeginCaptureToGraph_ptsz);
    BEGIN(real(s, g, deps, data, n, mode));
}

/* The capture is over once the stream captures no more, whether it ended valid or invalidated (an end from the
 * wrong thread leaves it open). An invalidated capture's graph is gone: graphmem.c forgets its memory nodes,
 * graphcoll.c its collectives. */
#define END(call)                                                      \
    do {                                                               \
        int was_ = cgpu_stream_capturing(s);                           \
        CUgraph into_ = was_ ? cgpu_graph_mem_capture_graph(s) : NULL; \
        CUresult r_ = call;                                            \
        if (r_ != CUDA_SUCCESS && into_) {                             \
            cgpu_graph_mem_forget(into_);                              \
            cgpu_graph_coll_graph_gone(into_);                         \
        }                                                              \
        if (was_ && !cgpu_stream_capturing(s)) {                       \
            pthread_mutex_lock(&mu);                                   \
            if (open_captures > 0)                                     \
                open_captures--;                                       \
            if (thread_captures > 0)                                   \
                thread_captures--;                                     \
            pthread_cond_broadcast(&cv);                               \
            pthread_mutex_unlock(&mu);                                 \
        }                                                              \
        return r_;                                                     \
    } while (0)

CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    REAL_OR_FAIL(cuStreamEndCapture);
    pthread_once(&cv_once, init_cv);
    END(real(s, g));
}

CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    REAL_OR_FAIL(cuStreamEndCapture_ptsz);
    pthread_once(&cv_once, init_cv);
    END(real(s, g));
}

int cgpu_captures_hold(void) {
    if (thread_captures > 0)
        return 0;
    pthread_once(&cv_once, init_cv);
    pthread_mutex_lock(&mu);
    struct timespec until;
    cgpu_deadline_in(&until, (int64_t)CAPTURE_WAIT_MS * 1000000);
    while (open_captures > 0)
        if (pthread_cond_timedwait(&cv, &mu, &until) == ETIMEDOUT)
            break;
    if (open_captures == 0)
        return 1;
    pthread_mutex_unlock(&mu);
    static _Atomic int said;
    if (!atomic_exchange(&said, 1))
        cgpu_log("a stream capture stayed open for %d ms at a lease's end: the lease ends without waiting for "
                 "the work queued before it (a sync would invalidate the capture)", CAPTURE_WAIT_MS);
    return 0;
}

void cgpu_captures_release(void) { pthread_mutex_unlock(&mu); }

void cgpu_captures_after_fork(void) {
    pthread_mutex_init(&mu, NULL);
    open_captures = 0; /* a child has none of its parent's captures (nor the threads that held them) */
    thread_captures = 0;
}
