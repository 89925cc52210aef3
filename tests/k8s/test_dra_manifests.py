"""deploy/kubernetes/overlays/dra as ``kubectl kustomize`` renders it, and deploy/kubernetes/examples/dra: every
object validates against the Kubernetes schemas of 1.34 to 1.37, the RBAC is exactly what the plugin calls, and the
example claims are placed by the scheduler model and prepared as meant."""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cgpu_dra_plugin import DRIVER, shareconfig
from cgpu_dra_plugin.claims import BadClaim, grants
from cgpu_dra_plugin.kubeapi import KubeApi
from cgpu_dra_plugin.main import build_parser
from cgpu_dra_plugin.slices import Gpu, resource_slice
from cgpu_testing import drasched, manifests
from cgpu_testing.drasched import allocate
from cgpu_testing.manifests import VERSIONS

EXAMPLES = manifests.EXAMPLES / "dra"
yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (test extra)")
GIB = 1 << 30


@functools.cache
def _rendered() -> tuple[dict[str, Any], ...]:
    return tuple(manifests.render(manifests.OVERLAYS["dra"]))


def examples() -> list[dict[str, Any]]:
    return [d for path in sorted(EXAMPLES.glob("example-*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def documents() -> list[dict[str, Any]]:
    """The overlay as kubectl kustomize renders it, and the examples."""
    try:
        return [*_rendered(), *examples()]
    except manifests.NoKubectl:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the overlay)")


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def test_the_manifests_are_there() -> None:
    kinds = sorted({d["kind"] for d in documents()})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "DeviceClass", "Pod",
                     "PodMonitor", "ResourceClaimTemplate", "ServiceAccount", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schema(version: str) -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")
    docs = documents()
    assert [manifests.problem(d, version) for d in docs] == [None] * len(docs)


CLIENT_VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update", "patch": "patch",
                "delete": "delete"}


def _source(module: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a name inside a module, not a module
        return None
    return ast.parse(Path(spec.origin).read_text()) if spec is not None and spec.origin else None


def _plugin_modules() -> dict[str, ast.Module]:
    """The cgpu_dra_plugin modules the plugin process imports (from cgpu_dra_plugin.main), parsed."""
    todo, seen = ["cgpu_dra_plugin.main"], {}
    while todo:
        name = todo.pop()
        tree = None if name in seen else _source(name)
        if tree is None:
            continue
        seen[name] = tree
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cgpu_dra_plugin"):
                todo += [str(node.module), *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("cgpu_dra_plugin")]
    return seen


def plugin_api_calls() -> dict[tuple[str, str], list[str]]:
    """(API group, resource) -> verbs, derived from the code: the KubeApi methods the plugin's modules call, and the
    ResourceV1Api (group resource.k8s.io) and CoreV1Api (the core group, "") calls in those methods (read_ -> get,
    list_ -> list, create_, replace_ -> update, delete_)."""
    methods = {n for n, _ in inspect.getmembers(KubeApi, inspect.isfunction) if not n.startswith("_")}
    used = set()
    modules = _plugin_modules()
    assert {"cgpu_dra_plugin.prepare", "cgpu_dra_plugin.publisher"} <= set(modules)
    assert "cgpu_dra_plugin.kubectl" not in modules  # kubectl-inspect-cgpu runs as the user, not as cgpu-dra
    for mod, tree in modules.items():
        if mod == "cgpu_dra_plugin.kubeapi":
            continue
        used |= {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr in methods}
    verbs: dict[tuple[str, str], set[str]] = {}
    for m in used:
        for api, call in re.findall(r"self\._(resource|core)\.(\w+)\(", inspect.getsource(getattr(KubeApi, m))):
            verb, _, rest = call.partition("_")
            kind = re.fullmatch(r"(?:namespaced_)?(?:resource_)?(\w+?)(?:_for_all_namespaces)?", rest)
            assert kind is not None and verb in CLIENT_VERBS, call
            group, prefix = ("resource.k8s.io", "resource") if api == "resource" else ("", "")
            verbs.setdefault((group, f"{prefix}{kind.group(1).replace('_', '')}s"), set()).add(CLIENT_VERBS[verb])
    return {r: sorted(v) for r, v in verbs.items()}


def test_rbac_grants_exactly_what_the_plugin_calls() -> None:
    """The ClusterRole's verbs per resource are those of the API calls the plugin's code makes (derived from the
    code, see plugin_api_calls), no more; and it is bound to the DaemonSet's service account."""
    calls = plugin_api_calls()
    assert calls[("resource.k8s.io", "resourceclaims")] and calls[("resource.k8s.io", "resourceslices")]
    assert calls[("", "pods")] == ["get"]  # the pod a claim is reserved for: its containers' names
    (role,) = of_kind("ClusterRole")
    assert all(len(rule["resources"]) == 1 and len(rule["apiGroups"]) == 1 for rule in role["rules"])
    assert {(rule["apiGroups"][0], rule["resources"][0]): sorted(rule["verbs"]) for rule in role["rules"]} == calls
    (binding,) = of_kind("ClusterRoleBinding")
    (sa,) = of_kind("ServiceAccount")
    (ds,) = of_kind("DaemonSet")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_the_admission_policy_confines_every_slice_write_of_the_plugin_to_its_node_and_driver() -> None:
    """The ValidatingAdmissionPolicy matches every write verb the role grants on resourceslices, for requests of
    the plugin's service account alone; it requires the token's node name, spec.nodeName equal to it, and
    spec.driver == gpu.cgpu.io; its binding denies what fails."""
    (policy,) = [p for p in of_kind("ValidatingAdmissionPolicy") if p["metadata"]["name"] == "cgpu-dra-resourceslices"]
    (binding,) = [b for b in of_kind("ValidatingAdmissionPolicyBinding")
                  if b["spec"]["policyName"] == policy["metadata"]["name"]]
    (sa,) = of_kind("ServiceAccount")
    spec = policy["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"] and rule["resources"] == ["resourceslices"]
    writes = {v.upper() for v in plugin_api_calls()[("resource.k8s.io", "resourceslices")] if v not in ("get", "list")}
    assert writes and writes <= set(rule["operations"])
    (cond,) = spec["matchConditions"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert cond["expression"] == f'request.userInfo.username == "{user}"'
    exprs = " ".join([v["expression"] for v in spec["variables"]] + [v["expression"] for v in spec["validations"]])
    assert "request.userInfo.extra[?'authentication.kubernetes.io/node-name']" in exprs
    assert "variables.userNodeName == variables.objectNodeName" in exprs and "spec.?nodeName" in exprs
    assert f"variables.slice.spec.driver == '{DRIVER}'" in exprs
    assert spec["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_plugin_command_parses_and_agrees_with_arbiterd() -> None:
    (ds,) = of_kind("DaemonSet")
    (plugin,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "dra-plugin"]
    args = build_parser().parse_args([*plugin["command"][1:], "--node-name", "n1"])
    (cm,) = of_kind("ConfigMap")
    arbiterd = tomllib.loads(cm["data"]["arbiterd.toml"])
    assert args.alloc_mount == arbiterd["alloc_mount"] and args.admin_socket == f"{arbiterd['run_dir']}/admin.sock"
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    assert {args.registry_dir, args.plugin_dir, args.cdi_dir, args.state_dir, args.socket_dir} <= mounts
    classes = {dc["metadata"]["name"]: dc for dc in of_kind("DeviceClass")}
    assert sorted(classes) == [DRIVER, f"{DRIVER}-highprio"]
    for dc in classes.values():
        assert DRIVER in dc["spec"]["selectors"][0]["cel"]["expression"]


def test_high_priority_comes_from_the_highprio_device_class_and_a_claim_cannot_ask_it() -> None:
    """The scheduler model copies gpu.cgpu.io-highprio's ShareConfig (source FromClass): a claim naming that class
    is high priority and may still set its weight; a claim of the plain class whose own config says highPriority
    is refused with one line."""
    classes = {dc["metadata"]["name"]: dc for dc in of_kind("DeviceClass")}
    slices = [resource_slice("n1", DRIVER, [Gpu(0, "GPU-0", "A10", 16 * GIB, 1)], 1)]

    def granted(device_class: str, **share: Any) -> Any:
        cfg = {"apiVersion": shareconfig.API_VERSION, "kind": shareconfig.KIND, **share} if share else None
        c = drasched.claim("c", memory="1Gi", device_class=device_class, config=cfg)
        c["metadata"]["uid"] = "u"
        c["status"] = {"allocation": drasched.allocate(c, slices, [], {n: DRIVER for n in classes}, "n1",
                                                        {n: dc["spec"].get("config", []) for n, dc in classes.items()})}
        (g,) = grants(c, DRIVER, "n1")
        return g.config

    assert granted(DRIVER).high_priority is False
    assert granted(f"{DRIVER}-highprio").high_priority is True
    both = granted(f"{DRIVER}-highprio", weight=3)
    assert (both.high_priority, both.weight) == (True, 3)
    with pytest.raises(BadClaim, match=f"highPriority is taken only from a DeviceClass.*{DRIVER}-highprio"):
        granted(DRIVER, highPriority=True)


def test_the_example_claims_are_placed_on_one_card_and_carry_their_share_config() -> None:
    """Each example file's claims, allocated by the scheduler model on an empty node of two 16 GiB cards: memory
    alone takes 4Gi and no cores; memory with cores 4Gi and 30; the weight pair share GPU 0, weights 1 and 2."""
    got = {}
    for path in sorted(EXAMPLES.glob("example-*.yaml")):
        slices = [resource_slice("n1", DRIVER, [Gpu(i, f"GPU-{i}", "A10", 16 * GIB, 1) for i in range(2)], 1)]
        done: list[dict[str, Any]] = []
        for t in (d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ResourceClaimTemplate"):
            c = {"metadata": {"name": t["metadata"]["name"], "namespace": "default", "uid": t["metadata"]["name"]},
                 "spec": t["spec"]["spec"]}
            c["status"] = {"allocation": allocate(c, slices, done, {DRIVER: DRIVER}, "n1")}
            done.append(c)
            (g,) = grants(c, DRIVER, "n1")
            got[t["metadata"]["name"]] = (g.device, g.memory // GIB, g.cores, g.config.weight)
    assert got == {"gpu-4gi": ("gpu-0", 4, 0, 0), "gpu-4gi-30": ("gpu-0", 4, 30, 0),
                   "gpu-weight-1": ("gpu-0", 6, 0, 1), "gpu-weight-2": ("gpu-0", 6, 0, 2)}
    for t in of_kind("ResourceClaimTemplate"):
        for cfg in t["spec"]["spec"]["devices"].get("config", []):
            assert shareconfig.parse(cfg["opaque"]["parameters"]).weight in (1, 2)
    templates = {t["metadata"]["name"] for t in of_kind("ResourceClaimTemplate")}
    for pod in of_kind("Pod"):
        (rc,) = pod["spec"]["resourceClaims"]
        assert rc["resourceClaimTemplateName"] in templates
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": rc["name"]}]
