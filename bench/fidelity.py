"""Shares at the daemon's default settings: throughput, not held time, for every row of the policy table.

    python -m bench.fidelity [--json] [--sizes 0.5,5] [--workloads loop,sync] [--native] [--only NAME[,NAME]]
                             [--no-results]
    python -m bench.fidelity --native --workloads resnet-pattern

A real arbiterd at its defaults (``--sim-gpus 1x16GiB --identity declared``: slice_ms auto) and tenants
under ``cgpu-run --device cpu`` running torch operators of about 0.5 ms and 5 ms (bench/fidelity_worker.py);
with ``--native``, C programs launching asynchronous spin kernels through libcgpu.so, on the fake CUDA
driver here and on the real one where a GPU is. A tenant's share is its rate against its own exclusive
rate, measured alone just before and after in the same run. bench/README.md says how. The ``sync`` workload
ends every operation in a synchronising read (``.item()``); it runs the 1:2 row and the high-priority row, whose
aggregates are compared (high priority's preemptions must cost no more than the weighted policy's hand-overs):
in either workload those two rows run side by side, cycle by cycle in turn. The output ends with
``max_share_error_pp=<n> min_aggregate_pct=<n> max_ratio_error_pct=<n> pinned5_ratio_error_pct=<n>
hp_aggregate_gap_pp=<n>``. ``--native --workloads resnet-pattern`` runs those two rows with ResNet-50's launch
pattern (bench/fidelity_run.py: 160 kernels of 75 µs queued at once, then a sync), reporting beside the 1:2 row's
work ratio the daemon's held (useful) time ratio over the same runs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import results
from bench.fidelity_run import (
    PATTERN_KERNEL_MS,
    PATTERN_KERNELS,
    SPIN_BATCH,
    NativeTarget,
    NativeTenants,
    TorchTenants,
    calibrate,
    duty_control,
    start_daemon,
)
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT

TARGETS = {"max_share_error_pp": 3.0, "min_aggregate_pct": 95.0, "max_ratio_error_pct": 2.5,
           "pinned5_ratio_error_pct": 2.5, "hp_aggregate_gap_pp": 1.0}
HP_PAIR = ("p2_1_2", "hp60_beside_normal")  # hp_aggregate_gap_pp: the first's aggregate less the second's
PATTERN = "resnet-pattern"  # --native --workloads: ResNet-50's launch pattern (issue 49's 2.111)


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: int = 1
    target: float = 0.0  # % of exclusive
    busy: bool = True
    highprio: bool = False


@dataclass(frozen=True)
class Row:
    name: str
    policy: int
    tenants: tuple[Tenant, ...]
    settings: dict[str, str] = field(default_factory=dict)  # besides the policy, for this row only
    ratio: bool = False  # a 1:2 row: report B/A
    pinned: bool = False  # not at the defaults: reported for its ratio only
    sync: bool = False  # run with the sync workload too (torch)

    @property
    def full(self) -> bool:
        """The busy tenants are owed the whole GPU: their sum is held to the aggregate target."""
        return abs(sum(t.target for t in self.tenants if t.busy) - 100) < 0.5


THIRD = 100 / 3
ROWS = (
    Row("p1_two_busy", 1, (Tenant("A", 1, 50), Tenant("B", 1, 50))),
    Row("p2_1_2", 2, (Tenant("A", 1, THIRD), Tenant("B", 2, 2 * THIRD)), ratio=True, sync=True),
    Row("p2_1_2_b_idle", 2, (Tenant("A", 1, THIRD), Tenant("B", 2, 0, busy=False))),
    Row("p0_max4", 0, (Tenant("A", 1, 25), Tenant("B", 1, 25)), {"max_inst": "4"}),
    Row("p3_max10_w3_alone", 3, (Tenant("A", 3, 30),), {"max_inst": "10"}),
    Row("p2_3_5_7", 2, (Tenant("A", 3, 20), Tenant("B", 5, 100 / 3), Tenant("C", 7, 700 / 15))),
    Row("p4_b_idle", 4, (Tenant("A", 1, 100), Tenant("B", 2, 0, busy=False))),
    Row("hp60_beside_normal", 1, (Tenant("H", 1, 60, highprio=True), Tenant("N", 1, 40)), {"prio_ratio": "60"},
        sync=True),
    Row("p2_1_2_pinned5", 2, (Tenant("A", 1, THIRD), Tenant("B", 2, 2 * THIRD)), {"slice_ms": "5"},
        ratio=True, pinned=True),
)
ROW_DEFAULTS = {"max_inst": "16", "prio_ratio": "50", "slice_ms": "auto"}
ROUNDS = 8  # a contended run lasts at least this many of the row's rounds after its warm-up


def round_s(row: Row) -> float:
    """How long one round of the row's policy takes at most: every tenant's turns once (idle ones' too on 2,
    the whole ring on 0 and 3), at the pinned slice or the longest that auto may choose (100 ms)."""
    settings = {**ROW_DEFAULTS, **row.settings}
    slice_ms = int(settings["slice_ms"]) if settings["slice_ms"] != "auto" else 100
    if row.policy in (0, 3):
        slots = int(settings["max_inst"])
    elif row.policy == 2:
        slots = sum(t.weight for t in row.tenants)
    else:
        slots = sum(1 for t in row.tenants if t.busy)
    return slots * slice_ms / 1e3


def std_error(xs: list[float]) -> float:
    """The standard error of the mean of ``xs`` (0 for fewer than two): how much of a row's error this machine's
    noise from cycle to cycle can explain."""
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0


def rate(ends: list[int], t0: int, t1: int) -> float:
    """Operations per second that ended in [t0, t1) (``ends`` in order, as a tenant records them)."""
    return (bisect.bisect_left(ends, t1) - bisect.bisect_left(ends, t0)) / ((t1 - t0) / 1e9)


def account(books: dict[str, float], ts: Any, row: Row, before: dict[str, Any], after: dict[str, Any],
            role: dict[str, str]) -> None:
    """Add what the daemon says of one contended run: each tenant's entitled, delivered and error seconds,
    under the role it played (``role``: a process's name to the row's tenant whose weight it had).

    (The daemon's view: useful time it granted, against the share its policy owed, while the tenant had
    demand; the row's share columns are the tenants' own view, their operation rates.)
    """
    def of(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {i["id"]: i for i in doc["gpus"][0]["instances"]}

    b, a = of(before), of(after)
    books["span"] = books.get("span", 0.0) + after["uptime_seconds"] - before["uptime_seconds"]
    for t in row.tenants:
        inst = ts.instance(t.name)
        if inst not in a:
            continue
        d = {k: a[inst][k] - b.get(inst, {}).get(k, 0.0) for k in ("entitled_seconds", "delivered_seconds",
                                                                    "owed_seconds")}
        for key, v in (("entitled_pct", d["entitled_seconds"]), ("delivered_pct", d["delivered_seconds"]),
                       ("error_pp", d["delivered_seconds"] - d["owed_seconds"])):
            books[f"{role[t.name]}.{key}"] = books.get(f"{role[t.name]}.{key}", 0.0) + v


Run = tuple[int, int, dict[str, int], dict[str, tuple[int, int]], dict[str, tuple[int, int]]]
"""A contended run: its start and end, each process's weight, and the spans alone before and after it."""


