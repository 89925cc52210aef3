"""The hub is the one door into the core: a request goes in as a message and comes back as replies and effects,
each effect becomes its wire message for the right peer, and the core's timer stays armed."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

import cgpu_protocol as p
from arbiterd.core.effects import GrantLease, RevokeLease
from arbiterd.core.errors import ConflictError, SettingError
from arbiterd.server import identity
from arbiterd.server.hub import NO_TIMER, Hub
from arbiterd.server.metrics import ArbiterCollector


class Peer:
    def __init__(self, cid: int = 0) -> None:
        self.cid, self.pid, self.uid = cid, 1000 + cid, 0
        self.peer = identity.Peer(self.pid, 0)
        self.instance: str | None = None
        self.sent: list[p.Message] = []

    def send(self, msg: p.Message) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        pass


def client(hub: Hub, name: str, gpu: int) -> Peer:
    """A connection registered as ``name`` on ``gpu``, through the door."""
    peer = Peer()
    peer.cid = hub.attach(peer)
    hub.serve(peer, p.Register(1, name, [gpu]), time.monotonic_ns())
    assert [m.OP for m in peer.sent] == ["registered"] and peer.instance == name
    peer.sent.clear()
    return peer


def test_effects_become_messages_for_their_peer(hub: Hub) -> None:
    async def go() -> tuple[Peer, Peer]:
        a, b = Peer(1), Peer(2)
        hub.peers.update({1: a, 2: b})
        hub.apply([GrantLease(1, 0, 7, 123, 50_000), RevokeLease(2, 0, 8, "highprio"), GrantLease(3, 0, 9, 1, 0)])
        await asyncio.sleep(0)
        return a, b

    a, b = asyncio.run(go())
    assert a.sent == [p.Grant(0, 7, 123)]
    assert b.sent == [p.Revoke(0, 8, "highprio")]
    assert hub.counters.grants_sent == 1 and hub.counters.revokes_sent == 1


def test_a_request_comes_back_as_replies_effects_and_the_gpu_whose_timer_they_move(hub: Hub) -> None:
    async def go() -> None:
        now = time.monotonic_ns()
        hub.admin_write("inst_ctl", "create x gpu=0 memsize=1GiB")
        peer = client(hub, "x", 0)
        replies, effects, gpu = hub.handle(peer, p.Acquire(0), now)
        assert (list(replies), gpu) == ([], 0) and [type(e) for e in effects] == [GrantLease]
        assert peer.sent == []  # handle decides, and sends nothing
        hub.deliver(peer, (replies, effects, gpu))
        assert [m.OP for m in peer.sent] == ["grant"]
        lease = effects[0].lease
        replies, effects, gpu = hub.handle(peer, p.MemReserve(5, 0, 2**29), now)
        assert replies == (p.Ok(5, 2**29, 2**30),) and effects == [] and gpu == NO_TIMER
        replies, _, _ = hub.handle(peer, p.MemReserve(6, 0, 2**30), now)
        assert [type(r) for r in replies] == [p.Denied]
        replies, effects, _ = hub.handle(peer, p.Release(0, lease, 1_000, id=7), now + 1)
        assert replies == (p.Ok(7),) and effects == []
        with pytest.raises(p.ProtocolError):
            hub.handle(peer, p.Hello([1], "test"), now)
        hub.stop_timer()

    asyncio.run(go())


def test_a_detached_peer_drops_its_lease_and_the_next_waiter_is_granted(hub: Hub) -> None:
    async def go() -> Peer:
        now = time.monotonic_ns()
        hub.admin_write("inst_ctl", "create x gpu=0")
        hub.admin_write("inst_ctl", "create y gpu=0")
        first, second = client(hub, "x", 0), client(hub, "y", 0)
        hub.serve(first, p.Acquire(0), now)
        hub.serve(second, p.Acquire(0), now)
        hub.detach(first.cid)
        await asyncio.sleep(0)
        return second

    second = asyncio.run(go())
    assert [m.OP for m in second.sent] == ["grant"]


def test_an_admin_write_is_checked_before_anything_changes(hub: Hub) -> None:
    """A refused write changes nothing, the state file included; an accepted one is saved."""
    hub.admin_write("inst_ctl", "create x gpu=0 weight=4")
    saved = hub.store.path.read_text()
    for path, value, error in (("0/max_inst", "3", ConflictError), ("inst_ctl", "create y gpu=0,1 memsize=-1",
                                                                      SettingError),
                               ("inst_ctl", "create y gpu=0 weight=13", ConflictError)):
        with pytest.raises(error):
            hub.admin_write(path, value)
        assert hub.store.path.read_text() == saved
    assert [r for r in hub.read("inst_ctl").splitlines()] == ["x gpu=0 weight=4 highprio=0 memsize=0"]
    assert hub.read("1").split().count("y") == 0 and hub.read("0/max_inst") == "16\n"


def test_a_write_the_state_dir_cannot_take_changes_nothing(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state directory is tried before the core changes (a full disk, a read-only mount): if it cannot take
    a write, the admin write is refused with the OSError and the setting stays."""

    def full(size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub.store, "check_writable", full)
    with pytest.raises(OSError):
        hub.admin_write("0/policy", "4")
    assert hub.read("0/policy") == "1\n" and not hub.store.path.exists()


