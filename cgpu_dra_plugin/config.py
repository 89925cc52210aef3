"""The plugin's settings: where the kubelet, arbiterd and the API server are, and how often to look."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cgpu_dra_plugin import DRIVER


@dataclass
class Config:
    node_name: str
    driver: str = DRIVER
    registry_dir: str = "/var/lib/kubelet/plugins_registry"  # the kubelet's plugin watcher looks here
    plugin_dir: str = f"/var/lib/kubelet/plugins/{DRIVER}"  # the DRAPlugin service's socket, dra.sock
    admin_socket: str = "/run/cgpu/admin.sock"  # arbiterd's admin API
    socket_dir: str = "/run/cgpu"  # host dir of arbiter.sock, mounted read-only at /run/cgpu
    libcgpu: str = "/usr/local/lib/cgpu/libcgpu.so"  # host path of the shim, mounted and preloaded
    state_dir: str = "/var/lib/cgpu/dra"  # checkpoint.json and the allocations' token dirs (root only)
    alloc_mount: str = "/run/cgpu-alloc"  # where containers see token dirs; arbiterd's alloc_mount
    cdi_dir: str = "/var/run/cdi"  # where the container runtime reads CDI specs
    kubeconfig: str | None = None  # None: in-cluster, else ~/.kube/config
    server: str | None = None  # the API server's URL, bypassing kubeconfig (tests)
    poll_interval_s: float = 2.0  # how often arbiterd's status is read (slice updates, arbiterd restarts)
    gc_interval_s: float = 30.0  # how often prepared claims are checked against the API server
    watch_interval_s: float = 1.0  # how often the registration socket is checked

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver}-reg.sock")

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.plugin_dir, "dra.sock")
