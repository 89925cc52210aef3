"""Discrete-event simulator of jobs across several GPUs, on a virtual clock: the gang rule's exact check.

How this works
--------------
Each GPU has its :class:`GpuScheduler`; a :class:`GangBook` joins them, as the arbiter does. A :class:`SimJob` runs
on one GPU (a single-GPU tenant) or on several (a job with collectives). Each of its GPUs has a client that behaves
like the gate of ``sim.py``: before an operation it checks its lease (valid: run it; expired or revoked: release and
ask again), a revoke is honoured at the next operation boundary, and an operation that starts just before the
deadline overruns it. A multi-GPU job's operations are *collectives*, as NCCL's kernels are: step k's kernel starts on
a GPU as soon as that GPU's client holds a lease, and finishes on every GPU ``op_ns`` after it has started on the
last of them; meanwhile it spins, holding its GPU. The job's useful time on each GPU is the steps it completed, at
``op_ns`` each; its *spin* is the time its kernels waited for a peer. One process with several devices (one client
on every GPU) or one process per GPU (as torchrun makes) are both modelled (:attr:`SimJob.one_process`).

:meth:`GangSimulation.run` integrates every instance's entitled share (:meth:`GpuScheduler.entitled`, with the
book assuming the workloads' demand on every GPU) over the run: the target the measured share is compared with.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from arbiterd.core.effects import NS_PER_MS, NS_PER_S, Effect, GrantLease, RevokeLease
from arbiterd.core.gang import DEFAULT_WINDOW_MS, GangBook
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import Workload, busy


@dataclass(frozen=True, slots=True)
class SimJob:
    name: str
    gpus: tuple[int, ...] = (0,)
    weight: int = 1
    highprio: bool = False
    workload: Workload = field(default_factory=busy)
    one_process: bool = False  # one client on every GPU (else one per GPU)
    # per GPU of it (in ``gpus`` order), how long after a step its client reaches its gate again (its CPU's part):
    # ranks that differ there reach a turn's deadline on either side of it now and then, as on a real host
    lag_ns: tuple[int, ...] = ()


@dataclass(slots=True, eq=False)
class _Client:
    cid: int
    gpu: int
    job: SimJob
    lease: int | None = None
    deadline: int = 0
    revoked: bool = False
    waiting_since: int | None = None
    running: bool = False  # a kernel of its is on the GPU (running or spinning)
    started: int = 0  # when that kernel started
    got_at: int = 0


@dataclass(slots=True)
class JobResult:
    name: str
    share: dict[int, float]  # useful time / window, per GPU
    target: dict[int, float]
    spin_ns: int
    held_ns: int
    steps: int
    max_stall_ns: int  # the longest time between two steps completed (after the warm-up)


@dataclass(slots=True)
class GangResult:
    duration_ns: int
    jobs: dict[str, JobResult]
    idle: dict[int, float]  # per GPU: the share of time nobody did useful work
    idle_target: dict[int, float]

    def pct(self, name: str, gpu: int) -> float:
        return self.jobs[name].share[gpu] * 100

    def max_error_pp(self) -> float:
        errs = [abs(r.share[g] - r.target[g]) * 100 for r in self.jobs.values() for g in r.share]
        errs += [abs(self.idle[g] - self.idle_target[g]) * 100 for g in self.idle]
        return max(errs)


class GangSimulation:
    """Jobs on ``gpus`` GPUs, each with its own settings, joined by a gang book (``window_ms`` 0: gangs off)."""

    def __init__(self, settings: dict[int, GpuSettings], jobs: list[SimJob], window_ms: int = DEFAULT_WINDOW_MS,
                 idle_release_ns: int = 2 * NS_PER_MS) -> None:
        self.scheds = {g: GpuScheduler(g, s, now=0) for g, s in settings.items()}
        self.book = GangBook(window_ms * NS_PER_MS)
        for sched in self.scheds.values():
            self.book.attach(sched)
        self.jobs = jobs
        self.idle_release_ns = idle_release_ns
        self.now = 0
        self._heap: list[tuple[int, int, str, int, int]] = []
        self._seq = itertools.count()
        self._ticks: set[int] = set()
        self.clients: dict[tuple[int, int], _Client] = {}
        self.useful: dict[tuple[str, int], int] = {}
        self.spin: dict[str, int] = dict.fromkeys((j.name for j in jobs), 0)
        self.steps: dict[str, int] = dict.fromkeys((j.name for j in jobs), 0)
        self.last_step: dict[str, int] = {}
        self.max_stall: dict[str, int] = dict.fromkeys((j.name for j in jobs), 0)
        self._starts: dict[str, dict[int, int]] = {j.name: {} for j in jobs}
        self.warmup_ns = 0
        ids = itertools.count(1)
        for job in jobs:
            shared = next(ids) if job.one_process else None
            for g in job.gpus:
                self.scheds[g].add_instance(job.name, job.weight, job.highprio, 0)
                cid = shared if shared is not None else next(ids)
                self.clients[(cid, g)] = _Client(cid, g, job)
                self.useful[(job.name, g)] = 0

    # ------------------------------------------------------------------ plumbing
    def _push(self, t: int, kind: str, cid: int = 0, gpu: int = 0) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, cid, gpu))

    def _arm_tick(self) -> None:
        for sched in self.scheds.values():
            t = sched.next_wakeup()
            if t is not None and t not in self._ticks:
                self._ticks.add(t)
                self._push(max(t, self.now), "tick")

    def _apply(self, effects: list[Effect]) -> None:
        pending = list(effects)
        while pending:
            eff = pending.pop(0)
            pending += self._deliver(eff)
        for sched in self.scheds.values():
            assert len(sched.holders()) <= 1, f"two holders on GPU {sched.index} at {self.now}"

    def _deliver(self, eff: Effect) -> list[Effect]:
        c = self.clients[(eff.client, eff.gpu)]
        if isinstance(eff, GrantLease):
            if eff.lease == c.lease:
                c.deadline = eff.deadline_ns
                return []
            if c.waiting_since is None:
                return []
            c.lease, c.deadline, c.revoked = eff.lease, eff.deadline_ns, False
            c.waiting_since, c.got_at = None, self.now
            return self._work(c)
        if isinstance(eff, RevokeLease) and eff.lease == c.lease:
            c.revoked = True
            if not c.running:
                return self._work(c)
        return []

    def _release(self, c: _Client, again: bool = False) -> list[Effect]:
        if c.lease is None:
            return []
        lease, c.lease = c.lease, None
        if again:
            c.waiting_since = self.now
        effects, _ = self.scheds[c.gpu].release(c.cid, lease, self.now, again=again)
        return effects

    def _work(self, c: _Client) -> list[Effect]:
        """The gate: what client ``c`` does when it is free to launch."""
        if c.running or c.waiting_since is not None:
            return []
        wl = c.job.workload
        if not wl.active(self.now):
            effects: list[Effect] = []
            if c.lease is not None and (c.revoked or self.now >= c.deadline):
                effects = self._release(c)
            elif c.lease is not None:
                self._push(self.now + self.idle_release_ns, "idle", c.cid, c.gpu)
            nxt = wl.next_on(self.now)
            if nxt is not None:
                self._push(nxt, "wake", c.cid, c.gpu)
            return effects
        if c.lease is not None and not c.revoked and self.now < c.deadline:
            self._launch(c)
            return []
        if c.lease is not None:
            return self._release(c, again=True)
        c.waiting_since = self.now
        return self.scheds[c.gpu].acquire(c.job.name, c.cid, self.now)

    def _launch(self, c: _Client) -> None:
        c.running, c.started = True, self.now
        job = c.job
        if len(job.gpus) == 1:
            self._push(self.now + job.workload.op_ns, "op", c.cid, c.gpu)
            return
        starts = self._starts[job.name]
        starts[c.gpu] = self.now
        if len(starts) == len(job.gpus):  # the collective has started everywhere: it ends op_ns after the last
            end = max(starts.values()) + job.workload.op_ns
            for cl in self._members(job):
                self._push(end, "op", cl.cid, cl.gpu)
            starts.clear()

    def _members(self, job: SimJob) -> list[_Client]:
        return [c for c in self.clients.values() if c.job is job]

    def _done(self, c: _Client) -> None:
        job = c.job
        t = self.now
        op = job.workload.op_ns
        if len(job.gpus) > 1:
            self.spin[job.name] += max(0, t - c.started - op)
        counted = t - max(t - op, self.warmup_ns) if t > self.warmup_ns else 0
        self.useful[(job.name, c.gpu)] += counted
        if c.gpu == job.gpus[0]:
            self.steps[job.name] += 1
            last = self.last_step.get(job.name)
            if last is not None and t > self.warmup_ns:
                self.max_stall[job.name] = max(self.max_stall[job.name], t - last - op)
            self.last_step[job.name] = t
        c.running = False

    # ------------------------------------------------------------------ the run
    def run(self, duration_ns: int, warmup_ns: int = 0) -> GangResult:
        self.warmup_ns = warmup_ns
        for c in self.clients.values():
            self._push(0, "wake", c.cid, c.gpu)
        while self._heap and self._heap[0][0] <= duration_ns:
            t, _, kind, cid, gpu = heapq.heappop(self._heap)
            self.now = t
            if kind == "tick":
                self._ticks.discard(t)
                effects: list[Effect] = []
                for sched in self.scheds.values():
                    wake = sched.next_wakeup()
                    if wake is not None and wake <= t:
                        effects += sched.tick(t)
                self._apply(effects)
            else:
                c = self.clients[(cid, gpu)]
                if kind == "op":
                    self._done(c)
                    lag = c.job.lag_ns[c.job.gpus.index(c.gpu)] if c.job.lag_ns else 0
                    if lag:
                        self._push(t + lag, "wake", c.cid, c.gpu)
                    else:
                        self._apply(self._work(c))
                elif kind == "wake":
                    self._apply(self._work(c))
                elif kind == "idle" and not c.running and not c.job.workload.active(t):
                    self._apply(self._release(c))
            self._arm_tick()
        return self._result(duration_ns, warmup_ns)

    def _result(self, duration_ns: int, warmup_ns: int) -> GangResult:
        window = duration_ns - warmup_ns
        targets = {(j.name, g): 0.0 for j in self.jobs for g in j.gpus}
        steps = 0
        for t in range(warmup_ns, duration_ns, NS_PER_MS):
            active = {g: {j.name for j in self.jobs if g in j.gpus and j.workload.active(t)} for g in self.scheds}
            self.book.assumed = active
            for g, sched in self.scheds.items():
                for name, share in sched.entitled(active[g]).items():
                    if name in active[g]:
                        targets[(name, g)] += share
            steps += 1
            if all(j.workload.on_ns is None for j in self.jobs):  # constant demand: one step says it all
                break
        self.book.assumed = None
        out: dict[str, JobResult] = {}
        for j in self.jobs:
            held = sum(self.scheds[g].held_ns(j.name, duration_ns) for g in j.gpus)
            out[j.name] = JobResult(
                j.name, {g: self.useful[(j.name, g)] / window for g in j.gpus},
                {g: targets[(j.name, g)] / steps for g in j.gpus}, self.spin[j.name], held, self.steps[j.name],
                self.max_stall[j.name])
        idle = {g: 1.0 - sum(r.share.get(g, 0.0) for r in out.values()) for g in self.scheds}
        idle_target = {g: 1.0 - sum(r.target.get(g, 0.0) for r in out.values()) for g in self.scheds}
        return GangResult(duration_ns, out, idle, idle_target)


def simulate_gangs(gpus: int, jobs: list[SimJob], seconds: float = 20, policy: int = 4, window_ms: int = 200,
                   **settings: int) -> GangResult:
    """``jobs`` on ``gpus`` GPUs of ``policy`` for ``seconds`` of virtual time (the first second is warm-up)."""
    sim = GangSimulation({g: GpuSettings(policy=policy, **settings) for g in range(gpus)}, jobs, window_ms)
    return sim.run(int(seconds * NS_PER_S), warmup_ns=NS_PER_S)
