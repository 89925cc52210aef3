"""Builds the shim, the fake CUDA driver and NVML (cgpu_testing/native), and the C test programs once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from cgpu_testing.native import build as fakes_build
from libcgpu_client.native import HERE
from libcgpu_client.native import build as nb

PROGS = Path(__file__).parent / "progs"
WORKLOADS = Path(__file__).parent.parent / "workloads"


@dataclass(frozen=True)
class Native:
    shim: Path
    fakes: Path  # the fake libcuda.so.1 and libnvidia-ml.so.1
    job_direct: Path  # cuda_job linked against libcuda.so.1
    job_dl: Path  # cuda_job that dlopen()s it
    codec: Path
    asan: bool = False

    def env(self, d: DaemonProc | None, **extra: str) -> dict[str, str]:
        """Environment for a program under the shim (LD_PRELOAD) against daemon ``d``."""
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.fakes), "CGPU_IDLE_MS": "3"}
        env["LD_PRELOAD"] = (f"{nb.asan_runtime()} {self.shim}" if self.asan else str(self.shim))
        if self.asan:
            env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=86"
            env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
        if d is not None:
            env["CGPU_SOCKET"] = d.sock
        env.update(extra)
        return env


def _shim() -> Path:
    """The pip-built libcgpu.so when it is newer than every source; else a fresh build."""
    return nb.current_shim(Path(os.environ.get("CGPU_NATIVE_BUILD", "/tmp/cgpu-native-build")) / "shim")


def _build(out: Path, asan: bool) -> Native:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the C parts")
    fakes = fakes_build.build_fakes(out / "fakes", asan=asan)
    shim_srcs = [HERE / "mp.c", HERE / "env.c"]
    return Native(
        shim=nb.build_shim(out, asan=True) if asan else _shim(),
        fakes=fakes,
        job_direct=fakes_build.build_job(out / "cuda_job_direct", asan=asan, link_cuda=fakes, defines=("DIRECT",)),
        job_dl=fakes_build.build_job(out / "cuda_job_dl", asan=asan),
        codec=nb.build_program([PROGS / "codec_check.c", *shim_srcs], out / "codec_check", asan=asan),
        asan=asan,
    )


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Native:
    return _build(tmp_path_factory.mktemp("native"), asan=False)


@pytest.fixture(scope="session")
def native_asan(tmp_path_factory: pytest.TempPathFactory) -> Native:
    return _build(tmp_path_factory.mktemp("native-asan"), asan=True)


def run_job(n: Native, d: DaemonProc | None, *args: str, dl: bool = False, timeout: float = 60,
            **env: str) -> subprocess.CompletedProcess[str]:
    exe = n.job_dl if dl else n.job_direct
    return subprocess.run([str(exe), *args], env=n.env(d, **env), capture_output=True, text=True, timeout=timeout)


def start_job(n: Native, d: DaemonProc | None, *args: str, dl: bool = False, **env: str) -> subprocess.Popen[str]:
    exe = n.job_dl if dl else n.job_direct
    return subprocess.Popen([str(exe), *args], env=n.env(d, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def fields(line: str) -> dict[str, str]:
    """``name k=v k=v`` -> {"name": name, k: v, ...}"""
    head, *rest = line.split()
    return {"name": head, **dict(kv.split("=", 1) for kv in rest)}


def lines(out: str, name: str) -> list[dict[str, str]]:
    return [fields(ln) for ln in out.splitlines() if ln.split()[:1] == [name]]


def at(seconds: float) -> int:
    """CLOCK_MONOTONIC ns ``seconds`` from now (the programs share the host's monotonic clock)."""
    return time.monotonic_ns() + int(seconds * 1e9)


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Each process's stderr once it has exited (killed after 20 s), in order."""
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        errs.append(err)
    return errs
