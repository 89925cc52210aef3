"""GPUs by identity: the fake driver enumerates devices as CUDA_VISIBLE_DEVICES says (CUDA Programming Guide,
"CUDA Environment Variables": indices or UUIDs, whole or a unique prefix, in the list's order, up to the first
invalid entry), and libcgpu.so maps each CUDA device to the instance's GPU with its UUID, never by position.

The daemon runs on the fake NVML (no --sim-gpus), which names GPU i as the fake driver names physical device i."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cgpu_testing.nvml import FakeNvml
from cgpu_testing.tools import tool
from libcgpu_client.run import build_env, build_parser
from tests.native.conftest import Native, lines, run_job

pytest.importorskip("pynvml")
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the fake driver")
GIB = 1 << 30
MIB = 1 << 20
DAEMON = ("--identity", "declared", "--trust-client-env")


def uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-0000-0000-{i:012d}"


ENUMERATE = """
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuInit(0)
n = ctypes.c_int(0)
cuda.cuDeviceGetCount(ctypes.byref(n))
out = []
for d in range(n.value):
    u = (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGetUuid_v2(u, d) == 0
    h = bytes(u).hex()
    out.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print(json.dumps([rc, out]))
"""


@pytest.mark.parametrize(("visible", "want"), [
    (None, [0, 1, 2]),
    ("2,0", [2, 0]),
    ("0,2,-1,1", [0, 2]),  # up to the first invalid index (the guide's own example)
    ("0,7,1", [0]),  # 7 is no device: invalid
    (uuid(1), [1]),
    (f"{uuid(2)[:-1]}2 , 0", [2, 0]),  # blanks around an entry
    ("GPU-fa4e0000-0000-0000-0000-00000000000", []),  # a prefix of every GPU's UUID names none
    ("1,1,0", [1]),  # a device named twice: invalid there
    ("", []),
])
def test_the_fake_driver_enumerates_devices_as_cuda_visible_devices_says(native: Native, visible: str | None,
                                                                         want: list[int]) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "FAKECUDA_DEVICES": "3"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("LD_PRELOAD", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    res = subprocess.run([sys.executable, "-c", ENUMERATE], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    rc, got = json.loads(res.stdout)
    assert got == [uuid(i) for i in want]
    assert rc == (0 if want else 100)  # CUDA_ERROR_NO_DEVICE when none is visible


@pytest.fixture
def nvml_daemon(daemon_factory: Any, short_tmp: Path) -> Any:
    return daemon_factory.start(*DAEMON, env=FakeNvml(short_tmp / "nvml.ctl", gpus=2).env())


def test_devices_map_to_the_instance_s_gpus_by_uuid_when_the_visible_order_differs(native: Native,
                                                                                   nvml_daemon: Any) -> None:
    """The instance is GPUs 0,1 with limits 2 GiB, 1 GiB; CUDA shows physical 1 as device 0: the program's device 0
    is held to GPU 1's 1 GiB, billed on GPU 1's ledger, and its 1.5 GiB allocation fails there."""
    res = run_job(native, nvml_daemon, "total", "alloc=600M", "info", "alloc=1536M", CGPU_INSTANCE="swapped",
                  ALIYUN_COM_GPU_VISIBLE_DEVICES="0,1", CGPU_MEM_LIMIT="2GiB,1GiB", CUDA_VISIBLE_DEVICES="1,0",
                  FAKECUDA_DEVICES="2")
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "total")[0]["bytes"] == str(GIB)
    assert [ln["rc"] for ln in lines(res.stdout, "alloc")] == ["0", "2"]
    assert lines(res.stdout, "info")[0] == {"name": "info", "free": str(GIB - 600 * MIB), "total": str(GIB),
                                            "rc": "0"}
    assert "none of this instance's GPUs" not in res.stderr


def test_a_device_that_is_none_of_the_instance_s_gpus_is_not_billed_as_one(native: Native, nvml_daemon: Any) -> None:
    """The instance is GPU 1 alone and CUDA_VISIBLE_DEVICES is unset: device 0 is physical GPU 0. Its memory is
    not GPU 1's (the device's own total shows, nothing is charged to GPU 1), and stderr says why once."""
    res = run_job(native, nvml_daemon, "total", "alloc=600M", "info", CGPU_INSTANCE="elsewhere",
                  ALIYUN_COM_GPU_VISIBLE_DEVICES="1", CGPU_MEM_LIMIT="1GiB", FAKECUDA_DEVICES="2")
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "total")[0]["bytes"] == str(16 * GIB)
    assert lines(res.stdout, "alloc")[0]["rc"] == "0"
    said = [ln for ln in res.stderr.splitlines() if "none of this instance's GPUs" in ln]
    assert len(said) == 1 and uuid(0) in said[0], res.stderr
    assert "Free: 1073741824" in nvml_daemon.ctl("cat", "1/elsewhere/meminfo").stdout


def test_cgpu_run_gpus_sets_cuda_visible_devices_to_match(native: Native, nvml_daemon: Any) -> None:
    """--gpus 1: CUDA shows the program GPU 1 as its device 0, which the shim holds to the instance's limit."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.fakes), "CGPU_SOCKET": nvml_daemon.sock,
           "FAKECUDA_DEVICES": "2"}
    env.pop("LD_PRELOAD", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run([tool("cgpu-run"), "--gpus", "1", "--instance", "run1", "--mem", "1GiB", "--",
                          str(native.job_direct), "total", "alloc=600M"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert lines(res.stdout, "total")[0]["bytes"] == str(GIB)  # GPU 1's limit: device 0 is GPU 1
    assert lines(res.stdout, "alloc")[0]["rc"] == "0"
    assert "none of this instance's GPUs" not in res.stderr


@pytest.mark.parametrize(("gpus", "visible", "order"), [
    ("1", "1", "PCI_BUS_ID"), (" 2, 0", "2,0", "PCI_BUS_ID"), (uuid(3), uuid(3), None),
])
def test_cgpu_run_gpus_environment(gpus: str, visible: str, order: str | None) -> None:
    """--gpus wins over an inherited CUDA_VISIBLE_DEVICES; indices are NVML's (the daemon's), which is CUDA's
    order only under CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's default is FASTEST_FIRST)."""
    args = build_parser().parse_args(["--gpus", gpus, "--", "prog"])
    env = build_env(args, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert env["ALIYUN_COM_GPU_VISIBLE_DEVICES"] == gpus
    assert env["CUDA_VISIBLE_DEVICES"] == visible
    assert env.get("CUDA_DEVICE_ORDER") == order
    assert "CUDA_VISIBLE_DEVICES" not in build_env(build_parser().parse_args(["--", "prog"]), {})