class RowRun:
    """One row's cycles: each busy tenant alone, then all of them under the row's policy, and alone again.

    A tenant's share in a cycle is its rate in the contended run (whole rounds after a warm-up) against its
    rate alone just before and just after. In a 1:2 row the two processes swap weights between cycles
    (ABBA), so a difference between the processes themselves cancels; shares are reported by weight. A
    cycle around which a tenant's rate alone moved by more than ``--drift`` % (the machine changed pace, so
    its reference is unsure) is run again, as many times in all as the row has cycles at most; the row says how
    many were. A row whose standard error is still over half its target after its cycles (a share's over 1.5 pp,
    a ratio's over 1.25 %: the machine is noisy) runs more of them, up to ``--max-cycles-factor`` times as many:
    the rule looks at the spread of the cycles, never at their mean.

    Every cycle writes the row's settings, weights and policy first, so that rows can take turns cycle by cycle
    on one daemon (:func:`run_side_by_side`); a cycle that follows another row's runs first runs its tenants
    alone again, so that its reference is as fresh as in a row run on its own.
    """

    def __init__(self, daemon: DaemonProc, ts: Any, row: Row, args: argparse.Namespace) -> None:
        self.daemon, self.ts, self.row, self.args = daemon, ts, row, args
        self.busy = [t for t in row.tenants if t.busy]
        self.cycles = args.pinned_cycles if row.pinned else args.ratio_cycles if row.ratio else args.cycles
        self.most = self.cycles * max(1, args.max_cycles_factor)
        self.block = 4 if row.ratio else 1  # a 1:2 row grows by whole ABBA blocks
        self.books: dict[str, float] = {}  # the daemon's own accounting over the contended runs
        self.alone_spans: list[dict[str, tuple[int, int]]] = []
        self.runs: list[Run] = []
        self.repeated = 0
        self.k = 0
        self.gpu: dict[str, Any] = {}

    def more(self) -> bool:
        """Whether the row runs another cycle."""
        k = self.k
        return (k < self.cycles or k % self.block != 0
                or (k < self.most and too_noisy(*per_cycle(self.row, self.runs, self.ts, self.args))))

    def alone(self) -> None:
        self.daemon.echo("4", "0/policy")  # work-conserving: one tenant gets the whole GPU
        spans = {}
        for t in self.busy:
            a0, a1 = self.ts.run([t.name], self.args.exclusive)
            spans[t.name] = (a0 + int(0.3e9), a1)
        self.alone_spans.append(spans)

    def drift_pct(self, j: int) -> float:
        """How far a busy tenant's rate alone moved from run alone ``j`` to the next, at most (%)."""
        moved = 0.0
        for t in self.busy:
            ends = self.ts.ends(t.name)
            r0, r1 = (rate(ends, *self.alone_spans[i][t.name]) for i in (j, j + 1))
            moved = max(moved, 100 * abs(r1 / r0 - 1) if r0 else 100.0)
        return moved

    def cycle(self, fresh: bool = False) -> None:
        """One cycle (run again while the machine drifted around it); ``fresh``: run alone first."""
        row, args, daemon, ts = self.row, self.args, self.daemon, self.ts
        write_settings(daemon, row)
        for t in self.busy:  # the processes may have played another row's tenants
            daemon.echo(str(int(t.highprio)), f"0/{ts.instance(t.name)}/highprio")
        if fresh or not self.alone_spans:
            self.alone()
        weights = {t.name: t.weight for t in self.busy}
        if row.ratio and self.k % 4 in (1, 2):  # ABBA: the processes swap weights
            weights = {"A": 2, "B": 1}
        for name in sorted(weights, key=lambda n: weights[n]):  # lower first: the sum stays <= max_inst
            daemon.echo(str(weights[name]), f"0/{ts.instance(name)}/weight")
        while True:
            daemon.echo(str(row.policy), "0/policy")
            before = daemon.status()
            # whole rounds are measured: a row with long rounds (3:5:7 at 100 ms is 1.5 s) runs longer
            seconds = max(args.contended, args.warmup + ROUNDS * round_s(row))
            t0, t1 = ts.run([t.name for t in self.busy], seconds)
            after = daemon.status()
            self.alone()
            j = len(self.alone_spans) - 2
            if self.repeated < max(self.cycles, self.k + 1) and self.drift_pct(j) > args.drift:
                self.repeated += 1
                continue
            self.gpu = after["gpus"][0]
            by_weight = {t.weight: t.name for t in self.busy}
            account(self.books, ts, row, before, after,
                    {t.name: by_weight[weights[t.name]] if row.ratio and t.busy else t.name
                     for t in row.tenants})
            self.runs.append((t0, t1, weights, self.alone_spans[j], self.alone_spans[j + 1]))
            break
        self.k += 1

    def result(self) -> dict[str, Any]:
        row, ts, gpu, books = self.row, self.ts, self.gpu, self.books
        by_role, log_ratios = per_cycle(row, self.runs, ts, self.args)
        shares = {name: statistics.mean(v) for name, v in by_role.items()}
        share_se = {name: std_error(v) for name, v in by_role.items()}  # pp
        for t in row.tenants:
            shares.setdefault(t.name, 0.0)
        # each tenant's grant waits over the daemon's last minute, at the row's end (mostly its contended runs:
        # the runs alone renew an extended lease about once a second); for a high-priority tenant, its
        # preemption delay
        last = {i["id"]: i for i in gpu.get("instances", [])}
        waits = {t.name: {k: last[ts.instance(t.name)][k] for k in ("wait_p50_ms", "wait_p99_ms")}
                 for t in row.tenants if ts.instance(t.name) in last}
        out: dict[str, Any] = {
            "row": row.name, "policy": row.policy, "settings": {**ROW_DEFAULTS, **row.settings},
            "slice_in_force_ms": gpu["slice_effective_ms"], "handover_ms": gpu["handover_ms"],
            "handover_transit_ms": gpu["handover_transit_ms"], "handover_warmup_ms": gpu["handover_warmup_ms"],
            "cycles": len(self.runs), "base_cycles": self.cycles, "repeated": self.repeated,
            "tenants": [{"name": t.name, "weight": t.weight, "highprio": t.highprio, "busy": t.busy,
                         "target_pct": round(t.target, 2), "share_pct": round(shares[t.name], 2),
                         "share_se_pp": round(share_se.get(t.name, 0.0), 2),
                         "error_pp": round(shares[t.name] - t.target, 2),
                         **{f"daemon_{k}": round(100 * books.get(f"{t.name}.{k}", 0.0) / books["span"], 2)
                            for k in ("entitled_pct", "delivered_pct", "error_pp")},
                         "cycles_pct": [round(x, 1) for x in by_role.get(t.name, [])],
                         **waits.get(t.name, {"wait_p50_ms": None, "wait_p99_ms": None})} for t in row.tenants],
            "aggregate_pct": round(sum(shares[t.name] for t in self.busy), 2),
        }
        if row.ratio:  # the processes swapped weights in as many cycles as not: their own speeds cancel
            out["ratio"] = round(math.exp(statistics.mean(log_ratios)), 4)
            out["cycles_ratio"] = [round(math.exp(x), 3) for x in log_ratios]
            out["ratio_se_pct"] = round(100 * std_error(log_ratios), 2)  # of the mean log-ratio: about %
            # the daemon's view of the same runs: useful (held less hand-over) time, weight 2's over weight 1's
            heavy, light = (max(self.busy, key=lambda t: t.weight), min(self.busy, key=lambda t: t.weight))
            held = [books.get(f"{t.name}.delivered_pct", 0.0) for t in (heavy, light)]
            out["held_ratio"] = round(held[0] / held[1], 4) if held[1] else 0.0
        return out


