"""How much of one lease's hand-over is credited, and what it feeds: the GPU's meter and the lease's discount.

A lease's hand-over is what nobody could use of it: the transit both ways (the
daemon's held time less what the client saw, ``used_ns``) and what the client
lost at the start (``warmup_ns``). Both are the client's word, so they are
credited only up to :func:`credit_cap`, which the daemon derives from the slice
it sized and from the other tenants: a client that claims more gains nothing by
it, and sizes neither the slice nor its own turns.
"""

from __future__ import annotations

from arbiterd.core.accounting import SAMPLE_MAX_NS, running_mean
from arbiterd.core.effects import NS_PER_MS
from arbiterd.core.model import InstanceState, Lease, Runqueue

# A lease's hand-over is credited up to CAP_OTHERS x the lower quartile of what the other instances' clients report
# theirs cost; while no other instance has reported one, up to CAP_TARGETS x handover_target_pct of the slice that
# auto would choose (or the pinned one, if longer), plus CAP_FLOOR_NS. What a client claims beyond that wins it
# nothing.
CAP_OTHERS = 3
CAP_TARGETS = 1.5
CAP_FLOOR_NS = 100_000


def credit_cap(rq: Runqueue, inst: InstanceState) -> int:
    """The most of one lease's hand-over (its transit and warm-up: the client's word) credited to ``inst``.

    CAP_OTHERS x the lower quartile of what the other instances' clients report their hand-overs cost (the
    least of them, up to four others); while no other has reported one, CAP_TARGETS x handover_target_pct of
    the slice ``auto`` would choose from what was credited so far (of the longest it may choose, before
    anything was), or of the slice in force if longer, plus CAP_FLOOR_NS.

    A lie is thus credited at most CAP_OTHERS times what an honest tenant pays, and tenants that lie together
    cannot raise each other's bound unless they are three in four; at the defaults the auto slice stretches with
    what is credited, so a liar's gain stays within about 2 % of its lease (tests/security/test_claims.py). An
    honest tenant whose hand-over is more than CAP_OTHERS times the others' pays the excess itself. A tenant that
    reports less than it pays lowers the others' bound, but loses as much itself."""
    others = sorted(i.claimed_ns for i in rq.instances.values() if i is not inst and i.claimed_ns >= 0)
    if others:
        return others[(len(others) - 1) // 4] * CAP_OTHERS
    s = rq.settings
    auto = (s.slice_max_ms * NS_PER_MS if inst.handovers == 0 and not rq.handover.count
            else rq.handover.auto_slice_ns(s.handover_target_pct, s.slice_min_ms, s.slice_max_ms))
    return int(max(rq.slice_ns, auto) * s.handover_target_pct * CAP_TARGETS) // 100 + CAP_FLOOR_NS


def measure(rq: Runqueue, lease: Lease, now: int, used_ns: int, warmup_ns: int) -> tuple[bool, int]:
    """Credit one released lease's hand-over: set its discount (billed to nobody) and feed the GPU's meter.
    Returns whether the meter's estimate moved (the slice is to be sized again) and what was credited.

    A renewal (the same instance again, at once: alone, or a second turn in a row) changed no hands: what it lost
    is not billed either, but it neither sizes the slice nor lengthens the instance's turns, which must pay for
    real hand-overs (an instance alone for a while would otherwise come back to contention with a slice and turns
    sized for none)."""
    transit = max(0, now - lease.granted_ns - used_ns)
    overhead = transit + warmup_ns
    inst = lease.inst
    cap = credit_cap(rq, inst)
    if not lease.renewal:
        inst.handovers += 1
        inst.claimed_ns = running_mean(inst.claimed_ns, min(overhead, SAMPLE_MAX_NS), inst.handovers)
        inst.warmup_mean_ns = running_mean(inst.warmup_mean_ns, warmup_ns, inst.handovers, signed=True)
    # the expected overhead sizes every tenant's slice: an instance whose clients report a warm-up below zero on
    # average (a liar, or a client whose idea of its own speed went stale) counts there as reporting none, or its
    # word would cut the slice to its floor; one honest lease below zero among others is kept, as it came, so
    # the estimate stays unbiased. The bounds that bill, and the lease's own bill, keep every claim.
    sized = min(overhead - min(0, inst.warmup_mean_ns), cap)
    if overhead > cap:
        overhead = cap
        warmup_ns = min(warmup_ns, cap)
    moved = not lease.renewal and rq.handover.observe(overhead, warmup_ns, sized)
    kept = min(rq.handover.discount(overhead), cap)
    lease.discount_ns = min(kept, now - lease.granted_ns)
    return moved, kept
