"""End to end through DRA against the REAL arbiterd: the fake kubelet calls the plugin's gRPC services, the
scheduler model allocates claims on the slice the plugin published to the fake API server, containers bind.

Set-up (cgpu_testing/dra.py): arbiterd with ``--sim-gpus 2x16GiB --identity cgroup --proc-root <fake /proc>
--allocations required`` (lent by tests/k8s/conftest.py), the fake API server validating every write against the
Kubernetes 1.34 schema, the DRA plugin in this process and the fake DRA kubelet.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cgpu_dra_plugin import DRIVER
from cgpu_testing.dra import NODE, DraNode
from cgpu_testing.drakubelet import PrepareFailed
from cgpu_testing.drasched import Unschedulable, claim
from cgpu_testing.k8s import GIB

PROG = str(Path(__file__).with_name("container_prog.py"))


@pytest.fixture
def dra(daemons: Any) -> Iterator[DraNode]:
    root = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: UNIX socket paths
    daemon = daemons.lend("2x16GiB")
    node = DraNode(root, daemon)
    node.start_plugin()
    yield node
    node.close()
    assert node.api.invalid == [], "the plugin wrote an object the Kubernetes schema refuses"
    daemons.give_back(daemon)
    shutil.rmtree(root, ignore_errors=True)


def run(node: DraNode, c: dict[str, Any], cdi_ids: list[str], *args: str) -> dict[str, Any]:
    rc = node.kubelet.start_container(node.pod_uid(c), cdi_ids, [sys.executable, PROG, *args])
    code, out, err = rc.wait(60)
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_slice_publishes_each_gpu_once_with_consumable_memory_and_cores(dra: DraNode) -> None:
    """Expects: one ResourceSlice for the node, pool = node name, one device per card allowing multiple
    allocations, memory 16Gi in 1Gi steps and cores 100 in steps of 5, with the card's uuid, index and policy."""
    (s,) = dra.slices()
    assert s["spec"]["nodeName"] == NODE and s["spec"]["pool"]["name"] == NODE
    devices = s["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    d0 = devices[0]
    assert d0["allowMultipleAllocations"] is True
    assert d0["capacity"]["memory"]["value"] == "16Gi"
    assert d0["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Gi"
    assert d0["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "5"}}}
    status = dra.daemon.status()
    assert d0["attributes"]["uuid"]["string"] == status["gpus"][0]["uuid"]
    assert d0["attributes"]["index"]["int"] == 0 and d0["attributes"]["policy"]["int"] == status["gpus"][0]["policy"]


def test_a_policy_change_republishes_the_slice_with_a_higher_generation(dra: DraNode) -> None:
    """Expects: writing 1/policy in arbiterd reaches the slice at the next poll, pool generation + 1."""
    (before,) = dra.slices()
    dra.daemon.echo("4", "1/policy")
    after = dra.wait_slice(lambda s: s["spec"]["devices"][1]["attributes"]["policy"]["int"] == 4)
    assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"] + 1
    dra.daemon.echo("1", "1/policy")


def test_4_gib_and_30_cores_are_prepared_applied_by_arbiterd_and_freed(dra: DraNode) -> None:
    """Expects: the claim is placed on one card consuming 4Gi and 30; prepare returns its CDI device; the
    container started with the CDI edits binds the allocation and arbiterd applies 4 GiB and 30 % (weight 6 of 20
    on policy 3); unprepare removes the allocation and the CDI spec."""
    c = dra.schedule(claim("infer", memory="4Gi", cores=30))
    (result,) = c["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}
    cdi_ids = dra.prepare(c)
    assert cdi_ids == [f"{DRIVER}/claim={c['metadata']['uid']}-gpu-0"]
    (alloc,) = dra.daemon.status()["allocations"]
    assert (alloc["gpus"], alloc["memsize"], alloc["core"]) == ([0], [4 * GIB], 30)
    reply = run(dra, c, cdi_ids, "register")
    assert reply["op"] == "registered"
    (gpu,) = reply["gpus"]
    assert gpu["gpu"] == 0 and gpu["mem_limit"] == 4 * GIB and gpu["weight"] == 6
    dra.unprepare(c)
    assert dra.daemon.status()["allocations"] == []
    assert list((dra.root / "cdi").glob("*.json")) == []


def test_prepare_is_idempotent_and_a_plugin_restart_between_prepare_and_unprepare_loses_nothing(dra: DraNode) -> None:
    """Expects: a retried prepare answers the same CDI ids and creates nothing more; after the plugin restarts
    (checkpoint on disk) a prepare answers the same, the container still binds, and unprepare frees it."""
    c = dra.schedule(claim("a", memory="2Gi", cores=10))
    first = dra.prepare(c)
    assert dra.prepare(c) == first and len(dra.daemon.status()["allocations"]) == 1
    dra.stop_plugin()
    dra.start_plugin()
    assert dra.prepare(c) == first and len(dra.daemon.status()["allocations"]) == 1
    assert run(dra, c, first, "register")["gpus"][0]["mem_limit"] == 2 * GIB
    dra.unprepare(c)
    assert dra.daemon.status()["allocations"] == []


def test_an_arbiterd_restart_that_forgot_its_allocations_gets_them_back(dra: DraNode) -> None:
    """Expects: arbiterd started from an empty state dir holds no allocation; the plugin notices the new daemon
    and creates the prepared claim's allocation again, with the same token, so the container still binds."""
    c = dra.schedule(claim("a", memory="3Gi"))
    ids = dra.prepare(c)
    dra.daemon.restart(forget=True)
    end = time.monotonic() + 10
    while not dra.daemon.status()["allocations"] and time.monotonic() < end:
        time.sleep(0.05)
    (alloc,) = dra.daemon.status()["allocations"]
    assert alloc["memsize"] == [3 * GIB]
    assert run(dra, c, ids, "register")["gpus"][0]["mem_limit"] == 3 * GIB


def test_the_kubelet_restarting_registers_the_plugin_again_and_v1beta1_kubelets_are_served(dra: DraNode) -> None:
    """Expects: after a kubelet restart the registration is found again; a kubelet that knows only v1beta1
    (Kubernetes 1.32/1.33) gets the same answers from the v1beta1 service."""
    dra.kubelet.restart()
    assert dra.kubelet.plugins[DRIVER].version == "v1.DRAPlugin"
    dra.kubelet.versions = ("v1beta1.DRAPlugin",)
    dra.kubelet.restart()
    assert dra.kubelet.plugins[DRIVER].version == "v1beta1.DRAPlugin"
    c = dra.schedule(claim("b", memory="1Gi"))
    assert dra.prepare(c) == [f"{DRIVER}/claim={c['metadata']['uid']}-gpu-0"]
    dra.unprepare(c)


def test_a_claim_that_does_not_fit_is_unschedulable_and_one_that_is_not_allocated_fails_prepare(dra: DraNode) -> None:
    """Expects: 17Gi fits no 16 GiB card: the scheduler model refuses it; a claim with no allocation gets a
    one-line error from NodePrepareResources, and nothing is created in arbiterd."""
    with pytest.raises(Unschedulable, match="no device"):
        dra.schedule(claim("big", memory="17Gi"))
    stored = dra.api.put("resourceclaims", claim("pending", memory="1Gi"))
    with pytest.raises(PrepareFailed, match="not allocated"):
        dra.prepare(stored)
    assert dra.daemon.status()["allocations"] == []


def test_an_allocation_whose_claim_is_gone_is_cleaned_up(dra: DraNode) -> None:
    """Expects: a prepared claim deleted from the API server without an unprepare (a kubelet that lost it) has
    its allocation and CDI spec removed by the plugin's garbage collection."""
    c = dra.schedule(claim("orphan", memory="2Gi"))
    dra.prepare(c)
    dra.api.delete("resourceclaims", "orphan", "default")
    assert dra.plugin is not None
    assert dra.plugin.preparer.collect_garbage() == [c["metadata"]["uid"]]
    assert dra.daemon.status()["allocations"] == [] and list((dra.root / "cdi").glob("*.json")) == []
