"""GPU-core percentages (behaviour §3): which GPUs they put on which policy, with or without a limit.

A core percentage P is weight P / 5 of 20 slots. Without a limit above P it is
cGPU's hard cap: the first one on an unused GPU still on policy 1 puts the GPU
on policy 3 with 20 slots. With a limit above P (a request of P and a ceiling,
as a DRA claim's ``cores`` and ``limit``) it needs a weighted, work-conserving
policy: such a GPU goes on policy 4 with 20 slots, and a GPU on policy 3 with
20 slots moves to policy 4 with every limit there made its request first,
which is what policy 3 held them to (policy 3 is policy 4 with every limit
equal to its request). Only a trusted party shapes a GPU so (``inst_ctl``, an
allocation); a client's core percentage is weight P / 5 where it lands, with a
warning.
"""

from __future__ import annotations

import logging

from arbiterd.core.effects import Effect
from arbiterd.core.limits import request_pct
from arbiterd.core.policies import FIXED_CORE, PREEMPTIVE, WEAK
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import CORE_MAX_INST, NO_LIMIT, limit_of

log = logging.getLogger("arbiterd.core")


def core_ready(sched: GpuScheduler) -> bool:
    """Whether a core percentage may set ``sched``'s policy and 20 slots: unused, on policy 1."""
    return sched.settings.policy == PREEMPTIVE and not sched.instances


def wanted(percent: int, limit: int) -> int:
    """The policy a core percentage with ``limit`` holds on: 3, or 4 where a limit above it was given (UNCAPPED: a
    limit of 100, no ceiling; NO_LIMIT is none given, and the percentage caps itself)."""
    return WEAK if percent < limit and limit != NO_LIMIT else FIXED_CORE


def core_policy(sched: GpuScheduler, percent: int, limit: int) -> int:
    """The policy ``sched`` will be on once a trusted party provisions a core percentage with ``limit`` there."""
    st = sched.settings
    if not percent:
        return st.policy
    want = wanted(percent, limit)
    if core_ready(sched) or (want == WEAK and st.policy == FIXED_CORE and st.max_inst == CORE_MAX_INST):
        return want
    return st.policy


def core_mode(sched: GpuScheduler, name: str, percent: int, limit: int, now: int, shape_gpu: bool = True
              ) -> tuple[list[Effect], list[str]]:
    """Put ``sched``'s GPU on the policy an instance asking ``percent`` of it (with ``limit``) holds on, if it
    may; else the warning that says what it is there."""
    st = sched.settings
    gpu = sched.index
    want = wanted(percent, limit)
    if st.max_inst == CORE_MAX_INST and st.policy in (want, WEAK):
        return [], []
    if shape_gpu and core_ready(sched):
        log.info("GPU %d: policy %d, max_inst %d, for instance %s asking %d %% of the GPU%s", gpu, want,
                 CORE_MAX_INST, name, percent, f" up to {limit_of(limit)} %" if want == WEAK else "")
        return sched.set_max_inst(CORE_MAX_INST, now) + sched.set_policy(want, now), []
    if shape_gpu and want == WEAK and st.policy == FIXED_CORE and st.max_inst == CORE_MAX_INST:
        log.info("GPU %d: policy 4 for instance %s asking %d %% of the GPU up to %d %%; every other instance's limit "
                 "is its request, as policy 3 held it", gpu, name, percent, limit_of(limit))
        effects: list[Effect] = []
        for inst in list(sched.instances.values()):
            if inst.limit == NO_LIMIT and inst.weight:
                effects += sched.set_limit(inst.name, round(request_pct(inst.weight, CORE_MAX_INST)), now)
        return effects + sched.set_policy(WEAK, now), []
    msg = (f"GPU {gpu} instance {name}: {percent} % of the GPU holds on policy {want} with max_inst "
           f"{CORE_MAX_INST}; GPU {gpu} has policy {st.policy} and max_inst {st.max_inst}, "
           f"so it is weight {percent // 5} there" + ("" if shape_gpu else " (an operator sets the policy)"))
    log.warning("%s", msg)
    return [], [msg]
