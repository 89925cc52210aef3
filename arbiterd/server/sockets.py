"""The daemon's listening sockets and the admin token on disk."""

from __future__ import annotations

import grp
import os
import secrets
import socket
from pathlib import Path


class StartupError(Exception):
    """The daemon could not start (one-line reason)."""


def bind_unix(path: Path, mode: int, group: str | None) -> socket.socket:
    """A listening UNIX socket at ``path``; a stale socket file is replaced, a live one refused."""
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
        else:
            raise StartupError(f"{path} is in use: is another arbiterd running?")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    if group is not None:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except (KeyError, OSError) as exc:
            sock.close()
            path.unlink(missing_ok=True)
            raise StartupError(f"cannot give {path} to group {group}: {exc}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def load_token(path: Path) -> str:
    """The bearer token of the TCP admin listener, created (mode 0600) on first use."""
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
