"""Gang leases: a job busy on several GPUs gets its turns on all of them at the same moment (behaviour §11, jobs
that span GPUs).

How this works
--------------
As Linux core scheduling makes one pick for every SMT sibling of a core, so that only tasks with the same cookie
run side by side, the :class:`GangBook` makes one pick for every GPU of a *gang*: an instance registered on several
GPUs and busy (waiting for or holding a lease) on two or more of them within ``window_ns``, on GPUs whose policy is
work-conserving virtual time (1 or 4), where it is neither high priority nor limited. Those GPUs are its *members*.
A gang that dissolved with no work on any of them (the job paused) comes back whole at its next demand on one.
A gang's instances are taken out of their GPUs' own picks (``InstanceState.gang``); the GPUs' policies share what
the gang leaves, and know of gangs only through :class:`GangView` (the ``Runqueue.gangs`` hooks).

*Entitlement.* On each member GPU the gang is a tenant of its weight: ``rest * w / W`` there (``W``: the weights
with demand, the gang's included; ``rest``: what high priority leaves), water-filled under the limits of limited
tenants there. It can only use what it has everywhere at once, so its share is the least of these, on every member;
each GPU's other tenants share the rest by weight (under their limits).

*Turns.* The gang runs on a credit that grows at its share of wall time and is spent by the time its leases are held
(as the high-priority class's does). With credit for a turn (its weight's turn on its GPUs) and work waiting on
every member, the gang is *armed*: each member GPU ends its current turn where that turn's nominal end is (an
extended lone holder runs on to where the gang can start: a gang does not count as waiting for a GPU's own turns, so
a lone tenant there holds one lease between its turns); a GPU whose turn ends before its peers' gives the gap to its
own tenants, in a turn cut to end where the last peer's ends (:meth:`GangView.fence`); when every member GPU is free
the gang is granted all of them at once, one deadline for all. Before it is armed, a turn a member GPU starts that
would run on more than half its length past where the gang will be armed (:meth:`GangView.due`) ends there: running
on, it armed the gang at its start and held the gang's turn back to its own end. A turn cut short for a gang goes on
first after the gang's turn (policies/vtime.py). A revoke of one member's lease (high priority, an operator) revokes
the others. Time that nobody else wants on any member GPU goes to a gang with work on all of them (spent from its
credit like any turn). A member GPU idles only where the gang needs it and it has nobody to fill the gap with, or
while a peer's holder runs past its deadline: that *aligned idle* is counted per GPU. Gangs that share a GPU are
armed one at a time, the one owed most per turn first.

*Kicks.* A GPU's scheduler runs only on its own events and wakeups. When a gang dissolves or stops being armed, a
GPU of it may hold a waiter of the gang that is now its own to serve, or be held free for a turn that will not
come: each such GPU is *kicked* (its wakeup is now) and looks again at its next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease
from arbiterd.core.limits import waterfill
from arbiterd.core.model import Bill, GangHooks, InstanceState, Lease, Runqueue
from arbiterd.core.policies.base import Policy
from arbiterd.core.policies.highprio import HighPriority
from arbiterd.core.policies.vtime import VirtualTime
from arbiterd.core.settings import NO_LIMIT

log = logging.getLogger("arbiterd.core")

GANG_POLICIES = (1, 4)  # work-conserving virtual time: what a GPU cannot give a gang, its others may use
DEFAULT_WINDOW_MS = 200
CREDIT_TURNS = 2  # credit banked (and owed) is held within this many turns either way
STRANDED_NS = 10 * NS_PER_MS  # a gang's lease held this far past its deadline is taken for a stranded collective


class Member(Protocol):
    """What the book needs of one GPU's scheduler."""

    rq: Runqueue
    hp: HighPriority
    policy: Policy


@dataclass(slots=True, eq=False)
class Gang:
    """One instance's gang over ``gpus``."""

    name: str
    gpus: tuple[int, ...]
    t: int  # credit accrued up to here
    credit: float = 0.0  # ns of turn it may take now
    rate: float = 0.0  # its share now: credit per ns of wall time
    armed: bool = False
    turn: dict[int, Lease] = field(default_factory=dict)  # the leases of its turn under way, by GPU
    kept: dict[int, int] = field(default_factory=dict)  # GPUs of its turn it had no waiter on: kept for it until
    turn_size: int = 0  # how many GPUs that turn was granted on
    ext: int = 0  # the hand-over its turn under way was lengthened by
    turn_end: int = 0  # that turn's deadline
    turns: int = 0
    turn_len: int = 0  # one turn of it (GangBook.turn_ns), as of the last sync that needed it
    held_ns: int = 0  # its leases' held time, summed over its GPUs


