"""The gRPC side: plugin registration (``pluginregistration.Registration``) and the node service
``DRAPlugin`` in both API versions the kubelet speaks, ``v1`` (Kubernetes 1.34+) and ``v1beta1``.

The kubelet's plugin watcher finds ``<registry_dir>/<driver>-reg.sock``, calls ``GetInfo``
(type ``DRAPlugin``, the driver's name, the DRA socket, ``v1.DRAPlugin`` and
``v1beta1.DRAPlugin``: the kubelet picks the newest it knows), then ``NotifyRegistrationStatus``.
Then it calls ``NodePrepareResources``/``NodeUnprepareResources`` on the DRA socket. Each claim
gets its own answer: a claim that fails (for any reason, a bug included) carries its one-line
error and the others still go through; the kubelet retries the failed ones.

A kubelet restart needs nothing from the plugin (its watcher finds the socket again). If the
registration socket is deleted, :class:`Servers` serves a new one.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from typing import Any

import grpc

from cgpu_dra_plugin.api.dra.v1 import api_pb2 as v1
from cgpu_dra_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from cgpu_dra_plugin.api.dra.v1beta1 import api_pb2 as v1beta1
from cgpu_dra_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from cgpu_dra_plugin.api.pluginregistration.v1 import api_pb2 as reg
from cgpu_dra_plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from cgpu_dra_plugin.config import Config
from cgpu_dra_plugin.prepare import PrepareError, Preparer

log = logging.getLogger("cgpu_dra_plugin.server")
PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go: DRAPlugin
SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # dra/v1 and dra/v1beta1 types.go: DRAPluginService


def _unexpected(verb: str, c: Any, exc: Exception) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"claim {c.namespace}/{c.name}: {verb} failed in the plugin ({type(exc).__name__}: {first}); see its log"


def _prepare(preparer: Preparer, pb: Any, request: Any) -> Any:
    resp = pb.NodePrepareResourcesResponse()
    for c in request.claims:
        answer = resp.claims[c.uid]
        try:
            for d in preparer.prepare(c.namespace, c.uid, c.name):
                answer.devices.add(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                                   cdi_device_ids=[d.cdi_id])
        except PrepareError as exc:
            log.warning("claim %s/%s (%s): prepare failed: %s", c.namespace, c.name, c.uid, exc)
            answer.error = str(exc)
        except Exception as exc:  # a bug fails this claim alone; the kubelet retries it
            log.exception("claim %s/%s (%s): prepare failed unexpectedly", c.namespace, c.name, c.uid)
            answer.error = _unexpected("prepare", c, exc)
    return resp


def _unprepare(preparer: Preparer, pb: Any, request: Any) -> Any:
    resp = pb.NodeUnprepareResourcesResponse()
    for c in request.claims:
        answer = resp.claims[c.uid]
        try:
            preparer.unprepare(c.uid)
        except PrepareError as exc:
            log.warning("claim %s/%s (%s): unprepare failed: %s", c.namespace, c.name, c.uid, exc)
            answer.error = str(exc)
        except Exception as exc:  # a bug fails this claim alone; the kubelet retries it
            log.exception("claim %s/%s (%s): unprepare failed unexpectedly", c.namespace, c.name, c.uid)
            answer.error = _unexpected("unprepare", c, exc)
    return resp


class DraService:
    """``DRAPlugin`` of one API version: ``pb`` is that version's ``api_pb2`` (v1 or v1beta1, the same messages)."""

    def __init__(self, preparer: Preparer, pb: Any) -> None:
        self.preparer = preparer
        self.pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _prepare(self.preparer, self.pb, request)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _unprepare(self.preparer, self.pb, request)


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.registered = threading.Event()
        self.notifications: list[tuple[bool, str]] = []

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.cfg.driver, endpoint=self.cfg.dra_socket,
                              supported_versions=SUPPORTED_VERSIONS)

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.notifications.append((request.plugin_registered, request.error))
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s (%s)", self.cfg.driver, self.cfg.dra_socket)
            self.registered.set()
        else:
            log.error("the kubelet refused the registration of DRA driver %s: %s", self.cfg.driver, request.error)
        return reg.RegistrationStatusResponse()


def _serve(path: str, add: Any) -> grpc.Server:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)  # a socket left by an earlier run
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


class Servers:
    """The DRA socket and the registration socket; the latter is served again if it is deleted."""

    def __init__(self, cfg: Config, preparer: Preparer) -> None:
        self.cfg = cfg
        self.preparer = preparer
        self.registration = Registration(cfg)
        self._dra: grpc.Server | None = None
        self._reg: grpc.Server | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _serve_registration(self) -> None:
        self._reg = _serve(self.cfg.registration_socket,
                           lambda s: reg_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
                               self.registration, s))

    def start(self) -> None:
        def add_dra(server: grpc.Server) -> None:
            v1_grpc.add_DRAPluginServicer_to_server(DraService(self.preparer, v1), server)  # type: ignore[no-untyped-call]
            v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                DraService(self.preparer, v1beta1), server)

        self._dra = _serve(self.cfg.dra_socket, add_dra)
        self._serve_registration()  # last: the kubelet may call as soon as this socket exists
        self._thread = threading.Thread(target=self._watch, name="cgpu-dra-registration", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.cfg.watch_interval_s):
            if not os.path.exists(self.cfg.registration_socket):
                log.warning("registration socket %s was deleted; serving it again", self.cfg.registration_socket)
                if self._reg is not None:
                    self._reg.stop(0)
                self._serve_registration()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for server, path in ((self._reg, self.cfg.registration_socket), (self._dra, self.cfg.dra_socket)):
            if server is not None:
                server.stop(1).wait(5)
            if os.path.exists(path):
                os.unlink(path)
