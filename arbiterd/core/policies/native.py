"""Policy 5, native: no time slicing. Every request is granted at once, concurrently.

Each client gets a lease of its own with a long deadline, which this class keeps
(:attr:`Native.leases`, beside the GPU's current lease); only memory isolation
and accounting remain. After a switch to another policy its leases run on to
their ends, and no turn is granted until they have (the GPU's ``draining``).
"""

from __future__ import annotations

from collections.abc import Collection

from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease
from arbiterd.core.model import Bill, InstanceState, Lease, Runqueue
from arbiterd.core.policies.base import Policy
from arbiterd.core.policies.highprio import HighPriority

NATIVE_LEASE_NS = 1000 * NS_PER_MS


class Native(Policy):
    number = 5
    name = "native"
    release_moves_timer = False  # every waiter was granted on arrival: a release frees nothing anyone waits for
    bills = False  # in force, nothing: leases run side by side, there are no turns to be fair about

    def __init__(self, gpu: Runqueue, hp: HighPriority, now: int) -> None:
        super().__init__(gpu, hp, now)
        # each client's lease, in the order granted; as every one runs NATIVE_LEASE_NS, the first ends first
        # unless one was revoked (``revokes`` counts those)
        self.leases: dict[int, Lease] = {}
        self.revokes = 0

    def keeps(self, lease: Lease) -> bool:
        """The current lease of a time-sliced policy runs on beside the native ones (it is billed at its end);
        a native lease of an earlier native policy does not."""
        return lease.client is None

    def acquire(self, inst: InstanceState, client: int, now: int) -> list[Effect] | None:
        """Granted on arrival, with no queue (unless its weight is 0, or its instance has clients waiting)."""
        if inst.weight and not inst.waiters:
            return [self.grant(inst, client, now, now)]
        return None

    def schedule(self, now: int, arrived: InstanceState | None = None) -> list[Effect]:
        """Grant every waiting client a lease of its own, at once (``arrived``: only its clients can wait)."""
        if arrived is not None:
            return self.grant_waiting(arrived, now)
        effects: list[Effect] = []
        for inst in self.gpu.instances.values():
            effects += self.grant_waiting(inst, now)
        return effects

    def released(self, now: int) -> list[Effect]:
        return []  # every waiter was granted on arrival: a release frees nothing anyone waits for

    def wakeup_at(self, overrun_ns: int) -> int | None:
        """The first of its leases to end (and the current lease of a time-sliced policy, running on)."""
        at = self.first_cutoff(overrun_ns)
        lease = self.gpu.lease
        if lease is not None:
            cut = lease.cutoff(overrun_ns)
            at = cut if at is None or cut < at else at
        return at

    def first_cutoff(self, overrun_ns: int) -> int | None:
        """When the first of its leases is cut off, if it has any."""
        if not self.leases:
            return None
        if self.revokes:  # one was revoked: each is looked at
            return min(n.cutoff(overrun_ns) for n in self.leases.values())
        return next(iter(self.leases.values())).deadline_ns + overrun_ns

    def entitled(self, live: list[InstanceState], starved: list[InstanceState], active: Collection[str]
                 ) -> dict[str, float]:
        """Every instance with demand is owed all of the GPU: the leases run side by side."""
        return {**self.shares(live, active, 1.0), **{i.name: 1.0 for i in starved}}

    def own_handover(self, inst: InstanceState, kept: int, now: int) -> None:
        """There are no turns to lengthen."""

    def grant_waiting(self, inst: InstanceState, now: int) -> list[Effect]:
        """Grant every waiting client of ``inst`` a lease of its own, at once (none if its weight is 0)."""
        if not inst.waiters or inst.weight == 0:
            return []
        effects: list[Effect] = [self.grant(inst, client, t, now) for client, t in inst.waiters.items()]
        inst.waiters.clear()
        return effects

    def grant(self, inst: InstanceState, client: int, since: int, now: int) -> GrantLease:
        """``client`` of ``inst`` (weight above 0), waiting since ``since``, gets a lease of its own now."""
        gpu = self.gpu
        lease = Lease(gpu.next_lease_id(), inst, {client}, now, now + NATIVE_LEASE_NS, self, client)
        self.leases[client] = lease
        inst.grants += 1
        inst.leases += 1
        gpu.stats.grants += 1
        gpu.waits.record(inst.name, now, now - since)
        if gpu.busy_since is None:
            gpu.busy_since = now
        return GrantLease(client, gpu.index, lease.id, lease.deadline_ns, now - since)

    def forget(self, lease: Lease) -> None:
        if lease.client is not None and self.leases.get(lease.client) is lease:
            del self.leases[lease.client]
            if lease.revoked_ns is not None:
                self.revokes -= 1

    def revoked(self, lease: Lease) -> None:
        if lease.client is not None:
            self.revokes += 1

    def charge(self, lease: Lease, bill: Bill) -> int:
        """Only once retired (while in force :attr:`bills` is false and no bill is made): a lease still draining
        after a switch is billed as every policy bills it (its time past the switch is debt for its next
        turn), as fairness starts afresh at a switch."""
        return super().charge(lease, bill) if self.retired else 0

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        return {i.name: 1.0 if i.name in active else 0.0 for i in members}
