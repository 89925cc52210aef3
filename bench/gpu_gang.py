"""bench.gpu's ``gang`` part: a two-GPU job (an NCCL all-reduce of two ranks, ``torch.distributed``) beside
single-GPU tenants, through the shim, where the host has two GPUs or more; one line saying why not elsewhere.

The job is one instance on GPUs 0 and 1 (``inst_ctl create ... gpu=0,1``), its two ranks under ``cgpu-run --gpus
0,1`` (rank r on its GPU r); each GPU also has a tenant of the same weight running ResNet-50 inference (batch 64)
under ``cgpu-run --gpus i``. Windows: the job alone, then the job with both tenants. It reports the job's
all-reduces a second in each, its rate beside the tenants against what it is entitled to (half of its rate alone,
at weights 1:1 on each GPU), and each GPU's held shares from the daemon's bill. How the daemon aligns a job's
turns across GPUs (gang leases, issue 50) is the daemon's; this part measures what a job gets.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from bench.gpu_host import torch_cuda
from bench.gpu_part import Skip
from bench.gpu_timeline import Bills, Events, S, Window
from bench.gpu_workers import PyWorker, keep_stderr
from cgpu_testing.tools import ROOT, tool

JOB = "proof-gang"
TENANTS = {0: "proof-gang-t0", 1: "proof-gang-t1"}
NCCL = "import sys, torch, torch.distributed as d; sys.exit(0 if d.is_nccl_available() else 1)"


NEEDS_S = 90.0  # two ranks' start-up and NCCL's, its windows alone and beside the tenants


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(proof: Any, figures: dict[str, Any]) -> None:
    """The part, on ``proof`` (a bench.gpu Proof with its daemon started); fills ``figures``."""
    gpus = len(proof.info.get("gpus", []))
    if gpus < 2:
        raise Skip(f"{gpus} GPU here: a job across GPUs needs two or more")
    if proof.fake or not torch_cuda():
        raise Skip("needs PyTorch with CUDA and NCCL")
    if proof.left_s() < NEEDS_S:
        raise Skip(f"{proof.left_s():.0f} s of the budget left, it may need {NEEDS_S:.0f} s")
    if subprocess.run([sys.executable, "-c", NCCL], capture_output=True, timeout=120).returncode != 0:
        raise Skip("PyTorch here has no NCCL")
    proof.provision(JOB, gpu="0,1", weight=1)
    for g, name in TENANTS.items():
        proof.provision(name, gpu=str(g), weight=1)
    env = {k: v for k, v in {**os.environ, **proof.env}.items() if k not in ("LD_PRELOAD", "CGPU_NATIVE")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    def under(instance: str, gpus: str) -> list[str]:
        return [tool("cgpu-run"), "--device", "cuda", "--gpus", gpus, "--socket", proof.daemon.sock, "--instance",
                instance, "--"]

    port = free_port()
    ranks = {r: PyWorker(f"gang-rank{r}", under(JOB, "0,1"), "allreduce",
                         ["--rank", str(r), "--world", "2", "--port", str(port)], env, proof.tmp, ROOT)
             for r in (0, 1)}
    tenants = {g: PyWorker(f"gang-tenant{g}", under(name, str(g)), "resnet", ["--variants", "inf64"], env,
                           proof.tmp, ROOT) for g, name in TENANTS.items()}
    workers = [*ranks.values(), *tenants.values()]
    try:
        for w in workers:
            w.init()
        deadline = time.monotonic() + min(180.0, max(30.0, proof.left_s() - 60))
        step = max(w.ready(deadline)["variants"]["allreduce"]["step_s"] for w in ranks.values())
        for w in tenants.values():
            w.ready(deadline)
        settle, x, p = int(max(0.3, 3 * step) * S), 3 * S, 6 * S
        t = time.monotonic_ns() + S // 2
        alone = Window("allreduce", "A", (t, t + settle + x), (t + settle, t + settle + x))
        t = alone.run[1]
        both = Window("allreduce", "AB", (t, t + settle + p), (t + settle, t + settle + p))
        events = Events()
        bills = {g: Bills(proof.status, gpu=g) for g in TENANTS}
        for b in bills.values():
            b.plan(events, [alone, both])
        for w in ranks.values():
            w.go([("allreduce", *alone.run), ("allreduce", *both.run)])
        for w in tenants.values():
            w.go([("inf64", *both.run)])
        events.run()
        deadline = time.monotonic() + 120
        done = [w.done(deadline) for w in workers]
    except Exception:
        keep_stderr(proof, workers)  # into workers.log beside gpu.json; the part fails with it
        raise
    finally:
        for w in workers:
            w.kill()
    rate_alone, rate_with = done[0].rate("allreduce", alone.measure), done[0].rate("allreduce", both.measure)

    def share(g: int, k: int, name: str) -> float | None:
        got = bills[g].held(k, name)
        return round(100 * got[0] / got[2], 2) if got and got[2] > 0 else None

    figures.update({
        "job_allreduce_per_s_alone": rate_alone, "job_allreduce_per_s_beside_tenants": rate_with,
        "job_rate_pct_of_entitled": round(100 * rate_with / (0.5 * rate_alone), 1) if rate_alone and rate_with
        else None,
        "held_pct": {f"gpu{g}": {"job": share(g, 1, JOB), "tenant": share(g, 1, TENANTS[g])} for g in TENANTS},
        "tenant_images_per_s": [d.rate("inf64", both.measure) for d in done[2:]],
    })
