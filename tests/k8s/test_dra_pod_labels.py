"""DRA: the plugin names each claim's pod (``status.reservedFor``) and container (the pod's spec) in arbiterd, and
``/metrics`` carries them; what it cannot tell is left out, and never fails a prepare.

Set-up as tests/k8s/test_dra_e2e.py (its ``dra`` fixture): the real arbiterd, the fake API server (which serves
the pods the scheduler model reserves claims for, ``/api/v1/namespaces/NS/pods/NAME``), the plugin in this process
and the fake DRA kubelet.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.core.podlabels import PodLabels
from cgpu_dra_plugin.claims import consumer
from cgpu_testing.dra import DraNode
from cgpu_testing.drasched import claim
from tests.k8s.test_dra_e2e import dra, run  # noqa: F401  (dra: the fixture)


def listing(node: DraNode) -> dict[str, str]:
    return {line.split()[0]: line for line in node.admin().get("alloc_ctl").splitlines() if line.strip()}


def samples(node: DraNode, metric: str) -> list[dict[str, str]]:
    text = node.admin().request("GET", "/metrics")
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == metric]


def test_a_prepared_claim_names_its_pod_and_container_in_arbiterd_and_metrics(dra: DraNode) -> None:  # noqa: F811
    c = dra.schedule(claim("infer-gpu", memory="4Gi", cores=30), pod="infer-0", containers=("model",))
    cdi_ids = dra.prepare(c)
    (line,) = listing(dra).values()
    assert " namespace=default pod=infer-0 container=model bound=-" in line
    reply = run(dra, c, cdi_ids, "register")
    assert reply["op"] == "registered", reply
    (labels,) = samples(dra, "cgpu_instance_memory_limit_bytes")
    gpu = dra.daemon.status()["gpus"][reply["gpus"][0]["gpu"]]
    assert {k: labels[k] for k in ("namespace", "pod", "container", "UUID", "modelName")} == {
        "namespace": "default", "pod": "infer-0", "container": "model", "UUID": gpu["uuid"], "modelName": gpu["name"]}
    (rec,) = dra.plugin.preparer.prepared() if dra.plugin else ()
    assert rec.labels == PodLabels("default", "infer-0", "model")  # in the checkpoint: a restart re-creates with it
    dra.delete(c)
    assert listing(dra) == {} and samples(dra, "cgpu_instance_memory_limit_bytes") == []


def test_a_claim_two_containers_name_keeps_its_pod_and_leaves_the_container_out(dra: DraNode) -> None:  # noqa: F811
    c = dra.schedule(claim("shared", memory="2Gi"), pod="two-ctr", containers=("a", "b"))
    dra.prepare(c)
    (line,) = listing(dra).values()
    assert " namespace=default pod=two-ctr bound=-" in line and "container=" not in line
    dra.delete(c)


def test_a_pod_that_cannot_be_read_still_prepares_with_its_pod_named(dra: DraNode) -> None:  # noqa: F811
    c = dra.schedule(claim("orphan", memory="1Gi"), pod="gone-pod")
    dra.api.delete("pods", "gone-pod", "default")
    dra.prepare(c)
    (line,) = listing(dra).values()
    assert " namespace=default pod=gone-pod bound=-" in line
    dra.delete(c)


CLAIM = {"metadata": {"name": "web-0-gpu-x7k2p", "namespace": "shop"},
         "status": {"reservedFor": [{"resource": "pods", "name": "web-0", "uid": "u"}]}}


def pod(*containers: tuple[str, list[str]], init: tuple[tuple[str, list[str]], ...] = (),
        template: bool = True) -> dict[str, Any]:
    """A pod whose claim entry ``gpu`` is the claim, made from a template (status) or named (spec)."""
    entry = {"name": "gpu", "resourceClaimTemplateName": "t"} if template else {"name": "gpu",
                                                                                "resourceClaimName": "web-0-gpu-x7k2p"}
    as_spec = [{"name": n, "resources": {"claims": [{"name": c} for c in cs]}} for n, cs in containers]
    return {"spec": {"resourceClaims": [entry], "containers": as_spec,
                     "initContainers": [{"name": n, "resources": {"claims": [{"name": c} for c in cs]}}
                                        for n, cs in init]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "web-0-gpu-x7k2p"}]}
            if template else {}}


@pytest.mark.parametrize(("the_pod", "labels", "why"), [
    (pod(("model", ["gpu"]), ("sidecar", [])), PodLabels("shop", "web-0", "model"), ""),
    (pod(("model", ["gpu"]), template=False), PodLabels("shop", "web-0", "model"), ""),
    (pod(("model", []), init=(("warm", ["gpu"]),)), PodLabels("shop", "web-0", "warm"), ""),
    (pod(("a", ["gpu"]), ("b", ["gpu"])), PodLabels("shop", "web-0"), "2 containers of its pod name it (a, b)"),
    (pod(("model", ["other"])), PodLabels("shop", "web-0"), "no container of its pod names it"),
    (None, PodLabels("shop", "web-0"), "its pod could not be read"),
])
def test_consumer_reads_reserved_for_and_the_pods_claims(the_pod: dict[str, Any] | None, labels: PodLabels,
                                                          why: str) -> None:
    assert consumer(CLAIM, the_pod) == (labels, why)


def test_a_claim_reserved_for_no_pod_names_none() -> None:
    assert consumer({"metadata": {"name": "c", "namespace": "n"}, "status": {}}, None) == (
        None, "the claim is reserved for no pod")
