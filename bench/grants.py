"""The daemon's grant path under load: the grant round trip at rising numbers of clients, and its capacity.

Python asyncio clients (in load processes of their own) and C clients (bench/native/grant_rtt.c, libcgpu.so's
codec, one thread each) acquire and release against arbiterd, GPU 0 on policy 5; and the floors under them: a bare
socket round trip between two C processes, an echo server and an answering server on the daemon's event loop.
``python -m bench.overhead --only grant`` runs it (bench/README.md says how each is measured).

Every grant level offers a fixed load (each client acquires and releases on a 5 ms schedule) and reports what was
achieved and the daemon's CPU. A level whose daemon uses more than 80 % of a core, or that achieves less than 95 %
of what it offered, is *saturated*: its latency is queueing, not the grant path, and is not the headline. The
headline is the highest unsaturated level, and the daemon's *capacity* is the load at which it uses 80 % of one
core (interpolated between the levels either side).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import cgpu_protocol as proto
from arbiterd.server.realtime import apply_realtime
from bench.common import percentile
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT
from libcgpu_client.aio import AsyncClient
from libcgpu_client.client import wait_for_socket

SLICE_S = 0.005  # each client's period: one acquire+release every slice
C_LEVELS = (1, 8, 16, 24, 32, 48, 64, 96, 128)  # C clients per level; 64 is run --runs times
PY_LEVELS = (1, 16, 64)
SATURATED_CPU = 0.80  # a level whose daemon uses more of one core than this is saturated,
SATURATED_ACHIEVED = 0.95  # and so is one that achieves less than this of the load it offered


async def _grant_loop(sock: str, n: int, seconds: float) -> list[float]:
    """``n`` clients, each acquiring and releasing on a fixed 5 ms schedule (an open loop: one that
    falls behind goes again at once); the round trips, in us."""
    # 8 instances (a GPU has at most 25 weight slots); under policy 5 each client has its own lease
    clients = [await AsyncClient.connect(sock, f"rtt-{i % 8}", [0]) for i in range(n)]
    samples: list[float] = []
    end = time.monotonic() + seconds

    async def one(c: AsyncClient) -> None:
        due = time.monotonic() + random.random() * SLICE_S
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if time.monotonic() >= end:
                return
            due += SLICE_S
            t0 = time.monotonic_ns()
            lease, _ = await c.acquire(0)
            samples.append((time.monotonic_ns() - t0) / 1e3)
            c.release(0, lease, 0)

    await asyncio.gather(*(one(c) for c in clients))
    for c in clients:
        await c.close()
    return samples


def _worker(sock: str, n: int, seconds: float, out: str) -> None:
    """One load process: ``n`` asyncio clients on uvloop; writes its samples to ``out`` as JSON."""
    import uvloop

    Path(out).write_text(json.dumps(uvloop.run(_grant_loop(sock, n, seconds))))


def cpu_ns(pid: int) -> int:
    """CPU time the live threads of process ``pid`` have used, in ns, from ``/proc/PID/task/*/schedstat``
    (exact, where ``/proc/PID/stat``'s clock ticks charge a process that wakes with the tick a whole tick)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def loaded(pid: int, clients: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One grant level: ``run()`` drives ``clients`` clients against the server ``pid`` and returns
    ``p50_us``, ``p99_us``, ``samples``, ``pairs_per_s`` (achieved) and ``pairs_total``. Adds the load
    offered, the server's CPU share over the level and its CPU per pair, and whether it saturated."""
    cpu0, t0 = cpu_ns(pid), time.monotonic_ns()
    res = run()
    wall, cpu = time.monotonic_ns() - t0, cpu_ns(pid) - cpu0
    offered = clients / SLICE_S
    share = cpu / wall
    return {**res, "offered_pairs_per_s": round(offered), "achieved_pairs_per_s": round(res["pairs_per_s"]),
            "daemon_cpu_pct": round(100 * share, 1),
            "daemon_cpu_us_per_pair": round(cpu / max(1, res["pairs_total"]) / 1e3, 1),
            "saturated": share > SATURATED_CPU or res["pairs_per_s"] < SATURATED_ACHIEVED * offered}


def capacity(levels: dict[str, dict[str, Any]]) -> int:
    """Pairs/s at which the daemon uses 80 % of one core: interpolated between the two levels whose CPU
    shares straddle it; scaled from the nearest level where none do (every level below, or above, 80 %)."""
    pts: list[tuple[float, float]] = sorted((r["daemon_cpu_pct"] / 100, r["achieved_pairs_per_s"])
                                            for r in levels.values())
    for (s0, r0), (s1, r1) in itertools.pairwise(pts):
        if s0 <= SATURATED_CPU <= s1 and s1 > s0:
            return round(r0 + (r1 - r0) * (SATURATED_CPU - s0) / (s1 - s0))
    share, rate = pts[-1] if pts[-1][0] < SATURATED_CPU else pts[0]
    return round(rate * SATURATED_CPU / share) if share > 0 else 0


def headline(levels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The highest level that is not saturated (its latency is the headline; with every level saturated,
    the lowest, marked so) and the daemon's capacity (:func:`capacity`)."""
    calm = [n for n, r in levels.items() if not r["saturated"]]
    top = max(calm, key=int) if calm else min(levels, key=int)
    r = levels[top]
    return {"clients": int(top) if calm else 0, "p50_us": r["p50_us"], "p99_us": r["p99_us"],
            "capacity_pairs_per_s": capacity(levels), "every_level_saturated": not calm}


def grant_round_trip(sock: str, pid: int, seconds: float, procs: int = 2) -> dict[str, dict[str, Any]]:
    """Python asyncio clients spread over ``procs`` load processes, so the load side is not the bottleneck."""
    out = {}
    for n in PY_LEVELS:
        parts = [n // procs + (1 if i < n % procs else 0) for i in range(min(procs, n))]

        def run(parts: list[int] = parts) -> dict[str, Any]:
            paths = [tempfile.mktemp(prefix="cgpu-rtt-", suffix=".json") for _ in parts]
            workers = [subprocess.Popen([sys.executable, "-c", "from bench.grants import _worker; "
                                         f"_worker({sock!r}, {k}, {seconds}, {path!r})"], cwd=ROOT)
                       for k, path in zip(parts, paths, strict=True)]
            samples: list[float] = []
            for w, path in zip(workers, paths, strict=True):
                if w.wait(timeout=seconds + 60) != 0:
                    raise RuntimeError("a load process failed")
                samples += json.loads(Path(path).read_text())
                Path(path).unlink()
            return {"p50_us": round(percentile(samples, 0.5), 1), "p99_us": round(percentile(samples, 0.99), 1),
                    "samples": len(samples), "pairs_per_s": len(samples) / seconds, "pairs_total": len(samples),
                    "load_processes": len(parts)}

        out[str(n)] = loaded(pid, n, run)
    return out


def run_rtt(cmd: list[str], seconds: float) -> dict[str, Any]:
    """Run grant_rtt or pingpong; their last line is ``name k=v ...`` (grant_rtt's with the pairs)."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=True)
    kv = dict(f.split("=") for f in res.stdout.split()[1:])
    out: dict[str, Any] = {"p50_us": float(kv["p50_us"]), "p99_us": float(kv["p99_us"]), "samples": int(kv["samples"])}
    if "pairs_total" in kv:
        out |= {"pairs_per_s": float(kv["pairs_per_s"]), "pairs_total": int(kv["pairs_total"])}
    return out


def native_grants(sock: str, pid: int, seconds: float, runs: int = 3, realtime_priority: int = 0
                  ) -> dict[str, Any]:
    """The grant round trip from C clients against the daemon ``pid``, level by level (:func:`loaded`),
    and the floors: a bare socket round trip between two C processes, paced like the clients, with no
    daemon in between; an echo server, and an answering server, on the daemon's event loop.

    The 64-client level runs ``runs`` times: a noisy second on this VM moves one run by 20 us (even the
    bare floor doubles then), so the run with the median p50 is kept, with every run's p50 and p99."""
    from libcgpu_client.native import HERE as native_dir
    from libcgpu_client.native import build as nb

    out = Path(tempfile.mkdtemp(prefix="cgpu-rtt-"))
    rtt = nb.build_program([ROOT / "bench/native/grant_rtt.c", native_dir / "mp.c"], out / "grant_rtt")
    pingpong = nb.build_program([ROOT / "bench/native/pingpong.c"], out / "pingpong")

    grants: dict[str, dict[str, Any]] = {}
    for n in C_LEVELS:
        cmd = [str(rtt), sock, str(n), str(seconds)]
        each = [loaded(pid, n, functools.partial(run_rtt, cmd, seconds))
                for _ in range(max(1, runs) if n == 64 else 1)]
        median = sorted(each, key=lambda r: r["p50_us"])[len(each) // 2]
        grants[str(n)] = {**median, "runs": [[r["p50_us"], r["p99_us"]] for r in each]} if len(each) > 1 else median
    floor = run_rtt([str(pingpong), str(seconds)], seconds)
    echo_sock, answer_sock = str(out / "echo.sock"), str(out / "answer.sock")
    floor_loop = _against("_echo_server", (echo_sock,), [str(pingpong), str(seconds), echo_sock], seconds)
    floor_protocol = _against("_answer_server", (answer_sock, realtime_priority),
                              [str(rtt), answer_sock, "64", str(seconds)], seconds, clients=64)
    shutil.rmtree(out, ignore_errors=True)
    return {"grant_round_trip_c": grants, "headline": headline(grants), "socket_round_trip_floor": floor,
            "event_loop_floor": floor_loop, "protocol_floor_64": floor_protocol}


def _against(server: str, args: tuple[Any, ...], cmd: list[str], seconds: float, clients: int = 0
             ) -> dict[str, Any]:
    """Start ``server(*args)``, a server of this module whose first argument is its socket, in a
    process of its own; measure ``cmd`` against it with :func:`run_rtt` (as a level of ``clients``
    clients with :func:`loaded`, when given); stop it."""
    call = f"from bench.grants import {server}; {server}{args!r}"
    server_proc = subprocess.Popen([sys.executable, "-c", call], cwd=ROOT)
    try:
        if not wait_for_socket(args[0], 15):
            raise RuntimeError(f"{server} did not start")
        if clients:
            return loaded(server_proc.pid, clients, lambda: run_rtt(cmd, seconds))
        return run_rtt(cmd, seconds)
    finally:
        server_proc.terminate()
        server_proc.wait(10)


def _serve_unix(path: str, protocol: Callable[[], asyncio.Protocol]) -> None:
    """Serve ``protocol`` on a UNIX socket at ``path`` on uvloop, the daemon's event loop, for ever."""
    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_unix_server(protocol, path)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


def _echo_server(path: str) -> None:
    """An echo server on the daemon's event loop (uvloop), doing nothing else: the floor a Python
    daemon starts from."""

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    _serve_unix(path, Echo)


def _answer_server(path: str, realtime_priority: int) -> None:
    """The protocol with no daemon behind it: on the daemon's event loop and at its priority, it
    welcomes, registers and grants every acquire at once, and ignores everything else. Its round
    trip at 64 clients is the part of the daemon's figure that is not the daemon's own work."""
    import msgpack

    apply_realtime(realtime_priority)
    welcome = proto.Welcome(proto.PROTOCOL_VERSION, "answer", proto.MAX_MESSAGE, "CLOCK_MONOTONIC").pack()

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.unpacker = msgpack.Unpacker(raw=False)
            self.leases = 0

        def data_received(self, data: bytes) -> None:
            self.unpacker.feed(data)
            for msg in self.unpacker:
                op = msg.get("op")
                if op == "acquire":
                    self.leases += 1
                    self.transport.write(proto.Grant(msg["gpu"], self.leases, time.monotonic_ns() + 10**9).pack())
                elif op == "hello":
                    self.transport.write(welcome)
                elif op == "register":
                    self.transport.write(proto.Registered(msg["id"], "answer", [], []).pack())

    _serve_unix(path, Answer)


def start_daemon(tmp: Path, realtime_priority: int) -> DaemonProc:
    """arbiterd on two simulated GPUs, GPU 0 on policy 5, started (the caller stops it)."""
    daemon = DaemonProc(tmp, "--sim-gpus", "2x16GiB", "--identity", "declared", "--max-clients", "4096",
                        "--max-inst", "25", "--log-level", "warning", "--realtime-priority", str(realtime_priority))
    daemon.start()
    try:
        daemon.echo("5", "0/policy")
    except BaseException:
        daemon.stop()
        raise
    return daemon


def normal_priority_grants(seconds: float) -> dict[str, Any]:
    """The 64-client C round trip again, against a daemon at normal priority (for comparison)."""
    from libcgpu_client.native import HERE as native_dir
    from libcgpu_client.native import build as nb

    tmp = Path(tempfile.mkdtemp(prefix="cgpu-ovh-"))
    try:
        rtt = nb.build_program([ROOT / "bench/native/grant_rtt.c", native_dir / "mp.c"], tmp / "grant_rtt")
        with start_daemon(tmp / "d", 0) as daemon:
            return loaded(daemon.pid, 64, lambda: run_rtt([str(rtt), daemon.sock, "64", str(seconds)], seconds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _runs(runs: list[list[float]]) -> str:
    return ", ".join(f"{p50} / {p99}" for p50, p99 in runs)


LEVEL_HEADER = ("| clients | offered pairs/s | achieved pairs/s | daemon CPU | CPU per pair | grant p50 | grant p99 "
                "| samples | |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")


def level_rows(levels: dict[str, dict[str, Any]]) -> list[str]:
    """One markdown row per grant level; a saturated level says so, and its latency is queueing."""
    return [f"| {n} | {r['offered_pairs_per_s']} | {r['achieved_pairs_per_s']} | {r['daemon_cpu_pct']} % | "
            f"{r['daemon_cpu_us_per_pair']} us | {r['p50_us']} us | {r['p99_us']} us | {r['samples']} | "
            f"{'saturated' if r['saturated'] else ''} |" for n, r in levels.items()]


def print_levels(title: str, levels: dict[str, dict[str, Any]]) -> None:
    print(title)
    print(f"{'clients':>8} {'offered/s':>10} {'achieved/s':>11} {'daemon CPU':>11} {'us CPU/pair':>12} "
          f"{'p50 us':>9} {'p99 us':>9} {'samples':>8}")
    for n, r in levels.items():
        print(f"{n:>8} {r['offered_pairs_per_s']:>10} {r['achieved_pairs_per_s']:>11} {r['daemon_cpu_pct']:>10}% "
              f"{r['daemon_cpu_us_per_pair']:>12} {r['p50_us']:>9} {r['p99_us']:>9} {r['samples']:>8}"
              f"{'  saturated' if r['saturated'] else ''}")


def summary(head: dict[str, Any]) -> str:
    return (f"capacity_pairs_per_s={head['capacity_pairs_per_s']} unsaturated_clients={head['clients']} "
            f"grant_p50_us={head['p50_us']} grant_p99_us={head['p99_us']}")


def grant_body(sched: str, realtime_priority: int, seconds: float, grants: dict[str, dict[str, Any]],
               native: dict[str, Any] | None, normal: dict[str, Any] | None) -> list[str]:
    """RESULTS.md's grant tables: each level with its load and CPU, the headline, and the floors."""
    body = [f"Daemon scheduling: {sched} (`--realtime-priority {realtime_priority}`; the shipped config and unit "
            f"run it so), at its default settings, GPU 0 on policy 5. Each client acquires and releases on a fixed "
            f"5 ms schedule ({seconds:g} s per level); daemon CPU from /proc/PID/task/*/schedstat over the level. "
            f"A level is saturated above {SATURATED_CPU:.0%} of a core or below {SATURATED_ACHIEVED:.0%} of the "
            "load offered: its latency is queueing.", "",
            "Python asyncio clients (2 load processes):", "", *LEVEL_HEADER, *level_rows(grants)]
    if native is None:
        return body
    c = native["grant_round_trip_c"]
    head = native["headline"]
    body += ["", "C clients (libcgpu.so's codec, one thread each, as containers would be):", "", *LEVEL_HEADER,
             *level_rows(c)]
    if normal is not None:
        body += ["", "The 64-client level against a daemon at normal priority:", "", *LEVEL_HEADER,
                 *level_rows({"64": normal})]
    runs64 = c["64"].get("runs", [])
    if len(runs64) > 1:
        body += ["", f"The 64-client level ran {len(runs64)} times; the table gives the run with the median p50. "
                 f"Each run's p50 / p99: {_runs(runs64)} us."]
    at = (f"{head['clients']} clients, p50 {head['p50_us']} us, p99 {head['p99_us']} us" if head["clients"]
          else "none: every level saturated")
    body += ["", f"Capacity: **{head['capacity_pairs_per_s']} pairs/s**, the load at which the daemon uses "
             f"{SATURATED_CPU:.0%} of one core (interpolated between the levels either side). The highest "
             f"unsaturated level: {at}."]
    f, e, a = native["socket_round_trip_floor"], native["event_loop_floor"], native["protocol_floor_64"]
    body += ["", f"Floor: a bare round trip of one small message between two C processes over a UNIX socket, paced "
             f"like the clients, no daemon: p50 {f['p50_us']} us, p99 {f['p99_us']} us ({f['samples']} samples). The "
             f"same from C to an echo server on the daemon's event loop (uvloop, Python, nothing else): p50 "
             f"{e['p50_us']} us, p99 {e['p99_us']} us. The 64 C clients against a server on the same event loop and "
             f"priority that grants every acquire at once and does nothing else (no scheduler, no accounting): "
             f"p50 {a['p50_us']} us, p99 {a['p99_us']} us, {a['daemon_cpu_us_per_pair']} us of its CPU per pair "
             f"({a['daemon_cpu_pct']} % of a core); the rest of the daemon's figure is its own work."]
    return body
