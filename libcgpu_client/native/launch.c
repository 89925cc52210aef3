/* libcgpu.so's launch hooks: every kernel launch (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz variants) passes the slice gate of
 * its device: one clock read while the lease is valid, the slow path (gates.c) when not.
 * Launches recorded into a graph by stream capture are not gated; the graph's launch is. */
#define _GNU_SOURCE
#include "hooks.h"

static int slow(cgpu_gate *g, CUstream stream) {
    __typeof__(cuStreamIsCapturing) *capturing = REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (capturing && capturing(stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE)
        return 0; /* recorded into a graph, not run: the graph's launch is gated */
    return cgpu_gate_slow(g);
}

#define GATED(stream, call)                                          \
    do {                                                             \
        int pos_ = cgpu_env_ok ? cgpu_current_pos() : -1;                 \
        if (pos_ < 0)                                                \
            return call;                                             \
        cgpu_gate *g_ = &cgpu_gates[pos_];                           \
        int counted_ = cgpu_gate_enter(g_) ? 1 : slow(g_, stream);   \
        if (counted_ < 0)                                            \
            return CGPU_REFUSED_ERROR;                               \
        CUresult r_ = call;                                          \
        if (counted_ > 0)                                            \
            cgpu_gate_leave(g_);                                     \
        return r_;                                                   \
    } while (0)

#define LAUNCH_KERNEL(name)                                                                               \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params, void **extra) {                              \
        REAL_OR_FAIL(name);                                                                               \
        GATED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                               \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name)                                                                   \
    CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) { \
        REAL_OR_FAIL(name);                                                               \
        GATED(cfg ? cfg->hStream : NULL, real(cfg, f, params, extra));                    \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name)                                                                                 \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params) {                                            \
        REAL_OR_FAIL(name);                                                                               \
        GATED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                                      \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define GRAPH_LAUNCH(name)                                \
    CUresult name(CUgraphExec exec, CUstream s) {         \
        REAL_OR_FAIL(name);                               \
        GATED(s, cgpu_graph_mem_launch(exec, s, real));   \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)
