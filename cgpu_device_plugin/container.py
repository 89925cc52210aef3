"""What an allocated container gets: its environment (docs/behaviour.md §6) and its mounts."""

from __future__ import annotations

from dataclasses import dataclass

from cgpu_device_plugin.config import Config
from cgpu_device_plugin.devices import GIB, Resource
from cgpu_device_plugin.placement import Plan

# Paths inside the container; the host side of each comes from the config.
CONTAINER_SOCKET_DIR = "/run/cgpu"
CONTAINER_SOCKET = f"{CONTAINER_SOCKET_DIR}/arbiter.sock"
CONTAINER_LIBCGPU = "/usr/local/lib/cgpu/libcgpu.so"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSetup:
    alloc_id: str
    envs: dict[str, str]
    mounts: tuple[Mount, ...]


def container_setup(cfg: Config, plan: Plan, alloc_id: str) -> ContainerSetup:
    """The env and mounts for allocation ``alloc_id`` of ``plan``.

    Both resources' answers carry the same card variables, the socket and the preload, so a
    container with memory and a core percentage on one card gets one consistent environment
    whichever answer the kubelet applies first.
    """
    envs = {
        "ALIYUN_COM_GPU_VISIBLE_DEVICES": ",".join(str(c.index) for c in plan.cards),
        "NVIDIA_VISIBLE_DEVICES": ",".join(c.uuid for c in plan.cards),
        "CGPU_SOCKET": CONTAINER_SOCKET,
        "LD_PRELOAD": CONTAINER_LIBCGPU,
        "CGPU_NATIVE": "1",
    }
    if plan.resource is Resource.MEM:
        envs["ALIYUN_COM_GPU_MEM_DEV"] = str(max(c.total_mem // GIB for c in plan.cards))
        envs["ALIYUN_COM_GPU_MEM_CONTAINER"] = ",".join(str(n) for n in plan.units)
    else:
        envs["CGPU_CORE_PERCENT"] = str(plan.total)
    mount_root = cfg.alloc_mount.rstrip("/")
    mounts = (
        Mount(CONTAINER_SOCKET_DIR, cfg.socket_dir),
        Mount(CONTAINER_LIBCGPU, cfg.libcgpu),
        Mount(f"{mount_root}/{alloc_id}", f"{cfg.alloc_dir.rstrip('/')}/{alloc_id}"),
    )
    return ContainerSetup(alloc_id, envs, mounts)
