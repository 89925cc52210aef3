"""Which card a container's units come from: pure functions over a snapshot of arbiterd's status.

How this works
--------------
A card's *room* for a resource is the number of its units the kubelet still lists as
available that arbiterd would also still accept (``Card.free``: what no allocation holds).

* ``preferred`` answers ``GetPreferredAllocation``. A request that fits one card gets one
  card: the paired card (``hint``: the card of the same container's other resource) when it
  has room, else by policy: ``binpack`` takes the fullest card that fits (least room),
  ``spread`` the emptiest (most room); ties go to the lowest index. Cards that keep at least
  the same share of the *other* resource free as the request takes of its own come first:
  the kubelet asks for the container's other resource only after this one, and it must fit
  on the same card. Memory that fits no single card spans the fewest cards, largest room
  first. Within a card the lowest units are taken.
* ``plan_allocation`` checks the IDs ``Allocate`` receives (the kubelet may ignore the
  preference) and refuses, with a one-line ``Refusal``, anything the node must not run: a
  core percentage that is not a multiple of 5 or crosses cards, memory split across cards
  though one card has room (or over more cards than needed), and anything that would
  overcommit a card.

Nothing here does I/O; the allocator feeds it what it read from arbiterd.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cgpu_device_plugin.devices import CORE_STEP, CORE_UNITS, BadDeviceId, DeviceId, Resource, parse_device_id
from cgpu_device_plugin.node import Card

UNIT_NAMES = {Resource.MEM: "GiB", Resource.CORE: "%"}


class Refusal(Exception):
    """The plugin will not provision this request; the message is one line for the pod's events."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A checked request: how many units on which cards (in card-index order)."""

    resource: Resource
    cards: tuple[Card, ...]
    units: tuple[int, ...]
    ids: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(self.units)

    def describe(self) -> str:
        unit = UNIT_NAMES[self.resource]
        return ", ".join(f"{n} {unit} on {c.label()}" for c, n in zip(self.cards, self.units, strict=True))


def _units_by_card(resource: Resource, ids: Iterable[str], cards: dict[str, Card]) -> dict[str, list[int]]:
    """Valid units of ``resource`` among ``ids``, grouped by card UUID; anything else is ignored."""
    out: dict[str, list[int]] = {}
    for text in ids:
        try:
            d = parse_device_id(text)
        except BadDeviceId:
            continue
        card = cards.get(d.uuid)
        if d.resource is resource and card is not None and d.unit < card.units(resource):
            out.setdefault(d.uuid, []).append(d.unit)
    return out


def _balanced(card: Card, resource: Resource, need: int) -> bool:
    """The card has at least the share of the other resource free that this request takes of its own."""
    other = resource.other
    return card.free(other) * card.units(resource) >= need * card.units(other)


def _order(cards: Sequence[Card], room: dict[str, int], policy: str, resource: Resource, need: int) -> list[Card]:
    """Cards with room beside them for the container's other resource first; then by policy."""
    sign = -1 if policy == "spread" else 1
    return sorted(cards, key=lambda c: (not _balanced(c, resource, need), sign * room[c.uuid], c.index))


def _take(resource: Resource, card: Card, units: list[int], n: int) -> list[str]:
    return [str(DeviceId(card.uuid, resource, u)) for u in sorted(units)[:n]]


def preferred(resource: Resource, size: int, available: Iterable[str], must_include: Sequence[str],
              cards: Sequence[Card], policy: str = "binpack", hint: int | None = None) -> list[str]:
    """The IDs to prefer for a container asking ``size`` units, or [] when none fit (Allocate explains)."""
    by_uuid = {c.uuid: c for c in cards}
    result = list(must_include)[:size]
    need = size - len(result)
    if need <= 0:
        return result
    must = set(result)
    avail = _units_by_card(resource, (i for i in available if i not in must), by_uuid)
    if must:  # devices the kubelet reuses (an init container's): complete the request on their card
        reused = _units_by_card(resource, must, by_uuid)
        if reused:
            hint = by_uuid[next(iter(reused))].index
    room = {c.uuid: min(len(avail.get(c.uuid, [])), c.free(resource)) for c in cards}
    fits = [c for c in cards if room[c.uuid] >= need]
    if fits:
        paired = [c for c in fits if c.index == hint]
        card = paired[0] if paired else _order(fits, room, policy, resource, need)[0]
        return result + _take(resource, card, avail[card.uuid], need)
    if resource is Resource.CORE or sum(room.values()) < need:
        return []
    for card in sorted(cards, key=lambda c: (-room[c.uuid], c.index)):
        n = min(need, room[card.uuid])
        result += _take(resource, card, avail.get(card.uuid, []), n)
        need -= n
        if need == 0:
            break
    return result


def min_cards(size: int, free: Iterable[int]) -> int:
    """The fewest cards whose free units add up to ``size`` (more than all cards when none do)."""
    frees = sorted(free, reverse=True)
    total = 0
    for n, f in enumerate(frees, 1):
        total += f
        if total >= size:
            return n
    return len(frees) + 1


def plan_allocation(resource: Resource, ids: Sequence[str], cards: Sequence[Card]) -> Plan:
    """Check the IDs the kubelet allocated to one container; raise Refusal saying why not."""
    name = resource.resource_name
    unit = UNIT_NAMES[resource]
    if not ids:
        raise Refusal(f"{name}: no devices in the request")
    by_uuid = {c.uuid: c for c in cards}
    per_card: Counter[str] = Counter()
    for text in ids:
        try:
            d = parse_device_id(text)
        except BadDeviceId as exc:
            raise Refusal(f"{name}: {exc}") from None
        if d.resource is not resource:
            raise Refusal(f"{name}: {text} belongs to {d.resource.resource_name}")
        card = by_uuid.get(d.uuid)
        if card is None:
            raise Refusal(f"{name}: {text} names GPU {d.uuid}, which arbiterd does not report")
        if d.unit >= card.units(resource):
            raise Refusal(f"{name}: {text} is past the last unit of {card.label()}")
        per_card[d.uuid] += 1
    if len(set(ids)) != len(ids):
        raise Refusal(f"{name}: the request names a device twice")
    n = len(ids)
    used = sorted((by_uuid[u] for u in per_card), key=lambda c: c.index)
    where = ", ".join(str(c.index) for c in used)
    if resource is Resource.CORE:
        if n % CORE_STEP:
            raise Refusal(f"{name}: {n} is not a multiple of {CORE_STEP}; request 5, 10, ... 100 percent of a GPU")
        if n > CORE_UNITS:
            raise Refusal(f"{name}: {n} is more than the {CORE_UNITS} percent of one GPU")
        if len(used) > 1:
            raise Refusal(f"{name}: {n} percent split over GPUs {where}; a core percentage comes from one GPU")
    elif len(used) > 1:
        whole = [c for c in cards if c.free(resource) >= n]
        if whole:
            raise Refusal(f"{name}: {n} GiB split over GPUs {where} although GPU {whole[0].index} has room for "
                          "all of it; a container's memory comes from one GPU when it fits")
        fewest = min_cards(n, (c.free(resource) for c in cards))
        if len(used) > fewest:
            raise Refusal(f"{name}: {n} GiB split over {len(used)} GPUs ({where}) where {fewest} suffice")
    for card in used:
        k, free = per_card[card.uuid], card.free(resource)
        if k > free:
            raise Refusal(f"{name}: {k} {unit} on {card.label()} would overcommit it: only {free} {unit} "
                          "are not allocated")
    return Plan(resource, tuple(used), tuple(per_card[c.uuid] for c in used), tuple(ids))
