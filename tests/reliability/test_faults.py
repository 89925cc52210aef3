"""Faults: dead clients, hung clients, a killed daemon, a state dir that cannot be written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.tools.adminclient import AdminClient
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT
from libcgpu_client.client import Client
from libcgpu_client.gate import Gate
from tests.helpers import RawClient

MIB = 1024**2
HOLDER = r"""
import socket, sys, time, msgpack
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
u = msgpack.Unpacker(raw=False)
def recv():
    while True:
        for m in u:
            return m
        u.feed(s.recv(65536))
s.sendall(msgpack.packb({"op": "hello", "versions": [1], "client": "holder"})); recv()
s.sendall(msgpack.packb({"op": "register", "id": 1, "instance": "holder", "gpus": [0],
                        "memsize": [512 * 2**20]})); recv()
s.sendall(msgpack.packb({"op": "mem_reserve", "id": 2, "gpu": 0, "bytes": 300 * 2**20})); recv()
s.sendall(msgpack.packb({"op": "acquire", "id": 3, "gpu": 0})); recv()
print("holding", flush=True)
time.sleep(3600)  # holds the lease and never gives it back
"""


def metric(d: DaemonProc, name: str) -> float:
    text = AdminClient(d.admin).request("GET", "/metrics")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def start_holder(d: DaemonProc) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, d.sock], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def test_sigkilled_holder_loses_its_lease_within_two_slices_and_its_memory(daemon_factory: type) -> None:
    """Slices of 20 ms (2 slices = 40 ms: room for a loaded 2-core machine)."""
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared", "--slice-ms", "20")
    holder = start_holder(d)
    assert "Mem: " + str(300 * MIB) in d.ctl("cat", "0/holder/meminfo").stdout
    waiter = RawClient(d.sock)
    waiter.hello_register("waiter")
    waiter.send({"op": "acquire", "id": 2, "gpu": 0})
    time.sleep(0.3)  # the waiter is queued behind the holder, which never releases
    killed = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    while True:
        msg = waiter.recv()
        if msg["op"] == "grant":
            break
    waited = time.monotonic() - killed
    holder.wait(5)
    assert waited < 0.040, waited
    assert d.ctl("cat", "0/holder/meminfo").stdout == f"Free: {512 * MIB}\n"
    waiter.close()


def test_hung_holder_is_cut_off_after_the_overrun_bound_charged_and_counted(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared", "--overrun-ms", "300")
    holder = start_holder(d)  # holds an extended lease: nobody else waits yet
    try:
        good = Client(d.sock, "good", [0])
        assert good.start(10)
        gate = Gate(good, 0)
        t = time.monotonic()
        gate.check()  # B arrives: A's lease is cut back to its 5 ms turn, then A overruns by 300 ms
        waited = time.monotonic() - t
        assert 0.30 <= waited < 1.0, waited
        assert metric(d, "cgpu_overruns_total") == 1
        doc = AdminClient(d.admin).status()
        held = {i["id"]: i["held_seconds"] for g in doc["gpus"] for i in g["instances"]}
        assert held["holder"] >= 0.30  # charged up to the cut-off
        for _ in range(50):  # the others carry on
            with gate.work():
                time.sleep(0.001)
        assert holder.poll() is None and d.proc is not None and d.proc.poll() is None
        gate.close()
        good.close()
    finally:
        holder.kill()
        holder.wait(5)


def test_daemon_sigkill_and_restart_clients_resume_settings_intact(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "2x16GiB", "--identity", "declared")
    for value, path in [("create web gpu=0 weight=3 highprio=1 memsize=2GiB", "inst_ctl"), ("4", "0/policy"),
                        ("12", "1/max_inst"), ("70", "0/prio_ratio"), ("1GiB", "default_memsize")]:
        assert d.ctl("echo", value, path).returncode == 0
    snapshot = {p: d.ctl("cat", p).stdout for p in ["0/policy", "1/max_inst", "0/prio_ratio", "default_memsize",
                                                    "0/web/weight", "0/web/highprio", "0/web/memsize", "inst_ctl"]}
    client = Client(d.sock, "web", [0])
    assert client.start(10)
    gate = Gate(client, 0)
    with gate.work():
        pass
    assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    d.start()
    with gate.work():  # waits for the reconnection, then gets a lease from the new daemon
        pass
    assert client.connects == 2
    assert {p: d.ctl("cat", p).stdout for p in snapshot} == snapshot
    gate.close()
    client.close()


def test_unwritable_state_dir_refuses_admin_writes_and_keeps_the_old_state(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB")
    assert d.ctl("echo", "3", "0/policy").returncode == 0
    assert d.proc is not None
    blocker = d.state_dir / f".state.json.{d.proc.pid}.tmp"
    blocker.mkdir()  # the temporary file cannot be created (root ignores file modes, so this stands in)
    r = d.ctl("echo", "4", "0/policy")
    assert r.returncode == 1 and "state could not be saved" in r.stderr and "nothing was changed" in r.stderr
    assert d.ctl("cat", "0/policy").stdout == "3\n"
    assert json.loads((d.state_dir / "state.json").read_text())["gpus"]["0"]["policy"] == 3
    blocker.rmdir()
    assert d.ctl("echo", "4", "0/policy").returncode == 0


@pytest.mark.skipif(subprocess.run(["which", "prlimit"], capture_output=True).returncode != 0,
                    reason="prlimit (util-linux) is not installed")
def test_full_disk_refuses_admin_writes_and_keeps_the_old_state(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB")
    assert d.ctl("echo", "3", "0/policy").returncode == 0
    assert d.proc is not None
    # no file of the daemon may grow past 64 bytes: writes fail with EFBIG, as on a full disk
    subprocess.run(["prlimit", f"--pid={d.proc.pid}", "--fsize=64"], check=True)
    r = d.ctl("echo", "4", "0/policy")
    assert r.returncode == 1 and "state could not be saved" in r.stderr
    assert d.ctl("cat", "0/policy").stdout == "3\n"
    assert json.loads((d.state_dir / "state.json").read_text())["gpus"]["0"]["policy"] == 3
    assert not list(d.state_dir.glob(".state.json.*.tmp"))  # nothing half-written left behind
    assert os.path.exists(ROOT)
