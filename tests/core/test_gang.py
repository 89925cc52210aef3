"""Gang leases on the virtual clock (behaviour §11, jobs that span GPUs): a job busy on several GPUs gets its turns
on all of them at once, its share is the least of its weight's shares over its GPUs, and each GPU's other tenants
share the rest by weight. Shares are asserted within 0.5 pp of the documented entitlement; a GPU idles only where
the rule says it must (the idle share is asserted against the entitlement's too)."""

from __future__ import annotations

import pytest

from arbiterd.core.effects import NS_PER_MS, NS_PER_S, GrantLease, RevokeLease
from arbiterd.core.gang import GangBook
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import GpuSettings
from cgpu_testing.gangsim import GangResult, GangSimulation, SimJob, simulate_gangs
from cgpu_testing.sim import bursty, busy

TOL_PP = 0.5


def assert_exact(r: GangResult, expected: dict[str, float]) -> None:
    """Every share within TOL_PP of the entitlement, which is the documented one (``expected``: job -> %, the same
    on every GPU of it), and every GPU's idle share within TOL_PP of what the rule leaves idle."""
    for name, pct in expected.items():
        for g, target in r.jobs[name].target.items():
            assert target * 100 == pytest.approx(pct, abs=1e-6), f"{name} on GPU {g}: entitlement {target * 100}"
    assert r.max_error_pp() < TOL_PP, {n: (j.share, j.target) for n, j in r.jobs.items()}


