"""A gang turn ends at the same collective on every rank (behaviour §11, "Where a turn stops"; libcgpu.so's board.c).

Job J has a process on each of two fake GPUs (as torchrun starts them) and ends every step with the fake driver's
collective, named as NCCL names its kernels; its rank on GPU 1 spends 1 ms on the host before each step, so at a
turn's deadline one rank has often launched a step's collective and the other has not. A on GPU 0 and B on GPU 1
share the GPUs with it, at the daemon's defaults (gangs on) but for 80 ms slices (a round of 160 ms on each GPU).
Without agreement the collective launched in time spins, holding its GPU, until the gang's next turn (most of a
round); with the board the late rank launches up to that collective and both stop there. Each collective's longest
wait is read from the fake driver's record."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import time
from pathlib import Path

from cgpu_testing.daemon import DaemonProc
from tests.native.conftest import Native, finish

SLOT = struct.Struct("5Q")  # fakecoll.c: started, spin_ns, count, work_ns, max_spin_ns per physical device
STRAND_MS = 40  # a strand waits for the gang's next turn: A's or B's turn, 80 ms


class Job:
    """J's ranks beside A on GPU 0 and B on GPU 1; ``opts``: cuda_job's options for J's ranks (how a step is
    launched: ``--api graph`` replays it as a CUDA graph)."""

    def __init__(self, n: Native, d: DaemonProc, tag: str, counting: str, opts: tuple[str, ...] = (),
                 lag_ms: float = 1) -> None:
        self.tag = tag
        self.procs: list[subprocess.Popen[str]] = []
        coll = {"FAKECUDA_COLLECTIVE": f"{tag}:0,1", "CGPU_COLLECTIVE_KERNELS": counting}
        self._start(n, d, f"J{tag}", 0, [*opts, "collective", "serve=0.5,4"], coll)
        self._start(n, d, f"J{tag}", 1, [*opts, "collective", f"serve=0.5,4,{lag_ms:g}"], coll)
        self._start(n, d, f"A{tag}", 0, ["serve=0.5,4"], {})
        self._start(n, d, f"B{tag}", 1, ["serve=0.5,4"], {})
        for p in self.procs:
            line = self._line(p)
            while line.startswith("collective"):
                line = self._line(p)
            assert line.startswith("ready"), line

    def _start(self, n: Native, d: DaemonProc, inst: str, gpu: int, args: list[str], extra: dict[str, str]) -> None:
        env = n.env(d, CGPU_INSTANCE=inst, FAKECUDA_DEVICES="2", CUDA_VISIBLE_DEVICES=str(gpu),
                    ALIYUN_COM_GPU_VISIBLE_DEVICES=str(gpu), **extra)
        self.procs.append(subprocess.Popen([str(n.job_direct), *args], env=env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    @staticmethod
    def _line(p: subprocess.Popen[str]) -> str:
        assert p.stdout is not None
        return p.stdout.readline()

    def say(self, line: str, which: int | None = None) -> None:
        for p in self.procs if which is None else [self.procs[which]]:
            assert p.stdin is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()

    @property
    def record(self) -> Path:
        return Path(f"/dev/shm/fakecuda-coll-{self.tag}")

    def longest_waits_ms(self) -> list[float]:
        raw = self.record.read_bytes()
        return [SLOT.unpack_from(raw, SLOT.size * g)[4] / 1e6 for g in (0, 1)]

    def forget_longest(self, settled: int = 20, timeout: float = 20.0) -> None:
        """Forget each GPU's longest wait so far, once each has run ``settled`` collectives: the start-up's waits
        (the ranks' first grants, before the gang forms) are not the turns'. On a loaded host the ranks' start-up
        took over a second, and a first collective that waited 100 ms for its peer's first grant was read as a
        strand."""
        until = time.monotonic() + timeout
        while min(SLOT.unpack_from(self.record.read_bytes(), SLOT.size * g)[2] for g in (0, 1)) < settled \
                and time.monotonic() < until:
            time.sleep(0.05)
        with self.record.open("r+b") as f:
            for g in (0, 1):
                f.seek(SLOT.size * g + 32)
                f.write(bytes(8))

    def steps(self, which: int, path: Path) -> int:
        return len(self.ends(which, path))

    def ends(self, which: int, path: Path) -> list[int]:
        """When each of process ``which``'s steps ended (CLOCK_MONOTONIC ns)."""
        self.say(f"dump {path}", which)
        self._line(self.procs[which])
        ends: list[int] = json.loads(path.read_text())["ends"]
        return ends

    def close(self) -> str:
        """The processes' stderr once they exited (each with 0), and a line for each board of J left behind (the
        last rank to exit removes it)."""
        self.say("quit")
        errs = finish(self.procs)
        for p, err in zip(self.procs, errs, strict=True):
            assert p.returncode == 0, err
        self.record.unlink(missing_ok=True)
        boards = list(Path("/dev/shm").glob(f"cgpu-board-*-J{self.tag}-*"))
        return "\n".join(errs) + "".join(f"\nleft: {b}" for b in boards)


def _run(n: Native, tmp_path: Path, counting: str, seconds: float,
         lag_ms: float = 1) -> tuple[list[float], float, list[int], str]:
    tag = f"te{os.getpid()}{counting[:2]}{int(n.asan)}{int(lag_ms)}"
    with DaemonProc(tmp_path / "d", "--sim-gpus", "2x16GiB", "--identity", "declared", "--slice-ms", "80") as d:
        job = Job(n, d, tag, counting, lag_ms=lag_ms)
        try:
            job.say("run")
            time.sleep(1.0)
            job.forget_longest()
            time.sleep(seconds)
            round_ms = min(float(g["round_ms"]) for g in d.status()["gpus"])
            job.say("pause")
            time.sleep(0.2)
            longest = job.longest_waits_ms()
            steps = [job.steps(k, tmp_path / f"r{k}.json") for k in (0, 1)]
        finally:
            errs = job.close()
    return longest, round_ms, steps, errs


def test_ranks_stop_at_the_same_collective(native: Native, tmp_path: Path) -> None:
    longest, round_ms, steps, errs = _run(native, tmp_path, "nccl", 3.0)
    assert round_ms == 160
    assert max(longest) < STRAND_MS, (longest, round_ms)
    assert abs(steps[0] - steps[1]) <= 1 and min(steps) > 100
    assert "left:" not in errs  # the last rank to exit removed the board


def test_a_rank_awaited_by_its_peer_keeps_its_lease_through_host_work(native: Native, tmp_path: Path) -> None:
    """J's rank on GPU 1 spends 10 ms on the host before each step, longer than its client's idle release takes
    (CGPU_IDLE_MS 3 ms: no launch for 3 ms, its queue drained, 3 ms more). Its peer works, or has launched the
    step's collective meanwhile, so its client keeps the lease (board.c, cgpu_board_keeps): at a deadline that falls
    in the host work it still holds its turn and catches up. Released as idle, it came back after the deadline
    to a GPU gone to B and no lease to catch up in, and its peer's collective waited for the gang's next turn or
    longer. Measured: 10 to 12 ms of longest wait and 177 steps in 3 s; the shim before this rule, 327 to 334 ms and
    77 to 84 steps (a 1 ms host part stretched by a loaded CPU did the same in CI: 84 to 97 ms)."""
    longest, _, steps, errs = _run(native, tmp_path, "nccl", 3.0, lag_ms=10)
    assert max(longest) < STRAND_MS, longest
    assert abs(steps[0] - steps[1]) <= 1 and min(steps) > 110, steps
    assert "left:" not in errs


def test_ranks_idle_together_give_their_turn_back(native: Native, tmp_path: Path) -> None:
    """J's ranks stop together (paused eight times, each a second or so into a run): each keeps its idle lease
    only while the other works or waits for it, not while the other only keeps its own for it (resting), so idle
    both they give their turn back within two idle periods, and A has GPU 0 again at once, not at the turn's end
    (up to 80 ms on). Measured: A's first step after each pause ended 9 to 12 ms after it; with a resting peer
    counted as working (each keeping its lease for the other), 8 to 60 ms, three of six over STRAND_MS."""
    tag = f"ti{os.getpid()}"
    rng = random.Random(5)
    gaps: list[float] = []
    with DaemonProc(tmp_path / "d", "--sim-gpus", "2x16GiB", "--identity", "declared", "--slice-ms", "80") as d:
        job = Job(native, d, tag, "nccl")
        try:
            job.say("run", 2)
            job.say("run", 3)
            paused: list[int] = []
            for _ in range(8):
                for k in (0, 1):
                    job.say("run", k)
                time.sleep(1.0 + rng.uniform(0, 0.16))
                paused.append(time.monotonic_ns())
                for k in (0, 1):
                    job.say("pause", k)
                time.sleep(0.25)
            ends = job.ends(2, tmp_path / "a.json")
            gaps = [(min(e for e in ends if e > t) - t) / 1e6 for t in paused]
        finally:
            job.close()
    assert sorted(gaps)[-2] < STRAND_MS, gaps  # one outlier left to a loaded host (153 ms once, beside 3 spinners)


def test_without_counting_a_collective_spins_until_the_next_turn(native: Native, tmp_path: Path) -> None:
    """The control: CGPU_COLLECTIVE_KERNELS=none counts nothing, and a collective launched just before a turn's end
    waits for the gang's next turn (test_ranks_stop_at_the_same_collective would fail so)."""
    longest, round_ms, _, _ = _run(native, tmp_path, "none", 3.0)
    assert max(longest) >= STRAND_MS + 5, (longest, round_ms)


def test_the_board_under_asan(native_asan: Native, tmp_path: Path) -> None:
    _, _, steps, errs = _run(native_asan, tmp_path, "nccl", 1.5)
    assert "AddressSanitizer" not in errs and "runtime error" not in errs, errs
    assert abs(steps[0] - steps[1]) <= 1 and min(steps) > 20
    assert "left:" not in errs
