"""Containment: what to do about GPU work NVML sees that did not come through cgpu, and memory past a limit.

Plain code on the daemon's clock, as the rest of the core: each poll of NVML
(arbiterd/server/watch.py does the reading and the acting) hands :meth:`Containment.observe`
the processes with a context on one GPU, each already mapped to its instance and
marked managed (a connected client of cgpu) or exempt (the operator's allow-list),
and gets back what to do: the processes first seen unmanaged (one log line each),
the processes to kill and why, and the instances newly over their memory limit.

- ``unmanaged`` (per GPU): ``allow`` ignores them; ``report`` lists them; ``kill``
  kills each at the second poll that sees it; ``throttle`` leaves them to the
  throttle (arbiterd/server/throttle.py), which schedules the offender's container
  as a tenant and freezes it outside its turns.
- ``memory_enforce`` (per GPU): an instance whose processes use more than its
  limit plus their context allowance (:func:`context_allowance`) for longer than
  ``memory_grace_ms`` is reported (``report``) or loses its largest process
  (``kill``), as the kernel's OOM killer chooses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from arbiterd.core.effects import NS_PER_MS, NS_PER_S
from arbiterd.core.settings import MEMORY_ENFORCE, UNMANAGED, GpuSettings

HOST = "host"  # the instance of a host process that is no client (no uid instance is made for it)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process NVML lists on one GPU, as the server mapped it."""

    pid: int
    used: int  # bytes of GPU memory NVML says it uses (its CUDA context included)
    instance: str  # its container's short id, uid-<uid>, or HOST
    managed: bool = False  # a connected client of cgpu
    exempt: bool = False  # on the operator's allow-list (unmanaged_allow)
    container: str | None = None  # its full container id, if it is in one
    exe: str = ""
    started: int | None = None  # its start time (boot ticks): a later process with its pid is another


@dataclass(frozen=True, slots=True)
class Kill:
    gpu: int
    pid: int
    instance: str
    reason: str  # "unmanaged" or "memory"
    why: str  # one line for the log
    started: int | None = None  # the start time of the process meant: re-checked before the signal


@dataclass(frozen=True, slots=True)
class Breach:
    """An instance over its memory limit (NVML's count) past the grace period."""

    gpu: int
    instance: str
    used: int
    limit: int  # its memsize plus the allowance of its processes


@dataclass(slots=True)
class Seen:
    """What one poll of one GPU showed and what it led to."""

    unmanaged: list[GpuProcess] = field(default_factory=list)  # every unmanaged process now (exempt ones not)
    actionable: list[GpuProcess] = field(default_factory=list)  # those of them the setting acts on now
    new: list[GpuProcess] = field(default_factory=list)  # first seen at this poll
    kills: list[Kill] = field(default_factory=list)
    breaches: list[Breach] = field(default_factory=list)  # newly past the grace period
    memory: dict[str, int] = field(default_factory=dict)  # bytes per instance, every process of it counted


START_GRACE_NS = 5 * NS_PER_S  # after a start, clients reconnect (their backoff is at most 2 s): nothing is acted on


