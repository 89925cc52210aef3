"""The hub turns every effect into its wire message, for the right peer, and counts it."""

from __future__ import annotations

import asyncio
import time

from arbiterd.core.effects import Grant, Revoke
from arbiterd.core.settings import InstanceSettings
from arbiterd.server.hub import Hub
from libcgpu_client import protocol as p


class Peer:
    def __init__(self, cid: int) -> None:
        self.cid, self.pid = cid, 1000 + cid
        self.sent: list[p.Message] = []

    def send(self, msg: p.Message) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        pass


def test_effects_become_messages_for_their_peer(hub: Hub) -> None:
    async def go() -> tuple[Peer, Peer]:
        a, b = Peer(1), Peer(2)
        hub.peers.update({1: a, 2: b})
        hub.apply([Grant(1, 0, 7, 123, 50_000), Revoke(2, 0, 8, "highprio"), Grant(3, 0, 9, 1, 0)])
        await asyncio.sleep(0)
        return a, b

    a, b = asyncio.run(go())
    assert a.sent == [p.Grant(0, 7, 123)]
    assert b.sent == [p.Revoke(0, 8, "highprio")]
    assert hub.counters.grants_sent == 1 and hub.counters.revokes_sent == 1


def test_a_detached_peer_drops_its_lease_and_the_next_waiter_is_granted(hub: Hub) -> None:
    async def go() -> Peer:
        now = time.monotonic_ns()
        arb = hub.arbiter
        arb.provision("x", [0], InstanceSettings(), now)
        arb.provision("y", [0], InstanceSettings(), now)
        first, second = Peer(0), Peer(0)
        for peer, name in ((first, "x"), (second, "y")):
            peer.cid = hub.attach(peer)
            arb.connect(peer.cid, peer.pid, 0)
            arb.register(peer.cid, name, [0], {}, now)
        hub.apply(arb.acquire(first.cid, 0, now))
        hub.apply(arb.acquire(second.cid, 0, now))
        hub.detach(first.cid)
        await asyncio.sleep(0)
        return second

    second = asyncio.run(go())
    assert [m.OP for m in second.sent] == ["grant"]


def test_the_timer_stays_at_or_before_every_gpus_next_wakeup_and_moves_only_earlier(hub: Hub) -> None:
    """After an acquire or release only that GPU's wakeup is asked again: a later one keeps the armed timer
    (an early tick is harmless), an earlier one on another GPU moves it, and a tick re-arms from all GPUs."""

    async def go() -> None:
        now = time.monotonic_ns()
        arb = hub.arbiter
        hub.admin_write("1/overrun_ms", "10")  # GPU 1's lease is cut off first
        peers = []
        for name, gpu in (("long", 0), ("short", 1)):
            arb.provision(name, [gpu], InstanceSettings(), now)
            peer = Peer(0)
            peer.cid = hub.attach(peer)
            arb.connect(peer.cid, peer.pid, 0)
            arb.register(peer.cid, name, [gpu], {}, now)
            peers.append(peer)
        (long_grant,) = arb.acquire(peers[0].cid, 0, now)
        hub.apply([long_grant], 0)
        assert hub._timer_at == arb.next_wakeup() == arb.scheds[0].next_wakeup()
        (short_grant,) = arb.acquire(peers[1].cid, 1, now)
        hub.apply([short_grant], 1)  # GPU 1's lease ends first: the timer comes forward
        assert hub._timer_at == arb.scheds[1].next_wakeup() < arb.scheds[0].next_wakeup()
        effects, _ = arb.release(peers[1].cid, 1, short_grant.lease, now + 1)
        armed = hub._timer_at
        hub.apply(effects, 1)  # GPU 1 has nothing due now: the early timer stays
        assert hub._timer_at == armed and arb.scheds[1].next_wakeup() is None
        hub._on_timer()  # the early tick: nothing to do, and the timer follows GPU 0 again
        assert hub._timer_at == arb.next_wakeup() == arb.scheds[0].next_wakeup()
        hub.stop_timer()

    asyncio.run(go())
