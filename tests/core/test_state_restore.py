"""Restoring a hand-edited state file: an operator's record wins over a client's, and every number is exact.

Two records that do not both fit keep the one an operator provisioned, wherever the file puts it. A number of
the file is an integer as ``take`` writes it: a bool (``"gpu": true`` is not GPU 1), a float, or text where no
setting reads it (``"gpu": "0"``) is skipped with a message naming the field, and the rest of the file restores.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from arbiterd.core import snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.effects import NS_PER_S

GIB = 1024**3
GPUS = [GpuInfo(0, "sim", "GPU-a", 16 * GIB, True), GpuInfo(1, "sim", "GPU-b", 8 * GIB, True)]


def make() -> Arbiter:
    return Arbiter(GPUS, ArbiterConfig(linger_ns=5 * NS_PER_S, allocations="optional"))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def record(name: str, weight: int, provisioned: bool, **extra: Any) -> dict[str, Any]:
    return {"id": name, "gpu": 0, "weight": weight, "highprio": 0, "memsize": 0, "provisioned": provisioned, **extra}


# GPU 0 has max_inst 16: weights 10 and 10 do not both fit, and neither does one id twice on one GPU
CONFLICTS = {
    "over_max_inst": (record("client", 10, False, creator_uid=1000), record("operator", 10, True, uid=1000)),
    "one_id_twice": (record("job", 3, False, creator_uid=1000), record("job", 5, True)),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_of_two_records_that_do_not_both_fit_the_provisioned_one_wins_though_it_comes_second(case: str) -> None:
    client, operator = CONFLICTS[case]
    doc = snapshot.take(make())
    fresh = make()
    warnings = snapshot.restore(fresh, {**doc, "instances": [client, operator]}, 0)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"state: instance record {client['id']!r} on GPU 0 skipped")
    assert "\n" not in warnings[0]
    assert fresh.records[(0, operator["id"])].provisioned
    assert fresh.scheds[0].instances[operator["id"]].weight == operator["weight"]
    assert snapshot.take(fresh) == {**doc, "instances": [operator]}  # the client's record is gone, nothing else


def test_records_that_fit_all_restore_whatever_made_them() -> None:
    doc = snapshot.take(make())
    both = [record("client", 6, False), record("operator", 10, True)]
    fresh = make()
    assert snapshot.restore(fresh, {**doc, "instances": both}, 0) == []
    assert snapshot.take(fresh) == {**doc, "instances": both}


def base() -> dict[str, Any]:
    """The state of a daemon with a setting, two records and an allocation, as its snapshot."""
    arb = make()
    tree.write(arb, "0/policy", "2", 0)
    tree.write(arb, "inst_ctl", "create keep weight=3 memsize=1GiB highprio=1", 0)
    tree.write(arb, "inst_ctl", "create mine uid=1000 gpu=1", 0)
    tree.write(arb, "alloc_ctl", f"create al token={sha('al')} gpu=1 core=30", 0)
    return snapshot.take(arb)


def alloc(**change: Any) -> dict[str, Any]:
    return {"id": "bad", "gpus": [1], "memsize": [GIB], "core": 0, "weight": 0, "highprio": 0, "bound": None,
            "pod": None, "token": sha("bad"), **change}


# (section, the bad item or setting, the field its message names, the value as the message shows it)
NOT_INTEGERS: list[tuple[str, Any, str, str]] = [
    ("instances", record("bad", 1, True, gpu=True), "gpu", "True"),  # was restored as GPU 1
    ("instances", record("bad", True, True), "weight", "True"),
    ("instances", record("bad", 1, True, memsize=1.5), "memsize", "1.5"),
    ("instances", record("bad", 1, True, highprio=True), "highprio", "True"),  # was restored as high priority
    ("instances", record("bad", 1, True, gpu=0.0), "gpu", "0.0"),
    ("instances", record("bad", 1, True, gpu="0\nforged"), "gpu", "'0\\nforged'"),  # one log line all the same
    ("instances", record("bad", 1, True, uid=False), "uid", "False"),
    ("instances", record("bad", 0, False, requested=2.0), "requested", "2.0"),
    ("allocations", alloc(core=True), "core", "True"),  # was restored as core 1
    ("allocations", alloc(gpus=[True]), "gpus", "True"),  # was restored on GPU 1
    ("allocations", alloc(memsize=[1.5]), "memsize", "1.5"),
    ("allocations", alloc(weight=2.0), "weight", "2.0"),
    ("allocations", alloc(highprio=True), "highprio", "True"),
    ("upgrade", True, "upgrade", "True"),  # a node-wide setting
    ("prio_ratio", 60.0, "prio_ratio", "60.0"),  # a GPU's setting
]


@pytest.mark.parametrize(("section", "bad", "field", "shown"), NOT_INTEGERS)
def test_a_bool_a_float_or_text_for_an_integer_is_skipped_naming_the_field(section: str, bad: Any, field: str,
                                                                    shown: str) -> None:
    doc = base()
    if section in ("instances", "allocations"):
        edited = {**doc, section: [*doc[section], bad]}
    elif section in doc:
        edited = {**doc, section: bad}
    else:
        edited = {**doc, "gpus": {**doc["gpus"], "0": {**doc["gpus"]["0"], section: bad}}}
    fresh = make()
    warnings = snapshot.restore(fresh, edited, 0)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "skipped" in warnings[0] and f"({field}: " in warnings[0] and shown in warnings[0]
    assert snapshot.take(fresh) == doc  # everything else restored, the bad item not
