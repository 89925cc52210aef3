"""What a lease loses at its start, as the client sees it, for the daemon to bill to nobody.

Two parts: the *wake-up*, from the grant's arrival to the first use of the lease
(a thread woken, a process scheduled), and the *warm-up*: a process that gets
the device back runs its first operations slower (cold caches, threads asleep)
for up to tens of milliseconds. The warm-up is estimated where operations run
synchronously (the CPU as simulated GPU): the first :data:`SETTLE_NS` of a lease
are compared with the same process's *settled* pace, uses per ns measured after
that point in earlier leases (the median of the last few). Uses are whatever the
gate counts, so only the ratio matters. Where operations are asynchronous (CUDA)
only the wake-up is reported.
"""

from __future__ import annotations

import statistics
from collections import deque

SETTLE_NS = 20_000_000  # a lease's first 20 ms may run slow; after that its pace is the settled one
MIN_USES = 8  # a settled stretch with fewer uses says too little about the pace
NEVER = 2**63 - 1


class WarmupMeter:
    """Per lease: when it was first used, when its pace settled; across leases: the settled pace."""

    def __init__(self, estimate_warmup: bool = True) -> None:
        self.estimate_warmup = estimate_warmup
        self.paces: deque[float] = deque(maxlen=15)  # ns per use, in settled stretches
        self.granted_at = self.settled = 0
        self.first = -1  # not used yet
        self.first_uses = self.settled_uses = 0

    def begin(self, granted_at: int) -> None:
        """A lease arrived at ``granted_at``."""
        self.granted_at, self.first, self.settled = granted_at, -1, 0

    def mark(self, now: int, uses: int) -> int:
        """The lease is used at ``now`` (``uses`` counted so far); returns when the next mark is due."""
        if self.first < 0:
            self.first, self.first_uses = now, uses
            return now + SETTLE_NS
        self.settled, self.settled_uses = now, uses
        return NEVER

    def lost(self, now: int, uses: int, at_use: bool) -> int:
        """What the lease lost at its start, as it ends at ``now``; ``at_use``: at a use (work went on to its
        end), so its last stretch is a measure of pace."""
        if self.first < 0:
            return 0
        wake = max(0, self.first - self.granted_at)
        if self.settled and at_use and uses - self.settled_uses >= MIN_USES:
            self.paces.append((now - self.settled) / (uses - self.settled_uses))
        if not self.estimate_warmup or not self.paces:
            return wake
        if self.settled:
            end, n = self.settled, self.settled_uses - self.first_uses
        elif at_use:
            end, n = now, uses - self.first_uses
        else:
            return wake  # it ended idle within its first stretch: nothing to compare
        span = end - self.first
        slow = span - n * statistics.median(self.paces)
        return wake + int(min(max(0.0, slow), span))
