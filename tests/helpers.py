"""Test helpers: a raw protocol client, and a well-behaved client in the background.

The daemon launcher and the rest of the harness that tests share with the benchmarks are in ``cgpu_testing``."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import msgpack

__all__ = ["BackgroundGate", "RawClient"]


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
