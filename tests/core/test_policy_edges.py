"""Policy switches, hung holders, lease extension and native leases, on the virtual clock.

The edges of behaviour §3 and §4 that the policy table itself does not show:
what a switch of policy revokes and bills, when a lone holder's lease is
extended, what a stalled or hung holder costs the others.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S, Effect, GrantLease, RevokeLease
from arbiterd.core.policies.native import Native
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings
from cgpu_testing.sim import SimInstance, Simulation, bursty, busy
from cgpu_testing.sim import simulate as run

TOL = 0.5  # percentage points


def test_weight_zero_instance_gets_nothing() -> None:
    res = run(4, [SimInstance("A", 1), SimInstance("Z", 0)])
    assert res.pct("Z") == 0
    assert res.pct("A") == pytest.approx(100, abs=TOL)


def test_hung_holder_is_cut_off_after_overrun_bound_and_counted() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=1, slice_ms=5, overrun_ms=50))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    sched.acquire("A", 1, 0)
    (g,) = sched.acquire("B", 2, 0)  # B waits: A's extended lease is cut back to its 5 ms turn
    assert g.client == 1 and g.deadline_ns == 5 * NS_PER_MS
    assert sched.next_wakeup() == g.deadline_ns + 50 * NS_PER_MS
    effects = sched.tick(g.deadline_ns + 50 * NS_PER_MS)
    assert effects[0] == RevokeLease(1, 0, g.lease, "overrun")
    assert isinstance(effects[1], GrantLease) and effects[1].client == 2
    assert sched.stats.overruns == 1
    assert sched.held_ns("A", 10**9) == g.deadline_ns + 50 * NS_PER_MS  # charged up to the cut-off


def test_policy_change_revokes_and_never_leaves_two_holders() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=1))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    (g,) = sched.acquire("A", 1, 0)
    sched.acquire("B", 2, 0)
    effects = sched.set_policy(4, NS_PER_MS)
    assert effects == [RevokeLease(1, 0, g.lease, "policy")]
    assert len(sched.holders()) == 1
    effects, _ = sched.release(1, g.lease, 2 * NS_PER_MS)
    assert isinstance(effects[0], GrantLease) and effects[0].client == 2


def test_switch_from_native_waits_for_every_holder() -> None:
    sched = GpuScheduler(0, GpuSettings(policy=5))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    ga, = sched.acquire("A", 1, 0)
    gb, = sched.acquire("B", 2, 0)
    revokes = sched.set_policy(1, NS_PER_MS)
    assert {r.client for r in revokes} == {1, 2}
    assert sched.acquire("A", 3, NS_PER_MS) == []  # waits until both native leases are back
    sched.release(1, ga.lease, 2 * NS_PER_MS)
    effects, _ = sched.release(2, gb.lease, 3 * NS_PER_MS)
    assert [e.client for e in effects] == [3]


def test_native_wakeup_is_the_first_lease_to_end_revoked_ones_included() -> None:
    """Native leases end in the order granted, so next_wakeup reads the first; a revoked one (a policy switch)
    ends at its revoke plus overrun_ms, and once every revoked one is back the first is read again."""
    sched = GpuScheduler(0, GpuSettings(policy=5, overrun_ms=30))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    over = 30 * NS_PER_MS
    ga, = sched.acquire("A", 1, 0)
    gb, = sched.acquire("B", 2, 5 * NS_PER_MS)
    assert sched.next_wakeup() == ga.deadline_ns + over
    sched.release(1, ga.lease, 6 * NS_PER_MS)
    assert sched.next_wakeup() == gb.deadline_ns + over  # the next one in grant order
    ga, = sched.acquire("A", 1, 7 * NS_PER_MS)
    native = sched.policy
    assert isinstance(native, Native)
    sched.set_policy(1, 8 * NS_PER_MS)  # both revoked: each must be back by 8 ms plus overrun_ms
    assert sched.rq.draining == [native] and native.revokes == 2
    assert sched.next_wakeup() == 8 * NS_PER_MS + over
    sched.release(2, gb.lease, 9 * NS_PER_MS)
    sched.release(1, ga.lease, 10 * NS_PER_MS)
    assert (native.leases, native.revokes, sched.rq.draining) == ({}, 0, [])
    sched.set_policy(5, 11 * NS_PER_MS)
    gb, = sched.acquire("B", 2, 12 * NS_PER_MS)
    assert sched.next_wakeup() == gb.deadline_ns + over


def test_handoff_transit_is_charged_to_nobody_and_a_liar_gains_little() -> None:
    """Honest clients report 0.2 ms of transit per lease; a liar claiming 4 ms is discounted no more than the
    median plus three interquartile ranges (0 here) plus 0.1 ms."""
    sched = GpuScheduler(0, GpuSettings(policy=1, slice_ms=5))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("L", 1, False, 0)
    now = 0
    for _ in range(20):  # honest: held 5.2 ms, used 5.0 ms
        (g,) = sched.acquire("A", 1, now)
        now += 5_200_000
        sched.release(1, g.lease, now, used_ns=5_000_000)
    a = sched.instances["A"]
    held_before, useful_before = a.held_ns, a.useful_ns
    (g,) = sched.acquire("A", 1, now)
    sched.release(1, g.lease, now + 5_200_000, used_ns=5_000_000)
    assert a.useful_ns - useful_before == 5_000_000  # the 0.2 ms transit is not billed ...
    assert a.held_ns - held_before == 5_200_000  # ... though it was held
    now += 5_200_000
    (g,) = sched.acquire("L", 2, now)
    sched.release(2, g.lease, now + 5_200_000, used_ns=1_200_000)  # claims 4 ms of transit
    assert sched.handover.median == 200_000
    assert sched.instances["L"].useful_ns == 5_200_000 - 300_000


def test_policy_switch_restarts_fairness() -> None:
    """Equal time under the ring (policy 0) must not turn into a catch-up burst under policy 2."""
    sim = Simulation(GpuSettings(policy=0, max_inst=4), [SimInstance("A", 1), SimInstance("B", 2)])
    sim.run(4 * NS_PER_S)
    sched = sim.sched
    sched.set_policy(2, sim.now)
    before = {n: sched.held_ns(n, sim.now) for n in "AB"}
    sim.run(9 * NS_PER_S)  # goes on from 4 s on the same virtual clock
    gained = {n: sched.held_ns(n, sim.now) - before[n] for n in "AB"}
    assert gained["B"] / gained["A"] == pytest.approx(2.0, rel=0.01)


def test_policy_switch_does_not_charge_an_extended_lease_under_the_new_policy() -> None:
    """B alone on policy 1 holds one extended lease; A comes back and policy 2 comes at 650 ms.

    A's return revokes B's lease, and the switch lands before B's op (3 ms) ends. The 651 ms
    B held under policy 1 is void like the rest of the old fairness: from then on turns
    alternate A (100 ms), B (200 ms). Charged at B's release under policy 2 it gave A three
    extra turns in a row (seen in bench.resnet50, which switches policy while both run).
    """
    on_after_650ms = bursty(3.0, on_ms=100_000, off_ms=650, phase_ms=100_000)
    sim = Simulation(GpuSettings(policy=1, slice_ms=100),
                     [SimInstance("A", 1, workload=on_after_650ms), SimInstance("B", 2, workload=busy(3.0))],
                     trace=True)
    sched = sim.sched
    sim.apply(sched.set_policy(1, 0))  # B's weight 2 made it 2 when B joined (behaviour §3)
    sim.run(650 * NS_PER_MS)  # A is waiting, B's lease is revoked, its op runs until 651 ms
    assert [what for _, name, what in sim.events] == ["grant"] and sched.held_ns("B", sim.now) == 650 * NS_PER_MS
    sim.apply(sched.set_policy(2, sim.now))
    sim.run(651 * NS_PER_MS + 2_100 * NS_PER_MS)  # 7 rounds of 300 ms
    turns = [name for _, name, what in sim.events if what == "grant"]
    assert turns[1:9] == ["A", "B"] * 4
    assert sched.instances["A"].held_ns == pytest.approx(700 * NS_PER_MS, abs=3 * NS_PER_MS)


def test_lone_holder_lease_is_extended_until_someone_waits() -> None:
    """Policies 1/4: no renewals while alone; a newcomer gets the GPU after the holder's nominal turn."""
    sched = GpuScheduler(0, GpuSettings(policy=4, slice_ms=5))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    (g,) = sched.acquire("A", 1, 0)
    assert g.deadline_ns >= NS_PER_S
    assert sched.acquire("B", 2, 2 * NS_PER_MS) == [GrantLease(1, 0, g.lease, 5 * NS_PER_MS, 0)]  # shortened
    (g2,) = sched.acquire("A", 3, 3 * NS_PER_MS)  # another client of A joins the shortened lease
    assert g2.deadline_ns == 5 * NS_PER_MS
    # past the nominal turn, a newcomer makes the holder yield at once
    sched2 = GpuScheduler(0, GpuSettings(policy=1, slice_ms=5))
    sched2.add_instance("A", 1, False, 0)
    sched2.add_instance("B", 1, False, 0)
    (g,) = sched2.acquire("A", 1, 0)
    assert sched2.acquire("B", 2, 400 * NS_PER_MS) == [RevokeLease(1, 0, g.lease, "turn")]
    effects, _ = sched2.release(1, g.lease, 401 * NS_PER_MS)
    assert [e.client for e in effects] == [2]


