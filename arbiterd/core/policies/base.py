"""What every policy class provides: the scheduler calls through this and never asks which it holds.

Like Linux's ``struct sched_class``: the scheduler asks the high-priority class
first and the GPU's policy second, for a verdict on the current holder
(:meth:`holder_check`) or for the next grant (:meth:`pick`). A lease is charged
by the class that granted it (:meth:`charge`), so a lease granted under an old
policy is billed by that policy's rules even after the switch.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import ClassVar

from arbiterd.core.effects import Effect, Grant
from arbiterd.core.model import Bill, GpuState, InstanceState, Lease


class Policy:
    """One scheduling policy of one GPU (the defaults are those of the time-sliced policies)."""

    number: ClassVar[int]
    name: ClassVar[str]
    # every client gets a lease of its own, at once (native): so a release that grants nothing brings no
    # deadline earlier (the daemon's timer relies on it)
    concurrent: ClassVar[bool] = False
    conserving: ClassVar[bool] = False  # time nobody with demand wants goes to whoever wants it
    bills: bool = True  # its leases are billed when they end (native, in force, has no turns to bill)

    def __init__(self, gpu: GpuState, now: int) -> None:
        self.gpu = gpu
        self.retired = False  # the GPU switched to another policy; leases it granted may still end

    def retire(self) -> None:
        """The GPU switched to another policy: leases this one granted may still end, and are billed."""
        self.retired = True
        self.bills = True

    # membership -------------------------------------------------------------
    def changed(self, now: int) -> None:
        """Instances, weights, priorities, max_inst or the slice changed."""

    def demand(self, inst: InstanceState, now: int) -> None:
        """``inst`` starts to want the GPU (it had neither a waiter nor a lease)."""

    def removed(self, inst: InstanceState) -> None:
        """``inst`` is gone."""

    def weight_switch(self, weight: int) -> int | None:
        """The policy a GPU on this one switches to when an instance of ``weight`` joins, if any."""
        return None

    # scheduling ---------------------------------------------------------------
    def holder_check(self, lease: Lease, now: int) -> list[Effect] | None:
        """Effects for the current holder (a cut-back or revoke), or None to keep it."""
        return None

    def pick(self, now: int) -> list[Effect]:
        """Grant the GPU to whoever should have it now (nothing: it stays idle)."""
        raise NotImplementedError

    def pick_for(self, inst: InstanceState, now: int) -> list[Effect]:
        """:meth:`pick`, after only ``inst`` gained a waiter (a concurrent policy looks at ``inst`` alone)."""
        return self.pick(now)

    def grant(self, inst: InstanceState, client: int, since: int, now: int) -> Grant:
        """A concurrent policy's lease for ``client`` of ``inst`` (weight above 0), waiting since ``since``, at once."""
        raise NotImplementedError

    def wakeup(self) -> int | None:
        """When this policy next wants :meth:`pick` called while clients wait, if ever."""
        return None

    def shares(self, members: list[InstanceState], active: Collection[str], rest: float) -> dict[str, float]:
        """The share of GPU time each normal instance is owed while ``active`` have demand.

        ``rest`` is what high priority leaves to the normal instances.
        """
        raise NotImplementedError

    # accounting ----------------------------------------------------------------
    def vtime_weight(self, inst: InstanceState) -> int:
        """The weight that divides ``inst``'s virtual-time charges."""
        return max(inst.weight, 1)

    def charge(self, lease: Lease, bill: Bill) -> int:
        """The time ``lease`` is billed (virtual time); overrun becomes debt for the next turn."""
        self.gpu.add_debt(lease.inst, bill.overrun)
        return max(0, bill.billed - bill.overrun - lease.prepaid_ns)

    def after_charge(self, inst: InstanceState | None) -> None:
        """A lease of ``inst`` has been charged (keeps the virtual-time floor)."""
