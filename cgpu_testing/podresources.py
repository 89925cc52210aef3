"""The fake kubelet's PodResources API: a real gRPC ``v1.PodResourcesLister`` on a UNIX socket.

It follows the kubelet's own server, kubernetes/kubernetes ``pkg/kubelet/apis/podresources/server_v1.go``,
over the messages of kubernetes/kubelet ``pkg/apis/podresources/v1/api.proto`` (vendored under
``cgpu_device_plugin/api/podresources/v1``):

* ``List``: every pod the kubelet runs, each with its name and namespace and one ``ContainerResources`` per
  container of its spec (name, and per resource the device IDs it was allocated: none for a container that asked
  for none);
* ``Get(pod_name, pod_namespace)``: that pod alone, or the error ``pod NAME in namespace NS not found`` (the Go
  server returns a plain error, which gRPC sends as ``UNKNOWN``);
* ``GetAllocatableResources``: every healthy device the plugins listed, by resource.

CPUs, memory and DRA resources stay empty: this kubelet has no CPU or memory manager, and the device plugin reads
only devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Protocol

import grpc

from cgpu_device_plugin.api.podresources.v1 import api_pb2 as pr
from cgpu_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc


class PodLike(Protocol):
    """What the fake kubelet's pods offer (cgpu_testing.kubelet.Pod)."""

    name: str
    namespace: str

    @property
    def resources(self) -> list[tuple[str, dict[str, list[str]]]]: ...


def pod_resources(pod: PodLike) -> pr.PodResources:
    return pr.PodResources(name=pod.name, namespace=pod.namespace, containers=[
        pr.ContainerResources(name=name, devices=[pr.ContainerDevices(resource_name=r, device_ids=ids)
                                                  for r, ids in sorted(devices.items()) if ids])
        for name, devices in pod.resources])


class _Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, pods: Callable[[], Iterable[PodLike]], allocatable: Callable[[], dict[str, list[str]]],
                 calls: list[str]) -> None:
        self.pods = pods
        self.allocatable = allocatable
        self.calls = calls

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self.calls.append("List")
        return pr.ListPodResourcesResponse(pod_resources=[pod_resources(p) for p in self.pods()])

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self.calls.append("Get")
        for p in self.pods():
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=pod_resources(p))
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not "
                                               "found")
        raise AssertionError("abort returns by raising")

    def GetAllocatableResources(self, request: pr.AllocatableResourcesRequest,
                                context: grpc.ServicerContext) -> pr.AllocatableResourcesResponse:
        self.calls.append("GetAllocatableResources")
        return pr.AllocatableResourcesResponse(devices=[pr.ContainerDevices(resource_name=r, device_ids=sorted(ids))
                                                        for r, ids in sorted(self.allocatable().items())])


class FakePodResources:
    """``start()`` serves on ``socket``; ``stop()`` ends it and removes the socket. ``calls`` names each RPC."""

    def __init__(self, socket: Path, pods: Callable[[], Iterable[PodLike]],
                 allocatable: Callable[[], dict[str, list[str]]]) -> None:
        self.socket = socket
        self.calls: list[str] = []
        self._lister = _Lister(pods, allocatable, self.calls)
        self._server: grpc.Server | None = None

    def start(self) -> FakePodResources:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(self._lister, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        self.socket.unlink(missing_ok=True)
