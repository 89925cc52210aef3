"""Every setting an operator can change, declared once.

A setting is a field of :class:`GpuSettings`, :class:`InstanceSettings` or
:class:`GlobalSettings` whose metadata is a :class:`Setting`: its type, range,
default and help. The settings tree, the daemon's flags and config file, the
state file, reload, metrics, ``cgpu-smi`` and the man pages are all derived from
these tables, so a value is parsed, checked and refused the same way
everywhere: :meth:`Setting.parse` takes text (a tree write, a flag, a TOML
string) and :meth:`Setting.check` a typed value (TOML, the wire, the state
file); both raise a one-line :class:`SettingError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from arbiterd.core.errors import SettingError

Kind = Literal["int", "auto", "size", "flag", "percent"]
Scope = Literal["global", "gpu", "instance"]
AUTO = 0  # the stored value of a setting of kind "auto" that is set to auto

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_INT = re.compile(r"^\s*[+-]?\d+\s*$")
GIB = 1024**3
MAX_INST_MAX = 25  # the most slots a GPU can be cut into; also the largest weight


@dataclass(frozen=True, slots=True)
class Setting:
    """How one setting is written, read and checked."""

    default: int
    help: str
    lo: int = 0
    hi: int = 2**63 - 1
    kind: Kind = "int"
    name: str = ""
    scope: Scope = "gpu"
    tree: bool = True  # a file of the settings tree
    live: bool = True  # takes effect at once (else at the next grant)

    @property
    def expected(self) -> str:
        """What a valid value looks like, for error messages and help."""
        if self.kind == "size":
            return "a size in bytes (or with KiB/MiB/GiB)"
        if self.kind == "flag":
            return "0 or 1"
        if self.kind == "percent":
            return "a multiple of 5 from 5 to 100"
        if self.kind == "auto":
            return f"auto or an integer {self.lo}..{self.hi}"
        return f"an integer {self.lo}..{self.hi}"

    def parse(self, text: str) -> int:
        """A value written as text; raises SettingError naming the setting."""
        t = text.strip()
        if self.kind == "auto" and t.lower() == "auto":
            return AUTO
        if self.kind == "size":
            m = _SIZE.match(t)
            if not m or m.group(2).lower() not in _UNITS:
                raise SettingError(f"{self.name}: expected {self.expected}, got {t!r}")
            return self.check(int(m.group(1)) * _UNITS[m.group(2).lower()])
        if not _INT.match(t):
            raise SettingError(f"{self.name}: expected {self.expected}, got {t!r}")
        return self.check(int(t))

    def check(self, value: object, hi: int | None = None) -> int:
        """The stored form of ``value`` as given from outside (a number, or text such as ``auto``); ``hi``
        narrows the range (a weight to the GPU's max_inst)."""
        if isinstance(value, str):
            return self.parse(value)
        if self.kind == "flag" and isinstance(value, bool):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(f"{self.name}: expected {self.expected}, got {value!r}")
        top = self.hi if hi is None else hi
        if self.kind == "percent" and (value % 5 or not self.lo <= value <= self.hi):
            raise SettingError(f"{self.name}: expected {self.expected}, got {value}")
        if not self.lo <= value <= top:
            raise SettingError(f"{self.name}: {value} is out of range {self.lo}..{top}")
        return value

    def valid(self, value: object, hi: int | None = None) -> int:
        """``value`` if it is a valid stored value (``AUTO`` included), for code that holds stored values."""
        if self.kind == "auto" and type(value) is int and value == AUTO:
            return AUTO
        return self.check(value, hi)

    def format(self, value: int) -> str:
        """The text a value reads back as."""
        return "auto" if self.kind == "auto" and value == AUTO else str(value)

    def external(self, value: int) -> int | str:
        """The value as files and documents hold it: ``auto``, or the number."""
        return "auto" if self.kind == "auto" and value == AUTO else value


def setting(default: int, help: str, lo: int = 0, hi: int = 2**63 - 1, kind: Kind = "int",
            tree: bool = True, live: bool = True) -> Any:
    """A dataclass field that is a setting (the name and scope are filled in from the class)."""
    return field(default=default, metadata={"setting": Setting(default, help, lo, hi, kind, tree=tree, live=live)})


@dataclass(slots=True)
class GpuSettings:
    """The settings of one GPU (files ``N/<name>`` of the tree)."""

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
    overrun_ms: int = setting(500, "cut a holder off this long after its deadline (or a revoke)", 1, 3_600_000)


@dataclass(slots=True)
class InstanceSettings:
    """The settings of one instance on one GPU (files ``N/<id>/<name>``)."""

    weight: int = setting(1, "share of the GPU: w of max_inst slots; the sum on a GPU stays <= max_inst",
                          1, MAX_INST_MAX)
    highprio: int = setting(0, "1: a high-priority instance, preempting others up to prio_ratio", 0, 1, "flag")
    memsize: int = setting(0, "memory limit in bytes (0: default_memsize, or the whole device)", 0, kind="size")
    core_percent: int = setting(0, "a GPU-core percentage instead of a weight: weight P/5 of 20 slots on "
                                   "policy 3", 5, 100, "percent", tree=False)

    def __post_init__(self) -> None:
        if self.core_percent:  # the weight follows from the percentage, here only
            self.weight = core_weight(self.core_percent)


@dataclass(slots=True)
class GlobalSettings:
    """Node-wide settings (top-level files of the tree)."""

    default_memsize: int = setting(0, "memory limit of an instance that states none (0: the whole device)",
                                   0, kind="size")
    upgrade: int = setting(0, "an operator's marker for a hot upgrade (state is always saved)", 0, 1, "flag")


def _table(cls: type, scope: Scope) -> dict[str, Setting]:
    out = {}
    for f in fields(cls):
        s: Setting = f.metadata["setting"]
        out[f.name] = Setting(s.default, s.help, s.lo, s.hi, s.kind, f.name, scope, s.tree, s.live)
    return out


GPU: dict[str, Setting] = _table(GpuSettings, "gpu")
INSTANCE: dict[str, Setting] = _table(InstanceSettings, "instance")
GLOBAL: dict[str, Setting] = _table(GlobalSettings, "global")
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


def parse_size(name: str, text: str) -> int:
    """Bytes from ``4294967296``, ``4GiB`` or ``512MiB`` (for values that are not settings)."""
    return Setting(0, "", kind="size", name=name).parse(text)


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
