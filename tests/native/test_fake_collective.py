"""The fake driver's collective kernel (cgpu_testing/native/fakecoll.c): like a NCCL kernel it cannot finish until
the same step has started on every peer GPU, and it spins on its own GPU meanwhile; one process per GPU here, as
torchrun starts them. Each rank launches its steps one kernel at a time or replays them as a CUDA graph captured
with the collective inside (NCCL User Guide, "Using NCCL with CUDA Graphs"), and the two meet alike. Run plain and
under AddressSanitizer."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tests.native.conftest import Native

SLOT = struct.Struct("5Q")  # started, spin_ns, count, work_ns, max_spin_ns per physical device


def _rank(n: Native, gpu: int, tag: str, api: str) -> subprocess.Popen[str]:
    env = n.env(None, CGPU_DISABLE="1", FAKECUDA_DEVICES="2", CUDA_VISIBLE_DEVICES=str(gpu),
                FAKECUDA_COLLECTIVE=f"{tag}:0,1")
    p = subprocess.Popen([str(n.job_direct), "--api", api, "collective", "serve=0.5,4"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().startswith("collective")
    assert p.stdout.readline().startswith("ready")
    return p


def _say(p: subprocess.Popen[str], line: str) -> str:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline() if line.startswith("dump") else ""


def _steps(p: subprocess.Popen[str], path: Path) -> int:
    _say(p, f"dump {path}")
    return len(json.loads(path.read_text())["ends"])


@pytest.mark.parametrize("apis", [("launch", "launch"), ("graph", "graph"), ("graph", "launch")],
                         ids=["kernels", "graphs", "graph-and-kernels"])
@pytest.mark.parametrize("asan", [False, True], ids=["plain", "asan"])
def test_a_collective_waits_for_its_peer_and_spins_meanwhile(native: Native, native_asan: Native, tmp_path: Path,
                                                              asan: bool, apis: tuple[str, str]) -> None:
    n = native_asan if asan else native
    tag = f"t{os.getpid()}{int(asan)}{apis[0][0]}{apis[1][0]}"
    ranks = [_rank(n, g, tag, apis[g]) for g in (0, 1)]
    try:
        _say(ranks[0], "run")
        time.sleep(0.4)
        alone = _steps(ranks[0], tmp_path / "r0a.json")
        assert alone == 0  # its first step's collective cannot finish without the peer's
        _say(ranks[1], "run")
        time.sleep(0.6)
        for p in ranks:
            _say(p, "pause")
        time.sleep(0.1)
        steps = [_steps(p, tmp_path / f"r{g}.json") for g, p in enumerate(ranks)]
        assert min(steps) >= 10 and abs(steps[0] - steps[1]) <= 1  # in lockstep once both run
        raw = Path(f"/dev/shm/fakecuda-coll-{tag}").read_bytes()
        started0, spin0, count0, work0, longest0 = SLOT.unpack_from(raw, 0)
        assert spin0 >= 0.35e9  # rank 0 spun on its GPU while it waited alone
        assert 0.35e9 <= longest0 <= spin0  # in one collective, its first
        assert started0 - 1 <= count0 <= started0 and work0 == count0 * 500_000  # one step may wait at the pause
    finally:
        for p in ranks:
            _say(p, "quit")
        for p in ranks:
            try:
                _, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:  # a rank left waiting for its peer's step (a failed check above)
                p.kill()
                p.communicate()
                raise
            assert "AddressSanitizer" not in err and "runtime error" not in err, err
            assert p.returncode == 0, err
        Path(f"/dev/shm/fakecuda-coll-{tag}").unlink(missing_ok=True)
