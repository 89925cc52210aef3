"""The cGPU settings tree (SPEC §2) over an :class:`Arbiter`, as plain text.

Paths are those of ``/proc/cgpu_km`` without the prefix: ``version``,
``default_memsize``, ``inst_ctl``, ``upgrade``, ``0/policy``,
``0/<container-id>/weight`` and so on. :func:`read` returns a file's text or a
folder's listing; :func:`write` parses and applies a value, raising a
:class:`CoreError` with a one-line reason and changing nothing when refused.

Beyond the seed's files each GPU folder also has ``slice_ms`` (rw, 1..100)
and ``overrun_ms`` (rw), and ``busy_ms`` (ro).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from arbiterd import __version__
from arbiterd.core.arbiter import Arbiter, InstanceSettings, core_weight
from arbiterd.core.effects import NS_PER_MS, Effect
from arbiterd.core.errors import NotFoundError, ReadOnlyError, SettingError
from arbiterd.core.units import parse_int, parse_size

MAJOR = 243  # the seed's cgpu_km device major; kept for compatibility
INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
GLOBAL_FILES = ("version", "default_memsize", "inst_ctl", "upgrade")
GPU_FILES = ("policy", "max_inst", "prio_ratio", "free_weight", "major", "slice_ms", "overrun_ms", "busy_ms")
GPU_RW = {"policy", "max_inst", "prio_ratio", "slice_ms", "overrun_ms"}
INST_FILES = ("id", "weight", "highprio", "memsize", "meminfo")
INST_RW = {"weight", "highprio", "memsize"}


def valid_instance_id(name: str) -> str:
    """Return ``name`` if it is a safe container id, else raise SettingError."""
    if not isinstance(name, str) or not INSTANCE_ID.match(name):
        raise SettingError(
            f"invalid instance id {name!r}: use 1-128 of A-Z a-z 0-9 _ . - (not starting with . - _)"
        )
    return name


def _split(path: str) -> list[str]:
    parts = [p for p in path.strip().strip("/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise NotFoundError(f"no such path: {path}")
    return parts


def _gpu(arb: Arbiter, part: str) -> int:
    if not part.isdigit() or int(part) not in arb.scheds:
        raise NotFoundError(f"no such path: {part}")
    return int(part)


def is_dir(arb: Arbiter, path: str) -> bool:
    parts = _split(path)
    if not parts:
        return True
    if len(parts) == 1:
        return parts[0].isdigit() and int(parts[0]) in arb.scheds
    if len(parts) == 2:
        gpu = _gpu(arb, parts[0])
        return (gpu, parts[1]) in arb.records
    return False


def listdir(arb: Arbiter, path: str) -> list[str]:
    parts = _split(path)
    if not parts:
        return list(GLOBAL_FILES) + [str(g) for g in sorted(arb.scheds)]
    if len(parts) == 1:
        gpu = _gpu(arb, parts[0])
        return list(GPU_FILES) + [r.name for r in arb.instances_on(gpu)]
    if len(parts) == 2:
        gpu = _gpu(arb, parts[0])
        arb.record(gpu, parts[1])
        return list(INST_FILES)
    raise NotFoundError(f"not a folder: {path}")


def read(arb: Arbiter, path: str, now: int) -> str:
    """The text of a file, or a folder's listing one name a line."""
    if is_dir(arb, path):
        return "\n".join(listdir(arb, path)) + "\n"
    parts = _split(path)
    if len(parts) == 1:
        name = parts[0]
        if name == "version":
            return f"{__version__}\n"
        if name == "default_memsize":
            return f"{arb.config.default_memsize}\n"
        if name == "upgrade":
            return f"{arb.upgrade}\n"
        if name == "inst_ctl":
            return inst_ctl_listing(arb)
    elif len(parts) == 2:
        gpu = _gpu(arb, parts[0])
        sched = arb.scheds[gpu]
        s = sched.settings
        values: dict[str, Callable[[], object]] = {
            "policy": lambda: s.policy,
            "max_inst": lambda: s.max_inst,
            "prio_ratio": lambda: s.prio_ratio,
            "free_weight": lambda: sched.free_weight,
            "major": lambda: MAJOR,
            "slice_ms": lambda: s.slice_ms,
            "overrun_ms": lambda: s.overrun_ms,
            "busy_ms": lambda: sched.busy_ns(now) // NS_PER_MS,
        }
        if parts[1] in values:
            return f"{values[parts[1]]()}\n"
    elif len(parts) == 3:
        gpu = _gpu(arb, parts[0])
        rec = arb.record(gpu, parts[1])
        st = arb.scheds[gpu].instances[rec.name]
        if parts[2] == "id":
            return f"{rec.name}\n"
        if parts[2] == "weight":
            return f"{st.weight}\n"
        if parts[2] == "highprio":
            return f"{int(st.highprio)}\n"
        if parts[2] == "memsize":
            return f"{arb.mem_limit(rec)}\n"
        if parts[2] == "meminfo":
            return rec.ledger.meminfo()
    raise NotFoundError(f"no such path: {path}")


