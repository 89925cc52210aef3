"""The fake NVML as tests and benchmarks drive it: what each GPU runs, written to its control file.

``arbiterd`` started with :meth:`FakeNvml.env` (and no ``--sim-gpus``) loads the fake ``libnvidia-ml.so.1``
(cgpu_testing/native/fakenvml.c) through pynvml's own loader and runs its real NVML path: discovery, and the
poll of each GPU's processes and utilization that containment reads (arbiterd/server/watch.py).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cgpu_testing.native.build import build_fakes


def fakes_dir() -> Path:
    """The fake libcuda.so.1 and libnvidia-ml.so.1, built once (rebuilt when a source is newer)."""
    out = Path(os.environ.get("CGPU_NATIVE_BUILD", Path(tempfile.gettempdir()) / "cgpu-native-build")) / "fakes"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:  # parallel test workers: one builds, the others wait for it
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_fakes(out)


@dataclass
class Proc:
    gpu: int
    pid: int
    used: int  # bytes
    kind: str = "compute"  # or graphics
    sm: int | str = 0  # its utilization, %; "cpu": the CPU it used since NVML was last asked


@dataclass
class FakeNvml:
    """The control file of the fake NVML: the processes on each GPU, and each GPU's utilization."""

    path: Path
    gpus: int = 1
    mem_mb: int = 16384
    procs: list[Proc] = field(default_factory=list)
    util: dict[int, int] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """What arbiterd's environment needs to load the fake and read this file."""
        self.write()
        return {"LD_LIBRARY_PATH": str(fakes_dir()), "FAKENVML_CONTROL": str(self.path),
                "FAKECUDA_DEVICES": str(self.gpus), "FAKECUDA_MEM_MB": str(self.mem_mb)}

    def run(self, pid: int, used: int, gpu: int = 0, kind: str = "compute", sm: int | str = 0) -> None:
        """Process ``pid`` has a context on ``gpu`` using ``used`` bytes (replacing what was said of it there)."""
        self.procs = [p for p in self.procs if (p.gpu, p.pid) != (gpu, pid)] + [Proc(gpu, pid, used, kind, sm)]
        self.write()

    def gone(self, pid: int) -> None:
        self.procs = [p for p in self.procs if p.pid != pid]
        self.write()

    def write(self) -> None:
        lines = [f"proc {p.gpu} {p.pid} {p.used} {p.kind} {p.sm}\n" for p in self.procs]
        lines += [f"util {g} {pct}\n" for g, pct in sorted(self.util.items())]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(self.path)  # the fake reads it at every call: never half-written
