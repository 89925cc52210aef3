"""Collective spin as the clients see it (behaviour §11, "Visible"): what ``libcgpu.so`` reports with its releases.

A client's shim counts, on each GPU, the time its collective kernels waited for a peer rank's launch of the same
collective (its board, ``board.c``), and sends what it counted since its last release there as ``spin_ns``. The
daemon cannot see a kernel wait, so it bounds what it believes by what it can check: a client's collectives on one
GPU cannot have waited longer, all together, than the wall time since the client registered. A report past that
is cut to it (and said once per client), and a negative one is refused before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arbiterd.core.errors import SettingError


@dataclass(slots=True)
class SpinTally:
    """One client's spin reports: since when it could count, what it reported on each GPU, whether one was cut."""

    since: int = 0
    told: dict[int, int] = field(default_factory=dict)
    cut: bool = False


def check(spin_ns: int) -> None:
    """Refuse a report no client can make (SettingError: the release is refused, nothing changes)."""
    if spin_ns < 0:
        raise SettingError(f"release: spin_ns {spin_ns} is negative (a collective's wait is 0 or more)")


def accept(tally: SpinTally, gpu: int, spin_ns: int, now: int) -> int:
    """The part of a report of ``spin_ns`` on ``gpu`` at ``now`` that is counted: all of it, unless the client's
    reports there would pass the wall time since it registered."""
    told = tally.told.get(gpu, 0)
    kept = max(0, min(spin_ns, now - tally.since - told))
    tally.told[gpu] = told + kept
    return kept
