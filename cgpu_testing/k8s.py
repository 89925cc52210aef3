"""A Kubernetes node for tests/k8s and bench.k8s: a real arbiterd that hands out allocations (``alloc_ctl``), the
fake kubelet (:mod:`cgpu_testing.kubelet`), and device plugins started on them in this process.

arbiterd runs as a node runs it for the plugin (docs/kubernetes.md): on simulated GPUs, allocations required and
bound by token, each container told by its cgroup, read from the fake ``/proc`` that the kubelet writes for every
container it starts.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any

from cgpu_device_plugin.admin import AdminClient
from cgpu_device_plugin.config import Config
from cgpu_device_plugin.node import DaemonAllocation
from cgpu_device_plugin.plugin import Plugin
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.kubelet import CORE, MEM, FakeKubelet

GIB = 1 << 30
RESOURCES = (MEM, CORE)
ALLOC_MOUNT = "/run/cgpu-alloc"


def node_daemon(tmp: Path, gpus: str = "2x16GiB", *args: str) -> DaemonProc:
    """arbiterd (not started) as a node runs it for the plugin, on ``gpus`` (``--sim-gpus``), reading the fake
    ``/proc`` at ``tmp/proc``; ``args`` are more flags."""
    return DaemonProc(tmp, "--sim-gpus", gpus, "--proc-root", str(tmp / "proc"), "--identity", "cgroup",
                      "--allocations", "required", "--alloc-mount", ALLOC_MOUNT, *args)


def proc_root_of(daemon: DaemonProc) -> Path:
    """The fake ``/proc`` a daemon of :func:`node_daemon` reads."""
    return Path(daemon.args[daemon.args.index("--proc-root") + 1])


class Node:
    """One node under ``root``: the plugins' and the kubelet's directories, ``daemon`` (started by the caller, and
    stopped by it: a test may lend one daemon to many nodes), a fake kubelet writing that daemon's fake ``/proc``,
    and the plugins :meth:`start_plugin` started, which :meth:`close` stops."""

    def __init__(self, root: Path, daemon: DaemonProc, **kubelet: Any) -> None:
        self.root = root
        self.daemon = daemon
        self.kubelet_dir = root / "dp"
        self.libcgpu = root / "libcgpu.so"
        self.libcgpu.write_bytes(b"")  # mounted into containers, never loaded by the tests' programs
        proc_root = proc_root_of(daemon)
        proc_root.mkdir(parents=True, exist_ok=True)
        self.kubelet = FakeKubelet(self.kubelet_dir, root / "k", proc_root=proc_root, **kubelet).start()
        self.plugins: list[Plugin] = []

    @property
    def run_dir(self) -> Path:
        """The daemon's run dir: the plugin mounts it into containers as ``/run/cgpu``."""
        return self.daemon.run_dir

    def config(self, **overrides: Any) -> Config:
        cfg = Config(kubelet_dir=str(self.kubelet_dir), admin_socket=self.daemon.admin, socket_dir=str(self.run_dir),
                     libcgpu=str(self.libcgpu), alloc_dir=str(self.root / "alloc"), poll_interval_s=0.05,
                     watch_interval_s=0.05, pod_resources_socket=str(self.kubelet.pod_resources.socket))
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg

    def start_plugin(self, wait: bool = True, **overrides: Any) -> Plugin:
        """Start a plugin; with ``wait``, return once both resources registered anew and sent their devices."""
        before = {r: self.kubelet.registrations.get(r, 0) for r in RESOURCES}
        plugin = Plugin(self.config(**overrides))
        plugin.start()
        self.plugins.append(plugin)
        if wait:
            for resource in RESOURCES:
                self.kubelet.wait_registered(resource, count=before[resource] + 1)
        return plugin

    def wait_health(self, health: str, what: str = "") -> None:
        """Until every device of both resources is ``health`` (``Healthy`` or ``Unhealthy``)."""
        for resource in RESOURCES:
            self.kubelet.wait_devices(resource, lambda d: bool(d) and set(d.values()) == {health},
                                      what=what or f"all {health}")

    def admin(self) -> AdminClient:
        return AdminClient(self.daemon.admin)

    def allocations(self) -> dict[str, DaemonAllocation]:
        """arbiterd's allocations, by id (its status document)."""
        return {a.id: a for a in self.admin().node().allocations}

    def add(self, alloc_id: str, gpu: int, memsize: int = 0, core: int = 0) -> None:
        """An allocation made behind the plugin's back (an operator, a racing client), with a token of its own."""
        digest = hashlib.sha256(secrets.token_hex(16).encode()).hexdigest()
        self.admin().create_allocation(alloc_id, digest, [gpu], [memsize] if memsize else [], core)

    def close(self) -> None:
        """Stop the kubelet (its pods' containers killed) and the plugins; the daemon is the caller's."""
        self.kubelet.close()
        for plugin in self.plugins:
            plugin.stop()
