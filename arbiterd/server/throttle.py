"""``unmanaged = throttle``: the offender's container is scheduled as a tenant and frozen outside its turns.

For each container with an unmanaged process on a GPU the throttle connects a
:class:`Proxy` to the hub, as a client of that container's instance would (its
provisioned weight, else the GPU's default), and keeps it asking for the GPU.
When the scheduler grants the proxy a lease, the container's cgroup is thawed;
at the lease's deadline, or at a revoke, it is frozen and the lease given back
(asking again at once: it keeps its place in the round). Frozen, its processes
cannot submit GPU work. What it queued before the freeze still runs: at each
poll the throttle reads NVML's per-process utilization of the frozen
offender's processes and bills that time to its instance
(:meth:`~arbiterd.core.arbiter.Arbiter.charge_outside`), so its next turns come
later and its share converges to its entitlement.

The freeze goes through the cgroup freezer (v1 ``freezer.state``, v2
``cgroup.freeze``), which works on every driver and needs no help from the
process; ``cuCheckpointProcessLock`` (drivers >= 550) is not used: see
docs/behaviour.md §10 for why. A host process (no container) is not frozen: its
cgroup is the host's (a user's session, a system service), so it is reported,
with one log line saying to kill it or allow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cgpu_protocol as p
from arbiterd.core.containment import GpuProcess
from arbiterd.core.errors import CoreError
from arbiterd.server import identity
from arbiterd.server.cgroups import CgroupFs, outermost_container

Samples = dict[int, list[tuple[int, int]]]  # pid -> (time stamp us since the epoch, SM %), as ProcessSource.busy

log = logging.getLogger("arbiterd.containment")
_IDS = itertools.count(1)


def freezer_of(proc_root: Path, pid: int, fs: CgroupFs) -> Path | None:
    """The file that freezes the container cgroup of ``pid``: its v1 ``freezer.state``, else its v2
    ``cgroup.freeze``; None when it is in no container or neither can be found."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for want, name in (("freezer", "freezer.state"), ("", "cgroup.freeze")):
        for _, controllers, path in lines:
            if want not in controllers.split(",") and not (want == "" and controllers == ""):
                continue
            found = outermost_container(path)
            if found is None:
                continue
            where = fs.directory(controllers, found[1])
            if where is not None and (where[0] / name).exists():
                return where[0] / name
    return None


def set_frozen(path: Path, frozen: bool) -> int:
    """Freeze or thaw through ``path`` (freezer.state or cgroup.freeze); how long the write took (ns), or -1 when
    it failed (logged)."""
    value = ("FROZEN" if frozen else "THAWED") if path.name == "freezer.state" else ("1" if frozen else "0")
    t0 = time.monotonic_ns()
    try:
        path.write_text(value)
    except OSError as exc:
        log.error("cannot %s %s: %s", "freeze" if frozen else "thaw", path.parent, exc.strerror)
        return -1
    return time.monotonic_ns() - t0


