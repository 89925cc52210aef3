/* Grant round trip from C: N client threads, each with its own connection to arbiterd,
 * speaking the protocol through libcgpu.so's own codec (mp.c).
 *
 *   grant_rtt SOCKET CLIENTS SECONDS [WARMUP]
 *
 * Each client registers as one of 8 instances, then on a fixed schedule, every 5 ms
 * from a random phase, sends acquire, waits for the grant, and releases: an open
 * loop, so the load offered is CLIENTS * 200 pairs/s whatever the daemon does, and a
 * client that falls behind sends its next acquire at once. The first WARMUP seconds
 * (default 0.5) run the same loop unmeasured: connections settle, and so do the
 * machine's wake-up paths (a VM's idle polling adapts to the rate). Prints
 * "rtt clients=N samples=S p50_us=X p99_us=Y pairs_per_s=R pairs_total=T": R is the
 * rate achieved over the measured seconds, T every pair, warm-up included. Run it
 * against a GPU on policy 5. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"

#define MAX_SAMPLES 20000
#define PERIOD_NS 5000000LL /* one slice */

static const char *sock_path;
static double seconds, warmup = 0.5;

typedef struct {
    int index;
    double *samples;
    int n;
    long pairs;
    uint8_t buf[MP_MAX_MESSAGE];
    size_t len;
    mp_node nodes[1024];
} client;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int send_w(int fd, mp_writer *w) { return w->err || send(fd, w->buf, w->len, MSG_NOSIGNAL) != (ssize_t)w->len; }

/* Read messages until one whose op is `op`; 0 when found. */
static int wait_op(int fd, client *c, const char *op) {
    mp_arena arena = {c->nodes, 1024, 0};
    for (;;) {
        mp_node *m;
        long k;
        while (c->len && (k = mp_parse(c->buf, c->len, &arena, &m)) > 0) {
            int hit = mp_str_is(mp_get(m, "op"), op);
            memmove(c->buf, c->buf + k, c->len - (size_t)k);
            c->len -= (size_t)k;
            if (hit)
                return 0;
        }
        ssize_t n = recv(fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (n <= 0)
            return -1;
        c->len += (size_t)n;
    }
}

static void *run(void *arg) {
    client *c = arg;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("grant_rtt: connect");
        exit(1);
    }
    uint8_t b[256];
    char inst[32];
    mp_writer w;
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 3), mp_w_str(&w, "op"), mp_w_str(&w, "hello"), mp_w_str(&w, "versions"), mp_w_array(&w, 1),
        mp_w_int(&w, 1), mp_w_str(&w, "client"), mp_w_str(&w, "grant_rtt");
    if (send_w(fd, &w) || wait_op(fd, c, "welcome"))
        exit(1);
    snprintf(inst, sizeof inst, "crtt-%d", c->index % 8);
    mp_writer_init(&w, b, sizeof b);
    mp_w_map(&w, 4), mp_w_str(&w, "op"), mp_w_str(&w, "register"), mp_w_str(&w, "id"), mp_w_int(&w, 1),
        mp_w_str(&w, "instance"), mp_w_str(&w, inst), mp_w_str(&w, "gpus"), mp_w_array(&w, 1), mp_w_int(&w, 0);
    if (send_w(fd, &w) || wait_op(fd, c, "registered"))
        exit(1);
    unsigned seed = (unsigned)c->index * 7919u + 1;
    int64_t next = now_ns() + (int64_t)(rand_r(&seed) % PERIOD_NS);
    int64_t measure = now_ns() + (int64_t)(warmup * 1e9);
    int64_t end = measure + (int64_t)(seconds * 1e9);
    for (;;) {
        struct timespec at = {(time_t)(next / 1000000000LL), (long)(next % 1000000000LL)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
        if (now_ns() >= end || c->n >= MAX_SAMPLES)
            break;
        next += PERIOD_NS;
        mp_writer_init(&w, b, sizeof b);
        mp_w_map(&w, 3), mp_w_str(&w, "op"), mp_w_str(&w, "acquire"), mp_w_str(&w, "id"), mp_w_int(&w, 0),
            mp_w_str(&w, "gpu"), mp_w_int(&w, 0);
        int64_t t0 = now_ns();
        if (send_w(fd, &w))
            exit(1);
        /* the grant carries the lease to release */
        mp_arena arena = {c->nodes, 1024, 0};
        int64_t lease = -1;
        while (lease < 0) {
            mp_node *m;
            long k;
            while (lease < 0 && c->len && (k = mp_parse(c->buf, c->len, &arena, &m)) > 0) {
                if (mp_str_is(mp_get(m, "op"), "grant"))
                    mp_get_i64(m, "lease", &lease);
                memmove(c->buf, c->buf + k, c->len - (size_t)k);
                c->len -= (size_t)k;
            }
            if (lease >= 0)
                break;
            /* wait as libcgpu.so does: poll() for input, then recv() (see read_msg there) */
            struct pollfd pf = {fd, POLLIN, 0};
            ssize_t n = poll(&pf, 1, -1) < 0 ? -1 : recv(fd, c->buf + c->len, sizeof c->buf - c->len, 0);
            if (n <= 0)
                exit(1);
            c->len += (size_t)n;
        }
        if (t0 >= measure)
            c->samples[c->n++] = (double)(now_ns() - t0) / 1e3;
        c->pairs++;
        mp_writer_init(&w, b, sizeof b);
        mp_w_map(&w, 4), mp_w_str(&w, "op"), mp_w_str(&w, "release"), mp_w_str(&w, "gpu"), mp_w_int(&w, 0),
            mp_w_str(&w, "lease"), mp_w_int(&w, lease), mp_w_str(&w, "used_ns"), mp_w_int(&w, 0);
        if (send_w(fd, &w))
            exit(1);
    }
    close(fd);
    return NULL;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: grant_rtt SOCKET CLIENTS SECONDS [WARMUP]\n");
        return 2;
    }
    if (argc == 5)
        warmup = atof(argv[4]);
    sock_path = argv[1];
    int n = atoi(argv[2]);
    seconds = atof(argv[3]);
    client *cs = calloc((size_t)n, sizeof *cs);
    pthread_t *ts = calloc((size_t)n, sizeof *ts);
    if (!cs || !ts)
        return 1;
    for (int i = 0; i < n; i++) {
        cs[i].index = i;
        cs[i].samples = calloc(MAX_SAMPLES, sizeof(double));
        if (!cs[i].samples || pthread_create(&ts[i], NULL, run, &cs[i]) != 0)
            return 1;
    }
    int total = 0;
    long pairs = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(ts[i], NULL);
        total += cs[i].n;
        pairs += cs[i].pairs;
    }
    double *all = malloc((size_t)(total ? total : 1) * sizeof *all);
    int k = 0;
    for (int i = 0; i < n; i++) {
        memcpy(all + k, cs[i].samples, (size_t)cs[i].n * sizeof *all);
        k += cs[i].n;
        free(cs[i].samples);
    }
    qsort(all, (size_t)total, sizeof *all, cmp);
    printf("rtt clients=%d samples=%d p50_us=%.1f p99_us=%.1f pairs_per_s=%.0f pairs_total=%ld\n", n, total,
           total ? all[total / 2] : 0.0, total ? all[(int)(total * 0.99)] : 0.0, total / seconds, pairs);
    free(all);
    free(cs);
    free(ts);
    return 0;
}
