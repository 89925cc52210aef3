"""Per-GPU slice scheduler: who holds one GPU, until when, and whom to revoke.

How this works
--------------
Instances ask for time through their clients (:meth:`GpuScheduler.acquire`);
the scheduler answers with effects, :class:`GrantLease` (a lease with an absolute
CLOCK_MONOTONIC deadline) and :class:`RevokeLease`. Under the time-sliced policies
at most one instance holds the lease and all its clients share it; under the
native policy every client gets a lease of its own at once.

The scheduler keeps the GPU's run queue (model.py) and reaches the policy in force only through its hooks
(policies/base.py), as Linux's core reaches a scheduling class: what an acquire gets, what follows a release, the
next step, the next timer, what each instance is owed. A time-sliced policy asks the high-priority class first and
itself second. A lease is billed by the class that granted it, for its *useful* time: from grant to release, overrun
included, less the hand-over it cost (measured per lease and credited up to a bound: credit.py, accounting.py). Each
instance's own expected hand-over lengthens its turns so that they hold their useful time; the GPU's sizes
``slice_ms = auto``. A native lease (policy 5) runs beside the others and hands nothing over, so it is billed what it
held and not measured. A holder still holding ``overrun_ms`` after its deadline (or a revoke) is cut off, charged up
to then and counted. A policy switch is switch.py; the setting writes are setters.py; limits, limits.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

from arbiterd.core import credit, limits
from arbiterd.core.accounting import HandoverMeter
from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease, RevokeLease
from arbiterd.core.entitlement import Entitlement
from arbiterd.core.errors import ConflictError, NotFoundError, SettingError
from arbiterd.core.model import Bill, GpuStats, InstanceState, Lease, Runqueue
from arbiterd.core.policies import NATIVE, HighPriority, Policy, make_policy
from arbiterd.core.setters import SettingWrites
from arbiterd.core.settings import INSTANCE, NO_LIMIT, GpuSettings, check_gpu_settings


class GpuScheduler(SettingWrites):
    """Decides who holds one GPU, until when, and whom to revoke: the operations on its run queue (:attr:`rq`),
    which reach the classes (:attr:`hp`, :attr:`policy`) only through their hooks."""

    def __init__(self, index: int, settings: GpuSettings | None = None, now: int = 0) -> None:
        settings = settings if settings is not None else GpuSettings()
        check_gpu_settings(settings)
        self.rq = rq = Runqueue(index, settings, now)
        self._client_inst: dict[int, InstanceState] = {}
        self.hp = HighPriority(rq, now)
        self.policy: Policy = make_policy(settings.policy, rq, self.hp, now)
        rq.policy = self.policy
        self.ent = Entitlement(rq.instances, self._shares, now)
        self._setters: dict[str, Callable[[int, int], list[Effect]]] = {
            "policy": self.set_policy, "max_inst": self.set_max_inst, "prio_ratio": self.set_prio_ratio,
            "slice_ms": self.set_slice_ms,
            **{name: functools.partial(self._set_slice_bound, name) for name in (
                "slice_min_ms", "slice_max_ms", "handover_target_pct", "latency_target_ms", "handover_max_pct")},
            **{name: functools.partial(self._set_plain, name)
               for name in ("limit_period_ms", "overrun_ms", "unmanaged", "memory_enforce", "memory_grace_ms",
                            "memory_allowance")},
        }

    # ------------------------------------------------------------------ derived (index, settings, instances: above)
    @property
    def stats(self) -> GpuStats:
        return self.rq.stats

    @property
    def lease(self) -> Lease | None:
        """The current lease (of the time-sliced policies; the native policy keeps its own)."""
        return self.rq.lease

    @property
    def handover(self) -> HandoverMeter:
        return self.rq.handover

    @property
    def slice_ns(self) -> int:
        return self.rq.slice_ns

    def holders(self) -> list[Lease]:
        """Every lease now held on this GPU."""
        return self.rq.holders()

    @property
    def overrun_ns(self) -> int:
        return self.settings.overrun_ms * NS_PER_MS

    @property
    def free_weight(self) -> int:
        return self.settings.max_inst - sum(i.weight for i in self.instances.values())

    def held_ns(self, name: str, now: int) -> int:
        """Time ``name`` has held this GPU, including a lease still running."""
        inst = self._inst(name)
        return inst.held_ns + sum(now - lease.granted_ns for lease in self.holders() if lease.inst is inst)

    def useful_ns(self, name: str, now: int) -> int:
        """Time ``name`` was billed for (held less hand-overs), including a lease still running."""
        inst = self._inst(name)
        return inst.useful_ns + sum(max(0, now - lease.granted_ns - lease.extension_ns) for lease in self.holders()
                                    if lease.inst is inst)

    def busy_ns(self, now: int) -> int:
        since = self.rq.busy_since
        return self.stats.busy_ns + (now - since if since is not None else 0)

    def entitled(self, active: Collection[str]) -> dict[str, float]:
        """The share of GPU time each instance is owed while the instances ``active`` have demand.

        Work-conserving policies (1, 4, 5) divide the GPU among the instances with
        demand; on 0, 2 and 3 an idle instance keeps its share (its turns pass idle).
        An instance with demand but weight 0 (free_weight had run out) is entitled to
        what its requested weight would give it: it is starved, and shows as such.
        """
        out = dict.fromkeys(self.instances, 0.0)
        live = [i for i in self.instances.values() if i.weight > 0]
        starved = [i for i in self.instances.values() if i.weight == 0 and i.requested > 0 and i.name in active]
        out.update(self.policy.entitled(live, starved, active))
        return out

    def entitlement(self, name: str, now: int) -> tuple[float, float, int]:
        """``name``'s (entitled, owed, demand) ns so far (see entitlement.py)."""
        return self.ent.pending(self._inst(name), now)

    def _reshare(self, now: int) -> None:
        """A setting or the membership changed: close the integrals under the old shares, and put in force the
        new shares of whoever has demand now (every set's shares are asked again)."""
        self.ent.fold(now, self._with_demand())

    def _with_demand(self) -> frozenset[str]:
        """The instances that wait for or hold a lease now."""
        return frozenset(n for n, i in self.instances.items() if i.waiters or i.leases)

    def _shares(self, active: frozenset[str]) -> dict[str, float]:
        """The entitled shares while ``active`` have demand (nonzero ones only)."""
        return {n: s for n, s in self.entitled(active).items() if s}

    def _resharing(self, effects: list[Effect], now: int) -> list[Effect]:
        self._reshare(now)
        return effects + self.rq.gangs.take()

    def _touched(self, inst: InstanceState | None, now: int) -> None:
        """``inst`` may have gained or lost demand: reshare if it did."""
        if inst is not None and (bool(inst.waiters) or inst.leases > 0) != (inst.name in self.ent.current.active):
            self.ent.toggle(inst.name, now)
        if inst is not None and inst.limit < NO_LIMIT:
            self.rq.bw.mark(inst, now)
        if inst is not None and self.rq.gangs.active:
            self.rq.gangs.touched(inst, now)

    def has_demand(self, name: str) -> bool:
        """Whether ``name`` waits for or holds a lease."""
        inst = self._inst(name)
        return bool(inst.waiters) or inst.leases > 0

    # -------------------------------------------------------------- instances
    def add_instance(self, name: str, weight: int, highprio: bool, now: int, requested: int | None = None,
                     switch: bool = True, limit: int = NO_LIMIT) -> list[Effect]:
        """Register an instance. ``weight`` 0 means it never gets GPU time; ``requested``: what it asked for;
        ``switch``: its weight may switch the GPU's policy (behaviour §3), as when an operator provisions it;
        ``limit``: its ceiling (limits.py; checked against its weight only: kept where the policy does not
        honour it)."""
        if name in self.instances:
            raise ConflictError(f"instance {name} already exists on GPU {self.index}")
        if weight != 0:
            INSTANCE["weight"].check(weight, self.settings.max_inst)
        if weight > self.free_weight:
            raise ConflictError(f"weight {weight} exceeds free_weight {self.free_weight} on GPU {self.index}")
        limits.check_request(self.rq, name, weight, INSTANCE["limit"].check(limit))
        inst = InstanceState(name, weight, bool(highprio), self.rq.next_order(),
                             requested=weight if requested is None else requested, limit=limit)
        self.policy.demand(inst, now)
        self.instances[name] = inst
        self.rq.bw.track(inst, now)
        self.hp.changed()
        self.rq.gangs.changed()
        self.policy.changed(now)
        to = self.policy.weight_switch(weight) if switch else None
        effects = self.set_policy(to, now) if to is not None else self.policy.schedule(now)
        self._reshare(now)
        return effects + self.rq.gangs.take()

    def remove_instance(self, name: str, now: int) -> list[Effect]:
        """Forget an instance; its lease is ended and its waiters dropped."""
        inst = self._inst(name)
        effects: list[Effect] = []
        for client in list(inst.waiters):
            self._client_inst.pop(client, None)
        inst.waiters.clear()
        for lease in self.holders():
            if lease.inst is inst:
                for client in lease.clients:
                    effects.append(RevokeLease(client, self.index, lease.id, "removed"))
                    self._client_inst.pop(client, None)
                self.stats.revoked["removed"] += 1
                self._end_lease(lease, now)
        self.ent.fold(now)
        self.rq.gangs.removed(name, now)  # a gang of it dissolves while its record is still there
        del self.instances[name]
        self.rq.waits.forget(name)
        self.rq.bw.forget(inst, now)
        self.hp.changed()
        self.rq.gangs.changed()
        self.policy.removed(inst)
        self.policy.changed(now)
        effects += self.policy.schedule(now)
        self._reshare(now)
        return effects + self.rq.gangs.take()

    # ----------------------------------------------------------------- events
    def acquire(self, name: str, client: int, now: int) -> list[Effect]:
        """``client`` of instance ``name`` wants to run GPU work."""
        inst = self._inst(name)
        owner = self._client_inst.get(client)
        if owner is not inst:
            if owner is not None:
                raise ConflictError(f"client {client} belongs to instance {owner.name}, not {name}")
            self._client_inst[client] = inst
        if inst.highprio:  # its credit up to now, banked as while it did not wait
            self.hp.accrue(now)
        policy = self.policy
        rq = self.rq
        if rq.lease is not None or policy.leases or rq.draining:  # it may hold one already
            for held in self._leases_of(client):
                if held.revoked_ns is None and now < held.deadline_ns:
                    return [GrantLease(client, rq.index, held.id, held.deadline_ns, 0)]
                self._drop_holder(held, client, now)
        effects = policy.acquire(inst, client, now)
        if effects is None:
            inst.waiters.setdefault(client, now)
            effects = policy.schedule(now, arrived=inst)
        self._touched(inst, now)
        return effects + rq.gangs.take() if rq.gangs.active else effects

    def release(
        self, client: int, lease_id: int, now: int, again: bool = False, used_ns: int | None = None,
        warmup_ns: int | None = None,
    ) -> tuple[list[Effect], bool]:
        """``client`` gives ``lease_id`` back. Returns (effects, whether it was current).

        With ``again`` the client still has work: it is queued again in the same
        step, so the choice of the next holder sees its demand (a renew).
        ``used_ns`` is the time the client itself saw the lease (grant received to
        release sent; the difference is the transit both ways) and ``warmup_ns``
        what it lost at the start (accounting.py).
        """
        policy = self.policy
        own = policy.leases.get(client)
        if own is not None and own.id == lease_id and not again:
            # a lease of the client's own (the native policy's grant path): it hands nothing over (billed what it
            # held, not measured)
            mine = own.inst
            self._end_lease(own, now)
            effects = policy.released(now)
            self._touched(mine, now)
            return effects, True
        current = False
        inst = self._client_inst.get(client)
        if again and inst is not None:  # queued first, so the renewing instance still counts as having demand
            inst.waiters.setdefault(client, now)
        for lease in self._leases_of(client):
            if lease.id == lease_id:
                # a lease of one client alone (native) runs beside the others and hands nothing over: billed what
                # it held. A shared one is measured, as it ends, by the word of the last of the clients granted it
                # at its start to give it back: one that joined later (another process of the instance) saw it only
                # from then, and its word would make the time before a hand-over
                if lease.client is None:
                    if used_ns is not None and client in lease.starters:
                        lease.report = (now, used_ns, warmup_ns or 0)
                    if len(lease.clients) == 1 and lease.report is not None:
                        self._measure(lease, *lease.report)
                self._drop_holder(lease, client, now)
                current = True
        if not current and not again:
            return [], False
        effects = self.policy.schedule(now) if again else self.policy.released(now)
        self._touched(inst, now)
        if self.rq.gangs.active:
            effects += self.rq.gangs.take()
        return effects, current

    def release_moves_timer(self) -> bool:
        """Whether a release that granted nothing may bring this GPU's next deadline earlier (the daemon's timer
        is left alone where it may not)."""
        return self.policy.release_moves_timer

    def drop_client(self, client: int, now: int) -> list[Effect]:
        """``client`` went away (disconnect or death): forget its wait and its leases."""
        inst = self._client_inst.pop(client, None)
        if inst is None:
            return []
        inst.waiters.pop(client, None)
        for lease in self._leases_of(client):
            self._drop_holder(lease, client, now)
        effects = self.policy.schedule(now)
        self._touched(inst, now)
        return effects + self.rq.gangs.take()

    def tick(self, now: int) -> list[Effect]:
        """Act on every deadline that has passed by ``now``."""
        effects: list[Effect] = []
        if self.rq.gangs.active:
            self.rq.gangs.ticked(now)
        overrun = self.overrun_ns
        for lease in self.holders():
            if now >= lease.cutoff(overrun):
                for client in lease.clients:
                    effects.append(RevokeLease(client, self.index, lease.id, "overrun"))
                self.stats.overruns += 1
                self.stats.revoked["overrun"] += 1
                self._end_lease(lease, now)
        effects += self.policy.schedule(now)
        self.ent.move(self._with_demand(), now)  # several instances may have lost demand at once
        return effects + self.rq.gangs.take()

    def next_wakeup(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do (asked after every acquire and release)."""
        overrun = self.settings.overrun_ms * NS_PER_MS
        at = self.policy.wakeup_at(overrun)
        for old in self.rq.draining:
            t = old.first_cutoff(overrun)
            if t is not None and (at is None or t < at):
                at = t
        return at

    # ------------------------------------------------------------- internals
    def _inst(self, name: str) -> InstanceState:
        try:
            return self.instances[name]
        except KeyError:
            raise NotFoundError(f"no instance {name} on GPU {self.index}") from None

    def _leases_of(self, client: int) -> list[Lease]:
        """The leases ``client`` holds: its own (the native policy's, keyed by it; a policy switched away from may
        still keep one), and the current one."""
        rq = self.rq
        leases = []
        own = self.policy.leases.get(client)
        if own is not None:
            leases.append(own)
        for old in rq.draining:
            mine = old.leases.get(client)
            if mine is not None:
                leases.append(mine)
        if rq.lease is not None and client in rq.lease.clients:
            leases.append(rq.lease)
        return leases

    def _measure(self, lease: Lease, now: int, used_ns: int, warmup_ns: int) -> None:
        """One lease's hand-over (credit.py): what nobody could use of it, billed to nobody, feeding the meter and
        its instance's turns."""
        moved, kept = credit.measure(self.rq, lease, now, used_ns, warmup_ns)
        if moved:
            self._refresh_slice(now)
        if not lease.renewal:
            self.policy.own_handover(lease.inst, kept, now)

    def credit_cap(self, inst: InstanceState) -> int:
        """The most of one lease's hand-over credited to ``inst`` (credit.py)."""
        return credit.credit_cap(self.rq, inst)

    def _drop_holder(self, lease: Lease, client: int, now: int) -> None:
        lease.clients.discard(client)
        lease.starters.discard(client)
        if not lease.clients:
            self._end_lease(lease, now)

    def _end_lease(self, lease: Lease, now: int) -> None:
        """End ``lease`` at ``now``: its instance's books, the GPU's busy time, and the bill of the class that
        granted it (none for a native lease while the native policy is in force: no turns to be fair about)."""
        rq = self.rq
        if self.hp.members:  # with none, the credit only fills to its cap: accrued in one step when one comes
            self.hp.accrue(now)  # (a native lease's too: the cap in force now bounds the credit banked until now)
        held = now - lease.granted_ns
        billed = held - lease.discount_ns if held > lease.discount_ns else 0  # its useful time: held less hand-over
        inst = lease.inst
        rq.last_ended = (inst, now)
        inst.held_ns += held
        inst.useful_ns += billed
        inst.leases -= 1
        if inst.limit < NO_LIMIT:
            rq.bw.consume(inst, billed, now)
        if now > lease.deadline_ns:
            rq.stats.late_releases += 1
        lease.clients.clear()
        owner = lease.owner
        if lease.client is None:
            if lease is rq.lease:
                rq.lease = None
        else:
            owner.forget(lease)
            if rq.draining:
                rq.draining = [old for old in rq.draining if old.leases]
                if not rq.draining:  # the policy switched to is in force alone now: gangs may form on it
                    rq.gangs.changed()
        if rq.busy_since is not None and not rq.held():
            rq.stats.busy_ns += now - rq.busy_since
            rq.busy_since = None
        if not owner.bills:
            return
        overrun = max(0, lease.granted_ns + billed - (lease.deadline_ns - lease.extension_ns))
        charged = owner.charge(lease, Bill(held, billed, overrun, now))
        if charged:
            rq.charge_vtime(inst, charged, self.policy.vtime_weight(inst))
        self.policy.after_charge(inst)


__all__ = ["NATIVE", "GpuScheduler", "GpuSettings", "SettingError"]
