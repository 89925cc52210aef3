"""An instance's limit and throttled time in status, the metrics and cgpu-smi (behaviour §3, requests and limits)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from arbiterd.core.settings import InstanceSettings
from arbiterd.server.hub import Hub
from arbiterd.server.metrics import ArbiterCollector
from arbiterd.tools import smi


def test_limit_and_throttled_seconds_everywhere(hub: Hub) -> None:
    arb = hub.arbiter
    arb.scheds[0].set("max_inst", 20, 0)
    arb.scheds[0].set("policy", 4, 0)
    arb.provision("a", [0], InstanceSettings(weight=6, limit=60), 0)
    inst = arb.scheds[0].instances["a"]
    inst.throttled_ns = 1_500_000_000  # as if it had waited 1.5 s with its quota spent
    reg = CollectorRegistry()
    reg.register(ArbiterCollector(hub))
    labels = {"gpu": "0", "instance": "a"}
    assert reg.get_sample_value("cgpu_instance_limit", labels) == 60
    assert reg.get_sample_value("cgpu_instance_throttled_seconds_total", labels) == 1.5
    doc = hub.status().to_json()
    row = next(i for i in doc["gpus"][0]["instances"] if i["id"] == "a")
    assert (row["limit"], row["throttled_seconds"]) == (60, 1.5)
    assert "LIMIT 60 %, throttled 1.5 s" in smi.render(doc)
