/* libcgpu.so's connection to arbiterd: one socket per process, owned by a reader thread
 * that connects, says hello, registers, reconnects with backoff, and hands grants, revokes
 * and replies on. The messages are those of proto/PROTOCOL.md (a test records every frame
 * this file sends and checks it against cgpu_protocol). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "mp.h"
#include "shim.h"

#define MAX_PENDING 32
#define ARENA_NODES 8192

enum { SLOT_FREE, SLOT_WAITING, SLOT_DONE, SLOT_LOST };

static struct {
    pthread_mutex_t mu; /* connection state and pending replies */
    pthread_cond_t cv;
    pthread_mutex_t send_mu;
    _Atomic int fd;        /* -1 when not connected */
    _Atomic int connected; /* registered and usable */
    _Atomic int started;
    int dgpu[CGPU_MAX_GPUS]; /* the daemon's GPU index of each visible position */
    int64_t limit[CGPU_MAX_GPUS];
    char uuid[CGPU_MAX_GPUS][96]; /* each visible position's GPU, as the daemon named it */
    char instance[160];           /* the instance the daemon resolved at the first registration */
    _Atomic int ever;             /* registered once: dgpu, uuid and instance are known */
    int64_t next_id;
    struct { int64_t id; int state; int ok; int64_t used, limit; } pending[MAX_PENDING];
    int64_t restore_id[CGPU_MAX_GPUS]; /* the re-reservation sent after a reconnect */
    _Atomic int refused;   /* the daemon answered the last handshake with an error other than busy */
    const cgpu_events *ev;
} C = {
    .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .send_mu = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
};
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

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

/* Start a message of op with nfields more fields after it. */
static void begin(mp_writer *w, uint8_t *buf, size_t cap, const char *op, uint32_t nfields) {
    mp_writer_init(w, buf, cap);
    mp_w_map(w, nfields + 1);
    mp_w_str(w, "op"), mp_w_str(w, op);
}

static void field_int(mp_writer *w, const char *key, int64_t v) { mp_w_str(w, key), mp_w_int(w, v); }

void cgpu_send_acquire(int pos) {
    uint8_t b[48];
    mp_writer w;
    begin(&w, b, sizeof b, "acquire", 1);
    field_int(&w, "gpu", C.dgpu[pos]);
    send_msg(&w);
}

void cgpu_send_release(int pos, uint64_t lease, int64_t used, int64_t warmup, int64_t spin, int again) {
    uint8_t b[192];
    mp_writer w;
    begin(&w, b, sizeof b, "release", 4 + (warmup > 0) + (spin > 0));
    field_int(&w, "gpu", C.dgpu[pos]);
    mp_w_str(&w, "lease"), mp_w_uint(&w, lease);
    field_int(&w, "used_ns", used);
    mp_w_str(&w, "again"), mp_w_bool(&w, again);
    if (warmup > 0)
        field_int(&w, "warmup_ns", warmup);
    if (spin > 0)
        field_int(&w, "spin_ns", spin);
    send_msg(&w);
}

void cgpu_send_mem_free(int pos, int64_t bytes) {
    uint8_t b[64];
    mp_writer w;
    begin(&w, b, sizeof b, "mem_free", 2);
    field_int(&w, "gpu", C.dgpu[pos]);
    field_int(&w, "bytes", bytes);
    send_msg(&w);
}

/* mem_reserve {id, gpu, bytes} when bytes >= 0, else mem_query {id, gpu} */
static void send_mem_request(int64_t id, int dgpu, int64_t bytes) {
    uint8_t b[96];
    mp_writer w;
    begin(&w, b, sizeof b, bytes >= 0 ? "mem_reserve" : "mem_query", bytes >= 0 ? 3 : 2);
    field_int(&w, "id", id);
    field_int(&w, "gpu", dgpu);
    if (bytes >= 0)
        field_int(&w, "bytes", bytes);
    send_msg(&w);
}

/* ---------------------------------------------------------------- requests */

int cgpu_conn_connected(void) { return atomic_load(&C.connected); }

int cgpu_conn_refused(void) { return !atomic_load(&C.connected) && atomic_load(&C.refused); }

int64_t cgpu_conn_limit(int pos) { return C.limit[pos]; }

const char *cgpu_conn_uuid(int pos) { return atomic_load(&C.ever) ? C.uuid[pos] : ""; }

