"""The PyTorch interposer's module hooks (CGPU_TORCH_HOOK=module), in process with a stub runtime."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402

from libcgpu_client.torch import CgpuMode, ModuleGate  # noqa: E402


class StubGate:
    def __init__(self) -> None:
        self.checks = 0
        self._active = 0
        self._uses = 0
        self.active_seen: list[int] = []
        self.kinds: list[object] = []

    def check(self, kind: object = None) -> None:
        self.checks += 1
        self.kinds.append(kind)


class StubRuntime:
    def __init__(self) -> None:
        self.gates = [StubGate()]
        self.reserved = 0

    def reserve(self, pos: int, nbytes: int) -> None:
        self.reserved += nbytes

    def unreserve(self, pos: int, nbytes: int) -> None:
        self.reserved -= nbytes


def test_modules_are_gated_at_each_call_with_the_dispatch_mode_off_inside() -> None:
    rt = StubRuntime()
    gate = rt.gates[0]
    mode = CgpuMode(rt, cpu_sim=True, cuda=False)  # type: ignore[arg-type]
    seen: dict[str, Any] = {}

    class Probe(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            seen["mode_inside"] = _get_current_dispatch_mode()
            seen["active_inside"] = gate._active
            return x * 2  # an operator inside a module, in no sub-module

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), Probe())
    x = torch.randn(128, 256)  # 128 KiB activations: reserved
    hook = ModuleGate(mode)
    with mode:
        hook.install()
        try:
            y = model(x)
            after = _get_current_dispatch_mode()
            z = y + 1  # outside any module: through the dispatch mode
        finally:
            hook.remove()
    assert gate.checks == 4 + 1  # Sequential, Linear, ReLU, Probe; then the bare add
    assert seen["mode_inside"] is None and after is mode
    assert seen["active_inside"] == 2  # Sequential and Probe are running: the idle thread keeps the lease
    assert gate._active == 0
    assert rt.reserved == 2 * 128 * 256 * 4  # y and z; the Linear and ReLU outputs came and went
    del y, z
    assert rt.reserved == 0  # outputs dropped: reservations returned


def test_a_module_that_raises_leaves_nothing_active() -> None:
    rt = StubRuntime()
    mode = CgpuMode(rt, cpu_sim=True, cuda=False)  # type: ignore[arg-type]

    class Boom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    hook = ModuleGate(mode)
    with mode:
        hook.install()
        try:
            with pytest.raises(ValueError):
                Boom()(torch.zeros(2))
            assert _get_current_dispatch_mode() is mode  # put back after the failed call
        finally:
            hook.remove()
    assert rt.gates[0]._active == 0


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"device": "cuda:0"}, 0),  # tensor.to("cuda"), .cuda(): a copy that allocates on GPU 0
    ({"device": torch.device("cuda", 0)}, 0),
    ({"device": "cuda:1"}, None),  # a GPU this process is not given
    ({"device": "cpu"}, None),
    ({}, None),  # CPU work stays ungated on a real GPU
])
def test_a_copy_of_a_cpu_tensor_onto_the_gpu_passes_the_gate_of_that_gpu(
        kwargs: dict[str, Any], expected: int | None) -> None:
    """Found on an H100: ``model.to("cuda")`` copies CPU parameters with ``_to_copy(t, device=cuda)``; taken for
    CPU work, it ran outside the gate and the memory governor, which refused it (a fraction of 0 granted yet)."""
    mode = CgpuMode(StubRuntime(), cpu_sim=False, cuda=True)  # type: ignore[arg-type]
    assert mode._pos((torch.zeros(2),), kwargs) == expected
