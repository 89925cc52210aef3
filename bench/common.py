"""Helpers shared by the benchmarks."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """Path of a console script installed beside this Python (arbiterd, cgpuctl, cgpu-run, ...)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name
