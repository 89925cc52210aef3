"""Discrete-event simulator that drives a :class:`GpuScheduler` on a virtual clock.

How this works
--------------
Each simulated client behaves like ``libcgpu_client``'s gate: before an
operation it checks its lease (valid -> run the op; expired or revoked ->
release with the time used, then acquire again); a client with no work gives
its lease back after ``idle_release_ns``; a revoke is honoured at the next
operation boundary. Operations run for their full length once started, so an
op that starts just before the deadline overruns it, as on a real GPU.

A :class:`SwitchCost` makes each hand-over cost something, as it does on a
real host: messages take ``transit_ns`` each way, a client starts its first op
``wake_ns`` after the grant arrives, and that op takes ``warm_ns`` longer (plus
its instance's own ``warm_ns``: one process may pay more than another); the
client reports the last two as the gate does (``warmup_ns``). Workloads: busy,
idle, bursty (on/off) and any op length. The share measured is *useful* time
(the nominal op time done). :meth:`Simulation.run` integrates the scheduler's entitled share
of each instance (:meth:`GpuScheduler.entitled`, for the instances whose
workload is on) over the run: the target the measured share is compared with.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from dataclasses import dataclass, field

from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease, RevokeLease
from arbiterd.core.policies import NATIVE
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings


@dataclass(frozen=True, slots=True)
class Workload:
    """When an instance has work, and how long each operation runs."""

    op_ns: int = NS_PER_MS
    on_ns: int | None = None  # None: always on
    off_ns: int = 0
    phase_ns: int = 0
    idle: bool = False

    def active(self, t: int) -> bool:
        if self.idle:
            return False
        if self.on_ns is None:
            return True
        period = self.on_ns + self.off_ns
        return (t + self.phase_ns) % period < self.on_ns

    def next_on(self, t: int) -> int | None:
        if self.idle:
            return None
        if self.on_ns is None or self.active(t):
            return t
        period = self.on_ns + self.off_ns
        return t + period - (t + self.phase_ns) % period


def busy(op_ms: float = 1.0) -> Workload:
    return Workload(op_ns=int(op_ms * NS_PER_MS))


def idle() -> Workload:
    return Workload(idle=True)


def bursty(op_ms: float, on_ms: float, off_ms: float, phase_ms: float = 0.0) -> Workload:
    return Workload(
        op_ns=int(op_ms * NS_PER_MS),
        on_ns=int(on_ms * NS_PER_MS),
        off_ns=int(off_ms * NS_PER_MS),
        phase_ns=int(phase_ms * NS_PER_MS),
    )


@dataclass(frozen=True, slots=True)
class SwitchCost:
    """What a hand-over costs a client (see the module docstring); all zero: nothing."""

    transit_ns: int = 0
    wake_ns: int = 0
    warm_ns: int = 0
    report: bool = True  # the client reports its wake-up and warm-up with each release


@dataclass(frozen=True, slots=True)
class SimInstance:
    name: str
    weight: int = 1
    highprio: bool = False
    workload: Workload = field(default_factory=busy)
    clients: int = 1
    # more clients of the instance, each with a workload of its own (a second process that works in bursts, say)
    others: tuple[Workload, ...] = ()
    warm_ns: int = 0  # this instance's warm-up on top of the hand-over's (a process slow to get going)
    # a lying client: warm-up it claims on every release on top of what it lost, and transit it claims (the
    # time it says it held the lease is short by this much)
    claim_warmup_ns: int = 0
    claim_transit_ns: int = 0
    limit: int = 100  # its ceiling, % of the GPU (100: none)


@dataclass(slots=True)
class InstanceResult:
    name: str
    target: float
    share: float
    held_share: float
    grants: int
    max_wait_ns: int


@dataclass(slots=True)
class SimResult:
    duration_ns: int
    instances: dict[str, InstanceResult]
    idle_share: float
    idle_target: float
    max_holders: int
    overruns: int
    revocations: int

    def pct(self, name: str) -> float:
        """``name``'s share of the GPU's time, in percent."""
        return self.instances[name].share * 100

    def max_error_pp(self) -> float:
        errs = [abs(r.share - r.target) * 100 for r in self.instances.values()]
        if all(r.target < 1.0 for r in self.instances.values()):
            errs.append(abs(self.idle_share - self.idle_target) * 100)
        return max(errs)


@dataclass(slots=True, eq=False)
class _Client:
    cid: int
    inst: SimInstance
    lease: int | None = None
    deadline: int = 0
    revoked: bool = False
    waiting_since: int | None = None
    op_end: int | None = None
    last_active: int = 0
    got_at: int = 0  # when the current lease's grant arrived
    cold: bool = False  # the next op is the lease's first: it pays the warm-up
    lost_ns: int = 0  # wake-up and warm-up of the current lease, as reported


class Simulation:
    """Run instances with workload models against one GPU's scheduler."""

    def __init__(
        self,
        settings: GpuSettings,
        instances: list[SimInstance],
        idle_release_ns: int = 2 * NS_PER_MS,
        trace: bool = False,
        switch: SwitchCost | None = None,
    ) -> None:
        self.sched = GpuScheduler(0, settings, now=0)
        self.switch = switch or SwitchCost()
        self.instances = instances
        self.idle_release_ns = idle_release_ns
        self.now = 0
        self._heap: list[tuple[int, int, str, int, tuple[int, ...]]] = []
        self._seq = itertools.count()
        self._ticks: set[int] = set()
        self.clients: dict[int, _Client] = {}
        self.op_ns: dict[str, int] = {i.name: 0 for i in instances}
        self.max_wait: dict[str, int] = {i.name: 0 for i in instances}
        self.max_holders = 0
        self.trace = trace
        self.events: list[tuple[int, str, str]] = []
        self._started = False
        ids = itertools.count(1)
        for inst in instances:
            self.sched.add_instance(inst.name, inst.weight, inst.highprio, 0, limit=inst.limit)
            kinds = [inst] * inst.clients + [dataclasses.replace(inst, workload=w, others=()) for w in inst.others]
            for kind in kinds:
                c = _Client(next(ids), kind)
                self.clients[c.cid] = c

    # event plumbing
    def _push(self, t: int, kind: str, cid: int = 0, payload: tuple[int, ...] = ()) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, cid, payload))

    def _arm_tick(self) -> None:
        t = self.sched.next_wakeup()
        if t is not None and t not in self._ticks:
            self._ticks.add(t)
            self._push(max(t, self.now), "tick")

    def _apply(self, effects: list[Effect]) -> None:
        pending = list(effects)
        while pending:
            eff = pending.pop(0)
            if self.switch.transit_ns:  # the client sees it later
                is_grant = isinstance(eff, GrantLease)
                payload = (eff.lease, eff.deadline_ns if isinstance(eff, GrantLease) else 0)
                self._push(self.now + self.switch.transit_ns, "grant" if is_grant else "revoke", eff.client, payload)
                continue
            pending += self._deliver(eff)
        self._check_holders()

    def _deliver(self, eff: Effect) -> list[Effect]:
        """The client acts on a grant or a revoke that has reached it."""
        c = self.clients[eff.client]
        if isinstance(eff, GrantLease):
            if eff.lease == c.lease:  # the deadline of the lease it holds moved
                c.deadline = eff.deadline_ns
                return []
            if c.waiting_since is None:
                return []  # a grant it no longer waits for (it gave that lease back)
            c.lease, c.deadline, c.revoked = eff.lease, eff.deadline_ns, False
            self.max_wait[c.inst.name] = max(self.max_wait[c.inst.name], self.now - c.waiting_since)
            c.waiting_since = None
            c.got_at, c.cold, c.lost_ns = self.now, True, 0
            if self.trace:
                self.events.append((self.now, c.inst.name, "grant"))
            if self.switch.wake_ns:
                self._push(self.now + self.switch.wake_ns, "wake", c.cid)
                return []
            return self._work(c)
        if isinstance(eff, RevokeLease) and eff.lease == c.lease:
            c.revoked = True
            if c.op_end is None:
                return self._work(c)
        return []

    def _check_holders(self) -> None:
        held = self.sched.holders()
        holders = len(held)
        for inst in self.sched.instances.values():
            assert inst.leases == sum(lease.inst is inst for lease in held), f"{inst.name}'s lease count at {self.now}"
        self.max_holders = max(self.max_holders, holders)
        if self.sched.settings.policy != NATIVE:
            assert holders <= 1, f"two holders at {self.now}"

    def apply(self, effects: list[Effect]) -> None:
        """Deliver the effects of a change made on ``sched`` between two ``run`` calls."""
        self._apply(effects)
        self._arm_tick()

    def _release(self, c: _Client, again: bool = False) -> list[Effect]:
        if c.lease is None:
            return []
        lease, c.lease = c.lease, None
        if again:
            c.waiting_since = self.now
        sw = self.switch
        if sw == SwitchCost():
            effects, _ = self.sched.release(c.cid, lease, self.now, again=again)
            return effects
        report = (self.now - c.got_at - c.inst.claim_transit_ns,
                  (c.lost_ns if sw.report else 0) + c.inst.claim_warmup_ns)
        return self._to_daemon(c, "release", (lease, int(again), *report))

    def _to_daemon(self, c: _Client, kind: str, payload: tuple[int, ...]) -> list[Effect]:
        if self.switch.transit_ns:
            self._push(self.now + self.switch.transit_ns, kind, c.cid, payload)
            return []
        return self._at_daemon(c, kind, payload)

    def _at_daemon(self, c: _Client, kind: str, payload: tuple[int, ...]) -> list[Effect]:
        if kind == "acquire":
            return self.sched.acquire(c.inst.name, c.cid, self.now)
        lease, again, used, warmup = payload
        effects, _ = self.sched.release(c.cid, lease, self.now, again=bool(again), used_ns=used, warmup_ns=warmup)
        return effects

    def _work(self, c: _Client) -> list[Effect]:
        """The gate: what client ``c`` does when it is free to start an op."""
        if c.op_end is not None or c.waiting_since is not None:
            return []
        wl = c.inst.workload
        if not wl.active(self.now):
            effects: list[Effect] = []
            if c.lease is not None and (c.revoked or self.now >= c.deadline):
                effects = self._release(c)
            elif c.lease is not None:
                self._push(self.now + self.idle_release_ns, "idle", c.cid)
            nxt = wl.next_on(self.now)
            if nxt is not None:
                self._push(nxt, "wake", c.cid)
            return effects
        if c.lease is not None and not c.revoked and self.now < c.deadline:
            c.op_end = self.now + wl.op_ns
            if c.cold:  # the lease's first op: slower by the warm-up, after the wake-up it waited
                warm = self.switch.warm_ns + c.inst.warm_ns
                c.op_end += warm
                c.lost_ns = self.now - c.got_at + warm
                c.cold = False
            self._push(c.op_end, "op", c.cid)
            return []
        if c.lease is not None:
            return self._release(c, again=True)
        c.waiting_since = self.now
        return self._to_daemon(c, "acquire", ())

    def run(self, duration_ns: int, warmup_ns: int = 0) -> SimResult:
        """Run until virtual time ``duration_ns``; a later call goes on from there."""
        if not self._started:
            self._started = True
            for c in self.clients.values():
                self._push(0, "wake", c.cid)
        while self._heap and self._heap[0][0] <= duration_ns:
            t, _, kind, cid, payload = heapq.heappop(self._heap)
            self.now = t
            if kind in ("grant", "revoke"):
                eff: Effect = (GrantLease(cid, 0, payload[0], payload[1], 0) if kind == "grant"
                               else RevokeLease(cid, 0, payload[0], ""))
                self._apply(self._deliver(eff))
            elif kind in ("acquire", "release"):
                self._apply(self._at_daemon(self.clients[cid], kind, payload))
            elif kind == "tick":
                self._ticks.discard(t)
                self._apply(self.sched.tick(t))
            else:
                c = self.clients[cid]
                if kind == "op":
                    if c.op_end != t:
                        continue
                    start = t - c.inst.workload.op_ns
                    self.op_ns[c.inst.name] += t - max(start, warmup_ns) if t > warmup_ns else 0
                    c.op_end = None
                    c.last_active = t
                    self._apply(self._work(c))
                elif kind == "wake":
                    self._apply(self._work(c))
                elif kind == "idle":
                    active = c.inst.workload.active(t)
                    if c.op_end is None and not active and t - c.last_active >= self.idle_release_ns:
                        self._apply(self._release(c))
            self._arm_tick()
        self.now = duration_ns
        for c in self.clients.values():  # count the part of running ops inside the window
            if c.op_end is not None and c.op_end > duration_ns:
                start = max(c.op_end - c.inst.workload.op_ns, warmup_ns)
                self.op_ns[c.inst.name] += max(0, duration_ns - start)
        return self._result(duration_ns, warmup_ns)

    def _result(self, duration_ns: int, warmup_ns: int) -> SimResult:
        window = duration_ns - warmup_ns
        targets = {i.name: 0.0 for i in self.instances}
        step = NS_PER_MS
        steps = 0
        for t in range(warmup_ns, duration_ns, step):
            active = {i.name for i in self.instances if i.workload.active(t)}
            for name, share in self.sched.entitled(active).items():
                if name in active and self.sched.instances[name].weight > 0:  # what it can be delivered
                    targets[name] += share
            steps += 1
        out: dict[str, InstanceResult] = {}
        for i in self.instances:
            st = self.sched.instances[i.name]
            out[i.name] = InstanceResult(
                name=i.name,
                target=targets[i.name] / steps,
                share=self.op_ns[i.name] / window,
                held_share=self.sched.held_ns(i.name, duration_ns) / duration_ns,
                grants=st.grants,
                max_wait_ns=self.max_wait[i.name],
            )
        used = sum(r.share for r in out.values())
        target_used = sum(r.target for r in out.values())
        return SimResult(
            duration_ns=duration_ns,
            instances=out,
            idle_share=max(0.0, 1.0 - used),
            idle_target=max(0.0, 1.0 - target_used),
            max_holders=self.max_holders,
            overruns=self.sched.stats.overruns,
            revocations=self.sched.stats.revocations,
        )


def simulate(policy: int, insts: list[SimInstance], seconds: float = 20, **settings: int) -> SimResult:
    """``insts`` on one GPU of ``policy`` (and ``settings``) for ``seconds`` of virtual time."""
    return Simulation(GpuSettings(policy=policy, **settings), insts).run(int(seconds * 1_000_000_000))