def test_gang_of_two_beside_tenants_of_various_weights() -> None:
    """J on GPUs 0 and 1 (weight 1); A (1) on GPU 0; B (1) and C (2) on GPU 1. J's share is min(1/2, 1/4) = 25 %
    on both; A gets the 75 % GPU 0 cannot give J in the aligned turns; B and C share GPU 1's 75 % as 1:2. No
    spin: the collectives start together."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("A", (0,)), SimJob("B", (1,)), SimJob("C", (1,), weight=2)],
                       seconds=10, slice_ms=20)
    assert_exact(r, {"J": 25.0, "A": 75.0, "B": 25.0, "C": 50.0})
    assert r.jobs["J"].spin_ns == 0
    assert max(r.idle.values()) < 0.005


def test_turns_end_where_a_gang_is_due_and_go_on_after_it() -> None:
    """J on GPUs 0 and 1, A on GPU 0, B and C on GPU 1 (policy 1, 10 ms slices), every tenant in steps of its own
    length, so that GPU 0's turns drift against GPU 1's. J waits for B's and C's turns on GPU 1 (20 ms), each
    running on to the end of the step under way at its deadline, and at most half a turn more: a turn that GPU 0
    starts just before J is due, and that would run on more than half its length past that point, ends there
    (before, it ran its whole length past it, and J waited for it: 30.2 ms). B and C wait for the other and J, and
    no more: a turn cut short where J starts goes on right after J's turn (before, its instance, having just had
    part of a turn, went after the other: 30.8 ms, a round). The shares stay within 1.5 pp (a step under way at a
    deadline leaves its peer GPU idle a moment: 1.1 % here)."""
    jobs = [SimJob("J", (0, 1), workload=busy(1.0)), SimJob("A", (0,), workload=busy(0.7)),
            SimJob("B", (1,), workload=busy(1.3)), SimJob("C", (1,), workload=busy(0.9))]
    r = simulate_gangs(2, jobs, seconds=10, policy=1, slice_ms=10)
    ops = 1.3 + 0.9 + 1.0
    assert r.jobs["J"].max_stall_ns <= int((20 + 10 / 2 + 1.3 + 0.9) * NS_PER_MS)
    for name in ("B", "C"):
        assert r.jobs[name].max_stall_ns <= int((20 + ops) * NS_PER_MS)
    assert r.max_error_pp() < 1.5


def test_gangs_of_four_and_two_on_four_gpus() -> None:
    """J (weight 2) on GPUs 0-3, K (1) on GPUs 2-3, tenants A (1) on 0, B (3) on 1, C (1) and D (4) on 2. J: min(2/3,
    2/5, 2/8, 2/3) = 25 %; K: min(1/8, 1/3) = 12.5 %; C and D share GPU 2's 62.5 % as 1:4. GPU 3 has only the two
    gangs: it idles the 62.5 % they cannot use everywhere at once, as the rule says."""
    jobs = [SimJob("J", (0, 1, 2, 3), weight=2), SimJob("K", (2, 3)), SimJob("A", (0,)), SimJob("B", (1,), weight=3),
            SimJob("C", (2,)), SimJob("D", (2,), weight=4)]
    r = simulate_gangs(4, jobs, seconds=8, slice_ms=10)
    assert_exact(r, {"J": 25.0, "K": 12.5, "A": 75.0, "B": 75.0, "C": 12.5, "D": 50.0})
    assert r.idle_target[3] * 100 == pytest.approx(62.5)
    assert r.jobs["J"].spin_ns == 0 and r.jobs["K"].spin_ns == 0


def test_two_gangs_on_the_same_pair_never_wait_longer_than_a_round() -> None:
    """J1 and J2 on GPUs 0 and 1, A (2) on GPU 0: J1 and J2 25 % each, A 50 %, GPU 1 idles 50 % (nobody else wants
    it). Neither job waits on the other: no spin, and no gap between two of a job's steps longer than GPU 0's round
    (its weights' turns: 4 slices)."""
    r = simulate_gangs(2, [SimJob("J1", (0, 1)), SimJob("J2", (0, 1)), SimJob("A", (0,), weight=2)], seconds=8,
                       slice_ms=10)
    assert_exact(r, {"J1": 25.0, "J2": 25.0, "A": 50.0})
    for name in ("J1", "J2"):
        assert r.jobs[name].spin_ns == 0
        assert r.jobs[name].max_stall_ns <= 4 * 10 * NS_PER_MS


def test_a_turn_given_back_early_costs_the_gang_only_what_it_held() -> None:
    """J alone on GPUs 0 and 1 takes a 10 ms turn (its credit -10 ms) and gives both leases back 2 ms in, its work
    done: it is billed the 2 ms it held, as a tenant's virtual time is, and not the whole turn (credit -8 ms)."""
    s0, s1, book = _pair()
    for s, client in ((s0, 1), (s1, 2)):
        s.acquire("J", client, 0)
    gang = book.gangs["J"]
    assert gang.credit == -10 * NS_PER_MS and gang.rate == 1.0
    for s, client in ((s0, 1), (s1, 2)):
        s.release(client, s.holders()[0].id, 2 * NS_PER_MS)
    assert gang.credit == pytest.approx(-2 * NS_PER_MS + 2 * NS_PER_MS * 1.0)


def test_a_gang_granted_as_its_bursts_end_is_not_starved() -> None:
    """J on GPUs 0 and 1 works 12 ms in every 21, A on GPU 0 and B on GPU 1 always (policy 4, 10 ms slices). J's
    rank blocked at a burst's end is granted in the pause after it, and gives the turn back at once (after the
    2 ms a client holds an idle lease). Billed the whole turn for it, J earned its next turn only as its next burst
    was over: granted in every pause, J did no work at all (19.6 % of its 28.6 % before a lone tenant held one
    lease between J's turns, 0 % after). Billed what it held, it gets at least 80 % of its due, and A and B theirs
    less at most the 2 ms in 21 J holds an idle lease."""
    r = simulate_gangs(2, [SimJob("J", (0, 1), workload=bursty(0.5, 12, 9)), SimJob("A", (0,)), SimJob("B", (1,))],
                       seconds=10, policy=4, slice_ms=10)
    assert r.jobs["J"].share[0] >= 0.8 * r.jobs["J"].target[0]
    for name, g in (("A", 0), ("B", 1)):
        assert r.jobs[name].share[g] >= r.jobs[name].target[g] - 2 / 21


def test_a_lone_tenant_holds_one_lease_between_a_gangs_turns() -> None:
    """J on GPUs 0 and 1 (policy 1), A alone on GPU 0, B and C on GPU 1: A's turns between two of J's are one lease,
    extended while nobody else waits on GPU 0 and cut back where J can start, not a renewal a turn while J, not
    yet armed, waits (each renewal is a hand-over: 856 grants of A to J's 333 before). A still gets its 2/3."""
    jobs = [SimJob("J", (0, 1)), SimJob("A", (0,)), SimJob("B", (1,)), SimJob("C", (1,))]
    sim = GangSimulation({g: GpuSettings(policy=1, slice_ms=10) for g in (0, 1)}, jobs)
    r = sim.run(10 * NS_PER_S, warmup_ns=NS_PER_S)
    assert_exact(r, {"J": 100 / 3, "A": 200 / 3, "B": 100 / 3, "C": 100 / 3})
    grants = {n: sim.scheds[0].instances[n].grants for n in ("J", "A")}
    assert grants["J"] > 250
    assert grants["A"] <= grants["J"] + 1, grants


def _lagging_pair(op_ms: float, lag_ns: int, seconds: float) -> GangResult:
    """Gangs J1 and J2 alone on GPUs 0 and 1 (policy 1, 20 ms slices), steps of ``op_ms``, each job's rank on GPU 1
    reaching its gate ``lag_ns`` after a step."""
    jobs = [SimJob(n, (0, 1), workload=busy(op_ms), lag_ns=(0, lag_ns)) for n in ("J1", "J2")]
    return simulate_gangs(2, jobs, seconds=seconds, policy=1, slice_ms=20)


@pytest.mark.parametrize("lag_ms", [0.3, 1.0])
def test_two_gangs_whose_ranks_lag_take_turns_in_turn(lag_ms: float) -> None:
    """J1 and J2 alone on GPUs 0 and 1, each with its rank on GPU 1 reaching its gate ``lag_ms`` after a step (its
    host's part), so at each turn's end one rank finishes its step past the deadline while the other already waits.
    That tail is not a strand: the gangs still alternate, neither waits longer than the other's turn (20 ms) and a
    step more, and they share the pair equally (each does what its lag leaves of 50 %: op / (op + lag)). The tail was
    taken for a stranded collective, put first: one gang had up to four turns in a row (stalls of 83 ms)."""
    lag = int(lag_ms * NS_PER_MS)
    r = _lagging_pair(2.0, lag, seconds=10)
    for name in ("J1", "J2"):
        assert r.jobs[name].share[0] * 100 == pytest.approx(50 * 2.0 / (2.0 + lag_ms), abs=1.5)
        assert r.jobs[name].max_stall_ns <= 20 * NS_PER_MS + 2 * (2 * NS_PER_MS + lag)
    assert abs(r.jobs["J1"].share[0] - r.jobs["J2"].share[0]) * 100 < TOL_PP


@pytest.mark.xfail(strict=True, reason="open defect: without agreement on where a turn stops (no board), a gang "
                   "stranded at every turn's end holds a GPU its neighbour gang needs until its own next turn")
@pytest.mark.parametrize(("op_ms", "lag_ms"), [(2.0, 3.0), (5.0, 5.0)])
def test_a_gang_stranded_at_every_turns_end_does_not_starve_its_neighbour(op_ms: float, lag_ms: float) -> None:
    """J1 and J2 alone on GPUs 0 and 1, each with its rank on GPU 1 a step or more behind the other (the host's part
    of a step as long as the step), and no agreement on where a turn stops (the simulated ranks do not count
    collectives, as processes outside libcgpu.so, or with collectives it does not name, do not): at every turn's
    end a collective on GPU 0 waits for its peer. J2 makes no step: J1's stranded lease holds GPU 0 until J1's next
    turn, which comes first and strands again (a review's reproducer). Catch-up leases for the waiting rank fixed it
    here but, on the fake driver beside real noise, stalled two gangs on a pair for 400-600 ms in 2 sittings of 4:
    not kept. Its adopted time is billed now (it was not)."""
    lag = int(lag_ms * NS_PER_MS)
    r = _lagging_pair(op_ms, lag, seconds=8)
    assert min(r.jobs[n].steps for n in ("J1", "J2")) > 200
    assert abs(r.jobs["J1"].share[0] - r.jobs["J2"].share[0]) * 100 < TOL_PP
    for name in ("J1", "J2"):
        assert r.jobs[name].max_stall_ns <= 2 * 20 * NS_PER_MS + 2 * int((op_ms + lag_ms) * NS_PER_MS)


@pytest.mark.xfail(strict=True, reason="open defect: a gang with bursts shorter than its turn is granted in its "
                   "pauses and holds its GPUs idle there until its clients' idle release")
def test_a_gang_whose_work_comes_in_short_bursts_leaves_its_gpus_to_the_others() -> None:
    """J on GPUs 0 and 1 works 12 ms in every 20 (0.5 ms steps), A on GPU 0 and B on GPU 1 always: J is entitled to
    50 % while it works, 30 % in all, and A and B to the rest, 70 %. Measured: J 25 %, A and B 65 %, 10 % of each
    GPU idle. J's rank, blocked at a burst's end (its turn over), waits into the pause, is granted there, and holds
    the lease idle for the 2 ms a client keeps one before it gives it back: 2 ms in every 20. A tenant with these
    bursts alone beside A on one GPU reads 50 / 50 (its turns fall inside its bursts), with 12 ms in 21, 39.5 %
    against 28.6 % and 6 % idle: the simulated client's idle hold, not the gang, is most of the gap."""
    r = simulate_gangs(2, [SimJob("J", (0, 1), workload=bursty(0.5, 12, 8)), SimJob("A", (0,)), SimJob("B", (1,))],
                       seconds=10, policy=4, slice_ms=10)
    assert r.max_error_pp() < 2


def test_two_gangs_alone_share_the_pair_without_idle() -> None:
    """Two gangs alone on a pair: 50 / 50 and no GPU idles (the time one does not take goes to the other)."""
    r = simulate_gangs(2, [SimJob("J1", (0, 1)), SimJob("J2", (0, 1))], seconds=6, slice_ms=10)
    assert_exact(r, {"J1": 50.0, "J2": 50.0})
    assert max(r.idle.values()) < 0.005


def test_policy_one_counts_every_weight_as_one() -> None:
    """Policy 1: J with A on GPU 0 and with B and C on GPU 1: 1/3 everywhere, A 2/3."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("A", (0,)), SimJob("B", (1,)), SimJob("C", (1,))],
                       seconds=6, slice_ms=10, policy=1)
    assert_exact(r, {"J": 100 / 3, "A": 200 / 3, "B": 100 / 3, "C": 100 / 3})


def test_one_process_with_several_devices() -> None:
    """One client on both GPUs (one process, two devices) is a gang as much as one process per GPU is."""
    r = simulate_gangs(2, [SimJob("J", (0, 1), one_process=True), SimJob("A", (0,), weight=3)], seconds=6,
                       slice_ms=10)
    assert_exact(r, {"J": 25.0, "A": 75.0})
    assert r.jobs["J"].spin_ns == 0


@pytest.mark.parametrize(("ratio", "job", "low"), [(50, 25.0, 25.0), (80, 10.0, 10.0)])
def test_high_priority_keeps_prio_ratio_beside_a_gang(ratio: int, job: float, low: float) -> None:
    """H (high priority) on GPU 0 takes prio_ratio; J and A share the rest 1:1 there, so J gets that on GPU 1 too,
    and B the rest of GPU 1. H's preemptions revoke J's lease on both GPUs (no spin)."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("H", (0,), highprio=True), SimJob("A", (0,)),
                           SimJob("B", (1,))], seconds=8, slice_ms=10, prio_ratio=ratio)
    assert_exact(r, {"J": job, "H": float(ratio), "A": low, "B": 100 - job})
    assert r.jobs["J"].spin_ns == 0


