"""Who is a client? Its PID (SO_PEERCRED) and that PID's cgroup under an injectable /proc.

A process inside a container is the container: its instance id is the
container id found in ``/proc/<pid>/cgroup`` (docker, containerd, CRI-O and
kubepods path forms), and a declared id that disagrees is refused. A process
outside any container may declare its id (``CGPU_INSTANCE``). With
``identity = "declared"`` (development hosts) the declared id is always used.
"""

from __future__ import annotations

import re
from pathlib import Path

from arbiterd.core.arbiter import valid_instance_id
from arbiterd.core.errors import IdentityError

_CONTAINER_PATTERNS = [
    re.compile(r"/docker/([0-9a-f]{64})(?:/|$)"),
    re.compile(r"docker-([0-9a-f]{64})\.scope"),
    re.compile(r"cri-containerd-([0-9a-f]{64})\.scope"),
    re.compile(r"crio-(?:conmon-)?([0-9a-f]{64})\.scope"),
    re.compile(r"/kubepods[^\n]*/pod[0-9a-f_-]+/([0-9a-f]{64})(?:/|$)"),
    re.compile(r"/libpod-([0-9a-f]{64})\.scope"),
]
SHORT_ID = 12  # docker ps shows 12 characters; the tree uses the same


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the content of a ``/proc/<pid>/cgroup`` file, if any."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for pat in _CONTAINER_PATTERNS:
            m = pat.search(path)
            if m:
                return m.group(1)
    return None


class IdentityResolver:
    def __init__(self, mode: str = "cgroup", proc_root: str = "/proc") -> None:
        self.mode = mode
        self.proc_root = Path(proc_root)

    def container_of(self, pid: int) -> str | None:
        try:
            text = (self.proc_root / str(int(pid)) / "cgroup").read_text()
        except OSError:
            return None
        return container_id_from_cgroup(text)

    def resolve(self, pid: int, declared: str | None) -> str:
        """The instance id of process ``pid`` that declared ``declared`` (may be None)."""
        if declared is not None:
            valid_instance_id(declared)
        if self.mode == "declared":
            return declared if declared is not None else f"pid-{pid}"
        cid = self.container_of(pid)
        if cid is None:
            return declared if declared is not None else "host"
        short = cid[:SHORT_ID]
        if declared is not None and declared not in (cid, short):
            raise IdentityError(f"pid {pid} is in container {short}; it may not act as {declared}")
        return short
