"""A client process for the demo and tests: busy-spins 'GPU ops' through the gate and records them.

    python -m cgpu_testing.spin SOCKET INSTANCE SECONDS OP_MS [WEIGHT]

Prints one JSON line: {"ops": n, "intervals": [[start_ns, end_ns], ...], "op_seconds": s}.
"""

import json
import sys
import time

from libcgpu_client.client import Client
from libcgpu_client.gate import Gate

sock, instance, seconds, op_ms = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
weight = int(sys.argv[5]) if len(sys.argv) > 5 else 1
client = Client(sock, instance, [0], weight=weight)
assert client.start(10.0), "no daemon"
gate = Gate(client, 0, idle_ms=3.0)
intervals = []
end = time.monotonic() + seconds
op_ns = int(op_ms * 1e6)
while time.monotonic() < end:
    with gate.work():
        t0 = time.monotonic_ns()
        while time.monotonic_ns() - t0 < op_ns:
            pass
        intervals.append((t0, time.monotonic_ns()))
gate.close()
client.close()
print(json.dumps({"ops": len(intervals), "intervals": intervals,
                  "op_seconds": sum(b - a for a, b in intervals) / 1e9}))
