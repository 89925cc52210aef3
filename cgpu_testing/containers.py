"""Containers for tests and benchmarks: real container cgroups where this runs as root, else a fake ``/proc``.

:class:`Containers` puts a process in a container: a real cgroup (``/docker/<64 hex>`` under the cgroup v1 pids
hierarchy or cgroup v2) when this runs as root and a hierarchy is writable, else an entry of a fake ``/proc`` that
the daemon reads through ``--proc-root`` (where every other peer, host processes included, must have an entry too:
:meth:`Containers.place` writes one). The fake kubelet writes its containers' entries with :func:`fake_cgroup`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
_HIERARCHIES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
FREEZER = Path("/sys/fs/cgroup/freezer")
V2 = Path("/sys/fs/cgroup")


def fake_cgroup(proc_root: Path, pid: int, cgroup: str) -> None:
    """In a fake /proc that arbiterd reads through ``--proc-root``: give process ``pid`` the cgroup file
    ``cgroup`` (its lines, ``N:controllers:/path``; a bare path is a cgroup v2 line), and make each of its cgroups'
    directories, owned by this user, in a fake cgroup fs beside it, mounted as the fake /proc's mount table says
    (arbiterd checks who made a container's cgroup: arbiterd/server/cgroups.py)."""
    fs = proc_root.parent / f"{proc_root.name}-cgroupfs"
    mountinfo = proc_root / "self" / "mountinfo"
    mountinfo.parent.mkdir(parents=True, exist_ok=True)
    table = mountinfo.read_text() if mountinfo.exists() else ""
    lines = [line if ":" in line else f"0::{line}" for line in cgroup.strip().splitlines()]
    for line in lines:
        _, controllers, path = line.split(":", 2)
        name = controllers or "unified"
        point = fs / name.replace("=", "_").replace(",", "_")
        if f" {point} " not in table:
            kind = f"cgroup cgroup rw,{controllers}" if controllers else "cgroup2 cgroup2 rw"
            table += f"{30 + table.count(chr(10))} 23 0:26 / {point} rw,relatime - {kind}\n"
        (point / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    mountinfo.write_text(table)
    entry = proc_root / str(pid)
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "cgroup").write_text("".join(line + "\n" for line in lines))


def writable_hierarchy() -> Path | None:
    """A cgroup hierarchy where this process may make container groups (root only), if any."""
    if not IS_ROOT:
        return None
    for base in _HIERARCHIES:
        probe = base / "docker" / ("f" * 64)
        try:
            probe.mkdir(parents=True, exist_ok=True)
            (probe / "cgroup.procs").stat()
            probe.rmdir()
            return base
        except OSError:
            continue
    return None


def give_cgroup(group: Path, uid: int) -> None:
    """Make cgroup dir ``group`` (and those above it that are missing) and hand it to ``uid``, as systemd delegates
    ``user@<uid>.service`` to its user: that user may then make cgroups under it and move its processes there."""
    group.mkdir(parents=True, exist_ok=True)
    os.chown(group, uid, uid)
    for name in ("cgroup.procs", "tasks"):
        if (group / name).exists():
            os.chown(group / name, uid, uid)


def remove_cgroups(*groups: Path) -> None:
    """Remove cgroup dirs, deepest first, ending any process still in one."""
    for group in groups:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                with contextlib.suppress(OSError, ValueError):
                    for pid in (group / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.02)


class Containers:
    """Puts processes into containers: real cgroups where it can, else a fake /proc for the daemon to read."""

    def __init__(self, tmp: Path, freezer: bool = False) -> None:
        self.hierarchy = writable_hierarchy()
        self.real = self.hierarchy is not None
        self.proc_root = tmp / "proc"
        self.made: list[Path] = []
        # with freezer, a container is also a group of the cgroup v1 freezer hierarchy (where there is one; on
        # cgroup v2 the one hierarchy freezes): unmanaged = throttle freezes it
        self.freezer = FREEZER if freezer and self.real and FREEZER.is_dir() and self.hierarchy != V2 else None

    def daemon_args(self) -> list[str]:
        return [] if self.real else ["--proc-root", str(self.proc_root)]

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(32)

    def place(self, pid: int, cid: str | None) -> None:
        """Put process ``pid`` in container ``cid`` (None: leave it on the host)."""
        if self.hierarchy is not None:
            if cid is None:
                return
            for base in (self.hierarchy, self.freezer):
                if base is None:
                    continue
                group = base / "docker" / cid
                group.mkdir(parents=True, exist_ok=True)
                if group not in self.made:
                    self.made.append(group)
                (group / "cgroup.procs").write_text(str(pid))
            return
        fake_cgroup(self.proc_root, pid, f"/docker/{cid}" if cid else "/user.slice/user-0.slice")

    def cleanup(self) -> None:
        """Remove the cgroups made, ending any process still in one (a child an agent forked, say); a frozen one is
        thawed first, so its processes can die."""
        for group in self.made:
            with contextlib.suppress(OSError):
                (group / "freezer.state").write_text("THAWED")
        remove_cgroups(*self.made)
        if self.freezer is not None:
            with contextlib.suppress(OSError):  # the freezer's docker/ too, once no test has a container in it
                (self.freezer / "docker").rmdir()
