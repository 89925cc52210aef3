"""Reading the fake driver's kernel trace (FAKECUDA_TRACE): who ran kernels, and when."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def read(path: Path) -> dict[int, list[tuple[int, int]]]:
    """pid -> [(start_ns, end_ns), ...] in start order."""
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        pid, start, end = map(int, line.split())
        runs[pid].append((start, end))
    return {pid: sorted(v) for pid, v in runs.items()}


def busy(intervals: list[tuple[int, int]], t0: int, t1: int) -> float:
    """Seconds of kernel time inside [t0, t1]."""
    return sum(max(0, min(e, t1) - max(s, t0)) for s, e in intervals) / 1e9


def turn_starts(intervals: list[tuple[int, int]], gap_ns: int = 3_000_000) -> list[int]:
    """When the process's turns began: its first kernel, and each kernel after a gap of more than
    ``gap_ns`` since its previous one ended (another process held the GPU meanwhile)."""
    return [s for i, (s, _) in enumerate(intervals) if i == 0 or s - intervals[i - 1][1] > gap_ns]


def overlap(runs: dict[int, list[tuple[int, int]]]) -> float:
    """Seconds during which kernels of two different processes ran at once."""
    events = sorted((s, e, pid) for pid, iv in runs.items() for s, e in iv)
    total, reach, owner = 0, 0, None
    for s, e, pid in events:
        if owner is not None and pid != owner and s < reach:
            total += min(e, reach) - s
        if e > reach:
            reach, owner = e, pid
    return total / 1e9