int cgpu_conn_gpu(int pos) { return atomic_load(&C.ever) ? C.dgpu[pos] : -1; }

const char *cgpu_conn_instance(void) { return atomic_load(&C.ever) ? C.instance : ""; }

int cgpu_conn_wait(int wait_ms) {
    struct timespec ts;
    cgpu_deadline_in(&ts, (int64_t)(wait_ms < 0 ? 0 : wait_ms) * 1000000LL);
    pthread_mutex_lock(&C.mu);
    while (!atomic_load(&C.connected) && !atomic_load(&C.refused)) {
        if (wait_ms < 0)
            pthread_cond_wait(&C.cv, &C.mu);
        else if (pthread_cond_timedwait(&C.cv, &C.mu, &ts) != 0)
            break;
    }
    pthread_mutex_unlock(&C.mu);
    return atomic_load(&C.connected);
}

int cgpu_rpc_mem(int pos, int64_t bytes, int *ok, int64_t *used, int64_t *limit) {
    pthread_mutex_lock(&C.mu);
    int slot = -1;
    for (;;) {
        if (!atomic_load(&C.connected)) {
            pthread_mutex_unlock(&C.mu);
            return -1;
        }
        for (int k = 0; k < MAX_PENDING && slot < 0; k++)
            if (C.pending[k].state == SLOT_FREE)
                slot = k;
        if (slot >= 0)
            break;
        pthread_cond_wait(&C.cv, &C.mu);
    }
    int64_t id = ++C.next_id;
    C.pending[slot].id = id;
    C.pending[slot].state = SLOT_WAITING;
    int dgpu = C.dgpu[pos];
    pthread_mutex_unlock(&C.mu);
    send_mem_request(id, dgpu, bytes);
    pthread_mutex_lock(&C.mu);
    while (C.pending[slot].state == SLOT_WAITING)
        pthread_cond_wait(&C.cv, &C.mu);
    int done = C.pending[slot].state == SLOT_DONE;
    *ok = C.pending[slot].ok;
    *used = C.pending[slot].used;
    *limit = C.pending[slot].limit;
    C.pending[slot].state = SLOT_FREE;
    pthread_cond_broadcast(&C.cv);
    pthread_mutex_unlock(&C.mu);
    return done ? 0 : -2;
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
            if (k > 0)
                return (int)k;
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

/* The daemon's answer to the last handshake when it was an error ("refused registration: why"), and the
 * last one logged. */
static char answer[320], said[320];

/* Send what ``w`` holds and read the reply into *m. Returns its length (consume it after
 * use), -1 if the connection failed, -3 if the daemon answered ``busy`` (no room now: try again),
 * or -2 if it answered with any other error: it refused ``what``. The answer is kept in ``answer``. */
static int request(int fd, const mp_writer *w, const char *want, const char *what, mp_node **m) {
    if (w->err || send_all(fd, w->buf, w->len) < 0)
        return -1;
    int k = read_msg(fd, m, 5000);
    if (k < 0)
        return -1;
    if (!mp_str_is(mp_get(*m, "op"), want)) {
        const mp_node *code = mp_get(*m, "code"), *msg = mp_get(*m, "message");
        int busy = mp_str_is(code, "busy");
        snprintf(answer, sizeof answer, "%s %s: %.*s", busy ? "put off" : "refused", what,
                 msg && msg->type == MP_STR ? (int)msg->n : 0, msg && msg->type == MP_STR ? msg->v.s : "");
        consume(k);
        return busy ? -3 : -2;
    }
    return k;
}

static void write_register(mp_writer *w, uint8_t *b, size_t cap) {
    const cgpu_env *e = &cgpu_cfg;
    begin(w, b, cap, "register",
          (uint32_t)(4 + (e->nmem > 0) + (e->highprio > 0) + (e->core_percent > 0) + (e->core_limit > 0)));
    field_int(w, "id", 1);
    mp_w_str(w, "instance");
    if (e->instance[0])
        mp_w_str(w, e->instance);
    else
        mp_w_nil(w);
    mp_w_str(w, "gpus"), mp_w_array(w, (uint32_t)e->ngpus);
    for (int p = 0; p < e->ngpus; p++) {
        if (e->gpu_index[p] >= 0)
            mp_w_int(w, e->gpu_index[p]);
        else
            mp_w_str(w, e->gpu_uuid[p]);
    }
    field_int(w, "weight", e->weight);
    if (e->nmem > 0) {
        mp_w_str(w, "memsize"), mp_w_array(w, (uint32_t)e->nmem);
        for (int p = 0; p < e->nmem; p++)
            mp_w_int(w, e->memsize[p]);
    }
    if (e->highprio)
        field_int(w, "highprio", 1);
    if (e->core_percent)
        field_int(w, "core_percent", e->core_percent);
    if (e->core_limit)
        field_int(w, "limit", e->core_limit);
}

static int handshake(int fd) {
    uint8_t b[2048];
    mp_writer w;
    begin(&w, b, sizeof b, "hello", 3);
    mp_w_str(&w, "versions"), mp_w_array(&w, 1), mp_w_int(&w, 1);
    mp_w_str(&w, "client"), mp_w_str(&w, "libcgpu.so/0.1");
    field_int(&w, "pid", getpid());
    mp_node *m;
    int k = request(fd, &w, "welcome", "the connection", &m);
    if (k < 0)
        return k;
    consume(k);
    write_register(&w, b, sizeof b);
    k = request(fd, &w, "registered", "registration", &m);
    if (k < 0)
        return k;
    const mp_node *gpus = mp_get(m, "gpus");
    if (!gpus || gpus->type != MP_ARRAY || (int)gpus->n != cgpu_cfg.ngpus) {
        consume(k);
        return -1;
    }
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        int64_t idx = -1, lim = 0;
        mp_get_i64(&gpus->v.kids[p], "gpu", &idx);
        mp_get_i64(&gpus->v.kids[p], "mem_limit", &lim);
        C.dgpu[p] = (int)idx;
        C.limit[p] = lim;
        const mp_node *u = mp_get(&gpus->v.kids[p], "uuid");
        if (!atomic_load(&C.ever)) /* a GPU's UUID does not change: kept from the first registration */
            snprintf(C.uuid[p], sizeof C.uuid[p], "%.*s", u && u->type == MP_STR ? (int)u->n : 0,
                     u && u->type == MP_STR ? u->v.s : "");
    }
    const mp_node *inst = mp_get(m, "instance");
    if (!atomic_load(&C.ever) && inst && inst->type == MP_STR)
        snprintf(C.instance, sizeof C.instance, "%.*s", (int)inst->n, inst->v.s);
    const mp_node *warn = mp_get(m, "warnings");
    for (uint32_t i = 0; warn && warn->type == MP_ARRAY && i < warn->n; i++)
        if (warn->v.kids[i].type == MP_STR)
            cgpu_log("arbiterd: %.*s", (int)warn->v.kids[i].n, warn->v.kids[i].v.s);
    consume(k);
    return 0;
}

