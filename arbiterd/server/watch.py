"""The edge of containment: read NVML, map each process to its instance, carry out what the core decides.

Every ``nvml_poll_ms`` the daemon calls :meth:`Watcher.poll`: for each GPU it
reads the processes NVML lists, tells each one's instance from its cgroup (as a
client's is told: arbiterd/server/identity.py), whether it is a connected
client of cgpu, and whether the operator exempted it (``unmanaged_allow``: its
executable, or a cgroup it is in or below); hands that to the core
(arbiterd/core/containment.py) and logs, kills and throttles as it answers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiterd.core.containment import HOST, Containment, GpuProcess, Kill
from arbiterd.core.effects import NS_PER_S
from arbiterd.core.errors import CoreError, IdentityError
from arbiterd.core.settings import UNMANAGED
from arbiterd.server.identity import IdentityResolver, host_instance, start_time
from arbiterd.server.nvml import ProcessSource

log = logging.getLogger("arbiterd.containment")


def allow_list(text: str | None) -> tuple[str, ...]:
    """The entries of ``unmanaged_allow``."""
    return tuple(p.strip().rstrip("/") or "/" for p in (text or "").split(",") if p.strip())


def exempt(entries: tuple[str, ...], exe: str, cgroups: list[str], in_container: bool, root_run: bool = False) -> bool:
    """Whether a process whose executable is ``exe`` and whose cgroup paths are ``cgroups`` is allowed. An
    executable counts for a host process run by root from a root-owned file no one else may write (``root_run``)
    only: a container may ship any path (the host reads a container's executable as the container names it), and
    any user may run a system binary with LD_PRELOAD."""
    by_exe = root_run and not in_container
    return any((exe == e and by_exe) or e == "/" or any(c == e or c.startswith(e + "/") for c in cgroups)
               for e in entries)


def root_run(base: Path) -> bool:
    """Whether the process at ``base`` (/proc/<pid>) runs as root, from a root-owned executable that neither its
    group nor others may write."""
    try:
        proc, exe = os.stat(base), os.stat(base / "exe")
    except OSError:
        return False
    return proc.st_uid == 0 and exe.st_uid == 0 and not exe.st_mode & 0o022


CLIENT_GRACE_NS = 30 * NS_PER_S  # a process that held a registered connection this lately counts as managed

Key = tuple[int, "int | None"]  # a process: its pid and its start time (boot ticks), told from a later user of the pid


class RecentClients:
    """The processes that held a registered connection to arbiter.sock in the last ``CLIENT_GRACE_NS``.

    Managed means registered: a process is a client of cgpu while it holds a registered connection (the hub's
    peers), and for this grace after its last one closed, while it reconnects (a daemon restart, a dropped
    connection: the shim's backoff is at most 2 s). A connection that was refused, or never registered, changes
    nothing: a process that only connects now and then is work that bypasses cgpu, and is contained as such.
    Entries past the grace are dropped by :meth:`prune`, which the daemon calls every second."""

    def __init__(self) -> None:
        self.seen: dict[Key, int] = {}  # (pid, start time) -> when it last registered or closed a registered one (ns)

    def saw(self, pid: int, started: int | None, now: int | None = None) -> None:
        """Process ``pid``, which started at ``started`` (boot ticks, as told at accept: at a close the pid may
        already be another process's), registered a connection, or closed a registered one, at ``now``."""
        if pid > 0:
            self.seen[(pid, started)] = time.monotonic_ns() if now is None else now

    def prune(self, now: int) -> None:
        """Forget the processes last seen more than the grace before ``now``."""
        for key in [k for k, t in self.seen.items() if now - t > CLIENT_GRACE_NS]:
            del self.seen[key]

    def keys(self, now: int) -> set[Key]:
        """The processes seen within the grace window before ``now`` (older ones are forgotten)."""
        self.prune(now)
        return set(self.seen)


class Watcher:
    """Polls one :class:`ProcessSource` for the hub's GPUs."""

    def __init__(self, source: ProcessSource, resolver: IdentityResolver, containment: Containment,
                 managed: Callable[[int], dict[Key, str | None]], limit: Callable[[int, str], int | None],
                 settings: Callable[[int], Any], allow: Callable[[], str | None]) -> None:
        self.source = source
        self.resolver = resolver
        self.containment = containment
        self.managed = managed  # now -> (pid, start time) -> instance, of the registered clients and RecentClients
        self.limit = limit  # (gpu, instance) -> its memory limit (its memsize, default_memsize, or the device)
        self.settings = settings  # gpu -> its GpuSettings
        self.allow = allow
        self.proc = resolver.proc_root
        self.utilization: dict[int, int | None] = {}
        self.throttle: Any = None  # the throttle (arbiterd/server/throttle.py), where one runs
        self.cannot: set[tuple[int, int]] = set()  # (gpu, pid) a kill failed for, logged once
        self.in_host_ns: bool | None = None  # whether arbiterd sees the host's pids (told at the first action)

    def poll(self, gpus: list[int], now: int | None = None) -> None:
        now = time.monotonic_ns() if now is None else now
        managed = self.managed(now)
        entries = allow_list(self.allow())
        for gpu in gpus:
            procs = [self.describe(pid, used, managed, entries) for pid, used in self.source.processes(gpu).items()]
            self.utilization[gpu] = self.source.utilization(gpu)
            seen = self.containment.observe(gpu, now, procs, self.settings(gpu), functools.partial(self.limit, gpu))
            for p in seen.new:
                log.warning("GPU %d: unmanaged process pid %d (%s) of instance %s, %d MiB: it runs GPU work "
                            "without cgpu", gpu, p.pid, p.exe or "?", p.instance, p.used >> 20)
            for b in seen.breaches:
                log.warning("GPU %d: instance %s uses %d MiB, over its limit of %d MiB (memsize and the context "
                            "allowance) past memory_grace_ms", gpu, b.instance, b.used >> 20, b.limit >> 20)
            for k in seen.kills:
                self.kill(k)
            if self.throttle is not None:
                throttling = UNMANAGED[self.settings(gpu).unmanaged] == "throttle" and self.host_pids()
                self.throttle.poll(gpu, now, seen.actionable, throttling)

    def throttled(self, gpu: int) -> set[int]:
        """The pids the throttle holds frozen outside their turns on GPU ``gpu``."""
        return self.throttle.throttled(gpu) if self.throttle is not None else set()

    def describe(self, pid: int, used: int, managed: dict[Key, str | None], entries: tuple[str, ...]) -> GpuProcess:
        """Process ``pid`` as the core sees it: its instance, managed or not, exempt or not."""
        base = self.proc / str(pid)
        exe = ""
        with contextlib.suppress(OSError):
            exe = os.readlink(base / "exe")
        cgroups = _cgroup_paths(base)
        instance, container = HOST, None
        try:
            uid = os.stat(base).st_uid
            peer = self.resolver.peer(pid, uid, accepted=start_time(pid))
            container = peer.container
            try:
                instance = self.resolver.identify(peer, None).instance
            except CoreError:
                instance = host_instance(uid) if container is None else instance
        except (OSError, IdentityError):
            pass  # it exited, or its cgroup cannot be read: HOST
        allowed = bool(entries) and exempt(entries, exe, cgroups, container is not None, root_run(base))
        started = start_time(pid)
        client = managed.get((pid, started))  # a registered client's instance is its connection's, as it registered
        return GpuProcess(pid, used, client or instance, (pid, started) in managed, allowed, container, exe, started)

    def kill(self, k: Kill) -> None:
        """SIGKILL through a pidfd of the process, once its start time still says it is the one meant; never the
        daemon itself, and nothing outside the host's pid namespace (NVML's pids are the host's)."""
        if k.pid == os.getpid() or not self.host_pids():
            return
        try:
            fd = os.pidfd_open(k.pid)
        except ProcessLookupError:
            return
        except OSError as exc:
            self._cannot(k, exc)
            return
        try:
            if k.started is None or start_time(k.pid) != k.started:
                return  # it exited and its pid went to another process
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError as exc:
            self._cannot(k, exc)
            return
        finally:
            os.close(fd)
        self.containment.killed(k)
        log.warning("GPU %d: killed pid %d: %s", k.gpu, k.pid, k.why)

    def host_pids(self) -> bool:
        """Whether the daemon runs in the host's pid namespace (logged once where it does not: it reports only)."""
        if self.in_host_ns is None:
            self.in_host_ns = _host_pid_namespace()
            if not self.in_host_ns:
                log.error("arbiterd is not in the host's pid namespace: NVML's pids are not its own, so nothing is "
                          "killed or throttled (unmanaged and memory_enforce act as report); run it with hostPID")
        return self.in_host_ns

    def _cannot(self, k: Kill, exc: OSError) -> None:
        if (k.gpu, k.pid) not in self.cannot:  # once a process: it is tried again at every poll
            self.cannot.add((k.gpu, k.pid))
            log.error("GPU %d: cannot kill pid %d: %s (arbiterd needs CAP_KILL for other users' processes)",
                      k.gpu, k.pid, exc.strerror)


HOST_PID_NS = 4026531836  # the inode of the initial pid namespace (PROC_PID_INIT_INO)


def _host_pid_namespace() -> bool:
    """Whether this process is in the host's (the initial) pid namespace. Pid 1's namespace is no test: in a
    container, pid 1 is the container's own init."""
    try:
        return os.readlink("/proc/self/ns/pid") == f"pid:[{HOST_PID_NS}]"
    except OSError:
        return False


def _cgroup_paths(base: Path) -> list[str]:
    try:
        text = (base / "cgroup").read_text()
    except OSError:
        return []
    return [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
