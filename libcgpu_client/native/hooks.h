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
    X(nvmlDeviceGetMemoryInfo_v2, "", 0, 0, 0, LIB_NVML)                        \
    MEMORY_HOOKS(X)                                                             \
    GRAPH_MEMORY_HOOKS(X)                                                       \
    GRAPH_COLLECTIVE_HOOKS(X)                                                   \
    CAPTURE_HOOKS(X)

/* Graphs built from graphs (graphcoll.c): the collectives they hold. */
#define GRAPH_COLLECTIVE_HOOKS(X)                                                                  \
    X(cuGraphClone, "cuGraphClone", 0, 1 << 30, 0, LIB_CUDA)                                       \
    X(cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode", 0, 1 << 30, 0, LIB_CUDA)

/* Stream captures (capture.c): the shim's syncs wait until none is open. */
#define CAPTURE_HOOKS(X)                                                                             \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", 0, 10010, 0, LIB_CUDA)                           \
    X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 0, 10010, 1, LIB_CUDA)                      \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 1 << 30, 0, LIB_CUDA)                  \
    X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1 << 30, 1, LIB_CUDA)             \
    X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 0, 1 << 30, 0, LIB_CUDA)           \
    X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 0, 1 << 30, 1, LIB_CUDA)      \
    X(cuStreamEndCapture, "cuStreamEndCapture", 0, 1 << 30, 0, LIB_CUDA)                             \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 0, 1 << 30, 1, LIB_CUDA)

/* The rest of the memory a process takes (pools.c, context.c, memory.c): stream-ordered pools and the
 * synchronisations at which a pool gives memory back, managed memory, arrays, contexts. */
#define MEMORY_HOOKS(X)                                                                        \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0, 1 << 30, 0, LIB_CUDA)             \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 0, 1 << 30, 1, LIB_CUDA)        \
    X(cuMemPoolCreate, "cuMemPoolCreate", 0, 1 << 30, 0, LIB_CUDA)                             \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 0, 1 << 30, 0, LIB_CUDA)                           \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 0, 1 << 30, 0, LIB_CUDA)                             \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 0, 1 << 30, 0, LIB_CUDA)                 \
    X(cuStreamSynchronize, "cuStreamSynchronize", 0, 1 << 30, 0, LIB_CUDA)                     \
    X(cuStreamSynchronize_ptsz, "cuStreamSynchronize", 0, 1 << 30, 1, LIB_CUDA)                \
    X(cuEventSynchronize, "cuEventSynchronize", 0, 1 << 30, 0, LIB_CUDA)                       \
    X(cuCtxSynchronize, "cuCtxSynchronize", 0, 13000, 0, LIB_CUDA)                             \
    X(cuMemAllocManaged, "cuMemAllocManaged", 0, 1 << 30, 0, LIB_CUDA)                         \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 1 << 30, 0, LIB_CUDA)                           \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 1 << 30, 0, LIB_CUDA)                       \
    X(cuArrayDestroy, "cuArrayDestroy", 0, 1 << 30, 0, LIB_CUDA)                               \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0, 1 << 30, 0, LIB_CUDA)               \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0, 1 << 30, 0, LIB_CUDA)             \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0, 1 << 30, 0, LIB_CUDA)           \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 1 << 30, 0, LIB_CUDA)  \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 11040, 0, LIB_CUDA)                                 \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 12050, 0, LIB_CUDA)                                \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 1 << 30, 0, LIB_CUDA)                              \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 1 << 30, 0, LIB_CUDA)

/* Graph memory nodes (graphmem.c) and imported pools (pools.c): what the device's graph memory pool reserves, and
 * pools whose memory another process holds. */
