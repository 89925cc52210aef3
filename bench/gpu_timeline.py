"""The timeline of a pair of tenants in bench.gpu's framework parts, and what the daemon billed along it.

One sitting per way of sharing: the two tenants are started together and warmed up, then, per variant, A runs
alone, B runs alone, and both run together (the pair). Each window starts with a settle (a step in flight from the
window before ends, a policy switch takes effect) and is measured after it. Windows are long enough for tens of
steps of the slowest tenant: ``x_s`` alone, ``p_s`` the pair, at least 10 and 30 warm steps (timed while both warmed
up at once, so a weight-1 tenant's step in the pair), but no more than three times ``x_s`` and ``p_s``.

Along it the proof can act at set times (:class:`Events`): switch the GPU's policy, and read the daemon's held
time of each instance at the edges of each measured window, so that a window's held time is the daemon's own bill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]
S = 1_000_000_000


@dataclass(frozen=True)
class Window:
    variant: str
    who: str  # "A", "B" (alone) or "AB" (the pair)
    run: Span  # when its tenants may start steps
    measure: Span  # the part of it that is measured


def timeline(t0: int, variants: list[str], step_s: dict[str, float], x_s: float, p_s: float,
             order: tuple[str, ...] = ("A", "B", "AB")) -> list[Window]:
    """The windows from ``t0`` (ns), per variant in ``order``."""
    windows = []
    t = t0
    for v in variants:
        st = step_s.get(v, 0.0)
        settle = int(max(0.3, 3 * st) * S)
        for who in order:
            want = (x_s, 10 * st) if len(who) == 1 else (p_s, 30 * st)
            length = int(min(max(want), 3 * want[0]) * S)
            windows.append(Window(v, who, (t, t + settle + length), (t + settle, t + settle + length)))
            t += settle + length
    return windows


def plan_of(who: str, windows: list[Window]) -> list[tuple[str, int, int]]:
    """Tenant ``who``'s windows: (variant, start, end)."""
    return [(w.variant, *w.run) for w in windows if who in w.who]


def length_s(windows: list[Window]) -> float:
    return (windows[-1].run[1] - windows[0].run[0]) / S if windows else 0.0


class Events:
    """Actions at set times, done in time order by :meth:`run` (which sleeps until each)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int, Callable[[], None]]] = []

    def at(self, t: int, action: Callable[[], None]) -> None:
        self.items.append((t, len(self.items), action))

    def run(self) -> None:
        for t, _, action in sorted(self.items, key=lambda e: (e[0], e[1])):
            time.sleep(max(0.0, (t - time.monotonic_ns()) / 1e9))
            action()


class Bills:
    """The daemon's held and throttled time of each instance, read at the edges of the measured windows."""

    def __init__(self, status: Callable[[], dict[str, Any]], gpu: int = 0) -> None:
        self.status, self.gpu = status, gpu
        self.reads: dict[tuple[int, str], tuple[int, dict[str, tuple[float, float]], dict[str, Any]]] = {}

    def read(self, key: tuple[int, str]) -> Callable[[], None]:
        def read() -> None:
            g = self.status()["gpus"][self.gpu]
            self.reads[key] = (time.monotonic_ns(), {i["id"]: (i["held_seconds"], i.get("throttled_seconds", 0.0))
                                                     for i in g["instances"]},
                               {"slice_ms": g.get("slice_effective_ms"), "handover_ms": g.get("handover_ms"),
                                "policy": g.get("policy")})
        return read

    def plan(self, events: Events, windows: list[Window]) -> None:
        for k, w in enumerate(windows):
            events.at(w.measure[0], self.read((k, "start")))
            events.at(w.measure[1], self.read((k, "end")))

    def held(self, k: int, instance: str) -> tuple[float, float, float] | None:
        """In window ``k``: ``instance``'s held seconds, throttled seconds, and the seconds between the reads."""
        a, b = self.reads.get((k, "start")), self.reads.get((k, "end"))
        if a is None or b is None or instance not in a[1] or instance not in b[1]:
            return None
        return (b[1][instance][0] - a[1][instance][0], b[1][instance][1] - a[1][instance][1], (b[0] - a[0]) / S)

    def gpu_at_end(self, k: int) -> dict[str, Any]:
        got = self.reads.get((k, "end"))
        return got[2] if got else {}
