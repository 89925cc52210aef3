"""One ResNet-50 instance for bench.resnet50: runs batches and records when each one finished.

    python -m bench.resnet_worker --batch B --image-size S --out FILE [--train]

Warms up, prints "ready", reads one line of CLOCK_MONOTONIC (host-wide)
times from stdin, "S1 E1 [S2 E2 ...]": the intervals in which to run. It
starts a batch only inside one of them and sleeps between them (so its lease
idles out), and writes {"completions": [ns, ...], "leases": [[granted, ended], ...]}
to FILE after the last. "leases" are the slices it held (from the slice gate,
when it runs under cgpu-run); the benchmark interpolates progress between
completions on that held-time clock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from bench.resnet import ResNet50
from libcgpu_client import runtime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--out", required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--torchvision", action="store_true", help="torchvision's ResNet-50 instead of bench/resnet.py's")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.torchvision:
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(device)
    else:
        model = ResNet50().to(device)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    if args.train:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    else:
        model.eval()

        def step() -> None:
            with torch.inference_mode():
                model(x)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        step()
    sync()
    rt = runtime.current()
    gate = rt.gate(0) if rt is not None and rt.gates else None
    leases: list[tuple[int, int]] = []
    if gate is not None:
        gate.on_lease_end.append(lambda granted, ended: leases.append((granted, ended)))
    print("ready", flush=True)
    times = [int(v) for v in sys.stdin.readline().split()]
    completions = []
    for start_ns, end_ns in zip(times[::2], times[1::2], strict=True):
        while time.monotonic_ns() < start_ns:
            time.sleep(min(0.05, max(0.0, (start_ns - time.monotonic_ns()) / 1e9)))
        while time.monotonic_ns() < end_ns:
            step()
            sync()
            completions.append(time.monotonic_ns())
    if gate is not None:
        gate.release()
    with open(args.out, "w") as f:
        json.dump({"completions": completions, "batch": args.batch, "leases": leases}, f)


if __name__ == "__main__":
    main()
