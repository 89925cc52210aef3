"""What a hand-over costs, measured on every lease, so that nobody is billed for it and the slice fits it.

A lease's *overhead* is the part of it nobody could use: the grant's and the
release's transit (what the daemon held minus what the client saw, ``used_ns``),
plus what the client reports as lost at the start (``warmup_ns``: from the
grant's arrival to its first gated use, and the extra time its first operations
took). Each lease is billed its held time less its own overhead, capped at
:data:`CAP_FACTOR` times the GPU's median so that a client that over-reports
gains little. The median is also the *expected* overhead, which lengthens each
turn so that it holds its nominal useful time, and it sizes ``slice_ms = auto``:
the shortest slice whose hand-over stays at or under ``handover_target_pct`` %.
"""

from __future__ import annotations

import bisect
from collections import deque

from arbiterd.core.effects import NS_PER_MS

SAMPLES = 63
SAMPLE_MAX_NS = 100 * NS_PER_MS  # a longer gap is a stall, not a hand-over
CAP_FACTOR = 3
REFRESH = 8  # the median moves slowly: it is recomputed every REFRESH samples
BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, float("inf"))


class HandoverMeter:
    """The running median of one GPU's hand-over overhead, and a histogram of every sample."""

    def __init__(self) -> None:
        self.samples: deque[int] = deque(maxlen=SAMPLES)
        self.count = 0
        self.median = 0
        self.buckets = [0] * len(BUCKETS)
        self.sum_ns = 0

    def observe(self, overhead_ns: int) -> bool:
        """Record one lease's overhead; True when the median was recomputed."""
        if not 0 <= overhead_ns <= SAMPLE_MAX_NS:
            return False
        self.samples.append(overhead_ns)
        self.count += 1
        self.sum_ns += overhead_ns
        self.buckets[bisect.bisect_left(BUCKETS, overhead_ns / 1e9)] += 1
        if self.count % REFRESH != 1:
            return False
        ordered = sorted(self.samples)
        self.median = ordered[len(ordered) // 2]
        return True

    def discount(self, overhead_ns: int) -> int:
        """The part of a lease with this overhead that is billed to nobody."""
        return max(0, min(overhead_ns, CAP_FACTOR * self.median))

    def auto_slice_ns(self, target_pct: int, lo_ms: int, hi_ms: int) -> int:
        """The shortest whole-ms slice whose hand-over costs at most ``target_pct`` % of it, in bounds."""
        want = -(-self.median * 100 // (target_pct * NS_PER_MS))  # ceil, in ms
        return max(lo_ms, min(hi_ms, want)) * NS_PER_MS
