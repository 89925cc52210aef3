"""Pods, not container ids: the device plugin names each allocation's pod and container from the kubelet's
PodResources API, arbiterd carries them on the instance, and ``/metrics`` shows them; a container cannot.

Set-up as tests/k8s/test_e2e_arbiterd.py: the real arbiterd (``--allocations required``), the fake kubelet (which
serves PodResources v1 as the kubelet does, cgpu_testing/podresources.py) and the plugin in this process.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.core.podlabels import PodLabels
from cgpu_device_plugin.podresources import PodLabeller, holders
from cgpu_testing.k8s import Node
from cgpu_testing.kubelet import CORE, MEM, Pod

PROG = str(Path(__file__).with_name("container_prog.py"))
POLL_S = 0.1


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> float:
    """Seconds until ``check()`` held (raise after ``timeout``)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - t0


def listing(node: Node) -> dict[str, str]:
    """``alloc_ctl``'s lines by allocation id."""
    return {line.split()[0]: line for line in node.admin().get("alloc_ctl").splitlines() if line.strip()}


def series(node: Node, metric: str) -> list[dict[str, str]]:
    text = node.admin().request("GET", "/metrics")
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == metric]


def register(node: Node, pod: Pod, container: str = "c0", env: dict[str, str] | None = None) -> dict[str, Any]:
    rc = node.kubelet.start_container(pod, [sys.executable, PROG, "register"], container=container, env=env)
    code, out, err = rc.wait(60)
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.fixture
def node(node_factory: Any) -> Node:
    n: Node = node_factory()
    n.start_plugin(poll_interval_s=POLL_S, watch_interval_s=POLL_S)
    n.wait_health("Healthy")
    return n


def test_the_fake_kubelet_lists_each_containers_devices_as_podresources_v1(node: Node) -> None:
    pod = node.kubelet.admit("infer", [{MEM: 4, CORE: 30}, {}], namespace="shop")
    response = PodLabeller(str(node.kubelet.pod_resources.socket), 1.0, lambda found: 0).list()
    (listed,) = [p for p in response.pod_resources if p.name == "infer"]
    assert listed.namespace == "shop" and [c.name for c in listed.containers] == ["c0", "c1"]
    devices = {d.resource_name: list(d.device_ids) for d in listed.containers[0].devices}
    assert devices == pod.container("c0").devices and not listed.containers[1].devices
    found, bad = holders(response)
    assert bad == [] and set(found) == {i for ids in devices.values() for i in ids}
    assert set(found.values()) == {PodLabels("shop", "infer", "c0")}


