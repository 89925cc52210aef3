"""deploy/kubernetes as an operator applies it: each overlay rendered by ``kubectl kustomize``, each object checked
against the schema the API server would check it with.

* :func:`render` runs ``kubectl kustomize DIR`` (kubectl embeds kustomize; v1.32 here) and returns the objects;
  :class:`NoKubectl` when kubectl is not installed (the tests skip then).
* :func:`problem` validates one object for a Kubernetes version: built-in kinds with ``kubernetes-validate`` (the
  upstream OpenAPI schemas, strict: an unknown field fails), the prometheus-operator's ``PodMonitor`` with the
  ``openAPIV3Schema`` of its CRD (vendored: cgpu_testing/crds), made strict the same way (an object of declared
  ``properties`` takes no other field, as the API server's strict field validation refuses unknown ones).
"""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cgpu_testing.tools import ROOT

DEPLOY = ROOT / "deploy" / "kubernetes"
OVERLAYS = {"device-plugin": DEPLOY / "overlays" / "device-plugin", "dra": DEPLOY / "overlays" / "dra"}
EXAMPLES = DEPLOY / "examples"
VERSIONS = ("1.34", "1.35", "1.36", "1.37")
CRDS = Path(__file__).resolve().parent / "crds"


class NoKubectl(Exception):
    """kubectl is not installed."""


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` renders; raise NoKubectl, or RuntimeError with kubectl's reason."""
    import yaml  # type: ignore[import-untyped]

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise NoKubectl("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@functools.cache
def _crd_schema(kind: str, api_version: str) -> dict[str, Any] | None:
    import yaml

    group, _, version = api_version.partition("/")
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            spec = (crd or {}).get("spec") or {}
            if spec.get("group") != group or spec.get("names", {}).get("kind") != kind:
                continue
            for v in spec.get("versions") or []:
                if v.get("name") == version:
                    return _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    return None


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` where every object with ``properties`` refuses others (unless it preserves unknown fields)."""
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for key in ("properties", "patternProperties"):
        for sub in (schema.get(key) or {}).values():
            _strict(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            _strict(sub)
    return schema


def problem(obj: dict[str, Any], version: str) -> str | None:
    """None if ``obj`` is valid for Kubernetes ``version``, else one line naming the object and the fault."""
    import jsonschema  # type: ignore[import-untyped]
    import kubernetes_validate  # type: ignore[import-untyped]

    name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    crd = _crd_schema(str(obj.get("kind")), str(obj.get("apiVersion")))
    if crd is not None:
        try:
            jsonschema.validate(obj, crd)
        except jsonschema.ValidationError as exc:
            return f"{name}: {exc.message} at {list(exc.absolute_path)}"
        return None
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{name}: {exc.message} at {list(exc.path)}"
    except kubernetes_validate.utils.SchemaNotFoundError:
        return f"{name}: no schema for {obj.get('apiVersion')} {obj.get('kind')} in Kubernetes {version}"
    return None
