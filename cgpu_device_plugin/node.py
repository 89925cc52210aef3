"""The node as arbiterd's ``GET /v1/status`` describes it: cards, what is allocated on them, allocations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cgpu_device_plugin.devices import CORE_UNITS, GIB, Resource, units_of


class StatusError(Exception):
    """arbiterd's status document lacks something the plugin relies on."""


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU and what arbiterd has already allocated on it."""

    index: int
    uuid: str
    total_mem: int  # bytes
    alloc_mem: int = 0  # bytes held by allocations
    alloc_core: int = 0  # percent held by allocations
    instances: int = 0

    @property
    def gib(self) -> int:
        return self.total_mem // GIB

    def units(self, resource: Resource) -> int:
        return units_of(self.total_mem, resource)

    def free(self, resource: Resource) -> int:
        """Units of ``resource`` arbiterd would still accept on this card."""
        if resource is Resource.MEM:
            return max(0, min(self.gib, (self.total_mem - self.alloc_mem) // GIB))
        return max(0, CORE_UNITS - self.alloc_core)

    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


@dataclass(frozen=True, slots=True)
class DaemonAllocation:
    """An allocation as arbiterd holds it."""

    id: str
    gpus: tuple[int, ...]
    memsize: tuple[int, ...]
    core: int
    bound: str | None


@dataclass(frozen=True, slots=True)
class NodeView:
    cards: tuple[Card, ...]
    allocations: tuple[DaemonAllocation, ...]
    pid: int | None = None

    def by_uuid(self) -> dict[str, Card]:
        return {c.uuid: c for c in self.cards}


def _int(where: str, doc: Mapping[str, Any], key: str) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise StatusError(f"arbiterd status: {where} has no integer {key!r} (got {v!r}); "
                          "this arbiterd may predate allocation support (alloc_ctl)")
    return v


def parse_status(doc: Mapping[str, Any]) -> NodeView:
    """The parts of a ``/v1/status`` document the plugin uses; raise StatusError if any is missing."""
    gpus = doc.get("gpus")
    allocs = doc.get("allocations")
    if not isinstance(gpus, list):
        raise StatusError("arbiterd status: no 'gpus' list")
    if not isinstance(allocs, list):
        raise StatusError("arbiterd status: no 'allocations' list; this arbiterd predates allocation support "
                          "(alloc_ctl)")
    cards = []
    for g in gpus:
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str):
            raise StatusError(f"arbiterd status: a GPU entry has no uuid: {g!r}")
        where = f"GPU {g.get('index')}"
        insts = g.get("instances")
        cards.append(Card(_int(where, g, "index"), g["uuid"], _int(where, g, "total_mem"),
                          _int(where, g, "alloc_mem"), _int(where, g, "alloc_core"),
                          len(insts) if isinstance(insts, list) else 0))
    allocations = []
    for a in allocs:
        if not isinstance(a, dict) or not isinstance(a.get("id"), str):
            raise StatusError(f"arbiterd status: an allocation has no id: {a!r}")
        where = f"allocation {a['id']}"
        gpu_list, mem_list = a.get("gpus"), a.get("memsize", [])
        if not isinstance(gpu_list, list) or not all(isinstance(i, int) for i in gpu_list):
            raise StatusError(f"arbiterd status: {where} has no 'gpus' list")
        if not isinstance(mem_list, list) or not all(isinstance(i, int) for i in mem_list):
            raise StatusError(f"arbiterd status: {where} has a bad 'memsize' {mem_list!r}")
        bound = a.get("bound")
        allocations.append(DaemonAllocation(a["id"], tuple(gpu_list), tuple(mem_list), _int(where, a, "core"),
                                            bound if isinstance(bound, str) else None))
    pid = doc.get("pid")
    return NodeView(tuple(sorted(cards, key=lambda c: c.index)), tuple(allocations),
                    pid if isinstance(pid, int) and not isinstance(pid, bool) else None)
