/* The process's settings (parsed once at load) and its log line, shared by every layer. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "shim.h"

cgpu_env cgpu_cfg;
int cgpu_env_ok;

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

int cgpu_spawn(void *(*fn)(void *), const char *what) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    int rc = pthread_create(&t, &a, fn, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0)
        cgpu_log("cannot start its %s thread", what);
    return rc;
}

void cgpu_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void cgpu_deadline_in(struct timespec *ts, int64_t ns) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ns / 1000000000LL;
    ts->tv_nsec += ns % 1000000000LL;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}
