"""Requests and limits (behaviour §3, "Requests and limits"), on the virtual clock.

A request of P % is weight P / 5 of 20 slots; a limit L % is a ceiling on useful time per period. Every
scenario runs 20 s of virtual time; the shares are the time the simulated ops really ran, compared with
what the documented rule gives (the scheduler's entitled shares, integrated by the simulator) and with the
issue's own numbers. Tolerance 0.5 percentage points unless stated.
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S
from arbiterd.core.errors import ConflictError, SettingError
from arbiterd.core.limits import waterfill
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, Simulation, SwitchCost, bursty, busy, idle
from cgpu_testing.sim import simulate as run

TOL = 0.5  # percentage points
COST = SwitchCost(transit_ns=100_000, wake_ns=300_000, warm_ns=600_000)  # 1.1 ms a hand-over, as on a CPU host


def req(name: str, request: int, limit: int = 100, **kw: object) -> SimInstance:
    """An instance requesting ``request`` % (weight request / 5 of 20 slots) with ``limit`` %."""
    return SimInstance(name, request // 5, limit=limit, **kw)  # type: ignore[arg-type]


def assert_rule(res_pcts: dict[str, tuple[float, float]], tol: float = TOL) -> None:
    for name, (target, measured) in res_pcts.items():
        assert measured == pytest.approx(target, abs=tol), name


def pcts(res: object) -> dict[str, tuple[float, float]]:
    return {n: (r.target * 100, r.share * 100) for n, r in res.instances.items()}  # type: ignore[attr-defined]


# ------------------------------------------------------------------ the scenarios, policy 4
def test_a_request_30_limit_60_alone_gets_60() -> None:
    res = run(4, [req("A", 30, 60)], max_inst=20)
    assert res.pct("A") == pytest.approx(60, abs=TOL)
    assert res.idle_share * 100 == pytest.approx(40, abs=TOL)  # enforced even on an idle GPU


def test_a_beside_b_request_30_no_limit_both_busy_get_50_50() -> None:
    res = run(4, [req("A", 30, 60), req("B", 30)], max_inst=20)
    assert res.pct("A") == pytest.approx(50, abs=TOL)
    assert res.pct("B") == pytest.approx(50, abs=TOL)


def test_a_beside_c_request_40_limit_40_idle_still_gets_60() -> None:
    res = run(4, [req("A", 30, 60), req("C", 40, 40, workload=idle())], max_inst=20)
    assert res.pct("A") == pytest.approx(60, abs=TOL)


def test_c_request_40_limit_40_alone_gets_40() -> None:
    res = run(4, [req("C", 40, 40)], max_inst=20)
    assert res.pct("C") == pytest.approx(40, abs=TOL)


def test_a_and_c_both_busy_c_held_to_its_limit_a_takes_the_rest() -> None:
    """Weights 6:8 would give 43 / 57; C is held to 40 and A, below its limit, takes the other 60."""
    res = run(4, [req("A", 30, 60), req("C", 40, 40)], max_inst=20)
    assert res.pct("A") == pytest.approx(60, abs=TOL)
    assert res.pct("C") == pytest.approx(40, abs=TOL)


# ------------------------------------------------------------------ every mix against the rule
MIXES = [
    pytest.param(4, [req("A", 30, 40), req("B", 30)], 50, {"A": 40, "B": 60}, id="p4-limit-binds-rest-to-b"),
    pytest.param(4, [req("A", 10), req("B", 20, 25), req("C", 30, 40)], 50, {"A": 35, "B": 25, "C": 40},
                 id="p4-two-capped-the-third-takes-the-rest"),
    pytest.param(4, [req("A", 10, 20), req("B", 20, 30)], 50, {"A": 20, "B": 30}, id="p4-all-capped-rest-idle"),
    pytest.param(4, [req("A", 30, 70, workload=busy(15)), req("C", 40, 40, workload=busy(15))], 50,
                 {"A": 60, "C": 40}, id="p4-ops-longer-than-a-slice"),
    pytest.param(2, [req("A", 30, 60)], 50, {"A": 60}, id="p2-alone"),
    pytest.param(2, [req("A", 30, 60), req("B", 30)], 50, {"A": 50, "B": 50}, id="p2-both-busy"),
    pytest.param(2, [req("A", 30, 60), req("C", 40, 40, workload=idle())], 50, {"A": 30 / 70 * 100},
                 id="p2-c-idle-its-turns-pass-idle"),
    pytest.param(2, [req("A", 30, 60), req("C", 40, 40)], 50, {"A": 30 / 70 * 100, "C": 40},
                 id="p2-c-capped-its-rest-idle"),
    pytest.param(2, [req("A", 30, 40), req("B", 30)], 50, {"A": 40, "B": 50}, id="p2-min-share-limit"),
    pytest.param(1, [SimInstance("A", limit=30), SimInstance("B")], 50, {"A": 30, "B": 70}, id="p1-limit"),
    # high priority, at several prio_ratio
    pytest.param(4, [req("H", 10, 30, highprio=True), req("B", 30)], 50, {"H": 30, "B": 70},
                 id="p4-hp-limited-below-ratio"),
    pytest.param(4, [req("H", 10, 80, highprio=True), req("B", 30)], 60, {"H": 60, "B": 40},
                 id="p4-hp-limit-above-ratio"),
    pytest.param(4, [req("H", 10, highprio=True), req("B", 30, 30)], 60, {"H": 70, "B": 30},
                 id="p4-hp-takes-what-a-capped-normal-leaves"),
    pytest.param(4, [req("H", 10, highprio=True), req("B", 30, 30)], 80, {"H": 80, "B": 20},
                 id="p4-hp-ratio80"),
    pytest.param(4, [req("H", 10, 10, highprio=True), req("B", 30, 30)], 20, {"H": 10, "B": 30},
                 id="p4-hp-ratio20-both-capped"),
    pytest.param(4, [req("H", 10, 30, highprio=True), req("B", 30, 50), req("C", 30)], 60,
                 {"H": 30, "B": 35, "C": 35}, id="p4-hp-and-two-normals"),
    pytest.param(2, [req("H", 10, 30, highprio=True), req("B", 30)], 50, {"H": 30, "B": 70},
                 id="p2-hp-limited"),
    pytest.param(2, [req("H", 10, highprio=True), req("B", 30, 30)], 60, {"H": 60, "B": 30},
                 id="p2-hp-normal-capped-rest-idle"),
    # a revoked turn is not an idle turn on policy 2 (it was, and the preempted normal lost: 40 / 30 here)
    pytest.param(2, [req("H", 10, highprio=True), req("B", 30), req("C", 30)], 30, {"H": 30, "B": 35, "C": 35},
                 id="p2-hp-beside-two-equal-normals"),
    pytest.param(2, [req("H", 10, highprio=True), req("B", 30, 45), req("C", 30)], 60, {"H": 60, "B": 20, "C": 20},
                 id="p2-hp-two-normals-one-limit-not-binding"),
]


@pytest.mark.parametrize(("policy", "insts", "ratio", "expected"), MIXES)
def test_every_mix_follows_the_documented_rule(policy: int, insts: list[SimInstance], ratio: int,
                                               expected: dict[str, float]) -> None:
    """Measured against the scheduler's entitled shares (the rule) and against the rule worked by hand."""
    res = run(policy, insts, max_inst=20, prio_ratio=ratio)
    assert_rule(pcts(res))
    for name, pct in expected.items():
        assert res.instances[name].target * 100 == pytest.approx(pct, abs=0.01), name
        assert res.pct(name) == pytest.approx(pct, abs=TOL), name


