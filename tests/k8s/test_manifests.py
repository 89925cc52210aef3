"""deploy/kubernetes: every manifest validates against the Kubernetes schema, and agrees with the configs."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from cgpu_device_plugin import config as plugin_config
from cgpu_testing.tools import ROOT

DEPLOY = ROOT / "deploy" / "kubernetes"

yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (test extra)")


def documents() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind]
    return doc


def test_there_are_manifests() -> None:
    assert {d["kind"] for _, d in documents()} == {"DaemonSet", "ConfigMap"}


@pytest.mark.parametrize(("path", "doc"), documents(), ids=lambda v: v.name if isinstance(v, Path) else v["kind"])
def test_every_manifest_validates_against_the_kubernetes_schema(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (it is in the test extra)")
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


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
    for path in (cfg.kubelet_dir, cfg.alloc_dir, cfg.socket_dir, str(Path(cfg.libcgpu).parent)):
        assert path in host_of, path


def test_privileges_are_only_where_needed() -> None:
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    caps = {c["name"]: c["securityContext"]["capabilities"] for c in spec["containers"] + spec["initContainers"]}
    assert caps["arbiterd"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "SYS_NICE"]}
    assert caps["device-plugin"] == {"drop": ["ALL"]} and caps["install-libcgpu"] == {"drop": ["ALL"]}
    for c in spec["containers"] + spec["initContainers"]:
        assert not c["securityContext"].get("privileged", False)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
