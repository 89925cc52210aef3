"""Test helpers: a real arbiterd in a subprocess, and a raw protocol client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """Path of a console script installed beside this Python (arbiterd, cgpuctl, ...)."""
    path = BIN / name
    return str(path) if path.exists() else name


class DaemonProc:
    """``arbiterd`` as a subprocess with its own run and state dirs."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None,
                 wrap: list[str] | None = None) -> None:
        self.tmp = tmp
        self.wrap = wrap or []
        self.run_dir = tmp / "run"
        self.state_dir = tmp / "state"
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "arbiterd.log"

    @property
    def sock(self) -> str:
        return str(self.run_dir / "arbiter.sock")

    @property
    def admin(self) -> str:
        return str(self.run_dir / "admin.sock")

    def start(self, timeout: float = 15.0) -> DaemonProc:
        cmd = [*self.wrap, tool("arbiterd"), "--run-dir", str(self.run_dir), "--state-dir", str(self.state_dir),
               *self.args]
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"arbiterd exited with {self.proc.returncode}:\n{self.read_log()}")
            if _accepts(self.sock) and _accepts(self.admin):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"arbiterd did not start:\n{self.read_log()}")

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool("cgpuctl"), "--admin", self.admin, *args], capture_output=True,
                              text=True, timeout=30)

    def smi_json(self) -> dict[str, Any]:
        """``cgpu-smi --json`` against this daemon, parsed."""
        out = subprocess.run([tool("cgpu-smi"), "--admin", self.admin, "--json"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        return json.loads(out)  # type: ignore[no-any-return]


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class RawClient:
    """Speaks the wire protocol by hand, for protocol-level tests."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.unpacker = msgpack.Unpacker(raw=False)

    def send(self, msg: Any) -> None:
        self.sock.sendall(msgpack.packb(msg, use_bin_type=True))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        while True:
            for msg in self.unpacker:
                return msg  # type: ignore[no-any-return]
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.unpacker.feed(data)

    def closed(self, timeout: float = 5.0) -> bool:
        """True once the daemon has closed the connection (after draining what it sent)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.unpacker.feed(data)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def hello_register(self, instance: str, gpus: list[int] | None = None, **extra: Any) -> dict[str, Any]:
        self.send({"op": "hello", "versions": [1], "client": "test"})
        assert self.recv()["op"] == "welcome"
        self.send({"op": "register", "id": 1, "instance": instance, "gpus": gpus or [0], **extra})
        return self.recv()

    def close(self) -> None:
        self.sock.close()


class BackgroundGate:
    """A well-behaved client working through its gate in a thread while a test misbehaves.

    Each loop holds the lease for ``hold_s`` and then idles a little, so the lease is
    given back and asked for again all the time. Errors are kept for the test to assert.
    """

    def __init__(self, sock: str, instance: str = "good", hold_s: float = 0.0005) -> None:
        from libcgpu_client.client import Client
        from libcgpu_client.gate import Gate

        self.client = Client(sock, instance, [0])
        assert self.client.start(10)
        self.gate = Gate(self.client, 0, idle_ms=1.0)
        self.hold_s = hold_s
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True)

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                with self.gate.work():
                    time.sleep(self.hold_s)
                time.sleep(0.002)
        except BaseException as exc:  # kept for the test to assert on
            self.errors.append(exc)

    def __enter__(self) -> BackgroundGate:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.gate.close()
        self.client.close()
