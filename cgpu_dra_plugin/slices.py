"""The node's ResourceSlice: each GPU once, a device that many claims share by consuming its capacity.

Built from arbiterd's status (``GET /v1/status``), so the slice says what arbiterd enforces:

* ``allowMultipleAllocations: true`` (KEP-5075, consumable capacity): the scheduler may place
  several claims on one device, each consuming part of its capacity;
* capacity ``memory`` = the card's whole GiB (a T4's 15.x GiB is ``15Gi``), requests rounded up
  to whole GiB (``validRange`` min 1Gi, step 1Gi, default 1Gi: a claim that names no memory gets 1 GiB);
* capacity ``cores`` = 100 (percent of the card's time), in steps of 5 (default 0: a claim that
  names no cores is scheduled as the card's policy says, like a memory-only device-plugin pod);
* attributes: uuid, index, productName, driverVersion, computeCapability, and the card's cgpu
  ``policy`` (0..5), so a DeviceClass or claim can select on them in CEL.

The slice is pure data: :func:`resource_slice` does no I/O (the publisher writes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cgpu_dra_plugin.quantity import GIB

API_VERSION = "resource.k8s.io/v1"
CORE_STEP = 5
CORE_TOTAL = 100


@dataclass(frozen=True, slots=True)
class Gpu:
    """One card as the slice describes it."""

    index: int
    uuid: str
    product: str
    total_mem: int  # bytes
    policy: int
    driver_version: str = ""
    compute_capability: str = ""

    @property
    def device(self) -> str:
        return device_name(self.index)

    @property
    def gib(self) -> int:
        return self.total_mem // GIB


def device_name(index: int) -> str:
    """The device's name in the slice (a DNS label): ``gpu-<index>``, arbiterd's index."""
    return f"gpu-{index}"


def gpu_index(device: str) -> int:
    """``gpu-3`` -> 3; raise ValueError for a name this driver never publishes."""
    prefix, sep, num = device.partition("-")
    if prefix != "gpu" or not sep or not num.isdigit() or str(int(num)) != num:
        raise ValueError(f"device {device!r} is not one of this driver's (gpu-<index>)")
    return int(num)


def gpus_of(status: Mapping[str, Any]) -> list[Gpu]:
    """The cards of an arbiterd status document, by index."""
    out = []
    for g in status.get("gpus", []):
        out.append(Gpu(int(g["index"]), str(g["uuid"]), str(g.get("name", "")), int(g["total_mem"]),
                       int(g.get("policy", 1)), str(g.get("driver_version", "")),
                       str(g.get("compute_capability", ""))))
    return sorted(out, key=lambda g: g.index)


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


def device(gpu: Gpu) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.product or "unknown"},
        "policy": {"int": gpu.policy},
    }
    if gpu.driver_version:
        attrs["driverVersion"] = {"string": gpu.driver_version}
    if gpu.compute_capability:
        attrs["computeCapability"] = {"string": gpu.compute_capability}
    return {
        "name": gpu.device,
        "allowMultipleAllocations": True,
        "attributes": attrs,
        "capacity": {
            "memory": {"value": f"{gpu.gib}Gi",
                       "requestPolicy": {"default": "1Gi", "validRange": {
                           "min": "1Gi", "max": f"{gpu.gib}Gi",
                           **({"step": "1Gi"} if gpu.gib >= 2 else {})}}},  # the API wants min + step <= value
            "cores": {"value": str(CORE_TOTAL),
                      "requestPolicy": {"default": "0",
                                        "validRange": {"min": "0", "max": str(CORE_TOTAL), "step": str(CORE_STEP)}}},
        },
    }


def resource_slice(node: str, driver: str, gpus: Sequence[Gpu], generation: int) -> dict[str, Any]:
    """The one ResourceSlice of ``node``'s pool (named after the node), at pool ``generation``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device(g) for g in gpus if g.gib >= 1],  # a card under 1 GiB has nothing to share
        },
    }
