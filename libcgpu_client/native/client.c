/* libcgpu.so, the daemon side: one connection to arbiterd per process, a reader
 * thread that owns it (connects, registers, reconnects with backoff, dispatches
 * grants, revokes and replies), an idle thread that gives back unused or revoked
 * leases, and the slice gates' slow path. Protocol: proto/PROTOCOL.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "mp.h"
#include "shim.h"

#define MAX_PENDING 32
#define ARENA_NODES 8192

cgpu_env cgpu_cfg;
int cgpu_env_ok;
cgpu_gate cgpu_gates[CGPU_MAX_GPUS];

static struct {
    pthread_mutex_t mu; /* connection state and pending replies */
    pthread_cond_t cv;
    pthread_mutex_t send_mu;
    _Atomic int fd;          /* -1 when not connected */
    _Atomic int connected;   /* registered and usable */
    _Atomic int started;
    int dgpu[CGPU_MAX_GPUS]; /* the daemon's GPU index of each visible position */
    int64_t limit[CGPU_MAX_GPUS];
    int64_t next_id;
    struct { int64_t id; int state; int ok; int64_t used, limit; } pending[MAX_PENDING]; /* state 1 waiting, 2 done */
    pthread_cond_t idle_cv;
} C = {
    .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .send_mu = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1, .idle_cv = PTHREAD_COND_INITIALIZER,
};

void cgpu_log(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    char out[540];
    int m = snprintf(out, sizeof out, "cgpu[%d]: %.*s", (int)getpid(), n, line);
    if (write(2, out, (size_t)(m < (int)sizeof out ? m : (int)sizeof out - 1)) < 0) {
        /* nothing better to do */
    }
}

static void ts_after(struct timespec *ts, int64_t ns) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ns / 1000000000LL;
    ts->tv_nsec += ns % 1000000000LL;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* ------------------------------------------------------------------ sending */

static int send_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Send one packed message; on failure the reader thread notices the dead socket. */
static int send_msg(const mp_writer *w) {
    if (w->err)
        return -1;
    pthread_mutex_lock(&C.send_mu);
    int fd = atomic_load(&C.fd);
    int rc = fd >= 0 ? send_all(fd, w->buf, w->len) : -1;
    if (rc < 0 && fd >= 0)
        shutdown(fd, SHUT_RDWR);
    pthread_mutex_unlock(&C.send_mu);
    return rc;
}

static void send_acquire(int dgpu) {
    uint8_t b[64];
    mp_writer w;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 3);
    mp_w_str(&w, "op"), mp_w_str(&w, "acquire");
    mp_w_str(&w, "id"), mp_w_int(&w, 0);
    mp_w_str(&w, "gpu"), mp_w_int(&w, dgpu);
    send_msg(&w);
}

static void send_release(int dgpu, uint64_t lease, int64_t used, int again) {
    uint8_t b[128];
    mp_writer w;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 5);
    mp_w_str(&w, "op"), mp_w_str(&w, "release");
    mp_w_str(&w, "gpu"), mp_w_int(&w, dgpu);
    mp_w_str(&w, "lease"), mp_w_uint(&w, lease);
    mp_w_str(&w, "used_ns"), mp_w_int(&w, used);
    mp_w_str(&w, "again"), mp_w_bool(&w, again);
    send_msg(&w);
}

static void send_mem(const char *op, int64_t id, int dgpu, int64_t bytes) {
    uint8_t b[96];
    mp_writer w;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 4);
    mp_w_str(&w, "op"), mp_w_str(&w, op);
    mp_w_str(&w, "id"), mp_w_int(&w, id);
    mp_w_str(&w, "gpu"), mp_w_int(&w, dgpu);
    mp_w_str(&w, "bytes"), mp_w_int(&w, bytes);
    send_msg(&w);
}

/* -------------------------------------------------------------- the gates */

