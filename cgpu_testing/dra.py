"""A Kubernetes node with DRA for tests and bench.k8s: a real arbiterd, the fake API server, the DRA plugin
in this process, the fake DRA kubelet, and the scheduler model placing claims on the published slice.

arbiterd runs as for the device plugin (:func:`cgpu_testing.k8s.node_daemon`: simulated GPUs,
allocations required, containers told by their cgroups in a fake ``/proc``). The caller starts
and stops the daemon (a test may lend one daemon to many nodes); :meth:`DraNode.close` stops the
rest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cgpu_device_plugin.admin import AdminClient
from cgpu_dra_plugin import DRIVER
from cgpu_dra_plugin.config import Config
from cgpu_dra_plugin.plugin import Plugin
from cgpu_testing.apiserver import FakeApiServer
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.drakubelet import ClaimRef, FakeDraKubelet
from cgpu_testing.drasched import allocate
from cgpu_testing.k8s import proc_root_of

NODE = "gpu-node-1"
DEVICE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}


class DraNode:
    def __init__(self, root: Path, daemon: DaemonProc, api: FakeApiServer | None = None) -> None:
        self.root = root
        self.daemon = daemon
        self.api = api or FakeApiServer().start()
        self._own_api = api is None
        self.api.put("deviceclasses", DEVICE_CLASS)
        self.libcgpu = root / "libcgpu.so"
        self.libcgpu.write_bytes(b"")  # mounted into containers, never loaded by the tests' programs
        proc_root = proc_root_of(daemon)
        proc_root.mkdir(parents=True, exist_ok=True)
        self.kubelet = FakeDraKubelet(root / "registry", root / "k", root / "cdi", proc_root)
        self.plugin: Plugin | None = None

    def config(self, **overrides: Any) -> Config:
        cfg = Config(node_name=NODE, registry_dir=str(self.root / "registry"), plugin_dir=str(self.root / "plugin"),
                     admin_socket=self.daemon.admin, socket_dir=str(self.daemon.run_dir), libcgpu=str(self.libcgpu),
                     state_dir=str(self.root / "state"), cdi_dir=str(self.root / "cdi"), server=self.api.url,
                     poll_interval_s=0.05, gc_interval_s=3600, watch_interval_s=0.05)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg

    def start_plugin(self, wait: bool = True, **overrides: Any) -> Plugin:
        """Start the plugin; with ``wait``, return once the kubelet registered it and its slice is on the API
        server (without, the kubelet is not touched: another thread may be using it)."""
        self.plugin = Plugin(self.config(**overrides))
        self.plugin.start()
        if not wait:
            return self.plugin
        self.kubelet.wait_registered(DRIVER)
        self.wait_slice(lambda s: bool(s["spec"]["devices"]))
        return self.plugin

    def stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.list("resourceslices") if s["spec"]["driver"] == DRIVER]

    def wait_slice(self, predicate: Any, timeout: float = 10.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for s in self.slices():
                if predicate(s):
                    return s
            time.sleep(0.02)
        raise TimeoutError(f"no ResourceSlice matched; have {self.slices()}")

    def schedule(self, claim: dict[str, Any], pod: str | None = None,
                 containers: tuple[str, ...] = ("main",)) -> dict[str, Any]:
        """Create ``claim`` and allocate it as kube-scheduler would (raise Unschedulable), reserved for a pod
        (named ``pod``, else as the claim) whose ``containers`` each name it in ``resources.claims``, which is
        created too; the stored claim."""
        meta = claim["metadata"]
        namespace = meta.get("namespace", "default")
        consumer = self.api.put("pods", {"metadata": {"name": pod or meta["name"], "namespace": namespace}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": meta["name"]}],
            "containers": [{"name": c, "image": "example:1", "resources": {"claims": [{"name": "gpu"}]}}
                           for c in containers]}})
        stored = self.api.put("resourceclaims", claim)
        others = [c for c in self.api.list("resourceclaims") if c["metadata"]["uid"] != stored["metadata"]["uid"]]
        try:
            classes = self.api.list("deviceclasses")
            allocation = allocate(stored, self.slices(), others, {c["metadata"]["name"]: DRIVER for c in classes}, NODE,
                                  {c["metadata"]["name"]: c["spec"].get("config", []) for c in classes})
        except Exception:
            self.api.delete("resourceclaims", meta["name"], namespace)
            self.api.delete("pods", consumer["metadata"]["name"], namespace)
            raise
        stored["status"] = {"allocation": allocation, "reservedFor": [
            {"resource": "pods", "name": consumer["metadata"]["name"], "uid": consumer["metadata"]["uid"]}]}
        return self.api.put("resourceclaims", stored)

    @staticmethod
    def ref(claim: dict[str, Any]) -> ClaimRef:
        m = claim["metadata"]
        return ClaimRef(m.get("namespace", "default"), m["uid"], m["name"])

    def prepare(self, claim: dict[str, Any]) -> list[str]:
        """NodePrepareResources for ``claim``; its CDI device ids."""
        devices = self.kubelet.prepare(DRIVER, [self.ref(claim)])[claim["metadata"]["uid"]]
        return [i for d in devices for i in d.cdi_device_ids]

    @staticmethod
    def pod_uid(claim: dict[str, Any]) -> str:
        """The UID of the pod the claim is reserved for."""
        return str(claim["status"]["reservedFor"][0]["uid"])

    def unprepare(self, claim: dict[str, Any]) -> None:
        self.kubelet.unprepare(DRIVER, [self.ref(claim)])

    def delete(self, claim: dict[str, Any]) -> None:
        """The pod is gone: unprepare, then the claim is deleted (as the resource-claim controller does)."""
        self.unprepare(claim)
        m = claim["metadata"]
        self.api.delete("resourceclaims", m["name"], m.get("namespace", "default"))
        for r in (claim.get("status") or {}).get("reservedFor") or []:
            self.api.delete("pods", r["name"], m.get("namespace", "default"))

    def admin(self) -> AdminClient:
        return AdminClient(self.daemon.admin)

    def close(self) -> None:
        self.kubelet.close()
        self.stop_plugin()
        if self._own_api:
            self.api.stop()
