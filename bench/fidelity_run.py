"""The moving parts of bench.fidelity: a daemon at its defaults, and tenants it can start and pause.

:class:`TorchTenants` runs bench/fidelity_worker.py under ``cgpu-run --device cpu``;
:class:`NativeTenants` runs the C job program (cgpu_testing/native/cuda_job.c, ``serve`` mode) with
libcgpu.so preloaded, against the fake CUDA driver, or the real one where there is a GPU. Both answer
``run(names, seconds)`` (those tenants work, the others are paused) and, afterwards, ``ends(name)`` (when
each unit of work finished) and ``leases(name)`` (when each turn started).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

from bench.common import has_gpu
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT, tool

SPIN_BATCH = 4  # kernels queued at once by a native tenant
# ResNet-50's launch pattern as issue 49 measured it on an H100 (bench.fidelity --native --workloads resnet-pattern):
# an iteration is about 160 kernels summing to about 12 ms, queued at once, with a sync at its end
PATTERN_KERNELS = 160
PATTERN_KERNEL_MS = 0.075
# glibc malloc's thresholds fixed, so freed tensors stay in the heap: with its self-adjusting defaults a
# process may hand them back to the kernel and fault them in again every operation, and its speed jumps
STEADY_MALLOC = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=268435456"


class TenantLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def busy(self) -> bool: ...
    @property
    def highprio(self) -> bool: ...


class RowLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def tenants(self) -> tuple[TenantLike, ...]: ...


def start_daemon(tmp: Path, real_gpu: bool = False) -> DaemonProc:
    """arbiterd at its defaults (not started: ``with`` it), in a directory of its own, on a simulated GPU unless
    ``real_gpu``."""
    return DaemonProc(tmp, *([] if real_gpu else ["--sim-gpus", "1x16GiB"]), "--identity", "declared")


def calibrate(ms: float, threads: int) -> int:
    """The matmul size whose operation takes about ``ms`` here on ``threads`` intra-op threads."""
    import torch

    torch.set_num_threads(threads)
    size, a = 128, None
    for _ in range(12):
        a = torch.randn(size, size)
        for _ in range(5):
            torch.mm(a, a)
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 0.3:
            torch.mm(a, a)
            n += 1
        took = (time.perf_counter() - t) / n * 1e3
        if abs(took / ms - 1) < 0.1:
            break
        size = max(32, int(size * (ms / took) ** (1 / 3)))
    return size


def duty_control(size: int, threads: int, on_ms: float, blocks: int = 4) -> list[float]:
    """The machine's own loss from sleeping between turns, with no cgpu: one torch loop, in this process,
    alternates running on for 1.5 s with turns of ``on_ms`` three times as long apart (policy 0's turns with two
    tenants at max_inst 4); each block gives how much longer (%) an operation took in the turns, past their first
    10 ms (a quarter of a shorter turn), than in the run on before it. A tenant that waits out three slots of
    four loses that much of its share here, whatever the daemon does."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    for _ in range(20):
        torch.mm(a, a)

    def op_ns() -> int:
        t = time.perf_counter_ns()
        torch.mm(a, a)
        return time.perf_counter_ns() - t

    on_s, skip_s = on_ms / 1e3, min(0.01, on_ms / 4e3)
    out = []
    for _ in range(blocks):
        on, end = [], time.monotonic() + 1.5
        while time.monotonic() < end:
            on.append(op_ns())
        turns = []
        for _ in range(max(3, round(2.0 / (4 * on_s)))):
            time.sleep(3 * on_s)
            start = time.monotonic()
            while (spent := time.monotonic() - start) < on_s:
                took = op_ns()
                if spent > skip_s:
                    turns.append(took)
        if len(on) > 1 and turns:  # operations as long as a turn leave nothing to compare
            out.append(100 * (sum(turns) / len(turns)) / (sum(on[1:]) / len(on[1:])) - 100)
    return out


