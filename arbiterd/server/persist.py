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


class StateStore:
    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    @staticmethod
    def encode(doc: dict[str, Any]) -> bytes:
        """The file's bytes for ``doc``."""
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def save(self, doc: dict[str, Any]) -> None:
        """Write ``doc`` atomically. Raises OSError (nothing half-written) on failure."""
        data = self.encode(doc)
        tmp = self._tmp()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        try:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            log.warning("state: could not fsync %s: %s", self.dir, exc.strerror)

    def check_writable(self, size: int) -> None:
        """Raise OSError unless the temporary file :meth:`save` writes can be made, ``size`` bytes written to it
        and synced now: asked before a change that must be saved is made, so that one that could not be is
        refused instead (a full disk, a read-only mount, a file in the way)."""
        probe = self._tmp()
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(bytes(size))
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            if not probe.is_dir():
                probe.unlink(missing_ok=True)

    def _tmp(self) -> Path:
        return self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"

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
