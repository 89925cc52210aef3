"""The round target (``latency_target_ms``), on the virtual clock: the slice shrinks so that a round of busy
instances fits the target, no further than ``handover_max_pct`` allows, and the round stretches past that.

Every hand-over here costs about 1.1 ms, so ``slice_ms = auto`` picks 55 ms at ``handover_target_pct`` 2 and
the shortest slice ``handover_max_pct`` 10 allows is 11 ms. At the defaults (``latency_target_ms`` 200): two
instances keep their 55 ms slices (a 110 ms round), four and twelve are cut to fit 200 ms, and 25 stretch the
round to 25 x 11 ms.
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, Simulation, SwitchCost, idle

COST = SwitchCost(transit_ns=300_000, wake_ns=200_000, warm_ns=300_000)
SECONDS = 30


def run(weights: list[int], **settings: int) -> tuple[Simulation, dict[str, float], dict[str, int]]:
    insts = [SimInstance(f"i{k}", w) for k, w in enumerate(weights)]
    sim = Simulation(GpuSettings(policy=4, max_inst=25, **settings), insts, switch=COST)
    res = sim.run(SECONDS * NS_PER_S)
    useful = sum(r.share for r in res.instances.values())
    shares = {name: r.share / useful * 100 for name, r in res.instances.items()}  # of the time used
    return sim, shares, {name: r.grants for name, r in res.instances.items()}


@pytest.mark.parametrize(("weights", "round_ms"), [
    ([1, 1], 110.0),  # 2 x 55 ms fits 200 ms: the hand-over target alone sizes the slice
    ([1, 1, 1, 1], 200.0),  # 4 x 50 ms
    ([1, 2] * 6, 200.0),  # 18 weights: 11.1 ms slices
    ([1] * 25, 275.0),  # 200 / 25 = 8 ms is below the 11 ms floor: the round stretches to 25 x 11 ms
])
def test_the_round_fits_the_target_down_to_the_shortest_slice_and_weights_keep_their_shares(
        weights: list[int], round_ms: float) -> None:
    sim, shares, grants = run(weights)
    rq = sim.sched.rq
    assert rq.handover.expected == pytest.approx(1.1 * NS_PER_MS, rel=0.02)
    assert rq.slice_ns == 55 * NS_PER_MS  # the slice auto picks from the hand-over is not changed by the round
    assert rq.round_ns / NS_PER_MS == pytest.approx(round_ms, abs=0.01)
    # measured: each instance has one turn a round, and a round is its useful time plus one hand-over a turn
    measured = SECONDS * 1e3 / (sum(grants.values()) / len(weights))
    assert measured == pytest.approx(round_ms + len(weights) * rq.handover.expected / NS_PER_MS, rel=0.01)
    total = sum(weights)
    for (name, share), w in zip(shares.items(), weights, strict=True):
        assert share == pytest.approx(100 * w / total, abs=0.5), name


def test_a_pinned_slice_is_never_cut() -> None:
    sim, _, _ = run([1] * 12, slice_ms=20)
    assert sim.sched.rq.round_ns == 12 * 20 * NS_PER_MS


def test_a_tighter_target_and_ceiling_cut_the_slice_further() -> None:
    """latency_target_ms 100 and handover_max_pct 20: twelve instances at 100 / 12 = 8.3 ms, above the
    5.5 ms floor."""
    sim, shares, _ = run([1] * 12, latency_target_ms=100, handover_max_pct=20)
    assert sim.sched.rq.round_ns / NS_PER_MS == pytest.approx(100.0, abs=0.01)
    assert max(abs(s - 100 / 12) for s in shares.values()) <= 0.5


def test_weighted_policy_counts_idle_instances_in_the_round() -> None:
    """On policy 2 an idle instance's turns pass with the GPU idle: they are part of the round."""
    insts = [SimInstance(f"i{k}", 1) for k in range(6)] + [SimInstance("idle", 2, workload=idle())]
    sim = Simulation(GpuSettings(policy=2, max_inst=25), insts, switch=COST)
    sim.run(10 * NS_PER_S)
    assert sim.sched.rq.round_ns / NS_PER_MS == pytest.approx(200.0, abs=0.01)  # 8 weights: 25 ms slices



@pytest.mark.parametrize("weights", [[1, 1], [1, 1, 1, 1], [1, 2] * 6, [1] * 25])
def test_each_busy_instance_waits_for_the_others_turns(weights: list[int]) -> None:
    """A busy instance asks again as its turn ends and waits for every other turn of the round: the round less
    its own useful time, plus one hand-over for each of the others' turns (arbiterd.core.waits, as status shows
    it)."""
    sim, _, _ = run(weights)
    rq = sim.sched.rq
    total, n = sum(weights), len(weights)
    for (name, inst), w in zip(rq.instances.items(), weights, strict=True):
        p50, p99 = rq.waits.quantiles(name, SECONDS * NS_PER_S) or (0, 0)
        expected = rq.round_ns * (1 - w / total) + (n - 1) * rq.handover.expected
        assert p50 == pytest.approx(expected, rel=0.025), name
        assert p50 <= p99 <= 2 * max(rq.round_ns, 200 * NS_PER_MS), name
        assert inst.grants > 0
