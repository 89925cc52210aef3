"""Effects are values: equal by their fields and hashable, as the type checker takes them to be."""

from __future__ import annotations

from arbiterd.core.effects import GrantLease, RevokeLease
from arbiterd.core.model import Bill


def test_effects_and_bills_are_equal_and_hash_by_their_fields() -> None:
    for make in (lambda: GrantLease(1, 0, 7, 10, 0), lambda: RevokeLease(1, 0, 7, "turn"), lambda: Bill(5, 4, 0, 9)):
        a, b = make(), make()
        assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert GrantLease(1, 0, 7, 10, 0) != GrantLease(1, 0, 8, 10, 0)