def write_settings(daemon: DaemonProc, row: Row) -> None:
    """The GPU's settings of ``row`` (its own over the defaults), in the tree."""
    for key, value in {**ROW_DEFAULTS, **row.settings}.items():
        daemon.echo(value, f"0/{key}")


def run_row(daemon: DaemonProc, tenants_of: Any, row: Row, args: argparse.Namespace) -> dict[str, Any]:
    """One row on its own: its cycles one after another (:class:`RowRun`). The row's settings are written
    before its tenants start: they register as they start, and the last row's max_inst (10 after
    p3_max10_w3_alone) would refuse p2_3_5_7's third."""
    write_settings(daemon, row)
    with tenants_of(row) as ts:
        run = RowRun(daemon, ts, row, args)
        while run.more():
            run.cycle()
        return run.result()


class Playing:
    """One row's tenants played by the processes of another row's (``names``: this row's name to theirs)."""

    def __init__(self, ts: Any, names: dict[str, str]) -> None:
        self.ts, self.names = ts, names

    def instance(self, name: str) -> str:
        return str(self.ts.instance(self.names[name]))

    def run(self, names: list[str], seconds: float) -> tuple[int, int]:
        t0, t1 = self.ts.run([self.names[n] for n in names], seconds)
        return int(t0), int(t1)

    def ends(self, name: str) -> list[int]:
        return list(self.ts.ends(self.names[name]))

    def leases(self, name: str) -> list[tuple[int, int]]:
        return list(self.ts.leases(self.names[name]))


