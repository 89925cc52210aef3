"""End to end against the REAL arbiterd: the plugin provisions, containers bind, the daemon enforces.

What arbiterd must do: ``alloc_ctl``; ``allocations``, ``alloc_mem`` and ``alloc_core`` in
``/v1/status``; binding by token (``--allocations required --alloc-mount``), as docs/kubernetes.md
("The binding model") and SECURITY.md say. Each test's docstring says what it checks.

Set-up (tests/k8s/conftest.py, cgpu_testing/k8s.py): arbiterd with ``--sim-gpus 2x16GiB --identity cgroup
--proc-root <fake /proc> --allocations required``, the fake kubelet writing that fake /proc for each container
process it starts, and the plugin in this process talking to both.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cgpu_device_plugin.plugin import Plugin
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.k8s import GIB, Node
from cgpu_testing.kubelet import CORE, MEM, FakeKubelet, Pod, RunningContainer

PROG = str(Path(__file__).with_name("container_prog.py"))


@dataclass
class Cluster:
    node: Node
    plugin: Plugin

    @property
    def daemon(self) -> DaemonProc:
        return self.node.daemon

    @property
    def kubelet(self) -> FakeKubelet:
        return self.node.kubelet

    def run(self, pod: Pod, *args: str, env: dict[str, str] | None = None, container: str = "c0",
            extra_mounts: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
        rc = self.start(pod, *args, env=env, container=container, extra_mounts=extra_mounts)
        return self.result(rc)

    def start(self, pod: Pod, *args: str, env: dict[str, str] | None = None, container: str = "c0",
              extra_mounts: tuple[tuple[str, str], ...] = ()) -> RunningContainer:
        return self.kubelet.start_container(pod, [sys.executable, PROG, *args], container=container, env=env,
                                            extra_mounts=extra_mounts)

    @staticmethod
    def result(rc: RunningContainer, timeout: float = 60) -> dict[str, Any]:
        code, out, err = rc.wait(timeout)
        assert code == 0, err
        return json.loads(out)  # type: ignore[no-any-return]

    def alloc_ctl(self) -> dict[str, str]:
        """``cgpuctl cat alloc_ctl``: allocation id -> its ``bound=`` value."""
        out = self.daemon.ctl("cat", "alloc_ctl").stdout
        return {line.split()[0]: line.rsplit("bound=", 1)[1] for line in out.splitlines() if line.strip()}

    def alloc_dir_of(self, pod: Pod, prefix: str) -> tuple[str, str]:
        """(container path, host path) of ``pod``'s allocation whose id starts with ``prefix``."""
        m = next(m for m in pod.container().mounts() if m.container_path.startswith(f"/run/cgpu-alloc/{prefix}"))
        return m.container_path, m.host_path


@pytest.fixture
def cluster_factory(node_factory: Any) -> Any:
    def make(**plugin: Any) -> Cluster:
        node: Node = node_factory()
        p = node.start_plugin(**{"poll_interval_s": 0.1, "watch_interval_s": 0.1, **plugin})
        node.wait_health("Healthy")
        return Cluster(node, p)

    return make


@pytest.fixture
def cluster(cluster_factory: Any) -> Cluster:
    return cluster_factory()  # type: ignore[no-any-return]


def test_a_container_connects_and_gets_its_allocation(cluster: Cluster) -> None:
    """Expects: registration resolves the container from its cgroup, finds both tokens under
    <proc>/<pid>/root/run/cgpu-alloc, binds both allocations to it, and provisions memsize 4 GiB and
    core 30 % (weight 6 of 20 on policy 3) on GPU 0."""
    pod = cluster.kubelet.admit("a", [{MEM: 4, CORE: 30}])
    rc = cluster.start(pod, "register")
    reply = cluster.result(rc)
    assert reply["op"] == "registered" and reply["instance"] == rc.cid[:12]
    (gpu,) = reply["gpus"]
    assert gpu["gpu"] == 0 and gpu["mem_limit"] == 4 * GIB and gpu["weight"] == 6
    bound = cluster.alloc_ctl()
    assert len(bound) == 2 and set(bound.values()) == {rc.cid[:12]}