def test_the_state_dir_probe_leaves_nothing_behind(hub: Hub) -> None:
    hub.store.check_writable(1 << 20)
    assert list(hub.store.dir.iterdir()) == []


def test_the_timer_stays_at_or_before_every_gpus_next_wakeup_and_moves_only_earlier(hub: Hub) -> None:
    """After an acquire or release only that GPU's wakeup is asked again: a later one keeps the armed timer
    (an early tick is harmless), an earlier one on another GPU moves it, and a tick re-arms from all GPUs."""

    async def go() -> None:
        now = time.monotonic_ns()
        arb = hub.arbiter
        hub.admin_write("1/overrun_ms", "10")  # GPU 1's lease is cut off first
        for name, gpu in (("long", 0), ("short", 1)):
            hub.admin_write("inst_ctl", f"create {name} gpu={gpu}")
        long, short = client(hub, "long", 0), client(hub, "short", 1)
        hub.serve(long, p.Acquire(0), now)
        assert hub._timer_at == arb.next_wakeup() == arb.scheds[0].next_wakeup()
        hub.serve(short, p.Acquire(1), now)  # GPU 1's lease ends first: the timer comes forward
        assert hub._timer_at == arb.scheds[1].next_wakeup() < arb.scheds[0].next_wakeup()
        (grant,) = short.sent
        assert isinstance(grant, p.Grant)
        armed = hub._timer_at
        hub.serve(short, p.Release(1, grant.lease, 1_000), now + 1)  # GPU 1 has nothing due now: the early timer stays
        assert hub._timer_at == armed and arb.scheds[1].next_wakeup() is None
        hub._on_timer()  # the early tick: nothing to do, and the timer follows GPU 0 again
        assert hub._timer_at == arb.next_wakeup() == arb.scheds[0].next_wakeup()
        hub.stop_timer()

    asyncio.run(go())


