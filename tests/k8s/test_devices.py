"""Device IDs: how units of a card are named, and that nothing else parses as one."""

from __future__ import annotations

import pytest

from cgpu_device_plugin.devices import (
    GIB,
    MAX_ID_LEN,
    BadDeviceId,
    DeviceId,
    Resource,
    device_ids,
    parse_device_id,
)
from cgpu_testing.daemon import sim_uuid

NVIDIA_UUID = "GPU-fef8089b-4820-abfc-e83e-94318197576e"


def test_a_16_gib_card_has_16_memory_devices_and_100_core_devices() -> None:
    mem = device_ids(NVIDIA_UUID, 16 * GIB, Resource.MEM)
    core = device_ids(NVIDIA_UUID, 16 * GIB, Resource.CORE)
    assert mem[0] == f"{NVIDIA_UUID}-mem-0" and mem[-1] == f"{NVIDIA_UUID}-mem-15" and len(mem) == 16
    assert core[0] == f"{NVIDIA_UUID}-core-0" and core[-1] == f"{NVIDIA_UUID}-core-99" and len(core) == 100


def test_memory_devices_are_whole_gib_rounded_down() -> None:
    """A T4 reports about 15.7 GiB: 15 devices, as ALIYUN_COM_GPU_MEM_DEV=15."""
    assert len(device_ids(NVIDIA_UUID, int(15.7 * GIB), Resource.MEM)) == 15


@pytest.mark.parametrize("uuid", [NVIDIA_UUID, sim_uuid(7)])
def test_ids_round_trip_and_fit_the_api_limit(uuid: str) -> None:
    for resource in Resource:
        for text in device_ids(uuid, 16 * GIB, resource):
            assert len(text) <= MAX_ID_LEN
            d = parse_device_id(text)
            assert d.uuid == uuid and d.resource is resource and str(d) == text


def test_parse_splits_at_the_last_kind_marker() -> None:
    assert parse_device_id("GPU-a-mem-b-core-42") == DeviceId("GPU-a-mem-b", Resource.CORE, 42)


@pytest.mark.parametrize("bad", ["", "GPU-x", "GPU-x-mem-", "GPU-x-mem-01", "GPU-x-mem--1", "GPU-x-gpu-1",
                                 "-mem-1", "GPU-x-mem-1 ", "GPU x-mem-1", "GPU-x-core-123456"])
def test_anything_else_is_not_a_device_id(bad: str) -> None:
    with pytest.raises(BadDeviceId, match="not a cgpu device ID"):
        parse_device_id(bad)


def test_resource_names_and_sockets() -> None:
    assert Resource.MEM.resource_name == "aliyun.com/gpu-mem"
    assert Resource.CORE.resource_name == "aliyun.com/gpu-core.percentage"
    assert (Resource.MEM.endpoint, Resource.CORE.endpoint) == ("cgpu-mem.sock", "cgpu-core.sock")
    assert Resource.MEM.other is Resource.CORE and Resource.CORE.other is Resource.MEM
