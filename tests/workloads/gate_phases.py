"""A gate client that is busy or idle in phases, for the entitlement tests.

    python gate_phases.py SOCKET INSTANCE WEIGHT PHASE...

Each PHASE is ``busy:SECONDS`` (0.5 ms operations through the gate, back to back) or
``idle:SECONDS`` (registered, asking nothing). ``GATE_GPU`` picks the GPU (default 0).
Prints nothing; exits 0 when done (a starved instance never does: it waits for its grant).
"""

from __future__ import annotations

import os
import sys
import time

from libcgpu_client.client import Client
from libcgpu_client.gate import Gate

OP_NS = 500_000


def main() -> None:
    sock, instance, weight, *phases = sys.argv[1:]
    gpu = int(os.environ.get("GATE_GPU", "0"))
    client = Client(sock, instance, [gpu], weight=int(weight))
    assert client.start(10.0), "no daemon"
    gate = Gate(client, gpu, idle_ms=3.0)
    for phase in phases:
        kind, _, seconds = phase.partition(":")
        end = time.monotonic() + float(seconds)
        if kind == "idle":
            time.sleep(float(seconds))
            continue
        while time.monotonic() < end:
            with gate.work():
                t0 = time.monotonic_ns()
                while time.monotonic_ns() - t0 < OP_NS:
                    pass
    gate.close()
    client.close()


if __name__ == "__main__":
    main()
