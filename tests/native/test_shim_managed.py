"""A program under libcgpu.so is a managed client from its ``cuInit``: the daemon's containment (NVML's process list
against the clients of ``arbiter.sock``) must not take a shimmed program that created its context and has not
launched or allocated yet for one that goes around cgpu. The same program with the shim disabled is unmanaged."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from arbiterd.core.containment import START_GRACE_NS
from cgpu_testing.nvml import FakeNvml
from tests.native.conftest import Native, start_job

pytest.importorskip("pynvml")
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the fake NVML library")
MIB = 1 << 20
POLL_MS = 100


def _wait(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_shimmed_program_is_managed_from_cuinit_before_its_first_launch(native: Native, daemon_factory: Any,
                                                                          short_tmp: Path) -> None:
    """Under ``unmanaged = kill``: a shimmed program that sits with its context and no launch (a model loading from
    disk) outlives many polls and is never listed unmanaged; the same program with ``CGPU_DISABLE=true`` is killed
    within two polls."""
    nvml = FakeNvml(short_tmp / "nvml.ctl")
    d = daemon_factory.start("--nvml-poll-ms", str(POLL_MS), "--unmanaged", "kill", env=nvml.env())
    _wait(lambda: d.status()["uptime_seconds"] > START_GRACE_NS / 1e9)
    jobs: list[subprocess.Popen[str]] = []
    try:
        # linked to libcuda, dlopen + dlsym (the CUDA runtime's way), cuGetProcAddress; then the shim disabled
        for dl, resolve, disabled in ((False, "dlsym", "false"), (True, "dlsym", "false"), (True, "gpa", "false"),
                                      (False, "dlsym", "true")):
            job = start_job(native, d, "--resolve", resolve, "ready", "sleep=30000", dl=dl, CGPU_DISABLE=disabled)
            jobs.append(job)
            assert job.stdout is not None and job.stdout.readline().startswith("ready")
            nvml.run(job.pid, 300 * MIB)
        *managed, bypass = jobs
        _wait(lambda: bypass.poll() is not None, 5.0)  # killed: it went around cgpu
        time.sleep(10 * POLL_MS / 1000)
        unmanaged = [u["pid"] for u in d.status()["gpus"][0]["unmanaged_processes"]]
        for job in managed:
            assert job.poll() is None and job.pid not in unmanaged, d.read_log()[-2000:]
        assert f"pid {bypass.pid}" in d.read_log()
    finally:
        for job in jobs:
            job.kill()
            job.wait()
