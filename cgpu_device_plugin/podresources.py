"""Naming each allocation's pod and container in arbiterd, from the kubelet's PodResources API.

How this works
--------------
The kubelet's ``Allocate`` never says which pod or container it is for; the kubelet records
the device IDs it handed out per pod and container, and serves that record on
``pod_resources_socket`` (``/var/lib/kubelet/pod-resources/kubelet.sock``), the ``v1``
``PodResourcesLister`` of kubernetes/kubelet ``pkg/apis/podresources/v1/api.proto``
(vendored under ``cgpu_device_plugin/api/podresources``). Every ``poll_interval_s`` the
labeller calls ``List``, maps each of this plugin's device IDs to its pod's namespace, name and
container, and hands the allocator the map: every recorded allocation whose devices a
container holds gets that container's names, in its record and in arbiterd (``alloc_ctl
label``), once. So an allocation is named within a poll of its container's admission, and a
record keeps the names across restarts of the plugin and of arbiterd (``resync`` creates an
allocation again with them). The socket missing (an old kubelet, or the DaemonSet mounts
no ``/var/lib/kubelet/pod-resources``) is logged once; allocations then carry no pod.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import grpc

from arbiterd.core import podlabels
from arbiterd.core.errors import SettingError
from arbiterd.core.podlabels import PodLabels
from cgpu_device_plugin.api.podresources.v1 import api_pb2 as pr
from cgpu_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from cgpu_device_plugin.devices import Resource

log = logging.getLogger("cgpu_device_plugin.podresources")
TIMEOUT_S = 5.0
RESOURCES = {r.resource_name for r in Resource}


def holders(response: pr.ListPodResourcesResponse) -> tuple[dict[str, PodLabels], list[str]]:
    """Device ID -> the pod labels of the container holding it, for this plugin's resources; and one line for each
    container whose names are not Kubernetes names (the kubelet's are; nothing is sent for such a one)."""
    out: dict[str, PodLabels] = {}
    bad = []
    for pod in response.pod_resources:
        for c in pod.containers:
            ids = [i for d in c.devices if d.resource_name in RESOURCES for i in d.device_ids]
            if not ids:
                continue
            try:
                labels = podlabels.check(pod.namespace, pod.name, c.name)
            except SettingError as exc:
                bad.append(f"pod {pod.namespace!r}/{pod.name!r} container {c.name!r}: {exc}")
                continue
            out.update(dict.fromkeys(ids, labels))
    return out, bad


class PodLabeller:
    """Polls ``List`` and passes the holders to ``apply`` (the allocator's :meth:`~Allocator.label`)."""

    def __init__(self, socket: str, interval_s: float, apply: Callable[[Mapping[str, PodLabels]], int],
                 then: Callable[[], int] | None = None) -> None:
        self.socket = socket
        self.interval_s = interval_s
        self.apply = apply
        self.then = then  # after each poll that named pods: the pods' limits (podlimits.py)
        self.available: bool | None = None  # None: not asked yet
        self._bad_logged: set[str] = set()
        self._channel: grpc.Channel | None = None  # kept between polls; made again after a failed call
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cgpu-podresources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._close()

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval_s)

    def list(self) -> pr.ListPodResourcesResponse:
        """``List`` on the kubelet's socket (raises grpc.RpcError, and the next call dials again: a restarted
        kubelet serves a new socket)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        stub = pr_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            response: pr.ListPodResourcesResponse = stub.List(pr.ListPodResourcesRequest(), timeout=TIMEOUT_S)
        except grpc.RpcError:
            self._close()
            raise
        return response

    def poll_once(self) -> int:
        """Read the kubelet's record once and name what it shows; how many allocations were named now."""
        try:
            response = self.list()
        except grpc.RpcError as exc:
            if self.available is not False:
                detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                log.warning("the kubelet's PodResources API at %s does not answer (%s): allocations carry no pod "
                            "names until it does", self.socket, detail)
            self.available = False
            return 0
        if self.available is False:
            log.info("the kubelet's PodResources API at %s answers: naming the pods of allocations", self.socket)
        self.available = True
        found, bad = holders(response)
        for line in bad:
            if line not in self._bad_logged:
                self._bad_logged.add(line)
                log.warning("PodResources: %s; its allocations are not named", line)
        named = self.apply(found)
        if self.then is not None:
            self.then()
        return named
