"""Snapshot and restore of everything an operator can set (for the state file).

The document holds every setting of the tables in settings.py, so a setting
added there is saved and restored with no change here.
"""

from __future__ import annotations

from typing import Any

from arbiterd.core.arbiter import Arbiter, valid_instance_id
from arbiterd.core.errors import CoreError, SettingError
from arbiterd.core.settings import GLOBAL, GPU, INSTANCE, InstanceSettings

STATE_VERSION = 1
INSTANCE_KEYS = tuple(name for name, s in INSTANCE.items() if s.tree)  # weight, highprio, memsize


def snapshot(arb: Arbiter) -> dict[str, Any]:
    """A JSON-able document of every setting and instance record."""
    gpus = {str(idx): {k: s.external(getattr(sched.settings, k)) for k, s in GPU.items()}
            for idx, sched in sorted(arb.scheds.items())}
    instances = []
    for (gpu, name), rec in sorted(arb.records.items()):
        st = arb.scheds[gpu].instances[name]
        instances.append({"id": name, "gpu": gpu, "weight": st.weight, "highprio": int(st.highprio),
                          "memsize": rec.memsize, "provisioned": rec.provisioned})
    return {
        "version": STATE_VERSION,
        **{k: getattr(arb.globals, k) for k in GLOBAL},
        "gpus": gpus,
        "instances": instances,
        "allocations": arb.allocations.snapshot(),
    }


def restore(arb: Arbiter, doc: Any, now: int) -> list[str]:
    """Apply a snapshot to a fresh arbiter. Raises SettingError on a malformed document.

    GPUs in the document that this host does not have are skipped and named in
    the returned warnings.
    """
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise SettingError(f"state: expected a document of version {STATE_VERSION}")
    warnings: list[str] = []
    try:
        for k, spec in GLOBAL.items():
            arb.set_global(k, doc.get(k, spec.default))
        for key, vals in dict(doc.get("gpus", {})).items():
            gpu = int(key)
            if gpu not in arb.scheds:
                warnings.append(f"state: GPU {gpu} is not on this host; its settings are skipped")
                continue
            sched = arb.scheds[gpu]
            for k, spec in GPU.items():
                if k in vals:
                    sched.set(k, spec.check(vals[k]), now)
        for item in list(doc.get("instances", [])):
            gpu, name = int(item["gpu"]), valid_instance_id(str(item["id"]))
            if gpu not in arb.scheds:
                continue
            s = InstanceSettings(**{k: INSTANCE[k].check(item[k]) for k in INSTANCE_KEYS})
            arb.create_instance(gpu, name, s, now, provisioned=bool(item["provisioned"]))
        totals = {g: info.total_mem for g, info in arb.gpus.items()}
        warnings += arb.allocations.restore(list(doc.get("allocations", [])), totals)
    except (KeyError, TypeError, ValueError) as exc:
        raise SettingError(f"state: malformed document ({exc.__class__.__name__}: {exc})") from None
    except CoreError as exc:
        raise SettingError(f"state: {exc}") from None
    return warnings
