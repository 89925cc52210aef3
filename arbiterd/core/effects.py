"""Decisions the core hands back to the I/O shell.

Effects are values, frozen to the type checker but plain slotted dataclasses at
run time: one is built on every grant, and a frozen dataclass (built field by
field through ``object.__setattr__``) or a named tuple (built through a
Python-level ``__new__``) is slower to build.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@typing.dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """``cls`` as a slotted dataclass, frozen to the type checker (see the module's docstring), and hashable by
    its fields as the type checker takes a frozen one to be."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@value
class GrantLease:
    """Tell ``client`` it holds ``lease`` on ``gpu`` until ``deadline_ns``."""

    client: int
    gpu: int
    lease: int
    deadline_ns: int
    waited_ns: int


@value
class RevokeLease:
    """Ask ``client`` to give ``lease`` back at its next operation boundary."""

    client: int
    gpu: int
    lease: int
    reason: str


Effect = GrantLease | RevokeLease
