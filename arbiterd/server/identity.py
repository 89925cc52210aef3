"""Who is a client? Its PID (SO_PEERCRED) and that PID's cgroup under an injectable /proc.

A process inside a container is the container: its instance id is the
container id found in ``/proc/<pid>/cgroup`` (docker, containerd, CRI-O and
kubepods path forms), and a declared id that disagrees is refused. A process
outside any container may declare its id (``CGPU_INSTANCE``). With
``identity = "declared"`` (development hosts) the declared id is always used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
SHORT_ID = 12  # docker ps shows 12 characters; the tree uses the same


@dataclass(frozen=True, slots=True)
class Identity:
    instance: str
    container: str | None = None  # the full container id, for a process in a container
    pod: str | None = None  # the kubelet's pod UID, for a container of a pod


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the content of a ``/proc/<pid>/cgroup`` file, if any."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for pat in _CONTAINER_PATTERNS:
            m = pat.search(path)
            if m:
                return m.group(1)
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a kubepods cgroup path (``kubepods-pod<uid>.slice`` or ``/kubepods/.../pod<uid>/``)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" in path:
            m = _POD.search(path)
            if m:
                return m.group(1).replace("_", "-")
    return None


class IdentityResolver:
    def __init__(self, mode: str = "cgroup", proc_root: str = "/proc") -> None:
        self.mode = mode
        self.proc_root = Path(proc_root)

    def _cgroup(self, pid: int) -> str:
        try:
            return (self.proc_root / str(int(pid)) / "cgroup").read_text()
        except OSError:
            return ""

    def container_of(self, pid: int) -> str | None:
        return container_id_from_cgroup(self._cgroup(pid))

    def identify(self, pid: int, declared: str | None) -> Identity:
        """Who process ``pid``, which declared the instance ``declared`` (may be None), is."""
        if declared is not None:
            valid_instance_id(declared)
        if self.mode == "declared":
            return Identity(declared if declared is not None else f"pid-{pid}")
        text = self._cgroup(pid)
        cid = container_id_from_cgroup(text)
        if cid is None:
            return Identity(declared if declared is not None else "host")
        short = cid[:SHORT_ID]
        if declared is not None and declared not in (cid, short):
            raise IdentityError(f"pid {pid} is in container {short}; it may not act as {declared}")
        return Identity(short, cid, pod_uid_from_cgroup(text))

    def resolve(self, pid: int, declared: str | None) -> str:
        """The instance id of process ``pid`` that declared ``declared`` (may be None)."""
        return self.identify(pid, declared).instance
