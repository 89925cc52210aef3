/* libcgpu.so's board: where a job's ranks agree on the collective at which a gang turn stops (behaviour §11,
 * jobs that span GPUs).
 *
 * A gang's turn ends at one deadline on all its GPUs, but each rank sees it at its own next launch. One rank may
 * launch a collective just before the deadline while a peer reaches its gate just after: the first collective
 * then waits for the peer's, spinning and holding its GPU, until the gang's next turn, a round later. So every
 * process of the instance counts, per GPU, the collective kernels it has launched (launch.c says which are; a CUDA
 * graph's replay counts the collectives captured into it, graphcoll.c, as launched at once), on a board in shared
 * memory beside the deadline of the turn it holds. The first rank to take its slow path past a turn's deadline
 * fixes the turn's *stop*: the most collectives a rank still holding that turn (a slot with the same deadline) has
 * launched. Past the deadline a rank still launches what leads up to the stop's collective and the launch that
 * holds it (one collective short of it; a replay of n collectives, from up to n short), so that it catches up with
 * the collective its peers wait in, for 100 ms at most; then it stops. A collective is counted before its rank
 * reads its deadline, so a rank that launched one in time is always seen by the rank that fixes the stop, which
 * read the clock later. A revoked lease does not catch up.
 *
 * The board is /dev/shm/cgpu-board-UID-INSTANCE-HASH (mode 0600, the instance the daemon resolved at
 * registration): one per instance, whose ranks' collectives must correspond one to one (data and tensor parallel:
 * every rank takes part in each; NCCL requires a captured collective's graph to be replayed by every rank of the
 * capture). A slot belongs to a process and a GPU position; a dead process's slot is taken over. Where
 * the board cannot be opened, or the driver names no kernel, there is no agreement: a stranded collective waits
 * for the next turn, as without the board.
 *
 * The board also measures collective spin as launches show it (behaviour §11, "Visible"). Each slot keeps when
 * it launched its last BOARD_RING collectives (the time its gate let each through). A rank that launches its n-th
 * collective on a GPU looks at every other slot of the instance: one that launched its n-th earlier has had that
 * collective waiting for this launch since, so the slot is credited the time from its launch (or from where its
 * count already reached, whichever is later) to now. A slot's count is thus the time its collectives waited for
 * the last peer's launch, each instant counted once however many of its collectives were queued. A kernel starts
 * no earlier than its launch, so this is an upper bound where the rank's queue was backed up. A slot more than
 * BOARD_RING collectives ahead of the peer that launches is not credited for that collective: its stamp of it is
 * gone, and counts that far apart are more likely two jobs' than one's. The process takes its slot's count at
 * each lease release and reports it to arbiterd (spin_ns).
 *
 * Within a turn, a rank's client does not give back an idle lease (gates.c) while a peer holds the same turn and
 * has launched a collective it has not (up to BOARD_RING ahead: the peer's collective waits for this rank's next
 * one), or holds it for work of its own: a peer that is itself only keeping its lease for others (*resting*) does
 * not count, so ranks idle together still give their turn back. Past the deadline it keeps the lease only where it
 * may still catch up (the farthest peer within a launch like its last one), for CATCH_UP_NS at most, billed to the
 * gang as time past its deadline. Host work between two steps longer than CGPU_IDLE_MS (a
 * busy host, a data loader) would otherwise end its part of the turn early, and coming back just after the
 * deadline it would find the GPU gone to a tenant and no lease to catch up in, with its peer's collective
 * stranded until the gang's next turn (86 ms of 80 ms turns, on a loaded 2-core host). The daemon keeps that
 * GPU for the gang until the turn's end anyway, so the held lease takes no tenant's time within the turn. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

#define BOARD_MAGIC 0x63677034u /* "cgp4" */
#define BOARD_SLOTS 256
#define BOARD_TURNS 16 /* the stops of the instance's recent turns (a GPU outside the gang has turns of its own) */
#define LOCK_NS (20 * 1000000LL) /* the longest a rank waits for the board's lock; then it does not catch up */
/* The longest a rank goes on past its turn's deadline to catch up: a step's part of a turn, well inside
 * overrun_ms (500 ms by default), where arbiterd cuts a holder off. Ranks whose collectives do not correspond one
 * to one would otherwise run on to it. */
