"""bench.gpu's framework parts, piece by piece, without a GPU: the rate a tenant's steps give, the windows of a
sitting, the worker's protocol (on its GPU-free ``sleep`` workload), MPS started, proven and refused in one line
(a stand-in ``nvidia-cuda-mps-control``), and the table and summary they make."""

from __future__ import annotations

import itertools
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_mps
from bench.gpu_frameworks import OK_BAND, FrameworkPart, Spec
from bench.gpu_report import frameworks_table, summary_frameworks
from bench.gpu_timeline import S, plan_of, timeline
from bench.gpu_workers import Done, PyWorker, WorkerError, keep_stderr
from cgpu_testing.tools import ROOT

MS = 1_000_000


def test_a_rate_counts_the_work_between_the_first_and_last_step_that_ended_in_the_window() -> None:
    # steps of 10 ms, back to back from t=0, 4 images each; the window [25 ms, 95 ms] holds the ends 30..90 ms
    steps = [(k * 10 * MS, (k + 1) * 10 * MS) for k in range(12)]
    done = Done("images", {"inf": 4}, {"inf": steps})
    assert done.rate("inf", (25 * MS, 95 * MS)) == pytest.approx(4 * 6 / 0.060)  # 6 steps between 30 and 90 ms
    assert done.rate("inf", (25 * MS, 45 * MS)) is None  # two ends: too few to say
    # the CUDA job program counts its own windows: kernel-ms over its first batch's start to its last's end
    c = Done("kernel-ms", {}, totals=[(500.0, 0, S), (100.0, S, S + S // 2)])
    assert c.rate("x", (0, 0), 0) == pytest.approx(500.0) and c.rate("x", (0, 0), 1) == pytest.approx(200.0)


def test_a_sitting_runs_each_alone_then_the_pair_with_a_settle_before_each_measured_part() -> None:
    t0 = 10 * S
    ws = timeline(t0, ["inf16", "train64"], {"inf16": 0.01, "train64": 0.2}, x_s=1.5, p_s=4.0)
    assert [(w.variant, w.who) for w in ws] == [("inf16", "A"), ("inf16", "B"), ("inf16", "AB"),
                                                 ("train64", "A"), ("train64", "B"), ("train64", "AB")]
    assert ws[0].run[0] == t0 and all(a.run[1] == b.run[0] for a, b in itertools.pairwise(ws))
    # a fast step: 0.3 s of settle, the windows as asked
    assert ws[0].measure == (t0 + S * 3 // 10, t0 + S * 3 // 10 + 3 * S // 2)
    assert ws[2].measure[1] - ws[2].measure[0] == 4 * S
    # a 0.2 s step: 0.6 s of settle, and windows long enough for 10 steps alone and 30 in the pair
    assert ws[3].measure[0] - ws[3].run[0] == 6 * S // 10
    assert ws[3].measure[1] - ws[3].measure[0] == 2 * S and ws[5].measure[1] - ws[5].measure[0] == 6 * S
    # a 1 s step: no window past three times what was asked
    slow = timeline(t0, ["x"], {"x": 1.0}, x_s=1.5, p_s=4.0)
    assert [w.measure[1] - w.measure[0] for w in slow] == [9 * S // 2, 9 * S // 2, 12 * S]
    assert plan_of("A", ws) == [(w.variant, *w.run) for w in ws if w.who in ("A", "AB")]
    assert [w.who for w in timeline(0, ["x"], {}, 1, 2, order=("B", "A", "AB"))] == ["B", "A", "AB"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def test_a_worker_imports_waits_for_init_reports_ready_and_steps_only_inside_its_windows(tmp_path: Path) -> None:
    w = PyWorker("t-sleep", [], "sleep", [], _env(), tmp_path, ROOT)
    try:
        w.wait_for("loaded", time.monotonic() + 60)
        w.init()
        info = w.ready(time.monotonic() + 60)
        assert info["pid"] == w.proc.pid and info["shim"] is False  # no cgpu-run: libcgpu.so not mapped
        assert info["variants"]["sleep"]["unit"] == "steps" and 0.002 <= info["variants"]["sleep"]["step_s"] < 0.5
        t0 = time.monotonic_ns() + S // 5
        w.go([("sleep", t0, t0 + S // 2), ("sleep", t0 + S, t0 + S + S // 2)])
        done = w.done(time.monotonic() + 30)
    finally:
        w.kill()
    steps = done.steps["sleep"]
    # every step started inside a window, none in the half second between them
    assert all(t0 <= s < t0 + S // 2 or t0 + S <= s < t0 + S + S // 2 for s, _ in steps)
    assert any(s >= t0 + S for s, _ in steps) and any(s < t0 + S // 2 for s, _ in steps)
    rate = done.rate("sleep", (t0, t0 + S // 2))
    assert rate is not None and 50 < rate <= 500  # 2 ms sleeps: at most 500 a second, fewer on a loaded machine


def test_a_worker_that_cannot_start_is_one_line_with_its_reason_and_its_stderr_is_kept(tmp_path: Path) -> None:
    from bench.gpu import Proof

    w = PyWorker("t-bad", [], "warp", [], _env(), tmp_path, ROOT)
    try:
        with pytest.raises(WorkerError, match=r"t-bad exited with 2 before 'loaded': fw_worker: no workload warp"):
            w.wait_for("loaded", time.monotonic() + 60)
    finally:
        w.kill()
    proof = Proof(tmp_path / "out", fake=True, budget_s=10)  # where a GPU run's failed tenants' stderr goes
    try:
        assert keep_stderr(proof, [w]) == "workers.log"
        assert keep_stderr(proof, [w]) == "workers.log"  # one file for all: a GPU host sends back few files
    finally:
        proof.close()
    log = (tmp_path / "out" / "workers.log").read_text()
    assert log.count("===== t-bad\n") == 2 and "fw_worker: no workload warp" in log


FAKE_CONTROL = """#!/bin/sh
# a stand-in nvidia-cuda-mps-control: -d "starts" (writes its pid file); commands on stdin answer from files
echo "$*" >> "$CUDA_MPS_LOG_DIRECTORY/calls"
if [ "$1" = "-d" ]; then
  [ -n "$MPS_FAIL_START" ] && { echo "cannot start: $MPS_FAIL_START" >&2; exit 1; }
  echo 999999 > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"; exit 0
fi
read cmd
echo "$cmd" >> "$CUDA_MPS_LOG_DIRECTORY/calls"
case "$cmd" in
  get_server_list) cat "$MPS_SERVERS" 2>/dev/null ;;
  get_client_list*) echo 4242; echo 4343 ;;
esac
"""


def _control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_text(FAKE_CONTROL)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(gpu_mps, "control_binary", lambda: str(path))


PROBE = [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(30)"]


def test_mps_that_its_clients_do_not_use_is_refused_in_one_line_and_stopped(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _control(tmp_path, monkeypatch)
    mps = gpu_mps.Mps(tmp_path / "mps", {**os.environ, "MPS_SERVERS": str(tmp_path / "none")})
    with pytest.raises(gpu_mps.MpsUnavailable, match=r"^the MPS daemon started but its clients run without it \("):
        mps.start(PROBE)
    assert (mps.logs / "calls").read_text().split("\n")[:3] == ["-d", "", "get_server_list"]
    assert "quit" in (mps.logs / "calls").read_text().splitlines()  # stopped again


def test_mps_is_started_proven_by_a_client_and_lists_its_clients(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _control(tmp_path, monkeypatch)
    (tmp_path / "servers").write_text("777\n")
    mps = gpu_mps.Mps(tmp_path / "mps", {**os.environ, "MPS_SERVERS": str(tmp_path / "servers")})
    mps.start(PROBE)
    assert mps.clients() == [4242, 4343]
    assert mps.client_env(33) == {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe), "CUDA_MPS_LOG_DIRECTORY": str(mps.logs),
                                  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33"}
    mps.stop()
    assert (mps.logs / "calls").read_text().splitlines()[-1] == "quit"
    monkeypatch.setenv("MPS_FAIL_START", "no GPU")
    bad = gpu_mps.Mps(tmp_path / "mps2", dict(os.environ))
    with pytest.raises(gpu_mps.MpsUnavailable, match="nvidia-cuda-mps-control -d exited with 1: cannot start: no GPU"):
        bad.start(PROBE)


def test_without_the_control_program_mps_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_mps, "control_binary", lambda: None)
    with pytest.raises(gpu_mps.MpsUnavailable, match=r"^nvidia-cuda-mps-control is not on this host$"):
        gpu_mps.Mps(tmp_path, {}).start(PROBE)


def _row(mode: str, a: float, b: float, **kw: object) -> dict[str, object]:
    return {"variant": "inf64", "mode": mode, "sharing": mode, "unit": "images", "alone_a": 100.0,
            "alone_b": 104.0, "a": a, "b": b, "ratio": b / a, "shim": mode == "cgpu", "stand_in": False, **kw}


def test_a_row_is_ok_with_the_shim_in_both_and_its_ratio_within_ten_percent_of_two() -> None:
    class Proof:
        fake = False

    part = FrameworkPart(Proof(), "resnet50", Spec("t", "resnet", ("inf64",), "torch"), {})
    part.rows = [_row("cgpu", 34.0, 66.0), _row("timeslice", 50.0, 52.0, alone_a=104.0, alone_b=108.0)]
    part.aggregate()
    cg, ts = part.rows
    assert cg["exclusive"] == 102.0 and cg["aggregate_pct"] == pytest.approx(100 * 100 / 102)
    assert ts["exclusive"] == 102.0  # every sitting against the same exclusive: the one through the shim
    assert cg["ok"] is True and "ok" not in ts
    assert cg["shim_cost_pct"] == pytest.approx(100 * (212 / 204 - 1))  # plain alone against shimmed alone
    low = 2 * (1 - OK_BAND) - 0.01
    part.rows = [_row("cgpu", 50.0, 50.0 * low)]
    part.aggregate()
    assert part.rows[0]["ok"] is False
    part.rows = [_row("cgpu", 34.0, 66.0, prealloc_pct_of_limit=[74.9, 101.0])]  # one pool past its limit
    part.aggregate()
    assert part.rows[0]["ok"] is False


def test_the_summary_counts_cgpu_rows_and_names_the_ratio_farthest_from_two() -> None:
    rows = [[{"mode": "cgpu", "ratio": 1.97, "ok": True}, {"mode": "timeslice", "ratio": 0.9}],
            [{"mode": "cgpu", "ratio": 2.31, "ok": False}], []]
    assert summary_frameworks(rows) == "frameworks_ok=1/2 worst_ratio=2.310"
    assert summary_frameworks([]) == "frameworks_ok=0/0 worst_ratio=na"


def test_a_workload_gets_one_table_with_a_row_per_way_of_sharing_and_its_notes() -> None:
    rows = [{**_row("cgpu", 34.0, 66.0), "sharing": "cgpu 1:2", "held_ratio": 2.0, "aggregate_pct": 98.0, "ok": True},
            {**_row("mps", 40.0, 70.0), "sharing": "MPS 33/67", "aggregate_pct": 107.8}]
    md = frameworks_table("resnet50", {"rows": rows, "notes": ["MPS: skipped: x"]})
    assert md[1] == "**resnet50**, images/s"
    assert "| inf64 | cgpu 1:2 | 100.0 | 104.0 | 34.0 | 66.0 | **1.941** | 2.000 | 98.0 % | yes | yes |" in md
    assert "| inf64 | MPS 33/67 | 100.0 | 104.0 | 40.0 | 70.0 | **1.750** | - | 107.8 % | no |  |" in md
    assert md[-1] == "- MPS: skipped: x"


# a stand-in for the CUDA job program: one spin line per window, 100 kernel-ms over its span (exit 1 with FAIL_JOB)
FAKE_JOB = """#!/bin/sh
[ -n "$FAIL_JOB" ] && { echo "cuda_job: cuInit failed: 100" >&2; exit 4; }
for a in "$@"; do
  case "$a" in spin=*) IFS=, read ms b s e <<EOF2
${a#spin=}
EOF2
    echo "spin kernels=50 batches=10 kernel_ns=100000000 first=$s last=$e";;
  esac
done
"""


class StubProof:
    """What a framework part asks of bench.gpu's Proof, without a daemon: a budget, and a record of its asks."""

    fake = True
    default_policy = 1

    def __init__(self, tmp: Path, left: float, reserve: float) -> None:
        self.tmp, self.env, self.left, self.reserve = tmp, {}, left, reserve
        self.job = tmp / "cuda_job"
        self.job.write_text(FAKE_JOB)
        self.job.chmod(0o755)
        self.info = {"gpus": [{"total_mem": 16 << 30}]}
        self.asked: list[tuple[str, str]] = []

    def left_s(self) -> float:
        return self.left

    def reserve_after(self, name: str) -> float:
        return self.reserve

    def provision(self, name: str, gpu: str = "0", **settings: object) -> None:
        self.asked.append(("provision", f"{name} {settings}"))

    def status(self) -> dict[str, object]:
        return {"gpus": [{"policy": 2, "instances": []}]}

    def ctl_put(self, path: str, value: str) -> None:
        self.asked.append((path, value))


def _stand_in_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, left: float, reserve: float,
                   ) -> tuple[StubProof, FrameworkPart, dict[str, object]]:
    monkeypatch.setattr(gpu_mps, "control_binary", lambda: None)
    monkeypatch.setattr(FrameworkPart, "prefix", lambda self, mode, who, names: [])  # no cgpu-run: no daemon here
    proof = StubProof(tmp_path, left, reserve)
    figures: dict[str, object] = {}
    spec = Spec("stand-in", "graph", ("decode",), "torch", stand_in=(1.0, 4, True))
    return proof, FrameworkPart(proof, "cuda_graph", spec, figures), figures


def test_a_comparison_that_the_budget_leaves_no_room_for_is_one_line_and_the_cgpu_sitting_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 100 s left, 90 of them for the framework parts after this one: the cgpu sitting (about 17 s) runs, the
    # time-slicing sitting does not fit the 10 s left for it
    proof, part, figures = _stand_in_part(tmp_path, monkeypatch, left=100.0, reserve=90.0)
    part.run()
    assert [r["mode"] for r in part.rows] == ["cgpu"]
    # each window's 100 kernel-ms over its span: 1 s alone (100 a second), 4 s in the pair (25 a second each)
    row = part.rows[0]
    assert (row["alone_a"], row["alone_b"], row["a"], row["b"]) == pytest.approx((100.0, 100.0, 25.0, 25.0))
    assert row["ratio"] == pytest.approx(1.0) and row["aggregate_pct"] == pytest.approx(50.0) and row["ok"] is False
    assert figures["notes"] == [
        "the fake driver runs no framework: the CUDA job program stands in (4 kernels of 1.0 ms a batch, as one "
        "cuGraphLaunch)",
        "MPS: skipped: nvidia-cuda-mps-control is not on this host",
        "time-slicing: skipped: 10 s of the budget left for it, it may need 17 s",
    ]
    # the instances at 1:2, the alone windows on the default policy and the pair on the one provisioning chose
    assert [a for a in proof.asked if a[0] == "0/policy"] == [("0/policy", "1"), ("0/policy", "2")]
    assert [a[1].split()[0] for a in proof.asked if a[0] == "provision"] == ["fw-cuda_graph-a", "fw-cuda_graph-b"]


def test_a_cgpu_sitting_without_the_budget_skips_its_part_and_a_broken_sitting_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.gpu_part import Skip

    _, part, _ = _stand_in_part(tmp_path, monkeypatch, left=5.0, reserve=0.0)
    with pytest.raises(Skip, match=r"^5 s of the budget left for it, it may need 17 s$"):
        part.run()
    monkeypatch.setenv("FAIL_JOB", "1")
    (tmp_path / "b").mkdir()
    _, part, figures = _stand_in_part(tmp_path / "b", monkeypatch, left=1000.0, reserve=0.0)
    part.run()
    assert part.rows == [] and figures["failed_sittings"] == ["cgpu", "timeslice"]
    assert "cgpu 1:2: failed: WorkerError: cuda_graph-cgpu-A: cuda_job exited with 4: cuda_job: cuInit failed: 100" \
        in figures["notes"]
