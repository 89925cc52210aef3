"""Prometheus metrics, read from live state at every scrape.

Per-GPU and per-instance settings are exported as gauges named after the
settings table (``cgpu_gpu_<setting>``, ``cgpu_instance_<setting>``), those in
ms in seconds (``cgpu_gpu_overrun_seconds``).

Every per-instance series carries, beside ``gpu`` and ``instance``, the GPU's
``UUID`` and ``modelName`` and the instance's ``namespace``, ``pod`` and
``container``, named as dcgm-exporter names them (its collector's ``UUID`` and
``modelName``, its transformation/const.go ``pod``, ``namespace``, ``container``),
so a dashboard built for dcgm-exporter joins on them. The pod labels come from the
allocation a plugin made for the container (``alloc_ctl``), never from the
container; an instance that is no pod's (a host process, a container with no such
allocation) has them empty, which Prometheus reads as absent. They are a function
of the instance, so they add no series: there is one per live instance record.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from arbiterd.core.accounting import BUCKETS
from arbiterd.core.settings import GPU, INSTANCE
from arbiterd.server.hub import Hub
from arbiterd.server.status import DaemonStatus, GpuStatus

INSTANCE_GAUGES = ("weight", "highprio")  # memsize is exported as the effective limit, below
INSTANCE_LABELS = ["gpu", "instance", "UUID", "modelName", "namespace", "pod", "container"]
POD_KEYS = ("namespace", "pod", "container")


def instance_labels(gpu: GpuStatus, instance: str, pod: dict[str, str] | None) -> list[str]:
    """The values of :data:`INSTANCE_LABELS` for ``instance`` on ``gpu``; the pod's empty where it has none."""
    return [str(gpu.index), instance, gpu.uuid, gpu.name, *((pod or {}).get(k, "") for k in POD_KEYS)]


def metric_name(setting: str) -> str:
    """A setting's gauge name: Prometheus wants base units, so ``overrun_ms`` is ``overrun_seconds``."""
    return setting[:-3] + "_seconds" if setting.endswith("_ms") else setting


