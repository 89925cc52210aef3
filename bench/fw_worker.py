"""One tenant of bench.gpu's framework parts: a workload's steps on the GPU, timed, in the windows it is told.

    python -m bench.fw_worker WORKLOAD --out FILE [--variants A,B] [--rank R --world W --port P]

How it talks to bench.gpu (stdout lines, stdin lines):

1. it imports its framework (no CUDA yet) and prints ``loaded``; then it waits for a line ``init`` on stdin, so
   that a pair can be started early and its CUDA contexts made only when its turn comes (an MPS daemon started
   in between, say);
2. it makes its context, builds each variant, warms it up, and prints ``ready {json}``: its pid, whether
   libcgpu.so is loaded in it, what GPU memory it sees, and per variant the unit of its work, the units of one
   step and a warm step's seconds;
3. it reads one line of JSON, ``[[variant, start_ns, end_ns], ...]`` (CLOCK_MONOTONIC, host-wide), and runs each
   variant's steps inside its windows: a step starts only inside one, and it sleeps between them (its lease
   idles out). Each step ends with a sync, so a step's end is when its work is done;
4. it writes ``{"steps": [[variant_index, start_ns, end_ns], ...]}`` to FILE and prints ``done``.

A step of a collective variant (the all-reduce of several ranks) also agrees with its peers whether to go on, so
that no rank starts an all-reduce that another will not join.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Variant:
    """One way a workload steps: ``step(go)`` runs one step and says whether to go on (``go`` for all but a
    collective, where it is what every rank wanted)."""

    step: Callable[[bool], bool]
    unit: str
    per_step: float
    collective: bool = False


@dataclass
class Built:
    """A workload on its device: its variants, and what GPU memory it sees (framework by framework)."""

    variants: dict[str, Variant]
    memory: dict[str, Any]


def shim_loaded() -> bool:
    """libcgpu.so is mapped into this process (``cgpu-run`` preloaded it)."""
    try:
        return "libcgpu.so" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def warm(v: Variant, n: int = 3) -> float:
    """Run ``n`` steps, then time ``n`` more: a warm step's seconds."""
    for _ in range(n):
        v.step(True)
    t0 = time.perf_counter()
    for _ in range(n):
        v.step(True)
    return (time.perf_counter() - t0) / n


def run_plan(variants: list[Variant], plan: list[tuple[int, int, int]]) -> list[list[int]]:
    """Each window's steps, in order; ``[variant, start_ns, end_ns]`` per step."""
    steps: list[list[int]] = []
    for vi, start, end in plan:
        v = variants[vi]
        while (left := start - time.monotonic_ns()) > 0:
            time.sleep(min(0.05, left / 1e9))
        while True:
            t0 = time.monotonic_ns()
            want = t0 < end
            if not want and not v.collective:
                break
            if not v.step(want):
                break
            steps.append([vi, t0, time.monotonic_ns()])
    return steps


# each workload's loader, as module:function (imported only for its own workload: a JAX worker loads no torch)
WORKLOADS = {"resnet": "fw_torch:resnet", "graph": "fw_torch:graph_decode", "compile": "fw_torch:compiled",
             "allreduce": "fw_torch:allreduce", "jax": "fw_others:jax_loop", "cupy": "fw_others:cupy_loop",
             "sleep": "fw_others:sleep_loop"}


def loader(workload: str) -> Callable[[argparse.Namespace], Callable[[], Built]]:
    """The workload's loader: it imports the framework and returns what builds the workload on the GPU."""
    import importlib

    module, fn = WORKLOADS[workload].split(":")
    found: Callable[[argparse.Namespace], Callable[[], Built]] = getattr(
        importlib.import_module(f"bench.{module}"), fn)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fw_worker")
    ap.add_argument("workload")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="", help="comma-separated; the workload's own default if empty")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    if args.workload not in WORKLOADS:
        print(f"fw_worker: no workload {args.workload} (workloads: {', '.join(WORKLOADS)})", file=sys.stderr)
        return 2
    build = loader(args.workload)(args)
    print("loaded", flush=True)
    if sys.stdin.readline().strip() != "init":
        return 0  # told to stop before its turn
    built = build()
    names = list(built.variants)
    info = {"pid": os.getpid(), "shim": shim_loaded(), "memory": built.memory,
            "variants": {n: {"unit": v.unit, "per_step": v.per_step, "step_s": warm(v)}
                         for n, v in built.variants.items()}}
    print("ready " + json.dumps(info), flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    plan = [(names.index(name), int(s), int(e)) for name, s, e in json.loads(line)]
    steps = run_plan([built.variants[n] for n in names], plan)
    Path(args.out).write_text(json.dumps({"variants": names, "steps": steps}))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
