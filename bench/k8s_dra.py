"""bench.k8s's DRA run: the same arrivals and departures through the DRA plugin and the scheduler model.

A fresh arbiterd (``--sim-gpus 8x16GiB``, allocations required), the fake API server, the DRA
plugin in this process publishing the node's ResourceSlice, the fake DRA kubelet, and the
model of kube-scheduler's allocator (cgpu_testing/drasched.py: first device that fits, consumed
capacity rounded by the request policy, never past a capacity). Each pod is one ResourceClaim
asking one device with ``capacity.requests`` ``memory`` (GiB) and ``cores`` (percent); a pod
that names no memory consumes the device's default, 1 GiB. Allocated, it is prepared through
``NodePrepareResources`` (timed, kubelet side); leaving, unprepared and deleted. Every other claim
that asks cores carries a ShareConfig ``limit`` of twice its request (at most 100): a request and a
limit (behaviour §3); at the end, each such pod still running registers its container, and its
instance in arbiterd must hold that limit.

What is counted for each pod, as for the device plugin's runs (:mod:`bench.k8s`):
``split``: its memory and cores on different cards (arbiterd's allocations of the claim);
``refused with room``: not running although one card had room for all of it;
``no card``: not running, with room on the node in total but on no single card (the device
plugin spans memory over cards there; one DRA device cannot); ``no room``: not even in total.
After every event, a card whose allocated memory or cores pass its total, in arbiterd's status
or in the claims' consumed capacity, counts as an overcommit.

What this can and cannot show: the placement is the model's, not kube-scheduler's. ``split`` is
0 by construction (one request, one device), and ``refused with room`` is judged with the same
first-fit view of the cards the model allocates from, so both check that the plugin prepares
what the model places; the latency and arbiterd's overcommit check are real measurements.
"""

from __future__ import annotations

import functools
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import k8s_labels
from bench.common import percentile
from cgpu_device_plugin.admin import AdminClient
from cgpu_dra_plugin.quantity import parse
from cgpu_testing.dra import DraNode
from cgpu_testing.drakubelet import PrepareFailed
from cgpu_testing.drasched import Unschedulable, claim, consumed_so_far
from cgpu_testing.k8s import node_daemon

log = logging.getLogger("bench.k8s")
GIB = 1 << 30


@dataclass
class DraRun:
    pods: int = 0
    admitted: int = 0
    no_room: int = 0
    no_card: int = 0
    refused_with_room: int = 0
    split: int = 0
    overcommits: int = 0
    prepare_ms: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    labelled: int = 0  # pods registered at the end whose series carry their pod, namespace and container
    running_at_end: int = 0  # of the pods running at the end, those whose container arbiterd registered
    label_problems: list[str] = field(default_factory=list)
    limited: dict[str, int] = field(default_factory=dict)  # pod -> the limit its claim's ShareConfig asked
    limits_running: int = 0  # limited pods running at the end whose container registered
    limits_in_force: int = 0  # of those, the ones whose instance holds that limit in arbiterd
    limit_problems: list[str] = field(default_factory=list)
    register_refused: list[str] = field(default_factory=list)  # pods whose container arbiterd refused

    @property
    def p50(self) -> float:
        return statistics.median(self.prepare_ms or [0.0])

    @property
    def p99(self) -> float:
        return percentile(self.prepare_ms, 0.99)


def _free(node: DraNode) -> list[tuple[int, int]]:
    """Per device: (free memory bytes, free cores), from the slice and the allocated claims."""
    (s,) = node.slices()
    used = consumed_so_far(node.api.list("resourceclaims"))
    out = []
    for d in s["spec"]["devices"]:
        mine = next((u for k, u in used.items() if k.device == d["name"]), {})
        out.append((parse(d["capacity"]["memory"]["value"]) - mine.get("memory", 0),
                    parse(d["capacity"]["cores"]["value"]) - mine.get("cores", 0)))
    return out


def _overcommitted(node: DraNode, admin: AdminClient) -> int:
    daemon = sum(1 for c in admin.node().cards if c.alloc_mem > c.total_mem or c.alloc_core > 100)
    claims = sum(1 for mem, core in _free(node) if mem < 0 or core < 0)
    return daemon + claims


