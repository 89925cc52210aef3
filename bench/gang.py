"""Jobs across GPUs on the fake driver, before (gangs off) and after (gangs on): does a collective wait for a turn?

    python -m bench.gang [--seconds 6] [--ms 0.5] [--no-results]

A real arbiterd at its defaults on two simulated GPUs (``--sim-gpus 2x16GiB --identity declared``: policy 1,
slice_ms auto, weight 1 each), run twice: with ``--gang-window-ms 0`` (before: every GPU gives a job its turns on
its own, as cgpu did) and at the default window (after: gang leases). Every tenant is a C program
(``cgpu_testing/native/cuda_job.c``) launching kernels of ``--ms`` through libcgpu.so on the fake CUDA driver, in
steps of 4 kernels and a stream sync. A *job* is one instance with a process on each GPU (as torchrun starts them),
whose every step ends with the fake driver's collective (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``,
fakecoll.c): it cannot finish until it has started on the peer GPU, and spins on its GPU meanwhile, as NCCL's
kernels do; libcgpu.so counts it, so the ranks end each gang turn at the same one (behaviour §11).

Two scenarios: ``job+tenants`` (job J on GPUs 0 and 1, A on GPU 0, B and C on GPU 1: J is entitled to min(1/2,
1/3) = 33.3 % on both, A to 66.7 %, B and C to 33.3 %), and ``two_jobs`` (J1 and J2 on the same pair: 50 % each).
A rate is steps a second; a share is the rate in the scenario against the rate alone just before (J alone: both its
processes; a single-GPU tenant beside one on the other GPU, as the host is loaded in the scenario: the mean of its
windows, see :func:`baseline_groups`). Printed, per run: the job's rate against its entitled rate (entitled share x
rate alone), its collective spin as % of the time it held its GPUs (the driver's count against the daemon's held
time; beside it the shim's, ``gang_shim_spin_seconds`` in status: what libcgpu.so counted from the ranks' launches
and reported), each single-GPU tenant's share against its entitlement, and the longest stall: the longest gap
between two steps of any tenant, less a step, against the round of its GPU *as held*: the time its instances held it
in the window, over the turns of the instance with fewest there (every instance has a turn a round; for the job, its GPU
with the longer round). The round in force that status gives counts a turn's useful time only, not the hand-over
each turn is lengthened by, so a tenant waiting its due, the others' turns, read as a stall beside it; and one turn
of every instance, each its mean, read short where a turn is cut where a gang is due (its rest is a second, short
turn). Spin and held time are read over the window the rates are (from a second in: a collective that one rank
launched as the other paused, in the run before, ends early in this one). The output ends with ``gang_rate_pct=<n>
spin_pct=<n> tenant_err_pp=<n> max_stall_ms=<n>`` for the gangs-on run (the job of ``job+tenants``; the stall: both
scenarios). Targets: the job at >= 95 % of its entitled rate, spin <= 2 % of its held time, tenants within 2 pp, no
stall longer than a round.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench import results
from bench.fidelity_run import NativeTarget, native_target
from cgpu_testing.daemon import DaemonProc

BATCH = 4  # kernels a step: 3 of work and the collective (a job) or a 4th of work (a tenant)
SLOT = struct.Struct("5Q")  # fakecoll.c's per-device record: started, spin_ns, count, work_ns, max_spin_ns


@dataclass(frozen=True)
class Tenant:
    name: str
    gpus: tuple[int, ...]
    target: float  # entitled share, %

    @property
    def job(self) -> bool:
        return len(self.gpus) > 1


SCENARIOS: dict[str, tuple[Tenant, ...]] = {
    "job+tenants": (Tenant("J", (0, 1), 100 / 3), Tenant("A", (0,), 200 / 3), Tenant("B", (1,), 100 / 3),
                    Tenant("C", (1,), 100 / 3)),
    "two_jobs": (Tenant("J1", (0, 1), 50.0), Tenant("J2", (0, 1), 50.0)),
}


class Procs:
    """One serving cuda_job per (tenant, GPU), started together; a tenant's steps are its first GPU's."""

    def __init__(self, where: NativeTarget, daemon: DaemonProc, tenants: tuple[Tenant, ...], ms: float,
                 tag: str) -> None:
        self.where, self.daemon, self.tenants, self.ms, self.tag = where, daemon, tenants, ms, tag
        self.procs: dict[tuple[str, int], subprocess.Popen[str]] = {}

    def instance(self, t: Tenant) -> str:
        return f"{self.tag}-{t.name}"

    def coll(self, t: Tenant) -> str:
        return f"{self.tag}-{t.name}"

    def __enter__(self) -> Procs:
        assert self.where.fakes is not None
        for t in self.tenants:
            for g in t.gpus:
                env = {**os.environ, "LD_PRELOAD": str(self.where.shim), "CGPU_NATIVE": "1",
                       "CGPU_SOCKET": self.daemon.sock, "CGPU_INSTANCE": self.instance(t),
                       "LD_LIBRARY_PATH": str(self.where.fakes), "FAKECUDA_DEVICES": "2",
                       "CUDA_VISIBLE_DEVICES": str(g), "ALIYUN_COM_GPU_VISIBLE_DEVICES": str(g)}
                args = [str(self.where.job)]
                if t.job:
                    env["FAKECUDA_COLLECTIVE"] = f"{self.coll(t)}:{','.join(map(str, t.gpus))}"
                    args.append("collective")
                args.append(f"serve={self.ms},{BATCH}")
                self.procs[(t.name, g)] = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                           stderr=subprocess.DEVNULL, text=True, env=env)
        for key, proc in self.procs.items():
            line = self._line(proc)
            while line.startswith("collective"):
                line = self._line(proc)
            if not line.startswith("ready"):
                raise RuntimeError(f"{key} did not start: {line!r}")
        return self

    @staticmethod
    def _line(proc: subprocess.Popen[str]) -> str:
        out: IO[str] | None = proc.stdout
        return out.readline() if out is not None else ""

    def _send(self, key: tuple[str, int], line: str) -> None:
        stdin = self.procs[key].stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    def run(self, names: list[str], seconds: float, marks: Sequence[tuple[float, Callable[[], None]]] = ()
            ) -> tuple[int, int]:
        """Those tenants work for ``seconds``; each of ``marks`` is called that many seconds in (in order; one at
        ``seconds``: just before they are told to pause)."""
        keys = [k for k in self.procs if k[0] in names]
        t0 = time.monotonic_ns()
        for k in keys:
            self._send(k, "run")
        for at, call in sorted(marks, key=lambda m: m[0]):
            time.sleep(max(0.0, t0 / 1e9 + at - time.monotonic_ns() / 1e9))
            call()
        time.sleep(max(0.0, t0 / 1e9 + seconds - time.monotonic_ns() / 1e9))
        t1 = time.monotonic_ns()
        for k in keys:
            self._send(k, "pause")
        time.sleep(0.3)
        return t0, t1

    def ends(self, t: Tenant) -> list[int]:
        key = (t.name, t.gpus[0])
        path = self.daemon.tmp / f"{self.tag}-{t.name}.json"
        self._send(key, f"dump {path}")
        self._line(self.procs[key])
        return list(json.loads(path.read_text())["ends"])

    def spin_ns(self, t: Tenant) -> int:
        path = Path(f"/dev/shm/fakecuda-coll-{self.coll(t)}")
        if not path.exists():
            return 0
        raw = path.read_bytes()
        return sum(SLOT.unpack_from(raw, SLOT.size * g)[1] for g in t.gpus)

    def __exit__(self, *exc: object) -> None:
        for key, proc in self.procs.items():
            self._send(key, "quit")
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for t in self.tenants:
            Path(f"/dev/shm/fakecuda-coll-{self.coll(t)}").unlink(missing_ok=True)


def round_in_force_ms(daemon: DaemonProc) -> float:
    """The longest round in force (status: useful time, no hand-overs) over the GPUs."""
    return max(float(g["round_ms"]) for g in daemon.status()["gpus"])


def turns(daemon: DaemonProc) -> dict[int, dict[str, tuple[float, int]]]:
    """Per GPU, each instance's held seconds and grants so far."""
    return {int(g["index"]): {i["id"]: (float(i["held_seconds"]), int(i["grants"])) for i in g["instances"]}
            for g in daemon.status()["gpus"]}


