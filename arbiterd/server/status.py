"""The status document, built in one place from typed records.

``GET /v1/status``, ``cgpu-smi``, the metrics and the client ``stats`` reply
all read a :class:`DaemonStatus`. Shares over a window come from
:class:`History`, one sample of every counter a second.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from arbiterd import __version__
from arbiterd.core.arbiter import Arbiter, GpuInfo
from arbiterd.core.containment import Containment
from arbiterd.core.effects import NS_PER_S
from arbiterd.core.policies import POLICY_NAMES
from arbiterd.core.settings import GPU
from arbiterd.server.realtime import describe

SCHEMA_VERSION = 1
HISTORY = 61  # one sample a second: enough for the 60 s window
WINDOWS = {"1s": NS_PER_S, "60s": 60 * NS_PER_S}


class Counters(NamedTuple):
    """One instance's cumulative counters on one GPU, in ns."""

    held: int
    delivered: int  # useful time: held less its hand-overs
    entitled: float
    owed: float  # entitled while it had demand
    demand: int


@dataclass(frozen=True, slots=True)
class Sample:
    t: int
    inst: dict[tuple[int, str], Counters]
    busy: dict[int, int]


def counters(arb: Arbiter, gpu: int, name: str, now: int) -> Counters:
    sched = arb.scheds[gpu]
    entitled, owed, demand = sched.entitlement(name, now)
    return Counters(sched.held_ns(name, now), sched.useful_ns(name, now), entitled, owed, demand)


