"""The client's measure of what a lease lost at its start: the wake-up, and the warm-up against the
settled pace, on synthetic use times (ns)."""

from __future__ import annotations

import pytest

from libcgpu_client.warmup import NEVER, SETTLE_NS, WarmupMeter

MS = 1_000_000


def lease(m: WarmupMeter, granted: int, first: int, gaps: list[int], at_use: bool = True) -> int:
    """A lease granted at ``granted``, first used at ``first``, then one use after each gap; returns lost."""
    m.begin(granted)
    uses, t, due = 1, first, m.mark(first, 1)
    for gap in gaps:
        t += gap
        uses += 1
        if t >= due:
            due = m.mark(t, uses)
    return m.lost(t, uses, at_use)


def test_wake_up_alone_before_any_pace_is_known() -> None:
    m = WarmupMeter()
    assert lease(m, 0, 700_000, [500_000] * 8) == 700_000


def test_warm_up_is_the_slowness_of_the_first_stretch_against_the_settled_pace() -> None:
    """Settled ops take 0.4 ms; a lease whose first 10 ops take 0.6 ms lost 10 x 0.2 ms, plus its wake-up."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 120)  # 48 ms at the settled pace: learns it after the first 20 ms
    assert m.paces and m.paces[-1] == pytest.approx(400_000)
    lost = lease(m, 0, 300_000, [600_000] * 10 + [400_000] * 6)  # 8.4 ms, shorter than the first stretch
    assert lost == pytest.approx(300_000 + 10 * 200_000, abs=1)


def test_a_long_lease_counts_only_its_first_stretch() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 120)
    gaps = [700_000] * 5 + [400_000] * 200  # 1.5 ms slow, then 80 ms settled
    assert lease(m, 0, 0, gaps) == pytest.approx(5 * 300_000, abs=1)


def test_a_lease_that_ends_idle_in_its_first_stretch_reports_its_wake_up_only() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 120)
    assert lease(m, 0, 200_000, [600_000] * 3, at_use=False) == 200_000


def test_asynchronous_devices_report_the_wake_up_only() -> None:
    m = WarmupMeter(estimate_warmup=False)
    lease(m, 0, 0, [400_000] * 120)
    assert lease(m, 0, 150_000, [600_000] * 10) == 150_000


def test_marks_are_due_at_the_first_use_and_at_the_end_of_the_first_stretch() -> None:
    m = WarmupMeter()
    m.begin(0)
    assert m.mark(5 * MS, 1) == 5 * MS + SETTLE_NS
    assert m.mark(5 * MS + SETTLE_NS, 40) == NEVER
