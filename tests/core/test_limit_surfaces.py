"""A limit on every surface (behaviour §3, requests and limits): the tree, inst_ctl, alloc_ctl and binding, the
state file; bad input is refused with one line and changes nothing."""

from __future__ import annotations

import hashlib

import pytest

from arbiterd.core import binding, snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.binding import Claimant
from arbiterd.core.errors import CoreError
from arbiterd.core.policies import FIXED_CORE, WEAK

GIB = 1024**3


def make(allocations: str = "off", gpus: int = 1) -> Arbiter:
    return Arbiter([GpuInfo(i, "sim", f"GPU-{i}", 16 * GIB, True) for i in range(gpus)],
                   ArbiterConfig(allocations=allocations))


def test_the_tree_reads_and_writes_a_limit_and_refuses_one_below_the_request() -> None:
    a = make()
    tree.write(a, "0/policy", "4", 0)
    tree.write(a, "0/max_inst", "20", 0)
    tree.write(a, "inst_ctl", "create c1 weight=6", 0)
    assert tree.read(a, "0/c1/limit", 0) == "100\n"
    tree.write(a, "0/c1/limit", "60", 0)
    assert tree.read(a, "0/c1/limit", 0) == "60\n"
    with pytest.raises(CoreError, match=r"limit 25 % is below its request, weight 6 of max_inst 20 = 30 %"):
        tree.write(a, "0/c1/limit", "25", 0)
    with pytest.raises(CoreError, match=r"limit: 120 is out of range 5\.\.100"):
        tree.write(a, "0/c1/limit", "120", 0)
    assert tree.read(a, "0/c1/limit", 0) == "60\n"


def test_a_limit_on_policy_3_is_refused_unless_it_is_the_request() -> None:
    a = make()
    tree.write(a, "inst_ctl", "create c1 core=30", 0)
    assert a.scheds[0].settings.policy == FIXED_CORE
    with pytest.raises(CoreError, match=r"policy 3 .fixed core. caps every instance at its request"):
        tree.write(a, "0/c1/limit", "60", 0)
    tree.write(a, "0/c1/limit", "30", 0)


def test_inst_ctl_core_with_a_limit_above_it_puts_an_unused_gpu_on_policy_4() -> None:
    a = make()
    tree.write(a, "inst_ctl", "create c1 core=30 limit=60", 0)
    s = a.scheds[0]
    assert (s.settings.policy, s.settings.max_inst) == (WEAK, 20)
    assert (s.instances["c1"].weight, s.instances["c1"].limit) == (6, 60)
    assert "c1 gpu=0 weight=6 limit=60 highprio=0" in tree.read(a, "inst_ctl", 0)
    with pytest.raises(CoreError, match="below its request"):
        tree.write(a, "inst_ctl", "create c2 core=40 limit=30", 0)
    assert "c2" not in a.scheds[0].instances


def test_a_policy_3_gpu_moves_to_4_keeping_every_cap_when_a_limit_above_a_request_comes() -> None:
    a = make()
    tree.write(a, "inst_ctl", "create c1 core=30", 0)
    tree.write(a, "inst_ctl", "create c2 core=40 limit=60", 0)
    s = a.scheds[0]
    assert s.settings.policy == WEAK
    assert (s.instances["c1"].limit, s.instances["c2"].limit) == (30, 60)  # c1's cap, as policy 3 held it


def test_the_state_file_round_trips_limits_and_the_period() -> None:
    a = make()
    tree.write(a, "inst_ctl", "create c1 core=30 limit=60", 0)
    tree.write(a, "0/limit_period_ms", "150", 0)
    doc = snapshot.take(a)
    b = make()
    assert snapshot.restore(b, doc, 0) == []
    assert snapshot.take(b) == doc
    assert b.scheds[0].instances["c1"].limit == 60 and b.scheds[0].settings.limit_period_ms == 150


def test_a_saved_limit_below_its_request_skips_that_record_only() -> None:
    a = make()
    tree.write(a, "inst_ctl", "create c1 core=30 limit=60", 0)
    tree.write(a, "inst_ctl", "create c2 core=10", 0)
    doc = snapshot.take(a)
    doc["instances"][0]["limit"] = 20
    b = make()
    warnings = snapshot.restore(b, doc, 0)
    assert len(warnings) == 1 and "c1" in warnings[0] and "below its request" in warnings[0]
    assert "c2" in b.scheds[0].instances


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_an_allocation_with_cores_and_a_limit_binds_a_request_and_a_ceiling() -> None:
    a = make("required")
    tree.write(a, "alloc_ctl", f"create x token={sha('t')} gpu=0 memsize=1GiB core=30 limit=60", 0)
    assert "core=30 limit=60 bound=-" in tree.read(a, "alloc_ctl", 0)
    with pytest.raises(CoreError, match="limit=20 is below core=30"):
        tree.write(a, "alloc_ctl", f"create y token={sha('u')} gpu=0 memsize=1GiB core=30 limit=20", 0)
    bound = binding.bind(a, Claimant("c1" * 6, "c1" * 30, "pod", frozenset({sha("t")})), 0)
    assert bound is not None and bound.gpus == [0]
    s = a.scheds[0]
    inst = s.instances["c1" * 6]
    assert (s.settings.policy, inst.weight, inst.limit) == (WEAK, 6, 60)
    doc = snapshot.take(a)
    b = make("required")
    assert snapshot.restore(b, doc, 0) == [] and snapshot.take(b) == doc


