"""``unmanaged = throttle`` with real processes in real container cgroups: the offender's container is frozen
outside its turns, the managed tenant beside it gets its half of the CPU back, and what the offender ran while frozen
is billed to its instance.

The two tenants are pinned to one CPU so that they contend; shares are each one's CPU time over the window, as a share
of the two together (the other users of this CPU take what they take from both)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from arbiterd.core.settings import InstanceSettings
from arbiterd.server.cgroups import CgroupFs
from arbiterd.server.hub import Hub
from arbiterd.server.throttle import Freezer, Throttle, freezer_of, set_frozen
from cgpu_testing.containers import Containers

MS = 1_000_000


def needs_freezer(tmp: Path) -> Containers:
    c = Containers(tmp, freezer=True)
    if not c.real or (c.freezer is None and c.hierarchy != Path("/sys/fs/cgroup")):
        pytest.skip("needs root and a cgroup freezer (v1 freezer or v2) to freeze a container")
    if shutil.which("gcc") is None or shutil.which("taskset") is None:
        pytest.skip("needs gcc (the fake NVML) and taskset (one CPU for both tenants)")
    return c


def test_throttle_gives_a_managed_tenant_its_half_where_report_does_not(short_tmp: Path) -> None:
    """1:1, the offender three busy processes: under report the managed tenant gets about a quarter of the CPU the
    two use; under throttle 50 +- 5 %."""
    needs_freezer(short_tmp)
    from bench.containment import shares

    report = shares(short_tmp / "r", "report", 6.0)
    throttle = shares(short_tmp / "t", "throttle", 6.0)
    assert throttle["throttled"] == 1.0 and report["throttled"] == 0.0
    assert abs(throttle["victim_pair_pct"] - 50) <= 5, throttle
    assert report["victim_pair_pct"] < 40, report


def test_the_container_is_thawed_when_its_offender_is_gone_or_the_setting_changes(short_tmp: Path) -> None:
    containers = needs_freezer(short_tmp)
    from bench.containment import start_offender
    from cgpu_testing.daemon import DaemonProc
    from cgpu_testing.nvml import FakeNvml

    nvml = FakeNvml(short_tmp / "nvml.ctl")
    d = DaemonProc(short_tmp / "d", *containers.daemon_args(), "--nvml-poll-ms", "100", "--unmanaged", "throttle",
                   env=nvml.env()).start()
    cid = containers.new_id()
    offender = start_offender(containers, cid)
    try:
        state = freezer_of(Path("/proc"), offender.pid, CgroupFs(Path("/proc")))
        assert state is not None
        nvml.run(offender.pid, 100 << 20, sm="cpu")
        assert _until(lambda: [u["throttled"] for u in d.status()["gpus"][0]["unmanaged_processes"]] == [True])
        assert cid[:12] in [i["id"] for i in d.status()["gpus"][0]["instances"]]  # scheduled as a tenant
        d.echo("report", "0/unmanaged")
        time.sleep(0.3)
        assert _thawed(state)
        d.echo("throttle", "0/unmanaged")
        time.sleep(0.3)
        nvml.gone(offender.pid)
        time.sleep(0.3)
        assert _thawed(state)
        nvml.run(offender.pid, 100 << 20, sm="cpu")
        time.sleep(0.3)
        d.stop()  # a daemon that stops leaves nothing frozen
        assert _thawed(state)
        assert "throttling container" in d.read_log()
        d.start()
        assert _until(lambda: [u["throttled"] for u in d.status()["gpus"][0]["unmanaged_processes"]] == [True])
        d.stop(signal.SIGKILL)  # one that dies leaves it frozen or thawed, as it was ...
        nvml.gone(offender.pid)
        d.start()  # ... and the next one thaws it
        assert _until(lambda: "left frozen by a daemon that stopped" in d.read_log(), 5.0)  # after the sockets
        assert _thawed(state)
    finally:
        offender.kill()
        offender.wait()
        if d.running():
            d.stop()
        containers.cleanup()


def _until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``cond()`` comes true within ``timeout`` (a daemon's first 5 s: it throttles nothing yet)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _thawed(path: Path) -> bool:
    for _ in range(100):
        if path.read_text().strip() in ("THAWED", "0"):
            return True
        time.sleep(0.01)
    return False


def test_what_a_frozen_offender_ran_is_billed_to_its_instance(hub: Hub, tmp_path: Path) -> None:
    """Between two polls 100 ms apart the container was frozen 1000-1030 and 1060-1080 ms, thawed in its turns
    between: NVML's samples stamped while frozen say 40 %, the one stamped in its turn 100 %. 40 % of the 50 ms frozen,
    20 ms, goes on its instance's bill; what ran in its turn is its lease's."""
    hub.arbiter.provision("c0ffee", [0], InstanceSettings(), 0)
    wall = time.time_ns() - time.monotonic_ns()

    def us(ms: int) -> int:
        return (ms * MS + wall) // 1000

    samples = {4242: [(us(1010), 40), (us(1045), 100), (us(1070), 40)]}
    throttle = Throttle(hub, None, lambda gpu: samples)  # type: ignore[arg-type]
    freezer = Freezer(tmp_path / "freezer.state")
    freezer.stretches = [[1000 * MS, 1030 * MS], [1060 * MS, 1080 * MS]]
    proxy = SimpleNamespace(freezer=freezer, instance="c0ffee", close=lambda: None)
    throttle.proxies[(0, "c0ffee" * 10)] = proxy  # type: ignore[assignment]
    throttle.pids[(0, "c0ffee" * 10)] = {4242}
    before = hub.arbiter.scheds[0].held_ns("c0ffee", 0)
    throttle._charge(0, 1000 * MS)
    throttle._charge(0, 1100 * MS)
    assert hub.arbiter.scheds[0].held_ns("c0ffee", 0) - before == 20 * MS
    assert throttle.charged_ns[0] == 20 * MS
    samples[4242] = [(us(1150), 100)]  # in its turn (no stretch frozen): what it runs is its lease's
    throttle._charge(0, 1200 * MS)
    assert throttle.charged_ns[0] == 20 * MS


def test_one_freezer_per_container_is_thawed_only_while_every_gpu_s_proxy_holds_a_turn(tmp_path: Path) -> None:
    """A container throttled on two GPUs has one freezer: a turn on one GPU does not thaw it while the other's proxy
    is out of turn, and it is thawed for good when the last proxy leaves."""
    path = tmp_path / "freezer.state"
    path.write_text("THAWED")
    f = Freezer(path)
    f.set(1, False)
    f.set(2, False)
    assert path.read_text() == "FROZEN"
    f.set(1, True)
    assert path.read_text() == "FROZEN"  # GPU 1's proxy still out of turn
    f.set(2, True)
    assert path.read_text() == "THAWED"
    f.set(1, False)
    f.leave(1)
    assert path.read_text() == "THAWED" and f.turns == {2: True}
    f.set(2, False)
    assert path.read_text() == "FROZEN"
    f.leave(2)
    assert path.read_text() == "THAWED"


def test_the_freezer_is_found_on_cgroup_v1_and_v2(tmp_path: Path) -> None:
    """v1: the container's group in the freezer hierarchy (freezer.state, FROZEN/THAWED); v2: its one group
    (cgroup.freeze, 1/0); a process in no container has none. A fake /proc and cgroup fs, so it runs anywhere."""
    from cgpu_testing.containers import fake_cgroup

    cid = "ab" * 32
    cases = {101: (f"6:freezer:/docker/{cid}\n8:pids:/docker/{cid}", "freezer", "freezer.state", "FROZEN"),
             102: (f"0::/system.slice/docker-{cid}.scope", "unified", "cgroup.freeze", "1")}
    for pid, (lines, hierarchy, name, frozen) in cases.items():
        proc = tmp_path / f"proc{pid}"
        fake_cgroup(proc, pid, lines)
        groups = [d for d in (tmp_path / f"proc{pid}-cgroupfs").iterdir() if d.name.startswith(hierarchy)]
        target = next(groups[0].rglob(f"*{cid}*"))
        (target / name).write_text("")
        found = freezer_of(proc, pid, CgroupFs(proc))
        assert found == target / name
        assert set_frozen(found, True) >= 0 and found.read_text() == frozen
    fake_cgroup(tmp_path / "proc103", 103, "0::/user.slice/user-0.slice")
    assert freezer_of(tmp_path / "proc103", 103, CgroupFs(tmp_path / "proc103")) is None


def test_a_container_that_cannot_be_frozen_is_reported_with_one_line(hub: Hub, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """No freezer group (a v1 host without the freezer's), or one whose file cannot be written (a read-only cgroup
    fs): the container is reported and not throttled, with one log line, not one a poll."""
    from arbiterd.core.containment import GpuProcess
    from arbiterd.server.identity import IdentityResolver
    from cgpu_testing.containers import fake_cgroup

    proc = tmp_path / "proc"
    cids = {201: "cd" * 32, 202: "ef" * 32}
    fake_cgroup(proc, 201, f"8:pids:/docker/{cids[201]}")
    fake_cgroup(proc, 202, f"6:freezer:/docker/{cids[202]}")
    (next((tmp_path / "proc-cgroupfs").rglob(cids[202])) / "freezer.state").mkdir()  # not writable as a file
    hub.identity = IdentityResolver("cgroup", str(proc))
    throttle = Throttle(hub, None, lambda gpu: {})  # type: ignore[arg-type]
    procs = [GpuProcess(pid, 1, cid[:12], container=cid) for pid, cid in cids.items()]
    for t in range(3):
        throttle.poll(0, t * 500 * MS, procs, True)
    assert throttle.throttled(0) == set() and throttle.proxies == {}
    assert caplog.text.count("no freezer cgroup found") == 1 and caplog.text.count("cannot freeze") == 1
    assert hub.peers == {}  # no client stands for them


def test_a_managed_client_in_the_throttled_container_gives_its_lease_back_before_the_freeze(short_tmp: Path) -> None:
    """The offender's container also runs a managed client (it shares the instance's lease with the daemon's
    client for the container): the freeze waits for it to give the lease back, so no turn of the container is cut
    off overrun_ms late."""
    containers = needs_freezer(short_tmp)
    import subprocess
    import sys

    from bench.containment import GATE, daemon, start_offender
    from cgpu_testing.nvml import FakeNvml
    from cgpu_testing.tools import ROOT

    nvml = FakeNvml(short_tmp / "nvml.ctl")
    d = daemon(short_tmp / "d", nvml, containers, "--unmanaged", "throttle")
    cid = containers.new_id()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        wait_then_run = ("import runpy, sys\nsys.stdin.read(2)\nsys.argv = sys.argv[1:]\n"
                         "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        inside = subprocess.Popen([sys.executable, "-c", wait_then_run, str(GATE), d.sock, cid[:12], "1", "busy:12"],
                                  stdin=subprocess.PIPE, env=env)
        procs.append(inside)
        containers.place(inside.pid, cid)
        assert inside.stdin is not None
        inside.stdin.write(b"go")
        inside.stdin.close()
        procs.append(subprocess.Popen([sys.executable, str(GATE), d.sock, f"uid-{os.geteuid()}", "1", "busy:12"],
                                      env=env))
        offender = start_offender(containers, cid)
        procs.append(offender)
        nvml.run(offender.pid, 100 << 20, sm="cpu")
        assert _until(lambda: any(u["throttled"] for u in d.status()["gpus"][0]["unmanaged_processes"]))
        before = d.status()["gpus"][0]["overruns"]
        time.sleep(4.0)
        gpu = d.status()["gpus"][0]
        assert gpu["overruns"] - before == 0, gpu["revoked"]
        ids = {i["id"]: i for i in gpu["instances"]}
        assert cid[:12] in ids and len(ids[cid[:12]]["pids"]) == 2  # its managed client and the daemon's
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        d.stop()
        containers.cleanup()


def test_a_daemon_thaws_what_the_one_before_it_left_frozen_without_nvml(short_tmp: Path) -> None:
    """The record of a daemon that was killed while it throttled is read at start whatever the GPUs: here simulated
    ones, where no NVML is opened."""
    containers = needs_freezer(short_tmp)
    import subprocess

    from cgpu_testing.daemon import DaemonProc

    p = subprocess.Popen(["sleep", "60"])
    d = DaemonProc(short_tmp / "d", *containers.daemon_args(), "--sim-gpus", "1x1GiB")
    try:
        cid = containers.new_id()
        containers.place(p.pid, cid)
        path = freezer_of(Path("/proc"), p.pid, CgroupFs(Path("/proc")))
        assert path is not None and set_frozen(path, True) >= 0
        d.run_dir.mkdir(parents=True)
        (d.run_dir / "frozen").write_text(f"{path}\n")
        d.start()
        assert _until(lambda: path.read_text().strip() in ("THAWED", "0"), 5.0)
        assert not (d.run_dir / "frozen").exists()
    finally:
        p.kill()
        if d.running():
            d.stop()
        containers.cleanup()  # thaws first: a frozen process dies once thawed
        p.wait()


def test_a_proxy_that_fails_to_start_leaves_nothing_frozen_and_the_freeze_is_recorded_first(
        hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record lists the container before its first freeze (a daemon killed between the two leaves it to be
    thawed), and any failure to schedule the proxy, not only a refusal, thaws the container."""
    from arbiterd.core.containment import GpuProcess
    from arbiterd.server import throttle as throttle_mod
    from arbiterd.server.identity import IdentityResolver
    from cgpu_testing.containers import fake_cgroup

    proc, cid = tmp_path / "proc", "ab" * 32
    fake_cgroup(proc, 301, f"6:freezer:/docker/{cid}")
    state = next((tmp_path / "proc-cgroupfs").rglob(cid)) / "freezer.state"
    state.write_text("THAWED")
    hub.identity = IdentityResolver("cgroup", str(proc))
    record = tmp_path / "frozen"
    at_freeze: list[str] = []
    real = throttle_mod.set_frozen

    def spy(path: Path, frozen: bool) -> int:
        if frozen:
            at_freeze.append(record.read_text() if record.exists() else "")
        return real(path, frozen)

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(throttle_mod, "set_frozen", spy)
    monkeypatch.setattr(hub, "serve", broken)
    throttle = Throttle(hub, None, lambda gpu: {}, record)  # type: ignore[arg-type]
    throttle.poll(0, 0, [GpuProcess(301, 1, cid[:12], container=cid)], True)
    assert at_freeze == [f"{state}\n"]
    assert state.read_text() == "THAWED" and throttle.proxies == {} and hub.peers == {}


