"""The scheduling policies of a GPU, by number (behaviour §3), and the high-priority class above them."""

from __future__ import annotations

from arbiterd.core.model import Runqueue
from arbiterd.core.policies.base import Policy
from arbiterd.core.policies.highprio import HighPriority
from arbiterd.core.policies.native import Native
from arbiterd.core.policies.ring import Fixed, FixedCore
from arbiterd.core.policies.vtime import Preemptive, Weak, Weighted

POLICIES: tuple[type[Policy], ...] = (Fixed, Preemptive, Weighted, FixedCore, Weak, Native)
POLICY_NAMES = tuple(p.name for p in POLICIES)
FIXED, PREEMPTIVE, WEIGHTED, FIXED_CORE, WEAK, NATIVE = range(6)


def make_policy(number: int, gpu: Runqueue, hp: HighPriority, now: int) -> Policy:
    return POLICIES[number](gpu, hp, now)


__all__ = ["FIXED", "FIXED_CORE", "NATIVE", "POLICIES", "POLICY_NAMES", "PREEMPTIVE", "WEAK", "WEIGHTED",
           "HighPriority", "Policy", "make_policy"]
