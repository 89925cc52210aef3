"""kubectl-inspect-cgpu against the fake API server, read through a kubeconfig as kubectl's plugins are: per node
and GPU memory and cores allocated against the total, the cluster total, and with -d the pods on each card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cgpu_dra_plugin import DRIVER
from cgpu_dra_plugin.kubectl import main
from cgpu_dra_plugin.slices import Gpu, resource_slice
from cgpu_testing.apiserver import FakeApiServer
from cgpu_testing.drasched import allocate, claim

GIB = 1 << 30


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with FakeApiServer() as api:
        for node, n in (("node-a", 2), ("node-b", 1)):
            api.put("resourceslices", resource_slice(node, DRIVER, [Gpu(i, f"GPU-{node}-{i}", "A10", 24 * GIB, 1)
                                                                    for i in range(n)], 1))
        slices = api.list("resourceslices")
        for name, mem, cores, node in (("p1", "4Gi", 30, "node-a"), ("p2", "8Gi", None, "node-a"),
                                       ("p3", "2Gi", 50, "node-b")):
            c = api.put("resourceclaims", claim(name, memory=mem, cores=cores))
            c["status"] = {"allocation": allocate(c, slices, api.list("resourceclaims"), {DRIVER: DRIVER}, node),
                           "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": f"u-{name}"}]}
            api.put("resourceclaims", c)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "me", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}]}))
        yield kubeconfig


def test_the_table_shows_each_card_and_the_cluster_total(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kubeconfig", str(cluster)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {(ln.split()[0], ln.split()[1]): ln for ln in lines[1:-1]}
    assert "12/24 (50%)" in rows[("node-a", "0")] and "30/100 (30%)" in rows[("node-a", "0")]
    assert "0/24 (0%)" in rows[("node-a", "1")]
    assert "2/24" in rows[("node-b", "0")] and "50/100" in rows[("node-b", "0")]
    assert lines[-1].startswith("TOTAL (2 nodes)") and "3 GPUs" in lines[-1]
    assert "14/72 (19%)" in lines[-1] and "80/300 (27%)" in lines[-1]


def test_details_list_the_pods_on_each_card(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kubeconfig", str(cluster), "-d", "--node", "node-a"]) == 0
    out = capsys.readouterr().out
    assert "default/pod-p1" in out and "claim p1" in out and "default/pod-p2" in out and "pod-p3" not in out


def test_json_gives_the_same_numbers(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kubeconfig", str(cluster), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {(g["node"], g["index"]): (g["memory_used"] // GIB, g["cores_used"], len(g["uses"])) for g in doc}
    assert got == {("node-a", 0): (12, 30, 2), ("node-a", 1): (0, 0, 0), ("node-b", 0): (2, 50, 1)}


def test_an_unreachable_api_server_is_one_line_and_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["--kubeconfig", str(missing)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kubectl-inspect-cgpu: cannot reach the API server") and err.count("\n") == 1


def test_a_kubeconfig_naming_a_dead_server_is_one_line_and_exit_3(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "me"}}]}))
    assert main(["--kubeconfig", str(kubeconfig)]) == 3
    assert capsys.readouterr().err.startswith("kubectl-inspect-cgpu: cannot reach the API server")