def test_the_containers_own_env_does_not_change_its_allocation(cluster: Cluster) -> None:
    """Expects: the bound allocations are the instance's provisioned settings whatever the client
    claims: weight 25 and 8 GiB claimed, core 30 % (weight 6) and 4 GiB given."""
    pod = cluster.kubelet.admit("greedy", [{MEM: 4, CORE: 30}])
    reply = cluster.run(pod, "register", env={"ALIYUN_COM_GPU_SCHD_WEIGHT": "25", "ALIYUN_COM_GPU_MEM_CONTAINER": "8"})
    assert reply["op"] == "registered"
    assert reply["gpus"][0]["weight"] == 6 and reply["gpus"][0]["mem_limit"] == 4 * GIB


def test_a_process_claiming_another_containers_allocation_is_refused(cluster: Cluster) -> None:
    """Expects: the first container to present a token binds its allocation; another container
    presenting it gets an ``identity`` error saying the allocation is bound to another container."""
    a = cluster.kubelet.admit("a", [{MEM: 4}])
    assert cluster.run(a, "register")["op"] == "registered"
    b = cluster.kubelet.admit("b", [{MEM: 2}])
    stolen = cluster.alloc_dir_of(a, "mem-")
    reply = cluster.run(b, "register", extra_mounts=(stolen,))
    assert reply["op"] == "error" and reply["code"] == "identity"
    assert "bound to another container" in reply["message"]


def test_a_token_reached_through_a_symlink_out_of_the_container_is_not_used(cluster: Cluster) -> None:
    """Expects: arbiterd resolves <alloc_mount>/*/token inside the container's root (openat2
    RESOLVE_IN_ROOT, or no symlinks followed), because a container can write symlinks under
    /run/cgpu-alloc: one pointing at a host path must not present that host file's token."""
    victim = cluster.kubelet.admit("victim", [{MEM: 4}])  # admitted, not started: its allocation is unbound
    _, host_dir = cluster.alloc_dir_of(victim, "mem-")
    thief = cluster.kubelet.admit("thief", [{MEM: 1}])
    rc = cluster.kubelet.start_container(thief, [sys.executable, PROG, "register"],
                                         symlinks=(("/run/cgpu-alloc/stolen", host_dir),))
    reply = cluster.result(rc)
    assert reply["op"] == "registered" and reply["gpus"][0]["mem_limit"] == 1 * GIB
    victim_id = Path(host_dir).name
    assert cluster.alloc_ctl()[victim_id] == "-"


def test_a_container_without_a_valid_token_is_refused(cluster: Cluster) -> None:
    """Expects: with ``allocations = "required"`` a container process presenting no token is
    refused with an error saying why (nothing under /run/cgpu-alloc)."""
    cpu_only = cluster.kubelet.admit("plain", [{}])
    rc = cluster.kubelet.start_container(cpu_only, [sys.executable, PROG, "register"],
                                         env={"CGPU_SOCKET": cluster.daemon.sock})
    reply = cluster.result(rc)
    assert reply["op"] == "error" and reply["code"] == "identity"
    assert "allocation" in reply["message"] and "token" in reply["message"]


def test_memory_and_core_on_different_cards_are_refused_at_bind(cluster_factory: Any) -> None:
    """Expects: a container presenting a memory allocation on GPU 0 and a core allocation on GPU 1
    is refused at registration, saying they are on different GPUs."""
    cluster: Cluster = cluster_factory(placement="spread", pair_window_s=0.0)
    mem = cluster.kubelet.admit("m", [{MEM: 4}])  # GPU 0
    cluster.kubelet.admit("filler", [{CORE: 10}])  # GPU 0: now GPU 1 is the emptiest in core
    core = cluster.kubelet.admit("c", [{CORE: 30}])  # GPU 1
    assert core.container().envs()["ALIYUN_COM_GPU_VISIBLE_DEVICES"] == "1"
    both = cluster.kubelet.admit("both", [{}])
    reply = cluster.run(both, "register", env={"CGPU_SOCKET": cluster.daemon.sock},
                        extra_mounts=(cluster.alloc_dir_of(mem, "mem-"), cluster.alloc_dir_of(core, "core-")))
    assert reply["op"] == "error" and "GPU" in reply["message"]


