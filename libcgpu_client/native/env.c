/* Strict environment parsing; the rules are those of libcgpu_client/env.py. */
#include "env.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GIB (1024LL * 1024 * 1024)

static int bad(char *err, int errlen, const char *name, const char *value, const char *fmt, ...) {
    char expected[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expected, sizeof expected, fmt, ap);
    va_end(ap);
    snprintf(err, (size_t)errlen, "%s='%.200s': expected %s", name, value, expected);
    return -1;
}

/* value with surrounding blanks removed, into buf; returns buf */
static char *trim(const char *v, char *buf, size_t cap) {
    while (*v && isspace((unsigned char)*v))
        v++;
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1]))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, v, n);
    buf[n] = 0;
    return buf;
}

/* NULL when unset or blank, like env.py's get() */
static const char *lookup(const char *(*get)(const char *), const char *name) {
    const char *v = get(name);
    if (!v)
        return NULL;
    for (const char *p = v; *p; p++)
        if (!isspace((unsigned char)*p))
            return v;
    return NULL;
}

static int all_digits(const char *s) {
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

static int parse_bool(const char *name, const char *value, int *out, char *err, int errlen) {
    char b[32];
    trim(value, b, sizeof b);
    static const char *t[] = {"1", "true", "yes", "on"}, *f[] = {"0", "false", "no", "off"};
    for (int k = 0; k < 4; k++) {
        if (strcasecmp(b, t[k]) == 0)
            return *out = 1, 0;
        if (strcasecmp(b, f[k]) == 0)
            return *out = 0, 0;
    }
    return bad(err, errlen, name, value, "true or false (also 1/0, yes/no)");
}

static int parse_int(const char *name, const char *value, long lo, long hi, int *out, char *err, int errlen) {
    char b[32];
    trim(value, b, sizeof b);
    if (!all_digits(b) || strlen(b) > 9 || atol(b) < lo || atol(b) > hi)
        return bad(err, errlen, name, value, "an integer %ld..%ld", lo, hi);
    *out = (int)atol(b);
    return 0;
}

/* split on commas into trimmed parts; returns the count or -1 when too many */
static int split(const char *value, char parts[][96], int maxparts) {
    int n = 0;
    const char *p = value;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (n == maxparts)
            return -1;
        char tmp[96];
        if (len >= sizeof tmp)
            len = sizeof tmp - 1; /* too long to be valid; trim() keeps it invalid */
        memcpy(tmp, p, len);
        tmp[len] = 0;
        trim(tmp, parts[n++], 96);
        if (!c)
            return n;
        p = c + 1;
    }
}

static int uuid_ok(const char *s) {
    if (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0)
        return 0;
    size_t n = strlen(s + 4);
    if (n < 4 || n > 80)
        return 0;
    for (const char *p = s + 4; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-')
            return 0;
    return 1;
}

static int instance_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 128 || !isalnum((unsigned char)s[0]))
        return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("_.-", *p))
            return 0;
    return 1;
}

static int64_t unit_of(const char *u) {
    static const struct { const char *name; int64_t mult; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1024}, {"kib", 1024}, {"m", 1024 * 1024}, {"mib", 1024 * 1024},
        {"g", GIB}, {"gib", GIB}, {"t", 1024 * GIB}, {"tib", 1024 * GIB}};
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
        if (strcasecmp(u, units[k].name) == 0)
            return units[k].mult;
    return 0;
}