@pytest.mark.parametrize("policy", [2, 4])
def test_a_ceiling_caps_useful_time_with_hand_overs_counted(policy: int) -> None:
    """With a hand-over of 1.1 ms a lease, a 30 % limit alone delivers 30 % of useful time (not 30 % held)."""
    res = Simulation(GpuSettings(policy=policy, max_inst=20), [req("A", 10, 30)], switch=COST).run(20 * NS_PER_S)
    assert res.pct("A") == pytest.approx(30, abs=TOL)
    assert res.instances["A"].held_share * 100 > 30.3  # it held more: the hand-overs on top


@pytest.mark.parametrize(("policy", "insts", "limited"), [
    (4, [req("A", 30, 40), req("B", 30)], {"A": 40}),
    (4, [req("A", 30, 70), req("C", 40, 40)], {"C": 40}),
    (2, [req("A", 30, 40), req("B", 30)], {"A": 40}),
])
def test_limits_hold_with_hand_overs_and_the_rest_follows_the_weights(policy: int, insts: list[SimInstance],
                                                                     limited: dict[str, int]) -> None:
    res = Simulation(GpuSettings(policy=policy, max_inst=20), insts, switch=COST).run(20 * NS_PER_S)
    for name, pct in limited.items():
        assert res.pct(name) == pytest.approx(pct, abs=TOL), name
    for name, r in res.instances.items():  # what the hand-overs leave, shared by the rule
        if name not in limited:
            assert r.share * 100 == pytest.approx(r.target * 100, abs=1.5), name


def test_a_bursty_limited_instance_gets_its_limit_of_each_stretch_within_one_quota() -> None:
    """On 400 ms, off 600 ms, limit 30 %: the fluid rule gives 12 %; each stretch of demand may differ from it by
    at most one period's quota (behaviour §3), here 30 % of a 30 ms round: 0.9 pp a second."""
    res = run(4, [req("A", 30, 30, workload=bursty(1, 400, 600))], max_inst=20)
    assert res.pct("A") == pytest.approx(12, abs=0.9)