def test_a_tenant_that_comes_and_goes_beside_a_gang() -> None:
    """A on GPU 0 is busy 300 ms of every 500: J gets 1/3 while A works (B's 2/3 on GPU 1 binds) and 1/3 while A
    rests too (GPU 1 binds), and GPU 0 idles what J cannot use (2/3 of A's off time) as the rule says."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("A", (0,), workload=bursty(1, 300, 200)),
                           SimJob("B", (1,), weight=2)], seconds=10, slice_ms=10)
    assert r.max_error_pp() < TOL_PP
    assert r.jobs["J"].target[0] * 100 == pytest.approx(100 / 3, abs=1e-6)


def test_gangs_off_the_collective_spins_and_stalls() -> None:
    """Today's behaviour (window 0, gangs off): each GPU gives J its turns on its own, J's kernel on one GPU spins
    for the peer's turn, billed to J and lost to A: J far below its entitlement, spin over a tenth of the run."""
    r = simulate_gangs(2, [SimJob("J", (0, 1)), SimJob("A", (0,)), SimJob("B", (1,)), SimJob("C", (1,), weight=2)],
                       seconds=6, slice_ms=20, window_ms=0)
    assert r.jobs["J"].share[0] < 0.5 * r.jobs["J"].target[0]
    assert r.jobs["J"].spin_ns > 0.1 * r.duration_ns