class Freezer:
    """One container cgroup's freezer, shared by the proxies (one per GPU) that throttle it: thawed only while every
    one of them holds a turn, thawed for good when the last leaves. It keeps when it was frozen (monotonic ns), for
    the billing of what ran while frozen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.turns: dict[int, bool] = {}  # a proxy's cid -> whether it holds a turn now
        self.frozen = False
        self.stretches: list[list[int]] = []  # [since, until] frozen (until 0: still frozen), oldest first

    def set(self, cid: int, turn: bool) -> int:
        """Proxy ``cid`` holds a turn (or not); what the write took (ns, 0: none needed), -1 where it failed."""
        self.turns[cid] = turn
        return self._apply(not all(self.turns.values()))

    def leave(self, cid: int) -> int:
        self.turns.pop(cid, None)
        return self._apply(bool(self.turns) and not all(self.turns.values()))

    def _apply(self, frozen: bool) -> int:
        if frozen == self.frozen:
            return 0
        took = set_frozen(self.path, frozen)
        if took < 0 and frozen:
            set_frozen(self.path, False)  # a v2 write may fail half-way: never left frozen unknown
            return took
        now = time.monotonic_ns()
        if frozen:
            self.stretches.append([now, 0])
        elif self.stretches:
            self.stretches[-1][1] = now
        self.frozen = frozen
        return took

    def frozen_within(self, since: int, until: int) -> list[tuple[int, int]]:
        """The stretches frozen between ``since`` and ``until`` (ns); older ones are forgotten."""
        self.stretches = [st for st in self.stretches if st[1] == 0 or st[1] > since]
        return [(max(a, since), min(b or until, until)) for a, b in self.stretches
                if a < until and (b or until) > since]


class Proxy:
    """A client of the hub that stands for an offender's container: its turns thaw it, the rest freeze it."""

    proxy = True  # not a managed process: the hub's list of managed pids leaves it out

    def __init__(self, hub: Any, gpu: int, who: identity.Peer, freezer: Freezer,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.hub, self.gpu, self.peer, self.freezer, self.loop = hub, gpu, who, freezer, loop
        self.pid, self.uid = who.pid, who.uid
        self.instance: str | None = None
        self.lease: int | None = None
        self.granted_at = 0
        self.cost_ns = 0  # of the lease held: the thaw's and the freeze's writes, which the tenant cannot use
        self.timer: asyncio.TimerHandle | None = None
        self.frozen_since: int | None = None
        self.closed = False
        self.cid = hub.attach(self)
        # a managed client of the container may hold a lease on this GPU now: frozen, it could not give it back
        # (the lease would be cut off overrun_ms late), so the freeze waits for it, as at the end of a turn
        self.held = self._held_in_container(who.container)
        if self.held is None:
            took = freezer.set(self.cid, False)
        else:  # probed with a thaw instead (harmless: no other proxy freezes it yet), frozen once it is given back
            took = set_frozen(freezer.path, False) if not freezer.turns else 0
            freezer.set(self.cid, True)
        if took < 0:
            self.close()
            raise OSError(f"cannot freeze {freezer.path.parent}")
        if self.held is None:
            self.frozen_since = time.monotonic_ns()

    def _held_in_container(self, container: str | None) -> int | None:
        """A lease on this GPU that a managed client in ``container`` holds, if any."""
        peers = self.hub.peers
        for lease in self.hub.arbiter.scheds[self.gpu].holders():
            for cid in lease.clients:
                peer = peers.get(cid)
                if cid != self.cid and peer is not None and peer.peer.container == container:
                    return int(lease.id)
        return None

    def start(self) -> None:
        """Register as the container's instance and ask for the GPU (raises CoreError when refused); where a managed
        client held a lease when it came, frozen once that is given back unless the turn came first."""
        self.hub.serve(self, p.Register(next(_IDS), None, [self.gpu]), time.monotonic_ns())
        self.hub.serve(self, p.Acquire(self.gpu), time.monotonic_ns())
        if self.held is not None:
            self._freeze_after(self.held, time.monotonic_ns() + self.hub.arbiter.scheds[self.gpu].overrun_ns)

    def send(self, msg: p.Message) -> None:
        if self.closed:
            return
        if isinstance(msg, p.Grant):
            self._granted(msg)
        elif isinstance(msg, p.Revoke) and msg.lease == self.lease:
            self.loop.call_soon(self._turn_over)

    def _granted(self, msg: p.Grant) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if msg.lease != self.lease:
            self.granted_at, self.cost_ns = time.monotonic_ns(), 0
        self.lease = msg.lease
        if self.frozen_since is not None:
            self.cost_ns += max(0, self.freezer.set(self.cid, True))
            self.frozen_since = None
        self.timer = self.loop.call_at(msg.deadline_ns / 1e9, self._turn_over)

    def _turn_over(self) -> None:
        """The turn ended (its deadline, or a revoke): freeze, give the lease back, and ask again. Where managed
        clients of the same instance share the lease, it is given back first and the freeze waits for them to
        give it back too (frozen, they could not: the lease would be cut off ``overrun_ms`` late)."""
        if self.closed or self.lease is None:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        lease, shared = self.lease, self._shared(self.lease)
        if not shared:
            self.cost_ns += max(0, self.freezer.set(self.cid, False))
            self.frozen_since = time.monotonic_ns()  # before the release, which may grant the next turn at once
        now = time.monotonic_ns()
        self.lease = None
        used = max(0, now - self.granted_at - self.cost_ns)  # its hand-over: what the freezer's writes took
        with contextlib.suppress(CoreError):
            self.hub.serve(self, p.Release(self.gpu, lease, used, again=True), now)
        if shared:
            self._freeze_after(lease, now + self.hub.arbiter.scheds[self.gpu].overrun_ns)

    def _shared(self, lease: int) -> bool:
        """Whether another client (a managed process of this container's instance) holds ``lease`` too."""
        holders = self.hub.arbiter.scheds[self.gpu].holders()
        return any(held.id == lease and held.clients - {self.cid} for held in holders)

    def _freeze_after(self, lease: int, until: int) -> None:
        """Freeze once nobody holds ``lease`` (or at ``until``), unless a new turn came first."""
        if self.closed or self.lease is not None or self.frozen_since is not None:
            return
        if self._shared(lease) and time.monotonic_ns() < until:
            self.timer = self.loop.call_later(0.001, self._freeze_after, lease, until)
            return
        self.freezer.set(self.cid, False)
        self.frozen_since = time.monotonic_ns()

    def close(self) -> None:
        """Stop throttling: thaw for good and leave the hub."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.freezer.leave(self.cid)
        self.hub.detach(self.cid)


def thaw_left(record: Path) -> None:
    """Thaw what a daemon that died while throttling left frozen (its record of what it froze), once, at start."""
    try:
        paths = record.read_text().split("\n")
    except OSError:
        return
    for line in filter(None, paths):
        path = Path(line)
        ours = path.name in ("freezer.state", "cgroup.freeze") and outermost_container(str(path.parent)) is not None
        if ours and set_frozen(path, False) >= 0:
            log.warning("thawed %s, left frozen by a daemon that stopped while it throttled it", path.parent)
    record.unlink(missing_ok=True)


class Throttle:
    """The proxies of the offenders' containers, per GPU, kept in step with what NVML shows; ``record``: where the
    freezer files of the containers it throttles are listed, so that the next daemon thaws them if this one dies."""

    def __init__(self, hub: Any, loop: asyncio.AbstractEventLoop, busy: Callable[[int], Samples],
                 record: Path | None = None) -> None:
        self.hub, self.loop, self.busy, self.record = hub, loop, busy, record
        self.proxies: dict[tuple[int, str], Proxy] = {}  # (gpu, container id) -> its proxy
        self.pids: dict[tuple[int, str], set[int]] = {}
        self.told: set[tuple[int, int]] = set()  # (gpu, pid) of host processes already logged
        self.failed: set[tuple[int, str]] = set()  # (gpu, container) that could not be frozen: reported only
        self.charged_ns: dict[int, int] = {}  # gpu -> GPU time billed for work that ran while frozen
        self.freezers: dict[Path, Freezer] = {}  # one per container cgroup, shared by its proxies on every GPU
        self.last_poll: dict[int, int] = {}

    def throttled(self, gpu: int) -> set[int]:
        return {pid for key, pids in self.pids.items() if key[0] == gpu and key in self.proxies for pid in pids}

    def poll(self, gpu: int, now: int, unmanaged: list[GpuProcess], throttling: bool) -> None:
        """What NVML's poll of ``gpu`` showed unmanaged; ``throttling``: the GPU's setting is throttle."""
        want: dict[str, list[GpuProcess]] = {}
        listed = {(gpu, proc.pid) for proc in unmanaged}
        self.told = {k for k in self.told if k[0] != gpu or k in listed}
        for proc in unmanaged if throttling else []:
            if proc.container is None:
                if (gpu, proc.pid) not in self.told:
                    self.told.add((gpu, proc.pid))
                    log.warning("GPU %d: pid %d is a host process: throttle freezes containers only; kill it or "
                                "allow it (unmanaged_allow)", gpu, proc.pid)
                continue
            want.setdefault(proc.container, []).append(proc)
        self._charge(gpu, now)
        gone = [k for k in self.proxies if k[0] == gpu and k[1] not in want]
        for key in gone:
            self.proxies.pop(key).close()
            self.pids.pop(key, None)
        self.freezers = {path: f for path, f in self.freezers.items() if f.turns}
        new = [c for c in want if (gpu, c) not in self.proxies]
        self.failed = {k for k in self.failed if k[0] != gpu or k[1] in want}
        for container, procs in want.items():
            self.pids[(gpu, container)] = {pr.pid for pr in procs}
            if container in new and (gpu, container) not in self.failed:
                self._start(gpu, container, procs[0])
        if gone or new:
            self._write_record()

    def _write_record(self, also: Path | None = None) -> None:
        """List the freezer files of the proxies, and ``also`` (one about to be frozen), in the record."""
        if self.record is None:
            return
        paths = [p.freezer.path for p in self.proxies.values()] + ([also] if also is not None else [])
        text = "".join(f"{path}\n" for path in dict.fromkeys(paths))
        try:
            tmp = self.record.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.record)
        except OSError as exc:
            log.error("cannot write %s: %s", self.record, exc.strerror)

    def _start(self, gpu: int, container: str, proc: GpuProcess) -> None:
        resolver = self.hub.identity
        freezer = freezer_of(resolver.proc_root, proc.pid, resolver.fs)
        if freezer is None:
            self.failed.add((gpu, container))
            log.error("GPU %d: container %s (pid %d): no freezer cgroup found; it is reported, not throttled",
                      gpu, container[:12], proc.pid)
            return
        started = identity.start_time(proc.pid)
        if (proc.started is not None and started != proc.started) or container not in str(freezer.parent):
            return  # its pid went to another process, or it moved, since NVML's poll: the next poll tells
        who = identity.Peer(proc.pid, 0, container, None, started)
        self._write_record(also=freezer)  # before the freeze: a daemon killed now leaves it listed, to be thawed
        try:
            proxy = Proxy(self.hub, gpu, who, self.freezers.setdefault(freezer, Freezer(freezer)), self.loop)
        except OSError:  # logged by set_frozen; tried again only once its offender is gone and back
            self.failed.add((gpu, container))
            return
        try:
            proxy.start()
        except Exception as exc:  # refused (CoreError) or anything else: never left frozen and unlisted
            log.error("GPU %d: container %s cannot be scheduled as a tenant (%s); it is reported, not throttled",
                      gpu, container[:12], exc)
            proxy.close()
            self.failed.add((gpu, container))
            return
        self.proxies[(gpu, container)] = proxy
        log.warning("GPU %d: throttling container %s (pid %d) as instance %s: frozen outside its turns", gpu,
                    container[:12], proc.pid, proxy.instance)

    def _charge(self, gpu: int, now: int) -> None:
        """Bill each frozen offender's instance for the GPU time NVML saw its processes use since the last poll."""
        since = self.last_poll.get(gpu)
        self.last_poll[gpu] = now
        busy = self.busy(gpu)
        if since is None:
            return
        wall = time.time_ns() - time.monotonic_ns()  # NVML stamps its samples in us since the epoch
        for key, proxy in self.proxies.items():
            if key[0] != gpu or proxy.instance is None:
                continue
            stretches = proxy.freezer.frozen_within(since, now)
            frozen_for = sum(b - a for a, b in stretches)
            pct = 0
            for pid in self.pids.get(key, ()):
                within = [sm for us, sm in busy.get(pid, ()) if any(a <= us * 1000 - wall <= b for a, b in stretches)]
                pct += sum(within) // len(within) if within else 0
            ns = frozen_for * min(100, pct) // 100
            if ns > 0:
                self.hub.arbiter.charge_outside(gpu, proxy.instance, ns)
                self.charged_ns[gpu] = self.charged_ns.get(gpu, 0) + ns

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        self.proxies.clear()
        self.freezers.clear()
        self.pids.clear()
        if self.record is not None:
            self.record.unlink(missing_ok=True)
