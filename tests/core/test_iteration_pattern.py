"""Issue 49's 2.111 on the virtual clock: ResNet-50 at 1:2 read 2.111 in images/s on an H100 while its held time read
1.992 (batch 64: an iteration of 12.4 ms, the auto slice at 36 ms, hand-overs of 0.7 ms).

An iteration is queued at once and ends in a sync, so the gate is met once an iteration: the simulator's operation
is the iteration (12.4 ms, run whole once started). Its turns end at iteration ends, past their deadlines, and the
overrun is debt, so work follows held time exactly, whatever the slice, as long as every loss at a hand-over is
reported (the shim reports the wait from the grant to its first launch). A loss it does not see (on a GPU: the
context switch, cold caches; the first kernels of a turn run slower) is billed as used, once a turn: weight 1 pays
it once a slice, weight 2 once every two, and the work ratio rises above 2 while the held ratio stays below, the
H100's signature.
"""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_S
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, Simulation, SwitchCost, busy

ITERATION_MS = 12.4  # ResNet-50, batch 64, on an H100: 64 images / 5167 images/s


def ratios(cost: SwitchCost, **settings: int) -> tuple[float, float]:
    """(work, held) of weight 2 over weight 1, both running iterations back to back, over 60 s after 5 s."""
    sim = Simulation(GpuSettings(policy=2, **settings), [SimInstance("A", 1, workload=busy(ITERATION_MS)),
                                                         SimInstance("B", 2, workload=busy(ITERATION_MS))],
                     switch=cost)
    res = sim.run(65 * NS_PER_S, warmup_ns=5 * NS_PER_S)
    held = sim.sched.held_ns("B", sim.now) / sim.sched.held_ns("A", sim.now)
    return res.instances["B"].share / res.instances["A"].share, held


@pytest.mark.parametrize("slice_ms", [0, 36])  # 0: auto
def test_iterations_at_1_2_follow_the_weights_when_every_hand_over_loss_is_reported(slice_ms: int) -> None:
    """Hand-overs of 0.7 ms (transit and the wake-up to the first launch, reported): the work ratio is 2 within
    0.5 %; turns of one slice and of two end at iteration ends alike, and neither loses work to it."""
    work, held = ratios(SwitchCost(transit_ns=330_000, wake_ns=50_000), **({"slice_ms": slice_ms} if slice_ms else {}))
    assert work == pytest.approx(2.0, rel=0.005)
    assert held == pytest.approx(2.0, rel=0.015)  # held includes the hand-overs, which weight 1 has as many of


def test_an_unreported_loss_at_each_turn_is_the_h100s_signature() -> None:
    """The same with 2 ms of each turn's start lost where the client cannot see it: the work ratio reads 2.06, above
    2, while the held ratio stays at 1.98, below it (the H100: 2.111 and 1.992). Each ms lost unseen a turn moves
    the ratio by about 1.5 % at 36 ms slices."""
    seen, _ = ratios(SwitchCost(transit_ns=330_000, wake_ns=50_000), slice_ms=36)
    work, held = ratios(SwitchCost(transit_ns=330_000, wake_ns=50_000, warm_ns=2_000_000, report=False), slice_ms=36)
    assert work == pytest.approx(2.06, abs=0.01) and work > seen + 0.05
    assert held == pytest.approx(1.98, abs=0.01)
    reported, _ = ratios(SwitchCost(transit_ns=330_000, wake_ns=50_000, warm_ns=2_000_000), slice_ms=36)
    assert reported == pytest.approx(2.0, rel=0.005)  # reported, the same loss costs no share
