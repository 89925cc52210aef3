/* libcgpu.so's launch hooks: every kernel launch (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz variants) passes the slice gate of
 * its device: one clock read while the lease is valid, the slow path (gates.c) when not.
 * Launches recorded into a graph by stream capture are not gated; the graph's launch is.
 * A kernel launch that is a collective (its name contains a part of CGPU_COLLECTIVE_KERNELS) is counted on
 * the board (board.c) before its gate, so that a job's ranks end a gang turn at the same collective, and stamped
 * there once through it, so that the board can tell how long a peer's same collective waited for it. A collective
 * launched into a capturing stream is counted for the graph instead (graphcoll.c), and a launch of an executable
 * graph counts the n collectives captured into it, as n launched at once. */
#define _GNU_SOURCE
#include <string.h>

#include "hooks.h"

static int slow(cgpu_gate *g, CUstream stream, int coll) {
    if (cgpu_stream_capturing(stream))
        return 0; /* recorded into a graph, not run: the graph's launch is gated */
    return cgpu_gate_slow(g, coll);
}

/* Whether f's name (cuFuncGetName; cuKernelGetName for a CUkernel passed as a function, CUDA 12.3) contains a
 * part of CGPU_COLLECTIVE_KERNELS. NCCL names its kernels ncclKernel_* (to 2.18) and ncclDevKernel_* (2.19 on). */
static int classify(CUfunction f) {
    const char *name = NULL;
    __typeof__(cuFuncGetName) *fn = REAL(cuFuncGetName);
    if (!fn || fn(&name, f) != CUDA_SUCCESS || !name) {
        __typeof__(cuKernelGetName) *kn = REAL(cuKernelGetName);
        name = NULL;
        if (!kn || kn(&name, (CUkernel)(void *)f) != CUDA_SUCCESS || !name)
            return 0; /* a driver before 12.3 names no kernel: nothing is counted */
    }
    for (int i = 0; i < cgpu_cfg.ncoll; i++)
        if (strstr(name, cgpu_cfg.coll[i]))
            return 1;
    return 0;
}

/* Each handle's answer, cached: the handle with 1 (a collective) or 2 (not) in its low bits. A handle freed
 * with its module and reused for another kernel keeps the first answer. */
#define KINDS 1024
static _Atomic uintptr_t kinds[KINDS];

/* 1 when f is a collective (its launch holds one), else 0. */
static int collective(CUfunction f) {
    if (!f || !cgpu_cfg.ncoll)
        return 0;
    uintptr_t h = (uintptr_t)f;
    size_t at = (size_t)(((uint64_t)h >> 3) * 0x9E3779B97F4A7C15ull >> 54);
    int kind = 0;
    for (int k = 0; k < 8 && !kind && !(h & 3); k++) {
        uintptr_t v = atomic_load_explicit(&kinds[(at + k) % KINDS], memory_order_acquire);
        if (!v)
            break;
        if ((v & ~(uintptr_t)3) == h)
            kind = (int)(v & 3);
    }
    if (!kind) {
        kind = classify(f) ? 1 : 2;
        for (int k = 0; k < 8 && !(h & 3); k++) {
            uintptr_t empty = 0;
            if (atomic_compare_exchange_strong(&kinds[(at + k) % KINDS], &empty, h | (uintptr_t)kind))
                break;
        }
    }
    return kind == 1;
}

/* A launch holding ncoll collectives: counted on the board, or, on a capturing stream, for the capture's graph once
 * the driver took the launch (nothing runs then: the graph's launches count them). */
#define GATED(stream, ncoll, call)                                                                         \
    do {                                                                  \
        int pos_ = cgpu_env_ok ? cgpu_current_pos() : -1;                 \
        if (pos_ < 0)                                                     \
            return call;                                                  \
        cgpu_gate *g_ = &cgpu_gates[pos_];                                \
        int n_ = (ncoll), captured_ = 0;                                  \
        if (n_ > 0 && cgpu_stream_capturing(stream)) {                    \
            captured_ = n_;                                               \
            n_ = 0;                                                       \
        }                                                                 \
        int coll_ = n_ > 0 ? cgpu_board_launch(pos_, n_) : 0;             \
        int counted_ = cgpu_gate_enter(g_) ? 1 : slow(g_, stream, coll_); \
        if (counted_ < 0)                                                 \
            return CGPU_REFUSED_ERROR;                                    \
        if (coll_) /* the gate's own clock read: when it let it through */ \
            cgpu_board_launched(pos_, counted_ ? atomic_load_explicit(&g_->last_use, memory_order_relaxed) \
                                               : cgpu_now(), coll_);      \
        CUresult r_ = call;                                               \
        if (counted_ > 0)                                                 \
            cgpu_gate_leave(g_);                                          \
        if (captured_ && r_ == CUDA_SUCCESS)                              \
            cgpu_graph_coll_captured(stream, captured_);                  \
        return r_;                                                        \
    } while (0)

#define LAUNCH_KERNEL(name)                                                                                \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params, void **extra) {                               \
        REAL_OR_FAIL(name);                                                                                \
        GATED(s, collective(f), real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                 \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name)                                                                   \
    CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) { \
        REAL_OR_FAIL(name); \
        GATED(cfg ? cfg->hStream : NULL, collective(f), real(cfg, f, params, extra)); \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name)                                                                                  \
    CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                  unsigned shmem, CUstream s, void **params) {                                             \
        REAL_OR_FAIL(name);                                                                                \
        GATED(s, collective(f), real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                        \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define GRAPH_LAUNCH(name)                                                                                  \
    CUresult name(CUgraphExec exec, CUstream s) {                                                           \
        REAL_OR_FAIL(name);                                                                                 \
        GATED(s, cgpu_graph_coll_of(exec), cgpu_graph_mem_launch(exec, s, real));                           \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)
