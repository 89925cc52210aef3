"""Allocate SIZE_MIB of CPU tensor under cgpu-run --device cpu, report, then hold it.

    python torch_mem.py SIZE_MIB HOLD_SECONDS

Prints "allocated" or "oom: <message>" on one line, then keeps running ops.
"""

import sys
import time

import torch

size_mib, hold = int(sys.argv[1]), float(sys.argv[2])
try:
    x = torch.empty(size_mib * 1024 * 1024, dtype=torch.uint8)
    x.fill_(1)
    print("allocated", flush=True)
except torch.OutOfMemoryError as exc:
    print(f"oom: {exc}", flush=True)
    x = None
end = time.monotonic() + hold
y = torch.ones(64, 64)
while time.monotonic() < end:
    y = y @ torch.ones(64, 64) / 64
    time.sleep(0.01)
print("done", flush=True)
