"""Preparing and unpreparing claims: arbiterd allocations, token directories, CDI specs, the checkpoint.

How this works
--------------
Every call holds one lock. ``prepare`` of a claim already in the checkpoint answers from it
(the kubelet retries, and calls again after its own restart), once arbiterd is seen to hold each
of its allocations with its token on disk: one missing is created again, and if arbiterd refuses
the prepare fails with its reason. Otherwise it reads the claim from
the API server, takes this driver's devices in this node's pool (:mod:`claims`), records them
in the checkpoint, makes each token, and only then asks arbiterd to create each allocation
(``alloc_ctl create``, id derived from the claim: a retry names the same one; an allocation
arbiterd already holds under that id, left by a try whose reply was lost, is removed and created
again with the new token, so it is never created twice); if arbiterd refuses, what was made is undone and
the kubelet gets arbiterd's one-line reason. Then the CDI spec is written.

``unprepare`` removes the allocations, the token dirs, the CDI spec and the record; a claim it
does not know is already unprepared. ``resync`` runs whenever arbiterd (re)appears: recorded
allocations it lacks are created again with the same token; a ``dra-`` allocation nobody recorded
is adopted (its record rebuilt from the API server) when the API server still allocates its claim
on this node, else removed, and token directories no record owns are removed.
``collect_garbage`` unprepares claims that are gone from the API server
(deleted, or deallocated) though the kubelet never said so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from arbiterd.core.podlabels import PodLabels
from cgpu_device_plugin.admin import AdminClient, Refused, Unreachable
from cgpu_device_plugin.node import DaemonAllocation, NodeView, StatusError
from cgpu_dra_plugin import cdi
from cgpu_dra_plugin.checkpoint import ALLOC_ID, TOKEN_FILE, Checkpoint, ClaimRecord, Prepared, alloc_id
from cgpu_dra_plugin.claims import BadClaim, Grant, consumer, grants, reserved_pod
from cgpu_dra_plugin.config import Config
from cgpu_dra_plugin.kubeapi import ApiException, KubeApi
from cgpu_dra_plugin.quantity import GIB
from cgpu_dra_plugin.slices import gpu_index

log = logging.getLogger("cgpu_dra_plugin.prepare")


class PrepareError(Exception):
    """A claim cannot be prepared; the message is one line (the kubelet puts it in the pod's events)."""


def _describe(d: Prepared) -> str:
    what = f"{d.memory // GIB} GiB"
    if d.cores:
        what += f", {d.cores} % cores" + ("" if d.enforce_cores else " (reserved, not a cap)")
    if d.weight:
        what += f", weight {d.weight}"
    if d.limit:
        what += f", limit {d.limit} %"
    if d.high_priority:
        what += ", high priority"
    return f"GPU {d.gpu} ({d.device}): {what}"


class Preparer:
    def __init__(self, cfg: Config, admin: AdminClient, kube: KubeApi, checkpoint: Checkpoint) -> None:
        self.cfg = cfg
        self.admin = admin
        self.kube = kube
        self.checkpoint = checkpoint
        self._lock = threading.Lock()

    # ------------------------------------------------------------ helpers
    def _node(self) -> NodeView:
        try:
            return self.admin.node()
        except (Unreachable, StatusError) as exc:
            raise PrepareError(str(exc)) from None

    def _spec(self, rec: ClaimRecord, node: NodeView) -> None:
        totals = {c.index: c.total_mem for c in node.cards}
        cdi.write(self.cfg.cdi_dir, rec.uid, cdi.spec(rec.uid, [(d, totals.get(d.gpu, d.memory)) for d in rec.devices],
                                                       self.cfg.socket_dir, self.cfg.libcgpu, self.cfg.state_dir,
                                                       self.cfg.alloc_mount))

    def _create(self, d: Prepared, labels: PodLabels | None) -> None:
        digest = self.checkpoint.token(d.alloc_id)
        self.admin.create_allocation(d.alloc_id, digest, [d.gpu], [d.memory], d.cores if d.enforce_cores else 0,
                                     d.weight, d.high_priority, d.limit, labels)

    def _consumer(self, where: str, claim: dict[str, Any]) -> PodLabels | None:
        """The pod labels of the container ``claim`` serves (claims.consumer), reading its pod; what is not known is
        logged and left out: a pod's names never fail a prepare."""
        name = reserved_pod(claim)
        pod = None
        if name is not None:
            namespace = str(claim.get("metadata", {}).get("namespace", ""))
            try:
                pod = self.kube.get_pod(namespace, name)
            except (ApiException, OSError, ValueError) as exc:
                log.warning("%s: cannot read its pod %s/%s from the API server (%s)", where, namespace, name, exc)
        labels, why = consumer(claim, pod)
        if why:
            log.warning("%s: %s; its allocations name %s", where, why,
                        f"pod {labels.text()} and no container" if labels else "no pod")
        return labels

    def _remove(self, d: Prepared) -> None:
        try:
            self.admin.remove_allocation(d.alloc_id)  # False (404): arbiterd no longer had it, as wanted
        except (Unreachable, Refused) as exc:
            raise PrepareError(f"cannot remove allocation {d.alloc_id} from arbiterd: {exc}") from None
        self.checkpoint.remove_dir(d.alloc_id)

    # ------------------------------------------------------------ NodePrepareResources
    def prepare(self, namespace: str, uid: str, name: str) -> list[Prepared]:
        """The prepared devices of claim ``namespace/name`` (``uid``); raise PrepareError with a one-line reason."""
        with self._lock:
            rec = self.checkpoint.claims.get(uid)
            if rec is not None:
                return self._prepare_again(rec)
            return self._prepare_new(namespace, uid, name)

    def _prepare_again(self, rec: ClaimRecord) -> list[Prepared]:
        """A recorded claim: make sure arbiterd holds each allocation (a crash between the record and the create,
        or a resync arbiterd refused, leaves it missing) with a token on disk, and that the CDI spec exists."""
        where = f"claim {rec.namespace}/{rec.name}"
        node = self._node()
        held = {a.id for a in node.allocations}
        for d in rec.devices:
            has_token = (self.checkpoint.alloc_path(d.alloc_id) / TOKEN_FILE).is_file()
            if d.alloc_id in held and has_token:
                continue
            try:
                if d.alloc_id in held:  # held with a digest whose token is gone: no container can bind it
                    self.admin.remove_allocation(d.alloc_id)
                self._create(d, rec.labels)
            except (Refused, Unreachable) as exc:
                raise PrepareError(f"{where}: arbiterd lacks allocation {d.alloc_id} and refused to create it "
                                   f"again: {exc}") from None
            log.warning("claim %s (%s): arbiterd lacked allocation %s; created it again", where, rec.uid, d.alloc_id)
        if not cdi.spec_path(self.cfg.cdi_dir, rec.uid).exists():
            self._write_spec(rec, node, where)
        return list(rec.devices)

    def _write_spec(self, rec: ClaimRecord, node: NodeView, where: str) -> None:
        try:
            self._spec(rec, node)
        except OSError as exc:
            raise PrepareError(f"{where}: cannot write the CDI spec under {self.cfg.cdi_dir}: {exc}") from None

    @staticmethod
    def _devices(where: str, uid: str, mine: Sequence[Grant], node: NodeView) -> list[Prepared]:
        cards = {c.index: c for c in node.cards}
        devices = []
        for g in mine:
            try:
                index = gpu_index(g.device)
            except ValueError as exc:
                raise PrepareError(f"{where}: {exc}") from None
            card = cards.get(index)
            if card is None:
                raise PrepareError(f"{where}: device {g.device} is not on this node any more (arbiterd has no "
                                   f"GPU {index})")
            devices.append(Prepared(alloc_id(uid, g.request, g.device), g.request, g.pool, g.device, index, card.uuid,
                                    g.memory, g.cores, g.config.enforce_cores, g.config.weight,
                                    g.config.high_priority, cdi.cdi_id(uid, g.device), g.config.limit))
        return devices

    def _prepare_new(self, namespace: str, uid: str, name: str) -> list[Prepared]:
        where = f"claim {namespace}/{name}"
        try:
            claim = self.kube.get_claim(namespace, name)
        except (ApiException, OSError, ValueError) as exc:
            raise PrepareError(f"{where}: cannot read it from the API server: {exc}") from None
        if claim is None:
            raise PrepareError(f"{where} does not exist")
        if claim.get("metadata", {}).get("uid") != uid:
            raise PrepareError(f"{where} has UID {claim.get('metadata', {}).get('uid')}, not {uid}")
        try:
            mine = grants(claim, self.cfg.driver, self.cfg.node_name)
        except BadClaim as exc:
            raise PrepareError(str(exc)) from None
        node = self._node()
        devices = self._devices(where, uid, mine, node)
        rec = ClaimRecord(uid, namespace, name, tuple(devices), time.time(), self._consumer(where, claim))
        try:
            self.checkpoint.put(rec)
        except OSError as exc:
            raise PrepareError(f"{where}: cannot write the checkpoint under {self.cfg.state_dir}: {exc}") from None
        held = {a.id for a in node.allocations}
        made: list[Prepared] = []
        try:
            for d in devices:
                if d.alloc_id in held:  # an earlier try created it but lost the reply: its token is gone, redo it
                    self.admin.remove_allocation(d.alloc_id)
                self._create(d, rec.labels)
                made.append(d)
            self._write_spec(rec, node, where)
        except (Refused, Unreachable, PrepareError) as exc:
            for d in made:
                try:
                    self._remove(d)
                except PrepareError as undo:
                    log.error("claim %s: could not undo allocation %s (%s); resync removes it", where, d.alloc_id,
                              undo)
            for d in devices:
                self.checkpoint.remove_dir(d.alloc_id)
            self.checkpoint.drop(uid)
            if isinstance(exc, PrepareError):
                raise
            what = "refused it" if isinstance(exc, Refused) else "did not answer"
            raise PrepareError(f"{where}: arbiterd {what}: {exc}") from None
        for d in devices:
            log.info("claim %s (%s): allocation %s on %s%s", where, uid, d.alloc_id, _describe(d),
                     f", for {rec.labels.text()}" if rec.labels else "")
        return devices

    # ------------------------------------------------------------ NodeUnprepareResources
    def unprepare(self, uid: str) -> None:
        """Undo what prepare did for claim ``uid`` (nothing, if it is not prepared); raise PrepareError."""
        with self._lock:
            self._unprepare(uid, "the kubelet unprepared it")

    def _unprepare(self, uid: str, why: str) -> None:
        rec = self.checkpoint.claims.get(uid)
        if rec is not None:
            for d in rec.devices:
                self._remove(d)
            self.checkpoint.drop(uid)
            log.info("claim %s/%s (%s): allocations %s removed: %s", rec.namespace, rec.name, uid,
                     ", ".join(d.alloc_id for d in rec.devices), why)
        cdi.remove(self.cfg.cdi_dir, uid)

    # ------------------------------------------------------------ keeping arbiterd, disk and API server in step
    def resync(self) -> int | None:
        """Make arbiterd hold exactly the recorded ``dra-`` allocations, adopting first those of claims the API
        server allocates on this node that no record names (an unreadable checkpoint was set aside); then remove
        token directories no record owns. arbiterd's status is read under the lock, so no prepare or unprepare
        runs between it and the changes. Returns arbiterd's pid. Raises Unreachable/StatusError if arbiterd does
        not answer, ApiException/OSError/ValueError if the API server cannot be read (then nothing unknown was
        removed: the caller retries)."""
        with self._lock:
            node = self.admin.node()
            held = {a.id for a in node.allocations}
            for rec in self.checkpoint.claims.values():
                for d in rec.devices:
                    if d.alloc_id in held:
                        continue
                    try:
                        self._create(d, rec.labels)
                        log.info("allocation %s (GPU %d, claim %s/%s): created again in arbiterd, which did not "
                                 "have it", d.alloc_id, d.gpu, rec.namespace, rec.name)
                    except Refused as exc:
                        log.error("allocation %s (GPU %d, claim %s/%s): arbiterd refuses to create it again (the "
                                  "claim's next prepare tries again): %s", d.alloc_id, d.gpu, rec.namespace,
                                  rec.name, exc)
            unknown = [a for a in node.allocations if ALLOC_ID.fullmatch(a.id) and a.id not in
                       self.checkpoint.alloc_ids()]
            kept = self._adopt_or_remove(unknown, node) if unknown else set()
            for alloc in sorted(set(self.checkpoint.stray_dirs()) - kept):
                self.checkpoint.remove_dir(alloc)
                log.warning("allocation %s: removed its token directory, which no claim record owned", alloc)
            return node.pid

    def _claims_here(self) -> dict[str, dict[str, Any]]:
        """Allocation id -> the claim the API server allocates on this node that names it."""
        out: dict[str, dict[str, Any]] = {}
        for claim in self.kube.list_claims():
            uid = str((claim.get("metadata") or {}).get("uid", ""))
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            for r in results or []:
                if r.get("driver") == self.cfg.driver and r.get("pool") == self.cfg.node_name:
                    out[alloc_id(uid, str(r.get("request", "")), str(r.get("device", "")))] = claim
        return out

    def _adopt_or_remove(self, unknown: Sequence[DaemonAllocation], node: NodeView) -> set[str]:
        """Adopt or remove each of ``unknown``; the ids kept with no record (a live claim that cannot be read)."""
        kept: set[str] = set()
        live = self._claims_here()  # before removing anything: a claim still allocated here keeps its allocation
        for a in unknown:
            claim = live.get(a.id)
            if claim is None:
                self.admin.remove_allocation(a.id)
                log.warning("allocation %s (GPU %s): arbiterd held it but no prepared claim names it and the API "
                            "server allocates no claim of it on this node; removed", a.id, ",".join(map(str, a.gpus)))
                continue
            meta = claim.get("metadata") or {}
            uid, namespace, name = str(meta.get("uid")), str(meta.get("namespace")), str(meta.get("name"))
            if uid in self.checkpoint.claims:
                continue  # adopted with an earlier device of the same claim
            where = f"claim {namespace}/{name}"
            try:
                devices = self._devices(where, uid, grants(claim, self.cfg.driver, self.cfg.node_name), node)
                rec = ClaimRecord(uid, namespace, name, tuple(devices), time.time(), self._consumer(where, claim))
                self.checkpoint.put(rec)
            except (BadClaim, PrepareError, OSError) as exc:
                log.error("allocation %s: %s is allocated here but its record cannot be rebuilt (%s); the allocation "
                          "is kept", a.id, where, exc)
                kept.add(a.id)
                continue
            lost = [d.alloc_id for d in devices if not (self.checkpoint.alloc_path(d.alloc_id) / TOKEN_FILE).is_file()]
            log.warning("%s (%s): no record named its allocation %s; rebuilt the record from the API server%s", where,
                        uid, a.id, f" (token gone for {', '.join(lost)}: a new container cannot bind it)" if lost
                        else "")
        return kept

    def collect_garbage(self) -> list[str]:
        """Unprepare claims the API server no longer has (or no longer allocates here); their UIDs. The API server
        is asked without the lock (prepares go on meanwhile); it is taken only to unprepare each gone claim."""
        with self._lock:
            records = list(self.checkpoint.claims.values())
        gone = []
        for rec in records:
            claim = self.kube.get_claim(rec.namespace, rec.name)
            alive = (claim is not None and claim.get("metadata", {}).get("uid") == rec.uid
                     and bool(((claim.get("status") or {}).get("allocation") or {}).get("devices")))
            if not alive:
                with self._lock:
                    if rec.uid not in self.checkpoint.claims:
                        continue  # the kubelet unprepared it meanwhile
                    self._unprepare(rec.uid, "its claim is gone from the API server")
                gone.append(rec.uid)
        return gone

    def prepared(self) -> Sequence[ClaimRecord]:
        with self._lock:
            return list(self.checkpoint.claims.values())