def test_the_fake_kubelet_answers_get_for_one_pod_and_an_error_for_none(node: Node) -> None:
    """``Get(pod_name, pod_namespace)``: that pod's resources; an unknown pod: ``pod NAME in namespace NS not found``,
    as the kubelet's server_v1.go returns it (a plain Go error: gRPC UNKNOWN)."""
    import grpc

    from cgpu_device_plugin.api.podresources.v1 import api_pb2 as pr
    from cgpu_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc

    pod = node.kubelet.admit("one", [{MEM: 2}], namespace="shop")
    with grpc.insecure_channel(f"unix://{node.kubelet.pod_resources.socket}") as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        got = stub.Get(pr.GetPodResourcesRequest(pod_name="one", pod_namespace="shop"), timeout=5).pod_resources
        assert (got.name, got.namespace) == ("one", "shop")
        assert list(got.containers[0].devices[0].device_ids) == pod.container().devices[MEM]
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(pr.GetPodResourcesRequest(pod_name="one", pod_namespace="default"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
        assert err.value.details() == "pod one in namespace default not found"  # type: ignore[attr-defined]
        allocatable = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5).devices
        assert {d.resource_name for d in allocatable} == {MEM, CORE}
        assert len({i for d in allocatable if d.resource_name == MEM for i in d.device_ids}) == 32  # 2 x 16 GiB


def test_each_allocation_is_named_within_a_few_polls_and_metrics_carry_the_pod(node: Node) -> None:
    """A pod's two allocations carry its namespace, pod and container in ``alloc_ctl`` within 5 polls of its
    admission; once its container registered, every per-instance series of that instance has ``namespace``,
    ``pod``, ``container``, the GPU's ``UUID`` and ``modelName``; a host instance's have them empty."""
    pod = node.kubelet.admit("infer-7d9f", [{MEM: 4, CORE: 30}], namespace="shop")
    ids = [m.container_path.rsplit("/", 1)[1] for m in pod.container().mounts() if "cgpu-alloc" in m.container_path]
    assert len(ids) == 2
    took = wait_for("both allocations named", lambda: all(
        "namespace=shop pod=infer-7d9f container=c0 bound=" in listing(node).get(i, "") for i in ids))
    assert took < 5 * POLL_S + 1.0  # a poll after admission, with room for a loaded machine
    reply = register(node, pod)
    assert reply["op"] == "registered", reply
    gpu = reply["gpus"][0]
    status = node.admin().status()
    (inst,) = [i for g in status["gpus"] for i in g["instances"]]
    assert inst["labels"] == {"namespace": "shop", "pod": "infer-7d9f", "container": "c0"}
    card = status["gpus"][gpu["gpu"]]
    for metric in ("cgpu_instance_memory_limit_bytes", "cgpu_instance_weight", "cgpu_instance_held_seconds_total",
                   "cgpu_instance_entitled_seconds_total", "cgpu_instance_delivered_seconds_total"):
        (labels,) = series(node, metric)
        assert labels == {"gpu": str(gpu["gpu"]), "instance": inst["id"], "UUID": card["uuid"],
                          "modelName": card["name"], "namespace": "shop", "pod": "infer-7d9f", "container": "c0"}
    limit = next(s for f in text_string_to_metric_families(node.admin().request("GET", "/metrics"))
                 for s in f.samples if s.name == "cgpu_instance_memory_limit_bytes")
    assert limit.value == 4 * (1 << 30)


def test_a_container_cannot_name_its_pod_and_labels_go_with_the_pod(node: Node) -> None:
    """A container whose environment claims another pod's names, or whose register carries them, changes nothing:
    the register is refused as malformed (``unexpected field``) or bound as the plugin named it. Deleting the pod
    ends its allocations at the next admission, and no series names the pod any more."""
    victim = node.kubelet.admit("victim", [{MEM: 2}], namespace="prod")
    wait_for("victim named", lambda: any("pod=victim" in line for line in listing(node).values()))
    tenant = node.kubelet.admit("tenant", [{MEM: 2}], namespace="dev")
    wait_for("tenant named", lambda: any("pod=tenant" in line for line in listing(node).values()))
    env = {"POD_NAME": "victim", "POD_NAMESPACE": "prod", "KUBERNETES_POD_NAME": "victim", "CGPU_POD": "prod/victim"}
    assert register(node, tenant, env=env)["op"] == "registered"
    pods = {(s["namespace"], s["pod"]) for s in series(node, "cgpu_instance_memory_limit_bytes")}
    assert pods == {("dev", "tenant")}
    smuggled = node.kubelet.start_container(tenant, [sys.executable, "-c", SMUGGLE])
    code, out, err = smuggled.wait(30)
    assert code == 0, err
    assert json.loads(out) == {"op": "error", "code": "bad_request", "message": "register: unexpected field 'pod'"}
    assert {(s["namespace"], s["pod"]) for s in series(node, "cgpu_instance_memory_limit_bytes")} == pods
    node.kubelet.delete(tenant)
    node.kubelet.delete(victim)
    node.kubelet.admit("next", [{MEM: 16}, {MEM: 16}], namespace="dev")  # every device again: the old ones end
    wait_for("old allocations removed", lambda: not any("pod=tenant" in ln or "pod=victim" in ln
                                                        for ln in listing(node).values()))
    wait_for("no series names the old pods", lambda: not any(
        s["pod"] in ("tenant", "victim") for s in series(node, "cgpu_instance_memory_limit_bytes")))


SMUGGLE = (
    "import json, os, socket, msgpack\n"
    "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['CGPU_SOCKET']); u = msgpack.Unpacker(raw=False)\n"
    "def call(m):\n"
    "    s.sendall(msgpack.packb(m))\n"
    "    while True:\n"
    "        for r in u: return r\n"
    "        u.feed(s.recv(65536))\n"
    "call({'op': 'hello', 'versions': [1], 'client': 'smuggler'})\n"
    "r = call({'op': 'register', 'id': 1, 'instance': None, 'gpus': [0], 'pod': 'victim', 'namespace': 'prod'})\n"
    "print(json.dumps({k: r.get(k) for k in ('op', 'code', 'message')}))\n"
)


def test_labels_survive_an_arbiterd_restart_and_one_that_forgot_them_gets_them_back(node: Node) -> None:
    """arbiterd keeps an allocation's pod names in its state file: a restart shows them at once, on the instance
    too once its container binds again. An arbiterd that lost its state gets the allocation back from the plugin's
    resync with the names its record kept."""
    pod = node.kubelet.admit("keep", [{MEM: 2}], namespace="ops")
    wait_for("named", lambda: any("pod=keep container=c0" in line for line in listing(node).values()))
    assert register(node, pod)["op"] == "registered"
    node.daemon.restart()
    assert any(" namespace=ops pod=keep container=c0 bound=" in line for line in listing(node).values())
    (inst,) = [i for g in node.admin().status()["gpus"] for i in g["instances"]]
    assert inst["labels"] == {"namespace": "ops", "pod": "keep", "container": "c0"}
    node.daemon.restart(forget=True)
    wait_for("re-created by the plugin with its names", lambda: any(
        " namespace=ops pod=keep container=c0 bound=-" in line for line in listing(node).values()))
