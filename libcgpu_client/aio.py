"""asyncio client for the cgpu protocol (for asyncio programs, tools and load generators).

    client = await AsyncClient.connect(path, instance="a", gpus=[0])
    lease, deadline_ns = await client.acquire(0)
    ...  # GPU work while time.monotonic_ns() < deadline_ns
    client.release(0, lease, used_ns)
    await client.close()

Unlike the blocking :class:`~libcgpu_client.client.Client` it does not
reconnect on its own: a lost connection raises ``ConnectionError`` in the
waiting calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from cgpu_protocol import (
    S2C,
    Acquire,
    Bye,
    Decoder,
    Error,
    Grant,
    MemFree,
    MemReserve,
    Message,
    Ok,
    ProtocolError,
    Registered,
    Release,
    Revoke,
    Welcome,
    decode,
)
from libcgpu_client.session import ClientSettings, DaemonError, Registration, hello


class _Protocol(asyncio.Protocol):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.decoder = Decoder()

    def data_received(self, data: bytes) -> None:
        try:
            for raw in self.decoder.feed(data):
                self.client._dispatch(decode(raw, S2C))
        except ProtocolError as exc:
            self.client._fail(ConnectionError(f"bad frame from arbiterd: {exc.message}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._fail(ConnectionError("arbiterd closed the connection"))


class AsyncClient:
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.registration: Registration | None = None
        self._ids = itertools.count(1)
        self._welcome: asyncio.Future[Message] | None = None
        self._replies: dict[int, asyncio.Future[Message]] = {}
        self._grants: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self.revoked: dict[int, int] = {}  # gpu -> last revoked lease
        self._error: Exception | None = None

    @classmethod
    async def connect(cls, path: str, instance: str | None, gpus: list[int | str], weight: int = 1,
                      highprio: bool = False, memsize: list[int] | None = None,
                      core_percent: int = 0, limit: int = 0) -> AsyncClient:
        self = cls()
        settings = ClientSettings(instance, tuple(gpus), weight, highprio, tuple(memsize or ()), core_percent,
                                  limit)
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
        self._welcome = loop.create_future()
        self._write(hello("libcgpu_client.aio"))
        welcome = await self._welcome
        if isinstance(welcome, Error):
            raise DaemonError.of(welcome)
        reg = await self.request(settings.register)
        assert isinstance(reg, Registered)
        self.registration = Registration.of(reg)
        return self

    def _write(self, msg: Message) -> None:
        if self._error is not None:
            raise self._error
        assert self.transport is not None
        self.transport.write(msg.pack())

    async def request(self, make: Callable[[int], Message]) -> Message:
        """Send ``make(id)`` with a fresh id and wait for its reply."""
        rid = next(self._ids)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[rid] = fut
        self._write(make(rid))
        reply = await fut
        if isinstance(reply, Error):
            raise DaemonError.of(reply)
        return reply

    async def _granted(self, gpu: int, msg: Message) -> tuple[int, int]:
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._grants[gpu] = fut
        self._write(msg)
        return await fut

    async def acquire(self, gpu: int) -> tuple[int, int]:
        """Wait for a lease on ``gpu``; returns (lease, deadline_ns)."""
        return await self._granted(gpu, Acquire(gpu))

    async def renew(self, gpu: int, lease: int, used_ns: int) -> tuple[int, int]:
        """Give a lease back and ask again in one message (keeps the place in the round)."""
        return await self._granted(gpu, Release(gpu, lease, used_ns, again=True))

    def release(self, gpu: int, lease: int, used_ns: int) -> None:
        """Give a lease back (no reply is awaited)."""
        self._write(Release(gpu, lease, used_ns))

    async def mem_reserve(self, gpu: int, nbytes: int) -> bool:
        reply = await self.request(lambda rid: MemReserve(rid, gpu, nbytes))
        return isinstance(reply, Ok)

    async def mem_free(self, gpu: int, nbytes: int) -> None:
        await self.request(lambda rid: MemFree(gpu, nbytes, rid))

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(Bye().pack())
            self.transport.close()

    # ------------------------------------------------------------------ inbound
    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Grant):
            fut = self._grants.pop(msg.gpu, None)
            if fut is not None and not fut.done():
                fut.set_result((msg.lease, msg.deadline_ns))
        elif isinstance(msg, Revoke):
            self.revoked[msg.gpu] = msg.lease
        elif self._welcome is not None and not self._welcome.done() and isinstance(msg, Welcome | Error):
            self._welcome.set_result(msg)  # the answer to hello (an error has no ``re`` there)
        else:
            rid = getattr(msg, "re", None)
            reply = self._replies.pop(rid, None) if isinstance(rid, int) else None
            if reply is not None and not reply.done():
                reply.set_result(msg)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        futures: list[asyncio.Future[Message]] = list(self._replies.values())
        if self._welcome is not None:
            futures.append(self._welcome)
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)
        for grant in self._grants.values():
            if not grant.done():
                grant.set_exception(exc)
        self._replies.clear()
        self._grants.clear()
