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
import threading
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
from cgpu_testing.tools import ROOT

PROG = str(Path(__file__).with_name("container_prog.py"))
DEPLOY = ROOT / "deploy" / "kubernetes" / "overlays" / "dra"


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


def share_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig", **fields}


def test_weights_1_and_2_in_the_claims_give_one_third_and_two_thirds(dra: DraNode) -> None:
    """Weights in the claim (ShareConfig) are enforced as inst_ctl's: two busy containers of weights 1 and 2 on
    one card (policy 2, as a weight over 1 makes policy 1) get 33.3 % and 66.7 % (± 2 pp) of the useful time the
    card delivered to them, by the daemon's own accounting over whole rounds, at defaults; together they kept the
    card busy more than half the time (so both really ran; CPU contention on a shared test machine costs some)."""
    dra.daemon.echo("1", "0/policy")
    claims = [dra.schedule(claim(f"w{w}", memory="2Gi", config=share_config(weight=w)))
              for w in (1, 2)]
    ids = [dra.prepare(c) for c in claims]
    lines = dra.daemon.cat("alloc_ctl")
    assert " weight=1 " in lines and " weight=2 " in lines
    running = [dra.kubelet.start_container(dra.pod_uid(c), i, [sys.executable, PROG, "spin", "12"])
               for c, i in zip(claims, ids, strict=True)]

    def sample() -> tuple[float, float, dict[str, float], int]:
        (gpu, *_) = dra.daemon.smi_json()["gpus"]
        return (time.monotonic(), gpu["slice_effective_ms"], {i["id"]: i["useful_seconds"] for i in gpu["instances"]},
                gpu["policy"])

    time.sleep(2.0)
    t0, slice_ms, u0, policy = sample()
    assert policy == 2
    ring = 3 * slice_ms / 1000
    time.sleep(ring * max(1, round(6.0 / ring)))  # a whole number of rounds, about 6 s
    t1, _, u1, _ = sample()
    for rc in running:
        code, _, err = rc.wait(60)
        assert code == 0, err
    useful = [u1[rc.cid[:12]] - u0[rc.cid[:12]] for rc in running]
    assert sum(useful) / (t1 - t0) > 0.5, (useful, t1 - t0)
    for want, got in zip((100 / 3, 200 / 3), useful, strict=True):
        share = 100 * got / sum(useful)
        assert abs(share - want) <= 2.0, (want, share, slice_ms)


def test_the_highprio_device_class_makes_a_high_priority_container_and_a_claim_cannot_ask_it(dra: DraNode) -> None:
    """Expects: a claim of deploy/kubernetes/dra's gpu.cgpu.io-highprio class (ShareConfig highPriority, source
    FromClass) with cores: the allocation carries highprio=1 and the 20 % cap, and the container that binds it
    registers as high priority with weight 4 (20 % of 20 slots); a claim of the plain class whose own ShareConfig
    says highPriority fails prepare with one line and creates nothing."""
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with the kubernetes client")
    dra.api.put("deviceclasses", yaml.safe_load((DEPLOY / "deviceclass-highprio.yaml").read_text()))
    c = dra.schedule(claim("hp", memory="1Gi", cores=20, device_class=f"{DRIVER}-highprio"))
    ids = dra.prepare(c)
    assert "core=20 highprio=1" in dra.daemon.cat("alloc_ctl")
    (gpu,) = run(dra, c, ids, "register")["gpus"]
    assert gpu["highprio"] in (1, True) and gpu["weight"] == 4
    forged = dra.schedule(claim("forged", memory="1Gi", config=share_config(highPriority=True)))
    dra.kubelet.retries = 0
    with pytest.raises(PrepareFailed, match="highPriority is taken only from a DeviceClass"):
        dra.prepare(forged)
    assert len(dra.daemon.status()["allocations"]) == 1


def test_a_bad_share_config_fails_prepare_with_one_line_and_creates_nothing(dra: DraNode) -> None:
    """Expects: weight 0 in the claim's ShareConfig: NodePrepareResources answers the claim's error naming the
    field, arbiterd holds no allocation and no CDI spec is written."""
    c = dra.schedule(claim("bad", memory="1Gi", config=share_config(weight=0)))
    with pytest.raises(PrepareFailed, match=r"weight must be an integer 1\.\.25, got 0"):
        dra.prepare(c)
    assert dra.daemon.status()["allocations"] == [] and list((dra.root / "cdi").glob("*.json")) == []