class _Tenants:
    """Processes that each serve one tenant through stdin commands (run, pause, dump, quit)."""

    def __init__(self, daemon: DaemonProc, row: RowLike) -> None:
        self.daemon, self.row = daemon, row
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.data: dict[str, dict[str, Any]] = {}
        self.prefix = f"{row.name}-{int(time.time() * 1000) % 100000}"

    def instance(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def command(self, t: TenantLike) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def __enter__(self) -> _Tenants:
        for t in self.row.tenants:
            cmd, env = self.command(t)
            self.procs[t.name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=subprocess.DEVNULL, text=True, env={**os.environ, **env})
        for name, proc in self.procs.items():
            line = self._line(proc)
            if not line.startswith("ready"):
                raise RuntimeError(f"tenant {name} did not start: {line!r}")
        return self

    @staticmethod
    def _line(proc: subprocess.Popen[str]) -> str:
        out: IO[str] | None = proc.stdout
        return out.readline() if out is not None else ""

    def _send(self, name: str, line: str) -> None:
        stdin = self.procs[name].stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    def run(self, names: list[str], seconds: float) -> tuple[int, int]:
        """Those tenants work for ``seconds`` (the others stay paused); returns the phase's (start, end)."""
        t0 = time.monotonic_ns()
        for name in names:
            self._send(name, "run")
        time.sleep(seconds)
        t1 = time.monotonic_ns()
        for name in names:
            self._send(name, "pause")
        time.sleep(0.2)  # let the last turn end and the leases go back
        self.data = {}  # what was fetched before is stale now: the next look fetches again
        return t0, t1

    def _collect(self) -> None:
        for name in self.procs:
            path = self.daemon.tmp / f"{self.instance(name)}.json"
            self._send(name, f"dump {path}")
            self._line(self.procs[name])
            self.data[name] = json.loads(path.read_text())

    def ends(self, name: str) -> list[int]:
        """When each unit of work of tenant ``name`` finished, so far (read after the phases)."""
        if not self.data:
            self._collect()
        return list(self.data[name]["ends"])

    def leases(self, name: str) -> list[tuple[int, int]]:
        if not self.data:
            self._collect()
        return [tuple(x) for x in self.data[name]["leases"]]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.data:
            self._collect()
        for name, proc in self.procs.items():
            self._send(name, "quit")
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            # the finished tenant's record goes, so that its weight is free for the next row
            self.daemon.ctl("echo", f"remove {self.instance(name)}", "inst_ctl")


class TorchTenants(_Tenants):
    def __init__(self, daemon: DaemonProc, row: RowLike, size: int, threads: int, sync: bool = False) -> None:
        super().__init__(daemon, row)
        self.size, self.threads, self.sync = size, threads, sync

    def command(self, t: TenantLike) -> tuple[list[str], dict[str, str]]:
        flags = ["--device", "cpu", "--socket", self.daemon.sock, "--instance", self.instance(t.name),
                 "--weight", str(t.weight), *(["--highprio"] if t.highprio else [])]
        return ([tool("cgpu-run"), *flags, "--", sys.executable, "-m", "bench.fidelity_worker", str(self.size),
                 str(self.threads), *(["sync"] if self.sync else [])],
                {"PYTHONPATH": str(ROOT), "GLIBC_TUNABLES": STEADY_MALLOC})


@dataclass(frozen=True)
class NativeTarget:
    job: Path  # cuda_job, resolving the driver with dlopen
    shim: Path
    fakes: Path | None  # the fake libcuda.so.1's directory; None on a real GPU
    real_gpu: bool

    @property
    def describe(self) -> str:
        return "a real NVIDIA GPU" if self.real_gpu else "the fake CUDA driver (kernels spin on the CPU)"


def native_target(tmp: Path) -> NativeTarget | None:
    from cgpu_testing.native.build import build_fakes, build_job
    from libcgpu_client.native import build as nb

    try:
        job = build_job(tmp / "cuda_job")
        real = has_gpu()
        fakes = None if real else build_fakes(tmp / "fakes")
        shim = nb.current_shim(tmp / "shim")
    except (nb.BuildError, FileNotFoundError):
        return None
    return NativeTarget(job, shim, fakes, real)


class NativeTenants(_Tenants):
    """``batch`` kernels of ``ms`` queued at once, then a stream sync, again and again (SPIN_BATCH; the ResNet-50
    pattern is PATTERN_KERNELS of PATTERN_KERNEL_MS)."""

    def __init__(self, where: NativeTarget, daemon: DaemonProc, row: RowLike, ms: float, tmp: Path,
                 batch: int = SPIN_BATCH) -> None:
        super().__init__(daemon, row)
        self.where, self.ms, self.kernel_ns, self.batch = where, ms, int(ms * 1e6), batch

    def command(self, t: TenantLike) -> tuple[list[str], dict[str, str]]:
        env = {"LD_PRELOAD": str(self.where.shim), "CGPU_NATIVE": "1", "CGPU_SOCKET": self.daemon.sock,
               "CGPU_INSTANCE": self.instance(t.name), "ALIYUN_COM_GPU_SCHD_WEIGHT": str(t.weight),
               "ALIYUN_COM_GPU_HIGH_PRIO": "1" if t.highprio else "0"}
        if self.where.fakes is not None:
            env["LD_LIBRARY_PATH"] = str(self.where.fakes)
        return [str(self.where.job), f"serve={self.ms},{self.batch}"], env

    def ends(self, name: str) -> list[int]:
        """A batch of kernels finished at each time: one end per kernel, spread over the batch."""
        out = []
        for t in super().ends(name):
            out += [t - k * self.kernel_ns for k in range(self.batch)]
        return sorted(out)

    def leases(self, name: str) -> list[tuple[int, int]]:
        """Turn starts, seen from the program: a batch that ended after a gap (another tenant's turn)."""
        ends = super().ends(name)
        # past two batches apart (another tenant's turn between); a long batch (the ResNet-50 pattern's 12 ms), past
        # one and a half: a turn of the other tenant is longer than half a batch
        gap = (2 if self.batch == SPIN_BATCH else 1.5) * self.batch * self.kernel_ns
        return [(b, b) for a, b in itertools.pairwise(ends) if b - a > gap]
