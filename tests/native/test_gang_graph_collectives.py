"""Collectives inside CUDA graphs count on the board at each replay (behaviour §11, "Where a turn stops";
libcgpu.so's graphcoll.c and board.c).

The scenario of test_gang_turn_end.py, with each of J's steps captured once into a CUDA graph (three 0.5 ms kernels
and the fake driver's collective, named as NCCL names its kernels: as vLLM's tensor-parallel decode captures its
all-reduce) and replayed with one cuGraphLaunch a step. J's rank on GPU 1 spends 1 ms on the host before each
replay, A on GPU 0 and B on GPU 1 share the GPUs, 80 ms slices. The shim counts each collective at capture for the
graph, and each replay counts the graph's collectives on the board before its gate: at a turn's end the rank behind
replays up to the collective its peer waits in, and both stop there. Uncounted (``CGPU_COLLECTIVE_KERNELS=none``, what
the shim did with every graph before), a replay launched just before the deadline waits in its collective for the
gang's next turn, and the daemon bills the GPU held past the deadline as the gang's spin."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from tests.native.conftest import Native
from tests.native.test_gang_turn_end import STRAND_MS, Job


def _run(n: Native, tmp_path: Path, counting: str, seconds: float,
         how: str = "capture") -> tuple[list[float], float, list[int], str]:
    """(each GPU's longest wait of one collective in ms, the daemon's gang spin of J in s, each rank's steps, the
    ranks' stderr); ``how``: how each rank makes the graph it replays from its capture (cuda_job's --graph)."""
    tag = f"gg{os.getpid()}{counting[:2]}{how[:2]}{int(n.asan)}"
    with DaemonProc(tmp_path / "d", "--sim-gpus", "2x16GiB", "--identity", "declared", "--slice-ms", "80") as d:
        job = Job(n, d, tag, counting, ("--api", "graph", "--graph", how))
        try:
            job.say("run")
            time.sleep(1.0)
            job.forget_longest()
            spin_before = _gang_spin(d, f"J{tag}")
            time.sleep(seconds)
            job.say("pause")
            time.sleep(0.2)
            longest = job.longest_waits_ms()
            spin = _gang_spin(d, f"J{tag}") - spin_before
            steps = [job.steps(k, tmp_path / f"r{k}.json") for k in (0, 1)]
        finally:
            errs = job.close()
    return longest, spin, steps, errs


def _gang_spin(d: DaemonProc, inst: str) -> float:
    """The daemon's spin of ``inst`` on both GPUs: time a rank held its GPU past its turn's deadline while its peer
    already waited for the next turn."""
    return sum(i["gang_spin_seconds"] for g in d.status()["gpus"] for i in g["instances"] if i["id"] == inst)


@pytest.mark.parametrize("how", ["capture", "clone", "child", "update"])
def test_graph_replays_stop_at_the_same_collective(native: Native, tmp_path: Path, how: str) -> None:
    """Counted, whether the graph replayed is the capture's, a clone of it (cuGraphClone), a graph holding it as
    a child graph node (cuGraphAddChildGraphNode), or an executable graph of spin kernels updated with it
    (cuGraphExecUpdate): no collective waits as long as a strand does (STRAND_MS, half a tenant's 80 ms turn;
    measured 3.2 to 9.5 ms on a 2-core host shared with other test runs), the ranks' step counts stay within one,
    and the daemon's spin stays under 50 ms a second (measured 45 to 61 ms in 3 s: the catch-up past each turn's
    deadline, as with the collective launched on its own, 55 to 62 ms). The shim before graphs were counted: its
    collectives waited 165 to 250 ms, 0.8 to 1.0 s of spin; without the clone, child node and update hooks, those
    three waited 89 to 249 ms."""
    seconds = 3.0
    longest, spin, steps, errs = _run(native, tmp_path, "nccl", seconds, how)
    assert max(longest) < STRAND_MS, (longest, spin)
    assert abs(steps[0] - steps[1]) <= 1 and min(steps) > 100, steps
    assert spin < 0.050 * seconds, (spin, longest)
    assert "left:" not in errs  # the last rank to exit removed the board


def test_uncounted_graph_collectives_strand_until_the_next_turn(native: Native, tmp_path: Path) -> None:
    """The control: with nothing counted, a replay launched just before a turn's end waits in its collective for the
    gang's next turn (the test above fails so, as it did before graphs were counted); the daemon sees its GPU held
    past the deadline while the peer waits (measured: 86 to 323 ms of collective wait, 0.28 to 1.24 s of spin in
    3 s). Run for 5 s: in 2 of about 14 runs of 3 s beside other native tests no replay stranded at all (the ranks'
    launches fell on one side of every deadline)."""
    seconds = 5.0
    longest, spin, _, _ = _run(native, tmp_path, "none", seconds)
    assert max(longest) >= STRAND_MS + 5, (longest, spin)
    assert spin >= 0.050 * seconds, (spin, longest)


@pytest.mark.parametrize("how", ["capture", "clone", "child", "update"])
def test_graph_collectives_under_asan(native_asan: Native, tmp_path: Path, how: str) -> None:
    """The capture's count, the per-graph records (made, copied, replaced, freed with their graphs) and a replay's
    collectives on the board under AddressSanitizer and UBSan, leaks included."""
    _, _, steps, errs = _run(native_asan, tmp_path, "nccl", 1.5, how)
    assert "AddressSanitizer" not in errs and "runtime error" not in errs and "LeakSanitizer" not in errs, errs
    assert abs(steps[0] - steps[1]) <= 1 and min(steps) > 20, steps
    assert "left:" not in errs