int cgpu_parse_env(const char *(*get)(const char *), cgpu_env *e, char *err, int errlen) {
    const char *v;
    char parts[CGPU_MAX_GPUS + 1][96];
    memset(e, 0, sizeof *e);
    snprintf(e->socket, sizeof e->socket, "/run/cgpu/arbiter.sock");
    e->ngpus = 1;
    e->gpu_index[0] = 0;
    e->weight = 1;
    e->idle_ms = 3.0;
    snprintf(e->device, sizeof e->device, "auto");
    e->ncoll = 2; /* env.py's COLLECTIVES */
    snprintf(e->coll[0], sizeof e->coll[0], "nccl");
    snprintf(e->coll[1], sizeof e->coll[1], "cross_device_reduce");

    if ((v = lookup(get, "CGPU_DISABLE")) && parse_bool("CGPU_DISABLE", v, &e->disabled, err, errlen))
        return -1;
    if ((v = lookup(get, "ALIYUN_COM_GPU_VISIBLE_DEVICES"))) {
        int n = split(v, parts, CGPU_MAX_GPUS);
        if (n < 0)
            return bad(err, errlen, "ALIYUN_COM_GPU_VISIBLE_DEVICES", v, "at most %d GPUs", CGPU_MAX_GPUS);
        for (int k = 0; k < n; k++) {
            if (all_digits(parts[k]) && strlen(parts[k]) <= 3) {
                e->gpu_index[k] = atoi(parts[k]);
            } else if (uuid_ok(parts[k])) {
                e->gpu_index[k] = -1;
                snprintf(e->gpu_uuid[k], sizeof e->gpu_uuid[k], "%s", parts[k]);
            } else {
                return bad(err, errlen, "ALIYUN_COM_GPU_VISIBLE_DEVICES", v,
                           "GPU indices like 0,1 or UUIDs like GPU-xxxxxxxx-...");
            }
            for (int j = 0; j < k; j++)
                if (e->gpu_index[j] == e->gpu_index[k] && strcmp(e->gpu_uuid[j], e->gpu_uuid[k]) == 0)
                    return bad(err, errlen, "ALIYUN_COM_GPU_VISIBLE_DEVICES", v, "each GPU once");
        }
        e->ngpus = n;
    }
    if ((v = lookup(get, "ALIYUN_COM_GPU_SCHD_WEIGHT")) &&
        parse_int("ALIYUN_COM_GPU_SCHD_WEIGHT", v, 1, 25, &e->weight, err, errlen))
        return -1;
    if ((v = lookup(get, "CGPU_CORE_PERCENT"))) {
        char b[32];
        trim(v, b, sizeof b);
        if (!all_digits(b) || strlen(b) > 3 || atol(b) < 5 || atol(b) > 100 || atol(b) % 5)
            return bad(err, errlen, "CGPU_CORE_PERCENT", v, "a multiple of 5 from 5 to 100 (a GPU-core percentage)");
        if (lookup(get, "ALIYUN_COM_GPU_SCHD_WEIGHT"))
            return bad(err, errlen, "CGPU_CORE_PERCENT", v, "either it or ALIYUN_COM_GPU_SCHD_WEIGHT, not both");
        e->core_percent = (int)atol(b);
        e->weight = e->core_percent / 5;
    }
    if ((v = lookup(get, "CGPU_CORE_LIMIT")) &&
        parse_int("CGPU_CORE_LIMIT", v, 5, 100, &e->core_limit, err, errlen))
        return -1;
    if ((v = lookup(get, "ALIYUN_COM_GPU_HIGH_PRIO")) &&
        parse_int("ALIYUN_COM_GPU_HIGH_PRIO", v, 0, 1, &e->highprio, err, errlen))
        return -1;
    int mem_dev = 0;
    if ((v = lookup(get, "ALIYUN_COM_GPU_MEM_DEV")) &&
        parse_int("ALIYUN_COM_GPU_MEM_DEV", v, 1, 4096, &mem_dev, err, errlen))
        return -1;
    if ((v = lookup(get, "ALIYUN_COM_GPU_MEM_CONTAINER"))) {
        const char *name = "ALIYUN_COM_GPU_MEM_CONTAINER";
        int n = split(v, parts, CGPU_MAX_GPUS + 1);
        for (int k = 0; k < n; k++)
            if (!all_digits(parts[k]) || strlen(parts[k]) > 9)
                return bad(err, errlen, name, v, "whole GiB like 3 or a list like 3,4,5");
        if (n < 0 || n > e->ngpus)
            return bad(err, errlen, name, v, "at most %d value(s), one per visible card", e->ngpus);
        int any = 0;
        for (int k = 0; k < e->ngpus; k++) {
            long gib = atol(parts[k < n ? k : n - 1]);
            if (mem_dev && gib > mem_dev)
                return bad(err, errlen, name, v, "at most ALIYUN_COM_GPU_MEM_DEV=%d GiB per card", mem_dev);
            e->memsize[k] = gib * GIB;
            any |= gib != 0;
        }
        e->nmem = any ? e->ngpus : 0;
    }
    if ((v = lookup(get, "CGPU_MEM_LIMIT"))) {
        const char *name = "CGPU_MEM_LIMIT";
        int n = split(v, parts, CGPU_MAX_GPUS + 1);
        int64_t sizes[CGPU_MAX_GPUS + 1];
        for (int k = 0; k < n; k++) {
            char *end;
            const char *p = parts[k];
            if (!isdigit((unsigned char)*p))
                return bad(err, errlen, name, v, "sizes like 600MiB or 1GiB,2GiB");
            long long num = strtoll(p, &end, 10);
            while (*end == ' ' || *end == '\t')
                end++;
            int64_t mult = unit_of(end);
            if (!mult || end - p > 15)
                return bad(err, errlen, name, v, "sizes like 600MiB or 1GiB,2GiB");
            sizes[k] = num * mult;
        }
        if (n < 0 || n > e->ngpus)
            return bad(err, errlen, name, v, "at most %d value(s), one per visible card", e->ngpus);
        int any = 0;
        for (int k = 0; k < e->ngpus; k++) {
            e->memsize[k] = sizes[k < n ? k : n - 1];
            any |= e->memsize[k] != 0;
        }
        e->nmem = any ? e->ngpus : 0;
    }
    if ((v = lookup(get, "CGPU_INSTANCE"))) {
        if (!instance_ok(v))
            return bad(err, errlen, "CGPU_INSTANCE", v, "1-128 of A-Z a-z 0-9 _ . - (not starting with . - _)");
        snprintf(e->instance, sizeof e->instance, "%s", v);
    }
    if ((v = lookup(get, "CGPU_ON_DAEMON_LOSS"))) {
        if (strcmp(v, "wait") != 0 && strcmp(v, "run") != 0)
            return bad(err, errlen, "CGPU_ON_DAEMON_LOSS", v, "wait or run");
        e->on_loss_run = strcmp(v, "run") == 0;
    }
    if ((v = lookup(get, "CGPU_IDLE_MS"))) {
        char b[64], *end;
        trim(v, b, sizeof b);
        double ms = strtod(b, &end);
        if (end == b || *end || !(ms >= 0.1 && ms <= 10000))
            return bad(err, errlen, "CGPU_IDLE_MS", v, "milliseconds, 0.1..10000");
        e->idle_ms = ms;
    }
    if ((v = lookup(get, "CGPU_DEVICE"))) {
        char b[64];
        trim(v, b, sizeof b);
        for (char *p = b; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        if (strcmp(b, "auto") && strcmp(b, "cuda") && strcmp(b, "cpu"))
            return bad(err, errlen, "CGPU_DEVICE", b, "auto, cuda or cpu");
        snprintf(e->device, sizeof e->device, "%.7s", b);
    }
    if ((v = lookup(get, "CGPU_NATIVE")) && parse_bool("CGPU_NATIVE", v, &e->native, err, errlen))
        return -1;
    if ((v = lookup(get, "CGPU_COLLECTIVE_KERNELS"))) {
        static const char *expected = "none, or 1-8 comma-separated parts of kernel names (A-Z a-z 0-9 _, up to 63 "
                                      "each)";
        char b[600];
        if (strlen(v) >= sizeof b)
            return bad(err, errlen, "CGPU_COLLECTIVE_KERNELS", v, "%s", expected);
        trim(v, b, sizeof b);
        e->ncoll = 0;
        if (strcmp(b, "none") != 0) {
            for (char *part = b, *next; part; part = next) {
                next = strchr(part, ',');
                if (next)
                    *next++ = 0;
                char t[sizeof b];
                if (e->ncoll == 8)
                    return bad(err, errlen, "CGPU_COLLECTIVE_KERNELS", v, "%s", expected);
                trim(part, t, sizeof t);
                if (!t[0] || strlen(t) > 63)
                    return bad(err, errlen, "CGPU_COLLECTIVE_KERNELS", v, "%s", expected);
                for (const char *c = t; *c; c++)
                    if (!isalnum((unsigned char)*c) && *c != '_')
                        return bad(err, errlen, "CGPU_COLLECTIVE_KERNELS", v, "%s", expected);
                snprintf(e->coll[e->ncoll++], sizeof e->coll[0], "%.63s", t);
            }
        }
    }
    if ((v = lookup(get, "CGPU_SOCKET"))) {
        if (strlen(v) > 107)
            return bad(err, errlen, "CGPU_SOCKET", v, "a UNIX socket path of at most 107 bytes");
        snprintf(e->socket, sizeof e->socket, "%s", v);
    }
    return 0;
}
