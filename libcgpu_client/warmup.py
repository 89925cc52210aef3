"""What a lease loses at its start, as the client sees it, for the daemon to bill to nobody.

Two parts: the *wake-up*, from the grant's arrival to the first use of the lease
(a thread woken, a process scheduled), and the *warm-up*: a process that gets
the device back runs slower for a while (cold caches, threads asleep, and on a
virtual machine cores that slept: tens of ms there). Where operations run
synchronously (the CPU as simulated GPU) the warm-up is the lease's shortfall
against the process's settled pace: time used, less uses times that pace. The
pace is sampled in 20 ms chunks of each lease after its first
:data:`SETTLE_NS`, and the settled pace is the median of the last 64 chunks, so
the estimate is unbiased: it can come out below zero, where a lease ran faster
than usual. Uses are whatever the gate counts, so only the ratio matters. Where
operations are asynchronous (CUDA) only the wake-up is reported. The daemon
bounds what a report can change in a bill (arbiterd.core.accounting).
"""

from __future__ import annotations

import statistics
from collections import deque

SETTLE_NS = 50_000_000  # a lease's first 50 ms may run slow: its pace is measured after them ...
CHUNK_NS = 20_000_000  # ... in chunks of 20 ms, each one a sample
MIN_USES = 4  # a chunk with fewer uses says too little about the pace
PACES = 64
NEVER = 2**63 - 1


class WarmupMeter:
    """Per lease: when it was first used and how far it got; across leases: the best pace."""

    def __init__(self, estimate_warmup: bool = True) -> None:
        self.estimate_warmup = estimate_warmup
        self.paces: deque[float] = deque(maxlen=PACES)  # ns per use, in chunks after a lease's first 20 ms
        self.granted_at = 0
        self.first = -1  # not used yet
        self.first_uses = 0
        self.mark_at, self.mark_uses, self.chunks = 0, 0, 0  # the last mark, and how many marks since first

    def begin(self, granted_at: int) -> None:
        """A lease arrived at ``granted_at``."""
        self.granted_at, self.first, self.chunks = granted_at, -1, 0

    def mark(self, now: int, uses: int) -> int:
        """The lease is used at ``now`` (``uses`` counted so far); returns when the next mark is due."""
        if self.first < 0:
            self.first, self.first_uses = now, uses
        elif self.chunks:  # a chunk after the first stretch: a sample of the pace
            self._sample(now, uses)
        if self.first != now:
            self.chunks += 1
        self.mark_at, self.mark_uses = now, uses
        return now + (SETTLE_NS if self.first == now else CHUNK_NS)

    def _sample(self, now: int, uses: int) -> None:
        if uses - self.mark_uses >= MIN_USES:
            self.paces.append((now - self.mark_at) / (uses - self.mark_uses))

    def pace(self) -> float | None:
        """The process's settled pace (ns per use): the median of the last chunks."""
        if not self.paces:
            return None
        return statistics.median(self.paces)

    def lost(self, now: int, uses: int, at_use: bool) -> int:
        """What the lease lost (ns; below 0 where it ran faster than usual), as it ends at ``now``;
        ``at_use``: at a use (work went on to its end)."""
        if self.first < 0:
            return 0
        wake = max(0, self.first - self.granted_at)
        if at_use and self.chunks:
            self._sample(now, uses)
        pace = self.pace()
        if not self.estimate_warmup or pace is None:
            return wake
        if at_use:
            end, n = now, uses - self.first_uses
        elif self.chunks:
            end, n = self.mark_at, self.mark_uses - self.first_uses  # it ended idle: up to its last mark
        else:
            return wake  # it ended idle within its first stretch: nothing to compare
        span = end - self.first
        return wake + int(min(max(-span, span - n * pace), span))
