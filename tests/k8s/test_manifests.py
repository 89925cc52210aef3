"""deploy/kubernetes/overlays/device-plugin, as ``kubectl kustomize`` renders it: every object validates against the
Kubernetes schema, and agrees with the configs (tests/deploy/test_kustomize.py checks every overlay and version)."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cgpu_device_plugin import config as plugin_config
from cgpu_testing import manifests

yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (test extra)")


@functools.cache
def _rendered() -> tuple[dict[str, Any], ...]:
    return tuple(manifests.render(manifests.OVERLAYS["device-plugin"]))


def documents() -> list[dict[str, Any]]:
    try:
        return list(_rendered())
    except manifests.NoKubectl:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the overlay)")


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind]
    return doc


def test_there_are_manifests() -> None:
    assert {d["kind"] for d in documents()} == {"DaemonSet", "ConfigMap", "PodMonitor", "ServiceAccount", "ClusterRole",
                                                "ClusterRoleBinding"}


def test_every_manifest_validates_against_the_kubernetes_schema() -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (it is in the test extra)")
    docs = documents()
    assert [manifests.problem(d, "1.37") for d in docs] == [None] * len(docs)


def test_the_plugin_config_in_the_configmap_is_valid() -> None:
    data = tomllib.loads(by_kind("ConfigMap")["data"]["cgpu-device-plugin.toml"])
    cfg, errors = plugin_config.from_mapping(data)
    assert errors == []
    assert cfg.alloc_mount == tomllib.loads(by_kind("ConfigMap")["data"]["arbiterd.toml"])["alloc_mount"]


def test_the_arbiterd_config_in_the_configmap_is_valid() -> None:
    from arbiterd.server import config as arbiterd_config

    data = tomllib.loads(by_kind("ConfigMap")["data"]["arbiterd.toml"])
    assert data["identity"] == "cgroup" and data["allocations"] == "required"
    assert data["alloc_mount"] == "/run/cgpu-alloc"
    cfg, errors = arbiterd_config.from_mapping(data)
    assert errors == [] and cfg.allocations == "required"


def test_the_plugin_sees_every_host_path_at_the_same_path() -> None:
    """Allocate names host paths; the plugin's container must see them where the host has them."""
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    plugin = next(c for c in spec["containers"] if c["name"] == "device-plugin")
    host_of = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
               for m in plugin["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert all(mount == host for mount, host in host_of.items())
    cfg, _ = plugin_config.from_mapping(tomllib.loads(by_kind("ConfigMap")["data"]["cgpu-device-plugin.toml"]))
    for path in (cfg.kubelet_dir, cfg.alloc_dir, cfg.socket_dir, str(Path(cfg.libcgpu).parent),
                 str(Path(cfg.pod_resources_socket).parent)):
        assert path in host_of, path
    pod_resources_dir = str(Path(cfg.pod_resources_socket).parent)
    (pod_resources,) = [m for m in plugin["volumeMounts"] if m["mountPath"] == pod_resources_dir]
    assert pod_resources["readOnly"] is True


def test_privileges_are_only_where_needed() -> None:
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["automountServiceAccountToken"] is False
    # the plugin's account lists pods (their cgpu.io/core-limit annotations), and its token is in its container only
    assert spec["serviceAccountName"] == "cgpu-device-plugin"
    assert by_kind("ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    tokens = {c["name"] for c in spec["containers"] + spec["initContainers"]
              for m in c.get("volumeMounts", []) if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"}
    assert tokens == {"device-plugin"}
    caps = {c["name"]: c["securityContext"]["capabilities"] for c in spec["containers"] + spec["initContainers"]}
    assert caps["arbiterd"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "SYS_NICE"]}
    assert caps["device-plugin"] == {"drop": ["ALL"]} and caps["install-libcgpu"] == {"drop": ["ALL"]}
    for c in spec["containers"] + spec["initContainers"]:
        assert not c["securityContext"].get("privileged", False)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
