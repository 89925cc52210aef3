"""A small virtual-clock driver for the gang book's edge cases: GPU schedulers joined by a :class:`GangBook`, one
gate-like client per (instance, GPU) working on its own (no collectives: :mod:`cgpu_testing.gangsim` models those),
the arbiter's tick loop, and operator actions at set times.

How this works
--------------
Each client behaves like the gate of ``sim.py``: before an operation it checks its lease (valid: run it; expired or
revoked: release and ask again), and a revoke is honoured at the next operation boundary. A client whose ``active``
says no releases its lease and polls every quarter millisecond. The tick loop is the arbiter's: every GPU whose
wakeup has come is ticked, in GPU order, and after each event every GPU's next wakeup is asked again. Besides each
instance's useful time per GPU, the driver measures per GPU the time it was *free while someone waited* (a waiter
with weight and runtime, no lease held): the stuck GPU the gang edge cases are about.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease, RevokeLease
from arbiterd.core.gang import GangBook
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import NO_LIMIT, GpuSettings

POLL_NS = NS_PER_MS // 4


def always(t: int) -> bool:
    return True


@dataclass(slots=True, eq=False)
class DriverClient:
    name: str
    gpu: int
    cid: int
    active: Callable[[int], bool]
    op_ns: int
    lease: int | None = None
    deadline: int = 0
    revoked: bool = False
    waiting: bool = False
    running: bool = False
    dead: bool = False


class GangDriver:
    """Schedulers of ``policies`` (GPU -> policy) joined by one gang book, on a virtual clock."""

    def __init__(self, policies: dict[int, int], window_ms: int = 200, **settings: int) -> None:
        settings.setdefault("slice_ms", 10)
        self.scheds = {g: GpuScheduler(g, GpuSettings(policy=p, **settings), 0) for g, p in policies.items()}
        self.book = GangBook(window_ms * NS_PER_MS)
        for sched in self.scheds.values():
            self.book.attach(sched)
        self.clients: dict[tuple[int, int], DriverClient] = {}
        self.now = 0
        self.useful: dict[tuple[str, int], int] = {}
        self.free_waiting: dict[int, int] = dict.fromkeys(policies, 0)  # GPU free while someone waits, summed
        self.longest_free: dict[int, int] = dict.fromkeys(policies, 0)  # the longest such interval
        self._free_since: dict[int, int | None] = dict.fromkeys(policies, None)  # the interval open now
        self._counted: dict[int, int] = dict.fromkeys(policies, 0)  # how far free_waiting counts it
        self._heap: list[tuple[int, int, str, int, int]] = []
        self._seq = itertools.count()
        self._ticks: set[int] = set()
        self._calls: dict[int, Callable[[], None]] = {}
        self.events = 0

    # ------------------------------------------------------------------ set-up and actions
    def add(self, name: str, gpu: int, weight: int = 1, limit: int = NO_LIMIT) -> None:
        self.apply(self.scheds[gpu].add_instance(name, weight, False, self.now, limit=limit))

    def client(self, name: str, gpu: int, cid: int, active: Callable[[int], bool] = always,
               op_ms: float = 1.0) -> DriverClient:
        c = DriverClient(name, gpu, cid, active, int(op_ms * NS_PER_MS))
        self.clients[(cid, gpu)] = c
        self.useful.setdefault((name, gpu), 0)
        self._push(self.now, "wake", cid, gpu)
        return c

    def at(self, t: int, action: Callable[[], None]) -> None:
        """Run ``action`` at ``t`` (an operator's write: it applies its own effects, :meth:`apply`)."""
        key = len(self._calls)
        self._calls[key] = action
        self._push(t, "call", key)

    def kill(self, c: DriverClient) -> None:
        """``c``'s process dies: its connection is dropped."""
        c.dead = True
        self.apply(self.scheds[c.gpu].drop_client(c.cid, self.now))

    def reset(self) -> int:
        """Start measuring afresh from now; returns now."""
        for key in self.useful:
            self.useful[key] = 0
        for g in self.free_waiting:
            self.free_waiting[g] = self.longest_free[g] = 0
            if self._free_since[g] is not None:
                self._free_since[g] = self._counted[g] = self.now
        return self.now

    def share(self, name: str, gpu: int, since: int) -> float:
        """``name``'s useful time on ``gpu`` since ``since``, in percent of the wall time."""
        return 100 * self.useful[(name, gpu)] / (self.now - since)

    # ------------------------------------------------------------------ plumbing
    def _push(self, t: int, kind: str, cid: int = 0, gpu: int = 0) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, cid, gpu))

    def apply(self, effects: list[Effect]) -> None:
        pending = list(effects)
        while pending:
            eff = pending.pop(0)
            c = self.clients.get((eff.client, eff.gpu))
            if c is None or c.dead:
                continue
            if isinstance(eff, GrantLease):
                if eff.lease == c.lease:
                    c.deadline = eff.deadline_ns
                elif c.waiting:
                    c.lease, c.deadline, c.revoked, c.waiting = eff.lease, eff.deadline_ns, False, False
                    pending += self._work(c)
            elif isinstance(eff, RevokeLease) and eff.lease == c.lease:
                c.revoked = True
                if not c.running:
                    pending += self._work(c)
        for sched in self.scheds.values():
            assert sched.rq.draining or len(sched.holders()) <= 1, f"two holders on GPU {sched.index} at {self.now}"

    def _release(self, c: DriverClient, again: bool = False) -> list[Effect]:
        if c.lease is None:
            return []
        lease, c.lease = c.lease, None
        c.waiting = again
        return self.scheds[c.gpu].release(c.cid, lease, self.now, again=again)[0]

    def _work(self, c: DriverClient) -> list[Effect]:
        if c.dead or c.running or c.waiting:
            return []
        if not c.active(self.now):
            self._push(self.now + POLL_NS, "wake", c.cid, c.gpu)
            return self._release(c)
        if c.lease is not None and not c.revoked and self.now < c.deadline:
            c.running = True
            self._push(self.now + c.op_ns, "op", c.cid, c.gpu)
            return []
        if c.lease is not None:
            return self._release(c, again=True)
        c.waiting = True
        return self.scheds[c.gpu].acquire(c.name, c.cid, self.now)

    def _tick(self) -> None:
        effects: list[Effect] = []
        for sched in self.scheds.values():
            wake = sched.next_wakeup()
            if wake is not None and wake <= self.now:
                effects += sched.tick(self.now)
        self.apply(effects)

    def _arm(self) -> None:
        for sched in self.scheds.values():
            t = sched.next_wakeup()
            if t is not None and max(t, self.now) not in self._ticks:
                self._ticks.add(max(t, self.now))
                self._push(max(t, self.now), "tick")

    def _track(self, t: int) -> None:
        """Close or open each GPU's free-while-someone-waits interval at ``t``."""
        for g, sched in self.scheds.items():
            bw = sched.rq.bw
            waiting = any(i.waiters and i.weight > 0 and not bw.throttled(i) for i in sched.instances.values())
            since = self._free_since[g]
            if waiting and not sched.rq.held():
                if since is None:
                    self._free_since[g] = self._counted[g] = t
            elif since is not None:
                self.free_waiting[g] += t - self._counted[g]
                self.longest_free[g] = max(self.longest_free[g], t - since)
                self._free_since[g] = None

    def run(self, until_ns: int, max_events: int = 1_000_000) -> None:
        """Run the clients, ticks and actions up to ``until_ns``."""
        while self._heap and self._heap[0][0] <= until_ns:
            t, _, kind, key, gpu = heapq.heappop(self._heap)
            self.events += 1
            if self.events > max_events:
                raise RuntimeError(f"event storm at {self.now}")
            self.now = t
            if kind == "tick":
                self._ticks.discard(t)
                self._tick()
            elif kind == "call":
                self._calls.pop(key)()
            else:
                c = self.clients[(key, gpu)]
                if kind == "op":
                    c.running = False
                    if not c.dead:
                        self.useful[(c.name, c.gpu)] += c.op_ns
                        self.apply(self._work(c))
                else:
                    self.apply(self._work(c))
            self._track(t)
            self._arm()
        self.now = until_ns
        self._track(until_ns)
        for g, since in self._free_since.items():  # an interval still open counts up to now
            if since is not None:
                self.free_waiting[g] += until_ns - self._counted[g]
                self._counted[g] = until_ns
                self.longest_free[g] = max(self.longest_free[g], until_ns - since)
