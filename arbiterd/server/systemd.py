"""systemd glue: sd_notify over NOTIFY_SOCKET and sockets passed by LISTEN_FDS."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("arbiterd.systemd")
SD_LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify datagrams; does nothing when NOTIFY_SOCKET is unset."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET")
        self.addr: str | None = None
        if addr:
            self.addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_usec = int(usec) if usec.isdigit() and (not pid or pid == str(os.getpid())) else 0
        self._sock: socket.socket | None = None

    def send(self, *lines: str) -> None:
        if self.addr is None:
            return
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(lines).encode(), self.addr)
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", self.addr, exc.strerror)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def listen_fds(env: dict[str, str] | None = None) -> dict[str, socket.socket]:
    """Sockets passed by the service manager, by FileDescriptorName (``arbiter``/``admin``)."""
    env = dict(os.environ) if env is None else env
    if env.get("LISTEN_PID") != str(os.getpid()):
        return {}
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        log.warning("LISTEN_FDS=%r is not a number; ignoring passed sockets", env.get("LISTEN_FDS"))
        return {}
    names = env.get("LISTEN_FDNAMES", "").split(":") if env.get("LISTEN_FDNAMES") else []
    out: dict[str, socket.socket] = {}
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        os.set_inheritable(fd, False)
        path = sock.getsockname()
        name = names[i] if i < len(names) else ""
        if not name or name == "unknown":
            name = "admin" if isinstance(path, str) and path.endswith("admin.sock") else "arbiter"
        out[name] = sock
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)
    return out
