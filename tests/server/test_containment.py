"""arbiterd's real NVML path on the fake libnvidia-ml.so.1 (loaded by pynvml's own loader): processes that run GPU
work without cgpu are seen in status, cgpu-smi, metrics and the log, exempted by the allow-list, killed under
``unmanaged = kill``, and an instance over its memory limit is killed under ``memory_enforce = kill``.

The offenders are real processes (``sleep``) that the fake NVML lists on GPU 0; they are host processes of this
test's uid (instance ``uid-<uid>``), so no cgroup or root is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.core.containment import START_GRACE_NS
from arbiterd.tools.adminclient import AdminClient
from cgpu_testing.containers import Containers
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.nvml import FakeNvml
from cgpu_testing.tools import ROOT

pytest.importorskip("pynvml")
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the fake NVML library")
MIB = 1 << 20
POLL_MS = 100
ME = f"uid-{os.geteuid()}"


@pytest.fixture
def nvml(short_tmp: Path) -> FakeNvml:
    return FakeNvml(short_tmp / "nvml.ctl")


def start(factory: Any, nvml: FakeNvml, *args: str, sub: str = "d") -> DaemonProc:
    d: DaemonProc = factory.start("--nvml-poll-ms", str(POLL_MS), *args, env=nvml.env(), sub=sub)
    return d



def gpu0(d: DaemonProc) -> dict[str, Any]:
    return d.status()["gpus"][0]  # type: ignore[no-any-return]


def wait_for(cond: Any, timeout: float = 5.0) -> float:
    """Seconds until ``cond()`` is true; fails past ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)
    return time.monotonic() - t0


def test_an_unmanaged_process_is_reported_everywhere_and_logged_once(daemon_factory: Any, nvml: FakeNvml,
                                                                    sleeper: subprocess.Popen[bytes]) -> None:
    d = start(daemon_factory, nvml)
    assert gpu0(d)["simulated"] is False and gpu0(d)["unmanaged"] == "report"
    nvml.run(sleeper.pid, 300 * MIB, sm=40)
    wait_for(lambda: gpu0(d)["unmanaged_processes"])
    row = gpu0(d)["unmanaged_processes"][0]
    assert (row["pid"], row["instance"], row["mem_used"], row["throttled"]) == (sleeper.pid, ME, 300 * MIB, False)
    assert row["exe"] == os.path.realpath(shutil.which("sleep") or "")
    assert gpu0(d)["nvml_memory"] == {ME: 300 * MIB} and gpu0(d)["utilization_pct"] == 40
    jsonschema.validate(d.status(), json.loads((ROOT / "docs" / "status.schema.json").read_text()))
    smi = subprocess.run([sys.executable, "-m", "arbiterd.tools.smi", "--admin", d.admin], capture_output=True,
                         text=True, check=True).stdout
    assert any(str(sleeper.pid) in line and "UNMANAGED" in line for line in smi.splitlines())
    time.sleep(3 * POLL_MS / 1000)
    assert d.read_log().count(f"unmanaged process pid {sleeper.pid}") == 1
    assert sleeper.poll() is None  # report: it runs on
    d.stop()  # metrics through the collector the admin API serves
    nvml.gone(sleeper.pid)


def test_metrics_count_unmanaged_processes_and_memory_by_gpu_and_instance(daemon_factory: Any, nvml: FakeNvml,
                                                                          sleeper: subprocess.Popen[bytes]) -> None:
    d = start(daemon_factory, nvml)
    nvml.run(sleeper.pid, 300 * MIB)
    wait_for(lambda: gpu0(d)["unmanaged_processes"])
    text = AdminClient(d.admin).request("GET", "/metrics")
    g = gpu0(d)  # a host process: the GPU's UUID and model, no pod (empty: absent to Prometheus)
    labels = {"gpu": "0", "instance": ME, "UUID": g["uuid"], "modelName": g["name"], "namespace": "", "pod": "",
              "container": ""}
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
           for s in f.samples}
    assert got[("cgpu_unmanaged_processes", tuple(sorted(labels.items())))] == 1
    assert got[("cgpu_unmanaged_memory_bytes", tuple(sorted(labels.items())))] == 300 * MIB
    assert 'cgpu_kills_total{gpu="0",reason="unmanaged"} 0.0' in text
    assert 'cgpu_gpu_unmanaged{gpu="0"} 1.0' in text  # the setting: 1 report


