"""A fake kubelet for DRA drivers: the plugin watcher's registration, then the DRA manager's calls.

What it does, as the kubelet does (pkg/kubelet/pluginmanager and pkg/kubelet/cm/dra):

* ``discover()``: for each socket in the plugins-registry directory, dial it and call
  ``Registration.GetInfo``; a ``DRAPlugin`` whose ``supported_versions`` include a DRA
  service this kubelet speaks (``v1.DRAPlugin``, then ``v1beta1.DRAPlugin``: the newest wins;
  ``versions`` narrows it, as a 1.32/1.33 kubelet knows only ``v1beta1``) is dialled on its
  ``endpoint`` and told ``NotifyRegistrationStatus(plugin_registered=true)``; otherwise it is
  told why not.
* ``prepare(claims)``: ``NodePrepareResources`` for the pod's claims before any container of
  the pod starts; a claim answered with an error, or missing from the answer, is asked again
  (the kubelet's pod sync retries), up to ``retries`` times, re-discovering the plugin when
  the call itself fails (the plugin restarted).
* ``unprepare(claims)``: ``NodeUnprepareResources`` once the pod's containers are gone, with
  the same retries.
* ``restart()``: forgets every plugin connection (a restarting kubelet), then discovers again;
  plugins-registry sockets stay, as on a node.
* ``start_container(...)``: applies the CDI devices a prepare returned (the container
  runtime's part: env and mounts from the specs in ``cdi_dir``) and runs a real process with
  the fake ``/proc`` entry that arbiterd reads (:class:`cgpu_testing.kubelet.FakeKubelet`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as dp
from cgpu_dra_plugin import cdi
from cgpu_dra_plugin.api.dra.v1 import api_pb2 as v1
from cgpu_dra_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from cgpu_dra_plugin.api.dra.v1beta1 import api_pb2 as v1beta1
from cgpu_dra_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from cgpu_dra_plugin.api.pluginregistration.v1 import api_pb2 as reg
from cgpu_dra_plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from cgpu_testing.kubelet import Container, FakeKubelet, Pod, RunningContainer

SERVICES: dict[str, tuple[Any, Any]] = {"v1.DRAPlugin": (v1, v1_grpc), "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc)}


class PrepareFailed(Exception):
    """A claim still failed after the retries; the message is the plugin's last error."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass
class DraPlugin:
    driver: str
    version: str
    channel: grpc.Channel
    stub: Any
    pb: Any


