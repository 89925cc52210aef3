"""The shim's collective spin at the daemon (behaviour §11, "Visible"; arbiterd/core/shimspin.py): a release's
``spin_ns`` adds to its instance's count on that GPU, shown in status, the metrics and cgpu-smi beside the daemon's
own; a negative one is refused with nothing changed, and reports past the wall time since the client registered
are cut to it."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

import cgpu_protocol as p
from arbiterd.core.effects import NS_PER_MS, NS_PER_S, GrantLease
from arbiterd.core.errors import SettingError
from arbiterd.core.settings import InstanceSettings
from arbiterd.server.hub import Hub
from arbiterd.server.metrics import ArbiterCollector
from arbiterd.tools import smi
from tests.server.test_hub import Peer


def _rank(hub: Hub, name: str, gpu: int, now: int) -> tuple[Peer, int]:
    """A connection of ``name`` registered on ``gpu`` at ``now`` and granted a lease there: (peer, lease)."""
    peer = Peer()
    peer.cid = hub.attach(peer)
    hub.handle(peer, p.Register(1, name, [gpu]), now)
    _, effects, _ = hub.handle(peer, p.Acquire(gpu), now)
    grants = [e for e in effects if isinstance(e, GrantLease) and e.client == peer.cid]
    assert grants, effects
    return peer, grants[0].lease


def _shim_spin(hub: Hub) -> dict[tuple[int, str], float]:
    doc = hub.status().to_json()
    return {(g["index"], i["id"]): i["gang_shim_spin_seconds"] for g in doc["gpus"] for i in g["instances"]}


def test_a_release_carrying_spin_adds_it_to_the_instance_on_that_gpu(hub: Hub) -> None:
    """J's rank on GPU 0 reports 30 ms, then 20 ms: J has 50 ms on GPU 0 (exactly: ns in, seconds out) and none on
    GPU 1, whose rank reports none; the metric and cgpu-smi say the same, and the daemon's own count stays apart."""
    now = time.monotonic_ns()
    hub.arbiter.provision("J", [0, 1], InstanceSettings(), now)
    r0, lease0 = _rank(hub, "J", 0, now)
    r1, lease1 = _rank(hub, "J", 1, now)
    hub.handle(r0, p.Release(0, lease0, 90 * NS_PER_MS, again=True, spin_ns=30 * NS_PER_MS), now + 100 * NS_PER_MS)
    hub.handle(r1, p.Release(1, lease1, 90 * NS_PER_MS, again=True), now + 100 * NS_PER_MS)
    assert _shim_spin(hub) == {(0, "J"): 0.030, (1, "J"): 0.0}
    # a stale lease (already given back) still carries the spin counted since: it is the GPU's, not the lease's
    hub.handle(r0, p.Release(0, lease0, 1_000, spin_ns=20 * NS_PER_MS), now + 200 * NS_PER_MS)
    assert _shim_spin(hub) == {(0, "J"): 0.050, (1, "J"): 0.0}
    reg = CollectorRegistry()
    reg.register(ArbiterCollector(hub))
    assert reg.get_sample_value("cgpu_instance_gang_shim_spin_seconds_total", {"gpu": "0", "instance": "J"}) == 0.05
    assert reg.get_sample_value("cgpu_instance_gang_shim_spin_seconds_total", {"gpu": "1", "instance": "J"}) == 0
    assert reg.get_sample_value("cgpu_instance_gang_spin_seconds_total", {"gpu": "0", "instance": "J"}) == 0
    shown = smi.render(hub.status().to_json())
    assert "shim 0.05 s" in shown, shown


def test_the_field_on_the_wire(hub: Hub) -> None:
    """Old clients send no spin_ns (none); the shim's form decodes on the quick path; a wrong type or an explicit
    nil is refused as any bad field is."""
    base = {"op": "release", "gpu": 0, "lease": 5, "used_ns": 1000}
    assert p.decode(base, p.C2S) == p.Release(0, 5, 1000)
    assert p.decode({**base, "again": True, "warmup_ns": 7, "spin_ns": 9}, p.C2S) == p.Release(
        0, 5, 1000, True, None, 7, 9)
    assert p.Release(0, 5, 1000, spin_ns=9).to_wire() == {**base, "spin_ns": 9}
    for bad in ("9", None, 1.5):
        with pytest.raises(p.ProtocolError, match="spin_ns"):
            p.decode({**base, "spin_ns": bad}, p.C2S)


def test_a_negative_spin_refuses_the_release_and_changes_nothing(hub: Hub) -> None:
    now = time.monotonic_ns()
    hub.arbiter.provision("J", [0], InstanceSettings(), now)
    r0, lease = _rank(hub, "J", 0, now)
    hub.handle(r0, p.Release(0, lease, 1_000, again=True, spin_ns=5 * NS_PER_MS), now + 10 * NS_PER_MS)
    held = hub.arbiter.scheds[0].rq.lease
    assert held is not None  # renewed
    with pytest.raises(SettingError, match="spin_ns -1 is negative"):
        hub.handle(r0, p.Release(0, held.id, 1_000, spin_ns=-1), now + 20 * NS_PER_MS)
    assert hub.arbiter.scheds[0].rq.lease is held and r0.cid in held.clients  # not applied: the lease is as it was
    assert _shim_spin(hub) == {(0, "J"): 0.005}


def test_reports_past_the_time_since_registration_are_cut_to_it(hub: Hub) -> None:
    """A client registered at T reports 10 s at T + 100 ms: 100 ms is counted, and the release is applied; at
    T + 150 ms it reports 80 ms: 50 ms more is all the wall time allows."""
    arb = hub.arbiter
    t = 1_000 * NS_PER_S
    arb.provision("J", [0, 1], InstanceSettings(), t)
    arb.connect(1, 101, 0)
    arb.register(1, "J", [0], {}, t)
    lease = next(e for e in arb.acquire(1, 0, t) if isinstance(e, GrantLease)).lease
    arb.release(1, 0, lease, t + 100 * NS_PER_MS, used_ns=1_000, spin_ns=10 * NS_PER_S)
    assert arb.records[(0, "J")].shim_spin_ns == 100 * NS_PER_MS
    assert arb.scheds[0].rq.lease is None  # given back all the same
    arb.release(1, 0, lease, t + 150 * NS_PER_MS, used_ns=1_000, spin_ns=80 * NS_PER_MS)
    assert arb.records[(0, "J")].shim_spin_ns == 150 * NS_PER_MS
    assert arb.records[(1, "J")].shim_spin_ns == 0
