"""Every resource of the daemon has an owner, a budget and a reserve: connection slots, file descriptors, the
admin API's connections, and the loop's time counted by what a request costs to decode.

Before: four containers (or eight host uids) at their caps held every one of ``max_clients``, and every new tenant
was refused; at a soft limit of 1024 descriptors the fourth container was refused at 237 connections and root's
``cgpuctl`` got ``admin API refused``; 1006 idle TCP connections held the admin listener for 45 s; a request of
61 000 empty maps counted as one, and the victim's round trip p99 read 64 ms (277 ms from eight connections).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time

from cgpu_testing.tools import root_on_path, still_open
from tests.security.conftest import Cast, needs_root
from tests.security.test_floods import p99, rtts


@needs_root
def test_four_tenants_at_their_caps_leave_a_fifth_and_root_room(cast: Cast) -> None:
    """max_clients 40, 10 a container, 8 kept in reserve for tenants holding fewer than 4: four containers take
    all they may (10, 10, 10, then 2 of the shared slots and 2 of the reserve); a fifth still connects, and root's
    admin.sock answers."""
    d = cast.daemon("--sim-gpus", "1x1GiB", "--max-clients", "40", "--max-clients-per-instance", "10",
                    "--client-reserve", "8")
    held = [cast.agent(d, cid=cast.containers.new_id()).call("flood_connect", n=12) for _ in range(4)]
    assert [h["open"] for h in held] == [10, 10, 10, 4], held
    assert all(h["refused"] == 2 for h in held[:3]) and held[3]["refused"] == 8, held
    fifth = cast.agent(d, cid=cast.containers.new_id())
    assert fifth.register()["op"] == "registered"
    assert d.ctl("cat", "0/policy").returncode == 0  # type: ignore[attr-defined]
    late = cast.agent(d, cid=cast.containers.new_id()).call("flood_connect", n=6)
    assert late["open"] == 4 and late["refused"] == 2, late  # a newcomer's first 4 come from the reserve: 39
    last = cast.agent(d, cid=cast.containers.new_id()).call("flood_connect", n=3)
    assert last["open"] == 1 and last["refused"] == 2, last  # and max_clients itself still holds: 40


def _start_under(limit: tuple[int, int]) -> subprocess.CompletedProcess[str]:
    """The start-up check at the defaults, in a process under descriptor limits (soft, hard)."""
    prog = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, {limit})\n"
            "from arbiterd.server.config import Config\n"
            "from arbiterd.server import limits\n"
            "why = limits.shortfall(Config())\n"
            "print(why or 'ok', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=root_on_path(),
                          timeout=30)


def test_the_descriptor_limit_is_raised_to_fit_or_the_start_says_what_to_change() -> None:
    raised = _start_under((1024, 4096))
    assert raised.stdout.split() == ["ok", "1408"], raised  # 1024 clients + 2 x 64 admin + 256 of its own
    short = _start_under((1024, 1024))
    assert short.stdout.startswith("max_clients 1024 and max_admin_clients 64 need 1408 file descriptors, and the "
                                   "limit is 1024: raise LimitNOFILE"), short


def test_a_daemon_that_cannot_have_its_descriptors_does_not_start(cast: Cast) -> None:
    d = cast.daemon(sub="limited", start=False)
    prog = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_NOFILE, (2048, 2048))\n"
            "from arbiterd.main import main\nsys.exit(main(sys.argv[1:]))\n")
    args = ["--run-dir", str(d.run_dir), "--state-dir", str(d.state_dir), "--sim-gpus", "1x1GiB",
            "--max-clients", "5000"]
    r = subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, env=root_on_path(),
                       timeout=30)
    assert r.returncode != 0 and "raise LimitNOFILE (ulimit -n) to 5384 or more" in r.stderr, r.stderr[-400:]


def test_the_admin_tcp_listener_caps_its_connections_and_closes_silent_ones(cast: Cast) -> None:
    d, port, _ = _admin_tcp_daemon(cast, "--max-admin-clients", "8", "--admin-request-timeout-s", "1")
    time.sleep(1.2)  # the probe's connection is gone
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
    try:
        time.sleep(0.3)
        open_now = [c for c in conns if still_open(c)]
        assert len(open_now) == 8, len(open_now)  # the rest closed as they came
        assert d.ctl("cat", "0/policy").returncode == 0  # type: ignore[attr-defined]  # admin.sock: not counted
        time.sleep(1.5)
        assert not any(still_open(c) for c in conns)  # no complete request within admin_request_timeout_s
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")  # a request never finished
        time.sleep(1.5)
        assert not still_open(half)
        half.close()
    finally:
        for c in conns:
            c.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_root
def test_a_flood_of_requests_costly_to_decode_costs_its_sender_by_their_bytes(cast: Cast) -> None:
    """Eight connections of one container send requests of 4 160 empty maps each (about 4 KiB: what the daemon
    still takes) as fast as they can; each counts by its bytes in its tenant's turn, so another tenant's round
    trip stays within a few ms (before: each counted as one, and a refused one never ended the turn). A frame of
    61 000 maps (64 KiB) is refused whole and closes its connection."""
    d = cast.daemon("--sim-gpus", "2x1GiB", "--client-mode", "0666")
    attacker = cast.agent(d, cid=cast.containers.new_id())
    assert attacker.call("flood_connect", n=8)["open"] == 8
    result: dict[str, object] = {}
    flooder = threading.Thread(target=lambda: result.update(attacker.call("flood_bytes", seconds=4.0, conns=8)))
    flooder.start()
    time.sleep(0.5)
    during = rtts(d.sock, 3.0)
    flooder.join()
    assert int(result["sent"]) > 1_000 and result["closed"] == 0, result  # type: ignore[call-overload]
    assert statistics.median(during) < 5 and p99(during) < 30, (statistics.median(during), p99(during))
    big = cast.agent(d, cid=cast.containers.new_id())
    assert big.call("flood_connect", n=1)["open"] == 1
    assert big.call("flood_bytes", seconds=0.5, conns=1, items=4096)["closed"] == 1


def _admin_tcp_daemon(cast: Cast, *args: str) -> tuple[object, int, str]:
    """A daemon with the loopback admin listener, once that accepts (it starts just after admin.sock): the daemon,
    the port and the bearer token."""
    port = _free_port()
    d = cast.daemon("--sim-gpus", "1x1GiB", "--admin-listen", f"127.0.0.1:{port}", *args)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    token = (d.state_dir / "admin.token").read_text().strip()  # type: ignore[attr-defined]
    return d, port, token


def _ask(s: socket.socket, token: str | None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    s.settimeout(5)
    s.sendall(f"GET /v1/tree/0/policy HTTP/1.1\r\nHost: x\r\n{auth}{extra}\r\n".encode())
    return s.recv(65536)


def test_refused_admin_requests_close_their_connection_so_asking_again_holds_no_slot(cast: Cast) -> None:
    """The red team held all 64 TCP slots with a request without the token every 0.3 s: each 401 gave the
    connection admin_request_timeout_s again, and operators holding the token were reset 10 times in 10. Now a
    refusal closes its connection, and only an authorised answer renews the time."""
    _d, port, token = _admin_tcp_daemon(cast, "--max-admin-clients", "8", "--admin-request-timeout-s", "2")
    time.sleep(2.5)  # the probe's connection is gone
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    try:
        for s in held:
            assert _ask(s, None).startswith(b"HTTP/1.1 401")
        time.sleep(0.3)
        assert not any(still_open(s) for s in held)  # each closed with its refusal
        with socket.create_connection(("127.0.0.1", port)) as op:
            answer = _ask(op, token)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n1\n"), answer
    finally:
        for s in held:
            s.close()


def test_admin_request_headers_are_bounded_before_the_token_is_checked(cast: Cast) -> None:
    """aiohttp takes 128 headers of 8 KiB by default: 64 connections of such headers, never finished, took the
    daemon from 45 to 173 MiB before any token was read. An admin request needs a path and a token: headers are
    bounded at 32, of 2 KiB each."""
    _, port, token = _admin_tcp_daemon(cast)
    for extra in ("X-Pad: " + "a" * 3000 + "\r\n", "".join(f"X-{i}: a\r\n" for i in range(40))):
        with socket.create_connection(("127.0.0.1", port)) as s:
            assert _ask(s, token, extra).split(b" ", 2)[1] == b"400"  # aiohttp answers a bad head as HTTP/1.0
    with socket.create_connection(("127.0.0.1", port)) as s:
        assert _ask(s, token, "X-Pad: " + "a" * 1000 + "\r\n").startswith(b"HTTP/1.1 200")
