"""The kubelet-facing gRPC service of one resource (``v1beta1.DevicePlugin``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from cgpu_device_plugin.allocator import Allocator
from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from cgpu_device_plugin.devices import Resource
from cgpu_device_plugin.health import NodeMonitor
from cgpu_device_plugin.placement import Refusal

log = logging.getLogger("cgpu_device_plugin.servicer")
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """One resource's plugin; both resources share the allocator (and its lock) and the monitor."""

    def __init__(self, resource: Resource, allocator: Allocator, monitor: NodeMonitor,
                 stopping: threading.Event) -> None:
        self.resource = resource
        self.allocator = allocator
        self.monitor = monitor
        self.stopping = stopping

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        ended = threading.Event()

        def on_end() -> None:
            ended.set()
            self.monitor.wake_watchers()

        context.add_callback(on_end)
        name = self.resource.resource_name
        sent = -1
        log.info("%s: the kubelet opened ListAndWatch", name)
        while not ended.is_set() and not self.stopping.is_set():
            generation, devices = self.monitor.snapshot(self.resource)
            if generation != sent:
                sent = generation
                unhealthy = sum(1 for _, h in devices if h != "Healthy")
                log.info("%s: sending %d devices to the kubelet (%d unhealthy)", name, len(devices), unhealthy)
                yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=h) for i, h in devices])
            self.monitor.wait_change(sent, timeout=1.0)
        log.info("%s: ListAndWatch ended", name)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            try:
                ids = self.allocator.preferred(self.resource, list(req.available_deviceIDs),
                                               list(req.must_include_deviceIDs), req.allocation_size)
            except Refusal as exc:
                log.warning("%s: no preference for %d devices: %s", self.resource.resource_name,
                            req.allocation_size, exc)
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        name = self.resource.resource_name
        try:
            setups = self.allocator.allocate(self.resource, [list(r.devices_ids) for r in request.container_requests])
        except Refusal as exc:
            log.warning("%s: Allocate refused: %s", name, exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(
                envs=s.envs,
                mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in s.mounts])
            for s in setups])

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()  # not required (OPTIONS); answered if a kubelet asks anyway
