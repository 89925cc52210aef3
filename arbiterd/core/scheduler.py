"""Per-GPU slice scheduler.

How this works
--------------
A ``GpuScheduler`` owns the time of one GPU. Instances (containers) ask for
time through their clients with :meth:`acquire`; the scheduler answers with
effects: :class:`Grant` (a lease with an absolute CLOCK_MONOTONIC deadline) and
:class:`Revoke`. Under policies 0-4 at most one instance holds the lease; all
of that instance's clients share it. Under policy 5 every client gets a lease
of its own at once.

Accounting is by time *really held*: a lease is charged from grant to the
moment its last client releases it (overrun included), never by its nominal
length.

* Policies 1, 2 and 4 pick the next holder by weighted virtual time, like
  Linux CFS: holding for ``t`` ns adds ``t * VR_SCALE / weight`` to the
  instance's ``vruntime``, and the smallest ``vruntime`` goes next. An
  instance that comes back from idle joins at the tail of the current round
  (the largest ``vruntime`` among instances with demand, and never below the
  GPU's ``min_vr``, which only moves forward), so it cannot bank credit and
  nobody waits more than one round. Policy 1 treats every weight
  as 1; policy 2 also walks instances without demand, whose turns pass with
  the GPU idle (their ``vruntime`` is charged for the idle turn).
* Policies 0 and 3 are a fixed ring of ``max_inst`` slots turned by the clock.
  An owner that overruns its segment owes the overrun (``debt_ns``), which is
  taken off its next segment, so the hard cap holds exactly in the long run.
* High-priority instances run on a credit that grows at ``prio_ratio`` % of
  wall time and is spent 1:1 while they hold the GPU; at most two slices'
  worth can be banked, so over any window a high-priority instance gets at
  most ``prio_ratio`` % plus two slices. With demand and enough credit for a
  slice they preempt a normal holder by revoke. Under the work-conserving
  policies (1, 4) a high-priority instance out of credit may still use time
  that no normal instance wants.
* The handoff between holders (the grant's and the release's transit, about
  0.2 ms between two processes here) is charged to nobody: each lease is
  discounted by the transit its client reports, capped at the GPU's median
  handoff. Otherwise the weight-1 instance, which changes hands twice as often
  per unit of share as the weight-2 one, would pay twice the overhead.
* Under policies 1, 2 and 4 a lease is *extended* while no other instance
  wants the GPU (its deadline is far off, so a lone instance never renews).
  When another instance starts to wait, the holder keeps its nominal turn:
  a new grant for the same lease moves its deadline back to the turn's end,
  or, if that has passed, the lease is revoked (reason ``turn``).
* Time held past a lease's deadline (an op that outlasted the slice) is the
  instance's *debt*: it is charged, and paid by shortening (or skipping) the
  instance's next turn, so turns keep their order and nobody waits more than
  one round while the long-run shares stay exact. Debt is capped at 20 slices:
  ops up to that long stay exact, and one stall (a client that answered
  seconds late) cannot cost its instance minutes of skipped turns.
* A holder still holding ``overrun_ns`` after its deadline (or after a
  revoke) is cut off: its lease is ended, charged up to that moment, and
  counted in ``stats.overruns``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from arbiterd.core.effects import NS_PER_MS, Effect, Grant, Revoke
from arbiterd.core.errors import NotFoundError, SettingError

FIXED, PREEMPTIVE, WEIGHTED, FIXED_CORE, WEAK, NATIVE = range(6)
POLICY_NAMES = ("fixed", "preemptive", "weighted", "fixed-core", "weak", "native")
RING_POLICIES = (FIXED, FIXED_CORE)
VTIME_POLICIES = (PREEMPTIVE, WEIGHTED, WEAK)
WORK_CONSERVING = (PREEMPTIVE, WEAK, NATIVE)

VR_SCALE = 26_771_144_400  # lcm(1..25): every vruntime charge is an exact integer
HANDOFF_SAMPLES = 63
DEBT_CAP_SLICES = 20  # debt beyond this (a stalled client) is not repaid by skipping turns
EXTENDED_NS = 1_000_000_000  # an uncontended lease runs this long before the client renews
HANDOFF_MAX_NS = 1_000_000  # a transit longer than 1 ms is not a handoff sample

MAX_INST_RANGE = (1, 25)
PRIO_RATIO_RANGE = (20, 99)
SLICE_MS_RANGE = (1, 100)


def check_range(name: str, value: int, lo: int, hi: int) -> int:
    """Return ``value`` if ``lo <= value <= hi``, else raise a one-line SettingError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingError(f"{name}: expected an integer {lo}..{hi}, got {value!r}")
    if not lo <= value <= hi:
        raise SettingError(f"{name}: {value} is out of range {lo}..{hi}")
    return value


