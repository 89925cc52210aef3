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
changes. On the grant path demand changes with nearly every acquire and
release, but between a few sets, each with the same shares every time. So each
set is kept as a :class:`DemandSet`: its shares, the time it was in force, and
the set each instance's toggle leads to. A change of demand adds the time since
the last one to the set in force and follows one link (constant time: no set
is hashed once its link is made); the sets' times are folded into the instances' integrals when
a setting or the membership is about to change the shares, or read whole when
an instance's figures are asked for. Exact on the virtual clock: a set's time
is an integer sum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from arbiterd.core.model import InstanceState

SETS_KEPT = 256  # sets of instances with demand kept apart before a fold


@dataclass(slots=True, eq=False)
class DemandSet:
    """The instances ``active`` with demand: their shares (the same every time the set comes back until the
    next fold, which comes before every change of a setting or of the membership), the time the set was in
    force since that fold, and the set that each instance's gaining or losing demand leads to."""

    active: frozenset[str]
    shares: dict[str, float]
    ns: int = 0
    after: dict[str, DemandSet] = field(default_factory=dict)



class Entitlement:
    """The set with demand in force since ``at``, every set in force since the last fold, and the integrals of
    ``instances`` they are folded into. ``shares_of`` gives the shares of a set under the settings in force."""

    def __init__(self, instances: Mapping[str, InstanceState], shares_of: Callable[[frozenset[str]], dict[str, float]],
                 now: int) -> None:
        self.instances = instances
        self.shares_of = shares_of
        self.at = now
        self._sets: dict[frozenset[str], DemandSet] = {}
        self.current = self._set(frozenset())

    @property
    def shares(self) -> dict[str, float]:
        return self.current.shares

    def toggle(self, name: str, now: int) -> None:
        """``name`` gained or lost demand at ``now`` (the grant path: one link followed)."""
        cur = self.current
        nxt = cur.after.get(name)
        if nxt is None:
            after = cur.active ^ {name}
            if after not in self._sets and len(self._sets) >= SETS_KEPT:
                self.fold(now)
                cur = self.current
            nxt = cur.after[name] = self._set(after)
        dt = now - self.at  # _advance, inline: this runs twice per acquire+release pair
        if dt > 0:
            cur.ns += dt
            self.at = now
        self.current = nxt

    def move(self, active: frozenset[str], now: int) -> None:
        """From ``now`` the instances ``active`` have demand (several may have changed at once)."""
        if active == self.current.active:
            return
        if active not in self._sets and len(self._sets) >= SETS_KEPT:
            self.fold(now)
        nxt = self._set(active)
        self._advance(now)
        self.current = nxt

    def _advance(self, now: int) -> None:
        """Add the time since the last change to the set in force (a clock that went back adds nothing)."""
        dt = now - self.at
        if dt > 0:
            self.current.ns += dt
            self.at = now

    def fold(self, now: int, active: frozenset[str] | None = None) -> None:
        """Advance every instance's integrals to ``now`` and forget the sets: before a setting or the membership
        changes a share (the shares are asked again), or when too many sets are kept. ``active``: who has demand
        from ``now`` (by default the same instances)."""
        self._advance(now)
        instances = self.instances
        for s in self._sets.values():
            if not s.ns:
                continue
            for name, share in s.shares.items():
                inst = instances.get(name)
                if inst is None or not share:
                    continue
                inst.entitled_ns += share * s.ns
                if name in s.active:
                    inst.owed_ns += share * s.ns
            for name in s.active:
                inst = instances.get(name)
                if inst is not None:
                    inst.demand_ns += s.ns
        self._sets.clear()
        self.current = self._set(self.current.active if active is None else active)

    def pending(self, inst: InstanceState, now: int) -> tuple[float, float, int]:
        """``inst``'s (entitled, owed, demand) ns up to ``now``, without advancing anything."""
        entitled, owed, demand = inst.entitled_ns, inst.owed_ns, inst.demand_ns
        name = inst.name
        for s in self._sets.values():
            dt = s.ns + (max(0, now - self.at) if s is self.current else 0)
            share = s.shares.get(name, 0.0)
            entitled += share * dt
            if name in s.active:
                owed += share * dt
                demand += dt
        return entitled, owed, demand

    def kept(self) -> int:
        """How many sets are kept apart (bounded by :data:`SETS_KEPT`)."""
        return len(self._sets)

    def _set(self, active: frozenset[str]) -> DemandSet:
        s = self._sets.get(active)
        if s is None:
            s = self._sets[active] = DemandSet(active, self.shares_of(active))
        return s
