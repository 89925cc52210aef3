"""A hostile review of gang leases (behaviour §11) after e8a7a8f (a lone tenant beside a gang holds one extended
lease between the gang's turns; a turn given back early is billed what it held): each test is the reproducer of a
defect the review found, on the virtual clock: those fixed since pass, the others are kept as expected failures
until they are. Each states what it measured on the code it was written against."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from arbiterd.core.effects import NS_PER_MS, Effect, GrantLease
from cgpu_testing.gangdriver import GangDriver
from cgpu_testing.gangsim import SimJob, simulate_gangs
from cgpu_testing.sim import bursty, busy

MS = NS_PER_MS
TOL_PP = 0.5


def _first_grant_wait(arrive_ns: int) -> int | None:
    """J (a gang on GPUs 0 and 1), A alone on GPU 0, B (weight 3) alone on GPU 1, policy 4, 10 ms slices; C (weight
    1, registered on GPU 0 from the start) starts to work at ``arrive_ns``: how long C waits for its first lease
    (None: not in 300 ms)."""
    d = _j_beside_a_and_b()
    d.add("C", 0)
    d.run(arrive_ns)
    d.client("C", 0, 5)
    return _grant_wait(d, "C")


def _j_beside_a_and_b() -> GangDriver:
    """J (a gang on GPUs 0 and 1), A alone on GPU 0, B (weight 3) alone on GPU 1, policy 4, 10 ms slices, each
    working from the start."""
    d = GangDriver({0: 4, 1: 4})
    for g in (0, 1):
        d.add("J", g)
    d.add("A", 0)
    d.add("B", 1, weight=3)
    d.client("J", 0, 1)
    d.client("J", 1, 2)
    d.client("A", 0, 3)
    d.client("B", 1, 4)
    return d


def _grant_wait(d: GangDriver, name: str) -> int | None:
    """How long from now until ``name`` holds GPU 0 (None: not in 300 ms)."""
    t0 = d.now
    while d.now < t0 + 300 * MS:
        d.run(d.now + MS // 10)
        lease = d.scheds[0].rq.lease
        if lease is not None and lease.inst.name == name:
            return d.now - t0
    return None


def test_a_tenant_that_arrives_beside_a_lone_holder_waits_no_more_than_a_round() -> None:
    """J, a gang on GPUs 0 and 1, waits for B's 30 ms turns on GPU 1; A is alone on GPU 0. Armed, J cuts A's
    extended lease back to where J can start: the end of B's turn, up to 20 ms past A's nominal turn (e8a7a8f; before,
    to A's nominal end). C then arrives on GPU 0: a round there is J's, A's and C's turns, 30 ms, and a newcomer
    joins at the tail of the round and waits at most one (policies/vtime.py). But A's lengthened lease has no nominal
    end any more, so C's arrival does not cut it: C waits for the rest of it and for J's turn. Measured over 60
    arrival times 1 ms apart: C waits longer than the round at 19 of them, up to 40 ms; before e8a7a8f, 20 ms at
    most.
    Fixed: the cut-back keeps the lease extended, its nominal end kept, so C's arrival cuts it back to that."""
    waits = [_first_grant_wait((500 + k) * MS) for k in range(60)]
    assert all(w is not None for w in waits)
    round_ns = 3 * 10 * MS  # J, A and C: one 10 ms slice each
    assert max(w for w in waits if w is not None) <= round_ns + MS // 10, [w / MS for w in waits if w is not None]


def _window_0(d: GangDriver) -> list[Effect]:
    """A reload sets gang_window_ms to 0, as Hub.retune does."""
    d.book.set_window(0, d.now)
    return d.book.take()


DISSOLVING: dict[str, Callable[[GangDriver], list[Effect]]] = {
    "gang_window_ms 0": _window_0,
    "policy 2 on GPU 1": lambda d: d.scheds[1].set_policy(2, d.now),
    "a limit on GPU 1": lambda d: d.scheds[1].set_limit("J", 50, d.now),
    "high priority on GPU 1": lambda d: d.scheds[1].set_highprio("J", 1, d.now),
}


def _wait_after_dissolution(at_ns: int, write: str) -> int | None:
    """As in :func:`_first_grant_wait` without C: at ``at_ns`` an operator's ``write`` dissolves J's gang; how long
    J's rank on GPU 0, waiting there then, waits for its first lease as GPU 0's own tenant (None: it did not wait
    then, or not granted in 300 ms)."""
    d = _j_beside_a_and_b()
    d.run(at_ns)
    d.apply(DISSOLVING[write](d))  # the gang is gone by the next sync
    if not d.scheds[0].instances["J"].waiters:
        return None
    return _grant_wait(d, "J")


@pytest.mark.parametrize("write", list(DISSOLVING))
def test_a_dissolved_gangs_waiter_waits_no_more_than_a_turn_for_a_lone_holder(write: str) -> None:
    """As above (J waits for B's 30 ms turns on GPU 1, A alone on GPU 0), and at one of 60 times 1 ms apart an
    operator's write dissolves the gang (each kind test_gang_edges.py checks, on GPU 1), and J's rank on GPU 0, if
    it waits there then, "joins that GPU's own turns" (§11). A has had its turn: J should have GPU 0 when A's turn
    ends, within a turn (10 ms). But A's lease, lengthened by the cut-back to the end of B's turn, runs on to it.
    Measured, after each write: 40 of the 60 times find J waiting, and it waits longer than a turn at 29 of them, up
    to 30 ms; before e8a7a8f, 10 ms at most.
    Fixed: as above, and a write that may dissolve a gang makes every GPU of the book look again at once."""
    waits = [w for k in range(60) if (w := _wait_after_dissolution((500 + k) * MS, write)) is not None]
    assert len(waits) >= 20
    assert max(waits) <= 10 * MS + MS // 10, [w / MS for w in waits]


@pytest.mark.parametrize("weight_b", [3, 5])
def test_a_limited_lone_holder_keeps_its_ceiling_beside_a_gang(weight_b: int) -> None:
    """J, a gang on GPUs 0 and 1; A alone on GPU 0 with a limit of 10 % (limit_period_ms 50: a quota of 5 ms a period,
    and at most a period's quota carried over, limits.py allowance); B (weight 3 or 5) alone on GPU 1, so that J
    waits for B's 30 or 50 ms turns. A's lease is cut at its grant to the runtime its limit leaves; the arming of J
    then lengthens it to the end of B's turn (_cut_back sets the deadline to where J can start, whatever the
    deadline was). A limit is a ceiling per period (§3, requests and limits): in no 50 ms window may A use more
    than its quota and what it carried over, 10 ms, and a step (1 ms). Measured: single leases of 29 ms (weight 3)
    and 49 ms (weight 5), 31 and 49 ms used in one 50 ms window, and a share of 10.37 % under a 10 % limit (weight
    3); before e8a7a8f, leases of 5 ms at most and 10.0 %.
    Fixed: the cut-back never moves a lease's end past the end its grant had (the limit's ceiling)."""
    d = GangDriver({0: 4, 1: 4}, limit_period_ms=50)
    for g in (0, 1):
        d.add("J", g)
    d.add("A", 0, limit=10)
    d.add("B", 1, weight=weight_b)
    d.client("J", 0, 1)
    d.client("J", 1, 2)
    d.client("A", 0, 3)
    d.client("B", 1, 4)
    longest = 0
    apply = d.apply

    def watch(effects: list[Effect]) -> None:
        nonlocal longest
        for e in effects:
            lease = d.scheds[0].rq.lease
            if isinstance(e, GrantLease) and e.client == 3 and lease is not None and lease.id == e.lease:
                longest = max(longest, e.deadline_ns - lease.granted_ns)
        apply(effects)

    d.apply = watch  # type: ignore[method-assign]
    d.run(500 * MS)
    t0 = d.reset()
    used: list[int] = []
    last = 0
    for k in range(1, 61):  # 60 windows of 50 ms
        d.run(t0 + k * 50 * MS)
        used.append(d.useful[("A", 0)] - last)
        last = d.useful[("A", 0)]
    assert max(used) <= 11 * MS, ([u / MS for u in used], longest / MS)
    assert longest <= 11 * MS
    assert d.share("A", 0, t0) <= 10 + TOL_PP


def test_high_priority_on_the_peer_gpu_leaves_the_other_gpu_to_its_tenant() -> None:
    """J, a gang on GPUs 0 and 1 (collectives, gangsim); A alone on GPU 0; H (high priority) and B on GPU 1,
    prio_ratio 50, 10 ms slices. H takes 50 % of GPU 1, J and B share the rest: J is owed 25 % on both GPUs, and A the
    75 % of GPU 0 that J cannot use (§11: what one GPU cannot give the gang goes to that GPU's other tenants; §11
    checks high priority only where H is on the GPU that A shares). Measured: A 50.0 % of 75, GPU 0 idle 25 % (free
    10 ms in every 40 with A waiting: J armed, GPU 1 free for an instant at B's turn's end, so GPU 0's fence is now
    and it idles; H is then granted GPU 1 for 10 ms and nobody looks at GPU 0 again). The same on the code before
    e8a7a8f.
    Fixed: a grant on a GPU where an armed gang waits makes the gang's other GPUs look again (GangBook.granted)."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("A", (0,)), SimJob("H", (1,), highprio=True),
                           SimJob("B", (1,))], seconds=5, slice_ms=10, prio_ratio=50)
    for name, pct in {"J": 25.0, "A": 75.0, "H": 50.0, "B": 25.0}.items():
        for g, target in r.jobs[name].target.items():
            assert target * 100 == pytest.approx(pct, abs=1e-6), (name, g)
    assert r.max_error_pp() < TOL_PP, {n: (j.share, j.target) for n, j in r.jobs.items()}
    assert r.idle[0] < 0.005


@pytest.mark.xfail(strict=True, reason="open defect (before e8a7a8f too): of two gangs sharing a GPU, one whose "
                   "other GPU has a tenant of its own gets less than its entitlement")
def test_overlapping_gangs_beside_tenants_each_get_their_entitlement() -> None:
    """J1 (weight 2) on GPUs 0 and 1, J2 (1) on GPUs 1 and 2, A (3) on GPU 0, C (1) on GPU 2. J1 is owed min(2/5,
    2/3) = 40 %; J2 min(1/3, 1/2) = 33.3 %; A 60 %, C 66.7 %. GPU 1 has room for both gangs (73.3 %) and each other
    GPU for its gang and its tenant. Measured: J2 20.0 % of 33.3, C 80.0 % of 66.7, GPU 1 idle 40 % (the same on the
    code before e8a7a8f). §11 says overlapping gangs get their entitlement; tests/core/test_gang_edges.py checks
    three gangs on three GPUs with one tenant on one."""
    r = simulate_gangs(3, [SimJob("J1", (0, 1), weight=2), SimJob("J2", (1, 2)), SimJob("A", (0,), weight=3),
                           SimJob("C", (2,))], seconds=5, slice_ms=10)
    for name, pct in {"J1": 40.0, "J2": 100 / 3, "A": 60.0, "C": 200 / 3}.items():
        for target in r.jobs[name].target.values():
            assert target * 100 == pytest.approx(pct, abs=1e-6), name
    assert r.max_error_pp() < TOL_PP, {n: (j.share, j.target) for n, j in r.jobs.items()}


@pytest.mark.xfail(strict=True, reason="open defect (before e8a7a8f too): of two gangs sharing a GPU, one whose "
                   "other GPU has a tenant of its own gets less than its entitlement")
def test_two_gangs_sharing_one_gpu_each_get_their_entitlement() -> None:
    """J1 on GPUs 0 and 1, J2 on GPUs 0 and 2 (weight 1 each), B (2) on GPU 1, C (1) on GPU 2. J1 is owed min(1/2,
    1/3) = 33.3 %, J2 min(1/2, 1/2) = 50 %; B 66.7 %, C 50 %; GPU 0 has room for both (83.3 %). Measured: J2 33.5 % of
    50, C 66.5 % of 50, GPU 0 idle 33.2 % (33.2, 66.8 and 33.5 % on the code before e8a7a8f): J2 gets J1's share, not
    its own."""
    r = simulate_gangs(3, [SimJob("J1", (0, 1)), SimJob("J2", (0, 2)), SimJob("B", (1,), weight=2),
                           SimJob("C", (2,))], seconds=5, slice_ms=10)
    for name, pct in {"J1": 100 / 3, "J2": 50.0, "B": 200 / 3, "C": 50.0}.items():
        for target in r.jobs[name].target.values():
            assert target * 100 == pytest.approx(pct, abs=1e-6), name
    assert r.max_error_pp() < TOL_PP, {n: (j.share, j.target) for n, j in r.jobs.items()}


@pytest.mark.xfail(strict=True, reason="open defect (before e8a7a8f too): a gang beside a high-priority instance "
                   "that works in short bursts on one of its GPUs is almost never granted")
@pytest.mark.parametrize(("on_ms", "off_ms"), [(3.0, 6.7), (2.6, 7.1)])
def test_a_gang_beside_a_bursty_high_priority_instance_gets_what_its_tenant_neighbour_gets(
        on_ms: float, off_ms: float) -> None:
    """J, a gang on GPUs 0 and 1, beside A (weight 1) on GPU 0 and B on GPU 1; H (high priority, prio_ratio 50) on
    GPU 0 works in bursts of about 3 ms every 10 (an inference server's cadence). J and A have the same weight on
    GPU 0 and GPU 1 does not bind J (B has weight 1 there), so J is owed what A is there (both 42.3 % by the
    entitlement; §11: "high priority and prio_ratio keep working with gangs"). Measured: J 3.0 and 4.5 % (156 and
    225 steps in 5 s, stalls of 160 ms) against A's 48.5 and 49.0 %, B 97.0 and 94.2 % (before e8a7a8f: J 3.1 and
    4.2 %, A 48.4 and 49.3 %); a single-GPU J in J's place gets what A gets (25.8 and 26.8 %). J is armed and
    waits for GPU 0; each time GPU 1's turn ends, H has come back on GPU 0 (a gang is not granted while a
    high-priority instance waits with credit), and GPU 1 goes to B for another turn. Tried: ending the turns that
    fill an armed gang's wait on its other GPUs as soon as it could start (J then starts in every gap H leaves, and
    H's preemptions give J's turns back as credit): J 37.6 %, A 11.5 %, GPU 0 idle 22.6 % (H's client holding its
    lease idle after each burst). The gang's credit grows at its entitlement, which counts on H taking 15.5 %,
    while H and its idle holds take about half of GPU 0: a gang needs a claim relative to its GPU's others, as
    virtual time gives a tenant, to share what is left. Not kept."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("H", (0,), highprio=True, workload=bursty(0.5, on_ms, off_ms)),
                           SimJob("A", (0,)), SimJob("B", (1,))], seconds=5, slice_ms=10, prio_ratio=50)
    assert r.jobs["J"].target[0] == pytest.approx(r.jobs["A"].target[0], abs=1e-9)
    assert r.jobs["J"].share[0] * 100 == pytest.approx(r.jobs["A"].share[0] * 100, abs=2.0), \
        {n: (j.share, j.target) for n, j in r.jobs.items()}