/* Wait for launches that passed the fast path before the deadline was cleared. */
static void drain_inflight(cgpu_gate *g) {
    while (atomic_load(&g->inflight) > 0)
        sched_yield();
}

static void sync_gate(cgpu_gate *g) {
    CUcontext cur = cgpu_current_context();
    if (cur)
        cgpu_sync_context(cur);
    if (g->ctx && g->ctx != cur)
        cgpu_sync_context(g->ctx);
}

/* Under g->mu, with the deadline already cleared and nothing in flight. */
static void give_back(cgpu_gate *g, int again) {
    uint64_t lease = g->lease;
    g->lease = 0;
    g->revoked = 0;
    atomic_store(&g->deadline, 0);
    if (!lease)
        return;
    int64_t used = cgpu_now() - g->granted_at;
    g->waiting = again;
    if (atomic_load(&C.connected))
        send_release(C.dgpu[g->pos], lease, used, again);
}

int cgpu_gate_slow(cgpu_gate *g) {
    cgpu_start();
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (cgpu_gate_enter(g)) {
            pthread_mutex_unlock(&g->mu);
            return 1;
        }
        int connected = atomic_load(&C.connected);
        if (!connected && cgpu_cfg.on_loss_run) {
            pthread_mutex_unlock(&g->mu);
            return 0;
        }
        if (connected) {
            if (g->lease) { /* expired or revoked: end the slice, keep our place in the round */
                atomic_store(&g->deadline, 0);
                drain_inflight(g);
                sync_gate(g);
                give_back(g, 1);
            } else if (!g->waiting) {
                g->waiting = 1;
                send_acquire(C.dgpu[g->pos]);
            }
        }
        struct timespec ts;
        ts_after(&ts, 200 * 1000000LL);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->ctx || g->lease == 0)
            g->ctx = cgpu_current_context();
    }
}

static void on_grant(int dgpu, uint64_t lease, int64_t deadline) {
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        if (C.dgpu[p] != dgpu)
            continue;
        cgpu_gate *g = &cgpu_gates[p];
        pthread_mutex_lock(&g->mu);
        if (lease == g->lease) { /* the daemon moved our deadline (an extended lease cut back) */
            if (!g->revoked)
                atomic_store(&g->deadline, deadline);
        } else {
            g->lease = lease;
            g->revoked = 0;
            g->waiting = 0;
            g->granted_at = cgpu_now();
            g->ctx = NULL;
            atomic_store(&g->last_use, g->granted_at);
            atomic_store(&g->deadline, deadline);
        }
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_mutex_lock(&C.mu);
        pthread_cond_signal(&C.idle_cv);
        pthread_mutex_unlock(&C.mu);
    }
}

static void on_revoke(int dgpu, uint64_t lease) {
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        cgpu_gate *g = &cgpu_gates[p];
        if (C.dgpu[p] != dgpu)
            continue;
        pthread_mutex_lock(&g->mu);
        if (lease == g->lease) {
            g->revoked = 1;
            atomic_store(&g->deadline, 0); /* the next launch takes the slow path */
        }
        pthread_mutex_unlock(&g->mu);
        pthread_mutex_lock(&C.mu);
        pthread_cond_signal(&C.idle_cv);
        pthread_mutex_unlock(&C.mu);
    }
}

/* Gives back leases that are revoked, or unused: no launch for idle_ms, then the work
 * already queued finished, then still no launch for another idle_ms (a program that
 * waits for its kernels and launches again at once keeps its lease). */
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
                cgpu_sync_context(ctx);
                pthread_mutex_lock(&g->mu);
                g->quiet_use = last;
                g->quiet_at = now = cgpu_now();
            }
            if (g->lease) {
                if (g->revoked || (now - last >= idle_ns && (!g->ctx || (g->quiet_use == last &&
                                                                      now - g->quiet_at >= idle_ns)))) {
                    atomic_store(&g->deadline, 0);
                    drain_inflight(g);
                    sync_gate(g);
                    give_back(g, 0);
                    pthread_cond_broadcast(&g->cv);
                } else {
                    int64_t due = g->quiet_use == last ? g->quiet_at + idle_ns : last + idle_ns;
                    wake = due < wake ? due : wake;
                }
            }
            pthread_mutex_unlock(&g->mu);
        }
        pthread_mutex_lock(&C.mu);
        struct timespec ts;
        int64_t wait = wake - cgpu_now();
        ts_after(&ts, wait > 0 ? wait : 0);
        pthread_cond_timedwait(&C.idle_cv, &C.mu, &ts);
        pthread_mutex_unlock(&C.mu);
    }
    return NULL;
}

