"""What a lease loses at its start, as the client sees it, for the daemon to bill to nobody.

Two parts: the *wake-up*, from the grant's arrival to the first use of the lease
(a thread woken, a process scheduled), and the *warm-up*: a process that gets
the device back runs slower for a while (cold caches, threads asleep, and on a
virtual machine cores that slept). Where operations run synchronously (the CPU
as simulated GPU) the warm-up is the shortfall of the lease's first stretch
(its first :data:`SETTLE_NS`, or the whole of a shorter lease) against the
process's settled pace: time used, less uses times that pace. The settled pace
is sampled in chunks of up to 20 ms after a lease's first stretch, where the
process has settled, and is the total time over the total uses of the last 64
chunks: the mean, not the median, because stalls and slow operations belong to
running, not to the hand-over, so the estimate is unbiased (it can come out
below zero, where a lease started faster than usual). Only the first stretch is
compared because a pace that is off by a little, times a long lease, would
swamp a hand-over of a millisecond.

A short lease is compared whole, and never samples the pace: its second half is
still warming up (on this project's 2-core VM, 5 ms turns of 0.5 ms operations
ran 1-5 % slow to their end), so a pace learnt there reads slow and a lease's
loss short by a fixed amount per lease. A tenant with shorter turns (weight 1
beside weight 2 on policy 2) then pays more of it per second held, and 1:2 of
useful time gave 2.05-2.09 of throughput. A process whose leases are all short
keeps the pace of its last long lease (running alone, or a turn past 50 ms,
which ``slice_ms = auto`` reaches when hand-overs cost much); if its speed
drifts meanwhile, the error is in proportion to each lease's length, so bills
stay in proportion between tenants while the measured hand-over reads high or
low. With no long lease yet only the wake-up is reported. Uses are whatever the
gate counts, so only the ratio matters. Where operations are asynchronous
(CUDA) only the wake-up is reported. The daemon bounds what a report can change
in a bill (arbiterd.core.accounting).
"""

from __future__ import annotations

from collections import deque

SETTLE_NS = 50_000_000  # a lease's first 50 ms may run slow: its pace is measured after them ...
CHUNK_NS = 20_000_000  # ... in chunks of 20 ms, each one a sample
MIN_USES = 4  # a chunk with fewer uses says too little about the pace
PACES = 64
NEVER = 2**63 - 1


class WarmupMeter:
    """Per lease: when it was first used and how far its first stretch got; across leases: the settled pace."""

    def __init__(self, estimate_warmup: bool = True) -> None:
        self.estimate_warmup = estimate_warmup
        self.paces: deque[tuple[int, int]] = deque(maxlen=PACES)  # (ns, uses) of chunks after a first stretch
        self._ns = self._uses = 0  # their sums
        self.granted_at = 0
        self.deadline = NEVER
        self.first = -1  # not used yet
        self.first_uses = 0
        self.settled_at, self.settled_uses = -1, 0  # the end of the first stretch (-1: not reached)
        self.mark_at, self.mark_uses = 0, 0  # the last mark

    def begin(self, granted_at: int, deadline: int = NEVER) -> None:
        """A lease arrived at ``granted_at``, to end at ``deadline``."""
        self.granted_at, self.deadline, self.first, self.settled_at = granted_at, deadline, -1, -1

    def mark(self, now: int, uses: int) -> int:
        """The lease is used at ``now`` (``uses`` counted so far); returns when the next mark is due."""
        if self.first < 0:
            self.first, self.first_uses = now, uses
        elif self.settled_at < 0:
            self.settled_at, self.settled_uses = now, uses
        else:  # a chunk after the first stretch: a sample of the pace
            self._sample(now, uses)
        self.mark_at, self.mark_uses = now, uses
        if self.first == now:  # the first stretch: SETTLE_NS, or the whole of a shorter lease
            return now + min(SETTLE_NS, max(0, self.deadline - now))
        return now + CHUNK_NS

    def _sample(self, now: int, uses: int) -> None:
        if uses - self.mark_uses < MIN_USES:
            return
        if len(self.paces) == self.paces.maxlen:
            ns, n = self.paces[0]
            self._ns, self._uses = self._ns - ns, self._uses - n
        sample = (now - self.mark_at, uses - self.mark_uses)
        self.paces.append(sample)
        self._ns, self._uses = self._ns + sample[0], self._uses + sample[1]

    def pace(self) -> float | None:
        """The process's settled pace (ns per use): total time over total uses of the last chunks."""
        return self._ns / self._uses if self._uses else None

    def lost(self, now: int, uses: int, at_use: bool) -> int:
        """What the lease lost (ns; below 0 where it started faster than usual), as it ends at ``now``;
        ``at_use``: at a use (work went on to its end)."""
        if self.first < 0:
            return 0
        wake = max(0, self.first - self.granted_at)
        if at_use and self.settled_at >= 0:
            self._sample(now, uses)
        pace = self.pace()
        if not self.estimate_warmup or pace is None:
            return wake
        if self.settled_at >= 0:
            end, n = self.settled_at, self.settled_uses - self.first_uses
        elif at_use:
            end, n = now, uses - self.first_uses
        else:
            return wake  # it ended idle within its first stretch: nothing to compare
        span = end - self.first
        return wake + int(min(max(-span, span - n * pace), span))
