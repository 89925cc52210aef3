"""Each row of behaviour §3's policy table and §4's high-priority rules, on the virtual clock.

Every scenario runs 20 s of virtual time. Shares are the time the simulated
ops really ran; tolerance 0.5 percentage points unless stated.
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S, GrantLease, RevokeLease
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, bursty, busy, idle
from cgpu_testing.sim import simulate as run

TOL = 0.5  # percentage points


def test_policy0_fixed_ring_max4_gives_each_a_quarter_and_leaves_half_idle() -> None:
    res = run(0, [SimInstance("A"), SimInstance("B")], max_inst=4)
    assert res.pct("A") == pytest.approx(25, abs=TOL)
    assert res.pct("B") == pytest.approx(25, abs=TOL)
    assert res.idle_share * 100 == pytest.approx(50, abs=TOL)


def test_policy0_idle_owner_slot_stays_idle() -> None:
    res = run(0, [SimInstance("A"), SimInstance("B", workload=idle())], max_inst=4)
    assert res.pct("A") == pytest.approx(25, abs=TOL)


def test_policy1_two_busy_share_equally() -> None:
    res = run(1, [SimInstance("A"), SimInstance("B")])
    assert res.pct("A") == pytest.approx(50, abs=TOL)
    assert res.pct("B") == pytest.approx(50, abs=TOL)


def test_policy1_skips_instance_without_demand() -> None:
    res = run(1, [SimInstance("A"), SimInstance("B", workload=idle())])
    assert res.pct("A") == pytest.approx(100, abs=TOL)


def test_policy2_weights_1_2_give_one_third_two_thirds() -> None:
    res = run(2, [SimInstance("A", 1), SimInstance("B", 2)])
    assert res.pct("A") == pytest.approx(100 / 3, abs=TOL)
    assert res.pct("B") == pytest.approx(200 / 3, abs=TOL)


def test_policy2_registered_idle_instance_slices_pass_idle() -> None:
    res = run(2, [SimInstance("A", 1), SimInstance("B", 2, workload=idle())])
    assert res.pct("A") == pytest.approx(100 / 3, abs=TOL)
    assert res.idle_share * 100 == pytest.approx(200 / 3, abs=TOL)


def test_policy2_alone_gets_everything() -> None:
    res = run(2, [SimInstance("A", 1)])
    assert res.pct("A") == pytest.approx(100, abs=TOL)


def test_policy2_ops_three_times_the_slice_still_share_1_2() -> None:
    """The overrun is charged: ops of 15 ms against slices of 5 and 10 ms."""
    res = run(2, [SimInstance("A", 1, workload=busy(15)), SimInstance("B", 2, workload=busy(15))])
    assert res.pct("A") == pytest.approx(100 / 3, abs=TOL)
    assert res.pct("B") == pytest.approx(200 / 3, abs=TOL)


def test_policy2_weights_8_4_switch_four_times_less_than_2_1() -> None:
    big = run(2, [SimInstance("A", 8), SimInstance("B", 4)])
    small = run(2, [SimInstance("A", 2), SimInstance("B", 1)])
    assert big.pct("A") == pytest.approx(200 / 3, abs=TOL)
    assert small.pct("A") == pytest.approx(200 / 3, abs=TOL)
    grants_big = sum(r.grants for r in big.instances.values())
    grants_small = sum(r.grants for r in small.instances.values())
    assert grants_small / grants_big == pytest.approx(4, rel=0.02)


def test_policy1_auto_switches_to_2_when_weight_above_1_joins() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=1))
    sched.add_instance("A", 1, False, 0)
    assert sched.settings.policy == 1
    sched.add_instance("B", 2, False, 0)
    assert sched.settings.policy == 2


def test_policy3_fixed_core_caps_even_when_alone() -> None:
    res = run(3, [SimInstance("A", 3)], max_inst=10)
    assert res.pct("A") == pytest.approx(30, abs=TOL)


def test_policy3_fixed_core_pair() -> None:
    res = run(3, [SimInstance("A", 3), SimInstance("B", 5)], max_inst=10)
    assert res.pct("A") == pytest.approx(30, abs=TOL)
    assert res.pct("B") == pytest.approx(50, abs=TOL)


def test_policy3_overrun_is_paid_back_so_the_cap_holds() -> None:
    """Ops of 4 ms against a 5 ms slice overrun every segment; the debt keeps 20 %."""
    res = run(3, [SimInstance("A", 2, workload=busy(4)), SimInstance("B", 2, workload=busy(4))], max_inst=10)
    assert res.pct("A") == pytest.approx(20, abs=TOL)
    assert res.pct("B") == pytest.approx(20, abs=TOL)


def test_policy4_weak_weights_1_2() -> None:
    res = run(4, [SimInstance("A", 1), SimInstance("B", 2)])
    assert res.pct("A") == pytest.approx(100 / 3, abs=TOL)
    assert res.pct("B") == pytest.approx(200 / 3, abs=TOL)


def test_policy4_is_work_conserving() -> None:
    res = run(4, [SimInstance("A", 1), SimInstance("B", 2, workload=idle())])
    assert res.pct("A") == pytest.approx(100, abs=TOL)


def test_policy4_bursty_instance_cannot_bank_credit() -> None:
    """B (weight 2) is on 1 s / off 0.5 s; while on it gets 2/3, never more."""
    res = run(4, [SimInstance("A", 1), SimInstance("B", 2, workload=bursty(2, 1000, 500))], seconds=30)
    assert res.pct("A") == pytest.approx(res.instances["A"].target * 100, abs=TOL)
    assert res.pct("B") == pytest.approx(res.instances["B"].target * 100, abs=TOL)


def test_policy5_native_grants_everyone_at_once() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=5))
    for name in "ABC":
        sched.add_instance(name, 1, False, 0)
    effects = [e for i, name in enumerate("ABC") for e in sched.acquire(name, i + 1, 10)]
    assert [type(e) for e in effects] == [GrantLease, GrantLease, GrantLease]
    assert len(sched.holders()) == 3


def test_highprio_capped_at_prio_ratio_beside_busy_normal() -> None:
    res = run(1, [SimInstance("H", 1, highprio=True), SimInstance("N", 1)], prio_ratio=60)
    assert res.pct("H") == pytest.approx(60, abs=TOL)
    assert res.pct("N") == pytest.approx(40, abs=TOL)


def test_highprio_without_demand_takes_nothing() -> None:
    res = run(1, [SimInstance("H", 1, highprio=True, workload=idle()), SimInstance("N", 1)], prio_ratio=60)
    assert res.pct("H") == 0
    assert res.pct("N") == pytest.approx(100, abs=TOL)


def test_highprio_preempts_holder_by_revoke() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=1, prio_ratio=60))
    sched.add_instance("N", 1, False, 0)
    sched.add_instance("H", 1, True, 0)
    (grant,) = sched.acquire("N", 1, 0)
    assert isinstance(grant, GrantLease)
    effects = sched.acquire("H", 2, 1 * NS_PER_MS)
    assert effects == [RevokeLease(1, 0, grant.lease, "highprio")]
    effects, current = sched.release(1, grant.lease, 2 * NS_PER_MS)
    assert current and isinstance(effects[0], GrantLease) and effects[0].client == 2


@pytest.mark.parametrize("op_ms", [10, 40])
def test_highprio_keeps_prio_ratio_when_normal_operations_outlast_a_slice(op_ms: float) -> None:
    """A preempted holder finishes the operation it started (2 to 8 slices here; a batch of queued
    kernels on a GPU): what it takes past the revoke is banked for the waiting high-priority instance,
    whose next turn spends it. Before, the bank was capped at two slices and this read 50 / 50."""
    insts = [SimInstance("H", 1, highprio=True, workload=busy(op_ms)), SimInstance("N", 1, workload=busy(op_ms))]
    res = run(1, insts, prio_ratio=60, slice_ms=5)
    assert res.pct("H") == pytest.approx(60, abs=TOL)
    assert res.pct("N") == pytest.approx(40, abs=TOL)


def test_highprio_back_from_idle_brings_at_most_two_turns_of_credit() -> None:
    """Idle for 1 s beside a busy normal instance, it banks two of its turns, not 60 % of the second: at
    prio_ratio 60 a turn is 1.5 slices (the normal turn between two is the slice), so its first turn is
    2 x 7.5 ms plus 60/40 of the 1 ms the normal holder took to give the GPU back."""
    sched = GpuScheduler(0, GpuSettings(policy=1, prio_ratio=60, slice_ms=5))
    sched.add_instance("N", 1, False, 0)
    sched.add_instance("H", 1, True, 0)
    (grant,) = sched.acquire("N", 1, 0)
    assert isinstance(grant, GrantLease)
    t = grant.deadline_ns
    while t < NS_PER_S:
        effects, _ = sched.release(1, grant.lease, t, again=True)
        (grant,) = effects
        assert isinstance(grant, GrantLease)
        t = grant.deadline_ns
    assert sched.acquire("H", 2, t) == [RevokeLease(1, 0, grant.lease, "highprio")]
    effects, _ = sched.release(1, grant.lease, t + NS_PER_MS)
    (first,) = effects
    assert isinstance(first, GrantLease) and first.client == 2
    assert first.deadline_ns - (t + NS_PER_MS) == 2 * 7_500_000 + NS_PER_MS * 60 // 40


def test_two_highprio_instances_share_by_policy() -> None:
    res = run(2, [SimInstance("H1", 1, highprio=True), SimInstance("H2", 2, highprio=True),
                  SimInstance("N", 1)], prio_ratio=60)
    assert res.pct("H1") == pytest.approx(20, abs=TOL)
    assert res.pct("H2") == pytest.approx(40, abs=TOL)
    assert res.pct("N") == pytest.approx(40, abs=TOL)


@pytest.mark.parametrize("policy", [1, 2, 4])
@pytest.mark.parametrize("prio_ratio", [30, 60, 80])
@pytest.mark.parametrize("weights", [(1, 1), (2, 1, 3)])
def test_highprio_takes_prio_ratio_and_the_normals_split_the_rest_by_weight(policy: int, prio_ratio: int,
                                                                            weights: tuple[int, ...]) -> None:
    """Whichever normal instance the preemptions fall on: on policy 2 a revoked turn was kept as an idle turn and
    charged whole while the high-priority instance held the GPU, and two equal normals beside one at prio_ratio
    60 read 6.7 / 33.3 % instead of 20 / 20."""
    names = [f"N{i}" for i in range(len(weights))]
    insts = [SimInstance("H", 1, highprio=True), *(SimInstance(n, w) for n, w in zip(names, weights, strict=True))]
    res = run(policy, insts, prio_ratio=prio_ratio, max_inst=10)
    assert res.pct("H") == pytest.approx(prio_ratio, abs=TOL)
    eff = list(weights)  # a weight over 1 moves policy 1 to 2, as inst_ctl does
    for n, w in zip(names, eff, strict=True):
        assert res.pct(n) == pytest.approx((100 - prio_ratio) * w / sum(eff), abs=TOL), n
