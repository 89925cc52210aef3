"""Allocate through the fake kubelet against a real arbiterd: what a container gets, where it lands, and what is
refused."""

from __future__ import annotations

import hashlib
import json
import stat
import sys

import grpc
import pytest

from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from cgpu_testing.daemon import sim_uuid
from cgpu_testing.k8s import GIB
from cgpu_testing.kubelet import CORE, MEM, AdmissionError, Pod
from tests.k8s.conftest import RecordedNode as Node


def cards_of(pod: Pod, resource: str) -> set[str]:
    return {d.rsplit("-", 2)[0] for c in pod.containers for d in c.devices.get(resource, [])}


def gpu_of(pod: Pod) -> int:
    (visible,) = {c.envs()["ALIYUN_COM_GPU_VISIBLE_DEVICES"] for c in pod.containers}
    return int(visible)


def test_a_pod_gets_the_env_the_mounts_and_an_allocation_in_arbiterd(node: Node) -> None:
    node.start_plugin()
    pod = node.kubelet.admit("a", [{MEM: 4, CORE: 30}])
    c = pod.container()
    assert c.envs() == {
        "ALIYUN_COM_GPU_MEM_DEV": "16", "ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0",
        "NVIDIA_VISIBLE_DEVICES": sim_uuid(0), "CGPU_CORE_PERCENT": "30", "CGPU_SOCKET": "/run/cgpu/arbiter.sock",
        "LD_PRELOAD": "/usr/local/lib/cgpu/libcgpu.so", "CGPU_NATIVE": "1"}
    allocs = node.allocations()
    tokens = node.log.creates()
    mem_id = next(i for i in allocs if i.startswith("mem-"))
    core_id = next(i for i in allocs if i.startswith("core-"))
    assert (allocs[mem_id].gpus, allocs[mem_id].memsize, allocs[mem_id].core) == ((0,), (4 * GIB,), 0)
    assert (allocs[core_id].gpus, allocs[core_id].core) == ((0,), 30)
    alloc_dir = node.root / "alloc"
    assert {(m.container_path, m.host_path, m.read_only) for m in c.mounts()} == {
        ("/run/cgpu", str(node.run_dir), True), ("/usr/local/lib/cgpu/libcgpu.so", str(node.libcgpu), True),
        (f"/run/cgpu-alloc/{mem_id}", f"{alloc_dir}/{mem_id}", True),
        (f"/run/cgpu-alloc/{core_id}", f"{alloc_dir}/{core_id}", True)}
    for alloc_id in (mem_id, core_id):
        token = alloc_dir / alloc_id / "token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o444
        assert stat.S_IMODE(token.parent.stat().st_mode) == 0o755
        assert tokens[alloc_id] == hashlib.sha256(token.read_text().strip().encode()).hexdigest()
    creates = [body for method, _, body in node.log.requests if method == "PUT" and not body.startswith("label ")]
    assert sorted(creates) == [f"create {core_id} token={tokens[core_id]} gpu=0 core=30",
                               f"create {mem_id} token={tokens[mem_id]} gpu=0 memsize={4 * GIB}"]


def test_binpack_fills_a_card_before_the_next(node: Node) -> None:
    node.start_plugin()
    assert [gpu_of(node.kubelet.admit(f"p{i}", [{MEM: 4}])) for i in range(6)] == [0, 0, 0, 0, 1, 1]


