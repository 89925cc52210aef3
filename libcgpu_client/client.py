"""Blocking, thread-safe protocol client with reconnection.

How this works
--------------
One socket per process. A reader thread decodes everything the daemon sends:
replies are matched to requests by ``re``; grants and revokes are routed to
the per-GPU listener (the :class:`~libcgpu_client.gate.Gate`). When the
socket breaks the reader thread reconnects with exponential backoff (50 ms up
to 2 s), says hello and registers again with the same settings, and tells the
listeners that every lease is gone. Callers that wait for a reply or a grant
meanwhile keep waiting; the application sees no exception.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cgpu_protocol import (
    S2C,
    Bye,
    Decoder,
    Denied,
    Error,
    Grant,
    MemFree,
    MemQuery,
    MemReserve,
    Message,
    Ok,
    ProtocolError,
    Registered,
    Revoke,
    Stats,
    StatsReply,
    Welcome,
    decode,
)
from libcgpu_client.session import ClientSettings, DaemonError, Registration, hello

log = logging.getLogger("libcgpu_client")
Reply = Ok | Denied | StatsReply | Registered


@dataclass(slots=True)
class LeaseListener:
    on_grant: Callable[[int, int], None]  # (lease, deadline_ns)
    on_revoke: Callable[[int], None]  # (lease)
    on_reset: Callable[[], None]


@dataclass(slots=True)
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    reply: Message | None = None


class Client:
    """A connection to ``arbiterd`` that survives daemon restarts."""

    def __init__(
        self,
        socket_path: str,
        instance: str | None,
        gpus: list[int | str],
        weight: int = 1,
        highprio: bool = False,
        memsize: list[int] | None = None,
        backoff_max_s: float = 2.0,
        core_percent: int = 0,
        limit: int = 0,
    ) -> None:
        self.socket_path = socket_path
        self.settings = ClientSettings(instance, tuple(gpus), weight, highprio, tuple(memsize or ()), core_percent,
                                       limit)
        self.backoff_max_s = backoff_max_s
        self.registration: Registration | None = None
        self.listeners: dict[int, LeaseListener] = {}
        self._sock: socket.socket | None = None
        self._decoder = Decoder()
        self._send_lock = threading.Lock()
        self._state = threading.Condition()
        self._connected = False
        self._closing = False
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._thread: threading.Thread | None = None
        self.connects = 0
        self.on_connected: list[Callable[[], None]] = []

    # ------------------------------------------------------------ lifecycle
    def start(self, wait_s: float | None = 5.0) -> bool:
        """Start the reader thread; wait up to ``wait_s`` for the first registration."""
        self._thread = threading.Thread(target=self._run, name="cgpu-client", daemon=True)
        self._thread.start()
        return self.wait_connected(wait_s)

    def wait_connected(self, timeout: float | None = None) -> bool:
        with self._state:
            return self._state.wait_for(lambda: self._connected or self._closing, timeout) and self._connected

    @property
    def connected(self) -> bool:
        return self._connected

    def close(self) -> None:
        with self._state:
            self._closing = True
            self._state.notify_all()
        sock = self._sock
        if sock is not None:
            try:
                with self._send_lock:
                    sock.sendall(Bye().pack())
            except OSError:
                pass
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    # -------------------------------------------------------------- requests
    def request(self, make: Callable[[int], Message], timeout: float | None = None) -> Reply:
        """Send ``make(id)`` with a fresh id and wait for its reply (across reconnects)."""
        while True:
            rid = next(self._ids)
            msg = make(rid)
            waiter = _Waiter()
            self._waiters[rid] = waiter
            try:
                self._send(msg, wait=True)
                if not waiter.event.wait(timeout):
                    raise TimeoutError(f"no reply to {msg.OP} within {timeout} s")
            finally:
                self._waiters.pop(rid, None)
            reply = waiter.reply
            if reply is None:  # the connection broke: ask again on the next one
                continue
            if isinstance(reply, Error):
                raise DaemonError.of(reply)
            if not isinstance(reply, Reply):
                raise ProtocolError("bad_request", f"{reply.OP} is not a reply to {msg.OP}")
            return reply

    def send(self, msg: Message) -> bool:
        """Send a message that asks for no reply. False when not connected."""
        return self._send(msg, wait=False)

    def _send(self, msg: Message, wait: bool) -> bool:
        data = msg.pack()
        while True:
            with self._state:
                if wait:
                    self._state.wait_for(lambda: self._connected or self._closing)
                if self._closing:
                    raise ConnectionError("client is closed")
                sock = self._sock if self._connected else None
            if sock is None:
                return False
            try:
                with self._send_lock:
                    sock.sendall(data)
                return True
            except OSError:
                self._lost(sock)
                if not wait:
                    return False

    # ---------------------------------------------------------------- reader
    def _run(self) -> None:
        delay = 0.05
        while not self._closing:
            try:
                sock = self._connect()
            except (OSError, ProtocolError, DaemonError) as exc:
                if isinstance(exc, DaemonError) and delay <= 0.05:  # it answered, and said no: say why, once a run
                    log.warning("cgpu: arbiterd refused this process (%s); retrying", exc)
                elif self.connects == 0 and delay <= 0.05:
                    log.warning("cgpu: cannot reach arbiterd at %s (%s); retrying", self.socket_path, exc)
                with self._state:
                    self._state.wait(delay)
                delay = min(delay * 2, self.backoff_max_s)
                continue
            delay = 0.05
            self._read_loop(sock)
            self._lost(sock)
            if not self._closing:
                log.warning("cgpu: lost arbiterd; reconnecting")

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(10.0)
            sock.connect(self.socket_path)
            decoder = Decoder()
            sock.sendall(hello("libcgpu_client").pack() + self.settings.register(0).pack())
            replies: list[Message] = []
            while len(replies) < 2:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("daemon closed the connection during the handshake")
                replies += [decode(raw, S2C) for raw in decoder.feed(data)]
                for r in replies:
                    if isinstance(r, Error):
                        raise DaemonError.of(r)
            welcome, reg = replies[:2]
            if not isinstance(welcome, Welcome) or not isinstance(reg, Registered):
                raise ProtocolError("bad_request", f"expected welcome and registered, got {welcome.OP}, {reg.OP}")
            self.registration = Registration.of(reg)
            for w in reg.warnings:
                log.warning("cgpu: %s", w)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._decoder = decoder
        with self._state:
            self._sock = sock
            self._connected = True
            self.connects += 1
            self._state.notify_all()
        for cb in list(self.on_connected):
            cb()
        return sock

    def _read_loop(self, sock: socket.socket) -> None:
        decoder = self._decoder
        # Wait in poll() rather than in recv(): a thread blocked in recv() on a UNIX stream
        # socket is also woken each time the daemon reads what this socket sent (a
        # write-space wake-up per request); poll() for input filters those out in the kernel.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            try:
                poller.poll()
                data = sock.recv(262144)
            except OSError:
                return
            if not data:
                return
            try:
                msgs = [decode(raw, S2C) for raw in decoder.feed(data)]
            except ProtocolError as exc:
                log.error("cgpu: bad frame from arbiterd (%s); reconnecting", exc.message)
                return
            for msg in msgs:
                self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Grant):
            lst = self.listeners.get(msg.gpu)
            if lst is not None:
                lst.on_grant(msg.lease, msg.deadline_ns)
        elif isinstance(msg, Revoke):
            lst = self.listeners.get(msg.gpu)
            if lst is not None:
                lst.on_revoke(msg.lease)
        else:
            rid = getattr(msg, "re", None)
            waiter = self._waiters.get(rid) if isinstance(rid, int) else None
            if waiter is not None:
                waiter.reply = msg
                waiter.event.set()
            elif isinstance(msg, Error):
                log.warning("cgpu: arbiterd: %s: %s", msg.code, msg.message)

    def _lost(self, sock: socket.socket) -> None:
        with self._state:
            if self._sock is not sock:
                return
            self._connected = False
            self._sock = None
            self._state.notify_all()
        with contextlib.suppress(OSError):
            sock.close()
        for waiter in list(self._waiters.values()):
            waiter.event.set()  # reply None: the request is sent again
        for lst in list(self.listeners.values()):
            lst.on_reset()

    # ----------------------------------------------------------------- memory
    def mem_reserve(self, gpu: int, nbytes: int) -> tuple[bool, int, int, str]:
        """Reserve ``nbytes`` on ``gpu``: (granted, instance's use, its limit, why not)."""
        r = self.request(lambda rid: MemReserve(rid, gpu, nbytes))
        if isinstance(r, Denied):
            return False, r.used, r.limit, r.reason
        assert isinstance(r, Ok)
        return True, r.used or 0, r.limit or 0, ""

    def mem_free(self, gpu: int, nbytes: int) -> None:
        self.request(lambda rid: MemFree(gpu, nbytes, rid))

    def mem_query(self, gpu: int) -> tuple[int, int]:
        """The instance's memory use and limit on ``gpu``."""
        r = self.request(lambda rid: MemQuery(rid, gpu))
        assert isinstance(r, Ok)
        return r.used or 0, r.limit or 0

    def stats(self) -> list[dict[str, object]]:
        r = self.request(lambda rid: Stats(rid))
        assert isinstance(r, StatsReply)
        return r.gpus


def wait_for_socket(path: str, timeout: float) -> bool:
    """True once something accepts connections at ``path`` (used by tools and tests)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return True
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    return False