def replay_dra(arrivals: list[Any], root: Path, gpus: int, gib_per_gpu: int) -> DraRun:
    """The arrivals (bench.k8s.Arrival) on a fresh DRA node."""
    root.mkdir(parents=True)
    run = DraRun()
    with node_daemon(root / "d", f"{gpus}x{gib_per_gpu}GiB") as daemon:
        node = DraNode(root, daemon)
        try:
            node.start_plugin(poll_interval_s=0.2)
            admin = node.admin()
            live: dict[str, tuple[Any, dict[str, Any]]] = {}
            for a in arrivals:
                for name, (b, c) in sorted(live.items()):
                    if b.leaves_at <= a.step:
                        node.delete(c)
                        del live[name]
                        run.overcommits += _overcommitted(node, admin)
                _arrive(node, admin, a, live, run)
                run.overcommits += _overcommitted(node, admin)
            run.prepare_ms = [s * 1000 for s in node.kubelet.prepare_seconds]
            running = []
            for _, c in live.values():
                cdi_ids = node.prepare(c)  # prepared already: the plugin answers from its checkpoint
                running.append(k8s_labels.Expected(
                    c["metadata"].get("namespace", "default"), c["status"]["reservedFor"][0]["name"], "main",
                    functools.partial(node.kubelet.start_container, node.pod_uid(c), cdi_ids)))
            got = k8s_labels.check(admin, running)
            run.labelled, run.running_at_end = got.labelled, got.registered
            run.label_problems, run.register_refused = got.problems, got.refused
            _check_limits(admin, run, got.pods)
        finally:
            node.close()
    return run


def limit_for(a: Any) -> int:
    """The ceiling every other claim with cores asks beside its request (its ShareConfig ``limit``): twice the
    request, at most 100; 0 for the rest, which keep their core percentage as a hard cap."""
    return min(100, 2 * a.core) if a.core and a.step % 2 == 0 else 0


def _check_limits(admin: AdminClient, run: DraRun, registered: frozenset[str]) -> None:
    """Count the limited pods whose container registered, and those whose instance holds the claim's limit."""
    held = {i["labels"]["pod"]: i.get("limit") for g in admin.status()["gpus"] for i in g["instances"]
            if i.get("labels")}
    for pod, want in sorted(run.limited.items()):
        if pod not in registered:
            continue
        run.limits_running += 1
        if held.get(pod) == want:
            run.limits_in_force += 1
        else:
            run.limit_problems.append(f"{pod}: limit {held.get(pod)} in arbiterd, {want} asked")


def _arrive(node: DraNode, admin: AdminClient, a: Any, live: dict[str, tuple[Any, dict[str, Any]]],
            run: DraRun) -> None:
    run.pods += 1
    mem = (a.mem or 1) * GIB  # a claim naming no memory consumes the default, 1Gi
    free = _free(node)
    one_card = any(m >= mem and c >= a.core for m, c in free)
    in_total = sum(max(m, 0) for m, _ in free) >= mem and sum(max(c, 0) for _, c in free) >= a.core
    limit = limit_for(a)
    config = {"apiVersion": "gpu.cgpu.io/v1alpha1", "kind": "ShareConfig", "limit": limit} if limit else None
    want = claim(a.name.replace("_", "-"), memory=f"{a.mem}Gi" if a.mem else None, cores=a.core or None,
                 config=config)
    try:
        c = node.schedule(want)
        node.prepare(c)
    except (Unschedulable, PrepareFailed) as exc:
        if isinstance(exc, PrepareFailed):
            stored = node.api.get("resourceclaims", want["metadata"]["name"], "default")
            if stored is not None:
                node.delete(stored)
        if one_card:
            run.refused_with_room += 1
            key = str(exc)[:60]
            run.reasons[key] = run.reasons.get(key, 0) + 1
        elif in_total:
            run.no_card += 1
        else:
            run.no_room += 1
        return
    run.admitted += 1
    live[a.name] = (a, c)
    if limit:
        run.limited[c["status"]["reservedFor"][0]["name"]] = limit
    uid = c["metadata"]["uid"]
    assert node.plugin is not None
    gpus = {d.gpu for r in node.plugin.preparer.prepared() if r.uid == uid for d in r.devices}
    run.split += len(gpus) > 1
