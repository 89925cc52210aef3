"""Decisions the core hands back to the I/O shell.

Effects are named tuples: immutable values, and built on every grant, where a
frozen dataclass's field-by-field construction was a measurable cost.
"""

from __future__ import annotations

from typing import NamedTuple

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


class Grant(NamedTuple):
    """Tell ``client`` it holds ``lease`` on ``gpu`` until ``deadline_ns``."""

    client: int
    gpu: int
    lease: int
    deadline_ns: int
    waited_ns: int


class Revoke(NamedTuple):
    """Ask ``client`` to give ``lease`` back at its next operation boundary."""

    client: int
    gpu: int
    lease: int
    reason: str


Effect = Grant | Revoke
