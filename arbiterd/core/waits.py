"""Each instance's grant waits over a window: the time from wanting the GPU to being granted it.

The wait is the round's counterpart as a tenant sees it: a bursty inference tenant on a GPU shared by twelve busy
ones waits up to a round for each burst. ``status``, ``cgpu-smi`` and the metrics show its p50 and p99 over the
last :data:`WINDOW_NS`; at most :data:`KEEP` waits are kept per instance (the oldest go first), so the memory is
bounded whatever the grant rate.
"""

from __future__ import annotations

import math
from collections import deque

from arbiterd.core.effects import NS_PER_MS

WINDOW_NS = 60_000 * NS_PER_MS  # the window the quantiles are taken over (the fairness windows' longest but one)
KEEP = 4096  # waits kept per instance: a minute of grants at about 68 per second


def quantile(ordered: list[int], q: float) -> int:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of a non-empty sorted list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class GrantWaits:
    """The waits of each instance of one GPU, on the core's clock (ns)."""

    __slots__ = ("_waits",)

    def __init__(self) -> None:
        self._waits: dict[str, deque[tuple[int, int]]] = {}

    def record(self, name: str, now: int, wait_ns: int) -> None:
        """A client of ``name`` was granted the GPU at ``now`` after waiting ``wait_ns``."""
        waits = self._waits.get(name)
        if waits is None:
            waits = self._waits[name] = deque(maxlen=KEEP)
        waits.append((now, max(0, wait_ns)))

    def quantiles(self, name: str, now: int, qs: tuple[float, ...] = (0.5, 0.99)) -> list[int] | None:
        """The ``qs`` quantiles of ``name``'s waits granted within :data:`WINDOW_NS` of ``now`` (None: none)."""
        waits = self._waits.get(name)
        if not waits:
            return None
        since = now - WINDOW_NS
        while waits and waits[0][0] < since:  # drop what has left the window
            waits.popleft()
        if not waits:
            return None
        ordered = sorted(w for _, w in waits)
        return [quantile(ordered, q) for q in qs]

    def forget(self, name: str) -> None:
        """``name`` is gone."""
        self._waits.pop(name, None)
