"""Bad input: fuzzed frames and handlers, random admin values, slow clients, floods, bad env vars."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiterd.core import snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo, InstanceSettings
from arbiterd.core.errors import CoreError
from bench.hotpath import FakeTransport
from cgpu_protocol import MESSAGES
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import tool
from tests.helpers import BackgroundGate, RawClient

GIB = 1024**3
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=40), st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=5)),
                      max_leaves=12)
ops = st.sampled_from([*MESSAGES, "nope", ""])
requests = st.builds(lambda op, fields: {"op": op, **fields}, ops,
                     st.dictionaries(st.sampled_from(["id", "gpu", "lease", "used_ns", "again", "bytes", "instance",
                                                      "gpus", "weight", "highprio", "memsize", "versions", "client"]),
                                     values, max_size=6))


Transport = FakeTransport  # what a ClientConnection writes to, in process


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss_of_daemon(d: DaemonProc) -> int:
    """The RSS of the daemon's Python process (the console script is a thin exec-less wrapper)."""
    assert d.proc is not None
    return rss_kib(d.proc.pid)


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="cg-fz-", dir="/tmp"))
    d = DaemonProc(tmp, "--sim-gpus", "1x16GiB", "--identity", "declared")
    d.start()
    with BackgroundGate(d.sock, hold_s=0.0002) as good:
        yield d, good.gate, good.client
    assert good.errors == []
    d.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(requests.map(lambda m: msgpack.packb(m, use_bin_type=True)), values.map(msgpack.packb),
                          st.binary(max_size=64)), min_size=1, max_size=6),
       st.booleans())
def test_fuzzed_frames_never_hurt_the_daemon_or_other_clients(fuzz_daemon: Any, frames: list[bytes],
                                                             greet: bool) -> None:
    d, _, _ = fuzz_daemon
    raw = RawClient(d.sock, timeout=2)
    try:
        if greet:
            raw.send({"op": "hello", "versions": [1], "client": "fuzz"})
        for frame in frames:
            raw.send_raw(frame)
        raw.closed(timeout=0.02)  # drain what the daemon answered (an error, or nothing yet)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon closed us for a bad frame, as it should
    finally:
        raw.close()  # a frame may be left half-sent: the daemon drops it with the connection
    assert d.proc.poll() is None


def test_after_fuzzing_the_daemon_is_up_bounded_and_the_good_client_never_noticed(fuzz_daemon: Any) -> None:
    d, gate, good = fuzz_daemon
    before = rss_of_daemon(d)
    for _ in range(300):  # many more garbage connections: memory must not grow with them
        raw = RawClient(d.sock)
        raw.send_raw(msgpack.packb({"op": "hello", "versions": [1], "client": "x" * 1000}) + b"\xc1" * 100)
        raw.closed(timeout=5)
        raw.close()
    assert rss_of_daemon(d) - before < 20 * 1024  # KiB
    acquires = gate.acquires
    time.sleep(0.5)
    assert gate.acquires > acquires  # the good client is still being served
    assert good.connects == 1


def _arb() -> Arbiter:
    a = Arbiter([GpuInfo(0, "sim", "GPU-a", 16 * GIB, True)], ArbiterConfig())
    a.provision("c1", [0], InstanceSettings(2, False, GIB), 0)
    a.connect(1, 100, 0)
    a.register(1, "c1", [0], {}, 0)
    return a


PATHS = ["version", "default_memsize", "inst_ctl", "upgrade", "0", "0/policy", "0/max_inst", "0/prio_ratio",
         "0/free_weight", "0/major", "0/slice_ms", "0/overrun_ms", "0/busy_ms", "0/c1", "0/c1/id", "0/c1/weight",
         "0/c1/highprio", "0/c1/memsize", "0/c1/meminfo", "1/policy", "0/zz/weight", "../x", ""]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PATHS), st.one_of(st.text(max_size=30), st.integers(-(10**12), 10**12).map(str),
                                         st.sampled_from(["0", "1", "25", "26", "-1", "99", "1GiB", " 3 ", "3\n",
                                                          "create x weight=30", "remove c1", "0x10", "1e3"])))
def test_random_values_for_every_admin_file(path: str, value: str) -> None:
    """Every write either succeeds and reads back, or is refused with one line and changes nothing."""
    arb = _arb()
    before = snapshot.take(arb)
    try:
        tree.write(arb, path, value, 0)
    except CoreError as exc:
        assert str(exc) and "\n" not in str(exc)
        assert snapshot.take(arb) == before
    tree.read(arb, "", 0)  # the tree stays readable


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, min_size=1, max_size=8))
def test_message_handlers_answer_every_request_without_raising(msgs: list[dict[str, Any]]) -> None:
    """The connection's handlers, in process, on random requests after a valid handshake."""
    import asyncio

    from arbiterd.server.config import Config
    from arbiterd.server.connection import ClientConnection
    from arbiterd.server.daemon import Daemon

    async def go() -> None:
        daemon = Daemon(Config(sim_gpus="1x1GiB", identity="declared", state_dir="/nonexistent-cgpu-state"))
        conn = ClientConnection(daemon.hub)
        t = Transport()
        conn.connection_made(t)  # type: ignore[arg-type]
        conn.data_received(msgpack.packb({"op": "hello", "versions": [1], "client": "h"}))
        for msg in msgs:
            conn.data_received(msgpack.packb(msg, use_bin_type=True))
            if conn.closed:
                break
        conn.connection_lost(None)
        assert daemon.hub.peers == {}

    asyncio.run(go())


