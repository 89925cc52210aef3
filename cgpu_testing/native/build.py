"""Builds the test doubles of the driver and the job program that tests and benchmarks run.

``fakecuda.c`` and ``fakenvml.c`` (README.md says what they model) become a ``libcuda.so.1`` and a
``libnvidia-ml.so.1`` that run on the CPU; ``cuda_job.c`` is the CUDA program the native tests and the
benchmarks drive. All of them include the shim's ``cuda_min.h`` and are compiled as the shim is, by
:mod:`libcgpu_client.native.build`, with warnings as errors.
"""

from __future__ import annotations

from pathlib import Path

from libcgpu_client.native import HERE as SHIM_DIR
from libcgpu_client.native import build as nb

HERE = Path(__file__).resolve().parent
JOB = HERE / "cuda_job.c"  # the CUDA job program (its modes: the comment at its top)
# each library's sources (the collective kernel, fakecoll.c, is linked into the fake driver)
FAKES = ((("fakecuda.c", "fakecoll.c"), "libcuda.so.1"), (("fakenvml.c",), "libnvidia-ml.so.1"))


def build_fakes(out_dir: Path, asan: bool = False) -> Path:
    """The fake libcuda.so.1 and libnvidia-ml.so.1, in ``out_dir`` (put it on LD_LIBRARY_PATH)."""
    for srcs, soname in FAKES:
        paths = [HERE / src for src in srcs]
        args = [*nb.flags(asan), f"-I{SHIM_DIR}", f"-I{HERE}", "-fPIC", "-shared", "-fvisibility=hidden",
                "-Wl,-Bsymbolic", f"-Wl,-soname,{soname}", *map(str, paths), "-lpthread", "-lrt"]
        nb.gcc(args, out_dir / soname, [*paths, HERE / "fakecoll.h", *nb.headers()])
    return out_dir


def build_job(out: Path, *, asan: bool = False, link_cuda: Path | None = None,
              defines: tuple[str, ...] = ()) -> Path:
    """The CUDA job program at ``out``: it resolves libcuda.so.1 with dlopen, or links the fakes in ``link_cuda``."""
    return nb.build_program([JOB], out, asan=asan, link_cuda=link_cuda, defines=defines)
