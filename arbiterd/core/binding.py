"""Binding allocations to the container that presents their tokens, and provisioning it from them.

With ``allocations`` on (``optional`` or ``required``), a registering process
is a :class:`Claimant`: its instance (container) id, its pod, and the digests
of the tokens found in its own filesystem (the server reads them; the core
never does I/O). :func:`bind` then decides:

* the first container to present an allocation's token binds it;
* another container presenting it is refused, unless it belongs to the same
  pod and the bound container has no client left (the kubelet restarted a
  crashed container under a new id, and never calls the plugin again);
* memory and core of one container must be on the same GPU(s);
* with ``required``, a process in a container that presents no valid token
  is refused (processes outside containers are the host's, and pass).

A bound container's instance records are provisioned from its allocations
(memory per GPU; a core percentage as weight P/5;
an allocation's weight and high priority as they are), so its environment changes
nothing. :func:`reprovision` keeps them in step when allocations come and go, and
:func:`relabel` gives them the pod labels their allocations carry (a plugin sets those through
``alloc_ctl``; nothing a container sends can), so they end with the last allocation.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from arbiterd.core.allocations import Allocation
from arbiterd.core.arbiter import Arbiter
from arbiterd.core.effects import Effect
from arbiterd.core.errors import IdentityError
from arbiterd.core.settings import NO_LIMIT, UNCAPPED, InstanceSettings

log = logging.getLogger("arbiterd.core")


@dataclass(frozen=True, slots=True)
class Claimant:
    """A registering process, as far as allocations are concerned."""

    instance: str
    container: str | None  # the container id, None for a process outside containers
    pod: str | None = None  # the pod UID from its cgroup, when it has one
    digests: frozenset[str] = frozenset()  # SHA-256 of each token it presented
    where: str = "/run/cgpu-alloc"  # where it was looked for, for messages


@dataclass(slots=True)
class Bound:
    """The outcome of a bind: the container's GPUs and what changed."""

    gpus: list[int]
    allocations: list[str]
    changed: bool
    effects: list[Effect] = field(default_factory=list)


def settings_of(allocs: Iterable[Allocation]) -> dict[int, InstanceSettings]:
    """Per GPU, the instance settings that ``allocs`` add up to."""
    mem: dict[int, int] = defaultdict(int)
    core: dict[int, int] = defaultdict(int)
    weight: dict[int, int] = defaultdict(int)
    highprio: dict[int, int] = defaultdict(int)
    limit: dict[int, int] = defaultdict(int)
    limited: set[int] = set()
    for a in allocs:
        for gpu, m in zip(a.gpus, a.memsize, strict=True):
            mem[gpu] += m
            core[gpu] += a.core
            weight[gpu] += a.weight
            highprio[gpu] |= int(a.highprio)
            if a.core or a.weight or a.limit:  # memory alone (the device plugin's gpu-mem) asks no time
                limit[gpu] += a.limit or a.core or NO_LIMIT  # a core percentage without a limit is its own cap
            if a.limit:
                limited.add(gpu)
    def ceiling(gpu: int) -> int:  # a core percentage given limits that add up to 100 or more: no ceiling, not its cap
        if gpu not in limited:
            return NO_LIMIT
        return UNCAPPED if limit[gpu] >= NO_LIMIT and core[gpu] else min(limit[gpu], NO_LIMIT)

    return {gpu: InstanceSettings(weight=weight[gpu] or 1, highprio=highprio[gpu], core_percent=core[gpu],
                                  memsize=mem[gpu], limit=ceiling(gpu))
            for gpu in sorted(mem)}


def in_use(arb: Arbiter, instance: str) -> bool:
    """Whether any client is registered as ``instance``."""
    return any(r.clients for (_, name), r in arb.records.items() if name == instance)


def reprovision(arb: Arbiter, instance: str, now: int) -> list[Effect]:
    """Make ``instance``'s provisioned records what its bound allocations say (none: dropped), labels included."""
    want = settings_of(arb.allocations.bound_to(instance))
    have = [g for (g, name), r in arb.records.items() if name == instance and r.provisioned]
    effects = arb.drop_records(instance, [g for g in have if g not in want], now)
    if want:
        effects += arb.provision_each(instance, want, now)
    relabel(arb, instance)
    return effects