/* ---------------------------------------------------------------- memory */

/* Wait until registered: forever (wait_ms < 0) or up to wait_ms. 1 when connected. */
static int wait_connected(int wait_ms) {
    struct timespec ts;
    ts_after(&ts, (int64_t)(wait_ms < 0 ? 0 : wait_ms) * 1000000LL);
    pthread_mutex_lock(&C.mu);
    while (!atomic_load(&C.connected)) {
        if (wait_ms < 0)
            pthread_cond_wait(&C.cv, &C.mu);
        else if (pthread_cond_timedwait(&C.cv, &C.mu, &ts) != 0)
            break;
    }
    pthread_mutex_unlock(&C.mu);
    return atomic_load(&C.connected);
}

/* One mem_reserve / mem_free round trip. 0: answered; -1: not connected; -2: lost on the way. */
static int rpc_mem(const char *op, int pos, int64_t bytes, int *ok, int64_t *used, int64_t *limit) {
    pthread_mutex_lock(&C.mu);
    int slot = -1;
    for (;;) {
        if (!atomic_load(&C.connected)) {
            pthread_mutex_unlock(&C.mu);
            return -1;
        }
        for (int k = 0; k < MAX_PENDING && slot < 0; k++)
            if (!C.pending[k].state)
                slot = k;
        if (slot >= 0)
            break;
        pthread_cond_wait(&C.cv, &C.mu);
    }
    int64_t id = ++C.next_id;
    C.pending[slot].id = id;
    C.pending[slot].state = 1;
    int dgpu = C.dgpu[pos];
    pthread_mutex_unlock(&C.mu);
    send_mem(op, id, dgpu, bytes);
    pthread_mutex_lock(&C.mu);
    while (C.pending[slot].state == 1)
        pthread_cond_wait(&C.cv, &C.mu);
    int done = C.pending[slot].state == 2;
    *ok = C.pending[slot].ok;
    *used = C.pending[slot].used;
    *limit = C.pending[slot].limit;
    C.pending[slot].state = 0;
    pthread_cond_broadcast(&C.cv);
    pthread_mutex_unlock(&C.mu);
    return done ? 0 : -2;
}

