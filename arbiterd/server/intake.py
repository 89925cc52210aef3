"""Fair intake: each tenant's requests get a bounded turn of the event loop, so a flood costs only its sender.

The daemon is one thread. A client that sends requests as fast as it can (on one
connection or on many) would otherwise have whole reads of them handled while
every other client waits. Here each *tenant* (a container, or a host uid) may
have at most ``limit`` requests handled per turn of the loop (a ``stats`` or a
``register`` counts as several); a connection whose tenant has had its turn stops reading
and keeps the rest of its requests, undecoded where they came in bulk, for the
next turn, in a queue served in arrival order. So in one turn each tenant's
cost is bounded however many connections it floods from, and a request of a
quiet tenant waits at most one turn per busy tenant. Alone, a busy tenant is
served turn after turn: nothing is slowed that nobody waits for.

What a request costs to decode counts too: a frame counts as one request more
for every ``BYTES_PER_REQUEST`` bytes it holds (every item decoded takes at
least a byte, so this bounds the items as well), and a client's frames are
capped at what its largest request needs (``MAX_REQUEST``, 8 KiB; maps of 16
keys, arrays of 64 items). So a tenant's turn decodes at most about 16 KiB
however its frames are made: a frame of thousands of empty maps counts as the
dozens of requests it costs, not as one. A tenant whose turn is spent has its
bytes queued undecoded.

Requests are counted, not timed: a count costs the grant path an addition, a
clock read per request far more (every request is cheap but ``stats``, counted
as ``STATS_COST`` and answered from a status at most 100 ms old, and
``register``, counted as ``REGISTER_COST``). The counts are renewed by a
callback at the loop's next turn, scheduled once a tenant has used half its
limit: a client that sends one request at a time (the grant path) schedules
one every 32 requests.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Protocol

LIMIT = 64  # requests one tenant may have handled per turn of the loop: a short turn, so a quiet tenant waits little
BYTES_PER_REQUEST = 256  # a frame counts one request more for each this many bytes (a grant path frame: none more)
STATS_COST = 8  # a stats request counts as this many
REGISTER_COST = 16  # and a register: it may read allocation tokens in the container and try a bind on a copy


class Deferred(Protocol):
    """A connection whose requests wait for the next turn."""

    def resume(self) -> None: ...


class Account:
    """One tenant's count in the current turn; shared by its connections, dropped with the last of them."""

    __slots__ = ("__weakref__", "turn", "used")

    def __init__(self) -> None:
        self.turn = 0
        self.used = 0


class Intake:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.turn = 1  # the loop turns since the counts were last renewed count as one
        self.accounts: weakref.WeakValueDictionary[str, Account] = weakref.WeakValueDictionary()
        self.waiting: deque[Deferred] = deque()
        self.deferrals = 0  # connections put off to a later turn (a counter, for status and tests)
        self._scheduled = False

    def account(self, tenant: str) -> Account:
        """The account of ``tenant`` (its connections hold it)."""
        acct = self.accounts.get(tenant)
        if acct is None:
            acct = self.accounts[tenant] = Account()
        return acct

    def defer(self, conn: Deferred) -> None:
        """``conn``'s tenant has had its turn: serve the rest of ``conn`` in the next one."""
        self.deferrals += 1
        self.waiting.append(conn)
        self.renew_soon()

    def renew_soon(self) -> None:
        """Renew every tenant's count at the loop's next turn (once, however often it is asked)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._renew)

    def _renew(self) -> None:
        self._scheduled = False
        self.turn += 1  # every account is read as empty from now on
        for _ in range(len(self.waiting)):  # those deferred again go to the back, for the turn after
            self.waiting.popleft().resume()
