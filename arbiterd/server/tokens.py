"""Reading allocation tokens inside a client's container, through ``<proc>/<pid>/root``.

The container owns everything under its root, so every step below
``<proc>/<pid>/root`` is opened relative to the previous one with
``O_NOFOLLOW``: a symlink the container planted (``/run/cgpu-alloc/x`` ->
a host path, which the host would resolve against *its* root) is skipped, never
followed. Only regular files of a few bytes are read. The daemon learns each
token's SHA-256, which is all the allocation book keeps.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("arbiterd")
TOKEN_FILE = "token"
MAX_ENTRIES = 32  # allocation dirs looked at per container
MAX_TOKEN = 512  # bytes; a token is 64 hex digits
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(slots=True)
class TokenScan:
    digests: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)  # what was not used, and why


def digest(text: bytes) -> str:
    """What ``alloc_ctl create token=`` names: the SHA-256 (hex) of the token's stripped text."""
    return hashlib.sha256(text.strip()).hexdigest()


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _read_token(dirfd: int, name: str, scan: TokenScan) -> None:
    sub = tok = None
    try:
        sub = os.open(name, _DIR, dir_fd=dirfd)
        tok = os.open(TOKEN_FILE, _FILE, dir_fd=sub)
        st = os.fstat(tok)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TOKEN:
            scan.skipped.append(f"{name}/{TOKEN_FILE}: not a small regular file")
            return
        scan.digests.add(digest(os.read(tok, MAX_TOKEN + 1)))
    except OSError as exc:
        scan.skipped.append(f"{name}: {exc.strerror or exc} (symlinks are not followed)")
    finally:
        _close(tok)
        _close(sub)


def _first_names(fd: int, n: int) -> list[str]:
    """The first ``n`` names of the directory open as ``fd``, in the order the file system lists them: read
    lazily and never sorted, so a container that fills its directory with a million entries costs the loop one
    batch of ``getdents``, not the whole listing."""
    with os.scandir(fd) as it:
        return [entry.name for entry in itertools.islice(it, n)]


def scan(proc_root: str | Path, pid: int, mount: str) -> TokenScan:
    """The token digests under ``mount`` (an absolute path) in process ``pid``'s root."""
    out = TokenScan()
    fd: int | None = None
    try:
        fd = os.open(Path(proc_root) / str(int(pid)) / "root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for part in (p for p in mount.split("/") if p):
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        names = _first_names(fd, MAX_ENTRIES + 1)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # a container with no allocation dir is normal
            out.skipped.append(f"{mount}: {exc.strerror or exc}")
        _close(fd)
        return out
    try:
        for name in names[:MAX_ENTRIES]:
            _read_token(fd, name, out)
        if len(names) > MAX_ENTRIES:
            out.skipped.append(f"{mount}: more entries than the first {MAX_ENTRIES}, which alone are read")
    finally:
        os.close(fd)
    return out
