"""The settings tree (behaviour §2) over an :class:`Arbiter`, as plain text.

Paths are those of ``/proc/cgpu_km`` without the prefix: ``version``,
``default_memsize``, ``inst_ctl``, ``upgrade``, ``alloc_ctl``, ``0/policy``,
``0/<container-id>/weight`` and so on. Writable files are the settings of
settings.py; the read-only ones are computed here. :func:`read` returns a
file's text or a folder's listing; :func:`write` parses and applies a value,
raising a :class:`CoreError` with a one-line reason and changing nothing when
refused.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiterd import __version__
from arbiterd.core import allocctl, instctl
from arbiterd.core.arbiter import Arbiter, InstanceRecord
from arbiterd.core.effects import NS_PER_MS, Effect
from arbiterd.core.errors import NotFoundError, ReadOnlyError, SettingError
from arbiterd.core.names import valid_instance_id
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GLOBAL, GPU, INSTANCE

MAJOR = 243  # cGPU's cgpu_km device major; kept for compatibility

# read-only files, computed from live state: name -> (reader, help)
GpuReader = Callable[[GpuScheduler, int], object]
GPU_READONLY: dict[str, tuple[GpuReader, str]] = {
    "free_weight": (lambda s, now: s.free_weight, "max_inst minus the sum of the weights of the GPU's instances"),
    "major": (lambda s, now: MAJOR, "a device-type number, kept for compatibility"),
    "busy_ms": (lambda s, now: s.busy_ns(now) // NS_PER_MS, "time some lease was held on the GPU (ms)"),
}
InstReader = Callable[[Arbiter, InstanceRecord], str]
INSTANCE_READONLY: dict[str, tuple[InstReader, str]] = {
    "id": (lambda a, r: f"{r.name}\n", "the container id"),
    "meminfo": (lambda a, r: r.ledger.meminfo(),
                "'Free: <bytes>', then one 'PID: <pid> Mem: <bytes>' line per process"),
}
GLOBAL_FILES = ("version", "default_memsize", "inst_ctl", "upgrade")
ALLOC_FILES = ("alloc_ctl",)  # listed only while allocations are on (cGPU's tree has no such file)
_CGPU_GPU = ("policy", "max_inst", "prio_ratio", "free_weight", "major")  # cGPU's order first
GPU_FILES = _CGPU_GPU + tuple(n for n in GPU if n not in _CGPU_GPU) + ("busy_ms",)
INST_FILES = ("id", "weight", "highprio", "memsize", "meminfo", "limit")
__all__ = ["GPU_FILES", "INST_FILES", "MAJOR", "Write", "plan", "read", "valid_instance_id", "write"]


def _split(path: str) -> list[str]:
    parts = [p for p in path.strip().strip("/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise NotFoundError(f"no such path: {path}")
    return parts


def _gpu(arb: Arbiter, part: str) -> GpuScheduler:
    if not part.isdigit() or int(part) not in arb.scheds:
        raise NotFoundError(f"no such path: {part}")
    return arb.scheds[int(part)]


def is_dir(arb: Arbiter, path: str) -> bool:
    parts = _split(path)
    if not parts:
        return True
    if len(parts) == 1:
        return parts[0].isdigit() and int(parts[0]) in arb.scheds
    if len(parts) == 2:
        return (_gpu(arb, parts[0]).index, parts[1]) in arb.records
    return False


def listdir(arb: Arbiter, path: str) -> list[str]:
    parts = _split(path)
    if not parts:
        extra = ALLOC_FILES if arb.config.allocations != "off" else ()
        return [*GLOBAL_FILES, *extra] + [str(g) for g in sorted(arb.scheds)]
    if len(parts) == 1:
        gpu = _gpu(arb, parts[0]).index
        return list(GPU_FILES) + [r.name for r in arb.instances_on(gpu)]
    if len(parts) == 2:
        arb.record(_gpu(arb, parts[0]).index, parts[1])
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
        if name in GLOBAL:
            return GLOBAL[name].format(getattr(arb.globals, name)) + "\n"
        if name == "inst_ctl":
            return instctl.listing(arb)
        if name == "alloc_ctl":
            return allocctl.listing(arb)
    elif len(parts) == 2:
        sched, key = _gpu(arb, parts[0]), parts[1]
        if key in GPU:
            return GPU[key].format(getattr(sched.settings, key)) + "\n"
        if key in GPU_READONLY:
            return f"{GPU_READONLY[key][0](sched, now)}\n"
    elif len(parts) == 3:
        sched, key = _gpu(arb, parts[0]), parts[2]
        rec = arb.record(sched.index, parts[1])
        st = sched.instances[rec.name]
        if key in INSTANCE_READONLY:
            return INSTANCE_READONLY[key][0](arb, rec)
        if key == "weight":
            return f"{st.weight}\n"
        if key == "highprio":
            return f"{int(st.highprio)}\n"
        if key == "memsize":
            return f"{arb.mem_limit(rec)}\n"
        if key == "limit":
            return f"{st.limit}\n"
    raise NotFoundError(f"no such path: {path}")


def write(arb: Arbiter, path: str, value: str, now: int) -> list[Effect]:
    """Apply ``value`` to the file at ``path``; refuse with a one-line reason, changing nothing."""
    return plan(arb, path, value)(now)


Write = Callable[[int], list[Effect]]


def plan(arb: Arbiter, path: str, value: str) -> Write:
    """Check that ``value`` may be written to the file at ``path`` now, changing nothing (a CoreError with a
    one-line reason if not), and return what writes it, at a time it is given: it does not fail."""
    apply = _plan(arb, path, value)

    def write_it(now: int) -> list[Effect]:
        return apply(now) + arb.promote(now)  # weight it freed goes to instances waiting at weight 0

    return write_it


def _plan(arb: Arbiter, path: str, value: str) -> Write:
    if "\n" in value.strip():
        raise SettingError("expected a single line")
    if is_dir(arb, path):
        raise ReadOnlyError(f"{path.strip('/') or '/'} is a folder")
    parts = _split(path)
    if len(parts) == 1:
        return _plan_global(arb, parts[0], value)
    if len(parts) == 2:
        sched, key = _gpu(arb, parts[0]), parts[1]
        if key in GPU_READONLY:
            raise ReadOnlyError(f"{sched.index}/{key} is read-only")
        if key in GPU:
            number = GPU[key].parse(value)
            sched.check(key, number)
            return lambda now: sched.set(key, number, now)
    elif len(parts) == 3:
        return _plan_instance(arb, _gpu(arb, parts[0]), parts[1], parts[2], value)
    raise NotFoundError(f"no such path: {path}")


def _plan_global(arb: Arbiter, name: str, value: str) -> Write:
    if name == "inst_ctl":
        return instctl.plan(arb, value)
    if name == "alloc_ctl":
        return allocctl.plan(arb, value)
    if name in GLOBAL:
        setting = GLOBAL[name].check(GLOBAL[name].parse(value))

        def set_global(now: int) -> list[Effect]:
            arb.set_global(name, setting)
            return []

        return set_global
    if name == "version":
        raise ReadOnlyError("version is read-only")
    raise NotFoundError(f"no such path: {name}")


def _plan_instance(arb: Arbiter, sched: GpuScheduler, name: str, key: str, value: str) -> Write:
    rec = arb.record(sched.index, name)
    if key in INSTANCE_READONLY:
        raise ReadOnlyError(f"{sched.index}/{rec.name}/{key} is read-only")
    if key == "weight":
        weight = INSTANCE[key].parse(value)
        sched.check_weight(rec.name, weight)
        return lambda now: sched.set_weight(rec.name, weight, now)
    if key == "highprio":
        highprio = INSTANCE[key].check(INSTANCE[key].parse(value))
        return lambda now: sched.set_highprio(rec.name, highprio, now)
    if key == "limit":
        limit = sched.check_limit(rec.name, INSTANCE[key].parse(value))
        return lambda now: sched.set_limit(rec.name, limit, now)
    if key == "memsize":
        memsize = INSTANCE[key].parse(value)
        arb.check_memsize(sched.index, rec.name, memsize)

        def set_memsize(now: int) -> list[Effect]:
            arb.set_memsize(sched.index, rec.name, memsize)
            return []

        return set_memsize
    raise NotFoundError(f"no such path: {sched.index}/{name}/{key}")
