"""Pairing a container's two resources by the order of the kubelet's calls, with a virtual clock."""

from __future__ import annotations

from cgpu_device_plugin.devices import Resource
from cgpu_device_plugin.pairing import Pairing

MEM, CORE = Resource.MEM, Resource.CORE


def test_the_second_resource_prefers_the_card_of_the_first_within_the_window() -> None:
    p = Pairing(5.0)
    assert p.hint(CORE, 0.0) is None
    assert p.allocated(MEM, "mem-a", 1, now=10.0) is None
    hint = p.hint(CORE, now=12.0)
    assert hint is not None and hint.card == 1 and hint.alloc_id == "mem-a"
    assert p.hint(MEM, now=12.0) is None  # a memory request does not pair with memory
    partner = p.allocated(CORE, "core-a", 1, now=12.0)
    assert partner is not None and partner.alloc_id == "mem-a"


def test_pairing_works_in_either_order() -> None:
    p = Pairing(5.0)
    p.allocated(CORE, "core-a", 0, now=0.0)
    hint = p.hint(MEM, now=0.1)
    assert hint is not None and hint.alloc_id == "core-a"


def test_after_a_pair_the_next_container_gets_no_hint_for_the_resource_that_came_first() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 0, now=0.0)
    p.allocated(CORE, "core-a", 0, now=0.1)
    assert p.hint(CORE, now=0.2) is None  # core was allocated after the last memory allocation
    hint = p.hint(MEM, now=0.2)  # memory first: the previous container's card, when it fits
    assert hint is not None and hint.alloc_id == "core-a"


def test_after_a_memory_only_container_the_next_one_still_ends_on_one_card() -> None:
    """mem-only A on GPU 1; B asks core first (drawn to GPU 1), then memory (follows its core)."""
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 1, now=0.0)
    first = p.hint(CORE, now=0.1)
    assert first is not None and first.card == 1
    p.allocated(CORE, "core-b", 1, now=0.1)
    second = p.hint(MEM, now=0.2)
    assert second is not None and second.alloc_id == "core-b"


def test_an_old_allocation_is_no_hint() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 1, now=0.0)
    assert p.hint(CORE, now=5.01) is None


def test_memory_spanning_cards_leaves_no_preference() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 0, now=0.0)
    p.allocated(MEM, "mem-b", None, now=1.0)
    assert p.hint(CORE, now=2.0) is None
