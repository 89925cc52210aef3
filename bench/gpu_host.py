"""What bench.gpu needs of the host it proves on: whether PyTorch sees the GPU, what nvidia-smi says, whether
arbiterd's default identity fits, and its programs run so that none outlives its step."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


@functools.cache
def torch_cuda() -> bool:
    """PyTorch with CUDA that sees a GPU (asked in a child: this process must not hold a context)."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def run_group(cmd: list[str], *, timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a process group of its own, its output captured; past ``timeout`` the whole group is killed (a
    benchmark's workers must not keep the GPU busy for the parts after it) and TimeoutExpired raised."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def smi_query(xml: str) -> tuple[list[dict[str, Any]], str]:
    """The GPUs of ``nvidia-smi -q -x`` (index, UUID, name, memory in MiB), in its order, which is NVML's, and the
    driver version."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    gpus = [
        {
            "index": i,
            "uuid": (g.findtext("uuid") or "").strip(),
            "name": (g.findtext("product_name") or "").strip(),
            "total_mib": int((g.findtext("fb_memory_usage/total") or "0").split()[0]),
        }
        for i, g in enumerate(root.findall("gpu"))
    ]
    return gpus, (root.findtext("driver_version") or "?").strip()


def identity_needs_declaring() -> str:
    """Why arbiterd's default identity would not let this proof's processes be the instances it names, or '' when
    it would: where the proof itself runs in a container, every process of it is that one container to arbiterd."""
    from arbiterd.server.cgroups import CgroupFs, container_of

    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return f"/proc/self/cgroup cannot be read ({exc.strerror})"
    container, _ = container_of(text, CgroupFs(Path("/proc")))
    return (
        f"this host is itself container {container[:12]}, so every process here is that container" if container else ""
    )


def rows(out: str) -> list[dict[str, str]]:
    """cuda_job's output: each action's line (``name k=v ...``) as a dict, in order."""
    rows = []
    for line in out.splitlines():
        if line.strip():
            head, *rest = line.split()
            rows.append({"name": head, **dict(kv.split("=", 1) for kv in rest if "=" in kv)})
    return rows


def by_name(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """The rows by action name (the last of each)."""
    return {x["name"]: x for x in rows}


# PyTorch under a 2 GiB limit (its context charged too): the total it sees, and whether 1 GiB + 1200 MiB raises its
# out-of-memory error
TORCH_MEMORY = (
    "import json, torch\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "a = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
    "try:\n"
    "    b = torch.empty(1200 << 20, dtype=torch.uint8, device='cuda'); oom = False\n"
    "except torch.cuda.OutOfMemoryError:\n"
    "    oom = True\n"
    "print(json.dumps({'total': total, 'oom': oom}))\n"
)

# exclusive ResNet-50 inference, images/s (torchvision's model, batch 64, 224x224, 10 s)
RESNET50_RATE = (
    "import time, torch, torchvision\n"
    "m = torchvision.models.resnet50(weights=None).cuda().eval()\n"
    "x = torch.randn(64, 3, 224, 224, device='cuda')\n"
    "with torch.inference_mode():\n"
    "    for _ in range(5): m(x)\n"
    "    torch.cuda.synchronize(); t = time.perf_counter(); n = 0\n"
    "    while time.perf_counter() - t < 10: m(x); torch.cuda.synchronize(); n += 64\n"
    "print(n / (time.perf_counter() - t))\n"
)
