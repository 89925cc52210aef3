"""The two resources this plugin sells, and the device IDs that stand for their units.

``aliyun.com/gpu-mem`` has one device per whole GiB of each card, ``<gpu-uuid>-mem-<k>``;
``aliyun.com/gpu-core.percentage`` one per percent, ``<gpu-uuid>-core-<k>`` (k = 0..99).
A device is only a unit of a card: which unit a container gets does not matter, only how
many and on which card.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

GIB = 1 << 30
CORE_UNITS = 100
CORE_STEP = 5
MAX_ID_LEN = 63  # the device-plugin API's limit on Device.ID
API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class Resource(enum.Enum):
    MEM = "mem"
    CORE = "core"

    @property
    def resource_name(self) -> str:
        return RESOURCE_NAMES[self]

    @property
    def endpoint(self) -> str:
        """The plugin's socket name in the kubelet's device-plugins directory."""
        return f"cgpu-{self.value}.sock"

    @property
    def other(self) -> Resource:
        return Resource.CORE if self is Resource.MEM else Resource.MEM


RESOURCE_NAMES = {Resource.MEM: "aliyun.com/gpu-mem", Resource.CORE: "aliyun.com/gpu-core.percentage"}


class BadDeviceId(ValueError):
    """A device ID this plugin never hands out."""


@dataclass(frozen=True, slots=True)
class DeviceId:
    uuid: str
    resource: Resource
    unit: int

    def __str__(self) -> str:
        return f"{self.uuid}-{self.resource.value}-{self.unit}"


_ID = re.compile(r"^(?P<uuid>[A-Za-z0-9][A-Za-z0-9_.:-]*)-(?P<kind>mem|core)-(?P<unit>0|[1-9][0-9]{0,4})$")


def parse_device_id(text: str) -> DeviceId:
    """``GPU-…-mem-3`` -> DeviceId(uuid, MEM, 3); raise BadDeviceId for anything else."""
    m = _ID.match(text)
    if m is None:
        raise BadDeviceId(f"{text!r} is not a cgpu device ID (<gpu-uuid>-mem-<k> or <gpu-uuid>-core-<k>)")
    return DeviceId(m.group("uuid"), Resource(m.group("kind")), int(m.group("unit")))


def units_of(total_mem: int, resource: Resource) -> int:
    """How many devices of ``resource`` a card with ``total_mem`` bytes offers."""
    return total_mem // GIB if resource is Resource.MEM else CORE_UNITS


def device_ids(uuid: str, total_mem: int, resource: Resource) -> list[str]:
    """Every device ID of ``resource`` on one card, in unit order."""
    return [str(DeviceId(uuid, resource, k)) for k in range(units_of(total_mem, resource))]
