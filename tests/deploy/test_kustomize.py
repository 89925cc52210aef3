"""deploy/kubernetes is a kustomize base and two overlays: ``kubectl kustomize`` renders each, every object it
renders validates for Kubernetes 1.34 to 1.37 (built-in kinds with ``kubernetes-validate``, the PodMonitor with its
CRD's schema), the pipeline an operator's CI runs passes, and the same pipeline fails on a planted error."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cgpu_testing import manifests
from cgpu_testing.manifests import DEPLOY, OVERLAYS, VERSIONS, problem

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")


def rendered(overlay: str) -> list[dict[str, Any]]:
    try:
        return manifests.render(OVERLAYS[overlay])
    except manifests.NoKubectl:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the overlays)")


def validator() -> str:
    found = shutil.which("kubernetes-validate") or str(Path(sys.executable).with_name("kubernetes-validate"))
    if not Path(found).exists():
        pytest.skip("the kubernetes-validate command is not installed")
    return found


def pipeline(root: Path, overlay: str, version: str) -> subprocess.CompletedProcess[str]:
    """``kubectl kustomize OVERLAY | kubernetes-validate --strict -k VERSION -``, from ``root``."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    cmd = f"kubectl kustomize {root / 'overlays' / overlay} | {validator()} --strict --quiet -k {version} -"
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_rendered_object_validates(overlay: str, version: str) -> None:
    objs = rendered(overlay)
    assert objs and [problem(o, version) for o in objs] == [None] * len(objs)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_pipeline_passes_and_fails_on_a_planted_error(overlay: str, tmp_path: Path) -> None:
    """The CI step: ``kubectl kustomize deploy/kubernetes/overlays/OVERLAY | kubernetes-validate`` exits 0; with
    ``hostPID: "yes"`` planted in the base's DaemonSet it exits non-zero and names the field."""
    ok = pipeline(DEPLOY, overlay, "1.37")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    planted = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, planted)
    ds = planted / "base" / "daemonset.yaml"
    ds.write_text(ds.read_text().replace("hostPID: true", 'hostPID: "yes"', 1))
    bad = pipeline(planted, overlay, "1.37")
    assert bad.returncode != 0
    assert "spec.template.spec.hostPID: 'yes' is not of type 'boolean'" in bad.stdout + bad.stderr


def test_a_planted_error_in_the_podmonitor_is_caught_by_its_crd_schema() -> None:
    (pm,) = [o for o in rendered("dra") if o["kind"] == "PodMonitor"]
    assert problem(pm, "1.34") is None
    bad = copy.deepcopy(pm)
    bad["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    assert "'honourLabels' was unexpected" in str(problem(bad, "1.34"))
    bad = copy.deepcopy(pm)
    bad["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "rename"
    assert "'rename' is not one of" in str(problem(bad, "1.34"))


def test_the_overlays_share_the_base_and_differ_only_by_their_plugin() -> None:
    """arbiterd, its ConfigMap and the PodMonitor come from the base, written once; each overlay adds its plugin
    container and what it needs, and keeps the DaemonSet names operators know (cgpu, cgpu-dra)."""
    dp, dra = rendered("device-plugin"), rendered("dra")
    kinds = {o: sorted((x["kind"], x["metadata"]["name"].rsplit("-", 1)[0] if x["kind"] == "ConfigMap"
                        else x["metadata"]["name"]) for x in objs) for o, objs in (("dp", dp), ("dra", dra))}
    assert kinds["dp"] == sorted([("ConfigMap", "cgpu-config"), ("DaemonSet", "cgpu"), ("PodMonitor", "cgpu"),
                                  ("ServiceAccount", "cgpu-device-plugin"), ("ClusterRole", "cgpu-device-plugin"),
                                  ("ClusterRoleBinding", "cgpu-device-plugin")])
    assert kinds["dra"] == sorted([("ConfigMap", "cgpu-config"), ("DaemonSet", "cgpu-dra"), ("PodMonitor", "cgpu"),
                                   ("ServiceAccount", "cgpu-dra"), ("ClusterRole", "cgpu-dra"),
                                   ("ClusterRoleBinding", "cgpu-dra"), ("DeviceClass", "gpu.cgpu.io"),
                                   ("DeviceClass", "gpu.cgpu.io-highprio"),
                                   ("ValidatingAdmissionPolicy", "cgpu-dra-resourceslices"),
                                   ("ValidatingAdmissionPolicy", "cgpu-highprio-claims"),
                                   ("ValidatingAdmissionPolicyBinding", "cgpu-dra-resourceslices"),
                                   ("ValidatingAdmissionPolicyBinding", "cgpu-highprio-claims")])

    def containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        (ds,) = [x for x in objs if x["kind"] == "DaemonSet"]
        return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}

    assert sorted(containers(dp)) == ["arbiterd", "device-plugin"] and sorted(containers(dra)) == ["arbiterd",
                                                                                                   "dra-plugin"]
    assert containers(dp)["arbiterd"] == containers(dra)["arbiterd"]  # one definition, in the base
    written = [p for p in DEPLOY.rglob("*.yaml") if "name: arbiterd" in p.read_text()]
    assert written == [DEPLOY / "base" / "daemonset.yaml"]
    for objs in (dp, dra):
        assert {c["image"] for c in containers(objs).values()} == {"cgpu:0.1.0"}
        for x in objs:
            namespaced = x["kind"] in ("ConfigMap", "DaemonSet", "PodMonitor", "ServiceAccount")
            assert (x["metadata"].get("namespace") == "kube-system") == namespaced, x["metadata"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_podmonitor_scrapes_arbiterds_metrics_port_and_keeps_the_tenants_pod_labels(overlay: str) -> None:
    """It selects the DaemonSet's pods, scrapes the port arbiterd serves metrics_listen on, keeps the metrics' own
    namespace/pod/container (honorLabels, the target's dropped: a host instance must not look like arbiterd's pod),
    names the node, and sets job cgpu, as the alert rules expect."""
    objs = rendered(overlay)
    (pm,) = [x for x in objs if x["kind"] == "PodMonitor"]
    (ds,) = [x for x in objs if x["kind"] == "DaemonSet"]
    (cm,) = [x for x in objs if x["kind"] == "ConfigMap"]
    template = ds["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= template.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    (arbiterd,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "arbiterd"]
    (port,) = [p for p in arbiterd["ports"] if p["name"] == endpoint["port"]]
    listen = tomllib.loads(cm["data"]["arbiterd.toml"])["metrics_listen"]
    assert listen == f"0.0.0.0:{port['containerPort']}" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    relabel = endpoint["relabelings"]
    assert {"action": "labeldrop", "regex": "namespace|pod|container"} in relabel
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in relabel
    assert {"action": "replace", "targetLabel": "job", "replacement": "cgpu"} in relabel


def test_the_device_plugin_may_only_list_pods_and_only_its_container_holds_the_token() -> None:
    """The device plugin reads its node's pods for their cgpu.io/core-limit annotations: its ClusterRole lists pods
    and nothing more; the pod mounts no token by default, and the projected one is in the plugin's container
    alone, with NODE_NAME from spec.nodeName (the field selector it lists by)."""
    dp = rendered("device-plugin")
    (role,) = [o for o in dp if o["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    (ds,) = [o for o in dp if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "cgpu-device-plugin"
    mounts = {c["name"]: [m["name"] for m in c.get("volumeMounts", [])] for c in spec["containers"]}
    assert "kube-api-access" in mounts["device-plugin"] and "kube-api-access" not in mounts["arbiterd"]
    (plugin,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in plugin["env"]