@dataclass(slots=True)
class GangStats:
    """Per GPU: aligned idle (nothing could fill the wait for a gang's peers) and gang turns granted."""

    idle_ns: int = 0
    turns: int = 0
    idle_since: int | None = None


class GangBook:
    """Every gang of the node, and the one pick that starts a gang's turn on all its GPUs."""

    bills = True

    def __init__(self, window_ns: int = DEFAULT_WINDOW_MS * NS_PER_MS) -> None:
        self.window_ns = window_ns  # 0: gangs off
        self.members: dict[int, Member] = {}
        self.gangs: dict[str, Gang] = {}
        self.stats: dict[int, GangStats] = {}
        self._multi: dict[str, tuple[int, ...]] = {}  # instances eligible on two or more GPUs
        self._paused: dict[str, tuple[int, ...]] = {}  # gangs dissolved with every GPU of them idle: their GPUs
        self._dirty = True
        self._busy: dict[tuple[int, str], int] = {}  # when an eligible instance last had demand on a GPU
        self._leases: dict[int, Gang] = {}  # lease id() -> the gang whose turn it is
        self._outbox: list[Effect] = []
        self._t = 0
        # GPUs whose scheduler must look again (a gang over them dissolved or was un-armed: a waiter of its may
        # now be theirs to serve, or a turn fenced for it is free), and since when: their wakeup is then
        self._kick: dict[int, int] = {}
        self._on: dict[int, list[Gang]] = {}  # the gangs over each GPU (kept with gangs)
        self.assumed: Mapping[int, Collection[str]] | None = None  # demand to assume (a simulator's targets)
        # collective spin as far as the daemon sees it, per (GPU, instance): time a member held its lease past the
        # turn's deadline while a peer waited for its next turn (its kernel waiting for that peer's)
        self.spin: dict[tuple[int, str], int] = {}

    def attach(self, member: Member) -> None:
        idx = member.rq.index
        self.members[idx] = member
        self.stats[idx] = GangStats()
        member.rq.gangs = GangView(self, idx)
        self._dirty = True

    # ---------------------------------------------------------------- membership
    @property
    def crossing(self) -> bool:
        """Whether a step on one GPU may move another GPU's deadline now (a gang, or a GPU kicked to look again)."""
        return bool(self.gangs) or bool(self._kick)

    @property
    def enabled(self) -> bool:
        return self.window_ns > 0 and len(self.members) > 1

    def set_window(self, window_ns: int, now: int) -> None:
        """Set the window (0: gangs off, every gang dissolves)."""
        self.window_ns = window_ns
        self._dirty = True
        self.sync(now)

    def _eligible(self, rq: Runqueue, inst: InstanceState) -> bool:
        return (rq.settings.policy in GANG_POLICIES and inst.weight > 0 and not inst.highprio
                and inst.limit >= NO_LIMIT and not rq.draining)

    def _recount(self) -> None:
        on: dict[str, list[int]] = {}
        if self.enabled:
            for idx, m in self.members.items():
                rq = m.rq
                for name, inst in rq.instances.items():
                    if self._eligible(rq, inst):
                        on.setdefault(name, []).append(idx)
        self._multi = {n: tuple(g) for n, g in on.items() if len(g) > 1}
        self._dirty = False

    def _has_demand(self, gpu: int, name: str) -> bool:
        inst = self.members[gpu].rq.instances.get(name)
        return inst is not None and (bool(inst.waiters) or inst.leases > 0)

    def refresh(self, now: int) -> None:
        """Form, change and dissolve gangs by the rule (module docstring)."""
        if self._dirty:
            self._recount()
        want: dict[str, tuple[int, ...]] = {}
        for name, gpus in self._multi.items():
            busy = tuple(g for g in gpus if self._has_demand(g, name)
                         or self._busy.get((g, name), -self.window_ns - 1) >= now - self.window_ns)
            paused = tuple(g for g in self._paused.get(name, ()) if g in gpus)
            if len(busy) > 1:
                want[name] = busy
            elif busy and len(paused) > 1:
                # a gang that paused whole comes back whole, at its first rank's demand: formed from demand alone,
                # two jobs whose ranks came back in turn each took one GPU of the pair as a plain lease, and each
                # waited in a collective for the GPU the other held (until an idle release or overrun_ms)
                want[name] = paused
                for g in paused:
                    self._busy[(g, name)] = now
        for name, gang in list(self.gangs.items()):
            if want.get(name) != gang.gpus:
                if name in self._multi and not any(self._has_demand(g, name) for g in gang.gpus):
                    # none of its GPUs has work now (one may still be within the window: its ranks stopped in
                    # turn): the job paused
                    self._paused[name] = gang.gpus
                self._dissolve(gang, now)
        for name, gpus in want.items():
            self._paused.pop(name, None)
            if name not in self.gangs:
                gang = Gang(name, gpus, now)
                self.gangs[name] = gang
                for g in gpus:
                    self._on.setdefault(g, []).append(gang)
                for g in gpus:
                    inst = self.members[g].rq.instances.get(name)
                    if inst is not None:
                        inst.gang = True

    def _dissolve(self, gang: Gang, now: int) -> None:
        """``gang`` is gone: its instances go back to their GPUs' own turns, an aligned wait for it ends, and
        every GPU of it looks again (a waiter of it, or a turn fenced for it, is now the GPU's to serve)."""
        del self.gangs[gang.name]
        for g in gang.gpus:
            self._on[g] = [other for other in self._on.get(g, ()) if other is not gang]
        for g in gang.gpus:
            self._busy_end(g, now)  # armed or not, it waited on its GPUs: not any more
            self._unflag(g, gang.name, now)
            self._kick.setdefault(g, now)

    def _unflag(self, gpu: int, name: str, now: int) -> None:
        m = self.members.get(gpu)
        if m is None:
            return
        inst = m.rq.instances.get(name)
        if inst is None or not inst.gang:
            return
        inst.gang = False
        if inst.waiters or inst.leases:
            m.policy.demand(inst, now)  # back among its GPU's turns, at the tail of the round

    def changed(self) -> None:
        """Instances, weights, priorities, limits or a policy changed on a GPU: a gang may no longer be one. Every
        GPU of a gang looks again at its next tick (at once), so that a gang an operator's write dissolved is
        gone then, and its ranks wait as their GPUs' own tenants, not until some event there happens to sync."""
        self._dirty = True
        for gang in self.gangs.values():
            for g in gang.gpus:
                self._kick.setdefault(g, self._t)

    def removed(self, gpu: int, name: str, now: int) -> None:
        """Instance ``name`` is about to be forgotten on ``gpu`` (its record dropped): a gang of it over ``gpu``
        dissolves now, while its record is still there (the next sync forms what is left), and what the book
        kept of it there goes."""
        self.accrue(now)
        gang = self.gangs.get(name)
        if gang is not None and gpu in gang.gpus:
            self._dissolve(gang, now)
        self._busy.pop((gpu, name), None)
        self.spin.pop((gpu, name), None)
        self._paused.pop(name, None)
        self._dirty = True

    def ticked(self, gpu: int, now: int) -> None:
        """``gpu``'s tick runs: a kick of it is spent, and the book is brought to ``now`` (the wakeup it asked for may
        be a gang's credit, which only a sync moves: a tick that reached no gang hook would find it due again)."""
        self._kick.pop(gpu, None)
        self.sync(now)

    def touched(self, gpu: int, inst: InstanceState, now: int) -> None:
        if inst.name in self._multi or self._dirty:
            self._busy[(gpu, inst.name)] = now

    # ---------------------------------------------------------------- credit and shares
    def share(self, gang: Gang, gpu: int | None = None, active_here: Collection[str] | None = None) -> float:
        """The gang's share: the least of its weight's share over its GPUs (on each, ``rest`` water-filled by weight
        among the instances with demand under their limits, the gang's included: rest * w / W where none binds)."""
        best = 1.0
        for g in gang.gpus:
            m = self.members[g]
            rq = m.rq
            if g == gpu and active_here is not None:
                active: Collection[str] = active_here
            elif self.assumed is not None:
                active = self.assumed.get(g, ())
            else:
                active = {n for n, i in rq.instances.items() if i.waiters or i.leases}
            _, rest = m.hp.shares(active, True, True, m.policy.limited())
            want = [i for i in rq.instances.values() if i.weight > 0 and not i.highprio
                    and (i.name in active or i.name == gang.name)]
            weights = {i.name: float(m.policy.vtime_weight(i)) for i in want}
            if gang.name not in weights:
                return 0.0  # its record is being dropped, or it is no longer eligible: it dissolves at the next sync
            if m.policy.limited():
                caps = {i.name: i.limit / 100 for i in want if i.limit < NO_LIMIT}
                best = min(best, waterfill(weights, caps, rest)[gang.name])
            else:
                best = min(best, rest * weights[gang.name] / sum(weights.values()))
        return best

    def _active(self, gang: Gang) -> bool:
        if self.assumed is not None:
            return any(gang.name in self.assumed.get(g, ()) for g in gang.gpus)
        return any(self._has_demand(g, gang.name) for g in gang.gpus)

    def turn_ns(self, gang: Gang) -> int:
        """One turn of the gang: the longest its weight's turn is on any of its GPUs (kept as ``turn_len``)."""
        gang.turn_len = max(self._turn_on(g, gang.name) for g in gang.gpus)
        return gang.turn_len

    def _turn_on(self, gpu: int, name: str) -> int:
        m = self.members[gpu]
        inst = m.rq.instances.get(name)
        if inst is None:  # its record is being dropped: it dissolves at the next sync
            return m.rq.slice_ns
        if isinstance(m.policy, VirtualTime):
            return m.policy.turn_ns(inst)
        return max(1, inst.weight) * m.rq.slice_ns  # its GPU left the gang's policies: it dissolves at the next sync

    def accrue(self, now: int) -> None:
        dt = now - self._t
        if dt <= 0:
            return
        self._t = now
        for gang in self.gangs.values():
            if now > gang.t:
                gang.credit += gang.rate * (now - gang.t)
                gang.t = now
                if gang.rate > 0 or gang.credit < 0:  # else nothing moved it towards a bound
                    turn = self.turn_ns(gang)
                    gang.credit = max(-CREDIT_TURNS * turn, min(gang.credit, CREDIT_TURNS * turn))

    def rerate(self) -> None:
        for gang in self.gangs.values():
            gang.rate = self.share(gang) if self._active(gang) else 0.0

    # ---------------------------------------------------------------- the pick
    def sync(self, now: int) -> None:
        """Bring credit to ``now``, the gangs up to date, and arm those due (the cut-backs this makes, on any of
        their GPUs, go out with the effects of the call under way: :meth:`take`)."""
        dirty = self._dirty  # a record may be gone: the gangs are brought up to date before anything reads them
        if dirty:
            self.refresh(now)
        self.accrue(now)
        if not dirty:
            self.refresh(now)
        self.rerate()
        if not self.gangs:
            return
        # an armed gang yields to one that holds one of its GPUs (that one goes first, just below), or stands down
        # when it waits on none of its GPUs any more (its clients died): nothing would use the turn
        yielded = [g for g in self.gangs.values()
                   if g.armed and (not self._waits(g) or self._blocked_by_gang(g, now))]
        for gang in yielded:
            gang.armed = False
        for gang in self.gangs.values():
            self.turn_ns(gang)
        # a gang that holds one of its GPUs stranded (a kernel waiting for its peers) arms first, then the one owed
        # most, relative to one of its turns
        for gang in sorted(self.gangs.values(),
                           key=lambda g: (not self._holds(g, now), -g.credit / max(1, g.turn_len), g.name)):
            if gang.kept:
                for g, end in gang.kept.items():
                    if end <= now:  # the GPU kept for the turn is free: its own scheduler looks again
                        self._kick.setdefault(g, now)
                gang.kept = {g: end for g, end in gang.kept.items() if end > now}
            # armed as soon as its credit will pay for a turn by the time its GPUs' current turns end: the wait for
            # them overlaps what it still has to earn
            if not gang.armed and not self._in_turn(gang, now) and self._waits(gang) \
                    and gang.credit + gang.rate * self._busy_for(gang, now) >= gang.turn_len // 2 \
                    and not self._armed_on(gang.gpus):
                gang.armed = True
                log.debug("gang %s armed at %d (credit %.0f, GPUs %s)", gang.name, now, gang.credit, gang.gpus)
                self._outbox += self._cut_back(gang, now)
        for gang in yielded:
            if not gang.armed:
                self._unarmed(gang, now)

    def _unarmed(self, gang: Gang, now: int) -> None:
        """``gang`` is armed no longer: a GPU idle or fenced for it is its own scheduler's again."""
        for g in gang.gpus:
            self._busy_end(g, now)
            self._kick.setdefault(g, now)

    def _holds(self, gang: Gang, now: int) -> bool:
        """Whether the gang holds the lease on one of its GPUs *stranded*: past its deadline by more than
        ``STRANDED_NS``, not revoked (a kernel of it waits for a peer, which waits for a turn). A rank finishing its
        last step just past the deadline is the turn's tail, not a strand: taken for one, it put its gang first
        again at each turn's end, and of two gangs on one pair one had four turns in a row (264 ms for the other's
        step)."""
        return any((end := self._held_until(gang, g)) is not None and now > end + STRANDED_NS for g in gang.gpus)

    def _held_until(self, gang: Gang, gpu: int) -> int | None:
        """The deadline of the gang's lease on ``gpu``, where it holds one not revoked."""
        lease = self.members[gpu].rq.lease
        if lease is not None and lease.inst.name == gang.name and lease.revoked_ns is None:
            return lease.deadline_ns
        return None

    def _blocked_by_gang(self, gang: Gang, now: int) -> bool:
        """Whether one of the armed ``gang``'s GPUs is held by another gang outside its turn (its kernel waits
        for a peer, which waits for a turn): that gang must run first, or both wait until overrun_ms."""
        for g in gang.gpus:
            lease = self.members[g].rq.lease
            other = self.gangs.get(lease.inst.name) if lease is not None else None
            if other is not None and other is not gang and not self._in_turn(other, now) and self._waits(other) \
                    and self._holds(other, now):
                return True
        return False

    def _busy_for(self, gang: Gang, now: int) -> int:
        """How long until the current turns on the gang's GPUs (not its own) end."""
        end = now
        for g in gang.gpus:
            lease = self.members[g].rq.lease
            if lease is not None and lease.inst.name != gang.name and lease.revoked_ns is None:
                end = max(end, lease.nominal_ns if lease.nominal_ns is not None else lease.deadline_ns)
        return end - now

    @staticmethod
    def _in_turn(gang: Gang, now: int) -> bool:
        """Whether a turn of the gang is under way: a GPU kept for it, or a lease of it neither revoked nor past
        its deadline (one held past it, a kernel waiting for a peer, is adopted by the next turn)."""
        return bool(gang.kept) or any(lease.revoked_ns is None and now < lease.deadline_ns
                                      for lease in gang.turn.values())

    def _waits(self, gang: Gang) -> bool:
        """Whether the gang waits on one of its GPUs (the others may be held by a kernel spinning for a peer,
        or between launches: they are kept for it)."""
        return any(self._waits_on(g, gang.name) for g in gang.gpus)

    def _waits_on(self, gpu: int, name: str) -> bool:
        inst = self.members[gpu].rq.instances.get(name)
        return inst is not None and bool(inst.waiters)

    def kept_until(self, gpu: int, now: int) -> tuple[Gang, int] | None:
        """The gang ``gpu`` is kept for now, and until when."""
        for gang in self._on.get(gpu, ()):
            end = gang.kept.get(gpu)
            if end is not None and end > now:
                return gang, end
        return None

    def _armed_on(self, gpus: Collection[int]) -> bool:
        return any(g.armed and set(g.gpus) & set(gpus) for g in self.gangs.values())

    def _cut_back(self, gang: Gang, now: int) -> list[Effect]:
        """The gang is armed: an extended lone holder on a member GPU runs on to where the gang can start (its
        nominal turn's end at the earliest, and the last peer's current turn's end), and no more: nobody else
        waits for that GPU meanwhile, and a renewal there would cost its holder a hand-over. It stays extended
        (its nominal end kept), so that another instance that comes to wait there, or the gang's own rank once the
        gang dissolves, cuts it back to its turn as before; and it never runs past the end its grant had (a limit's
        ceiling, limits.py)."""
        extended: list[tuple[int, Lease]] = []
        start = now
        for g in gang.gpus:
            lease = self.members[g].rq.lease
            if lease is None or lease.revoked_ns is not None or lease.inst.name == gang.name:
                continue
            if lease.nominal_ns is not None:
                extended.append((g, lease))
                start = max(start, lease.nominal_ns)
            else:
                start = max(start, lease.deadline_ns)
            kept = self.kept_until(g, now)
            if kept is not None:
                start = max(start, kept[1])
        effects: list[Effect] = []
        for g, lease in extended:
            rq = self.members[g].rq
            end = min(start, lease.deadline_ns)
            if now >= end:
                lease.nominal_ns = None
                lease.deadline_ns = now
                effects += rq.revoke(lease, now, "turn")
            elif end != lease.deadline_ns:
                lease.deadline_ns = end
                effects += [GrantLease(c, g, lease.id, end, 0) for c in sorted(lease.clients)]
        return effects

    def fence(self, gpu: int, now: int) -> int | None:
        """Where a turn granted on ``gpu`` now must end: where the last peer's current turn ends, for the gang
        armed over ``gpu`` (now: it waits only for a peer running past its deadline)."""
        for gang in self._on.get(gpu, ()):
            if gang.armed:
                end = now
                for g in gang.gpus:
                    lease = self.members[g].rq.lease
                    if g != gpu and lease is not None and lease.revoked_ns is None:
                        end = max(end, lease.deadline_ns)
                    kept = self.kept_until(g, now)
                    if g != gpu and kept is not None:
                        end = max(end, kept[1])
                return end
        return None

    def due(self, gpu: int, now: int) -> int | None:
        """Where a turn granted on ``gpu`` now should end at the latest: where a gang over it, not yet armed, will
        be (its credit paying for half a turn by then, and its peers' current turns over: as :meth:`sync` arms
        it). A turn that ran past that point would arm the gang at its grant and hold the gang's start back to its
        own end, while the peers' turns are cut to it (:meth:`fence`): the gang's wait grew by up to a whole turn
        of another tenant."""
        at: int | None = None
        for gang in self._on.get(gpu, ()):
            if gang.armed or gang.rate <= 0 or self._in_turn(gang, now) or not self._waits(gang) \
                    or self._armed_on(gang.gpus):
                continue
            credit = gang.credit + gang.rate * max(0, now - gang.t)
            missing = (gang.turn_len or self.turn_ns(gang)) // 2 - credit
            end = max(now + max(0, int(missing / gang.rate) + 1), now + self._busy_for(gang, now),
                      *(kept[1] for g in gang.gpus if g != gpu and (kept := self.kept_until(g, now)) is not None))
            if end > now and (at is None or end < at):
                at = end
        return at

    def _free(self, gang: Gang, now: int) -> bool:
        for g in gang.gpus:
            m = self.members[g]
            lease = m.rq.lease
            if (lease is not None and lease.inst.name != gang.name) or m.rq.draining \
                    or self.kept_until(g, now) is not None:
                return False
            if m.hp.candidate() is not None and m.hp.ready(now):
                return False
        return True

    def pick(self, gpu: int, now: int) -> list[Effect] | None:
        """Start a gang's turn on every GPU of it at once, if one is armed over ``gpu`` and all are free, or time
        nobody else wants is left on all of them; a GPU kept for a gang's turn is its alone until the turn's end;
        None: the GPU's policy picks (within :meth:`fence`)."""
        self._kick.pop(gpu, None)
        self.sync(now)
        kept = self.kept_until(gpu, now)
        if kept is not None:
            gang, end = kept
            if not self._waits_on(gpu, gang.name):
                return []
            del gang.kept[gpu]
            return self._lease(gang, gpu, now, end, gang.ext)
        for gang in self._on.get(gpu, ()):
            if gpu not in gang.turn and now < gang.turn_end and gang.turn \
                    and self._waits_on(gpu, gang.name):
                # it comes back within its turn, which a peer still holds: the rest of the turn is its own here
                return self._lease(gang, gpu, now, gang.turn_end, 0)
        for gang in self._on.get(gpu, ()):
            if gang.armed:
                if self._free(gang, now):
                    return self._grant(gang, now, self.turn_ns(gang))
                self._idle(gpu, now)
                fence = self.fence(gpu, now)
                # the gang starts now (a peer runs past its deadline): nothing fits before it; else the GPU's
                # tenants fill the gap, within the fence
                return [] if fence is not None and fence <= now else None
        if any(not self._in_turn(g, now) and self._waits_on(gpu, g.name) for g in self._on.get(gpu, ())):
            self._idle(gpu, now)  # free while a gang waits on it, until a lease is granted here (granted)
        else:
            self._busy_end(gpu, now)
        spare = [g for g in self._on.get(gpu, ()) if not self._in_turn(g, now) and self._waits(g)
                 and self._free(g, now) and not any(self._others_wait(m, g.name) for m in g.gpus)]
        if spare:  # time nobody else wants on any of its GPUs
            gang = max(spare, key=lambda g: g.credit)
            return self._grant(gang, now, self.turn_ns(gang))
        return None

    def _others_wait(self, gpu: int, name: str) -> bool:
        """Whether another instance waits on ``gpu`` and may run (one whose limit's runtime is spent may not)."""
        rq = self.members[gpu].rq
        return any(i.waiters and i.weight > 0 and i.name != name and not rq.bw.throttled(i)
                   for i in rq.instances.values())

    def _grant(self, gang: Gang, now: int, length: int) -> list[Effect]:
        """The gang's turn on all its GPUs at once, one deadline for all: a lease where it waits, and where it does
        not (a kernel spinning for a peer, or between launches) the GPU is kept for it until the deadline. The turn
        is paid from its credit at once; what its leases hold past the deadline, at their end."""
        log.debug("gang %s: a turn of %d ns on GPUs %s at %d", gang.name, length, gang.gpus, now)
        gang.armed = False
        ext = max(self.members[g].rq.extension_for(self.members[g].rq.instances[gang.name]) for g in gang.gpus)
        gang.ext = ext
        end = now + length + ext
        gang.turn_end = end
        gang.credit -= length + ext
        gang.turn_size = len(gang.gpus)
        gang.turns += 1
        effects: list[Effect] = []
        for g in gang.gpus:
            self._busy_end(g, now)
            self.stats[g].turns += 1
            own = self.members[g].rq.lease
            if own is not None and own.revoked_ns is None:
                # its own, from before it was a gang or from its last turn (a kernel spinning for a peer): it runs
                # on as this turn's
                if now > own.deadline_ns:
                    # what it held past its deadline is its gang's, as a lease's end would bill it: the deadline
                    # moves now, so its end would not (unbilled, a gang stranded at every turn's end was first
                    # again each time, and the other gang on its pair never ran)
                    self._spun(g, gang.name, now - own.deadline_ns)
                    gang.credit -= (now - own.deadline_ns) / len(gang.gpus)
                own.deadline_ns, own.nominal_ns, own.owner = end, None, self
                effects += [GrantLease(c, g, own.id, end, 0) for c in sorted(own.clients)]
                gang.turn[g] = own
                self._leases[id(own)] = gang
            elif own is not None:  # revoked, its holder finishing a kernel: then the GPU is kept for it
                gang.kept[g] = end
            elif self._waits_on(g, gang.name):
                effects += self._lease(gang, g, now, end, ext)
            else:
                gang.kept[g] = end
        return effects

    def _lease(self, gang: Gang, gpu: int, now: int, end: int, ext: int) -> list[Effect]:
        rq = self.members[gpu].rq
        effects = rq.grant(rq.instances[gang.name], now, end, self, extension=min(ext, end - now))
        lease = rq.lease
        assert lease is not None
        gang.turn[gpu] = lease
        self._leases[id(lease)] = gang
        return effects

    def granted(self, gpu: int, now: int) -> None:
        """A lease was granted on ``gpu`` (to anyone): it is not idle for a gang; and where a gang armed over it
        waits, its other GPUs look again: one that found this GPU free an instant ago (a high-priority instance
        about to take it) idled for a gang that could start at once, and its fence is where this lease ends."""
        self._busy_end(gpu, now)
        for gang in self._on.get(gpu, ()):
            if gang.armed:
                for g in gang.gpus:
                    if g != gpu:
                        self._kick.setdefault(g, now)

    def _idle(self, gpu: int, now: int) -> None:
        st = self.stats[gpu]
        if st.idle_since is None:
            st.idle_since = now

    def _busy_end(self, gpu: int, now: int) -> None:
        st = self.stats[gpu]
        if st.idle_since is not None:
            st.idle_ns += now - st.idle_since
            st.idle_since = None

    def wakeup(self, gpu: int) -> int | None:
        """When a gang over ``gpu`` will have credit for a turn, a GPU kept for it is free again, or one of its GPUs
        leaves it (the window); at once for a GPU kicked (a gang over it dissolved or was un-armed)."""
        at: int | None = self._kick.get(gpu)
        for gang in self._on.get(gpu, ()):
            times = list(gang.kept.values())
            if not gang.armed and gang.rate > 0 and not self._in_turn(gang, gang.t):
                # it arms once credit + rate x (the turns under way on its GPUs) pays half a turn: that sum stays
                # put until those turns end, then grows at its rate; a turn granted on a member GPU since the last
                # sync may have made it enough now
                missing = (gang.turn_len or self.turn_ns(gang)) // 2 - gang.credit
                if missing > 0:
                    times.append(gang.t + int(missing / gang.rate) + 1)
                if self._waits(gang) and not self._armed_on(gang.gpus) \
                        and missing <= gang.rate * self._busy_for(gang, gang.t):
                    times.append(gang.t)
            for g in gang.gpus:
                if not self._has_demand(g, gang.name):
                    times.append(self._busy.get((g, gang.name), gang.t) + self.window_ns + 1)
                end = self._held_until(gang, g)
                if end is not None and end <= gang.t <= end + STRANDED_NS:
                    times.append(end + STRANDED_NS + 1)  # taken for stranded then (_holds)
            for t in times:
                at = t if at is None or t < at else at
        return at

    # ---------------------------------------------------------------- the Charger of its leases
    def charge(self, lease: Lease, bill: Bill) -> int:
        """A gang's turn was paid at its grant: a lease of it pays here what it held past the deadline (shared
        over the GPUs of the turn), and gets back what a revoke cut off, or what the turn had left where its last
        lease ended early. It is no part of its GPU's virtual time (the gang is not among that GPU's picks)."""
        gang = self._leases.pop(id(lease), None)
        if gang is not None:
            size = max(1, gang.turn_size)
            if lease.revoked_ns is not None and bill.end < lease.deadline_ns:
                gang.credit += (lease.deadline_ns - bill.end) / size
            else:
                gang.credit -= max(0, bill.end - lease.deadline_ns) / size
            late = bill.end - lease.deadline_ns
            if late > 0 and any(self._has_demand(g, gang.name) for g in gang.gpus if g not in gang.turn):
                gpu = next((g for g in gang.gpus if self.members[g].rq.instances.get(gang.name) is lease.inst), None)
                if gpu is not None:
                    self._spun(gpu, gang.name, late)
            gang.held_ns += bill.held
            mine = next((g for g, held in gang.turn.items() if held is lease), None)
            gang.turn = {g: held for g, held in gang.turn.items() if held is not lease}
            if mine is not None and lease.revoked_ns is None and bill.end < lease.deadline_ns:
                if gang.turn:
                    # its rank stepped off before the turn's end (its process between launches for a while) while
                    # a peer still holds its GPU, maybe in a collective that waits for this rank: the GPU stays the
                    # gang's until the turn's end, or the rank, back, would wait for a tenant's whole turn
                    gang.kept[mine] = lease.deadline_ns
                else:  # the turn's last lease ended early: nothing of it runs, a GPU kept for it is free
                    # and is billed what it held, as a tenant's virtual time is: billed the whole turn, a gang
                    # granted as each of its bursts ended (its rank blocked at the end, granted in the pause) earned
                    # its next turn only after its next burst, and did no work at all
                    gang.credit += lease.deadline_ns - bill.end
                    for g in gang.kept:
                        self._kick.setdefault(g, bill.end)
                    gang.kept.clear()
            for g, m in self.members.items():
                if m.rq.instances.get(lease.inst.name) is lease.inst:
                    self._busy[(g, lease.inst.name)] = bill.end
        return 0

    def _spun(self, gpu: int, name: str, ns: int) -> None:
        key = (gpu, name)
        self.spin[key] = self.spin.get(key, 0) + ns

    def idle_ns(self, gpu: int, now: int) -> int:
        """Time ``gpu`` idled for a gang's alignment (nothing could fill the wait for its peers), so far."""
        st = self.stats[gpu]
        return st.idle_ns + (now - st.idle_since if st.idle_since is not None else 0)

    def forget(self, lease: Lease) -> None:
        """Its leases are each GPU's current one: nothing of its own to drop (:meth:`charge` closes them)."""

    def revoked(self, lease: Lease) -> None:
        """One GPU's lease of a gang's turn was revoked: so are the others (they end together)."""
        gang = self._leases.get(id(lease))
        if gang is None:
            return
        at = lease.revoked_ns if lease.revoked_ns is not None else lease.granted_ns
        for g, other in list(gang.turn.items()):
            if other is not lease and other.revoked_ns is None:
                self._outbox += self.members[g].rq.revoke(other, at, "turn")
        for g in gang.kept:  # free again: its own scheduler looks again
            self._kick.setdefault(g, at)
        gang.kept.clear()

    def take(self) -> list[Effect]:
        out, self._outbox = self._outbox, []
        return out

    # ---------------------------------------------------------------- the view for status
    def gang_of(self, gpu: int, name: str) -> Gang | None:
        gang = self.gangs.get(name)
        return gang if gang is not None and gpu in gang.gpus else None

    def shares(self, gpu: int, active: Collection[str]) -> dict[str, float]:
        """The shares of ``gpu``'s gang members while ``active`` have demand there (the peers' demand: as now)."""
        out: dict[str, float] = {}
        for gang in self._on.get(gpu, ()):
            live = gang.name in active or any(
                gang.name in (self.assumed.get(g, ()) if self.assumed is not None else ())
                or (self.assumed is None and self._has_demand(g, gang.name)) for g in gang.gpus if g != gpu)
            out[gang.name] = self.share(gang, gpu, active) if live else 0.0
        return out


