"""The shim against NVIDIA's own headers and tools, without a GPU (libcgpu_client/native/conformance.py).

The headers come from NVIDIA's PyPI wheels (nvidia-cuda-runtime: cuda.h, cudaTypedefs.h; nvidia-nvml-dev:
nvml.h), ptxas from nvidia-cuda-nvcc; the test extra installs them. Where they are missing, each test says so in
one line and skips.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cgpu_testing.native.build import JOB
from libcgpu_client.native import HERE
from libcgpu_client.native import build as nb
from libcgpu_client.native import conformance as cf
from tests.native.conftest import PROGS, Native

INCLUDE = cf.nvidia_include()
PTXAS = cf.ptxas()
needs_headers = pytest.mark.skipif(INCLUDE is None or shutil.which("gcc") is None,
                                   reason="NVIDIA's headers (pip install nvidia-cuda-runtime nvidia-nvml-dev) "
                                          "or gcc are not installed")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas (pip install nvidia-cuda-nvcc) is not installed")
DEFAULT, LEGACY, PER_THREAD = 0, 1, 2  # CU_GET_PROC_ADDRESS_* flags


@needs_headers
def test_the_shim_builds_against_nvidias_headers_and_every_hook_has_its_pfn_type(tmp_path: Path) -> None:
    assert INCLUDE is not None
    pairs, lonely = cf.checks(cf.hooks(), cf.pfns((INCLUDE / "cudaTypedefs.h").read_text()))
    assert lonely == []  # every CUDA hook serves some version the header knows
    assert {h.name for h, _ in pairs} == {h.name for h in cf.hooks() if h.lib == "LIB_CUDA"}
    assert cf.build(tmp_path, INCLUDE).exists()


@needs_headers
@pytest.mark.parametrize(("file", "old", "new", "says"), [
    # a hook's type that the header's PFN_ typedef does not have
    ("hooks.h", "typedef CUresult(mem_alloc_t)(CUdeviceptr *, size_t);",
     "typedef CUresult(mem_alloc_t)(CUdeviceptr *, unsigned int);", "cuMemAlloc_v2"),
    # a per-thread-stream variant with the wrong stream type
    ("hooks.h", "typedef CUresult(graph_launch_t)(CUgraphExec, CUstream);",
     "typedef CUresult(graph_launch_t)(CUgraphExec, void *);", "cuGraphLaunch"),
    # an NVML hook defined against a structure nvml.h does not pass it
    ("memory.c", "nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {",
     "nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_v2_t *m) {", "nvmlDeviceGetMemoryInfo"),
])
def test_a_planted_prototype_mismatch_fails_the_build(tmp_path: Path, file: str, old: str, new: str,
                                                      says: str) -> None:
    assert INCLUDE is not None
    src = tmp_path / "src"
    shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    text = (src / file).read_text()
    assert old in text, f"{file} changed: update this test's plant"
    (src / file).write_text(text.replace(old, new))
    with pytest.raises(nb.BuildError, match=says):
        cf.build(tmp_path / "out", INCLUDE, sources=src)


def table() -> list[tuple[str, int, int, str]]:
    """(name, version, flags, the hook libcgpu.so must hand out) for every PFN_ typedef of cudaTypedefs.h that
    maps to a hooked entry point: flags 0 and 1 for a plain one, 2 for a per-thread-stream one (and 2 for a plain
    one that has no per-thread variant, where the driver hands out the plain entry point)."""
    assert INCLUDE is not None
    hook_list, pfn_list = cf.hooks(), cf.pfns((INCLUDE / "cudaTypedefs.h").read_text())
    has_ptsz = {p.base for p in pfn_list if p.ptsz}
    rows = []
    for h, p in cf.checks(hook_list, pfn_list)[0]:
        flag_set = [PER_THREAD] if p.ptsz else [DEFAULT, LEGACY] + ([] if p.base in has_ptsz else [PER_THREAD])
        rows += [(p.base, p.version, f, h.name) for f in flag_set]
    return rows


@needs_headers
def test_get_proc_address_hands_out_a_hook_for_every_version_and_flag_the_header_maps_to_one(
        native: Native, tmp_path: Path) -> None:
    """Both cuGetProcAddress and _v2, reached through dlopen and dlsym as applications reach them."""
    prog = nb.build_program([PROGS / "gpa_table.c"], tmp_path / "gpa_table")
    rows = table()
    assert len(rows) >= 40
    stdin = "".join(f"{name} {version} {flags}\n" for name, version, flags, _ in rows)
    res = subprocess.run([str(prog)], input=stdin, env=native.env(None), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = [line.split() for line in res.stdout.splitlines()]
    assert len(got) == len(rows)
    shim = native.shim.name
    wrong = [(name, version, flags, line[3:]) for (name, version, flags, hook), line in zip(rows, got, strict=True)
             if line[3:] != [f"v1={shim}:{hook}", f"v2={shim}:{hook}"]]
    assert wrong == []


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_ptx_the_job_program_loads_assembles(tmp_path: Path, arch: str) -> None:
    assert PTXAS is not None
    ptx = tmp_path / "spin.ptx"
    ptx.write_text(cf.ptx_of(JOB))
    res = subprocess.run([str(PTXAS), f"-arch={arch}", str(ptx), "-o", str(tmp_path / "spin.cubin")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


@needs_ptxas
def test_a_ptx_typo_fails_to_assemble(tmp_path: Path) -> None:
    assert PTXAS is not None
    ptx = tmp_path / "typo.ptx"
    ptx.write_text(cf.ptx_of(JOB).replace("setp.lt.u64", "setp.lt.u46"))
    res = subprocess.run([str(PTXAS), "-arch=sm_80", str(ptx), "-o", str(tmp_path / "typo.cubin")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "u46" in res.stderr


def test_the_daemon_finds_gpus_through_the_real_pynvml_on_the_fake_nvml_library(native: Native) -> None:
    """nvidia-ml-py loads libnvidia-ml.so.1 as it loads NVIDIA's; here the fake one answers, and the daemon's
    discovery reads two GPUs through it. A call the fake library lacks fails this test."""
    import json
    import os
    import sys

    pytest.importorskip("pynvml")
    code = ("import json; from arbiterd.server import devices; "
            "print(json.dumps([[g.index, g.name, g.uuid, g.total_mem, g.simulated] for g in devices.discover(None)]))")
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "FAKECUDA_DEVICES": "2", "FAKECUDA_MEM_MB": "8192"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [[i, f"cgpu fake GPU {i}", f"GPU-fa4e0000-0000-0000-0000-{i:012d}", 8 << 30,
                                       False] for i in range(2)]
