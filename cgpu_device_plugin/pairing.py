"""Pairing a container's memory with its core percentage, though the kubelet never says they belong together.

How this works
--------------
For one container the kubelet calls the two resources' plugins one after the other, in no
fixed order, during one admission, and never names the pod or container. So after an
``Allocate`` of one resource on a single card, that card is remembered for ``window_s``
seconds as *unpaired*; the next ``GetPreferredAllocation`` of the other resource in that
window prefers it (when it has room), and the next ``Allocate`` of the other resource pairs
with it and clears it. A newer unpaired allocation replaces an older one.

This is only a preference: a container whose memory and core end up on different cards is
refused by arbiterd when it binds (it checks every allocation a container presents).
Time is passed in, so tests drive it with a virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgpu_device_plugin.devices import Resource


@dataclass(frozen=True, slots=True)
class Unpaired:
    card: int
    alloc_id: str
    at: float


class Pairing:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[Resource, Unpaired] = {}

    def _fresh(self, resource: Resource, now: float) -> Unpaired | None:
        entry = self._last.get(resource)
        if entry is not None and now - entry.at > self.window_s:
            del self._last[resource]
            return None
        return entry

    def hint(self, resource: Resource, now: float) -> Unpaired | None:
        """The other resource's unpaired allocation in the window, whose card ``resource`` should prefer."""
        return self._fresh(resource.other, now)

    def allocated(self, resource: Resource, alloc_id: str, card: int | None, now: float) -> Unpaired | None:
        """Record an Allocate of ``resource`` (``card`` None: it spans cards); return what it paired with."""
        partner = self._fresh(resource.other, now)
        if partner is not None:
            del self._last[resource.other]
            return partner
        if card is None:
            self._last.pop(resource, None)
        else:
            self._last[resource] = Unpaired(card, alloc_id, now)
        return None