#define GRAPH_MEMORY_HOOKS(X)                                                                               \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 0, 1 << 30, 0, LIB_CUDA)                            \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 0, 1 << 30, 0, LIB_CUDA)                  \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 0, 1 << 30, 0, LIB_CUDA)                \
    X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 0, 1 << 30, 1, LIB_CUDA)           \
    X(cuGraphUpload, "cuGraphUpload", 0, 1 << 30, 0, LIB_CUDA)                                              \
    X(cuGraphUpload_ptsz, "cuGraphUpload", 0, 1 << 30, 1, LIB_CUDA)                                         \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 0, 1 << 30, 0, LIB_CUDA)                                \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 0, 1 << 30, 0, LIB_CUDA)                                    \
    X(cuGraphExecUpdate, "cuGraphExecUpdate", 0, 12000, 0, LIB_CUDA)                                        \
    X(cuGraphExecUpdate_v2, "cuGraphExecUpdate", 12000, 1 << 30, 0, LIB_CUDA)                               \
    X(cuGraphDestroy, "cuGraphDestroy", 0, 1 << 30, 0, LIB_CUDA)                                            \
    X(cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle", 0, 1 << 30, 0, LIB_CUDA)

/* driver functions the shim calls but does not interpose */
#define HELPERS(X)                                                              \
    X(cuCtxGetCurrent, "", 0, 0, 0, LIB_CUDA)                                   \
    X(cuCtxGetDevice, "", 0, 0, 0, LIB_CUDA)                                    \
    X(cuCtxPushCurrent_v2, "", 0, 0, 0, LIB_CUDA)                               \
    X(cuCtxPopCurrent_v2, "", 0, 0, 0, LIB_CUDA)                                \
    X(cuStreamIsCapturing, "", 0, 0, 0, LIB_CUDA)                               \
    X(cuDeviceGetUuid, "", 0, 0, 0, LIB_CUDA)                                   \
    X(cuThreadExchangeStreamCaptureMode, "", 0, 0, 0, LIB_CUDA)                 \
    X(cuDeviceGetUuid_v2, "", 0, 0, 0, LIB_CUDA)                                \
    X(nvmlDeviceGetIndex, "", 0, 0, 0, LIB_NVML)                                \
    X(cuDeviceGetMemPool, "", 0, 0, 0, LIB_CUDA)                                \
    X(cuMemPoolGetAttribute, "", 0, 0, 0, LIB_CUDA)                             \
    X(cuDeviceGetGraphMemAttribute, "", 0, 0, 0, LIB_CUDA)                      \
    X(cuStreamGetCaptureInfo_v2, "", 0, 0, 0, LIB_CUDA)                         \
    X(nvmlInit_v2, "", 0, 0, 0, LIB_NVML)                                       \
    X(nvmlDeviceGetHandleByIndex_v2, "", 0, 0, 0, LIB_NVML)                     \
    X(cuFuncGetName, "", 0, 0, 0, LIB_CUDA)                                     \
    X(cuKernelGetName, "", 0, 0, 0, LIB_CUDA)

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
typedef CUresult(alloc_from_pool_t)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult(pool_create_t)(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult(pool_destroy_t)(CUmemoryPool);
typedef CUresult(pool_trim_t)(CUmemoryPool, size_t);
typedef CUresult(pool_attr_t)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult(stream_sync_t)(CUstream);
typedef CUresult(event_sync_t)(CUevent);
typedef CUresult(ctx_sync_t)(void);
typedef CUresult(alloc_managed_t)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult(array_create_t)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult(array3d_create_t)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult(array_destroy_t)(CUarray);
typedef CUresult(mipmap_create_t)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult(mipmap_destroy_t)(CUmipmappedArray);
typedef CUresult(primary_retain_t)(CUcontext *, CUdevice);
typedef CUresult(primary_release_t)(CUdevice);
typedef CUresult(ctx_create2_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult(ctx_create3_t)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
typedef CUresult(ctx_create4_t)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult(ctx_destroy_t)(CUcontext);
typedef CUresult(begin_capture1_t)(CUstream);
typedef CUresult(begin_capture_t)(CUstream, CUstreamCaptureMode);
typedef CUresult(begin_capture_graph_t)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                                        CUstreamCaptureMode);
typedef CUresult(end_capture_t)(CUstream, CUgraph *);
typedef CUresult(add_alloc_node_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult(instantiate_flags_t)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult(instantiate_params_t)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult(graph_upload_t)(CUgraphExec, CUstream);
typedef CUresult(graph_mem_trim_t)(CUdevice);
typedef CUresult(graph_exec_destroy_t)(CUgraphExec);
typedef CUresult(exec_update1_t)(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
typedef CUresult(exec_update_t)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
typedef CUresult(graph_destroy_t)(CUgraph);
typedef CUresult(graph_clone_t)(CUgraph *, CUgraph);
typedef CUresult(add_child_node_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
typedef CUresult(pool_import_t)(CUmemoryPool *, void *, CUmemAllocationHandleType, unsigned long long);

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
EXPORT alloc_from_pool_t cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz;
EXPORT pool_create_t cuMemPoolCreate;
EXPORT pool_destroy_t cuMemPoolDestroy;
EXPORT pool_trim_t cuMemPoolTrimTo;
EXPORT pool_attr_t cuMemPoolSetAttribute;
EXPORT stream_sync_t cuStreamSynchronize, cuStreamSynchronize_ptsz;
EXPORT event_sync_t cuEventSynchronize;
EXPORT ctx_sync_t cuCtxSynchronize;
EXPORT alloc_managed_t cuMemAllocManaged;
EXPORT array_create_t cuArrayCreate_v2;
EXPORT array3d_create_t cuArray3DCreate_v2;
EXPORT array_destroy_t cuArrayDestroy;
EXPORT mipmap_create_t cuMipmappedArrayCreate;
EXPORT mipmap_destroy_t cuMipmappedArrayDestroy;
EXPORT primary_retain_t cuDevicePrimaryCtxRetain;
EXPORT primary_release_t cuDevicePrimaryCtxRelease_v2;
EXPORT ctx_create2_t cuCtxCreate_v2;
EXPORT ctx_create3_t cuCtxCreate_v3;
EXPORT ctx_create4_t cuCtxCreate_v4;
EXPORT ctx_destroy_t cuCtxDestroy_v2;
EXPORT begin_capture1_t cuStreamBeginCapture, cuStreamBeginCapture_ptsz;
EXPORT begin_capture_t cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz;
EXPORT begin_capture_graph_t cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz;
EXPORT end_capture_t cuStreamEndCapture, cuStreamEndCapture_ptsz;
EXPORT add_alloc_node_t cuGraphAddMemAllocNode;
EXPORT instantiate_flags_t cuGraphInstantiateWithFlags;
EXPORT instantiate_params_t cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz;
EXPORT graph_upload_t cuGraphUpload, cuGraphUpload_ptsz;
EXPORT graph_mem_trim_t cuDeviceGraphMemTrim;
EXPORT graph_exec_destroy_t cuGraphExecDestroy;
EXPORT exec_update1_t cuGraphExecUpdate;
EXPORT exec_update_t cuGraphExecUpdate_v2;
EXPORT graph_destroy_t cuGraphDestroy;
EXPORT graph_clone_t cuGraphClone;
EXPORT add_child_node_t cuGraphAddChildGraphNode;
EXPORT pool_import_t cuMemPoolImportFromShareableHandle;
/* graphmem.c: cuGraphLaunch's call of the real launch, with the graph memory pool's mapping charged first. */
CGPU_HIDDEN CUresult cgpu_graph_mem_launch(CUgraphExec e, CUstream s, graph_launch_t *real);
/* graphcoll.c: the collectives each graph holds. n collectives were captured on stream s (into its capture graph);
 * how many a launch of e holds; e runs g's nodes from now (instantiated from g, or updated with it); e or g is
 * destroyed (or g's capture failed). */
CGPU_HIDDEN void cgpu_graph_coll_captured(CUstream s, int n);
CGPU_HIDDEN int cgpu_graph_coll_of(CUgraphExec e);
CGPU_HIDDEN void cgpu_graph_coll_exec_from(CUgraphExec e, CUgraph g);
CGPU_HIDDEN void cgpu_graph_coll_exec_gone(CUgraphExec e);
CGPU_HIDDEN void cgpu_graph_coll_graph_gone(CUgraph g);

/* The driver functions the shim only calls (HELPERS): declared for their types, never defined here. */
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *);
CUresult cuDeviceGetUuid(CUuuid *, CUdevice);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t, unsigned int *);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void *);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void *);
CUresult cuStreamGetCaptureInfo_v2(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **,
                                   size_t *);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
CUresult cuFuncGetName(const char **, CUfunction);
CUresult cuKernelGetName(const char **, CUkernel);

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
CGPU_HIDDEN int cgpu_stream_capturing(CUstream s); /* capturing into a graph */
/* The visible position (in ALIYUN_COM_GPU_VISIBLE_DEVICES) of CUDA device ordinal dev: the registered GPU with
 * the device's UUID; -1 when it is none of them. Learned once per device, after waiting for the registration up
 * to wait_ms (< 0: as the gates wait, for good unless CGPU_ON_DAEMON_LOSS=run). */
CGPU_HIDDEN int cgpu_device_pos(CUdevice dev, int wait_ms);
CGPU_HIDDEN CUdevice cgpu_current_device(void); /* -1 with no current context */
CGPU_HIDDEN int cgpu_current_pos(void);         /* cgpu_device_pos of the current context's device, as gates wait */

#endif