#define CATCH_UP_NS (100 * 1000000LL)
#define BOARD_RING 32 /* each slot's last collectives' launch times */
/* a ring entry: valid bit, the collective's number mod 2^15, its launch time (CLOCK_MONOTONIC ns) mod 2^48 */
#define STAMP_VALID (1ULL << 63)
#define STAMP_TBITS 48
#define STAMP_TMASK ((1ULL << STAMP_TBITS) - 1)
#define STAMP_NMASK 0x7fffULL

struct board_slot {
    _Atomic int32_t pid; /* 0: free */
    int32_t pos;
    _Atomic int32_t resting;  /* its lease kept idle for its peers (cgpu_board_keeps): it does not keep theirs */
    _Atomic int64_t key;      /* the deadline of the turn its lease is (0: none held) */
    _Atomic uint64_t colls;   /* collectives launched on the GPU */
    _Atomic uint64_t ring[BOARD_RING]; /* the launch of collective n at n % BOARD_RING (a stamp) */
    _Atomic int64_t covered; /* spin is counted up to here: its collectives waited for peers until then */
    _Atomic uint64_t spin;   /* ns of spin counted and not yet reported */
};

struct board {
    _Atomic uint32_t magic; /* set once the mutex is ready */
    uint32_t slots;
    pthread_mutex_t mu; /* robust, process-shared: guards turn and next */
    struct {
        int64_t key; /* a turn whose stop is fixed (0: none) */
        uint64_t stop;
    } turn[BOARD_TURNS];
    uint32_t next;
    _Atomic uint32_t used; /* slots ever taken: where a scan of them ends */
    struct board_slot slot[BOARD_SLOTS];
};

static struct {
    pthread_mutex_t mu; /* opening the board and taking slots */
    struct board *b;
    int tried;
    struct board_slot *_Atomic mine[CGPU_MAX_GPUS];
    _Atomic int64_t key[CGPU_MAX_GPUS]; /* the deadline of each gate's turn, kept before a slot exists */
    _Atomic int last_n[CGPU_MAX_GPUS];  /* the collectives of each GPU's last counted launch */
} B = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* /cgpu-board-UID-NAME-HASH: NAME the instance's first 100 characters, those not [A-Za-z0-9._-] as _, and HASH
 * (FNV-1a, 64 bits) of the whole name, so that names alike there still have boards of their own. */
