/* The floor under the grant round trip: one small message to another process over a
 * UNIX stream socket and one back, with nothing in between (no daemon, no decoding).
 *
 *   pingpong SECONDS [SOCKET]
 *
 * Without SOCKET the other end is a forked C process that echoes; with SOCKET it is
 * whatever echo server listens there (bench.overhead starts one on Python's event loop).
 * Paced like grant_rtt's clients (a round trip every 5 ms), so both ends sleep between
 * messages as they do there. Prints "pingpong samples=S p50_us=X p99_us=Y". */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: pingpong SECONDS [SOCKET]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    int sv[2];
    pid_t echo = -1;
    if (argc == 3) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(argv[2]) >= sizeof addr.sun_path) {
            fprintf(stderr, "pingpong: socket path too long\n");
            return 2;
        }
        strcpy(addr.sun_path, argv[2]);
        sv[0] = socket(AF_UNIX, SOCK_STREAM, 0);
        if (sv[0] < 0 || connect(sv[0], (struct sockaddr *)&addr, sizeof addr) != 0) {
            perror("pingpong: connect");
            return 1;
        }
    } else if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    } else if ((echo = fork()) == 0) {
        char buf[64];
        close(sv[0]);
        for (;;) {
            ssize_t r = read(sv[1], buf, sizeof buf);
            if (r <= 0 || write(sv[1], buf, (size_t)r) != r)
                _exit(0);
        }
    }
    if (argc == 2 && echo < 0) {
        perror("pingpong: fork");
        return 1;
    }
    if (echo > 0)
        close(sv[1]);
    size_t cap = (size_t)(seconds * 1000 / 5) + 16, n = 0;
    double *samples = malloc(cap * sizeof *samples);
    char msg[32] = {0}, back[64];
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end && n < cap) {
        usleep(5000);
        long long t0 = now_ns();
        if (write(sv[0], msg, sizeof msg) != (ssize_t)sizeof msg || read(sv[0], back, sizeof back) <= 0)
            break;
        samples[n++] = (double)(now_ns() - t0) / 1e3;
    }
    close(sv[0]);
    if (echo > 0)
        waitpid(echo, NULL, 0);
    if (n == 0)
        return 1;
    qsort(samples, n, sizeof *samples, cmp);
    printf("pingpong samples=%zu p50_us=%.1f p99_us=%.1f\n", n, samples[n / 2], samples[n * 99 / 100]);
    free(samples);
    return 0;
}
