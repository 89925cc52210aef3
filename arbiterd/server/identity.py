"""Who a client is: fixed from the kernel's word when it connects, never from what it says.

At accept, the daemon takes the peer's PID and uid from ``SO_PEERCRED`` and
reads that PID's cgroup (under an injectable /proc). The read is guarded
against a reused PID: the kernel's pidfd for the peer (``SO_PEERPIDFD``,
Linux 6.5+) pins the process while its cgroup is read, and elsewhere the
process's start time must predate the accept and be the same before and after
the read. The process must also be *live* once its cgroup has been read: not a
zombie, not dead, and not exiting (``/proc/<pid>/stat``'s state and
``PF_EXITING``). On cgroup v1 the kernel shows an exiting task's cgroups as
``/``, and a pidfd still answers for a zombie, so a container child that
connected and exited unreaped would otherwise pass for a host process while
its parent spoke on the connection. A peer whose cgroup cannot be read (it
exited, the PID was reused, it is leaving, /proc is hidden) is refused: it is
never taken for a host process. A cgroup
named after a container counts only if root made it (cgroups.py): a user
cannot name a cgroup of its own after a container and become it.

At ``register``:

* a process in a container *is* its container: its instance id is the
  container id (docker, containerd, CRI-O, podman and kubepods forms), and a
  declared id that disagrees is refused;
* a process outside every container (a *host* process) is ``uid-<uid>``, or
  an instance an operator provisioned for its uid (``inst_ctl create NAME
  uid=N``); any other declared id is refused, so no host user can act as a
  container, squat an id, use another uid's instance, or make instances of its
  own to take more of a GPU. ``host_clients = "refuse"`` refuses host
  processes altogether;
* with ``identity = "declared"`` (development hosts only) the declared id is
  taken as given, as it was before identities were checked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from arbiterd.core.errors import IdentityError
from arbiterd.core.names import valid_instance_id
from arbiterd.server.cgroups import CgroupFs, container_in, container_of, pod_uid_in

SHORT_ID = 12  # docker ps shows 12 characters; the tree uses the same
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5+; Python 3.11 does not name it
HOST_CLIENTS = ("allow", "refuse")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a connection, as the kernel said when it connected."""

    pid: int
    uid: int
    container: str | None = None  # the full container id, for a process in a container
    pod: str | None = None  # the kubelet's pod UID, for a container of a pod
    started: int | None = None  # its start time (clock ticks since boot), to tell it from a later user of its PID
    # what per-tenant bounds count by: the container (short id), or uid-<uid> for a host process (set from the above)
    tenant: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", self.container[:SHORT_ID] if self.container else host_instance(self.uid))


@dataclass(frozen=True, slots=True)
class Identity:
    instance: str
    container: str | None = None  # the full container id, for a process in a container
    pod: str | None = None  # the kubelet's pod UID, for a container of a pod
    host_uid: int | None = None  # a host process under identity = cgroup: its uid (its settings are the defaults)


def host_instance(uid: int) -> str:
    """The instance of a host process of ``uid`` that declares none."""
    return f"uid-{uid}"


def container_id_from_cgroup(text: str) -> str | None:
    """The container id a ``/proc/<pid>/cgroup`` file's content is named after, if any (unchecked: see
    :meth:`IdentityResolver.peer` for who made it)."""
    for line in text.splitlines():
        cid = container_in(line.split(":", 2)[-1])
        if cid is not None:
            return cid
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a kubepods cgroup path (``kubepods-pod<uid>.slice`` or ``/kubepods/.../pod<uid>/``)."""
    for line in text.splitlines():
        pod = pod_uid_in(line.split(":", 2)[-1])
        if pod is not None:
            return pod
    return None


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process that identity depends on."""

    state: str  # field 3: R, S, D, ... ; Z (a zombie) and X (dead) are no longer the process that connected
    flags: int  # field 9: the kernel's PF_* flags
    started: int  # field 22: its start time in clock ticks since boot

    @property
    def live(self) -> bool:
        """Neither dead, a zombie, nor exiting: on cgroup v1 the kernel shows an exiting task's cgroups as ``/``
        (``cgroup_exit`` runs in ``do_exit`` after ``PF_EXITING`` is set, and before the task is a zombie)."""
        return self.state not in "ZXx" and not self.flags & PF_EXITING


PF_EXITING = 0x00000004  # include/linux/sched.h: "getting shut down"


def proc_stat(pid: int) -> ProcStat | None:
    """Process ``pid``'s state, flags and start time (``/proc/<pid>/stat``), None if it is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()  # the name in brackets may hold spaces and brackets
    try:  # these start at field 3
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[6]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """Process ``pid``'s start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), None if gone."""
    st = proc_stat(pid)
    return st.started if st is not None else None


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/<pid>/stat`` counts a start time in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)


