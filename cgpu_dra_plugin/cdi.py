"""CDI specs: what the container runtime adds to a container that uses a prepared claim.

One spec file per claim, ``<cdi_dir>/gpu.cgpu.io-<claim uid>.json`` (CDI 0.6.0, kind
``gpu.cgpu.io/claim``), one CDI device per allocated device, named ``<claim uid>-<device>``;
the kubelet passes the ids NodePrepareResources returns (``gpu.cgpu.io/claim=<name>``) to the
runtime, which applies each device's ``containerEdits``: the environment of docs/kubernetes.md
(the device plugin's variables), the socket dir, ``libcgpu.so`` (preloaded) and the allocation's
token directory, each mounted read-only.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cgpu_dra_plugin import DRIVER
from cgpu_dra_plugin.checkpoint import Prepared
from cgpu_dra_plugin.quantity import GIB

CDI_VERSION = "0.6.0"
KIND = f"{DRIVER}/claim"
CONTAINER_SOCKET_DIR = "/run/cgpu"
CONTAINER_LIBCGPU = "/usr/local/lib/cgpu/libcgpu.so"


def cdi_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    return f"{KIND}={cdi_name(claim_uid, device)}"


def env_of(d: Prepared, total_mem: int) -> dict[str, str]:
    """The container environment for one prepared device (docs/behaviour.md §6)."""
    env = {
        "ALIYUN_COM_GPU_VISIBLE_DEVICES": str(d.gpu),
        "NVIDIA_VISIBLE_DEVICES": d.uuid,
        "CGPU_SOCKET": f"{CONTAINER_SOCKET_DIR}/arbiter.sock",
        "LD_PRELOAD": CONTAINER_LIBCGPU,
        "CGPU_NATIVE": "1",
        "ALIYUN_COM_GPU_MEM_DEV": str(total_mem // GIB),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(d.memory // GIB),
    }
    if d.cores and d.enforce_cores:
        env["CGPU_CORE_PERCENT"] = str(d.cores)
    if d.weight:
        env["ALIYUN_COM_GPU_SCHD_WEIGHT"] = str(d.weight)
    if d.high_priority:
        env["ALIYUN_COM_GPU_HIGH_PRIO"] = "1"
    return env


def spec(claim_uid: str, devices: Sequence[tuple[Prepared, int]], socket_dir: str, libcgpu: str, alloc_dir: str,
         alloc_mount: str) -> dict[str, Any]:
    """The CDI spec of one claim; ``devices`` are (prepared device, its card's total memory)."""
    out = []
    for d, total in devices:
        mounts = [(CONTAINER_SOCKET_DIR, socket_dir), (CONTAINER_LIBCGPU, libcgpu),
                  (f"{alloc_mount.rstrip('/')}/{d.alloc_id}", f"{alloc_dir.rstrip('/')}/{d.alloc_id}")]
        out.append({"name": cdi_name(claim_uid, d.device),
                    "containerEdits": {
                        "env": [f"{k}={v}" for k, v in env_of(d, total).items()],
                        "mounts": [{"hostPath": h, "containerPath": c, "options": ["ro", "nosuid", "nodev", "bind"]}
                                   for c, h in mounts]}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": out}


def spec_path(cdi_dir: str, claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{DRIVER}-{claim_uid}.json"


def write(cdi_dir: str, claim_uid: str, doc: dict[str, Any]) -> Path:
    """Write the spec atomically (the runtime may read the directory at any time)."""
    path = spec_path(cdi_dir, claim_uid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


def remove(cdi_dir: str, claim_uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(cdi_dir, claim_uid).unlink()


def read_device(cdi_dir: str, device_id: str) -> dict[str, Any]:
    """The ``containerEdits`` of CDI device ``device_id`` (``kind=name``), from the specs in ``cdi_dir``:
    what a runtime does, for the fake kubelet and for checks. Raise KeyError when no spec has it."""
    kind, _, name = device_id.partition("=")
    for path in sorted(Path(cdi_dir).glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("kind") != kind:
            continue
        for dev in doc.get("devices", []):
            if dev.get("name") == name:
                return dict(dev["containerEdits"])
    raise KeyError(f"no CDI device {device_id} under {cdi_dir}")
