"""High priority: a class above every policy, like Linux's real-time class above CFS.

A high-priority instance runs on a credit that grows at ``prio_ratio`` % of wall
time and is spent 1:1 while it holds the GPU. While none waits, at most two
slices' worth can be banked, so it cannot come back from idle with a burst.
While one waits, what a normal holder takes past its revoke (the work it had
queued) is banked too, up to a window's worth, and the next high-priority turn
lasts as long as its credit pays for: ``prio_ratio`` holds over a window even
when the others' operations are longer than a slice. With demand and credit
for a slice it preempts a normal holder by revoke; the policy below never
sees it then. Under the work-conserving policies (1, 4) an
instance out of credit may still take time no normal instance wants: that is
the policy's choice (its candidates), not this class's.

Its preemptions are hand-overs like any other, so they are held to the same
budget: a cycle of a high-priority turn and the normal turn it preempts is a
round of two turns in the ratio ``prio_ratio`` : 100 - ``prio_ratio``, and the
shorter of the two is a whole slice (:meth:`HighPriority.turn_slice_ns`): at
``prio_ratio`` 60 the high-priority turn is 1.5 slices and the normal one a
slice, not a slice and two thirds of one. Under ``slice_ms = auto`` that slice
is cut to fit the cycle in ``latency_target_ms`` as any round is, no shorter
than ``handover_max_pct`` allows.
"""

from __future__ import annotations

from collections.abc import Collection

from arbiterd.core.effects import NS_PER_MS, NS_PER_S, Effect
from arbiterd.core.limits import waterfill
from arbiterd.core.model import Bill, InstanceState, Lease, Runqueue
from arbiterd.core.settings import AUTO, NO_LIMIT

WINDOW_NS = NS_PER_S  # the window prio_ratio is kept over: no high-priority turn is longer


