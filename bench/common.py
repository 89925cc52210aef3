"""Helpers shared by the benchmarks."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """Path of a console script installed beside this Python (arbiterd, cgpuctl, cgpu-run, ...)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def has_gpu() -> bool:
    """An NVIDIA driver that finds a device (libcuda, loaded as a CUDA program loads it)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
