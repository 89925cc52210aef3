"""Fixtures for the device plugin: a fake arbiterd admin API, a fake kubelet, the plugin in-process."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cgpu_device_plugin.config import Config
from cgpu_device_plugin.plugin import Plugin
from tests.k8s.fake_arbiter import FakeArbiter
from tests.k8s.fake_kubelet import FakeKubelet


class Node:
    """One fake node: directories, a fake arbiterd, a fake kubelet, and plugins started on them."""

    def __init__(self, root: Path, gpus_gib: list[int]) -> None:
        self.root = root
        self.kubelet_dir = root / "dp"
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        self.libcgpu = root / "libcgpu.so"
        self.libcgpu.write_bytes(b"")  # only mounted, never loaded, in these tests
        self.arbiter = FakeArbiter(self.run_dir / "admin.sock", gpus_gib).start()
        self.kubelet = FakeKubelet(self.kubelet_dir, root / "k").start()
        self.plugins: list[Plugin] = []

    def config(self, **overrides: Any) -> Config:
        cfg = Config(kubelet_dir=str(self.kubelet_dir), admin_socket=str(self.arbiter.path),
                     socket_dir=str(self.run_dir), libcgpu=str(self.libcgpu), alloc_dir=str(self.root / "alloc"),
                     poll_interval_s=0.05, watch_interval_s=0.05)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg

    def start_plugin(self, wait: bool = True, **overrides: Any) -> Plugin:
        """Start a plugin; with ``wait``, return once both resources registered anew and sent devices."""
        resources = ("aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage")
        before = {r: self.kubelet.registrations.get(r, 0) for r in resources}
        plugin = Plugin(self.config(**overrides))
        plugin.start()
        self.plugins.append(plugin)
        if wait:
            for resource in resources:
                self.kubelet.wait_registered(resource, count=before[resource] + 1)
        return plugin

    def close(self) -> None:
        self.kubelet.close()
        for plugin in self.plugins:
            plugin.stop()
        self.arbiter.stop()


@pytest.fixture
def node_factory() -> Iterator[Any]:
    made: list[Node] = []

    def make(gpus_gib: list[int] | None = None) -> Node:
        # short: UNIX socket paths (the rootfs' arbiter.sock included) must stay under 108 bytes
        n = Node(Path(tempfile.mkdtemp(prefix="k8-", dir="/tmp")), gpus_gib or [16, 16])
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()
        shutil.rmtree(n.root, ignore_errors=True)


@pytest.fixture
def node(node_factory: Any) -> Node:
    """Two 16 GiB GPUs, a fake kubelet, and nothing started on them yet."""
    return node_factory()  # type: ignore[no-any-return]
