/* The fake driver's collective kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL" (linked into the fake
 * libcuda.so.1; tests only).
 *
 * It models what a NCCL collective kernel does on each GPU of a job: it cannot finish until the same collective
 * has started on every peer GPU, and it spins on its own GPU meanwhile (NCCL User Guide, "Using multiple NCCL
 * communicators concurrently": NCCL kernels are blocking, waiting for data to arrive; "Creating a
 * Communicator": one rank per CUDA device). Then it does its own work, the nanoseconds of its first parameter,
 * as cgpu_spin does. Like any kernel it runs after its launch returned (CUDA Driver API, Execution Control,
 * cuLaunchKernel: kernel launches are asynchronous), on the context's worker thread; captured into a graph, at each
 * replay (fakecuda.c), counted among the device's steps as a launch of it is.
 *
 * The peers meet in shared memory, so one process with several devices and one process per GPU (as torchrun
 * makes) are the same to it: FAKECUDA_COLLECTIVE="ID:P,P,..." names the job (ID) and the physical devices of
 * its ranks. Each device counts the collectives it has run (step k); its k-th waits until every peer device has
 * started its k-th. Unset, the kernel is a plain spin (a job on one GPU). /dev/shm/fakecuda-coll-ID holds, per
 * physical device, five uint64 (native order): the last step started, the nanoseconds spent waiting for peers,
 * the collectives run, the nanoseconds of own work, and the longest wait of one collective: what a benchmark reads
 * as the job's spin. A step whose
 * peers never come (a peer process that exited) is given up after FAKECUDA_COLLECTIVE_TIMEOUT_MS (2000), as
 * PyTorch's NCCL watchdog aborts a collective that outlives its timeout, so that a program can still exit.
 *
 * A GPU that spins takes nothing from its host's CPUs, but this one is a host thread: while it waits for its
 * peers it yields the CPU to any thread that is ready (the peer rank's launching thread among them), and the time
 * counts as spin all the same. Burning a core there slowed the very launch it waited for, on a small host. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fakecoll.h"

#define COLL_SLOTS 16

struct coll_slot {
    _Atomic uint64_t started; /* the last step whose collective started on this device */
    _Atomic uint64_t spin_ns; /* waiting for peers, summed */
    _Atomic uint64_t count;   /* collectives run */
    _Atomic uint64_t work_ns; /* own work, summed */
    _Atomic uint64_t max_spin_ns; /* the longest one collective waited for its peers */
};

static struct {
    pthread_once_t once;
    struct coll_slot *slots; /* NULL: no collective configured */
    int peers[COLL_SLOTS];
    int npeers;
    uint64_t steps[COLL_SLOTS]; /* this process's collectives so far, per physical device */
    int64_t timeout_ns;
    pthread_mutex_t mu;
} C = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t coll_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void coll_open(void) {
    const char *t = getenv("FAKECUDA_COLLECTIVE_TIMEOUT_MS");
    C.timeout_ns = (t && *t ? strtol(t, NULL, 10) : 2000) * 1000000LL;
    const char *v = getenv("FAKECUDA_COLLECTIVE");
    const char *colon = v ? strchr(v, ':') : NULL;
    if (!colon || colon == v || colon - v > 64)
        return;
    char name[96];
    snprintf(name, sizeof name, "/fakecuda-coll-%.*s", (int)(colon - v), v);
    for (const char *p = colon + 1; *p && C.npeers < COLL_SLOTS;) {
        char *end;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d >= COLL_SLOTS)
            return;
        C.peers[C.npeers++] = (int)d;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return;
    }
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return;
    size_t size = sizeof(struct coll_slot) * COLL_SLOTS;
    if (ftruncate(fd, (off_t)size) != 0) { /* a new file is zero-filled; an existing one keeps its size */
        close(fd);
        return;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED)
        C.slots = m;
}

void fakecoll_run(int phys, uint64_t ns) {
    pthread_once(&C.once, coll_open);
    if (!C.slots || phys < 0 || phys >= COLL_SLOTS) {
        fake_busy_until(coll_now() + (int64_t)ns);
        return;
    }
    pthread_mutex_lock(&C.mu);
    uint64_t k = ++C.steps[phys];
    pthread_mutex_unlock(&C.mu);
    struct coll_slot *me = &C.slots[phys];
    atomic_store(&me->started, k);
    int64_t t0 = coll_now();
    for (int i = 0; i < C.npeers; i++) /* spin on this GPU until every peer has started step k */
        while (atomic_load(&C.slots[C.peers[i]].started) < k && coll_now() - t0 < C.timeout_ns)
            sched_yield();
    int64_t t1 = coll_now();
    fake_busy_until(t1 + (int64_t)ns);
    atomic_fetch_add(&me->spin_ns, (uint64_t)(t1 - t0));
    for (uint64_t was = atomic_load(&me->max_spin_ns);
         (uint64_t)(t1 - t0) > was && !atomic_compare_exchange_weak(&me->max_spin_ns, &was, (uint64_t)(t1 - t0));)
        ;
    atomic_fetch_add(&me->work_ns, ns);
    atomic_fetch_add(&me->count, 1);
}