def test_a_prepare_sent_while_the_plugin_restarts_is_retried_until_it_is_back(dra: DraNode) -> None:
    """Expects: with the plugin stopped (its sockets gone) the kubelet's prepare fails and is retried; once the
    plugin is back and registered again the retry succeeds, with one allocation in arbiterd."""
    c = dra.schedule(claim("late", memory="2Gi", cores=5))
    dra.stop_plugin()
    dra.kubelet.retries, dra.kubelet.retry_delay_s = 200, 0.05
    restarter = threading.Timer(1.0, dra.start_plugin, kwargs={"wait": False})
    restarter.start()
    try:
        ids = dra.prepare(c)
    finally:
        restarter.join()
    assert ids == [f"{DRIVER}/claim={c['metadata']['uid']}-gpu-0"]
    assert [a["memsize"] for a in dra.daemon.status()["allocations"]] == [[2 * GIB]]
    assert sum(1 for rpc, _ in dra.kubelet.calls if rpc == "GetInfo") >= 2


def test_a_deleted_registration_socket_is_served_again(dra: DraNode) -> None:
    """Expects: the plugin notices its registration socket is gone and serves a new one, which the kubelet's
    watcher registers."""
    sock = dra.root / "registry" / f"{DRIVER}-reg.sock"
    sock.unlink()
    end = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < end:
        time.sleep(0.02)
    assert sock.exists()
    dra.kubelet.restart()
    assert DRIVER in dra.kubelet.plugins