def run_side_by_side(daemon: DaemonProc, tenants_of: Any, rows: list[Row],
                     args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows whose aggregates are compared (the 1:2 row and the high-priority row), run cycle by cycle in turn on
    one daemon: a spell of the machine slower than the rest falls on both rows alike instead of on whichever ran
    then. The same processes play every row's tenants (the first row's, in order), each cycle writing its row's
    weights and priorities, because instances of a row not running would hold their idle turns on policy 2.
    A row with more cycles than the others runs its rest after theirs."""
    write_settings(daemon, rows[0])
    with tenants_of(rows[0]) as ts:
        first = [t.name for t in rows[0].tenants]
        runs = []
        for row in rows:
            names = [t.name for t in row.tenants]
            if len(names) != len(first) or not all(t.busy for t in row.tenants):
                raise ValueError(f"rows side by side need as many busy tenants: {rows[0].name}, {row.name}")
            runs.append(RowRun(daemon, ts if row is rows[0] else Playing(ts, dict(zip(names, first, strict=True))),
                               row, args))
        last: RowRun | None = None
        while True:  # each row's rule asked once a pass (it may read the tenants' records), until none runs
            ran = False
            for r in runs:
                if r.more():
                    r.cycle(fresh=last is not None and last is not r)
                    last, ran = r, True
            if not ran:
                return [r.result() for r in runs]


def per_cycle(row: Row, runs: list[Run], ts: Any, args: argparse.Namespace) -> tuple[dict[str, list[float]],
                                                                                    list[float]]:
    """Each cycle's share per role (% of exclusive) and, in a 1:2 row, its log ratio of weight 2's rate over
    weight 1's, from the tenants' records."""
    busy = [t for t in row.tenants if t.busy]
    by_role: dict[str, list[float]] = {t.name: [] for t in busy}
    if not runs:
        return by_role, []
    ends = {t.name: ts.ends(t.name) for t in busy}
    leases = ts.leases(busy[0].name)
    role_of = {(t.weight, t.name) for t in busy}
    log_ratios = []  # weight 2's rate over weight 1's, in the same window: drift of the machine cancels
    for t0, t1, weights, before, after in runs:
        # whole rounds: from a turn start of the first busy tenant after the warm-up to a later one
        starts = [g for g, _ in leases if t0 + args.warmup * 1e9 <= g < t1]
        w0, w1 = (starts[0], starts[-1]) if len(starts) > 2 else (int(t0 + args.warmup * 1e9), t1)
        rates = {name: rate(ends[name], w0, w1) for name in weights}
        for name in weights:
            excl = statistics.mean(rate(ends[name], *spans[name]) for spans in (before, after))
            role = name if not row.ratio else next(n for w, n in role_of if w == weights[name])
            by_role[role].append(100 * rates[name] / excl)
        if row.ratio:
            heavy, light = sorted(weights, key=lambda n: -weights[n])
            log_ratios.append(math.log(rates[heavy] / rates[light]))
    return by_role, log_ratios


def too_noisy(by_role: dict[str, list[float]], log_ratios: list[float]) -> bool:
    """Whether a row's cycles leave a share's or a ratio's standard error over half its target."""
    share = max((std_error(v) for v in by_role.values()), default=0.0)
    ratio = 100 * std_error(log_ratios)
    return share > TARGETS["max_share_error_pp"] / 2 or ratio > TARGETS["max_ratio_error_pct"] / 2


