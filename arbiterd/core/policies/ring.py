"""Policies 0 and 3: a fixed ring of ``max_inst`` slots turned by the clock.

* 0, fixed: each instance owns one slot.
* 3, fixed core: an instance of weight w owns w slots, a hard cap of w / max_inst
  of the GPU whether or not it is otherwise idle. The slots are spread over the
  ring (smooth weighted round robin, idle slots included), so a 30 % instance
  waits a few slices between turns rather than most of a ring, and the cap holds
  over any window of a few slices, not only over whole rings.

Unowned slots, and slots whose owner has no work, leave the GPU idle. An owner
that overruns its segment owes the overrun (``debt_ns``), which is taken off its
next segment, so the cap holds exactly in the long run.
"""

from __future__ import annotations

from collections.abc import Collection

from arbiterd.core.effects import Effect
from arbiterd.core.model import Bill, InstanceState, Lease, Runqueue
from arbiterd.core.policies.base import Policy
from arbiterd.core.policies.highprio import HighPriority


class Ring(Policy):
    def __init__(self, gpu: Runqueue, hp: HighPriority, now: int) -> None:
        super().__init__(gpu, hp, now)
        self.segments: list[tuple[InstanceState | None, int]] = []
        self.idx = 0
        self.seg_end = now
        self.dirty = True

    def slots(self, inst: InstanceState) -> int:
        return inst.weight

    def changed(self, now: int) -> None:
        self.dirty = True

    def layout(self, members: list[tuple[InstanceState, int]], idle: int) -> list[tuple[InstanceState | None, int]]:
        """The ring's order: (owner, slots) runs; here each member's slots together, then the idle ones."""
        return [*members, (None, idle)] if idle else list(members)

    def rebuild(self, now: int) -> None:
        gpu = self.gpu
        old = [s[0] for s in self.segments]
        current = old[self.idx] if old else None
        turn = old[: self.idx].count(current)  # which of its segments the current owner is in
        members: list[tuple[InstanceState, int]] = []
        used = 0
        for inst in sorted(gpu.normal_members(), key=lambda i: i.order):
            n = self.slots(inst)
            if used + n > gpu.settings.max_inst:
                break
            members.append((inst, n))
            used += n
        runs = self.layout(members, gpu.settings.max_inst - used)
        # an owned segment holds its slots' useful time plus its owner's hand-over, taken from the idle slots
        idle_slots = sum(n for owner, n in runs if owner is None)
        taken = sum(gpu.extension_for(owner) for owner, _ in runs if owner is not None)
        slot = gpu.round_slice_ns(gpu.settings.max_inst)  # the ring is one round of max_inst slots
        segs: list[tuple[InstanceState | None, int]] = []
        for owner, n in runs:
            if owner is not None:
                segs.append((owner, n * slot + gpu.extension_for(owner)))
            elif (length := n * slot - taken * n // idle_slots) > 0:
                segs.append((None, length))
        had_segments = bool(self.segments)
        self.segments = segs
        self.dirty = False
        owners = [s[0] for s in segs]
        # the ring goes on from the segment under way (new lengths apply from the next one), if it still exists:
        # the same turn of the same owner, so a rebuild neither repeats nor skips an owner's segments
        if had_segments and current in owners:
            turns = [i for i, o in enumerate(owners) if o is current]
            self.idx = turns[min(turn, len(turns) - 1)]
        else:
            self.start(0, now)

    def start(self, idx: int, start: int) -> None:
        """Begin segment ``idx`` at ``start``, skipping segments whose owner's debt covers them."""
        for _ in range(len(self.segments)):
            owner, length = self.segments[idx]
            if owner is not None and owner.debt_ns >= length:
                owner.debt_ns -= length
                idx = (idx + 1) % len(self.segments)
                continue
            if owner is not None:
                length -= owner.debt_ns
                owner.debt_ns = 0
            self.idx, self.seg_end = idx, start + length
            return
        self.idx, self.seg_end = idx, start + self.segments[idx][1]

    def pick(self, now: int) -> list[Effect]:
        gpu = self.gpu
        if self.dirty:
            self.rebuild(now)
        round_ns = sum(length for _, length in self.segments)
        if now - self.seg_end > 2 * round_ns:  # skip whole idle rounds at once
            rounds = (now - self.seg_end) // round_ns - 1
            self.seg_end += rounds * round_ns
            for owner, length in self.segments:
                if owner is not None:
                    owner.debt_ns = max(0, owner.debt_ns - rounds * length)
        while now >= self.seg_end:
            self.start((self.idx + 1) % len(self.segments), self.seg_end)
        owner = self.segments[self.idx][0]
        if owner is not None and owner.waiters:
            ext = min(gpu.extension_for(owner), self.seg_end - now)
            return gpu.grant(owner, now, self.seg_end, self, ring=True, extension=ext)
        return []

    def wakeup(self) -> int | None:
        return self.seg_end

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        """A hard cap: owned slots over all slots, whoever else wants the GPU; an idle owner keeps its slots."""
        top = self.gpu.settings.max_inst
        return {i.name: rest * self.slots(i) / top for i in members}

    def charge(self, lease: Lease, bill: Bill) -> int:
        """The owner pays its overrun off its next segment; a segment that ran out turns the ring."""
        self.gpu.add_debt(lease.inst, bill.overrun)
        if bill.end >= lease.deadline_ns and self.segments and not self.dirty and not self.retired:
            self.start((self.idx + 1) % len(self.segments), bill.end)
        return max(0, bill.billed - lease.prepaid_ns)


class Fixed(Ring):
    number = 0
    name = "fixed"

    def slots(self, inst: InstanceState) -> int:
        return 1


class FixedCore(Ring):
    number = 3
    name = "fixed-core"

    def layout(self, members: list[tuple[InstanceState, int]], idle: int) -> list[tuple[InstanceState | None, int]]:
        """Every slot its own turn, spread evenly: smooth weighted round robin, the idle slots a member too."""
        entries: list[tuple[InstanceState | None, int]] = [*members, (None, idle)] if idle else list(members)
        total = sum(n for _, n in entries)
        credit = [0] * len(entries)
        runs: list[tuple[InstanceState | None, int]] = []
        for _ in range(total):
            for i, (_, n) in enumerate(entries):
                credit[i] += n
            best = max(range(len(entries)), key=lambda i: credit[i])
            credit[best] -= total
            owner = entries[best][0]
            if runs and runs[-1][0] is owner:
                runs[-1] = (owner, runs[-1][1] + 1)
            else:
                runs.append((owner, 1))
        return runs
