"""``alloc_ctl``: creating and removing allocations through the settings tree.

    create ID token=SHA256 gpu=I[,J] [memsize=SIZE[,SIZE]] [core=P | weight=N] [limit=P] [highprio=0|1]
           [namespace=NS pod=NAME [container=NAME]]
    label ID namespace=NS pod=NAME [container=NAME]
    limit ID P|none
    remove ID

``token`` is the SHA-256 (hex) of the token the container will hold; ``memsize``
is per GPU (the last repeats); ``core`` a percentage of each GPU, a multiple
of 5. At least one of ``memsize`` and ``core``. ``weight`` (1..max_inst, for policies 2 and 4)
and ``highprio`` are the container's scheduling settings, enforced as ``inst_ctl``'s are (a DRA claim's
ShareConfig carries them); ``weight`` and ``core`` exclude each other, as in ``inst_ctl``. ``limit``
(5..100, not below ``core``) is the container's ceiling beside its request (behaviour §3): a core
percentage with a limit above it is held on policy 4, without one on policy 3.
A create that would overcommit a card's memory or core, or whose id or token exists, is refused (409).
``namespace``, ``pod`` and ``container`` are the Kubernetes names of the container the allocation is for
(:mod:`arbiterd.core.podlabels` checks them); a plugin gives them at create, or later with ``label`` (the
device plugin learns them from the kubelet after ``Allocate``), and the instance the allocation binds to
carries them, in ``status``, ``cgpu-smi`` and the metrics, until the allocation is removed.
``limit`` sets an allocation's ceiling later, or (``none``) takes it back to its core percentage's cap (none at all
without one): the device plugin learns a container's limit
from its pod's ``cgpu.io/core-limit`` annotation after ``Allocate``, as it learns its names. It is checked as at
create, and against the card (its bound container re-provisioned with it, or nothing changes).
Removing a bound allocation re-provisions its container. Reading the file
lists the allocations, one a line:
``ID gpu=0 memsize=BYTES core=P [namespace=NS pod=NAME container=NAME] bound=<container|->``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from arbiterd.core import binding, podlabels
from arbiterd.core.allocations import Allocation, valid_digest
from arbiterd.core.arbiter import Arbiter
from arbiterd.core.effects import Effect
from arbiterd.core.errors import ConflictError, SettingError
from arbiterd.core.instctl import parse_gpus
from arbiterd.core.names import valid_alloc_id
from arbiterd.core.settings import INSTANCE, parse_size

USAGE = ("alloc_ctl: expected 'create ID token=SHA256 gpu=I[,J] [memsize=SIZE[,SIZE]] [core=P | weight=N] "
         "[limit=P] [highprio=0|1] [namespace=NS pod=NAME [container=NAME]]', 'label ID namespace=NS pod=NAME "
         "[container=NAME]', 'limit ID P|none' or 'remove ID'")
_CREATE_KEYS = ("token", "gpu", "memsize", "core", "weight", "highprio", "limit", *podlabels.KEYS)


def listing(arb: Arbiter) -> str:
    return "".join(a.line() + "\n" for a in arb.allocations)


def _options(verb: str, words: list[str], keys: tuple[str, ...]) -> dict[str, str]:
    """``key=value`` words, each key among ``keys`` and given once (a SettingError naming the first that is not)."""
    opts: dict[str, str] = {}
    for word in words:
        key, sep, val = word.partition("=")
        if not sep or key not in keys or key in opts:
            raise SettingError(f"alloc_ctl {verb}: unexpected {word!r}")
        opts[key] = val
    return opts


def _parse_create(arb: Arbiter, alloc_id: str, words: list[str]) -> tuple[Allocation, dict[int, int]]:
    """The allocation a ``create`` describes, and its GPUs' memory (a CoreError if it is malformed)."""
    if arb.config.allocations == "off":
        raise ConflictError("alloc_ctl: allocations are off in this daemon (start it with --allocations "
                            "optional or required)")
    opts = _options("create", words, _CREATE_KEYS)
    if "token" not in opts or "gpu" not in opts:
        raise SettingError("alloc_ctl create: token= and gpu= are required")
    digest = valid_digest(opts["token"])
    gpus = parse_gpus(arb, opts["gpu"])
    if len(set(gpus)) != len(gpus):
        raise SettingError(f"alloc_ctl create: gpu={opts['gpu']} names a GPU twice")
    sizes = [parse_size("memsize", m) for m in opts["memsize"].split(",")] if "memsize" in opts else []
    if len(sizes) > len(gpus) or any(m <= 0 for m in sizes):
        raise SettingError(f"alloc_ctl create: memsize={opts['memsize']}: one positive size per GPU")
    sizes += [sizes[-1] if sizes else 0] * (len(gpus) - len(sizes))
    core = INSTANCE["core_percent"].parse(opts["core"]) if "core" in opts else 0
    if not any(sizes) and not core:
        raise SettingError("alloc_ctl create: give memsize= or core= (or both)")
    if core and len(gpus) > 1:
        raise SettingError("alloc_ctl create: core= is a percentage of one GPU; give one gpu=")
    if core and "weight" in opts:
        raise SettingError("alloc_ctl create: give weight=N or core=P (a GPU-core percentage), not both")
    weight = INSTANCE["weight"].parse(opts["weight"]) if "weight" in opts else 0
    highprio = INSTANCE["highprio"].parse(opts["highprio"]) if "highprio" in opts else 0
    limit = INSTANCE["limit"].parse(opts["limit"]) if "limit" in opts else 0
    if limit and limit < core:
        raise SettingError(f"alloc_ctl create: limit={limit} is below core={core}: a limit is a ceiling above the "
                           "request")
    for gpu in gpus if weight else ():
        if weight > arb.scheds[gpu].settings.max_inst:
            raise SettingError(f"alloc_ctl create: weight={weight} is over GPU {gpu}'s max_inst "
                               f"{arb.scheds[gpu].settings.max_inst}")
    labels = podlabels.from_words(opts)
    return (Allocation(alloc_id, digest, tuple(gpus), tuple(sizes), core, weight=weight, highprio=bool(highprio),
                       limit=limit, labels=labels), {g: arb.gpus[g].total_mem for g in gpus})


