"""``ShareConfig``: the opaque device configuration a claim (or its DeviceClass) gives the driver.

    apiVersion: gpu.cgpu.io/v1alpha1
    kind: ShareConfig
    weight: 2              # 1..25: the container's weight on its card (policies 2 and 4)
    highPriority: false    # preempts normal containers, up to the card's prio_ratio
    limits: MemoryAndCores # or MemoryOnly: the consumed cores reserve room but are not a cap
    limit: 60              # 5..100: the most GPU time (%) the container may use, even on an idle card

It reaches the plugin as ``status.allocation.devices.config[].opaque.parameters`` (raw JSON)
and becomes the allocation's ``weight=``/``highprio=`` in arbiterd, which enforces them as it
enforces ``inst_ctl``. ``weight`` and an enforced core percentage exclude each other (as in
``inst_ctl``): a claim with a weight uses ``MemoryOnly``, or asks no cores. ``limit`` is the
container's ceiling beside its request (the consumed ``cores``, or its weight): a claim may carry
both (behaviour §3, requests and limits); it becomes the allocation's ``limit=``. Anything else
unknown or out of range is refused with one line, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cgpu_dra_plugin import DRIVER

API_VERSION = f"{DRIVER}/v1alpha1"
KIND = "ShareConfig"
LIMITS = ("MemoryAndCores", "MemoryOnly")
MAX_WEIGHT = 25  # arbiterd's max_inst ceiling
_FIELDS = ("apiVersion", "kind", "weight", "highPriority", "limits", "limit")


class BadShareConfig(ValueError):
    """A ShareConfig that is malformed; the message is one line."""


@dataclass(frozen=True, slots=True)
class ShareConfig:
    weight: int = 0  # 0: arbiterd's default
    high_priority: bool = False
    limits: str = "MemoryAndCores"
    limit: int = 0  # the most GPU time (%) it may use; 0: none (an enforced core percentage is its own cap)

    @property
    def enforce_cores(self) -> bool:
        return self.limits == "MemoryAndCores"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "limits": self.limits}
        if self.weight:
            doc["weight"] = self.weight
        if self.high_priority:
            doc["highPriority"] = True
        if self.limit:
            doc["limit"] = self.limit
        return doc


DEFAULT = ShareConfig()


def parse(doc: object) -> ShareConfig:
    """Check one ShareConfig document; raise BadShareConfig with a one-line reason."""
    if not isinstance(doc, Mapping):
        raise BadShareConfig(f"ShareConfig: expected an object, got {type(doc).__name__}")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise BadShareConfig(f"ShareConfig: apiVersion must be {API_VERSION} and kind {KIND} "
                             f"(got {doc.get('apiVersion')!r}, {doc.get('kind')!r})")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise BadShareConfig(f"ShareConfig: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS[2:])})")
    weight = doc.get("weight", 0)
    bad_weight = isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT
    if "weight" in doc and bad_weight:
        raise BadShareConfig(f"ShareConfig: weight must be an integer 1..{MAX_WEIGHT}, got {weight!r}")
    high = doc.get("highPriority", False)
    if not isinstance(high, bool):
        raise BadShareConfig(f"ShareConfig: highPriority must be true or false, got {high!r}")
    limits = doc.get("limits", DEFAULT.limits)
    if limits not in LIMITS:
        raise BadShareConfig(f"ShareConfig: limits must be {' or '.join(LIMITS)}, got {limits!r}")
    limit = doc.get("limit", 0)
    if "limit" in doc and (isinstance(limit, bool) or not isinstance(limit, int) or not 5 <= limit <= 100):
        raise BadShareConfig(f"ShareConfig: limit must be an integer 5..100 (percent of the GPU), got {limit!r}")
    return ShareConfig(weight, high, limits, limit)