def test_a_card_that_appears_or_disappears_reaches_the_slice(dra: DraNode) -> None:
    """Expects: arbiterd restarted with a third GPU: the slice lists gpu-0..gpu-2 at the next poll, with a higher
    pool generation; restarted with one GPU, the slice lists gpu-0 alone."""
    (before,) = dra.slices()
    flags = list(dra.daemon.args)
    grown = [f if f != "2x16GiB" else "3x16GiB" for f in flags]
    dra.daemon.restart(*grown, forget=True)
    three = dra.wait_slice(lambda s: len(s["spec"]["devices"]) == 3)
    assert three["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]
    dra.daemon.restart(*[f if f != "2x16GiB" else "1x16GiB" for f in flags], forget=True)
    one = dra.wait_slice(lambda s: [d["name"] for d in s["spec"]["devices"]] == ["gpu-0"])
    assert one["spec"]["pool"]["generation"] > three["spec"]["pool"]["generation"]


def test_a_claim_of_two_requests_gets_two_devices_and_two_allocations(dra: DraNode) -> None:
    """Expects: requests of 12Gi and 8Gi cannot share a 16 GiB card: the scheduler model puts them on gpu-0 and
    gpu-1; prepare returns one CDI device per card and arbiterd holds one allocation on each."""
    c = claim("pair", memory="12Gi")
    second = json.loads(json.dumps(c["spec"]["devices"]["requests"][0]))
    second["name"] = "second"
    second["exactly"]["capacity"]["requests"]["memory"] = "8Gi"
    c["spec"]["devices"]["requests"].append(second)
    stored = dra.schedule(c)
    assert [r["device"] for r in stored["status"]["allocation"]["devices"]["results"]] == ["gpu-0", "gpu-1"]
    uid = stored["metadata"]["uid"]
    assert dra.prepare(stored) == [f"{DRIVER}/claim={uid}-gpu-0", f"{DRIVER}/claim={uid}-gpu-1"]
    held = sorted((a["gpus"], a["memsize"]) for a in dra.daemon.status()["allocations"])
    assert held == [([0], [12 * GIB]), ([1], [8 * GIB])]
    dra.unprepare(stored)
    assert dra.daemon.status()["allocations"] == []


def test_unprepare_while_arbiterd_is_down_fails_and_a_retry_after_it_is_back_frees_the_claim(dra: DraNode) -> None:
    """Expects: with arbiterd stopped, NodeUnprepareResources answers the claim's error (the kubelet retries) and
    keeps the record; once arbiterd is back the retry removes the allocation, the token dir and the CDI spec."""
    c = dra.schedule(claim("keep", memory="1Gi"))
    dra.prepare(c)
    dra.daemon.stop()
    with pytest.raises(PrepareFailed, match="cannot remove allocation dra-"):
        dra.unprepare(c)
    assert dra.plugin is not None and [r.uid for r in dra.plugin.preparer.prepared()] == [c["metadata"]["uid"]]
    dra.daemon.start()
    dra.unprepare(c)
    assert dra.daemon.status()["allocations"] == [] and list((dra.root / "cdi").glob("*.json")) == []
    assert not any(p.name.startswith("dra-") for p in (dra.root / "state").iterdir())


def test_a_create_whose_reply_was_lost_is_redone_on_the_retry_with_a_token_the_container_holds(
        dra: DraNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expects: arbiterd creates the allocation but the reply times out (Unreachable): the prepare fails and the
    kubelet's retry removes the allocation left under the claim's id and creates it again with the new token, so
    the token directory exists and the container binds the allocation."""
    from cgpu_device_plugin.admin import Unreachable
    assert dra.plugin is not None
    admin = dra.plugin.preparer.admin
    real = admin.create_allocation
    lost: list[str] = []

    def create_then_lose_reply(alloc_id: str, *args: Any, **kw: Any) -> None:
        real(alloc_id, *args, **kw)
        if not lost:
            lost.append(alloc_id)
            raise Unreachable("timed out")

    monkeypatch.setattr(admin, "create_allocation", create_then_lose_reply)
    c = dra.schedule(claim("lost", memory="2Gi"))
    ids = dra.prepare(c)
    assert lost and (dra.root / "state" / lost[0] / "token").is_file()
    (alloc,) = dra.daemon.status()["allocations"]
    assert alloc["id"] == lost[0]
    assert run(dra, c, ids, "register")["gpus"][0]["mem_limit"] == 2 * GIB


def test_a_prepare_whose_checkpoint_write_failed_is_not_prepared_and_its_retry_creates_the_allocation(
        dra: DraNode) -> None:
    """Expects: the checkpoint cannot be written (its path is a directory): prepare fails naming the checkpoint and
    arbiterd holds nothing; once it can be written again, the retry prepares the claim for real: the allocation is
    in arbiterd and the container binds it."""
    c = dra.schedule(claim("ckpt", memory="1Gi"))
    blocker = dra.root / "state" / "checkpoint.json"
    blocker.mkdir()
    dra.kubelet.retries = 0
    with pytest.raises(PrepareFailed, match="cannot write the checkpoint"):
        dra.prepare(c)
    assert dra.daemon.status()["allocations"] == []
    blocker.rmdir()
    ids = dra.prepare(c)
    assert len(dra.daemon.status()["allocations"]) == 1
    assert run(dra, c, ids, "register")["gpus"][0]["mem_limit"] == 1 * GIB


def test_a_recorded_claim_whose_allocation_arbiterd_lacks_is_created_again_or_fails_prepare(dra: DraNode) -> None:
    """Expects: a prepared claim whose allocation vanished from arbiterd (same daemon, so no resync): the next
    prepare creates it again and the container binds it; if arbiterd refuses (the card is full meanwhile), the
    prepare fails naming the refusal rather than answering devices with no allocation."""
    c = dra.schedule(claim("gone", memory="4Gi"))
    ids = dra.prepare(c)
    (alloc,) = dra.daemon.status()["allocations"]
    admin = dra.admin()
    admin.remove_allocation(alloc["id"])
    assert dra.prepare(c) == ids
    assert [a["id"] for a in dra.daemon.status()["allocations"]] == [alloc["id"]]
    assert run(dra, c, ids, "register")["gpus"][0]["mem_limit"] == 4 * GIB
    d = dra.schedule(claim("other", memory="3Gi"))
    dra.prepare(d)
    admin.remove_allocation(alloc["id"])
    admin.create_allocation("filler", "0" * 64, [0], [13 * GIB], 0, 0, False)
    dra.kubelet.retries = 0
    with pytest.raises(PrepareFailed, match="refused to create it again"):
        dra.prepare(c)


def test_an_unexpected_error_fails_only_its_claim_and_a_cdi_write_failure_says_so(
        dra: DraNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expects: a bug (RuntimeError) in one claim's prepare fails that claim alone, with a one-line error naming
    it, while the other claim of the same NodePrepareResources is prepared; a CDI spec that cannot be written
    fails the prepare naming the CDI spec (not arbiterd) and leaves no allocation behind."""
    assert dra.plugin is not None
    preparer = dra.plugin.preparer
    real = preparer.prepare
    good, bad = dra.schedule(claim("good", memory="1Gi")), dra.schedule(claim("buggy", memory="1Gi"))

    def prepare(namespace: str, uid: str, name: str) -> Any:
        if uid == bad["metadata"]["uid"]:
            raise RuntimeError("boom\nsecond line")
        return real(namespace, uid, name)

    monkeypatch.setattr(preparer, "prepare", prepare)
    dra.kubelet.retries = 0
    with pytest.raises(PrepareFailed) as failed:
        dra.kubelet.prepare(DRIVER, [dra.ref(good), dra.ref(bad)])
    assert str(failed.value) == ("claim default/buggy: claim default/buggy: prepare failed in the plugin "
                                 "(RuntimeError: boom); see its log")
    assert len(dra.daemon.status()["allocations"]) == 1
    monkeypatch.undo()
    cdi = dra.root / "cdi"
    shutil.rmtree(cdi)
    cdi.write_text("")
    c = dra.schedule(claim("nocdi", memory="1Gi"))
    with pytest.raises(PrepareFailed, match=f"cannot write the CDI spec under {cdi}"):
        dra.prepare(c)
    assert len(dra.daemon.status()["allocations"]) == 1
    cdi.unlink()


def test_an_unreadable_checkpoint_keeps_running_claims_allocations_and_removes_only_strays(dra: DraNode) -> None:
    """Expects: the plugin restarts with an unreadable checkpoint (set aside): the allocation of a claim the API
    server still allocates on this node stays in arbiterd, its record is rebuilt (the container binds with the
    token on disk, and unprepare frees it), while a dra- allocation of no claim and its token directory go."""
    c = dra.schedule(claim("survivor", memory="2Gi"))
    ids = dra.prepare(c)
    (alloc,) = dra.daemon.status()["allocations"]
    dra.stop_plugin()
    stray = "dra-0123456789ab"
    dra.admin().create_allocation(stray, "1" * 64, [1], [GIB], 0, 0, False)
    (dra.root / "state" / stray).mkdir()
    (dra.root / "state" / "checkpoint.json").write_text("{not json")
    dra.start_plugin()
    end = time.monotonic() + 10  # the resync runs at the plugin's first poll
    while any(a["id"] == stray for a in dra.daemon.status()["allocations"]) and time.monotonic() < end:
        time.sleep(0.02)
    assert [a["id"] for a in dra.daemon.status()["allocations"]] == [alloc["id"]]
    assert dra.plugin is not None and [r.uid for r in dra.plugin.preparer.prepared()] == [c["metadata"]["uid"]]
    assert not (dra.root / "state" / stray).exists()
    assert run(dra, c, ids, "register")["gpus"][0]["mem_limit"] == 2 * GIB
    dra.unprepare(c)
    assert dra.daemon.status()["allocations"] == []


def test_a_claim_reserved_for_two_pods_fails_prepare_and_creates_nothing(dra: DraNode) -> None:
    """Expects: arbiterd binds an allocation to one container, so a claim whose status.reservedFor names two pods
    fails NodePrepareResources with one line saying each pod needs its own claim; nothing is allocated."""
    c = dra.schedule(claim("shared", memory="1Gi"))
    c["status"]["reservedFor"].append({"resource": "pods", "name": "second", "uid": "0" * 8})
    c = dra.api.put("resourceclaims", c)
    dra.kubelet.retries = 0
    with pytest.raises(PrepareFailed, match=r"reserved for 2 consumers .* each pod needs its own claim"):
        dra.prepare(c)
    assert dra.daemon.status()["allocations"] == [] and list((dra.root / "cdi").glob("*.json")) == []


def test_resync_reads_arbiterd_under_the_lock_so_a_prepare_racing_the_poll_logs_no_false_error(
        dra: DraNode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Expects: a claim prepared just after the publisher read arbiterd's status (the poll's snapshot lacks its
    allocation): the resync that follows neither tries to create it again nor logs an error, and the claim keeps
    its one allocation."""
    assert dra.plugin is not None
    plugin = dra.plugin
    plugin.publisher.stop()  # step by hand
    c = dra.schedule(claim("race", memory="1Gi"))
    real = plugin.admin.status
    raced: list[bool] = []

    def status() -> dict[str, Any]:
        doc = real()
        if not raced:
            raced.append(True)
            plugin.preparer.prepare("default", c["metadata"]["uid"], "race")
        return doc

    monkeypatch.setattr(plugin.admin, "status", status)
    plugin.publisher._daemon_pid = None  # as after an arbiterd restart: the next step resyncs
    with caplog.at_level("INFO", logger="cgpu_dra_plugin"):
        plugin.publisher.step(time.monotonic())
    assert raced and [r.levelname for r in caplog.records if r.levelname in ("ERROR", "WARNING")] == []
    assert not any("created again" in r.getMessage() for r in caplog.records)
    assert len(dra.daemon.status()["allocations"]) == 1


def test_garbage_collection_asks_the_api_server_without_holding_the_prepare_lock(
        dra: DraNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expects: while collect_garbage reads each recorded claim from the API server the preparer's lock is free
    (a prepare is not held up by N API calls); the claim that is gone is still unprepared."""
    assert dra.plugin is not None
    preparer = dra.plugin.preparer
    kept, gone = dra.schedule(claim("kept", memory="1Gi")), dra.schedule(claim("gc", memory="1Gi"))
    dra.prepare(kept)
    dra.prepare(gone)
    dra.api.delete("resourceclaims", "gc", "default")
    locked: list[bool] = []
    real = preparer.kube.get_claim

    def get_claim(namespace: str, name: str) -> Any:
        locked.append(preparer._lock.locked())
        return real(namespace, name)

    monkeypatch.setattr(preparer.kube, "get_claim", get_claim)
    assert preparer.collect_garbage() == [gone["metadata"]["uid"]]
    assert locked == [False, False]
    assert [r.uid for r in preparer.prepared()] == [kept["metadata"]["uid"]]
