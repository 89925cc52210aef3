"""The plugin's record of the allocations it provisioned, and each allocation's token directory.

On disk, under ``alloc_dir``:

* ``state.json``: allocation id -> resource, device IDs, GPUs, sizes, and the pod labels the
  kubelet's PodResources API gave its container (mode 0600, written atomically: temp file,
  fsync, rename, fsync of the directory);
* ``<ALLOC_ID>/token`` (dir 0755, file 0444, inside ``alloc_dir`` 0700): 32 random bytes as hex. ``Allocate`` mounts
  the directory read-only into the container; arbiterd knows only the token's SHA-256, and
  binds the allocation to the first container that presents the token.

The kubelet never says when a container ends; the record of which device IDs an allocation
holds is how the plugin notices: when the kubelet hands those IDs out again, it is dead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiterd.core import podlabels
from arbiterd.core.errors import SettingError
from arbiterd.core.podlabels import PodLabels
from arbiterd.server.persist import write_atomic
from cgpu_device_plugin.devices import Resource

log = logging.getLogger("cgpu_device_plugin.store")
ALLOC_ID = re.compile(r"(?:mem|core)-[0-9a-f]{12}")
STATE_FILE = "state.json"
TOKEN_FILE = "token"


def new_alloc_id(resource: Resource) -> str:
    return f"{resource.value}-{secrets.token_hex(6)}"


def token_digest(content: str) -> str:
    """What arbiterd is told: the SHA-256 (hex) of the token file's stripped content."""
    return hashlib.sha256(content.strip().encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Record:
    alloc_id: str
    resource: Resource
    devices: tuple[str, ...]
    gpus: tuple[int, ...]
    memsize: tuple[int, ...]  # bytes per GPU (memory allocations)
    core: int  # percent (core allocations)
    created: float  # wall-clock seconds
    labels: PodLabels | None = None  # its container's pod, once PodResources named it (podresources.py)
    limit: int = 0  # its container's ceiling (%) from the pod's annotation (podlimits.py); 0: none

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource.value, "devices": list(self.devices), "gpus": list(self.gpus),
                "memsize": list(self.memsize), "core": self.core, "created": self.created,
                "labels": self.labels.to_json() if self.labels else None, "limit": self.limit}

    @classmethod
    def from_json(cls, alloc_id: str, d: dict[str, Any]) -> Record:
        try:
            labels = podlabels.from_json(d.get("labels"))
        except SettingError as exc:
            raise ValueError(str(exc)) from None
        return cls(alloc_id, Resource(d["resource"]), tuple(str(x) for x in d["devices"]),
                   tuple(int(x) for x in d["gpus"]), tuple(int(x) for x in d["memsize"]), int(d["core"]),
                   float(d["created"]), labels, int(d.get("limit", 0)))


class AllocationStore:
    """Records in memory, mirrored to ``state.json`` on every change. Not thread-safe: the allocator locks."""

    def __init__(self, alloc_dir: str | Path) -> None:
        self.dir = Path(alloc_dir)
        self.path = self.dir / STATE_FILE
        self._records: dict[str, Record] = {}
        self._owner: dict[str, str] = {}  # device ID -> allocation id

    # ------------------------------------------------------------ persistence
    def load(self) -> None:
        """Read ``state.json``; an unreadable one is moved aside (logged) and the store starts empty.

        ``alloc_dir`` itself is made 0700: each container sees only its own allocation's
        directory (a bind mount), and nobody on the host but root lists or reads the tokens.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        try:
            raw = json.loads(self.path.read_text())
            records = [Record.from_json(k, v) for k, v in raw["allocations"].items() if ALLOC_ID.fullmatch(k)]
        except FileNotFoundError:
            records = []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.bad-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("allocation state %s is unreadable (%s); moved it to %s and starting empty", self.path, exc,
                      aside)
            records = []
        self._records = {r.alloc_id: r for r in records}
        self._reindex()

    def _save(self) -> None:
        write_atomic(self.path, json.dumps({"version": 1, "allocations": {
            k: r.to_json() for k, r in sorted(self._records.items())}}, indent=1).encode())

    def _reindex(self) -> None:
        self._owner = {dev: r.alloc_id for r in self._records.values() for dev in r.devices}

    # ------------------------------------------------------------ records
    @property
    def records(self) -> dict[str, Record]:
        return dict(self._records)

    def get(self, alloc_id: str) -> Record | None:
        return self._records.get(alloc_id)

    def owners(self, device_ids: Iterable[str]) -> list[Record]:
        """The recorded allocations holding any of ``device_ids``."""
        ids = {self._owner[d] for d in device_ids if d in self._owner}
        return [self._records[i] for i in sorted(ids)]

    def add(self, record: Record) -> None:
        self._records[record.alloc_id] = record
        self._reindex()
        self._save()

    def set_labels(self, alloc_id: str, labels: PodLabels) -> None:
        """Record the pod of ``alloc_id``'s container (nothing if the record is gone meanwhile)."""
        rec = self._records.get(alloc_id)
        if rec is not None and rec.labels != labels:
            self._records[alloc_id] = dataclasses.replace(rec, labels=labels)
            self._save()

    def set_limit(self, alloc_id: str, limit: int) -> None:
        """Record the ceiling of ``alloc_id``'s container (nothing if the record is gone meanwhile)."""
        rec = self._records.get(alloc_id)
        if rec is not None and rec.limit != limit:
            self._records[alloc_id] = dataclasses.replace(rec, limit=limit)
            self._save()

    def remove(self, alloc_id: str) -> Record | None:
        """Forget ``alloc_id`` and delete its directory; the removed record, if there was one."""
        rec = self._records.pop(alloc_id, None)
        if rec is not None:
            self._reindex()
            self._save()
        self.remove_dir(alloc_id)
        return rec

    # ------------------------------------------------------------ token directories
    def alloc_path(self, alloc_id: str) -> Path:
        if not ALLOC_ID.fullmatch(alloc_id):
            raise ValueError(f"not an allocation id: {alloc_id!r}")
        return self.dir / alloc_id

    def create_token(self, alloc_id: str) -> str:
        """Make ``<alloc_dir>/<alloc_id>/token`` (dir 0755, file 0444); return the digest arbiterd gets."""
        path = self.alloc_path(alloc_id)
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)  # whatever the umask
        content = secrets.token_hex(32)
        fd = os.open(path / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.fchmod(fd, 0o444)
            os.write(fd, (content + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return token_digest(content)

    def token_sha(self, alloc_id: str) -> str:
        """The digest of an existing allocation's token (raises OSError if it is gone)."""
        return token_digest((self.alloc_path(alloc_id) / TOKEN_FILE).read_text())

    def remove_dir(self, alloc_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.alloc_path(alloc_id))

    def stray_dirs(self) -> list[str]:
        """Allocation directories with no record (a crash between making one and recording it)."""
        return sorted(p.name for p in self.dir.iterdir()
                      if p.is_dir() and ALLOC_ID.fullmatch(p.name) and p.name not in self._records)
