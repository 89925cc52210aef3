"""Load: 8 simulated GPUs x 25 instances x 2 processes = 400 clients, mixed busy and bursty work.

    python -m bench.load [--json] [--seconds 60] [--gpus 8] [--instances 25] [--procs 2] [--workers 4]

Reports grants/s, grant latency (a queueing figure), the largest share error
among busy weight-1 instances of a GPU, the daemon's CPU use and lost grants
(bench/README.md says how), and the grant wait against the round in force
(``latency_target_ms`` at its default) with the share of held time hand-overs
cost. The output ends with ``clients=<n> grants_per_s=<n> p50_us=<n> p99_us=<n>
max_share_error_pp=<x> lost=<n> daemon_cpu_pct=<x> round_ms=<x> handover_pct=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arbiterd.tools.adminclient import AdminClient
from bench import results
from bench.common import percentile
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT
from libcgpu_client.aio import AsyncClient

OP_S = 0.001



async def _client(sock: str, gpu: int, inst: str, bursty: bool, end: float, log: dict[str, Any]) -> None:
    c = await AsyncClient.connect(sock, inst, [gpu])
    rnd = random.Random(f"{inst}-{id(log)}")
    while time.monotonic() < end:
        on_until = time.monotonic() + (rnd.uniform(0.02, 0.2) if bursty else 1e9)
        held: tuple[int, int, int] | None = None  # (lease, granted at, released at)
        while time.monotonic() < min(end, on_until):
            t0 = time.monotonic_ns()
            log["asked"] += 1
            try:
                if held is None:
                    lease, deadline = await asyncio.wait_for(c.acquire(gpu), timeout=30)
                else:  # still busy: give the lease back and ask again in one message, as the gate does
                    lease, deadline = await asyncio.wait_for(c.renew(gpu, held[0], held[2] - held[1]), timeout=30)
            except TimeoutError:
                log["unanswered"] += 1
                held = None
                break
            got = time.monotonic_ns()
            log["latency_us"].append((got - t0) / 1e3)
            while time.monotonic_ns() < deadline and c.revoked.get(gpu) != lease and time.monotonic() < on_until:
                await asyncio.sleep(OP_S)  # an op "running on the GPU"
            held = (lease, got, time.monotonic_ns())
            log["held"].append((gpu, inst, got, held[2]))
        if held is not None:
            c.release(gpu, held[0], held[2] - held[1])
        if bursty and time.monotonic() < end:
            await asyncio.sleep(rnd.uniform(0.02, 0.2))
    await c.close()


async def _worker_main(sock: str, specs: list[tuple[int, str, bool]], seconds: float) -> dict[str, Any]:
    log: dict[str, Any] = {"asked": 0, "unanswered": 0, "latency_us": [], "held": []}
    end = time.monotonic() + seconds
    await asyncio.gather(*(_client(sock, g, i, b, end, log) for g, i, b in specs))
    return log


def worker(sock: str, specs_json: str, seconds: float, out: str) -> None:
    import uvloop

    specs = [tuple(s) for s in json.loads(specs_json)]
    Path(out).write_text(json.dumps(uvloop.run(_worker_main(sock, specs, seconds))))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def turn_gaps(held: list[list[Any]], names: set[str]) -> list[float]:
    """How long each of the instances ``names`` went without the GPU between two of its turns (ms): its
    clients' held intervals merged, the gaps between them. The wait for a turn, where the grant latency also
    counts the grants that join a lease the instance already holds."""
    by_inst: dict[str, list[tuple[int, int]]] = {}
    for _, inst, start, end in held:
        if inst in names:
            by_inst.setdefault(inst, []).append((start, end))
    gaps: list[float] = []
    for intervals in by_inst.values():
        intervals.sort()
        last_end = intervals[0][1]
        for start, end in intervals[1:]:
            if start > last_end:
                gaps.append((start - last_end) / 1e6)
            last_end = max(last_end, end)
    return gaps


def overlaps(held: list[list[Any]]) -> int:
    """Moments at which two different instances held one GPU (client-side intervals)."""
    bad = 0
    by_gpu: dict[int, list[tuple[int, int, str]]] = {}
    for gpu, inst, start, end in held:
        by_gpu.setdefault(gpu, []).append((start, end, inst))
    for intervals in by_gpu.values():
        intervals.sort()
        last_end, last_inst = 0, ""
        for start, end, inst in intervals:
            if start < last_end and inst != last_inst:
                bad += 1
            if end > last_end:
                last_end, last_inst = end, inst
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--instances", type=int, default=25, help="instances per GPU")
    p.add_argument("--procs", type=int, default=2, help="client processes per instance")
    p.add_argument("--workers", type=int, default=4, help="load-generating processes")
    p.add_argument("--no-results", action="store_true")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-load-"))
    # the load processes are Python on a 2-core machine: at start-up they may answer slower than 500 ms; a
    # cut-off would not be a fault of the daemon (--overrun-ms)
    daemon = DaemonProc(tmp / "d", "--sim-gpus", f"{args.gpus}x16GiB", "--identity", "declared", "--policy", "4",
                        "--max-inst", "25", "--max-clients", "4096", "--log-level", "warning",
                        "--overrun-ms", "5000").start()
    sock, admin = daemon.sock, daemon.admin
    try:
        specs = [(g, f"g{g}-i{i}", i % 2 == 1) for g in range(args.gpus) for i in range(args.instances)
                 for _ in range(args.procs)]
        random.Random(1).shuffle(specs)
        parts = [specs[k::args.workers] for k in range(args.workers)]
        outs = [str(tmp / f"w{k}.json") for k in range(args.workers)]
        cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", "import sys; from bench.load import worker; "
                                   "worker(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])",
                                   sock, json.dumps(part), str(args.seconds), out], cwd=ROOT)
                 for part, out in zip(parts, outs, strict=True)]
        time.sleep(min(5.0, args.seconds / 4))
        (held_a, useful_a, _), ta = _sample(admin), time.monotonic()
        time.sleep(max(0.0, args.seconds - (time.monotonic() - t0) - 1.0))
        (held_b, useful_b, rounds), tb = _sample(admin), time.monotonic()
        for proc in procs:
            if proc.wait(timeout=args.seconds + 120) != 0:
                raise RuntimeError("a load process failed")
        wall = time.monotonic() - t0
        cpu = cpu_seconds(daemon.pid) - cpu0
    finally:
        daemon.stop()
    logs = [json.loads(Path(o).read_text()) for o in outs]
    latency = sorted(x for log in logs for x in log["latency_us"])
    held = [h for log in logs for h in log["held"]]
    asked = sum(log["asked"] for log in logs)
    unanswered = sum(log["unanswered"] for log in logs)
    twice = overlaps(held)
    errors = []
    for g in range(args.gpus):
        busy = [f"g{g}-i{i}" for i in range(args.instances) if i % 2 == 0]
        got = [held_b.get(n, 0.0) - held_a.get(n, 0.0) for n in busy]
        mean = sum(got) / len(got)
        errors += [abs(x - mean) / (tb - ta) * 100 for x in got]
    gaps = turn_gaps(held, {name for _, name, bursty in specs if not bursty})
    held_all = sum(held_b.values()) - sum(held_a.values())
    handover_pct = 100 * (1 - (sum(useful_b.values()) - sum(useful_a.values())) / held_all) if held_all else 0.0
    round_ms, target_ms, slice_ms, handover_ms = (percentile([r[k] for r in rounds], 0.5) for k in range(4))
    doc = {
        "clients": len(specs), "gpus": args.gpus, "instances_per_gpu": args.instances, "seconds": args.seconds,
        "grants": len(latency), "grants_per_s": len(latency) / wall,
        "p50_us": latency[len(latency) // 2], "p99_us": latency[int(len(latency) * 0.99)],
        "max_share_error_pp": max(errors), "lost": unanswered + twice, "unanswered": unanswered,
        "held_twice": twice, "acquires": asked, "daemon_cpu_pct": 100 * cpu / wall,
        "turn_wait_p50_ms": percentile(gaps, 0.5), "turn_wait_p99_ms": percentile(gaps, 0.99),
        "round_ms": round_ms, "round_target_ms": target_ms, "handover_pct": handover_pct,
        "slice_ms": slice_ms, "handover_ms": handover_ms,
    }
    line = (f"clients={doc['clients']} grants_per_s={doc['grants_per_s']:.0f} p50_us={doc['p50_us']:.0f} "
            f"p99_us={doc['p99_us']:.0f} max_share_error_pp={doc['max_share_error_pp']:.2f} lost={doc['lost']} "
            f"daemon_cpu_pct={doc['daemon_cpu_pct']:.1f} round_ms={round_ms:.1f} handover_pct={handover_pct:.2f}")
    table = "\n".join([
        f"{args.gpus} simulated GPUs x {args.instances} instances x {args.procs} processes = {len(specs)} clients, "
        f"policy 4, half busy and half bursty, {args.seconds:.0f} s; every other setting at its default "
        f"(slice_ms auto, latency_target_ms {target_ms:g}); the slice auto picks from the hand-over "
        f"({handover_ms:.2f} ms): {slice_ms:g} ms (the median GPU's)",
        "",
        "| grants/s | grant latency p50 | p99 | busy instances' wait for a turn p50 | p99 | round in force (target) "
        "| hand-overs | max share error | acquires | unanswered | held twice | daemon CPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {doc['grants_per_s']:.0f} | {doc['p50_us']:.0f} us | {doc['p99_us']:.0f} us | "
        f"{doc['turn_wait_p50_ms']:.1f} ms | {doc['turn_wait_p99_ms']:.1f} ms | {round_ms:.1f} ms "
        f"({target_ms:g}) | {handover_pct:.2f} % | {doc['max_share_error_pp']:.2f} pp | {asked} | {unanswered} | "
        f"{twice} | {doc['daemon_cpu_pct']:.1f} % |",
    ])
    if args.json:
        print(json.dumps(doc, indent=2))
    print(table)
    if not args.no_results:
        cmd = "python -m bench.load " + " ".join(argv if argv is not None else sys.argv[1:])
        results.update("load", cmd.strip(), table + "\n\n" + line + "\n")
    print(line)
    return 0


def _sample(admin: str) -> tuple[dict[str, float], dict[str, float], list[tuple[float, float, float, float]]]:
    """Each instance's held and delivered seconds so far, and each GPU's round in force, its target, the slice in
    force and the expected hand-over (ms)."""
    doc = AdminClient(admin).status()
    insts = [i for g in doc["gpus"] for i in g["instances"]]
    return ({i["id"]: float(i["held_seconds"]) for i in insts}, {i["id"]: float(i["delivered_seconds"]) for i in insts},
            [(float(g["round_ms"]), float(g["latency_target_ms"]), float(g["slice_effective_ms"]),
              float(g["handover_ms"])) for g in doc["gpus"]])


if __name__ == "__main__":
    sys.exit(main())
