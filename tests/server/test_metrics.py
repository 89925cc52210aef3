"""The metrics collector on a private registry: live state at every scrape, names from the settings table."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from arbiterd.core.settings import GPU, InstanceSettings
from arbiterd.server.hub import Hub
from arbiterd.server.metrics import ArbiterCollector, metric_name


def registry(hub: Hub) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(ArbiterCollector(hub))
    return reg


def test_a_gauge_per_gpu_setting_and_instance_values(hub: Hub) -> None:
    hub.arbiter.provision("a", [1], InstanceSettings(weight=3, memsize=2**30), 0)
    reg = registry(hub)
    for name, s in GPU.items():
        if s.kind != "auto":  # slice_ms may be auto: the slice in force is cgpu_gpu_slice_seconds
            assert reg.get_sample_value(f"cgpu_gpu_{metric_name(name)}", {"gpu": "0"}) is not None, name
    assert reg.get_sample_value("cgpu_gpu_overrun_seconds", {"gpu": "0"}) == 0.5
    assert reg.get_sample_value("cgpu_gpu_slice_seconds", {"gpu": "0"}) == 0.005
    assert reg.get_sample_value("cgpu_gpu_handover_seconds_count", {"gpu": "0"}) == 0
    for part in ("transit", "warmup"):
        assert reg.get_sample_value("cgpu_gpu_handover_part_seconds", {"gpu": "0", "part": part}) == 0
    hub.arbiter.scheds[0].handover.observe(1_500_000, warmup_ns=1_000_000)  # 0.5 ms of transit, 1 ms warm-up
    assert reg.get_sample_value("cgpu_gpu_handover_part_seconds", {"gpu": "0", "part": "transit"}) == 0.0005
    assert reg.get_sample_value("cgpu_gpu_handover_part_seconds", {"gpu": "0", "part": "warmup"}) == 0.001
    assert reg.get_sample_value("cgpu_gpu_policy", {"gpu": "1"}) == 2  # a weight above 1 made it weighted
    gpu1 = hub.gpus[1]
    labels = {"gpu": "1", "instance": "a", "UUID": gpu1.uuid, "modelName": gpu1.name, "namespace": "", "pod": "",
              "container": ""}  # a host instance: no pod labels (empty is Prometheus's absent)
    assert reg.get_sample_value("cgpu_instance_weight", labels) == 3
    assert reg.get_sample_value("cgpu_instance_memory_limit_bytes", labels) == 2**30
    assert reg.get_sample_value("cgpu_gpu_free_weight", {"gpu": "1"}) == 13


def test_counters_follow_the_hub(hub: Hub) -> None:
    reg = registry(hub)
    hub.counters.granted(30_000)
    hub.counters.bad_frames += 2
    assert reg.get_sample_value("cgpu_grant_latency_seconds_count") == 1
    assert reg.get_sample_value("cgpu_grant_latency_seconds_bucket", {"le": "5e-05"}) == 1
    assert reg.get_sample_value("cgpu_grant_latency_seconds_bucket", {"le": "2.5e-05"}) == 0
    assert reg.get_sample_value("cgpu_bad_frames_total") == 2
    hub.counters.refused["uid"] += 3
    assert reg.get_sample_value("cgpu_clients_refused_total", {"reason": "uid"}) == 3
    assert reg.get_sample_value("cgpu_clients_refused_total", {"reason": "identity"}) == 0
