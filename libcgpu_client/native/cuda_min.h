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
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;

/* CUresult values (cuda.h) that the shim returns or tests, and the fake driver gives */
enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_DEVICE_UNAVAILABLE = 46, CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, CUDA_ERROR_UNKNOWN = 999,
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
    int type;                 /* CUmemLocationType: 1 = device */
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