int cgpu_mem_reserve(int pos, int64_t bytes) {
    cgpu_start();
    for (;;) {
        if (!wait_connected(cgpu_cfg.on_loss_run ? 0 : -1)) {
            atomic_fetch_add(&cgpu_gates[pos].mem_used, bytes); /* on_loss=run: unchecked */
            return -1;
        }
        int ok;
        int64_t used, limit;
        if (rpc_mem("mem_reserve", pos, bytes, &ok, &used, &limit) != 0)
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
    if (atomic_load(&C.connected))
        send_mem("mem_free", 0, C.dgpu[pos], bytes);
}

int cgpu_mem_query(int pos, int64_t *used, int64_t *limit) {
    cgpu_start();
    int ok;
    if (wait_connected(2000) && rpc_mem("mem_reserve", pos, 0, &ok, used, limit) == 0)
        return 0;
    if (C.limit[pos] <= 0)
        return -1; /* never registered */
    *limit = C.limit[pos]; /* daemon unreachable: the last limit and what this process holds */
    *used = atomic_load(&cgpu_gates[pos].mem_used);
    return 0;
}

/* ------------------------------------------------------------- the reader */

static struct {
    uint8_t buf[MP_MAX_MESSAGE];
    size_t len;
    mp_node nodes[ARENA_NODES];
    mp_arena arena;
} R;

/* Read until one whole message is parsed; -1 on EOF, error, timeout or a bad frame. */
static int read_msg(int fd, mp_node **msg, int timeout_ms) {
    for (;;) {
        if (R.len) {
            long k = mp_parse(R.buf, R.len, &R.arena, msg);
            if (k > 0) {
                return (int)k;
            }
            if (k < 0) {
                cgpu_log("bad frame from arbiterd; reconnecting");
                return -1;
            }
        }
        /* Wait in poll() for input, even with no timeout: a thread blocked in recv() on a
         * UNIX stream socket is also woken each time the daemon reads what this socket sent
         * (a write-space wake-up, one per request), and poll() filters those out in the kernel. */
        struct pollfd pf = {fd, POLLIN, 0};
        int r = poll(&pf, 1, timeout_ms);
        if (r == 0)
            return -1;
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = recv(fd, R.buf + R.len, sizeof R.buf - R.len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        R.len += (size_t)n;
    }
}

static void consume(int k) {
    memmove(R.buf, R.buf + k, R.len - (size_t)k);
    R.len -= (size_t)k;
}

/* Send what ``w`` holds and read the reply into *m. Returns its length (consume it after
 * use), -1 if the connection failed, or -2 if the daemon answered with anything but
 * ``want``: it refused ``what``, which is logged with the daemon's message. */
static int request(int fd, const mp_writer *w, const char *want, const char *what, mp_node **m) {
    if (w->err || send_all(fd, w->buf, w->len) < 0)
        return -1;
    int k = read_msg(fd, m, 5000);
    if (k < 0)
        return -1;
    if (!mp_str_is(mp_get(*m, "op"), want)) {
        const mp_node *msg = mp_get(*m, "message");
        cgpu_log("arbiterd refused %s: %.*s", what, msg && msg->type == MP_STR ? (int)msg->n : 0,
                 msg && msg->type == MP_STR ? msg->v.s : "");
        consume(k);
        return -2;
    }
    return k;
}

static int handshake(int fd) {
    uint8_t b[2048];
    mp_writer w;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 4);
    mp_w_str(&w, "op"), mp_w_str(&w, "hello");
    mp_w_str(&w, "versions"), mp_w_array(&w, 1), mp_w_int(&w, 1);
    mp_w_str(&w, "client"), mp_w_str(&w, "libcgpu.so/0.1");
    mp_w_str(&w, "pid"), mp_w_int(&w, getpid());
    mp_node *m;
    int k = request(fd, &w, "welcome", "the connection", &m);
    if (k < 0)
        return k;
    consume(k);

    const cgpu_env *e = &cgpu_cfg;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, (uint32_t)(5 + (e->nmem > 0) + (e->highprio > 0) + (e->core_percent > 0)));
    mp_w_str(&w, "op"), mp_w_str(&w, "register");
    mp_w_str(&w, "id"), mp_w_int(&w, 1);
    mp_w_str(&w, "instance");
    if (e->instance[0])
        mp_w_str(&w, e->instance);
    else
        mp_w_nil(&w);
    mp_w_str(&w, "gpus"), mp_w_array(&w, (uint32_t)e->ngpus);
    for (int p = 0; p < e->ngpus; p++) {
        if (e->gpu_index[p] >= 0)
            mp_w_int(&w, e->gpu_index[p]);
        else
            mp_w_str(&w, e->gpu_uuid[p]);
    }
    mp_w_str(&w, "weight"), mp_w_int(&w, e->weight);
    if (e->nmem > 0) {
        mp_w_str(&w, "memsize"), mp_w_array(&w, (uint32_t)e->nmem);
        for (int p = 0; p < e->nmem; p++)
            mp_w_int(&w, e->memsize[p]);
    }
    if (e->highprio)
        mp_w_str(&w, "highprio"), mp_w_int(&w, 1);
    if (e->core_percent)
        mp_w_str(&w, "core_percent"), mp_w_int(&w, e->core_percent);
    k = request(fd, &w, "registered", "registration", &m);
    if (k < 0)
        return k;
    const mp_node *gpus = mp_get(m, "gpus");
    if (!gpus || gpus->type != MP_ARRAY || (int)gpus->n != e->ngpus) {
        consume(k);
        return -1;
    }
    for (int p = 0; p < e->ngpus; p++) {
        int64_t idx = -1, lim = 0;
        mp_get_i64(&gpus->v.kids[p], "gpu", &idx);
        mp_get_i64(&gpus->v.kids[p], "mem_limit", &lim);
        C.dgpu[p] = (int)idx;
        C.limit[p] = lim;
    }
    const mp_node *warn = mp_get(m, "warnings");
    for (uint32_t i = 0; warn && warn->type == MP_ARRAY && i < warn->n; i++)
        if (warn->v.kids[i].type == MP_STR)
            cgpu_log("arbiterd: %.*s", (int)warn->v.kids[i].n, warn->v.kids[i].v.s);
    consume(k);
    return 0;
}