static void board_path(char *out, size_t n) {
    const char *inst = cgpu_conn_instance();
    char safe[101];
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = inst; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    size_t k = 0;
    for (; inst[k] && k < sizeof safe - 1; k++) {
        char c = inst[k];
        safe[k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                          c == '_' || c == '.' ? c : '_';
    }
    safe[k] = 0;
    snprintf(out, n, "/cgpu-board-%u-%s-%016llx", (unsigned)geteuid(), safe, (unsigned long long)h);
}

static struct board *map_board(int fd) {
    void *m = mmap(NULL, sizeof(struct board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* Under B.mu: the board, created by the first process of the instance; NULL where it cannot be. */
static struct board *open_board(void) {
    if (B.b || B.tried)
        return B.b;
    if (!cgpu_conn_instance()[0])
        return NULL; /* not registered yet: tried again later */
    B.tried = 1;
    char path[200];
    board_path(path, sizeof path);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        struct board *b = NULL;
        if (ftruncate(fd, sizeof(struct board)) == 0 && (b = map_board(fd))) {
            pthread_mutexattr_t a;
            pthread_mutexattr_init(&a);
            pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
            pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
            pthread_mutex_init(&b->mu, &a);
            pthread_mutexattr_destroy(&a);
            b->slots = BOARD_SLOTS;
            atomic_store(&b->magic, BOARD_MAGIC);
        }
        close(fd);
        B.b = b;
    } else if (errno == EEXIST && (fd = shm_open(path, O_RDWR | O_CLOEXEC, 0600)) >= 0) {
        struct stat st;
        struct board *b = NULL;
        for (int i = 0; i < 1000 && fstat(fd, &st) == 0 && st.st_uid == geteuid(); i++) {
            if (st.st_size >= (off_t)sizeof(struct board)) {
                b = map_board(fd);
                break;
            }
            usleep(1000); /* its creator is sizing it */
        }
        close(fd);
        for (int i = 0; b && atomic_load(&b->magic) != BOARD_MAGIC && i < 1000; i++)
            usleep(1000); /* its creator is initialising it */
        if (b && (atomic_load(&b->magic) != BOARD_MAGIC || b->slots != BOARD_SLOTS)) {
            munmap(b, sizeof(struct board));
            b = NULL;
        }
        B.b = b;
    }
    if (!B.b)
        cgpu_log("no board for the instance's collectives (%s): a gang turn's end is not agreed", path);
    return B.b;
}

/* 1 with the board's lock held; 0 when another process kept it LOCK_NS (a rank of the instance wedged there, or a
 * process of the same uid holding it on purpose: nobody waits on it for long). */
static int lock(struct board *b) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += LOCK_NS;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    int r = pthread_mutex_timedlock(&b->mu, &until);
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&b->mu); /* a process died holding it: a stop is written whole, key last */
    return r == 0 || r == EOWNERDEAD;
}

static int alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

/* Under B.mu: this process's slot for GPU pos, taken on first use. */
static struct board_slot *slot_of(int pos) {
    if (atomic_load(&B.mine[pos]))
        return atomic_load(&B.mine[pos]);
    struct board *b = open_board();
    if (!b)
        return NULL;
    int32_t me = (int32_t)getpid();
    struct board_slot *got = NULL;
    if (!lock(b))
        return NULL;
    for (int i = 0; i < BOARD_SLOTS && !got; i++) {
        struct board_slot *s = &b->slot[i];
        int32_t owner = atomic_load(&s->pid);
        if (owner == 0 || !alive(owner)) {
            atomic_store(&s->key, 0);
            atomic_store(&s->resting, 0);
            atomic_store(&s->colls, 0);
            for (int k = 0; k < BOARD_RING; k++)
                atomic_store(&s->ring[k], 0);
            atomic_store(&s->covered, 0);
            atomic_store(&s->spin, 0);
            s->pos = pos;
            if (atomic_load(&b->used) < (uint32_t)i + 1)
                atomic_store(&b->used, (uint32_t)i + 1);
            atomic_store(&s->key, atomic_load(&B.key[pos]));
            atomic_store(&s->pid, me);
            got = s;
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (got) {
        atomic_store(&B.mine[pos], got);
        atomic_store(&got->key, atomic_load(&B.key[pos])); /* a grant that came meanwhile saw no slot yet */
    }
    return got;
}

void cgpu_board_turn(int pos, int64_t key) {
    atomic_store(&B.key[pos], key);
    struct board_slot *s = atomic_load(&B.mine[pos]);
    if (s) {
        atomic_store(&s->resting, 0);
        atomic_store(&s->key, key);
    }
}

void cgpu_board_resting(int pos, int on) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    if (s && atomic_load_explicit(&s->resting, memory_order_relaxed) != on)
        atomic_store(&s->resting, on);
}

int cgpu_board_launch(int pos, int n) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    if (!s) {
        pthread_mutex_lock(&B.mu);
        s = slot_of(pos);
        pthread_mutex_unlock(&B.mu);
        if (!s)
            return 0;
    }
    atomic_fetch_add(&s->colls, (uint64_t)n);
    atomic_store(&B.last_n[pos], n);
    return n;
}

void cgpu_board_unlaunch(int pos, int n) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    if (s)
        atomic_fetch_sub(&s->colls, (uint64_t)n);
}