@pytest.mark.parametrize("policy", [1, 4])
def test_a_lone_high_priority_instance_renews_no_more_often_than_a_normal_one(policy: int) -> None:
    """Alone on a work-conserving policy, the time a high-priority instance takes past its credit is leftover
    time, extended as any lone holder's is: it renews about once a second, not once a slice (each renewal costs
    the tenant a round trip and a warm-up; it used to renew every 6 ms here). A newcomer still gets the GPU
    after the holder's nominal turn."""
    counts = {}
    for hp in (True, False):
        sim = Simulation(GpuSettings(policy=policy, slice_ms=5, prio_ratio=60), [SimInstance("H", highprio=hp)])
        res = sim.run(10 * NS_PER_S)
        assert res.pct("H") == pytest.approx(100, abs=TOL)
        counts[hp] = res.instances["H"].grants
    assert counts[False] <= 11 and counts[True] <= 2 * counts[False]
    sched = GpuScheduler(0, GpuSettings(policy=policy, slice_ms=5, prio_ratio=60))
    sched.add_instance("H", 1, True, 0)
    sched.add_instance("N", 1, False, 0)
    (g,) = sched.acquire("H", 1, 0)  # its credit-paid turn first: two turns of 1.5 slices banked
    assert g.deadline_ns == 15 * NS_PER_MS
    (g,) = sched.release(1, g.lease, 15 * NS_PER_MS, again=True)[0]  # then leftover time, extended
    assert g.deadline_ns >= NS_PER_S
    assert sched.acquire("N", 2, 17 * NS_PER_MS) == [GrantLease(1, 0, g.lease, 20 * NS_PER_MS, 0)]  # cut to its turn


