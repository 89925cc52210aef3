"""deploy/kubernetes/dra/admission.yaml, policy cgpu-highprio-claims: a ResourceClaim or ResourceClaimTemplate may
name the DeviceClass gpu.cgpu.io-highprio only in a namespace an administrator labelled cgpu.io/highprio=allowed.

How this works: the policy's CEL is read from the shipped file and run by cel-python (``celpy``), a CEL interpreter,
as the API server runs a ValidatingAdmissionPolicy
(https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/): the request must match a
rule of ``matchConstraints``, then the variables are evaluated in order, each seeing those before it, then every
validation. ``object`` is a claim as the fake API server stores it (``FakeApiServer.put``, checked against the
Kubernetes 1.34 schema of its apiVersion) or a template checked by the same ``validate``; ``namespaceObject`` is its
Namespace; ``request`` names the resource. A false validation denies with its messageExpression. An expression that
fails to evaluate would deny too (failurePolicy Fail); here it fails the test, except in the mutants, which show
that every case table entry is needed: each weakened copy of the policy gets at least one case wrong."""

from __future__ import annotations

import copy
import importlib.resources
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cgpu_dra_plugin import DRIVER
from cgpu_testing.apiserver import FakeApiServer, validate
from cgpu_testing.tools import ROOT

DEPLOY = ROOT / "deploy" / "kubernetes" / "overlays" / "dra"
EXAMPLES = ROOT / "deploy" / "kubernetes" / "examples" / "dra"
ADMISSION = DEPLOY / "admission.yaml"
POLICY = "cgpu-highprio-claims"
LABEL, ALLOWED = "cgpu.io/highprio", "allowed"
HIGHPRIO = f"{DRIVER}-highprio"
VERSIONS = ("1.34", "1.35", "1.36", "1.37")
NS = "team-a"
yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (test extra)")
celpy = pytest.importorskip("celpy", reason="cel-python is in the test extra")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

# Where a request of each resource.k8s.io version names a DeviceClass (the API types DeviceRequest,
# ExactDeviceRequest and DeviceSubRequest; test_the_shapes_are_every_field_that_names_a_class checks them against the
# schemas), and a request naming ``cls`` through each.
FIELDS = {"exactly": "spec.devices.requests[].exactly.deviceClassName",
          "deviceClassName": "spec.devices.requests[].deviceClassName",
          "firstAvailable": "spec.devices.requests[].firstAvailable[].deviceClassName"}
SHAPES = {"v1": ("exactly", "firstAvailable"), "v1beta2": ("exactly", "firstAvailable"),
          "v1beta1": ("deviceClassName", "firstAvailable")}


def request(shape: str, cls: str, name: str = "gpu") -> dict[str, Any]:
    if shape == "exactly":
        return {"name": name, "exactly": {"deviceClassName": cls}}
    if shape == "deviceClassName":
        return {"name": name, "deviceClassName": cls}
    return {"name": name, "firstAvailable": [{"name": "plain", "deviceClassName": DRIVER},
                                             {"name": "high", "deviceClassName": cls}]}


