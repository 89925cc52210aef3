"""The daemon's own CPU scheduling class (``realtime_priority``).

A grant is a message the daemon must send while client processes keep the CPUs
busy. Under ``SCHED_FIFO`` the daemon runs as soon as a request arrives instead of
waiting for the kernel to preempt a busy process. The daemon is event-driven and
single-threaded, so it never holds a CPU longer than one batch of messages, and the
kernel's real-time throttling (``kernel.sched_rt_runtime_us``) bounds it anyway.

Without the privilege (``CAP_SYS_NICE``, or ``RLIMIT_RTPRIO`` at least the priority,
which the systemd unit grants with ``LimitRTPRIO=``), or where the kernel refuses
real-time tasks in the service's cgroup, the daemon says so once and runs at
normal priority: only grant latency suffers.
"""

from __future__ import annotations

import os
from collections.abc import Callable

PRIORITY_RANGE = (0, 99)  # 0: normal scheduling; 1..99: SCHED_FIFO priorities
Setter = Callable[[int, int, os.sched_param], None]


def apply_realtime(priority: int, setter: Setter = os.sched_setscheduler) -> tuple[bool, str]:
    """Switch this process to SCHED_FIFO ``priority`` (0: leave it as it is).

    Returns whether it took effect and a one-line message for the log. Threads
    started afterwards inherit the class; forked children do not
    (``SCHED_RESET_ON_FORK``).
    """
    if priority == 0:
        return False, "scheduling: normal (realtime_priority 0)"
    try:
        setter(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return False, (f"realtime_priority {priority}: cannot switch to SCHED_FIFO ({reason}); "
                       "running at normal priority, so grants may wait behind busy processes")
    return True, f"scheduling: SCHED_FIFO priority {priority} (realtime_priority)"


def describe(pid: int = 0) -> str:
    """The scheduling class ``pid`` (0: this process) runs under: ``SCHED_FIFO 10`` or ``normal``."""
    policy = os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK
    if policy == os.SCHED_FIFO:
        return f"SCHED_FIFO {os.sched_getparam(pid).sched_priority}"
    if policy == os.SCHED_RR:
        return f"SCHED_RR {os.sched_getparam(pid).sched_priority}"
    return "normal"
