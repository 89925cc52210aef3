"""High priority's preemptions are held to the hand-over budget, on the virtual clock (#42).

A cycle of a high-priority turn and the normal turn it preempts is a round of two turns whose shorter one is a
whole slice: at ``prio_ratio`` 60 beside a busy normal instance the GPU changes hands no more often than between
two busy normal instances on policy 1, so the time the tenants can use together is within half a point of the
weighted 1:2 pair's; and a high-priority instance waits at most the normal turn, the operation the holder is in
and a hand-over (the preemption delay).
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, SimResult, Simulation, SwitchCost, busy

COST = SwitchCost(transit_ns=300_000, wake_ns=200_000, warm_ns=300_000)  # 1.1 ms hand-overs: 55 ms auto slices
SECONDS = 30


def run(policy: int, insts: list[SimInstance], **settings: int) -> tuple[Simulation, SimResult]:
    sim = Simulation(GpuSettings(policy=policy, **settings), insts, switch=COST)
    return sim, sim.run(SECONDS * NS_PER_S)


def used_pct(res: SimResult) -> float:
    return sum(r.share for r in res.instances.values()) * 100


def grants_per_s(res: SimResult) -> float:
    return sum(r.grants for r in res.instances.values()) / SECONDS


@pytest.mark.parametrize("op_ms", [0.5, 5.0])
def test_preemption_costs_no_more_than_the_weighted_policies(op_ms: float) -> None:
    _, weighted = run(2, [SimInstance("A", 1, workload=busy(op_ms)), SimInstance("B", 2, workload=busy(op_ms))])
    _, two = run(1, [SimInstance("A", 1, workload=busy(op_ms)), SimInstance("B", 1, workload=busy(op_ms))])
    sim, hp = run(1, [SimInstance("H", 1, highprio=True, workload=busy(op_ms)),
                      SimInstance("N", 1, workload=busy(op_ms))], prio_ratio=60)
    assert hp.pct("H") / (hp.pct("H") + hp.pct("N")) == pytest.approx(0.6, abs=0.005)
    assert grants_per_s(hp) <= grants_per_s(two)  # a preemption is one hand-over of the budget's
    assert used_pct(hp) >= used_pct(weighted) - 0.5
    # the normal turn is the slice and the high-priority one 1.5 slices: a preempted turn is never shorter
    assert sim.sched.hp.turn_slice_ns() == 55 * NS_PER_MS
    rq = sim.sched.rq
    wait = (rq.waits.quantiles("H", SECONDS * NS_PER_S) or [0, 0])[1]
    # the preemption delay (p99): the normal turn (the slice, lengthened by its expected hand-over), the operation
    # its holder is in when revoked, and the hand-over itself
    assert wait <= 55 * NS_PER_MS + op_ms * NS_PER_MS + 2 * rq.handover.expected


def test_the_cycle_is_cut_to_fit_the_round_target() -> None:
    """At prio_ratio 90 a normal turn of a slice would make a 550 ms cycle: it is cut to 20 ms (200 ms x 10 %),
    above the 11 ms that handover_max_pct 10 allows, and the normal instance waits out a 180 ms turn."""
    sim, res = run(1, [SimInstance("H", 1, highprio=True), SimInstance("N", 1)], prio_ratio=90)
    assert sim.sched.hp.turn_slice_ns() == 20 * NS_PER_MS
    assert res.pct("H") / (res.pct("H") + res.pct("N")) == pytest.approx(0.9, abs=0.005)
    p50, _ = sim.sched.rq.waits.quantiles("N", SECONDS * NS_PER_S) or [0, 0]
    assert p50 == pytest.approx(180 * NS_PER_MS + 10 * NS_PER_MS, abs=2 * NS_PER_MS)  # and a hand-over or so