class History:
    """Counters sampled once a second, to compute shares over the last 1 s and 60 s."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=HISTORY)

    def sample(self, arb: Arbiter, now: int) -> None:
        inst = {(g, n): counters(arb, g, n, now) for (g, n) in arb.records}
        busy = {g: s.busy_ns(now) for g, s in arb.scheds.items()}
        self.samples.append(Sample(now, inst, busy))

    def past(self, now: int, age_ns: int, key: tuple[int, str] | None = None) -> Sample | None:
        """The newest sample at least ``age_ns`` old (or the oldest there is); with ``key``, among those
        that have that instance (a window of an instance younger than it is its whole life)."""
        best = first = None
        for sample in self.samples:
            if key is not None and key not in sample.inst:
                continue
            if first is None:
                first = sample
            if now - sample.t >= age_ns:
                best = sample
        return best if best is not None else first


@dataclass(slots=True)
class Fairness:
    """One instance over one window: what it was entitled to and delivered, in % of the window."""

    entitled_pct: float | None
    delivered_pct: float | None
    demand_pct: float | None
    error_pp: float | None  # delivered less owed (entitled while it had demand); None without demand


def fairness(now: Counters, then: Counters | None, span: int) -> Fairness:
    if then is None or span <= 0:
        return Fairness(None, None, None, None)
    demand = now.demand - then.demand
    error = 100 * ((now.delivered - then.delivered) - (now.owed - then.owed)) / span if demand > 0 else None
    return Fairness(round(100 * (now.entitled - then.entitled) / span, 2),
                    round(100 * (now.delivered - then.delivered) / span, 2),
                    round(100 * demand / span, 2), None if error is None else round(error, 2))


@dataclass(slots=True)
class InstanceStatus:
    id: str
    weight: int
    highprio: int
    starved: bool
    held_seconds: float
    useful_seconds: float  # held less the hand-overs it was not billed for (= delivered_seconds)
    delivered_seconds: float
    entitled_seconds: float
    owed_seconds: float  # entitled while it had demand: what its error is measured against
    demand_seconds: float
    share_pct: dict[str, float | None]  # held time over each window
    entitled_pct: dict[str, float | None]
    delivered_pct: dict[str, float | None]
    error_pp: dict[str, float | None]
    grants: int
    mem_used: int
    mem_limit: int
    pids: list[int]
    clients: int
    provisioned: bool
    demand: bool
    wait_p50_ms: float | None  # its grant waits over the last minute (arbiterd.core.waits): None if none
    wait_p99_ms: float | None
    limit: int = 100  # its ceiling, % of the GPU (100: none; arbiterd.core.limits)
    throttled_seconds: float = 0.0  # time it waited with its limit's runtime spent
    labels: dict[str, str] | None = None  # its pod (namespace, pod, container), from its allocations; None: not a pod's
    gang: list[int] | None = None  # the GPUs of the gang it is one GPU of (behaviour §11); None: in none
    gang_spin_seconds: float = 0.0  # time it held this GPU past its gang turn's deadline while a peer waited
    # time its collectives here waited for a peer's launch of the same one, as its processes counted it (shimspin.py)
    gang_shim_spin_seconds: float = 0.0


@dataclass(slots=True)
class UnmanagedStatus:
    """A process with a context on the GPU that is not a client of cgpu (NVML's process list)."""

    pid: int
    instance: str  # its container's short id, uid-<uid>, or host
    container: str | None
    exe: str
    mem_used: int  # bytes, as NVML counts them
    seen_seconds: float  # since it was first seen
    throttled: bool  # under unmanaged = throttle: frozen outside its container's turns
    labels: dict[str, str] | None = None  # its container's pod, where an allocation bound to it names one


@dataclass(slots=True)
class GpuStatus:
    index: int
    name: str
    uuid: str
    simulated: bool
    total_mem: int
    mem_used: int
    policy_name: str
    settings: dict[str, int | str]  # every GPU setting, by name (the settings table)
    slice_effective_ms: float  # the slice in force (what slice_ms = auto chose, or the pinned value)
    round_ms: float  # the round in force: the useful time one turn of every instance takes (latency_target_ms)
    handover_ms: float  # the expected hand-over: the mean of the last leases' (arbiterd.core.accounting)
    handover_transit_ms: float  # the last leases' mean transit, unclamped: the daemon's and the messages' part
    handover_warmup_ms: float  # ... and mean warm-up: the part the clients reported (wake-up, slow first work)
    free_weight: int
    busy_seconds: float
    busy_pct: dict[str, float | None]
    grants: int
    revocations: int
    revoked: dict[str, int]  # revocations by reason, overrun cut-offs included
    overruns: int
    fairness_error_pp: dict[str, float | None]  # the largest |error| among instances with demand
    alloc_mem: int  # bytes held by allocations (alloc_ctl)
    alloc_core: int  # percent held by allocations
    driver_version: str  # NVML's driver version; empty for a simulated GPU
    compute_capability: str  # "8.6"; empty for a simulated GPU
    instances: list[InstanceStatus] = field(default_factory=list)
    unmanaged_processes: list[UnmanagedStatus] = field(default_factory=list)
    nvml_memory: dict[str, int] = field(default_factory=dict)  # bytes per instance, every process NVML lists
    utilization_pct: int | None = None  # NVML's, at the last poll (None: not read)
    unmanaged_kills: int = 0
    memory_kills: int = 0
    memory_breaches: int = 0  # instances over their limit past memory_grace_ms
    gang_turns: int = 0  # gang turns granted on this GPU (behaviour §11)
    gang_idle_seconds: float = 0.0  # time it idled for a gang's alignment, with nobody to fill the wait


@dataclass(slots=True)
class DaemonStatus:
    version: str
    pid: int
    uptime_seconds: float
    scheduling: str
    clients: int
    state_file: str
    state_problem: str | None
    upgrade: int
    allocations_mode: str
    gpus: list[GpuStatus]
    allocations: list[dict[str, Any]]
    pod_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # by instance: the metrics' pod labels

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        del doc["pod_labels"]  # each instance carries its own (labels); this index serves the metrics
        doc["schema"] = SCHEMA_VERSION
        for g in doc["gpus"]:
            g.update(g.pop("settings"))
        return doc


def _pct(delta: int, span: int) -> float | None:
    return round(100 * delta / span, 2) if span > 0 else None


def pod_labels(arb: Arbiter) -> dict[str, dict[str, str]]:
    """The pod labels of every instance that an allocation naming a pod is bound to."""
    out = {}
    for a in arb.allocations:
        if a.bound is not None and a.bound not in out and (labels := arb.allocations.labels_of(a.bound)):
            out[a.bound] = labels.to_json()
    return out


def add_containment(gs: GpuStatus, c: Containment, now: int, utilization: int | None,
                    throttled: set[int], labels: dict[str, dict[str, str]]) -> None:
    """What NVML's last poll of the GPU showed: its unmanaged processes (with their pod's ``labels``, by instance),
    memory per instance, the kills."""
    seen = c.last.get(gs.index)
    if seen is not None:
        gs.unmanaged_processes = [UnmanagedStatus(p.pid, p.instance, p.container, p.exe, p.used,
                                        round((now - c.first_seen.get((gs.index, p.pid, p.started), now)) / 1e9, 3),
                                        p.pid in throttled, labels.get(p.instance)) for p in seen.unmanaged]
        gs.nvml_memory = dict(seen.memory)
    gs.utilization_pct = utilization
    gs.unmanaged_kills = c.kills[(gs.index, "unmanaged")]
    gs.memory_kills = c.kills[(gs.index, "memory")]
    gs.memory_breaches = c.breaches[gs.index]


def build(arb: Arbiter, gpus: list[GpuInfo], history: History, *, clients: int, started_at: float,
          state_file: str, state_problem: str | None) -> DaemonStatus:
    """The whole status document, now."""
    now = time.monotonic_ns()
    windows = {key: history.past(now, age) for key, age in WINDOWS.items()}
    out = []
    for g in gpus:
        sched = arb.scheds[g.index]
        busy = sched.busy_ns(now)
        busy_pct = {k: _pct(busy - p.busy.get(g.index, 0), now - p.t) if p else None for k, p in windows.items()}
        records = arb.instances_on(g.index)
        insts: list[InstanceStatus] = []
        worst: dict[str, float | None] = dict.fromkeys(WINDOWS)
        for rec in records:
            st = sched.instances[rec.name]
            cur = counters(arb, g.index, rec.name, now)
            past = {k: history.past(now, age, (g.index, rec.name)) for k, age in WINDOWS.items()}
            fair = {k: fairness(cur, p.inst[(g.index, rec.name)] if p else None, now - p.t if p else 0)
                    for k, p in past.items()}
            for k, f in fair.items():
                if f.error_pp is not None:
                    worst[k] = max(worst[k] or 0.0, abs(f.error_pp))
            share = {k: _pct(cur.held - p.inst[(g.index, rec.name)].held, now - p.t) if p else None
                     for k, p in past.items()}
            pids = sorted({arb.clients[c].pid for c in rec.clients if c in arb.clients})
            found = sched.rq.waits.quantiles(rec.name, now)
            p50, p99 = (None, None) if found is None else (round(found[0] / 1e6, 3), round(found[1] / 1e6, 3))
            insts.append(InstanceStatus(
                rec.name, st.weight, int(st.highprio), st.weight == 0, cur.held / 1e9,
                cur.delivered / 1e9, cur.delivered / 1e9, round(cur.entitled / 1e9, 6), round(cur.owed / 1e9, 6),
                cur.demand / 1e9, share,
                {k: f.entitled_pct for k, f in fair.items()}, {k: f.delivered_pct for k, f in fair.items()},
                {k: f.error_pp for k, f in fair.items()}, st.grants,
                rec.ledger.used, rec.ledger.limit, pids, len(rec.clients), rec.provisioned,
                sched.has_demand(rec.name), p50, p99,
                limit=st.limit, throttled_seconds=sched.throttled_ns(rec.name, now) / 1e9,
                labels=rec.labels.to_json() if rec.labels else None,
                gang=list(gang.gpus) if (gang := arb.gangs.gang_of(g.index, rec.name)) is not None else None,
                gang_spin_seconds=arb.gangs.spin.get((g.index, rec.name), 0) / 1e9,
                gang_shim_spin_seconds=rec.shim_spin_ns / 1e9,
            ))
        transit, warmup = sched.handover.parts
        gs = GpuStatus(
            g.index, g.name, g.uuid, g.simulated, g.total_mem, sum(r.ledger.used for r in records),
            POLICY_NAMES[sched.settings.policy],
            {name: s.external(getattr(sched.settings, name)) for name, s in GPU.items()},
            sched.slice_ns / 1e6, sched.rq.round_ns / 1e6, sched.handover.expected / 1e6, transit / 1e6, warmup / 1e6,
            sched.free_weight, busy / 1e9, busy_pct, sched.stats.grants, sched.stats.revocations,
            dict(sched.stats.revoked), sched.stats.overruns, worst,
            arb.allocations.alloc_mem(g.index), arb.allocations.alloc_core(g.index), g.driver_version,
            g.compute_capability, insts, gang_turns=arb.gangs.stats[g.index].turns,
            gang_idle_seconds=arb.gangs.idle_ns(g.index, now) / 1e9,
        )
        out.append(gs)
    return DaemonStatus(__version__, os.getpid(), round(time.time() - started_at, 3), describe(), clients,
                        state_file, state_problem, arb.globals.upgrade, arb.config.allocations, out,
                        [a.to_json() for a in arb.allocations])
