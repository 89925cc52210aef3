"""What the blocking and the asyncio client share: who they register as, and what they learn.

Both build their ``hello`` and ``register`` from here, so the two clients
cannot drift apart in what they tell the daemon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from cgpu_protocol import SUPPORTED_VERSIONS, Error, Hello, Register, Registered
from libcgpu_client import __version__


class DaemonError(Exception):
    """The daemon refused a request (its one-line reason)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def of(cls, reply: Error) -> DaemonError:
        return cls(reply.code, reply.message)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What a client asks for when it registers (only a request: see behaviour §6)."""

    instance: str | None
    gpus: tuple[int | str, ...] = (0,)
    weight: int = 1
    highprio: bool = False
    memsize: tuple[int, ...] = ()  # bytes per listed GPU, the last repeating; empty: no limit stated
    core_percent: int = 0  # a GPU-core percentage instead of a weight; 0: none
    limit: int = 0  # the most GPU time (%) it asks to be held to; 0: none stated

    def register(self, rid: int) -> Register:
        return Register(rid, self.instance, list(self.gpus), self.weight, int(self.highprio),
                        list(self.memsize) or None, self.core_percent or None, self.limit or None)


def hello(client: str) -> Hello:
    return Hello(list(SUPPORTED_VERSIONS), f"{client}/{__version__}", os.getpid())


@dataclass(slots=True)
class Registration:
    """The daemon's answer to ``register``: the instance and, per GPU, what it was granted."""

    instance: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, reply: Registered) -> Registration:
        return cls(reply.instance, reply.gpus, reply.warnings)
