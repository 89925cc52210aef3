"""Prometheus metrics, read from live state at every scrape."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from arbiterd.server.daemon import Daemon


class ArbiterCollector(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        arb = d.arbiter
        now = time.monotonic_ns()
        busy = CounterMetricFamily("cgpu_gpu_busy_seconds", "Time some lease was held on the GPU",
                                   labels=["gpu"])
        policy = GaugeMetricFamily("cgpu_gpu_policy", "Scheduling policy of the GPU (0..5)", labels=["gpu"])
        free_w = GaugeMetricFamily("cgpu_gpu_free_weight", "max_inst minus the sum of weights", labels=["gpu"])
        total = GaugeMetricFamily("cgpu_gpu_memory_total_bytes", "Device memory", labels=["gpu"])
        grants = CounterMetricFamily("cgpu_grants", "Leases granted", labels=["gpu"])
        revokes = CounterMetricFamily("cgpu_revocations", "Leases revoked", labels=["gpu"])
        overruns = CounterMetricFamily("cgpu_overruns", "Leases cut off after overrunning their deadline "
                                       "by more than overrun_ms", labels=["gpu"])
        held = CounterMetricFamily("cgpu_instance_held_seconds", "Time the instance held the GPU",
                                   labels=["gpu", "instance"])
        weight = GaugeMetricFamily("cgpu_instance_weight", "Weight (0: starved)", labels=["gpu", "instance"])
        used = GaugeMetricFamily("cgpu_instance_memory_used_bytes", "Reserved device memory",
                                 labels=["gpu", "instance"])
        limit = GaugeMetricFamily("cgpu_instance_memory_limit_bytes", "Memory limit",
                                  labels=["gpu", "instance"])
        for gpu, sched in sorted(arb.scheds.items()):
            g = str(gpu)
            busy.add_metric([g], sched.busy_ns(now) / 1e9)
            policy.add_metric([g], sched.settings.policy)
            free_w.add_metric([g], sched.free_weight)
            total.add_metric([g], arb.gpus[gpu].total_mem)
            grants.add_metric([g], sched.stats.grants)
            revokes.add_metric([g], sched.stats.revocations)
            overruns.add_metric([g], sched.stats.overruns)
        for (gpu, name), rec in sorted(arb.records.items()):
            labels = [str(gpu), name]
            held.add_metric(labels, arb.scheds[gpu].held_ns(name, now) / 1e9)
            weight.add_metric(labels, arb.scheds[gpu].instances[name].weight)
            used.add_metric(labels, rec.ledger.used)
            limit.add_metric(labels, rec.ledger.limit)
        yield from (busy, policy, free_w, total, grants, revokes, overruns, held, weight, used, limit)
        buckets = []
        acc = 0
        for bound, count in zip(_bounds(), d.grant_buckets, strict=True):
            acc += count
            buckets.append((bound, acc))
        yield HistogramMetricFamily("cgpu_grant_latency_seconds", "Time from acquire to grant",
                                    buckets=buckets, sum_value=d.grant_latency_sum)
        clients = GaugeMetricFamily("cgpu_clients", "Connected clients")
        clients.add_metric([], len(d.connections))
        yield clients
        bad = CounterMetricFamily("cgpu_bad_frames", "Connections closed for a malformed frame")
        bad.add_metric([], d.stats_bad_frames)
        yield bad


def _bounds() -> list[str]:
    from arbiterd.server.daemon import GRANT_LATENCY_BUCKETS

    return ["+Inf" if b == float("inf") else repr(b) for b in GRANT_LATENCY_BUCKETS]