def test_the_allow_list_exempts_by_executable_or_cgroup(daemon_factory: Any, nvml: FakeNvml,
                                                        sleeper: subprocess.Popen[bytes]) -> None:
    exe = os.path.realpath(shutil.which("sleep") or "")
    cgroup = Path(f"/proc/{sleeper.pid}/cgroup").read_text().splitlines()[0].split(":", 2)[2]
    for allow in (exe, cgroup):
        d = start(daemon_factory, nvml, "--unmanaged-allow", f"/nowhere,{allow}", sub=f"d{len(allow)}")
        d.echo("kill", "0/unmanaged")
        nvml.run(sleeper.pid, 300 * MIB)
        time.sleep(3 * POLL_MS / 1000)
        if allow == exe and os.geteuid() != 0:  # an executable exempts root's processes only
            assert [u["pid"] for u in gpu0(d)["unmanaged_processes"]] == [sleeper.pid]
        else:
            assert gpu0(d)["unmanaged_processes"] == [] and sleeper.poll() is None
        assert gpu0(d)["nvml_memory"] == {ME: 300 * MIB}  # still counted against its instance's memory
        d.stop()
    conf = nvml.path.with_name("bad.toml")
    conf.write_text('unmanaged_allow = "/usr/bin/x,relative"\nunmanaged = "stop"\n')
    bad = subprocess.run([sys.executable, "-m", "arbiterd", "--check-config", str(conf)], capture_output=True,
                         text=True)
    assert bad.returncode == 1
    assert "unmanaged_allow: expected absolute paths, separated by commas, got '/usr/bin/x,relative'" in bad.stdout
    assert "unmanaged: expected one of allow, report, throttle, kill, got 'stop'" in bad.stdout


def test_kill_ends_an_unmanaged_process_within_two_polls_with_a_log_line_and_a_count(
        daemon_factory: Any, nvml: FakeNvml, sleeper: subprocess.Popen[bytes]) -> None:
    d = start(daemon_factory, nvml, "--unmanaged", "kill")
    early = subprocess.Popen(["sleep", "60"])
    try:  # in the daemon's first seconds, while its clients would reconnect, nothing is killed
        nvml.run(early.pid, 300 * MIB)
        time.sleep(3 * POLL_MS / 1000)
        assert early.poll() is None and [u["pid"] for u in gpu0(d)["unmanaged_processes"]] == [early.pid]
    finally:
        early.kill()
        early.wait()
        nvml.gone(early.pid)
    wait_for(lambda: d.status()["uptime_seconds"] > START_GRACE_NS / 1e9, timeout=10)  # its grace from its start
    nvml.run(sleeper.pid, 300 * MIB)
    took = wait_for(lambda: sleeper.poll() is not None)
    assert took < 2 * POLL_MS / 1000 + 0.05, took  # two polls, and 50 ms for a loaded machine
    assert sleeper.returncode == -9
    wait_for(lambda: gpu0(d)["unmanaged_kills"] == 1)
    time.sleep(3 * POLL_MS / 1000)  # NVML still lists it (the fake is not told): killed once, counted once
    assert gpu0(d)["unmanaged_kills"] == 1
    assert d.read_log().count(f"killed pid {sleeper.pid}") == 1


def test_an_instance_over_its_memory_limit_is_killed_under_kill_and_left_alone_under_report(
        daemon_factory: Any, nvml: FakeNvml) -> None:
    d = start(daemon_factory, nvml, "--memory-grace-ms", "300")
    d.echo(f"create {ME} gpu=0 memsize=1GiB uid={os.geteuid()}", "inst_ctl")
    d.echo("allow", "0/unmanaged")
    for mode in ("report", "kill"):
        d.echo(mode, "0/memory_enforce")
        small, big = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
        try:
            nvml.run(small.pid, 400 * MIB)
            nvml.run(big.pid, 2000 * MIB)  # 2400 MiB > 1 GiB + 512 MiB (one context allowance: neither is managed)
            t0 = time.monotonic()
            if mode == "kill":
                wait_for(lambda p=big: p.poll() is not None)  # type: ignore[misc]
                took = time.monotonic() - t0
                assert 0.3 <= took < 0.3 + 2 * POLL_MS / 1000 + 0.05, took  # the grace, then within two polls
                assert small.poll() is None  # the largest process only
                assert gpu0(d)["memory_kills"] == 1
            else:
                wait_for(lambda: gpu0(d)["memory_breaches"] == 1)
                time.sleep(0.5)
                assert big.poll() is None and small.poll() is None and gpu0(d)["memory_kills"] == 0
                assert f"instance {ME} uses 2400 MiB, over its limit of 1536 MiB" in d.read_log()
        finally:
            for p in (small, big):
                p.kill()
                p.wait()
                nvml.gone(p.pid)
        time.sleep(2 * POLL_MS / 1000)