def test_a_release_on_the_native_policy_leaves_the_timer_and_it_stays_in_time(hub: Hub) -> None:
    """Under policy 5 a release that grants nothing only ends a lease, so the hub does not ask the scheduler
    again: the armed timer stays, and is still at or before the next cutoff (the first lease's)."""

    async def go() -> None:
        now = time.monotonic_ns()
        arb = hub.arbiter
        hub.admin_write("0/policy", "5")
        hub.admin_write("inst_ctl", "create x gpu=0")
        peers = [client(hub, "x", 0) for _ in range(3)]
        for k, peer in enumerate(peers):
            hub.serve(peer, p.Acquire(0), now + k)
        armed = hub._timer_at
        assert armed == arb.scheds[0].next_wakeup()  # the first lease's cutoff
        for k, peer in enumerate(peers):
            (grant,) = peer.sent
            assert isinstance(grant, p.Grant)
            _, effects, gpu = hub.handle(peer, p.Release(0, grant.lease, 1_000), now + 10 + k)
            assert effects == [] and gpu == NO_TIMER
            hub.deliver(peer, ([], effects, gpu))
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
        hub.admin_write("inst_ctl", "create a gpu=1")
        hub.admin_write("inst_ctl", "create b gpu=1")
        a, b = client(hub, "a", 1), client(hub, "b", 1)
        hub.serve(a, p.Acquire(1), now)
        (grant,) = a.sent
        assert isinstance(grant, p.Grant)
        hub.serve(b, p.Acquire(1), now + 1)
        armed = hub._timer_at
        assert armed is not None
        outcome = hub.handle(a, p.Release(1, grant.lease, 1_000), now + 2)
        due = arb.scheds[1].next_wakeup()
        assert outcome[1] == [] and due is not None and due < armed  # nothing granted, the wakeup earlier...
        hub.deliver(a, outcome)
        assert hub._timer_at == due  # ...and the timer followed it
        hub.stop_timer()

    asyncio.run(go())


def test_the_round_in_force_is_in_the_status(hub: Hub) -> None:
    """The round is sized at each turn from the instances that take turns: one asking at first (a 50 ms round of
    50 ms slices), then four once the holder asks again with the others waiting. (How latency_target_ms cuts
    it is tests/core/test_round.py's, on the virtual clock.)"""
    async def go() -> list[float]:
        now = time.monotonic_ns()
        hub.admin_write("0/policy", "4")
        hub.admin_write("0/slice_min_ms", "50")  # no hand-over measured yet: auto picks slice_min_ms
        peers = [client(hub, f"i{k}", 0) for k in range(4)]
        for peer in peers:
            hub.serve(peer, p.Acquire(0), now)
        rounds = [hub.status().gpus[0].round_ms]
        holder = next(peer for peer in peers if any(m.OP == "grant" for m in peer.sent))
        lease = next(m for m in holder.sent if isinstance(m, p.Grant)).lease
        hub.serve(holder, p.Release(0, lease, 50_000_000, again=True), now + 50_000_000)
        rounds.append(hub.status().gpus[0].round_ms)
        return rounds

    assert asyncio.run(go()) == [50.0, 200.0]


def test_each_instances_grant_wait_is_in_the_status_and_the_metrics(hub: Hub) -> None:
    """``a`` is granted at once; ``b`` asks 1 ms later and is granted when ``a`` gives its lease back at 50 ms:
    its wait is 49 ms, ``a``'s 0, and an instance granted nothing in the window has none."""
    async def go() -> None:
        now = time.monotonic_ns()
        hub.admin_write("inst_ctl", "create a gpu=0")
        hub.admin_write("inst_ctl", "create b gpu=0")
        hub.admin_write("inst_ctl", "create c gpu=0")
        a, b = client(hub, "a", 0), client(hub, "b", 0)
        hub.serve(a, p.Acquire(0), now)
        grant = next(m for m in a.sent if isinstance(m, p.Grant))
        hub.serve(b, p.Acquire(0), now + 1_000_000)
        hub.serve(a, p.Release(0, grant.lease, 49_000_000), now + 50_000_000)
        assert any(isinstance(m, p.Grant) for m in b.sent)
        hub.stop_timer()

    asyncio.run(go())
    waits = {i.id: (i.wait_p50_ms, i.wait_p99_ms) for i in hub.status().gpus[0].instances}
    assert waits == {"a": (0.0, 0.0), "b": (49.0, 49.0), "c": (None, None)}
    reg = CollectorRegistry()
    reg.register(ArbiterCollector(hub))
    sample = reg.get_sample_value
    gpu = {"gpu": "0", "UUID": hub.gpus[0].uuid, "modelName": hub.gpus[0].name, "namespace": "", "pod": "",
           "container": ""}
    assert sample("cgpu_instance_grant_wait_p99_seconds", {**gpu, "instance": "b"}) == 0.049
    assert sample("cgpu_instance_grant_wait_p50_seconds", {**gpu, "instance": "c"}) is None
