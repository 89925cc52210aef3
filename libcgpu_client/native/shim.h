/* Internals of libcgpu.so, in layers that only call downwards:
 *
 *   preload.c  start-up: parse the environment, wire the layers together, fork handling
 *   launch.c, memory.c   the CUDA and NVML entry points the shim interposes
 *   resolve.c  the real driver: symbol lookup, dlsym and cuGetProcAddress, context helpers
 *   gates.c    the slice gates (slow path, idle thread) and the memory ledger calls
 *   board.c    where a job's ranks agree on the collective at which a gang turn stops
 *   conn.c     the daemon connection: one socket, a reader thread, requests and replies
 *   log.c, env.c, mp.c   the process's settings and log, env parsing, the msgpack codec
 *
 * A lower layer reaches a higher one only through the callbacks it is given at start. */
#ifndef CGPU_SHIM_H
#define CGPU_SHIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cuda_min.h"
#include "env.h"

#define CGPU_HIDDEN __attribute__((visibility("hidden")))

/* What a gated call returns while arbiterd refuses this process's registration (behaviour §1): the
 * driver's code for a device that is "unavailable at the current time", as under an exclusive compute mode. */
#define CGPU_REFUSED_ERROR CUDA_ERROR_DEVICE_UNAVAILABLE

static inline int64_t cgpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ log.c */
CGPU_HIDDEN extern cgpu_env cgpu_cfg;
CGPU_HIDDEN extern int cgpu_env_ok; /* parsed, and not CGPU_DISABLE */
CGPU_HIDDEN void cgpu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
CGPU_HIDDEN void cgpu_cond_init(pthread_cond_t *cv); /* a condition variable on CLOCK_MONOTONIC */
CGPU_HIDDEN int cgpu_spawn(void *(*fn)(void *), const char *what); /* a detached thread; logged on failure */
CGPU_HIDDEN void cgpu_deadline_in(struct timespec *ts, int64_t ns);
/* capture.c: 1 once no stream capture is open, holding new ones back until cgpu_captures_release; 0 where a sync
 * must be skipped (a capture of the calling thread, or one open too long) */
CGPU_HIDDEN int cgpu_captures_hold(void);
CGPU_HIDDEN void cgpu_captures_release(void);
CGPU_HIDDEN void cgpu_captures_after_fork(void);

/* ---------------------------------------------------------------- board.c */
/* Where a gang turn stops: each process's collectives per GPU, beside the turn (deadline) it holds. */
CGPU_HIDDEN void cgpu_board_turn(int pos, int64_t key); /* the turn held on GPU pos (its deadline); 0: none */
/* A launch holding n >= 1 collectives (a kernel, or a graph's replay) is about to be made (before its gate): n when
 * counted, 0 when not (then, if it is not launched, cgpu_board_unlaunch(pos, n)). */
CGPU_HIDDEN int cgpu_board_launch(int pos, int n);
CGPU_HIDDEN void cgpu_board_unlaunch(int pos, int n);
/* The counted launch of n collectives went through GPU pos's gate at t (the gate's clock read): each of them is
 * stamped, and the peers that launched the same collectives earlier are credited their wait for them as spin. */
CGPU_HIDDEN void cgpu_board_launched(int pos, int64_t t, int n);
/* The spin counted for this process on GPU pos since the last call (ns), reset. */
CGPU_HIDDEN uint64_t cgpu_board_spin_take(int pos);
/* Past the turn's end with its lease held: 1 while the launch holds the turn's stop on GPU pos, or leads to it
 * (coll: the collectives it holds, counted; cgpu_board_holds_stop), so the launch goes on. */
CGPU_HIDDEN int cgpu_board_may_finish(int pos, int coll);
/* 1 while this process's idle lease on GPU pos is kept for its gang: within the turn, while a peer holding the same
 * turn on the board has launched a collective this process has yet to launch, or works (is not resting); past the
 * turn's deadline, while such a peer's collective is one it may still catch up to (100 ms at most). */
CGPU_HIDDEN int cgpu_board_keeps(int pos);
/* Whether this process keeps its idle lease on GPU pos for its peers (1) or works there (0); a new turn is 0. */
CGPU_HIDDEN void cgpu_board_resting(int pos, int on);
/* The catch-up rule: a launch of n collectives made after `launched` of them goes on past the deadline when it holds
 * the stop-th (launched < stop <= launched + n); one of none (a kernel that is no collective) when the next
 * collective is the stop. For n = 1: stop == launched + 1. */
static inline int cgpu_board_holds_stop(uint64_t launched, int n, uint64_t stop) {
    return launched < stop && stop <= launched + (uint64_t)(n > 0 ? n : 1);
}
CGPU_HIDDEN void cgpu_board_after_fork(void);