def write(arb: Arbiter, path: str, value: str, now: int) -> list[Effect]:
    """Apply ``value`` to the file at ``path``; refuse with a one-line reason."""
    if "\n" in value.strip():
        raise SettingError("expected a single line")
    if is_dir(arb, path):
        raise ReadOnlyError(f"{path.strip('/') or '/'} is a folder")
    parts = _split(path)
    if len(parts) == 1:
        name = parts[0]
        if name == "default_memsize":
            arb.set_default_memsize(parse_size("default_memsize", value))
            return []
        if name == "upgrade":
            v = parse_int("upgrade", value)
            if v not in (0, 1):
                raise SettingError(f"upgrade: expected 0 or 1, got {v}")
            arb.upgrade = v
            return []
        if name == "inst_ctl":
            return inst_ctl(arb, value, now)
        if name == "version":
            raise ReadOnlyError("version is read-only")
    elif len(parts) == 2:
        gpu = _gpu(arb, parts[0])
        sched = arb.scheds[gpu]
        key = parts[1]
        if key in GPU_FILES and key not in GPU_RW:
            raise ReadOnlyError(f"{gpu}/{key} is read-only")
        if key in GPU_RW:
            v = parse_int(key, value)
            setter: dict[str, Callable[[int, int], list[Effect]]] = {
                "policy": sched.set_policy,
                "max_inst": sched.set_max_inst,
                "prio_ratio": sched.set_prio_ratio,
                "slice_ms": sched.set_slice_ms,
                "overrun_ms": sched.set_overrun_ms,
            }
            return setter[key](v, now)
    elif len(parts) == 3:
        gpu = _gpu(arb, parts[0])
        rec = arb.record(gpu, parts[1])
        key = parts[2]
        if key in ("id", "meminfo"):
            raise ReadOnlyError(f"{gpu}/{rec.name}/{key} is read-only")
        if key == "weight":
            return arb.scheds[gpu].set_weight(rec.name, parse_int("weight", value), now)
        if key == "highprio":
            return arb.scheds[gpu].set_highprio(rec.name, parse_int("highprio", value), now)
        if key == "memsize":
            arb.set_memsize(gpu, rec.name, parse_size("memsize", value))
            return []
    raise NotFoundError(f"no such path: {path}")


def inst_ctl_listing(arb: Arbiter) -> str:
    lines = []
    for (gpu, name), rec in sorted(arb.records.items()):
        if rec.provisioned:
            st = arb.scheds[gpu].instances[name]
            lines.append(f"{name} gpu={gpu} weight={st.weight} highprio={int(st.highprio)} memsize={rec.memsize}")
    return "".join(line + "\n" for line in lines)


def inst_ctl(arb: Arbiter, command: str, now: int) -> list[Effect]:
    """``create ID [gpu=0,1] [weight=N | core=P] [highprio=0|1] [memsize=SIZE]`` or ``remove ID [gpu=...]``."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise SettingError(f"inst_ctl: {exc}") from None
    if len(words) < 2 or words[0] not in ("create", "remove"):
        raise SettingError(
            "inst_ctl: expected 'create ID [gpu=0,1] [weight=N | core=P] [highprio=0|1] [memsize=SIZE]' "
            "or 'remove ID [gpu=N]'"
        )
    verb, name, rest = words[0], valid_instance_id(words[1]), words[2:]
    opts: dict[str, str] = {}
    allowed = {"gpu", "weight", "core", "highprio", "memsize"} if verb == "create" else {"gpu"}
    for word in rest:
        key, sep, val = word.partition("=")
        if not sep or key not in allowed or key in opts:
            raise SettingError(f"inst_ctl {verb}: unexpected {word!r}")
        opts[key] = val
    gpus: list[int] | None = None
    if "gpu" in opts:
        try:
            gpus = [int(g) for g in opts["gpu"].split(",")]
        except ValueError:
            raise SettingError(f"inst_ctl: gpu: expected indices like 0,1, got {opts['gpu']!r}") from None
        for gpu in gpus:
            arb.sched(gpu)
    if verb == "remove":
        return arb.unprovision(name, gpus, now)
    if "core" in opts and "weight" in opts:
        raise SettingError("inst_ctl create: give weight=N or core=P (a GPU-core percentage), not both")
    core = 0
    if "core" in opts:
        core = parse_int("core", opts["core"])
        core_weight(core)  # refuses core=0 too, which the settings would read as none
    s = InstanceSettings(
        weight=parse_int("weight", opts.get("weight", "1")),
        highprio=bool(parse_int("highprio", opts.get("highprio", "0"))),
        memsize=parse_size("memsize", opts.get("memsize", "0")),
        core_percent=core,
    )
    if parse_int("highprio", opts.get("highprio", "0")) not in (0, 1):
        raise SettingError("inst_ctl: highprio: expected 0 or 1")
    return arb.provision(name, gpus if gpus is not None else sorted(arb.scheds), s, now)
