"""Log lines a client can cause, at most one per tenant and kind every few seconds.

A tenant that is refused, closed or warned about again and again (a flood of
connections, of failed registrations, of bad frames) would otherwise write a
line each time, and fill the disk as fast as it can send. Each such line goes
through :class:`LogRate` under a key (what happened, to whom): the first in a
period is written, the rest are counted, and the next line written says how
many were held back.
"""

from __future__ import annotations

import logging
import time
from typing import Any

PERIOD_S = 10.0
KEYS_MAX = 4096  # past this many keys, those whose period is over are forgotten


class LogRate:
    def __init__(self, logger: logging.Logger, period_s: float = PERIOD_S) -> None:
        self.logger = logger
        self.period_s = period_s
        self.seen: dict[str, tuple[float, int]] = {}  # key -> (when its last line was written, lines held back)

    def log(self, key: str, level: int, msg: str, *args: Any) -> None:
        """Write ``msg % args`` at ``level`` unless a line of ``key`` was written in this period."""
        now = time.monotonic()
        last = self.seen.get(key)
        if last is not None and now - last[0] < self.period_s:
            self.seen[key] = (last[0], last[1] + 1)
            return
        if last is None and len(self.seen) >= KEYS_MAX:
            self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.period_s}
        self.seen[key] = (now, 0)
        if last is not None and last[1]:
            msg += f" ({last[1]} more like it held back in the last {self.period_s:g} s)"
        self.logger.log(level, msg, *args)