/* ----------------------------------------------------------------- conn.c */
/* What the connection tells the layer above; pos is the visible GPU position. */
typedef struct {
    void (*grant)(int pos, uint64_t lease, int64_t deadline);
    void (*revoke)(int pos, uint64_t lease);
    void (*lost)(void);             /* every lease is gone */
    void (*connected)(void);        /* registered (again) */
    void (*refused)(void);          /* the daemon refused the registration */
    int64_t (*held_bytes)(int pos); /* memory this process holds, re-reserved after a reconnect */
} cgpu_events;

CGPU_HIDDEN void cgpu_conn_init(void);                   /* at load */
CGPU_HIDDEN void cgpu_conn_start(const cgpu_events *ev); /* the reader thread, once */
CGPU_HIDDEN int cgpu_conn_connected(void);
/* Refused: the daemon's last answer to a registration was an error other than busy (it is asked again). */
CGPU_HIDDEN int cgpu_conn_refused(void);
/* until registered or refused: forever (< 0) or wait_ms; 1 if registered */
CGPU_HIDDEN int cgpu_conn_wait(int wait_ms);
CGPU_HIDDEN int64_t cgpu_conn_limit(int pos); /* the limit learned at registration; 0 if never */
/* The UUID of GPU pos as the daemon named it at registration ("GPU-..."); "" before one. */
CGPU_HIDDEN const char *cgpu_conn_uuid(int pos);
CGPU_HIDDEN int cgpu_conn_gpu(int pos); /* the daemon's index of GPU pos; -1 before a registration */
CGPU_HIDDEN const char *cgpu_conn_instance(void); /* the instance the daemon resolved; "" before a registration */
CGPU_HIDDEN void cgpu_send_acquire(int pos);
/* used: grant received to release sent; warmup: grant received to the first launch; spin: collective spin
 * counted on the board since the last release (each 0: left off) */
CGPU_HIDDEN void cgpu_send_release(int pos, uint64_t lease, int64_t used, int64_t warmup, int64_t spin, int again);
CGPU_HIDDEN void cgpu_send_mem_free(int pos, int64_t bytes);
/* mem_reserve (bytes > 0) or mem_query (bytes < 0): 0 answered, -1 not connected, -2 lost on the way */
CGPU_HIDDEN int cgpu_rpc_mem(int pos, int64_t bytes, int *ok, int64_t *used, int64_t *limit);
CGPU_HIDDEN void cgpu_conn_after_fork(void);

/* ---------------------------------------------------------------- gates.c */
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
    int64_t first_use;        /* the first launch the lease let through; 0 before it */
    int waiting;              /* an acquire (or release with again) is outstanding */
    int revoked;
    CUcontext ctx;            /* the context that took the lease, synchronised at its end */
    int64_t quiet_use;        /* idle thread: the last_use it saw the queued work finish after */
    int64_t quiet_at;
    _Atomic int64_t mem_used; /* bytes this process holds on this GPU */
} cgpu_gate;

/* How the gates reach the device: given by the layer that knows the driver. */
typedef struct {
    void (*sync)(CUcontext ctx);
    CUcontext (*current)(void);
} cgpu_device_ops;

CGPU_HIDDEN extern cgpu_gate cgpu_gates[CGPU_MAX_GPUS];
CGPU_HIDDEN void cgpu_gates_init(const cgpu_device_ops *dev);
CGPU_HIDDEN void cgpu_start(void); /* the connection and the idle thread, at cuInit or the first gated call */
CGPU_HIDDEN void cgpu_gates_after_fork(void);

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

/* Slow path: waits for a lease. 1: inflight counted; 0: run unchecked (daemon gone, on_loss=run);
 * -1: fail the call with CGPU_REFUSED_ERROR (the daemon refused this process). coll: the collectives the launch
 * holds (a kernel's 1, a graph's replay its captured ones), counted on the board (cgpu_board_launch) before the
 * fast path; 0: none. */
CGPU_HIDDEN int cgpu_gate_slow(cgpu_gate *g, int coll);

/* Memory against the instance's ledger. reserve: 1 granted, 0 denied, -1 unchecked (no daemon),
 * -2 refused (fail with CGPU_REFUSED_ERROR). */
CGPU_HIDDEN int cgpu_mem_reserve(int pos, int64_t bytes);
CGPU_HIDDEN void cgpu_mem_free(int pos, int64_t bytes);
/* The ledger of GPU pos: used and limit (bytes). 0 on success. */
CGPU_HIDDEN int cgpu_mem_query(int pos, int64_t *used, int64_t *limit);

#endif