def peer_pidfd(sock: socket.socket | None) -> int | None:
    """A pidfd of the process that connected ``sock`` (SO_PEERPIDFD), or None where the kernel has none."""
    if sock is None:
        return None
    try:
        fd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; we may not signal it
    return True


class IdentityResolver:
    def __init__(self, mode: str = "cgroup", proc_root: str = "/proc", host_clients: str = "allow") -> None:
        self.mode = mode
        self.proc_root = Path(proc_root)
        self.host_clients = host_clients
        self.fs = CgroupFs(self.proc_root)

    def _cgroup(self, pid: int) -> str:
        """The cgroup file of ``pid``; raises OSError when it cannot be read."""
        return (self.proc_root / str(int(pid)) / "cgroup").read_text()

    def peer(self, pid: int, uid: int, pidfd: int | None = None, accepted: int | None = None) -> Peer:
        """Who connected: process ``pid`` of ``uid`` (SO_PEERCRED), with the kernel's ``pidfd`` for it if any,
        accepted at ``accepted`` (boot ticks, default now). Raises IdentityError when that cannot be told:
        under ``identity = "declared"`` such a peer is a host process instead."""
        try:
            return self._peer(pid, uid, pidfd, boot_ticks() if accepted is None else accepted)
        except IdentityError:
            if self.mode == "declared":
                return Peer(pid, uid)
            raise
        finally:
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(pidfd)

    def _peer(self, pid: int, uid: int, pidfd: int | None, accepted: int) -> Peer:
        if pid <= 0:
            raise IdentityError("the kernel gave no PID for this peer; its cgroup cannot be read")
        before = start_time(pid)
        if before is None or (pidfd is None and before > accepted):
            raise IdentityError(f"pid {pid} exited (or its PID was reused) before its cgroup could be read")
        try:
            text = self._cgroup(pid)
        except OSError as exc:
            raise IdentityError(f"pid {pid}: its cgroup cannot be read ({exc.strerror or exc})") from None
        after = proc_stat(pid)  # read after the cgroup: a process that is live now was live while it was read
        if after is None or after.started != before or (pidfd is not None and not _alive(pidfd)):
            raise IdentityError(f"pid {pid} exited (or its PID was reused) while its cgroup was read")
        if not after.live:
            raise IdentityError(f"pid {pid} is exiting or a zombie (state {after.state}): a process that is leaving "
                                f"no longer shows its cgroup, so who it is cannot be told")
        cid, pod = container_of(text, self.fs)
        return Peer(pid, uid, cid, pod, before)

    def still_there(self, peer: Peer) -> bool:
        """Whether the process that connected is still the one with its PID (for reads made after accept)."""
        return peer.started is None or start_time(peer.pid) == peer.started

    def identify(self, peer: Peer, declared: str | None,
                 provisioned_uid: Callable[[str], int | None] = lambda name: None) -> Identity:
        """The instance of ``peer``, which declared ``declared`` (may be None). ``provisioned_uid(name)``: the
        host uid an operator provisioned instance ``name`` for, if any."""
        if declared is not None:
            valid_instance_id(declared)
        if self.mode == "declared":
            return Identity(declared if declared is not None else f"pid-{peer.pid}", peer.container, peer.pod)
        if peer.container is not None:
            short = peer.container[:SHORT_ID]
            if declared is not None and declared not in (peer.container, short):
                raise IdentityError(f"pid {peer.pid} is in container {short}; it may not act as {declared}")
            if provisioned_uid(short) is not None:
                raise IdentityError(f"instance {short} is not yours: it is provisioned for a host user, and "
                                    f"container {short} may not use it")
            return Identity(short, peer.container, peer.pod)
        if self.host_clients == "refuse":
            raise IdentityError(f"pid {peer.pid} (uid {peer.uid}) is not in a container, and this daemon serves "
                                f"containers only (host_clients = refuse)")
        own = host_instance(peer.uid)
        if declared is None:
            return Identity(own, host_uid=peer.uid)
        owner = provisioned_uid(declared)
        if owner == peer.uid or (owner is None and declared == own):
            return Identity(declared, host_uid=peer.uid)
        why = ("it is not yours: it is provisioned for another user" if owner is not None
               else f"a host process may act only as {own} or an instance provisioned for uid {peer.uid} "
                    f"(inst_ctl create {declared} uid={peer.uid})")
        raise IdentityError(f"pid {peer.pid} (uid {peer.uid}) is not in a container; it may not act as "
                            f"{declared}: {why}")
