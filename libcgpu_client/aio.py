"""asyncio client for the cgpu protocol (for asyncio programs, tools and load generators).

    client = await AsyncClient.connect(path, instance="a", gpus=[0])
    lease, deadline_ns = await client.acquire(0)
    ...  # GPU work while time.monotonic_ns() < deadline_ns
    await client.release(0, lease, used_ns)
    await client.close()

Unlike the blocking :class:`~libcgpu_client.client.Client` it does not
reconnect on its own: a lost connection raises ``ConnectionError`` in the
waiting calls.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from libcgpu_client import __version__, wire
from libcgpu_client.client import DaemonError, Registration


class _Protocol(asyncio.Protocol):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.decoder = wire.Decoder("s2c")

    def data_received(self, data: bytes) -> None:
        try:
            for msg in self.decoder.feed(data):
                self.client._dispatch(msg)
        except wire.ProtocolError as exc:
            self.client._fail(ConnectionError(f"bad frame from arbiterd: {exc.message}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._fail(ConnectionError("arbiterd closed the connection"))


class AsyncClient:
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.registration: Registration | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._grants: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self.revoked: dict[int, int] = {}  # gpu -> last revoked lease
        self._error: Exception | None = None

    @classmethod
    async def connect(cls, path: str, instance: str | None, gpus: list[int | str], weight: int = 1,
                      highprio: bool = False, memsize: list[int] | None = None) -> AsyncClient:
        self = cls()
        loop = asyncio.get_running_loop()
        for attempt in range(200):
            try:
                transport, _ = await loop.create_unix_connection(lambda: _Protocol(self), path)
                break
            except BlockingIOError:  # EAGAIN: the listen backlog is full for a moment
                if attempt == 199:
                    raise
                await asyncio.sleep(0.01)
        self.transport = transport
        hello = self._request({"op": "hello", "versions": list(wire.SUPPORTED_VERSIONS),
                               "client": f"libcgpu_client.aio/{__version__}", "pid": os.getpid()}, key=0)
        welcome = await hello
        if welcome["op"] != "welcome":
            raise DaemonError(welcome.get("code", "?"), welcome.get("message", "no welcome"))
        msg: dict[str, Any] = {"op": "register", "instance": instance, "gpus": gpus, "weight": weight,
                               "highprio": int(highprio)}
        if memsize:
            msg["memsize"] = memsize
        reg = await self.request(msg)
        self.registration = Registration(reg["instance"], reg["gpus"], reg["warnings"])
        return self

    def _request(self, msg: dict[str, Any], key: int) -> asyncio.Future[dict[str, Any]]:
        if self._error is not None:
            raise self._error
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[key] = fut
        assert self.transport is not None
        self.transport.write(wire.pack(msg))
        return fut

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        rid = next(self._ids)
        reply = await self._request({**msg, "id": rid}, key=rid)
        if reply["op"] == "error":
            raise DaemonError(reply["code"], reply["message"])
        return reply

    async def acquire(self, gpu: int) -> tuple[int, int]:
        """Wait for a lease on ``gpu``; returns (lease, deadline_ns)."""
        if self._error is not None:
            raise self._error
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._grants[gpu] = fut
        assert self.transport is not None
        self.transport.write(wire.pack({"op": "acquire", "id": 0, "gpu": gpu}))
        return await fut

    async def renew(self, gpu: int, lease: int, used_ns: int) -> tuple[int, int]:
        """Give a lease back and ask again in one message (keeps the place in the round)."""
        if self._error is not None:
            raise self._error
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._grants[gpu] = fut
        assert self.transport is not None
        self.transport.write(wire.pack({"op": "release", "gpu": gpu, "lease": lease, "used_ns": used_ns,
                                        "again": True}))
        return await fut

    def release(self, gpu: int, lease: int, used_ns: int) -> None:
        """Give a lease back (no reply is awaited)."""
        assert self.transport is not None
        self.transport.write(wire.pack({"op": "release", "gpu": gpu, "lease": lease, "used_ns": used_ns}))

    async def mem_reserve(self, gpu: int, nbytes: int) -> bool:
        reply = await self.request({"op": "mem_reserve", "gpu": gpu, "bytes": nbytes})
        return bool(reply["op"] == "ok")

    async def mem_free(self, gpu: int, nbytes: int) -> None:
        await self.request({"op": "mem_free", "gpu": gpu, "bytes": nbytes})

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire.pack({"op": "bye"}))
            self.transport.close()

    # ------------------------------------------------------------------ inbound
    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "grant":
            fut = self._grants.pop(msg["gpu"], None)
            if fut is not None and not fut.done():
                fut.set_result((msg["lease"], msg["deadline_ns"]))
        elif op == "revoke":
            self.revoked[msg["gpu"]] = msg["lease"]
        elif op == "welcome":
            self._resolve(0, msg)
        else:
            rid = msg.get("re")
            if isinstance(rid, int):
                self._resolve(rid, msg)

    def _resolve(self, key: int, msg: dict[str, Any]) -> None:
        fut = self._replies.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        for fut in [*self._replies.values(), *self._grants.values()]:
            if not fut.done():
                fut.set_exception(exc)
        self._replies.clear()
        self._grants.clear()
