"""The vendored DRA and plugin-registration APIs: regenerating gives the committed modules, names are the kubelet's."""

from __future__ import annotations

import pytest

from cgpu_dra_plugin.api import regen
from cgpu_dra_plugin.api.dra.v1 import api_pb2 as v1
from cgpu_dra_plugin.api.dra.v1beta1 import api_pb2 as v1beta1
from cgpu_dra_plugin.api.pluginregistration.v1 import api_pb2 as reg


def test_regenerating_gives_the_committed_files() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra")
    assert regen.differences() == []


def test_service_paths_and_field_numbers_match_the_kubelet() -> None:
    """gRPC paths are /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/<rpc> (and v1beta1) and
    /pluginregistration.Registration/<rpc>; field numbers as upstream."""
    for pb, version in ((v1, "v1"), (v1beta1, "v1beta1")):
        service = pb.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
        numbers = {(m.name, f.name): f.number for m in pb.DESCRIPTOR.message_types_by_name.values() for f in m.fields}
        assert numbers[("Device", "cdi_device_ids")] == 4 and numbers[("Claim", "name")] == 3
        assert numbers[("NodePrepareResourceResponse", "error")] == 2
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert [m.name for m in registration.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert {f.name: f.number for f in reg.PluginInfo.DESCRIPTOR.fields}["supported_versions"] == 4
