"""NVML's view of each GPU's processes and utilization, read through pynvml (nvidia-ml-py).

The daemon holds NVML open while it runs (:func:`open_nvml`) and reads, at each
poll, the compute and graphics process lists with each process's used memory
(``nvmlDeviceGetComputeRunningProcesses`` / ``...GraphicsRunningProcesses``,
which nvidia-ml-py maps to the ``_v3`` entry points of the driver) and the GPU's
utilization over the driver's last sample period (``nvmlDeviceGetUtilizationRates``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

try:
    import pynvml
except ImportError:  # no nvidia-ml-py: nothing is polled
    pynvml = None

log = logging.getLogger("arbiterd.nvml")
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND (nvml.h)


class ProcessSource(Protocol):
    """Where the daemon reads what runs on each GPU (NVML; tests may give their own)."""

    def processes(self, gpu: int) -> dict[int, int]:
        """pid -> bytes of GPU memory, for every process with a context on GPU ``gpu``."""
        ...

    def utilization(self, gpu: int) -> int | None:
        """The GPU's utilization (%) over NVML's last sample period; None when it cannot be read."""
        ...

    def busy(self, gpu: int) -> dict[int, list[tuple[int, int]]]:
        """pid -> its samples since the last call, each (time stamp in us since the epoch, SM utilization %), for
        the processes NVML sampled."""
        ...

    def close(self) -> None: ...


class Nvml:
    """NVML, open, with a handle per GPU index."""

    def __init__(self, indices: list[int]) -> None:
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        self.failed: set[tuple[int, str]] = set()  # (gpu, call) that failed, logged once
        self.seen_us: dict[int, int] = {}  # gpu -> the newest sample's time stamp read (us)

    def processes(self, gpu: int) -> dict[int, int]:
        out: dict[int, int] = {}
        h = self.handles[gpu]
        for name, call in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                           ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):
            try:
                procs = call(h)
            except pynvml.NVMLError as exc:
                self._failed(gpu, name, exc)
                continue
            for p in procs:
                used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
                out[int(p.pid)] = max(out.get(int(p.pid), 0), used)
        return out

    def utilization(self, gpu: int) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetUtilizationRates(self.handles[gpu]).gpu)
        except pynvml.NVMLError as exc:
            self._failed(gpu, "utilization", exc)
            return None

    def busy(self, gpu: int) -> dict[int, list[tuple[int, int]]]:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(self.handles[gpu], self.seen_us.get(gpu, 0))
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) != NOT_FOUND:  # NOT_FOUND: no process sampled since the time stamp
                self._failed(gpu, "process utilization", exc)
            return {}
        out: dict[int, list[tuple[int, int]]] = {}
        for s in samples:
            out.setdefault(int(s.pid), []).append((int(s.timeStamp), int(s.smUtil)))
            self.seen_us[gpu] = max(self.seen_us.get(gpu, 0), int(s.timeStamp))
        return out

    def _failed(self, gpu: int, what: str, exc: Exception) -> None:
        if (gpu, what) not in self.failed:
            self.failed.add((gpu, what))
            log.warning("GPU %d: NVML cannot list its %s: %s (unmanaged work there goes unseen)", gpu, what, exc)

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def open_nvml(indices: list[int]) -> Nvml | None:
    """NVML opened for the GPUs ``indices``, or None (logged) where it cannot be."""
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        return Nvml(indices)
    except pynvml.NVMLError as exc:
        log.warning("NVML: %s: processes that bypass cgpu cannot be seen", exc)
        return None
