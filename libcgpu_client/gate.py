"""The slice gate: every piece of GPU work passes it.

The gate keeps the current lease's deadline (CLOCK_MONOTONIC ns). The fast path,
while the lease is valid, is one clock read and a compare. A revoke sets the
deadline to 0, so the next check takes the slow path: it synchronises the
device's outstanding work (through a :class:`DeviceAdapter`), releases the lease
with the time really used and, in the same message, asks again (``release``
with ``again``), then waits for the grant. A background thread gives back a
lease no operation has used for ``idle_ms``, after synchronising, so an
instance without work never holds the GPU. When the daemon is gone the gate
waits for it (``on_loss="wait"``) or lets work run unchecked (``"run"``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Protocol

from cgpu_protocol import Acquire, Release
from libcgpu_client.client import Client, LeaseListener
from libcgpu_client.warmup import WarmupMeter

log = logging.getLogger("libcgpu_client.gate")
_now = time.monotonic_ns


class DeviceAdapter(Protocol):
    synchronous: bool  # operations finish before the gate is checked again (the warm-up can be measured)

    def synchronize(self) -> None:
        """Wait until every piece of work queued on the device has finished."""


class CpuAdapter:
    """The CPU as a simulated GPU: operators run synchronously, nothing to wait for."""

    synchronous = True

    def synchronize(self) -> None:
        return None


class CudaAdapter:
    """Synchronises one CUDA device through PyTorch (``torch.cuda.synchronize``)."""

    synchronous = False

    def __init__(self, device_index: int, sync: Callable[[int], None] | None = None) -> None:
        self.device_index = device_index
        if sync is None:
            import torch

            def sync(i: int) -> None:
                torch.cuda.synchronize(i)

        self._sync = sync

    def synchronize(self) -> None:
        self._sync(self.device_index)


class Gate:
    """Holds this process's lease on one GPU and gates work on it."""

    def __init__(
        self,
        client: Client,
        gpu: int,
        device: DeviceAdapter | None = None,
        idle_ms: float = 3.0,
        on_loss: str = "wait",
    ) -> None:
        self.client = client
        self.gpu = gpu
        self.device = device if device is not None else CpuAdapter()
        self.idle_ns = int(idle_ms * 1e6)
        self.on_loss = on_loss
        self._deadline = 0
        self._lease: int | None = None
        self._granted_at = 0
        self._uses = 0
        self._warmup = WarmupMeter(self.device.synchronous)
        self._use = self._warmup.use
        self._active = 0
        self._lock = threading.RLock()
        self._granted = threading.Condition(self._lock)
        self._waiting = False
        self._closed = False
        self.acquires = 0
        self.held_ns = 0
        # called with (granted_ns, ended_ns), CLOCK_MONOTONIC, as each lease ends (tracing, benchmarks)
        self.on_lease_end: list[Callable[[int, int], None]] = []
        self._has_lease = threading.Event()
        client.listeners[gpu] = LeaseListener(self._on_grant, self._on_revoke, self._on_reset)
        client.on_connected.append(self._on_connected)
        self._idle_thread = threading.Thread(target=self._idle_loop, name=f"cgpu-idle-{gpu}", daemon=True)
        self._idle_thread.start()

    # ---------------------------------------------------------------- public
    def check(self, kind: Hashable = None) -> None:
        """Return once this process may put work on the GPU; ``kind`` names the operation about to run
        (operations of one kind usually take about as long: see :mod:`libcgpu_client.warmup`)."""
        now = _now()
        if now < self._deadline:
            self._uses += 1
            self._use(now, kind)
            return
        self._slow(kind)

    @contextmanager
    def work(self) -> Iterator[None]:
        """Gate a block of GPU work; the idle thread never releases inside it."""
        self.check()
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            self._uses += 1

    __enter__ = check

    def __exit__(self, *exc: object) -> None:
        self._uses += 1

    def release(self) -> None:
        """Give the lease back now (after synchronising)."""
        with self._lock:
            if self._lease is not None:
                self.device.synchronize()
                self._give_back(again=False)

    def close(self) -> None:
        self._closed = True
        self.release()

    # ------------------------------------------------------------- slow path
    def _slow(self, kind: Hashable) -> None:
        with self._lock:
            now = _now()
            if now < self._deadline:
                self._uses += 1
                self._use(now, kind)
                return
            if not self.client.connected and self.on_loss == "run":
                return
            if self._lease is not None:
                self.device.synchronize()
                self._give_back(again=True)
            else:
                self._ask()
            while not (_now() < self._deadline):
                if not self.client.connected and self.on_loss == "run":
                    return
                if not self._waiting:
                    self._ask()
                self._granted.wait(0.5)
            self._uses += 1
            self._use(_now(), kind)

    def _ask(self) -> None:
        self._waiting = True
        self.acquires += 1
        if not self.client.send(Acquire(self.gpu)):
            self._waiting = False

    def _give_back(self, again: bool) -> None:
        """Release the lease; ``again`` (from the slow path, at a use): ask for the next turn in the same message."""
        lease, self._lease = self._lease, None
        self._deadline = 0
        if lease is None:
            return
        end = self._ended()
        # from the slow path this is the boundary of the use about to start: the last operation ended
        lost = self._warmup.lost(end, at_use=again)
        self._waiting = again
        if again:
            self.acquires += 1
        sent = self.client.send(Release(self.gpu, lease, end - self._granted_at, again, warmup_ns=lost or None))
        if not sent:
            self._waiting = False

    def _ended(self) -> int:
        """The held lease ends now: count its time and tell the callbacks; returns when."""
        end = _now()
        self.held_ns += end - self._granted_at
        for callback in self.on_lease_end:
            callback(self._granted_at, end)
        return end

    # ------------------------------------------------------------- callbacks
    def _on_grant(self, lease: int, deadline: int) -> None:
        with self._lock:
            if lease == self._lease:  # the daemon moved the deadline of the lease we hold
                self._deadline = deadline
                return
            self._waiting = False
            self._lease = lease
            self._granted_at = _now()
            self._warmup.begin(self._granted_at)
            self._deadline = deadline
            self._has_lease.set()
            self._granted.notify_all()

    def _on_revoke(self, lease: int) -> None:
        if lease == self._lease:
            self._deadline = 0  # the next check takes the slow path
            if self._active == 0:
                threading.Thread(target=self._release_if_idle, daemon=True).start()

    def _release_if_idle(self) -> None:
        with self._lock:
            if self._active == 0 and self._lease is not None and not (_now() < self._deadline):
                self.device.synchronize()
                self._give_back(again=False)

    def _on_reset(self) -> None:
        with self._lock:
            if self._lease is not None:
                self._ended()
            self._lease = None
            self._deadline = 0
            self._waiting = False
            self._granted.notify_all()

    def _on_connected(self) -> None:
        with self._lock:
            self._granted.notify_all()

    def _idle_loop(self) -> None:
        period = max(self.idle_ns / 1e9, 0.0005)
        last_uses = -1
        last_change = _now()
        while not self._closed:
            if self._lease is None:
                self._has_lease.clear()
                if self._lease is None:
                    self._has_lease.wait(1.0)
                last_uses, last_change = self._uses, _now()
                continue
            time.sleep(period)
            uses = self._uses
            now = _now()
            if uses != last_uses or self._active:
                last_uses, last_change = uses, now
                continue
            if self._lease is not None and now - last_change >= self.idle_ns:
                with self._lock:
                    if self._lease is not None and self._uses == uses and self._active == 0:
                        self.device.synchronize()
                        self._give_back(again=False)
