"""A torch CPU workload for tests, run under cgpu-run: matmuls in a loop, op intervals recorded.

    python torch_loop.py SECONDS SIZE OUT.json [module|layer]

With ``module`` the matmul runs inside an ``nn.Module`` call, timed inside it,
and nothing else checks the gate: the module hooks of ``CGPU_TORCH_HOOK=module``
alone hold it to its share. With ``layer`` it is a built-in ``nn.Linear`` with
autograd off, which the default hook gates at its call (its fast path) and
nothing else. In every mode an operator's interval starts when the call starts
or, if the gate waited inside it, when that wait ended: a turn that ends
between the loop's own check and the operator is not counted as operator time.

Writes {"intervals": [[start_ns, end_ns], ...], "errors": [...]} with
CLOCK_MONOTONIC times (host-wide, so intervals of two processes compare).
"""

import json
import sys
import time
from collections.abc import Hashable

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
slow, waited = gate._slow, [0]


def timed_slow(kind: Hashable = None) -> None:
    slow(kind)
    waited[0] = time.monotonic_ns()


gate._slow = timed_slow  # type: ignore[method-assign]
end = time.monotonic() + seconds
if sys.argv[4:] == ["module"]:
    mm = MatMul()
    while time.monotonic() < end:
        mm(a)  # gated by the module hooks alone
elif sys.argv[4:] == ["layer"]:
    linear = torch.nn.Linear(size, size, bias=False)
    with torch.inference_mode():
        while time.monotonic() < end:
            t = time.monotonic_ns()
            linear(a)
            intervals.append((max(t, waited[0]), time.monotonic_ns()))
else:
    while time.monotonic() < end:
        gate.check()  # wait for the lease outside the timed region; the interposer checks again
        t = time.monotonic_ns()
        torch.mm(a, b)  # if the lease ended since the check, the interposer waits for the next turn here
        intervals.append((max(t, waited[0]), time.monotonic_ns()))
with open(out, "w") as f:
    json.dump({"intervals": intervals}, f)
