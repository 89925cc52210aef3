"""Run every scenario of behaviour §3 and §4 on the simulator and compare shares with targets.

    python -m bench.shares [--json] [--seconds 60]

Each scenario runs for ``--seconds`` of virtual time. The target of each
instance comes from the fluid model of its policy (:func:`fluid_shares`),
integrated over the run; the measured share is the time the instance's ops
really ran on the simulated GPU. The output ends with ``max_error_pp=<x>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from arbiterd.core.effects import NS_PER_S
from arbiterd.core.settings import GpuSettings
from bench import results
from cgpu_testing.sim import SimInstance, SimResult, Simulation, bursty, busy, idle


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: int
    instances: list[SimInstance]
    max_inst: int = 16
    prio_ratio: int = 50
    slice_ms: int = 5
    note: str = ""
    extra: dict[str, int] = field(default_factory=dict)


A, B = "A", "B"

SCENARIOS: list[Scenario] = [
    Scenario("p0_fixed_max4", 0, [SimInstance(A), SimInstance(B)], max_inst=4,
             note="fixed ring, max_inst=4: A 25%, B 25%, idle 50%"),
    Scenario("p1_preemptive", 1, [SimInstance(A), SimInstance(B)], note="A 50%, B 50%"),
    Scenario("p1_b_idle", 1, [SimInstance(A), SimInstance(B, workload=idle())],
             note="B idle: A ~100%"),
    Scenario("p2_weighted_1_2", 2, [SimInstance(A, 1), SimInstance(B, 2)], note="33% / 67%"),
    Scenario("p2_weighted_1_2_b_idle", 2, [SimInstance(A, 1), SimInstance(B, 2, workload=idle())],
             note="B registered but idle: A 33%, idle 67%"),
    Scenario("p2_a_alone", 2, [SimInstance(A, 1)], note="A alone: 100%"),
    Scenario("p2_ops_3x_slice", 2, [SimInstance(A, 1, workload=busy(15)),
                                    SimInstance(B, 2, workload=busy(15))],
             note="weights 1:2, each op 3x the 5 ms slice: overrun is charged"),
    Scenario("p2_weighted_8_4", 2, [SimInstance(A, 8), SimInstance(B, 4)], max_inst=16,
             note="8:4 gives the ratio of 2:1 with 4x fewer switches"),
    Scenario("p2_bursty_1_2", 2, [SimInstance(A, 1, workload=bursty(1, 700, 300)),
                                  SimInstance(B, 2, workload=bursty(1.5, 1100, 400, 250))],
             note="both bursty (on/off); non-work-conserving"),
    Scenario("p3_fixed_core_alone", 3, [SimInstance(A, 3)], max_inst=10,
             note="max_inst=10, weight 3: 30% even alone"),
    Scenario("p3_fixed_core_pair", 3, [SimInstance(A, 3), SimInstance(B, 5)], max_inst=10,
             note="30% / 50%, idle 20%"),
    Scenario("core_pct_30_45", 3, [SimInstance(A, 30 // 5), SimInstance(B, 45 // 5)], max_inst=20,
             note="GPU-core percentages 30 % and 45 %: weights 6 and 9 of 20 slots on policy 3"),
    Scenario("p4_weak_1_2", 4, [SimInstance(A, 1), SimInstance(B, 2)], note="33% / 67%"),
    Scenario("p4_weak_b_idle", 4, [SimInstance(A, 1), SimInstance(B, 2, workload=idle())],
             note="B idle: A ~100%"),
    Scenario("p4_bursty_1_2", 4, [SimInstance(A, 1, workload=busy(1)),
                                  SimInstance(B, 2, workload=bursty(2, 1000, 500))],
             note="A busy, B bursty: 1:2 while both want the GPU, A takes B's gaps"),
    Scenario("p4_ops_3x_slice", 4, [SimInstance(A, 1, workload=busy(15)),
                                    SimInstance(B, 2, workload=busy(15))],
             note="work-conserving, ops 3x the slice"),
    Scenario("p5_native", 5, [SimInstance(A), SimInstance(B)],
             note="no slicing: both run concurrently, 100% each"),
    Scenario("hp_ratio60_busy_normal", 1,
             [SimInstance(A, 1, highprio=True), SimInstance(B, 1)], prio_ratio=60,
             note="high priority capped at prio_ratio=60 beside a busy normal instance"),
    Scenario("hp_ratio60_weighted", 2,
             [SimInstance(A, 1, highprio=True), SimInstance(B, 2)], prio_ratio=60,
             note="high priority on policy 2"),
    Scenario("hp_no_demand", 1,
             [SimInstance(A, 1, highprio=True, workload=idle()), SimInstance(B, 1)],
             prio_ratio=60, note="high priority without demand takes nothing"),
    Scenario("hp_bursty", 1,
             [SimInstance(A, 1, highprio=True, workload=bursty(1, 400, 600)), SimInstance(B, 1)],
             prio_ratio=60, note="bursty high-priority (online) beside a busy offline job"),
]


def run_scenario(sc: Scenario, seconds: float) -> SimResult:
    settings = GpuSettings(policy=sc.policy, max_inst=sc.max_inst, prio_ratio=sc.prio_ratio,
                           slice_ms=sc.slice_ms)
    sim = Simulation(settings, sc.instances)
    return sim.run(int(seconds * NS_PER_S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shares", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--seconds", type=float, default=60.0, help="virtual seconds per scenario")
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    worst = 0.0
    for sc in SCENARIOS:
        if args.only and args.only not in sc.name:
            continue
        res = run_scenario(sc, args.seconds)
        err = res.max_error_pp()
        worst = max(worst, err)
        rows.append({
            "scenario": sc.name,
            "policy": sc.policy,
            "note": sc.note,
            "instances": {
                n: {"target_pct": round(r.target * 100, 3), "measured_pct": round(r.share * 100, 3),
                    "held_pct": round(r.held_share * 100, 3), "grants": r.grants,
                    "max_wait_ms": round(r.max_wait_ns / 1e6, 3)}
                for n, r in res.instances.items()
            },
            "idle": {"target_pct": round(res.idle_target * 100, 3),
                     "measured_pct": round(res.idle_share * 100, 3)},
            "error_pp": round(err, 3),
            "overruns": res.overruns,
        })
    if args.json:
        print(json.dumps({"seconds": args.seconds, "scenarios": rows}, indent=2))
    else:
        print(f"{'scenario':28} {'inst':4} {'target%':>8} {'measured%':>10} {'err pp':>7}")
        for row in rows:
            for name, r in row["instances"].items():
                print(f"{row['scenario']:28} {name:4} {r['target_pct']:8.2f} "
                      f"{r['measured_pct']:10.2f} {abs(r['target_pct'] - r['measured_pct']):7.2f}")
            print(f"{'':28} {'idle':4} {row['idle']['target_pct']:8.2f} "
                  f"{row['idle']['measured_pct']:10.2f}")
    if not args.no_results and args.only is None:
        lines = [f"Every scenario of behaviour §3 and §4, {args.seconds:.0f} s of virtual time each, slices of 5 ms.",
                 "", "| scenario | policy | instance | target % | measured % | error pp |",
                 "| --- | ---: | --- | ---: | ---: | ---: |"]
        for row in rows:
            for name, r in [*row["instances"].items(), ("idle", row["idle"])]:
                lines.append(f"| {row['scenario']} | {row['policy']} | {name} | {r['target_pct']:.2f} | "
                             f"{r['measured_pct']:.2f} | {abs(r['target_pct'] - r['measured_pct']):.2f} |")
        cmd = "python -m bench.shares " + " ".join(argv if argv is not None else sys.argv[1:])
        results.update("shares", cmd.strip(), "\n".join(lines) + f"\n\nmax_error_pp={worst:.3f}\n")
    print(f"max_error_pp={worst:.3f}")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