/* How long before t a stamp's launch was (signed: negative where it was after t). */
static int64_t stamp_ago(uint64_t stamp, int64_t t) {
    uint64_t d = ((uint64_t)t - stamp) & STAMP_TMASK;
    return (int64_t)(d << (64 - STAMP_TBITS)) >> (64 - STAMP_TBITS);
}

/* When slot o launched collective n, as its ring shows it (0: it has not launched n, or n is out of its ring). */
static int64_t launched_at(struct board_slot *o, uint64_t n, int64_t t) {
    uint64_t e = atomic_load_explicit(&o->ring[n % BOARD_RING], memory_order_acquire);
    if (!(e & STAMP_VALID) || ((e >> STAMP_TBITS) & STAMP_NMASK) != (n & STAMP_NMASK))
        return 0;
    int64_t ago = stamp_ago(e, t);
    return ago > 0 ? t - ago : 0;
}

/* Slot o's collectives waited for a peer from `from` to t: the part past what it has counted is added. */
static void credit(struct board_slot *o, int64_t from, int64_t t) {
    int64_t c = atomic_load(&o->covered);
    for (;;) {
        int64_t lo = from > c ? from : c;
        if (t <= lo)
            return;
        if (atomic_compare_exchange_weak(&o->covered, &c, t)) {
            atomic_fetch_add(&o->spin, (uint64_t)(t - lo));
            return;
        }
    }
}

/* Collective n of slot s went through its gate at t: stamped, and each peer that launched its n-th earlier credited
 * its wait since. */
static void stamp(struct board *b, struct board_slot *s, uint64_t n, int64_t t) {
    atomic_store_explicit(&s->ring[n % BOARD_RING],
                          STAMP_VALID | (n & STAMP_NMASK) << STAMP_TBITS | ((uint64_t)t & STAMP_TMASK),
                          memory_order_release);
    uint32_t used = atomic_load(&b->used);
    for (uint32_t i = 0; i < used && i < BOARD_SLOTS; i++) {
        struct board_slot *o = &b->slot[i];
        int64_t at;
        if (o != s && atomic_load(&o->pid) && (at = launched_at(o, n, t)))
            credit(o, at, t);
    }
}

void cgpu_board_launched(int pos, int64_t t, int n) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    struct board *b = B.b;
    if (!s || !b || n <= 0)
        return;
    /* a graph's n collectives are launched together: each is stamped (the last BOARD_RING of them, what the ring
     * holds), in order, so that a peer's same collective is credited its wait from its own launch */
    uint64_t last = atomic_load(&s->colls);
    uint64_t k = (uint64_t)n < BOARD_RING ? (uint64_t)n : BOARD_RING;
    for (uint64_t c = last - k + 1; c <= last; c++)
        stamp(b, s, c, t);
}

/* The most collectives a live peer of slot s holding turn key has launched, `from` at least (a peer more than
 * `ahead` past `from` left out); *working set to 1 where such a peer holds the turn for work of its own (it is not
 * resting). */
static uint64_t farthest(struct board *b, struct board_slot *s, int64_t key, uint64_t from, uint64_t ahead,
                         int *working) {
    uint64_t far = from;
    uint32_t used = atomic_load(&b->used);
    for (uint32_t i = 0; i < used && i < BOARD_SLOTS; i++) {
        struct board_slot *o = &b->slot[i];
        if (o == s || atomic_load(&o->key) != key || !alive(atomic_load(&o->pid)))
            continue;
        uint64_t n = atomic_load(&o->colls);
        if (n > far && n - from <= ahead)
            far = n;
        if (working && !atomic_load(&o->resting))
            *working = 1;
    }
    return far;
}

