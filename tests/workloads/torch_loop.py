"""A torch CPU workload for tests, run under cgpu-run: matmuls in a loop, op intervals recorded.

    python torch_loop.py SECONDS SIZE OUT.json [module]

With ``module`` the matmul runs inside an ``nn.Module`` and nothing else checks the
gate: only the interposer's module hook does, and the module times its own work.

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


intervals = []


class MatMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = time.monotonic_ns()
        out = torch.mm(x, y)
        intervals.append((t, time.monotonic_ns()))
        return out


module = sys.argv[4:] == ["module"]
rt = runtime.current()
assert rt is not None, "cgpu is not active"
gate = rt.gate(0)
mm = MatMul()
end = time.monotonic() + seconds
while time.monotonic() < end:
    if module:
        mm(a, b)
        continue
    gate.check()  # wait for the lease outside the timed region; the interposer checks again (fast path)
    t = time.monotonic_ns()
    torch.mm(a, b)
    intervals.append((t, time.monotonic_ns()))
with open(out, "w") as f:
    json.dump({"intervals": intervals}, f)
