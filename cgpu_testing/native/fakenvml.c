/* A fake of libnvidia-ml.so.1 for tests only: the device list and memory queries.
 * Devices and totals come from FAKECUDA_DEVICES and FAKECUDA_MEM_MB, like the fake
 * driver; "used" is FAKENVML_USED_MB (default 0) because the fake cannot see other
 * processes' allocations. See README.md beside this file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void fill(unsigned long long *total, unsigned long long *used) {
    *total = (unsigned long long)env_long("FAKECUDA_MEM_MB", 16384) << 20;
    *used = (unsigned long long)env_long("FAKENVML_USED_MB", 0) << 20;
    if (*used > *total)
        *used = *total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill(&m->total, &m->used);
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
    fill(&m->total, &m->used);
    m->reserved = 0;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    return snprintf(v, len, "550.0-fake") >= (int)len ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
