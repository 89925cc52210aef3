"""Pods arriving and leaving through a fake kubelet on an 8-GPU node, under binpack and under spread.

    python -m bench.k8s [--json] [--pods 200] [--seed 7] [--dra] [--no-results]

One event sequence (fixed seed) of ``--pods`` arrivals, each pod asking for GPU memory
and/or a core percentage of random sizes and leaving after a random number of arrivals,
is replayed once per placement policy: a fresh arbiterd (``--sim-gpus 8x16GiB``), a fresh
fake kubelet and the plugin in this process (cgpu_testing/k8s.py). After every
arrival and departure the bench reads arbiterd's status and counts a card whose allocated
memory or core percentage passes its total as an overcommit.

A pod is *refused* when the node had room for it in total (free memory and core percent
summed over cards, from the pods still running) yet it cannot run: admission failed, or its
memory and core percentage landed on different cards (arbiterd refuses such a container
when it binds). That is fragmentation. Pods the node had no room for are counted apart.
``Allocate`` latency is the kubelet-side time of each Allocate RPC.

arbiterd runs at its defaults plus ``--allocations required`` (``--identity cgroup`` with the
fake kubelet's /proc). The output ends with
``pods=<n> overcommits=<n> binpack_refused=<n> spread_refused=<n> allocate_p99_ms=<x> pods_labelled=<n>/<n>``:
at the end of each replay, every pod still running starts a container that registers; of those arbiterd
registers (a refusal is printed with its reason: it leaves no series to label), a pod counts as labelled when
every per-instance series of its instance carries its namespace, pod and container (:mod:`bench.k8s_labels`;
the pods are in namespace ``bench``).

``--dra`` replays the same arrivals through the DRA plugin as well (:mod:`bench.k8s_dra`) and
prints both side by side, ending with ``dra_pods=<n> dra_split=<n> dra_refused_with_room=<n>
dra_overcommits=<n> plugin_split=<n> prepare_p99_ms=<x> pods_labelled=<n>/<n> dra_limits=<n>/<n>`` (plugin: the
binpack run, the plugin's default; pods_labelled: over every run; dra_limits: of the running pods whose claim asked a
limit beside its cores' request, those whose instance holds it in arbiterd); it writes the section ``k8s-dra`` of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import k8s_labels
from bench.common import percentile
from bench.k8s_dra import DraRun, replay_dra
from cgpu_device_plugin.admin import AdminClient
from cgpu_testing.k8s import Node, node_daemon
from cgpu_testing.kubelet import CORE, MEM, AdmissionError, Pod

GPUS, GIB_PER_GPU = 8, 16
NAMESPACE = "bench"
MEM_SIZES = [1, 2, 2, 4, 4, 4, 6, 8, 8, 12, 16]  # GiB, weighted by repetition
CORE_SIZES = [10, 15, 20, 25, 30, 40, 50, 60]


@dataclass(frozen=True)
class Arrival:
    step: int
    name: str
    mem: int  # GiB, 0: none
    core: int  # percent, 0: none
    leaves_at: int


def workload(pods: int, seed: int) -> list[Arrival]:
    """``pods`` arrivals, one per step; each stays 8 to 32 steps (about 85 % of the node's memory in use)."""
    rng = random.Random(seed)
    out = []
    for step in range(pods):
        kind = rng.random()
        mem = rng.choice(MEM_SIZES) if kind < 0.9 else 0
        core = rng.choice(CORE_SIZES) if kind >= 0.2 else 0
        out.append(Arrival(step, f"pod-{step:03d}", mem, core, step + rng.randint(8, 32)))
    return out


@dataclass
class Run:
    placement: str
    pods: int = 0
    admitted: int = 0
    no_room: int = 0
    refused: int = 0  # fragmentation: admission failed though the node had room in total
    split: int = 0  # memory and core on different cards: refused at bind
    split_no_card: int = 0  # of those, pods no single card had room for
    refused_no_card: int = 0  # of the refused, pods no single card had room for
    spanned: int = 0  # memory over more than one card
    overcommits: int = 0
    allocate_ms: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    labelled: int = 0  # pods registered at the end whose series carry their pod, namespace and container
    running_at_end: int = 0  # of the pods running at the end, those whose container arbiterd registered
    label_problems: list[str] = field(default_factory=list)
    register_refused: list[str] = field(default_factory=list)  # pods whose container arbiterd refused

    @property
    def cannot_run(self) -> int:
        return self.refused + self.split

    @property
    def refused_with_room(self) -> int:
        """Pods that could not run although one card had room for all of them."""
        return self.cannot_run - self.split_no_card - self.refused_no_card


def cards(pod: Pod, resource: str) -> set[str]:
    return {d.rsplit("-", 2)[0] for c in pod.containers for d in c.devices.get(resource, [])}


def is_split(pod: Pod) -> bool:
    """Its memory and core percentage on different cards: arbiterd refuses its container."""
    mem_cards, core_cards = cards(pod, MEM), cards(pod, CORE)
    return bool(mem_cards and core_cards and not core_cards <= mem_cards)


def overcommitted(admin: AdminClient) -> int:
    node = admin.node()
    return sum(1 for c in node.cards if c.alloc_mem > c.total_mem or c.alloc_core > 100)


def replay(placement: str, arrivals: list[Arrival], root: Path) -> Run:
    """The arrivals on a fresh node (arbiterd, fake kubelet, plugin) under ``placement``."""
    root.mkdir(parents=True)
    run = Run(placement)
    with node_daemon(root / "d", f"{GPUS}x{GIB_PER_GPU}GiB") as daemon:
        node = Node(root, daemon)
        try:
            node.start_plugin(placement=placement, poll_interval_s=0.2, watch_interval_s=0.2)
            admin = node.admin()
            uuids = [c.uuid for c in admin.node().cards]
            live: dict[str, tuple[Arrival, Pod]] = {}
            for a in arrivals:
                for name, (b, pod) in sorted(live.items()):
                    if b.leaves_at <= a.step:
                        node.kubelet.delete(pod)
                        del live[name]
                        run.overcommits += overcommitted(admin)
                arrive(node, a, live, uuids, run)
                run.overcommits += overcommitted(admin)
            run.allocate_ms = [s * 1000 for s in node.kubelet.allocate_seconds]
            start = node.kubelet.start_container
            running = [k8s_labels.Expected(NAMESPACE, b.name, "c0", functools.partial(start, pod))
                       for b, pod in live.values() if not is_split(pod)]
            got = k8s_labels.check(admin, running)
            run.labelled, run.running_at_end = got.labelled, got.registered
            run.label_problems, run.register_refused = got.problems, got.refused
        finally:
            node.close()
    return run


def arrive(node: Node, a: Arrival, live: dict[str, tuple[Arrival, Pod]], uuids: list[str], run: Run) -> None:
    """Admit pod ``a`` beside the ``live`` ones, and count in ``run`` what became of it."""
    run.pods += 1
    used: dict[str, list[int]] = {}
    for _, p in live.values():
        for resource, k in ((MEM, 0), (CORE, 1)):
            for d in (d for c in p.containers for d in c.devices.get(resource, [])):
                used.setdefault(d.rsplit("-", 2)[0], [0, 0])[k] += 1
    one_card = any(GIB_PER_GPU - u[0] >= a.mem and 100 - u[1] >= a.core
                   for u in [used.get(uuid, [0, 0]) for uuid in uuids])
    free_mem = GPUS * GIB_PER_GPU - sum(b.mem for b, _ in live.values())
    free_core = GPUS * 100 - sum(b.core for b, _ in live.values())
    requests = {r: n for r, n in ((MEM, a.mem), (CORE, a.core)) if n}
    try:
        pod = node.kubelet.admit(a.name, [requests], namespace=NAMESPACE)
    except AdmissionError as exc:
        if a.mem > free_mem or a.core > free_core:
            run.no_room += 1
        else:
            run.refused += 1
            run.refused_no_card += not one_card
            key = str(exc).split(": ", 2)[-1][:60]
            run.reasons[key] = run.reasons.get(key, 0) + 1
        return
    run.admitted += 1
    live[a.name] = (a, pod)
    run.spanned += len(cards(pod, MEM)) > 1
    if is_split(pod):
        run.split += 1
        run.split_no_card += not one_card


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.k8s", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON document before the summary line")
    parser.add_argument("--pods", type=int, default=200, help="pod arrivals (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="workload seed (default 7)")
    parser.add_argument("--dra", action="store_true",
                        help="also replay the arrivals through the DRA plugin and compare (section k8s-dra)")
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    arrivals = workload(args.pods, args.seed)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bk-", dir="/tmp"))  # short: UNIX socket paths
    try:
        runs = [replay(p, arrivals, tmp / p) for p in ("binpack", "spread")]
        dra = replay_dra(arrivals, tmp / "dra", GPUS, GIB_PER_GPU) if args.dra else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    if dra is not None:
        return report_dra(args, argv, runs, dra)
    all_ms = [ms for r in runs for ms in r.allocate_ms]
    p99 = percentile(all_ms, 0.99)
    header = (f"{'placement':9} {'pods':>5} {'admitted':>8} {'no room':>7} {'refused':>7} {'split':>5} "
              f"{'(no card)':>9} {'spanned':>7} {'overcommits':>11} {'alloc p50 ms':>12} {'p99 ms':>7} "
              f"{'labelled':>8}")
    rows = [f"{r.placement:9} {r.pods:5d} {r.admitted:8d} {r.no_room:7d} {r.refused:7d} {r.split:5d} "
            f"{r.split_no_card:9d} {r.spanned:7d} {r.overcommits:11d} {statistics.median(r.allocate_ms or [0]):12.2f} "
            f"{percentile(r.allocate_ms, 0.99):7.2f} {f'{r.labelled}/{r.running_at_end}':>8}" for r in runs]
    pods = runs[0].pods
    overcommits = sum(r.overcommits for r in runs)
    summary = (f"pods={pods} overcommits={overcommits} binpack_refused={runs[0].cannot_run} "
               f"spread_refused={runs[1].cannot_run} allocate_p99_ms={p99:.2f} {labelled_field(runs)}")
    if args.json:
        print(json.dumps({"arbiter": "arbiterd", "seed": args.seed,
                          "gpus": f"{GPUS}x{GIB_PER_GPU}GiB",
                          "runs": [{**{k: v for k, v in asdict(r).items()
                                       if k not in ("allocate_ms", "label_problems", "register_refused")},
                                    "cannot_run": r.cannot_run,
                                    "allocate_p50_ms": round(statistics.median(r.allocate_ms or [0]), 3),
                                    "allocate_p99_ms": round(percentile(r.allocate_ms, 0.99), 3)} for r in runs]},
                         indent=2))
    print(header)
    print("\n".join(rows))
    note = ("refused: admission failed with room in total; split: memory and core on different cards (arbiterd "
            "refuses the container at bind); (no card): of those, pods no single card had room for; spanned: "
            "memory over several cards; labelled: of the pods running at the end whose container registered, those "
            "whose every series carries its namespace, pod and container")
    print(note)
    print_label_problems(runs)
    if not args.no_results:
        from bench import results

        cmd = "python -m bench.k8s " + " ".join(argv if argv is not None else sys.argv[1:])
        body = (f"{pods} pod arrivals (seed {args.seed}) on {GPUS}x{GIB_PER_GPU}GiB, once per placement "
                f"({args.load}: latencies grow with the machine's load).\n\n```\n"
                f"{header}\n" + "\n".join(rows) + f"\n```\n{note}\n\n{summary}\n")
        results.update("k8s", cmd.strip(), body)
    print(summary)
    return 0 if overcommits == 0 and all_labelled(runs) else 1


def labelled_field(runs: list[Any]) -> str:
    """``pods_labelled=N/M`` over ``runs`` (Run or DraRun)."""
    return f"pods_labelled={sum(r.labelled for r in runs)}/{sum(r.running_at_end for r in runs)}"


def all_labelled(runs: list[Any]) -> bool:
    return all(r.labelled == r.running_at_end for r in runs)


def print_label_problems(runs: list[Any]) -> None:
    for r in runs:
        for line in r.label_problems:
            print(f"not labelled: {line}", file=sys.stderr)
        for line in r.register_refused:
            print(f"registration refused (no series to label): {line}")


DRA_CAVEAT = ("The DRA row shows the model of kube-scheduler's allocator (`cgpu_testing/drasched.py`), not "
              "kube-scheduler itself. Its split is 0 by construction: one request is one device, so a claim's memory "
              "and cores are on one card. Its refused with room uses the same first-fit accounting as the model that "
              "placed the pods, so 0 there shows that the plugin prepares whatever the model places, not that "
              "kube-scheduler never refuses a pod with room (its scoring, other pods' constraints and races are not "
              "modelled). Measured for real: the NodePrepareResources latency, and overcommits in arbiterd's own "
              "status.")

def report_dra(args: argparse.Namespace, argv: list[str] | None, runs: list[Run], dra: DraRun) -> int:
    """Print (and record) the DRA run beside the device plugin's runs; exit 1 on any overcommit."""
    header = (f"{'path':18} {'pods':>5} {'running':>7} {'split':>5} {'refused with room':>17} {'no card':>7} "
              f"{'no room':>7} {'overcommits':>11} {'p50 ms':>7} {'p99 ms':>7} {'labelled':>8}")
    rows = [f"{'plugin ' + r.placement:18} {r.pods:5d} {r.admitted - r.split:7d} {r.split:5d} "
            f"{r.refused_with_room:17d} {r.split_no_card + r.refused_no_card:7d} {r.no_room:7d} "
            f"{r.overcommits:11d} {statistics.median(r.allocate_ms or [0]):7.2f} "
            f"{percentile(r.allocate_ms, 0.99):7.2f} {f'{r.labelled}/{r.running_at_end}':>8}" for r in runs]
    rows.append(f"{'DRA':18} {dra.pods:5d} {dra.admitted - dra.split:7d} {dra.split:5d} {dra.refused_with_room:17d} "
                f"{dra.no_card:7d} {dra.no_room:7d} {dra.overcommits:11d} {dra.p50:7.2f} {dra.p99:7.2f} "
                f"{f'{dra.labelled}/{dra.running_at_end}':>8}")
    note = ("running: admitted and not split; split: memory and cores on different cards (arbiterd refuses the "
            "container at bind); refused with room: not running though one card had room for all of it; no card: "
            "not running, room on the node in total but on no single card; p50/p99: kubelet-side Allocate "
            "(plugin) or NodePrepareResources (DRA) latency against the real arbiterd; labelled: of the pods running "
            "at the end whose container registered, those whose every series carries its namespace, pod and "
            "container. Requests and limits: every other DRA claim asking cores carries a ShareConfig limit of "
            f"twice its request (at most 100): {len(dra.limited)} claims; of those running at the end whose "
            f"container registered, {dra.limits_in_force} of {dra.limits_running} hold that limit in arbiterd")
    summary = (f"dra_pods={dra.pods} dra_split={dra.split} dra_refused_with_room={dra.refused_with_room} "
               f"dra_overcommits={dra.overcommits} plugin_split={runs[0].split} prepare_p99_ms={dra.p99:.2f} "
               f"{labelled_field([*runs, dra])} dra_limits={dra.limits_in_force}/{dra.limits_running}")
    if args.json:
        print(json.dumps({"arbiter": "arbiterd", "seed": args.seed, "gpus": f"{GPUS}x{GIB_PER_GPU}GiB",
                          "plugin": [{"placement": r.placement, "pods": r.pods, "admitted": r.admitted,
                                      "split": r.split, "refused_with_room": r.refused_with_room,
                                      "cannot_run": r.cannot_run, "overcommits": r.overcommits,
                                      "labelled": r.labelled, "running_at_end": r.running_at_end,
                                      "allocate_p99_ms": round(percentile(r.allocate_ms, 0.99), 3)} for r in runs],
                          "dra": {**{k: v for k, v in asdict(dra).items()
                                     if k not in ("prepare_ms", "label_problems", "register_refused", "limited")},
                                  "prepare_p50_ms": round(dra.p50, 3), "prepare_p99_ms": round(dra.p99, 3)}},
                         indent=2))
    print(header)
    print("\n".join(rows))
    print(note)
    print_label_problems([*runs, dra])
    for line in dra.limit_problems:
        print(f"limit not in force: {line}", file=sys.stderr)
    if not args.no_results:
        from bench import results

        cmd = "python -m bench.k8s " + " ".join(argv if argv is not None else sys.argv[1:])
        body = (f"{dra.pods} pod arrivals (seed {args.seed}) on {GPUS}x{GIB_PER_GPU}GiB, the same sequence through "
                "the device plugin (binpack, spread) and through DRA (the DRA plugin, a model of kube-scheduler's "
                "allocator with consumable capacity: first device that fits). arbiterd at its defaults plus "
                f"`--allocations required`; a DRA pod naming no memory consumes the 1Gi default ({args.load}: "
                "latencies grow with the machine's load).\n\n"
                f"{DRA_CAVEAT}\n\n```\n"
                f"{header}\n" + "\n".join(rows) + f"\n```\n{note}\n\n{summary}\n")
        results.update("k8s-dra", cmd.strip(), body)
    print(summary)
    ok = dra.overcommits == 0 and all(r.overcommits == 0 for r in runs) and all_labelled([*runs, dra])
    return 0 if ok and dra.limits_in_force == dra.limits_running else 1


if __name__ == "__main__":
    sys.exit(main())
