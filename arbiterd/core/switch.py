"""A GPU switching policy: the old class retires, the new one takes over, and fairness starts afresh.

The old class stays the owner of the leases it granted, and bills them by its
own rules when they end. Leases it keeps itself (the native policy's, one per
client) run on as the GPU's ``draining``: no turn is granted until they end.
Every lease the new policy does not keep (:meth:`Policy.keeps`) is revoked, its
time so far void like every debt.
"""

from __future__ import annotations

from arbiterd.core.effects import Effect
from arbiterd.core.model import Lease, Runqueue
from arbiterd.core.policies import HighPriority, Policy, make_policy


def switch_policy(rq: Runqueue, hp: HighPriority, number: int, now: int) -> tuple[Policy, list[Effect]]:
    """Put policy ``number`` in force on ``rq``: the new class, and the revokes of what it does not keep."""
    old = rq.policy
    rq.settings.policy = number
    old.retire()
    if old.leases:  # its own leases run on (revoked below unless the new one keeps them)
        rq.draining.append(old)
    new = make_policy(number, rq, hp, now)
    rq.policy = new
    new.changed(now)
    # fairness restarts under the new policy: what was owed under the old one is void
    base = max([rq.min_vr, *(i.vruntime for i in rq.instances.values())])
    for inst in rq.instances.values():
        inst.vruntime = base
        inst.debt_ns = 0
    rq.min_vr = base
    effects: list[Effect] = []
    for lease in rq.holders():
        if not new.keeps(lease):
            effects += close_under_old_policy(rq, lease, now)
    return new, effects


def close_under_old_policy(rq: Runqueue, lease: Lease, now: int) -> list[Effect]:
    """Revoke a lease granted under the old policy, whose time so far is void like its debts.

    Its holder only finishes what it started: that is overrun, debt for its next turn. Without this, an instance
    alone on a work-conserving policy (a lease extended for seconds) would be charged all of it at release under
    the new policy, and the others would get that many extra turns in a row.
    """
    lease.prepaid_ns = max(lease.prepaid_ns, now - lease.granted_ns)
    lease.deadline_ns = min(lease.deadline_ns, now)
    lease.extension_ns = 0
    lease.nominal_ns = None
    return rq.revoke(lease, now, "policy")
