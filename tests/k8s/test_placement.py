"""Placement as pure functions: which card, and which requests Allocate refuses."""

from __future__ import annotations

import dataclasses

import pytest

from cgpu_device_plugin.devices import GIB, Resource, device_ids, parse_device_id
from cgpu_device_plugin.node import Card
from cgpu_device_plugin.placement import Plan, Refusal, min_cards, plan_allocation, preferred
from cgpu_testing.daemon import sim_uuid

MEM, CORE = Resource.MEM, Resource.CORE


def cards(*gib: int) -> list[Card]:
    return [Card(i, sim_uuid(i), g * GIB) for i, g in enumerate(gib)]


def all_ids(cs: list[Card], resource: Resource) -> list[str]:
    return [i for c in cs for i in device_ids(c.uuid, c.total_mem, resource)]


def card_of(ids: list[str]) -> set[int]:
    return {int(parse_device_id(i).uuid.split("-")[-1]) for i in ids}


def commit(cs: list[Card], resource: Resource, ids: list[str]) -> list[Card]:
    """What arbiterd reports after an allocation of ``ids`` is created (placement's only input)."""
    plan = plan_allocation(resource, ids, cs)
    out = []
    for c in cs:
        n = dict(zip((p.uuid for p in plan.cards), plan.units, strict=True)).get(c.uuid, 0)
        out.append(dataclasses.replace(c, alloc_mem=c.alloc_mem + n * GIB * (resource is MEM),
                                       alloc_core=c.alloc_core + n * (resource is CORE)))
    return out


def run_pods(policy: str, sizes: list[int], cs: list[Card]) -> list[int]:
    """Place memory pods one after another (nothing frees); the card each lands on."""
    used: set[str] = set()
    placed = []
    for size in sizes:
        available = [i for i in all_ids(cs, MEM) if i not in used]
        ids = preferred(MEM, size, available, [], cs, policy)
        assert len(ids) == size
        (card,) = card_of(ids)
        placed.append(card)
        cs = commit(cs, MEM, ids)
        used |= set(ids)
    return placed


def test_binpack_fills_one_16_gib_card_with_four_4_gib_pods_before_the_next() -> None:
    assert run_pods("binpack", [4] * 8, cards(16, 16)) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_spread_alternates_between_equal_cards() -> None:
    assert run_pods("spread", [4] * 8, cards(16, 16)) == [0, 1, 0, 1, 0, 1, 0, 1]


def test_binpack_takes_the_fullest_card_that_fits() -> None:
    cs = cards(16, 16, 16)
    cs[1] = dataclasses.replace(cs[1], alloc_mem=13 * GIB)  # 3 GiB left: fullest, but 4 does not fit
    cs[2] = dataclasses.replace(cs[2], alloc_mem=8 * GIB)
    assert card_of(preferred(MEM, 4, all_ids(cs, MEM), [], cs, "binpack")) == {2}
    assert card_of(preferred(MEM, 3, all_ids(cs, MEM), [], cs, "binpack")) == {1}
    assert card_of(preferred(MEM, 4, all_ids(cs, MEM), [], cs, "spread")) == {0}


def test_the_card_is_only_what_the_kubelet_still_lists_and_arbiterd_still_has() -> None:
    cs = cards(16, 16)
    available = [i for i in all_ids(cs, MEM) if not i.endswith(("-mem-0", "-mem-1")) or "00000001" in i]
    # card 0: 14 listed by the kubelet, but arbiterd says 12 GiB are allocated: room 4
    cs[0] = dataclasses.replace(cs[0], alloc_mem=12 * GIB)
    assert card_of(preferred(MEM, 4, available, [], cs, "binpack")) == {0}
    assert card_of(preferred(MEM, 5, available, [], cs, "binpack")) == {1}


def test_the_paired_card_wins_when_it_has_room() -> None:
    cs = cards(16, 16)
    cs[0] = dataclasses.replace(cs[0], alloc_core=50)
    assert card_of(preferred(CORE, 30, all_ids(cs, CORE), [], cs, "binpack")) == {0}
    assert card_of(preferred(CORE, 30, all_ids(cs, CORE), [], cs, "binpack", hint=1)) == {1}
    assert card_of(preferred(CORE, 60, all_ids(cs, CORE), [], cs, "binpack", hint=0)) == {1}  # no room: ignored


def test_memory_that_fits_no_card_spans_the_fewest_cards() -> None:
    cs = cards(16, 16, 16)
    cs = [dataclasses.replace(c, alloc_mem=a * GIB) for c, a in zip(cs, [12, 6, 9], strict=True)]  # free 4, 10, 7
    ids = preferred(MEM, 15, all_ids(cs, MEM), [], cs, "binpack")
    assert len(ids) == 15 and card_of(ids) == {1, 2}
    assert plan_allocation(MEM, ids, cs).units == (10, 5)
    assert preferred(MEM, 22, all_ids(cs, MEM), [], cs, "binpack") == []  # 21 free in all


def test_a_core_percentage_never_spans_cards() -> None:
    cs = [dataclasses.replace(c, alloc_core=60) for c in cards(16, 16)]
    assert preferred(CORE, 50, all_ids(cs, CORE), [], cs, "binpack") == []


