"""GPU code paths, tested against fakes that behave like the real APIs (no GPU here)."""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any

import pytest

from arbiterd.server import devices
from cgpu_protocol import Message
from libcgpu_client.gate import CudaAdapter, Gate


class FakeNVMLError(Exception):
    pass


def fake_pynvml(count: int = 2, fail_init: bool = False, raw_bytes: bool = False) -> types.ModuleType:
    """pynvml as nvidia-ml-py shapes it: init/shutdown, handles, name/UUID (str, or bytes on old
    versions), memory info with .total, NVMLError on failure."""
    mod = types.ModuleType("pynvml")
    state = {"init": 0}

    def nvmlInit() -> None:
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")
        state["init"] += 1

    def nvmlShutdown() -> None:
        state["init"] -= 1

    def enc(s: str) -> Any:
        return s.encode() if raw_bytes else s

    mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    mod.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: enc("NVIDIA A10")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUUID = lambda h: enc(f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=24 * 1024**3, free=1, used=2)  # type: ignore[attr-defined]
    mod.nvmlSystemGetDriverVersion = lambda: enc("550.54.15")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 6)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: []  # type: ignore[attr-defined]
    mod.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0, memory=0)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetProcessUtilization = lambda h, t: []  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    return mod


@pytest.mark.parametrize("raw_bytes", [False, True])
def test_nvml_discovery(monkeypatch: pytest.MonkeyPatch, raw_bytes: bool) -> None:
    mod = fake_pynvml(raw_bytes=raw_bytes)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    gpus = devices.discover(None)
    assert [(g.index, g.name, g.total_mem, g.simulated) for g in gpus] == [
        (0, "NVIDIA A10", 24 * 1024**3, False), (1, "NVIDIA A10", 24 * 1024**3, False)]
    assert gpus[1].uuid.startswith("GPU-00000001")
    assert (gpus[0].driver_version, gpus[0].compute_capability) == ("550.54.15", "8.6")
    assert mod.state["init"] == 0  # shut down again


def test_no_nvml_falls_back_to_one_simulated_gpu_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    gpus = devices.discover(None)
    assert len(gpus) == 1 and gpus[0].simulated and gpus[0].total_mem == 16 * 1024**3
    assert "SIMULATED" in caplog.text


class FakeStream:
    """A CUDA device as the gate sees it: launches return at once, work finishes later."""

    def __init__(self) -> None:
        self.pending: list[float] = []
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.pending.append(time.monotonic() + seconds)

    def synchronize(self, device: int) -> None:
        self.syncs += 1
        if self.pending:
            time.sleep(max(0.0, max(self.pending) - time.monotonic()))
        self.pending.clear()


class FakeClient:
    def __init__(self) -> None:
        self.listeners: dict[int, Any] = {}
        self.on_connected: list[Any] = []
        self.connected = True
        self.sent: list[dict[str, Any]] = []
        self.lease = 0
        self.order: list[str] = []

    def send(self, message: Message) -> bool:
        msg = message.to_wire()
        self.sent.append(msg)
        self.order.append(msg["op"])
        if msg["op"] == "acquire" or msg.get("again"):
            self.lease += 1
            lease = self.lease
            threading.Timer(0.001, lambda: self.listeners[0].on_grant(lease, time.monotonic_ns() + 20_000_000)).start()
        return True


def test_cuda_adapter_waits_for_queued_kernels_before_the_lease_is_given_back() -> None:
    stream = FakeStream()
    client = FakeClient()
    adapter = CudaAdapter(0, sync=lambda i: (client.order.append("sync"), stream.synchronize(i)))
    gate = Gate(client, 0, device=adapter, idle_ms=1000)  # type: ignore[arg-type]
    gate.check()
    stream.launch(0.05)  # a kernel queued asynchronously, past the end of the lease
    gate._deadline = 0  # the lease expires (or is revoked)
    t = time.monotonic()
    gate.check()
    assert time.monotonic() - t >= 0.045  # the queued work was waited for ...
    release = client.order.index("release")
    assert client.order[release - 1] == "sync"  # ... before the lease went back
    (msg,) = [m for m in client.sent if m["op"] == "release"]
    assert msg["used_ns"] >= 45_000_000 and msg["again"]  # charged to this holder, which asks again
    gate._closed = True


def test_gate_reports_each_lease_it_held_as_it_ends() -> None:
    """on_lease_end gets (granted, ended) for every lease: given back expired, and released."""
    client = FakeClient()
    gate = Gate(client, 0, idle_ms=1000)  # type: ignore[arg-type]
    ended: list[tuple[int, int]] = []
    gate.on_lease_end.append(lambda granted, end: ended.append((granted, end)))
    t0 = time.monotonic_ns()
    gate.check()
    gate._deadline = 0  # the lease expires: the next check gives it back and asks again
    gate.check()
    gate.release()
    t1 = time.monotonic_ns()
    assert len(ended) == 2
    (g1, e1), (g2, e2) = ended
    assert t0 <= g1 <= e1 <= g2 <= e2 <= t1
    assert gate.held_ns == (e1 - g1) + (e2 - g2)
    gate._closed = True


def test_cuda_memory_governor_caps_the_allocator_at_what_the_daemon_granted() -> None:
    torch = pytest.importorskip("torch")
    from libcgpu_client.runtime import OutOfMemory
    from libcgpu_client.torch import CUDA_GROW, CudaMemoryGovernor

    fractions: dict[int, float] = {}

    class Rt:
        gates = [object()]
        memory = [types.SimpleNamespace(reserved=0, used=0)]
        limit = 600 * 1024**2

        def reserve(self, pos: int, n: int) -> None:
            acct = self.memory[pos]
            if acct.reserved + n > self.limit:
                raise OutOfMemory("cgpu: out of memory on GPU 0 (limit)")
            acct.reserved += n
            acct.used += n

    rt = Rt()
    gov = CudaMemoryGovernor(rt, lambda f, i: fractions.__setitem__(i, f), lambda i: 16 * 1024**3)  # type: ignore[arg-type]
    assert fractions[0] == 0.0  # nothing granted yet: the allocator may not grow
    gov.grow(0)
    assert fractions[0] == pytest.approx(CUDA_GROW / (16 * 1024**3))
    gov.grow(0)
    with pytest.raises(OutOfMemory):
        gov.grow(0)  # past the 600 MiB limit: the daemon says no, the cap stays
    assert fractions[0] == pytest.approx(2 * CUDA_GROW / (16 * 1024**3))
    assert torch is not None
