"""What the GPU scheduler does when one of its settings, or an instance's, is written (the tree, ``inst_ctl``, an
allocation, the state file): each write is checked first (:meth:`SettingWrites.check`, ``check_*``), changing
nothing when refused, then applied, re-planning the turns and the shares."""

from __future__ import annotations

from collections.abc import Callable

from arbiterd.core import limits, switch
from arbiterd.core.effects import Effect
from arbiterd.core.entitlement import Entitlement
from arbiterd.core.errors import ConflictError, NotFoundError
from arbiterd.core.model import InstanceState, Runqueue
from arbiterd.core.policies import HighPriority, Policy
from arbiterd.core.settings import GPU, INSTANCE, GpuSettings


class SettingWrites:
    """The setting writes of :class:`~arbiterd.core.scheduler.GpuScheduler`, which provides what is declared
    here."""

    rq: Runqueue
    hp: HighPriority
    policy: Policy
    ent: Entitlement
    _setters: dict[str, Callable[[int, int], list[Effect]]]

    @property
    def settings(self) -> GpuSettings:
        return self.rq.settings

    @property
    def instances(self) -> dict[str, InstanceState]:
        return self.rq.instances

    @property
    def index(self) -> int:
        return self.rq.index

    def _inst(self, name: str) -> InstanceState:
        raise NotImplementedError

    def _resharing(self, effects: list[Effect], now: int) -> list[Effect]:
        raise NotImplementedError

    def _reshare(self, now: int) -> None:
        raise NotImplementedError

    def check(self, name: str, value: int) -> None:
        """Raise a CoreError (one line) if the GPU setting ``name`` may not be ``value`` now; change nothing."""
        if name not in self._setters:
            raise NotFoundError(f"no GPU setting {name}")
        GPU[name].valid(value)
        s = self.settings
        if name in ("slice_min_ms", "slice_max_ms"):
            lo, hi = (value, s.slice_max_ms) if name == "slice_min_ms" else (s.slice_min_ms, value)
            if lo > hi:
                raise ConflictError(f"{name}: slice_min_ms {lo} would be above slice_max_ms {hi}")
        elif name == "max_inst":
            used = sum(i.weight for i in self.instances.values())
            if value < used:
                raise ConflictError(f"max_inst {value} is below the sum of weights {used}")
            for inst in self.instances.values():
                limits.check_request(self.rq, inst.name, inst.weight, inst.limit, value)

    def set(self, name: str, value: int, now: int) -> list[Effect]:
        """Set the GPU setting ``name`` (a key of :data:`arbiterd.core.settings.GPU`)."""
        self.check(name, value)
        return self._setters[name](value, now)

    def _set_plain(self, name: str, value: int, now: int) -> list[Effect]:
        """``overrun_ms``, or a setting the server's containment reads (``unmanaged``, ``memory_*``)."""
        self.check(name, value)
        setattr(self.settings, name, value)
        return self.policy.schedule(now) + self.rq.gangs.take()

    def _set_slice_bound(self, name: str, value: int, now: int) -> list[Effect]:
        """``slice_min_ms``, ``slice_max_ms``, ``handover_target_pct``, ``latency_target_ms`` or
        ``handover_max_pct``: what ``slice_ms = auto`` may do."""
        self.check(name, value)
        setattr(self.settings, name, value)
        self._refresh_slice(now)
        return self.policy.schedule(now) + self.rq.gangs.take()

    def _refresh_slice(self, now: int) -> None:
        """Put the slice and the turn extension in force again (a setting or the measured hand-over changed).

        The extension follows the expected hand-over once it has moved by 5 % (rings are rebuilt
        for it, so it does not follow every sample).
        """
        rq = self.rq
        slice_ns = rq.pick_slice_ns()
        expected = rq.handover.expected
        moved = abs(expected - rq.extension_ns) * 20 > rq.extension_ns
        if slice_ns == rq.slice_ns and not moved:
            return
        rq.slice_ns = slice_ns
        if moved:
            rq.extension_ns = expected
        self.hp.clamp()
        self.policy.changed(now)

    def set_policy(self, policy: int, now: int) -> list[Effect]:
        GPU["policy"].valid(policy)
        if policy == self.settings.policy:
            return []
        self.hp.accrue(now)
        self.policy, effects = switch.switch_policy(self.rq, self.hp, policy, now)
        self.rq.gangs.changed()
        self.rq.bw.mark_all(now)  # limits come into force, or go out of it
        effects += self.policy.schedule(now)
        self._reshare(now)
        return effects + self.rq.gangs.take()

    def set_max_inst(self, value: int, now: int) -> list[Effect]:
        self.check("max_inst", value)
        self.settings.max_inst = value
        self.policy.changed(now)
        return self._resharing(self.policy.schedule(now), now)

    def set_prio_ratio(self, value: int, now: int) -> list[Effect]:
        GPU["prio_ratio"].valid(value)
        self.hp.accrue(now)
        self.settings.prio_ratio = value
        self.hp.clamp()
        return self._resharing(self.policy.schedule(now), now)

    def set_slice_ms(self, value: int, now: int) -> list[Effect]:
        GPU["slice_ms"].valid(value)
        self.settings.slice_ms = value
        self._refresh_slice(now)
        return self.policy.schedule(now) + self.rq.gangs.take()

    def check_weight(self, name: str, weight: int) -> None:
        """Raise a CoreError (one line) if instance ``name`` may not have ``weight``; change nothing."""
        inst = self._inst(name)
        INSTANCE["weight"].check(weight, self.settings.max_inst)
        others = sum(i.weight for i in self.instances.values() if i is not inst)
        if others + weight > self.settings.max_inst:
            raise ConflictError(f"weight {weight} would make the sum {others + weight} exceed max_inst "
                                f"{self.settings.max_inst} on GPU {self.index}")
        limits.check_request(self.rq, name, weight, inst.limit)

    def set_weight(self, name: str, weight: int, now: int) -> list[Effect]:
        self.check_weight(name, weight)
        inst = self.instances[name]
        inst.weight = weight
        self.rq.gangs.changed()
        self.policy.changed(now)
        return self._resharing(self.policy.schedule(now), now)

    def check_limit(self, name: str, limit: object) -> int:
        """``limit`` if instance ``name`` may have it now (limits.py); else a CoreError (one line), changing nothing."""
        inst = self._inst(name)
        return limits.check_limit(self.rq, name, inst.weight or inst.requested, limit)

    def set_limit(self, name: str, limit: int, now: int) -> list[Effect]:
        """Put ``name``'s ceiling in force (100: none); it starts with a full quota."""
        self.check_limit(name, limit)
        self.ent.fold(now)
        inst = self.instances[name]
        inst.limit = limit
        self.rq.bw.track(inst, now)
        self.rq.gangs.changed()
        self.policy.changed(now)
        return self._resharing(self.policy.schedule(now), now)

    def throttled_ns(self, name: str, now: int) -> int:
        """The time ``name`` waited with its limit's runtime spent (limits.py)."""
        return self.rq.bw.throttled_ns(self._inst(name), now)

    def set_highprio(self, name: str, highprio: int, now: int) -> list[Effect]:
        inst = self._inst(name)
        INSTANCE["highprio"].check(highprio)
        inst.highprio = bool(highprio)
        self.hp.changed()
        self.rq.gangs.changed()
        self.policy.changed(now)
        return self._resharing(self.policy.schedule(now), now)
