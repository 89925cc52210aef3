"""One client connection on ``arbiter.sock``: framing, handshake and request dispatch.

Errors never leave this module: a malformed or oversized frame gets an
``error`` message and the connection is closed; a refused request gets an
``error`` reply (its code from the error's type) and the connection stays.
Other clients are never touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, cast

from arbiterd import __version__
from arbiterd.core.errors import CoreError
from arbiterd.core.settings import INSTANCE, InstanceSettings
from arbiterd.server import status as status_mod
from arbiterd.server.hub import Hub
from libcgpu_client import protocol as p

log = logging.getLogger("arbiterd.clients")
_PEERCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket | None) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer of a UNIX socket, or (0, -1, -1) if unknown."""
    if sock is None:
        return 0, -1, -1
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return 0, -1, -1
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


class ClientConnection(asyncio.Protocol):
    def __init__(self, hub: Hub, status: Callable[[], status_mod.DaemonStatus]) -> None:
        self.hub = hub
        self.status = status
        self.transport: asyncio.Transport | None = None
        self.decoder = p.Decoder()
        self.encoder = p.Encoder()
        self.cid = 0
        self.pid = 0
        self.uid = -1
        self.greeted = False
        self.closed = False
        self.opened_ns = time.monotonic_ns()
        self.arrived_ns = self.opened_ns  # when the last whole message arrived: what its request is timed by
        self.partial_since_ns = 0  # when the frame still arriving began to arrive (0: none is)

    # asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.pid, self.uid, _ = peer_credentials(self.transport.get_extra_info("socket"))
        hub = self.hub
        if len(hub.peers) >= hub.config.max_clients:
            log.warning("refusing client pid %d: %d clients connected (max_clients)", self.pid, len(hub.peers))
            self.fail("busy", f"too many clients: the daemon allows {hub.config.max_clients}")
            return
        self.cid = hub.attach(self)
        hub.arbiter.connect(self.cid, self.pid, self.uid)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        last = self.arrived_ns
        try:
            for raw in self.decoder.feed(data):
                self.arrived_ns = time.monotonic_ns()
                try:
                    msg = p.decode(raw, p.C2S)
                except p.ProtocolError as exc:
                    if exc.code == "bad_frame" or not self.greeted:
                        raise
                    self.send(p.Error(exc.code, exc.message, p.request_id(raw)))
                    continue
                if not self.greeted:
                    self.greet(msg)
                else:  # a request's handler, run here rather than through one more call (twice per grant)
                    try:
                        handler = _HANDLERS.get(type(msg))
                        if handler is None:
                            raise p.ProtocolError("bad_request", f"{msg.OP} is not a request")
                        handler(self, msg)
                    except CoreError as exc:  # refused: answered, and the connection stays
                        self.send(p.Error(exc.code, str(exc), getattr(msg, "id", None)))
                    except p.ProtocolError as exc:
                        self.send(p.Error(exc.code, exc.message, getattr(msg, "id", None)))
                if self.closed:
                    return
            if not self.decoder.pending_bytes:
                self.partial_since_ns = 0
            elif not self.partial_since_ns or self.arrived_ns != last:  # a frame began in this read
                self.partial_since_ns = time.monotonic_ns()
        except p.ProtocolError as exc:
            log.info("client %d (pid %d): %s; closing", self.cid, self.pid, exc.message)
            self.hub.counters.bad_frames += 1
            self.fail(exc.code, exc.message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.cid:
            self.hub.detach(self.cid)

    # sending ---------------------------------------------------------------
    def send(self, msg: p.Message) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(self.encoder.frame(msg.to_wire()))

    def fail(self, code: str, message: str) -> None:
        self.send(p.Error(code, message))
        self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def partial_for_ns(self, now_ns: int) -> int:
        """How long the frame still arriving has been arriving (0: none is)."""
        return now_ns - self.partial_since_ns if self.partial_since_ns else 0

    # requests ----------------------------------------------------------------
    def greet(self, msg: p.Message) -> None:
        """The first message: only hello is accepted."""
        if not isinstance(msg, p.Hello):
            self.fail("bad_request", "the first message must be hello")
            return
        self.hello(msg)

    def hello(self, msg: p.Hello) -> None:
        common = [v for v in msg.versions if v in p.SUPPORTED_VERSIONS]
        if not common:
            self.fail("version", f"no common protocol version: daemon speaks {list(p.SUPPORTED_VERSIONS)}")
            return
        self.greeted = True
        self.send(p.Welcome(max(common), f"arbiterd/{__version__}", p.MAX_MESSAGE, "CLOCK_MONOTONIC"))

    def register(self, msg: p.Register) -> None:
        hub = self.hub
        ident = hub.identity.identify(self.pid, msg.instance)
        instance = ident.instance
        gpus = [hub.gpu_index(g) for g in msg.gpus]
        memsize = msg.memsize or []
        requested: dict[int, InstanceSettings] = {}
        for i, gpu in enumerate(gpus):
            values = {"weight": 1 if msg.weight is None else msg.weight,
                      "highprio": 0 if msg.highprio is None else msg.highprio,
                      "memsize": memsize[min(i, len(memsize) - 1)] if memsize else 0}
            if msg.core_percent is not None:
                values["core_percent"] = msg.core_percent
            requested[gpu] = InstanceSettings(**{k: INSTANCE[k].check(v) for k, v in values.items()})
        bound = hub.bind(self.pid, ident)
        notes: list[str] = []
        if bound is not None and sorted(set(gpus)) != bound.gpus:
            notes.append(f"GPU {','.join(map(str, bound.gpus))} from allocation {', '.join(bound.allocations)} "
                         f"(asked for GPU {','.join(map(str, gpus))})")
            gpus = bound.gpus
        reg, effects = hub.arbiter.register(self.cid, instance, gpus, requested, time.monotonic_ns())
        for w in reg.warnings:
            log.warning("client %d (pid %d): %s", self.cid, self.pid, w)
        self.send(p.Registered(msg.id, reg.instance, [dataclasses.asdict(g) for g in reg.gpus],
                               notes + reg.warnings))
        hub.apply(effects)

    def acquire(self, msg: p.Acquire) -> None:
        self.hub.apply(self.hub.arbiter.acquire(self.cid, msg.gpu, self.arrived_ns), msg.gpu)

    def release(self, msg: p.Release) -> None:
        hub = self.hub
        effects, _ = hub.arbiter.release(self.cid, msg.gpu, msg.lease, self.arrived_ns, again=msg.again,
                                         used_ns=msg.used_ns, warmup_ns=msg.warmup_ns)
        if msg.id is not None:
            self.send(p.Ok(msg.id))
        hub.released(effects, msg.gpu)

    def mem_reserve(self, msg: p.MemReserve) -> None:
        dec = self.hub.arbiter.mem_reserve(self.cid, msg.gpu, msg.bytes)
        if dec.ok:
            self.send(p.Ok(msg.id, dec.used, dec.limit))
        else:
            self.send(p.Denied(msg.id, dec.used, dec.limit, dec.reason))

    def mem_free(self, msg: p.MemFree) -> None:
        dec = self.hub.arbiter.mem_free(self.cid, msg.gpu, msg.bytes)
        if msg.id is not None:
            self.send(p.Ok(msg.id, dec.used, dec.limit))

    def mem_query(self, msg: p.MemQuery) -> None:
        dec = self.hub.arbiter.mem_query(self.cid, msg.gpu)
        self.send(p.Ok(msg.id, dec.used, dec.limit))

    def stats(self, msg: p.Stats) -> None:
        """This client's GPUs, showing only its own instance (nothing of other tenants)."""
        info = self.hub.arbiter.client(self.cid)
        gpus = []
        for g in self.status().to_json()["gpus"]:
            if g["index"] in info.gpus:
                g["instances"] = [i for i in g["instances"] if i["id"] == info.instance]
                gpus.append(g)
        self.send(p.StatsReply(msg.id, gpus))


# each request's handler, by its message class: one lookup instead of a chain of isinstance tests per message
_HANDLERS: dict[type[p.Message], Callable[[ClientConnection, Any], None]] = {
    p.Acquire: ClientConnection.acquire, p.Release: ClientConnection.release,
    p.MemReserve: ClientConnection.mem_reserve, p.MemFree: ClientConnection.mem_free,
    p.MemQuery: ClientConnection.mem_query, p.Register: ClientConnection.register,
    p.Stats: ClientConnection.stats, p.Bye: lambda conn, msg: conn.close(),
}