def test_alloc_ctl_limit_sets_and_clears_a_bound_containers_ceiling_and_refuses_bad_ones() -> None:
    """The device plugin's path (its pod's cgpu.io/core-limit annotation, read after Allocate): a core allocation
    bound as a hard cap on policy 3 gets a ceiling above its request, which puts the card on policy 4 with every
    other instance held to its request; ``none`` gives the cap back; bad values change nothing."""
    a = make("required")
    tree.write(a, "alloc_ctl", f"create x token={sha('t')} gpu=0 memsize=1GiB core=30", 0)
    tree.write(a, "alloc_ctl", f"create y token={sha('u')} gpu=0 memsize=1GiB core=40", 0)
    binding.bind(a, Claimant("c1" * 6, "c1" * 30, "pod", frozenset({sha("t")})), 0)
    binding.bind(a, Claimant("c2" * 6, "c2" * 30, "pod2", frozenset({sha("u")})), 0)
    s = a.scheds[0]
    a1, a2 = s.instances["c1" * 6], s.instances["c2" * 6]
    assert (s.settings.policy, a1.weight, a1.limit) == (FIXED_CORE, 6, 100)
    before = snapshot.take(a)
    for bad, why in (("20", "20 is below allocation x's core=30"), ("120", r"120 is out of range 5\.\.100"),
                     ("lots", "limit"), ("60 70", "expected 'limit ID P'")):
        with pytest.raises(CoreError, match=why):
            tree.write(a, "alloc_ctl", f"limit x {bad}", 0)
    with pytest.raises(CoreError, match="nope"):
        tree.write(a, "alloc_ctl", "limit nope 60", 0)
    assert snapshot.take(a) == before
    tree.write(a, "alloc_ctl", "limit x 60", 0)
    assert "core=30 limit=60 bound=" in tree.read(a, "alloc_ctl", 0)
    assert (s.settings.policy, a1.weight, a1.limit, a2.weight, a2.limit) == (WEAK, 6, 60, 8, 40)
    doc = snapshot.take(a)
    b = make("required")
    assert snapshot.restore(b, doc, 0) == [] and snapshot.take(b) == doc
    tree.write(a, "alloc_ctl", "limit x none", 0)
    assert (s.settings.policy, a1.limit) == (WEAK, 30) and "core=30 limit=30 bound=" in tree.read(a, "alloc_ctl", 0)
    # unbound: only the allocation changes, and binding brings the ceiling
    tree.write(a, "alloc_ctl", f"create z token={sha('v')} gpu=0 memsize=1GiB core=20", 0)
    tree.write(a, "alloc_ctl", "limit z 50", 0)
    binding.bind(a, Claimant("c3" * 6, "c3" * 30, "pod3", frozenset({sha("v")})), 0)
    assert s.instances["c3" * 6].limit == 50


def test_a_memory_allocation_beside_a_limited_core_allocation_leaves_the_limit_alone() -> None:
    """The device plugin makes two allocations per container, gpu-mem and gpu-core; memory asks no GPU time, so
    it must not add "no limit" to the core's ceiling (it did: 60 + 100 read as no limit)."""
    a = make("required")
    tree.write(a, "alloc_ctl", f"create m token={sha('t')} gpu=0 memsize=2GiB", 0)
    tree.write(a, "alloc_ctl", f"create c token={sha('u')} gpu=0 core=30 limit=60", 0)
    binding.bind(a, Claimant("c1" * 6, "c1" * 30, "pod", frozenset({sha("t"), sha("u")})), 0)
    inst = a.scheds[0].instances["c1" * 6]
    assert (inst.weight, inst.limit, a.records[(0, "c1" * 6)].memsize) == (6, 60, 2 * GIB)


def test_a_limit_of_100_beside_a_core_percentage_is_no_ceiling_not_its_hard_cap() -> None:
    """core=60 limit=100 asks 60 % under contention and the whole GPU when it is free; it read as no limit given,
    so the core percentage capped it at 60 % on policy 3 (bench.k8s --dra: a claim with limit 100 held 60)."""
    a = make("required", gpus=2)
    tree.write(a, "alloc_ctl", f"create x token={sha('t')} gpu=0 memsize=1GiB core=60 limit=100", 0)
    binding.bind(a, Claimant("c1" * 6, "c1" * 30, "pod", frozenset({sha("t")})), 0)
    s = a.scheds[0]
    inst = s.instances["c1" * 6]
    assert (s.settings.policy, inst.weight, inst.limit) == (WEAK, 12, 100)
    tree.write(a, "inst_ctl", "create h gpu=1 core=40 limit=100", 0)
    assert (a.scheds[1].settings.policy, a.scheds[1].instances["h"].limit) == (WEAK, 100)
    assert "h gpu=1 weight=8 highprio=0" in tree.read(a, "inst_ctl", 0)  # no ceiling: none listed
