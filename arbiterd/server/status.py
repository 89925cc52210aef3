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
from typing import Any

from arbiterd import __version__
from arbiterd.core.arbiter import Arbiter, GpuInfo
from arbiterd.core.effects import NS_PER_S
from arbiterd.core.policies import POLICY_NAMES
from arbiterd.core.settings import GPU
from arbiterd.server.cpu import describe

SCHEMA_VERSION = 1
HISTORY = 61  # one sample a second: enough for the 60 s window
WINDOWS = {"1s": NS_PER_S, "60s": 60 * NS_PER_S}


@dataclass(frozen=True, slots=True)
class Sample:
    t: int
    held: dict[tuple[int, str], int]
    busy: dict[int, int]


class History:
    """Counters sampled once a second, to compute shares over the last 1 s and 60 s."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=HISTORY)

    def sample(self, arb: Arbiter, now: int) -> None:
        held = {(g, n): arb.scheds[g].held_ns(n, now) for (g, n) in arb.records}
        busy = {g: s.busy_ns(now) for g, s in arb.scheds.items()}
        self.samples.append(Sample(now, held, busy))

    def past(self, now: int, age_ns: int) -> Sample | None:
        """The newest sample at least ``age_ns`` old (or the oldest there is)."""
        best = None
        for sample in self.samples:
            if now - sample.t >= age_ns:
                best = sample
        if best is None and self.samples:
            best = self.samples[0]
        return best


@dataclass(slots=True)
class InstanceStatus:
    id: str
    weight: int
    highprio: int
    starved: bool
    held_seconds: float
    useful_seconds: float  # held less the hand-overs it was not billed for
    share_pct: dict[str, float | None]
    grants: int
    mem_used: int
    mem_limit: int
    pids: list[int]
    clients: int
    provisioned: bool
    demand: bool


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
    handover_ms: float  # the expected hand-over: the mean of the last leases' (arbiterd.core.accounting)
    free_weight: int
    busy_seconds: float
    busy_pct: dict[str, float | None]
    grants: int
    revocations: int
    overruns: int
    alloc_mem: int  # bytes held by allocations (alloc_ctl)
    alloc_core: int  # percent held by allocations
    instances: list[InstanceStatus] = field(default_factory=list)


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

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["schema"] = SCHEMA_VERSION
        for g in doc["gpus"]:
            g.update(g.pop("settings"))
        return doc


def _pct(delta: int, span: int) -> float | None:
    return round(100 * delta / span, 2) if span > 0 else None


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
        gs = GpuStatus(
            g.index, g.name, g.uuid, g.simulated, g.total_mem, sum(r.ledger.used for r in records),
            POLICY_NAMES[sched.settings.policy],
            {name: s.external(getattr(sched.settings, name)) for name, s in GPU.items()},
            sched.slice_ns / 1e6, sched.handover.expected / 1e6,
            sched.free_weight, busy / 1e9, busy_pct, sched.stats.grants, sched.stats.revocations,
            sched.stats.overruns, arb.allocations.alloc_mem(g.index), arb.allocations.alloc_core(g.index),
        )
        for rec in records:
            st = sched.instances[rec.name]
            held = sched.held_ns(rec.name, now)
            share = {k: _pct(held - p.held.get((g.index, rec.name), 0), now - p.t) if p else None
                     for k, p in windows.items()}
            pids = sorted({arb.clients[c].pid for c in rec.clients if c in arb.clients})
            gs.instances.append(InstanceStatus(
                rec.name, st.weight, int(st.highprio), st.weight == 0, held / 1e9,
                sched.useful_ns(rec.name, now) / 1e9, share, st.grants,
                rec.ledger.used, rec.ledger.limit, pids, len(rec.clients), rec.provisioned,
                sched.has_demand(rec.name),
            ))
        out.append(gs)
    return DaemonStatus(__version__, os.getpid(), round(time.time() - started_at, 3), describe(), clients,
                        state_file, state_problem, arb.globals.upgrade, arb.config.allocations, out,
                        [a.to_json() for a in arb.allocations])