def _pair() -> tuple[GpuScheduler, GpuScheduler, GangBook]:
    """GPUs 0 and 1 (policy 4, 10 ms slices) joined by a book, J registered on both."""
    s0, s1 = (GpuScheduler(g, GpuSettings(policy=4, slice_ms=10)) for g in (0, 1))
    book = GangBook()
    book.attach(s0)
    book.attach(s1)
    for s in (s0, s1):
        s.add_instance("J", 1, False, 0)
    return s0, s1, book


def test_a_revoke_ends_the_gangs_lease_on_every_gpu() -> None:
    """J holds its turn on both GPUs; H (high priority) preempts it on GPU 0: J's lease on GPU 1 is revoked in the
    same step."""
    s0, s1, book = _pair()
    s0.add_instance("H", 1, True, 0)
    s0.acquire("J", 1, 0)
    s1.acquire("J", 2, 0)
    held = [lease for s in (s0, s1) for lease in s.holders()]
    assert [lease.inst.name for lease in held] == ["J", "J"] and book.gangs["J"].gpus == (0, 1)
    assert held[0].deadline_ns == held[1].deadline_ns  # one turn, one deadline
    effects = s0.acquire("H", 9, NS_PER_MS)  # its credit is full: it preempts J on GPU 0
    assert {(e.gpu, e.client) for e in effects if isinstance(e, RevokeLease)} == {(0, 1), (1, 2)}
    assert not any(isinstance(e, GrantLease) for e in effects)


def test_a_job_busy_on_one_gpu_is_no_gang() -> None:
    """J is registered on both GPUs but works on GPU 0 only: no gang forms, and it takes turns there as any tenant
    (nothing waits for a GPU it does not use)."""
    s0, _, book = _pair()
    effects = s0.acquire("J", 1, 0)
    assert [e.gpu for e in effects if isinstance(e, GrantLease)] == [0]
    assert not book.gangs and not s0.instances["J"].gang


def test_gangs_form_only_on_work_conserving_virtual_time() -> None:
    """On policy 2 (and the rings, 0 and 3) every GPU schedules the job's instance on its own: no gang."""
    s0, s1 = (GpuScheduler(g, GpuSettings(policy=2, slice_ms=10)) for g in (0, 1))
    book = GangBook()
    book.attach(s0)
    book.attach(s1)
    for s in (s0, s1):
        s.add_instance("J", 1, False, 0)
    s0.acquire("J", 1, 0)
    s1.acquire("J", 2, 0)
    assert not book.gangs