def test_high_priority_leftover_time_is_not_extended_while_another_high_priority_instance_waits() -> None:
    """On leftover time two high-priority instances take turns of a slice, as two normal ones would: the holder's
    lease is extended only while nobody at all waits."""
    sched = GpuScheduler(0, GpuSettings(policy=1, slice_ms=5, prio_ratio=20))
    for name, hp in (("H1", True), ("H2", True), ("N", False)):
        sched.add_instance(name, 1, hp, 0)
    (g,) = sched.acquire("H1", 1, 0)  # its credit-paid turn
    sched.acquire("H2", 2, NS_PER_MS)
    (g2,) = sched.release(1, g.lease, 10 * NS_PER_MS, again=True)[0]  # out of credit: leftover time, to H2
    assert g2.client == 2 and g2.deadline_ns == 15 * NS_PER_MS


def test_a_stall_costs_at_most_twenty_slices_of_skipped_turns() -> None:
    """A holder that answers 3 s late is charged for it, but repays at most 20 slices by skipping."""
    sched = GpuScheduler(0, GpuSettings(policy=1, slice_ms=5, overrun_ms=10_000))
    for name in "AB":
        sched.add_instance(name, 1, False, 0)
    sched.acquire("A", 1, 0)
    (g,) = sched.acquire("B", 2, 0)  # cuts A's extended lease back to 5 ms
    sched.release(1, g.lease, 3 * NS_PER_S, again=True)  # A answers 3 s late
    assert sched.instances["A"].debt_ns == 20 * 5 * NS_PER_MS
    assert sched.held_ns("A", 3 * NS_PER_S) == 3 * NS_PER_S


