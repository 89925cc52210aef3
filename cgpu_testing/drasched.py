"""A model of kube-scheduler's structured allocator for one node, for devices with consumable capacity.

Test code only: it stands where kube-scheduler's DRA plugin stands in a cluster, allocating
``resource.k8s.io/v1`` ResourceClaims against the ResourceSlices the DRA plugin published, and
writing ``status.allocation`` as the scheduler does. It follows
kubernetes/kubernetes ``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/
experimental/`` (``allocator_experimental.go``, ``consumable_capacity.go``; KEP-5075):

* each request (``exactly``, ``allocationMode: ExactCount``, ``count`` 1) takes one device of
  its DeviceClass's driver; devices are tried in slice order, the first that fits wins (the
  allocator's search, without scoring);
* a device with ``allowMultipleAllocations`` is shared: for every capacity of the device, the
  request consumes ``calculateConsumedQuantity``: the requested value rounded up by the
  ``requestPolicy`` (``roundUpRange``: to ``min``, then to ``min + k*step``; ``validValues``:
  the smallest value at least the request), or the policy's ``default`` when the request names
  none, or the whole capacity when the device has no policy; ``violatesPolicy`` (over
  ``max``, off the step) skips the device; and the sum of what the device's allocated claims
  consumed, what this claim is allocating on it, and this request must be at most the
  capacity's ``value`` (``cmpRequestOverCapacity``);
* a device without ``allowMultipleAllocations`` is taken whole, by one request of one claim;
* the result names driver, pool, device, request, a fresh ``shareID`` for a shared device and
  its ``consumedCapacity``; the opaque configs of each request's DeviceClass are copied first
  (``source: FromClass``, ``requests`` naming that request), then the claim's (``source: FromClaim``).

CEL selectors and constraints are not modelled: cgpu's DeviceClass selects on the driver only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cgpu_dra_plugin.quantity import GIB, parse


class Unschedulable(Exception):
    """No device fits one of the claim's requests; the message says which."""


@dataclass(frozen=True, slots=True)
class DeviceKey:
    driver: str
    pool: str
    device: str