def test_30_and_45_percent_pods_on_one_card_get_30_and_45_percent(cluster: Cluster) -> None:
    """Core allocations are weights P/5 of 20 slots on policy 3, a hard cap: two busy containers of
    30 % and 45 % on GPU 0 get 30 % and 45 % (± 2 pp) of its useful time, by the daemon's own
    accounting, over whole turns of the ring (20 slices of the length auto chose), at defaults."""
    pods = [cluster.kubelet.admit(f"p{p}", [{CORE: p}]) for p in (30, 45)]
    assert {p.container().envs()["ALIYUN_COM_GPU_VISIBLE_DEVICES"] for p in pods} == {"0"}
    running = [cluster.start(p, "spin", "14") for p in pods]

    def sample() -> tuple[float, float, dict[str, float]]:
        (gpu, *_) = cluster.daemon.smi_json()["gpus"]
        return (time.monotonic(), gpu["slice_effective_ms"],
                {i["id"]: i["useful_seconds"] for i in gpu["instances"]})

    time.sleep(2.0)
    t0, slice_ms, u0 = sample()
    ring = 20 * slice_ms / 1000
    time.sleep(ring * max(1, round(4.0 / ring)))  # a whole number of rings, about 4 s
    t1, _, u1 = sample()
    for rc in running:
        cluster.result(rc)
    for want, rc in zip((30, 45), running, strict=True):
        cid = rc.cid[:12]
        share = 100 * (u1[cid] - u0[cid]) / (t1 - t0)
        assert abs(share - want) <= 2.0, (want, share, slice_ms)


def test_a_4_gib_pod_sees_4_gib_and_its_fifth_gib_is_refused(cluster: Cluster) -> None:
    """Expects: the memory allocation is the instance's limit on its GPU: 4 GiB reserve, the
    fifth is denied."""
    pod = cluster.kubelet.admit("m4", [{MEM: 4}])
    out = cluster.run(pod, "reserve", "4", "1")
    assert out["registered"]["gpus"][0]["mem_limit"] == 4 * GIB
    ok, denied = out["reserve"]
    assert ok["op"] == "ok" and ok["limit"] == 4 * GIB
    assert denied["op"] == "denied" and denied["used"] == 4 * GIB


def test_arbiterd_restart_flips_health_and_keeps_allocations(cluster: Cluster) -> None:
    """Expects: arbiterd keeps allocations across a restart (state.json), or accepts the plugin
    creating them again with the same token digest."""
    pod = cluster.kubelet.admit("a", [{MEM: 4}])
    before = set(cluster.alloc_ctl())
    cluster.daemon.stop()
    cluster.node.wait_health("Unhealthy")
    cluster.daemon.start()
    cluster.node.wait_health("Healthy")
    assert set(cluster.alloc_ctl()) == before
    assert cluster.run(pod, "register")["gpus"][0]["mem_limit"] == 4 * GIB


def test_a_restarted_container_of_the_same_pod_binds_its_allocation_again(cluster: Cluster) -> None:
    """Expects (beyond the written interface): the kubelet restarts a crashed container under a NEW
    container id and never calls Allocate again, so an allocation whose bound container has no
    live process must be bindable by a container of the same pod (same pod UID in its cgroup)."""
    pod = cluster.kubelet.admit("crashy", [{MEM: 4}])
    first = cluster.run(pod, "register")
    assert first["op"] == "registered"
    second = cluster.run(pod, "register")  # the first process has exited: a "restarted" container
    assert second["op"] == "registered" and second["instance"] != first["instance"]
    assert second["gpus"][0]["mem_limit"] == 4 * GIB