def test_a_proxy_that_starts_while_a_managed_client_holds_the_lease_freezes_once_it_is_given_back(
        hub: Hub, tmp_path: Path) -> None:
    """Throttling starts in the middle of a turn of the container's managed client, or just past its deadline: the
    freeze waits for the client to give the lease back (frozen, it could not, and the lease would be cut off
    ``overrun_ms`` late); then the container is frozen until its next turn."""
    import cgpu_protocol as p
    from arbiterd.server import identity
    from arbiterd.server.identity import IdentityResolver
    from arbiterd.server.throttle import Proxy

    container = "c0ffee" * 10
    path = tmp_path / "freezer.state"
    path.write_text("THAWED")

    class Managed:
        def __init__(self, container: str | None) -> None:
            self.peer = identity.Peer(os.getpid(), 0, container)
            self.pid, self.uid = self.peer.pid, 0
            self.instance: str | None = None
            self.sent: list[p.Message] = []

        def send(self, msg: p.Message) -> None:
            self.sent.append(msg)

    hub.identity = IdentityResolver("cgroup", "/proc")  # instances by container (the host tenant: uid-0)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        managed, other = Managed(container), Managed(None)  # the other a tenant on the host, waiting its turn
        for client in (managed, other):
            client.cid = hub.attach(client)  # type: ignore[arg-type,attr-defined]
            hub.serve(client, p.Register(1, None, [0]), time.monotonic_ns())  # type: ignore[arg-type]
            hub.serve(client, p.Acquire(0), time.monotonic_ns())  # type: ignore[arg-type]
        grant = [m for m in managed.sent if isinstance(m, p.Grant)][-1]  # its deadline brought in for the other
        await asyncio.sleep(max(0.0, grant.deadline_ns / 1e9 - loop.time()) + 0.01)  # past its deadline, still held
        proxy = Proxy(hub, 0, identity.Peer(os.getpid(), 0, container), Freezer(path), loop)
        proxy.start()
        assert proxy.instance == managed.instance == container[:12] and proxy.lease is None
        await asyncio.sleep(0.02)
        assert path.read_text() == "THAWED"  # the managed client still holds its lease: not frozen under it
        hub.serve(managed, p.Release(0, grant.lease, None, again=False), time.monotonic_ns())  # type: ignore[arg-type]
        await asyncio.sleep(0.02)
        assert path.read_text() == "FROZEN" and [m.OP for m in other.sent][-1] == "grant"  # the other's turn
        proxy.close()
        assert path.read_text() == "THAWED"

    asyncio.run(go())
