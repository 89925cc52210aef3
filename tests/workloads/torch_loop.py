"""A torch CPU workload for tests: runs operators for a while and reports its operator time.

    python torch_loop.py SECONDS [SIZE]

Prints one JSON line: {"ops": n, "op_seconds": s, "wall": w}. Operator time is
measured around each operator, inside the cgpu gate, by a dispatch mode
pushed *below* cgpu's (so waiting for a lease is not counted).
"""

import json
import sys
import time

import torch

torch.set_num_threads(1)
seconds = float(sys.argv[1])
size = int(sys.argv[2]) if len(sys.argv) > 2 else 192
a = torch.randn(size, size)
b = torch.randn(size, size)
ops = 0
op_ns = 0
end = time.monotonic() + seconds
start = time.monotonic()
from libcgpu_client import runtime  # noqa: E402

rt = runtime.current()
gate = rt.gate(0) if rt else None
while time.monotonic() < end:
    if gate is not None:
        gate.check()  # wait for the lease outside the timed region
    t = time.perf_counter_ns()
    c = torch.mm(a, b)
    op_ns += time.perf_counter_ns() - t
    ops += 1
print(json.dumps({"ops": ops, "op_seconds": op_ns / 1e9, "wall": time.monotonic() - start,
                  "held_seconds": (gate.held_ns / 1e9) if gate else None}))
