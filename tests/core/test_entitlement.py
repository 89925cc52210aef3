"""Entitled, owed and demand time, integrated event by event on the virtual clock: exact."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from arbiterd.core.effects import NS_PER_S
from arbiterd.core.entitlement import SETS_KEPT
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings

S = NS_PER_S


def three(policy: int) -> GpuScheduler:
    """A (weight 1) and B (weight 2) busy from 0; C (weight 1) wants the GPU from 10 s to 20 s."""
    sched = GpuScheduler(0, GpuSettings(policy=policy), 0)
    for name, w in (("A", 1), ("B", 2), ("C", 1)):
        sched.add_instance(name, w, False, 0)
    sched.set_policy(policy, 0)  # a weight > 1 on policy 1 switched it to 2
    sched.acquire("A", 1, 0)
    sched.acquire("B", 2, 0)
    sched.acquire("C", 3, 10 * S)
    sched.drop_client(3, 20 * S)
    return sched


def seconds(sched: GpuScheduler, name: str, now: int = 30 * S) -> tuple[float, float, float]:
    entitled, owed, demand = sched.entitlement(name, now)
    return entitled / S, owed / S, demand / S


def test_work_conserving_entitlement_follows_demand() -> None:
    """Policy 4: 1/3, 2/3 while C is idle; 1/4, 1/2, 1/4 while it is back."""
    sched = three(4)
    assert seconds(sched, "A") == pytest.approx((20 / 3 + 10 / 4,) * 2 + (30,), rel=1e-12)
    assert seconds(sched, "B") == pytest.approx((40 / 3 + 10 / 2,) * 2 + (30,), rel=1e-12)
    assert seconds(sched, "C") == pytest.approx((10 / 4, 10 / 4, 10), rel=1e-12)
    assert sched.ent.shares == pytest.approx({"A": 1 / 3, "B": 2 / 3})


def test_on_policy_2_an_idle_instance_keeps_its_entitlement_but_is_owed_only_what_it_asked_for() -> None:
    sched = three(2)
    assert seconds(sched, "A") == pytest.approx((30 / 4,) * 2 + (30,), rel=1e-12)
    assert seconds(sched, "B") == pytest.approx((30 / 2,) * 2 + (30,), rel=1e-12)
    assert seconds(sched, "C") == pytest.approx((30 / 4, 10 / 4, 10), rel=1e-12)


@pytest.mark.parametrize(("policy", "max_inst", "want"), [(0, 4, 1 / 4), (3, 10, 1 / 10)])
def test_rings_keep_an_idle_owners_slots(policy: int, max_inst: int, want: float) -> None:
    sched = GpuScheduler(0, GpuSettings(policy=policy, max_inst=max_inst), 0)
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    sched.acquire("A", 1, 0)
    assert seconds(sched, "B", 10 * S) == pytest.approx((10 * want, 0, 0))
    assert seconds(sched, "A", 10 * S) == pytest.approx((10 * want, 10 * want, 10))


def test_high_priority_is_entitled_to_prio_ratio_beside_a_normal_instance() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=1, prio_ratio=60), 0)
    sched.add_instance("H", 1, True, 0)
    sched.add_instance("N", 1, False, 0)
    sched.acquire("N", 2, 0)
    sched.acquire("H", 1, 5 * S)
    assert seconds(sched, "H", 10 * S)[0] == pytest.approx(3.0)  # 60 % of 5 s
    assert seconds(sched, "N", 10 * S)[0] == pytest.approx(5.0 + 2.0)


def test_a_starved_instance_is_entitled_to_what_its_requested_weight_would_give() -> None:
    """Weight 0 (free_weight was 0) gets nothing, but is owed what it asked for: it shows as starved."""
    sched = GpuScheduler(0, GpuSettings(policy=2, max_inst=2), 0)
    sched.add_instance("A", 2, False, 0)
    sched.add_instance("Z", 0, False, 0, requested=1)
    sched.acquire("A", 1, 0)
    sched.acquire("Z", 2, 0)
    assert seconds(sched, "Z", 9 * S) == pytest.approx((3.0, 3.0, 9))  # 1 of 1 + 2, for 9 s
    assert sched.useful_ns("Z", 9 * S) == 0
    assert seconds(sched, "A", 9 * S)[0] == pytest.approx(9.0)


def test_settings_changes_close_the_integrals_under_the_old_shares() -> None:
    sched = three(4)
    sched.set_weight("B", 1, 30 * S)  # from 30 s: A and B 1:1
    assert seconds(sched, "B", 40 * S)[0] == pytest.approx(40 / 3 + 10 / 2 + 10 / 2, rel=1e-12)
    sched.remove_instance("A", 40 * S)
    assert seconds(sched, "B", 50 * S)[0] == pytest.approx(40 / 3 + 10 / 2 + 10 / 2 + 10, rel=1e-12)


@pytest.mark.parametrize(("policy", "max_inst"), [(2, 16), (3, 10), (4, 16)])
def test_delivered_follows_owed_within_1pp_under_the_simulator(policy: int, max_inst: int) -> None:
    """Real scheduling with 1.3 ms hand-overs at the auto slice: each instance's useful time tracks what it
    was owed while it had demand, a bursty third (3 s on, 3 s off) included."""
    from cgpu_testing.sim import SimInstance, Simulation, SwitchCost, bursty, busy

    sim = Simulation(GpuSettings(policy=policy, max_inst=max_inst),
                     [SimInstance("A", 1, workload=busy(0.5)), SimInstance("B", 2, workload=busy(0.5)),
                      SimInstance("C", 1, workload=bursty(0.5, 3000, 3000))],
                     switch=SwitchCost(transit_ns=100_000, wake_ns=600_000, warm_ns=500_000))
    sim.run(30 * S)
    for name in "ABC":
        _, owed, demand = sim.sched.entitlement(name, sim.now)
        assert demand > 0
        assert abs(sim.sched.useful_ns(name, sim.now) - owed) / sim.now <= 0.01, name


def test_repeated_demand_sets_give_the_same_integrals_as_accruing_event_by_event() -> None:
    """Policy 4, A (weight 1) always busy, B (weight 3) toggling every second for 100 s; at 50 s B's weight
    becomes 1. Demand changes only add time to the set in force, read whole and folded at the weight change:
    A is owed 1/4 while B runs (1/2 after 50 s) and all of it while B is idle."""
    sched = GpuScheduler(0, GpuSettings(policy=4, max_inst=8), 0)
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 3, False, 0)
    sched.acquire("A", 1, 0)
    for t in range(0, 100, 2):
        if t == 50:
            sched.set_weight("B", 1, t * S)
        sched.acquire("B", 2, t * S)  # waiting is demand
        sched.drop_client(2, (t + 1) * S)
    a = (25 * 1 / 4 + 25 * 1 + 25 * 1 / 2 + 25 * 1) * S
    assert sched.entitlement("A", 100 * S) == (a, a, 100 * S)
    b = (25 * 3 / 4 + 25 * 1 / 2) * S
    assert sched.entitlement("B", 100 * S) == (b, b, 50 * S)
    assert sched.ent.kept() <= 2  # the two sets since the weight change, folded before it


# a Gray code: each step toggles one instance, and every one of the 1024 sets comes once
GRAY = [((i & -i).bit_length() - 1, (i % 7) * S // 10 + i) for i in range(1, 1024)]


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5 * S)), min_size=1, max_size=400))
@example(GRAY)
@settings(max_examples=30, deadline=None)
def test_integrals_stay_exact_past_the_sets_kept_apart(steps: list[tuple[int, int]]) -> None:
    """Ten instances of weights 1 to 3 on policy 4 gain and lose demand at random (more sets than are kept
    apart, so folds come in between): every instance's integrals are the event-by-event sums of its share
    under each set, read from ``entitled``."""
    sched = GpuScheduler(0, GpuSettings(policy=4, max_inst=25), 0)
    names = [f"I{k}" for k in range(10)]
    for k, name in enumerate(names):
        sched.add_instance(name, k % 3 + 1, False, 0)
    want = {n: [0.0, 0.0, 0] for n in names}
    now = 0
    for k, dt in steps:
        active = frozenset(n for n in names if sched.has_demand(n))
        shares = sched.entitled(active)
        for n in names:
            want[n][0] += shares[n] * dt
            if n in active:
                want[n][1] += shares[n] * dt
                want[n][2] += dt
        now += dt
        if sched.has_demand(names[k]):
            sched.drop_client(k + 1, now)
        else:
            sched.acquire(names[k], k + 1, now)
        assert sched.ent.kept() <= SETS_KEPT
    for n in names:
        entitled, owed, demand = sched.entitlement(n, now)
        assert (entitled, owed) == pytest.approx(tuple(want[n][:2]), rel=1e-9, abs=1e-3) and demand == want[n][2]


def test_a_clock_that_goes_back_adds_no_time() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=4), 0)
    sched.add_instance("A", 1, False, 0)
    sched.acquire("A", 1, 100)
    sched.drop_client(1, 50)
    assert sched.entitlement("A", 200) == (0.0, 0.0, 0)
