"""A CUDA graph captured on one thread while another thread's lease ends, then replayed beside another tenant.

PyTorch captures graphs in global mode (its default), in which a "potentially unsafe" call such as
cuCtxSynchronize on any thread invalidates the capture (the driver API reference,
cuThreadExchangeStreamCaptureMode; the fake enforces it). The shim syncs when a lease ends: here the lease ends on
a second thread of the program, in the slow path of its launch, while the first is inside its capture.
test_shim.py's capture test covers the idle thread's sync, with no other tenant.
"""

from __future__ import annotations

import json
from pathlib import Path

from cgpu_testing.daemon import DaemonProc
from tests.native import trace
from tests.native.conftest import Native, at, lines, run_job, start_job

DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


def held_s(d: DaemonProc, name: str) -> float:
    doc = json.loads(d.ctl("status").stdout)
    return float(next(i for i in doc["gpus"][0]["instances"] if i["id"] == name)["held_seconds"])


def test_a_capture_beside_another_threads_lease_end_stays_valid_and_its_replays_are_gated(
        native: Native, daemon_factory: type, short_tmp: Path) -> None:
    """Policy 1, 10 ms slices, beside a busy tenant: thread 2 launches 1 ms kernels while thread 1 captures 4 in
    global mode and idles 300 ms inside the capture, so thread 2's lease ends there (its launch waits for the next
    turn, at least once). The capture ends valid; its 40 replays (160 ms of kernels) all run, never while the other
    tenant's kernels do, and the instance is billed at least their kernel time."""
    d = daemon_factory.start(*DAEMON, "--policy", "1", "--slice-ms", "10")
    tr = short_tmp / "trace"
    end = at(30)
    other = start_job(native, d, f"spin=2,4,0,{end}", dl=True, CGPU_INSTANCE="other", FAKECUDA_TRACE=str(tr))
    res = run_job(native, d, "launch=1", "xcapture=4,300,40", CGPU_INSTANCE="graphs", FAKECUDA_TRACE=str(tr))
    assert res.returncode == 0, res.stderr
    got = lines(res.stdout, "xcapture")[0]
    assert (got["end_rc"], got["replay_rc"]) == ("0", "0"), got
    assert int(got["other_waits"]) >= 1, got  # thread 2's lease did end during the capture
    assert held_s(d, "graphs") >= 0.9 * (0.160 + int(got["other_launches"]) * 0.001), res.stdout
    other.kill()
    other.communicate()
    runs = trace.read(tr)
    assert trace.overlap(runs) < 0.001
    mine = [pid for pid in runs if pid != other.pid]
    assert len(mine) == 1 and len(runs[mine[0]]) >= 1 + 40 * 4, len(runs[mine[0]])



def test_the_same_under_asan(native_asan: Native, daemon_factory: type) -> None:
    """The two threads, the capture, the lease ends and the replays, with the shim, the fakes and the program built
    with AddressSanitizer and UBSan: no error."""
    d = daemon_factory.start(*DAEMON, "--policy", "1", "--slice-ms", "5")
    other = start_job(native_asan, d, f"spin=1,2,0,{at(20)}", dl=True, CGPU_INSTANCE="other")
    res = run_job(native_asan, d, "launch=1", "xcapture=4,100,5", CGPU_INSTANCE="graphs")
    other.kill()
    other.communicate()
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "xcapture")[0]["end_rc"] == "0", res.stdout
