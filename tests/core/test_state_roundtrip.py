"""restore(snapshot(s)) gives back s for every state the daemon can reach, and a bad item costs only itself.

The states come from random sequences of what operators and clients do (hypothesis): provisioning, for
containers and for host uids, registrations (queued at weight 0 where the daemon queues them), disconnections,
writes to every writable file of the tree, allocations and their binding, time passing. Whatever a sequence
reached, its snapshot, restored into a fresh daemon, snapshots the same, with no warning; and restored on a host
that lacks one of the GPUs, the absent GPU's items come back unchanged in the next snapshot.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiterd.core import binding, snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.effects import NS_PER_S
from arbiterd.core.errors import CoreError, SettingError
from arbiterd.core.settings import InstanceSettings

GIB = 1024**3
NAMES = ["a", "b", "c", "0123456789ab", "uid-1000", "job.x"]
GPUS = [GpuInfo(0, "sim", "GPU-a", 16 * GIB, True), GpuInfo(1, "sim", "GPU-b", 8 * GIB, True)]


def make(overcommit: str, gpus: list[GpuInfo] = GPUS) -> Arbiter:
    return Arbiter(gpus, ArbiterConfig(linger_ns=5 * NS_PER_S, allocations="optional", overcommit=overcommit,
                                       clients_shape_gpus=overcommit == "queue", max_records_per_uid=3))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


gpu_sets = st.sampled_from([[0], [1], [0, 1]])
settings_st = st.builds(lambda w, hp, mem, core: InstanceSettings(w, hp, mem, core),
                        st.integers(1, 12), st.integers(0, 1), st.sampled_from([0, GIB, 3 * GIB]),
                        st.sampled_from([0, 0, 0, 30, 55]))
ops = st.one_of(
    st.tuples(st.just("provision"), st.sampled_from(NAMES), gpu_sets, settings_st,
              st.sampled_from([None, None, 1000, 1001])),
    st.tuples(st.just("unprovision"), st.sampled_from(NAMES)),
    st.tuples(st.just("register"), st.integers(1, 8), st.sampled_from(NAMES), gpu_sets, settings_st,
              st.sampled_from([None, None, 1000])),
    st.tuples(st.just("disconnect"), st.integers(1, 8)),
    st.tuples(st.just("write"), st.sampled_from([
        "0/policy", "1/policy", "0/max_inst", "1/max_inst", "0/prio_ratio", "0/slice_ms", "1/slice_min_ms",
        "1/slice_max_ms", "0/handover_target_pct", "0/overrun_ms", "default_memsize", "upgrade",
        *(f"{g}/{n}/{k}" for g in (0, 1) for n in NAMES[:3] for k in ("weight", "highprio", "memsize"))]),
              st.sampled_from(["0", "1", "2", "3", "5", "8", "16", "20", "60", "auto", "1GiB", "4GiB"])),
    st.tuples(st.just("alloc"), st.sampled_from(["m1", "m2", "c1"]), st.sampled_from([0, 1]),
              st.sampled_from(["memsize=1GiB", "core=30", "memsize=2GiB core=20"])),
    st.tuples(st.just("unalloc"), st.sampled_from(["m1", "m2", "c1"])),
    st.tuples(st.just("bind"), st.sampled_from(NAMES[:3]), st.sampled_from(["m1", "m2", "c1"])),
    st.tuples(st.just("tick"), st.integers(0, 8)),
    st.tuples(st.just("fill"), st.sampled_from([0, 1])),  # an operator takes what weight is free
)


def play(arb: Arbiter, steps: list[tuple[Any, ...]]) -> int:
    """Apply ``steps``; a refused one changes nothing (CoreError). Returns the virtual time reached."""
    now = 0
    for step in steps:
        kind, *args = step
        try:
            if kind == "provision":
                name, gpus, s, uid = args
                if uid is not None and name == "0123456789ab":
                    continue  # inst_ctl refuses a host instance named like a container
                arb.provision(name, gpus, s, now, host_uid=uid)
            elif kind == "unprovision":
                arb.unprovision(args[0], None, now)
            elif kind == "register":
                cid, name, gpus, s, uid = args
                if cid in arb.clients:
                    continue
                arb.connect(cid, 100 + cid, uid or 0)
                try:
                    arb.register(cid, name, gpus, dict.fromkeys(gpus, s), now, host_uid=uid, creator_uid=uid)
                except CoreError:
                    arb.disconnect(cid, now)
                    raise
            elif kind == "disconnect":
                arb.disconnect(args[0], now)
            elif kind == "write":
                tree.write(arb, args[0], args[1], now)
            elif kind == "alloc":
                alloc_id, gpu, what = args
                tree.write(arb, "alloc_ctl", f"create {alloc_id} token={sha(alloc_id)} gpu={gpu} {what}", now)
            elif kind == "unalloc":
                tree.write(arb, "alloc_ctl", f"remove {args[0]}", now)
            elif kind == "bind":
                name, alloc_id = args
                who = binding.Claimant(name, name * 4, None, frozenset({sha(alloc_id)}))
                binding.bind(arb, who, now)
            elif kind == "fill":
                free = arb.scheds[args[0]].free_weight
                if free:
                    tree.write(arb, "inst_ctl", f"create fill{now} gpu={args[0]} weight={free}", now)
                now += 1
            elif kind == "tick":
                now += args[0] * NS_PER_S
                arb.tick(now)
        except CoreError:
            pass
    return now


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["refuse", "queue"]), st.lists(ops, max_size=30))
def test_restore_of_a_snapshot_gives_back_every_reachable_state(overcommit: str, steps: list[tuple[Any, ...]]) -> None:
    arb = make(overcommit)
    now = play(arb, steps)
    doc = snapshot.take(arb)
    fresh = make(overcommit)
    assert snapshot.restore(fresh, doc, now) == []
    assert snapshot.take(fresh) == doc


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, max_size=25))
def test_items_of_a_gpu_this_host_lacks_are_kept_for_when_it_is_back(steps: list[tuple[Any, ...]]) -> None:
    arb = make("queue")
    play(arb, steps)
    doc = snapshot.take(arb)
    one = make("queue", GPUS[:1])
    assert snapshot.restore(one, doc, 0) == []
    assert snapshot.take(one) == doc  # GPU 1's settings, records and allocations written back as they were
    both = make("queue")
    assert snapshot.restore(both, snapshot.take(one), 0) == [] and snapshot.take(both) == doc


def test_a_weight_0_record_round_trips() -> None:
    """The case that used to set the whole file aside: a record queued at weight 0."""
    arb = make("queue")
    arb.provision("big", [0], InstanceSettings(16), 0)
    arb.connect(1, 101, 0)
    reg, _ = arb.register(1, "late", [0], {0: InstanceSettings(2)}, 0)
    assert reg.gpus[0].weight == 0
    doc = snapshot.take(arb)
    assert {"id": "late", "gpu": 0, "weight": 0, "requested": 2, "highprio": 0, "memsize": 0,
            "provisioned": False} in doc["instances"]
    fresh = make("queue")
    assert snapshot.restore(fresh, doc, 0) == [] and snapshot.take(fresh) == doc
    tree.write(fresh, "0/big/weight", "14", 0)
    assert fresh.scheds[0].instances["late"].weight == 2  # still queued for what it asked


BAD_ITEMS: list[tuple[str, Any, str]] = [
    ("instances", {"id": "bad\n", "gpu": 0, "weight": 1, "highprio": 0, "memsize": 0, "provisioned": True},
     "instance record"),
    ("instances", {"id": "w99", "gpu": 0, "weight": 99, "highprio": 0, "memsize": 0, "provisioned": True},
     "instance record"),
    ("instances", {"id": "nouid", "gpu": 0, "weight": 1, "highprio": 0, "memsize": 0, "provisioned": True,
                   "uid": -4}, "instance record"),
    ("instances", {"id": "zero", "gpu": 0, "weight": 0, "highprio": 0, "memsize": 0, "provisioned": True},
     "instance record"),
    ("instances", "not a record", "instance record"),
    ("allocations", {"id": "x", "gpus": [0], "memsize": [1], "core": 0, "token": "nothex", "bound": None},
     "allocation"),
]


@pytest.mark.parametrize(("section", "item", "label"), BAD_ITEMS)
def test_a_bad_item_is_skipped_on_its_own_and_everything_else_kept(section: str, item: Any, label: str) -> None:
    arb = make("refuse")
    tree.write(arb, "0/policy", "2", 0)
    tree.write(arb, "inst_ctl", "create keep weight=3 memsize=1GiB", 0)
    tree.write(arb, "inst_ctl", "create mine uid=1000 gpu=1", 0)
    tree.write(arb, "alloc_ctl", f"create al token={sha('al')} gpu=1 core=30", 0)
    doc = snapshot.take(arb)
    bad = {**doc, section: [*doc[section], item]}
    fresh = make("refuse")
    warnings = snapshot.restore(fresh, bad, 0)
    assert len(warnings) == 1 and warnings[0].startswith(f"state: {label}") and "skipped" in warnings[0]
    assert "\n" not in warnings[0]
    assert snapshot.take(fresh) == doc


def test_bad_settings_are_skipped_one_by_one() -> None:
    arb = make("refuse")
    doc = {**snapshot.take(arb), "default_memsize": "lots"}
    doc["gpus"] = {"0": {**doc["gpus"]["0"], "policy": 9, "max_inst": 20}, "x": {}, "1": "nope"}
    fresh = make("refuse")
    warnings = snapshot.restore(fresh, doc, 0)
    assert sorted(w.split(" (")[0] for w in warnings) == sorted([
        "state: default_memsize skipped", "state: GPU 0 policy skipped", "state: gpus.x skipped",
        "state: GPU 1 settings skipped"])
    assert fresh.scheds[0].settings.max_inst == 20  # the good setting beside the bad one is kept


def test_a_document_that_is_no_state_at_all_is_refused_whole() -> None:
    for doc in (None, [], {"version": 9}):
        with pytest.raises(SettingError):
            snapshot.restore(make("refuse"), doc, 0)
