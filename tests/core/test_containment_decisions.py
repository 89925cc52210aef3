"""Containment's decisions on a virtual clock: who is unmanaged, who is killed, which instance is over its memory."""

from __future__ import annotations

from arbiterd.core.containment import START_GRACE_NS, Containment, GpuProcess
from arbiterd.core.effects import NS_PER_MS
from arbiterd.core.settings import MEMORY_ENFORCE, UNMANAGED, GpuSettings, InstanceSettings

MIB = 1 << 20


def gpu(unmanaged: str = "report", memory_enforce: str = "report", grace_ms: int = 1000,
        allowance: int = 100 * MIB) -> GpuSettings:
    return GpuSettings(unmanaged=UNMANAGED.index(unmanaged), memory_enforce=MEMORY_ENFORCE.index(memory_enforce),
                       memory_grace_ms=grace_ms, memory_allowance=allowance)


def no_limit(inst: str) -> int | None:
    return None


def test_nothing_is_acted_on_while_the_clients_of_a_restarted_daemon_reconnect() -> None:
    c = Containment(started=0)
    procs = [GpuProcess(10, MIB, "abc")]
    for t in range(0, START_GRACE_NS, START_GRACE_NS // 10):
        seen = c.observe(0, t, procs, gpu("kill"), no_limit)
        assert seen.kills == [] and seen.actionable == [] and [p.pid for p in seen.unmanaged] == [10]
    assert [k.pid for k in c.observe(0, START_GRACE_NS, procs, gpu("kill"), no_limit).kills] == [10]


def test_an_unmanaged_process_is_new_once_and_listed_while_it_runs() -> None:
    c = Containment()
    procs = [GpuProcess(10, MIB, "abc"), GpuProcess(11, MIB, "abc", managed=True), GpuProcess(12, MIB, "host",
                                                                                              exempt=True)]
    first = c.observe(0, 0, procs, gpu(), no_limit)
    assert [p.pid for p in first.new] == [10] and [p.pid for p in first.unmanaged] == [10] and not first.kills
    second = c.observe(0, 500 * NS_PER_MS, procs, gpu(), no_limit)
    assert second.new == [] and [p.pid for p in second.unmanaged] == [10]
    assert c.first_seen == {(0, 10, None): 0}
    c.observe(0, NS_PER_MS * 1000, [], gpu(), no_limit)
    assert c.first_seen == {}
    assert c.observe(0, 0, procs, gpu("allow"), no_limit).unmanaged == []


def test_kill_kills_each_unmanaged_process_once_at_the_second_poll_that_sees_it() -> None:
    c = Containment()
    procs = [GpuProcess(10, MIB, "abc"), GpuProcess(11, MIB, "abc", managed=True)]
    assert c.observe(0, 0, procs, gpu("kill"), no_limit).kills == []  # seen once: it may be a client registering
    kills = c.observe(0, 1, procs, gpu("kill"), no_limit).kills
    assert [(k.pid, k.reason) for k in kills] == [(10, "unmanaged")]
    c.killed(kills[0])
    assert c.observe(0, 2, procs, gpu("kill"), no_limit).kills == []  # still listed (NVML lags): not again
    assert c.kills[(0, "unmanaged")] == 1


def test_an_instance_over_its_limit_past_the_grace_loses_its_largest_process_or_is_reported() -> None:
    limit = {"a": 1000 * MIB}.get
    procs = [GpuProcess(1, 700 * MIB, "a", managed=True), GpuProcess(2, 600 * MIB, "a"), GpuProcess(3, 5000 * MIB, "b")]
    for mode in ("report", "kill"):
        c = Containment()
        assert c.observe(0, 0, procs, gpu(memory_enforce=mode), limit).breaches == []  # 1300 > 1000 + 1 x 100 MiB
        assert c.observe(0, 999 * NS_PER_MS, procs, gpu(memory_enforce=mode), limit).kills == []  # within the grace
        seen = c.observe(0, 1000 * NS_PER_MS, procs, gpu(memory_enforce=mode), limit)
        assert [(b.instance, b.used, b.limit) for b in seen.breaches] == [("a", 1300 * MIB, 1100 * MIB)]
        assert [k.pid for k in seen.kills] == ([1] if mode == "kill" else [])
        assert c.breaches[0] == 1
    within = [GpuProcess(1, 650 * MIB, "a", managed=True), GpuProcess(2, 550 * MIB, "a", managed=True),
              GpuProcess(4, 0, "a")]
    c = Containment()  # two managed processes, two allowances: 1200 <= 1000 + 2 x 100 MiB
    assert c.observe(0, 0, within, gpu(memory_enforce="kill", grace_ms=0), limit).kills == []
    spawned = [*within, GpuProcess(5, 100 * MIB, "a")]  # one more outside cgpu brings no allowance of its own
    seen = Containment().observe(0, 0, spawned, gpu(memory_enforce="kill", grace_ms=0), limit)
    assert [(b.used, b.limit) for b in seen.breaches] == [(1300 * MIB, 1200 * MIB)]


def test_the_oom_kill_waits_for_its_victim_and_a_stretch_under_the_limit_starts_the_grace_again() -> None:
    limit = {"a": 100 * MIB}.get
    procs = [GpuProcess(1, 300 * MIB, "a"), GpuProcess(2, 200 * MIB, "a")]
    c = Containment()
    s = gpu(memory_enforce="kill", grace_ms=0, allowance=0)
    kills = c.observe(0, 0, procs, s, limit).kills
    assert [k.pid for k in kills] == [1]
    c.killed(kills[0])
    assert c.observe(0, 1, procs, s, limit).kills == []  # pid 1 still listed: its memory is not back yet
    assert [k.pid for k in c.observe(0, 2, procs[1:], s, limit).kills] == [2]
    c = Containment()
    s = gpu(memory_enforce="kill", grace_ms=10, allowance=0)
    c.observe(0, 0, procs, s, limit)
    c.observe(0, 5 * NS_PER_MS, [], s, limit)  # under: the grace starts again
    assert c.observe(0, 12 * NS_PER_MS, procs, s, limit).kills == []


def test_time_charged_outside_the_leases_comes_off_the_offenders_turns_so_its_share_converges() -> None:
    """Policy 1, two busy instances 1:1 on the virtual clock; after each of b's turns its frozen container's queued
    work runs on for 30 % of a turn, which is charged to b. Counting that work, each gets half the GPU (± 1 pp),
    where without the charge b would get 1.3 / 2.3 = 57 %."""
    from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
    from arbiterd.core.effects import GrantLease

    arb = Arbiter([GpuInfo(0, "sim", "GPU-a", 1 << 34, True)], ArbiterConfig(), {0: GpuSettings(slice_ms=10)})
    for cid, name in ((1, "a"), (2, "b")):
        arb.connect(cid, 1000 + cid, 0)
        arb.register(cid, name, [0], {0: InstanceSettings()}, 0)
    now, extra = 0, 0
    pending = arb.acquire(1, 0, now) + arb.acquire(2, 0, now)
    sched = arb.scheds[0]
    for step in range(600):
        if step == 100:  # past the first lone lease (extended while b had not asked yet)
            a0, b0, extra = sched.held_ns("a", now), sched.held_ns("b", now), 0
        grant = next(e for e in pending if isinstance(e, GrantLease))
        now = grant.deadline_ns
        pending, _ = arb.release(grant.client, 0, grant.lease, now, again=True)
        if grant.client == 2:
            arb.charge_outside(0, "b", 3 * NS_PER_MS)  # it ran 3 ms past the freeze, beside a's turn
            extra += 3 * NS_PER_MS
        pending = pending or arb.tick(now)
    a, b = sched.held_ns("a", now) - a0, sched.held_ns("b", now) - b0
    assert extra > 0 and abs(100 * b / (a + b) - 50) <= 1.0, (a, b, extra)
    assert 100 * (b - extra) / (a + b - extra) < 45  # its leases alone: less than half, by what it ran outside


def test_a_new_process_with_a_known_pid_is_tracked_anew() -> None:
    """Tracking is by pid and start time: a process that took an exited one's pid starts its own two polls."""
    c, s, t = Containment(started=0), gpu("kill"), START_GRACE_NS
    c.observe(0, t, [GpuProcess(10, MIB, "abc", started=100)], s, no_limit)
    seen = c.observe(0, t + 1, [GpuProcess(10, MIB, "abc", started=200)], s, no_limit)
    assert seen.kills == [] and [p.started for p in seen.new] == [200]
    seen = c.observe(0, t + 2, [GpuProcess(10, MIB, "abc", started=200)], s, no_limit)
    assert [(k.pid, k.started) for k in seen.kills] == [(10, 200)]
