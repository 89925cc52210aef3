"""Several processes of one instance under libcgpu.so, on the fake CUDA driver (behaviour §2, "Several processes of
one instance"): they share the instance's turn and its memory ledger, each sees the instance's current use, and a
fork()ed child that uses CUDA is gated and counted like any of them.

The fake runs every process's kernels on a CPU thread of its own, so the processes of one instance run theirs side
by side inside its turn (a GPU would time-slice them): an instance's GPU time here is the union of its processes'
kernel intervals.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from libcgpu_client.native import build as nb
from tests.native import trace
from tests.native.conftest import PROGS, Native, at, fields, lines, start_job

MIB = 1024**2
GIB = 1024**3
DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


def union(intervals: list[tuple[int, int]], t0: int, t1: int) -> float:
    """Seconds inside [t0, t1] during which at least one of ``intervals`` ran."""
    total, reach = 0, t0
    for s, e in sorted(intervals):
        s, e = max(s, reach), min(e, t1)
        if e > s:
            total += e - s
            reach = e
    return total / 1e9


def instance_of(d: DaemonProc, name: str) -> dict[str, object]:
    doc = json.loads(d.ctl("status").stdout)
    return next(i for i in doc["gpus"][0]["instances"] if i["id"] == name)


def test_two_processes_of_one_instance_beside_another_at_1_1_get_half(native: Native, daemon_factory: type,
                                                                      short_tmp: Path) -> None:
    """Instance a runs two processes, b one, weights 1:1 on policy 2: the daemon's useful time of a is b's within
    3 %, not twice b's (one turn each per round, whatever the process count), and a's kernels never run while
    b's do. a's GPU time (its processes' kernels, side by side in its turns) is b's within 15 %: beside each
    other a's two processes leave fewer gaps in its turns than b's one does between its sync and its next launch
    (read 1.02-1.12 here, where a turn per process would read 2)."""
    d = daemon_factory.start(*DAEMON, "--policy", "2", "--slice-ms", "20")
    tr = short_tmp / "trace"
    start, end = at(1.0), at(8.0)
    procs = {name: start_job(native, d, f"spin=2,4,{start},{end}", dl=name == "b", CGPU_INSTANCE=inst,
                             FAKECUDA_TRACE=str(tr))
             for name, inst in (("a1", "a"), ("a2", "a"), ("b", "b"))}
    for p in procs.values():
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    runs = trace.read(tr)
    a = runs[procs["a1"].pid] + runs[procs["a2"].pid]
    b = runs[procs["b"].pid]
    t0, t1 = start + 1_000_000_000, end - 300_000_000
    ga, gb = union(a, t0, t1), union(b, t0, t1)
    assert ga / gb == pytest.approx(1.0, rel=0.15), (ga, gb)
    assert (ga + gb) / ((t1 - t0) / 1e9) > 0.75, (ga, gb)
    assert trace.overlap({1: sorted(a), 2: b}) < 0.001
    useful = {i: float(instance_of(d, i)["useful_seconds"]) for i in ("a", "b")}  # type: ignore[arg-type]
    assert useful["a"] / useful["b"] == pytest.approx(1.0, rel=0.03), useful


def test_memory_one_process_takes_is_seen_by_the_others_at_once(native: Native, daemon_factory: type) -> None:
    """Three processes of one 1 GiB instance: what the first holds (600 MiB) shows at once in the second's
    cuMemGetInfo; the second's 500 MiB does not fit (the limit is for them all) and its 400 MiB does; the first,
    asked again, sees both; the ledger names both; and once both exit a third process sees all of it free."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "shared", "CGPU_MEM_LIMIT": "1GiB"}
    first = start_job(native, d, "alloc=600M", "ready", "sleep=1500", "info", "ready", "sleep=30000", **env)
    assert first.stdout is not None
    assert first.stdout.readline().startswith("alloc") and first.stdout.readline().startswith("ready")
    second = start_job(native, d, "info", "alloc=500M", "alloc=400M", "info", "ready", "sleep=30000", **env)
    assert second.stdout is not None
    out2 = "".join(second.stdout.readline() for _ in range(5))
    info2 = lines(out2, "info")
    assert [int(i["free"]) for i in info2] == [GIB - 600 * MIB, GIB - 1000 * MIB], out2
    assert [ln["rc"] for ln in lines(out2, "alloc")] == ["2", "0"], out2  # 2: CUDA_ERROR_OUT_OF_MEMORY
    assert first.stdout.readline().startswith("sleep")
    info1 = fields(first.stdout.readline())
    assert int(info1["free"]) == GIB - 1000 * MIB and int(info1["total"]) == GIB, info1
    meminfo = d.ctl("cat", "0/shared/meminfo").stdout
    assert f"PID: {first.pid} Mem: {600 * MIB}" in meminfo and f"PID: {second.pid} Mem: {400 * MIB}" in meminfo
    for p in (first, second):
        p.kill()
        p.communicate()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and "PID:" in d.ctl("cat", "0/shared/meminfo").stdout:
        time.sleep(0.05)
    third = start_job(native, d, "info", **env)
    out3, err3 = third.communicate(timeout=30)
    assert int(lines(out3, "info")[0]["free"]) == GIB, (out3, err3)


@pytest.fixture(scope="module")
def fork_job(native: Native, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nb.build_program([PROGS / "fork_job.c"], tmp_path_factory.mktemp("fork") / "fork_job",
                            link_cuda=native.fakes)


def test_a_forked_child_that_uses_cuda_is_gated_and_counted(native: Native, daemon_factory: type,
                                                           short_tmp: Path, fork_job: Path) -> None:
    """The parent registers (its NVML query starts the shim's connection) and forks; the child initialises CUDA:
    it connects again as a client of the same instance, its 600 MiB is on the instance's ledger under its pid and
    its second 600 MiB past the 1 GiB limit fails, and its kernels take the instance's turns beside another
    instance's (never at once, and about half the GPU each)."""
    d = daemon_factory.start(*DAEMON, "--policy", "1", "--slice-ms", "10")
    tr = short_tmp / "trace"
    start, end = at(1.0), at(4.0)
    other = start_job(native, d, f"spin=2,4,{start},{end}", CGPU_INSTANCE="other", FAKECUDA_TRACE=str(tr))
    env = native.env(d, CGPU_INSTANCE="forked", CGPU_MEM_LIMIT="1GiB", FAKECUDA_TRACE=str(tr))
    job = subprocess.Popen([str(fork_job), str(600 * MIB), str(600 * MIB), "2", str(end), "1500"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert job.stdout is not None
    nvml = fields(job.stdout.readline())
    assert nvml["rc"] == "0" and nvml["total"] == str(GIB), nvml  # the parent was registered: it sees the limit
    child = fields(job.stdout.readline())
    assert (child["alloc1"], child["alloc2"]) == ("0", "2"), child
    assert int(lines(job.stdout.readline(), "spin")[0]["kernels"]) > 0
    meminfo = d.ctl("cat", "0/forked/meminfo").stdout  # the child holds its memory 1.5 s more
    assert f"PID: {child['pid']} Mem: {600 * MIB}" in meminfo, meminfo
    out, err = job.communicate(timeout=30)
    assert job.returncode == 0 and "child_status=0" in out, (out, err)
    _, err = other.communicate(timeout=30)
    assert other.returncode == 0, err
    runs = trace.read(tr)
    mine, theirs = runs[int(child["pid"])], runs[other.pid]
    assert trace.overlap({1: mine, 2: theirs}) < 0.001
    t0, t1 = start + 300_000_000, end - 200_000_000
    a, b = trace.busy(mine, t0, t1), trace.busy(theirs, t0, t1)
    assert a / (a + b) == pytest.approx(0.5, abs=0.1), (a, b)
    assert int(instance_of(d, "forked")["grants"]) > 10  # type: ignore[call-overload]


def test_a_forked_child_under_asan(native_asan: Native, daemon_factory: type,
                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """The fork, with the shim, the fakes and the program built with AddressSanitizer and UBSan: no error in the
    parent or the child (the child's shim starts afresh from what the parent's left)."""
    prog = nb.build_program([PROGS / "fork_job.c"], tmp_path_factory.mktemp("fork-asan") / "fork_job", asan=True,
                            link_cuda=native_asan.fakes)
    d = daemon_factory.start(*DAEMON)
    res = subprocess.run([str(prog), str(100 * MIB), str(100 * MIB), "1", str(at(0.5)), "0"],
                         env=native_asan.env(d, CGPU_INSTANCE="forked"), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "child_status=0" in res.stdout, (res.stdout, res.stderr)
    assert "alloc1=0 alloc2=0" in res.stdout, res.stdout
