/* libcgpu.so's slice gates and memory ledger calls: the slow path that ends a lease and waits
 * for the next, the idle thread that gives back leases nobody uses, and reservations against
 * the instance's memory limit. The device is reached through the ops the driver layer gives. */
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>

#include "shim.h"

cgpu_gate cgpu_gates[CGPU_MAX_GPUS];

static cgpu_device_ops dev;
static pthread_mutex_t idle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_cv;
static _Atomic int started;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static void wake_idle_thread(void) {
    pthread_mutex_lock(&idle_mu);
    pthread_cond_signal(&idle_cv);
    pthread_mutex_unlock(&idle_mu);
}

/* Wait for launches that passed the fast path before the deadline was cleared. */
static void drain_inflight(cgpu_gate *g) {
    while (atomic_load(&g->inflight) > 0)
        sched_yield();
}

static void sync_gate(cgpu_gate *g) {
    CUcontext cur = dev.current();
    if (cur)
        dev.sync(cur);
    if (g->ctx && g->ctx != cur)
        dev.sync(g->ctx);
}

/* Under g->mu, with the deadline already cleared and nothing in flight. */
static void give_back(cgpu_gate *g, int again) {
    uint64_t lease = g->lease;
    g->lease = 0;
    g->revoked = 0;
    atomic_store(&g->deadline, 0);
    if (!lease)
        return;
    cgpu_board_turn(g->pos, 0);
    int64_t used = cgpu_now() - g->granted_at;
    int64_t wake = g->first_use ? g->first_use - g->granted_at : 0; /* what the hand-over cost this client */
    g->waiting = again;
    if (cgpu_conn_connected())
        cgpu_send_release(g->pos, lease, used, wake, (int64_t)cgpu_board_spin_take(g->pos), again);
}

/* End the lease now: nothing new starts, what started finishes, the queued work is waited for. */
static void end_lease(cgpu_gate *g, int again) {
    atomic_store(&g->deadline, 0);
    drain_inflight(g);
    sync_gate(g);
    give_back(g, again);
}

int cgpu_gate_slow(cgpu_gate *g, int coll) {
    cgpu_start();
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (cgpu_gate_enter(g)) {
            if (!g->first_use)
                g->first_use = cgpu_now();
            pthread_mutex_unlock(&g->mu);
            return 1;
        }
        int connected = cgpu_conn_connected();
        if (cgpu_conn_refused()) {
            if (coll)
                cgpu_board_unlaunch(g->pos, coll);
            pthread_mutex_unlock(&g->mu);
            return -1;
        }
        if (!connected && cgpu_cfg.on_loss_run) {
            pthread_mutex_unlock(&g->mu);
            return 0;
        }
        if (connected) {
            if (g->lease && !g->revoked && cgpu_board_may_finish(g->pos, coll)) {
                /* past the turn's end, but a peer of its gang waits in a collective this rank has yet to
                 * launch (board.c): it goes on until it has, billed as the turn's overrun */
                atomic_fetch_add(&g->inflight, 1);
                atomic_store_explicit(&g->last_use, cgpu_now(), memory_order_relaxed);
                pthread_mutex_unlock(&g->mu);
                return 1;
            }
            if (g->lease) { /* expired or revoked: end the slice, keep our place in the round */
                end_lease(g, 1);
            } else if (!g->waiting) {
                g->waiting = 1;
                cgpu_send_acquire(g->pos);
            }
        }
        if (coll) /* not launched in this turn: counted again when it is */
            cgpu_board_unlaunch(g->pos, coll);
        struct timespec ts;
        cgpu_deadline_in(&ts, 200 * 1000000LL);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->ctx || g->lease == 0)
            g->ctx = dev.current();
        if (coll)
            coll = cgpu_board_launch(g->pos, coll);
    }
}

/* ------------------------------------------------------- connection events */

