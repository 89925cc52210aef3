"""Snapshot and restore of everything an operator can set (for the state file).

The document holds every setting of the tables in settings.py, so a setting
added there is saved and restored with no change here. ``restore(take(a))``
gives back ``a``'s settings and records for every state the daemon can reach,
weight-0 records included (tests/core/test_state_roundtrip.py).

Restore is per item: a global, a GPU setting, an instance record or an
allocation that fails its checks is skipped on its own and named in the
returned warnings, and everything else is kept. Items for GPUs this host does
not have now (a card out for repair, a driver that failed to load) are kept
aside as they were and written back by every later snapshot, so no operator's
setting is lost while its GPU is away.

Where two items do not both fit (weights over max_inst, a record twice), the
one restored first stays, so operator state goes first: instance records an
operator provisioned (``"provisioned": true``: made by ``inst_ctl``, or from an
allocation that ``alloc_ctl`` made), then allocations, then the records clients
made, each group in file order. A client-made record that conflicts with an
operator's is the one skipped, wherever the file puts it. Allocations are
checked only against each other today, so their place beside the records
decides nothing yet; it is between the two so that any check added across them
keeps the operator's side ahead of the clients'.

Every number of the file is an integer exactly as :func:`take` writes it
(:func:`_int`): a bool (Python's bool is an int, so ``"gpu": true`` would be
GPU 1) or a float is refused, for every field, before a setting's own check
sees it (that check takes a bool for a flag's 0 or 1 from the daemon's own
callers).
The wire refuses them in ``cgpu_protocol``, and the settings tree parses text.
"""

from __future__ import annotations

import logging
from typing import Any

from arbiterd.core import binding
from arbiterd.core.arbiter import Arbiter
from arbiterd.core.errors import CoreError, SettingError
from arbiterd.core.names import valid_instance_id
from arbiterd.core.settings import GLOBAL, GPU, INSTANCE, NO_LIMIT, Setting

log = logging.getLogger("arbiterd.core")
STATE_VERSION = 1
INSTANCE_KEYS = tuple(name for name, s in INSTANCE.items() if s.tree)  # weight, highprio, memsize, limit
_BAD = (CoreError, KeyError, TypeError, ValueError, AttributeError)


def take(arb: Arbiter) -> dict[str, Any]:
    """A JSON-able document of every setting and instance record (and those kept for absent GPUs)."""
    gpus = {str(idx): {k: s.external(getattr(sched.settings, k)) for k, s in GPU.items()}
            for idx, sched in sorted(arb.scheds.items())}
    gpus.update(arb.absent.gpus)
    instances = []
    for (gpu, name), rec in sorted(arb.records.items()):
        st = arb.scheds[gpu].instances[name]
        item: dict[str, Any] = {"id": name, "gpu": gpu, "weight": st.weight, "highprio": int(st.highprio),
                                "memsize": rec.memsize, "provisioned": rec.provisioned}
        if st.weight == 0:
            item["requested"] = st.requested
        if st.limit < NO_LIMIT:
            item["limit"] = st.limit
        if rec.host_uid is not None:
            item["uid"] = rec.host_uid
        if rec.creator_uid is not None:
            item["creator_uid"] = rec.creator_uid
        instances.append(item)
    return {
        "version": STATE_VERSION,
        **{k: getattr(arb.globals, k) for k in GLOBAL},
        "gpus": dict(sorted(gpus.items(), key=lambda kv: int(kv[0]))),
        "instances": sorted(instances + arb.absent.instances, key=lambda i: (int(i["gpu"]), str(i["id"]))),
        "allocations": sorted(arb.allocations.snapshot() + arb.absent.allocations, key=lambda a: str(a["id"])),
    }


def restore(arb: Arbiter, doc: Any, now: int) -> list[str]:
    """Apply a snapshot to a fresh arbiter; one warning per item skipped because it failed its checks.

    Raises SettingError only when ``doc`` is not a state document at all (not a map, another version).
    """
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise SettingError(f"state: expected a document of version {STATE_VERSION}")
    warnings: list[str] = []
    for k, spec in GLOBAL.items():
        try:
            arb.set_global(k, _int(k, doc.get(k, spec.default), spec))
        except _BAD as exc:
            warnings.append(f"state: {k} skipped ({_why(exc)})")
    gpus = doc.get("gpus", {})
    if not isinstance(gpus, dict):
        warnings.append("state: gpus skipped (not a map)")
        gpus = {}
    for key, vals in gpus.items():
        warnings += _restore_gpu(arb, key, vals, now)
    items = doc.get("instances", [])
    records = items if isinstance(items, list) else []
    warnings += _restore_records(arb, [i for i in records if _provisioned(i)], now)
    allocs = doc.get("allocations", [])
    warnings += _restore_allocations(arb, allocs if isinstance(allocs, list) else [])
    warnings += _restore_records(arb, [i for i in records if not _provisioned(i)], now)
    for instance in sorted({a.bound for a in arb.allocations if a.bound is not None}):
        binding.relabel(arb, instance)  # a pod's labels are its allocations': saved with them, back on its records
    if arb.absent:
        log.warning("state: settings of GPU(s) %s are kept for when the GPU is back: this host does not have it "
                    "now", ", ".join(sorted(arb.absent.gpu_names())))
    return warnings


