"""Requests and limits on real processes: each scenario's target and measured share, at the daemon's defaults.

    python -m bench.limits [--native] [--seconds 6] [--ms 0.5] [--only NAME] [--no-results]

A real arbiterd at its defaults (``--sim-gpus 1x16GiB --identity declared``: slice_ms auto, limit_period_ms
auto), its GPU on policy 4 with 20 slots (so a request of P % is weight P/5), and tenants under ``cgpu-run
--device cpu`` running torch operators of about ``--ms`` (bench/fidelity_worker.py: the CPU stand-in); with
``--native``, C programs launching spin kernels through libcgpu.so on the fake CUDA driver (on the real one
where a GPU is). Each tenant's record is provisioned with its request and, once its rate alone is measured
unlimited, its limit (``N/<id>/limit``). A tenant's share is its rate in the scenario against its own rate
alone just before, so the hand-overs are counted: a limit caps useful time. The scenarios are those of issue
51 (A: request 30 %, limit 60 %; B: request 30 %; C: request 40 %, limit 40 %) and one where a limit binds
under contention. ``throttled_ok`` checks each limited tenant's throttled time (status ``throttled_seconds``)
against what its limit leaves: 1 - L alone, none where its limit does not bind (10 pp). The output ends with
``limit_err_pp=<n> request_err_pp=<n> throttled_ok=<bool>``: the largest error of a share held by a limit,
and of one held by a request (the weights' share), both to stay within 3 pp.
"""

from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import results
from bench.fidelity_run import NativeTarget, NativeTenants, TorchTenants, calibrate, start_daemon
from cgpu_testing.daemon import DaemonProc

TARGET_PP = 3.0
THROTTLE_PP = 10.0


@dataclass(frozen=True)
class Tenant:
    name: str
    request: int  # % of the GPU: weight request / 5 of 20 slots
    limit: int = 100
    target: float = 0.0  # % of exclusive
    busy: bool = True
    highprio: bool = False

    @property
    def weight(self) -> int:
        return self.request // 5


@dataclass(frozen=True)
class Scenario:
    name: str
    tenants: tuple[Tenant, ...]
    note: str
    throttled: dict[str, float]  # a limited tenant's expected throttled fraction of the run


SCENARIOS = (
    Scenario("A_alone", (Tenant("A", 30, 60, 60),), "A (request 30 %, limit 60 %) alone: 60 %", {"A": 0.40}),
    Scenario("A_beside_B", (Tenant("A", 30, 60, 50), Tenant("B", 30, 100, 50)),
             "A beside B (request 30 %, no limit), both busy: 50 / 50", {"A": 0.0}),
    Scenario("A_beside_C_idle", (Tenant("A", 30, 60, 60), Tenant("C", 40, 40, 0, busy=False)),
             "A beside C (request 40 %, limit 40 %) idle: A still 60 %", {"A": 0.40}),
    Scenario("C_alone", (Tenant("C", 40, 40, 40),), "C alone: 40 %", {"C": 0.60}),
    Scenario("A40_beside_B", (Tenant("A", 30, 40, 40), Tenant("B", 30, 100, 60)),
             "A limited to 40 % beside B: the limit binds under contention, B takes the rest", {}),
)


def rate(ends: list[int], t0: int, t1: int) -> float:
    return (bisect.bisect_left(ends, t1) - bisect.bisect_left(ends, t0)) / ((t1 - t0) / 1e9)


def throttled(daemon: DaemonProc, instance: str) -> float:
    for g in daemon.status()["gpus"]:
        for i in g["instances"]:
            if i["id"] == instance:
                return float(i["throttled_seconds"])
    return 0.0


def run_scenario(daemon: DaemonProc, ts: TorchTenants | NativeTenants, sc: Scenario, seconds: float
                 ) -> dict[str, Any]:
    busy = [t for t in sc.tenants if t.busy]
    spans: list[dict[str, tuple[int, int]]] = []

    def alone() -> None:  # each tenant's rate alone, unlimited, before and after (the machine drifts)
        spans.append({})
        for t in busy:
            a0, a1 = ts.run([t.name], 1.5)
            spans[-1][t.name] = (a0 + int(0.3e9), a1)

    def limits(on: bool) -> None:
        for t in sc.tenants:
            if t.limit < 100:
                daemon.echo(str(t.limit if on else 100), f"0/{ts.instance(t.name)}/limit")

    alone()
    limits(True)
    before = {t.name: throttled(daemon, ts.instance(t.name)) for t in sc.tenants}
    c0, c1 = ts.run([t.name for t in busy], seconds)
    after = {t.name: throttled(daemon, ts.instance(t.name)) for t in sc.tenants}
    limits(False)
    alone()
    out: dict[str, Any] = {"scenario": sc.name, "note": sc.note, "tenants": {}}
    for t in busy:
        ends = ts.ends(t.name)
        solo = sum(rate(ends, *span[t.name]) for span in spans) / len(spans)
        share = 100 * rate(ends, c0 + int(1e9), c1) / solo if solo else 0.0
        frac = (after[t.name] - before[t.name]) / (seconds - 0.2)
        out["tenants"][t.name] = {"request": t.request, "limit": t.limit, "target_pct": t.target,
                                  "measured_pct": round(share, 2), "error_pp": round(share - t.target, 2),
                                  "throttled_frac": round(frac, 3), "held_by": held_by(sc, t)}
    return out