/* A reply to a memory request: to the thread waiting for it, or to a re-reservation. */
static void on_reply(const mp_node *m, int ok) {
    int64_t re = -1;
    if (mp_get_i64(m, "re", &re) || re <= 0)
        return;
    for (int p = 0; p < cgpu_cfg.ngpus; p++)
        if (C.restore_id[p] == re && !ok)
            cgpu_log("arbiterd denied the memory this process already holds on GPU %d (its limit went down "
                     "while it was away)", p);
    pthread_mutex_lock(&C.mu);
    for (int k = 0; k < MAX_PENDING; k++) {
        if (C.pending[k].state == SLOT_WAITING && C.pending[k].id == re) {
            C.pending[k].ok = ok;
            C.pending[k].used = C.pending[k].limit = 0;
            mp_get_i64(m, "used", &C.pending[k].used);
            mp_get_i64(m, "limit", &C.pending[k].limit);
            C.pending[k].state = SLOT_DONE;
            pthread_cond_broadcast(&C.cv);
        }
    }
    pthread_mutex_unlock(&C.mu);
}

static void dispatch(const mp_node *m) {
    const mp_node *op = mp_get(m, "op");
    int64_t gpu = -1, lease = 0, deadline = 0;
    int grant = mp_str_is(op, "grant");
    if (grant || mp_str_is(op, "revoke")) {
        if (mp_get_i64(m, "gpu", &gpu) || mp_get_i64(m, "lease", &lease))
            return;
        if (grant && mp_get_i64(m, "deadline_ns", &deadline))
            return;
        for (int p = 0; p < cgpu_cfg.ngpus; p++) {
            if (C.dgpu[p] != gpu)
                continue;
            if (grant)
                C.ev->grant(p, (uint64_t)lease, deadline);
            else
                C.ev->revoke(p, (uint64_t)lease);
        }
    } else if (mp_str_is(op, "ok") || mp_str_is(op, "denied")) {
        on_reply(m, mp_str_is(op, "ok"));
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
    C.ev->lost();
    pthread_mutex_lock(&C.mu);
    for (int k = 0; k < MAX_PENDING; k++)
        if (C.pending[k].state == SLOT_WAITING)
            C.pending[k].state = SLOT_LOST;
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

/* Registered: what this process already holds goes back on the (new) daemon's ledger. */
static void on_registered(int fd) {
    atomic_store(&C.ever, 1);
    atomic_store(&C.fd, fd);
    atomic_store(&C.connected, 1);
    for (int p = 0; p < cgpu_cfg.ngpus; p++) {
        int64_t held = C.ev->held_bytes(p);
        C.restore_id[p] = 0;
        if (held > 0) {
            pthread_mutex_lock(&C.mu);
            C.restore_id[p] = ++C.next_id;
            pthread_mutex_unlock(&C.mu);
            send_mem_request(C.restore_id[p], C.dgpu[p], held);
        }
    }
    pthread_mutex_lock(&C.mu);
    pthread_cond_broadcast(&C.cv);
    pthread_mutex_unlock(&C.mu);
    C.ev->connected();
}

/* The daemon answered the handshake with an error: refused (gated calls fail until it accepts one) or
 * busy (they wait). Said once, and again only when the answer changes. */
static void on_answer(int refused) {
    if (strcmp(said, answer) != 0) {
        memcpy(said, answer, sizeof said);
        if (refused)
            cgpu_log("arbiterd %s; GPU calls fail with CUDA_ERROR_DEVICE_UNAVAILABLE (%d) until it accepts this "
                     "process", answer, CGPU_REFUSED_ERROR);
        else
            cgpu_log("arbiterd %s; GPU work waits until it has room", answer);
    }
    if (!refused)
        atomic_store(&C.refused, 0);
    if (refused && !atomic_exchange(&C.refused, 1)) {
        pthread_mutex_lock(&C.mu);
        pthread_cond_broadcast(&C.cv);
        pthread_mutex_unlock(&C.mu);
        C.ev->refused();
    }
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
            if (hs == -2 || hs == -3)
                on_answer(hs == -2);
            else if (!warned++)
                cgpu_log("cannot reach arbiterd at %s; %s", cgpu_cfg.socket,
                         cgpu_cfg.on_loss_run ? "running unchecked meanwhile" : "GPU work waits");
            struct timespec ts = {backoff_ms / 1000, (backoff_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
            continue;
        }
        if (atomic_exchange(&C.refused, 0))
            cgpu_log("arbiterd accepted this process");
        else if (ever)
            cgpu_log("reconnected to arbiterd");
        said[0] = 0;
        ever = 1;
        warned = 0;
        backoff_ms = 20;
        on_registered(fd);
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

void cgpu_conn_start(const cgpu_events *ev) {
    if (atomic_load(&C.started))
        return;
    pthread_mutex_lock(&start_mu);
    if (!atomic_load(&C.started)) {
        C.ev = ev;
        cgpu_spawn(reader_main, "connection");
        atomic_store(&C.started, 1);
    }
    pthread_mutex_unlock(&start_mu);
}

void cgpu_conn_init(void) { cgpu_cond_init(&C.cv); }

/* A forked child has none of the parent's threads and must not share its socket. */
void cgpu_conn_after_fork(void) {
    int fd = atomic_exchange(&C.fd, -1);
    if (fd >= 0)
        close(fd);
    atomic_store(&C.connected, 0);
    atomic_store(&C.refused, 0);
    atomic_store(&C.started, 0);
    pthread_mutex_init(&C.mu, NULL);
    pthread_mutex_init(&C.send_mu, NULL);
    pthread_mutex_init(&start_mu, NULL);
    cgpu_cond_init(&C.cv);
    memset(C.pending, 0, sizeof C.pending);
}
