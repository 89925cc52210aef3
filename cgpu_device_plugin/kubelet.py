"""Serving each resource on its own socket in the kubelet's directory, and staying registered.

How this works
--------------
The kubelet, when it starts, empties its device-plugins directory (our sockets included)
and creates ``kubelet.sock`` anew; a plugin must then serve again and re-register. So every
``watch_interval_s`` the link compares ``kubelet.sock``'s identity (device, inode, ctime:
an inode number alone may be reused by the new file) and our own sockets' with what it
registered against. On any difference it (re)starts the servers whose socket is gone and
registers every resource again. The kubelet calls ``GetDevicePluginOptions`` back before it
answers ``Register``, so servers are always started first. A failed registration is retried
with a doubling delay (up to 30 s).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent import futures
from pathlib import Path

import grpc

from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from cgpu_device_plugin.config import Config
from cgpu_device_plugin.devices import API_VERSION, Resource
from cgpu_device_plugin.servicer import OPTIONS, DevicePluginServicer

log = logging.getLogger("cgpu_device_plugin.kubelet")
FileId = tuple[int, int, int]
REGISTER_TIMEOUT_S = 10.0
RETRY_MAX_S = 30.0


def file_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class _Endpoint:
    """One resource's gRPC server on ``<kubelet_dir>/<resource.endpoint>``."""

    def __init__(self, path: Path, servicer: DevicePluginServicer) -> None:
        self.path = path
        self.servicer = servicer
        self.server: grpc.Server | None = None
        self.socket_id: FileId | None = None

    @property
    def serving(self) -> bool:
        return self.server is not None and self.socket_id is not None and file_id(self.path) == self.socket_id

    def start(self) -> None:
        self.stop()
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.path.stem))
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self.server, self.socket_id = server, file_id(self.path)
        log.info("%s: serving on %s", self.servicer.resource.resource_name, self.path)

    def stop(self, grace: float = 0.5) -> None:
        if self.server is not None:
            self.server.stop(grace).wait(grace + 5)
            self.server = None
        if self.socket_id is not None and file_id(self.path) == self.socket_id:
            self.path.unlink()  # only our own socket file, never one a newer process made
        self.socket_id = None


class KubeletLink:
    def __init__(self, cfg: Config, servicers: Mapping[Resource, DevicePluginServicer]) -> None:
        self.cfg = cfg
        self.kubelet_socket = cfg.kubelet_socket
        self.endpoints = {r: _Endpoint(Path(cfg.kubelet_dir) / r.endpoint, s) for r, s in servicers.items()}
        self.registered: FileId | None = None  # the kubelet.sock we registered with
        self.registrations = 0
        self._retry_s = 0.0
        self._lost_logged = False

    def run(self, stop: threading.Event) -> None:
        """Keep serving and registered until ``stop`` is set; then stop serving."""
        try:
            while not stop.is_set():
                wait = self.step()
                stop.wait(wait)
        finally:
            self.close()

    def step(self) -> float:
        """Check once and act; return how long to wait before the next check."""
        current = file_id(self.kubelet_socket)
        if current is None:
            if not self._lost_logged:
                log.warning("no kubelet socket at %s: waiting for the kubelet", self.kubelet_socket)
                self._lost_logged = True
            self.registered = None
            return self.cfg.watch_interval_s
        self._lost_logged = False
        stale = [r for r, e in self.endpoints.items() if not e.serving]
        if current == self.registered and not stale:
            return self.cfg.watch_interval_s
        if self.registered is not None:
            why = "kubelet.sock was re-created" if current != self.registered else "our sockets were removed"
            log.info("the kubelet restarted (%s): serving and registering again", why)
        try:
            for resource in stale:
                self.endpoints[resource].start()
            for resource in self.endpoints:
                self._register(resource)
        except (grpc.RpcError, RuntimeError, OSError) as exc:
            self._retry_s = min(RETRY_MAX_S, max(self.cfg.watch_interval_s, self._retry_s * 2))
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            log.warning("registration with the kubelet at %s failed (%s); retrying in %.1f s", self.kubelet_socket,
                        detail, self._retry_s)
            self.registered = None
            return self._retry_s
        self._retry_s = 0.0
        self.registered = current
        return self.cfg.watch_interval_s

    def _register(self, resource: Resource) -> None:
        request = pb.RegisterRequest(version=API_VERSION, endpoint=resource.endpoint,
                                     resource_name=resource.resource_name, options=OPTIONS)
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        self.registrations += 1
        log.info("%s: registered with the kubelet (endpoint %s)", resource.resource_name, resource.endpoint)

    def close(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.stop()
