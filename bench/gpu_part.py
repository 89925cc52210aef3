"""What bench.gpu's parts share: a part's record, and the exception that skips it with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Skip(Exception):
    """A part cannot run here: the one-line reason."""


@dataclass
class Part:
    name: str
    status: str = "not run"  # ok | failed | skipped
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