class Containment:
    """The daemon's memory of what NVML showed: who was first seen when, who has been over since when.

    An unmanaged process is acted on (killed, or throttled) only once it was unmanaged at an earlier poll too (a
    client between its context and its registration is not), and not in the first ``START_GRACE_NS`` after the
    daemon started (``started``), while the clients of the daemon before it reconnect."""

    def __init__(self, started: int = -START_GRACE_NS) -> None:
        self.started = started
        self.first_seen: dict[tuple[int, int, int | None], int] = {}  # (gpu, pid, start) unmanaged -> when (ns)
        self.over_since: dict[tuple[int, str], int] = {}  # (gpu, instance) over its limit -> since when (ns)
        self.reported: set[tuple[int, str]] = set()  # breaches already reported (once per stretch over)
        self.kills: Counter[tuple[int, str]] = Counter()  # (gpu, reason) -> processes killed
        self.breaches: Counter[int] = Counter()  # gpu -> breaches past the grace period
        self.last: dict[int, Seen] = {}  # gpu -> the last poll's outcome
        self.dying: set[tuple[int, int, int | None]] = set()  # (gpu, pid, start) killed and still listed (NVML lags)

    def observe(self, gpu: int, now: int, procs: Iterable[GpuProcess], settings: GpuSettings,
                limit: Callable[[str], int | None]) -> Seen:
        """One poll of GPU ``gpu`` at ``now``: ``procs`` on it; ``limit(instance)``: its memory limit in bytes
        (None: none)."""
        procs = list(procs)
        seen = Seen(memory=_memory(procs))
        self._unmanaged(gpu, now, procs, settings, seen)
        self._memory(gpu, now, procs, settings, limit, seen)
        self.last[gpu] = seen
        return seen

    def _unmanaged(self, gpu: int, now: int, procs: list[GpuProcess], settings: GpuSettings, seen: Seen) -> None:
        mode = UNMANAGED[settings.unmanaged]
        here = set()
        for proc in procs:
            if proc.managed or proc.exempt or mode == "allow":
                continue
            key = (gpu, proc.pid, proc.started)
            here.add(key)
            seen.unmanaged.append(proc)
            if key not in self.first_seen:
                self.first_seen[key] = now
                seen.new.append(proc)
            if self.first_seen[key] == now or now - self.started < START_GRACE_NS:
                continue
            seen.actionable.append(proc)
            if mode == "kill" and key not in self.dying:
                seen.kills.append(Kill(gpu, proc.pid, proc.instance, "unmanaged",
                                       f"pid {proc.pid} ({proc.exe or '?'}, instance {proc.instance}) runs GPU work "
                                       f"without cgpu on GPU {gpu} (unmanaged = kill)", proc.started))
        for key in [k for k in self.first_seen if k[0] == gpu and k not in here]:
            del self.first_seen[key]
        listed = {(gpu, p.pid, p.started) for p in procs}
        self.dying = {k for k in self.dying if k[0] != gpu or k in listed}

    def _memory(self, gpu: int, now: int, procs: list[GpuProcess], settings: GpuSettings,
                limit: Callable[[str], int | None], seen: Seen) -> None:
        counts = Counter(p.instance for p in procs)
        over = set()
        for inst, used in seen.memory.items():
            cap = limit(inst)
            if cap is None:
                continue
            cap += context_allowance([p for p in procs if p.instance == inst], settings.memory_allowance)
            key = (gpu, inst)
            if used <= cap:
                continue
            over.add(key)
            since = self.over_since.setdefault(key, now)
            if now - since < settings.memory_grace_ms * NS_PER_MS:
                continue
            if key not in self.reported:
                self.reported.add(key)
                self.breaches[gpu] += 1
                seen.breaches.append(Breach(gpu, inst, used, cap))
            waiting = any((gpu, p.pid, p.started) in self.dying for p in procs if p.instance == inst)
            if MEMORY_ENFORCE[settings.memory_enforce] == "kill" and not waiting:  # as the OOM killer, one at a time
                big = max((p for p in procs if p.instance == inst and not p.exempt), key=lambda p: p.used,
                          default=None)
                if big is not None:
                    seen.kills.append(Kill(gpu, big.pid, inst, "memory",
                                           f"instance {inst} on GPU {gpu} uses {used} B, over its limit {cap} B "
                                           f"(memsize and the context allowance of its {counts[inst]} process(es)) for "
                                           f"{(now - since) // NS_PER_MS} ms: killing its largest process, pid "
                                           f"{big.pid} ({big.used} B) (memory_enforce = kill)", big.started))
        for key in [k for k in self.over_since if k[0] == gpu and k not in over]:
            del self.over_since[key]
            self.reported.discard(key)

    def killed(self, kill: Kill) -> None:
        """``kill`` was carried out (the process got SIGKILL): counted once, and not killed again while listed."""
        self.kills[(kill.gpu, kill.reason)] += 1
        self.dying.add((kill.gpu, kill.pid, kill.started))


def context_allowance(procs: list[GpuProcess], allowance: int) -> int:
    """What an instance whose processes on a GPU are ``procs`` may use beyond its limit for their CUDA contexts:
    each process counts what it uses up to ``allowance``, and the whole is at most one ``allowance`` per managed
    process (at least one): processes it starts outside cgpu add no room."""
    most = max(1, sum(p.managed for p in procs)) * allowance
    return min(most, sum(min(p.used, allowance) for p in procs))


def _memory(procs: list[GpuProcess]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for p in procs:
        out[p.instance] += p.used
    return dict(out)