def shim_spin_s(daemon: DaemonProc, instance: str) -> float:
    """The collective spin the instance's processes reported so far (status ``gang_shim_spin_seconds``), over its
    GPUs (behaviour §11, the shim's spin)."""
    return sum(float(i.get("gang_shim_spin_seconds", 0.0)) for g in daemon.status()["gpus"] for i in g["instances"]
               if i["id"] == instance)


def rounds_held_ms(t0: dict[int, dict[str, tuple[float, int]]], t1: dict[int, dict[str, tuple[float, int]]]
                   ) -> dict[int, float]:
    """Per GPU, the round as held between two :func:`turns`: the time its instances held it, over the turns of the
    one that had fewest (every instance has at least a turn a round; one cut short where a gang starts has the
    rest of it in a second)."""
    out: dict[int, float] = {}
    for g, now in t1.items():
        held, rounds = 0.0, None
        for inst, (h1, n1) in now.items():
            h0, n0 = t0.get(g, {}).get(inst, (0.0, 0))
            if n1 > n0:
                held += h1 - h0
                rounds = n1 - n0 if rounds is None else min(rounds, n1 - n0)
        out[g] = round(1000 * held / rounds, 1) if rounds else 0.0
    return out


def rate(ends: list[int], t0: int, t1: int) -> float:
    return (bisect.bisect_left(ends, t1) - bisect.bisect_left(ends, t0)) / ((t1 - t0) / 1e9)


