"""A torch CPU workload for tests, run under cgpu-run: matmuls in a loop, op intervals recorded.

    python torch_loop.py SECONDS SIZE OUT.json [module]

With ``module`` the matmul runs inside an ``nn.Module`` call, timed inside it,
and nothing else checks the gate: the module hooks of ``CGPU_TORCH_HOOK=module``
alone hold it to its share.

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
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # timed inside the module: its pre-hook has waited for the lease by now
        t = time.monotonic_ns()
        y = torch.mm(x, b)
        intervals.append((t, time.monotonic_ns()))
        return y


rt = runtime.current()
assert rt is not None, "cgpu is not active"
gate = rt.gate(0)
end = time.monotonic() + seconds
if sys.argv[4:] == ["module"]:
    mm = MatMul()
    while time.monotonic() < end:
        mm(a)  # gated by the module hooks alone
else:
    while time.monotonic() < end:
        gate.check()  # wait for the lease outside the timed region; the interposer checks again (fast path)
        t = time.monotonic_ns()
        torch.mm(a, b)
        intervals.append((t, time.monotonic_ns()))
with open(out, "w") as f:
    json.dump({"intervals": intervals}, f)