static void on_grant(int pos, uint64_t lease, int64_t deadline) {
    cgpu_gate *g = &cgpu_gates[pos];
    pthread_mutex_lock(&g->mu);
    if (lease == g->lease) { /* the daemon moved our deadline (an extended lease cut back, a gang's next turn) */
        if (!g->revoked) {
            atomic_store(&g->deadline, deadline);
            cgpu_board_turn(pos, deadline);
        }
    } else {
        g->lease = lease;
        g->revoked = 0;
        g->waiting = 0;
        g->granted_at = cgpu_now();
        g->first_use = 0;
        g->ctx = NULL;
        atomic_store(&g->last_use, g->granted_at);
        cgpu_board_turn(pos, deadline);
        atomic_store(&g->deadline, deadline);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    wake_idle_thread();
}

static void on_revoke(int pos, uint64_t lease) {
    cgpu_gate *g = &cgpu_gates[pos];
    pthread_mutex_lock(&g->mu);
    if (lease == g->lease) {
        g->revoked = 1;
        atomic_store(&g->deadline, 0); /* the next launch takes the slow path */
    }
    pthread_mutex_unlock(&g->mu);
    wake_idle_thread();
}

static void each_gate_broadcast(int reset) {
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        cgpu_gate *g = &cgpu_gates[p];
        pthread_mutex_lock(&g->mu);
        if (reset) {
            atomic_store(&g->deadline, 0);
            cgpu_board_turn(p, 0);
            g->lease = 0;
            g->waiting = 0;
            g->revoked = 0;
        }
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
}

static void on_lost(void) { each_gate_broadcast(1); }
static void on_connected(void) { each_gate_broadcast(0); }
static void on_refused(void) { each_gate_broadcast(0); }
static int64_t held_bytes(int pos) { return atomic_load(&cgpu_gates[pos].mem_used); }

static const cgpu_events events = {on_grant, on_revoke, on_lost, on_connected, on_refused, held_bytes};

/* ------------------------------------------------------------ idle thread */

/* Gives back leases that are revoked, or unused: no launch for idle_ms, then the work
 * already queued finished, then still no launch for another idle_ms (a program that
 * waits for its kernels and launches again at once keeps its lease). A lease of a gang's
 * turn whose peers still work, or wait in a collective for this process's next one, is
 * kept (board.c, cgpu_board_keeps). */
static void *idle_main(void *arg) {
    (void)arg;
    int64_t idle_ns = (int64_t)(cgpu_cfg.idle_ms * 1e6);
    for (;;) {
        int64_t now = cgpu_now(), wake = now + 1000000000LL;
        for (int p = 0; p < cgpu_cfg.ngpus; p++) {
            cgpu_gate *g = &cgpu_gates[p];
            pthread_mutex_lock(&g->mu);
            int64_t last = atomic_load(&g->last_use);
            if (g->lease && !g->revoked && now - last >= idle_ns && g->quiet_use != last && g->ctx) {
                CUcontext ctx = g->ctx; /* phase 1: wait for the queued work, lease kept */
                pthread_mutex_unlock(&g->mu);
                dev.sync(ctx);
                pthread_mutex_lock(&g->mu);
                g->quiet_use = last;
                g->quiet_at = now = cgpu_now();
            }
            if (g->lease) {
                int idle = now - last >= idle_ns &&
                           (!g->ctx || (g->quiet_use == last && now - g->quiet_at >= idle_ns));
                if (g->revoked || (idle && !cgpu_board_keeps(g->pos))) {
                    end_lease(g, 0);
                    pthread_cond_broadcast(&g->cv);
                } else if (idle) { /* kept for its peers: looked at again */
                    cgpu_board_resting(g->pos, 1);
                    wake = now + idle_ns < wake ? now + idle_ns : wake;
                } else {
                    cgpu_board_resting(g->pos, 0);
                    int64_t due = g->quiet_use == last ? g->quiet_at + idle_ns : last + idle_ns;
                    wake = due < wake ? due : wake;
                }
            }
            pthread_mutex_unlock(&g->mu);
        }
        pthread_mutex_lock(&idle_mu);
        struct timespec ts;
        int64_t wait = wake - cgpu_now();
        cgpu_deadline_in(&ts, wait > 0 ? wait : 0);
        pthread_cond_timedwait(&idle_cv, &idle_mu, &ts);
        pthread_mutex_unlock(&idle_mu);
    }
    return NULL;
}

void cgpu_start(void) {
    if (atomic_load(&started))
        return;
    pthread_mutex_lock(&start_mu);
    if (!atomic_load(&started)) {
        cgpu_conn_start(&events);
        cgpu_spawn(idle_main, "idle");
        atomic_store(&started, 1);
    }
    pthread_mutex_unlock(&start_mu);
}

/* ----------------------------------------------------------------- memory */

int cgpu_mem_reserve(int pos, int64_t bytes) {
    cgpu_start();
    for (;;) {
        if (!cgpu_conn_wait(cgpu_cfg.on_loss_run ? 0 : -1)) {
            if (cgpu_conn_refused())
                return -2;
            atomic_fetch_add(&cgpu_gates[pos].mem_used, bytes); /* on_loss=run: unchecked */
            return -1;
        }
        int ok;
        int64_t used, limit;
        if (cgpu_rpc_mem(pos, bytes, &ok, &used, &limit) != 0)
            continue; /* the daemon went away: ask the next one */
        if (ok)
            atomic_fetch_add(&cgpu_gates[pos].mem_used, bytes);
        else
            cgpu_log("out of memory on GPU %d: %lld bytes requested, %lld of %lld in use by the instance",
                     pos, (long long)bytes, (long long)used, (long long)limit);
        return ok;
    }
}

void cgpu_mem_free(int pos, int64_t bytes) {
    atomic_fetch_sub(&cgpu_gates[pos].mem_used, bytes);
    if (cgpu_conn_connected())
        cgpu_send_mem_free(pos, bytes);
}

int cgpu_mem_query(int pos, int64_t *used, int64_t *limit) {
    cgpu_start();
    int ok;
    if (cgpu_conn_wait(2000) && cgpu_rpc_mem(pos, -1, &ok, used, limit) == 0)
        return 0;
    if (cgpu_conn_limit(pos) <= 0)
        return -1; /* never registered */
    *limit = cgpu_conn_limit(pos); /* daemon unreachable: the last limit and what this process holds */
    *used = atomic_load(&cgpu_gates[pos].mem_used);
    return 0;
}

/* -------------------------------------------------------------- lifecycle */

static void init_gates(void) {
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        cgpu_gate *g = &cgpu_gates[p];
        memset(g, 0, sizeof *g);
        g->pos = p;
        pthread_mutex_init(&g->mu, NULL);
        cgpu_cond_init(&g->cv);
    }
    cgpu_cond_init(&idle_cv);
}

void cgpu_gates_init(const cgpu_device_ops *ops) {
    dev = *ops;
    init_gates();
    cgpu_conn_init();
}

/* A forked child has none of the parent's threads: it starts afresh at its first gated call. */
void cgpu_gates_after_fork(void) {
    cgpu_captures_after_fork();
    cgpu_board_after_fork();
    cgpu_conn_after_fork();
    atomic_store(&started, 0);
    pthread_mutex_init(&idle_mu, NULL);
    pthread_mutex_init(&start_mu, NULL);
    init_gates();
}