def _provisioned(item: Any) -> bool:
    return isinstance(item, dict) and item.get("provisioned") is True


def _restore_records(arb: Arbiter, items: list[Any], now: int) -> list[str]:
    warnings = []
    for item in items:
        try:
            gpu = _int("gpu", item["gpu"])
            if gpu not in arb.scheds:
                arb.absent.instances.append(item)
                continue
            _restore_record(arb, gpu, item, now)
        except _BAD as exc:
            warnings.append(f"state: instance record {_label(item)} skipped ({_why(exc)})")
    return warnings


def _restore_allocations(arb: Arbiter, items: list[Any]) -> list[str]:
    warnings = []
    totals = {g: info.total_mem for g, info in arb.gpus.items()}
    for item in items:
        try:
            if any(_int("gpus", g) not in totals for g in item["gpus"]):
                arb.absent.allocations.append(item)
                continue
            for m in item["memsize"]:
                _int("memsize", m)
            _int("core", item["core"])
            _int("weight", item.get("weight", 0))
            _int("highprio", item.get("highprio", 0), INSTANCE["highprio"])
            arb.allocations.restore_one(item, totals)
        except _BAD as exc:
            warnings.append(f"state: allocation {_label(item)} skipped ({_why(exc)})")
    return warnings


def _restore_gpu(arb: Arbiter, key: Any, vals: Any, now: int) -> list[str]:
    try:
        gpu = int(key)
    except (TypeError, ValueError):
        return [f"state: gpus.{key!s:.40} skipped (not a GPU index)"]
    if gpu not in arb.scheds:
        arb.absent.gpus[str(key)] = vals
        return []
    if not isinstance(vals, dict):
        return [f"state: GPU {gpu} settings skipped (not a map)"]
    warnings = []
    sched = arb.scheds[gpu]
    for k, spec in GPU.items():  # in table order: slice_min_ms is put back before slice_max_ms
        if k in vals:
            try:
                sched.set(k, _int(k, vals[k], spec), now)
            except _BAD as exc:
                warnings.append(f"state: GPU {gpu} {k} skipped ({_why(exc)})")
    return warnings


def _restore_record(arb: Arbiter, gpu: int, item: dict[str, Any], now: int) -> None:
    name = valid_instance_id(item["id"])
    weight = item["weight"]
    if weight == 0 and type(weight) is int:  # admitted while free_weight was 0 (overcommit = queue)
        requested = _int("requested", item["requested"], INSTANCE["weight"])
    else:
        weight = requested = _int("weight", weight, INSTANCE["weight"], arb.scheds[gpu].settings.max_inst)
    uid, creator = item.get("uid"), item.get("creator_uid")
    for key, v in (("uid", uid), ("creator_uid", creator)):
        if v is not None and _int(key, v) < 0:
            raise SettingError(f"{key}: a uid is a number >= 0, got {v!r}")
    if type(item["provisioned"]) is not bool:
        raise SettingError(f"provisioned: expected true or false, got {item['provisioned']!r:.40}")
    arb.restore_record(gpu, name, weight, requested, _int("highprio", item["highprio"], INSTANCE["highprio"]),
                       _int("memsize", item["memsize"], INSTANCE["memsize"]), item["provisioned"], uid, creator,
                       now, _int("limit", item.get("limit", NO_LIMIT), INSTANCE["limit"]))


def _int(key: str, value: Any, spec: Setting[int] | None = None, hi: int | None = None) -> int:
    """A number of the file, as :func:`take` writes it: an integer, never a bool or a float (the one place every
    number of the file is checked). With the field's setting, that setting's check follows, and text is its to
    judge (``auto``, an enum's name, ``4GiB``), as a tree write's is; ``hi`` narrows its range."""
    if spec is not None and isinstance(value, str):
        return spec.check(value, hi)
    if type(value) is not int:
        raise SettingError(f"{key}: expected an integer, got {value!r:.40}")
    return value if spec is None else spec.check(value, hi)


def _label(item: Any) -> str:
    if isinstance(item, dict):
        return f"{str(item.get('id'))[:60]!r}" + (f" on GPU {item['gpu']!r:.20}" if "gpu" in item else "")
    return f"{str(item)[:60]!r}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r}"
    return str(exc) or exc.__class__.__name__
