"""One ResNet-50 instance for bench.resnet50: runs batches and records when each one finished.

    python -m bench.resnet_worker --batch B --image-size S --out FILE [--train]

Warms up, prints "ready", reads "START_NS END_NS" (CLOCK_MONOTONIC, host-wide)
from stdin, waits for the start, runs batches until the end, and writes
{"completions": [ns, ...]} to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from bench.resnet import ResNet50


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--out", required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
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
    print("ready", flush=True)
    start_ns, end_ns = (int(v) for v in sys.stdin.readline().split())
    while time.monotonic_ns() < start_ns:
        time.sleep(min(0.05, max(0.0, (start_ns - time.monotonic_ns()) / 1e9)))
    completions = []
    while time.monotonic_ns() < end_ns:
        step()
        sync()
        completions.append(time.monotonic_ns())
    with open(args.out, "w") as f:
        json.dump({"completions": completions, "batch": args.batch}, f)


if __name__ == "__main__":
    main()
