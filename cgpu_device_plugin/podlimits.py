"""A container's GPU-time limit beside its ``aliyun.com/gpu-core.percentage`` request: the pod's annotation.

Kubernetes gives an extended resource one number: its request must equal its limit, so
``aliyun.com/gpu-core.percentage: 30`` can only say "30 %". The core percentage stays the
**request** (the share under contention, and what the kubelet places by); the **limit**, the
most GPU time the container may use even on an idle card, is the pod's annotation::

    metadata:
      annotations:
        cgpu.io/core-limit: "60"                  # every container of the pod that asks for cores
        cgpu.io/core-limit: "main=60,sidecar=40"  # or per container, by name

An annotation is written by whoever writes the pod, as its resources are, and, unlike a
container's environment, nothing inside the container can change it. The plugin learns which
pod and container hold an allocation from the kubelet (podresources.py), then reads the pods of
its node from the API server (``list`` with ``fieldSelector=spec.nodeName=NODE``, one request a
poll; the DaemonSet's ClusterRole grants ``get``/``list`` on pods) and sets each core allocation's
ceiling in arbiterd (``alloc_ctl limit``). Until then, and without an annotation, the core
percentage is a hard cap, as in cGPU. A limit below the request, or not a whole 5..100, is logged
once and not applied.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from arbiterd.core.podlabels import PodLabels

log = logging.getLogger("cgpu_device_plugin.podlimits")
ANNOTATION = "cgpu.io/core-limit"
_ONE = re.compile(r"(?:[1-9][0-9]?|100)")
_PAIR = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)=((?:[1-9][0-9]?|100))")

ContainerKey = tuple[str, str, str]  # (namespace, pod, container)


class BadAnnotation(ValueError):
    """An annotation value that is neither ``P`` nor ``name=P[,name=P]``."""


def parse(value: str) -> tuple[int | None, dict[str, int]]:
    """``"60"`` -> (60, {}); ``"main=60,side=40"`` -> (None, {"main": 60, "side": 40}); raise BadAnnotation."""
    text = value.strip()
    if _ONE.fullmatch(text):
        return _in_range(int(text), text), {}
    out: dict[str, int] = {}
    for part in text.split(","):
        m = _PAIR.fullmatch(part.strip())
        if m is None or m.group(1) in out:
            raise BadAnnotation(f"{ANNOTATION}: {value!r} is not P or name=P[,name=P] (P a percentage 5..100, each "
                                "container once)")
        out[m.group(1)] = _in_range(int(m.group(3)), value)
    return None, out


def _in_range(p: int, text: str) -> int:
    if not 5 <= p <= 100:
        raise BadAnnotation(f"{ANNOTATION}: {text!r}: a limit is a percentage 5..100")
    return p


def limits_of(pods: list[dict[str, Any]]) -> tuple[dict[ContainerKey, int], list[str]]:
    """Each annotated container's limit, from pod objects as the API serves them (JSON); and one line per pod
    whose annotation is malformed (none of its containers get a limit from it)."""
    out: dict[ContainerKey, int] = {}
    bad: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        value = (meta.get("annotations") or {}).get(ANNOTATION)
        if not isinstance(value, str):
            continue
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            every, each = parse(value)
        except BadAnnotation as exc:
            bad.append(f"pod {ns}/{name}: {exc}")
            continue
        for c in (pod.get("spec") or {}).get("containers") or []:
            cname = str(c.get("name", ""))
            p = each.get(cname, every)
            if p is not None:
                out[(ns, name, cname)] = p
    return out, bad


def key(labels: PodLabels) -> ContainerKey:
    return (labels.namespace, labels.pod, labels.container or "")


class PodLimits:
    """Reads this node's pods (``list_pods``: the API call, raising on failure) and hands the limits to ``apply``
    (the allocator's :meth:`~cgpu_device_plugin.allocator.Allocator.limit`); logs an unreachable API server and
    each malformed annotation once."""

    def __init__(self, list_pods: Callable[[], list[dict[str, Any]]],
                 apply: Callable[[Mapping[ContainerKey, int]], int]) -> None:
        self.list_pods = list_pods
        self.apply = apply
        self.available: bool | None = None
        self._bad_logged: set[str] = set()

    def poll_once(self) -> int:
        """Read the pods once and set what changed; how many allocations got a new limit."""
        try:
            pods = self.list_pods()
        except Exception as exc:  # the client raises its own, urllib3's and OSError: each means "not now"
            if self.available is not False:
                log.warning("cannot list this node's pods from the API server (%s): containers' %s annotations "
                            "are not applied until it answers; a core percentage caps its container meanwhile",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__, ANNOTATION)
            self.available = False
            return 0
        if self.available is False:
            log.info("the API server answers: applying %s annotations", ANNOTATION)
        self.available = True
        found, bad = limits_of(pods)
        for line in bad:
            if line not in self._bad_logged:
                self._bad_logged.add(line)
                log.warning("%s; not applied", line)
        return self.apply(found)


def node_pods(api_client: Any, node: str, timeout: float = 10.0) -> Callable[[], list[dict[str, Any]]]:
    """``list`` of the pods bound to ``node``, through the official client, as JSON dicts."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def list_pods() -> list[dict[str, Any]]:
        resp: Any = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False,
                                                _request_timeout=timeout)
        items = json.loads(resp.data).get("items")
        return items if isinstance(items, list) else []

    return list_pods
