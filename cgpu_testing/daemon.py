"""The one way tests, benchmarks and the demo start ``arbiterd``: a subprocess with its own run and state dirs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from arbiterd.server.devices import parse_sim_gpus
from arbiterd.tools.adminclient import AdminClient, Refused
from cgpu_testing.tools import tool


def sim_uuid(index: int) -> str:
    """The UUID arbiterd gives simulated GPU ``index`` (``--sim-gpus``)."""
    return parse_sim_gpus(f"{index + 1}x1GiB")[index].uuid


class DaemonProc:
    """``arbiterd`` as a subprocess, its run and state dirs under ``tmp`` and its output in ``tmp/arbiterd.log``.

    ``args`` are more flags (``--sim-gpus 2x16GiB``...); ``env`` is added to this process's environment; ``wrap``
    goes before the command (``setpriv ...``, ``strace -f``). :meth:`start` returns once both sockets accept;
    :meth:`stop` and :meth:`start` again keep the state dir, so the daemon comes back with what it saved. As a
    context manager it starts (unless started) and stops.
    """

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None,
                 wrap: list[str] | None = None) -> None:
        self.tmp = tmp
        self.wrap = wrap or []
        self.run_dir = tmp / "run"
        self.state_dir = tmp / "state"
        self.args = list(args)
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "arbiterd.log"
        self._log: IO[bytes] | None = None

    @property
    def sock(self) -> str:
        return str(self.run_dir / "arbiter.sock")

    @property
    def admin(self) -> str:
        return str(self.run_dir / "admin.sock")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        """The command line :meth:`start` runs (``wrap`` first)."""
        return [*self.wrap, tool("arbiterd"), "--run-dir", str(self.run_dir), "--state-dir", str(self.state_dir),
                *self.args]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 20.0) -> DaemonProc:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"arbiterd exited with {self.proc.returncode}:\n{self.read_log()}")
            if _accepts(self.sock) and _accepts(self.admin):
                return self
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"arbiterd did not start in {timeout:g} s:\n{self.read_log()}")

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The daemon held with SIGSTOP: what connects meanwhile waits in the listen backlog, not yet accepted."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` (a running daemon only), wait for it to exit (kill it after ``timeout``); its exit code."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
        return self.proc.returncode

    def restart(self, *args: str, forget: bool = False) -> DaemonProc:
        """Stop (if running) and start again: with ``args`` in place of its flags, and with ``forget`` from an empty
        state dir (a new node, as far as the daemon knows)."""
        if self.running():
            self.stop()
        if args:
            self.args = list(args)
        if forget:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return self.start()

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``cgpuctl`` against this daemon, whatever its exit code."""
        return subprocess.run([tool("cgpuctl"), "--admin", self.admin, *args], capture_output=True,
                              text=True, timeout=30)

    def echo(self, value: str, path: str) -> None:
        """Write ``value`` to tree file ``path`` (as ``cgpuctl echo``, in this process); raise RuntimeError with the
        daemon's reason when it refuses."""
        try:
            AdminClient(self.admin).put(path, value)
        except Refused as exc:
            raise RuntimeError(f"echo {value!r} > {path}: {exc}") from None

    def cat(self, path: str) -> str:
        """Tree file ``path`` (as ``cgpuctl cat``, in this process)."""
        return AdminClient(self.admin).get(path)

    def status(self) -> dict[str, Any]:
        """The status document (``GET /v1/status``)."""
        return AdminClient(self.admin).status()

    def clear(self) -> None:
        """Through the admin API, back to no allocations and no provisioned instances (every GPU setting kept):
        the next test on a daemon that is shared has it to itself."""
        for alloc in self.status().get("allocations", []):
            self.echo(f"remove {alloc['id']}", "alloc_ctl")
        for line in self.cat("inst_ctl").splitlines():
            if line.strip():
                self.echo(f"remove {line.split()[0]}", "inst_ctl")

    def smi_json(self) -> dict[str, Any]:
        """``cgpu-smi --json`` against this daemon, parsed."""
        out = subprocess.run([tool("cgpu-smi"), "--admin", self.admin, "--json"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        return json.loads(out)  # type: ignore[no-any-return]

    def add_state_record(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the instance records of the state file of this daemon, which must be stopped
        (a record it may refuse at its next start)."""
        assert not self.running(), "stop the daemon first: it rewrites its state file"
        path = self.state_dir / "state.json"
        doc = json.loads(path.read_text())
        doc["instances"].append(record)
        path.write_text(json.dumps(doc))

    def __enter__(self) -> DaemonProc:
        return self if self.running() else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
