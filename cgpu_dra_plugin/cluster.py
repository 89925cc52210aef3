"""The cluster's cgpu GPUs as the API server describes them: ResourceSlices and the claims allocated on them.

Pure: :func:`view` takes the listed objects and returns, per node and GPU, memory and cores
allocated (the claims' ``consumedCapacity``) against the capacity the slice publishes, with the
pods each claim is reserved for. ``kubectl-inspect-cgpu`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cgpu_dra_plugin import DRIVER
from cgpu_dra_plugin.quantity import BadQuantity, parse


@dataclass(frozen=True, slots=True)
class Use:
    """One claim's share of one GPU."""

    namespace: str
    claim: str
    pods: tuple[str, ...]
    memory: int  # bytes
    cores: int  # percent


@dataclass
class GpuView:
    node: str
    device: str
    index: int
    uuid: str
    product: str
    memory: int  # bytes published
    cores: int  # percent published
    uses: list[Use] = field(default_factory=list)

    @property
    def memory_used(self) -> int:
        return sum(u.memory for u in self.uses)

    @property
    def cores_used(self) -> int:
        return sum(u.cores for u in self.uses)


def _attr(dev: Mapping[str, Any], name: str) -> Any:
    a = (dev.get("attributes") or {}).get(name) or {}
    return next(iter(a.values()), None)


def _quantity(caps: Mapping[str, Any], name: str, driver: str) -> int:
    for key in (name, f"{driver}/{name}"):
        if key in caps:
            try:
                return parse(caps[key])
            except BadQuantity:
                return 0
    return 0


def view(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
         driver: str = DRIVER) -> list[GpuView]:
    """Every GPU of ``driver``'s slices, by node and index, with the claims allocated on it."""
    gpus: dict[tuple[str, str], GpuView] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        for dev in spec.get("devices") or []:
            caps = {k: v.get("value") for k, v in (dev.get("capacity") or {}).items()}
            gpus[(pool, dev["name"])] = GpuView(
                spec.get("nodeName") or pool, dev["name"], int(_attr(dev, "index") or 0),
                str(_attr(dev, "uuid") or ""), str(_attr(dev, "productName") or ""),
                _quantity(caps, "memory", driver), _quantity(caps, "cores", driver))
    for c in claims:
        meta = c.get("metadata") or {}
        status = c.get("status") or {}
        pods = tuple(r.get("name", "") for r in status.get("reservedFor") or [] if r.get("resource") == "pods")
        for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            g = gpus.get((r.get("pool", ""), r.get("device", "")))
            if r.get("driver") != driver or g is None:
                continue
            caps = r.get("consumedCapacity") or {}
            g.uses.append(Use(meta.get("namespace", ""), meta.get("name", ""), pods,
                              _quantity(caps, "memory", driver), _quantity(caps, "cores", driver)))
    return sorted(gpus.values(), key=lambda g: (g.node, g.index))
