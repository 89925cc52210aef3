/* The CUDA driver and NVML as libcgpu.so sees them: the entry points it interposes (HOOKS),
 * the ones it only calls (HELPERS), and how it reaches the real ones (resolve.c). */
#ifndef CGPU_HOOKS_H
#define CGPU_HOOKS_H

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))

enum { LIB_CUDA, LIB_NVML };

/* name, base name for cuGetProcAddress, versions [min, max), per-thread-stream variant, library */
#define HOOKS(X)                                                                \
    X(cuInit, "cuInit", 0, 1 << 30, 0, LIB_CUDA)                                \
    X(cuLaunchKernel, "cuLaunchKernel", 0, 1 << 30, 0, LIB_CUDA)                \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 0, 1 << 30, 1, LIB_CUDA)           \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 0, 1 << 30, 0, LIB_CUDA)            \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 0, 1 << 30, 1, LIB_CUDA)       \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0, 1 << 30, 0, LIB_CUDA) \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 0, 1 << 30, 1, LIB_CUDA) \
    X(cuGraphLaunch, "cuGraphLaunch", 0, 1 << 30, 0, LIB_CUDA)                  \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 0, 1 << 30, 1, LIB_CUDA)             \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 1 << 30, 0, LIB_CUDA)                  \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 1 << 30, 0, LIB_CUDA)        \
    X(cuMemFree_v2, "cuMemFree", 3020, 1 << 30, 0, LIB_CUDA)                    \
    X(cuMemAllocAsync, "cuMemAllocAsync", 0, 1 << 30, 0, LIB_CUDA)              \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 0, 1 << 30, 1, LIB_CUDA)         \
    X(cuMemFreeAsync, "cuMemFreeAsync", 0, 1 << 30, 0, LIB_CUDA)                \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 0, 1 << 30, 1, LIB_CUDA)           \
    X(cuMemCreate, "cuMemCreate", 0, 1 << 30, 0, LIB_CUDA)                      \
    X(cuMemRelease, "cuMemRelease", 0, 1 << 30, 0, LIB_CUDA)                    \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 1 << 30, 0, LIB_CUDA)              \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 1 << 30, 0, LIB_CUDA)      \
    X(cuGetProcAddress, "cuGetProcAddress", 0, 12000, 0, LIB_CUDA)              \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 1 << 30, 0, LIB_CUDA)     \
    X(nvmlDeviceGetMemoryInfo, "", 0, 0, 0, LIB_NVML)                           \
    X(nvmlDeviceGetMemoryInfo_v2, "", 0, 0, 0, LIB_NVML)

/* driver functions the shim calls but does not interpose */
#define HELPERS(X)                                                              \
    X(cuCtxSynchronize, "", 0, 0, 0, LIB_CUDA)                                  \
    X(cuCtxGetCurrent, "", 0, 0, 0, LIB_CUDA)                                   \
    X(cuCtxGetDevice, "", 0, 0, 0, LIB_CUDA)                                    \
    X(cuCtxPushCurrent_v2, "", 0, 0, 0, LIB_CUDA)                               \
    X(cuCtxPopCurrent_v2, "", 0, 0, 0, LIB_CUDA)                                \
    X(cuStreamIsCapturing, "", 0, 0, 0, LIB_CUDA)                               \
    X(cuDeviceGetUuid, "", 0, 0, 0, LIB_CUDA)                                   \
    X(cuThreadExchangeStreamCaptureMode, "", 0, 0, 0, LIB_CUDA)                 \
    X(cuDeviceGetUuid_v2, "", 0, 0, 0, LIB_CUDA)                                \
    X(nvmlDeviceGetIndex, "", 0, 0, 0, LIB_NVML)

#define AS_ENUM(name, base, lo, hi, ptsz, lib) H_##name,
enum { HOOKS(AS_ENUM) N_HOOKS, HELPERS(AS_ENUM) N_ALL };


