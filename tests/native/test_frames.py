"""Every frame libcgpu.so sends is a valid message of cgpu_protocol, not only bytes its codec
can round-trip: a recording proxy between the shim and a real arbiterd decodes each one."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

import cgpu_protocol as p
from cgpu_testing.daemon import DaemonProc
from tests.native.conftest import Native, at, lines, start_job

DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


def _shutdown(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


class RecordingProxy:
    """Forwards every connection to the daemon and decodes what the client sends."""

    def __init__(self, path: str, upstream: str) -> None:
        self.path, self.upstream = path, upstream
        self.frames: list[p.Message] = []
        self.errors: list[str] = []
        self.conns: list[tuple[socket.socket, socket.socket]] = []
        self.recorders: list[threading.Thread] = []  # one per client connection: what it sent, decoded
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            self.conns.append((client, server))
            recorder = threading.Thread(target=self._pipe, args=(client, server, True), daemon=True)
            self.recorders.append(recorder)
            recorder.start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every connection of a client that has exited is read to its end: its last frames may
        still be in the socket when the process is gone."""
        for recorder in list(self.recorders):
            recorder.join(timeout)

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        decoder = p.Decoder()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                _shutdown(src, dst)
                return
            if record:
                try:
                    self.frames += [p.decode(raw, p.C2S) for raw in decoder.feed(data)]
                except p.ProtocolError as exc:
                    self.errors.append(exc.message)
            try:
                dst.sendall(data)
            except OSError:  # the other side is gone (a dropped connection)
                _shutdown(src, dst)
                return

    def drop_all(self) -> None:
        """As if the daemon went away: every connection is cut."""
        for client, server in self.conns:
            _shutdown(client, server)
        self.conns.clear()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy(daemon_factory: type, short_tmp: Path) -> RecordingProxy:
    d: DaemonProc = daemon_factory.start(*DAEMON, "--policy", "2")
    px = RecordingProxy(str(short_tmp / "rec.sock"), d.sock)
    yield px
    px.close()


def test_every_frame_the_shim_sends_is_a_valid_message(native: Native, proxy: RecordingProxy) -> None:
    """Registration with a memory limit and a core percentage, launches, allocations, a memory query,
    frees, and the re-reservation after the connection is lost: all decode as protocol messages."""
    env = {"CGPU_INSTANCE": "rec", "ALIYUN_COM_GPU_MEM_CONTAINER": "1", "CGPU_CORE_PERCENT": "30",
           "ALIYUN_COM_GPU_HIGH_PRIO": "1"}
    job = start_job(native, None, "alloc=64M", "info", f"spin=2,2,{at(0.3)},{at(0.8)}", "ready", "sleep=1500",
                    "info", "freeall", CGPU_SOCKET=proxy.path, **env)
    assert job.stdout is not None
    for line in job.stdout:
        if line.startswith("ready"):
            proxy.drop_all()  # the shim reconnects and puts the 64 MiB it holds back on the ledger
            break
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    proxy.settle()
    assert proxy.errors == []
    ops = [f.OP for f in proxy.frames]
    assert {"hello", "register", "acquire", "release", "mem_reserve", "mem_query", "mem_free"} <= set(ops), ops
    assert ops.count("register") >= 2  # once, and again after the reconnect
    registers = [f for f in proxy.frames if isinstance(f, p.Register)]
    assert registers[0].core_percent == 30 and registers[0].highprio == 1 and registers[0].memsize == [2**30]
    restore = [f for f in proxy.frames if isinstance(f, p.MemReserve) and f.bytes == 64 * 2**20]
    assert len(restore) == 2  # the allocation, and its re-reservation after the reconnect
    assert all(f.id is None for f in proxy.frames if isinstance(f, p.Acquire | p.MemFree))
    assert int(lines(out, "info")[-1]["total"]) == 2**30
