"""Bounded per tenant: a flood of connections, of idle greetings, of requests, or of replies never read, costs the
uid (or container) that sends it, and another tenant still connects and is answered within a few ms."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import RawClient
from tests.security.conftest import NOBODY, Cast, needs_root


def rtts(sock: str, seconds: float, instance: str = "uid-0", gpu: int = 0) -> list[float]:
    """Acquire -> grant -> release -> ok round trips (ms) of one client alone on ``gpu``, for ``seconds``."""
    c = RawClient(sock)
    reply = c.hello_register(instance, [gpu])
    assert reply["op"] == "registered", reply
    out = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        t0 = time.perf_counter()
        c.send({"op": "acquire", "id": 2 * n, "gpu": gpu})
        grant = c.recv()
        assert grant["op"] == "grant", grant
        c.send({"op": "release", "id": 2 * n + 1, "gpu": gpu, "lease": grant["lease"], "used_ns": 0})
        assert c.recv()["op"] == "ok"
        out.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.002)
    c.close()
    return out


def p99(xs: list[float]) -> float:
    return sorted(xs)[int(0.99 * (len(xs) - 1))]


@needs_root
def test_a_connection_flood_from_one_uid_costs_only_that_uid(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--client-mode", "0666")
    flood = cast.agent(d, uid=NOBODY).call("flood_connect", n=160)
    assert (flood["open"], flood["refused"]) == (128, 32), flood  # max_clients_per_uid
    assert flood["errors"] == {"busy": 32}
    assert "uid 65534 holds 128 connections" in d.read_log()
    reply = cast.agent(d, cid=cast.containers.new_id()).register()
    assert reply["op"] == "registered"  # another tenant still connects
    assert statistics.median(rtts(d.sock, 1.0)) < 5


def test_a_container_is_capped_by_its_own_connections(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--max-clients-per-instance", "5")
    cid = cast.containers.new_id()
    flood = cast.agent(d, cid=cid).call("flood_connect", n=8)
    assert (flood["open"], flood["refused"]) == (5, 3)
    assert cast.agent(d, cid=cast.containers.new_id()).register()["op"] == "registered"


@needs_root
def test_idle_greeted_connections_are_closed_and_registered_ones_kept(cast: Cast) -> None:
    cfg = cast.tmp / "idle.toml"
    cfg.write_text("idle_timeout_s = 1\n")
    d = cast.daemon("--sim-gpus", "1x1GiB", "--client-mode", "0666", "--config", str(cfg))
    idle = cast.agent(d, uid=NOBODY)
    assert idle.call("flood_connect", n=10)["open"] == 10
    worker = cast.agent(d, cid=cast.containers.new_id())
    assert worker.register()["op"] == "registered"
    deadline = time.monotonic() + 10
    while idle.call("count_open")["open"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert idle.call("count_open") == {"open": 0}
    assert d.smi_json()["clients"] == 1  # the registered one stays


def test_a_client_that_never_reads_its_replies_is_closed_and_its_buffer_freed(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--max-unread-bytes", str(256 << 10))
    hog = cast.agent(d, cid=cast.containers.new_id())
    assert hog.call("flood_connect", n=1)["open"] == 1
    hog.call("flood_requests", seconds=3.0, read=False, conns=1)
    # its requests wait once 64 KiB of replies stand unread, and it is closed frame_timeout_s (5 s) later (asking
    # whether it is open reads it, so that is asked once)
    time.sleep(7.0)
    assert hog.call("count_open") == {"open": 0}
    assert "replies unread" in d.read_log()
    rss_kib = int(next(line for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines()  # type: ignore
                       if line.startswith("VmRSS:")).split()[1])
    assert rss_kib < 200 * 1024  # nothing of the hog's replies stays behind
    assert d.smi_json()["clients"] == 0


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


@needs_root
def test_a_container_that_reads_no_reply_on_any_of_its_connections_holds_little_of_the_daemons_memory(
        cast: Cast) -> None:
    """The red team's attack: 256 connections (all a container may hold), each sending 170 registers that name a
    GPU of 7 000 characters and reading no reply. Before, each refusal echoed the name (7 KB), and each connection
    could hold max_unread_bytes (1 MiB) of them: the daemon went from 45 to 327 MiB, and its pod's limit is 512
    MiB. Now a refusal names at most 64 characters of it, and a connection's requests wait once 64 KiB of its
    replies stand unread (backpressure)."""
    d = cast.daemon("--sim-gpus", "1x1GiB")
    before = _rss_mib(d.proc.pid)  # type: ignore[attr-defined]
    hog = cast.agent(d, cid=cast.containers.new_id())
    assert hog.call("flood_connect", n=256)["open"] == 256
    hog.call("flood_unread", n=170, gpu="A" * 7000)
    time.sleep(3.0)
    grown = _rss_mib(d.proc.pid) - before  # type: ignore[attr-defined]
    # a connection holds at most 64 KiB of replies and one read of its requests (the event loop reads up to
    # 256 KiB at a time): 80 MiB for 256 (measured 59; before: 181)
    assert grown < 96, grown
    probe = cast.agent(d)
    assert probe.register()["op"] == "registered"  # and the daemon answers another tenant


@needs_root
def test_a_request_flood_from_many_connections_leaves_another_tenant_answered_in_ms(cast: Cast) -> None:
    """20 connections of one uid send acquires, stats and memory queries as fast as they can, on the other GPU;
    a client of another uid goes on with its acquire/release round trips. Each tenant gets a bounded turn of
    the daemon's loop (intake.py), so the round trip stays within a few ms (noisy 2-core CI: the median within
    5 ms, 99 % within 30 ms)."""
    d = cast.daemon("--sim-gpus", "2x1GiB", "--client-mode", "0666")
    attacker = cast.agent(d, uid=NOBODY)
    assert attacker.call("flood_connect", n=20)["open"] == 20
    result: dict[str, object] = {}
    flooder = threading.Thread(target=lambda: result.update(attacker.call(
        "flood_requests", seconds=4.0, conns=20, gpu=1, register={"instance": None})))
    flooder.start()
    time.sleep(0.5)
    during = rtts(d.sock, 3.0)
    flooder.join()
    assert int(result["sent"]) > 10_000  # type: ignore[call-overload]
    print("RTT", statistics.median(during), p99(during), max(during))
    assert statistics.median(during) < 5 and p99(during) < 30, (statistics.median(during), p99(during))


@needs_root
def test_records_one_uid_makes_are_capped(cast: Cast) -> None:
    """Where ids are taken as declared (a development host), one uid still cannot make records without end."""
    d = cast.daemon("--sim-gpus", "1x1GiB", "--identity", "declared", "--max-records-per-uid", "3",
                    "--client-mode", "0666")
    replies = [cast.agent(d, uid=NOBODY).register(f"r{i}") for i in range(5)]
    assert [r["op"] for r in replies] == ["registered"] * 3 + ["error"] * 2
    assert replies[3]["code"] == "busy" and "max_records_per_uid" in replies[3]["message"]
    assert cast.agent(d).register("r9")["op"] == "registered"  # root, trusted, is not counted


@needs_root
def test_a_host_instance_is_capped_by_its_registered_connections(cast: Cast) -> None:
    """A host uid's instance counts its registered connections (a container's count from the connect); a
    registration that failed counts nothing."""
    d = cast.daemon("--sim-gpus", "1x1GiB", "--client-mode", "0666", "--max-clients-per-instance", "2")
    a = cast.agent(d, uid=NOBODY)
    assert a.register(gpus=[7])["code"] == "not_found"  # refused: counts nothing
    first, second, third = (cast.agent(d, uid=NOBODY) for _ in range(3))
    assert first.register()["op"] == second.register()["op"] == "registered"
    reply = third.register()
    assert reply["code"] == "busy" and "max_clients_per_instance" in reply["message"]
    assert d.ctl("echo", f"create other uid={NOBODY}", "inst_ctl").returncode == 0
    assert cast.agent(d, uid=NOBODY).register("other")["op"] == "registered"  # another instance, its own count
    first.stop()
    deadline = time.monotonic() + 5
    while third.register().get("op") != "registered":
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("junk", [40, 50_000])
def test_a_flood_of_failing_registrations_costs_only_its_sender(cast: Cast, junk: int) -> None:
    """Under allocations = required, a container with no token sends register after register on one connection.
    Each may read the container's allocation tokens: a register counts as many requests in its tenant's turn
    (intake.REGISTER_COST), and the log line each refusal could write is written once in 10 s. The mount may hold
    any number of entries (before: 300 000 were listed and sorted at every register, and another tenant's round
    trip read 1.7-2.5 s); only the first 32 are read."""
    mount = cast.tmp / "alloc"  # the container's allocation mount (read through /proc/<pid>/root): junk entries
    mount.mkdir()
    for i in range(junk):
        if junk <= 40:
            (mount / f"junk{i}").mkdir()
        else:
            os.close(os.open(mount / f"junk{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    d = cast.daemon("--sim-gpus", "1x1GiB", "--allocations", "required", "--alloc-mount", str(mount))
    spammer = cast.agent(d, cid=cast.containers.new_id())
    result: dict[str, object] = {}
    flood = threading.Thread(target=lambda: result.update(spammer.call("flood_register", seconds=4.0)))
    flood.start()
    time.sleep(0.5)
    probe = cast.agent(d)  # a host process: not bound by allocations
    assert probe.register()["op"] == "registered"
    rtt = probe.call("probe", seconds=3.0)["rtt_ms"]
    flood.join()
    assert int(result["answered"]) > 1000  # type: ignore[call-overload]
    assert statistics.median(rtt) < 5 and p99(rtt) < 30, (statistics.median(rtt), p99(rtt))
    assert len(d.read_log().splitlines()) < 50


@pytest.mark.parametrize("gpu", ["\u00b2", "1" * 4301, "A" * 7000])
def test_a_gpu_named_oddly_is_not_found_and_the_connection_stays(short_tmp: Path, gpu: str) -> None:
    """'\u00b2'.isdigit() is true and int() refuses it; so does int() of more than 4 300 digits: the error escaped the
    request's handler, the connection died and the event loop logged a traceback each time (3.2 MB in 3 s).
    A refusal names at most 64 characters of what it was given."""
    from cgpu_testing.daemon import DaemonProc

    with DaemonProc(short_tmp / "d", "--sim-gpus", "1x1GiB") as d:
        c = RawClient(d.sock)
        c.send({"op": "hello", "versions": [1], "client": "t"})
        assert c.recv()["op"] == "welcome"
        c.send({"op": "register", "id": 1, "instance": None, "gpus": [gpu]})
        reply = c.recv()
        assert reply["op"] == "error" and reply["code"] == "not_found" and len(reply["message"]) < 140, reply
        c.send({"op": "register", "id": 2, "instance": None, "gpus": [0]})
        assert c.recv()["op"] == "registered"
        c.close()
        assert "Fatal error" not in d.read_log() and "Traceback" not in d.read_log()


def test_a_connection_that_chats_without_registering_is_closed_at_idle_timeout(short_tmp: Path) -> None:
    """idle_timeout_s counts from the hello's answer: requests sent meanwhile (answered 'register first') do not
    renew it (before: a memory query every 0.5 s kept the connection past 5 s at idle_timeout_s = 1)."""
    from cgpu_testing.daemon import DaemonProc

    cfg = short_tmp / "arbiterd.toml"
    cfg.write_text("idle_timeout_s = 1\n")
    with DaemonProc(short_tmp / "d", "--config", str(cfg), "--sim-gpus", "1x1GiB") as d:
        c = RawClient(d.sock)
        c.send({"op": "hello", "versions": [1], "client": "t"})
        assert c.recv()["op"] == "welcome"
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 5 and not closed:
            try:
                c.send({"op": "mem_query", "id": 3, "gpu": 0})
            except OSError:
                break
            closed = c.closed(timeout=0.3)
        assert time.monotonic() - t0 < 3.5 and (closed or c.closed())