def test_must_include_devices_are_kept_and_completed_on_their_card() -> None:
    cs = cards(16, 16)
    reused = device_ids(cs[1].uuid, cs[1].total_mem, MEM)[:2]
    ids = preferred(MEM, 4, [i for i in all_ids(cs, MEM) if i not in reused], reused, cs, "binpack")
    assert ids[:2] == reused and card_of(ids) == {1} and len(set(ids)) == 4


def test_unknown_ids_in_the_available_list_are_ignored() -> None:
    cs = cards(16)
    ids = preferred(MEM, 2, ["junk", "GPU-gone-mem-0", *all_ids(cs, CORE), *all_ids(cs, MEM)], [], cs)
    assert card_of(ids) == {0} and all("-mem-" in i for i in ids)


# ------------------------------------------------------------------ refusals in Allocate


def test_a_core_request_not_a_multiple_of_5_is_refused() -> None:
    cs = cards(16)
    with pytest.raises(Refusal, match=r"gpu-core.percentage: 33 is not a multiple of 5"):
        plan_allocation(CORE, all_ids(cs, CORE)[:33], cs)


def test_memory_split_across_cards_is_refused_when_one_card_has_room() -> None:
    cs = cards(16, 16)
    ids = all_ids(cs, MEM)
    with pytest.raises(Refusal, match=r"4 GiB split over GPUs 0, 1 although GPU 0 has room for all of it"):
        plan_allocation(MEM, ids[:2] + ids[16:18], cs)


def test_a_core_percentage_split_across_cards_is_refused() -> None:
    cs = cards(16, 16)
    ids = all_ids(cs, CORE)
    with pytest.raises(Refusal, match=r"30 percent split over GPUs 0, 1; a core percentage comes from one GPU"):
        plan_allocation(CORE, ids[:15] + ids[100:115], cs)


def test_memory_spanning_more_cards_than_needed_is_refused() -> None:
    cs = [dataclasses.replace(c, alloc_mem=10 * GIB) for c in cards(16, 16, 16)]  # 6 free on each
    ids = [i for c in cs for i in device_ids(c.uuid, c.total_mem, MEM)[10:14]]  # 4 + 4 + 4
    with pytest.raises(Refusal, match=r"12 GiB split over 3 GPUs \(0, 1, 2\) where 2 suffice"):
        plan_allocation(MEM, ids, cs)


def test_an_allocation_that_would_overcommit_the_card_is_refused() -> None:
    cs = [dataclasses.replace(cards(16)[0], alloc_mem=14 * GIB, alloc_core=80)]
    with pytest.raises(Refusal, match=r"4 GiB on GPU 0 .* would overcommit it: only 2 GiB are not allocated"):
        plan_allocation(MEM, all_ids(cs, MEM)[:4], cs)
    with pytest.raises(Refusal, match=r"25 % on GPU 0 .* would overcommit it: only 20 % are not allocated"):
        plan_allocation(CORE, all_ids(cs, CORE)[:25], cs)


@pytest.mark.parametrize(("ids", "message"), [
    ([], "no devices in the request"),
    (["nonsense"], "is not a cgpu device ID"),
    ([f"{sim_uuid(0)}-core-1"], "belongs to aliyun.com/gpu-core.percentage"),
    ([f"{sim_uuid(5)}-mem-1"], "names GPU GPU-fa4e0000-0000-0000-0000-000000000005.*which arbiterd does not report"),
    ([f"{sim_uuid(0)}-mem-16"], "past the last unit of GPU 0"),
    ([f"{sim_uuid(0)}-mem-1", f"{sim_uuid(0)}-mem-1"], "names a device twice"),
])
def test_malformed_requests_are_refused_with_a_reason(ids: list[str], message: str) -> None:
    with pytest.raises(Refusal, match=message):
        plan_allocation(MEM, ids, cards(16))


def test_a_good_request_becomes_a_plan() -> None:
    cs = cards(16, 16)
    plan = plan_allocation(CORE, all_ids(cs, CORE)[100:130], cs)
    assert plan == Plan(CORE, (cs[1],), (30,), tuple(all_ids(cs, CORE)[100:130]))
    assert plan.describe() == f"30 % on GPU 1 ({sim_uuid(1)})"


def test_min_cards() -> None:
    assert min_cards(15, [4, 10, 7]) == 2
    assert min_cards(4, [4, 10, 7]) == 1
    assert min_cards(22, [4, 10, 7]) == 4


def test_cards_with_room_for_the_other_resource_come_first() -> None:
    """GPU 0 is fuller in memory but has no core left: a container's core (asked next) could not join it."""
    cs = cards(16, 16)
    cs[0] = dataclasses.replace(cs[0], alloc_mem=8 * GIB, alloc_core=100)
    cs[1] = dataclasses.replace(cs[1], alloc_mem=4 * GIB)
    assert card_of(preferred(MEM, 4, all_ids(cs, MEM), [], cs, "binpack")) == {1}
    cs[0] = dataclasses.replace(cs[0], alloc_core=70)  # 30 % core free >= the 25 % of memory asked
    assert card_of(preferred(MEM, 4, all_ids(cs, MEM), [], cs, "binpack")) == {0}