@dataclass(slots=True)
class GpuSettings:
    """Tunable settings of one GPU (SPEC §2)."""

    policy: int = PREEMPTIVE
    max_inst: int = 16
    prio_ratio: int = 50
    slice_ms: int = 5
    overrun_ms: int = 500

    def validate(self) -> None:
        check_range("policy", self.policy, 0, 5)
        check_range("max_inst", self.max_inst, *MAX_INST_RANGE)
        check_range("prio_ratio", self.prio_ratio, *PRIO_RATIO_RANGE)
        check_range("slice_ms", self.slice_ms, *SLICE_MS_RANGE)
        check_range("overrun_ms", self.overrun_ms, 1, 3_600_000)


@dataclass(slots=True, eq=False)
class InstanceState:
    """One instance (container) on one GPU."""

    name: str
    weight: int
    highprio: bool
    order: int
    vruntime: int = 0
    debt_ns: int = 0
    held_ns: int = 0
    grants: int = 0
    served: int = 0  # sequence number of its last grant: ties go to the least recently served
    waiters: dict[int, int] = field(default_factory=dict)  # client -> acquire time


@dataclass(slots=True, eq=False)
class Lease:
    id: int
    inst: InstanceState
    clients: set[int]
    granted_ns: int
    deadline_ns: int
    highprio: bool = False
    ring: bool = False
    prepaid_ns: int = 0
    revoked_ns: int | None = None
    discount_ns: int = 0
    nominal_ns: int | None = None  # set while extended: where the lease would have ended
    native_client: int | None = None  # policy 5: the one client of this lease (its key in ``native``)


@dataclass(slots=True)
class GpuStats:
    grants: int = 0
    revocations: int = 0
    overruns: int = 0
    late_releases: int = 0
    busy_ns: int = 0


