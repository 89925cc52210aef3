"""What each instance is owed, integrated over time: entitled, owed and demand seconds.

At every moment an instance is *entitled* to a share of the GPU that follows
from the policy, its settings and which instances have demand
(:meth:`GpuScheduler.entitled`). Integrated over time that is
``entitled_ns``, the counter an operator compares with the time it was
delivered (its useful time). Two more integrals make the comparison fair:

* ``demand_ns``: the time it had demand (waiting for, or holding, a lease);
* ``owed_ns``: its entitlement counted only while it had demand. On policies 0,
  2 and 3 an idle instance keeps its entitlement (its turns pass with the GPU
  idle), but it is not under-served for time it did not ask for: its error is
  delivered less *owed*.

The shares change only when the set of instances with demand or a setting
changes, so they are recomputed then, and the integrals advance event by event
(exactly, on the virtual clock).
"""

from __future__ import annotations

from collections.abc import Mapping

from arbiterd.core.model import InstanceState


class Entitlement:
    """The shares in force since ``at``, for the instances ``active`` with demand."""

    def __init__(self, now: int) -> None:
        self.at = now
        self.active: frozenset[str] = frozenset()
        self.shares: dict[str, float] = {}

    def accrue(self, instances: Mapping[str, InstanceState], now: int) -> None:
        """Advance every instance's integrals to ``now`` under the shares in force."""
        dt = now - self.at
        if dt <= 0:
            return
        for name, share in self.shares.items():
            inst = instances.get(name)
            if inst is None or not share:
                continue
            inst.entitled_ns += share * dt
            if name in self.active:
                inst.owed_ns += share * dt
        for name in self.active:
            inst = instances.get(name)
            if inst is not None:
                inst.demand_ns += dt
        self.at = now

    def pending(self, inst: InstanceState, now: int) -> tuple[float, float, int]:
        """``inst``'s (entitled, owed, demand) ns up to ``now``, without advancing anything."""
        dt = max(0, now - self.at)
        share = self.shares.get(inst.name, 0.0)
        on = inst.name in self.active
        return (inst.entitled_ns + share * dt, inst.owed_ns + (share * dt if on else 0.0),
                inst.demand_ns + (dt if on else 0))
