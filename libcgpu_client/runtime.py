"""The per-process runtime: one :class:`Client` and one :class:`Gate` per visible GPU.

``activate()`` builds it from the environment (behaviour §6); the framework
interposers and ``cgpu-run``'s start-up hook use it. Position ``i`` in
``ALIYUN_COM_GPU_VISIBLE_DEVICES`` is the framework's device ``i``.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cgpu_protocol import MemFree
from libcgpu_client.client import Client
from libcgpu_client.env import ClientEnv, parse_env
from libcgpu_client.gate import CpuAdapter, DeviceAdapter, Gate

log = logging.getLogger("libcgpu_client")
# Memory is reserved from the daemon in chunks, with hysteresis, as a caching allocator
# does: grow by at least GROW, give back only when more than KEEP_MAX is spare, down to KEEP.
CHUNK = 64 * 1024**2
GROW = 4 * CHUNK
KEEP = 2 * CHUNK
KEEP_MAX = 8 * CHUNK


class OutOfMemory(MemoryError):
    """A reservation was denied: the instance's memory limit would be passed."""


@dataclass(slots=True)
class MemoryAccount:
    """Memory this process uses on one GPU, and how much of it the daemon has granted."""

    gpu: int
    reserved: int = 0
    used: int = 0


class Runtime:
    def __init__(self, env: ClientEnv, device_factory: Callable[[int], DeviceAdapter] | None = None) -> None:
        self.env = env
        self.client = Client(env.socket, env.instance, list(env.gpus), env.weight, env.highprio,
                             list(env.memsize) or None, core_percent=env.core_percent,
                             limit=env.limit)
        self._device_factory = device_factory or (lambda i: CpuAdapter())
        self.gates: list[Gate] = []
        self.memory: list[MemoryAccount] = []
        self._mem_lock = threading.Lock()

    def start(self, wait_s: float = 5.0) -> None:
        if not self.client.start(wait_s):
            log.warning("cgpu: arbiterd at %s is not answering; GPU work %s until it does",
                        self.env.socket, "waits" if self.env.on_daemon_loss == "wait" else "runs unchecked")
            if self.env.on_daemon_loss == "wait":
                self.client.wait_connected()
        reg = self.client.registration
        indices = [int(g["gpu"]) for g in reg.gpus] if reg else [
            g if isinstance(g, int) else i for i, g in enumerate(self.env.gpus)]
        for pos, gpu in enumerate(indices):
            self.gates.append(Gate(self.client, gpu, self._device_factory(pos), self.env.idle_ms,
                                   self.env.on_daemon_loss))
            self.memory.append(MemoryAccount(gpu))

    def gate(self, pos: int = 0) -> Gate:
        return self.gates[pos]

    def mem_limit(self, pos: int = 0) -> int:
        reg = self.client.registration
        return int(reg.gpus[pos]["mem_limit"]) if reg else 0

    def reserve(self, pos: int, nbytes: int) -> None:
        """Account ``nbytes`` more on device ``pos``; raise OutOfMemory past the limit."""
        acct = self.memory[pos]
        with self._mem_lock:
            if acct.used + nbytes <= acct.reserved:
                acct.used += nbytes
                return
            need = acct.used + nbytes - acct.reserved
            for ask in (max(need, GROW) + (-max(need, GROW)) % CHUNK, need + (-need) % CHUNK, need):
                ok, used, limit, reason = self.client.mem_reserve(acct.gpu, ask)
                if ok:
                    acct.reserved += ask
                    acct.used += nbytes
                    return
            raise OutOfMemory(
                f"cgpu: out of memory on GPU {acct.gpu}: tried to allocate {nbytes} bytes; "
                f"the instance uses {used} of its {limit}-byte limit ({reason})"
            )

    def unreserve(self, pos: int, nbytes: int) -> None:
        acct = self.memory[pos]
        with self._mem_lock:
            acct.used = max(0, acct.used - nbytes)
            spare = acct.reserved - acct.used
            if spare > KEEP_MAX:
                give = spare - KEEP
                acct.reserved -= give
                self.client.send(MemFree(acct.gpu, give))

    def close(self) -> None:
        for gate in self.gates:
            gate.close()
        self.client.close()


_runtime: Runtime | None = None
_lock = threading.Lock()


def activate(env: ClientEnv | None = None,
             device_factory: Callable[[int], DeviceAdapter] | None = None) -> Runtime | None:
    """The process's runtime, created on first call; None when CGPU_DISABLE is true."""
    global _runtime
    with _lock:
        if _runtime is None:
            env = env if env is not None else parse_env()
            if env.disabled:
                return None
            rt = Runtime(env, device_factory)
            rt.start()
            atexit.register(rt.close)  # give leases back before daemon threads stop at exit
            _runtime = rt
        return _runtime


def current() -> Runtime | None:
    return _runtime
