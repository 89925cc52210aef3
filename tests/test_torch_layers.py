"""The default hook's fast path (LayerGate): built-in single-operator layers gated at their call.

In process with a stub runtime; the interposer's real mode counts the operators that reach it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from libcgpu_client.torch import CgpuMode, LayerGate, single_operator_layers  # noqa: E402
from tests.test_torch_hooks import StubRuntime  # noqa: E402


class CountingMode(CgpuMode):
    """The interposer's mode, counting the operators that reach it."""

    ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        self.ops += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


# one instance and input per layer class, sized so that the output is tracked (64 KiB or more)
def _img(c: int, d: int) -> Any:
    return torch.randn(8, c, *([24] * d))


CASES: dict[type, Callable[[], tuple[Any, Any]]] = {
    nn.Conv1d: lambda: (nn.Conv1d(4, 16, 3, padding=1), _img(4, 1)),
    nn.Conv2d: lambda: (nn.Conv2d(4, 16, 3, padding=1, padding_mode="reflect"), _img(4, 2)),
    nn.Conv3d: lambda: (nn.Conv3d(4, 8, 3), _img(4, 3)),
    nn.ConvTranspose1d: lambda: (nn.ConvTranspose1d(4, 16, 3), _img(4, 1)),
    nn.ConvTranspose2d: lambda: (nn.ConvTranspose2d(4, 8, 3, stride=2), _img(4, 2)),
    nn.ConvTranspose3d: lambda: (nn.ConvTranspose3d(4, 4, 3), _img(4, 3)),
    nn.Linear: lambda: (nn.Linear(64, 512), torch.randn(4, 8, 64)),
    nn.BatchNorm1d: lambda: (nn.BatchNorm1d(32), _img(32, 1)),
    nn.BatchNorm2d: lambda: (nn.BatchNorm2d(8).train(), _img(8, 2)),  # updates its running stats in place
    nn.BatchNorm3d: lambda: (nn.BatchNorm3d(4), _img(4, 3)),
    nn.LayerNorm: lambda: (nn.LayerNorm(64), torch.randn(512, 64)),
    nn.GroupNorm: lambda: (nn.GroupNorm(2, 8), _img(8, 2)),
    nn.Embedding: lambda: (nn.Embedding(100, 64, max_norm=1.0), torch.randint(0, 100, (8, 64))),
    nn.Dropout: lambda: (nn.Dropout(0.5).train(), torch.randn(128, 256)),  # the mask is made and dropped
    nn.MaxPool1d: lambda: (nn.MaxPool1d(2), _img(64, 1)),
    nn.MaxPool2d: lambda: (nn.MaxPool2d(2), _img(64, 2)),
    nn.MaxPool3d: lambda: (nn.MaxPool3d(2), _img(32, 3)),
    nn.AvgPool1d: lambda: (nn.AvgPool1d(2), _img(64, 1)),
    nn.AvgPool2d: lambda: (nn.AvgPool2d(2), _img(64, 2)),
    nn.AvgPool3d: lambda: (nn.AvgPool3d(2), _img(32, 3)),
    nn.AdaptiveAvgPool1d: lambda: (nn.AdaptiveAvgPool1d(12), _img(256, 1)),
    nn.AdaptiveAvgPool2d: lambda: (nn.AdaptiveAvgPool2d(12), _img(64, 2)),
    nn.AdaptiveAvgPool3d: lambda: (nn.AdaptiveAvgPool3d(8), _img(32, 3)),
}
for _act in (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid,
             nn.Sigmoid, nn.Tanh, nn.Softplus):
    CASES[_act] = lambda act=_act: (act(), torch.randn(128, 256))
CASES[nn.Softmax] = lambda: (nn.Softmax(dim=1), torch.randn(128, 256))
CASES[nn.LogSoftmax] = lambda: (nn.LogSoftmax(dim=1), torch.randn(128, 256))


@contextmanager
def interposer(layers: bool = True) -> Iterator[tuple[StubRuntime, CountingMode]]:
    rt = StubRuntime()
    mode = CountingMode(rt, cpu_sim=True, cuda=False)  # type: ignore[arg-type]
    gate = LayerGate(mode)
    with mode:
        if layers:
            gate.install()
        try:
            yield rt, mode
        finally:
            gate.remove()