def hp_gap(rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float] | None = None) -> float:
    """The most the high-priority row falls short of the 1:2 row measured in the same sitting with the same
    operations (points; 0 where the run had not both): in aggregate throughput, or in ``value`` of each row."""
    of = value if value is not None else (lambda row: float(row["aggregate_pct"]))
    gaps = []
    for r in rows:
        if r["row"] == HP_PAIR[0]:
            for h in rows:
                if h["row"] == HP_PAIR[1] and (h["size_ms"], h["workload"]) == (r["size_ms"], r["workload"]):
                    gaps.append(of(r) - of(h))
    return max(gaps, default=0.0)


def delivered(row: dict[str, Any]) -> float:
    """The useful time the daemon delivered to the row's tenants together (% of the GPU's): the scheduler's part
    of the aggregate, without the tenants' speed in their turns, which is what moves with a noisy host."""
    return float(sum(t["daemon_delivered_pct"] for t in row["tenants"]))


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    at_defaults = [r for r in rows if not r["pinned"]]
    return {
        "max_share_error_pp": max((abs(t["error_pp"]) for r in at_defaults for t in r["tenants"]), default=0.0),
        "min_aggregate_pct": min((r["aggregate_pct"] for r in at_defaults if r["full"]), default=100.0),
        "max_ratio_error_pct": max((abs(r["ratio"] / 2 - 1) * 100 for r in at_defaults if "ratio" in r),
                                   default=0.0),
        "pinned5_ratio_error_pct": max((abs(r["ratio"] / 2 - 1) * 100 for r in rows if r["pinned"]),
                                       default=0.0),
        "hp_aggregate_gap_pp": hp_gap(rows),
    }


def noise(rows: list[dict[str, Any]]) -> str:
    """The largest standard errors over the cycles, printed beside the summary."""
    at_defaults = [r for r in rows if not r["pinned"]]
    share = max((t["share_se_pp"] for r in at_defaults for t in r["tenants"]), default=0.0)
    ratio = max((r["ratio_se_pct"] for r in at_defaults if "ratio" in r), default=0.0)
    pinned = max((r["ratio_se_pct"] for r in rows if r["pinned"]), default=0.0)
    text = (f"standard errors over the cycles: share up to {share:.2f} pp, ratio up to {ratio:.2f} % "
            f"(pinned {pinned:.2f} %)")
    if any(r["row"] == HP_PAIR[1] for r in rows) and any(r["row"] == HP_PAIR[0] for r in rows):
        text += f"; time delivered, 1:2 less high priority: {hp_gap(rows, delivered):.2f} pp"
    return text


def _waits(t: dict[str, Any]) -> str:
    p50, p99 = t.get("wait_p50_ms"), t.get("wait_p99_ms")
    return "" if p50 is None or p99 is None else f"{p50:.0f} / {p99:.0f}"


