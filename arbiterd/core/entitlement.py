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
release, but between a few sets, each with the same shares every time: so a
change of demand only adds the time the set was in force to that set's span
(constant time), and the spans are folded into the instances' integrals when a
setting or the membership is about to change the shares, or read whole when an
instance's figures are asked for. Exact on the virtual clock: a span's time is
an integer sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arbiterd.core.model import InstanceState

SPANS_KEPT = 256  # sets of instances with demand whose time is kept apart before a fold


@dataclass(slots=True)
class Span:
    """One set with demand since the last fold: its shares (the same values every time it comes back until
    the next fold, which comes before every change of a setting or of the membership) and its time in force."""

    shares: dict[str, float]
    ns: int


class Entitlement:
    """The shares in force since ``at``, for the instances ``active`` with demand, and how long each earlier
    set was in force (its span), not yet folded into the integrals of ``instances``."""

    def __init__(self, instances: Mapping[str, InstanceState], now: int) -> None:
        self.instances = instances
        self.at = now
        self.active: frozenset[str] = frozenset()
        self.shares: dict[str, float] = {}
        self._spans: dict[frozenset[str], Span] = {}

    def switch(self, active: frozenset[str], shares: dict[str, float], now: int) -> None:
        """From ``now`` the instances ``active`` have demand, under ``shares``."""
        dt = now - self.at
        if dt > 0:
            self.at = now
            spans = self._spans
            span = spans.get(self.active)
            if span is not None:
                span.ns += dt
            else:
                if len(spans) >= SPANS_KEPT:
                    self.fold(now)
                spans[self.active] = Span(self.shares, dt)
        self.active, self.shares = active, shares

    def fold(self, now: int) -> None:
        """Advance every instance's integrals to ``now``: before a setting or the membership changes a share."""
        self.switch(self.active, self.shares, now)
        for active, span in self._spans.items():
            self._add(active, span.shares, span.ns)
        self._spans.clear()

    def pending(self, inst: InstanceState, now: int) -> tuple[float, float, int]:
        """``inst``'s (entitled, owed, demand) ns up to ``now``, without advancing anything."""
        entitled, owed, demand = inst.entitled_ns, inst.owed_ns, inst.demand_ns
        name = inst.name
        for active, span in [*self._spans.items(), (self.active, Span(self.shares, max(0, now - self.at)))]:
            shares, dt = span.shares, span.ns
            share = shares.get(name, 0.0)
            entitled += share * dt
            if name in active:
                owed += share * dt
                demand += dt
        return entitled, owed, demand

    def _add(self, active: frozenset[str], shares: dict[str, float], dt: int) -> None:
        instances = self.instances
        for name, share in shares.items():
            inst = instances.get(name)
            if inst is None or not share:
                continue
            inst.entitled_ns += share * dt
            if name in active:
                inst.owed_ns += share * dt
        for name in active:
            inst = instances.get(name)
            if inst is not None:
                inst.demand_ns += dt
