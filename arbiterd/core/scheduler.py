"""Per-GPU slice scheduler: who holds one GPU, until when, and whom to revoke.

How this works
--------------
Instances ask for time through their clients (:meth:`GpuScheduler.acquire`);
the scheduler answers with effects, :class:`Grant` (a lease with an absolute
CLOCK_MONOTONIC deadline) and :class:`Revoke`. Under the time-sliced policies
at most one instance holds the lease and all its clients share it; under the
native policy every client gets a lease of its own at once.

The choice is made by two classes, asked in turn (policies/): high priority
first, then the GPU's policy. A lease is billed by the class that granted it,
for its *useful* time: from grant to release, overrun included, less the
hand-over it cost (measured per lease: the transit both ways, the client's wait
for its first use and its first operations' warm-up; accounting.py). Each
instance's own expected hand-over (a running mean of its leases') lengthens
its turns so that they hold their useful time; the GPU's (the mean of the
recent leases') sizes ``slice_ms = auto``. A native lease (policy 5) runs beside
the others and hands nothing over, so it is billed what it held and not
measured. A holder still
holding ``overrun_ms`` after its deadline (or a revoke) is cut off, charged up
to then and counted.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection

from arbiterd.core.accounting import SAMPLE_MAX_NS
from arbiterd.core.effects import NS_PER_MS, Effect, Grant, Revoke
from arbiterd.core.entitlement import Entitlement
from arbiterd.core.errors import ConflictError, NotFoundError, SettingError
from arbiterd.core.model import Bill, GpuState, InstanceState, Lease
from arbiterd.core.policies import NATIVE, HighPriority, Policy, make_policy
from arbiterd.core.settings import GPU, INSTANCE, GpuSettings, check_gpu_settings

OWN_HANDOVER_LEASES = 16  # an instance's expected hand-over is a running mean over about this many leases
# A lease's hand-over is credited up to CAP_OTHERS x the lower quartile of what the other instances' clients report
# theirs cost; while no other instance has reported one, up to CAP_TARGETS x handover_target_pct of the slice that
# auto would choose (or the pinned one, if longer), plus CAP_FLOOR_NS. What a client claims beyond that wins it
# nothing (see credit_cap).
CAP_OTHERS = 3
CAP_TARGETS = 1.5
CAP_FLOOR_NS = 100_000


class GpuScheduler(GpuState):
    """Decides who holds one GPU, until when, and whom to revoke."""

    def __init__(self, index: int, settings: GpuSettings | None = None, now: int = 0) -> None:
        settings = settings if settings is not None else GpuSettings()
        check_gpu_settings(settings)
        super().__init__(index, settings, now)
        self._client_inst: dict[int, InstanceState] = {}
        self.hp = HighPriority(self, now)
        self.policy: Policy = make_policy(settings.policy, self, now)
        self.ent = Entitlement(self.instances, self._shares, now)
        self._setters: dict[str, Callable[[int, int], list[Effect]]] = {
            "policy": self.set_policy, "max_inst": self.set_max_inst, "prio_ratio": self.set_prio_ratio,
            "slice_ms": self.set_slice_ms, "overrun_ms": self.set_overrun_ms,
            **{name: functools.partial(self._set_slice_bound, name)
               for name in ("slice_min_ms", "slice_max_ms", "handover_target_pct")},
        }

    # ------------------------------------------------------------------ derived
    @property
    def overrun_ns(self) -> int:
        return self.settings.overrun_ms * NS_PER_MS

    @property
    def free_weight(self) -> int:
        return self.settings.max_inst - sum(i.weight for i in self.instances.values())

    def held_ns(self, name: str, now: int) -> int:
        """Time ``name`` has held this GPU, including a lease still running."""
        inst = self._inst(name)
        total = inst.held_ns
        for lease in self.holders():
            if lease.inst is inst:
                total += now - lease.granted_ns
        return total

    def useful_ns(self, name: str, now: int) -> int:
        """Time ``name`` was billed for (held less hand-overs), including a lease still running."""
        inst = self._inst(name)
        total = inst.useful_ns
        for lease in self.holders():
            if lease.inst is inst:
                total += max(0, now - lease.granted_ns - lease.extension_ns)
        return total

    def busy_ns(self, now: int) -> int:
        extra = now - self.busy_since if self.busy_since is not None else 0
        return self.stats.busy_ns + extra

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
        if self.policy.concurrent:
            out.update(self.policy.shares(live, active, 1.0))
            out.update({i.name: 1.0 for i in starved})
            return out
        normals = [i for i in live if not i.highprio]
        hp, rest = self.hp.shares(active, self.policy.conserving, any(i.name in active for i in normals))
        out.update(hp)
        out.update(self.policy.shares(normals, active, rest))
        for inst in starved:
            ghost = dataclasses.replace(inst, weight=min(inst.requested, self.settings.max_inst))
            if inst.highprio:
                hp_as, _ = self.hp.shares(active, self.policy.conserving, True, extra=ghost)
                out[inst.name] = hp_as.get(inst.name, 0.0)
            else:
                out[inst.name] = self.policy.shares([*normals, ghost], active, rest)[inst.name]
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
        return effects

    def _touched(self, inst: InstanceState | None, now: int) -> None:
        """``inst`` may have gained or lost demand: reshare if it did."""
        if inst is not None and (bool(inst.waiters) or inst.leases > 0) != (inst.name in self.ent.current.active):
            self.ent.toggle(inst.name, now)

    def has_demand(self, name: str) -> bool:
        """Whether ``name`` waits for or holds a lease."""
        inst = self._inst(name)
        return bool(inst.waiters) or inst.leases > 0

    # -------------------------------------------------------------- instances
    def add_instance(self, name: str, weight: int, highprio: bool, now: int, requested: int | None = None,
                     switch: bool = True) -> list[Effect]:
        """Register an instance. ``weight`` 0 means it never gets GPU time; ``requested``: what it asked for;
        ``switch``: its weight may switch the GPU's policy (behaviour §3), as when an operator provisions it."""
        if name in self.instances:
            raise ConflictError(f"instance {name} already exists on GPU {self.index}")
        if weight != 0:
            INSTANCE["weight"].check(weight, self.settings.max_inst)
        if weight > self.free_weight:
            raise ConflictError(f"weight {weight} exceeds free_weight {self.free_weight} on GPU {self.index}")
        inst = InstanceState(name, weight, bool(highprio), self.next_order(),
                             requested=weight if requested is None else requested)
        self.policy.demand(inst, now)
        self.instances[name] = inst
        self.hp.changed()
        self.policy.changed(now)
        to = self.policy.weight_switch(weight) if switch else None
        effects = self.set_policy(to, now) if to is not None else self._schedule(now)
        self._reshare(now)
        return effects

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
                    effects.append(Revoke(client, self.index, lease.id, "removed"))
                    self._client_inst.pop(client, None)
                self.stats.revoked["removed"] += 1
                self._end_lease(lease, now)
        self.ent.fold(now)
        del self.instances[name]
        self.hp.changed()
        self.policy.removed(inst)
        self.policy.changed(now)
        effects += self._schedule(now)
        self._reshare(now)
        return effects

    # --------------------------------------------------------------- settings
    def set(self, name: str, value: int, now: int) -> list[Effect]:
        """Set the GPU setting ``name`` (a key of :data:`arbiterd.core.settings.GPU`)."""
        try:
            setter = self._setters[name]
        except KeyError:
            raise NotFoundError(f"no GPU setting {name}") from None
        return setter(value, now)

    def _set_slice_bound(self, name: str, value: int, now: int) -> list[Effect]:
        """``slice_min_ms``, ``slice_max_ms`` or ``handover_target_pct``: what ``slice_ms = auto`` may do."""
        GPU[name].valid(value)
        s = self.settings
        lo, hi = (value, s.slice_max_ms) if name == "slice_min_ms" else (s.slice_min_ms, value)
        if name != "handover_target_pct" and lo > hi:
            raise ConflictError(f"{name}: slice_min_ms {lo} would be above slice_max_ms {hi}")
        setattr(s, name, value)
        self._refresh_slice(now)
        return self._schedule(now)

    def _refresh_slice(self, now: int) -> None:
        """Put the slice and the turn extension in force again (a setting or the measured hand-over changed).

        The extension follows the expected hand-over once it has moved by 5 % (rings are rebuilt
        for it, so it does not follow every sample).
        """
        slice_ns = self.pick_slice_ns()
        expected = self.handover.expected
        moved = abs(expected - self.extension_ns) * 20 > self.extension_ns
        if slice_ns == self.slice_ns and not moved:
            return
        self.slice_ns = slice_ns
        if moved:
            self.extension_ns = expected
        self.hp.clamp()
        self.policy.changed(now)

    def set_policy(self, policy: int, now: int) -> list[Effect]:
        GPU["policy"].valid(policy)
        if policy == self.settings.policy:
            return []
        self.hp.accrue(now)
        old = self.policy
        self.settings.policy = policy
        old.retire()
        self.policy = make_policy(policy, self, now)
        self.policy.changed(now)
        # fairness restarts under the new policy: what was owed under the old one is void
        base = max([self.min_vr, *(i.vruntime for i in self.instances.values())])
        for inst in self.instances.values():
            inst.vruntime = base
            inst.debt_ns = 0
        self.min_vr = base
        effects: list[Effect] = []
        for lease in self.holders():
            if not (self.policy.concurrent and lease.native_client is None):
                effects += self._close_under_old_policy(lease, now)
        effects += self._schedule(now)
        self._reshare(now)
        return effects

    def _close_under_old_policy(self, lease: Lease, now: int) -> list[Effect]:
        """Revoke a lease granted under the old policy, whose time so far is void like its debts.

        Its holder only finishes what it started: that is overrun, debt for its next turn.
        Without this, an instance alone on a work-conserving policy (a lease extended for
        seconds) would be charged all of it at release under the new policy, and the others
        would get that many extra turns in a row.
        """
        lease.prepaid_ns = max(lease.prepaid_ns, now - lease.granted_ns)
        lease.deadline_ns = min(lease.deadline_ns, now)
        lease.extension_ns = 0
        lease.nominal_ns = None
        return self.revoke(lease, now, "policy")

    def set_max_inst(self, value: int, now: int) -> list[Effect]:
        GPU["max_inst"].valid(value)
        used = sum(i.weight for i in self.instances.values())
        if value < used:
            raise ConflictError(f"max_inst {value} is below the sum of weights {used}")
        self.settings.max_inst = value
        self.policy.changed(now)
        return self._resharing(self._schedule(now), now)

    def set_prio_ratio(self, value: int, now: int) -> list[Effect]:
        GPU["prio_ratio"].valid(value)
        self.hp.accrue(now)
        self.settings.prio_ratio = value
        self.hp.clamp()
        return self._resharing(self._schedule(now), now)

    def set_slice_ms(self, value: int, now: int) -> list[Effect]:
        GPU["slice_ms"].valid(value)
        self.settings.slice_ms = value
        self._refresh_slice(now)
        return self._schedule(now)

    def set_overrun_ms(self, value: int, now: int) -> list[Effect]:
        GPU["overrun_ms"].valid(value)
        self.settings.overrun_ms = value
        return self._schedule(now)

    def set_weight(self, name: str, weight: int, now: int) -> list[Effect]:
        inst = self._inst(name)
        INSTANCE["weight"].check(weight, self.settings.max_inst)
        others = sum(i.weight for i in self.instances.values() if i is not inst)
        if others + weight > self.settings.max_inst:
            raise ConflictError(
                f"weight {weight} would make the sum {others + weight} exceed max_inst "
                f"{self.settings.max_inst} on GPU {self.index}"
            )
        inst.weight = weight
        self.policy.changed(now)
        return self._resharing(self._schedule(now), now)

    def set_highprio(self, name: str, highprio: int, now: int) -> list[Effect]:
        inst = self._inst(name)
        INSTANCE["highprio"].check(highprio)
        inst.highprio = bool(highprio)
        self.hp.changed()
        self.policy.changed(now)
        return self._resharing(self._schedule(now), now)

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
        effects: list[Effect] = []
        if self.native or self.lease is not None:  # it may hold one already
            for held in self._leases_of(client):
                if held.revoked_ns is None and now < held.deadline_ns:
                    return [Grant(client, self.index, held.id, held.deadline_ns, 0)]
                self._drop_holder(held, client, now)
        policy = self.policy
        lease = self.lease
        if (not policy.concurrent and lease is not None and lease.inst is inst
                and lease.revoked_ns is None and now < lease.deadline_ns):
            lease.clients.add(client)
            return [*effects, Grant(client, self.index, lease.id, lease.deadline_ns, 0)]
        if not inst.waiters and not inst.leases:
            policy.demand(inst, now)
        if policy.concurrent and inst.weight and not inst.waiters:  # granted on arrival, with no queue
            effects.append(policy.grant(inst, client, now, now))
            if inst.name not in self.ent.current.active:  # its first lease: it gained demand
                self.ent.toggle(inst.name, now)
            return effects
        inst.waiters.setdefault(client, now)
        effects += self._schedule(now, arrived=inst)
        self._touched(inst, now)
        return effects

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
        own = self.native.get(client)
        if own is not None and own.id == lease_id and not again:
            # a native lease (policy 5's grant path), the client's alone: it hands nothing over (billed what it
            # held, not measured), and frees nothing anyone waits for while the native policy is in force
            self._end_lease(own, now)
            effects = [] if self.policy.concurrent else self._schedule(now)
            mine = own.inst
            if not mine.leases and not mine.waiters and mine.name in self.ent.current.active:  # it lost demand
                self.ent.toggle(mine.name, now)
            return effects, True
        current = False
        inst = self._client_inst.get(client)
        if again and inst is not None:  # queued first, so the renewing instance still counts as having demand
            inst.waiters.setdefault(client, now)
        for lease in self._leases_of(client):
            if lease.id == lease_id:
                # a native lease runs beside the others and hands nothing over: billed what it held
                if used_ns is not None and len(lease.clients) == 1 and lease.native_client is None:
                    self._measure(lease, now, used_ns, warmup_ns or 0)
                self._drop_holder(lease, client, now)
                current = True
        if not current and not again:
            return [], False
        # under a concurrent policy every waiter was granted on arrival: a release frees nothing anyone waits for
        effects = self._schedule(now) if again or not self.policy.concurrent else []
        self._touched(inst, now)
        return effects, current

    def drop_client(self, client: int, now: int) -> list[Effect]:
        """``client`` went away (disconnect or death): forget its wait and its leases."""
        inst = self._client_inst.pop(client, None)
        if inst is None:
            return []
        inst.waiters.pop(client, None)
        for lease in self._leases_of(client):
            self._drop_holder(lease, client, now)
        effects = self._schedule(now)
        self._touched(inst, now)
        return effects

    def tick(self, now: int) -> list[Effect]:
        """Act on every deadline that has passed by ``now``."""
        effects: list[Effect] = []
        for lease in self.holders():
            if now >= self._cutoff(lease):
                for client in lease.clients:
                    effects.append(Revoke(client, self.index, lease.id, "overrun"))
                self.stats.overruns += 1
                self.stats.revoked["overrun"] += 1
                self._end_lease(lease, now)
        effects += self._schedule(now)
        self.ent.move(self._with_demand(), now)  # several instances may have lost demand at once
        return effects

    def next_wakeup(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do."""
        # asked after every acquire and release: the cheap tests first
        times = []
        if self.native:  # the first ends first (model.py), unless one was revoked: then each is looked at
            if self.native_revoked:
                end = min(n.deadline_ns if n.revoked_ns is None else n.revoked_ns for n in self.native.values())
            else:
                end = next(iter(self.native.values())).deadline_ns
            end += self.overrun_ns  # every native lease has the same overrun allowance
            if self.lease is None:  # native leases only (policy 5's grant path): nothing else can be due
                return end
            times.append(end)
        lease = self.lease
        if lease is not None:
            times.append(self._cutoff(lease))
            if (hp := self.hp.wakeup(lease)) is not None:
                times.append(hp)
        elif not self.native and not self.policy.concurrent and any(i.waiters for i in self.instances.values()):
            for t in (self.hp.wakeup(None), self.policy.wakeup()):
                if t is not None:
                    times.append(t)
        return min(times) if times else None

    # ------------------------------------------------------------- internals
    def _next_lease_id(self) -> int:
        return self.next_lease_id()

    def _inst(self, name: str) -> InstanceState:
        try:
            return self.instances[name]
        except KeyError:
            raise NotFoundError(f"no instance {name} on GPU {self.index}") from None

    def _leases_of(self, client: int) -> list[Lease]:
        """The leases ``client`` holds: its own under policy 5 (keyed by it), and the shared one."""
        own = self.native.get(client)
        if own is None and self.lease is None:  # the usual acquire: nothing held
            return []
        leases = []
        if own is not None and client in own.clients:
            leases.append(own)
        if self.lease is not None and client in self.lease.clients:
            leases.append(self.lease)
        return leases

    def _measure(self, lease: Lease, now: int, used_ns: int, warmup_ns: int) -> None:
        """One lease's hand-over: what nobody could use of it. Billed to nobody; feeds the meter.

        Its transit (``used_ns``) and warm-up are the client's word: they are credited only up to
        :meth:`credit_cap`, which the daemon derives from the slice it sized and from the other tenants,
        so a client that claims more gains nothing by it, and sizes neither the slice nor its own turns.
        A renewal (the same instance again, at once: alone, or a second turn in a row) changed no hands:
        what it lost is not billed either, but it neither sizes the slice nor lengthens the instance's
        turns, which must pay for real hand-overs (an instance alone for a while would otherwise come
        back to contention with a slice and turns sized for none)."""
        overhead = max(0, now - lease.granted_ns - used_ns) + warmup_ns
        cap = self.credit_cap(lease.inst)
        if not lease.renewal:
            inst = lease.inst
            inst.handovers += 1
            claim = min(overhead, SAMPLE_MAX_NS)
            inst.claimed_ns = _running_mean(inst.claimed_ns, claim, inst.handovers)
        if overhead > cap:
            overhead = cap
            warmup_ns = min(warmup_ns, cap)
        if not lease.renewal and self.handover.observe(overhead, warmup_ns):
            self._refresh_slice(now)
        kept = min(self.handover.discount(overhead), cap)
        lease.discount_ns = min(kept, now - lease.granted_ns)
        if not self.policy.concurrent and not lease.renewal:
            self._follow_own_handover(lease.inst, kept, now)

    def credit_cap(self, inst: InstanceState) -> int:
        """The most of one lease's hand-over (its transit and warm-up: the client's word) credited to ``inst``.

        CAP_OTHERS x the lower quartile of what the other instances' clients report their hand-overs cost (the
        least of them, up to four others); while no other has reported one, CAP_TARGETS x handover_target_pct of
        the slice ``auto`` would choose from what was credited so far (of the longest it may choose, before
        anything was), or of the slice in force if longer, plus CAP_FLOOR_NS.

        A lie is thus credited at most CAP_OTHERS times what an honest tenant pays, and tenants that lie together
        cannot raise each other's bound unless they are three in four; at the defaults the auto slice stretches
        with what is credited, so a liar's gain stays within about 2 % of its lease (tests/security/
        test_claims.py). An honest tenant whose hand-over is more than CAP_OTHERS times the others' pays the excess
        itself. A tenant that reports less than it pays lowers the others' bound, but loses as much itself."""
        others = sorted(i.claimed_ns for i in self.instances.values() if i is not inst and i.claimed_ns >= 0)
        if others:
            return others[(len(others) - 1) // 4] * CAP_OTHERS
        s = self.settings
        auto = (s.slice_max_ms * NS_PER_MS if inst.handovers == 0 and not self.handover.count
                else self.handover.auto_slice_ns(s.handover_target_pct, s.slice_min_ms, s.slice_max_ms))
        return int(max(self.slice_ns, auto) * s.handover_target_pct * CAP_TARGETS) // 100 + CAP_FLOOR_NS

    def _follow_own_handover(self, inst: InstanceState, kept: int, now: int) -> None:
        """An instance's turns are lengthened by its own expected hand-over: one process may pay more than
        another (one that wakes after the GPU idled, a slow starter), and the GPU's mean would leave it short
        and the others long. A running mean of its bounded overheads; the extension follows it once it has
        moved by 5 % and 20 µs, so rings are not rebuilt for every sample."""
        own = _running_mean(inst.handover_ns, kept, inst.handovers)
        inst.handover_ns = own
        own = max(0, own)
        moved = abs(own - inst.extension_ns)
        if inst.extension_ns < 0 or (moved * 20 > inst.extension_ns and moved > 20_000):
            inst.extension_ns = own
            self.policy.changed(now)

    def _cutoff(self, lease: Lease) -> int:
        base = lease.revoked_ns if lease.revoked_ns is not None else lease.deadline_ns
        return base + self.overrun_ns

    def _drop_holder(self, lease: Lease, client: int, now: int) -> None:
        lease.clients.discard(client)
        if not lease.clients:
            self._end_lease(lease, now)

    def _end_lease(self, lease: Lease, now: int) -> None:
        """End ``lease`` at ``now``: its instance's books, the GPU's busy time, and the bill of the class that
        granted it (none for a native lease while the native policy is in force: no turns to be fair about)."""
        if self.hp.members:  # with none, the credit only fills to its cap: accrued in one step when one comes
            self.hp.accrue(now)  # (a native lease's too: the cap in force now bounds the credit banked until now)
        client = lease.native_client
        held = now - lease.granted_ns
        billed = held - lease.discount_ns if held > lease.discount_ns else 0  # its useful time: held less hand-over
        inst = lease.inst
        self.last_ended = (inst, now)
        inst.held_ns += held
        inst.useful_ns += billed
        inst.leases -= 1
        if now > lease.deadline_ns:
            self.stats.late_releases += 1
        lease.clients.clear()
        if client is None:
            if lease is self.lease:
                self.lease = None
        elif self.native.get(client) is lease:
            del self.native[client]
            if lease.revoked_ns is not None:
                self.native_revoked -= 1
        if self.busy_since is not None and self.lease is None and not self.native:
            self.stats.busy_ns += now - self.busy_since
            self.busy_since = None
        owner = lease.owner if lease.owner is not None else self.policy
        if not owner.bills:
            return
        overrun = max(0, lease.granted_ns + billed - (lease.deadline_ns - lease.extension_ns))
        charged = owner.charge(lease, Bill(held, billed, overrun, now))
        if charged:
            self.charge_vtime(inst, charged, self.policy.vtime_weight(inst))
        self.policy.after_charge(inst)

    def _schedule(self, now: int, arrived: InstanceState | None = None) -> list[Effect]:
        """Hand the GPU to whoever should have it now: high priority first, then the policy.

        ``arrived``: the one instance that just gained a waiter, if that is all that changed (a concurrent
        policy, which grants every waiter on arrival, then looks at it alone)."""
        if self.policy.concurrent:
            return self.policy.pick(now) if arrived is None else self.policy.pick_for(arrived, now)
        if self.native:
            return []  # draining leases granted under the native policy
        self.hp.accrue(now)
        lease = self.lease
        if lease is not None:
            for cls in (self.hp, self.policy):
                effects = cls.holder_check(lease, now)
                if effects is not None:
                    return effects
            return []
        picked = self.hp.pick(now)
        return picked if picked is not None else self.policy.pick(now)


def _running_mean(mean: int, sample: int, n: int) -> int:
    """A running mean over about OWN_HANDOVER_LEASES samples; over the first ones, their plain mean."""
    if mean < 0 or n <= 1:
        return sample
    return mean + (sample - mean) // min(n, OWN_HANDOVER_LEASES)


__all__ = ["NATIVE", "GpuScheduler", "GpuSettings", "SettingError"]
