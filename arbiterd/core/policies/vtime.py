"""Policies 1, 2 and 4: the next holder by weighted virtual time, like Linux CFS.

Holding for ``t`` ns adds ``t * VR_SCALE / weight`` to an instance's
``vruntime`` and the smallest goes next. An instance that comes back from idle
joins at the tail of the round (never below the GPU's ``min_vr``, which only
moves forward), so it cannot bank credit and nobody waits more than one round.
1 (preemptive) counts every weight as 1, one slice a turn, and skips instances
without demand; 2 (weighted) gives ``weight`` slices a turn and lets an idle
instance's turn pass with the GPU idle (an early release keeps the rest of the
turn idle too); 4 (weak) is weighted and work-conserving. A lease is extended
while no other instance wants the GPU; when another starts to wait, the
holder keeps its nominal turn and no more. Time held past a deadline is debt,
paid by shortening or skipping the next turn.
"""

from __future__ import annotations

from collections.abc import Collection

from arbiterd.core.effects import Effect, GrantLease
from arbiterd.core.model import EXTENDED_NS, VR_SCALE, Bill, InstanceState, Lease, Runqueue
from arbiterd.core.policies.base import Policy
from arbiterd.core.policies.highprio import HighPriority


class VirtualTime(Policy):
    """The virtual-time mechanics shared by policies 1, 2 and 4."""

    conserving = True
    honours_limits = True

    def __init__(self, gpu: Runqueue, hp: HighPriority, now: int) -> None:
        super().__init__(gpu, hp, now)
        # a turn cut short where a gang starts: its instance, its useful length, and the instance's virtual time
        # and weight at its grant. Its rest (the length less what the cut turn was billed) goes first once the
        # gang's turn is over, as a task preempted goes on where it stopped
        self.resume: tuple[InstanceState, int, int, int] | None = None

    def demand(self, inst: InstanceState, now: int) -> None:
        """Put an instance that (re)gains demand at the tail of the current round.

        It joins behind every instance that already has demand, so it waits at most
        one round, and it cannot bring back credit from before it went idle. A holder
        counts with the time of its running lease (which is charged only at release).
        """
        gpu = self.gpu
        bw = gpu.bw
        active = [i.vruntime for i in gpu.instances.values()
                  if i is not inst and i.weight > 0 and not i.gang and i.waiters and not bw.throttled(i)]
        for lease in gpu.holders():
            if lease.inst is not inst and lease.inst.weight > 0 and not lease.inst.gang:
                # up to the turn's end only: time past it is debt, charged at the holder's next turn
                useful_end = lease.deadline_ns - lease.extension_ns
                running = max(0, min(now, useful_end) - lease.granted_ns - lease.prepaid_ns)
                active.append(lease.inst.vruntime + running * VR_SCALE // self.vtime_weight(lease.inst))
        inst.vruntime = max([inst.vruntime, gpu.min_vr, *active])

    def counts_for_floor(self, inst: InstanceState) -> bool:
        """Whether ``inst`` holds ``min_vr`` back though it has no demand."""
        return False

    def after_charge(self, inst: InstanceState | None) -> None:
        """Move ``min_vr`` forward to the least vruntime among instances with demand.

        ``inst``, whose lease just ended, counts too (as CFS counts ``curr``): while
        one instance runs alone, ``min_vr`` follows it, so an instance that comes back
        later cannot claim that time.
        """
        gpu = self.gpu
        bw = gpu.bw
        active = [i.vruntime for i in gpu.instances.values()
                  if i.weight > 0 and not i.gang and (i.leases or i is inst or self.counts_for_floor(i)
                                       or (i.waiters and not bw.throttled(i)))]
        if active:
            gpu.min_vr = max(gpu.min_vr, min(active))

    def round_weight(self) -> int:
        """The slices one round of turns takes: the weights of the normal instances with demand (a gang's
        included: its turns are part of the round, gang.py)."""
        return sum(self.vtime_weight(i) for i in self.gpu.instances.values()
                   if i.weight > 0 and not i.highprio and (i.waiters or i.leases))

    def turn_slice_ns(self) -> int:
        """The slice of this round: the slice in force, cut to fit the round target (Runqueue.round_slice_ns)."""
        return self.gpu.round_slice_ns(self.round_weight())

    def turn_ns(self, inst: InstanceState) -> int:
        """The nominal length of one turn of ``inst``: ``weight`` slices."""
        return inst.weight * self.turn_slice_ns()

    def contended(self, inst: InstanceState) -> bool:
        """Whether another instance wants the GPU that ``inst`` holds: a normal one (a high-priority one with credit
        preempts by itself; a gang's member takes its turn when its gang is armed, which cuts an extended holder
        back itself, gang.py), or any at all where ``inst`` is high priority, on leftover time."""
        gpu = self.gpu
        others: list[InstanceState] | Collection[InstanceState] = (
            gpu.instances.values() if inst.highprio else gpu.normal_members())
        bw = gpu.bw
        return any(i.waiters and not bw.throttled(i) for i in others if i is not inst and i.weight > 0)

    def pay_debt(self, inst: InstanceState, full: int) -> int:
        """Length of the lease ``inst`` gets for a turn of ``full`` ns after paying its debt.

        A debt of a whole turn or more skips the turn (charged as used): 0 is returned.
        """
        w = self.vtime_weight(inst)
        if inst.debt_ns >= full:
            inst.debt_ns -= full
            inst.vruntime += full * VR_SCALE // w
            return 0
        length = full - inst.debt_ns
        inst.vruntime += inst.debt_ns * VR_SCALE // w
        inst.debt_ns = 0
        return length

    def next_turn(self, candidates: list[InstanceState]) -> tuple[InstanceState, int]:
        """The next instance and its lease length, once debts are paid (debts only shrink, so this ends)."""
        while True:
            inst = self.gpu.pick(candidates)
            assert inst is not None
            length = self.pay_debt(inst, self.turn_ns(inst))
            if length > 0:
                return inst, length

    def grant_turn(self, inst: InstanceState, now: int, length: int) -> list[Effect]:
        """Grant a turn of ``length`` useful ns, lengthened by the expected hand-over; extend it while
        nobody else wants the GPU (no renewals when alone), a high-priority instance's leftover time too."""
        ext = self.gpu.extension_for(inst)
        cut = self.gang_cut(now)
        if cut is not None and (cut[1] or cut[0] < now + length + ext - length // 2):
            # a gang starts there (armed): the turn fills the gap up to it (gang.py); or a gang is due there and the
            # turn would run on more than half its length past it: it ends there. Cut wherever it runs past, a
            # turn costs a hand-over more each time (its tenants 1 to 2 pp on the fake driver); never cut, it made
            # the gang wait up to a whole turn more
            end, ext = min(now + length + ext, cut[0]), min(ext, cut[0] - now)
            if end - now - ext < length:
                self.resume = (inst, length, inst.vruntime, self.vtime_weight(inst))
            return self.gpu.grant(inst, now, end, self, extension=ext)
        if self.contended(inst):
            return self.gpu.grant(inst, now, now + length + ext, self, extension=ext)
        effects = self.gpu.grant(inst, now, now + max(length + ext, EXTENDED_NS), self, extension=ext)
        lease = self.gpu.lease
        assert lease is not None
        lease.nominal_ns = min(now + length + ext, lease.deadline_ns)  # a limit may have cut it (limits.py)
        return effects

    def gang_cut(self, now: int) -> tuple[int, bool] | None:
        """Where a turn granted now must end for a gang over this GPU, and whether it must end there whatever its
        length (a gang armed: :meth:`GangHooks.fence`) or only if it would run past it (a gang due then:
        :meth:`GangHooks.due`)."""
        gangs = self.gpu.gangs
        if not gangs.active:
            return None
        if (fence := gangs.fence(now)) is not None:
            return fence, True
        if (due := gangs.due(now)) is not None:
            return due, False
        return None

    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        """Someone else wants the GPU: an extended holder keeps its nominal turn, and no more."""
        nominal = lease.nominal_ns
        if nominal is None or lease.revoked_ns is not None or not self.contended(lease.inst):
            return None
        lease.nominal_ns = None
        if now >= nominal:
            lease.deadline_ns = now  # the turn is over: not an early release, no idle rest of turn
            return self.gpu.revoke(lease, now, "turn")
        lease.deadline_ns = nominal
        return [GrantLease(c, self.gpu.index, lease.id, nominal, 0) for c in sorted(lease.clients)]

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        """Work-conserving: weights among the instances with demand; a gang's members take the gang's share
        first (gang.py), and the others share what is left."""
        gangs = self.gpu.gangs.shares(active, rest) if self.gpu.gangs.active else {}
        if gangs:
            rest -= sum(gangs.values())
            members = [i for i in members if i.name not in gangs]
        total = sum(self.vtime_weight(i) for i in members if i.name in active) or 1
        out = {i.name: rest * self.vtime_weight(i) / total if i.name in active else 0.0 for i in members}
        out.update(gangs)
        return out

    def pick(self, now: int) -> list[Effect]:
        """Work-conserving: the least virtual time among instances with demand."""
        gpu = self.gpu
        bw = gpu.bw
        candidates = [i for i in gpu.normal_members() if i.waiters and not bw.throttled(i)]
        if not candidates:  # leftover time goes to high-priority instances past their cap
            candidates = [i for i in gpu.instances.values()
                          if i.weight > 0 and not i.gang and i.waiters and not bw.throttled(i)]
        if not candidates:
            return []
        resume, self.resume = self.resume, None
        if resume is not None and resume[0] in candidates and self.vtime_weight(resume[0]) == resume[3]:
            # the rest of a turn a gang cut short (unless its weight changed since). Taken by virtual time, an
            # instance that had part of its turn was behind by the rest: with little of it had, it went after the
            # others; with most, it had a whole turn more right away. Either way another waited a round and more
            inst, length, vr, weight = resume
            rest = length - (inst.vruntime - vr) * weight // VR_SCALE
            if rest > gpu.extension_for(inst):
                return self.grant_turn(inst, now, rest)
            if rest > 0:  # no longer than its hand-over, which would take it all: counted as had
                gpu.charge_vtime(inst, rest, weight)
        inst, length = self.next_turn(candidates)
        return self.grant_turn(inst, now, length)


class Preemptive(VirtualTime):
    number = 1
    name = "preemptive"

    def vtime_weight(self, inst: InstanceState) -> int:
        return 1

    def turn_ns(self, inst: InstanceState) -> int:
        return self.turn_slice_ns()

    def weight_switch(self, weight: int) -> int | None:
        return Weighted.number if weight > 1 else None


class Weak(VirtualTime):
    number = 4
    name = "weak"


class Weighted(VirtualTime):
    number = 2
    name = "weighted"
    conserving = False

    def __init__(self, gpu: Runqueue, hp: HighPriority, now: int) -> None:
        super().__init__(gpu, hp, now)
        self.turn: tuple[InstanceState, int] | None = None  # the owner of an idle turn, and its end
        self.owed = 0  # hand-overs granted as turn extensions since the last idle turn, paid by idle time

    def removed(self, inst: InstanceState) -> None:
        if self.turn is not None and self.turn[0] is inst:
            self.turn = None

    def counts_for_floor(self, inst: InstanceState) -> bool:
        return True  # a registered instance's turns pass even while it is idle

    def round_weight(self) -> int:
        return sum(i.weight for i in self.gpu.normal_members())  # idle turns are part of the round

    def contended(self, inst: InstanceState) -> bool:
        return any(i is not inst for i in self.gpu.normal_members())

    def unthrottled(self, inst: InstanceState, now: int) -> None:
        """Its turns passed idle while it was throttled, and were charged: it keeps its place."""

    def charge(self, lease: Lease, bill: Bill) -> int:
        """An early release keeps the turn: the rest passes idle unless the owner comes back. A revoked lease (a
        high-priority instance preempting it) did not give its turn up: it is charged what it held, as on the
        other policies, and its next turn comes as its virtual time says. Kept as an idle turn, the rest of it
        passed while the high-priority instance held the GPU and was charged too, so whichever normal instance
        the preemptions fell on lost (6.7 / 33.3 % for two equal ones beside one at prio_ratio 60)."""
        early = bill.end < lease.deadline_ns
        if (not self.retired and lease.nominal_ns is None and early and lease.revoked_ns is None
                and not self.gpu.draining):
            self.turn = (lease.inst, lease.deadline_ns)
            return max(0, lease.deadline_ns - lease.extension_ns - lease.granted_ns - lease.prepaid_ns)
        return super().charge(lease, bill)

    def wakeup(self) -> int | None:
        return self.turn[1] if self.turn is not None else None

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        """Weights among all registered instances: an idle one keeps its share, its turns passing idle."""
        total = sum(i.weight for i in members) or 1
        return {i.name: rest * i.weight / total for i in members}

    def pick(self, now: int) -> list[Effect]:
        gpu = self.gpu
        bw = gpu.bw
        if self.turn is not None:
            owner, end = self.turn
            if now < end:
                if owner.waiters and not bw.throttled(owner):
                    self.turn = None
                    return gpu.grant(owner, now, end, self, prepaid=end - now)
                return []
            self.turn = None
        members = gpu.normal_members()
        if not any(i.waiters and not bw.throttled(i) for i in members):
            return []
        inst, length = self.next_turn(members)
        if inst.waiters and not bw.throttled(inst):  # a throttled one's turn passes idle, as an idle one's does
            self.owed += gpu.extension_for(inst)
            return self.grant_turn(inst, now, length)
        inst.vruntime += length * VR_SCALE // inst.weight
        gpu.turns += 1
        inst.served = gpu.turns  # an idle turn is a turn
        # it passes with the GPU idle, less the hand-overs the others' turns were lengthened by: they
        # cost nobody a share, so the instances with work get exactly theirs
        paid = min(self.owed, length)
        self.owed -= paid
        self.turn = (inst, now + length - paid)
        self.after_charge(None)
        return []
