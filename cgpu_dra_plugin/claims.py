"""What an allocated ResourceClaim gives this driver on this node: devices, consumed capacity, ShareConfig.

Reads ``status.allocation.devices`` of a ``resource.k8s.io/v1`` ResourceClaim: each result of
this driver in this node's pool is one :class:`Grant`; its ``consumedCapacity`` (written by
kube-scheduler for a device with ``allowMultipleAllocations``) is what the container gets, and
the last ``config`` entry of this driver that applies to its request (class configs come first,
then the claim's, as the scheduler copies them) is its ShareConfig. ``highPriority`` counts only
from a DeviceClass's config (``source: FromClass``): anyone who may create a claim writes the
claim's, so one that asks it is refused; ``weight`` may come from either (arbiterd bounds it by
the card's ``max_inst`` and free weight). A claim reserved for more than one consumer is refused:
arbiterd binds an allocation to the first container that presents its token. :func:`consumer` names the
pod a claim is reserved for (``status.reservedFor``) and the container of that pod's spec that names the claim
(``resources.claims``, through the pod's ``spec.resourceClaims``, or ``status.resourceClaimStatuses`` for a claim
made from a template). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from arbiterd.core import podlabels
from arbiterd.core.errors import SettingError
from arbiterd.core.podlabels import PodLabels
from cgpu_dra_plugin import DRIVER, shareconfig
from cgpu_dra_plugin.quantity import BadQuantity, parse
from cgpu_dra_plugin.shareconfig import ShareConfig

FROM_CLASS = "FromClass"  # a config the scheduler copied from the DeviceClass, which only an administrator writes


class BadClaim(ValueError):
    """The claim cannot be prepared on this node; the message is one line, for the pod's events."""


@dataclass(frozen=True, slots=True)
class Grant:
    request: str
    pool: str
    device: str
    memory: int  # bytes consumed
    cores: int  # percent consumed
    share_id: str
    config: ShareConfig


def _consumed(result: Mapping[str, Any], driver: str, name: str) -> int:
    caps = result.get("consumedCapacity") or {}
    for key in (name, f"{driver}/{name}"):
        if key in caps:
            try:
                return parse(caps[key])
            except BadQuantity as exc:
                raise BadClaim(f"device {result.get('device')}: consumedCapacity {key}: {exc}") from None
    return 0


def _config_for(configs: list[Any], driver: str, request: str) -> ShareConfig:
    """The last applicable config's weight and limits; high priority from the last applicable DeviceClass config
    (``source: FromClass``) alone: a claim's own config that asks it is refused (BadClaim)."""
    chosen = shareconfig.DEFAULT
    high = False
    for entry in configs:
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        requests = entry.get("requests") or []
        if requests and request not in requests and request.split("/", 1)[0] not in requests:
            continue
        try:
            chosen = shareconfig.parse(opaque.get("parameters"))
        except shareconfig.BadShareConfig as exc:
            raise BadClaim(str(exc)) from None
        if entry.get("source") == FROM_CLASS:
            high = chosen.high_priority
        elif chosen.high_priority:
            raise BadClaim("ShareConfig: highPriority is taken only from a DeviceClass (an administrator's), not "
                           f"from the claim; request a device of class {DRIVER}-highprio instead")
    return replace(chosen, high_priority=high)


def grants(claim: Mapping[str, Any], driver: str, pool: str) -> list[Grant]:
    """This driver's devices in ``pool`` that ``claim`` was allocated; raise BadClaim when it is not allocated
    or a device, capacity or config is unusable."""
    meta = claim.get("metadata") or {}
    where = f"claim {meta.get('namespace')}/{meta.get('name')}"
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    results = devices.get("results")
    if not results:
        raise BadClaim(f"{where} is not allocated (no status.allocation.devices.results)")
    consumers = (claim.get("status") or {}).get("reservedFor") or []
    if len(consumers) > 1:
        names = ", ".join(f"{c.get('resource', '?')}/{c.get('name', '?')}" for c in consumers)
        raise BadClaim(f"{where} is reserved for {len(consumers)} consumers ({names}); a cgpu allocation binds to "
                       "one container, so each pod needs its own claim (use a ResourceClaimTemplate)")
    configs = list(devices.get("config") or [])
    out = []
    for r in results:
        if r.get("driver") != driver:
            continue
        if r.get("pool") != pool:
            raise BadClaim(f"{where}: device {r.get('device')} is in pool {r.get('pool')!r}, not this node's "
                           f"({pool!r})")
        request = str(r.get("request", ""))
        cfg = _config_for(configs, driver, request)
        memory, cores = _consumed(r, driver, "memory"), _consumed(r, driver, "cores")
        if memory <= 0:
            raise BadClaim(f"{where}: device {r.get('device')} has no consumed memory; this driver's devices "
                           "need the DRAConsumableCapacity feature (consumedCapacity in the claim's status)")
        if cores % 5 or not 0 <= cores <= 100:
            raise BadClaim(f"{where}: device {r.get('device')}: cores {cores} is not a multiple of 5 in 0..100")
        if cfg.weight and cores and cfg.enforce_cores:
            raise BadClaim(f"{where}: ShareConfig weight {cfg.weight} and a cores cap of {cores} exclude each "
                           "other; set limits: MemoryOnly, or ask no cores")
        if cfg.limit and cfg.limit < cores:
            raise BadClaim(f"{where}: ShareConfig limit {cfg.limit} % is below the cores it requests ({cores} %)")
        out.append(Grant(request, str(r["pool"]), str(r.get("device", "")), memory, cores,
                         str(r.get("shareID", "")), cfg))
    if not out:
        raise BadClaim(f"{where} has no device of driver {driver}")
    return out


def reserved_pod(claim: Mapping[str, Any]) -> str | None:
    """The name of the pod ``claim`` is reserved for (None: none, or not a pod)."""
    for r in (claim.get("status") or {}).get("reservedFor") or []:
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name"):
            return str(r["name"])
    return None


def claim_containers(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> list[str]:
    """The containers (init containers included) of ``pod`` whose ``resources.claims`` name ``claim``."""
    name = (claim.get("metadata") or {}).get("name")
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    entries = {rc.get("name") for rc in spec.get("resourceClaims") or [] if rc.get("resourceClaimName") == name}
    entries |= {s.get("name") for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName") == name}
    return [str(c.get("name")) for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
            if any(r.get("name") in entries for r in (c.get("resources") or {}).get("claims") or [])]


def consumer(claim: Mapping[str, Any], pod: Mapping[str, Any] | None) -> tuple[PodLabels | None, str]:
    """The pod labels of the container ``claim`` serves, and why they are partial or missing ('' when whole): the
    pod ``status.reservedFor`` names, in the claim's namespace, and the one container of ``pod`` (its spec, None
    when it could not be read) that names the claim; the container is left empty where it is not one."""
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    name = reserved_pod(claim)
    if name is None:
        return None, "the claim is reserved for no pod"
    containers = claim_containers(claim, pod) if pod is not None else []
    why = ("its pod could not be read" if pod is None else "no container of its pod names it" if not containers
           else f"{len(containers)} containers of its pod name it ({', '.join(containers)})"
           if len(containers) > 1 else "")
    try:
        return podlabels.check(namespace, name, containers[0] if len(containers) == 1 else ""), why
    except SettingError as exc:
        return None, str(exc)
