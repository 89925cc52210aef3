"""The shim checked against NVIDIA's own headers and tools, without a GPU.

The shim builds against ``cuda_min.h``, declarations we wrote, so that it needs
no CUDA toolkit. Here it is built again against the real ones, from NVIDIA's
wheels on PyPI: ``cuda.h`` and ``cudaTypedefs.h`` (``nvidia-cuda-runtime``),
``nvml.h`` (``nvidia-nvml-dev``), and ``ptxas`` (``nvidia-cuda-nvcc``):

* every hook is compiled against the driver's own prototype (``cuda.h`` with
  ``__CUDA_API_VERSION_INTERNAL``, as the driver itself is built, so every
  versioned entry point is declared under its own name; ``nvml.h``), and a
  generated file asserts that each hook has the type of every ``PFN_`` typedef
  that ``cudaTypedefs.h`` gives its base name in the versions it serves: a
  mismatch fails the build;
* :func:`proc_address_table` derives from ``cudaTypedefs.h`` every (name,
  version, flags) that ``cuGetProcAddress`` must answer with a hook, and which;
* :func:`ptx_of` takes the PTX that the native job program loads, for ``ptxas``.

Nothing here is in the product: tests/native/test_conformance.py and CI use it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from libcgpu_client.native import HERE
from libcgpu_client.native import build as nb

# X(name, "base", lo, hi, ptsz, lib) in hooks.h
_HOOK = re.compile(r'X\((\w+), "(\w*)", (\d+), ([^,]+), ([01]), (LIB_\w+)\)')
# typedef CUresult (CUDAAPI *PFN_<base>_v<version>[_ptsz|_ptds])(...)
_PFN = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+?)_v(\d+)(_ptsz|_ptds)?\s*\)")
DEFINES = ("CGPU_REAL_CUDA_H", "__CUDA_API_VERSION_INTERNAL")


@dataclass(frozen=True)
class Hook:
    name: str  # the symbol libcgpu.so exports
    base: str  # the name cuGetProcAddress is asked for ("" for NVML)
    lo: int  # the driver versions it serves: [lo, hi)
    hi: int
    ptsz: bool  # the per-thread default stream variant
    lib: str  # LIB_CUDA or LIB_NVML


@dataclass(frozen=True)
class Pfn:
    base: str
    version: int
    ptsz: bool

    @property
    def typedef(self) -> str:
        return f"PFN_{self.base}_v{self.version}{'_ptsz' if self.ptsz else ''}"


def hooks(text: str | None = None) -> list[Hook]:
    """The hooks of ``hooks.h`` (its HOOKS table, as the shim itself reads it)."""
    text = text if text is not None else (HERE / "hooks.h").read_text()
    table = text[text.index("#define HOOKS(X)"):text.index("#define HELPERS(X)")]
    out = []
    for name, base, lo, hi, ptsz, lib in _HOOK.findall(table):
        top = 1 << 30 if hi.replace(" ", "") == "1<<30" else int(hi)
        out.append(Hook(name, base, int(lo), top, ptsz == "1", lib))
    return out


def pfns(typedefs_text: str) -> list[Pfn]:
    """Every ``PFN_`` typedef of ``cudaTypedefs.h`` (the per-thread-stream ones, ``_ptsz``/``_ptds``, as ptsz)."""
    return [Pfn(base, int(v), bool(suffix)) for base, v, suffix in _PFN.findall(typedefs_text)]


def served(hook: Hook, pfn: Pfn) -> bool:
    """Whether ``hook`` is what ``cuGetProcAddress(pfn.base, pfn.version, ...)`` must hand out."""
    return hook.base == pfn.base and hook.lo <= pfn.version < hook.hi and hook.ptsz == pfn.ptsz


def checks(hook_list: list[Hook], pfn_list: list[Pfn]) -> tuple[list[tuple[Hook, Pfn]], list[Hook]]:
    """(each CUDA hook with each PFN typedef it serves, the CUDA hooks that serve none)."""
    pairs = [(h, p) for h in hook_list if h.lib == "LIB_CUDA" for p in pfn_list if served(h, p)]
    lonely = [h for h in hook_list if h.lib == "LIB_CUDA" and not any(h is x for x, _ in pairs)]
    return pairs, lonely


def check_source(pairs: list[tuple[Hook, Pfn]]) -> str:
    """A C file asserting that each hook has the type of each PFN typedef it serves."""
    lines = ['#define _GNU_SOURCE', '#include "hooks.h"', ""]
    for h, p in pairs:
        lines.append(f'_Static_assert(__builtin_types_compatible_p(__typeof__(&{h.name}), {p.typedef}), '
                     f'"{h.name} does not have the type of {p.typedef} (cudaTypedefs.h)");')
    return "\n".join(lines) + "\n"


def nvidia_include() -> Path | None:
    """The directory with NVIDIA's cuda.h, cudaTypedefs.h and nvml.h (from their PyPI wheels), if installed."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in map(Path, getattr(nvidia, "__path__", [])):
        for inc in sorted(root.glob("cu*/include"), reverse=True):
            if all((inc / h).exists() for h in ("cuda.h", "cudaTypedefs.h", "nvml.h")):
                return inc
    return None


def ptxas() -> Path | None:
    """NVIDIA's PTX assembler: on PATH, or from the nvidia-cuda-nvcc wheel."""
    found = shutil.which("ptxas")
    if found:
        return Path(found)
    try:
        import nvidia
    except ImportError:
        return None
    for root in map(Path, getattr(nvidia, "__path__", [])):
        for exe in sorted(root.glob("cu*/bin/ptxas"), reverse=True):
            return exe
    return None


def build(out_dir: Path, include: Path, sources: Path = HERE) -> Path:
    """libcgpu.so built from ``sources`` against the headers in ``include``, with the PFN assertions; raises
    :class:`~libcgpu_client.native.build.BuildError` (gcc's message) on any mismatch."""
    text = (include / "cudaTypedefs.h").read_text()
    pairs, lonely = checks(hooks((sources / "hooks.h").read_text()), pfns(text))
    if lonely:
        names = ", ".join(h.name for h in lonely)
        raise nb.BuildError(f"cudaTypedefs.h has no PFN_ typedef for the versions these hooks serve: {names}")
    out_dir.mkdir(parents=True, exist_ok=True)
    check = out_dir / "conformance_check.c"
    check.write_text(check_source(pairs))
    srcs = [sources / s for s in nb.SHIM_SOURCES] + [check]
    args = ["-std=c11", "-O1", *nb.WARNINGS, *(f"-D{d}" for d in DEFINES), f"-I{sources}", f"-I{include}",
            "-fPIC", "-shared", "-fvisibility=hidden", *map(str, srcs), "-ldl", "-lpthread"]
    out = out_dir / "libcgpu-conformance.so"
    res = subprocess.run(["gcc", *args, "-o", str(out)], capture_output=True, text=True)
    if res.returncode != 0:
        raise nb.BuildError(f"libcgpu.so does not build against NVIDIA's headers:\n{res.stderr}")
    return out


def ptx_of(program: Path) -> str:
    """The PTX a C program carries in a ``static const char ..._PTX[] = "..." ...;`` string."""
    m = re.search(r"static const char \w+_PTX\[\] =\s*\n(.*?);\n", program.read_text(), re.S)
    if m is None:
        raise ValueError(f"{program}: no PTX string")
    return "".join(_c_string(s) for s in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))


def _c_string(body: str) -> str:
    return body.encode().decode("unicode_escape")
