"""The state file: written atomically (temp file, fsync, rename), read at start."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("arbiterd.state")
STATE_FILE = "state.json"


def _tmp_of(path: Path) -> Path:
    """The temporary file a write of ``path`` goes through: beside it, named after it and this process."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write_synced(path: Path, data: bytes, flags: int = 0) -> None:
    """Create or truncate ``path`` (mode 0600), write ``data`` whole and fsync it. Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomic(path: Path, data: bytes) -> None:
    """Put ``data`` at ``path`` so that a crash leaves the old file or the new one: a temporary file beside it,
    written whole and synced, renamed over it. Raises OSError, the old file in place and no temporary left."""
    tmp = _tmp_of(path)
    try:
        _write_synced(tmp, data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def sync_dir(directory: Path) -> None:
    """fsync ``directory``, so that a rename in it survives a crash. Raises OSError."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_atomic(path: Path, data: bytes) -> None:
    """:func:`replace_atomic`, then its directory synced (raises OSError if that fails too): the device plugin's
    and the DRA plugin's records, whose writers treat an unsynced rename as a failed save."""
    replace_atomic(path, data)
    sync_dir(path.parent)


class StateStore:
    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    @staticmethod
    def encode(doc: dict[str, Any]) -> bytes:
        """The file's bytes for ``doc``."""
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def save(self, doc: dict[str, Any]) -> None:
        """Write ``doc`` atomically. Raises OSError (nothing half-written) on failure; a directory that cannot be
        synced afterwards is only logged (the file is in place)."""
        replace_atomic(self.path, self.encode(doc))
        try:
            sync_dir(self.dir)
        except OSError as exc:
            log.warning("state: could not fsync %s: %s", self.dir, exc.strerror)

    def check_writable(self, size: int) -> None:
        """Raise OSError unless the temporary file :meth:`save` writes can be made, ``size`` bytes written to it
        and synced now: asked before a change that must be saved is made, so that one that could not be is
        refused instead (a full disk, a read-only mount, a file in the way)."""
        probe = self._tmp()
        try:
            _write_synced(probe, bytes(size), os.O_NOFOLLOW)
        finally:
            if not probe.is_dir():
                probe.unlink(missing_ok=True)

    def _tmp(self) -> Path:
        return _tmp_of(self.path)

    def load(self) -> tuple[Any | None, str | None]:
        """(document, problem). A missing file is (None, None); an unreadable one is set aside."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"state file {self.path} cannot be read: {exc.strerror}"
        try:
            return json.loads(text), None
        except ValueError as exc:
            return None, self.set_aside(f"not valid JSON ({exc})")

    def keep_copy(self, why: str) -> str:
        """Copy the state file beside itself (``state.json.bad-<time>``), leaving it in place; the problem."""
        bad = self.path.with_name(f"{STATE_FILE}.bad-{int(time.time())}")
        try:
            data = self.path.read_bytes()
            fd = os.open(bad, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return f"state file {self.path}: {why}; the rest is in force, and the file as it was is kept as {bad}"
        except OSError as exc:
            return f"state file {self.path}: {why}; the rest is in force (no copy made: {exc.strerror})"

    def set_aside(self, why: str) -> str:
        bad = self.path.with_name(f"{STATE_FILE}.bad-{int(time.time())}")
        try:
            os.replace(self.path, bad)
            return f"state file {self.path} is unusable ({why}); moved to {bad}; starting with defaults"
        except OSError as exc:
            return f"state file {self.path} is unusable ({why}) and could not be moved: {exc.strerror}"
