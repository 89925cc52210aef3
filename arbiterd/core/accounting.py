"""What a hand-over costs, measured, so that nobody is billed for it.

The grant's and the release's transit are charged to nobody: each client reports
how long it saw its lease (``used_ns``), and the difference from what the daemon
saw is the transit. Samples up to :data:`HANDOFF_MAX_NS` feed a running median of
the GPU's hand-over, and a lease is discounted by its own transit but never by
more than that median, so a client that under-reports gains no more than every
client gets. Otherwise the weight-1 instance, which changes hands twice as often
per unit of share as the weight-2 one, would pay twice the overhead.
"""

from __future__ import annotations

from collections import deque

HANDOFF_SAMPLES = 63
HANDOFF_MAX_NS = 1_000_000  # a transit longer than 1 ms is not a hand-over sample


class HandoverMeter:
    """The running median of one GPU's hand-over transit."""

    def __init__(self) -> None:
        self.samples: deque[int] = deque(maxlen=HANDOFF_SAMPLES)
        self.count = 0
        self.median = 0

    def discount(self, held: int, used: int) -> int:
        """The part of a lease held for ``held`` ns (daemon) and ``used`` ns (client) charged to nobody."""
        gap = held - used
        if gap < 0:
            return 0
        if gap <= HANDOFF_MAX_NS:
            self.samples.append(gap)
            self.count += 1
            if self.count % 16 == 1:  # the median moves slowly: refresh it now and then
                ordered = sorted(self.samples)
                self.median = ordered[len(ordered) // 2]
        return min(gap, self.median)
