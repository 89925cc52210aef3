"""bench.gpu's ``limit`` part: a tenant held to a limit of 30 % (behaviour §3, requests and limits) beside an
unlimited one, both of weight 1 on the daemon's default policy, through the shim.

Windows (bench.gpu_timeline): the unlimited tenant B alone (its rate is the exclusive one), the limited tenant A
alone (it must get its 30 % even with the GPU otherwise idle), then both (A still 30 %, B the rest, 70 %). Shares
are the daemon's own bill: each one's held time over the window, and A's throttled time. The work is torchvision's
ResNet-50 inference at batch 64 where PyTorch has CUDA, else the CUDA job program (1 ms kernels, 4 a batch). The
part fails where A's held share is off its limit by more than 3 pp (5 on the fake driver, whose kernels are CPU
spins on a shared machine).
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.gpu_frameworks import importable
from bench.gpu_host import torch_cuda
from bench.gpu_timeline import Bills, Events, length_s, plan_of, timeline
from bench.gpu_workers import CWorker, PyWorker, keep_stderr
from cgpu_testing.tools import ROOT, tool

LIMIT = 30
NAMES = {"A": "proof-limit-a", "B": "proof-limit-b"}


def run(proof: Any, figures: dict[str, Any]) -> None:
    """The part, on ``proof`` (a bench.gpu Proof with its daemon started); fills ``figures``."""
    torch = not proof.fake and torch_cuda() and not importable("torchvision")
    proof.provision(NAMES["A"], weight=1, limit=LIMIT)
    proof.provision(NAMES["B"], weight=1)
    env = {k: v for k, v in {**os.environ, **proof.env}.items() if k not in ("LD_PRELOAD", "CGPU_NATIVE")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    def prefix(who: str) -> list[str]:
        return [tool("cgpu-run"), "--device", "cuda", "--socket", proof.daemon.sock, "--instance", NAMES[who], "--"]

    workers: dict[str, Any] = {}
    try:
        if torch:
            variant = "inf64"
            for who in ("A", "B"):
                workers[who] = PyWorker(f"limit-{who}", prefix(who), "resnet", ["--variants", variant], env,
                                        proof.tmp, ROOT)
                workers[who].init()
            deadline = time.monotonic() + min(120, max(30, proof.left_s() - 30))
            step = max(w.ready(deadline)["variants"][variant]["step_s"] for w in workers.values())
            x_s, p_s = 3.0, 5.0
        else:
            variant, step, x_s, p_s = "spin", 0.004, 2.0, 3.0
        windows = timeline(time.monotonic_ns() + int((0.3 if torch else 2.0) * 1e9), [variant], {variant: step},
                           x_s, p_s, order=("B", "A", "AB"))
        events, bills = Events(), Bills(proof.status)
        bills.plan(events, windows)
        for who in ("A", "B"):
            if torch:
                workers[who].go(plan_of(who, windows))
            else:
                spans = [(s, e) for _, s, e in plan_of(who, windows)]
                workers[who] = CWorker(f"limit-{who}", proof.job, prefix(who), env, spans, 1.0, 4, False)
        events.run()
        deadline = time.monotonic() + 60
        done = {who: w.done(deadline) for who, w in workers.items()}
    except Exception:
        keep_stderr(proof, list(workers.values()))  # into workers.log beside gpu.json; the part fails with it
        raise
    finally:
        for w in workers.values():
            w.kill()
    rates = {}
    for k, w in enumerate(windows):
        for who in w.who:
            nth = sum(1 for x in windows[:k] if who in x.who)
            rates[(w.who, who)] = done[who].rate(variant, w.measure, nth)
    exclusive = rates[("B", "B")]

    def share(k: int, who: str) -> float | None:
        got = bills.held(k, NAMES[who])
        return round(100 * got[0] / got[2], 2) if got and got[2] > 0 else None

    def of_exclusive(r: float | None) -> float | None:
        return round(100 * r / exclusive, 1) if r and exclusive else None

    throttled = bills.held(2, NAMES["A"])
    figures.update({
        "work": "ResNet-50 inference, batch 64" if torch else "the CUDA job program (1 ms kernels, 4 a batch)",
        "limit_pct": LIMIT, "windows_s": round(length_s(windows), 1),
        "rows": [
            {"tenant": f"limit {LIMIT} alone", "held_pct": share(1, "A"), "target_pct": LIMIT,
             "work_pct_of_exclusive": of_exclusive(rates[("A", "A")])},
            {"tenant": f"limit {LIMIT} beside an unlimited one", "held_pct": share(2, "A"), "target_pct": LIMIT,
             "work_pct_of_exclusive": of_exclusive(rates[("AB", "A")]),
             "throttled_s": round(throttled[1], 3) if throttled else None},
            {"tenant": "unlimited beside it", "held_pct": share(2, "B"), "target_pct": 100 - LIMIT,
             "work_pct_of_exclusive": of_exclusive(rates[("AB", "B")])},
        ],
    })
    tol = 5.0 if proof.fake else 3.0
    off = [r for r in figures["rows"][:2] if r["held_pct"] is None or abs(r["held_pct"] - LIMIT) > tol]
    proof.info["limit_err_pp"] = max((abs((r["held_pct"] or 0) - LIMIT) for r in figures["rows"][:2]), default=None)
    if off:
        raise RuntimeError(f"the limited tenant's held share is off its {LIMIT} % by more than {tol:g} pp: "
                           + "; ".join(f"{r['tenant']}: {r['held_pct']}" for r in off))