def test_processes_that_only_connected_bring_no_memory_allowance(daemon_factory: Any, nvml: FakeNvml) -> None:
    """Four processes of an instance with a 1 GiB limit use 700 MiB each. Had their bare connections made them
    managed, each would bring a context allowance (4 x 512 MiB: 2800 MiB under a 3 GiB limit, before); only
    registered ones do, so the instance is held to 1 GiB + one allowance and its largest process is killed."""
    d = start(daemon_factory, nvml, "--memory-grace-ms", "300")
    d.echo(f"create {ME} gpu=0 memsize=1GiB uid={os.geteuid()}", "inst_ctl")
    d.echo("allow", "0/unmanaged")
    d.echo("kill", "0/memory_enforce")
    procs = [subprocess.Popen([sys.executable, "-c", _REGISTER_THEN_CLOSE, d.sock, "connect"], stdout=subprocess.PIPE)
             for _ in range(4)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"closed\n"
            nvml.run(proc.pid, 700 * MIB)
        wait_for(lambda: sum(p.poll() is not None for p in procs) == 1)
        assert gpu0(d)["memory_kills"] == 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            nvml.gone(proc.pid)


def test_an_executable_on_the_allow_list_exempts_no_container(daemon_factory: Any, nvml: FakeNvml,
                                                             short_tmp: Path) -> None:
    """A container may ship any path: /usr/bin/sleep inside one is unmanaged though /usr/bin/sleep is allowed."""
    containers = Containers(short_tmp)
    if not containers.real:
        pytest.skip("needs root to put a process in a real container cgroup")
    exe = os.path.realpath(shutil.which("sleep") or "")
    d = start(daemon_factory, nvml, "--unmanaged-allow", exe)
    p = subprocess.Popen(["sleep", "60"])
    try:
        cid = containers.new_id()
        containers.place(p.pid, cid)
        nvml.run(p.pid, 100 * MIB)
        wait_for(lambda: gpu0(d)["unmanaged_processes"])
        row = gpu0(d)["unmanaged_processes"][0]
        assert (row["pid"], row["instance"], row["container"]) == (p.pid, cid[:12], cid)
    finally:
        p.kill()
        p.wait()
        containers.cleanup()


_REGISTER_THEN_CLOSE = (
    "import socket, sys, time, msgpack\n"
    "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
    "if sys.argv[2] == 'register':\n"
    "    u = msgpack.Unpacker()\n"
    "    for m in ({'op': 'hello', 'versions': [1], 'client': 't'},\n"
    "              {'op': 'register', 'id': 1, 'instance': None, 'gpus': [0]}):\n"
    "        s.sendall(msgpack.packb(m)); u.feed(s.recv(65536)); print(next(u)['op'], flush=True)\n"
    "s.close()\n"
    "print('closed', flush=True); time.sleep(60)\n")


def test_managed_means_registered_a_process_that_only_connects_is_not(
        daemon_factory: Any, nvml: FakeNvml, sleeper: subprocess.Popen[bytes]) -> None:
    """A process that held a registered connection within CLIENT_GRACE_NS is managed (it reconnects after a restart
    or a dropped connection): not killed. One that only connects, and one that never connected, are not: a
    handshake now and then must not shield GPU work from ``unmanaged = kill`` (before: a process that connected
    every 10 s was still alive at 27 s)."""
    d = start(daemon_factory, nvml, "--unmanaged", "kill")
    procs = {how: subprocess.Popen([sys.executable, "-c", _REGISTER_THEN_CLOSE, d.sock, how], stdout=subprocess.PIPE)
             for how in ("register", "connect")}
    try:
        for how, proc in procs.items():
            assert proc.stdout is not None
            lines = [proc.stdout.readline() for _ in range(3 if how == "register" else 1)]
            assert lines[-1] == b"closed\n" and (how == "connect" or lines[:2] == [b"welcome\n", b"registered\n"])
        wait_for(lambda: d.status()["uptime_seconds"] > START_GRACE_NS / 1e9, timeout=10)
        for proc in (*procs.values(), sleeper):
            nvml.run(proc.pid, 300 * MIB)
        wait_for(lambda: sleeper.poll() is not None)  # the one that never connected
        wait_for(lambda: procs["connect"].poll() is not None)  # the one that only connected
        time.sleep(5 * POLL_MS / 1000)
        assert procs["register"].poll() is None
        assert procs["register"].pid not in [u["pid"] for u in gpu0(d)["unmanaged_processes"]]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
