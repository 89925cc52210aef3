#define _GNU_SOURCE
/* A fake of libnvidia-ml.so.1 for tests only: the device list, memory, the running processes and utilization.
 * Devices and totals come from FAKECUDA_DEVICES and FAKECUDA_MEM_MB, like the fake
 * driver; "used" is FAKENVML_USED_MB (default 0), which stands for other processes' memory, plus what this
 * process holds in the fake driver (its contexts and allocations), as NVML counts every process's. The processes with a context on each GPU, their memory and
 * utilization come from the control file FAKENVML_CONTROL names, which a test writes and
 * rewrites (read again at every call). See README.md beside this file. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_min.h" /* libcgpu_client/native, on the -I path */

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 16

struct nvmlDevice_st {
    unsigned int index;
};
static struct nvmlDevice_st devices[MAX_DEVICES];
static int inited;

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}
static unsigned count(void) {
    long n = env_long("FAKECUDA_DEVICES", 1);
    return (unsigned)(n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    for (unsigned k = 0; k < MAX_DEVICES; k++)
        devices[k].index = k;
    inited++;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
/* what nvidia-ml-py's nvmlInit() calls since 12.x; flags: NVML_INIT_FLAG_NO_GPUS (1), NVML_INIT_FLAG_NO_ATTACH (2) */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    if (flags & ~3u)
        return NVML_ERROR_INVALID_ARGUMENT;
    return nvmlInit_v2();
}
EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    inited--;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devices[i];
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) { return d >= &devices[0] && d < &devices[count()]; }

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !i)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !name)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (snprintf(name, len, "cgpu fake GPU %u", d->index) >= (int)len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (snprintf(uuid, len, "GPU-fa4e0000-0000-0000-0000-%012u", d->index) >= (int)len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

/* What the fake driver loaded in this process holds on device index (0 without it). */
static unsigned long long this_process(unsigned index) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda)
        return 0;
    int64_t (*used)(int) = (int64_t(*)(int))dlsym(cuda, "fakecuda_used_bytes");
    int64_t n = used ? used((int)index) : 0;
    dlclose(cuda);
    return n > 0 ? (unsigned long long)n : 0;
}

static void fill(unsigned index, unsigned long long *total, unsigned long long *used) {
    *total = (unsigned long long)env_long("FAKECUDA_MEM_MB", 16384) << 20;
    *used = ((unsigned long long)env_long("FAKENVML_USED_MB", 0) << 20) + this_process(index);
    if (*used > *total)
        *used = *total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill(d->index, &m->total, &m->used);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fill(d->index, &m->total, &m->used);
    m->reserved = 0;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* ---- the control file: one line per fact, '#' starts a comment:
 *   proc GPU PID BYTES [compute|graphics] [SM%|cpu]   a process with a context on GPU, its used memory and
 *                                                   utilization (cpu: the CPU the process used since the last
 *                                                   call, as a share of one CPU: the simulated GPU is the CPU)
 *   util GPU PCT                                  the GPU's utilization (default: the sum of its processes' SM%)  */
#define MAX_PROCS 256
struct fake_proc {
    unsigned gpu, pid, sm;
    unsigned long long used;
    int graphics;
};
static struct { unsigned pid; unsigned long long ticks, ns; } cpu_seen[MAX_PROCS];

static unsigned long long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* the share of one CPU process pid used since the last time it was asked (0 the first time, or once it is gone) */
static unsigned cpu_share(unsigned pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    unsigned long long ticks = ut + st, ns = now_ns(CLOCK_MONOTONIC), hz = (unsigned long long)sysconf(_SC_CLK_TCK);
    int slot = -1;
    for (int k = 0; k < MAX_PROCS && slot < 0; k++)
        if (cpu_seen[k].pid == pid || cpu_seen[k].pid == 0)
            slot = k;
    if (slot < 0)
        slot = (int)(pid % MAX_PROCS);
    unsigned share = 0;
    if (cpu_seen[slot].pid == pid && ns > cpu_seen[slot].ns)
        share = (unsigned)((ticks - cpu_seen[slot].ticks) * 1000000000ull / hz * 100 / (ns - cpu_seen[slot].ns));
    cpu_seen[slot].pid = pid;
    cpu_seen[slot].ticks = ticks;
    cpu_seen[slot].ns = ns;
    return share > 100 ? 100 : share;
}
/* nvmlProcessInfo_v2_t/_v3_t, nvmlUtilization_t and nvmlProcessUtilizationSample_t, as nvml.h lays them out */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    fake_process_info_t;
typedef struct { unsigned int gpu, memory; } fake_utilization_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; }
    fake_process_sample_t;

