"""systemd integration: notify protocol, socket activation, reload, config checks, unit files."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from cgpu_testing.tools import ROOT, tool
from tests.helpers import RawClient

UNITS = ROOT / "systemd"


def test_unit_files_verify_with_the_man_pages_the_package_installs(short_tmp: Path) -> None:
    """systemd-analyze verify, man pages included: the unit names man:arbiterd(8), which the built
    package installs under share/man (the wheel's data files, as pip installs them)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None or shutil.which("man") is None:
        pytest.skip("systemd-analyze and man are not installed (CI installs Debian's systemd and man-db)")
    wheel_dir = short_tmp / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(wheel_dir)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheel_dir.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        pages = [n for n in z.namelist() if "/data/share/man/" in n]
        z.extractall(short_tmp / "installed", members=pages)
    assert {Path(n).name for n in pages} == {"arbiterd.8", "cgpuctl.8", "cgpu-smi.1", "cgpu-run.1",
                                             "cgpu-device-plugin.8", "cgpu-dra-plugin.8", "kubectl-inspect-cgpu.1"}
    manpath = next((short_tmp / "installed").glob("*.data/data/share/man"))
    names = ["cgpu-arbiterd.service", "cgpu-arbiterd.socket", "cgpu-arbiterd-admin.socket"]
    for name in names:
        text = (UNITS / name).read_text().replace("/usr/local/bin/arbiterd", tool("arbiterd"))
        (short_tmp / name).write_text(text)
    r = subprocess.run([analyze, "verify", *names], cwd=short_tmp, capture_output=True, text=True,
                       env={**os.environ, "MANPATH": str(manpath)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.strip() == "", r.stderr


def test_notify_ready_after_accept_watchdog_cadence_and_stopping(short_tmp: Path) -> None:
    notify_path = str(short_tmp / "notify")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(notify_path)
    ns.settimeout(15)
    run_dir = short_tmp / "run"
    env = {**os.environ, "NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"}
    proc = subprocess.Popen([tool("arbiterd"), "--run-dir", str(run_dir), "--state-dir", str(short_tmp / "state"),
                             "--sim-gpus", "1x1GiB"], env=env, stderr=subprocess.DEVNULL)
    try:
        msgs: list[tuple[float, str]] = []
        while True:
            data = ns.recv(4096).decode()
            now = time.monotonic()
            if "READY=1" in data.split("\n"):
                # at the moment READY=1 arrives, the client socket must accept and answer
                raw = RawClient(str(run_dir / "arbiter.sock"))
                raw.send({"op": "hello", "versions": [1], "client": "t"})
                assert raw.recv()["op"] == "welcome"
                raw.close()
                assert "STATUS=1 GPU(s)" in data
                break
            msgs.append((now, data))
        beats: list[float] = []
        while len(beats) < 8:
            data = ns.recv(4096).decode()
            if "WATCHDOG=1" in data:
                beats.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        median = sorted(gaps)[len(gaps) // 2]
        assert 0.15 <= median <= 0.3, gaps  # half of WatchdogSec (0.4 s)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        seen_stopping = False
        while time.monotonic() < deadline and not seen_stopping:
            seen_stopping = "STOPPING=1" in ns.recv(4096).decode().split("\n")
        assert seen_stopping
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        ns.close()


LAUNCHER = """
import os, sys
a, b = int(sys.argv[1]), int(sys.argv[2])
a2, b2 = os.dup(a), os.dup(b)
os.dup2(a2, 3); os.dup2(b2, 4)
for fd in (a, b, a2, b2):
    if fd > 4:
        os.close(fd)
os.set_inheritable(3, True); os.set_inheritable(4, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="2", LISTEN_FDNAMES="arbiter:admin")
os.execvp(sys.argv[3], sys.argv[3:])
"""


def start_activated(tmp: Path, client: socket.socket, admin: socket.socket) -> subprocess.Popen[bytes]:
    """arbiterd started the way systemd does it: pre-opened sockets, LISTEN_* variables."""
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, str(client.fileno()), str(admin.fileno()),
                             tool("arbiterd"), "--run-dir", str(tmp / "run"), "--state-dir", str(tmp / "state"),
                             "--sim-gpus", "1x1GiB", "--identity", "declared"],
                            pass_fds=(client.fileno(), admin.fileno()), stderr=subprocess.DEVNULL)


def test_socket_activation_survives_a_daemon_restart(short_tmp: Path) -> None:
    run = short_tmp / "run"
    run.mkdir()
    socks = []
    for name in ("arbiter.sock", "admin.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(run / name))
        s.listen(128)
        socks.append(s)
    first = start_activated(short_tmp, *socks)
    try:
        raw = RawClient(str(run / "arbiter.sock"), timeout=15)
        assert raw.hello_register("a")["op"] == "registered"
        raw.send({"op": "acquire", "id": 2, "gpu": 0})
        assert raw.recv()["op"] == "grant"
        raw.close()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # a client that connects while no daemon runs waits in the socket's backlog
        waiting = RawClient(str(run / "arbiter.sock"), timeout=15)
        waiting.send({"op": "hello", "versions": [1], "client": "t"})
        second = start_activated(short_tmp, *socks)
        try:
            assert waiting.recv()["op"] == "welcome"
            waiting.send({"op": "register", "id": 1, "instance": "b", "gpus": [0]})
            assert waiting.recv()["op"] == "registered"
            waiting.send({"op": "acquire", "id": 2, "gpu": 0})
            assert waiting.recv()["op"] == "grant"
            waiting.close()
        finally:
            second.terminate()
            assert second.wait(10) == 0
        assert (run / "arbiter.sock").exists()  # a passed socket is not the daemon's to remove
    finally:
        if first.poll() is None:
            first.kill()
        for s in socks:
            s.close()


def test_systemd_socket_activate_serves_the_first_client(short_tmp: Path) -> None:
    ssa = shutil.which("systemd-socket-activate")
    if ssa is None:
        pytest.skip("systemd-socket-activate is not installed")
    run = short_tmp / "run"
    run.mkdir()
    proc = subprocess.Popen([ssa, "-l", str(run / "arbiter.sock"), "-l", str(run / "admin.sock"),
                             "--fdname=arbiter:admin", "-E", "PATH", tool("arbiterd"), "--run-dir", str(run),
                             "--state-dir", str(short_tmp / "state"), "--sim-gpus", "1x1GiB",
                             "--identity", "declared"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if (run / "arbiter.sock").exists():
                break
            time.sleep(0.05)
        raw = RawClient(str(run / "arbiter.sock"), timeout=20)
        assert raw.hello_register("a")["op"] == "registered"
        raw.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_sighup_applies_a_changed_config_and_refuses_a_broken_one(daemon_factory: type, short_tmp: Path) -> None:
    cfg = short_tmp / "arbiterd.toml"
    cfg.write_text('sim_gpus = "1x1GiB"\nidentity = "declared"\npolicy = 1\n')
    d = daemon_factory.start("--config", str(cfg))
    raw = RawClient(d.sock)
    assert raw.hello_register("a")["op"] == "registered"
    cfg.write_text('sim_gpus = "1x1GiB"\nidentity = "declared"\npolicy = 4\nprio_ratio = 70\n')
    d.proc.send_signal(signal.SIGHUP)
    for _ in range(100):
        if d.ctl("cat", "0/policy").stdout == "4\n":
            break
        time.sleep(0.05)
    assert d.ctl("cat", "0/policy").stdout == "4\n"
    assert d.ctl("cat", "0/prio_ratio").stdout == "70\n"
    cfg.write_text('policy = 9\nnot toml at all = = =\n')
    d.proc.send_signal(signal.SIGHUP)
    for _ in range(100):
        if "reload refused" in d.read_log():
            break
        time.sleep(0.05)
    assert "reload refused, keeping the running config" in d.read_log()
    assert d.ctl("cat", "0/policy").stdout == "4\n"
    raw.send({"op": "acquire", "id": 5, "gpu": 0})
    assert raw.recv()["op"] == "grant"  # the client was never dropped
    raw.close()


def test_check_config(short_tmp: Path) -> None:
    good = short_tmp / "good.toml"
    good.write_text((UNITS / "arbiterd.toml").read_text())
    r = subprocess.run([tool("arbiterd"), "--check-config", str(good)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    bad = short_tmp / "bad.toml"
    bad.write_text('policy = 7\nmax_inst = 0\nidentity = "trust-me"\ncolour = "red"\n')
    r = subprocess.run([tool("arbiterd"), "--check-config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4, lines
    assert any(line.startswith("policy:") for line in lines)
    assert any(line.startswith("colour: unknown setting") for line in lines)
    broken = short_tmp / "broken.toml"
    broken.write_text("policy = = 1")
    r = subprocess.run([tool("arbiterd"), "--check-config", str(broken)], capture_output=True, text=True)
    assert r.returncode == 1 and "not valid TOML" in r.stdout


def test_apply_realtime_asks_for_fifo_reset_on_fork_and_reports_a_refusal() -> None:
    from arbiterd.server.realtime import apply_realtime

    calls: list[tuple[int, int, int]] = []
    took, msg = apply_realtime(10, lambda pid, policy, param: calls.append((pid, policy, param.sched_priority)))
    assert took and calls == [(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, 10)], calls
    assert msg == "scheduling: SCHED_FIFO priority 10 (realtime_priority)"

    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    took, msg = apply_realtime(10, refuse)
    assert not took and "cannot switch to SCHED_FIFO (Operation not permitted)" in msg and "\n" not in msg
    calls.clear()
    assert apply_realtime(0, lambda *a: calls.append(a)) == (False, "scheduling: normal (realtime_priority 0)")
    assert calls == []


def test_realtime_priority_out_of_range_is_a_one_line_error() -> None:
    for value in ("100", "-1"):
        r = subprocess.run([tool("arbiterd"), "--realtime-priority", value], capture_output=True, text=True)
        assert r.returncode == 2
        assert r.stderr.strip() == f"arbiterd: realtime_priority: expected an integer 0..99, got {value}", r.stderr


def _daemon_policy(d: object) -> int:
    return os.sched_getscheduler(d.proc.pid)  # type: ignore[attr-defined]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to grant or withhold CAP_SYS_NICE")
def test_realtime_priority_runs_the_daemon_under_sched_fifo_or_says_why_not(daemon_factory: type) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        # without the capability (and with RLIMIT_RTPRIO 0) the daemon warns once and runs normally
        d = daemon_factory.start("--sim-gpus", "1x1GiB", "--realtime-priority", "3", sub="rt-denied",
                                 wrap=[setpriv, "--bounding-set", "-sys_nice", "--"])
        assert _daemon_policy(d) == os.SCHED_OTHER
        warnings = [line for line in d.read_log().splitlines() if "realtime_priority 3" in line]
        assert len(warnings) == 1 and " WARNING " in warnings[0] and "normal priority" in warnings[0], warnings
        assert RawClient(d.sock).hello_register(f"uid-{os.geteuid()}")["op"] == "registered"
        assert d.smi_json()["scheduling"] == "normal"
        d.stop()
    d = daemon_factory.start("--sim-gpus", "1x1GiB", "--realtime-priority", "3", sub="rt")
    log = d.read_log()
    if "cannot switch to SCHED_FIFO" in log:
        assert _daemon_policy(d) == os.SCHED_OTHER
        pytest.skip("this kernel refuses SCHED_FIFO even to root here (real-time group scheduling)")
    assert _daemon_policy(d) == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    assert os.sched_getparam(d.proc.pid).sched_priority == 3
    assert "scheduling: SCHED_FIFO priority 3 (realtime_priority)" in log
    assert RawClient(d.sock).hello_register(f"uid-{os.geteuid()}")["op"] == "registered"
    assert d.smi_json()["scheduling"] == "SCHED_FIFO 3"