def _consumed(requested: int | None, total: int, policy: Mapping[str, Any] | None) -> int:
    """consumable_capacity.go calculateConsumedQuantity (integer path)."""
    if requested is None:
        if policy is not None and "default" in policy:
            return parse(policy["default"])
        return total
    if policy is None:
        return requested
    rng = policy.get("validRange")
    if rng is not None and "min" in rng:
        lo = parse(rng["min"])
        if requested < lo:
            return lo
        if "step" not in rng:
            return requested
        step = parse(rng["step"])
        return lo + -(-(requested - lo) // step) * step
    values = policy.get("validValues")
    if values:
        for v in (parse(x) for x in values):
            if requested <= v:
                return v
    return requested


def _violates(value: int, policy: Mapping[str, Any] | None) -> bool:
    """consumable_capacity.go violatesPolicy."""
    if policy is None:
        return False
    if "default" in policy and value == parse(policy["default"]):
        return False
    rng = policy.get("validRange")
    if rng is not None:
        if "max" in rng and value > parse(rng["max"]):
            return True
        return "step" in rng and (value - parse(rng["min"])) % parse(rng["step"]) != 0
    values = policy.get("validValues")
    return bool(values) and value not in {parse(v) for v in values or ()}


def consumed_so_far(claims: Iterable[Mapping[str, Any]]) -> dict[DeviceKey, dict[str, int]]:
    """What the allocated ``claims`` consume per device and capacity (a whole device: key ``*``)."""
    out: dict[DeviceKey, dict[str, int]] = {}
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            key = DeviceKey(r["driver"], r["pool"], r["device"])
            used = out.setdefault(key, {})
            if "consumedCapacity" not in r:
                used["*"] = 1
            for name, q in (r.get("consumedCapacity") or {}).items():
                used[name] = used.get(name, 0) + parse(q)
    return out


def _fit(device: Mapping[str, Any], request_caps: Mapping[str, Any], used: Mapping[str, int]) -> dict[str, int] | None:
    """What ``device`` would consume for the request, or None if it does not fit."""
    capacity = device.get("capacity") or {}
    if any(name not in capacity for name in request_caps):
        return None  # the device does not define a requested capacity
    consumed = {}
    for name, cap in capacity.items():
        total = parse(cap["value"])
        want = parse(request_caps[name]) if name in request_caps else None
        value = _consumed(want, total, cap.get("requestPolicy"))
        if _violates(value, cap.get("requestPolicy")) or used.get(name, 0) + value > total:
            return None
        consumed[name] = value
    return consumed


def _format(name: str, value: int) -> str:
    return f"{value // GIB}Gi" if name == "memory" and value % GIB == 0 else str(value)


def allocate(claim: Mapping[str, Any], slices: Sequence[Mapping[str, Any]], allocated: Iterable[Mapping[str, Any]],
             classes: Mapping[str, str], node: str,
             class_configs: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """``claim``'s ``status.allocation`` on ``node``; raise Unschedulable. ``classes``: DeviceClass -> driver;
    ``class_configs``: DeviceClass -> its ``spec.config`` (copied first, ``source: FromClass``, per request)."""
    used = consumed_so_far(allocated)
    results = []
    from_class: list[dict[str, Any]] = []
    for req in claim["spec"]["devices"]["requests"]:
        from_class += [{"source": "FromClass", "requests": [req["name"]], "opaque": c["opaque"]}
                       for c in (class_configs or {}).get((req.get("exactly") or {}).get("deviceClassName", ""), [])
                       if "opaque" in c]
        exactly = req.get("exactly") or {}
        if exactly.get("allocationMode", "ExactCount") != "ExactCount" or exactly.get("count", 1) != 1:
            raise Unschedulable(f"request {req['name']}: the model allocates one device per request")
        driver = classes.get(exactly.get("deviceClassName", ""))
        if driver is None:
            raise Unschedulable(f"request {req['name']}: no DeviceClass {exactly.get('deviceClassName')!r}")
        caps = (exactly.get("capacity") or {}).get("requests") or {}
        chosen: tuple[DeviceKey, dict[str, int] | None] | None = None
        for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
            spec = s["spec"]
            if spec["driver"] != driver or spec.get("nodeName") != node:
                continue
            for dev in spec.get("devices", []):
                key = DeviceKey(driver, spec["pool"]["name"], dev["name"])
                mine = used.get(key, {})
                if not dev.get("allowMultipleAllocations"):
                    if mine:
                        continue
                    chosen = (key, None)
                    break
                fit = _fit(dev, caps, mine)
                if fit is not None:
                    chosen = (key, fit)
                    break
            if chosen:
                break
        if chosen is None:
            raise Unschedulable(f"request {req['name']}: no device of {driver} on node {node} has room for "
                                f"{dict(caps) or 'the defaults'}")
        key, fit = chosen
        result: dict[str, Any] = {"request": req["name"], "driver": key.driver, "pool": key.pool,
                                  "device": key.device}
        slot = used.setdefault(key, {})
        if fit is None:
            slot["*"] = 1
        else:
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {n: _format(n, v) for n, v in fit.items()}
            for n, v in fit.items():
                slot[n] = slot.get(n, 0) + v
        results.append(result)
    config = from_class + [{"source": "FromClaim", **({"requests": c["requests"]} if c.get("requests") else {}),
                            "opaque": c["opaque"]} for c in claim["spec"]["devices"].get("config", []) if "opaque" in c]
    return {"devices": {"results": results, **({"config": config} if config else {})},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                     "values": [node]}]}]}}


def claim(name: str, namespace: str = "default", memory: str | None = None, cores: int | None = None,
          device_class: str = "gpu.cgpu.io", config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ResourceClaim asking one device with these capacities (and an opaque ShareConfig)."""
    requests: dict[str, str] = {}
    if memory is not None:
        requests["memory"] = memory
    if cores is not None:
        requests["cores"] = str(cores)
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if requests:
        exactly["capacity"] = {"requests": requests}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": "gpu.cgpu.io", "parameters": dict(config)}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}