static int read_control(struct fake_proc *procs, int *util, unsigned ndev) {
    const char *path = getenv("FAKENVML_CONTROL");
    int n = 0;
    for (unsigned k = 0; k < ndev && k < MAX_DEVICES; k++)
        util[k] = -1;
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    char line[256], kind[16];
    while (fgets(line, sizeof line, f)) {
        unsigned gpu, pid, sm = 0;
        unsigned long long used;
        int pct;
        kind[0] = 0;
        if (sscanf(line, " proc %u %u %llu %15s %u", &gpu, &pid, &used, kind, &sm) >= 3) {
            if (gpu >= ndev || n >= MAX_PROCS)
                continue;
            if (strstr(line, " cpu"))
                sm = 101; /* measured when asked: cpu_share */
            procs[n] = (struct fake_proc){gpu, pid, sm > 101 ? 100 : sm, used, strcmp(kind, "graphics") == 0};
            n++;
        } else if (sscanf(line, " util %u %d", &gpu, &pct) == 2 && gpu < ndev) {
            util[gpu] = pct < 0 ? 0 : pct > 100 ? 100 : pct;
        }
    }
    fclose(f);
    return n;
}

static nvmlReturn_t running(nvmlDevice_t d, unsigned int *cnt, fake_process_info_t *infos, int graphics) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !cnt)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_proc procs[MAX_PROCS];
    int util[MAX_DEVICES];
    int n = read_control(procs, util, count());
    unsigned found = 0;
    for (int k = 0; k < n; k++)
        found += procs[k].gpu == d->index && procs[k].graphics == graphics;
    if (found > *cnt || (found && !infos)) { /* as NVML: the count needed, and INSUFFICIENT_SIZE */
        *cnt = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned i = 0;
    for (int k = 0; k < n; k++)
        if (procs[k].gpu == d->index && procs[k].graphics == graphics)
            infos[i++] = (fake_process_info_t){procs[k].pid, procs[k].used, 0xFFFFFFFFu, 0xFFFFFFFFu};
    *cnt = found;
    return NVML_SUCCESS;
}

/* what nvidia-ml-py's nvmlDeviceGetComputeRunningProcesses / ...GraphicsRunningProcesses call (the _v3 ABI;
 * _v2 has the same layout) */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, fake_process_info_t *p) {
    return running(d, c, p, 0);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, fake_process_info_t *p) {
    return running(d, c, p, 0);
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, fake_process_info_t *p) {
    return running(d, c, p, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, fake_process_info_t *p) {
    return running(d, c, p, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, fake_utilization_t *u) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !u)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_proc procs[MAX_PROCS];
    int util[MAX_DEVICES];
    int n = read_control(procs, util, count());
    unsigned sum = 0;
    for (int k = 0; k < n; k++)
        sum += procs[k].gpu == d->index && procs[k].sm <= 100 ? procs[k].sm : 0;
    u->gpu = util[d->index] >= 0 ? (unsigned)util[d->index] : sum > 100 ? 100 : sum;
    u->memory = 0;
    return NVML_SUCCESS;
}

/* one sample per process of the GPU with an SM%, stamped now (us since the epoch, as NVML); NOT_FOUND when none */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, fake_process_sample_t *s, unsigned int *cnt,
                                                    unsigned long long last_seen) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !cnt)
        return NVML_ERROR_INVALID_ARGUMENT;
    (void)last_seen;
    struct fake_proc procs[MAX_PROCS];
    int util[MAX_DEVICES];
    int n = read_control(procs, util, count());
    unsigned found = 0;
    for (int k = 0; k < n; k++)
        found += procs[k].gpu == d->index;
    if (!found)
        return NVML_ERROR_NOT_FOUND;
    if (!s || found > *cnt) {
        *cnt = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long now = now_ns(CLOCK_REALTIME) / 1000;
    unsigned i = 0;
    for (int k = 0; k < n; k++)
        if (procs[k].gpu == d->index)
            s[i++] = (fake_process_sample_t){procs[k].pid, now, procs[k].sm > 100 ? cpu_share(procs[k].pid)
                                                                                   : procs[k].sm, 0, 0, 0};
    *cnt = found;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    return snprintf(v, len, "550.0-fake") >= (int)len ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
