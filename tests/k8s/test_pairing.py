"""Pairing a container's two resources by time, with a virtual clock."""

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


def test_pairing_works_in_either_order_and_consumes_the_partner() -> None:
    p = Pairing(5.0)
    p.allocated(CORE, "core-a", 0, now=0.0)
    partner = p.allocated(MEM, "mem-a", 0, now=1.0)
    assert partner is not None and partner.alloc_id == "core-a"
    assert p.hint(MEM, 1.5) is None and p.hint(CORE, 1.5) is None  # both paired: nothing left to prefer


def test_an_old_allocation_is_not_a_partner() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 1, now=0.0)
    assert p.hint(CORE, now=5.01) is None
    assert p.allocated(CORE, "core-b", 0, now=5.02) is None  # it stays unpaired itself
    assert p.hint(MEM, now=6.0) is not None


def test_the_most_recent_unpaired_allocation_wins() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 0, now=0.0)
    p.allocated(MEM, "mem-b", 1, now=1.0)
    hint = p.hint(CORE, now=2.0)
    assert hint is not None and hint.alloc_id == "mem-b"


def test_memory_spanning_cards_leaves_no_preference() -> None:
    p = Pairing(5.0)
    p.allocated(MEM, "mem-a", 0, now=0.0)
    p.allocated(MEM, "mem-b", None, now=1.0)
    assert p.hint(CORE, now=2.0) is None
