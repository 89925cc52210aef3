"""Which container a process is in, believed only where no user could have made it up.

A line of ``/proc/<pid>/cgroup`` names a cgroup; the container runtimes name
theirs after the container (``/docker/<64 hex>``, ``docker-<id>.scope``,
``cri-containerd-<id>.scope``, ``crio-<id>.scope``, kubepods, podman). Two
things are checked, because a name alone proves nothing:

* **Who made it.** A user to whom a cgroup subtree is delegated (systemd gives
  every user ``user@<uid>.service``, and ``systemd-run --user --scope -u
  docker-<id>.scope`` makes one in a step) can make a cgroup with any such name
  under it and move itself there. So a container's cgroup counts only if it and
  every directory above it, up to the hierarchy's mount, are owned by root (or
  by the daemon's own user, which is trusted anyway): the runtimes create
  container cgroups as root, and a delegated subtree belongs to its user. A
  rootless container, whose cgroup its user owns, is that user's process.
* **Which one is the container.** A container whose cgroup is writable to it
  (systemd inside it, a private cgroup namespace) can make cgroups under its
  own, named after another container or owned by nobody, and move into them.
  So the container is the *outermost* directory of the path named after one:
  what lies below it, whatever its name or owner, is inside that container.

Where each hierarchy is mounted comes from ``<proc>/self/mountinfo`` (cgroup v1:
the mount whose options name the line's controllers; v2: the ``cgroup2``
mount), read again when a line names a hierarchy it did not list.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# each names a container by the last directory of a path (matched at its end, so that the outermost wins)
_CONTAINER_PATTERNS = [
    re.compile(r"/docker/([0-9a-f]{64})\Z"),
    re.compile(r"/docker-([0-9a-f]{64})\.scope\Z"),
    re.compile(r"/cri-containerd-([0-9a-f]{64})\.scope\Z"),
    re.compile(r"/crio-(?:conmon-)?([0-9a-f]{64})\.scope\Z"),
    re.compile(r"/kubepods[^/]*(?:/[^/]+)*/pod[0-9a-f_-]+/([0-9a-f]{64})\Z"),
    re.compile(r"/libpod-([0-9a-f]{64})\.scope\Z"),
]
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class Mount:
    controllers: frozenset[str] | None  # cgroup v1: its controllers (and name=...); None: cgroup v2
    root: str  # the path within the hierarchy that is mounted
    point: Path


def outermost_container(path: str) -> tuple[str, str] | None:
    """(container id, the path of its cgroup) for the outermost directory of cgroup ``path`` named after a
    container, if any."""
    parts = path.rstrip("/").split("/")
    for end in range(2, len(parts) + 1):
        prefix = "/".join(parts[:end])
        for pat in _CONTAINER_PATTERNS:
            m = pat.search(prefix)
            if m:
                return m.group(1), prefix
    return None


def container_in(path: str) -> str | None:
    """The container id a cgroup path is named after (its outermost such directory), if any."""
    found = outermost_container(path)
    return found[0] if found is not None else None


def pod_uid_in(path: str) -> str | None:
    """The pod UID in a kubepods cgroup path (``kubepods-pod<uid>.slice`` or ``/kubepods/.../pod<uid>/``)."""
    if "kubepods" in path:
        m = _POD.search(path)
        if m:
            return m.group(1).replace("_", "-")
    return None


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(Mount(None, fields[3], point))
        else:
            opts = frozenset(o for o in tail[2].split(",") if o not in ("rw", "ro"))
            mounts.append(Mount(opts, fields[3], point))
    return mounts


class CgroupFs:
    """The host's cgroup hierarchies, as this daemon's mount table shows them."""

    def __init__(self, proc_root: Path) -> None:
        self.mountinfo = proc_root / "self" / "mountinfo"
        self.mounts: list[Mount] = []
        self.trusted = {0, os.geteuid()}
        self.reload()

    def reload(self) -> None:
        try:
            self.mounts = parse_mountinfo(self.mountinfo.read_text())
        except OSError:
            self.mounts = []

    def directory(self, controllers: str, path: str) -> tuple[Path, Path] | None:
        """(the cgroup's directory, its hierarchy's mount point) for a line's controllers and path."""
        want = None if controllers == "" else frozenset(controllers.split(","))
        for again in (False, True):
            if again:
                self.reload()
            for m in self.mounts:
                if want is None and m.controllers is not None:
                    continue
                if want is not None and (m.controllers is None or not want <= m.controllers):
                    continue
                root = m.root.rstrip("/")
                if path == root or path.startswith(root + "/"):
                    return m.point / path[len(root):].lstrip("/"), m.point
        return None

    def root_made(self, controllers: str, path: str) -> bool:
        """Whether the cgroup of a line, and every directory above it to its mount, belongs to root (or to this
        daemon's user): so no other user made it."""
        found = self.directory(controllers, path)
        if found is None:
            return False
        d, top = found
        try:
            while True:
                if os.stat(d).st_uid not in self.trusted:
                    return False
                if d == top or top not in d.parents:
                    return d == top
                d = d.parent
        except OSError:
            return False


def container_of(text: str, fs: CgroupFs | None) -> tuple[str | None, str | None]:
    """(container id, pod UID) of the content of a ``/proc/<pid>/cgroup`` file: from the first line whose
    outermost directory named after a container was made by root (``fs`` None: unchecked). The pod UID comes
    from the container's own path."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        found = outermost_container(path)
        if found is not None and (fs is None or fs.root_made(controllers, found[1])):
            return found[0], pod_uid_in(found[1])
    return None, None