def table(kind: str, size: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        settings = ", ".join(f"{k} {v}" for k, v in r["settings"].items() if ROW_DEFAULTS.get(k) != v)
        for t in r["tenants"]:
            ratio = (f"{r['ratio']:.3f} ± {r['ratio_se_pct']:.1f} % (held {r['held_ratio']:.3f})"
                     if "ratio" in r and t is r["tenants"][0] else "")
            agg = f"{r['aggregate_pct']:.1f}" if t is r["tenants"][0] else ""
            runs = f"{r['cycles']} ({r['repeated']})" if t is r["tenants"][0] else ""
            lines.append(f"| {kind} {size} | {r['row']} | {r['policy']} | {settings or 'defaults'} | "
                         f"{r['slice_in_force_ms']:g} / {r['handover_ms']:.2f}: {r['handover_transit_ms']:.2f} + "
                         f"{r['handover_warmup_ms']:.2f} | {t['name']}"
                         f" (w{t['weight']}){' hp' if t['highprio'] else ''}{'' if t['busy'] else ' idle'} | "
                         f"{t['target_pct']:.1f} | {t['share_pct']:.1f} ± {t['share_se_pp']:.1f} | "
                         f"{t['error_pp']:+.1f} | {agg} | {ratio} | "
                         f"{t['daemon_entitled_pct']:.1f} | {t['daemon_delivered_pct']:.1f} | "
                         f"{t['daemon_error_pp']:+.1f} | {_waits(t)} | {runs} |")
    return lines


def selected(row: Row, only: str | None) -> bool:
    """Whether ``--only`` lets ``row`` run: a part that names a row runs that row, any other the rows whose name
    contains it."""
    if not only:
        return True
    names = {r.name for r in ROWS}
    return any(part == row.name or (part not in names and part in row.name) for part in only.split(","))


def describe(label: str, row: Row, r: dict[str, Any]) -> str:
    """The line printed as a row ends."""
    shares = " ".join(f"{t['name']}={t['share_pct']:.1f}/{t['target_pct']:.1f}" for t in r["tenants"])
    excl = " ".join(f"{t['name']}:{'/'.join(f'{x:.0f}' for x in t['cycles_pct'])}" for t in r["tenants"] if t["busy"])
    waits = " ".join(f"{t['name']} {_waits(t)}" for t in r["tenants"] if t.get("wait_p50_ms") is not None)
    return (f"{label:>26} {row.name:22} slice {r['slice_in_force_ms']:g} ms, hand-over "
            f"{r['handover_ms']:.2f} ms ({r['handover_transit_ms']:.2f} transit + "
            f"{r['handover_warmup_ms']:.2f} warm-up): {shares} sum {r['aggregate_pct']:.1f}"
            + (f" ratio {r['ratio']:.3f} ± {r['ratio_se_pct']:.1f} % (held {r['held_ratio']:.3f})" if "ratio" in r
               else "")
            + (f"; grant wait p50 / p99 ms: {waits}" if waits else "")
            + f" ({r['cycles']} cycles: {excl}" + (f"; {r['repeated']} run again" if r["repeated"] else "") + ")")


def control(r: dict[str, Any], matmul: int, ms: float, threads: int) -> str:
    """The machine's own loss in the turns of a policy-0 row, with no cgpu (duty_control), printed and kept."""
    on_ms = r["slice_in_force_ms"]
    blocks = duty_control(matmul, threads, on_ms)
    r["duty_control_pct"] = [round(x, 2) for x in blocks]
    loss = (f"{statistics.mean(blocks):+.1f} ± {std_error(blocks):.1f} %" if blocks
            else "not measured (operations as long as a turn)")
    turns = f"{on_ms:g} ms turns {3 * on_ms:g} ms apart"
    print(f"{'':>26} control, no cgpu: {turns} took {loss} per operation against running on", flush=True)
    return f"torch {ms:g} ms, {turns}: {loss}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--sizes", default="0.5,5", help="operation (or kernel) lengths in ms (default 0.5,5)")
    p.add_argument("--workloads", default="loop,sync", help="torch workloads (default loop,sync): loop runs "
                   "every row; sync, whose operations end in a synchronising read (.item()), runs the 1:2 and the "
                   "high-priority rows. With --native: loop (the default), and resnet-pattern: ResNet-50's launch "
                   f"pattern ({PATTERN_KERNELS} kernels of {PATTERN_KERNEL_MS} ms queued at once, then a sync), "
                   "in the rows sync runs, once whatever --sizes says")
    p.add_argument("--native", action="store_true", help="C programs through libcgpu.so instead of torch")
    p.add_argument("--only", help="run only these rows (comma-separated): a name that is a row's runs that row, "
                   "any other the rows whose name contains it")
    p.add_argument("--cycles", type=int, default=4, help="contended runs per row, each between runs alone")
    p.add_argument("--ratio-cycles", type=int, default=8, help="contended runs of a 1:2 row (a multiple of 4, "
                   "for the ABBA swaps): its ratio is held to the tightest target")
    p.add_argument("--pinned-cycles", type=int, default=16, help="contended runs of the pinned 1:2 row (a "
                   "multiple of 4): with 5 ms operations a weight-1 turn there is one operation, and one run's ratio "
                   "varies by several %%")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of each torch tenant (default 1: "
                   "the simulated device is one core, the other is the host's)")
    p.add_argument("--exclusive", type=float, default=1.5, help="seconds of each tenant's run alone")
    p.add_argument("--contended", type=float, default=6.0, help="seconds of each contended run, at least: "
                   "a run lasts 8 of the row's rounds after its warm-up")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of a contended run left out")
    p.add_argument("--drift", type=float, default=10.0, help="a cycle around which a tenant's rate alone moved "
                   "by more than this %% is run again (default 10)")
    p.add_argument("--max-cycles-factor", type=int, default=2, help="a row whose standard error is over half its "
                   "target after its cycles runs more, up to this many times as many (default 2; 1: never)")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = p.parse_args(argv)
    workloads = args.workloads.split(",")
    allowed = ["loop", "sync", PATTERN] if args.native else ["loop", "sync"]
    if not set(workloads) <= set(allowed):
        p.error(f"--workloads takes {', '.join(allowed)}{'' if args.native else f' ({PATTERN} with --native)'}, "
                f"not {args.workloads}")
    if args.native:  # sync is torch's: the native loop already waits for each batch
        workloads = [w for w in workloads if w != "sync"] or ["loop"]
    for flag, n in (("--ratio-cycles", args.ratio_cycles), ("--pinned-cycles", args.pinned_cycles)):
        if n < 4 or n % 4:
            p.error(f"{flag} must be a multiple of 4 (whole ABBA blocks), not {n}")
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-fid-", dir="/tmp"))
    kind = "native" if args.native else "torch"
    where: NativeTarget | None = None
    if args.native:
        from bench.fidelity_run import native_target

        where = native_target(tmp)
        if where is None:
            print("bench.fidelity --native: gcc is needed to build the C programs; skipped")
            return 0
        print(f"native tenants on {where.describe}" + ("" if where.real_gpu else
              "; no NVIDIA GPU here, so the real-driver run is skipped"), flush=True)
    rows_out: list[dict[str, Any]] = []
    lines: list[str] = []
    controls: list[str] = []  # the machine's own loss in policy 0's turns, no cgpu (duty_control)
    # each size with its workloads, on a daemon of its own; the ResNet-50 pattern once, on its own
    passes = [(size, [w for w in workloads if w != PATTERN]) for size in args.sizes.split(",")]
    passes = [(size, ws) for size, ws in passes if ws] + ([(PATTERN, [PATTERN])] if PATTERN in workloads else [])
    for size, pass_workloads in passes:
        ms = PATTERN_KERNEL_MS if size == PATTERN else float(size)
        with start_daemon(tmp / f"d-{size}", real_gpu=where is not None and where.real_gpu) as daemon:
            matmul = 0 if args.native else calibrate(ms, args.threads)
            for workload in pass_workloads:
                sync = workload in ("sync", PATTERN)  # the pattern runs the rows sync runs
                tenants_of: Callable[[Row], NativeTenants | TorchTenants]
                if args.native:
                    assert where is not None
                    batch = PATTERN_KERNELS if workload == PATTERN else SPIN_BATCH

                    def native_of(row: Row, ms: float = ms, where: NativeTarget = where,
                                  batch: int = batch) -> NativeTenants:
                        return NativeTenants(where, daemon, row, ms, tmp, batch)
                    tenants_of = native_of
                    label = (f"ResNet-50 pattern ({PATTERN_KERNELS} x {ms:g} ms + sync)" if workload == PATTERN
                             else f"{ms:g} ms kernels")
                else:
                    def torch_of(row: Row, matmul: int = matmul, sync: bool = sync) -> TorchTenants:
                        return TorchTenants(daemon, row, matmul, args.threads, sync)
                    tenants_of = torch_of
                    label = (f"{ms:g} ms ops{' + .item()' if sync else ''} (matmul {matmul}, {args.threads} "
                             f"thread{'s' * (args.threads > 1)})")
                chosen = [row for row in ROWS if selected(row, args.only) and (row.sync or not sync)]
                pair = [row for row in chosen if row.name in HP_PAIR]
                for row in chosen:
                    if len(pair) == 2 and row is pair[1]:
                        continue  # it ran beside the first, cycle by cycle
                    together = pair if len(pair) == 2 and row is pair[0] else [row]
                    if len(together) > 1:
                        outs = run_side_by_side(daemon, tenants_of, together, args)
                    else:
                        outs = [run_row(daemon, tenants_of, row, args)]
                    for one, r in zip(together, outs, strict=True):
                        r.update(size_ms=ms, workload=workload, op=label, full=one.full, pinned=one.pinned,
                                 side_by_side=len(together) > 1)
                        rows_out.append(r)
                        print(describe(label, one, r), flush=True)
                    if row.policy == 0 and not args.native:  # in the same spell of the machine as the row
                        controls.append(control(outs[0], matmul, ms, args.threads))
                order = [row.name for row in ROWS]
                heading = "ResNet-50 pattern" if workload == PATTERN else f"{ms:g} ms{' sync' if sync else ''}"
                lines += table(kind, heading,
                               sorted((r for r in rows_out if r["size_ms"] == ms and r["workload"] == workload),
                                      key=lambda r: order.index(r["row"])))
    summ = summary(rows_out)
    summary_line = " ".join(f"{k}={v:.2f}" for k, v in summ.items())
    ok = all(summ[k] <= v if k != "min_aggregate_pct" else summ[k] >= v for k, v in TARGETS.items())
    if args.json:
        print(json.dumps({"rows": rows_out, "summary": summ, "targets": TARGETS,
                          "hp_delivered_gap_pp": hp_gap(rows_out, delivered)}, indent=2))
    if not args.no_results and args.only is None:
        head = ["Daemon at its defaults (`--sim-gpus 1x16GiB --identity declared`: slice_ms auto, "
                "handover_target_pct 2, policy set per row through the tree); the pinned row sets slice_ms 5. "
                + ("" if args.native else
                   f"Torch tenants: {args.threads} intra-op thread{'s' if args.threads > 1 else ''} each. ")
                + f"{args.cycles} contended runs per row, {args.ratio_cycles} in a 1:2 row and {args.pinned_cycles} "
                f"in the pinned one, and more, up to {args.max_cycles_factor} times as many, while a share's standard "
                f"error was over {TARGETS['max_share_error_pp'] / 2:g} pp or a ratio's over "
                f"{TARGETS['max_ratio_error_pct'] / 2:g} % (half their targets); a run around which a "
                f"tenant's rate alone moved by more than {args.drift:g} % was run again. The last column gives the "
                "runs kept and, in brackets, those run again. "
                + "Share: a tenant's rate against its own exclusive rate, measured alone before and after "
                "in the same run; window: whole rounds after a warm-up. A ratio is the geometric mean of the "
                "runs' ratios, a share the mean of the runs' shares, each ± its standard error over the runs. "
                "The slice and the hand-over are the daemon's at the row's end (status: `slice_effective_ms`, "
                "`handover_ms`, and the last hand-overs' mean transit and warm-up, unclamped). The last three "
                "columns are the daemon's own fairness accounting over the same contended runs (`cgpu-smi`'s "
                "Entitled/Delivered/Err; in a 1:2 row, where the processes swap weights, by the weight each had): "
                "entitled and delivered (useful) % of the time, and delivered less owed (entitled while the "
                "tenant had demand), in points; then each tenant's grant wait over the daemon's last minute at the "
                "row's end (a high-priority tenant's is its preemption delay). The sync workload ends each "
                "operation in a synchronising read (`.item()`). A ratio's `held` is the daemon's: weight 2's useful "
                "time over weight 1's in the same runs."
                + (f" The ResNet-50 pattern: {PATTERN_KERNELS} kernels of {PATTERN_KERNEL_MS} ms queued at once, "
                   "then a stream sync, again and again (an iteration of ResNet-50 at batch 64 on an H100 is about "
                   "160 kernels and 12 ms); the unit of work is the kernel." if PATTERN in workloads else ""),
                "",
                "| tenants | row | policy | settings | slice in force / hand-over: transit + warm-up (ms) | tenant | "
                "target % | "
                "share % | error pp | sum % | ratio | daemon: entitled % | delivered % | error pp | "
                "grant wait p50 / p99 ms | runs (again) |",
                "| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                "| ---: |"]
        cmd = "python -m bench.fidelity " + " ".join(argv if argv is not None else sys.argv[1:])
        if controls:
            lines += ["", "Control, with no cgpu, run right after the p0_max4 row: one torch loop in the bench's "
                      "own process running the same operation in turns of that row's slice, three times as long "
                      "apart (that row's turns), took this much longer per operation, past each turn's first "
                      "10 ms, than running on; a tenant that waits out three slots of four loses that much of its "
                      "share on this machine whatever the daemon does: " + "; ".join(controls) + "."]
        # the pattern alone has a section of its own, beside the rows of every size
        section = f"fidelity-{kind}" + (f"-{PATTERN}" if workloads == [PATTERN] else "")
        results.update(section, cmd.strip(), "\n".join(head + lines) + f"\n\n{summary_line}\n")
    print(noise(rows_out))
    print(summary_line)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
