"""The run queue of one GPU: what the scheduler and its classes share, like Linux's ``struct rq``.

:class:`Runqueue` holds the instances, the current lease (the one turn that
the time-sliced classes hand from instance to instance), the counters and the
policy in force, and the few operations every class
uses: grant the current lease, revoke a lease, pick by virtual time, pay a debt.
What is one class's own stays in that class (policies/): the native policy's
leases, one per client, the ring's segments, the weighted policy's idle turn.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from arbiterd.core.accounting import HandoverMeter
from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease, RevokeLease, value
from arbiterd.core.limits import Bandwidth
from arbiterd.core.settings import AUTO, NO_LIMIT, GpuSettings
from arbiterd.core.waits import GrantWaits

VR_SCALE = 26_771_144_400  # lcm(1..25): every vruntime charge is an exact integer
DEBT_CAP_SLICES = 20  # debt beyond this (a stalled client) is not repaid by skipping turns
EXTENDED_NS = 1_000_000_000  # an uncontended lease runs this long before the client renews
REVOKE_REASONS = ("highprio", "policy", "overrun", "removed", "turn")


@dataclass(slots=True, eq=False)
class InstanceState:
    """One instance (container) on one GPU."""

    name: str
    weight: int
    highprio: bool
    order: int
    requested: int = 0  # the weight it asked for (more than its weight when free_weight ran out)
    vruntime: int = 0
    debt_ns: int = 0
    held_ns: int = 0  # grant to release, as the daemon saw it
    useful_ns: int = 0  # what it was billed: held time less each lease's hand-over
    entitled_ns: float = 0.0  # its entitled share, integrated over time (entitlement.py)
    owed_ns: float = 0.0  # the same, only while it had demand
    demand_ns: int = 0  # time it had demand
    grants: int = 0
    leases: int = 0  # leases it holds now (one, or one per client under the native policy)
    served: int = 0  # sequence number of its last grant: ties go to the least recently served
    handover_ns: int = -1  # its own expected hand-over: a running mean of its leases' (-1: none yet)
    claimed_ns: int = -1  # what its clients report a hand-over costs: a running mean, unclamped (-1: none yet)
    handovers: int = 0  # hand-overs measured for it (its running means start as plain means)
    warmup_mean_ns: int = 0  # the warm-up its clients report: a running mean over the same hand-overs
    extension_ns: int = -1  # what its turns are lengthened by now (-1: the GPU's, until it has its own)
    limit: int = NO_LIMIT  # the most GPU time (%) it may use per period (limits.py)
    throttled_ns: int = 0  # time it waited with its runtime spent, intervals closed so far (limits.py)
    nr_throttled: int = 0  # such intervals
    gang: bool = False  # one GPU of a gang (gang.py): its turns come from the gang, not from this GPU's policy
    waiters: dict[int, int] = field(default_factory=dict)  # client -> acquire time


@value
class Bill:
    """How a lease ended, for the class that bills it (one is built per lease)."""

    held: int  # grant to release, as the daemon saw it
    billed: int  # useful time: held, less its hand-over
    overrun: int  # useful time past the turn's useful length (its deadline less the extension)
    end: int  # when it really ended (the release arrived)


class Charger(Protocol):
    """The class that granted a lease, which bills it when it ends (unless ``bills`` is false: then no bill is
    made) and forgets it, if it kept it."""

    bills: bool

    def charge(self, lease: Lease, bill: Bill) -> int: ...

    def forget(self, lease: Lease) -> None: ...

    def revoked(self, lease: Lease) -> None: ...


class GangHooks:
    """What a GPU's classes ask of the gangs (gang.py) it may be part of; this default: none, so a GPU scheduled on
    its own behaves as if gangs did not exist."""

    @property
    def active(self) -> bool:
        """Whether some gang may use this GPU now (else the hooks are not asked)."""
        return False

    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        """Effects for the current holder (a gang waits for its turn to end), or None."""
        return None

    def pick(self, now: int) -> list[Effect] | None:
        """Grant a gang its turn (on every GPU of it at once), or None: the policy picks."""
        return None

    def fence(self, now: int) -> int | None:
        """Where a turn granted by the policy now must end (a gang starts then), if anywhere."""
        return None

    def due(self, now: int) -> int | None:
        """Where a turn granted by the policy now should end at the latest, if anywhere: a gang over this GPU will
        be due then (a turn past it would hold the gang's start back)."""
        return None

    def wakeup(self) -> int | None:
        return None

    def granted(self, now: int) -> None:
        """A lease was granted on this GPU (to anyone): it is not idle for a gang."""

    def touched(self, inst: InstanceState, now: int) -> None:
        """``inst`` may have gained or lost demand."""

    def changed(self) -> None:
        """Instances, weights, priorities, limits or the policy changed."""

    def removed(self, name: str, now: int) -> None:
        """Instance ``name`` is about to be forgotten on this GPU (it is still registered)."""

    def ticked(self, now: int) -> None:
        """This GPU's tick runs at ``now``: a wakeup the gangs asked for is spent."""

    def take(self) -> list[Effect]:
        """Effects made for this GPU's clients or a peer's while acting on another (a gang's revoke)."""
        return []

    def shares(self, active: Collection[str], rest: float) -> dict[str, float]:
        """The shares of this GPU's gang members while ``active`` have demand here."""
        return {}


NO_GANGS = GangHooks()


class Keeper(Charger, Protocol):
    """A class that keeps leases of its own, one per client (the native policy), apart from the current one."""

    retired: bool
    leases: Mapping[int, Lease]
    honours_limits: bool

    def first_cutoff(self, overrun_ns: int) -> int | None: ...

    def retire(self) -> None: ...


@dataclass(slots=True, eq=False)
class Lease:
    """A grant of one GPU until ``deadline_ns``, billed by ``owner``, the class that granted it, when it ends.

    The fields a native lease sets come first: one is built per acquire under policy 5, and it is built by
    position, which is cheaper than by keyword."""

    id: int
    inst: InstanceState
    clients: set[int]
    granted_ns: int
    deadline_ns: int
    owner: Charger
    client: int | None = None  # the one client of a lease its class keeps apart (the native policy's)
    highprio: bool = False
    ring: bool = False
    prepaid_ns: int = 0
    revoked_ns: int | None = None
    discount_ns: int = 0  # its hand-over, billed to nobody (set at release)
    extension_ns: int = 0  # the expected hand-over added to its length, so the turn holds its useful time
    nominal_ns: int | None = None  # set while extended: where the lease would have ended
    renewal: bool = False  # granted to the instance whose lease ended in the same step: nothing changed hands
    # the clients that have held it since it began (not those of its instance that joined it later, nor one that
    # gave it back and came back), and the last word of one of them on giving it back, (when, used_ns, warmup_ns):
    # what measures its hand-over (scheduler.release)
    starters: set[int] = field(default_factory=set)
    report: tuple[int, int, int] | None = None

    def cutoff(self, overrun_ns: int) -> int:
        """When its holders are cut off: ``overrun_ns`` past its deadline, or past its revoke."""
        return (self.revoked_ns if self.revoked_ns is not None else self.deadline_ns) + overrun_ns


@dataclass(slots=True)
class GpuStats:
    grants: int = 0
    revocations: int = 0
    overruns: int = 0
    late_releases: int = 0
    busy_ns: int = 0
    revoked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REVOKE_REASONS, 0))  # by reason


