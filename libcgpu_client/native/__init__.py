"""libcgpu.so, the native interposer (C, loaded with ``LD_PRELOAD``).

``pip install`` builds it next to this file (see ``setup.py``). :func:`shim_path`
finds it; :func:`shim_loaded` tells whether this process runs with it preloaded.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM_NAME = "libcgpu.so"


def shim_path() -> Path | None:
    """The built libcgpu.so, or None when this checkout was not built (``pip install -e .``)."""
    path = HERE / SHIM_NAME
    return path if path.is_file() else None


def shim_loaded() -> bool:
    """True when libcgpu.so is loaded in this process (its ``cgpu_shim_version`` symbol is visible)."""
    try:
        ctypes.c_char.in_dll(ctypes.CDLL(None), "cgpu_shim_version")
    except (OSError, ValueError):
        return False
    return True
