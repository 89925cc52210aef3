"""GPU discovery: NVML through pynvml, or simulated GPUs."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from arbiterd.core.arbiter import GpuInfo
from arbiterd.core.errors import SettingError
from arbiterd.core.settings import GIB, parse_size

log = logging.getLogger("arbiterd.devices")
_SIM = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")


def sim_uuid(index: int) -> str:
    """Simulated GPU ``index``'s UUID: hex digits in NVML's form, as a driver reports them (cuDeviceGetUuid gives 16
    bytes), so that a client maps its CUDA devices to simulated GPUs by UUID as it does to real ones. The test
    doubles of the driver and NVML (cgpu_testing/native) give their device ``index`` the same UUID."""
    return f"GPU-fa4e0000-0000-0000-0000-{index:012d}"


def parse_sim_gpus(spec: str) -> list[GpuInfo]:
    """``2x16GiB`` -> two simulated GPUs of 16 GiB; ``16GiB,8GiB`` -> one of each."""
    gpus: list[GpuInfo] = []
    for part in spec.split(","):
        m = _SIM.match(part)
        count, size = (int(m.group(1)), m.group(2)) if m else (1, part.strip())
        try:
            total = parse_size("sim_gpus", size)
        except SettingError:
            raise SettingError(f"sim_gpus: expected COUNTxSIZE like 2x16GiB, got {spec!r}") from None
        if count < 1 or count > 64 or total <= 0:
            raise SettingError(f"sim_gpus: expected 1..64 GPUs of a positive size, got {spec!r}")
        for _ in range(count):
            i = len(gpus)
            gpus.append(GpuInfo(i, "Simulated GPU", sim_uuid(i), total, simulated=True))
    if len(gpus) > 64:
        raise SettingError(f"sim_gpus: at most 64 GPUs, got {len(gpus)}")
    return gpus


def _optional(pynvml: Any, query: Callable[[], object]) -> str:
    """A descriptive NVML query (driver version, compute capability) as text; empty where this NVML lacks it."""
    try:
        value = query()
    except pynvml.NVMLError as exc:
        log.info("NVML: %s; the GPUs' attributes leave it out", exc)
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GpuInfo] | None:
    """Every GPU NVML reports, or None when NVML (libnvidia-ml) is not available."""
    try:
        import pynvml
    except ImportError:
        log.warning("pynvml is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.warning("NVML is not available: %s", exc)
        return None
    try:
        gpus = []
        driver = _optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            cc = _optional(pynvml, lambda: ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h))))  # noqa: B023
            gpus.append(GpuInfo(
                i,
                name.decode() if isinstance(name, bytes) else str(name),
                uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                int(mem.total),
                driver_version=driver,
                compute_capability=cc,
            ))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def discover(sim_gpus: str | None) -> list[GpuInfo]:
    if sim_gpus is not None:
        gpus = parse_sim_gpus(sim_gpus)
        log.info("using %d simulated GPU(s) (--sim-gpus %s)", len(gpus), sim_gpus)
        return gpus
    found = nvml_gpus()
    if found:
        for g in found:
            log.info("GPU %d: %s %s, %d MiB", g.index, g.name, g.uuid, g.total_mem // 2**20)
        return found
    log.warning("no NVML GPU found: falling back to ONE SIMULATED 16 GiB GPU "
                "(pass --sim-gpus to choose, or install the NVIDIA driver)")
    return [GpuInfo(0, "Simulated GPU", sim_uuid(0), 16 * GIB, True)]
