"""What the daemon counts as it talks to clients: grants, their latency, revokes, bad frames."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

GRANT_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                         2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))
# the same bounds in whole ns (each is one), so a grant is counted with integers only
_BOUNDS_NS = tuple(round(b * 1e9) for b in GRANT_LATENCY_BUCKETS[:-1])
# identity: who it is could not be told; busy: max_clients; uid, instance: that tenant's cap; unread: replies
# left unread past max_unread_bytes; idle: greeted but never registered
REFUSALS = ("identity", "busy", "uid", "instance", "unread", "idle")


@dataclass(slots=True)
class Counters:
    grants_sent: int = 0
    grant_buckets: list[int] = field(default_factory=lambda: [0] * len(GRANT_LATENCY_BUCKETS))
    grant_latency_ns: int = 0
    revokes_sent: int = 0
    bad_frames: int = 0
    # connections refused or closed to protect the others, by reason
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))

    def granted(self, waited_ns: int) -> None:
        """A grant went out after its request waited ``waited_ns``."""
        self.grants_sent += 1
        self.grant_latency_ns += waited_ns
        self.grant_buckets[bisect.bisect_left(_BOUNDS_NS, waited_ns)] += 1  # first bound >= it (+Inf past the last)

    @property
    def grant_latency_sum(self) -> float:
        """Seconds waited by every grant sent."""
        return self.grant_latency_ns / 1e9

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """(upper bound, count at or below it), as a Prometheus histogram wants them."""
        out = []
        acc = 0
        for bound, count in zip(GRANT_LATENCY_BUCKETS, self.grant_buckets, strict=True):
            acc += count
            out.append((bound, acc))
        return out
