"""Policy 5, native: no time slicing. Every request is granted at once, concurrently.

Each client gets a lease of its own with a long deadline; only memory isolation
and accounting remain.
"""

from __future__ import annotations

from collections.abc import Collection

from arbiterd.core.effects import NS_PER_MS, Effect, Grant
from arbiterd.core.model import Bill, InstanceState, Lease
from arbiterd.core.policies.base import Policy

NATIVE_LEASE_NS = 1000 * NS_PER_MS


class Native(Policy):
    number = 5
    name = "native"
    concurrent = True
    bills = False  # in force, nothing: leases run side by side, there are no turns to be fair about

    def pick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for inst in self.gpu.instances.values():
            effects += self.pick_for(inst, now)
        return effects

    def pick_for(self, inst: InstanceState, now: int) -> list[Effect]:
        """Grant every waiting client of ``inst`` a lease of its own, at once (none if its weight is 0)."""
        if not inst.waiters or inst.weight == 0:
            return []
        effects: list[Effect] = [self.grant(inst, client, t, now) for client, t in inst.waiters.items()]
        inst.waiters.clear()
        return effects

    def grant(self, inst: InstanceState, client: int, since: int, now: int) -> Grant:
        """``client`` of ``inst`` (weight above 0), waiting since ``since``, gets a lease of its own now."""
        gpu = self.gpu
        lease = Lease(gpu.next_lease_id(), inst, {client}, now, now + NATIVE_LEASE_NS, self, client)
        gpu.native[client] = lease
        inst.grants += 1
        inst.leases += 1
        gpu.stats.grants += 1
        if gpu.busy_since is None:
            gpu.busy_since = now
        return Grant(client, gpu.index, lease.id, lease.deadline_ns, now - since)

    def charge(self, lease: Lease, bill: Bill) -> int:
        """Only once retired (while in force :attr:`bills` is false and no bill is made): a lease still draining
        after a switch is billed as every policy bills it (its time past the switch is debt for its next
        turn), as fairness starts afresh at a switch."""
        return super().charge(lease, bill) if self.retired else 0

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        return {i.name: 1.0 if i.name in active else 0.0 for i in members}
