"""The daemon's CPU per acquire+release pair, in process, beside the protocol's floor on the same machine.

    python -m bench.hotpath [--json] [--pairs 5000] [--clients 64] [--rounds 15] [--section NAME] [--no-results]

A regression guard for the grant path that is not a timed test. Both sides run on uvloop, the
daemon's event loop, with the same fake transports and the same frames the C clients of
``bench.overhead`` send (``acquire``, then ``release`` with the lease), each frame delivered as its
own read, with one turn of the event loop after it, as a daemon under load sees them:

* **pair**: arbiterd's own connection objects on one simulated GPU on policy 5 (native, as
  ``bench.overhead`` runs), ``--clients`` connections of 8 instances taking turns: decode,
  validate, schedule, account, encode, and the timer the hub keeps armed.
* **floor**: the same frames through a bare server that decodes each with msgpack's streaming
  ``Unpacker`` and answers an acquire with a packed grant, and does nothing else.

Each figure is the median of ``--rounds`` rounds, the two sides interleaved; the ratio is the median
of each round's ratio (a slow spell of the machine hits both sides of a round alike). The output
ends with ``pair_us=<n> floor_us=<n> ratio=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import msgpack
import uvloop

from bench import results

INSTANCES = 8


class FakeTransport:
    """What a connection writes, kept for the client side to read back (tests drive connections with it too)."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> None:
        return None

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def acquire_frame() -> bytes:
    frame: bytes = msgpack.packb({"op": "acquire", "id": 0, "gpu": 0})  # as grant_rtt.c sends it
    return frame


def release_frame(lease: int) -> bytes:
    frame: bytes = msgpack.packb({"op": "release", "gpu": 0, "lease": lease, "used_ns": 0})
    return frame


class Answer(asyncio.Protocol):
    """The floor: decode every frame, answer an acquire with a grant (bench.overhead's answer server)."""

    def __init__(self) -> None:
        self.unpacker = msgpack.Unpacker(raw=False)
        self.leases = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        for msg in self.unpacker:
            if msg.get("op") == "acquire":
                self.leases += 1
                self.transport.write(msgpack.packb({"op": "grant", "gpu": msg["gpu"], "lease": self.leases,
                                                    "deadline_ns": time.monotonic_ns() + 10**9}))


def lease_of(transport: FakeTransport) -> int:
    """The lease of the grant the connection just wrote."""
    (frame,) = transport.out
    transport.out.clear()
    msg = msgpack.unpackb(frame)
    assert msg["op"] == "grant", msg
    lease: int = msg["lease"]
    return lease


async def drive(conns: list[tuple[asyncio.Protocol, FakeTransport]], pairs: int) -> float:
    """Seconds of process CPU for ``pairs`` acquire+release pairs, the connections taking turns."""
    acquire = acquire_frame()
    t0 = time.process_time()
    for i in range(pairs):
        conn, transport = conns[i % len(conns)]
        conn.data_received(acquire)
        await asyncio.sleep(0)
        conn.data_received(release_frame(lease_of(transport)))
        await asyncio.sleep(0)
    return time.process_time() - t0


async def daemon_side(clients: int, state_dir: str) -> list[tuple[asyncio.Protocol, FakeTransport]]:
    from arbiterd.server.config import Config
    from arbiterd.server.connection import ClientConnection
    from arbiterd.server.daemon import Daemon

    daemon = Daemon(Config(sim_gpus="1x16GiB", identity="declared", state_dir=state_dir, max_clients=4096))
    daemon.hub.admin_write("0/policy", "5")
    conns: list[tuple[asyncio.Protocol, FakeTransport]] = []
    for n in range(clients):
        conn, t = ClientConnection(daemon.hub), FakeTransport()
        conn.connection_made(t)  # type: ignore[arg-type]
        conn.data_received(msgpack.packb({"op": "hello", "versions": [1], "client": "hotpath"}))
        conn.data_received(msgpack.packb({"op": "register", "id": 1, "instance": f"hot-{n % INSTANCES}",
                                          "gpus": [0]}))
        for _ in range(100):  # turns of the loop, as between reads: a request left for its tenant's next turn
            if len(t.out) >= 2:
                break
            await asyncio.sleep(0)
        assert [msgpack.unpackb(f)["op"] for f in t.out] == ["welcome", "registered"], t.out
        t.out.clear()
        conns.append((conn, t))
    return conns


def floor_side(clients: int) -> list[tuple[asyncio.Protocol, FakeTransport]]:
    conns: list[tuple[asyncio.Protocol, FakeTransport]] = []
    for _ in range(clients):
        conn, t = Answer(), FakeTransport()
        conn.connection_made(t)
        conns.append((conn, t))
    return conns


def measure(pairs: int, clients: int, rounds: int) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="cgpu-hot-") as state:
            daemon = await daemon_side(clients, state)
            floor = floor_side(clients)
            await drive(daemon, pairs // 10)  # warm both up
            await drive(floor, pairs // 10)
            pair_s, floor_s = [], []
            for _ in range(rounds):
                pair_s.append(await drive(daemon, pairs) / pairs)
                floor_s.append(await drive(floor, pairs) / pairs)
        pair_us, floor_us = statistics.median(pair_s) * 1e6, statistics.median(floor_s) * 1e6
        # each round's ratio is taken between neighbours in time, so a slow spell of the machine cancels
        ratio = statistics.median(p / f for p, f in zip(pair_s, floor_s, strict=True))
        return {"pairs": pairs, "clients": clients, "rounds": rounds,
                "pair_us": round(pair_us, 2), "floor_us": round(floor_us, 2), "ratio": round(ratio, 2),
                "pair_us_rounds": [round(s * 1e6, 2) for s in pair_s],
                "floor_us_rounds": [round(s * 1e6, 2) for s in floor_s]}

    return uvloop.run(go())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--pairs", type=int, default=5000, help="acquire+release pairs per round (default 5000)")
    p.add_argument("--clients", type=int, default=64, help="connections, of 8 instances (default 64)")
    p.add_argument("--rounds", type=int, default=15, help="rounds per side; the median is reported (default 15)")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    p.add_argument("--section", default="hotpath", metavar="NAME",
                   help="the RESULTS.md section to write (default hotpath)")
    args = p.parse_args(argv)
    doc = measure(args.pairs, args.clients, args.rounds)
    line = f"pair_us={doc['pair_us']} floor_us={doc['floor_us']} ratio={doc['ratio']}"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{'':>6} {'us per pair':>12}   rounds")
        for side in ("pair", "floor"):
            print(f"{side:>6} {doc[side + '_us']:>12}   {', '.join(map(str, doc[side + '_us_rounds']))}")
        print(f"ratio {doc['ratio']}")
    if not args.no_results:
        cmd = "python -m bench.hotpath " + " ".join(argv if argv is not None else sys.argv[1:])
        body = ["| side | us per pair (median) | each round |", "| --- | ---: | --- |",
                f"| arbiterd (decode, validate, schedule, account, encode, timer) | {doc['pair_us']} | "
                f"{', '.join(map(str, doc['pair_us_rounds']))} |",
                f"| floor (msgpack decode + encode of the same frames) | {doc['floor_us']} | "
                f"{', '.join(map(str, doc['floor_us_rounds']))} |", "",
                f"{args.clients} connections of {INSTANCES} instances on one simulated GPU on policy 5, "
                f"{args.pairs} pairs per round, {args.rounds} rounds, process CPU time; one event-loop turn "
                "after each frame on both sides. The ratio is the median of each round's ratio."]
        results.update(args.section, cmd.strip(), "\n".join(body) + f"\n\n{line}\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
