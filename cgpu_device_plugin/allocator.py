"""Provisioning: turns the kubelet's device IDs into arbiterd allocations, and keeps the two in step.

How this works
--------------
Every call holds one lock, so the status it reads is still true when it creates.

* ``preferred`` (GetPreferredAllocation) first reaps allocations whose devices the kubelet
  now lists as available (their pods are gone), then places the request on the live status.
* ``allocate`` (Allocate) reaps allocations that own any of the handed-out IDs, re-reads the
  status, checks the IDs (``placement.plan_allocation``), writes the token directory and
  the record, and only then asks arbiterd to create the allocation; if arbiterd refuses,
  the record and directory go again and the kubelet gets arbiterd's reason.
* ``resync`` runs whenever arbiterd (re)appears: records arbiterd lacks are created again
  with the same token (and their pod's names), and ``mem-``/``core-`` allocations nobody recorded
  are removed.
* ``label`` (every poll of the kubelet's PodResources API, podresources.py) names in arbiterd the
  pod and container of each recorded allocation whose devices a container holds, once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from arbiterd.core.podlabels import PodLabels
from cgpu_device_plugin import placement, podlimits
from cgpu_device_plugin.admin import AdminClient, Refused, Unreachable
from cgpu_device_plugin.config import Config
from cgpu_device_plugin.container import ContainerSetup, container_setup
from cgpu_device_plugin.devices import GIB, Resource
from cgpu_device_plugin.node import NodeView, StatusError
from cgpu_device_plugin.pairing import Pairing
from cgpu_device_plugin.placement import Refusal
from cgpu_device_plugin.store import ALLOC_ID, AllocationStore, Record, new_alloc_id

log = logging.getLogger("cgpu_device_plugin.allocator")


def _gpus(rec: Record) -> str:
    return ",".join(str(g) for g in rec.gpus)


class Allocator:
    def __init__(self, cfg: Config, admin: AdminClient, store: AllocationStore,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.admin = admin
        self.store = store
        self.clock = clock
        self.pairing = Pairing(cfg.pair_window_s)
        self.on_unreachable: Callable[[], None] = lambda: None  # the monitor re-polls at once
        self._lock = threading.Lock()
        self._limit_refused: set[tuple[str, int]] = set()  # (allocation, limit) arbiterd refused: not asked again

    # ------------------------------------------------------------ helpers
    def _node(self) -> NodeView:
        try:
            return self.admin.node()
        except Unreachable as exc:
            self.on_unreachable()
            raise Refusal(str(exc)) from None
        except StatusError as exc:
            raise Refusal(str(exc)) from None

    def _reap(self, records: Iterable[Record], why: str) -> None:
        for rec in records:
            try:
                known = self.admin.remove_allocation(rec.alloc_id)
            except (Unreachable, Refused) as exc:
                raise Refusal(f"cannot remove dead allocation {rec.alloc_id} from arbiterd: {exc}") from None
            self.store.remove(rec.alloc_id)
            log.info("allocation %s (%s on GPU %s) is dead: %s; removed%s", rec.alloc_id, rec.resource.resource_name,
                     _gpus(rec), why, "" if known else " (arbiterd no longer had it)")

    # ------------------------------------------------------------ GetPreferredAllocation
    def preferred(self, resource: Resource, available: Sequence[str], must_include: Sequence[str],
                  size: int) -> list[str]:
        with self._lock:
            must = set(must_include)
            self._reap(self.store.owners(i for i in available if i not in must),
                       "the kubelet lists its devices as free")
            node = self._node()
            hint = self.pairing.hint(resource, self.clock())
            ids = placement.preferred(resource, size, available, must_include, node.cards, self.cfg.placement,
                                      hint.card if hint else None)
            cards = sorted({i.rsplit(f"-{resource.value}-", 1)[0] for i in ids})
            log.debug("%s: %d preferred on %s%s", resource.resource_name, size,
                      ", ".join(c.label() for c in node.cards if c.uuid in cards) or "no GPU (none fits)",
                      f" (allocation {hint.alloc_id} is on GPU {hint.card})" if hint else "")
            return ids

    # ------------------------------------------------------------ Allocate
    def allocate(self, resource: Resource, requests: Sequence[Sequence[str]]) -> list[ContainerSetup]:
        """One setup per container request; all or nothing (a refusal undoes the ones made)."""
        with self._lock:
            done: list[ContainerSetup] = []
            try:
                for ids in requests:
                    done.append(self._allocate_one(resource, list(ids)))
            except Refusal:
                for setup in done:
                    self._undo(setup.alloc_id)
                raise
            return done

    def _allocate_one(self, resource: Resource, ids: list[str]) -> ContainerSetup:
        self._reap(self.store.owners(ids), "the kubelet handed its devices to a new container")
        node = self._node()
        plan = placement.plan_allocation(resource, ids, node.cards)
        if not os.path.isfile(self.cfg.libcgpu):
            raise Refusal(f"libcgpu.so is not at {self.cfg.libcgpu} on this node (the DaemonSet's init container "
                          "installs it)")
        alloc_id = new_alloc_id(resource)
        gpus = tuple(c.index for c in plan.cards)
        memsize = tuple(n * GIB for n in plan.units) if resource is Resource.MEM else ()
        core = plan.total if resource is Resource.CORE else 0
        try:
            digest = self.store.create_token(alloc_id)
            self.store.add(Record(alloc_id, resource, tuple(ids), gpus, memsize, core, time.time()))
        except OSError as exc:
            self.store.remove(alloc_id)
            raise Refusal(f"cannot write allocation {alloc_id} under {self.cfg.alloc_dir}: {exc}") from None
        try:
            self.admin.create_allocation(alloc_id, digest, gpus, memsize, core)
        except (Unreachable, Refused) as exc:
            self.store.remove(alloc_id)
            if isinstance(exc, Unreachable):
                self.on_unreachable()
            raise Refusal(f"arbiterd refused allocation {alloc_id} ({plan.describe()}): {exc}") from None
        partner = self.pairing.allocated(resource, alloc_id, gpus[0] if len(gpus) == 1 else None, self.clock())
        if partner is not None and (len(gpus) != 1 or partner.card != gpus[0]):
            log.info("allocation %s on GPU %s: the last %s allocation, %s, is on GPU %d; if both are one "
                     "container's, arbiterd will refuse it when it binds", alloc_id, ",".join(map(str, gpus)),
                     resource.other.resource_name, partner.alloc_id, partner.card)
        log.info("allocation %s: %s%s", alloc_id, plan.describe(),
                 f" (beside {partner.alloc_id})" if partner and gpus == (partner.card,) else "")
        return container_setup(self.cfg, plan, alloc_id)

    def _undo(self, alloc_id: str) -> None:
        try:
            self.admin.remove_allocation(alloc_id)
        except (Unreachable, Refused) as exc:
            log.error("allocation %s: could not undo it in arbiterd (%s); it is removed when arbiterd is back",
                      alloc_id, exc)
        self.store.remove(alloc_id)
        log.info("allocation %s undone: another container of the same request was refused", alloc_id)

    # ------------------------------------------------------------ keeping arbiterd and the records in step
    def recover(self) -> None:
        """At start: delete token directories that no record owns."""
        with self._lock:
            for alloc_id in self.store.stray_dirs():
                self.store.remove_dir(alloc_id)
                log.warning("allocation %s: removed its directory, which no record owned", alloc_id)

    def resync(self, node: NodeView) -> None:
        """Make arbiterd hold exactly the recorded allocations (raises Unreachable if it goes away)."""
        with self._lock:
            held = {a.id for a in node.allocations}
            for rec in self.store.records.values():
                if rec.alloc_id in held:
                    continue
                try:
                    digest = self.store.token_sha(rec.alloc_id)
                except OSError as exc:
                    self.store.remove(rec.alloc_id)
                    log.error("allocation %s (GPU %s): its token is unreadable (%s); dropped it", rec.alloc_id,
                              _gpus(rec), exc)
                    continue
                try:
                    self.admin.create_allocation(rec.alloc_id, digest, rec.gpus, rec.memsize, rec.core,
                                                 limit=rec.limit, labels=rec.labels)
                    log.info("allocation %s (GPU %s): created again in arbiterd, which did not have it",
                             rec.alloc_id, _gpus(rec))
                except Refused as exc:
                    log.error("allocation %s (GPU %s): arbiterd refuses to create it again: %s; its container "
                              "will be refused until its pod is gone", rec.alloc_id, _gpus(rec), exc)
            for a in node.allocations:
                if ALLOC_ID.fullmatch(a.id) and self.store.get(a.id) is None:
                    self.admin.remove_allocation(a.id)
                    log.warning("allocation %s (GPU %s): arbiterd held it but this plugin has no record of it; "
                                "removed", a.id, ",".join(map(str, a.gpus)))

    # ------------------------------------------------------------ pod names (the kubelet's PodResources API)
    def label(self, holders: Mapping[str, PodLabels]) -> int:
        """Name in arbiterd the pod of each recorded allocation whose devices ``holders`` (device ID -> labels)
        shows a container holding, where its record does not have those names yet; how many were named. Raises
        nothing: arbiterd away or refusing leaves the record unnamed, and the next poll tries again.

        The allocator's lock is held only to pick the records and to store each name, never across a call to
        arbiterd: an ``Allocate`` waits for no batch of names (held across them, it read a p99 of 60 ms, 18 without
        the labeller)."""
        with self._lock:
            todo = [(rec, labels) for rec in self.store.records.values()
                    if (labels := next((holders[d] for d in rec.devices if d in holders), None)) is not None
                    and labels != rec.labels]
        named = 0
        for rec, labels in todo:
            try:
                self.admin.label_allocation(rec.alloc_id, labels)
            except Unreachable as exc:
                log.warning("allocation %s (GPU %s): cannot name its pod %s in arbiterd: %s", rec.alloc_id,
                            _gpus(rec), labels.text(), exc)
                return named
            except Refused as exc:
                log.warning("allocation %s (GPU %s): arbiterd refused its pod's names %s: %s", rec.alloc_id,
                            _gpus(rec), labels.text(), exc)
                continue
            with self._lock:
                self.store.set_labels(rec.alloc_id, labels)  # nothing where it was released meanwhile
            named += 1
            log.info("allocation %s (%s on GPU %s) is pod %s's", rec.alloc_id, rec.resource.resource_name,
                     _gpus(rec), labels.text())
        return named

    # ------------------------------------------------------------ limits (the pods' cgpu.io/core-limit annotations)
    def limit(self, limits: Mapping[tuple[str, str, str], int]) -> int:
        """Set in arbiterd the ceiling of each named core allocation whose container ``limits`` (namespace, pod,
        container -> %) gives one other than its record's (none: 0, its core percentage caps it again); how many
        changed. Raises nothing, and holds the lock as :meth:`label` does: arbiterd away leaves the rest for the
        next poll; a refusal (a limit below the request, or a card that cannot honour it) is logged once."""
        with self._lock:
            records = self.store.records
            self._limit_refused = {r for r in self._limit_refused if r[0] in records}  # gone: forgotten
            todo = [(rec, want) for rec in records.values()
                    if rec.resource is Resource.CORE and rec.labels is not None
                    and (want := limits.get(podlimits.key(rec.labels), 0)) != rec.limit
                    and (rec.alloc_id, want) not in self._limit_refused]
        changed = 0
        for rec, want in todo:
            what = f"limit {want} %" if want else "no limit"
            try:  # arbiterd checks it (below the request, a card that cannot honour it) and says why
                self.admin.limit_allocation(rec.alloc_id, want)
            except Unreachable as exc:
                log.warning("allocation %s (GPU %s): cannot set %s in arbiterd: %s", rec.alloc_id, _gpus(rec), what,
                            exc)
                return changed
            except Refused as exc:
                self._limit_refused.add((rec.alloc_id, want))
                log.warning("allocation %s (pod %s, GPU %s): %s from %s is refused: %s; its core percentage "
                            "stays its cap", rec.alloc_id, rec.labels.text() if rec.labels else "?", _gpus(rec),
                            what, podlimits.ANNOTATION, exc)
                continue
            with self._lock:
                self.store.set_limit(rec.alloc_id, want)
            changed += 1
            log.info("allocation %s (pod %s, GPU %s): %s (%s)", rec.alloc_id,
                     rec.labels.text() if rec.labels else "?", _gpus(rec), what, podlimits.ANNOTATION)
        return changed