class ArbiterCollector(Collector):
    """Every metric, from the hub's status document and hand-over meters at each scrape."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        doc = self.hub.status()
        yield from _gpu_metrics(doc, self.hub.handover_meters())
        yield from _instance_metrics(doc)
        yield from _limit_metrics(doc)
        yield from _gang_metrics(doc)
        yield from _containment_metrics(doc)
        yield from _client_metrics(self.hub)


def _gpu_metrics(doc: DaemonStatus, meters: dict[int, tuple[list[int], int]]) -> Iterator[Metric]:
    g_ = ["gpu"]
    busy = CounterMetricFamily("cgpu_gpu_busy_seconds", "Time some lease was held on the GPU", labels=g_)
    settings = {name: GaugeMetricFamily(f"cgpu_gpu_{metric_name(name)}", f"GPU setting {name}: {s.help}"
                                        + (" (in seconds)" if name.endswith("_ms") else "")
                                        + "".join(f" ({i} {c})" for i, c in enumerate(s.choices)), labels=g_)
                for name, s in GPU.items() if s.kind != "auto"}
    free_w = GaugeMetricFamily("cgpu_gpu_free_weight", "max_inst minus the sum of weights", labels=g_)
    total = GaugeMetricFamily("cgpu_gpu_memory_total_bytes", "Device memory", labels=g_)
    alloc_mem = GaugeMetricFamily("cgpu_gpu_allocated_memory_bytes", "Memory held by allocations (alloc_ctl)",
                                  labels=g_)
    alloc_core = GaugeMetricFamily("cgpu_gpu_allocated_core_percent", "GPU-core percent held by allocations",
                                   labels=g_)
    grants = CounterMetricFamily("cgpu_grants", "Leases granted", labels=g_)
    revokes = CounterMetricFamily("cgpu_revocations", "Leases revoked, by reason (overrun: cut off after "
                                  "overrunning by more than overrun_ms)", labels=["gpu", "reason"])
    fair = GaugeMetricFamily("cgpu_gpu_fairness_error_ratio", "Over the last 60 s, the largest |delivered - "
                             "owed| share among the instances with demand (0.05 = 5 points)", labels=g_)
    overruns = CounterMetricFamily("cgpu_overruns", "Leases cut off after overrunning their deadline "
                                   "by more than overrun_ms", labels=g_)
    slice_s = GaugeMetricFamily("cgpu_gpu_slice_seconds", "The slice in force (slice_ms, or what auto chose)",
                                labels=g_)
    round_s = GaugeMetricFamily("cgpu_gpu_round_seconds", "The round in force: one turn of every instance that "
                                "takes turns (slice_ms auto cuts the slice to fit latency_target_ms)", labels=g_)
    handover = HistogramMetricFamily("cgpu_gpu_handover_seconds", "What each hand-over cost: the part of a "
                                     "lease nobody could use (transit, wake-up, warm-up)", labels=g_)
    parts = GaugeMetricFamily("cgpu_gpu_handover_part_seconds", "Where the last hand-overs went, on average "
                              "(unclamped): transit (the daemon and the messages) or warmup (the clients' wake-up "
                              "and slow first operations)", labels=[*g_, "part"])
    for g in doc.gpus:
        lg = [str(g.index)]
        busy.add_metric(lg, g.busy_seconds)
        for name, family in settings.items():
            value = g.settings[name]
            value = GPU[name].choices.index(value) if isinstance(value, str) else value
            family.add_metric(lg, float(value) / (1000 if name.endswith("_ms") else 1))
        free_w.add_metric(lg, g.free_weight)
        total.add_metric(lg, g.total_mem)
        alloc_mem.add_metric(lg, g.alloc_mem)
        alloc_core.add_metric(lg, g.alloc_core)
        slice_s.add_metric(lg, g.slice_effective_ms / 1e3)
        round_s.add_metric(lg, g.round_ms / 1e3)
        counts, sum_ns = meters[g.index]
        acc, buckets = 0, []
        for bound, n in zip(BUCKETS, counts, strict=True):
            acc += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        handover.add_metric(lg, buckets, sum_ns / 1e9)
        parts.add_metric([*lg, "transit"], g.handover_transit_ms / 1e3)
        parts.add_metric([*lg, "warmup"], g.handover_warmup_ms / 1e3)
        grants.add_metric(lg, g.grants)
        for reason, n in g.revoked.items():
            revokes.add_metric([str(g.index), reason], n)
        if g.fairness_error_pp["60s"] is not None:
            fair.add_metric(lg, g.fairness_error_pp["60s"] / 100)
        overruns.add_metric(lg, g.overruns)
    yield from (busy, *settings.values(), slice_s, round_s, handover, parts, free_w, total, alloc_mem, alloc_core,
                grants, revokes, overruns, fair)


def _containment_metrics(doc: DaemonStatus) -> Iterator[Metric]:
    """What NVML shows that bypasses cgpu (arbiterd/server/watch.py); nothing where NVML is not polled."""
    gi, g_ = INSTANCE_LABELS, ["gpu"]
    procs = GaugeMetricFamily("cgpu_unmanaged_processes", "Processes with a context on the GPU that are not "
                              "clients of cgpu (allow-listed ones not counted)", labels=gi)
    mem = GaugeMetricFamily("cgpu_unmanaged_memory_bytes", "GPU memory of those processes (NVML)", labels=gi)
    nvml = GaugeMetricFamily("cgpu_instance_nvml_memory_bytes", "GPU memory of every process of the instance, as "
                             "NVML counts it (contexts included)", labels=gi)
    kills = CounterMetricFamily("cgpu_kills", "Processes killed, by reason (unmanaged: unmanaged = kill; memory: "
                                "memory_enforce = kill)", labels=["gpu", "reason"])
    breaches = CounterMetricFamily("cgpu_memory_breaches", "Instances over their memory limit (NVML) past "
                                   "memory_grace_ms", labels=g_)
    for g in doc.gpus:
        lg = str(g.index)
        by: dict[str, tuple[int, int]] = {}
        for u in g.unmanaged_processes:
            n, b = by.get(u.instance, (0, 0))
            by[u.instance] = (n + 1, b + u.mem_used)
        for inst, (n, b) in sorted(by.items()):
            procs.add_metric(instance_labels(g, inst, doc.pod_labels.get(inst)), n)
            mem.add_metric(instance_labels(g, inst, doc.pod_labels.get(inst)), b)
        for inst, b in sorted(g.nvml_memory.items()):
            nvml.add_metric(instance_labels(g, inst, doc.pod_labels.get(inst)), b)
        kills.add_metric([lg, "unmanaged"], g.unmanaged_kills)
        kills.add_metric([lg, "memory"], g.memory_kills)
        breaches.add_metric([lg], g.memory_breaches)
    yield from (procs, mem, nvml, kills, breaches)


def _instance_metrics(doc: DaemonStatus) -> Iterator[Metric]:
    gi = INSTANCE_LABELS
    held = CounterMetricFamily("cgpu_instance_held_seconds", "Time the instance held the GPU", labels=gi)
    delivered = CounterMetricFamily("cgpu_instance_delivered_seconds", "Useful GPU time delivered: time held, "
                                    "less the hand-overs it was not billed for", labels=gi)
    entitled = CounterMetricFamily("cgpu_instance_entitled_seconds", "GPU time the instance was entitled to "
                                   "by its policy, settings and the demand of the others", labels=gi)
    demand = CounterMetricFamily("cgpu_instance_demand_seconds", "Time the instance wanted the GPU "
                                 "(waiting for or holding a lease)", labels=gi)
    inst = {name: GaugeMetricFamily(f"cgpu_instance_{name}", f"Instance setting {name}: {INSTANCE[name].help}",
                                    labels=gi) for name in INSTANCE_GAUGES}
    used = GaugeMetricFamily("cgpu_instance_memory_used_bytes", "Reserved device memory", labels=gi)
    limit = GaugeMetricFamily("cgpu_instance_memory_limit_bytes", "Memory limit", labels=gi)
    waits = {q: GaugeMetricFamily(f"cgpu_instance_grant_wait_{q}_seconds", f"The {q} of the instance's grant waits "
                                  "(acquire to grant) over the last minute; absent when nothing was granted in it",
                                  labels=gi) for q in ("p50", "p99")}
    for g in doc.gpus:
        for i in g.instances:
            li = instance_labels(g, i.id, i.labels)
            held.add_metric(li, i.held_seconds)
            delivered.add_metric(li, i.delivered_seconds)
            entitled.add_metric(li, i.entitled_seconds)
            demand.add_metric(li, i.demand_seconds)
            inst["weight"].add_metric(li, i.weight)
            inst["highprio"].add_metric(li, i.highprio)
            used.add_metric(li, i.mem_used)
            limit.add_metric(li, i.mem_limit)
            for q, ms in (("p50", i.wait_p50_ms), ("p99", i.wait_p99_ms)):
                if ms is not None:
                    waits[q].add_metric(li, ms / 1e3)
    yield from (held, delivered, entitled, demand, *inst.values(), used, limit, *waits.values())


def _limit_metrics(doc: DaemonStatus) -> Iterator[Metric]:
    """Each instance's limit and its throttled time (named after cAdvisor's
    ``container_cpu_cfs_throttled_seconds_total``)."""
    gi = ["gpu", "instance"]
    limit = GaugeMetricFamily("cgpu_instance_limit", f"Instance setting limit: {INSTANCE['limit'].help}", labels=gi)
    throttled = CounterMetricFamily("cgpu_instance_throttled_seconds", "Time the instance waited for the GPU with "
                                    "its limit's quota for the period spent", labels=gi)
    for g in doc.gpus:
        for i in g.instances:
            li = [str(g.index), i.id]
            limit.add_metric(li, i.limit)
            throttled.add_metric(li, i.throttled_seconds)
    yield from (limit, throttled)


def _gang_metrics(doc: DaemonStatus) -> Iterator[Metric]:
    """Gangs (behaviour §11): which instances are one, their collective spin (the daemon's view and the shim's), and
    each GPU's aligned idle."""
    gi = ["gpu", "instance"]
    member = GaugeMetricFamily("cgpu_instance_gang_gpus", "The number of GPUs of the gang the instance is one GPU of "
                               "(0: in none)", labels=gi)
    spin = CounterMetricFamily("cgpu_instance_gang_spin_seconds", "Collective spin as far as the daemon sees it: "
                               "time the instance held the GPU past its gang turn's deadline while a peer waited "
                               "for the next turn", labels=gi)
    shim = CounterMetricFamily("cgpu_instance_gang_shim_spin_seconds", "Collective spin as far as the instance's "
                               "processes (libcgpu.so) see it, in a gang or not: time its collective kernels on the "
                               "GPU waited for the last peer rank's launch of the same collective, each instant once "
                               "(from launches: an upper bound where its queue was backed up)", labels=gi)
    turns = CounterMetricFamily("cgpu_gpu_gang_turns", "Gang turns granted on the GPU", labels=["gpu"])
    idle = CounterMetricFamily("cgpu_gpu_gang_idle_seconds", "Time the GPU idled for a gang's alignment, with "
                               "nobody to fill the wait for its peers", labels=["gpu"])
    for g in doc.gpus:
        turns.add_metric([str(g.index)], g.gang_turns)
        idle.add_metric([str(g.index)], g.gang_idle_seconds)
        for i in g.instances:
            li = [str(g.index), i.id]
            member.add_metric(li, len(i.gang) if i.gang else 0)
            spin.add_metric(li, i.gang_spin_seconds)
            shim.add_metric(li, i.gang_shim_spin_seconds)
    yield from (member, spin, shim, turns, idle)


def _client_metrics(hub: Hub) -> Iterator[Metric]:
    c = hub.counters
    yield HistogramMetricFamily(
        "cgpu_grant_latency_seconds", "Time from acquire to grant",
        buckets=[("+Inf" if b == float("inf") else repr(b), n) for b, n in c.cumulative_buckets()],
        sum_value=c.grant_latency_sum)
    clients = GaugeMetricFamily("cgpu_clients", "Connected clients")
    clients.add_metric([], len(hub.peers))
    yield clients
    bad = CounterMetricFamily("cgpu_bad_frames", "Connections closed for a malformed frame")
    bad.add_metric([], c.bad_frames)
    yield bad
    refused = CounterMetricFamily("cgpu_clients_refused", "Connections refused or closed to protect the other "
                                  "clients, by reason (identity: who it is could not be told; busy: max_clients; "
                                  "uid, instance: that tenant's cap; unread: replies left unread past "
                                  "max_unread_bytes; idle: never registered)", labels=["reason"])
    for reason, n in c.refused.items():
        refused.add_metric([reason], n)
    yield refused
