"""Claims the daemon cannot check cannot win time: on the virtual clock, a tenant that lies about its warm-up, its
transit or its usage gets at most 2 percentage points more of the useful GPU time than an honest one beside it.

Both tenants run the same work at weights 1:1 on policy 2, at the daemon's defaults (slice_ms auto), and pay the
same real hand-over (sim.SwitchCost). Before the credit was bounded (scheduler.credit_cap), 90 ms of claimed
warm-up on every release won the liar 66 % of the work done to the honest tenant's 34 %.
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, Simulation, SwitchCost, bursty, busy

HAND_OVER = SwitchCost(transit_ns=30_000, wake_ns=50_000, warm_ns=200_000)  # 0.31 ms, as on a CPU host
SLOW = SwitchCost(transit_ns=100_000, wake_ns=600_000, warm_ns=500_000)  # 1.3 ms


def shares(liar: SimInstance, cost: SwitchCost = HAND_OVER, seconds: int = 60) -> tuple[float, float, Simulation]:
    """(honest, liar) shares of the work the two did, in percent."""
    sim = Simulation(GpuSettings(policy=2), [SimInstance("honest", 1, workload=busy(0.5)), liar], switch=cost)
    res = sim.run(seconds * NS_PER_S, warmup_ns=5 * NS_PER_S)
    h, li = res.instances["honest"].share, res.instances[liar.name].share
    return 100 * h / (h + li), 100 * li / (h + li), sim


@pytest.mark.parametrize("cost", [HAND_OVER, SLOW], ids=["0.3ms", "1.3ms"])
@pytest.mark.parametrize(("what", "liar"), [
    ("warm-up 90 ms", SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=90 * NS_PER_MS)),
    ("warm-up 2 ms", SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=2 * NS_PER_MS)),
    ("transit 20 ms", SimInstance("liar", 1, workload=busy(0.5), claim_transit_ns=20 * NS_PER_MS)),
    ("usage: held nothing", SimInstance("liar", 1, workload=busy(0.5), claim_transit_ns=10**12)),
    ("both", SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=50 * NS_PER_MS,
                         claim_transit_ns=50 * NS_PER_MS)),
])
def test_a_lying_tenant_gains_at_most_2_points_over_an_honest_one(what: str, liar: SimInstance,
                                                                  cost: SwitchCost) -> None:
    honest, lied, _ = shares(liar, cost)
    assert lied - honest <= 2.0, (what, honest, lied)
    assert honest >= 49.0


def test_a_tenant_that_claims_less_than_it_pays_only_loses() -> None:
    """Reporting less (or a negative warm-up) lowers what the others may be credited, but costs the reporter as
    much: it does not win."""
    honest, lied, _ = shares(SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=-2 * NS_PER_MS))
    assert lied <= honest + 0.5


def test_the_auto_slice_is_stretched_by_a_liar_at_most_to_what_its_credit_allows() -> None:
    """The slice is sized from what was credited, not from what was claimed: a 90 ms claim no longer pushes every
    tenant's slice to slice_max_ms."""
    _, _, honest_sim = shares(SimInstance("b", 1, workload=busy(0.5)))
    _, _, lied_sim = shares(SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=90 * NS_PER_MS))
    assert lied_sim.sched.slice_ns <= 2.5 * honest_sim.sched.slice_ns < 100 * NS_PER_MS


def test_an_honest_slow_starter_within_the_bound_keeps_its_exact_share() -> None:
    """What the bound costs honesty: a tenant whose hand-over is 2.5 times the other's is still credited all of
    it (the bound is 3 times the others'), so the two split the work evenly."""
    honest, slow, _ = shares(SimInstance("slow", 1, workload=busy(0.5), warm_ns=470_000))
    assert abs(slow - honest) <= 0.5


def test_tenants_that_lie_together_cannot_raise_each_others_bound() -> None:
    """Three tenants of the liar's, each working 5 ms every 2 s and claiming 90 ms of warm-up each time, beside it
    and an honest tenant, both busy (policy 4: the idle time goes to those who want it). A lie is bounded by the
    lower quartile of the others' claims (the honest one's, here): the liar gains less than 2 points. With the
    median instead, its accomplices set its bound and it took 66 % of the work the two did."""
    accomplices = [SimInstance(f"C{i}", 1, workload=bursty(0.5, 5, 2000, phase_ms=300 * i),
                               claim_warmup_ns=90 * NS_PER_MS) for i in range(3)]
    sim = Simulation(GpuSettings(policy=4), [SimInstance("honest", 1, workload=busy(0.5)),
                                             SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=90 * NS_PER_MS),
                                             *accomplices], switch=HAND_OVER)
    res = sim.run(60 * NS_PER_S, warmup_ns=5 * NS_PER_S)
    h, li = res.instances["honest"].share, res.instances["liar"].share
    assert 100 * (li - h) / (h + li) <= 2.0, (h, li)


@pytest.mark.parametrize("cost", [HAND_OVER, SLOW], ids=["0.3ms", "1.3ms"])
def test_a_negative_warm_up_cuts_the_slice_no_more_than_reporting_none(cost: SwitchCost) -> None:
    """A hand-over costs no less than nothing: in the expected hand-over, which sizes every tenant's slice, an
    instance whose warm-up claims average below zero counts as claiming none. Before, one tenant claiming -2 ms
    (or a client whose pace had gone stale, as one did on the VM: -2.08 ms of warm-up on average) put the
    GPU's slice at the 5 ms floor (from 16 and 65 ms), and so every tenant's hand-overs at up to a quarter of
    their time. Now the liar cuts it no further than a tenant that reports no warm-up at all, whose word the
    daemon cannot check either (10 and 35 ms against 7 and 21)."""
    silent = SimInstance("quiet", 1, workload=busy(0.5), claim_warmup_ns=-(cost.wake_ns + cost.warm_ns))
    _, _, quiet_sim = shares(silent, cost, seconds=20)
    for claim_ms in (-2, -90):
        honest, lied, sim = shares(SimInstance("liar", 1, workload=busy(0.5), claim_warmup_ns=claim_ms * NS_PER_MS),
                                   cost, seconds=20)
        assert sim.sched.slice_ns >= quiet_sim.sched.slice_ns > sim.sched.settings.slice_min_ms * NS_PER_MS, claim_ms
        assert lied <= honest + 0.5  # and it still wins nothing