def relabel(arb: Arbiter, instance: str) -> None:
    """Give every record of ``instance`` the pod labels of its bound allocations (None when it has none)."""
    labels = arb.allocations.labels_of(instance)
    for (_, name), rec in arb.records.items():
        if name == instance:
            rec.labels = labels


def _check_one_gpu(allocs: list[Allocation]) -> None:
    mem = sorted({g for a in allocs for g, m in zip(a.gpus, a.memsize, strict=True) if m})
    core = sorted({g for a in allocs if a.core for g in a.gpus})
    if mem and set(core) - set(mem):
        raise IdentityError(
            f"allocations {', '.join(a.id for a in allocs)} put memory on GPU {','.join(map(str, mem))} and "
            f"GPU-core on GPU {','.join(map(str, core))}: a container's memory and core must be on the same GPU")


def claim(arb: Arbiter, who: Claimant) -> tuple[list[Allocation], set[str]] | None:
    """The allocations ``who`` presents and the containers it takes them over from (a restarted container of the
    same pod); None when none apply. Raises IdentityError when it is refused. Changes nothing."""
    mode = arb.config.allocations
    if mode == "off":
        return None
    allocs = arb.allocations.by_digest(who.digests)
    if not allocs:
        if mode == "required" and who.container is not None:
            what = ("the token(s) there match no allocation of this node" if who.digests
                    else "none was found there")
            raise IdentityError(f"container {who.instance}: no valid allocation token under {who.where} ({what}); "
                                "this node requires an allocation (from cgpu-device-plugin) for every container")
        return None
    takeover = set()
    for a in allocs:
        if a.bound is None or a.bound == who.instance:
            continue
        if who.pod is not None and a.pod == who.pod and not in_use(arb, a.bound):
            takeover.add(a.bound)  # a restarted container of the same pod
            continue
        raise IdentityError(f"allocation {a.id} is bound to another container ({a.bound}); container "
                            f"{who.instance} may not use it")
    _check_one_gpu(allocs)
    return allocs, takeover


def check(arb: Arbiter, who: Claimant) -> None:
    """Raise a CoreError (one line) if ``who`` may not bind what it presents, or its records may not be provisioned
    from them; change nothing."""
    claimed = claim(arb, who)
    if claimed is None:
        return
    allocs, takeover = claimed
    ids = {a.id for a in allocs}
    freed: dict[int, int] = defaultdict(int)  # weight the containers taken over from give up, by GPU
    for old in takeover:
        keep = settings_of(a for a in arb.allocations.bound_to(old) if a.id not in ids)
        for (gpu, name), rec in arb.records.items():
            if name == old and rec.provisioned:
                freed[gpu] += arb.scheds[gpu].instances[name].weight - (keep[gpu].weight if gpu in keep else 0)
    mine = [a for a in arb.allocations.bound_to(who.instance) if a.id not in ids]
    arb.check_provision(who.instance, settings_of([*mine, *allocs]), freed)


def bind(arb: Arbiter, who: Claimant, now: int) -> Bound | None:
    """Bind the allocations ``who`` presents; None when none apply. Raises IdentityError when refused, and a
    CoreError when its records may not be provisioned from them: :func:`check` first, which changes nothing."""
    claimed = claim(arb, who)
    if claimed is None:
        return None
    allocs, takeover = claimed
    gpus = sorted({g for a in allocs for g in a.gpus})
    changed = any(a.bound != who.instance for a in allocs) or any((g, who.instance) not in arb.records
                                                                   for g in gpus)
    effects: list[Effect] = []
    if changed:
        for a in allocs:
            a.bound, a.pod = who.instance, who.pod
        for old in sorted(takeover):
            log.info("allocations of container %s pass to %s of the same pod (%s has no client left)",
                     old, who.instance, old)
            effects += reprovision(arb, old, now)
        effects += reprovision(arb, who.instance, now)
    return Bound(gpus, [a.id for a in allocs], changed, effects)