def held_by(sc: Scenario, t: Tenant) -> str:
    """Whether the tenant's target is its limit (a ceiling holds it) or what the weights give it."""
    return "limit" if t.limit < 100 and abs(t.target - t.limit) < 0.01 else "request"


def provision(daemon: DaemonProc, ts: TorchTenants | NativeTenants, sc: Scenario) -> None:
    for t in sc.tenants:
        daemon.ctl("echo", f"create {ts.instance(t.name)} gpu=0 weight={t.weight}", "inst_ctl")


class _Row:
    """What the tenants' processes need of a scenario (bench.fidelity_run's RowLike)."""

    def __init__(self, sc: Scenario) -> None:
        self.name, self.tenants = sc.name, sc.tenants


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--native", action="store_true", help="C programs through libcgpu.so instead of torch")
    p.add_argument("--seconds", type=float, default=6.0, help="seconds of each scenario's contended run")
    p.add_argument("--ms", type=float, default=0.5, help="length of one operation or kernel (ms)")
    p.add_argument("--only", help="run only the scenarios whose name contains this")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-lim-", dir="/tmp"))
    where: NativeTarget | None = None
    if args.native:
        from bench.fidelity_run import native_target

        where = native_target(tmp)
        if where is None:
            print("bench.limits --native: gcc is needed to build the C programs; skipped")
            return 0
    rows: list[dict[str, Any]] = []
    with start_daemon(tmp / "d", real_gpu=where is not None and where.real_gpu) as daemon:
        daemon.echo("20", "0/max_inst")
        daemon.echo("4", "0/policy")
        matmul = 0 if where is not None else calibrate(args.ms, 1)
        for sc in SCENARIOS:
            if args.only and args.only not in sc.name:
                continue
            row = _Row(sc)
            ts: TorchTenants | NativeTenants
            ts = (NativeTenants(where, daemon, row, args.ms, tmp) if where is not None
                  else TorchTenants(daemon, row, matmul, 1))
            provision(daemon, ts, sc)
            with ts:
                rows.append(run_scenario(daemon, ts, sc, args.seconds))
            time.sleep(0.2)
    what = (where.describe if where is not None else f"the CPU stand-in (torch matmul {matmul}, 1 thread)")
    lines = [f"Tenants on {what}, {args.ms:g} ms operations, {args.seconds:g} s a scenario; GPU on policy 4, "
             "max_inst 20, every other setting at its default.", "",
             "| scenario | tenant | request % | limit % | target % | measured % | error pp | throttled |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    print(f"{'scenario':18} {'tenant':6} {'req%':>5} {'lim%':>5} {'target%':>8} {'measured%':>10} {'err pp':>7} "
          f"{'thr':>5}")
    errs = {"limit": 0.0, "request": 0.0}
    ok = True
    for r in rows:
        sc = next(s for s in SCENARIOS if s.name == r["scenario"])
        for name, t in r["tenants"].items():
            errs[t["held_by"]] = max(errs[t["held_by"]], abs(t["error_pp"]))
            if name in sc.throttled:
                ok &= abs(t["throttled_frac"] - sc.throttled[name]) * 100 <= THROTTLE_PP
            lim = "-" if t["limit"] >= 100 else str(t["limit"])
            print(f"{r['scenario']:18} {name:6} {t['request']:>5} {lim:>5} {t['target_pct']:8.2f} "
                  f"{t['measured_pct']:10.2f} {t['error_pp']:7.2f} {t['throttled_frac']:5.2f}")
            lines.append(f"| {r['scenario']} | {name} | {t['request']} | {lim} | {t['target_pct']:.2f} | "
                         f"{t['measured_pct']:.2f} | {t['error_pp']:.2f} | {t['throttled_frac']:.2f} |")
    summary = f"limit_err_pp={errs['limit']:.2f} request_err_pp={errs['request']:.2f} throttled_ok={ok}"
    if not args.no_results and args.only is None:
        cmd = "python -m bench.limits " + " ".join(argv if argv is not None else sys.argv[1:])
        results.update("limits-native" if args.native else "limits", cmd.strip(),
                       "\n".join(lines) + f"\n\n{summary}\n")
    print(summary)
    return 0 if ok and max(errs.values()) <= TARGET_PP else 1


if __name__ == "__main__":
    sys.exit(main())
