"""Compile the native pieces with gcc for tests and benchmarks.

The product build of libcgpu.so is ``pip install`` (``setup.py``); this module
builds the same sources again when a test wants them with AddressSanitizer,
and C programs against the shim's headers (``cuda_min.h``, ``mp.h``). The fake
CUDA driver and NVML are not the product: ``cgpu_testing/native`` holds them
and builds them with :func:`gcc` and :func:`flags`. Everything is compiled with
warnings as errors.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from libcgpu_client.native import HERE, shim_path

SHIM_SOURCES = ("mp.c", "env.c", "log.c", "conn.c", "board.c", "gates.c", "resolve.c", "launch.c", "memory.c",
                "pools.c", "context.c", "capture.c", "preload.c", "graphmem.c", "graphcoll.c")
WARNINGS = ["-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Werror"]
ASAN = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


class BuildError(RuntimeError):
    """gcc failed; the message carries its output."""


def flags(asan: bool) -> list[str]:
    return ["-std=c11", "-g", "-O1" if asan else "-O2", *WARNINGS, *(ASAN if asan else [])]


def gcc(args: list[str], out: Path, inputs: list[Path]) -> Path:
    """Run gcc unless ``out`` is newer than every input (and the command is unchanged)."""
    stamp = out.with_name(out.name + ".cmd")
    cmd = ["gcc", *args, "-o", str(out)]
    key = hashlib.sha256(" ".join(cmd).encode()).hexdigest()
    fresh = out.exists() and stamp.exists() and stamp.read_text() == key and all(
        out.stat().st_mtime >= p.stat().st_mtime for p in inputs)
    if fresh:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"gcc failed for {out.name}:\n{res.stderr}")
    stamp.write_text(key)
    return out


def headers() -> list[Path]:
    return sorted(HERE.glob("*.h"))


def build_shim(out_dir: Path, asan: bool = False) -> Path:
    srcs = [HERE / s for s in SHIM_SOURCES]
    out = out_dir / ("libcgpu-asan.so" if asan else "libcgpu.so")
    args = [*flags(asan), "-fPIC", "-shared", "-fvisibility=hidden", *map(str, srcs), "-ldl", "-lpthread"]
    return gcc(args, out, srcs + headers())


def build_program(srcs: list[Path], out: Path, *, asan: bool = False, link_cuda: Path | None = None,
                  defines: tuple[str, ...] = ()) -> Path:
    """A C program from ``srcs``; ``link_cuda`` = a directory with a libcuda.so.1 (the fakes'), to link it directly."""
    inputs = [*srcs, *headers()]
    args = [*flags(asan), f"-I{HERE}", *(f"-D{d}" for d in defines), *map(str, srcs)]
    if link_cuda is not None:
        args += [str(link_cuda / "libcuda.so.1"), f"-Wl,-rpath-link,{link_cuda}"]
        inputs.append(link_cuda / "libcuda.so.1")
    args += ["-ldl", "-lpthread"]
    return gcc(args, out, inputs)


def asan_runtime() -> str:
    """The path of gcc's libasan, which must come first in LD_PRELOAD for an ASan-built shim."""
    return subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=True).stdout.strip()


def current_shim(out_dir: Path) -> Path:
    """The pip-built libcgpu.so where it is newer than every source, else one built into ``out_dir`` from them: a
    benchmark or test run after an edit of the shim must not load the one built before it."""
    built = shim_path()
    srcs = [HERE / s for s in SHIM_SOURCES] + headers()
    if built is not None and all(built.stat().st_mtime >= p.stat().st_mtime for p in srcs):
        return built
    return build_shim(out_dir)
