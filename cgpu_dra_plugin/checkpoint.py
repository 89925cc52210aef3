"""The plugin's record of the claims it prepared, on disk, so a restarted plugin loses nothing.

Under ``state_dir`` (0700):

* ``checkpoint.json``: claim UID -> namespace, name, the pod labels of the container it serves,
  and per allocated device its arbiterd allocation (id, card, memory, cores, weight, high
  priority) and CDI device id; written
  atomically (temp file, fsync, rename, fsync of the directory) before arbiterd is asked, so a
  crash leaves a record to finish or undo, never an allocation nobody knows;
* ``<ALLOC_ID>/token`` (dir 0755, file 0444): 32 random bytes as hex. The CDI spec mounts the
  directory read-only into the container; arbiterd knows only the token's SHA-256 and binds
  the allocation to the first container that presents it (as the device plugin does).

Allocation ids are ``dra-`` and 12 hex digits of SHA-256(claim UID / request / device): the
same claim always names the same allocation, so a kubelet retry cannot create a second one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from arbiterd.core import podlabels
from arbiterd.core.errors import SettingError
from arbiterd.core.podlabels import PodLabels
from arbiterd.server.persist import write_atomic
from cgpu_device_plugin.store import token_digest

log = logging.getLogger("cgpu_dra_plugin.checkpoint")
ALLOC_ID = re.compile(r"dra-[0-9a-f]{12}")
CHECKPOINT = "checkpoint.json"
TOKEN_FILE = "token"


def alloc_id(claim_uid: str, request: str, device: str) -> str:
    return "dra-" + hashlib.sha256(f"{claim_uid}/{request}/{device}".encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Prepared:
    """One allocated device of a claim, as prepared on this node."""

    alloc_id: str
    request: str
    pool: str
    device: str
    gpu: int
    uuid: str
    memory: int  # bytes
    cores: int  # percent consumed (reserved on the card)
    enforce_cores: bool  # the core percentage is a cap in arbiterd (ShareConfig limits)
    weight: int
    high_priority: bool
    cdi_id: str
    limit: int = 0  # the most GPU time (%) it may use (ShareConfig limit); 0: none


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    devices: tuple[Prepared, ...]
    prepared_at: float
    labels: PodLabels | None = None  # the container it serves (claims.consumer); None: not known

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "prepared_at": self.prepared_at,
                "devices": [asdict(d) for d in self.devices], "labels": self.labels.to_json() if self.labels else None}

    @classmethod
    def from_json(cls, uid: str, d: dict[str, Any]) -> ClaimRecord:
        try:
            labels = podlabels.from_json(d.get("labels"))
        except SettingError as exc:
            raise ValueError(str(exc)) from None
        return cls(uid, str(d["namespace"]), str(d["name"]), tuple(Prepared(**x) for x in d["devices"]),
                   float(d["prepared_at"]), labels)


class Checkpoint:
    """Claim records in memory, mirrored to ``checkpoint.json`` on every change (disk first, so a failed
    write changes nothing). The caller locks."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / CHECKPOINT
        self.claims: dict[str, ClaimRecord] = {}

    def load(self) -> None:
        """Read the checkpoint; an unreadable one is moved aside (logged) and the plugin starts empty."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        try:
            raw = json.loads(self.path.read_text())
            claims = [ClaimRecord.from_json(k, v) for k, v in raw["claims"].items()]
        except FileNotFoundError:
            claims = []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_name(f"{CHECKPOINT}.bad-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("checkpoint %s is unreadable (%s); moved it to %s and starting empty (the first resync rebuilds "
                      "the records of claims still allocated here)", self.path, exc, aside)
            claims = []
        self.claims = {c.uid: c for c in claims}

    def _save(self, claims: dict[str, ClaimRecord]) -> None:
        write_atomic(self.path, json.dumps({"version": 1, "claims": {
            k: c.to_json() for k, c in sorted(claims.items())}}, indent=1).encode())

    def put(self, record: ClaimRecord) -> None:
        """Record ``record`` on disk, then in memory: if the write fails (OSError) nothing changed."""
        claims = {**self.claims, record.uid: record}
        self._save(claims)
        self.claims = claims

    def drop(self, uid: str) -> ClaimRecord | None:
        """Forget ``uid`` on disk, then in memory (OSError: nothing changed); its record, or None."""
        rec = self.claims.get(uid)
        if rec is not None:
            claims = {k: v for k, v in self.claims.items() if k != uid}
            self._save(claims)
            self.claims = claims
        return rec

    def alloc_ids(self) -> set[str]:
        return {d.alloc_id for c in self.claims.values() for d in c.devices}

    # ------------------------------------------------------------ token directories
    def alloc_path(self, alloc: str) -> Path:
        if not ALLOC_ID.fullmatch(alloc):
            raise ValueError(f"not an allocation id of this plugin: {alloc!r}")
        return self.dir / alloc

    def token(self, alloc: str) -> str:
        """The digest of ``alloc``'s token, making the token first if there is none."""
        path = self.alloc_path(alloc)
        with contextlib.suppress(FileNotFoundError):
            return token_digest((path / TOKEN_FILE).read_text())
        shutil.rmtree(path, ignore_errors=True)  # a directory left without its token by a crash
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)
        content = secrets.token_hex(32)
        fd = os.open(path / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.fchmod(fd, 0o444)
            os.write(fd, (content + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return token_digest(content)

    def remove_dir(self, alloc: str) -> None:
        shutil.rmtree(self.alloc_path(alloc), ignore_errors=True)

    def stray_dirs(self) -> list[str]:
        """Token directories no record owns (a crash between making one and recording it)."""
        known = self.alloc_ids()
        return sorted(p.name for p in self.dir.iterdir()
                      if p.is_dir() and ALLOC_ID.fullmatch(p.name) and p.name not in known)
