"""The status document: typed records, shares over windows from the one-second history."""

from __future__ import annotations

from arbiterd.core.settings import InstanceSettings
from arbiterd.server import status as status_mod
from arbiterd.server.hub import Hub


def test_history_picks_the_newest_sample_old_enough() -> None:
    h = status_mod.History()
    for t in (0, 1, 2, 3):
        h.samples.append(status_mod.Sample(t * 10**9, {}, {}))
    assert h.past(3 * 10**9, 10**9).t == 2 * 10**9  # type: ignore[union-attr]
    assert h.past(3 * 10**9, 60 * 10**9).t == 0  # type: ignore[union-attr]


def test_document_has_a_schema_version_and_every_gpu_setting(hub: Hub) -> None:
    hub.arbiter.provision("a", [0], InstanceSettings(weight=2), 0)
    doc = status_mod.build(hub.arbiter, hub.gpus, status_mod.History(), clients=3, started_at=0.0,
                           state_file="s", state_problem=None).to_json()
    assert doc["schema"] == status_mod.SCHEMA_VERSION and doc["clients"] == 3
    g = doc["gpus"][0]
    assert {"policy", "max_inst", "prio_ratio", "slice_ms", "overrun_ms", "policy_name"} <= set(g)
    (inst,) = g["instances"]
    assert inst["id"] == "a" and inst["weight"] == 2 and inst["share_pct"] == {"1s": None, "60s": None}