@pytest.mark.parametrize("policy", [2, 4])
def test_late_registration_after_a_long_extended_lease_keeps_exact_shares(policy: int) -> None:
    """B (weight 2) runs alone on an extended lease for 300 ms, then A registers: 1:2 from then on.

    (The simulator registers everyone at once; this is the order real processes start in.)"""
    sched = GpuScheduler(0, GpuSettings(policy=policy, slice_ms=5))
    sched.add_instance("B", 2, False, 0)
    (g,) = sched.acquire("B", 2, 0)
    assert g.deadline_ns >= NS_PER_S  # extended: B is alone
    now = 300 * NS_PER_MS
    effects = sched.add_instance("A", 1, False, now)  # policy 2: a registered member is contention
    effects += sched.acquire("A", 1, now)  # policy 4: a waiting one is
    assert effects == [RevokeLease(2, 0, g.lease, "turn")]
    held = {"A": 0, "B": 0}
    effects, _ = sched.release(2, g.lease, now + NS_PER_MS, again=True)
    now += NS_PER_MS
    # B's turn is over: A goes next, and B is charged the 301 ms it held, not its far deadline
    assert [e.client for e in effects if isinstance(e, GrantLease)] == [1]
    assert sched.held_ns("B", now) == 301 * NS_PER_MS
    start = {n: sched.held_ns(n, now) for n in "AB"}
    for _ in range(600):  # both always busy: each holder runs to its deadline and renews
        grants = [e for e in effects if isinstance(e, GrantLease)]
        assert len(grants) == 1
        gr = grants[0]
        now = max(now, gr.deadline_ns)
        effects, _ = sched.release(gr.client, gr.lease, now, again=True)
    for n in "AB":
        held[n] = sched.held_ns(n, now) - start[n]
    assert held["B"] / held["A"] == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize(("weights", "max_inst"), [((6, 9), 20), ((3,), 10), ((1, 2, 3, 4), 10), ((20,), 20)])