def claim(*requests: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """A ResourceClaim in NS as the fake API server stores it (schema-checked, uid and resourceVersion set)."""
    obj = {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
           "metadata": {"name": "c", "namespace": NS}, "spec": {"devices": {"requests": list(requests)}}}
    return FakeApiServer().put("resourceclaims", obj)


def template(*requests: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """A ResourceClaimTemplate in NS, checked as the fake API server checks what it stores."""
    obj = {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimTemplate",
           "metadata": {"name": "t", "namespace": NS}, "spec": {"spec": {"devices": {"requests": list(requests)}}}}
    assert validate(obj) is None
    return obj


def namespace(labels: dict[str, str] | None) -> dict[str, Any]:
    """NS as the API server keeps it: kubernetes.io/metadata.name always, plus ``labels`` (None: no labels at all)."""
    meta: dict[str, Any] = {"name": NS}
    if labels is not None:
        meta["labels"] = {"kubernetes.io/metadata.name": NS, **labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def shipped_templates() -> list[dict[str, Any]]:
    out = []
    for path in sorted(EXAMPLES.glob("example-*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d["kind"] == "ResourceClaimTemplate":
                d["metadata"]["namespace"] = NS
                out.append(d)
    return out


def policy_docs() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(ADMISSION.read_text()) if d}
    return (docs[("ValidatingAdmissionPolicy", POLICY)], docs[("ValidatingAdmissionPolicyBinding", POLICY)])


# ------------------------------------------------------------ the CEL, run as the API server runs it
def _cel(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def _matched(spec: dict[str, Any], group: str, version: str, plural: str, operation: str) -> bool:
    return any(group in r["apiGroups"] and {version, "*"} & set(r["apiVersions"])
               and {operation, "*"} & set(r["operations"]) and {plural, "*"} & set(r["resources"])
               for r in spec["matchConstraints"]["resourceRules"])


def denials(spec: dict[str, Any], obj: dict[str, Any], ns: dict[str, Any]) -> list[str]:
    """The messages of the policy ``spec``'s validations that deny creating ``obj`` in ``ns``; [] admits it."""
    group, version = obj["apiVersion"].split("/")
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[obj["kind"]]
    if not _matched(spec, group, version, plural, "CREATE"):
        return []
    req = {"operation": "CREATE", "namespace": ns["metadata"]["name"], "name": obj["metadata"]["name"],
           "kind": {"group": group, "version": version, "kind": obj["kind"]},
           "resource": {"group": group, "version": version, "resource": plural}}
    act: dict[str, Any] = {"object": celpy.json_to_cel(obj), "oldObject": None, "request": celpy.json_to_cel(req),
                           "namespaceObject": celpy.json_to_cel(ns)}
    variables: dict[Any, Any] = {}
    for var in spec.get("variables", []):
        act["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(var["name"])] = _cel(var["expression"], act)
    act["variables"] = celpy.celtypes.MapType(variables)
    return [str(_cel(v["messageExpression"], act)) if "messageExpression" in v else v["message"]
            for v in spec["validations"] if not _cel(v["expression"], act)]


# ------------------------------------------------------------ the cases
@dataclass(frozen=True, slots=True)
class Case:
    name: str
    obj: dict[str, Any]
    labels: dict[str, str] | None
    allowed: bool


def cases() -> list[Case]:
    yes, other = {LABEL: ALLOWED}, {"team": "a"}
    out = [
        Case("v1 claim of the highprio class, namespace with no labels", claim(request("exactly", HIGHPRIO)),
             None, False),
        Case("v1 claim of the plain class, namespace with no labels", claim(request("exactly", DRIVER)), None, True),
        Case("v1 claim of the plain class, labelled namespace", claim(request("exactly", DRIVER)), yes, True),
        Case("label value true", claim(request("exactly", HIGHPRIO)), {LABEL: "true"}, False),
        Case("label value Allowed", claim(request("exactly", HIGHPRIO)), {LABEL: "Allowed"}, False),
        Case("label value empty", claim(request("exactly", HIGHPRIO)), {LABEL: ""}, False),
        Case("value allowed under another key", claim(request("exactly", HIGHPRIO)), {"cgpu.io/priority": ALLOWED},
             False),
        Case("highprio in the second request",
             claim(request("exactly", DRIVER, "a"), request("exactly", HIGHPRIO, "b")), other, False),
        Case("highprio in the second request, labelled",
             claim(request("exactly", DRIVER, "a"), request("exactly", HIGHPRIO, "b")), yes, True),
        Case("plain class in two requests",
             claim(request("exactly", DRIVER, "a"), request("firstAvailable", DRIVER, "b")), other, True),
        Case("template of the highprio class, no labels", template(request("exactly", HIGHPRIO)), None, False),
        Case("template with highprio in the second request",
             template(request("exactly", DRIVER, "a"), request("exactly", HIGHPRIO, "b")), other, False),
        Case("template of the highprio class, label value true", template(request("exactly", HIGHPRIO)),
             {LABEL: "true"}, False),
    ]
    for version, shapes in SHAPES.items():
        for shape in shapes:
            out += [Case(f"{version} claim, highprio in {shape}", claim(request(shape, HIGHPRIO), version=version),
                         other, False),
                    Case(f"{version} claim, highprio in {shape}, labelled",
                         claim(request(shape, HIGHPRIO), version=version), yes, True),
                    Case(f"{version} claim, plain class in {shape}", claim(request(shape, DRIVER), version=version),
                         other, True),
                    Case(f"{version} template, highprio in {shape}",
                         template(request(shape, HIGHPRIO), version=version), other, False),
                    Case(f"{version} template, highprio in {shape}, labelled",
                         template(request(shape, HIGHPRIO), version=version), yes, True)]
    for t in shipped_templates():
        out.append(Case(f"shipped template {t['metadata']['name']}", t, other, True))
        high = copy.deepcopy(t)
        high["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = HIGHPRIO
        out += [Case(f"shipped template {t['metadata']['name']} with the highprio class", high, other, False),
                Case(f"shipped template {t['metadata']['name']} with the highprio class, labelled", high, yes, True)]
    return out


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_policy_admits_the_highprio_class_only_in_a_namespace_labelled_allowed(case: Case) -> None:
    """Each case as its name says: denied where a request (exactly, deviceClassName, or a firstAvailable
    subrequest, in any request, of a claim or a template) names gpu.cgpu.io-highprio and the namespace's label
    cgpu.io/highprio is not exactly "allowed"; admitted otherwise. A denial says why and what to label."""
    spec = policy_docs()[0]["spec"]
    got = denials(spec, case.obj, namespace(case.labels))
    assert (got == []) is case.allowed, got
    for message in got:
        assert HIGHPRIO in message and f"{LABEL}={ALLOWED}" in message and f"'{NS}'" in message


def _weakened(spec: dict[str, Any], where: str, old: str, new: str) -> dict[str, Any]:
    """``spec`` with ``old`` replaced by ``new`` in the expression ``where`` names (``validation`` or a variable)."""
    spec = copy.deepcopy(spec)
    entries = spec["validations"] if where == "validation" else [v for v in spec["variables"] if v["name"] == where]
    (entry,) = entries
    assert old in entry["expression"], (where, old)
    entry["expression"] = entry["expression"].replace(old, new)
    return spec


def _rule(spec: dict[str, Any], key: str, value: list[str]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    (rule,) = spec["matchConstraints"]["resourceRules"]
    rule[key] = value
    return spec


MUTANTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "validation true": lambda s: _weakened(s, "validation", s["validations"][0]["expression"], "true"),
    "exactly not looked at": lambda s: _weakened(
        s, "namesHighprio", "(has(r.exactly) && r.exactly.deviceClassName == variables.highprioClass)", "false"),
    "v1beta1 deviceClassName not looked at": lambda s: _weakened(
        s, "namesHighprio", "(has(r.deviceClassName) && r.deviceClassName == variables.highprioClass)", "false"),
    "firstAvailable not looked at": lambda s: _weakened(
        s, "namesHighprio",
        "(has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName == variables.highprioClass))",
        "false"),
    "only the first request": lambda s: _weakened(s, "namesHighprio", "variables.requests.exists(",
                                                  "[variables.requests[0]].exists("),
    "any value of the label": lambda s: _weakened(
        s, "namespaceAllowed", "&& namespaceObject.metadata.labels['cgpu.io/highprio'] == 'allowed'", ""),
    "templates read as claims": lambda s: _weakened(s, "claimSpec", "? object.spec.spec", "? object.spec"),
    "claims only": lambda s: _rule(s, "resources", ["resourceclaims"]),
    "templates only": lambda s: _rule(s, "resources", ["resourceclaimtemplates"]),
    "updates only": lambda s: _rule(s, "operations", ["UPDATE"]),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_weakened_policy_gets_some_case_wrong(mutant: str) -> None:
    """The case table is strong enough: with the policy weakened this way, at least one case's verdict changes (an
    expression that fails to evaluate counts as a denial, as failurePolicy Fail makes it)."""
    spec = MUTANTS[mutant](policy_docs()[0]["spec"])

    def allowed(case: Case) -> bool:
        try:
            return denials(spec, case.obj, namespace(case.labels)) == []
        except celpy.CELEvalError:
            return False

    wrong = [c.name for c in CASES if allowed(c) is not c.allowed]
    assert wrong, f"no case notices the mutant {mutant!r}"


# ------------------------------------------------------------ the manifests
def _defs(version: str) -> dict[str, Any]:
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    defs: dict[str, Any] = json.loads((root / f"v{version}.0-local-strict" / "_definitions.json").read_text())["$defs"]
    return defs


def _class_fields(defs: dict[str, Any], node: dict[str, Any], path: str, seen: frozenset[str]) -> set[str]:
    """The paths under ``node`` of every property named deviceClassName."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        return set() if name in seen else _class_fields(defs, defs[name], path, seen | {name})
    out = set()
    for key, sub in (node.get("properties") or {}).items():
        out |= {f"{path}.{key}"} if key == "deviceClassName" else _class_fields(defs, sub, f"{path}.{key}", seen)
    if "items" in node:
        out |= _class_fields(defs, node["items"], f"{path}[]", seen)
    if isinstance(node.get("additionalProperties"), dict):
        out |= _class_fields(defs, node["additionalProperties"], f"{path}{{}}", seen)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shapes_are_every_field_that_names_a_class(version: str) -> None:
    """In the Kubernetes schemas, the resource.k8s.io versions with a ResourceClaimSpec are those the cases cover,
    and in each a class is named exactly at the fields the cases put gpu.cgpu.io-highprio in."""
    defs = _defs(version)
    prefix, suffix = "io.k8s.api.resource.", ".ResourceClaimSpec"
    found = {name[len(prefix):-len(suffix)]: _class_fields(defs, defs[name], "spec", frozenset())
             for name in defs if name.startswith(prefix) and name.endswith(suffix)}
    assert found == {v: {FIELDS[s] for s in shapes} for v, shapes in SHAPES.items()}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_policy_and_its_binding_validate_against_the_kubernetes_schema(version: str) -> None:
    for doc in policy_docs():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_policy_guards_the_shipped_highprio_class_on_every_create_and_denies() -> None:
    """It names the DeviceClass of deviceclass-highprio.yaml (the one whose config sets highPriority), matches
    CREATE of claims and templates in every version of resource.k8s.io (both specs are immutable, so updates need no
    check), fails closed, and its binding denies."""
    policy, binding = policy_docs()
    (highprio,) = list(yaml.safe_load_all((DEPLOY / "deviceclass-highprio.yaml").read_text()))
    assert highprio["spec"]["config"][0]["opaque"]["parameters"]["highPriority"] is True
    (var,) = [v for v in policy["spec"]["variables"] if v["name"] == "highprioClass"]
    assert _cel(var["expression"], {}) == highprio["metadata"]["name"] == HIGHPRIO
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