def longest_gap_ms(ends: list[int], t0: int, t1: int, step_ns: float) -> float:
    inside = [e for e in ends if t0 <= e <= t1]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    return max(0.0, (max(gaps, default=0) - step_ns) / 1e6)


def baseline_groups(tenants: tuple[Tenant, ...]) -> list[list[str]]:
    """Who runs alone together for the rates alone: a job by itself (it keeps each of its GPUs busy), and the
    single-GPU tenants one per GPU at a time, each GPU with one of its own while there are any (A with B, then A
    with C), so that the host carries what it carries in the scenario, one busy process a GPU. The fake's GPUs are
    the host's threads: read with the other GPU idle, a tenant's rate alone was 2 % higher on this 2-core host
    (A alone 467 to 473 steps/s, beside B or C on GPU 1 445 to 461), which read as a share lost to the arbiter."""
    groups = [[t.name] for t in tenants if t.job]
    by_gpu: dict[int, list[str]] = {}
    for t in tenants:
        if not t.job:
            by_gpu.setdefault(t.gpus[0], []).append(t.name)
    for i in range(max((len(names) for names in by_gpu.values()), default=0)):
        groups.append([names[i % len(names)] for names in by_gpu.values()])
    return groups


def alone_windows(ps: Procs, tenants: tuple[Tenant, ...]) -> dict[str, list[tuple[int, int]]]:
    """Each tenant's windows alone on its GPUs (:func:`baseline_groups`), 1.5 s each, from 0.4 s in."""
    out: dict[str, list[tuple[int, int]]] = {}
    for group in baseline_groups(tenants):
        a0, a1 = ps.run(group, 1.5)
        for name in group:
            out.setdefault(name, []).append((a0 + int(0.4e9), a1))
    return out