class Runqueue:
    """Instances, the current lease and the counters of one GPU, its classes, and the operations they share."""

    policy: Keeper  # the policy in force (policies/), set by the scheduler

    def __init__(self, index: int, settings: GpuSettings, now: int) -> None:
        self.index = index
        self.settings = settings
        self.instances: dict[str, InstanceState] = {}
        self.stats = GpuStats()
        self.lease: Lease | None = None  # the current turn's lease, which every client of its instance shares
        self.draining: list[Keeper] = []  # policies switched away from whose own leases have not all ended
        self.min_vr = 0
        self._orders = 0
        self._last_lease = 0
        self.turns = 0
        self.busy_since: int | None = None
        self.last_ended: tuple[InstanceState, int] | None = None  # whose lease ended last, and when
        self.handover = HandoverMeter()
        self.waits = GrantWaits()  # each instance's grant waits, for status and the metrics
        self.slice_ns = self.pick_slice_ns()
        self.extension_ns = 0  # what a turn is lengthened by: the expected hand-over (see accounting.py)
        self.round_ns = 0  # the round of turns in force: the useful time every instance's turn takes, together
        self.bw = Bandwidth(self, now)  # the limited instances' quotas (limits.py)
        self.gangs: GangHooks = NO_GANGS  # the gangs this GPU may be part of (gang.py)

    def extension_for(self, inst: InstanceState) -> int:
        """What a turn of ``inst`` is lengthened by: its own expected hand-over, the GPU's until it has one."""
        return inst.extension_ns if inst.extension_ns >= 0 else self.extension_ns

    def pick_slice_ns(self) -> int:
        """The slice in force: the pinned ``slice_ms``, or what ``auto`` makes of the measured hand-over."""
        s = self.settings
        if s.slice_ms != AUTO:
            return s.slice_ms * NS_PER_MS
        return self.handover.auto_slice_ns(s.handover_target_pct, s.slice_min_ms, s.slice_max_ms)

    def round_slice_ns(self, weight: int) -> int:
        """The slice for a round of ``weight`` slices (the weights that take turns), and the round it makes.

        Under ``slice_ms = auto`` the slice in force is cut so that the round fits ``latency_target_ms``, as
        CFS cuts its period among runnable tasks, but no shorter than ``slice_min_ms`` or than the slice whose
        hand-over costs ``handover_max_pct`` % of it; past that the round stretches. With few instances the
        round fits at the slice in force and nothing changes. Shares stay exact: every turn is cut alike.
        """
        s = self.settings
        slice_ns = self.slice_ns
        if s.slice_ms == AUTO and weight > 0:
            fit = s.latency_target_ms * NS_PER_MS // weight
            if fit < slice_ns:
                floor = max(s.slice_min_ms * NS_PER_MS, self.handover.shortest_slice_ns(s.handover_max_pct))
                slice_ns = min(slice_ns, max(floor, fit))
        self.round_ns = weight * slice_ns
        return slice_ns

    def holders(self) -> list[Lease]:
        """Every lease now held on this GPU: the classes' own, then the current one."""
        held = list(self.policy.leases.values())
        for old in self.draining:
            held += old.leases.values()
        if self.lease is not None:
            held.append(self.lease)
        return held

    def held(self) -> bool:
        """Whether any lease is held on this GPU."""
        return self.lease is not None or bool(self.policy.leases) or bool(self.draining)

    def normal_members(self) -> list[InstanceState]:
        """The instances this GPU's policy gives turns to: weight above 0, not high priority, not in a gang."""
        return [i for i in self.instances.values() if i.weight > 0 and not i.highprio and not i.gang]

    def next_order(self) -> int:
        self._orders += 1
        return self._orders

    def next_lease_id(self) -> int:
        self._last_lease += 1
        return self._last_lease

    @staticmethod
    def pick(candidates: list[InstanceState]) -> InstanceState | None:
        """The least virtual time; ties go to the least recently served, then the oldest."""
        if not candidates:
            return None
        return min(candidates, key=lambda i: (i.vruntime, i.served, i.order))

    def grant(self, inst: InstanceState, now: int, deadline: int, owner: Charger, *, highprio: bool = False,
              ring: bool = False, prepaid: int = 0, extension: int = 0) -> list[Effect]:
        """Give the GPU to every waiting client of ``inst`` until ``deadline``; ``owner`` bills it.

        ``extension`` is the part of the lease's length that pays for its expected hand-over. A limited instance's
        lease ends where its runtime runs out, if that is sooner (limits.py).
        """
        if inst.limit < NO_LIMIT:
            deadline = now + extension + self.bw.allowance(inst, now, max(0, deadline - now - extension))
        ended = self.last_ended
        lease = Lease(self.next_lease_id(), inst, set(inst.waiters), now, deadline, owner, highprio=highprio,
                      ring=ring, prepaid_ns=prepaid, extension_ns=extension,
                      renewal=ended is not None and ended[0] is inst and ended[1] == now,
                      starters=set(inst.waiters))
        waiting = sorted(inst.waiters.items()) if len(inst.waiters) > 1 else inst.waiters.items()
        effects: list[Effect] = [GrantLease(c, self.index, lease.id, deadline, now - t) for c, t in waiting]
        for _, t in waiting:
            self.waits.record(inst.name, now, now - t)
        inst.waiters.clear()
        inst.grants += 1
        inst.leases += 1
        self.stats.grants += 1
        self.turns += 1
        inst.served = self.turns
        self.lease = lease
        if self.busy_since is None:
            self.busy_since = now
        if self.gangs.active:
            self.gangs.granted(now)
        return effects

    def revoke(self, lease: Lease, now: int, reason: str) -> list[Effect]:
        """Ask the holders of ``lease`` to give it back (once)."""
        if lease.revoked_ns is not None:
            return []
        lease.revoked_ns = now
        lease.owner.revoked(lease)
        self.stats.revocations += 1
        self.stats.revoked[reason] += 1
        return [RevokeLease(c, self.index, lease.id, reason) for c in sorted(lease.clients)]

    def charge_vtime(self, inst: InstanceState, ns: int, weight: int) -> None:
        inst.vruntime += ns * VR_SCALE // weight

    def add_debt(self, inst: InstanceState, overrun: int) -> None:
        inst.debt_ns = min(inst.debt_ns + overrun, DEBT_CAP_SLICES * self.slice_ns)
