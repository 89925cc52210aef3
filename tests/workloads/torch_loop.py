"""A torch CPU workload for tests, run under cgpu-run: matmuls in a loop, op intervals recorded.

    python torch_loop.py SECONDS SIZE OUT.json

Writes {"intervals": [[start_ns, end_ns], ...], "errors": [...]} with
CLOCK_MONOTONIC times (host-wide, so intervals of two processes compare).
"""

import json
import sys
import time

import torch

from libcgpu_client import runtime

torch.set_num_threads(1)
seconds, size, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
a = torch.randn(size, size)
b = torch.randn(size, size)
rt = runtime.current()
assert rt is not None, "cgpu is not active"
gate = rt.gate(0)
intervals = []
end = time.monotonic() + seconds
while time.monotonic() < end:
    gate.check()  # wait for the lease outside the timed region; the interposer checks again (fast path)
    t = time.monotonic_ns()
    torch.mm(a, b)
    intervals.append((t, time.monotonic_ns()))
with open(out, "w") as f:
    json.dump({"intervals": intervals}, f)
