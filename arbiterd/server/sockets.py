"""The daemon's directories, listening sockets and admin token, made so that no other user can take them over.

* A run or state directory is refused (sshd's StrictModes is the model) if it,
  or a directory above it, is owned by a user other than root and the daemon's
  own, or may be written by others without the sticky bit: such a user could
  swap a socket or plant a token.
* A socket is created with no permissions at all (umask 0777 around ``bind``),
  and its group and mode are then set through a descriptor opened on it with
  ``O_PATH | O_NOFOLLOW``: never through a path that a symlink could redirect.
* ``admin.token`` is read only if it is a regular file of the daemon's own user
  that nobody else may read or write; otherwise the daemon refuses to start.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import secrets
import socket
import stat
from pathlib import Path

log = logging.getLogger("arbiterd")
_NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH = getattr(os, "O_PATH", 0o10000000)


class StartupError(Exception):
    """The daemon could not start (one-line reason)."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def secure_dir(path: Path, mode: int, what: str) -> None:
    """Create ``path`` with ``mode`` if missing, then refuse it (StartupError, one line naming the directory and
    its owner) if it or a directory above it may be changed by a user other than root and this one."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"{what} {path}: {exc.strerror}") from None
    me = os.geteuid()
    real = path.resolve()
    for d in (real, *real.parents):
        try:
            st = os.stat(d)
        except OSError as exc:
            raise StartupError(f"{what} {path}: {d}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise StartupError(f"{what} {path}: {d} is not a directory")
        if st.st_uid not in (0, me):
            raise StartupError(f"{what} {path}: {d} is owned by {_owner(st.st_uid)}, not root or arbiterd's "
                               f"user; refusing to use it")
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise StartupError(f"{what} {path}: {d} (owner {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}) "
                               f"may be written by any user; refusing to use it")


def group_id(name: str) -> int | None:
    """The id of group ``name``, None if there is no such group."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def bind_unix(path: Path, mode: int, gid: int | None) -> socket.socket:
    """A listening UNIX socket at ``path`` with ``mode`` and group ``gid``; a stale socket file is replaced, a live
    one refused."""
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
    old = os.umask(0o777)  # the file is born with no permissions: nobody else connects before its mode is set
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    try:
        set_owner_mode(path, mode, gid)
    except OSError as exc:
        sock.close()
        path.unlink(missing_ok=True)
        raise StartupError(f"cannot set the group and mode of {path}: {exc.strerror}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def set_owner_mode(path: Path, mode: int, gid: int | None) -> None:
    """Set the group and mode of the socket file at ``path`` through a descriptor of it (never following a
    symlink): ``/proc/self/fd/N`` of an ``O_PATH | O_NOFOLLOW`` descriptor names that very file."""
    fd = os.open(path, _PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(0, f"{path} is not the socket just bound")
        via = f"/proc/self/fd/{fd}"
        if not os.path.exists(via):  # no /proc: the directory is checked, so the path is ours
            via = str(path)
        if gid is not None:
            os.chown(via, -1, gid, follow_symlinks=via != str(path))
        os.chmod(via, mode)
    finally:
        os.close(fd)


def load_token(path: Path) -> str:
    """The bearer token of the TCP admin listener, created (mode 0600) on first use. A token file that is not
    a regular file of this user, or that others may read or write, is refused (StartupError)."""
    try:
        fd = os.open(path, _NOFOLLOW_READ)
    except FileNotFoundError:
        return _new_token(path)
    except OSError as exc:
        raise StartupError(f"{path}: {exc.strerror} (a symlink is not followed)") from None
    with os.fdopen(fd, "r") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise StartupError(f"{path} is owned by {_owner(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}; "
                               f"a token another user planted or can read is refused: remove it to have a new one "
                               f"made")
        token = f.read(4096).strip()
    return token or _replace_token(path)


def _new_token(path: Path) -> str:
    token = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StartupError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def _replace_token(path: Path) -> str:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return _new_token(path)