static void dispatch(const mp_node *m) {
    const mp_node *op = mp_get(m, "op");
    int64_t gpu = -1, lease = 0, deadline = 0, re = -1;
    if (mp_str_is(op, "grant")) {
        if (!mp_get_i64(m, "gpu", &gpu) && !mp_get_i64(m, "lease", &lease) &&
            !mp_get_i64(m, "deadline_ns", &deadline))
            on_grant((int)gpu, (uint64_t)lease, deadline);
    } else if (mp_str_is(op, "revoke")) {
        if (!mp_get_i64(m, "gpu", &gpu) && !mp_get_i64(m, "lease", &lease))
            on_revoke((int)gpu, (uint64_t)lease);
    } else if (mp_str_is(op, "ok") || mp_str_is(op, "denied")) {
        if (mp_get_i64(m, "re", &re) || re <= 0)
            return;
        pthread_mutex_lock(&C.mu);
        for (int k = 0; k < MAX_PENDING; k++) {
            if (C.pending[k].state == 1 && C.pending[k].id == re) {
                C.pending[k].ok = mp_str_is(op, "ok");
                C.pending[k].used = C.pending[k].limit = 0;
                mp_get_i64(m, "used", &C.pending[k].used);
                mp_get_i64(m, "limit", &C.pending[k].limit);
                C.pending[k].state = 2;
                pthread_cond_broadcast(&C.cv);
            }
        }
        pthread_mutex_unlock(&C.mu);
    } else if (mp_str_is(op, "error")) {
        const mp_node *code = mp_get(m, "code"), *msg = mp_get(m, "message");
        if (code && code->type == MP_STR && msg && msg->type == MP_STR)
            cgpu_log("arbiterd: %.*s: %.*s", (int)code->n, code->v.s, (int)msg->n, msg->v.s);
    }
}

static void lose_connection(void) {
    pthread_mutex_lock(&C.send_mu);
    int fd = atomic_exchange(&C.fd, -1);
    atomic_store(&C.connected, 0);
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&C.send_mu);
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        cgpu_gate *g = &cgpu_gates[p];
        pthread_mutex_lock(&g->mu);
        atomic_store(&g->deadline, 0);
        g->lease = 0;
        g->waiting = 0;
        g->revoked = 0;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_lock(&C.mu);
    for (int k = 0; k < MAX_PENDING; k++)
        if (C.pending[k].state == 1)
            C.pending[k].state = 3; /* lost */
    pthread_cond_broadcast(&C.cv);
    pthread_mutex_unlock(&C.mu);
}

