"""bench.gang's rates alone are read with the host loaded as in the scenario: one busy process a GPU."""

from __future__ import annotations

from bench.gang import SCENARIOS, baseline_groups


def test_single_gpu_tenants_run_alone_beside_one_on_the_other_gpu() -> None:
    """J alone (it keeps both its GPUs busy); A beside B, then beside C: every tenant has a window, and no group
    puts two tenants on one GPU."""
    groups = baseline_groups(SCENARIOS["job+tenants"])
    assert groups == [["J"], ["A", "B"], ["A", "C"]]
    gpus = {t.name: t.gpus for t in SCENARIOS["job+tenants"]}
    for group in groups[1:]:
        used = [g for name in group for g in gpus[name]]
        assert len(used) == len(set(used))


def test_jobs_alone_run_by_themselves() -> None:
    assert baseline_groups(SCENARIOS["two_jobs"]) == [["J1"], ["J2"]]
