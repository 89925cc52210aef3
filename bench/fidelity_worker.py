"""A tenant of bench.fidelity: torch CPU operators in a loop under ``cgpu-run --device cpu``, on command.

    cgpu-run --device cpu ... -- python -m bench.fidelity_worker SIZE [THREADS [sync]]

Reads commands on stdin, one a line: ``run``, ``pause``, ``dump PATH`` (writes the end time of every
operation and the (granted, ended) of every lease, CLOCK_MONOTONIC ns, as JSON) and ``quit``. Prints
``ready`` once registered and warmed up. Each operation is a SIZE x SIZE matmul on THREADS intra-op threads
(default 1); with ``sync`` each iteration then reads one element of the product back (``.item()``), as a
training loop that logs its loss every step does: the iteration ends in a synchronising read.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import torch

from libcgpu_client import runtime


def main() -> None:
    size = int(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    sync = len(sys.argv) > 3 and sys.argv[3] == "sync"
    a, b = torch.randn(size, size), torch.randn(size, size)
    rt = runtime.current()
    assert rt is not None, "cgpu is not active (run under cgpu-run)"
    leases: list[tuple[int, int]] = []
    rt.gate(0).on_lease_end.append(lambda granted, ended: leases.append((granted, ended)))
    ends: list[int] = []
    running = threading.Event()
    done = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "run":
                running.set()
            elif cmd == "pause":
                running.clear()
            elif cmd == "dump":
                with open(arg, "w") as f:
                    json.dump({"ends": list(ends), "leases": list(leases)}, f)
                print("dumped", flush=True)
            elif cmd == "quit":
                break
        done.set()
        running.set()

    threading.Thread(target=commands, daemon=True).start()
    with torch.inference_mode():
        for _ in range(20):
            torch.mm(a, b)
        print("ready", flush=True)
        while not done.is_set():
            running.wait()
            while running.is_set() and not done.is_set():
                c = torch.mm(a, b)
                if sync:
                    c[0, 0].item()
                ends.append(time.monotonic_ns())


if __name__ == "__main__":
    main()