def test_every_layer_of_the_fast_path_has_a_case() -> None:
    assert set(CASES) == single_operator_layers()


@pytest.mark.parametrize("cls", sorted(CASES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_a_layer_is_gated_once_reserves_its_output_and_matches_the_per_operator_path(cls: type) -> None:
    layer, x = CASES[cls]()
    twin = copy.deepcopy(layer)  # some layers change their own state (running stats, renormed rows)
    torch.manual_seed(0)
    with torch.inference_mode(), interposer(layers=False) as (rt, mode):
        slow = twin(x)
        assert mode.ops >= 1
        # the premise of the fast path: with autograd off the layer leaves nothing but its output
        slow_reserved = rt.reserved
    torch.manual_seed(0)
    with torch.inference_mode(), interposer() as (rt, mode):
        fast = layer(x)
        gate = rt.gates[0]
        assert mode.ops == 0  # its operators skipped the dispatch mode
        assert gate.checks == 1 and gate._active == 0 and gate._uses == 1
        assert rt.reserved == slow_reserved == (fast.nbytes if fast.nbytes >= 64 * 1024 else 0)
        assert torch.equal(fast, slow)
        del fast
        assert rt.reserved == 0


def test_the_operator_after_a_layer_goes_through_the_mode_again() -> None:
    x = torch.randn(4, 4)
    with torch.inference_mode(), interposer() as (rt, mode):
        y = nn.ReLU()(x)
        y + 1
        assert mode.ops == 1 and rt.gates[0].checks == 2  # the add: through the mode


def test_each_check_names_the_operation_s_kind_a_layer_or_an_operator_and_its_input_shape() -> None:
    """What the warm-up compares a lease's first operations with is their own kind's usual time."""
    a, b = nn.ReLU(), nn.ReLU()
    x, y = torch.randn(4, 4), torch.randn(2, 8)
    with torch.inference_mode(), interposer() as (rt, _mode):
        a(x), b(x), a(y)
        x + 1, y + 1
        kinds = rt.gates[0].kinds
    assert kinds[:3] == [id(a), id(b), id(a)]  # a layer keeps its shapes: the layer is its kind
    assert kinds[3:] == [(torch.ops.aten.add.Tensor, x.shape), (torch.ops.aten.add.Tensor, y.shape)]


class MyLinear(nn.Linear):
    pass


@pytest.mark.parametrize("case", ["autograd on", "subclass", "forward hook", "global hook", "mode above ours",
                                  "keyword input"])
def test_anything_else_goes_through_the_mode_operator_by_operator(case: str) -> None:
    from torch.nn.modules import module as nn_module

    layer: Any = MyLinear(8, 8) if case == "subclass" else nn.Linear(8, 8)
    x = torch.randn(4, 8)
    handles = []
    if case == "forward hook":
        handles.append(layer.register_forward_hook(lambda m, a, out: None))
    if case == "global hook":
        handles.append(nn_module.register_module_forward_pre_hook(lambda m, a: None))

    class Above(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    with interposer() as (_, mode), torch.inference_mode(case != "autograd on"):
        mode.ops = 0
        if case == "mode above ours":
            with Above():
                layer(x)
        elif case == "keyword input":
            layer(input=x)
        else:
            layer(x)
        assert mode.ops >= 1  # the operator reached the mode
    for h in handles:
        h.remove()


def test_a_layer_that_raises_puts_the_mode_back_and_leaves_nothing_active() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with torch.inference_mode(), interposer() as (rt, mode):
        with pytest.raises(RuntimeError):
            nn.Linear(8, 8)(torch.randn(4, 3))  # wrong shape
        assert _get_current_dispatch_mode() is mode
        assert rt.gates[0]._active == 0


def test_remove_restores_the_plain_module_call() -> None:
    with interposer():
        assert "__call__" in nn.Conv2d.__dict__
    assert all("__call__" not in cls.__dict__ for cls in single_operator_layers())