int cgpu_board_keeps(int pos) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    int64_t key = atomic_load(&B.key[pos]);
    if (!s || !key)
        return 0;
    struct board *b = B.b; /* set before any slot of it is */
    int64_t now = cgpu_now();
    if (now > key + CATCH_UP_NS)
        return 0;
    /* the farthest peer holding the turn (up to BOARD_RING ahead: the stop a rank past the deadline fixes) */
    int working = 0;
    uint64_t mine = atomic_load(&s->colls), far = farthest(b, s, key, mine, BOARD_RING, &working);
    if (now <= key) /* within the turn: the GPU is the gang's until the deadline anyway */
        return far > mine || working;
    /* past it, awaited as far as this rank may still catch up: within one launch like its last one */
    return far > mine && cgpu_board_holds_stop(mine, atomic_load(&B.last_n[pos]), far);
}

uint64_t cgpu_board_spin_take(int pos) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    return s ? atomic_exchange(&s->spin, 0) : 0;
}

/* Under the board's lock: the stop of turn key, fixed by the first rank to ask. It is the most collectives a rank
 * still holding the turn has launched (the asking rank's pending one left out: it is what is being decided), so
 * a rank that is nobody's peer (a GPU outside any gang, its peers gone) stops where it is. */
static uint64_t stop_of(struct board *b, struct board_slot *me, int64_t key, uint64_t launched) {
    for (int i = 0; i < BOARD_TURNS; i++)
        if (b->turn[i].key == key)
            return b->turn[i].stop;
    uint64_t stop = farthest(b, me, key, launched, UINT64_MAX, NULL);
    uint32_t at = b->next++ % BOARD_TURNS;
    b->turn[at].key = 0;
    b->turn[at].stop = stop;
    b->turn[at].key = key;
    return stop;
}

int cgpu_board_may_finish(int pos, int coll) {
    struct board_slot *s = atomic_load(&B.mine[pos]);
    int64_t key = atomic_load(&B.key[pos]);
    if (!s || !key || cgpu_now() > key + CATCH_UP_NS)
        return 0; /* no collective of this process on this GPU, no turn held, or caught up long enough */
    struct board *b = B.b;
    uint64_t launched = atomic_load(&s->colls) - (uint64_t)coll;
    if (!lock(b))
        return 0;
    uint64_t stop = stop_of(b, s, key, launched);
    pthread_mutex_unlock(&b->mu);
    /* only the launch that holds the stop's collective, and what leads to it: a rank further behind has counts that
     * no longer correspond to its peers' (a restarted rank, two jobs in one instance, pipeline stages), and
     * catching up would launch collectives nobody meets */
    return cgpu_board_holds_stop(launched, coll, stop);
}

void cgpu_board_after_fork(void) {
    pthread_mutex_init(&B.mu, NULL);
    for (int p = 0; p < CGPU_MAX_GPUS; p++) {
        atomic_store(&B.mine[p], NULL); /* the parent's slots stay the parent's */
        atomic_store(&B.key[p], 0);
        atomic_store(&B.last_n[p], 0);
    }
}

/* At exit: this process's slots are free, and the last process of the instance removes the board (one killed
 * leaves its slots to be taken over, and the board to the next). */
__attribute__((destructor)) static void board_exit(void) {
    struct board *b = B.b;
    if (!b)
        return;
    int32_t me = (int32_t)getpid();
    int others = 0;
    if (!lock(b))
        return;
    for (int i = 0; i < BOARD_SLOTS; i++) {
        int32_t owner = atomic_load(&b->slot[i].pid);
        if (owner == me)
            atomic_store(&b->slot[i].pid, 0);
        else if (owner && alive(owner))
            others = 1;
    }
    if (!others) {
        char path[200];
        board_path(path, sizeof path);
        shm_unlink(path);
    }
    pthread_mutex_unlock(&b->mu);
}