def _plan_limit(arb: Arbiter, alloc: Allocation, words: list[str]) -> Callable[[int], list[Effect]]:
    """``limit ID P|none``: the allocation's new ceiling, checked against its core and, where it is bound, against
    its container's records on the card (a CoreError naming why, and nothing changes)."""
    if len(words) != 1:
        raise SettingError("alloc_ctl limit: expected 'limit ID P' (5..100) or 'limit ID none'")
    # none: no ceiling, but a core percentage caps by itself (on a card a limit moved to policy 4 as well)
    limit = alloc.core if words[0] == "none" else INSTANCE["limit"].parse(words[0])
    if limit and limit < alloc.core:
        raise SettingError(f"alloc_ctl limit: {limit} is below allocation {alloc.id}'s core={alloc.core}: a limit is "
                           "a ceiling above the request")
    if alloc.bound is not None:
        others = [a for a in arb.allocations.bound_to(alloc.bound) if a.id != alloc.id]
        arb.check_provision(alloc.bound, binding.settings_of([*others, dataclasses.replace(alloc, limit=limit)]))

    def set_limit(now: int) -> list[Effect]:
        alloc.limit = limit
        return binding.reprovision(arb, alloc.bound, now) if alloc.bound is not None else []

    return set_limit


def run(arb: Arbiter, command: str, now: int) -> list[Effect]:
    """Carry out one ``alloc_ctl`` command."""
    return plan(arb, command)(now)


def plan(arb: Arbiter, command: str) -> Callable[[int], list[Effect]]:
    """Check one ``alloc_ctl`` command, changing nothing (a CoreError with a one-line reason if it may not be
    carried out), and return what carries it out."""
    words = command.split()
    if len(words) < 2 or words[0] not in ("create", "label", "limit", "remove"):
        raise SettingError(USAGE)
    verb, alloc_id, rest = words[0], valid_alloc_id(words[1]), words[2:]
    book = arb.allocations
    if verb == "create":
        alloc, totals = _parse_create(arb, alloc_id, rest)
        book.check_create(alloc, totals)

        def create(now: int) -> list[Effect]:
            book.create(alloc, totals)
            return []

        return create
    if verb == "label":
        labels = podlabels.from_words(_options("label", rest, podlabels.KEYS))
        if labels is None:
            raise SettingError("alloc_ctl label: give namespace=NS pod=NAME [container=NAME]")
        alloc = book.get(alloc_id)

        def label(now: int) -> list[Effect]:
            alloc.labels = labels
            if alloc.bound is not None:
                binding.relabel(arb, alloc.bound)
            return []

        return label
    if verb == "limit":
        return _plan_limit(arb, book.get(alloc_id), rest)
    if rest:
        raise SettingError("alloc_ctl remove: takes only an id")
    book.get(alloc_id)

    def remove(now: int) -> list[Effect]:
        alloc = book.remove(alloc_id)
        return binding.reprovision(arb, alloc.bound, now) if alloc.bound else []

    return remove


__all__ = ["USAGE", "listing", "plan", "run"]
