"""The admin API's connections: who each one is, told once when it connects; how many may be held; how long one
may stay silent.

* **Who, once, at accept.** An ``admin.sock`` peer is told from the kernel when
  it connects (``SO_PEERCRED``, its cgroup, and that it is live: identity.py),
  and that answer holds for the connection's life. It is never read again: a
  container child that connected and then exited unreaped shows ``/`` as its
  cgroup on cgroup v1, and re-reading it on each request took it for the host.
* **How many.** The loopback TCP listener holds at most ``max_admin_clients``
  connections, and ``admin.sock`` as many again from peers it refuses (a
  container's root, through the plugins' mount); a connection beyond that is
  closed as soon as it is accepted. The host's own ``admin.sock`` peers (root,
  ``admin_group``) are never counted or refused: the daemon's descriptor budget
  (limits.py) keeps room for them.
* **How long.** Any admin connection that has not sent a complete request, and
  had it answered, ``admin_request_timeout_s`` after it connected or after its
  last answer is closed: an idle or half-sent connection holds nothing for long.

aiohttp's :class:`~aiohttp.web.Server` is told of each connection and its end
(``connection_made`` / ``connection_lost``, called by every
:class:`~aiohttp.web_protocol.RequestHandler`); :func:`install` hooks those two.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(slots=True)
class Conn:
    transport: asyncio.Transport
    kind: str  # "host" (an admin.sock peer it serves), "refused" (one it refuses), "tcp"
    refusal: str | None  # why an admin.sock peer is refused (told at accept); None: served (or TCP: by its token)
    timer: asyncio.TimerHandle | None = None


class AdminConnections:
    """The admin API's live connections, keyed by their request handler (``request.protocol``)."""

    def __init__(self, refusal: Callable[[socket.socket], str | None], cap: Callable[[], int],
                 timeout_s: Callable[[], float]) -> None:
        self.refusal = refusal  # why the peer of an admin.sock connection is refused, or None
        self.cap = cap  # max_admin_clients, read at each accept (a reload may change it)
        self.timeout_s = timeout_s  # admin_request_timeout_s, likewise
        self.conns: dict[Any, Conn] = {}
        self.held: Counter[str] = Counter()  # live connections by kind

    def install(self, server: web.Server) -> None:
        """Hook ``server``'s own connection callbacks (it serves admin.sock and the TCP listener alike)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self.made(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.lost(handler)
            lost(handler, exc)

        setattr(server, "connection_made", connection_made)  # noqa: B010 - an instance's own callback, replaced
        setattr(server, "connection_lost", connection_lost)  # noqa: B010

    def made(self, handler: Any, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            why = self.refusal(sock)
            kind = "host" if why is None else "refused"
        else:
            why, kind = None, "tcp"
        if kind != "host" and self.held[kind] >= self.cap():
            transport.abort()
            return
        conn = self.conns[handler] = Conn(transport, kind, why)
        self.held[kind] += 1
        self._arm(handler, conn)

    def lost(self, handler: Any) -> None:
        conn = self.conns.pop(handler, None)
        if conn is not None:
            self.held[conn.kind] -= 1
            if conn.timer is not None:
                conn.timer.cancel()

    def get(self, handler: Any) -> Conn | None:
        """The connection a request came on (None: one closed at accept, or never seen)."""
        return self.conns.get(handler)

    def answered(self, handler: Any) -> None:
        """A request on ``handler`` was answered: its connection has ``admin_request_timeout_s`` again."""
        conn = self.conns.get(handler)
        if conn is not None:
            self._arm(handler, conn)

    def _arm(self, handler: Any, conn: Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        conn.timer = asyncio.get_running_loop().call_later(self.timeout_s(), self._expire, handler)

    def _expire(self, handler: Any) -> None:
        conn = self.conns.get(handler)
        if conn is not None:
            conn.timer = None
            conn.transport.abort()
