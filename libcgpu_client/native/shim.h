/* Internals of libcgpu.so shared by its two halves: client.c (the daemon connection,
 * slice gates and memory ledger calls) and hooks.c (the CUDA and NVML entry points). */
#ifndef CGPU_SHIM_H
#define CGPU_SHIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cuda_min.h"
#include "env.h"

#define CGPU_HIDDEN __attribute__((visibility("hidden")))

static inline int64_t cgpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One GPU's lease. The fast path reads `deadline` and counts itself in `inflight`
 * without a lock; everything else happens under `mu`. */
typedef struct {
    _Atomic int64_t deadline; /* CLOCK_MONOTONIC ns; 0 = no valid lease */
    _Atomic int inflight;     /* launches between the check and the real call's return */
    _Atomic int64_t last_use;
    int pos;                  /* the CUDA device ordinal / place in the visible list */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t lease;           /* 0 = none */
    int64_t granted_at;
    int waiting;              /* an acquire (or release with again) is outstanding */
    int revoked;
    CUcontext ctx;            /* the context that took the lease, synchronised at its end */
    int64_t quiet_use;        /* idle thread: the last_use it saw the queued work finish after */
    int64_t quiet_at;
    _Atomic int64_t mem_used; /* bytes this process holds on this GPU */
} cgpu_gate;

CGPU_HIDDEN extern cgpu_env cgpu_cfg;
CGPU_HIDDEN extern int cgpu_env_ok;
CGPU_HIDDEN extern cgpu_gate cgpu_gates[CGPU_MAX_GPUS];

CGPU_HIDDEN void cgpu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
CGPU_HIDDEN void cgpu_start(void);

/* Fast path: 1 when the lease is valid (inflight counted; call cgpu_gate_leave after the launch). */
static inline int cgpu_gate_enter(cgpu_gate *g) {
    atomic_fetch_add(&g->inflight, 1);
    int64_t now = cgpu_now();
    if (now < atomic_load(&g->deadline)) {
        atomic_store_explicit(&g->last_use, now, memory_order_relaxed);
        return 1;
    }
    atomic_fetch_sub(&g->inflight, 1);
    return 0;
}
static inline void cgpu_gate_leave(cgpu_gate *g) { atomic_fetch_sub(&g->inflight, 1); }

/* Slow path: waits for a lease. 1: inflight counted; 0: run unchecked (daemon gone, on_loss=run). */
CGPU_HIDDEN int cgpu_gate_slow(cgpu_gate *g);

/* Memory against the instance's ledger. reserve: 1 granted, 0 denied, -1 unchecked (no daemon). */
CGPU_HIDDEN int cgpu_mem_reserve(int pos, int64_t bytes);
CGPU_HIDDEN void cgpu_mem_free(int pos, int64_t bytes);
/* The ledger of GPU pos: used and limit (bytes). 0 on success. */
CGPU_HIDDEN int cgpu_mem_query(int pos, int64_t *used, int64_t *limit);

/* provided by hooks.c: synchronise a context through the real driver */
CGPU_HIDDEN void cgpu_sync_context(CUcontext ctx);
CGPU_HIDDEN CUcontext cgpu_current_context(void);

#endif
