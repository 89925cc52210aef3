"""Allocations: GPU memory and GPU-core percentages sold to containers by a trusted party.

A device plugin (or an operator) creates an allocation through ``alloc_ctl``
before its container starts: an id, the card(s), memory per card and/or a core
percentage, and the SHA-256 of a secret token that only that container can read
(a file mounted into it). arbiterd never sees the token itself. When a process
of the container registers, the daemon reads the token through the process's
``/proc/<pid>/root`` and *binds* the allocation to that container; from then on
the allocation is the container's settings, whatever its environment says.

The book only keeps the records and refuses what would overcommit a card; the
binding rules are in :mod:`arbiterd.core.binding`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from arbiterd.core import podlabels
from arbiterd.core.errors import ConflictError, NotFoundError, SettingError
from arbiterd.core.names import valid_alloc_id, valid_instance_id
from arbiterd.core.podlabels import PodLabels

DIGEST = re.compile(r"[0-9a-f]{64}")
CORE_TOTAL = 100  # a card's compute, in percent


@dataclass(slots=True)
class Allocation:
    """One allocation: memory per card (bytes; 0 = none) and a core percentage on its card(s)."""

    id: str
    digest: str  # SHA-256 (hex) of the token's stripped text
    gpus: tuple[int, ...]
    memsize: tuple[int, ...]  # one per GPU, bytes
    core: int = 0  # percent of each of its GPUs
    bound: str | None = None  # the instance (container) it is bound to
    pod: str | None = None  # that container's pod UID, when it has one
    weight: int = 0  # the container's weight on its GPU(s) (policies 2 and 4); 0: the default
    highprio: bool = False  # the container is high priority
    limit: int = 0  # the most GPU time (%) the container may use (0: none; a core percentage caps by itself)
    labels: PodLabels | None = None  # its container's namespace, pod and container, as the plugin says

    def mem_on(self, gpu: int) -> int:
        return sum(m for g, m in zip(self.gpus, self.memsize, strict=True) if g == gpu)

    def line(self) -> str:
        """The ``alloc_ctl`` listing line."""
        return (f"{self.id} gpu={','.join(map(str, self.gpus))} memsize={','.join(map(str, self.memsize))} "
                f"core={self.core}{f' weight={self.weight}' if self.weight else ''}"
                f"{' highprio=1' if self.highprio else ''}{f' limit={self.limit}' if self.limit else ''}"
                f"{f' {self.labels.words()}' if self.labels else ''} bound={self.bound or '-'}")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "gpus": list(self.gpus), "memsize": list(self.memsize), "core": self.core,
                "weight": self.weight, "highprio": int(self.highprio), "bound": self.bound,
                "labels": self.labels.to_json() if self.labels else None,
                **({"limit": self.limit} if self.limit else {})}


def valid_digest(text: object) -> str:
    if not isinstance(text, str) or not DIGEST.fullmatch(text):
        raise SettingError("token= must be the SHA-256 of the token, 64 lowercase hex digits")
    return text


class AllocationBook:
    """Every allocation of the node, by id and by token digest."""

    def __init__(self) -> None:
        self.by_id: dict[str, Allocation] = {}

    def __iter__(self) -> Any:
        return iter(sorted(self.by_id.values(), key=lambda a: a.id))

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, alloc_id: str) -> Allocation:
        try:
            return self.by_id[alloc_id]
        except KeyError:
            raise NotFoundError(f"no allocation {alloc_id}") from None

    def by_digest(self, digests: Iterable[str]) -> list[Allocation]:
        """The allocations whose token digest is among ``digests``, by id."""
        want = set(digests)
        return [a for a in self if a.digest in want]

    def bound_to(self, instance: str) -> list[Allocation]:
        return [a for a in self if a.bound == instance]

    def labels_of(self, instance: str) -> PodLabels | None:
        """The pod labels of the allocations bound to ``instance`` (the first by id that has any), or None."""
        return next((a.labels for a in self.bound_to(instance) if a.labels is not None), None)

    def alloc_mem(self, gpu: int) -> int:
        """Bytes of ``gpu`` held by allocations."""
        return sum(a.mem_on(gpu) for a in self.by_id.values())

    def alloc_core(self, gpu: int) -> int:
        """Percent of ``gpu`` held by allocations."""
        return sum(a.core for a in self.by_id.values() if gpu in a.gpus)

    def create(self, alloc: Allocation, totals: Mapping[int, int]) -> None:
        """Add ``alloc``; raise ConflictError if its id or token exists or a card would be overcommitted.

        ``totals``: each GPU's memory in bytes.
        """
        self.check_create(alloc, totals)
        self.by_id[alloc.id] = alloc

    def check_create(self, alloc: Allocation, totals: Mapping[int, int]) -> None:
        """Raise ConflictError (one line) if ``alloc`` may not be added; change nothing."""
        if alloc.id in self.by_id:
            raise ConflictError(f"allocation {alloc.id} exists")
        if any(a.digest == alloc.digest for a in self.by_id.values()):
            raise ConflictError(f"allocation {alloc.id}: another allocation has the same token")
        for gpu in alloc.gpus:
            mem, held = alloc.mem_on(gpu), self.alloc_mem(gpu)
            if held + mem > totals[gpu]:
                raise ConflictError(f"GPU {gpu}: memsize {mem} would overcommit it ({held} of {totals[gpu]} "
                                    "bytes allocated)")
            core = self.alloc_core(gpu)
            if core + alloc.core > CORE_TOTAL:
                raise ConflictError(f"GPU {gpu}: core={alloc.core} would overcommit it ({core} % allocated)")

    def remove(self, alloc_id: str) -> Allocation:
        alloc = self.get(alloc_id)
        del self.by_id[alloc_id]
        return alloc

    # ------------------------------------------------------------ state file
    def snapshot(self) -> list[dict[str, Any]]:
        return [{**a.to_json(), "token": a.digest, "pod": a.pod} for a in self]

    def restore_one(self, item: Any, totals: Mapping[int, int]) -> None:
        """Re-create one saved allocation (raises a CoreError, KeyError, TypeError or ValueError if it is bad)."""
        gpus = tuple(int(g) for g in item["gpus"])
        bound, pod = item.get("bound"), item.get("pod")
        memsize = tuple(int(m) for m in item["memsize"])
        if len(memsize) != len(gpus) or any(m < 0 for m in memsize) or not 0 <= int(item["core"]) <= CORE_TOTAL:
            raise SettingError("memsize or core out of range")
        self.create(Allocation(valid_alloc_id(item["id"]), valid_digest(item["token"]), gpus, memsize,
                               int(item["core"]), valid_instance_id(bound) if bound is not None else None,
                               str(pod) if pod is not None else None, int(item.get("weight", 0)),
                               bool(item.get("highprio", 0)), int(item.get("limit", 0)),
                               podlabels.from_json(item.get("labels"))), totals)
