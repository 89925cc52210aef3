"""The client's measure of what a lease lost: the wake-up, and its shortfall against the process's settled
pace, on synthetic use times (ns)."""

from __future__ import annotations

import pytest

from libcgpu_client.warmup import CHUNK_NS, NEVER, SETTLE_NS, WarmupMeter

MS = 1_000_000
NS_PER_S = 1_000_000_000


def lease(m: WarmupMeter, granted: int, first: int, gaps: list[int], at_use: bool = True,
          deadline: int = NEVER) -> int:
    """A lease granted at ``granted``, first used at ``first``, then one use after each gap; returns lost."""
    m.begin(granted, deadline)
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
    lease(m, 0, 0, [400_000] * 200)  # 80 ms at the settled pace: learns it after the first 50 ms
    assert m.pace() == pytest.approx(400_000)
    lost = lease(m, 0, 300_000, [600_000] * 10 + [400_000] * 6)  # 8.4 ms, shorter than the first stretch
    assert lost == pytest.approx(300_000 + 10 * 200_000, abs=1)


def test_a_long_lease_counts_a_warm_up_of_tens_of_ms() -> None:
    """Cores that slept run slow for 45 ms, inside the first stretch: all of it is lost."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 0, [550_000] * 82 + [400_000] * 100) == pytest.approx(82 * 150_000, abs=1)


def test_the_settled_pace_is_the_mean_so_stalls_while_running_do_not_count_as_warm_up() -> None:
    """Every 17 ms of 0.4 ms ops comes a 4 ms stall: most 20 ms chunks have none, so their median would say
    0.4 ms per op; the mean says about 0.49, and a lease that runs as usual, stalls included, lost little."""
    m = WarmupMeter()
    usual = ([400_000] * 43 + [4_000_000]) * 40
    lease(m, 0, 0, usual)
    assert m.pace() == pytest.approx(sum(usual) / len(usual), rel=0.03)
    assert abs(lease(m, 0, 0, usual)) < 2 * MS  # one stall more or less in the first stretch
    assert m.pace() > 1.15 * 400_000


def test_only_the_first_stretch_is_compared_so_a_long_lease_does_not_multiply_a_pace_error() -> None:
    """The pace learnt is 0.4 ms; a 400 ms lease then runs 2 % slower throughout. Over the whole lease that
    would be 8 ms of 'warm-up'; over its first stretch it is 1 ms."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 1000)
    lost = lease(m, 0, 0, [408_000] * 980)
    first_stretch_ops = -(-50_000_000 // 408_000)  # the first use at or after 50 ms closes the stretch
    assert 0 < lost <= first_stretch_ops * 8_000  # the lease's own chunks have moved the pace a little


def test_a_lease_that_starts_faster_than_usual_is_below_zero() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 150)
    assert lease(m, 0, 0, [380_000] * 100) == -100 * 20_000  # 38 ms: the whole lease is its first stretch


def test_a_slow_start_then_settled_ops_count_only_the_slowness() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    gaps = [700_000] * 5 + [400_000] * 200  # 1.5 ms slow, then 80 ms settled
    assert lease(m, 0, 0, gaps) == pytest.approx(5 * 300_000, abs=1)


def test_a_lease_that_ends_idle_in_its_first_stretch_reports_its_wake_up_only() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 200_000, [600_000] * 3, at_use=False) == 200_000


def test_asynchronous_devices_report_the_wake_up_only() -> None:
    m = WarmupMeter(estimate_warmup=False)
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 150_000, [600_000] * 10) == 150_000


def test_marks_are_due_after_the_first_stretch_then_every_chunk() -> None:
    m = WarmupMeter()
    m.begin(0)
    assert m.mark(5 * MS, 1) == 5 * MS + SETTLE_NS
    assert m.mark(5 * MS + SETTLE_NS, 40) == 5 * MS + SETTLE_NS + CHUNK_NS


def test_a_short_lease_is_compared_whole_and_does_not_sample_the_pace() -> None:
    """5 ms leases of 0.5 ms ops whose first op is 0.3 ms slow and the rest 2 % slow to the end (still warming
    up): all of it is lost, and none of it teaches the pace, which stays the settled 0.5 ms."""
    m = WarmupMeter()
    lease(m, 0, 0, [500_000] * 200)
    for k in range(50):
        t0 = k * 10 * MS
        lost = lease(m, t0, t0, [800_000] + [510_000] * 8, deadline=t0 + 5 * MS)
        assert lost == pytest.approx(300_000 + 8 * 10_000, abs=1)
    assert m.pace() == pytest.approx(500_000)


def test_a_stale_pace_errs_in_proportion_to_the_lease_so_bills_keep_their_ratio() -> None:
    """The pace was learnt at 0.4 ms; the machine is now 25 % slower and every lease is short (5 ms turns
    of weight 1 beside 10 ms turns of weight 2). Each lease's loss reads high by 0.1 ms per op, a fifth of its
    work, so the useful time left is 80 % of the true one for both: 1:2 stays 1:2."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    short = lease(m, 0, 200_000, [500_000] * 10, deadline=5 * MS)  # 0.2 ms wake-up, then 10 ops
    long = lease(m, 0, 200_000, [500_000] * 20, deadline=10 * MS)  # 20 ops
    used_short, used_long = 200_000 + 10 * 500_000, 200_000 + 20 * 500_000
    assert (used_long - long) / (used_short - short) == pytest.approx(2.0)
    assert short == 200_000 + 10 * 100_000  # reads high: the wake-up, and 0.1 ms of each op
    assert m.pace() == pytest.approx(400_000)


def test_the_first_stretch_is_a_short_lease_whole() -> None:
    m = WarmupMeter()
    m.begin(0, 8 * MS)
    assert m.mark(2 * MS, 1) == 8 * MS
