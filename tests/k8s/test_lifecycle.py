"""Registration, kubelet restarts, health, and keeping arbiterd's allocations in step with the records.

arbiterd is real (tests/k8s/conftest.py): it goes away, comes back with a GPU fewer, or forgets its state by being
stopped and started again."""

from __future__ import annotations

import time

import pytest

from cgpu_testing.daemon import sim_uuid
from cgpu_testing.k8s import GIB
from cgpu_testing.kubelet import CORE, MEM, AdmissionError
from tests.k8s.conftest import RecordedNode as Node

RESOURCES = (MEM, CORE)


def all_are(health: str) -> object:
    return lambda devices: bool(devices) and set(devices.values()) == {health}


def test_each_resource_registers_on_its_own_socket_in_the_kubelets_order(node: Node) -> None:
    node.start_plugin()
    for resource, sock in ((MEM, "cgpu-mem.sock"), (CORE, "cgpu-core.sock")):
        ep = node.kubelet.wait_registered(resource)
        assert ep.socket == node.kubelet_dir / sock and ep.socket.is_socket()
        calls = [name for name, r in node.kubelet.calls if r == resource]
        assert calls[:3] == ["Register", "GetDevicePluginOptions", "ListAndWatch"]
        assert ep.options.get_preferred_allocation_available and not ep.options.pre_start_required
    assert len(node.kubelet.devices(MEM)) == 32 and len(node.kubelet.devices(CORE)) == 200
    assert set(node.kubelet.devices(MEM).values()) == {"Healthy"}


def test_the_plugin_re_registers_when_the_kubelet_restarts(node: Node) -> None:
    plugin = node.start_plugin()
    a = node.kubelet.admit("a", [{MEM: 4}])
    node.kubelet.restart()  # kubelet.sock and our sockets are deleted, a new kubelet.sock appears
    for resource in RESOURCES:
        node.kubelet.wait_registered(resource, count=2)
        node.kubelet.wait_devices(resource, all_are("Healthy"), what="healthy devices after the restart")
    assert (node.kubelet_dir / "cgpu-mem.sock").is_socket() and (node.kubelet_dir / "cgpu-core.sock").is_socket()
    b = node.kubelet.admit("b", [{MEM: 4}])  # devices in use survived the restart (checkpoint)
    assert not set(a.container().devices[MEM]) & set(b.container().devices[MEM])
    assert plugin.link.registrations == 4


def test_the_plugin_waits_for_a_kubelet_that_is_not_there_yet(node: Node) -> None:
    node.kubelet.stop()
    node.start_plugin(wait=False)
    node.kubelet.start()
    for resource in RESOURCES:
        node.kubelet.wait_registered(resource)


def test_health_flips_while_arbiterd_is_away_and_back(node: Node) -> None:
    node.start_plugin()
    node.daemon.stop()
    node.wait_health("Unhealthy")
    with pytest.raises(AdmissionError, match="Available: 0"):
        node.kubelet.admit("a", [{MEM: 1}])
    node.daemon.start()
    node.wait_health("Healthy", "all Healthy again")
    node.kubelet.admit("a", [{MEM: 1}])


def test_a_gpu_missing_from_the_status_turns_unhealthy_and_comes_back(node: Node) -> None:
    """arbiterd comes back with GPU 1 gone (a card the driver lost), then with it again."""
    node.start_plugin()
    flags = list(node.daemon.args)
    gpus = flags.index("--sim-gpus") + 1
    node.daemon.restart(*flags[:gpus], "1x16GiB", *flags[gpus + 1:])

    def gpu1_down(devices: dict[str, str]) -> bool:
        return all((h == "Unhealthy") == i.startswith(sim_uuid(1)) for i, h in devices.items())

    devices = node.kubelet.wait_devices(MEM, gpu1_down, what="GPU 1 Unhealthy")
    assert len(devices) == 32  # still listed: capacity stays, allocatable drops
    node.kubelet.wait_devices(CORE, gpu1_down, what="GPU 1 Unhealthy")
    node.daemon.restart(*flags)
    node.kubelet.wait_devices(MEM, all_are("Healthy"), what="GPU 1 Healthy again")


def allocations(node: Node) -> dict[str, tuple[str, tuple[int, ...], tuple[int, ...], int]]:
    """arbiterd's allocations: id -> (the token digest the plugin created it with, GPUs, memory, core)."""
    tokens = node.log.creates()
    return {i: (tokens.get(i, "?"), a.gpus, a.memsize, a.core) for i, a in node.allocations().items()}


def test_allocations_arbiterd_lost_are_created_again_and_strays_removed(node: Node) -> None:
    node.start_plugin()
    node.kubelet.admit("a", [{MEM: 4, CORE: 25}])
    before = allocations(node)
    node.daemon.restart(forget=True)  # a new pid, and no allocations
    node.add("mem-0123456789ab", 1, memsize=GIB)  # ours by its name, but not in our records
    # the plugin re-syncs when it sees a new pid, which may have been before the stray came: one more restart
    # (the stray kept in the state file) makes it see one with the stray there
    node.daemon.restart()
    deadline = time.monotonic() + 10
    while set(node.allocations()) != set(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert allocations(node) == before, "allocations re-created with their tokens, and the stray removed"


def test_a_restarted_plugin_keeps_its_records(node: Node) -> None:
    first = node.start_plugin()
    a = node.kubelet.admit("a", [{MEM: 16}])
    (old,) = node.allocations()
    first.stop()
    node.start_plugin()
    node.kubelet.delete(a)
    node.kubelet.admit("b", [{MEM: 16}])
    (new,) = node.allocations()
    assert new != old and not (node.root / "alloc" / old).exists()


def test_a_stray_token_directory_is_removed_at_start(node: Node) -> None:
    stray = node.root / "alloc" / "core-0123456789ab"
    stray.mkdir(parents=True)
    (stray / "token").write_text("x")
    node.start_plugin()
    assert not stray.exists()


def test_the_plugin_removes_its_sockets_when_it_stops(node: Node) -> None:
    plugin = node.start_plugin()
    plugin.stop()
    assert not (node.kubelet_dir / "cgpu-mem.sock").exists() and not (node.kubelet_dir / "cgpu-core.sock").exists()
    assert (node.kubelet_dir / "kubelet.sock").exists()


def test_the_command_serves_and_sigterm_stops_it_cleanly(node: Node) -> None:
    import signal
    import subprocess

    from cgpu_testing.tools import tool

    cfg = node.config()
    toml = node.root / "plugin.toml"
    toml.write_text(f'kubelet_dir = "{cfg.kubelet_dir}"\nadmin_socket = "{cfg.admin_socket}"\n'
                    f'socket_dir = "{cfg.socket_dir}"\nlibcgpu = "{cfg.libcgpu}"\nalloc_dir = "{cfg.alloc_dir}"\n'
                    'placement = "binpack"\n')
    proc = subprocess.Popen([tool("cgpu-device-plugin"), "--config", str(toml), "--placement", "spread",
                             "--poll-interval-s", "0.05", "--watch-interval-s", "0.05"],
                            stderr=subprocess.PIPE, text=True)
    try:
        for resource in RESOURCES:
            node.kubelet.wait_registered(resource, timeout=20)
        pods = [node.kubelet.admit(f"p{i}", [{MEM: 4}]) for i in range(2)]
        assert [p.container().envs()["ALIYUN_COM_GPU_VISIBLE_DEVICES"] for p in pods] == ["0", "1"]  # the flag won
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "SIGTERM: shutting down" in err and "allocation mem-" in err
    assert not (node.kubelet_dir / "cgpu-mem.sock").exists()
