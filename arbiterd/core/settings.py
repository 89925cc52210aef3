"""Every setting of the settings tree, declared once.

A setting is a field of :class:`GpuSettings`, :class:`InstanceSettings` or
:class:`GlobalSettings` declared with :func:`~arbiterd.core.setting.setting`:
its kind, range, default, help and where it appears. The per-GPU settings are
files ``N/<name>`` of the tree, TOML keys and flags of ``arbiterd`` (the
default of every GPU); the instance settings are files ``N/<id>/<name>``; the
node-wide ones are top-level files (``default_memsize`` is also a TOML key and
a flag). The settings tree, the daemon's flags and config file, the state
file, reload, metrics, ``cgpu-smi``, the man pages and the documents' tables
are all derived from these tables, so a value is parsed, checked and refused
the same way everywhere (see :class:`~arbiterd.core.setting.Setting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from arbiterd.core.errors import SettingError
from arbiterd.core.setting import AUTO, Kind, Scope, Setting, parse_size, setting, table

__all__ = ["AUTO", "CORE_MAX_INST", "GIB", "GLOBAL", "GPU", "INSTANCE", "MAX_INST_MAX", "MEMORY_ENFORCE", "NO_LIMIT",
           "UNCAPPED", "UNMANAGED", "GlobalSettings", "GpuSettings", "InstanceSettings", "Kind", "Scope", "Setting",
           "check_gpu_settings", "core_weight", "format_size", "limit_of", "parse_size", "setting"]

GIB = 1024**3
MAX_INST_MAX = 25  # the most slots a GPU can be cut into; also the largest weight
UNMANAGED = ("allow", "report", "throttle", "kill")  # what the per-GPU setting unmanaged may be, by index
MEMORY_ENFORCE = ("report", "kill")
NO_LIMIT = 100  # an instance's limit (%) that limits nothing
# InstanceSettings.limit of a core percentage given a limit of 100 (inst_ctl core=P limit=100, a claim's limit 100):
# a request with no ceiling, on policy 4; no limit at all leaves a core percentage its own cap (policy 3). The
# instance holds it as NO_LIMIT (limit_of).
UNCAPPED = NO_LIMIT + 1


def limit_of(limit: int) -> int:
    """The limit an instance holds for an InstanceSettings.limit (UNCAPPED is none)."""
    return min(limit, NO_LIMIT)


@dataclass(slots=True)
class GpuSettings:
    """The settings of one GPU (files ``N/<name>`` of the tree; as flags and TOML keys, every GPU's default)."""

    policy: int = setting(1, "scheduling policy: 0 fixed, 1 preemptive, 2 weighted, 3 fixed core, "
                             "4 weak (work-conserving), 5 native", 0, 5)
    max_inst: int = setting(16, "number of slots the GPU's time is divided into; not below the sum of weights",
                            1, MAX_INST_MAX)
    prio_ratio: int = setting(50, "most GPU time (%) that high-priority instances may take", 20, 99)
    slice_ms: int = setting(AUTO, "slice length in ms, or auto: the shortest slice that keeps the measured "
                                  "hand-over cost at or under handover_target_pct of GPU time", 1, 100, "auto")
    slice_min_ms: int = setting(5, "with slice_ms auto: the shortest slice it may choose (ms)", 1, 100)
    slice_max_ms: int = setting(100, "with slice_ms auto: the longest slice it may choose (ms)", 1, 100)
    handover_target_pct: int = setting(2, "with slice_ms auto: the share of GPU time (%) hand-overs may cost",
                                       1, 50)
    latency_target_ms: int = setting(200, "with slice_ms auto: the round of turns (ms) that busy instances should "
                                          "fit in; the slice shrinks to fit it, down to what handover_max_pct allows, "
                                          "and past that the round stretches", 10, 10_000)
    handover_max_pct: int = setting(10, "with slice_ms auto: the most GPU time (%) hand-overs may cost while the "
                                        "slice shrinks to fit latency_target_ms", 1, 50)
    limit_period_ms: int = setting(AUTO, "the period an instance's limit is a quota of (ms), or auto: the round of "
                                         "turns in force, stretched by what high-priority instances take", 1, 1000,
                                   "auto")
    overrun_ms: int = setting(500, "cut a holder off this long after its deadline (or a revoke)", 1, 3_600_000)
    unmanaged: int = setting(UNMANAGED.index("report"), "a process with a context on the GPU that is not a client "
                             "of cgpu (NVML sees it): allow it; report it (status, cgpu-smi, metrics, one log "
                             "line); throttle it (its container frozen outside its turns, as a tenant of its "
                             "weight); or kill it (SIGKILL)", 0, len(UNMANAGED) - 1, "enum", choices=UNMANAGED)
    memory_enforce: int = setting(MEMORY_ENFORCE.index("report"), "an instance whose processes NVML shows using more "
                                  "than its memsize (plus its context allowance) for memory_grace_ms: report "
                                  "it, or kill its largest process", 0, len(MEMORY_ENFORCE) - 1, "enum",
                                  choices=MEMORY_ENFORCE)
    memory_grace_ms: int = setting(1000, "how long an instance may stay over its memory limit before "
                                         "memory_enforce acts (ms)", 0, 3_600_000)
    memory_allowance: int = setting(512 * 1024**2, "what a process may use beyond its instance's memsize, as NVML "
                                    "counts it, for its CUDA context; an instance gets at most one per managed process "
                                    "(at least one)", 0, kind="size")


@dataclass(slots=True)
class InstanceSettings:
    """The settings of one instance on one GPU (files ``N/<id>/<name>``)."""

    weight: int = setting(1, "share of the GPU: w of max_inst slots; the sum on a GPU stays <= max_inst",
                          1, MAX_INST_MAX)
    highprio: int = setting(0, "1: a high-priority instance, preempting others up to prio_ratio", 0, 1, "flag")
    memsize: int = setting(0, "memory limit in bytes (0: default_memsize, or the whole device)", 0, kind="size")
    limit: int = setting(NO_LIMIT, "most GPU time (%) it may use, per period, even on an idle GPU (100: none); not "
                                   "below its request, weight / max_inst; honoured on policies 1, 2 and 4", 5, 100)
    core_percent: int = setting(0, "a GPU-core percentage instead of a weight: weight P/5 of 20 slots on "
                                   "policy 3", 5, 100, "percent", tree=False)

    def __post_init__(self) -> None:
        if self.core_percent:  # the weight follows from the percentage, here only
            self.weight = core_weight(self.core_percent)


@dataclass(slots=True)
class GlobalSettings:
    """Node-wide settings (top-level files of the tree)."""

    default_memsize: int = setting(0, "memory limit of an instance that states none (0: the whole device)",
                                   0, kind="size", flag=True, toml=True, metavar="SIZE")
    upgrade: int = setting(0, "an operator's marker for a hot upgrade (state is always saved)", 0, 1, "flag")


def _ints(settings: dict[str, Setting[object]]) -> dict[str, Setting[int]]:
    return cast(dict[str, Setting[int]], settings)


GPU: dict[str, Setting[int]] = _ints(table(GpuSettings, "gpu", tree=True, flag=True, toml=True))
INSTANCE: dict[str, Setting[int]] = _ints(table(InstanceSettings, "instance", tree=True))
GLOBAL: dict[str, Setting[int]] = _ints(table(GlobalSettings, "global", tree=True))
CORE_MAX_INST = 20  # a GPU-core percentage is counted in 5 % steps: 20 slots


def core_weight(percent: object) -> int:
    """The weight of a GPU-core percentage (a multiple of 5 from 5 to 100): percent / 5."""
    return INSTANCE["core_percent"].check(percent) // 5


def check_gpu_settings(s: GpuSettings) -> None:
    """Raise SettingError if any field of ``s`` is out of range."""
    for name, spec in GPU.items():
        spec.valid(getattr(s, name))
    if s.slice_min_ms > s.slice_max_ms:
        raise SettingError(f"slice_min_ms: {s.slice_min_ms} is above slice_max_ms {s.slice_max_ms}")


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
