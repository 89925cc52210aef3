"""The hub turns every effect into its wire message, for the right peer, and counts it."""

from __future__ import annotations

import asyncio
import time

import cgpu_protocol as p
from arbiterd.core.effects import Grant, Revoke
from arbiterd.core.settings import InstanceSettings
from arbiterd.server import identity
from arbiterd.server.hub import Hub


class Peer:
    def __init__(self, cid: int) -> None:
        self.cid, self.pid = cid, 1000 + cid
        self.peer = identity.Peer(self.pid, 0)
        self.instance: str | None = None
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


def _client(hub: Hub, name: str, gpu: int, now: int) -> Peer:
    peer = Peer(0)
    peer.cid = hub.attach(peer)
    hub.arbiter.connect(peer.cid, peer.pid, 0)
    hub.arbiter.register(peer.cid, name, [gpu], {}, now)
    return peer


def test_a_release_on_the_native_policy_leaves_the_timer_and_it_stays_in_time(hub: Hub) -> None:
    """Under policy 5 a release that grants nothing only ends a lease, so the hub does not ask the scheduler
    again: the armed timer stays, and is still at or before the next cutoff (the first lease's)."""

    async def go() -> None:
        now = time.monotonic_ns()
        arb = hub.arbiter
        hub.admin_write("0/policy", "5")
        arb.provision("x", [0], InstanceSettings(), now)
        peers = [_client(hub, "x", 0, now) for _ in range(3)]
        grants = []
        for k, peer in enumerate(peers):
            (g,) = arb.acquire(peer.cid, 0, now + k)
            hub.apply([g], 0)
            grants.append(g)
        armed = hub._timer_at
        assert armed == arb.scheds[0].next_wakeup()  # the first lease's cutoff
        for k, (peer, g) in enumerate(zip(peers, grants, strict=True)):
            effects, _ = arb.release(peer.cid, 0, g.lease, now + 10 + k)
            hub.released(effects, 0)
            due = arb.scheds[0].next_wakeup()
            assert hub._timer_at == armed and (due is None or armed <= due)
        assert arb.scheds[0].next_wakeup() is None
        hub.stop_timer()

    asyncio.run(go())


def test_a_release_on_a_ring_policy_that_grants_nothing_still_moves_the_timer(hub: Hub) -> None:
    """On policy 2 a release can leave the GPU idle until the end of the holder's turn, before the cutoff
    the timer was armed at: there the scheduler is asked again, and the timer comes forward."""

    async def go() -> None:
        now = time.monotonic_ns()
        arb = hub.arbiter
        hub.admin_write("1/policy", "2")
        arb.provision("a", [1], InstanceSettings(), now)
        arb.provision("b", [1], InstanceSettings(), now)
        a, b = _client(hub, "a", 1, now), _client(hub, "b", 1, now)
        effects = arb.acquire(a.cid, 1, now)
        hub.apply(effects, 1)
        (g,) = [e for e in effects if e.client == a.cid]
        hub.apply(arb.acquire(b.cid, 1, now + 1), 1)
        armed = hub._timer_at
        assert armed is not None
        effects, _ = arb.release(a.cid, 1, g.lease, now + 2)
        due = arb.scheds[1].next_wakeup()
        assert effects == [] and due is not None and due < armed  # the case: nothing granted, the wakeup earlier...
        hub.released(effects, 1)
        assert hub._timer_at == due  # ...and the timer followed it
        hub.stop_timer()

    asyncio.run(go())
