"""Decisions the core hands back to the I/O shell."""

from __future__ import annotations

from dataclasses import dataclass

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Grant:
    """Tell ``client`` it holds ``lease`` on ``gpu`` until ``deadline_ns``."""

    client: int
    gpu: int
    lease: int
    deadline_ns: int
    waited_ns: int


@dataclass(frozen=True, slots=True)
class Revoke:
    """Ask ``client`` to give ``lease`` back at its next operation boundary."""

    client: int
    gpu: int
    lease: int
    reason: str


Effect = Grant | Revoke
