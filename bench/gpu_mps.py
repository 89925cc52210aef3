"""NVIDIA MPS for bench.gpu's comparison rows: a control daemon of the proof's own, started and stopped in private
pipe and log directories, and the environment its clients need.

``nvidia-cuda-mps-control -d`` starts the control daemon (it daemonizes, and writes its pid to
``nvidia-cuda-mps-control.pid`` in ``CUDA_MPS_PIPE_DIRECTORY``); a CUDA program whose environment names the same
pipe directory connects to it when it initializes CUDA, and the daemon starts an MPS server for it. A program
that cannot connect runs without MPS, silently (the MPS documentation, "nvidia-cuda-mps-control"), so
:meth:`Mps.start` proves the daemon with a probe that must show up in ``get_server_list``. Each client's
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of the GPU's threads its contexts may use. ``echo quit |
nvidia-cuda-mps-control`` stops the daemon and its server.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

DRIVER_BIN = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")


def control_binary() -> str | None:
    """Where ``nvidia-cuda-mps-control`` is: on PATH, or where drivers put it."""
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return found
    for d in DRIVER_BIN:
        path = Path(d) / "nvidia-cuda-mps-control"
        if os.access(path, os.X_OK):
            return str(path)
    return None


class MpsUnavailable(Exception):
    """MPS cannot be used here: the one-line reason."""


class Mps:
    """A control daemon in ``root``'s own pipe and log directories."""

    def __init__(self, root: Path, base_env: dict[str, str]) -> None:
        self.pipe, self.logs = root / "pipe", root / "log"
        self.binary = control_binary()
        self.env = {**base_env, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}
        self.started = False

    def client_env(self, percent: int) -> dict[str, str]:
        """What a client at ``percent`` % of the GPU's threads needs."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.logs),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)}

    def control(self, command: str, timeout: float = 10) -> str:
        assert self.binary is not None
        r = subprocess.run([self.binary], input=command + "\n", env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        return r.stdout.strip()

    def start(self, probe: list[str], timeout: float = 30) -> None:
        """Start the daemon and prove it with ``probe`` (a CUDA program that prints a line once it has its context,
        then sleeps): its server must be listed. Raises MpsUnavailable with the reason, the daemon stopped."""
        if self.binary is None:
            raise MpsUnavailable("nvidia-cuda-mps-control is not on this host")
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        out_path = self.logs / "start.out"
        with open(out_path, "w") as out:  # a file, not a pipe: a daemon that kept a pipe open would hang the run
            self.started = True  # from here stop() quits whatever may have started
            try:
                r = subprocess.run([self.binary, "-d"], env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                raise MpsUnavailable(f"nvidia-cuda-mps-control -d did not return in {timeout:g} s") from None
        if r.returncode != 0:
            self.stop()
            raise MpsUnavailable(f"nvidia-cuda-mps-control -d exited with {r.returncode}: "
                                 f"{out_path.read_text(errors='replace').strip()[-200:]}")
        proc = subprocess.Popen(probe, env={**self.env, **self.client_env(100)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None  # a line once the probe has its context: through MPS, or without it
            seen, _, _ = select.select([proc.stdout], [], [], timeout)
            line = proc.stdout.readline() if seen else ""
            servers = self.control("get_server_list") if line else ""
        finally:
            proc.kill()
            proc.wait()
        if not line or not any(x.strip().isdigit() for x in servers.splitlines()):
            why = self.log_tail() or "no MPS server was started for a client"
            self.stop()
            raise MpsUnavailable(f"the MPS daemon started but its clients run without it ({why})")

    def clients(self) -> list[int]:
        """The pids connected to the daemon's servers."""
        pids: list[int] = []
        for server in self.control("get_server_list").split():
            if server.isdigit():
                pids += [int(p) for p in self.control(f"get_client_list {server}").split() if p.isdigit()]
        return pids

    def log_tail(self) -> str:
        for name in ("server.log", "control.log"):
            try:
                lines = [x for x in (self.logs / name).read_text().splitlines() if x.strip()]
            except OSError:
                continue
            if lines:
                return f"{name}: {lines[-1][-160:]}"
        return ""

    def stop(self, timeout: float = 15) -> None:
        """Quit the daemon (and its server) and wait for it to be gone."""
        if not self.started:
            return
        self.started = False
        pid_file = self.pipe / "nvidia-cuda-mps-control.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        try:
            self.control("quit", timeout=timeout)
        except subprocess.TimeoutExpired:  # it did not answer: the daemon is ended by its pid instead
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
