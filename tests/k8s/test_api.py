"""The vendored kubelet API: regenerating gives the committed modules, and the names are the kubelet's."""

from __future__ import annotations

import pytest

from cgpu_device_plugin.api import regen
from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as pb


def test_regenerating_gives_the_committed_files() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra")
    assert regen.differences() == []


def test_the_vendored_proto_has_no_gogo_options() -> None:
    text = regen.PROTOS[0].read_text()
    assert "gogoproto" not in text.split("syntax =", 1)[1]
    assert 'package v1beta1;' in text


def test_service_and_field_numbers_match_the_kubelet() -> None:
    """gRPC paths are /v1beta1.DevicePlugin/<rpc> and /v1beta1.Registration/Register; numbers as upstream."""
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    numbers = {(m.name, f.name): f.number for m in pb.DESCRIPTOR.message_types_by_name.values() for f in m.fields}
    assert numbers[("DevicePluginOptions", "get_preferred_allocation_available")] == 2
    assert numbers[("RegisterRequest", "options")] == 4
    assert numbers[("ContainerAllocateRequest", "devices_ids")] == 1
    assert numbers[("ContainerAllocateResponse", "cdi_devices")] == 5
    assert numbers[("ContainerPreferredAllocationRequest", "allocation_size")] == 3
    assert numbers[("Mount", "read_only")] == 3


def test_pod_resources_paths_and_numbers_match_the_kubelet() -> None:
    """kubernetes/kubelet pkg/apis/podresources/v1/api.proto: /v1.PodResourcesLister/{List,GetAllocatableResources,
    Get}, and the field numbers a kubelet sends."""
    from cgpu_device_plugin.api.podresources.v1 import api_pb2 as pr

    (proto,) = [p for p in regen.PROTOS if "podresources" in p.parts]
    assert "package v1;" in proto.read_text()
    service = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    numbers = {(m.name, f.name): f.number for m in pr.DESCRIPTOR.message_types_by_name.values() for f in m.fields}
    assert numbers[("ListPodResourcesResponse", "pod_resources")] == 1
    assert (numbers[("PodResources", "name")], numbers[("PodResources", "namespace")],
            numbers[("PodResources", "containers")]) == (1, 2, 3)
    assert (numbers[("ContainerResources", "name")], numbers[("ContainerResources", "devices")]) == (1, 2)
    assert (numbers[("ContainerDevices", "resource_name")], numbers[("ContainerDevices", "device_ids")]) == (1, 2)
    assert (numbers[("GetPodResourcesRequest", "pod_name")], numbers[("GetPodResourcesRequest", "pod_namespace")]) \
        == (1, 2)
