/* The slice of the CUDA driver and NVML ABIs that libcgpu.so and the test fakes use.
 *
 * Declared here, from the public driver API reference, so that the shim builds without
 * the CUDA toolkit. Only types and values; every layout matches cuda.h / nvml.h of
 * CUDA 12 on 64-bit Linux. */
#ifndef CGPU_CUDA_MIN_H
#define CGPU_CUDA_MIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef CGPU_REAL_CUDA_H
/* The conformance build (libcgpu_client/native/conformance.py): NVIDIA's own cuda.h and cudaTypedefs.h instead of
 * the declarations below, so that every hook is compiled against the real prototype. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <nvml.h>
#else

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData; /* only pointed to here */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;

/* CUresult values (cuda.h) that the shim returns or tests, and the fake driver gives */
enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_DEVICE_UNAVAILABLE = 46, CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600, CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_UNKNOWN = 999,
};

/* cuGetProcAddress flags and results */
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0, CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
typedef enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
               CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 } CUdriverProcAddressQueryResult;

enum { CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16 };
typedef enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
               CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 } CUstreamCaptureStatus;
typedef enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
               CU_STREAM_CAPTURE_MODE_RELAXED = 2 } CUstreamCaptureMode;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct {
    int type;                 /* CUmemLocationType: CU_MEM_LOCATION_TYPE_* */
    int id;                   /* device ordinal */
} CUmemLocation;
typedef struct {
    int type;                 /* CUmemAllocationType: 1 = pinned */
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
             unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

/* Memory that is not cuMemAlloc's: stream-ordered pools, managed memory, arrays (cuda.h, CUDA 12) */
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUexecAffinityParam_st CUexecAffinityParam; /* cuCtxCreate_v3's; only passed through */
typedef struct CUctxCreateParams_st CUctxCreateParams;     /* cuCtxCreate_v4's; only passed through */
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef int CUarray_format;
typedef int CUmemPool_attribute;
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_LOCATION_TYPE_HOST = 2, CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
       CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4 };
enum { CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
       CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
       CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
       CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7, CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8 };
enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };
enum { CU_AD_FORMAT_UNSIGNED_INT8 = 0x01, CU_AD_FORMAT_UNSIGNED_INT16 = 0x02, CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
       CU_AD_FORMAT_SIGNED_INT8 = 0x08, CU_AD_FORMAT_SIGNED_INT16 = 0x09, CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
       CU_AD_FORMAT_HALF = 0x10, CU_AD_FORMAT_FLOAT = 0x20 };
typedef struct {
    size_t Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
    int allocType;            /* CUmemAllocationType: 1 = pinned */
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Graph memory nodes and IPC pools (cuda.h, CUDA 12): the graph memory pool's attributes, an allocation node's
 * parameters, cuGraphInstantiateWithParams' parameters, pool export data and shareable handle types. */
typedef int CUgraphMem_attribute;
enum { CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
       CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3 };
enum { CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2 };
typedef struct CUmemAccessDesc_st CUmemAccessDesc; /* only pointed to here */
typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;         /* out: the allocation's address */
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;           /* CUgraphInstantiateResult */
} CUDA_GRAPH_INSTANTIATE_PARAMS;
/* cuGraphExecUpdate's result (cuda.h: CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo of CUDA 12) */
typedef enum { CU_GRAPH_EXEC_UPDATE_SUCCESS = 0, CU_GRAPH_EXEC_UPDATE_ERROR = 1,
               CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2, CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3,
               CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 4, CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 5,
               CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 6, CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 7,
               CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 8 } CUgraphExecUpdateResult;
typedef struct {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;
typedef int CUmemAllocationHandleType;
enum { CU_MEM_HANDLE_TYPE_NONE = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 };
typedef struct { unsigned char reserved[64]; } CUmemPoolPtrExportData;

/* NVML */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
       NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
       NVML_ERROR_UNKNOWN = 999 };
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

#endif /* CGPU_REAL_CUDA_H */

#endif
