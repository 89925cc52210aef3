"""A Python program that drives the CUDA driver API through ctypes (no framework).

    python ctypes_cuda.py dlsym|gpa KERNEL_MS COUNT ALLOC_BYTES

It loads libcuda.so.1 with ctypes (dlopen + dlsym), or resolves every entry
point through cuGetProcAddress_v2 (``gpa``), runs COUNT kernels of KERNEL_MS
(the fake driver's ``cgpu_spin``), tries one allocation of ALLOC_BYTES, and
asks NVML for the memory total. It prints one line:
``kernels=N alloc_rc=R cuda_total=T nvml_total=T``.
"""

from __future__ import annotations

import ctypes
import sys

mode, kernel_ms, count, alloc_bytes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cuda = ctypes.CDLL("libcuda.so.1")
CUresult = ctypes.c_int


def fn(name: str, *argtypes: object) -> ctypes._CFuncPtr:
    proto = ctypes.CFUNCTYPE(CUresult, *argtypes)
    if mode == "dlsym":
        return proto((name, cuda))
    gpa = cuda.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.c_void_p]
    ptr = ctypes.c_void_p()
    base = name[:-3] if name.endswith("_v2") else name
    rc = gpa(base.encode(), ctypes.byref(ptr), 12040, 0, None)
    if rc != 0:
        raise SystemExit(f"cuGetProcAddress({base}) failed: {rc}")
    return proto(ptr.value)


P = ctypes.c_void_p
cuInit = fn("cuInit", ctypes.c_uint)
cuDeviceGet = fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)
cuRetain = fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(P), ctypes.c_int)
cuSetCurrent = fn("cuCtxSetCurrent", P)
cuModuleLoadData = fn("cuModuleLoadData", ctypes.POINTER(P), ctypes.c_char_p)
cuModuleGetFunction = fn("cuModuleGetFunction", ctypes.POINTER(P), P, ctypes.c_char_p)
cuLaunchKernel = fn("cuLaunchKernel", P, *([ctypes.c_uint] * 7), P, ctypes.POINTER(P), ctypes.POINTER(P))
cuCtxSynchronize = fn("cuCtxSynchronize")
cuMemAlloc = fn("cuMemAlloc_v2", ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
cuDeviceTotalMem = fn("cuDeviceTotalMem_v2", ctypes.POINTER(ctypes.c_size_t), ctypes.c_int)


def ok(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} failed: {rc}")


dev, ctx, mod, func = ctypes.c_int(), P(), P(), P()
ok(cuInit(0), "cuInit")
ok(cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuSetCurrent(ctx), "cuCtxSetCurrent")
ok(cuModuleLoadData(ctypes.byref(mod), b"fake"), "cuModuleLoadData")
ok(cuModuleGetFunction(ctypes.byref(func), mod, b"cgpu_spin"), "cuModuleGetFunction")
ns = ctypes.c_uint64(int(kernel_ms * 1e6))
params = (P * 1)(ctypes.cast(ctypes.byref(ns), P))
for _ in range(count):
    ok(cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")
    ok(cuCtxSynchronize(), "cuCtxSynchronize")
ptr = ctypes.c_uint64()
alloc_rc = cuMemAlloc(ctypes.byref(ptr), alloc_bytes)
total = ctypes.c_size_t()
ok(cuDeviceTotalMem(ctypes.byref(total), dev), "cuDeviceTotalMem")


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


nvml = ctypes.CDLL("libnvidia-ml.so.1")
handle, mem = P(), NvmlMemory()
ok(nvml.nvmlInit_v2(), "nvmlInit_v2")
ok(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
ok(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
print(f"kernels={count} alloc_rc={alloc_rc} cuda_total={total.value} nvml_total={mem.total}", flush=True)
