"""A gang in status, the metrics and cgpu-smi (behaviour §11): its instances and their GPUs marked, its collective
spin as far as the daemon sees it, each GPU's gang turns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
from prometheus_client import CollectorRegistry

from arbiterd.core.effects import NS_PER_MS
from arbiterd.core.settings import InstanceSettings
from arbiterd.server.hub import Hub
from arbiterd.server.metrics import ArbiterCollector
from arbiterd.tools import smi

ROOT = Path(__file__).resolve().parents[2]


def test_a_gang_is_marked_everywhere(hub: Hub) -> None:
    """J, busy on GPUs 0 and 1 (one client on each, as torchrun starts them), is a gang: status lists its GPUs on
    both, the schema holds, cgpu-smi marks it, the metrics count its GPUs and the GPUs' gang turns; A, on GPU 0
    only, is no gang."""
    arb = hub.arbiter
    now = time.monotonic_ns()
    arb.provision("J", [0, 1], InstanceSettings(), now)
    arb.provision("A", [0], InstanceSettings(), now)
    for cid, gpu in ((1, 0), (2, 1)):
        arb.connect(cid, 100 + cid, 0)
        arb.register(cid, "J", [gpu], {}, now)
    arb.connect(3, 103, 0)
    arb.register(3, "A", [0], {}, now)
    arb.acquire(1, 0, now)
    arb.acquire(2, 1, now + NS_PER_MS)
    arb.acquire(3, 0, now + 2 * NS_PER_MS)
    doc = hub.status().to_json()
    jsonschema.validate(doc, json.loads((ROOT / "docs" / "status.schema.json").read_text()))
    rows = {(g["index"], i["id"]): i for g in doc["gpus"] for i in g["instances"]}
    assert rows[(0, "J")]["gang"] == [0, 1] and rows[(1, "J")]["gang"] == [0, 1]
    assert rows[(0, "A")]["gang"] is None
    assert doc["gpus"][0]["gang_turns"] == 1 and doc["gpus"][1]["gang_turns"] == 1
    assert "GANG on GPUs 0,1" in smi.render(doc)
    reg = CollectorRegistry()
    reg.register(ArbiterCollector(hub))
    assert reg.get_sample_value("cgpu_instance_gang_gpus", {"gpu": "1", "instance": "J"}) == 2
    assert reg.get_sample_value("cgpu_instance_gang_gpus", {"gpu": "0", "instance": "A"}) == 0
    assert reg.get_sample_value("cgpu_gpu_gang_turns_total", {"gpu": "0"}) == 1
    assert reg.get_sample_value("cgpu_instance_gang_spin_seconds_total", {"gpu": "0", "instance": "J"}) == 0


def test_gangs_off_marks_nothing(hub: Hub) -> None:
    """With gang_window_ms 0 the same job takes its turns GPU by GPU: no gang anywhere."""
    arb = hub.arbiter
    now = time.monotonic_ns()
    arb.gangs.set_window(0, now)
    arb.provision("J", [0, 1], InstanceSettings(), now)
    for cid, gpu in ((1, 0), (2, 1)):
        arb.connect(cid, 100 + cid, 0)
        arb.register(cid, "J", [gpu], {}, now)
        arb.acquire(cid, gpu, now)
    doc = hub.status().to_json()
    assert all(i["gang"] is None for g in doc["gpus"] for i in g["instances"])
    assert "GANG" not in smi.render(doc)


def test_the_window_turns_gangs_off_and_on(hub: Hub) -> None:
    """gang_window_ms (what a reload sets, Hub.retune): 0 dissolves the gang at once, its instances back among their
    GPUs' own turns; the default forms it again at the job's next step."""
    arb = hub.arbiter
    now = time.monotonic_ns()
    arb.provision("J", [0, 1], InstanceSettings(), now)
    for cid, gpu in ((1, 0), (2, 1)):
        arb.connect(cid, 100 + cid, 0)
        arb.register(cid, "J", [gpu], {}, now)
        arb.acquire(cid, gpu, now)
    assert "J" in arb.gangs.gangs
    arb.gangs.set_window(0, now + 1)
    assert not arb.gangs.gangs and not any(s.instances["J"].gang for s in arb.scheds.values())
    arb.gangs.set_window(hub.config.gang_window_ms * NS_PER_MS, now + 2)
    arb.disconnect(1, now + 3)  # its next step: a process on GPU 0 asks again
    arb.connect(3, 103, 0)
    arb.register(3, "J", [0], {}, now + 3)
    arb.acquire(3, 0, now + 3)
    assert arb.gangs.gangs["J"].gpus == (0, 1)
