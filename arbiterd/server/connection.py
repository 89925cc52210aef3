"""One client connection on ``arbiter.sock``: framing, handshake and request dispatch.

Errors never leave this module: a malformed or oversized frame gets an
``error`` message and the connection is closed; a refused request gets an
``error`` reply and the connection stays. Other clients are never touched.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from arbiterd import __version__
from arbiterd.core.arbiter import InstanceSettings, core_weight
from arbiterd.core.errors import CoreError, IdentityError, NotFoundError
from arbiterd.core.scheduler import check_range
from libcgpu_client import wire

if TYPE_CHECKING:
    from arbiterd.server.daemon import Daemon

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
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.transport: asyncio.Transport | None = None
        self.decoder = wire.Decoder("c2s")
        self.cid = 0
        self.pid = 0
        self.uid = -1
        self.greeted = False
        self.closed = False
        self.opened_at = time.monotonic()
        self.last_message_at = self.opened_at

    # asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.pid, self.uid, _ = peer_credentials(self.transport.get_extra_info("socket"))
        d = self.daemon
        if len(d.connections) >= d.config.max_clients:
            log.warning("refusing client pid %d: %d clients connected (max_clients)", self.pid,
                        len(d.connections))
            self.fail("busy", f"too many clients: the daemon allows {d.config.max_clients}")
            return
        self.cid = d.new_client_id()
        d.connections[self.cid] = self
        d.arbiter.connect(self.cid, self.pid, self.uid)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for raw in self.decoder.feed_raw(data):
                self.last_message_at = time.monotonic()
                if not isinstance(raw, dict):
                    raise wire.ProtocolError("bad_frame", f"expected a map, got {type(raw).__name__}")
                try:
                    msg = wire.validate(raw, "c2s")
                except wire.ProtocolError as exc:
                    if exc.code == "bad_frame" or not self.greeted:
                        raise
                    rid = raw.get("id")
                    self.send({"op": "error", "re": rid if isinstance(rid, int) else None,
                               "code": exc.code, "message": exc.message})
                    continue
                self.handle(msg)
                if self.closed:
                    return
        except wire.ProtocolError as exc:
            log.info("client %d (pid %d): %s; closing", self.cid, self.pid, exc.message)
            self.daemon.stats_bad_frames += 1
            self.fail(exc.code, exc.message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.daemon.connections.pop(self.cid, None) is not None:
            self.daemon.apply(self.daemon.arbiter.disconnect(self.cid, time.monotonic_ns()))

    # sending ---------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(wire.pack(msg))

    def fail(self, code: str, message: str) -> None:
        self.send({"op": "error", "code": code, "message": message})
        self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def pending_partial(self) -> bool:
        return self.decoder.pending_bytes > 0

    # requests ----------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if not self.greeted:
            if op != "hello":
                self.fail("bad_request", "the first message must be hello")
                return
            self.hello(msg)
            return
        rid = msg.get("id")
        try:
            handler = _HANDLERS.get(op)
            if handler is None:
                raise wire.ProtocolError("bad_request", f"{op} is not a request")
            handler(self, msg)
        except IdentityError as exc:
            self.send({"op": "error", "re": rid, "code": "identity", "message": str(exc)})
        except NotFoundError as exc:
            self.send({"op": "error", "re": rid, "code": "not_found", "message": str(exc)})
        except CoreError as exc:
            self.send({"op": "error", "re": rid, "code": "refused", "message": str(exc)})
        except wire.ProtocolError as exc:
            self.send({"op": "error", "re": rid, "code": exc.code, "message": exc.message})

    def hello(self, msg: dict[str, Any]) -> None:
        common = [v for v in msg["versions"] if v in wire.SUPPORTED_VERSIONS]
        if not common:
            self.fail("version", f"no common protocol version: daemon speaks {list(wire.SUPPORTED_VERSIONS)}")
            return
        self.greeted = True
        self.send({"op": "welcome", "version": max(common), "server": f"arbiterd/{__version__}",
                   "max_message": wire.MAX_MESSAGE, "clock": "CLOCK_MONOTONIC"})

    def op_register(self, msg: dict[str, Any]) -> None:
        d = self.daemon
        instance = d.identity.resolve(self.pid, msg.get("instance"))
        gpus = [d.gpu_index(g) for g in msg["gpus"]]
        memsize = msg.get("memsize") or []
        requested: dict[int, InstanceSettings] = {}
        core = msg.get("core_percent", 0)
        if "core_percent" in msg:
            try:
                core_weight(core)
            except CoreError as exc:
                raise wire.ProtocolError("bad_request", f"register: {exc}") from None
        for i, gpu in enumerate(gpus):
            weight = check_range("weight", msg.get("weight", 1), 1, 25)
            highprio = check_range("highprio", msg.get("highprio", 0), 0, 1)
            mem = memsize[min(i, len(memsize) - 1)] if memsize else 0
            if mem < 0:
                raise wire.ProtocolError("bad_request", "register: memsize must not be negative")
            requested[gpu] = InstanceSettings(weight, bool(highprio), mem, core)
        reg, effects = d.arbiter.register(self.cid, instance, gpus, requested, time.monotonic_ns())
        for w in reg.warnings:
            log.warning("client %d (pid %d): %s", self.cid, self.pid, w)
        self.send({"op": "registered", "re": msg["id"], "instance": reg.instance, "gpus": reg.gpus,
                   "warnings": reg.warnings})
        d.apply(effects)

    def op_acquire(self, msg: dict[str, Any]) -> None:
        self.daemon.apply(self.daemon.arbiter.acquire(self.cid, msg["gpu"], time.monotonic_ns()))

    def op_release(self, msg: dict[str, Any]) -> None:
        d = self.daemon
        effects, _ = d.arbiter.release(self.cid, msg["gpu"], msg["lease"], time.monotonic_ns(),
                                       again=bool(msg.get("again", False)), used_ns=msg["used_ns"])
        if "id" in msg:
            self.send({"op": "ok", "re": msg["id"]})
        d.apply(effects)

    def op_mem_reserve(self, msg: dict[str, Any]) -> None:
        dec = self.daemon.arbiter.mem_reserve(self.cid, msg["gpu"], msg["bytes"])
        if dec.ok:
            self.send({"op": "ok", "re": msg["id"], "used": dec.used, "limit": dec.limit})
        else:
            self.send({"op": "denied", "re": msg["id"], "used": dec.used, "limit": dec.limit,
                       "reason": dec.reason})

    def op_mem_free(self, msg: dict[str, Any]) -> None:
        dec = self.daemon.arbiter.mem_free(self.cid, msg["gpu"], msg["bytes"])
        self.send({"op": "ok", "re": msg["id"], "used": dec.used, "limit": dec.limit})

    def op_stats(self, msg: dict[str, Any]) -> None:
        """This client's GPUs, showing only its own instance (nothing of other tenants)."""
        info = self.daemon.arbiter.client(self.cid)
        gpus = []
        for g in self.daemon.status()["gpus"]:
            if g["index"] in info.gpus:
                g["instances"] = [i for i in g["instances"] if i["id"] == info.instance]
                gpus.append(g)
        self.send({"op": "stats", "re": msg["id"], "gpus": gpus})

    def op_bye(self, msg: dict[str, Any]) -> None:
        self.close()


_HANDLERS: dict[str, Callable[[ClientConnection, dict[str, Any]], None]] = {
    name[3:]: fn for name, fn in vars(ClientConnection).items() if name.startswith("op_")
}