class HighPriority:
    bills = True  # its leases spend credit when they end

    def __init__(self, gpu: Runqueue, now: int) -> None:
        self.gpu = gpu
        self.credit = self.cap()
        self.t = now
        self.members: tuple[InstanceState, ...] = ()  # the GPU's high-priority instances

    def changed(self) -> None:
        """An instance joined or left, or one's priority changed (the grant path asks :attr:`members`
        instead of scanning every instance)."""
        self.members = tuple(i for i in self.gpu.instances.values() if i.highprio)

    def turn_slice_ns(self) -> int:
        """The shorter turn of a cycle (the high-priority turn below ``prio_ratio`` 50, the normal one above).

        It is the slice in force, cut as :meth:`Runqueue.round_slice_ns` cuts a round's, to fit the cycle (the
        shorter turn times 100 / min(r, 100 - r)) in ``latency_target_ms``, no shorter than ``slice_min_ms`` or
        than ``handover_max_pct`` allows. A pinned slice is not cut.
        """
        gpu = self.gpu
        s = gpu.settings
        slice_ns = gpu.slice_ns
        if s.slice_ms == AUTO:
            fit = s.latency_target_ms * NS_PER_MS * min(s.prio_ratio, 100 - s.prio_ratio) // 100
            if fit < slice_ns:
                floor = max(s.slice_min_ms * NS_PER_MS, gpu.handover.shortest_slice_ns(s.handover_max_pct))
                slice_ns = min(slice_ns, max(floor, fit))
        return slice_ns

    def threshold(self) -> int:
        """The credit a high-priority turn starts with: it lasts threshold / (100 - r) and the others' turn
        before it threshold / r, so the shorter is :meth:`turn_slice_ns`; no turn is longer than a window."""
        r = self.gpu.settings.prio_ratio
        return min(max(r, 100 - r) * self.turn_slice_ns(), (100 - r) * WINDOW_NS)

    def cap(self) -> int:
        """Credit banked while no high-priority instance waits: two turns' worth."""
        return 2 * self.threshold()

    def owed_cap(self) -> int:
        """Credit banked while one waits on a normal holder: a turn of up to a window."""
        return max(self.cap(), (100 - self.gpu.settings.prio_ratio) * WINDOW_NS)

    def accrue(self, now: int) -> None:
        dt = now - self.t
        if dt <= 0:
            return
        self.t = now
        self.credit += self.gpu.settings.prio_ratio * dt
        cap = self.cap()
        if self.credit > cap:  # only then does it matter whether one waits
            lease = self.gpu.lease
            if lease is None or not lease.highprio:
                self.credit = min(self.credit, self.owed_cap() if self.waiting() else cap)

    def clamp(self) -> None:
        """After ``prio_ratio`` or the slice changed: no more banked than the new cap."""
        self.credit = min(self.credit, self.cap())

    def waiting(self) -> bool:
        """Whether a high-priority instance wants the GPU (and may have it: one throttled by its limit waits for
        its next period, and banks no credit meanwhile)."""
        bw = self.gpu.bw
        return any(i.weight > 0 and i.waiters and not bw.throttled(i) for i in self.members)

    def candidate(self) -> InstanceState | None:
        bw = self.gpu.bw
        return self.gpu.pick([i for i in self.members if i.weight > 0 and i.waiters and not bw.throttled(i)])

    def ready(self, now: int) -> bool:
        self.accrue(now)
        return self.credit >= self.threshold()

    def ready_at(self) -> int:
        missing = self.threshold() - self.credit
        if missing <= 0:
            return self.t
        return self.t + -(-missing // self.gpu.settings.prio_ratio)

    def forget(self, lease: Lease) -> None:
        """Its leases are the current one: nothing of its own to drop."""

    def revoked(self, lease: Lease) -> None:
        """Nothing to count: a revoked high-priority lease ends as any other."""

    def spend(self, held: int) -> None:
        self.credit = min(self.credit - 100 * held, self.cap())

    def charge(self, lease: Lease, bill: Bill) -> int:
        """A high-priority lease spends its credit on the time it held the GPU, hand-over included:
        ``prio_ratio`` caps what it takes from the others. Its virtual time is billed its useful time."""
        self.spend(bill.held)
        return max(0, bill.billed - lease.prepaid_ns)

    def shares(self, active: Collection[str], conserving: bool, normal_active: bool, limited: bool = False,
               extra: InstanceState | None = None) -> tuple[dict[str, float], float]:
        """What high-priority instances with demand are owed, and what that leaves to the others.

        Together they get ``prio_ratio`` %, split by weight, or all of it on a
        work-conserving policy where no normal instance wants the GPU; ``limited``:
        water-filled under their limits (limits.py), what they leave going to the
        others. ``extra`` is counted among them (a starved instance at its requested
        weight).
        """
        hp = [i for i in self.members if i.weight > 0 and i.name in active]
        if extra is not None:  # a starved instance, counted at the weight it asked for
            hp.append(extra)
        if not hp:
            return {}, 1.0
        ratio = 1.0 if conserving and not normal_active else self.gpu.settings.prio_ratio / 100
        if limited:
            out = waterfill({i.name: i.weight for i in hp}, {i.name: i.limit / 100 for i in hp if i.limit < NO_LIMIT},
                            ratio)
            return out, 1.0 - sum(out.values())
        total = sum(i.weight for i in hp)
        return {i.name: ratio * i.weight / total for i in hp}, 1.0 - ratio

    # the class interface ------------------------------------------------------
    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        """Revoke a normal holder while a high-priority instance waits with credit."""
        if not lease.highprio and self.candidate() is not None and self.ready(now):
            return self.gpu.revoke(lease, now, "highprio")
        return None

    def pick(self, now: int) -> list[Effect] | None:
        hp = self.candidate()
        if hp is None or not self.ready(now):
            return None
        r = self.gpu.settings.prio_ratio
        length = self.credit // (100 - r)  # a slice, or more where the others overran its preemption
        ext = self.gpu.extension_for(hp)
        return self.gpu.grant(hp, now, now + max(length, 1) + ext, self, highprio=True, extension=ext)

    def wakeup(self, lease: Lease | None) -> int | None:
        """When a waiting high-priority instance will have credit for a slice."""
        if lease is not None and (lease.highprio or lease.revoked_ns is not None):
            return None
        return self.ready_at() if self.candidate() is not None else None
