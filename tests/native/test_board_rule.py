"""The board's catch-up rule past a gang turn's deadline (behaviour §11, "Where a turn stops"; shim.h,
cgpu_board_holds_stop), for launches of several collectives at once (a CUDA graph's replay) as for one.

A rank that has launched ``launched`` collectives and makes a launch holding ``n`` goes on past the deadline when that
launch holds the turn's ``stop``-th collective; a launch of none (a kernel that is no collective) goes on when the
next collective is the stop (it leads to it). One collective at a time, that is the rule the board had before graphs
counted: ``stop == launched + 1``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from libcgpu_client.native import build as nb
from tests.native.conftest import PROGS

CASES = [
    # launched, n, stop, goes on: why
    (4, 1, 5, 1),  # the stop is this kernel's collective
    (4, 1, 4, 0),  # already at the stop
    (4, 1, 6, 0),  # two short: counts that no longer correspond to the peers'
    (4, 0, 5, 1),  # a plain kernel before the stop's collective
    (4, 0, 4, 0),  # a plain kernel after it
    (4, 0, 6, 0),
    (4, 3, 5, 1),  # a replay of three collectives holding the stop: the first of them
    (4, 3, 6, 1),  # the second
    (4, 3, 7, 1),  # the last
    (4, 3, 4, 0),  # the replay starts past the stop
    (4, 3, 8, 0),  # the stop lies past this replay: further behind
    (0, 2, 1, 1),  # the first replay of a turn
    (0, 2, 0, 0),  # a stop of none: nobody launched a collective in the turn
    (2**40, 2, 2**40 + 2, 1),  # large counts
]


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the C parts")
    return nb.build_program([PROGS / "board_rule.c"], tmp_path_factory.mktemp("rule") / "board_rule")


def _ask(rule: Path, cases: list[tuple[int, int, int]]) -> list[int]:
    text = "".join(f"{a} {n} {s}\n" for a, n, s in cases)
    out = subprocess.run([str(rule)], input=text, capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def test_a_launch_goes_on_while_it_holds_the_stop(rule: Path) -> None:
    assert _ask(rule, [c[:3] for c in CASES]) == [c[3] for c in CASES]


def test_one_collective_keeps_the_rule_it_had(rule: Path) -> None:
    grid = [(a, 1, s) for a in range(6) for s in range(8)]
    assert _ask(rule, grid) == [int(s == a + 1) for a, _, s in grid]