def test_policy3_spreads_each_instances_slots_over_the_ring(weights: tuple[int, ...], max_inst: int) -> None:
    """Weight w owns w slots, never two turns further apart than ceil(max_inst / w) + 1 slots, so
    the cap holds over any few slices; the idle slots are spread the same way."""
    from arbiterd.core.policies.ring import FixedCore

    members = [(SimpleNamespace(name=f"i{n}"), w) for n, w in enumerate(weights)]
    runs = FixedCore.layout(None, members, max_inst - sum(weights))  # type: ignore[arg-type]
    slots = [owner for owner, n in runs for _ in range(n)]
    assert len(slots) == max_inst
    for inst, w in members:
        at = [i for i, owner in enumerate(slots) if owner is inst]
        assert len(at) == w
        gaps = [(b - a) % max_inst or max_inst for a, b in zip(at, at[1:] + at[:1], strict=True)]
        assert max(gaps) <= -(-max_inst // w) + 1, (weights, gaps)


def test_policy3_rebuilds_keep_each_owners_turn() -> None:
    """The ring is rebuilt whenever the slice changes (``slice_ms = auto`` does so as the hand-over moves);
    it goes on from the same turn of the same owner, so 9 and 6 slots of 20 still get 45 % and 30 %."""
    sched = GpuScheduler(0, GpuSettings(policy=3, max_inst=20, slice_ms=5))
    sched.add_instance("A", 9, False, 0)
    sched.add_instance("B", 6, False, 0)
    effects = sched.acquire("A", 1, 0) + sched.acquire("B", 2, 0)
    now, n = 0, 0
    while now < 20 * NS_PER_S:
        grants = [e for e in effects if isinstance(e, GrantLease)]
        if not grants:  # an idle slot: wait for the ring to turn
            now = sched.next_wakeup() or now + NS_PER_MS
            effects = sched.tick(now)
            continue
        (gr,) = grants
        now = max(now, gr.deadline_ns)
        n += 1
        if n % 3 == 0:  # a slice change mid-ring, every third turn
            sched.set_slice_ms(4 + n % 2 * 2, now)
        effects, _ = sched.release(gr.client, gr.lease, now, again=True)
    assert sched.held_ns("A", now) / now * 100 == pytest.approx(45, abs=TOL)
    assert sched.held_ns("B", now) / now * 100 == pytest.approx(30, abs=TOL)


def test_a_native_lease_hands_nothing_over_and_is_billed_what_it_held() -> None:
    """Policy 5 runs every lease beside the others: its transit is not a hand-over, so it neither feeds the
    meter that sizes the slice nor is taken off the tenant's useful time."""
    sched = GpuScheduler(0, GpuSettings(policy=5))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    (ga,) = sched.acquire("A", 1, 0)
    (gb,) = sched.acquire("B", 2, 1_000)  # granted at once, beside A
    sched.release(1, ga.lease, 5_000_000, used_ns=3_000_000, warmup_ns=500_000)
    sched.release(2, gb.lease, 6_000_000, used_ns=4_000_000)
    assert sched.handover.count == 0
    assert sched.instances["A"].useful_ns == sched.instances["A"].held_ns == 5_000_000
    assert sched.instances["B"].useful_ns == sched.instances["B"].held_ns == 5_999_000


def test_high_priority_credit_banked_under_a_native_lease_is_capped_when_the_lease_ends() -> None:
    """The end of every lease accrues high-priority credit, a native one's too: the cap in force until then
    bounds what was banked, so a longer slice set later does not bank the whole stretch under the new cap
    (here it would have let H preempt at once on the switch to policy 2)."""
    ms = NS_PER_MS
    sched = GpuScheduler(0, GpuSettings(policy=5, slice_ms=10), 0)
    ratio = sched.settings.prio_ratio
    sched.add_instance("H", 1, True, 0)
    sched.add_instance("N", 1, False, 0)
    (g,) = sched.acquire("N", 1, 0)
    sched.release(1, g.lease, 500 * ms)
    sched.set_slice_ms(50, 500 * ms + 1)
    sched.set_policy(2, 500 * ms + 2)
    assert sched.hp.credit == (100 - ratio) * 2 * 10 * ms + ratio * 2  # the 10 ms cap, then 2 ns more
    assert sched.acquire("H", 7, 500 * ms + 3) == []


def test_a_renewal_is_billed_its_loss_but_does_not_size_the_slice() -> None:
    """The same instance again at once (alone, renewing) changed no hands: its small loss is not billed, but
    it neither feeds the meter that sizes ``slice_ms = auto`` nor shortens the instance's turns, so a tenant
    alone for a while comes back to contention with the slice that contention had measured."""
    sched = GpuScheduler(0, GpuSettings(policy=2))
    sched.add_instance("A", 1, False, 0)
    sched.add_instance("B", 1, False, 0)
    granted: dict[int, tuple[int, int, int]] = {}  # client -> (lease, granted at, deadline)

    def take(effects: list[Effect], now: int) -> None:
        for e in effects:
            if isinstance(e, GrantLease):
                granted[e.client] = (e.lease, now, e.deadline_ns)

    take(sched.acquire("A", 1, 0) + sched.acquire("B", 2, 0), 0)

    def turn(loss_ns: int) -> int:
        """The holder uses its lease to the deadline and renews; returns when."""
        (client, (lease, at, deadline)), = granted.items()
        del granted[client]
        effects, _ = sched.release(client, lease, deadline, again=True, used_ns=deadline - at, warmup_ns=loss_ns)
        take(effects, deadline)
        return deadline

    for _ in range(40):  # contended: every lease a hand-over costing 2 ms
        now = turn(2_000_000)
    measured, slice_ns, extension = sched.handover.count, sched.slice_ns, sched.instances["A"].extension_ns
    assert measured == 40 and extension > 0 and not any(lease.renewal for lease in sched.holders())
    granted.pop(2, None)
    take(sched.drop_client(2, now) + sched.remove_instance("B", now), now)  # B leaves: A renews alone
    for _ in range(40):
        turn(10_000)
    a = sched.instances["A"]
    assert sched.handover.count == measured + 1  # only A's lease that followed B's was measured
    assert sched.slice_ns == slice_ns and a.extension_ns == extension
    assert a.held_ns - a.useful_ns >= 40 * 10_000  # ... though each renewal's loss was not billed