class GpuScheduler:
    """Decides who holds one GPU, until when, and whom to revoke."""

    def __init__(self, index: int, settings: GpuSettings | None = None, now: int = 0) -> None:
        self.index = index
        self.settings = settings if settings is not None else GpuSettings()
        self.settings.validate()
        self.instances: dict[str, InstanceState] = {}
        self.stats = GpuStats()
        self.lease: Lease | None = None
        self.native: dict[int, Lease] = {}
        self._client_inst: dict[int, InstanceState] = {}
        # plain counters, not itertools.count: the daemon deep-copies the core to try admin
        # writes, and copying itertools objects is gone from Python 3.14
        self._orders = 0
        self._last_lease = 0
        self._turns = 0
        self._handoffs: deque[int] = deque(maxlen=HANDOFF_SAMPLES)
        self._handoff_count = 0
        self._handoff_median = 0
        self.min_vr = 0
        self._turn: tuple[InstanceState, int] | None = None  # policy 2 idle turn: (owner, end)
        self._ring: list[tuple[InstanceState | None, int]] = []
        self._seg_idx = 0
        self._seg_end = now
        self._ring_dirty = True
        self._hp_credit = self._hp_cap()
        self._hp_t = now
        self._busy_since: int | None = None

    # ------------------------------------------------------------------ derived
    @property
    def slice_ns(self) -> int:
        return self.settings.slice_ms * NS_PER_MS

    @property
    def overrun_ns(self) -> int:
        return self.settings.overrun_ms * NS_PER_MS

    @property
    def free_weight(self) -> int:
        return self.settings.max_inst - sum(i.weight for i in self.instances.values())

    def holders(self) -> list[Lease]:
        """Every lease now held on this GPU."""
        held = list(self.native.values())
        if self.lease is not None:
            held.append(self.lease)
        return held

    def held_ns(self, name: str, now: int) -> int:
        """Time ``name`` has held this GPU, including a lease still running."""
        inst = self._inst(name)
        total = inst.held_ns
        for lease in self.holders():
            if lease.inst is inst:
                total += now - lease.granted_ns
        return total

    def busy_ns(self, now: int) -> int:
        extra = now - self._busy_since if self._busy_since is not None else 0
        return self.stats.busy_ns + extra

    def has_demand(self, name: str) -> bool:
        inst = self._inst(name)
        return bool(inst.waiters) or any(lease.inst is inst for lease in self.holders())

    # -------------------------------------------------------------- instances
    def add_instance(self, name: str, weight: int, highprio: bool, now: int) -> list[Effect]:
        """Register an instance. ``weight`` 0 means it never gets GPU time."""
        if name in self.instances:
            raise SettingError(f"instance {name} already exists on GPU {self.index}")
        if weight != 0:
            check_range("weight", weight, 1, self.settings.max_inst)
        if weight > self.free_weight:
            raise SettingError(
                f"weight {weight} exceeds free_weight {self.free_weight} on GPU {self.index}"
            )
        self._orders += 1
        inst = InstanceState(name, weight, bool(highprio), self._orders)
        self._place(inst, now)
        self.instances[name] = inst
        self._ring_dirty = True
        if weight > 1 and self.settings.policy == PREEMPTIVE:
            return self.set_policy(WEIGHTED, now)
        return self._schedule(now)

    def remove_instance(self, name: str, now: int) -> list[Effect]:
        """Forget an instance; its lease is ended and its waiters dropped."""
        inst = self._inst(name)
        effects: list[Effect] = []
        for client in list(inst.waiters):
            self._client_inst.pop(client, None)
        inst.waiters.clear()
        for lease in self.holders():
            if lease.inst is inst:
                for client in lease.clients:
                    effects.append(Revoke(client, self.index, lease.id, "removed"))
                    self._client_inst.pop(client, None)
                self._end_lease(lease, now)
        del self.instances[name]
        if self._turn is not None and self._turn[0] is inst:
            self._turn = None
        self._ring_dirty = True
        return effects + self._schedule(now)

    # --------------------------------------------------------------- settings
    def set_policy(self, policy: int, now: int) -> list[Effect]:
        check_range("policy", policy, 0, 5)
        old = self.settings.policy
        if policy == old:
            return []
        self._accrue_hp(now)
        self.settings.policy = policy
        self._turn = None
        self._ring_dirty = True
        # fairness restarts under the new policy: what was owed under the old one is void
        base = max([self.min_vr, *(i.vruntime for i in self.instances.values())])
        for inst in self.instances.values():
            inst.vruntime = base
            inst.debt_ns = 0
        self.min_vr = base
        effects: list[Effect] = []
        if old == NATIVE:
            for lease in self.native.values():
                effects += self._close_under_old_policy(lease, now)
        elif self.lease is not None and policy != NATIVE:
            effects += self._close_under_old_policy(self.lease, now)
        return effects + self._schedule(now)

    def _close_under_old_policy(self, lease: Lease, now: int) -> list[Effect]:
        """Revoke a lease granted under the old policy, whose time so far is void like its debts.

        Its holder only finishes what it started: that is overrun, debt for its next turn.
        Without this, an instance alone on a work-conserving policy (a lease extended for
        seconds) would be charged all of it at release under the new policy, and the others
        would get that many extra turns in a row.
        """
        lease.prepaid_ns = max(lease.prepaid_ns, now - lease.granted_ns)
        lease.deadline_ns = min(lease.deadline_ns, now)
        lease.nominal_ns = None
        return self._revoke(lease, now, "policy")

    def set_max_inst(self, value: int, now: int) -> list[Effect]:
        check_range("max_inst", value, *MAX_INST_RANGE)
        used = sum(i.weight for i in self.instances.values())
        if value < used:
            raise SettingError(f"max_inst {value} is below the sum of weights {used}")
        self.settings.max_inst = value
        self._ring_dirty = True
        return self._schedule(now)

    def set_prio_ratio(self, value: int, now: int) -> list[Effect]:
        check_range("prio_ratio", value, *PRIO_RATIO_RANGE)
        self._accrue_hp(now)
        self.settings.prio_ratio = value
        self._hp_credit = min(self._hp_credit, self._hp_cap())
        return self._schedule(now)

    def set_slice_ms(self, value: int, now: int) -> list[Effect]:
        check_range("slice_ms", value, *SLICE_MS_RANGE)
        self.settings.slice_ms = value
        self._ring_dirty = True
        return self._schedule(now)

    def set_overrun_ms(self, value: int, now: int) -> list[Effect]:
        check_range("overrun_ms", value, 1, 3_600_000)
        self.settings.overrun_ms = value
        return self._schedule(now)

    def set_weight(self, name: str, weight: int, now: int) -> list[Effect]:
        inst = self._inst(name)
        check_range("weight", weight, 1, self.settings.max_inst)
        others = sum(i.weight for i in self.instances.values() if i is not inst)
        if others + weight > self.settings.max_inst:
            raise SettingError(
                f"weight {weight} would make the sum {others + weight} exceed max_inst "
                f"{self.settings.max_inst} on GPU {self.index}"
            )
        inst.weight = weight
        self._ring_dirty = True
        return self._schedule(now)

    def set_highprio(self, name: str, highprio: int, now: int) -> list[Effect]:
        inst = self._inst(name)
        check_range("highprio", highprio, 0, 1)
        inst.highprio = bool(highprio)
        self._ring_dirty = True
        return self._schedule(now)

    # ----------------------------------------------------------------- events
    def acquire(self, name: str, client: int, now: int) -> list[Effect]:
        """``client`` of instance ``name`` wants to run GPU work."""
        inst = self._inst(name)
        owner = self._client_inst.get(client)
        if owner is not None and owner is not inst:
            raise SettingError(f"client {client} belongs to instance {owner.name}, not {name}")
        self._client_inst[client] = inst
        effects: list[Effect] = []
        for held in self._leases_of(client):
            if held.revoked_ns is None and now < held.deadline_ns:
                return [Grant(client, self.index, held.id, held.deadline_ns, 0)]
            effects += self._drop_holder(held, client, now)
        lease = self.lease
        if (
            self.settings.policy != NATIVE
            and lease is not None
            and lease.inst is inst
            and lease.revoked_ns is None
            and now < lease.deadline_ns
        ):
            lease.clients.add(client)
            return [*effects, Grant(client, self.index, lease.id, lease.deadline_ns, 0)]
        if not inst.waiters and not any(h.inst is inst for h in self.holders()):
            self._place(inst, now)
        inst.waiters.setdefault(client, now)
        return effects + self._schedule(now)

    def release(
        self, client: int, lease_id: int, now: int, again: bool = False, used_ns: int | None = None
    ) -> tuple[list[Effect], bool]:
        """``client`` gives ``lease_id`` back. Returns (effects, whether it was current).

        With ``again`` the client still has work: it is queued again in the same
        step, so the choice of the next holder sees its demand (a renew).
        ``used_ns`` is the time the client itself saw the lease (grant received to
        release sent); see :meth:`_handoff_discount`.
        """
        current = False
        if again:  # queued first, so the renewing instance still counts as having demand
            inst = self._client_inst.get(client)
            if inst is not None:
                inst.waiters.setdefault(client, now)
        for lease in self._leases_of(client):
            if lease.id == lease_id:
                if used_ns is not None and len(lease.clients) == 1:
                    lease.discount_ns = self._handoff_discount(now - lease.granted_ns, used_ns)
                self._drop_holder(lease, client, now)
                current = True
        if not current and not again:
            return [], False
        return self._schedule(now), current

    def drop_client(self, client: int, now: int) -> list[Effect]:
        """``client`` went away (disconnect or death): forget its wait and its leases."""
        inst = self._client_inst.pop(client, None)
        if inst is None:
            return []
        inst.waiters.pop(client, None)
        effects: list[Effect] = []
        for lease in self._leases_of(client):
            effects += self._drop_holder(lease, client, now)
        return effects + self._schedule(now)

    def tick(self, now: int) -> list[Effect]:
        """Act on every deadline that has passed by ``now``."""
        effects: list[Effect] = []
        for lease in self.holders():
            if now >= self._cutoff(lease):
                for client in lease.clients:
                    effects.append(Revoke(client, self.index, lease.id, "overrun"))
                self.stats.overruns += 1
                self._end_lease(lease, now)
        return effects + self._schedule(now)

    def next_wakeup(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do."""
        # called after every burst of messages: the cheap tests first, the high-priority
        # candidate (a pass over the instances) only where it can matter
        times = [self._cutoff(lease) for lease in self.native.values()]
        lease = self.lease
        if lease is not None:
            times.append(self._cutoff(lease))
            if not lease.highprio and lease.revoked_ns is None and self._hp_waiting():
                times.append(self._hp_ready_at())
        elif (not self.native and self.settings.policy != NATIVE
              and any(i.waiters for i in self.instances.values())):
            if self._hp_waiting():
                times.append(self._hp_ready_at())
            if self.settings.policy == WEIGHTED and self._turn is not None:
                times.append(self._turn[1])
            if self.settings.policy in RING_POLICIES:
                times.append(self._seg_end)
        return min(times) if times else None

    # ------------------------------------------------------------- internals
    def _next_lease_id(self) -> int:
        self._last_lease += 1
        return self._last_lease

    def _inst(self, name: str) -> InstanceState:
        try:
            return self.instances[name]
        except KeyError:
            raise NotFoundError(f"no instance {name} on GPU {self.index}") from None

    def _leases_of(self, client: int) -> list[Lease]:
        """The leases ``client`` holds: its own under policy 5 (keyed by it), and the shared one."""
        leases = []
        own = self.native.get(client)
        if own is not None and client in own.clients:
            leases.append(own)
        if self.lease is not None and client in self.lease.clients:
            leases.append(self.lease)
        return leases

    def _cutoff(self, lease: Lease) -> int:
        base = lease.revoked_ns if lease.revoked_ns is not None else lease.deadline_ns
        return base + self.overrun_ns

    def _revoke(self, lease: Lease, now: int, reason: str) -> list[Effect]:
        if lease.revoked_ns is not None:
            return []
        lease.revoked_ns = now
        self.stats.revocations += 1
        return [Revoke(c, self.index, lease.id, reason) for c in sorted(lease.clients)]

    def _drop_holder(self, lease: Lease, client: int, now: int) -> list[Effect]:
        lease.clients.discard(client)
        if not lease.clients:
            self._end_lease(lease, now)
        return []

    def _weight_for_vtime(self, inst: InstanceState) -> int:
        if self.settings.policy == PREEMPTIVE:
            return 1
        return max(inst.weight, 1)

    def _handoff_discount(self, held: int, used: int) -> int:
        """The part of a lease spent in message transit, which is charged to nobody.

        ``held - used`` is the grant's and the release's transit as the client tells
        it. Samples up to HANDOFF_MAX_NS feed a running median of the GPU's handoff,
        and a lease is discounted by its own transit but never by more than that
        median: a client that under-reports gains no more than every client gets.
        """
        gap = held - used
        if gap < 0:
            return 0
        if gap <= HANDOFF_MAX_NS:
            self._handoffs.append(gap)
            self._handoff_count += 1
            if self._handoff_count % 16 == 1:  # the median moves slowly: refresh it now and then
                ordered = sorted(self._handoffs)
                self._handoff_median = ordered[len(ordered) // 2]
        return min(gap, self._handoff_median)

    def _end_lease(self, lease: Lease, now: int) -> None:
        self._accrue_hp(now)
        busy_end = now
        now = max(lease.granted_ns, now - lease.discount_ns)  # charge up to the end of real use
        held = max(0, now - lease.granted_ns)
        inst = lease.inst
        inst.held_ns += held
        if now > lease.deadline_ns:
            self.stats.late_releases += 1
        if lease is self.lease:
            self.lease = None
        elif lease.native_client is not None and self.native.get(lease.native_client) is lease:
            del self.native[lease.native_client]
        lease.clients.clear()
        overrun = max(0, now - lease.deadline_ns)
        if lease.highprio or lease.ring:
            charged = max(0, held - lease.prepaid_ns)
        elif (self.settings.policy == WEIGHTED and lease.nominal_ns is None and now < lease.deadline_ns
              and not self.native):
            # policy 2: the owner keeps its turn; the rest passes idle unless it comes back
            charged = max(0, lease.deadline_ns - lease.granted_ns - lease.prepaid_ns)
            self._turn = (inst, lease.deadline_ns)
        else:
            # the overrun becomes debt, paid by shortening the next lease: turns stay in order
            charged = max(0, held - overrun - lease.prepaid_ns)
            inst.debt_ns = min(inst.debt_ns + overrun, DEBT_CAP_SLICES * self.slice_ns)
        inst.vruntime += charged * VR_SCALE // self._weight_for_vtime(inst)
        if lease.highprio:
            self._hp_credit = min(self._hp_credit - 100 * held, self._hp_cap())
        if lease.ring:
            inst.debt_ns = min(inst.debt_ns + overrun, DEBT_CAP_SLICES * self.slice_ns)
            if busy_end >= lease.deadline_ns and self._ring and not self._ring_dirty:
                self._ring_start((self._seg_idx + 1) % len(self._ring), busy_end)
        if self.lease is None and not self.native and self._busy_since is not None:
            self.stats.busy_ns += busy_end - self._busy_since
            self._busy_since = None
        self._update_min_vr(inst)

    def _place(self, inst: InstanceState, now: int) -> None:
        """Put an instance that (re)gains demand at the tail of the current round.

        It joins behind every instance that already has demand, so it waits at most
        one round, and it cannot bring back credit from before it went idle. A holder
        counts with the time of its running lease (which is charged only at release).
        """
        active = [i.vruntime for i in self.instances.values()
                  if i is not inst and i.weight > 0 and i.waiters]
        for lease in self.holders():
            if lease.inst is not inst and lease.inst.weight > 0:
                # up to the deadline only: time past it is debt, charged at the holder's next turn
                running = max(0, min(now, lease.deadline_ns) - lease.granted_ns - lease.prepaid_ns)
                active.append(lease.inst.vruntime + running * VR_SCALE // self._weight_for_vtime(lease.inst))
        inst.vruntime = max([inst.vruntime, self.min_vr, *active])

    def _update_min_vr(self, current: InstanceState | None = None) -> None:
        """Move ``min_vr`` forward to the least vruntime among instances with demand.

        ``current``, the instance whose lease just ended, counts too (as CFS counts
        ``curr``): while one instance runs alone, ``min_vr`` follows it, so an
        instance that comes back later cannot claim that time.
        """
        holding = {lease.inst for lease in self.holders()}
        active = [
            i.vruntime
            for i in self.instances.values()
            if i.weight > 0
            and (i.waiters or i in holding or i is current or self.settings.policy == WEIGHTED)
        ]
        if active:
            self.min_vr = max(self.min_vr, min(active))

    def _grant(
        self,
        inst: InstanceState,
        now: int,
        deadline: int,
        *,
        highprio: bool = False,
        ring: bool = False,
        prepaid: int = 0,
    ) -> list[Effect]:
        lease = Lease(
            self._next_lease_id(), inst, set(inst.waiters), now, deadline, highprio, ring, prepaid
        )
        waiting = sorted(inst.waiters.items()) if len(inst.waiters) > 1 else inst.waiters.items()
        effects: list[Effect] = [Grant(c, self.index, lease.id, deadline, now - t) for c, t in waiting]
        inst.waiters.clear()
        inst.grants += 1
        self.stats.grants += 1
        self._turns += 1
        inst.served = self._turns
        self.lease = lease
        if self._busy_since is None:
            self._busy_since = now
        return effects

    def _schedule(self, now: int) -> list[Effect]:
        """Hand the GPU to whoever should have it now."""
        if self.settings.policy == NATIVE:
            return self._schedule_native(now)
        if self.native:
            return []  # draining leases granted under policy 5
        self._accrue_hp(now)
        lease = self.lease
        if lease is not None:
            if not lease.highprio and self._hp_candidate() is not None and self._hp_ready(now):
                return self._revoke(lease, now, "highprio")
            if lease.nominal_ns is not None and lease.revoked_ns is None and self._contended(lease.inst):
                return self._end_extension(lease, now)
            return []
        hp = self._hp_candidate()
        if hp is not None and self._hp_ready(now):
            r = self.settings.prio_ratio
            length = min(self._hp_credit // (100 - r), hp.weight * self.slice_ns)
            return self._grant(hp, now, now + max(length, 1), highprio=True)
        policy = self.settings.policy
        if policy in RING_POLICIES:
            return self._schedule_ring(now)
        if policy == WEIGHTED:
            return self._schedule_weighted(now)
        return self._schedule_conserving(now)

    def _schedule_native(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for inst in self.instances.values():
            if inst.weight == 0 or not inst.waiters:
                continue
            for client, t in list(inst.waiters.items()):
                lease = Lease(self._next_lease_id(), inst, {client}, now, now + 1000 * NS_PER_MS,
                              native_client=client)
                self.native[client] = lease
                inst.grants += 1
                self.stats.grants += 1
                effects.append(Grant(client, self.index, lease.id, lease.deadline_ns, now - t))
            inst.waiters.clear()
        if self.native and self._busy_since is None:
            self._busy_since = now
        return effects

    def _normal_members(self) -> list[InstanceState]:
        return [i for i in self.instances.values() if i.weight > 0 and not i.highprio]

    def _pick(self, candidates: list[InstanceState]) -> InstanceState | None:
        if not candidates:
            return None
        return min(candidates, key=lambda i: (i.vruntime, i.served, i.order))

    def _schedule_conserving(self, now: int) -> list[Effect]:
        members = self._normal_members()
        candidates = [i for i in members if i.waiters]
        if not candidates:  # leftover time goes to high-priority instances past their cap
            candidates = [i for i in self.instances.values() if i.weight > 0 and i.waiters]
        if not candidates:
            return []
        inst, length = self._next_turn(candidates)
        return self._grant_turn(inst, now, length)

    def _next_turn(self, candidates: list[InstanceState]) -> tuple[InstanceState, int]:
        """The next instance by virtual time and its lease length, once debts are paid.

        An instance whose debt covers a whole turn skips it (charged), and the pick is
        made again; debts only shrink, so this ends.
        """
        while True:
            inst = self._pick(candidates)
            assert inst is not None
            length = self._pay_debt(inst, self._turn_ns(inst))
            if length > 0:
                return inst, length

    def _contended(self, inst: InstanceState) -> bool:
        """Whether another instance wants the GPU that ``inst`` holds (policies 1, 2, 4)."""
        others = [i for i in self._normal_members() if i is not inst]
        if self.settings.policy == WEIGHTED:
            return bool(others)  # a registered instance's turns pass even while it is idle
        return any(i.waiters for i in others)

    def _grant_turn(self, inst: InstanceState, now: int, length: int) -> list[Effect]:
        """Grant a turn; extend it while nobody else wants the GPU (no renewals when alone)."""
        if self._contended(inst) or inst.highprio:
            return self._grant(inst, now, now + length)
        effects = self._grant(inst, now, now + max(length, EXTENDED_NS))
        assert self.lease is not None
        self.lease.nominal_ns = now + length
        return effects

    def _end_extension(self, lease: Lease, now: int) -> list[Effect]:
        """Someone else wants the GPU: the holder keeps its nominal turn, and no more."""
        nominal = lease.nominal_ns
        assert nominal is not None
        lease.nominal_ns = None
        if now >= nominal:
            lease.deadline_ns = now  # the turn is over: not an early release, no idle rest of turn
            return self._revoke(lease, now, "turn")
        lease.deadline_ns = nominal
        return [Grant(c, self.index, lease.id, nominal, 0) for c in sorted(lease.clients)]

    def _turn_ns(self, inst: InstanceState) -> int:
        """The nominal length of one turn of ``inst``: one slice, or w slices when weighted."""
        return (1 if self.settings.policy == PREEMPTIVE else inst.weight) * self.slice_ns

    def _pay_debt(self, inst: InstanceState, full: int) -> int:
        """Length of the lease ``inst`` gets for a turn of ``full`` ns after paying its debt.

        A debt of a whole turn or more skips the turn (charged as used), so 0 is returned.
        """
        if inst.debt_ns >= full:
            inst.debt_ns -= full
            inst.vruntime += full * VR_SCALE // self._weight_for_vtime(inst)
            return 0
        length = full - inst.debt_ns
        inst.vruntime += inst.debt_ns * VR_SCALE // self._weight_for_vtime(inst)
        inst.debt_ns = 0
        return length

    def _schedule_weighted(self, now: int) -> list[Effect]:
        if self._turn is not None:
            owner, end = self._turn
            if now < end:
                if owner.waiters:
                    self._turn = None
                    return self._grant(owner, now, end, prepaid=end - now)
                return []
            self._turn = None
        members = self._normal_members()
        if not any(i.waiters for i in members):
            return []
        inst, length = self._next_turn(members)
        if inst.waiters:
            return self._grant_turn(inst, now, length)
        inst.vruntime += length * VR_SCALE // inst.weight
        self._turns += 1
        inst.served = self._turns  # an idle turn is a turn
        self._turn = (inst, now + length)
        self._update_min_vr()
        return []

    # fixed ring (policies 0 and 3)
    def _ring_rebuild(self, now: int) -> None:
        old_owner = self._ring[self._seg_idx][0] if self._ring else None
        segs: list[tuple[InstanceState | None, int]] = []
        used = 0
        for inst in sorted(self._normal_members(), key=lambda i: i.order):
            n = 1 if self.settings.policy == FIXED else inst.weight
            if used + n > self.settings.max_inst:
                break
            segs.append((inst, n * self.slice_ns))
            used += n
        if used < self.settings.max_inst:
            segs.append((None, (self.settings.max_inst - used) * self.slice_ns))
        self._ring = segs
        self._ring_dirty = False
        owners = [s[0] for s in segs]
        if old_owner is not None and old_owner in owners and self._seg_end > now:
            self._seg_idx = owners.index(old_owner)
        else:
            self._ring_start(0, now)

    def _ring_start(self, idx: int, start: int) -> None:
        for _ in range(len(self._ring)):
            owner, length = self._ring[idx]
            if owner is not None and owner.debt_ns >= length:
                owner.debt_ns -= length
                idx = (idx + 1) % len(self._ring)
                continue
            if owner is not None:
                length -= owner.debt_ns
                owner.debt_ns = 0
            self._seg_idx, self._seg_end = idx, start + length
            return
        self._seg_idx, self._seg_end = idx, start + self._ring[idx][1]

    def _schedule_ring(self, now: int) -> list[Effect]:
        if self._ring_dirty:
            self._ring_rebuild(now)
        round_ns = self.settings.max_inst * self.slice_ns
        if now - self._seg_end > 2 * round_ns:  # skip whole idle rounds at once
            rounds = (now - self._seg_end) // round_ns - 1
            self._seg_end += rounds * round_ns
            for owner, length in self._ring:
                if owner is not None:
                    owner.debt_ns = max(0, owner.debt_ns - rounds * length)
        while now >= self._seg_end:
            self._ring_start((self._seg_idx + 1) % len(self._ring), self._seg_end)
        owner = self._ring[self._seg_idx][0]
        if owner is not None and owner.waiters:
            return self._grant(owner, now, self._seg_end, ring=True)
        return []

    # high priority credit
    def _hp_cap(self) -> int:
        # Two slices' worth of banked credit: over any window W a high-priority
        # instance gets at most prio_ratio % of W plus two slices.
        return (100 - self.settings.prio_ratio) * 2 * self.slice_ns

    def _accrue_hp(self, now: int) -> None:
        dt = now - self._hp_t
        if dt <= 0:
            return
        self._hp_t = now
        self._hp_credit += self.settings.prio_ratio * dt
        if self.lease is None or not self.lease.highprio:
            self._hp_credit = min(self._hp_credit, self._hp_cap())

    def _hp_threshold(self) -> int:
        return (100 - self.settings.prio_ratio) * self.slice_ns

    def _hp_candidate(self) -> InstanceState | None:
        return self._pick([i for i in self.instances.values() if i.highprio and i.weight > 0 and i.waiters])

    def _hp_waiting(self) -> bool:
        return self._hp_candidate() is not None

    def _hp_ready(self, now: int) -> bool:
        self._accrue_hp(now)
        return self._hp_credit >= self._hp_threshold()

    def _hp_ready_at(self) -> int:
        missing = self._hp_threshold() - self._hp_credit
        if missing <= 0:
            return self._hp_t
        r = self.settings.prio_ratio
        return self._hp_t + -(-missing // r)
