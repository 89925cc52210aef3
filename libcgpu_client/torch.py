"""PyTorch interposer: every operator on a controlled device passes the slice gate.

:func:`install` pushes a ``TorchDispatchMode`` on the importing thread and every
thread started afterwards. With ``CGPU_DEVICE=cpu`` the CPU acts as the
simulated GPU 0: CPU operators are gated and new tensor storage is reserved
against the instance's ledger (tensors under 64 KiB are not counted). On CUDA,
operators on ``cuda:i`` pass the gate of visible GPU ``i``, and the caching
allocator is capped at what the daemon granted, growing on demand; a denial is
``torch.OutOfMemoryError``. With ``libcgpu.so`` loaded, CUDA is left to it.
Memory totals report the limit as the device's total.

A dispatch mode costs a Python round trip per operator, so the default hook
gates built-in single-operator layers at their call (:class:`LayerGate`);
``CGPU_TORCH_HOOK=module`` gates at module calls instead (:class:`ModuleGate`),
and ``operator`` sends every operator through the mode.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode, _push_mode

from libcgpu_client import runtime as runtime_mod
from libcgpu_client.env import parse_env
from libcgpu_client.gate import CudaAdapter, Gate
from libcgpu_client.native import shim_loaded
from libcgpu_client.runtime import OutOfMemory, Runtime

log = logging.getLogger("libcgpu_client.torch")
MIN_TRACKED = 64 * 1024
CUDA_GROW = 256 * 1024**2
_installed: CgpuMode | None = None


class CudaMemoryGovernor:
    """Caps the CUDA caching allocator at what the daemon granted; grows on demand."""

    def __init__(
        self,
        rt: Runtime,
        set_fraction: Callable[[float, int], None],
        total_memory: Callable[[int], int],
    ) -> None:
        self.rt = rt
        self.set_fraction = set_fraction
        self.total_memory = total_memory
        for pos in range(len(rt.gates)):
            self._apply(pos)

    def _apply(self, pos: int) -> None:
        total = self.total_memory(pos)
        granted = self.rt.memory[pos].reserved
        self.set_fraction(min(1.0, granted / total) if total else 0.0, pos)

    def grow(self, pos: int) -> None:
        """Reserve another step from the daemon; raises OutOfMemory when denied."""
        self.rt.reserve(pos, CUDA_GROW)
        self._apply(pos)


class CgpuMode(TorchDispatchMode):
    def __init__(self, rt: Runtime, cpu_sim: bool, cuda: bool,
                 governor: CudaMemoryGovernor | None = None) -> None:
        super().__init__()
        self.rt = rt
        self.cpu_sim = cpu_sim
        self.cuda = cuda
        self.governor = governor
        self.gates = rt.gates
        self._live: dict[int, _Held] = {}  # data pointer -> the reservation of that storage
        self._on_free = self._freed  # one bound method for every reservation
        self.op_ns = 0
        self.module_gate: ModuleGate | None = None
        self.layer_gate: LayerGate | None = None

    def _pos(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        for a in args:
            if isinstance(a, torch.Tensor):
                break
            if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor):
                a = a[0]
                break
        else:
            dev = kwargs.get("device")
            if dev is None:
                return 0 if self.cpu_sim else None
            dev = torch.device(dev)
            if dev.type == "cpu":
                return 0 if self.cpu_sim else None
            if dev.type == "cuda" and self.cuda:
                idx = dev.index if dev.index is not None else torch.cuda.current_device()
                return idx if idx < len(self.gates) else None
            return None
        # the tensor's own flags: cheaper than building its torch.device on every operator
        if a.is_cpu:
            if self.cpu_sim:
                return 0
            # a copy onto the GPU (``tensor.to("cuda")``, ``_to_copy(cpu_tensor, device=cuda)``) allocates there
            dev = kwargs.get("device")
            if dev is not None and self.cuda and (dev := torch.device(dev)).type == "cuda":
                idx = dev.index if dev.index is not None else torch.cuda.current_device()
                return idx if idx < len(self.gates) else None
            return None
        if a.is_cuda and self.cuda:
            idx = a.get_device()
            return idx if idx < len(self.gates) else None
        return None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        pos = self._pos(args, kwargs)
        if pos is None:
            return func(*args, **kwargs)
        gate: Gate = self.gates[pos]
        a = args[0] if args else None
        # the operation's kind: the operator and its first input's shape (what it costs depends on both)
        gate.check((func, a.shape) if isinstance(a, torch.Tensor) else func)
        gate._active += 1
        try:
            if self.governor is not None and not self.cpu_sim:
                out = self._run_cuda(func, args, kwargs, pos)
            else:
                out = func(*args, **kwargs)
        finally:
            gate._active -= 1
            gate._uses += 1
        if self.cpu_sim and pos == 0:
            self._account(out)
        return out

    def _run_cuda(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pos: int) -> Any:
        assert self.governor is not None
        while True:
            try:
                return func(*args, **kwargs)
            except torch.OutOfMemoryError:
                try:
                    self.governor.grow(pos)
                except OutOfMemory as exc:
                    raise torch.OutOfMemoryError(str(exc)) from None

    def _account(self, out: Any) -> None:
        """Reserve the storage of every new output tensor of 64 KiB or more."""
        if isinstance(out, torch.Tensor):
            tensors: tuple[Any, ...] | list[Any] = (out,)
        elif isinstance(out, list | tuple):
            tensors = out
        else:
            return
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t._base is not None:
                continue  # a view shares its base's storage
            nbytes = t.nbytes
            if nbytes < MIN_TRACKED:
                continue
            ptr = t.data_ptr()
            if ptr in self._live:
                continue  # in-place results and outputs that alias an input
            try:
                self.rt.reserve(0, nbytes)
            except OutOfMemory as exc:
                raise torch.OutOfMemoryError(str(exc)) from None
            held = _Held(t, self._on_free)
            held.ptr, held.nbytes = ptr, nbytes
            self._live[ptr] = held

    def _freed(self, held: _Held) -> None:
        if self._live.get(held.ptr) is held:
            del self._live[held.ptr]
            # try/except, not contextlib.suppress (a context manager per call): this runs for every tracked tensor
            try:  # noqa: SIM105
                self.rt.unreserve(0, held.nbytes)
            except (ConnectionError, OSError):
                pass  # while the process exits the connection may be gone: the daemon frees on disconnect


class _Held(weakref.ref):  # type: ignore[type-arg]
    """A reservation: a weak reference to the tensor whose storage it covers.

    One object per tracked tensor (no callback closure, no tuple): the interposer
    runs on every operator, and fewer allocations also mean fewer GC passes.
    """

    __slots__ = ("nbytes", "ptr")
    ptr: int
    nbytes: int


def mem_get_info(pos: int = 0) -> tuple[int, int]:
    """(free, total) of controlled device ``pos`` as the instance sees it: its limit is the total."""
    rt = runtime_mod.current()
    if rt is None:
        raise RuntimeError("cgpu is not active in this process")
    limit = rt.mem_limit(pos)
    return max(0, limit - rt.memory[pos].used), limit


def _patch_cuda_totals(rt: Runtime) -> None:
    real_info = torch.cuda.mem_get_info
    real_props = torch.cuda.get_device_properties

    @functools.wraps(real_info)
    def cgpu_mem_get_info(device: Any = None) -> tuple[int, int]:
        free, total = real_info(device)
        idx = torch.cuda._utils._get_device_index(device, optional=True)
        limit = rt.mem_limit(idx) if idx < len(rt.gates) else total
        used = torch.cuda.memory_reserved(idx)
        return max(0, min(free, limit - used)), limit

    class _Props:
        def __init__(self, props: Any, limit: int) -> None:
            self._props = props
            self.total_memory = limit

        def __getattr__(self, name: str) -> Any:
            return getattr(self._props, name)

    @functools.wraps(real_props)
    def cgpu_get_device_properties(device: Any = None) -> Any:
        props = real_props(device)
        idx = torch.cuda._utils._get_device_index(device, optional=True)
        return _Props(props, rt.mem_limit(idx)) if idx < len(rt.gates) else props

    torch.cuda.mem_get_info = cgpu_mem_get_info
    torch.cuda.get_device_properties = cgpu_get_device_properties


class ModuleGate:
    """Gates CPU-as-GPU work at ``nn.Module`` calls; the dispatch mode is off inside modules.

    The opt-in hook (``CGPU_TORCH_HOOK=module``), through PyTorch's global module hooks: the gate is
    checked before every module call (leaves included), the idle thread never releases the lease
    while a module runs, and each module's output is reserved. Operators outside any module still go
    through the dispatch mode. Coarser than the default: a module with a long ``forward`` runs on
    past its lease (the overrun is charged), a revoke waits for the next module call, and
    intermediate tensors that a module creates and drops are not reserved.
    """

    def __init__(self, mode: CgpuMode, pos: int = 0) -> None:
        self.mode = mode
        self.gate = mode.gates[pos]
        self.local = threading.local()
        self.handles: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        if not self.handles:
            self.handles = [nn_module.register_module_forward_pre_hook(self.pre),
                            nn_module.register_module_forward_hook(self.post, always_call=True)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def pre(self, module: Any, args: Any) -> None:
        loc = self.local
        depth = getattr(loc, "depth", 0)
        if depth == 0:
            # take our mode off while modules run, unless another mode is stacked on it
            loc.popped = _get_current_dispatch_mode() is self.mode
            if loc.popped:
                _pop_mode()
        loc.depth = depth + 1
        self.gate.check(id(module))
        self.gate._active += 1

    def post(self, module: Any, args: Any, output: Any) -> None:
        gate = self.gate
        gate._active -= 1
        gate._uses += 1
        loc = self.local
        loc.depth -= 1
        if loc.depth == 0 and loc.popped:
            _push_mode(self.mode)
        self.mode._account(output)


def single_operator_layers() -> frozenset[type]:
    """Built-in layers whose ``forward`` is one functional call: one operator (or one composite).

    With autograd off such a call leaves nothing behind but its output (``tests/test_torch_layers.py``
    checks each against the per-operator path)."""
    nn = torch.nn
    return frozenset((
        nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
        nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm, nn.Embedding,
        nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid,
        nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softmax, nn.LogSoftmax, nn.Dropout,
        nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
        nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    ))


class LayerGate:
    """The default hook's fast path: a built-in single-operator layer is gated at its call.

    Called on a plain CPU tensor with autograd off, in a thread whose innermost dispatch mode is
    ours, and with nothing else that ``nn.Module.__call__`` would do (no hooks of any kind, not
    compiled, not JIT-tracing), a layer of :func:`single_operator_layers` (that exact class, not
    a subclass) checks the gate, runs its ``forward`` with the dispatch mode taken off, and
    reserves its output; otherwise it is called as usual and each of its operators goes through
    the mode. One gate check and no Python dispatch for its operator, where the mode would cost
    the operator a round trip into Python.
    """

    def __init__(self, mode: CgpuMode, pos: int = 0) -> None:
        self.mode = mode
        self.gate = mode.gates[pos]
        self.layers = single_operator_layers()
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        from torch.nn.modules import module as nn_module

        mode, gate, layers, account = self.mode, self.gate, self.layers, self.mode._account
        stack_len, stack_at = torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at
        pop, push = torch._C._pop_torch_dispatch_stack, torch._C._push_on_torch_dispatch_stack
        grad_enabled, tracing, Tensor = torch.is_grad_enabled, torch._C._get_tracing_state, torch.Tensor
        global_hooks = (nn_module._global_backward_pre_hooks, nn_module._global_backward_hooks,
                        nn_module._global_forward_hooks, nn_module._global_forward_pre_hooks)
        Module = nn_module.Module

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            n = stack_len()
            if (type(self) not in layers or not args or type(args[0]) is not Tensor or not args[0].is_cpu
                    or grad_enabled() or not n or stack_at(n - 1) is not mode
                    or self._forward_pre_hooks or self._forward_hooks or self._backward_hooks
                    or self._backward_pre_hooks or any(global_hooks)
                    or self._compiled_call_impl is not None or tracing()):
                return Module.__call__(self, *args, **kwargs)  # looked up now: fx patches it
            gate.check(id(self))  # the layer is the operation's kind: its shapes stay put
            gate._active += 1
            pop(None)
            try:
                out = self.forward(*args, **kwargs)
            finally:
                push(mode)
                gate._active -= 1
                gate._uses += 1
            account(out)
            return out

        for cls in layers:
            cls.__call__ = __call__  # type: ignore[method-assign]
        self.installed = True

    def remove(self) -> None:
        for cls in self.layers:
            if "__call__" in cls.__dict__:
                delattr(cls, "__call__")  # back to nn.Module.__call__
        self.installed = False


def _enter_in_new_threads(mode: CgpuMode) -> None:
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        if self.name.startswith("cgpu-"):
            original(self)
            return
        with mode:
            original(self)

    threading.Thread.run = run  # type: ignore[method-assign]


def install(rt: Runtime | None = None) -> CgpuMode | None:
    """Gate every PyTorch operator of this process; idempotent. None when cgpu is disabled."""
    global _installed
    if _installed is not None:
        return _installed
    if rt is None:
        env = parse_env()
        native = env.native or shim_loaded()
        if native and env.device != "cpu":
            log.info("cgpu: libcgpu.so is loaded and enforces CUDA; the PyTorch interposer stays out")
            return None
        use_cuda = env.device != "cpu" and torch.cuda.is_available()
        rt = runtime_mod.activate(env, device_factory=CudaAdapter if use_cuda else None)
    if rt is None:
        return None
    cpu_sim = rt.env.device == "cpu"
    native = rt.env.native or shim_loaded()
    cuda = rt.env.device in ("cuda", "auto") and not native and torch.cuda.is_available()
    if rt.env.device == "cuda" and not torch.cuda.is_available():
        log.warning("cgpu: CGPU_DEVICE=cuda but CUDA is not available; nothing is gated")
    governor = None
    if cuda:
        log.warning("cgpu: the PyTorch interposer gates CUDA here without libcgpu.so, and only PyTorch operators: "
                    "CUDA graph replays, Triton, AOTInductor and extension kernels run ungated (cgpu-run preloads "
                    "libcgpu.so unless --no-native)")
        governor = CudaMemoryGovernor(
            rt, lambda frac, i: torch.cuda.set_per_process_memory_fraction(frac, i),
            lambda i: int(torch.cuda.get_device_properties(i).total_memory))
        _patch_cuda_totals(rt)
    mode = CgpuMode(rt, cpu_sim, cuda, governor)
    mode.__enter__()
    _enter_in_new_threads(mode)
    if cpu_sim and rt.env.torch_hook == "module":
        mode.module_gate = ModuleGate(mode)
        mode.module_gate.install()
    elif cpu_sim and rt.env.torch_hook == "dispatch":
        mode.layer_gate = LayerGate(mode)
        mode.layer_gate.install()
    _installed = mode
    log.info("cgpu: PyTorch interposer active (%s)", "CPU as simulated GPU" if cpu_sim else
             "CUDA" if cuda else "nothing to gate")
    return mode
