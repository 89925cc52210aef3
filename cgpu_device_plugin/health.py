"""Device health: polls arbiterd's status and publishes each resource's device list to ListAndWatch.

How this works
--------------
Every ``poll_interval_s`` (or at once after ``poke``) the monitor reads ``/v1/status``.
Every card seen since the plugin started keeps its devices in the list:

* arbiterd unreachable (or its status unusable): every device is Unhealthy, so the kubelet
  admits no new pod while nobody could provision or bind it; running pods keep their devices;
* a card missing from a status that is otherwise fine: that card's devices are Unhealthy.
  Unhealthy rather than removed: the kubelet then keeps the capacity and shows allocatable
  dropping (an operator sees a lost GPU, not a smaller node), pods holding its IDs keep
  them, and a card that returns is Healthy again under the same IDs. A card gone at a
  plugin restart is simply not listed any more.

When arbiterd answers after not answering, or answers with another pid (it restarted), the
``on_back`` callback (the allocator's resync) runs before devices turn Healthy.
Watchers wait on a generation number that grows whenever some list changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cgpu_device_plugin.admin import AdminClient, Refused, Unreachable
from cgpu_device_plugin.devices import HEALTHY, UNHEALTHY, Resource, device_ids
from cgpu_device_plugin.node import Card, NodeView, StatusError

log = logging.getLogger("cgpu_device_plugin.health")
DeviceList = tuple[tuple[str, str], ...]  # (ID, health)


class NodeMonitor:
    def __init__(self, admin: AdminClient, interval_s: float,
                 on_back: Callable[[NodeView], None] = lambda node: None) -> None:
        self.admin = admin
        self.interval_s = interval_s
        self.on_back = on_back
        self._cond = threading.Condition()
        self._generation = 0
        self._lists: dict[Resource, DeviceList] = {r: () for r in Resource}
        self._cards: dict[str, Card] = {}  # every card seen since start, by UUID
        self._present: set[str] = set()
        self._reachable: bool | None = None  # None: not polled yet
        self._pid: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cgpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        self.wake_watchers()

    def poke(self) -> None:
        """Poll again now (something just failed to reach arbiterd)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    # ------------------------------------------------------------ polling
    def poll_once(self) -> None:
        node: NodeView | None = None
        problem = ""
        try:
            node = self.admin.node()
        except (Unreachable, StatusError) as exc:
            problem = str(exc)
        if node is not None and (not self._reachable or node.pid != self._pid):
            try:
                self.on_back(node)
            except (Unreachable, Refused) as exc:
                node, problem = None, f"arbiterd went away while re-syncing allocations: {exc}"
        self._apply(node, problem)

    def _apply(self, node: NodeView | None, problem: str) -> None:
        with self._cond:
            if node is None:
                if self._reachable is not False:
                    log.warning("arbiterd is unreachable (%s): every device is Unhealthy until it answers", problem)
                self._reachable = False
                self._present = set()
            else:
                if self._reachable is False:
                    log.info("arbiterd answers again (pid %s): devices of present GPUs are Healthy", node.pid)
                elif self._pid is not None and node.pid != self._pid:
                    log.info("arbiterd restarted (pid %s -> %s)", self._pid, node.pid)
                self._reachable, self._pid = True, node.pid
                present = {c.uuid for c in node.cards}
                for card in node.cards:
                    old = self._cards.get(card.uuid)
                    if old is None or old.total_mem != card.total_mem:
                        log.info("%s: %d GiB -> %d gpu-mem devices, 100 gpu-core.percentage devices", card.label(),
                                 card.gib, card.gib)
                    elif card.uuid not in self._present and self._present:
                        log.info("%s is back in arbiterd's status: its devices are Healthy", card.label())
                    self._cards[card.uuid] = card
                for uuid in sorted(self._present - present):
                    log.warning("%s is gone from arbiterd's status: its devices are Unhealthy",
                                self._cards[uuid].label())
                self._present = present
            changed = False
            for resource in Resource:
                fresh = self._build(resource)
                if fresh != self._lists[resource]:
                    self._lists[resource] = fresh
                    changed = True
            if changed:
                self._generation += 1
                self._cond.notify_all()

    def _build(self, resource: Resource) -> DeviceList:
        out: list[tuple[str, str]] = []
        for card in sorted(self._cards.values(), key=lambda c: (c.index, c.uuid)):
            health = HEALTHY if card.uuid in self._present else UNHEALTHY
            out += [(i, health) for i in device_ids(card.uuid, card.total_mem, resource)]
        return tuple(out)

    # ------------------------------------------------------------ watchers
    def snapshot(self, resource: Resource) -> tuple[int, DeviceList]:
        with self._cond:
            return self._generation, self._lists[resource]

    def wait_change(self, generation: int, timeout: float) -> int:
        """Block until the generation passes ``generation`` (or timeout, or wake_watchers); return it."""
        with self._cond:
            if self._generation == generation:
                self._cond.wait(timeout)
            return self._generation

    def wake_watchers(self) -> None:
        with self._cond:
            self._cond.notify_all()
