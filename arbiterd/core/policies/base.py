"""What every policy class provides: the scheduler calls through this and never asks which it holds.

Like Linux's ``struct sched_class``: the scheduler reaches a policy only through
these hooks: an acquire (:meth:`acquire`), a release (:meth:`released`), the
next step (:meth:`schedule`), its next timer (:meth:`wakeup_at`), what each
instance is owed (:meth:`entitled`). The defaults are those of the time-sliced
policies, which hand one lease from instance to instance: they ask the
high-priority class first and themselves second, for a verdict on the current
holder (:meth:`holder_check`) or for the next grant (:meth:`pick`). A class that
works otherwise (the native policy, which gives every client a lease of its own
at once) overrides the hooks and keeps its leases itself (:attr:`leases`). A
lease is charged by the class that granted it (:meth:`charge`), so a lease
granted under an old policy is billed by that policy's rules even after the
switch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import ClassVar

from arbiterd.core.accounting import running_mean
from arbiterd.core.effects import Effect, GrantLease
from arbiterd.core.limits import waterfill
from arbiterd.core.model import Bill, InstanceState, Lease, Runqueue
from arbiterd.core.policies.highprio import HighPriority
from arbiterd.core.settings import NO_LIMIT

NO_LEASES: Mapping[int, Lease] = MappingProxyType({})


class Policy:
    """One scheduling policy of one GPU (the defaults are those of the time-sliced policies)."""

    number: ClassVar[int]
    name: ClassVar[str]
    conserving: ClassVar[bool] = False  # time nobody with demand wants goes to whoever wants it
    # a release that grants nothing may bring the next deadline earlier (not where every client has its own lease:
    # the daemon's timer is then left alone)
    release_moves_timer: ClassVar[bool] = True
    bills: bool = True  # its leases are billed when they end (native, in force, has no turns to bill)
    honours_limits: bool = False  # instances' limits are in force under it (limits.py)
    leases: Mapping[int, Lease] = NO_LEASES  # the leases it keeps itself, by client (the native policy's)

    def __init__(self, gpu: Runqueue, hp: HighPriority, now: int) -> None:
        self.gpu = gpu
        self.hp = hp
        self.retired = False  # the GPU switched to another policy; leases it granted may still end

    def retire(self) -> None:
        """The GPU switched to another policy: leases this one granted may still end, and are billed."""
        self.retired = True
        self.bills = True

    # membership -------------------------------------------------------------
    def changed(self, now: int) -> None:
        """Instances, weights, priorities, max_inst or the slice changed."""

    def demand(self, inst: InstanceState, now: int) -> None:
        """``inst`` starts to want the GPU (it had neither a waiter nor a lease)."""

    def removed(self, inst: InstanceState) -> None:
        """``inst`` is gone."""

    def weight_switch(self, weight: int) -> int | None:
        """The policy a GPU on this one switches to when an instance of ``weight`` joins, if any."""
        return None

    def keeps(self, lease: Lease) -> bool:
        """Whether ``lease``, granted before the GPU switched to this policy, runs on to its end (else it is
        revoked, its time void)."""
        return False

    # the scheduler's hooks --------------------------------------------------
    def acquire(self, inst: InstanceState, client: int, now: int) -> list[Effect] | None:
        """``client`` of ``inst`` (which it does not hold a lease of) wants the GPU: the effects if it is answered
        at once, else None (it waits, and :meth:`schedule` runs). Here: it joins its instance's current lease."""
        gpu = self.gpu
        self.refill(now)
        lease = gpu.lease
        if lease is not None and lease.inst is inst and lease.revoked_ns is None and now < lease.deadline_ns:
            lease.clients.add(client)
            return [GrantLease(client, gpu.index, lease.id, lease.deadline_ns, 0)]
        if not inst.waiters and not inst.leases:
            self.demand(inst, now)
            if inst.limit < NO_LIMIT:
                self.gpu.bw.woke(inst, now)
        return None

    def schedule(self, now: int, arrived: InstanceState | None = None) -> list[Effect]:
        """Hand the GPU to whoever should have it now: high priority first, then this policy. Nothing while a
        policy switched away from still has leases of its own running. ``arrived``: the one instance that just
        gained a waiter, if that is all that changed."""
        gpu = self.gpu
        if gpu.draining:
            return []
        self.refill(now)
        hp = self.hp
        hp.accrue(now)
        lease = gpu.lease
        gangs = gpu.gangs
        if lease is not None:
            effects = hp.holder_check(lease, now)
            if effects is None and gangs.active:
                effects = gangs.holder_check(lease, now)
            if effects is None:
                effects = self.holder_check(lease, now)
            return effects or []
        picked = hp.pick(now)
        if picked is None and gangs.active:
            picked = gangs.pick(now)
        return picked if picked is not None else self.pick(now)

    def released(self, now: int) -> list[Effect]:
        """A lease ended by its release (its clients have no more work): what follows."""
        return self.schedule(now)

    def wakeup_at(self, overrun_ns: int) -> int | None:
        """When the scheduler's :meth:`tick` next has something to do for this policy and the current lease."""
        gpu = self.gpu
        lease = gpu.lease
        refill = gpu.bw.wakeup() if gpu.bw.quotas and self.honours_limits else None
        if lease is not None:
            at = lease.cutoff(overrun_ns)
            hp = self.hp.wakeup(lease)
            at = at if hp is None or hp > at else hp
            if gpu.gangs.active and (gang := gpu.gangs.wakeup()) is not None and gang < at:
                at = gang
            return at if refill is None or refill > at else refill
        gang = gpu.gangs.wakeup() if gpu.gangs.active else None
        if gpu.draining or not any(i.waiters for i in gpu.instances.values()):
            return gang
        times = [t for t in (self.hp.wakeup(None), self.wakeup(), refill, gang) if t is not None]
        return min(times) if times else None

    def entitled(self, live: list[InstanceState], starved: list[InstanceState], active: Collection[str]
                 ) -> dict[str, float]:
        """The share of GPU time each instance of ``live`` (weight above 0) and ``starved`` (weight 0 with demand,
        owed what its requested weight would give it) is owed while ``active`` have demand."""
        normals = [i for i in live if not i.highprio]
        hp, rest = self.hp.shares(active, self.conserving, any(i.name in active for i in normals), self.limited())
        ours = self.shares(normals, active, rest)
        out = {**hp, **ours}
        if self.honours_limits and any(i.limit < NO_LIMIT for i in live):
            out = self.capped(normals, active, out, rest - sum(ours.values()))
        for inst in starved:
            ghost = dataclasses.replace(inst, weight=min(inst.requested, self.gpu.settings.max_inst))
            if inst.highprio:
                hp_as, _ = self.hp.shares(active, self.conserving, True, extra=ghost)
                out[inst.name] = hp_as.get(inst.name, 0.0)
            else:
                out[inst.name] = self.shares([*normals, ghost], active, rest)[inst.name]
        return out

    def limited(self) -> bool:
        """Whether limits shape the shares now: they are in force, and some instance has one."""
        return self.honours_limits and bool(self.gpu.bw.quotas)

    def capped(self, normals: list[InstanceState], active: Collection[str], out: dict[str, float], left: float
               ) -> dict[str, float]:
        """The shares ``out`` under the normal instances' limits (the high-priority ones' are already in):
        :meth:`shares` split ``left`` of what high priority leaves; on a work-conserving policy the normal
        instances with demand water-fill it under their limits, and what they leave goes to the high-priority
        ones with demand below theirs (time no normal instance wants); elsewhere each keeps ``min(share,
        limit)`` and the rest passes idle."""
        caps = {i.name: i.limit / 100 for i in normals if i.limit < NO_LIMIT}
        if not self.conserving:
            return {n: min(s, caps.get(n, s)) for n, s in out.items()}
        # a gang's members keep the gang's share (gang.py water-filled it already); the others share what is left
        gangs = self.gpu.gangs.shares(active, left) if self.gpu.gangs.active else {}
        want = [i for i in normals if i.name in active and i.name not in gangs]
        total = sum(out[i.name] for i in want) + left
        out.update(waterfill({i.name: self.vtime_weight(i) for i in want}, caps, total))
        spare = total - sum(out[i.name] for i in want)
        hp = [i for i in self.hp.members if i.weight > 0 and i.name in active]
        if spare > 1e-12 and hp:
            base = {i.name: out.get(i.name, 0.0) for i in hp}
            more = waterfill({i.name: i.weight for i in hp},
                             {i.name: i.limit / 100 - base[i.name] for i in hp if i.limit < NO_LIMIT}, spare)
            for name, extra in more.items():
                out[name] = base[name] + extra
        return out

    def refill(self, now: int) -> None:
        """Start the limits' periods that began by ``now`` (limits.py), before anything is decided at ``now``."""
        bw = self.gpu.bw
        if bw.quotas and now >= bw.next_ns:
            for inst in bw.refill(now):
                self.unthrottled(inst, now)

    def unthrottled(self, inst: InstanceState, now: int) -> None:
        """``inst``, waiting, has runtime again (limits.py): it joins the round as one that gains demand does (it
        took no turns while throttled, and may not bring back credit from then)."""
        self.demand(inst, now)

    def own_handover(self, inst: InstanceState, kept: int, now: int) -> None:
        """One of ``inst``'s hand-overs was measured (``kept``: what was credited of it): its turns are lengthened
        by its own expected hand-over, a running mean of its credited ones (one process may pay more than another:
        one that wakes after the GPU idled, a slow starter; the GPU's mean would leave it short and the others
        long). The extension follows the mean once it has moved by 5 % and 20 µs, so turns are not re-planned for
        every sample."""
        own = running_mean(inst.handover_ns, kept, inst.handovers)
        inst.handover_ns = own
        own = max(0, own)
        moved = abs(own - inst.extension_ns)
        if inst.extension_ns < 0 or (moved * 20 > inst.extension_ns and moved > 20_000):
            inst.extension_ns = own
            self.changed(now)

    def first_cutoff(self, overrun_ns: int) -> int | None:
        """When the first of the leases it keeps itself is cut off, if it keeps any."""
        return None

    def forget(self, lease: Lease) -> None:
        """``lease``, which this class granted, ended (a class that keeps its leases drops it)."""

    def revoked(self, lease: Lease) -> None:
        """``lease``, which this class granted, was revoked."""

    # the policy's own choices -------------------------------------------------
    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        """Effects for the current holder (a cut-back or revoke), or None to keep it."""
        return None

    def pick(self, now: int) -> list[Effect]:
        """Grant the GPU to whoever should have it now (nothing: it stays idle)."""
        raise NotImplementedError

    def wakeup(self) -> int | None:
        """When this policy next wants :meth:`pick` called while clients wait, if ever."""
        return None

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        """The share of GPU time each normal instance is owed while ``active`` have demand.

        ``rest`` is what high priority leaves to the normal instances.
        """
        raise NotImplementedError

    # accounting ----------------------------------------------------------------
    def vtime_weight(self, inst: InstanceState) -> int:
        """The weight that divides ``inst``'s virtual-time charges."""
        return max(inst.weight, 1)

    def charge(self, lease: Lease, bill: Bill) -> int:
        """The time ``lease`` is billed (virtual time); overrun becomes debt for the next turn."""
        self.gpu.add_debt(lease.inst, bill.overrun)
        return max(0, bill.billed - bill.overrun - lease.prepaid_ns)

    def after_charge(self, inst: InstanceState | None) -> None:
        """A lease of ``inst`` has been charged (keeps the virtual-time floor)."""