def run_scenario(where: NativeTarget, daemon: DaemonProc, name: str, tenants: tuple[Tenant, ...], ms: float,
                 seconds: float, tag: str) -> dict[str, Any]:
    with Procs(where, daemon, tenants, ms, tag) as ps:
        solo = alone_windows(ps, tenants)
        jobs = [t for t in tenants if t.job]
        # the job's spin and held time over the window its rate is read in: from a second in (a collective that
        # one rank launched as the other paused, in the run before, spins until they run again and is counted as it
        # ends, early in this run) to its end
        marks: dict[str, tuple[int, dict[str, tuple[int, float, float]]]] = {}
        held: dict[str, dict[int, dict[str, tuple[float, int]]]] = {}

        def snap(key: str) -> None:
            now = held[key] = turns(daemon)
            marks[key] = (time.monotonic_ns(), {
                t.name: (ps.spin_ns(t), sum(gpu.get(ps.instance(t), (0.0, 0))[0] for gpu in now.values()),
                         shim_spin_s(daemon, ps.instance(t)))
                for t in jobs})

        rounds: list[float] = []
        ps.run([t.name for t in tenants], seconds,
               [(1.0, lambda: snap("from")), (seconds / 2, lambda: rounds.append(round_in_force_ms(daemon))),
                (seconds, lambda: snap("to"))])
        (w0, before), (c1, after) = marks["from"], marks["to"]
        round_held = rounds_held_ms(held["from"], held["to"])
        out: dict[str, Any] = {"scenario": name, "tenants": {}}
        for t in tenants:
            ends = ps.ends(t)
            alone = sum(rate(ends, *w) for w in solo[t.name]) / len(solo[t.name])
            now = rate(ends, w0, c1)
            row: dict[str, Any] = {"target_pct": round(t.target, 2), "solo_rate": round(alone, 1),
                                   "rate": round(now, 1), "share_pct": round(100 * now / alone, 2) if alone else 0.0,
                                   "stall_ms": round(longest_gap_ms(ends, w0, c1, 1e9 / alone if alone else 0), 1),
                                   "round_ms": max(round_held.get(g, 0.0) for g in t.gpus), "job": t.job}
            if t.job:
                spin0, held0, shim0 = before[t.name]
                spin1, held1, shim1 = after[t.name]
                row["entitled_rate"] = round(alone * t.target / 100, 1)
                row["rate_pct"] = round(100 * now / (alone * t.target / 100), 1) if alone else 0.0
                row["spin_pct"] = round(100 * (spin1 - spin0) / 1e9 / (held1 - held0), 2) if held1 > held0 else 0.0
                row["shim_spin_pct"] = round(100 * (shim1 - shim0) / (held1 - held0), 2) if held1 > held0 else 0.0
            out["tenants"][t.name] = row
        out["round_ms"] = rounds[0] if rounds else 0.0
    return out


