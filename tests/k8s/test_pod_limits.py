"""Requests and limits through the device plugin: ``aliyun.com/gpu-core.percentage`` is the request, the pod's
``cgpu.io/core-limit`` annotation the ceiling (cgpu_device_plugin/podlimits.py).

Set-up as tests/k8s/test_pod_labels.py (the real arbiterd with ``--allocations required``, the fake kubelet serving
PodResources v1, the plugin in this process), plus the fake API server (cgpu_testing/apiserver.py) serving the
node's pods with ``fieldSelector=spec.nodeName`` as the real one does (pkg/registry/core/pod/strategy.go).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cgpu_device_plugin import podlimits
from cgpu_device_plugin.podlimits import BadAnnotation, limits_of, parse
from cgpu_testing.apiserver import FakeApiServer
from cgpu_testing.k8s import Node
from cgpu_testing.kubelet import CORE, MEM, Pod
from tests.k8s.test_pod_labels import listing, register

POLL_S = 0.1
NODE = "gpu-node-1"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)


def pod_object(pod: Pod, annotation: str | None, node: str = NODE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
    if annotation is not None:
        meta["annotations"] = {podlimits.ANNOTATION: annotation}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": c.name, "image": "app"} for c in pod.containers]}}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def node(node_factory: Any, api: FakeApiServer) -> Iterator[Node]:
    n: Node = node_factory()
    admin = n.admin()
    before = {g: (admin.get(f"{g}/policy").strip(), admin.get(f"{g}/max_inst").strip()) for g in (0, 1)}
    n.start_plugin(poll_interval_s=POLL_S, watch_interval_s=POLL_S, node_name=NODE, kube_server=api.url)
    n.wait_health("Healthy")
    yield n
    for plugin in n.plugins:
        plugin.stop()
    n.plugins.clear()
    for alloc in admin.node().allocations:
        admin.remove_allocation(alloc.id)
    for g, (policy, max_inst) in before.items():  # the daemon is shared with the next test: as it was lent
        admin.put(f"{g}/policy", policy)
        admin.put(f"{g}/max_inst", max_inst)


def core_line(node: Node, pod: Pod) -> str:
    """Its core allocation's ``alloc_ctl`` line once the plugin named its pod; "" before."""
    lines = [v for k, v in listing(node).items() if k.startswith("core-") and f"pod={pod.name} " in v]
    assert len(lines) <= 1, lines
    return lines[0] if lines else ""


def instance(node: Node) -> dict[str, Any]:
    (inst,) = [i for g in node.admin().status()["gpus"] for i in g["instances"]]
    return inst  # type: ignore[no-any-return]


def test_the_annotation_is_parsed_for_the_whole_pod_or_per_container_and_refused_whole_when_malformed() -> None:
    assert parse("60") == (60, {}) and parse(" 100 ") == (100, {})
    assert parse("main=60,side=40") == (None, {"main": 60, "side": 40})
    for bad in ("4", "101", "60%", "main=60,main=40", "main=3", "Main=60", "main=60;side=40", ""):
        with pytest.raises(BadAnnotation, match=r"cgpu\.io/core-limit"):
            parse(bad)
    pods = [{"metadata": {"namespace": "a", "name": "p", "annotations": {podlimits.ANNOTATION: "main=60"}},
             "spec": {"containers": [{"name": "main"}, {"name": "side"}]}},
            {"metadata": {"namespace": "a", "name": "q", "annotations": {podlimits.ANNOTATION: "70"}},
             "spec": {"containers": [{"name": "x"}, {"name": "y"}]}},
            {"metadata": {"namespace": "a", "name": "r", "annotations": {podlimits.ANNOTATION: "x=1000"}},
             "spec": {"containers": [{"name": "x"}]}},
            {"metadata": {"namespace": "a", "name": "s"}, "spec": {"containers": [{"name": "x"}]}}]
    found, bad = limits_of(pods)
    assert found == {("a", "p", "main"): 60, ("a", "q", "x"): 70, ("a", "q", "y"): 70}
    assert len(bad) == 1 and bad[0].startswith("pod a/r: cgpu.io/core-limit: 'x=1000'")


def test_the_fake_api_server_selects_pods_by_node_and_refuses_an_unknown_field(api: FakeApiServer) -> None:
    import json

    from cgpu_dra_plugin.kubeapi import api_client

    for name, where in (("here", NODE), ("there", "other-node")):
        api.put("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "d"},
                         "spec": {"nodeName": where, "containers": [{"name": "c", "image": "i"}]}})
    pods = podlimits.node_pods(api_client(None, api.url), NODE)()
    assert [p["metadata"]["name"] for p in pods] == ["here"]
    from kubernetes import client
    from kubernetes.client import ApiException

    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api_client(None, api.url)).list_pod_for_all_namespaces(field_selector="spec.color=red")
    assert err.value.status == 400 and "field label not supported" in json.loads(err.value.body)["message"]


def test_a_pods_annotation_is_its_core_requests_ceiling_in_arbiterd_and_follows_the_annotation(
        node: Node, api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """A container asking 30 % with ``cgpu.io/core-limit: "60"`` is bound with request 30 and limit 60 on policy 4
    (what it would get alone: 60 %, not the hard cap's 30); a new value follows within polls, one below the request
    is refused with a line and changes nothing, and taking the annotation away gives the hard cap back."""
    pod = node.kubelet.admit("train", [{MEM: 2, CORE: 30}], namespace="ml")
    api.put("pods", pod_object(pod, "60"))
    wait_for("the limit in arbiterd", lambda: "core=30 limit=60 " in core_line(node, pod))
    reply = register(node, pod)
    assert reply["op"] == "registered", reply
    inst = instance(node)
    gpu = reply["gpus"][0]["gpu"]
    assert (inst["weight"], inst["limit"]) == (6, 60)
    assert node.admin().get(f"{gpu}/policy").strip() == "4"

    api.put("pods", pod_object(pod, "c0=45"))
    wait_for("the new limit", lambda: instance(node)["limit"] == 45)
    with caplog.at_level(logging.WARNING, logger="cgpu_device_plugin"):
        api.put("pods", pod_object(pod, "c0=20"))
        wait_for("the refusal logged", lambda: any("limit 20 %" in r.message and "refused" in r.message
                                                   for r in caplog.records))
    assert instance(node)["limit"] == 45 and "limit=45 " in core_line(node, pod)
    api.put("pods", pod_object(pod, None))
    wait_for("the hard cap back", lambda: instance(node)["limit"] == 30)
    assert "core=30 limit=30 " in core_line(node, pod)


def test_without_the_api_server_a_core_percentage_stays_a_hard_cap_and_the_plugin_serves(
        node_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    n: Node = node_factory()
    with caplog.at_level(logging.WARNING, logger="cgpu_device_plugin"):
        n.start_plugin(poll_interval_s=POLL_S, watch_interval_s=POLL_S, node_name=NODE,
                       kube_server="http://127.0.0.1:9")  # nothing listens on the discard port
        n.wait_health("Healthy")
        pod = n.kubelet.admit("infer", [{MEM: 2, CORE: 30}], namespace="ml")
        wait_for("the pod named", lambda: "pod=infer " in core_line(n, pod))
        wait_for("one warning", lambda: any("cannot list this node's pods" in r.message for r in caplog.records))
    assert " limit=" not in core_line(n, pod)
    assert sum("cannot list this node's pods" in r.message for r in caplog.records) == 1
    assert sys.modules["cgpu_device_plugin.podlimits"] is podlimits
