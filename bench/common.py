"""Helpers the benchmarks share (the harness they share with the tests is ``cgpu_testing``)."""

from __future__ import annotations

import ctypes


def has_gpu() -> bool:
    """An NVIDIA driver that finds a device (libcuda, loaded as a CUDA program loads it)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def percentile(values: list[float], q: float) -> float:
    """The value below which a fraction ``q`` of ``values`` lie (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
