"""Pairing a container's memory with its core percentage, though the kubelet never says they belong together.

How this works
--------------
For one container the kubelet calls the two resources' plugins one right after the other
(GetPreferredAllocation, Allocate; then the other resource), in no fixed order, and never
names the pod or container; it admits one container at a time. So the pairing remembers,
per resource, the card of its most recent single-card ``Allocate``. A call for one resource
prefers the card of the other resource's most recent allocation when that one is newer
than this resource's own most recent allocation and younger than ``window_s``.

The second resource of a container therefore always finds its first one. Nothing is
"consumed": after a container that asked for one resource only, the next container's first
resource is drawn to that container's card (when it fits) and its second follows its first,
so the container still ends up on one card. The price: within the window, a container's
first resource prefers the card the previous container ended on, if it fits there.

This is only a preference: a container whose memory and core end up on different cards is
refused by arbiterd when it binds. Time is passed in, so tests drive it with a virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgpu_device_plugin.devices import Resource


@dataclass(frozen=True, slots=True)
class Recent:
    """The most recent single-card allocation of one resource."""

    card: int
    alloc_id: str
    at: float


class Pairing:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[Resource, Recent] = {}

    def hint(self, resource: Resource, now: float) -> Recent | None:
        """The allocation whose card a call for ``resource`` should prefer, if any."""
        other = self._last.get(resource.other)
        if other is None or now - other.at > self.window_s:
            return None
        mine = self._last.get(resource)
        if mine is not None and mine.at >= other.at:
            return None  # this resource was allocated since: that call was the other's pair
        return other

    def allocated(self, resource: Resource, alloc_id: str, card: int | None, now: float) -> Recent | None:
        """Record an Allocate of ``resource`` (``card`` None: it spans cards); return the hint it had."""
        partner = self.hint(resource, now)
        if card is None:
            self._last.pop(resource, None)
        else:
            self._last[resource] = Recent(card, alloc_id, now)
        return partner