typedef CUresult(init_t)(unsigned int);
typedef CUresult(launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **, void **);
typedef CUresult(launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult(launch_coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, CUstream, void **);
typedef CUresult(graph_launch_t)(CUgraphExec, CUstream);
typedef CUresult(mem_alloc_t)(CUdeviceptr *, size_t);
typedef CUresult(mem_alloc_pitch_t)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult(mem_free_t)(CUdeviceptr);
typedef CUresult(mem_alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult(mem_free_async_t)(CUdeviceptr, CUstream);
typedef CUresult(mem_create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult(mem_release_t)(CUmemGenericAllocationHandle);
typedef CUresult(mem_get_info_t)(size_t *, size_t *);
typedef CUresult(total_mem_t)(size_t *, CUdevice);
typedef CUresult(gpa_t)(const char *, void **, int, cuuint64_t);
typedef CUresult(gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef nvmlReturn_t(nvml_mem_t)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t(nvml_mem2_t)(nvmlDevice_t, nvmlMemory_v2_t *);

EXPORT init_t cuInit;
EXPORT launch_t cuLaunchKernel, cuLaunchKernel_ptsz;
EXPORT launch_ex_t cuLaunchKernelEx, cuLaunchKernelEx_ptsz;
EXPORT launch_coop_t cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz;
EXPORT graph_launch_t cuGraphLaunch, cuGraphLaunch_ptsz;
EXPORT mem_alloc_t cuMemAlloc_v2;
EXPORT mem_alloc_pitch_t cuMemAllocPitch_v2;
EXPORT mem_free_t cuMemFree_v2;
EXPORT mem_alloc_async_t cuMemAllocAsync, cuMemAllocAsync_ptsz;
EXPORT mem_free_async_t cuMemFreeAsync, cuMemFreeAsync_ptsz;
EXPORT mem_create_t cuMemCreate;
EXPORT mem_release_t cuMemRelease;
EXPORT mem_get_info_t cuMemGetInfo_v2;
EXPORT total_mem_t cuDeviceTotalMem_v2;
EXPORT gpa_t cuGetProcAddress;
EXPORT gpa2_t cuGetProcAddress_v2;
EXPORT nvml_mem_t nvmlDeviceGetMemoryInfo;
EXPORT nvml_mem2_t nvmlDeviceGetMemoryInfo_v2;

/* The driver functions the shim only calls (HELPERS): declared for their types, never defined here. */
CUresult cuCtxSynchronize(void);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *);
CUresult cuDeviceGetUuid(CUuuid *, CUdevice);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t, unsigned int *);

/* The real entry point idx (an H_ value); NULL when the driver lacks it. */
CGPU_HIDDEN void *cgpu_real(int idx);
/* The real entry point, typed like the declaration above (the hook's own, or the helper's). */
#define REAL(name) ((__typeof__(name) *)cgpu_real(H_##name))
#define REAL_OR_FAIL(name)                \
    __typeof__(name) *real = REAL(name);  \
    if (!real)                            \
    return CUDA_ERROR_NOT_FOUND

CGPU_HIDDEN CUcontext cgpu_current_context(void);
CGPU_HIDDEN void cgpu_sync_context(CUcontext ctx);
/* The visible position (in ALIYUN_COM_GPU_VISIBLE_DEVICES) of CUDA device ordinal dev: the registered GPU with
 * the device's UUID; -1 when it is none of them. Learned once per device, after waiting for the registration up
 * to wait_ms (< 0: as the gates wait, for good unless CGPU_ON_DAEMON_LOSS=run). */
CGPU_HIDDEN int cgpu_device_pos(CUdevice dev, int wait_ms);
CGPU_HIDDEN CUdevice cgpu_current_device(void); /* -1 with no current context */
CGPU_HIDDEN int cgpu_current_pos(void);         /* cgpu_device_pos of the current context's device, as gates wait */

#endif
