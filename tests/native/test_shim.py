"""libcgpu.so under real programs: C programs and ctypes Python against the fake CUDA driver.


Each test starts a real arbiterd on a simulated GPU. The fake driver runs a
kernel as a CPU busy-spin on a worker thread and can write a trace of every
kernel (FAKECUDA_TRACE), which is how kernel time and overlap are measured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import tool
from tests.native import trace
from tests.native.conftest import WORKLOADS, Native, at, fields, lines, run_job, start_job

MIB = 1024**2
GIB = 1024**3
DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


def status_of(d: DaemonProc, instance: str) -> dict[str, object]:
    doc = json.loads(d.ctl("status").stdout)
    return next(i for i in doc["gpus"][0]["instances"] if i["id"] == instance)


def pair(native: Native, d: DaemonProc, tmp: Path, seconds: float, kernel_ms: float, batch: int,
         **kw: str) -> tuple[float, float, float, float]:
    """Weights 1 (direct linking) and 2 (dlopen), both spinning; kernel seconds in the common window,
    the window, and the overlap between them. The window is whole rounds: from the start of one of
    the weight-1 process's turns to the start of a later one, so a turn cut at either edge (120 ms
    with 60 ms kernels, 4 % of what weight 1 gets in 10 s) does not move the ratio."""
    tr = tmp / "trace"
    start, end = at(1.0), at(1.0 + seconds)
    spin = f"spin={kernel_ms},{batch},{start},{end}"
    procs = [start_job(native, d, *(["--api", kw["api"]] if "api" in kw else []), spin, dl=dl,
                       CGPU_INSTANCE=name, ALIYUN_COM_GPU_SCHD_WEIGHT=str(w), FAKECUDA_TRACE=str(tr))
             for name, w, dl in (("w1", 1, False), ("w2", 2, True))]
    pids = []
    for p in procs:
        _, err = p.communicate(timeout=seconds + 60)
        assert p.returncode == 0, err
        pids.append(p.pid)
    runs = trace.read(tr)
    # both are past their first grant and not yet done
    starts = [t for t in trace.turn_starts(runs[pids[0]]) if start + 500_000_000 <= t <= end - 200_000_000]
    assert len(starts) >= 2, starts
    t0, t1 = starts[0], starts[-1]
    a, b = (trace.busy(runs[pid], t0, t1) for pid in pids)
    return a, b, (t1 - t0) / 1e9, trace.overlap(runs)


def test_weights_1_2_get_kernel_time_1_2(native: Native, daemon_factory: type, short_tmp: Path) -> None:
    """Policy 2, weights 1:2, 2 ms kernels queued 4 at a time: kernel time 1:2 within ±10 % over 10 s (ungated,
    about 1:1), and kernels of the two processes never run at once; the daemon's bills (useful time) 1:2 within
    ±3 %.

    Why ±10 % for kernel time, not 5: beside two busy loops on this 2-core host the kernel-time ratio reads
    2.16-2.26 while the bills read 1.98-2.01. The fake GPU is a CPU thread, and under load the gap it sees at a
    hand-over (the last kernel of one process to the first of the other) averages 0.9-2 ms, p90 2.5 ms, where the
    daemon measures 0.3-0.5 ms: the rest (the woken launcher, the fake's kernel thread) is used time to the
    daemon, billed to the incoming tenant. Both processes have as many turns (about 175 in 10 s; weight 2's
    are twice as long), so that loss is twice the fraction of weight 1's kernel time. The precision is
    bench.fidelity --native's (1:2 within 0.48 % at the defaults)."""
    d = daemon_factory.start(*DAEMON, "--policy", "2", "--slice-ms", "20")
    a, b, win, ov = pair(native, d, short_tmp, 10.7, 2, 4)
    assert win >= 9.5, win
    assert b / a == pytest.approx(2.0, rel=0.10), (a, b, win)
    useful = {i: float(status_of(d, i)["useful_seconds"]) for i in ("w1", "w2")}  # type: ignore[arg-type]
    assert useful["w2"] / useful["w1"] == pytest.approx(2.0, rel=0.03), useful
    assert ov < 0.001, ov
    assert (a + b) / win > 0.75, (a, b, win)  # the GPU is not left idle between turns


def test_kernels_three_slices_long_are_waited_for_and_charged(native: Native, daemon_factory: type,
                                                              short_tmp: Path) -> None:
    """60 ms kernels (3x the 20 ms slice), two queued at once, run past the lease end: the shim waits
    for them before giving the lease back and the overrun is charged, so the share is still 1:2."""
    d = daemon_factory.start(*DAEMON, "--policy", "2", "--slice-ms", "20")
    a, b, win, ov = pair(native, d, short_tmp, 10.7, 60, 2)
    assert b / a == pytest.approx(2.0, rel=0.05), (a, b, win)
    assert ov < 0.001, ov  # the next holder starts only after the queued kernels finished
    held = {i: float(status_of(d, i)["held_seconds"]) for i in ("w1", "w2")}  # type: ignore[arg-type]
    # What the daemon charged, over the whole run: its first and last turns (120 ms each, 3 % of what
    # weight 1 holds) are in it, so ±10 % (1.90 to 2.00 in runs here).
    assert held["w2"] / held["w1"] == pytest.approx(2.0, rel=0.10), held


@pytest.mark.parametrize("api", ["ex", "coop", "graph"])
def test_every_launch_entry_point_is_gated(native: Native, daemon_factory: type, short_tmp: Path,
                                           api: str) -> None:
    """cuLaunchKernelEx, cuLaunchCooperativeKernel and cuGraphLaunch (a captured graph of 4 kernels,
    gated as a whole): two instances on policy 1 never run kernels at once, and both progress."""
    d = daemon_factory.start(*DAEMON, "--policy", "1", "--slice-ms", "10")
    a, b, win, ov = pair(native, d, short_tmp, 2.5, 2, 4, api=api)
    assert ov < 0.001, ov
    assert a > 0.2 * win and b > 0.2 * win, (a, b, win)


def test_memory_limit_out_of_memory_and_return(native: Native, daemon_factory: type) -> None:
    """A 1 GiB instance: the second process's 600 MiB gets CUDA_ERROR_OUT_OF_MEMORY while the first
    keeps running; cuMemGetInfo and cuDeviceTotalMem show the limit; kill -9 returns the memory."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "mem", "CGPU_MEM_LIMIT": "1GiB"}
    first = start_job(native, d, "info", "total", "alloc=600M", "info", "ready", "sleep=30000", **env)
    seen = []
    while not seen or seen[-1].split()[0] != "ready":
        line = first.stdout.readline()  # type: ignore[union-attr]
        assert line, first.stderr.read()  # type: ignore[union-attr]
        seen.append(line)
    out = "".join(seen)
    assert fields(lines(out, "info")[0]["name"] and out.splitlines()[0])["total"] == str(GIB)
    assert lines(out, "total")[0]["bytes"] == str(GIB)
    assert lines(out, "alloc")[0]["rc"] == "0"
    assert lines(out, "info")[1]["free"] == str(GIB - 600 * MIB)

    second = run_job(native, d, "alloc=600M", "alloc=300M", **env)
    assert second.returncode == 0, second.stderr
    rcs = [ln["rc"] for ln in lines(second.stdout, "alloc")]
    assert rcs == ["2", "0"], second.stdout  # 2 = CUDA_ERROR_OUT_OF_MEMORY; what fits still fits
    assert "out of memory" in second.stderr
    assert first.poll() is None  # the first carries on
    meminfo = d.ctl("cat", "0/mem/meminfo").stdout
    assert f"PID: {first.pid} Mem: {600 * MIB}" in meminfo

    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and f"Free: {GIB}" not in meminfo:
        meminfo = d.ctl("cat", "0/mem/meminfo").stdout
    assert f"Free: {GIB}" in meminfo and "PID:" not in meminfo, meminfo


def test_every_allocation_entry_point_reserves_and_frees(native: Native, daemon_factory: type) -> None:
    """cuMemAllocPitch_v2, cuMemAllocAsync and cuMemCreate count against the ledger; their frees
    (cuMemFree_v2, cuMemFreeAsync, cuMemRelease) give it back."""
    d = daemon_factory.start(*DAEMON)
    res = run_job(native, d, "pitch=1000,1000", "async=100M", "create=200M", "info", "create=800M", "freeall",
                  "info", CGPU_INSTANCE="apis", CGPU_MEM_LIMIT="1GiB")
    assert res.returncode == 0, res.stderr
    pitch = int(lines(res.stdout, "pitch")[0]["pitch"])
    assert pitch == 1024
    used = 1024 * 1000 + 100 * MIB + 200 * MIB
    info = lines(res.stdout, "info")
    assert int(info[0]["free"]) == GIB - used
    assert [ln["rc"] for ln in lines(res.stdout, "create")] == ["0", "2"]
    assert lines(res.stdout, "freeall")[0] == {"name": "freeall", "count": "3", "failed": "0"}
    assert int(info[1]["free"]) == GIB


RESOLVE = [("direct", False, []), ("dlsym", True, ["--resolve", "dlsym"]), ("gpa", True, ["--resolve", "gpa"]),
           ("gpa-ptsz", True, ["--resolve", "gpa-ptsz"])]


@pytest.mark.parametrize(("name", "dl", "opts"), RESOLVE, ids=[r[0] for r in RESOLVE])
def test_each_way_of_reaching_the_driver_is_hooked(native: Native, daemon_factory: type, name: str,
                                                   dl: bool, opts: list[str]) -> None:
    """Direct linking, dlopen + dlsym, cuGetProcAddress_v2 (and its per-thread-stream variants): the
    memory hooks answer (limit as total, out of memory past it) and launches take leases."""
    d = daemon_factory.start(*DAEMON)
    inst = f"res-{name}"
    res = run_job(native, d, *opts, "total", "alloc=2G", "info", f"spin=5,1,0,{at(0.3)}", dl=dl,
                  CGPU_INSTANCE=inst, CGPU_MEM_LIMIT="1GiB")
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "total")[0]["bytes"] == str(GIB)
    assert lines(res.stdout, "alloc")[0]["rc"] == "2"
    assert lines(res.stdout, "info")[0]["total"] == str(GIB)
    kernels = int(lines(res.stdout, "spin")[0]["kernels"])
    st = status_of(d, inst)
    assert st["grants"] >= 1 and float(st["held_seconds"]) >= 0.9 * kernels * 0.005, st  # type: ignore[operator]


@pytest.mark.parametrize("mode", ["dlsym", "gpa"])
def test_python_ctypes_program_is_gated(native: Native, daemon_factory: type, mode: str) -> None:
    """A Python program that loads libcuda.so.1 (and libnvidia-ml.so.1) with ctypes, resolving by name
    or through cuGetProcAddress: its kernels take leases, its allocation past the limit fails, and
    CUDA and NVML report the limit as the device total."""
    d = daemon_factory.start(*DAEMON)
    inst = f"py-{mode}"
    res = subprocess.run([sys.executable, str(WORKLOADS / "ctypes_cuda.py"), mode, "5", "20", str(2 * GIB)],
                         env=native.env(d, CGPU_INSTANCE=inst, CGPU_MEM_LIMIT="1GiB"), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = fields("py " + res.stdout.strip())
    assert got["alloc_rc"] == "2" and got["cuda_total"] == str(GIB) and got["nvml_total"] == str(GIB), got
    st = status_of(d, inst)
    assert st["grants"] >= 1 and float(st["held_seconds"]) >= 0.09, st  # type: ignore[operator]


def test_highprio_revokes_and_the_shim_gives_way(native: Native, daemon_factory: type, short_tmp: Path) -> None:
    """A high-priority instance arrives while a normal one holds the GPU: the daemon revokes, the shim
    gives the lease back at its next launch, and the high-priority one gets at least its prio_ratio
    share (50 %) with no kernel overlap."""
    d = daemon_factory.start(*DAEMON, "--policy", "1", "--slice-ms", "10")
    tr = short_tmp / "trace"
    start, end = at(0.8), at(4.8)
    low = start_job(native, d, f"spin=2,2,{start - 600_000_000},{end}", CGPU_INSTANCE="low", FAKECUDA_TRACE=str(tr))
    high = start_job(native, d, f"spin=2,2,{start},{end}", dl=True, CGPU_INSTANCE="high",
                     ALIYUN_COM_GPU_HIGH_PRIO="1", FAKECUDA_TRACE=str(tr))
    for p in (low, high):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    runs = trace.read(tr)
    t0, t1 = start + 300_000_000, end - 100_000_000
    hi, lo = trace.busy(runs[high.pid], t0, t1), trace.busy(runs[low.pid], t0, t1)
    assert hi / (hi + lo) >= 0.45, (hi, lo)
    assert lo > 0  # the normal instance still runs in the remainder
    assert trace.overlap(runs) < 0.001


def test_daemon_restart_mid_run(native: Native, daemon_factory: type) -> None:
    """arbiterd is killed and restarted while the program runs: the shim reconnects, re-registers and
    re-reserves its memory, and the program finishes normally."""
    d = daemon_factory.start(*DAEMON)
    job = start_job(native, d, "alloc=100M", f"spin=2,2,0,{at(5)}", CGPU_INSTANCE="survivor")
    time.sleep(1.5)
    d.stop(signal.SIGKILL)
    time.sleep(1.0)
    d.start()
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert "lost arbiterd" in err and "reconnected" in err
    assert int(lines(out, "spin")[0]["kernels"]) > 100
    # the memory it holds is back on the new daemon's ledger while it lives; gone once it exited
    assert "PID:" not in d.ctl("cat", "0/survivor/meminfo").stdout


def test_memory_is_re_reserved_after_restart(native: Native, daemon_factory: type) -> None:
    d = daemon_factory.start(*DAEMON)
    job = start_job(native, d, "alloc=100M", "ready", "sleep=4000", CGPU_INSTANCE="keeper", CGPU_MEM_LIMIT="1GiB")
    assert job.stdout.readline().startswith("alloc")  # type: ignore[union-attr]
    d.stop(signal.SIGKILL)
    d.start()
    deadline = time.monotonic() + 3
    meminfo = ""
    while time.monotonic() < deadline and f"Mem: {100 * MIB}" not in meminfo:
        meminfo = d.ctl("cat", "0/keeper/meminfo").stdout
        time.sleep(0.05)
    assert f"PID: {job.pid} Mem: {100 * MIB}" in meminfo, meminfo
    job.kill()
    job.communicate()


def test_no_daemon_waits_or_runs_unchecked(native: Native, short_tmp: Path) -> None:
    """Without arbiterd, GPU work waits by default (isolation holds); with CGPU_ON_DAEMON_LOSS=run it
    runs unchecked."""
    nowhere = str(short_tmp / "none.sock")
    res = run_job(native, None, f"spin=1,1,0,{at(0.3)}", CGPU_SOCKET=nowhere, CGPU_ON_DAEMON_LOSS="run",
                  CGPU_INSTANCE="x")
    assert res.returncode == 0, res.stderr
    assert int(lines(res.stdout, "spin")[0]["kernels"]) > 50
    waiting = start_job(native, None, f"spin=1,1,0,{at(5)}", CGPU_SOCKET=nowhere, CGPU_INSTANCE="x")
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.communicate(timeout=1.5)
    waiting.kill()
    _, err = waiting.communicate()
    assert "cannot reach arbiterd" in err


def test_malformed_environment_is_a_one_line_error(native: Native) -> None:
    res = run_job(native, None, "total", ALIYUN_COM_GPU_SCHD_WEIGHT="heavy")
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "ALIYUN_COM_GPU_SCHD_WEIGHT='heavy': expected an integer 1..25" in err[0]
    assert res.stdout == ""


def test_disabled_passes_everything_through(native: Native) -> None:
    res = run_job(native, None, "total", "alloc=2G", CGPU_DISABLE="1", CGPU_MEM_LIMIT="1GiB",
                  CGPU_SOCKET="/nonexistent.sock")
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "total")[0]["bytes"] == str(16 * GIB)
    assert lines(res.stdout, "alloc")[0]["rc"] == "0"


def test_cgpu_run_preloads_the_shim_for_programs_that_are_not_python(native: Native, daemon_factory: type) -> None:
    d = daemon_factory.start(*DAEMON)
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "CGPU_SOCKET": d.sock}
    env.pop("LD_PRELOAD", None)
    cmd = [tool("cgpu-run"), "--instance", "wrapped", "--mem", "1GiB", "--"]
    auto = subprocess.run([*cmd, str(native.job_direct), "total", "alloc=2G"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert auto.returncode == 0, auto.stderr
    assert lines(auto.stdout, "total")[0]["bytes"] == str(GIB)
    assert lines(auto.stdout, "alloc")[0]["rc"] == "2"
    plain = subprocess.run([tool("cgpu-run"), "--no-native", "--instance", "plain", "--mem", "1GiB", "--",
                            str(native.job_direct), "total"], env=env, capture_output=True, text=True, timeout=60)
    assert lines(plain.stdout, "total")[0]["bytes"] == str(16 * GIB)


def test_python_interposer_leaves_cuda_to_the_shim(native: Native, daemon_factory: type) -> None:
    """Under --native the PyTorch interposer does no CUDA enforcement of its own, and keeps the
    CPU-as-simulated-GPU role."""
    pytest.importorskip("torch")
    d = daemon_factory.start(*DAEMON)
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "CGPU_SOCKET": d.sock}
    probe = "import torch, libcgpu_client.torch as t; from libcgpu_client.native import shim_loaded; " \
            "print(shim_loaded(), t._installed is not None)"
    out = {}
    for device in ("auto", "cpu"):
        res = subprocess.run([tool("cgpu-run"), "--native", "--device", device, "--instance", f"n-{device}", "--",
                              sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        out[device] = res.stdout.split()
    assert out == {"auto": ["True", "False"], "cpu": ["True", "True"]}


def test_a_core_percentage_registers_weight_p_over_5_on_policy_3(native: Native, daemon_factory: type) -> None:
    d = daemon_factory.start(*DAEMON)
    res = run_job(native, d, "alloc=1M", CGPU_INSTANCE="pct", CGPU_CORE_PERCENT="45")
    assert res.returncode == 0, res.stderr
    assert status_of(d, "pct")["weight"] == 9
    assert [d.ctl("cat", p).stdout.strip() for p in ("0/policy", "0/max_inst")] == ["3", "20"]


def test_a_refused_registration_fails_gated_calls_with_the_daemons_reason(native: Native,
                                                                         daemon_factory: type) -> None:
    """overcommit = refuse and no free weight: the shimmed program's allocation and launch fail at once with
    CUDA_ERROR_DEVICE_UNAVAILABLE (46) instead of waiting for good, its stderr names the daemon's reason once,
    and once an operator makes room the same process registers and its next launch runs."""
    d = daemon_factory.start(*DAEMON, "--overcommit", "refuse")
    d.ctl("echo", "1", "0/max_inst")
    d.ctl("echo", "create holder weight=1", "inst_ctl")  # free_weight is 0 now
    job = start_job(native, d, "alloc=1M", "launch=1", "info", "ready", "sleep=2500", "launch=1", "alloc=1M",
                    CGPU_INSTANCE="late")
    assert job.stdout is not None and job.stderr is not None
    stuck = threading.Timer(10, job.kill)  # a program that waits for good is stopped, and the test fails
    stuck.start()
    head = [job.stdout.readline() for _ in range(4)]
    stuck.cancel()
    assert [fields(ln)["rc"] for ln in head[:2]] == ["46", "46"], head
    assert head[2].startswith("info") and head[3].startswith("ready"), head
    d.ctl("echo", "remove holder", "inst_ctl")  # room: the shim's next attempt (within 1 s) is accepted
    out, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    assert [ln["rc"] for ln in lines(out, "launch")] == ["0"], out
    assert [ln["rc"] for ln in lines(out, "alloc")] == ["0"], out
    refusals = [ln for ln in err.splitlines() if "refused registration" in ln]
    assert len(refusals) == 1, err  # said once, though it was asked again every second
    assert "no free weight" in refusals[0] and "CUDA_ERROR_DEVICE_UNAVAILABLE" in refusals[0], refusals
    assert "accepted" in err
    assert status_of(d, "late")["weight"] == 1


def _run_env(native: Native, d: DaemonProc) -> dict[str, str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "CGPU_SOCKET": d.sock}
    env.pop("LD_PRELOAD", None)
    return env


def test_cgpu_run_preloads_the_shim_for_python_programs_on_a_cuda_host(native: Native, daemon_factory: type) -> None:
    """cgpu-run -- python x.py, with a CUDA driver (the fake) on the host: libcgpu.so is preloaded, so the Python
    program's own CUDA calls (ctypes, as any framework's) are held to the limit; --device cpu leaves the CPU
    stand-in to the Python interposer alone (one gate per process)."""
    d = daemon_factory.start(*DAEMON)
    env = _run_env(native, d)
    res = subprocess.run([tool("cgpu-run"), "--instance", "py-auto", "--mem", "1GiB", "--", sys.executable,
                          str(WORKLOADS / "ctypes_cuda.py"), "dlsym", "2", "5", str(2 * GIB)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = fields("py " + res.stdout.strip())
    assert got["alloc_rc"] == "2" and got["cuda_total"] == str(GIB), got
    assert status_of(d, "py-auto")["grants"] >= 1
    probe = ("import os; from libcgpu_client.native import shim_loaded; "
             "print(shim_loaded(), os.environ.get('CGPU_NATIVE'))")
    cpu = subprocess.run([tool("cgpu-run"), "--device", "cpu", "--instance", "py-cpu", "--", sys.executable, "-c",
                          probe], env=env, capture_output=True, text=True, timeout=60)
    assert cpu.returncode == 0, cpu.stderr
    assert cpu.stdout.split() == ["False", "None"]


def test_asking_for_the_python_interposer_alone_on_a_cuda_host_says_what_it_does_not_gate(
        native: Native, daemon_factory: type) -> None:
    d = daemon_factory.start(*DAEMON)
    cmd = [tool("cgpu-run"), "--no-native", "--instance", "alone", "--", sys.executable, "-c", "print('ran')"]
    res = subprocess.run(cmd, env=_run_env(native, d), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ran", res.stderr
    said = res.stderr.strip().splitlines()
    assert len(said) == 1 and "CUDA graph replays" in said[0] and "ungated" in said[0], res.stderr


def test_without_a_cuda_driver_cgpu_run_says_nothing_and_needs_no_shim(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """No CUDA driver on the host: --no-native is not told anything (there is no CUDA to leave ungated), and a
    Python program runs without libcgpu.so where this installation has none."""
    from libcgpu_client import run

    ran: list[dict[str, str]] = []
    monkeypatch.setattr(run, "cuda_driver_present", lambda: False)
    monkeypatch.setattr(run, "shim_path", lambda: None)
    monkeypatch.setattr(run.os, "execvpe", lambda f, a, env: ran.append(dict(env)))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert run.main(["--no-native", "--", "python", "x.py"]) == 0
    assert run.main(["--", "python", "x.py"]) == 0
    assert capsys.readouterr().err == ""
    assert all("LD_PRELOAD" not in env and "CGPU_NATIVE" not in env for env in ran) and len(ran) == 2
    monkeypatch.setattr(run, "cuda_driver_present", lambda: True)  # a CUDA host with no shim built: an error
    assert run.main(["--", "python", "x.py"]) == 2
    assert "libcgpu.so is not built" in capsys.readouterr().err


def test_a_capture_stays_valid_while_the_shim_syncs_and_its_replays_are_gated(native: Native,
                                                                              daemon_factory: type) -> None:
    """A program holds its lease, then captures a graph in global mode (PyTorch's default) and stays inside the
    capture for 50 ms, past the idle time: the shim's idle thread would give the lease back meanwhile, synchronising
    the context from another thread, which CUDA's capture rules (the fake enforces them) make invalid in every mode,
    invalidating the capture. It waits for the capture to end instead. The capture must end valid, its replay run
    under a lease and be billed; and the same capture alone, with no shim, is valid too (the fake's rules do not
    fail it by themselves). Before capture.c, with the sync in relaxed mode, it read 901 (invalidated)."""
    d = daemon_factory.start(*DAEMON)
    res = run_job(native, d, "capture=4,50", "capture=2,20", CGPU_INSTANCE="graphs")
    assert res.returncode == 0, res.stderr
    assert [(ln["end_rc"], ln["replay_rc"]) for ln in lines(res.stdout, "capture")] == [("0", "0")] * 2, res.stdout
    st = status_of(d, "graphs")
    assert st["grants"] >= 1 and float(st["held_seconds"]) >= 0.002 + 0.006 * 0.9, st  # type: ignore[operator]
    bare = run_job(native, None, "capture=4,50", CGPU_DISABLE="1")
    assert bare.returncode == 0 and lines(bare.stdout, "capture")[0]["end_rc"] == "0", bare.stdout


def test_the_fake_driver_enforces_capture_modes(native: Native) -> None:
    """Stream capture's rules, on the fake: a cuCtxSynchronize of the capture's own context, from another thread,
    fails (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates the capture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    at its end) in every mode (the Programming Guide's "Prohibited and Unhandled Operations"); one of another context
    is a potentially unsafe call, under cuThreadExchangeStreamCaptureMode's rules: it invalidates a global-mode
    capture, and does not in relaxed or thread-local mode, nor one begun in thread-local mode."""
    res = subprocess.run([sys.executable, str(WORKLOADS / "capture_modes.py")],
                         env={**native.env(None), "LD_PRELOAD": "", "CGPU_DISABLE": "1"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    pairs = ("global/global", "global/relaxed", "global/thread_local", "thread_local/global", "relaxed/global")
    assert {k: v["own"] for k, v in got.items()} == {k: [900, 901] for k in pairs}, got
    assert {k: v["other"] for k, v in got.items()} == {
        "global/global": [900, 901], "global/relaxed": [0, 0], "global/thread_local": [0, 0],
        "thread_local/global": [0, 0], "relaxed/global": [0, 0]}, got