@pytest.mark.xfail(strict=True, reason="open defect (before e8a7a8f too): without agreement on where a turn stops, "
                   "a gang stranded at every turn's end starves a single-GPU tenant, not only a neighbour gang")
@pytest.mark.parametrize("lag_ms", [3.0, 5.0])
def test_a_gang_stranded_at_every_turns_end_leaves_its_tenant_its_share(lag_ms: float) -> None:
    """J on GPUs 0 and 1 (2 ms steps) beside A on GPU 0 and B on GPU 1, J's rank on GPU 1 spending ``lag_ms`` on the
    host after each step, and no agreement on where a turn stops (the simulated ranks count no collectives, as
    processes whose collectives are inside CUDA graphs, or on a driver that names no kernel, do not: §11 "Where a
    turn stops"). Each of J's turns ends with its collective on GPU 0 waiting for the lagging rank: J's lease there is
    stranded and adopted by J's next turn. §11 names the neighbour gang that starves so (test_gang.py's expected
    failure); a single-GPU tenant does too. Measured: A 0.0 % of its 50 %, J 6.5 and 6.1 % of 50 with its kernels
    spinning 4.6 s of the 5, B 83.8 and 78.5 % (the same on the code before e8a7a8f). A is owed 50 %; asserted: at
    least 40 %."""
    r = simulate_gangs(2, [SimJob("J", (0, 1), workload=busy(2.0), lag_ns=(0, int(lag_ms * MS))), SimJob("A", (0,)),
                           SimJob("B", (1,))], seconds=5, slice_ms=10)
    assert r.jobs["A"].target[0] == pytest.approx(0.5)
    assert r.jobs["A"].share[0] >= 0.4, {n: (j.share, j.target) for n, j in r.jobs.items()}
