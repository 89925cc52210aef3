"""Limits: a ceiling beside each instance's share, enforced as CFS bandwidth control enforces ``cpu.max``.

How this works
--------------
An instance's weight is its share under contention (its *request*, as
Kubernetes maps a container's CPU request to ``cpu.weight``); its ``limit``
L % (below 100) is a ceiling on the GPU's *useful* time it may have, as a
container's CPU limit is a quota per period (``cpu.max``). Each period every
limited instance is given L % of the period as runtime; each of its leases is
cut where its runtime runs out (the hand-over it pays is added on top, as it
is to every turn, so the ceiling caps useful time), and what a lease used is
taken off when it ends, overrun included (runtime below 0 is debt, carried).
An instance out of runtime with work waiting is *throttled*: the policy passes
it over until the next period gives it runtime again, even on an idle GPU.

The period is the round of turns in force (every instance with demand has
one turn a round; with high-priority instances, the normal round stretched
by the time they take): a period shorter than a round would cut turns that
the weights give, so an instance whose share is below its limit would lose
share to the cut. ``limit_period_ms`` pins it instead. Runtime left at a
period's end is carried up to one period's quota while the instance has
demand (it may have waited for its turn across the boundary), and not at all
while it has none; an instance that gains demand in the middle of a period
may have what is left of the period at its limit. So it cannot come back from
idle with a burst: over a stretch of demand it gets its limit to within one
period's quota (the stretch's last period may be cut short by its end).

What every instance is entitled to, with limits: on a work-conserving policy
the weights' shares water-filled under the limits (what a capped instance
leaves goes to the others by weight); on policy 2 each is entitled to
``min(share, limit)`` and what it leaves passes idle, as an idle instance's
turns do. Policies 0, 3 and 5 do not honour limits (3 caps every instance at
its request: it is the case where every limit equals its request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arbiterd.core.effects import NS_PER_MS
from arbiterd.core.errors import ConflictError
from arbiterd.core.settings import AUTO, INSTANCE, NO_LIMIT

if TYPE_CHECKING:
    from arbiterd.core.model import InstanceState, Runqueue

FIXED_CORE = 3
MIN_RUN_NS = NS_PER_MS  # runtime below this is not worth a hand-over: the instance waits for the next period
CATCH_UP_PERIODS = 1000  # periods applied one by one after an idle stretch; past that, at once


@dataclass(slots=True, eq=False)
class Quota:
    """One limited instance's runtime and its throttling counters (cgroup ``cpu.stat``'s)."""

    runtime_ns: int  # useful time it may still hold this period (below 0: debt)
    throttled_since: int | None = None  # start of the throttled interval running now
    nr_periods: int = 0  # periods it was given runtime in while it had demand


class Bandwidth:
    """The quotas of one GPU's limited instances and the period timer they share."""

    def __init__(self, rq: Runqueue, now: int) -> None:
        self.rq = rq
        self.quotas: dict[InstanceState, Quota] = {}
        self.next_ns = now  # the next period's start

    @property
    def in_force(self) -> bool:
        """Whether the policy in force honours limits."""
        return self.rq.policy.honours_limits

    def period_ns(self) -> int:
        """The period: ``limit_period_ms``, or (auto) the round of turns in force, stretched by what high-priority
        instances take of each cycle."""
        rq = self.rq
        s = rq.settings
        if s.limit_period_ms != AUTO:
            return s.limit_period_ms * NS_PER_MS
        period = max(rq.round_ns, rq.slice_ns, MIN_RUN_NS)
        if any(i.highprio and i.weight > 0 for i in rq.instances.values()):
            period = period * 100 // (100 - s.prio_ratio)
        return period

    def track(self, inst: InstanceState, now: int) -> None:
        """``inst``'s limit was set: it gets a quota (a full one now), or none where it has no limit."""
        quota = self.quotas.pop(inst, None)
        if quota is not None:
            self._close(inst, quota, now)
        if inst.limit < NO_LIMIT:
            if not self.quotas:
                self.next_ns = now + self.period_ns()
            self.quotas[inst] = Quota(inst.limit * self.period_ns() // 100)
            self.mark(inst, now)

    def forget(self, inst: InstanceState, now: int) -> None:
        quota = self.quotas.pop(inst, None)
        if quota is not None:
            self._close(inst, quota, now)

    def throttled(self, inst: InstanceState) -> bool:
        """Whether ``inst`` has spent its runtime (and limits are in force): the policy passes it over."""
        if inst.limit >= NO_LIMIT:
            return False
        quota = self.quotas.get(inst)
        return quota is not None and quota.runtime_ns < MIN_RUN_NS and self.in_force

    def refill(self, now: int) -> list[InstanceState]:
        """Start every period that began by ``now``; the instances that wait and are throttled no more."""
        if now < self.next_ns or not self.quotas:
            return []
        before = {inst for inst in self.quotas if inst.waiters and self.throttled(inst)}
        n = 0
        while now >= self.next_ns:
            period = self.period_ns()
            n += 1
            if n > CATCH_UP_PERIODS:  # an idle stretch: what is left of it at once
                self.next_ns += (now - self.next_ns) // period * period
            for inst, quota in self.quotas.items():
                q = inst.limit * period // 100
                demand = bool(inst.waiters) or inst.leases > 0
                quota.runtime_ns = min(quota.runtime_ns + q, 2 * q if demand else q)
                quota.nr_periods += demand
            self.next_ns += period
        for inst in self.quotas:
            self.mark(inst, now)
        return [inst for inst in before if not self.throttled(inst)]

    def woke(self, inst: InstanceState, now: int) -> None:
        """``inst`` wants the GPU again after it had no demand: of this period it may have what is left of it at its
        limit, as if it had wanted the GPU at its limit all along (idle time banks nothing)."""
        quota = self.quotas.get(inst)
        if quota is not None:
            quota.runtime_ns = min(quota.runtime_ns, inst.limit * max(0, self.next_ns - now) // 100)

    def allowance(self, inst: InstanceState, now: int, useful_ns: int) -> int:
        """The useful time ``inst`` may hold from ``now``, at most ``useful_ns``: until its runtime runs out,
        counting the periods that start meanwhile (as :meth:`refill` will give them while it holds)."""
        quota = self.quotas.get(inst)
        if quota is None or not self.in_force:
            return useful_ns
        left, t, start = quota.runtime_ns, now, self.next_ns
        period = self.period_ns()
        q = inst.limit * period // 100
        while left > 0 and t + left > start and start - now < useful_ns:
            left -= start - t
            t = start
            left = min(left + q, 2 * q)
            start += period
        return max(0, min(useful_ns, t - now + left))

    def consume(self, inst: InstanceState, useful_ns: int, now: int) -> None:
        """``inst`` used ``useful_ns`` of GPU time (a lease ended, or work billed from outside)."""
        quota = self.quotas.get(inst)
        if quota is not None and self.in_force:
            quota.runtime_ns -= useful_ns
            self.mark(inst, now)

    def mark(self, inst: InstanceState, now: int) -> None:
        """Open or close ``inst``'s throttled interval: throttled while it waits with its runtime spent."""
        quota = self.quotas.get(inst)
        if quota is None:
            return
        if inst.waiters and self.throttled(inst):
            if quota.throttled_since is None:
                quota.throttled_since = now
                inst.nr_throttled += 1
        else:
            self._close(inst, quota, now)

    def mark_all(self, now: int) -> None:
        """The policy changed (limits came into force, or went out of it)."""
        for inst in self.quotas:
            self.mark(inst, now)

    @staticmethod
    def _close(inst: InstanceState, quota: Quota, now: int) -> None:
        if quota.throttled_since is not None:
            inst.throttled_ns += max(0, now - quota.throttled_since)
            quota.throttled_since = None

    def throttled_ns(self, inst: InstanceState, now: int) -> int:
        """The time ``inst`` was throttled (waited with its runtime spent), an interval running now included."""
        quota = self.quotas.get(inst)
        since = quota.throttled_since if quota is not None else None
        return inst.throttled_ns + (now - since if since is not None else 0)

    def wakeup(self) -> int | None:
        """When a throttled instance that waits gets runtime again, if one does."""
        if any(inst.waiters and self.throttled(inst) for inst in self.quotas):
            return self.next_ns
        return None


def waterfill(weights: Mapping[str, float], caps: Mapping[str, float], total: float) -> dict[str, float]:
    """Split ``total`` by ``weights``, none above its cap (a fraction; absent: none); what a capped one leaves goes to
    the others by weight, as far as their caps allow."""
    out = dict.fromkeys(weights, 0.0)
    free = {n: w for n, w in weights.items() if w > 0}
    left = total
    while free and left > 1e-12:
        wsum = sum(free.values())
        capped = {n for n, w in free.items() if n in caps and caps[n] - out[n] <= left * w / wsum}
        if not capped:
            for n, w in free.items():
                out[n] += left * w / wsum
            break
        for n in capped:
            left -= caps[n] - out[n]
            out[n] = caps[n]
            del free[n]
    return out


def request_pct(weight: int, max_inst: int) -> float:
    """The share of the GPU a weight is guaranteed (its request): weight / max_inst, in percent."""
    return 100 * weight / max_inst


WHY_NOT = {
    0: "policy 0 (fixed) gives every instance one slot of max_inst and no more",
    3: "policy 3 (fixed core) caps every instance at its request: there a limit is the request",
    5: "policy 5 (native) does not slice time, so it cannot hold an instance to a limit",
}


def check_request(rq: Runqueue, name: str, weight: int, limit: int, max_inst: int | None = None) -> None:
    """Raise ConflictError (one line) if ``limit`` is below what ``weight`` of ``max_inst`` slots requests."""
    top = rq.settings.max_inst if max_inst is None else max_inst
    if weight > 0 and limit < NO_LIMIT and limit < request_pct(weight, top):
        raise ConflictError(f"instance {name} on GPU {rq.index}: limit {limit} % is below its request, weight "
                            f"{weight} of max_inst {top} = {request_pct(weight, top):g} %; raise the limit or "
                            f"lower the weight")


def check_limit(rq: Runqueue, name: str, weight: int, limit: object, policy: int | None = None,
                max_inst: int | None = None) -> int:
    """``limit`` if instance ``name`` of ``weight`` may have it on the GPU of ``rq`` (under ``policy`` and
    ``max_inst``, by default those in force); else a one-line CoreError. 100 (no limit) is always allowed; on
    policy 3 so is the request itself, which is what that policy enforces."""
    value = INSTANCE["limit"].check(limit)
    if value >= NO_LIMIT:
        return value
    number = rq.settings.policy if policy is None else policy
    top = rq.settings.max_inst if max_inst is None else max_inst
    check_request(rq, name, weight, value, top)
    exact = number == FIXED_CORE and value == request_pct(weight, top)
    if number in WHY_NOT and not exact:
        raise ConflictError(f"GPU {rq.index}: limit {value} % for instance {name} cannot be honoured: "
                            f"{WHY_NOT[number]}; limits hold on policies 1, 2 and 4")
    return value


__all__ = ["MIN_RUN_NS", "Bandwidth", "Quota", "check_limit", "check_request", "request_pct", "waterfill"]