def test_throttled_time_is_counted_while_it_waits_with_its_runtime_spent() -> None:
    """Alone at 30 %, busy: throttled 70 % of the time, in one interval a period."""
    sim = Simulation(GpuSettings(policy=4, max_inst=20), [req("A", 10, 30)])
    sim.run(10 * NS_PER_S)
    throttled = sim.sched.throttled_ns("A", 10 * NS_PER_S)
    assert throttled / (10 * NS_PER_S) == pytest.approx(0.70, abs=0.01)
    inst = sim.sched.instances["A"]
    period = sim.sched.rq.bw.period_ns()
    assert inst.nr_throttled == pytest.approx(10 * NS_PER_S / period, rel=0.05)


def test_a_limit_raised_to_100_brings_back_no_credit_from_its_throttled_time() -> None:
    """A (request 10 %) was held to 20 % beside B for 10 s; without its limit it gets its weight's share at once,
    not a burst."""
    sim = Simulation(GpuSettings(policy=4, max_inst=20), [req("A", 10, 20), req("B", 10)])
    sim.run(10 * NS_PER_S)
    a0, b0 = sim.op_ns["A"], sim.op_ns["B"]
    sim.apply(sim.sched.set_limit("A", 100, sim.now))
    sim.run(11 * NS_PER_S)
    a, b = sim.op_ns["A"] - a0, sim.op_ns["B"] - b0
    assert a / (a + b) == pytest.approx(0.5, abs=0.02)


def test_period_is_the_round_unless_pinned() -> None:
    sim = Simulation(GpuSettings(policy=4, max_inst=20, slice_ms=10), [req("A", 30, 60), req("B", 30)])
    sim.run(NS_PER_S)
    assert sim.sched.rq.bw.period_ns() == 12 * 10 * NS_PER_MS  # weights 6 + 6, 10 ms slices
    sim.sched.set("limit_period_ms", 50, sim.now)
    assert sim.sched.rq.bw.period_ns() == 50 * NS_PER_MS


# ------------------------------------------------------------------ validation
def test_a_limit_below_the_request_is_refused_and_changes_nothing() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=4, max_inst=20))
    sched.add_instance("A", 6, False, 0)
    with pytest.raises(ConflictError, match="limit 25 % is below its request"):
        sched.set_limit("A", 25, 0)
    assert sched.instances["A"].limit == 100
    sched.set_limit("A", 30, 0)
    with pytest.raises(ConflictError, match="below its request"):
        sched.set_weight("A", 7, 0)  # 35 % would be above its limit
    with pytest.raises(ConflictError, match="below its request"):
        sched.set("max_inst", 18, 0)  # 6 of 18 is 33 %
    assert (sched.instances["A"].weight, sched.settings.max_inst) == (6, 20)


@pytest.mark.parametrize(("policy", "why"), [(0, "policy 0"), (3, "policy 3"), (5, "policy 5")])
def test_a_limit_on_a_policy_that_cannot_honour_it_is_refused(policy: int, why: str) -> None:
    sched = GpuScheduler(0, GpuSettings(policy=policy, max_inst=20))
    sched.add_instance("A", 6, False, 0)
    with pytest.raises(ConflictError, match=why):
        sched.set_limit("A", 60, 0)
    assert sched.instances["A"].limit == 100
    sched.set_limit("A", 100, 0)  # no limit is always allowed


def test_on_policy_3_a_limit_equal_to_the_request_is_what_it_enforces() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=3, max_inst=20))
    sched.add_instance("A", 6, False, 0)
    sched.set_limit("A", 30, 0)
    assert sched.instances["A"].limit == 30


def test_out_of_range_limits_are_refused() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=4, max_inst=20))
    sched.add_instance("A", 1, False, 0)
    for bad in (4, 101, "x", True):
        with pytest.raises(SettingError, match="limit"):
            sched.set_limit("A", bad, 0)  # type: ignore[arg-type]


def test_a_limit_survives_a_switch_to_a_policy_that_does_not_honour_it() -> None:
    """Policy 3 caps A at its request; back on 4 its limit is in force again: nothing the operator set is lost."""
    sim = Simulation(GpuSettings(policy=4, max_inst=20), [req("A", 30, 60)])
    sim.run(5 * NS_PER_S)
    sim.apply(sim.sched.set_policy(3, sim.now))
    assert sim.sched.instances["A"].limit == 60
    a0 = sim.op_ns["A"]
    sim.run(10 * NS_PER_S)
    assert (sim.op_ns["A"] - a0) / (5 * NS_PER_S) == pytest.approx(0.30, abs=0.005)
    sim.apply(sim.sched.set_policy(4, sim.now))
    a0 = sim.op_ns["A"]
    sim.run(15 * NS_PER_S)
    assert (sim.op_ns["A"] - a0) / (5 * NS_PER_S) == pytest.approx(0.60, abs=0.005)


def test_waterfill_gives_what_a_capped_one_leaves_to_the_others_by_weight() -> None:
    assert waterfill({"a": 1, "b": 1, "c": 2}, {"a": 0.1}, 1.0) == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6})
    assert waterfill({"a": 1, "b": 1}, {"a": 0.2, "b": 0.3}, 1.0) == pytest.approx({"a": 0.2, "b": 0.3})
