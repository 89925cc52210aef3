"""One client connection on ``arbiter.sock``: who it is, framing, handshake and request dispatch.

Who the peer is (its container, or its uid on the host) is fixed when it
connects (identity.py); a peer that cannot be told, or whose tenant already
holds as many connections as it may, is refused at once. Errors never leave
this module: a malformed or oversized frame gets an ``error`` message and the
connection is closed; a refused request gets an ``error`` reply (its code from
the error's type) and the connection stays. Other clients are never touched:
requests are handled under each tenant's share of the loop (intake.py), and a
connection that leaves more than ``max_unread_bytes`` of replies unread is
closed and its buffer freed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any, cast

import cgpu_protocol as p
from arbiterd import __version__
from arbiterd.core.errors import CoreError, IdentityError
from arbiterd.server.hub import Hub
from arbiterd.server.identity import Peer, peer_pidfd
from arbiterd.server.intake import BYTES_PER_REQUEST, REGISTER_COST, STATS_COST, Account

UNREAD_MARK = 64 << 10  # replies unread past which a connection's requests wait (backpressure)
_EAGER_BYTES = 4096  # a read up to this size is decoded whole; a longer one frame by frame
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
    """Frames in and out, the handshake, and each request handed to the hub (:meth:`Hub.serve`), in order, under
    its tenant's share of the loop."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport | None = None
        self.decoder = p.Decoder.for_requests()
        self.encoder = p.Encoder()
        self.cid = 0
        self.pid = 0
        self.uid = -1
        self.peer = Peer(0, -1)
        self.instance: str | None = None  # set by register
        self.greeted = False
        self.greeted_ns = 0  # when its hello was answered
        self.backed_up_since = 0  # when its unread replies passed UNREAD_MARK (0: they have not)
        self.closed = False
        self._backlog: Iterator[Any] | None = None  # requests read but left for the next turn (intake.py)
        self.account = Account()  # its tenant's count of requests in this turn (shared once it is let in)
        self.opened_ns = time.monotonic_ns()
        self.arrived_ns = self.opened_ns  # when the last whole message arrived: what its request is timed by
        self.partial_since_ns = 0  # when the frame still arriving began to arrive (0: none is)

    # asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = self.transport.get_extra_info("socket")
        self.pid, self.uid, _ = peer_credentials(sock)
        hub = self.hub
        try:
            self.peer = hub.identity.peer(self.pid, self.uid, peer_pidfd(sock))
        except IdentityError as exc:
            hub.client_log.log(f"refused identity uid-{self.uid}", logging.WARNING,
                               "refusing client pid %d (uid %d): %s", self.pid, self.uid, exc)
            hub.counters.refused["identity"] += 1
            self.fail("identity", str(exc))
            return
        why = hub.admit(self.peer)
        if why is not None:
            reason, message = why
            hub.client_log.log(f"refused {reason} {self.peer.tenant}", logging.WARNING,
                               "refusing client pid %d (uid %d): %s", self.pid, self.uid, message)
            hub.counters.refused[reason] += 1
            self.fail("busy", message)
            return
        mark = min(UNREAD_MARK, hub.config.max_unread_bytes)
        self.transport.set_write_buffer_limits(high=mark, low=mark // 4)
        self.account = hub.intake.account(self.peer.tenant)
        self.cid = hub.attach(self)

    def pause_writing(self) -> None:
        """The replies this client has not read passed ``UNREAD_MARK``: its requests wait, unread, until it reads
        (backpressure), so a connection holds at most about that much of the daemon's memory in replies. One that
        stays so ``frame_timeout_s`` (the daemon's housekeeping), or whose replies still pass ``max_unread_bytes``
        (effects it did not ask for), is closed and its buffer freed."""
        if self.closed or self.transport is None:
            return
        self.backed_up_since = time.monotonic_ns()
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        """It read its replies: its requests are served again (those left waiting, at its tenant's next turn)."""
        self.backed_up_since = 0
        if self.closed or self.transport is None:
            return
        if self._backlog is not None:
            self.hub.intake.defer(self)
        else:
            self.transport.resume_reading()

    def unread(self) -> None:
        """Close it for replies left unread: past ``max_unread_bytes``, or backed up too long."""
        if self.closed or self.transport is None:
            return
        self.hub.client_log.log(f"unread {self.peer.tenant}", logging.WARNING,
                                "client %d (pid %d): replies unread (more than %d bytes, or for long); closing",
                                self.cid, self.pid, self.hub.config.max_unread_bytes)
        self.hub.counters.refused["unread"] += 1
        self.closed = True
        self._backlog = None
        self.transport.abort()

    def backed_up_for_ns(self, now_ns: int) -> int:
        """How long its replies have stood past ``UNREAD_MARK`` unread (0: they do not)."""
        return now_ns - self.backed_up_since if self.backed_up_since else 0

    def resume(self) -> None:
        """Intake's next turn: serve the requests left over, then read again (not while its replies stand unread:
        :meth:`resume_writing` puts it back in the queue)."""
        if self.backed_up_since:
            return
        backlog, self._backlog = self._backlog, None
        if self.closed or backlog is None:
            return
        self.data_received(b"", backlog)
        if self._backlog is None and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes, backlog: Iterator[Any] | None = None) -> None:
        """Handle the requests in ``data`` (or, from :meth:`resume`, those left in ``backlog``) in order while
        this client's tenant has requests left in this turn of the loop; leave the rest for its next turn,
        reading paused meanwhile (intake.py). One method, with each request handled inline: it is the grant
        path, and the count costs it an addition."""
        if self.closed:
            return
        hub = self.hub
        acct, intake = self.account, hub.intake
        if acct.turn != intake.turn:  # a new turn: its count starts again
            acct.turn, acct.used = intake.turn, 0
        used, limit = acct.used, intake.limit
        decoder = self.decoder
        whole = decoder.whole  # where the frames decoded here begin: each is charged by its size
        frames: Iterable[Any]
        if backlog is not None:
            frames = backlog
        elif self._backlog is not None:  # requests still wait for their turn: these queue behind them, undecoded
            self._backlog = itertools.chain(self._backlog, decoder.stream(data))
            return
        elif used >= limit or len(data) > _EAGER_BYTES:  # decoded one by one, as the tenant's turn allows
            frames = decoder.stream(data)
        else:
            try:
                frames = decoder.feed(data)  # the grant path: a frame or two, decoded in one call
            except p.ProtocolError as exc:
                self._bad_frame(exc)
                return
        it = iter(frames)
        if used >= limit:  # its turn is spent already: all of these wait, undecoded
            self._defer(it)
            return
        last = self.arrived_ns
        try:
            for raw in it:
                self.arrived_ns = time.monotonic_ns()
                used += 1 + (decoder.whole - whole) // BYTES_PER_REQUEST  # what decoding it cost, by its size
                whole = decoder.whole
                try:
                    msg = p.decode(raw, p.C2S)
                except p.ProtocolError as exc:
                    if exc.code == "bad_frame" or not self.greeted:
                        raise
                    self.send(p.Error(exc.code, exc.message, p.request_id(raw)))  # answered, and counted below
                    msg = None
                if msg is None:
                    pass
                elif not self.greeted:
                    self.greet(msg)
                elif type(msg) is p.Bye:
                    self.close()
                else:
                    try:
                        used += _COSTLY.get(type(msg), 0)
                        hub.serve(self, msg, self.arrived_ns)
                    except CoreError as exc:  # refused: answered, and the connection stays
                        self.send(p.Error(exc.code, str(exc), getattr(msg, "id", None)))
                    except p.ProtocolError as exc:
                        self.send(p.Error(exc.code, exc.message, getattr(msg, "id", None)))
                if self.closed:
                    return
                if self.backed_up_since:  # its replies stand unread: what is left waits until it reads them
                    self._backlog = it
                    return
                if used >= limit:  # its turn is spent: what is left (perhaps nothing) waits
                    self._defer(it)
                    return
        except p.ProtocolError as exc:
            self._bad_frame(exc)
            return
        finally:
            acct.used = used
            if used * 2 >= limit:
                intake.renew_soon()
        if not self.decoder.pending_bytes:
            self.partial_since_ns = 0
        elif not self.partial_since_ns or self.arrived_ns != last:  # a frame began in this read
            self.partial_since_ns = time.monotonic_ns()

    def _defer(self, rest: Iterator[Any]) -> None:
        self._backlog = rest
        if self.transport is not None:
            self.transport.pause_reading()
        self.hub.intake.defer(self)

    def _bad_frame(self, exc: p.ProtocolError) -> None:
        self.hub.client_log.log(f"bad_frame {self.peer.tenant}", logging.INFO, "client %d (pid %d): %s; closing",
                                self.cid, self.pid, exc.message)
        self.hub.counters.bad_frames += 1
        self.fail(exc.code, exc.message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._backlog = None
        if self.instance is not None:  # it stays managed for a grace while it reconnects (server/watch.py)
            self.hub.recent.saw(self.pid, self.peer.started)
        if self.cid:
            self.hub.detach(self.cid)

    # sending ---------------------------------------------------------------
    def send(self, msg: p.Message) -> None:
        transport = self.transport
        if transport is not None and not self.closed:
            transport.write(self.encoder.frame(msg.to_wire()))
            if self.backed_up_since and transport.get_write_buffer_size() > self.hub.config.max_unread_bytes:
                self.unread()

    def fail(self, code: str, message: str) -> None:
        self.send(p.Error(code, message))
        self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def partial_for_ns(self, now_ns: int) -> int:
        """How long the frame still arriving has been arriving (0: none is, or requests wait for their turn)."""
        return now_ns - self.partial_since_ns if self.partial_since_ns and self._backlog is None else 0

    def idle_for_ns(self, now_ns: int) -> int:
        """How long a greeted connection has gone without registering since its hello was answered (0: it
        registered, or has not said hello: the handshake timeout covers that). Requests sent meanwhile do not
        count: a connection that chats without registering holds its slot no longer."""
        return now_ns - self.greeted_ns if self.greeted and self.instance is None else 0

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
        self.greeted_ns = time.monotonic_ns()
        self.send(p.Welcome(max(common), f"arbiterd/{__version__}", p.MAX_REQUEST, "CLOCK_MONOTONIC"))


# requests that cost the daemon much more than a grant, and count as that many more (intake.py)
_COSTLY: dict[type[p.Message], int] = {p.Stats: STATS_COST - 1, p.Register: REGISTER_COST - 1}
