"""What a lease loses at its start, as the client sees it, for the daemon to bill to nobody.

Two parts: the *wake-up*, from the grant's arrival to the first use of the lease
(a thread woken, a process scheduled), and the *warm-up*: a process that gets
the device back runs slower for a while (cold caches, threads asleep, and on a
virtual machine cores that slept). Where operations run synchronously (the CPU
as simulated GPU) the warm-up is the shortfall of the lease's first stretch
(the operations that start in its first :data:`SETTLE_NS`, all of a shorter
lease) against what they usually take.

Each use of the lease starts an *operation*, which lasts until the next use; the
caller names what kind it is (the layer, or the operator and its input's shape),
because a model's operations differ by orders of magnitude (a ResNet's
convolutions against its ReLUs) and a lease starts wherever the last one left
off. What an operation usually takes is two factors: the process's *speed*,
the total time over the total cost of the operations in the last 64 chunks of
about 20 ms after first stretches (the machine's pace, which drifts by the
second on a busy host), and its kind's *cost*, the mean of its own durations
after first stretches, each divided by the speed of its time (over about its
last 1024 runs: what a layer costs beside the others barely moves, so the
speed alone follows the machine). Means, not medians, because stalls and slow operations belong to
running, not to the hand-over, so the estimate is unbiased (it can come out
below zero, where a lease started faster than usual). Only the first stretch is
compared because a speed that is off by a little, times a long lease, would
swamp a hand-over of a millisecond. An operation of a kind never seen settled
is not compared.

A short lease is compared whole, and teaches nothing: its second half is still
warming up, so costs learnt there would read slow and a lease's loss short by a
fixed amount per lease. A tenant with shorter turns (weight 1 beside weight 2
on policy 2) would then pay more of it per second held, and get less than its
share of throughput. A process whose leases are all short keeps
what its last long lease taught (running alone, or a turn past 50 ms, which
``slice_ms = auto`` reaches when hand-overs cost much); if its speed drifts
meanwhile, the error is in proportion to each lease's length, so bills stay in
proportion between tenants while the measured hand-over reads high or low. With
nothing learnt yet only the wake-up is reported.

A pace can also be stale the other way round, and then it must be forgotten: a
process that learnt it in a slow spell (alone, while another tenant's
interpreter was starting on the same cores) reads every later short lease as
faster than usual, a loss below zero in proportion to the lease. Beside a
tenant that never learnt a pace (it never had a long lease) and so reports
only its wake-up, that tenant is billed more than it held. A warm-up is not
below zero on average, so where the first stretches of the last compared leases
(at least :data:`CHECK_LEASES` of them and :data:`CHECK_NS` of their time) ran,
in sum, faster than the pace by more than :data:`STALE_PCT` % of their time,
everything learnt is forgotten and only the wake-up is reported until a long
lease teaches it again. The check needs that much evidence, and that margin,
because a sound pace also reads faster than usual in some blocks of leases.

Where operations are asynchronous (CUDA) only the wake-up is reported. The
daemon bounds what a report can change in a bill (arbiterd.core.accounting).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

SETTLE_NS = 50_000_000  # a lease's first 50 ms may run slow: costs and speed are learnt after them ...
CHUNK_NS = 20_000_000  # ... the speed in chunks of about 20 ms, each one a sample
MIN_OPS = 4  # a chunk with fewer operations says too little about the speed
SPEEDS = 64
COST_RUNS = 1024  # a kind's cost: the mean of about its last 1024 runs (an exponential window)
MAX_KINDS = 4096  # past this many kinds of operation, what was learnt of their costs starts over
NEVER = 2**63 - 1
CHECK_LEASES = 16  # a pace is checked against the first stretches of at least this many compared leases ...
CHECK_NS = 500_000_000  # ... and this much of their time ...
STALE_PCT = 3  # ... which together may not run faster than it by more than this share of their time


class WarmupMeter:
    """Per lease: when it was first used and how its first stretch ran; across leases: costs and speed."""

    _ns: float  # the speeds' sums ...
    _cost: float
    _speed: float  # ... and their ratio (1.0 until a chunk is in)
    _chunk_ns: float  # the chunk being filled
    _chunk_cost: float
    _chunk_ops: int

    def __init__(self, estimate_warmup: bool = True) -> None:
        self.estimate_warmup = estimate_warmup
        self.costs: dict[Hashable, list[float]] = {}  # kind -> [mean ns, runs counted, at most COST_RUNS]
        self.speeds: deque[tuple[float, float]] = deque(maxlen=SPEEDS)  # (ns, cost) of chunks
        self.forget()  # nothing learnt yet
        self.granted_at = 0
        self.first = -1  # not used yet
        self.settle_at = NEVER  # operations that start before this are the first stretch
        self.last_at = -1  # when the operation under way started (-1: none) ...
        self.last_kind: Hashable = None  # ... and its kind
        self.stretch_ns = self.stretch_cost = 0.0  # the first stretch's operations of known kind
        self._checked = 0  # compared leases since the pace was last checked ...
        self._checked_ns = self._checked_warm = 0.0  # ... their first stretches' time, and its warm-up in sum

    def begin(self, granted_at: int) -> None:
        """A lease arrived at ``granted_at``."""
        self.granted_at, self.first, self.settle_at, self.last_at = granted_at, -1, NEVER, -1
        self.stretch_ns = self.stretch_cost = 0.0

    def use(self, now: int, kind: Hashable = None) -> None:
        """The lease is used at ``now`` by an operation of ``kind``: the one before it has ended."""
        last = self.last_at
        if last < 0:
            if self.first < 0:
                self.first, self.settle_at = now, now + SETTLE_NS
        elif self.estimate_warmup:
            self._ran(self.last_kind, last, now - last)
        self.last_at, self.last_kind = now, kind

    def _ran(self, kind: Hashable, start: int, ns: int) -> None:
        cost = self.costs.get(kind)
        if start < self.settle_at:  # the first stretch: compared, never learnt from
            if cost is not None:
                self.stretch_ns += ns
                self.stretch_cost += cost[0]
            return
        if cost is None:
            if len(self.costs) >= MAX_KINDS:
                self.costs.clear()
            self.costs[kind] = [ns / self._speed, 1.0]
            return  # its first run says nothing about the speed
        self._chunk_ns += ns
        self._chunk_cost += cost[0]
        self._chunk_ops += 1
        runs = cost[1] + 1.0 if cost[1] < COST_RUNS else cost[1]
        cost[0] += (ns / self._speed - cost[0]) / runs
        cost[1] = runs
        if self._chunk_ns >= CHUNK_NS:
            self._close_chunk()

    def _close_chunk(self) -> None:
        if self._chunk_ops >= MIN_OPS:
            if len(self.speeds) == self.speeds.maxlen:
                ns, cost = self.speeds[0]
                self._ns, self._cost = self._ns - ns, self._cost - cost
            self.speeds.append((self._chunk_ns, self._chunk_cost))
            self._ns, self._cost = self._ns + self._chunk_ns, self._cost + self._chunk_cost
            self._speed = self._ns / self._cost
        self._chunk_ns = self._chunk_cost = 0.0
        self._chunk_ops = 0

    def speed(self) -> float | None:
        """The process's settled speed: time taken over the usual cost, in the last chunks (1.0: as usual)."""
        return self._ns / self._cost if self._cost else None

    def usual_ns(self, kind: Hashable = None) -> float | None:
        """What an operation of ``kind`` usually takes (ns), at the settled speed."""
        cost, speed = self.costs.get(kind), self.speed()
        return cost[0] * speed if cost is not None and speed is not None else None

    def lost(self, now: int, at_use: bool) -> int:
        """What the lease lost (ns; below 0 where it started faster than usual), as it ends at ``now``;
        ``at_use``: at a use (the operation under way ended there; otherwise it ended idle, and is not counted)."""
        if self.first < 0:
            return 0
        wake = max(0, self.first - self.granted_at)
        if self.estimate_warmup:
            if at_use and self.last_at >= 0:
                self._ran(self.last_kind, self.last_at, now - self.last_at)
            self._close_chunk()
        self.last_at = -1
        speed = self.speed()
        if not self.estimate_warmup or speed is None or not self.stretch_ns:
            return wake
        span = self.stretch_ns
        warm = span - self.stretch_cost * speed
        if self._stale(span, warm):
            return wake
        return wake + int(min(max(-span, warm), span))

    def _stale(self, span: float, warm: float) -> bool:
        """Count one compared lease; True where the pace proved stale (below zero on average) and was forgotten."""
        self._checked += 1
        self._checked_ns += span
        self._checked_warm += warm
        if self._checked < CHECK_LEASES or self._checked_ns < CHECK_NS:
            return False
        stale = self._checked_warm * 100 < -STALE_PCT * self._checked_ns
        self._checked, self._checked_ns, self._checked_warm = 0, 0.0, 0.0
        if stale:
            self.forget()
        return stale

    def forget(self) -> None:
        """Drop every cost and speed learnt: only the wake-up is reported until a long lease teaches them again."""
        self.costs.clear()
        self.speeds.clear()
        self._ns = self._cost = 0.0
        self._speed = 1.0
        self._chunk_ns = self._chunk_cost = 0.0
        self._chunk_ops = 0