class GangView(GangHooks):
    """One GPU's hooks into the book (``Runqueue.gangs``)."""

    def __init__(self, book: GangBook, gpu: int) -> None:
        self.book = book
        self.gpu = gpu

    @property
    def active(self) -> bool:
        book = self.book
        return bool(book.gangs) or bool(book._multi) or bool(book._kick) or (book._dirty and book.enabled)

    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        self.book.sync(now)
        return None

    def pick(self, now: int) -> list[Effect] | None:
        return self.book.pick(self.gpu, now)

    def fence(self, now: int) -> int | None:
        return self.book.fence(self.gpu, now)

    def due(self, now: int) -> int | None:
        return self.book.due(self.gpu, now)

    def granted(self, now: int) -> None:
        self.book.granted(self.gpu, now)

    def wakeup(self) -> int | None:
        return self.book.wakeup(self.gpu)

    def touched(self, inst: InstanceState, now: int) -> None:
        self.book.touched(self.gpu, inst, now)

    def changed(self) -> None:
        self.book.changed()

    def removed(self, name: str, now: int) -> None:
        self.book.removed(self.gpu, name, now)

    def ticked(self, now: int) -> None:
        self.book.ticked(self.gpu, now)

    def take(self) -> list[Effect]:
        return self.book.take()

    def shares(self, active: Collection[str], rest: float) -> dict[str, float]:
        return self.book.shares(self.gpu, active)