@dataclass
class FakeDraKubelet:
    registry_dir: Path
    root: Path
    cdi_dir: Path
    proc_root: Path
    versions: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    retries: int = 5
    retry_delay_s: float = 0.05
    plugins: dict[str, DraPlugin] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (rpc, claim uid or driver)
    prepare_seconds: list[float] = field(default_factory=list)
    _containers: FakeKubelet | None = None

    # ------------------------------------------------------------ registration
    def discover(self) -> list[str]:
        """Register every DRA plugin whose socket is in the registry dir; the drivers registered now."""
        found = []
        for sock in sorted(self.registry_dir.glob("*.sock")):
            channel = grpc.insecure_channel(f"unix://{sock}")
            try:
                stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                info = stub.GetInfo(reg.InfoRequest(), timeout=5)
                self.calls.append(("GetInfo", info.name))
                if info.type != "DRAPlugin":
                    continue
                version = next((v for v in self.versions if v in info.supported_versions), None)
                if version is None:
                    stub.NotifyRegistrationStatus(reg.RegistrationStatus(
                        plugin_registered=False, error=f"none of {list(info.supported_versions)} is supported"),
                        timeout=5)
                    continue
                pb, pb_grpc = SERVICES[version]
                dra = grpc.insecure_channel(f"unix://{info.endpoint}")
                grpc.channel_ready_future(dra).result(timeout=5)
                old = self.plugins.pop(info.name, None)
                if old is not None:
                    old.channel.close()
                self.plugins[info.name] = DraPlugin(info.name, version, dra, pb_grpc.DRAPluginStub(dra), pb)
                stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
                self.calls.append(("NotifyRegistrationStatus", info.name))
                found.append(info.name)
            except grpc.RpcError:
                continue  # a stale socket: the real watcher ignores it too
            finally:
                channel.close()
        return found

    def wait_registered(self, driver: str, timeout: float = 10.0) -> DraPlugin:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if driver in self.discover():
                return self.plugins[driver]
            time.sleep(0.05)
        raise TimeoutError(f"fake kubelet: DRA driver {driver} did not register")

    def restart(self) -> None:
        """A kubelet restart: every connection dropped, then the registry dir discovered again."""
        for p in self.plugins.values():
            p.channel.close()
        self.plugins.clear()
        self.discover()

    def close(self) -> None:
        for p in self.plugins.values():
            p.channel.close()
        self.plugins.clear()
        if self._containers is not None:
            self._containers.close()

    # ------------------------------------------------------------ claims
    def _call(self, driver: str, rpc: str, claims: Sequence[ClaimRef]) -> Any:
        for attempt in range(self.retries + 1):
            plugin = self.plugins.get(driver)
            if plugin is None:
                self.discover()
                plugin = self.plugins.get(driver)
            if plugin is not None:
                request_type = getattr(plugin.pb, f"{rpc}Request")
                req = request_type(claims=[plugin.pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name)
                                           for c in claims])
                try:
                    return getattr(plugin.stub, rpc)(req, timeout=10)
                except grpc.RpcError:
                    self.plugins.pop(driver, None)  # the plugin went away: find it again
            if attempt < self.retries:
                time.sleep(self.retry_delay_s)
        raise PrepareFailed(f"{rpc}: DRA driver {driver} is not reachable")

    def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, list[Any]]:
        """Prepare ``claims``; per claim UID the devices (request_names, pool_name, device_name, cdi_device_ids).
        Raise PrepareFailed when a claim still fails after the retries."""
        todo = list(claims)
        out: dict[str, list[Any]] = {}
        last: dict[str, str] = {}
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            resp = self._call(driver, "NodePrepareResources", todo)
            self.prepare_seconds.append(time.perf_counter() - t0)
            self.calls += [("NodePrepareResources", c.uid) for c in todo]
            failed = []
            for c in todo:
                answer = resp.claims.get(c.uid)
                if answer is None or answer.error:
                    last[c.uid] = answer.error if answer is not None else "missing from the answer"
                    failed.append(c)
                else:
                    out[c.uid] = list(answer.devices)
            todo = failed
            if not todo:
                return out
            if attempt < self.retries:
                time.sleep(self.retry_delay_s)
        raise PrepareFailed("; ".join(f"claim {c.namespace}/{c.name}: {last[c.uid]}" for c in todo))

    def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> None:
        todo = list(claims)
        last: dict[str, str] = {}
        for attempt in range(self.retries + 1):
            resp = self._call(driver, "NodeUnprepareResources", todo)
            self.calls += [("NodeUnprepareResources", c.uid) for c in todo]
            todo = [c for c in todo if c.uid not in resp.claims or resp.claims[c.uid].error]
            last = {c.uid: resp.claims[c.uid].error if c.uid in resp.claims else "missing" for c in todo}
            if not todo:
                return
            if attempt < self.retries:
                time.sleep(self.retry_delay_s)
        raise PrepareFailed("; ".join(f"claim {c.namespace}/{c.name}: {last[c.uid]}" for c in todo))

    # ------------------------------------------------------------ containers
    def start_container(self, pod_uid: str, cdi_ids: Sequence[str], argv: Sequence[str],
                        env: dict[str, str] | None = None) -> RunningContainer:
        """Run ``argv`` as a container of pod ``pod_uid`` with the CDI devices ``cdi_ids`` applied."""
        if self._containers is None:
            self._containers = FakeKubelet(self.root / "dp-unused", self.root, proc_root=self.proc_root)
        c = Container("c0", {})
        for i, device_id in enumerate(cdi_ids):
            edits = cdi.read_device(str(self.cdi_dir), device_id)
            envs = dict(e.split("=", 1) for e in edits.get("env", []))
            mounts = [dp.Mount(container_path=m["containerPath"], host_path=m["hostPath"],
                               read_only="ro" in m.get("options", [])) for m in edits.get("mounts", [])]
            c.responses[f"cdi-{i}"] = dp.ContainerAllocateResponse(envs=envs, mounts=mounts)
        pod = Pod(pod_uid, f"pod-{pod_uid[:8]}", [c])
        self._containers.pods[pod_uid] = pod
        return self._containers.start_container(pod, argv, env=env)
