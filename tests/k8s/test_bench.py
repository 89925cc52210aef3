"""bench.k8s runs end to end on a real arbiterd and ends with its summary line."""

from __future__ import annotations

import re

import pytest

from bench import k8s


def test_bench_k8s_runs_on_arbiterd(capsys: pytest.CaptureFixture[str]) -> None:
    assert k8s.main(["--pods", "30", "--no-results"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"pods=30 overcommits=0 binpack_refused=(\d+) spread_refused=(\d+) allocate_p99_ms=[\d.]+ "
                     r"pods_labelled=(\d+)/(\d+)", last)
    assert m, last
    labelled, running = int(m.group(3)), int(m.group(4))
    assert running >= 10 and labelled == running  # every pod registered at the end: its series carry its pod


def test_the_workload_is_fixed_by_its_seed() -> None:
    assert k8s.workload(50, 7) == k8s.workload(50, 7) != k8s.workload(50, 8)
    assert all(a.mem or a.core for a in k8s.workload(200, 7))