def sitting(where: NativeTarget, tmp: Path, gangs: bool, ms: float, seconds: float, only: str | None = None
            ) -> list[dict[str, Any]]:
    args = ["--sim-gpus", "2x16GiB", "--identity", "declared", *([] if gangs else ["--gang-window-ms", "0"])]
    rows = []
    with DaemonProc(tmp / ("on" if gangs else "off"), *args) as daemon:
        for name, tenants in SCENARIOS.items():
            if only and only not in name:
                continue
            tag = f"{'on' if gangs else 'off'}-{name.replace('+', '-')}-{os.getpid()}"
            rows.append(run_scenario(where, daemon, name, tenants, ms, seconds, tag))
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    first = rows[0]["tenants"]
    job = min((r for r in first.values() if r["job"]), key=lambda r: r["rate_pct"])
    tenant_err = max((abs(r["share_pct"] - r["target_pct"]) for r in first.values() if not r["job"]), default=0.0)
    every = [r for row in rows for r in row["tenants"].values()]
    worst = max(every, key=lambda r: r["stall_ms"] / r["round_ms"] if r["round_ms"] else float("inf"))
    return {"gang_rate_pct": job["rate_pct"], "spin_pct": job["spin_pct"], "shim_spin_pct": job["shim_spin_pct"],
            "tenant_err_pp": round(tenant_err, 2),
            "max_stall_ms": max(r["stall_ms"] for r in every),
            "stall_in_rounds": round(worst["stall_ms"] / worst["round_ms"], 2) if worst["round_ms"] else 0.0,
            "round_ms": worst["round_ms"], "round_in_force_ms": max(row["round_ms"] for row in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gang", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0, help="seconds of each scenario's contended run")
    p.add_argument("--ms", type=float, default=0.5, help="length of one kernel (ms)")
    p.add_argument("--only", help="run only the scenarios whose name contains this (job+tenants, two_jobs)")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-gang-", dir="/tmp"))
    where = native_target(tmp)
    if where is None or where.fakes is None:
        print("bench.gang: needs gcc and the fake driver (its collective models NCCL's; on a real GPU, run NCCL "
              "jobs); skipped")
        return 0
    runs = {"before (gangs off)": sitting(where, tmp, False, args.ms, args.seconds, args.only),
            "after (gangs on)": sitting(where, tmp, True, args.ms, args.seconds, args.only)}
    lines = [f"Two simulated GPUs on the fake CUDA driver, {args.ms:g} ms kernels in steps of {BATCH}, "
             f"{args.seconds:g} s a scenario; the daemon at its defaults (policy 1), gangs off "
             "(--gang-window-ms 0) then on (the default window).", "",
             "| run | scenario | tenant | target % | measured % | rate /s | entitled /s | rate % of entitled | "
             "spin % of held | shim's spin % of held | longest stall ms | round ms |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    print(f"{'run':20} {'scenario':12} {'tenant':6} {'target%':>8} {'measured%':>10} {'rate/s':>7} "
          f"{'entitled/s':>10} {'rate%':>6} {'spin%':>6} {'shim%':>6} {'stall ms':>9} {'round ms':>9}")
    summary: dict[str, dict[str, float]] = {}
    for run, rows in runs.items():
        for row in rows:
            for name, r in row["tenants"].items():
                ent = f"{r['entitled_rate']:.1f}" if r["job"] else "-"
                pct = f"{r['rate_pct']:.1f}" if r["job"] else "-"
                spin = f"{r['spin_pct']:.2f}" if r["job"] else "-"
                shim = f"{r['shim_spin_pct']:.2f}" if r["job"] else "-"
                print(f"{run:20} {row['scenario']:12} {name:6} {r['target_pct']:8.2f} {r['share_pct']:10.2f} "
                      f"{r['rate']:7.1f} {ent:>10} {pct:>6} {spin:>6} {shim:>6} {r['stall_ms']:9.1f} "
                      f"{r['round_ms']:9.1f}")
                lines.append(f"| {run} | {row['scenario']} | {name} | {r['target_pct']:.2f} | {r['share_pct']:.2f} | "
                             f"{r['rate']:.1f} | {ent} | {pct} | {spin} | {shim} | {r['stall_ms']:.1f} | "
                             f"{r['round_ms']:.1f} |")
        summary[run] = figures(rows)
    for run, f in summary.items():
        print(f"{run}: job at {f['gang_rate_pct']:.1f} % of its entitled rate, spin {f['spin_pct']:.2f} % of held "
              f"(the shim's count: {f['shim_spin_pct']:.2f} %), "
              f"tenants within {f['tenant_err_pp']:.2f} pp, longest stall {f['max_stall_ms']:.1f} ms; the longest "
              f"against its GPU's round as held, {f['stall_in_rounds']:.2f} of {f['round_ms']:.1f} ms (the round in "
              f"force, useful time: {f['round_in_force_ms']:.1f} ms)")
    f = summary["after (gangs on)"]
    line = (f"gang_rate_pct={f['gang_rate_pct']:.1f} spin_pct={f['spin_pct']:.2f} "
            f"tenant_err_pp={f['tenant_err_pp']:.2f} max_stall_ms={f['max_stall_ms']:.1f}")
    if not args.no_results and args.only is None:
        cmd = "python -m bench.gang " + " ".join(argv if argv is not None else sys.argv[1:])
        b = summary["before (gangs off)"]
        before = (f"before: gang_rate_pct={b['gang_rate_pct']:.1f} spin_pct={b['spin_pct']:.2f} "
                  f"tenant_err_pp={b['tenant_err_pp']:.2f} max_stall_ms={b['max_stall_ms']:.1f}")
        results.update("gang", cmd.strip(), "\n".join(lines) + f"\n\n{before}\n\n{line}\n")
    print(line)
    ok = f["gang_rate_pct"] >= 95 and f["spin_pct"] <= 2 and f["tenant_err_pp"] <= 2 and f["stall_in_rounds"] <= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
