"""Each instance's grant waits over a window (arbiterd.core.waits): nearest-rank quantiles, the window, the cap."""

from __future__ import annotations

from arbiterd.core.effects import NS_PER_MS
from arbiterd.core.waits import KEEP, WINDOW_NS, GrantWaits, quantile


def test_nearest_rank_quantiles() -> None:
    ordered = list(range(1, 101))
    assert quantile(ordered, 0.5) == 50
    assert quantile(ordered, 0.99) == 99
    assert quantile(ordered, 1.0) == 100
    assert quantile([7], 0.99) == 7


def test_waits_leave_the_window_and_none_means_nothing_granted() -> None:
    w = GrantWaits()
    assert w.quantiles("a", 0) is None
    for k in range(10):  # ten waits of 1..10 ms at 1 s apart
        w.record("a", k * 1000 * NS_PER_MS, (k + 1) * NS_PER_MS)
    assert w.quantiles("a", 9000 * NS_PER_MS) == [5 * NS_PER_MS, 10 * NS_PER_MS]
    # 65 s on, the first six have left the 60 s window
    assert w.quantiles("a", WINDOW_NS + 5500 * NS_PER_MS) == [8 * NS_PER_MS, 10 * NS_PER_MS]
    assert w.quantiles("a", WINDOW_NS + 10_000 * NS_PER_MS) is None
    assert w.quantiles("b", 0) is None


def test_the_oldest_go_first_past_the_cap_and_forget_drops_all() -> None:
    w = GrantWaits()
    for k in range(KEEP + 100):
        w.record("a", k, 1 if k < 100 else 2)  # the first 100 are pushed out by the cap
    assert w.quantiles("a", KEEP + 100, (0.0001,)) == [2]
    w.record("b", 0, -5)  # a clock step back is no wait, not a negative one
    assert w.quantiles("b", 0) == [0, 0]
    w.forget("a")
    assert w.quantiles("a", KEEP + 100) is None
