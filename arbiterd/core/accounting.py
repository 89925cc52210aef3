"""What a hand-over costs, measured on every lease, so that nobody is billed for it and the slice fits it.

A lease's *overhead* is the part of it nobody could use: the grant's and the
release's transit (what the daemon held minus what the client saw, ``used_ns``),
plus what the client reports as lost at the start (``warmup_ns``: from the
grant's arrival to its first gated use, and the slowness of its first
operations; an unbiased estimate, so it may be below zero). Each lease is
billed its held time less its own overhead, kept within the GPU's median plus or
minus three interquartile ranges, so that a client that misreports gains little.
The mean of the recent overheads, each kept so, is the GPU's *expected*
overhead (each instance keeps its own as well, which lengthens its turns so
that they hold their nominal useful time; scheduler.py), and it sizes
``slice_ms = auto``: the shortest slice whose hand-over stays at or under
``handover_target_pct`` %.

The expected overhead sizes every tenant's slice, so an instance whose clients
report a warm-up below zero on average counts there as reporting none (each
sample ``sized_ns``); the median and the bounds, which bill, keep every claim.
One client's word, a liar's or a stale estimate's, would otherwise cut the
slice to its floor (arbiterd.core.credit).

The meter also keeps the two parts of the recent samples apart, unclamped, to
say where a GPU's hand-overs go: the *transit* (the daemon's work and the
messages', from the grant to the client and from its release back) and the
*warm-up* (the client's: its wake-up to the first use, and its slow first
operations). They bill nothing and size nothing.
"""

from __future__ import annotations

import bisect
from collections import deque

from arbiterd.core.effects import NS_PER_MS

SAMPLES = 63
SAMPLE_MAX_NS = 100 * NS_PER_MS  # a longer gap is a stall, not a hand-over
SPREAD = 3  # a lease's overhead counts within the median plus or minus this many interquartile ranges
FLOOR_NS = 100_000  # ... and this much, so that identical samples do not pin every bill to one value
REFRESH = 8  # the median moves slowly: it is recomputed every REFRESH samples
BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, float("inf"))


class HandoverMeter:
    """The running median of one GPU's hand-over overhead, and a histogram of every sample."""

    def __init__(self) -> None:
        self.samples: deque[int] = deque(maxlen=SAMPLES)
        self.warmups: deque[int] = deque(maxlen=SAMPLES)  # the part of each sample the client reported
        self.sized: deque[int] = deque(maxlen=SAMPLES)  # each sample as the slice is sized from it
        self.count = 0
        self.median = 0
        self.expected = 0  # the mean of the recent overheads as sized, each kept within [lo, hi]
        self.lo = self.hi = 0  # the bounds a lease's overhead is kept within
        self.buckets = [0] * len(BUCKETS)
        self.sum_ns = 0

    def observe(self, overhead_ns: int, warmup_ns: int = 0, sized_ns: int | None = None) -> bool:
        """Record one lease's overhead, of which ``warmup_ns`` the client reported, and ``sized_ns``, what it
        counts for in the expected overhead (the overhead itself unless given); True when the median was
        recomputed."""
        if not -SAMPLE_MAX_NS <= overhead_ns <= SAMPLE_MAX_NS:
            return False
        self.samples.append(overhead_ns)
        self.warmups.append(warmup_ns)
        self.sized.append(overhead_ns if sized_ns is None else sized_ns)
        self.count += 1
        self.sum_ns += max(0, overhead_ns)
        self.buckets[bisect.bisect_left(BUCKETS, max(0, overhead_ns) / 1e9)] += 1
        if self.count % REFRESH != 1:
            return False
        ordered = sorted(self.samples)
        n = len(ordered)
        self.median = ordered[n // 2]
        spread = SPREAD * (ordered[3 * n // 4] - ordered[n // 4]) + FLOOR_NS
        lo, hi = self.lo, self.hi = self.median - spread, self.median + spread
        kept = sum(min(hi, max(lo, x)) for x in self.sized)  # each sample within [lo, hi]
        self.expected = max(0, kept // n)
        return True

    @property
    def parts(self) -> tuple[int, int]:
        """The recent samples' mean transit and mean warm-up (ns), unclamped; (0, 0) before any sample."""
        n = len(self.samples)
        if n == 0:
            return 0, 0
        warmup = sum(self.warmups) // n
        return sum(self.samples) // n - warmup, warmup

    def discount(self, overhead_ns: int) -> int:
        """The part of a lease with this overhead that is billed to nobody (below 0: billed more)."""
        return max(self.lo, min(overhead_ns, self.hi))

    def auto_slice_ns(self, target_pct: int, lo_ms: int, hi_ms: int) -> int:
        """The shortest whole-ms slice whose hand-over costs at most ``target_pct`` % of it, in bounds."""
        want = -(-self.expected * 100 // (target_pct * NS_PER_MS))  # ceil, in ms
        return max(lo_ms, min(hi_ms, want)) * NS_PER_MS

    def shortest_slice_ns(self, max_pct: int) -> int:
        """The shortest slice whose hand-over costs at most ``max_pct`` % of it (ns)."""
        return -(-self.expected * 100 // max_pct)


OWN_HANDOVER_LEASES = 16  # an instance's expected hand-over is a running mean over about this many leases


def running_mean(mean: int, sample: int, n: int, signed: bool = False) -> int:
    """A running mean over about OWN_HANDOVER_LEASES samples; over the first ones, their plain mean (``mean`` below
    0: none yet, unless ``signed``: a mean that may be below 0, which ``n`` alone starts)."""
    if n <= 1 or (mean < 0 and not signed):
        return sample
    return mean + (sample - mean) // min(n, OWN_HANDOVER_LEASES)
