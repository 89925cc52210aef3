"""Collective spin as the shim sees it (behaviour §11, "Visible"; libcgpu.so's board.c, arbiterd/core/shimspin.py).

Job J has a process on each of two fake GPUs (as torchrun starts them); every step is 0.5 ms kernels in fours, the
last the fake driver's collective (it cannot finish until the peer's same step has started, and spins meanwhile:
fakecoll.c). The rank on GPU 1 spends LAG ms on the host before each step, so each collective on GPU 0 is launched
LAG ms and more before its peer's and spins that long. The shim stamps every collective's launch on the board and
credits an earlier peer its wait; each rank reports its GPU's count with its releases. The daemon's
``gang_shim_spin_seconds`` must come to about LAG times the collectives on GPU 0 (and what the fake driver measured
its kernels waiting, which starts a step's three kernels later), nothing on GPU 1, and stay small with no lag."""

from __future__ import annotations

import os
import struct
import subprocess
import time
from pathlib import Path

from cgpu_testing.daemon import DaemonProc
from tests.native.conftest import Native, finish

SLOT = struct.Struct("5Q")  # fakecoll.c: started, spin_ns, count, work_ns, max_spin_ns per physical device
TIMEOUT_MS = 400  # a collective whose peer never comes (one rank paused first) gives up after this


def _run(n: Native, tmp_path: Path, lag_ms: int, seconds: float) -> tuple[list[float], int, float]:
    """(shim spin reported on GPU 0 and 1, collectives run on GPU 1, the fake driver's spin on GPU 0), all in
    seconds but the count."""
    tag = f"ss{os.getpid()}{lag_ms}"
    record = Path(f"/dev/shm/fakecuda-coll-{tag}")
    procs: list[subprocess.Popen[str]] = []
    with DaemonProc(tmp_path / "d", "--sim-gpus", "2x16GiB", "--identity", "declared") as d:
        try:
            for gpu, serve in ((0, "serve=0.5,4"), (1, f"serve=0.5,4,{lag_ms}")):
                env = n.env(d, CGPU_INSTANCE="J", FAKECUDA_DEVICES="2", CUDA_VISIBLE_DEVICES=str(gpu),
                            ALIYUN_COM_GPU_VISIBLE_DEVICES=str(gpu), FAKECUDA_COLLECTIVE=f"{tag}:0,1",
                            FAKECUDA_COLLECTIVE_TIMEOUT_MS=str(TIMEOUT_MS))
                procs.append(subprocess.Popen([str(n.job_direct), "collective", serve], env=env, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for p in procs:
                assert p.stdout is not None
                assert p.stdout.readline().startswith("collective") and p.stdout.readline().startswith("ready")
            for p in procs:
                _say(p, "run")
            time.sleep(seconds)
            for p in procs:  # GPU 0's first: its rank stops after the step its peer is in, which the peer ends
                _say(p, "pause")
            shim = _settled(d)
            raw = record.read_bytes()
            _, spin0, _, _, _ = SLOT.unpack_from(raw, 0)
            count1 = SLOT.unpack_from(raw, SLOT.size)[2]
        finally:
            for p in procs:
                _say(p, "quit")
            errs = finish(procs)
            record.unlink(missing_ok=True)
    for p, err in zip(procs, errs, strict=True):
        assert p.returncode == 0, err
        assert "AddressSanitizer" not in err and "runtime error" not in err, err
    return [shim[(0, "J")], shim[(1, "J")]], count1, spin0 / 1e9


def _settled(d: DaemonProc) -> dict[tuple[int, str], float]:
    """Each instance's shim spin once the last counts came in: they come with releases, the last ones from the idle
    thread after the pause, or after a collective one rank launched as its peer paused gave up (TIMEOUT_MS)."""
    time.sleep(TIMEOUT_MS / 1000 + 0.2)
    last: dict[tuple[int, str], float] = {}
    for _ in range(50):
        now = {(g["index"], i["id"]): i["gang_shim_spin_seconds"] for g in d.status()["gpus"] for i in g["instances"]}
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError(f"the shim's spin still moves: {last}")


def _say(p: subprocess.Popen[str], line: str) -> None:
    assert p.stdin is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()


def test_a_lagging_rank_shows_as_its_peers_spin(native: Native, tmp_path: Path) -> None:
    """LAG 50 ms: GPU 0's count is 50 ms a collective, within -20 % (the rank on GPU 0 wakes up late from its own
    sync on a loaded host, and launches closer to its peer) and +50 % (the lagging rank's wake-ups and grant waits
    lengthen the lag); it is the fake driver's own measure of the wait within 15 % (measured: 0.1 % on a quiet
    2-core host, 4 to 8 % with both cores busy besides, where the fake GPUs, CPU threads, start a kernel late);
    GPU 1 waits for nothing (2 ms a collective at most)."""
    lag = 0.050
    (spin0, spin1), count, driver0 = _run(native, tmp_path, 50, 2.0)
    assert count >= 10, count
    assert 0.8 * lag * count <= spin0 <= 1.5 * lag * (count + 1), (spin0, count)
    assert abs(spin0 - driver0) <= 0.15 * driver0, (spin0, driver0, count)
    assert spin1 <= 0.002 * count, (spin1, count)


def test_ranks_in_step_show_little_spin(native: Native, tmp_path: Path) -> None:
    """No lag: the ranks launch each collective within a wake-up of each other: on both GPUs together, a tenth of the
    lag above a collective at most (measured: 0.05 ms on a quiet 2-core host, 1 ms with both cores busy besides,
    3.6 ms with ASan builds and the other test runners too)."""
    (spin0, spin1), count, _ = _run(native, tmp_path, 0, 1.0)
    assert count >= 30, count
    assert spin0 + spin1 <= 0.005 * count, (spin0, spin1, count)


def test_the_count_under_asan(native_asan: Native, tmp_path: Path) -> None:
    """The board's stamps and credits under AddressSanitizer and UBSan, with the lag test's bounds."""
    (spin0, _), count, _ = _run(native_asan, tmp_path, 50, 1.0)
    assert count >= 5, count
    assert 0.8 * 0.050 * count <= spin0 <= 1.5 * 0.050 * (count + 1), (spin0, count)