static int connect_socket(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", cgpu_cfg.socket);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *reader_main(void *arg) {
    (void)arg;
    int backoff_ms = 20, ever = 0, warned = 0;
    R.arena.nodes = R.nodes;
    R.arena.cap = ARENA_NODES;
    for (;;) {
        R.len = 0;
        int fd = connect_socket();
        int hs = fd >= 0 ? handshake(fd) : -1;
        if (hs < 0) {
            if (fd >= 0)
                close(fd);
            if (!warned++)
                cgpu_log("cannot reach arbiterd at %s; %s", cgpu_cfg.socket,
                         cgpu_cfg.on_loss_run ? "running unchecked meanwhile" : "GPU work waits");
            struct timespec ts = {backoff_ms / 1000, (backoff_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
            continue;
        }
        if (ever)
            cgpu_log("reconnected to arbiterd");
        ever = 1;
        warned = 0;
        backoff_ms = 20;
        atomic_store(&C.fd, fd);
        atomic_store(&C.connected, 1);
        /* what this process already holds goes back on the (new) daemon's ledger */
        for (int p = 0; p < cgpu_cfg.ngpus; p++) {
            int64_t held = atomic_load(&cgpu_gates[p].mem_used);
            if (held > 0)
                send_mem("mem_reserve", 0, C.dgpu[p], held);
        }
        pthread_mutex_lock(&C.mu);
        pthread_cond_broadcast(&C.cv);
        pthread_mutex_unlock(&C.mu);
        for (int p = 0; p < cgpu_cfg.ngpus; p++) {
            pthread_mutex_lock(&cgpu_gates[p].mu);
            pthread_cond_broadcast(&cgpu_gates[p].cv);
            pthread_mutex_unlock(&cgpu_gates[p].mu);
        }
        for (;;) {
            mp_node *m;
            int k = read_msg(fd, &m, -1);
            if (k < 0)
                break;
            dispatch(m);
            consume(k);
        }
        lose_connection();
        cgpu_log("lost arbiterd; reconnecting");
    }
    return NULL;
}

/* ------------------------------------------------------------ lifecycle */

static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static void init_gates(void) {
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        cgpu_gate *g = &cgpu_gates[p];
        memset(g, 0, sizeof *g);
        g->pos = p;
        pthread_mutex_init(&g->mu, NULL);
        cond_init_mono(&g->cv);
    }
}

void cgpu_start(void) {
    if (atomic_load(&C.started))
        return;
    pthread_mutex_lock(&start_mu);
    if (!atomic_load(&C.started)) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 * 1024);
        if (pthread_create(&t, &a, reader_main, NULL) != 0 || pthread_create(&t, &a, idle_main, NULL) != 0)
            cgpu_log("cannot start its threads");
        pthread_attr_destroy(&a);
        atomic_store(&C.started, 1);
    }
    pthread_mutex_unlock(&start_mu);
}

/* A forked child has none of the parent's threads and must not share its socket. */
static void after_fork_child(void) {
    int fd = atomic_exchange(&C.fd, -1);
    if (fd >= 0)
        close(fd);
    atomic_store(&C.connected, 0);
    atomic_store(&C.started, 0);
    pthread_mutex_init(&C.mu, NULL);
    pthread_mutex_init(&C.send_mu, NULL);
    pthread_mutex_init(&start_mu, NULL);
    cond_init_mono(&C.idle_cv);
    cond_init_mono(&C.cv);
    memset(C.pending, 0, sizeof C.pending);
    init_gates();
}

static const char *env_get(const char *name) { return getenv(name); }

__attribute__((constructor)) static void cgpu_shim_init(void) {
    char err[400];
    if (cgpu_parse_env(env_get, &cgpu_cfg, err, sizeof err) < 0) {
        cgpu_log("%s", err);
        _exit(2);
    }
    cgpu_env_ok = !cgpu_cfg.disabled;
    init_gates();
    cond_init_mono(&C.cv);
    cond_init_mono(&C.idle_cv);
    pthread_atfork(NULL, NULL, after_fork_child);
}