def test_spread_alternates(node: Node) -> None:
    node.start_plugin(placement="spread")
    assert [gpu_of(node.kubelet.admit(f"p{i}", [{MEM: 4}])) for i in range(6)] == [0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_a_containers_memory_and_core_land_on_one_card(node_factory: object, seed: int) -> None:
    """Alone, memory would go to GPU 1 (fuller in memory) and core to GPU 0 (fuller in core): pairing wins."""
    node: Node = node_factory()  # type: ignore[operator]
    node.kubelet.rng.seed(seed)  # either resource may come first
    node.add("ext-mem", 1, memsize=8 * GIB)
    node.add("ext-core", 0, core=50)
    node.start_plugin()
    pod = node.kubelet.admit("a", [{MEM: 4, CORE: 20}])
    assert len(cards_of(pod, MEM) | cards_of(pod, CORE)) == 1


def test_memory_larger_than_any_card_spans_the_fewest_cards(node_factory: object) -> None:
    node: Node = node_factory([16, 16, 16])  # type: ignore[operator]
    node.add("ext", 2, memsize=12 * GIB)
    node.start_plugin()
    env = node.kubelet.admit("big", [{MEM: 20}]).container().envs()
    assert (env["ALIYUN_COM_GPU_MEM_CONTAINER"], env["ALIYUN_COM_GPU_VISIBLE_DEVICES"]) == ("16,4", "0,1")
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{sim_uuid(0)},{sim_uuid(1)}"
    (alloc,) = [a for a in node.allocations().values() if a.id.startswith("mem-")]
    assert (alloc.gpus, alloc.memsize) == ((0, 1), (16 * GIB, 4 * GIB))


def test_a_core_request_not_a_multiple_of_5_fails_admission(node: Node) -> None:
    node.start_plugin()
    with pytest.raises(AdmissionError, match=r"gpu-core.percentage: 33 is not a multiple of 5"):
        node.kubelet.admit("odd", [{CORE: 33}])
    assert node.allocations() == {} and node.kubelet.in_use(CORE) == set()
    assert not [p for p in (node.root / "alloc").iterdir() if p.is_dir()]


def test_cross_card_ids_are_refused_when_the_kubelet_ignores_the_preference(node_factory: object) -> None:
    node: Node = node_factory()  # type: ignore[operator]
    node.kubelet.use_preferred = False  # it picks IDs at random, as when a preference is not honoured
    node.start_plugin()
    refused = 0
    for i in range(6):
        try:
            pod = node.kubelet.admit(f"p{i}", [{MEM: 4}])
        except AdmissionError as exc:
            assert "split over GPUs 0, 1 although GPU" in str(exc)
            refused += 1
        else:
            assert len(cards_of(pod, MEM)) == 1
    assert refused > 0  # 8 random IDs of 32 all on one card is unlikely; the seed makes it certain here
    assert all(len(a.gpus) == 1 for a in node.allocations().values())


def test_an_allocation_that_would_overcommit_is_refused(node: Node) -> None:
    node.add("ext0", 0, memsize=14 * GIB)
    node.add("ext1", 1, memsize=14 * GIB)
    node.start_plugin()
    with pytest.raises(AdmissionError, match=r"would overcommit it: only 2 GiB are not allocated"):
        node.kubelet.admit("big", [{MEM: 5}])


def test_arbiterd_refusing_the_create_fails_admission_and_leaves_nothing(node: Node) -> None:
    """Someone takes the card between the plugin's status read and its create: arbiterd answers 409."""
    node.start_plugin()

    node.log.before_create = lambda: node.add("racer", 0, memsize=14 * GIB)
    with pytest.raises(AdmissionError, match=r"arbiterd refused allocation mem-[0-9a-f]{12} \(4 GiB on GPU 0 .*\): "
                                             r"GPU 0: memsize 4294967296 would overcommit it"):
        node.kubelet.admit("a", [{MEM: 4}])
    assert list(node.allocations()) == ["racer"]
    assert node.plugins[0].store.records == {}
    assert not [p for p in (node.root / "alloc").iterdir() if p.is_dir()]


def test_ids_listed_as_free_again_mean_the_old_allocation_is_dead(node: Node) -> None:
    node.start_plugin()
    a = node.kubelet.admit("a", [{MEM: 16}])
    (old,) = node.allocations()
    node.kubelet.delete(a)
    node.kubelet.admit("b", [{MEM: 16}])  # binpack: GPU 0 again, which is free again
    (new,) = node.allocations()
    assert new != old and not (node.root / "alloc" / old).exists()
    assert set(node.plugins[0].store.records) == {new}


def test_ids_handed_out_again_in_allocate_reap_the_old_allocation(node_factory: object) -> None:
    node: Node = node_factory([4])  # type: ignore[operator]
    node.kubelet.use_preferred = False
    node.start_plugin()
    a = node.kubelet.admit("a", [{MEM: 4}])
    (old,) = node.allocations()
    node.kubelet.delete(a)
    b = node.kubelet.admit("b", [{MEM: 4}])
    assert set(b.container().devices[MEM]) == set(a.container().devices[MEM])
    (new,) = node.allocations()
    assert new != old and not (node.root / "alloc" / old).exists()


def test_one_allocate_for_two_containers_is_all_or_nothing(node: Node) -> None:
    node.start_plugin()
    ep = node.kubelet.endpoints[CORE]
    ids = sorted(node.kubelet.devices(CORE), key=lambda i: (i.rsplit("-", 1)[0], int(i.rsplit("-", 1)[1])))
    with pytest.raises(grpc.RpcError) as exc:
        ep.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids[:10]), pb.ContainerAllocateRequest(devices_ids=ids[10:17])]))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "7 is not a multiple of 5" in exc.value.details()  # type: ignore[attr-defined]
    assert node.allocations() == {} and node.plugins[0].store.records == {}


def test_a_missing_libcgpu_is_refused_clearly(node: Node) -> None:
    node.libcgpu.unlink()
    node.start_plugin()
    with pytest.raises(AdmissionError, match=r"libcgpu.so is not at .* on this node"):
        node.kubelet.admit("a", [{MEM: 1}])


PROBE = """
import json, os, sys
from pathlib import Path
proc = Path(os.environ["FAKE_PROC"]) / str(os.getpid())
print(json.dumps({"cgroup": (proc / "cgroup").read_text(), "root": os.readlink(proc / "root"),
                  "env": {k: v for k, v in os.environ.items() if k.startswith(("ALIYUN", "CGPU", "NVIDIA", "LD_"))},
                  "tokens": sorted(p.parent.name for p in (proc / "root" / "run/cgpu-alloc").glob("*/token")),
                  "socket_dir": os.path.isdir(os.path.dirname(os.environ["CGPU_SOCKET"]))}))
"""


def test_a_container_runs_with_its_env_mounts_and_fake_proc_entries(node: Node) -> None:
    node.start_plugin()
    pod = node.kubelet.admit("a", [{MEM: 2, CORE: 10}])
    rc = node.kubelet.start_container(pod, [sys.executable, "-c", PROBE],
                                      env={"FAKE_PROC": str(node.kubelet.proc_root)})
    code, out, err = rc.wait()
    assert code == 0, err
    seen = json.loads(out)
    uid = pod.uid.replace("-", "_")
    assert seen["cgroup"] == f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{rc.cid}.scope\n"
    assert seen["root"] == str(rc.rootfs)
    assert seen["tokens"] == sorted(node.allocations())
    assert seen["env"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2" and seen["env"]["CGPU_CORE_PERCENT"] == "10"
    assert seen["env"]["CGPU_SOCKET"] == f"{rc.rootfs}/run/cgpu/arbiter.sock" and seen["socket_dir"]
    assert "LD_PRELOAD" not in seen["env"]
