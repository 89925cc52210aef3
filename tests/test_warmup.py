"""The client's measure of what a lease lost: the wake-up, and its first stretch against what its
operations usually take, on synthetic operation times (ns)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from libcgpu_client.warmup import CHECK_LEASES, CHECK_NS, SETTLE_NS, WarmupMeter

MS = 1_000_000


def lease(m: WarmupMeter, granted: int, first: int, ops: Sequence[int], at_use: bool = True,
          kinds: Sequence[Hashable] | None = None) -> int:
    """A lease granted at ``granted``, first used at ``first``, running operations of these durations back to
    back (of these kinds; one kind if none are given); it ends as the last one ends, at a use unless
    ``at_use`` is False (then idle). Returns what it lost."""
    m.begin(granted)
    t = first
    for i, ns in enumerate(ops):
        m.use(t, kinds[i] if kinds is not None else None)
        t += ns
    return m.lost(t, at_use)


def test_wake_up_alone_before_anything_is_learnt() -> None:
    m = WarmupMeter()
    assert lease(m, 0, 700_000, [500_000] * 8) == 700_000


def test_warm_up_is_the_slowness_of_the_first_stretch_against_the_usual() -> None:
    """Settled ops take 0.4 ms; a lease whose first 10 ops take 0.6 ms lost 10 x 0.2 ms, plus its wake-up."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)  # 80 ms at the settled pace: learns it after the first 50 ms
    assert m.usual_ns() == pytest.approx(400_000)
    lost = lease(m, 0, 300_000, [600_000] * 10 + [400_000] * 6)  # 8.4 ms, shorter than the first stretch
    assert lost == pytest.approx(300_000 + 10 * 200_000, abs=1)


