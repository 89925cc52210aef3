"""bench.gpu's ``containment`` part: a CUDA program that goes around the shim, seen and stopped by arbiterd on NVML.

The CUDA job program runs without ``LD_PRELOAD`` (no shim, no client of cgpu): NVML lists it once it has its
context, and arbiterd, at its defaults, must list it as unmanaged (its instance ``uid-<uid>``, its memory); under
``unmanaged = kill`` it must die within two polls; and an instance provisioned with ``memsize`` 256 MiB whose
bypassing program holds 1 GiB must lose it under ``memory_enforce = kill`` (``memory_grace_ms``, then a poll).
With ``--fake`` the fake NVML lists the program, as its control file says (cgpu_testing/nvml.py): the driver's
own list is what a real GPU proves. The settings it changes are put back.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiterd.core.containment import START_GRACE_NS
from arbiterd.server.config import Config
from cgpu_testing.nvml import FakeNvml

MIB = 1 << 20


def _wait(cond: Callable[[], Any], timeout: float) -> tuple[float, Any]:
    t0 = time.monotonic()
    while not (got := cond()):
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"not within {timeout:g} s")
        time.sleep(0.01)
    return time.monotonic() - t0, got


def run(proof: Any, figures: dict[str, Any]) -> None:
    """The part, on ``proof`` (a bench.gpu Proof with its daemon started); fills ``figures``."""
    fake = FakeNvml(Path(proof.env["FAKENVML_CONTROL"])) if proof.fake else None
    env = {k: v for k, v in {**os.environ, **proof.env}.items() if k != "LD_PRELOAD"}
    poll_s = Config().nvml_poll_ms / 1000
    jobs: list[subprocess.Popen[bytes]] = []

    def start(*actions: str, used: int) -> subprocess.Popen[bytes]:
        job = subprocess.Popen([str(proof.job), *actions], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        jobs.append(job)
        if fake is not None:
            fake.run(job.pid, used)
        return job

    def row(pid: int) -> dict[str, Any] | None:
        return next((u for u in proof.status()["gpus"][0]["unmanaged_processes"] if u["pid"] == pid), None)

    while proof.status()["uptime_seconds"] <= START_GRACE_NS / 1e9:  # a daemon's first seconds: it acts on nothing
        time.sleep(0.1)
    try:
        job = start("alloc=256M", "sleep=30000", used=300 * MIB)
        took, seen = _wait(lambda: row(job.pid), 15)
        figures.update(seen_s=round(took, 3), instance=seen["instance"], mem_mib=seen["mem_used"] // MIB)
        proof.ctl("echo", "kill", "0/unmanaged")
        took, _ = _wait(lambda: job.poll() is not None, 10)
        figures["kill_s"] = round(took, 3)
        if took > 2 * poll_s + 0.5:
            raise RuntimeError(f"the bypassing program died {took:.2f} s after unmanaged = kill, past two polls")
        proof.ctl("echo", "allow", "0/unmanaged")
        if "identity" in proof.info:  # declared: a host process is pid-<pid>, no instance to provision ahead
            figures["memory"] = "skipped: identity declared"
            return
        proof.provision(f"uid-{proof.uid}", memsize="256MiB")
        proof.ctl("echo", "kill", "0/memory_enforce")
        job = start("alloc=1G", "sleep=30000", used=1200 * MIB)
        took, _ = _wait(lambda: job.poll() is not None, 15)
        figures["memory_kill_s"] = round(took, 3)
    finally:
        for job in jobs:
            job.kill()
            job.wait()
            if fake is not None:
                fake.gone(job.pid)
        for value, path in (("report", "0/unmanaged"), ("report", "0/memory_enforce")):
            proof.ctl("echo", value, path)