def test_a_frame_is_timed_from_its_first_byte_not_from_the_last_message() -> None:
    """A client idle for longer than frame_timeout_s whose next frame arrives in two reads is not dropped
    between them; a frame that stays cut short is, frame_timeout_s after its first byte."""
    import asyncio

    from arbiterd.server.config import Config
    from arbiterd.server.connection import ClientConnection
    from arbiterd.server.daemon import Daemon

    async def go() -> None:
        daemon = Daemon(Config(sim_gpus="1x1GiB", identity="declared", state_dir="/nonexistent-cgpu-state",
                               idle_timeout_s=3600))
        conn = ClientConnection(daemon.hub)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        conn.data_received(msgpack.packb({"op": "hello", "versions": [1], "client": "h"}))
        assert conn.greeted and conn.partial_for_ns(time.monotonic_ns()) == 0
        conn.arrived_ns -= int(60e9)  # the last whole message came a minute ago
        frame = msgpack.packb({"op": "register", "id": 1, "instance": "a", "gpus": [0]})
        conn.data_received(frame[:5])
        daemon._drop_stalled()
        assert not conn.closed  # the frame began just now
        conn.data_received(frame[5:])
        assert not conn.closed and conn.partial_for_ns(time.monotonic_ns()) == 0
        conn.data_received(frame[:5])
        stale = int(daemon.hub.config.frame_timeout_s * 1e9) + 1
        conn.partial_since_ns -= stale
        conn.data_received(frame[5:] + frame[:5])  # one read ends that frame and begins the next
        daemon._drop_stalled()
        assert not conn.closed
        conn.partial_since_ns -= stale
        conn.data_received(frame[5:8])  # more of the same frame: it keeps its start
        daemon._drop_stalled()
        assert conn.closed  # this one has been arriving for longer than frame_timeout_s

    asyncio.run(go())


def test_slow_clients_are_timed_out(daemon_factory: type, short_tmp: Path) -> None:
    cfg = short_tmp / "slow.toml"
    cfg.write_text("handshake_timeout_s = 1.0\nframe_timeout_s = 1.5\n")
    d = daemon_factory.start("--config", str(cfg), "--sim-gpus", "1x1GiB")
    silent = RawClient(d.sock)
    trickle = RawClient(d.sock)
    trickle.send({"op": "hello", "versions": [1], "client": "t"})
    assert trickle.recv()["op"] == "welcome"
    frame = msgpack.packb({"op": "register", "id": 1, "instance": "a", "gpus": [0]})
    t0 = time.monotonic()
    for i in range(4):  # one byte a second: never a whole frame
        trickle.send_raw(frame[i:i + 1])
        time.sleep(1.0)
        if trickle.closed(timeout=0.01):
            break
    assert trickle.closed(timeout=3)
    assert silent.closed(timeout=3)
    assert time.monotonic() - t0 < 6


def test_connection_flood_beyond_max_clients_is_refused(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x1GiB", "--max-clients", "10", "--identity", "declared",
                             "--client-reserve", "0")  # one tenant may take every slot
    held = []
    for _ in range(10):
        c = RawClient(d.sock)
        c.send({"op": "hello", "versions": [1], "client": "f"})
        assert c.recv()["op"] == "welcome"
        held.append(c)
    extra = RawClient(d.sock)
    msg = extra.recv()
    assert msg["op"] == "error" and msg["code"] == "busy" and "too many clients" in msg["message"]
    assert extra.closed()
    held.pop().close()
    time.sleep(0.2)
    again = RawClient(d.sock)
    assert again.hello_register("late")["op"] == "registered"  # room again once one left
    for c in [*held, again]:
        c.close()


@pytest.mark.parametrize(("name", "value"), [
    ("ALIYUN_COM_GPU_MEM_CONTAINER", "lots"), ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "gpu0"),
    ("ALIYUN_COM_GPU_HIGH_PRIO", "yes"), ("CGPU_DISABLE", "perhaps"), ("CGPU_IDLE_MS", "-3"),
])
def test_malformed_env_in_cgpu_run_is_one_line(name: str, value: str) -> None:
    r = subprocess.run([tool("cgpu-run"), "--", sys.executable, "-c", "print('ran')"],
                       env={**os.environ, name: value}, capture_output=True, text=True)
    assert r.returncode == 2 and "ran" not in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and name in r.stderr


def test_socket_of_a_dead_daemon_is_reclaimed(short_tmp: Path) -> None:
    """A stale arbiter.sock left by a killed daemon does not stop the next one."""
    run = short_tmp / "run"
    run.mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run / "arbiter.sock"))
    s.close()  # a socket file with nobody behind it
    d = DaemonProc(short_tmp, "--sim-gpus", "1x1GiB")
    d.start()
    assert d.stop() == 0


def test_a_register_with_a_core_percentage_off_the_grid_is_refused(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared", "--client-env-max-weight", "25")
    for bad in (0, 33, 105, "30"):
        c = RawClient(d.sock)
        reply = c.hello_register("pct", core_percent=bad)
        assert (reply["op"], reply["code"]) == ("error", "bad_request"), reply
        c.close()
    assert d.ctl("cat", "0/policy").stdout.strip() == "1" and "pct" not in d.ctl("ls", "0").stdout.split()
    c = RawClient(d.sock)
    reply = c.hello_register("pct", core_percent=30, weight=6)
    assert reply["op"] == "registered" and reply["gpus"][0]["weight"] == 6
    assert d.ctl("cat", "0/policy").stdout.strip() == "3"
    c.close()