def test_a_long_lease_counts_a_warm_up_of_tens_of_ms() -> None:
    """Cores that slept run slow for 45 ms, inside the first stretch: all of it is lost."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 0, [550_000] * 82 + [400_000] * 100) == pytest.approx(82 * 150_000, abs=1)


def test_the_usual_is_the_mean_so_stalls_while_running_do_not_count_as_warm_up() -> None:
    """Every 17 ms of 0.4 ms ops comes a 4 ms stall: most 20 ms chunks have none, so their median would say
    0.4 ms per op; the mean says about 0.48, and a lease that runs as usual, stalls included, lost little."""
    m = WarmupMeter()
    usual = ([400_000] * 43 + [4_000_000]) * 40
    lease(m, 0, 0, usual)
    assert m.usual_ns() == pytest.approx(sum(usual) / len(usual), rel=0.03)
    assert abs(lease(m, 0, 0, usual)) < 2 * MS  # one stall more or less in the first stretch
    assert m.usual_ns() > 1.15 * 400_000


def test_only_the_first_stretch_is_compared_so_a_long_lease_does_not_multiply_a_speed_error() -> None:
    """The usual op is 0.4 ms; a 400 ms lease then runs 2 % slower throughout. Over the whole lease that
    would be 8 ms of 'warm-up'; over its first stretch it is 1 ms."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 1000)
    lost = lease(m, 0, 0, [408_000] * 980)
    first_stretch_ops = -(-SETTLE_NS // 408_000)  # the ops that start in the first 50 ms
    assert 0 < lost <= first_stretch_ops * 8_000  # the lease's own chunks have moved the speed a little


def test_what_is_usual_follows_the_machine() -> None:
    """The machine turns 10 % slower: within a second and a half what each op usually takes says so."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 2000)
    lease(m, 0, 0, [440_000] * 3500)
    assert m.usual_ns() == pytest.approx(440_000, rel=0.01)
    m = WarmupMeter()
    model_lease(m, 0, 900)
    lease(m, 0, 0, [ns * 11 // 10 for _, ns in MODEL] * 500, kinds=[k for k, _ in MODEL] * 500)
    for kind, ns in MODEL:
        assert m.usual_ns(kind) == pytest.approx(1.1 * ns, rel=0.01)


def test_a_lease_that_starts_faster_than_usual_is_below_zero() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 150)
    assert lease(m, 0, 0, [380_000] * 100) == -100 * 20_000  # 38 ms: the whole lease is its first stretch


def test_a_slow_start_then_settled_ops_count_only_the_slowness() -> None:
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    ops = [700_000] * 5 + [400_000] * 200  # 1.5 ms slow, then 80 ms settled
    assert lease(m, 0, 0, ops) == pytest.approx(5 * 300_000, abs=1)


def test_a_lease_that_ends_idle_does_not_count_its_last_operation() -> None:
    """Ended idle: the last op's time runs on into the idle wait, so only the ops before it are compared."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 200_000, [600_000] * 3 + [9 * MS], at_use=False) == 200_000 + 3 * 200_000


def test_asynchronous_devices_report_the_wake_up_only() -> None:
    m = WarmupMeter(estimate_warmup=False)
    lease(m, 0, 0, [400_000] * 200)
    assert lease(m, 0, 150_000, [600_000] * 10) == 150_000
    assert not m.costs


def test_a_short_lease_is_compared_whole_and_teaches_nothing() -> None:
    """5 ms leases of 0.5 ms ops whose first op is 0.3 ms slow and the rest 2 % slow to the end (still warming
    up): all of it is lost, and none of it is learnt: the usual op stays the settled 0.5 ms."""
    m = WarmupMeter()
    lease(m, 0, 0, [500_000] * 200)
    for k in range(50):
        t0 = k * 10 * MS
        lost = lease(m, t0, t0, [800_000] + [510_000] * 8)
        assert lost == pytest.approx(300_000 + 8 * 10_000, abs=1)
    assert m.usual_ns() == pytest.approx(500_000)


def test_a_stale_speed_errs_in_proportion_to_the_lease_so_bills_keep_their_ratio() -> None:
    """The usual op was learnt at 0.4 ms; the machine is now 25 % slower and every lease is short (5 ms turns
    of weight 1 beside 10 ms turns of weight 2). Each lease's loss reads high by 0.1 ms per op, a fifth of its
    work, so the useful time left is 80 % of the true one for both: 1:2 stays 1:2."""
    m = WarmupMeter()
    lease(m, 0, 0, [400_000] * 200)
    short = lease(m, 0, 200_000, [500_000] * 10)  # 0.2 ms wake-up, then 10 ops
    long = lease(m, 0, 200_000, [500_000] * 20)  # 20 ops
    used_short, used_long = 200_000 + 10 * 500_000, 200_000 + 20 * 500_000
    assert (used_long - long) / (used_short - short) == pytest.approx(2.0)
    assert short == 200_000 + 10 * 100_000  # reads high: the wake-up, and 0.1 ms of each op
    assert m.usual_ns() == pytest.approx(400_000)


def test_a_pace_learnt_in_a_slow_spell_is_forgotten_once_short_leases_run_faster_than_it() -> None:
    """The demo's case: a process learnt its 1 ms ops at 1.074 ms while another's interpreter was starting, then
    gets only 17 ms turns that run at 1 ms per op. Each reads -1.2 ms lost (it would be billed more than it
    held) until enough of them (CHECK_LEASES, CHECK_NS) show the pace is stale; then it reports its wake-up
    only, like a tenant that never learnt a pace."""
    m = WarmupMeter()
    lease(m, 0, 0, [1_074_000] * 100)
    block = max(CHECK_LEASES, -(-CHECK_NS // (17 * MS)))  # the compared leases a check needs
    losses = [lease(m, 0, 100_000, [MS] * 17) for _ in range(3 * block)]
    assert losses[:block - 1] == [100_000 - 17 * 74_000] * (block - 1)
    assert losses[block - 1:] == [100_000] * (2 * block + 1)
    assert m.speed() is None and not m.costs
    lease(m, 0, 0, [MS] * 100)  # a long lease teaches the pace again
    assert m.usual_ns() == pytest.approx(MS)


def test_a_pace_that_holds_is_kept_though_single_leases_read_below_zero() -> None:
    """A warm-up of 0.3 ms on the first op of three leases in four and noise of +-0.1 ms on the rest: some leases
    read below zero, but on average the first stretches are not faster than the pace, so it is never forgotten."""
    m = WarmupMeter()
    lease(m, 0, 0, [500_000] * 200)
    noise = [100_000, -100_000, -100_000, 0, 100_000, -100_000, -100_000, 100_000]
    for k in range(4 * CHECK_NS // (5 * MS)):  # 5 ms leases: four checks
        ops = [800_000 if k % 4 else 500_000] + [500_000 + noise[(k + i) % 8] for i in range(9)]
        lease(m, 0, 0, ops)
    assert m.usual_ns() == pytest.approx(500_000)
    assert min(lease(m, 0, 0, [500_000] + [400_000] * 9), 0) < 0  # a lease may still read below zero


# a model's operations: a 3 ms convolution, a 0.2 ms norm, a 0.1 ms activation, over and over
MODEL = [("conv", 3 * MS), ("norm", 200_000), ("relu", 100_000)]


def model_lease(m: WarmupMeter, start: int, n: int, slow: dict[int, int] | None = None) -> int:
    """``n`` ops of the model from its ``start``-th; ``slow``: extra ns for the op at that place in the lease."""
    kinds = [MODEL[(start + i) % 3][0] for i in range(n)]
    ops = [MODEL[(start + i) % 3][1] + (slow or {}).get(i, 0) for i in range(n)]
    return lease(m, 0, 0, ops, kinds=kinds)


def test_each_kind_of_operation_is_compared_with_its_own_usual_time() -> None:
    """A lease that starts on the model's ReLUs and norms is compared with what those take, not with the
    model's mean op (1.1 ms): run as usual it lost nothing wherever it began, and a slow first op is seen."""
    m = WarmupMeter()
    model_lease(m, 0, 300)  # 330 ms: learns each kind after the first 50
    for start in range(3):
        assert abs(model_lease(m, start, 5)) <= 3  # rounding only: 5 ops, however many of them convolutions
    assert model_lease(m, 1, 5, slow={0: 150_000}) == pytest.approx(150_000, abs=3)


def test_one_kind_for_all_operations_misreads_a_lease_by_where_it_starts() -> None:
    """What the kinds are for: with one kind, the same model's ops are all compared with their mean, so a
    lease of ReLUs and norms 'lost' a large negative and one starting on a convolution a large positive."""
    m = WarmupMeter()
    lease(m, 0, 0, [ns for _, ns in MODEL] * 100)
    on_norm = lease(m, 0, 0, [200_000, 100_000, 3 * MS, 200_000, 100_000])
    on_conv = lease(m, 0, 0, [3 * MS, 200_000, 100_000, 3 * MS, 200_000])
    assert on_norm < -1 * MS and on_conv > 1 * MS


def test_a_kind_never_seen_settled_is_not_compared() -> None:
    m = WarmupMeter()
    model_lease(m, 0, 300)
    assert lease(m, 0, 100_000, [5 * MS, 200_000], kinds=["new", "norm"]) == 100_000
