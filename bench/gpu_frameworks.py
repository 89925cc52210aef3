"""bench.gpu's framework parts: a real framework's tenants at 1:2, through the shim, beside what a user would pick
instead, in one sitting, one table per workload.

Each part runs one workload (bench.fw_worker: ResNet-50, a CUDA-graph decode loop, ``torch.compile``, JAX, CuPy)
as two tenants, A and B, in three ways of sharing, one after the other (:mod:`bench.gpu_timeline` for the windows):

- **cgpu 1:2**: each under ``cgpu-run`` (which preloads libcgpu.so for every program), as instances provisioned
  for this user with weights 1 and 2 (the daemon then puts the GPU on policy 2, as at its defaults); alone
  windows run on the daemon's default policy (1), the pair on that policy 2. The daemon's own bill gives each
  one's held time in the pair, and the held-time ratio beside the work ratio;
- **time-slicing**: the same two programs with no shim and no arbiter, at once: the driver's own time-slicing,
  which no weight controls (each one's rate and the ratio it happens to give);
- **MPS 33/67**: the same two under an MPS daemon of the proof's own (bench.gpu_mps) with
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` 33 and 67, where ``nvidia-cuda-mps-control -d`` works (else one line).

All three pairs are started when the part starts and import their framework at once; each makes its CUDA context
only when its turn comes. A row gives each tenant's rate alone and in the pair, the work ratio B/A, the held-time
ratio (cgpu), and the pair's sum against the exclusive rate (the mean of A's and B's alone rates through the shim,
or without it where the cgpu sitting did not run). Where the framework is missing (the fake driver), a part with
a stand-in runs the CUDA job program instead (``cuda_graph``: its kernels as one ``cuGraphLaunch`` a batch), and
the others skip in one line. A framework row is ``ok`` when both tenants had the shim loaded and the work ratio is
within 10 % of 2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.gpu_host import torch_cuda
from bench.gpu_mps import Mps, MpsUnavailable
from bench.gpu_part import Skip
from bench.gpu_timeline import Bills, Events, Window, length_s, plan_of, timeline
from bench.gpu_workers import CWorker, Done, PyWorker, keep_stderr
from cgpu_testing.tools import ROOT, tool

MODES = ("cgpu", "timeslice", "mps")
LABEL = {"cgpu": "cgpu 1:2", "timeslice": "time-slicing", "mps": "MPS 33/67"}
MPS_PERCENT = {"A": 33, "B": 67}
OK_BAND = 0.10  # a row's work ratio within 10 % of 2


@dataclass(frozen=True)
class Spec:
    """One workload's part."""

    title: str
    workload: str  # bench.fw_worker's
    variants: tuple[str, ...]
    needs: str  # the module that must import (in a child), with PyTorch on the GPU for torch's
    x_s: float = 2.0  # each tenant alone (s)
    p_s: float = 5.0  # the pair (s)
    start_s: float = 60.0  # what its start and warm-up take (s): the budget's estimate
    ready_s: float = 150.0  # the most its six workers' imports, contexts and warm-ups at once may take (s)
    stand_in: tuple[float, int, bool] | None = None  # (kernel ms, kernels a batch, as a graph): the CUDA job program
    memsize_frac: float = 0.0  # cgpu: each instance's memsize, a fraction of the GPU's memory (0: none)
    env: dict[str, str] = field(default_factory=dict)  # every sitting
    unset: tuple[str, ...] = ()  # taken out of every sitting's environment (the host's own settings)
    plain_env: dict[str, str] = field(default_factory=dict)  # time-slicing and MPS (no limit shown to them)


SPECS = {
    "resnet50": Spec("torchvision ResNet-50, 224x224: inference at batch 16, 64, 128 and training at batch 64",
                     "resnet", ("inf16", "inf64", "inf128", "train64"), "torchvision", x_s=1.5, p_s=4.0),
    "cuda_graph": Spec("a small transformer's decode step captured as a torch.cuda.CUDAGraph, replayed 16 times a "
                       "step", "graph", ("decode",), "torch", stand_in=(2.0, 4, True)),
    "compile": Spec("the same transformer's forward under torch.compile (mode default: Inductor's Triton kernels)",
                    "compile", ("default",), "torch", start_s=240.0),
    "jax": Spec("a jitted chain of 4096x4096 float32 matrix products (JAX on CUDA, default preallocation)", "jax",
                ("matmul",), "jax", memsize_frac=0.25,
                env={"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
                unset=("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"),
                plain_env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.35"}),
    "cupy": Spec("a CuPy RawKernel launched 20 times a step", "cupy", ("kernels",), "cupy", start_s=45.0),
}


def estimate_s(spec: Spec, c: bool) -> float:
    """What one sitting may take: start-up and its windows."""
    per_variant = 2 * spec.x_s + spec.p_s + 3 * 1.0
    return (5.0 if c else spec.start_s / 2) + len(spec.variants) * per_variant


# what must run in a child for a framework to be usable on the GPU, beyond its import
PROBES = {"jax": "import jax; jax.devices('cuda')", "cupy": "import cupy; assert cupy.cuda.runtime.getDeviceCount()"}


@functools.cache
def importable(module: str) -> str:
    """'' where ``module`` imports in a child and reaches the GPU (PROBES), else why not (its last line)."""
    code = PROBES.get(module, f"import {module}")
    env = {**os.environ, "JAX_PLATFORMS": "cuda"} if module == "jax" else None
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    return "" if r.returncode == 0 else (lines[-1][-160:] if lines else f"exit {r.returncode}")


class Sitting:
    """One way of sharing for one part: its two tenants, their windows and the daemon's bill."""

    def __init__(self, mode: str, names: dict[str, str]) -> None:
        self.mode, self.names = mode, names
        self.workers: dict[str, Any] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def kill(self) -> None:
        for w in self.workers.values():
            w.kill()


class FrameworkPart:
    """One workload's part, on ``proof`` (a bench.gpu Proof with its daemon started)."""

    def __init__(self, proof: Any, name: str, spec: Spec, figures: dict[str, Any]) -> None:
        self.proof, self.name, self.spec, self.figures = proof, name, spec, figures
        self.notes: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.c = False  # the CUDA job program stands in for the framework
        self.memsize = 0  # each cgpu instance's memory limit (bytes), where the spec sets one

    # --------------------------------------------------------------- set-up
    def choose(self) -> None:
        """The framework, or its stand-in; Skip (the proof's) in one line where neither can run."""
        why = ""
        if self.proof.fake:
            why = "the fake driver runs no framework"
        elif self.spec.needs in ("torch", "torchvision") and not torch_cuda():
            why = "no PyTorch with CUDA here"
        elif self.spec.needs != "torch" and (why_not := importable(self.spec.needs)):
            why = f"{self.spec.needs} does not import here ({why_not})"
        if not why:
            return
        if self.spec.stand_in is None:
            raise Skip(f"{why}, and this part has no stand-in")
        self.c = True
        self.notes.append(f"{why}: the CUDA job program stands in ({self.spec.stand_in[1]} kernels of "
                          f"{self.spec.stand_in[0]} ms a batch{', as one cuGraphLaunch' * self.spec.stand_in[2]})")

    def base_env(self) -> dict[str, str]:
        env = {**os.environ, **self.proof.env, **self.spec.env}
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for k in ("LD_PRELOAD", "CGPU_NATIVE", "CGPU_INSTANCE", *self.spec.unset):
            env.pop(k, None)
        return env

    def prefix(self, mode: str, who: str, names: dict[str, str]) -> list[str]:
        if mode != "cgpu":
            return []
        return [tool("cgpu-run"), "--device", "cuda", "--socket", self.proof.daemon.sock, "--instance", names[who],
                "--"]

    def env_for(self, mode: str, who: str, mps: Mps | None) -> dict[str, str]:
        env = self.base_env()
        if mode != "cgpu":
            env.update(self.spec.plain_env)
        if mode == "mps" and mps is not None:
            env.update(mps.client_env(MPS_PERCENT[who]))
        return env

    def spawn(self, s: Sitting, mps: Mps | None) -> None:
        """The sitting's two Python tenants, started (they import, then wait for ``init``)."""
        args = ["--variants", ",".join(self.spec.variants)]
        for who in ("A", "B"):
            s.workers[who] = PyWorker(f"{self.name}-{s.mode}-{who}", self.prefix(s.mode, who, s.names),
                                      self.spec.workload, args, self.env_for(s.mode, who, mps), self.proof.tmp, ROOT)

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        self.choose()
        self.figures.update(rows=self.rows, notes=self.notes)
        mps = Mps(self.proof.tmp / f"mps-{self.name}", {**os.environ, **self.proof.env})
        sittings = {m: Sitting(m, {"A": f"fw-{self.name}-a", "B": f"fw-{self.name}-b"}) for m in MODES}
        if mps.binary is None or self.proof.mps_unavailable:  # found once: not tried again
            why = "nvidia-cuda-mps-control is not on this host" if mps.binary is None else self.proof.mps_unavailable
            self.notes.append(f"MPS: skipped: {why}")
            del sittings["mps"]
        if "cgpu" in sittings:
            self.provision(sittings["cgpu"].names)
        try:
            if not self.c:
                for s in sittings.values():
                    self.spawn(s, mps)
            for s in sittings.values():
                self.sitting(s, mps)
        finally:
            for s in sittings.values():
                s.kill()
            with contextlib.suppress(Exception):
                mps.stop()
        self.aggregate()

    def provision(self, names: dict[str, str]) -> None:
        mem = {}
        if self.spec.memsize_frac:
            self.memsize = int(self.proof.info["gpus"][0]["total_mem"] * self.spec.memsize_frac) >> 20 << 20
            mem = {"memsize": f"{self.memsize >> 20}MiB"}
        self.proof.provision(names["A"], weight=1, **mem)
        self.proof.provision(names["B"], weight=2, **mem)

    def sitting(self, s: Sitting, mps: Mps) -> None:
        """One way of sharing, measured; a sitting that cannot run or breaks is one line under the table (the
        time-slicing and MPS sittings also leave what the later framework parts need to start)."""
        label = LABEL[s.mode]
        need = estimate_s(self.spec, self.c)
        left = self.proof.left_s() - (self.proof.reserve_after(self.name) if s.mode != "cgpu" else 0.0)
        if left < need:
            why = f"{left:.0f} s of the budget left for it, it may need {need:.0f} s"
            if s.mode == "cgpu":
                raise Skip(why)
            self.notes.append(f"{label}: skipped: {why}")
            return
        try:
            if s.mode == "mps":
                mps.start([str(self.proof.job), "ready", "sleep=30000"])
            self.measure(s, mps)
        except MpsUnavailable as exc:
            self.notes.append(f"{label}: skipped: {exc}")
            self.proof.mps_unavailable = f"{exc} (in the {self.name} part)"
        except Exception as exc:  # the sitting's one line (its tenants' stderr kept); the next sitting runs
            kept = keep_stderr(self.proof, list(s.workers.values()))
            self.notes.append(f"{label}: failed: {exc.__class__.__name__}: {exc}"[:400]
                              + (f" (stderr: {kept})" if kept else ""))
            self.figures.setdefault("failed_sittings", []).append(s.mode)
        finally:
            s.kill()
            if s.mode == "mps":
                mps.stop()

    def measure(self, s: Sitting, mps: Mps) -> None:
        proof = self.proof
        t_start = time.monotonic()
        if self.c:
            kernel_ms, batch, _ = self.spec.stand_in or (1.0, 1, False)
            step = {v: kernel_ms * batch / 1000 for v in self.spec.variants}
        else:
            wait_s = max(self.spec.ready_s, self.spec.start_s)
            deadline = time.monotonic() + min(wait_s, max(10.0, proof.left_s() - 30))
            for w in s.workers.values():
                w.init()
            for who, w in s.workers.items():
                s.info[who] = w.ready(deadline)
            step = {v: max(s.info[who]["variants"][v]["step_s"] for who in s.info) for v in self.spec.variants}
            self.check_shim(s)
            if s.mode == "mps":
                pids = set(mps.clients())
                self.figures.setdefault("mps_clients", {})[self.name] = sorted(pids)
                if not {s.info[w]["pid"] for w in s.info} <= pids:
                    raise RuntimeError(f"the MPS daemon lists clients {sorted(pids)}, not both tenants")
        started = time.monotonic() - t_start
        x_s, p_s = (1.0, 4.0) if proof.fake else (self.spec.x_s, self.spec.p_s)
        windows = timeline(time.monotonic_ns() + int((2.0 if self.c else 0.3) * 1e9), list(self.spec.variants),
                           step, x_s, p_s)
        events = Events()
        bills = Bills(proof.status)
        if s.mode == "cgpu":
            self.policy_events(events, windows)
            bills.plan(events, windows)
        if self.c:
            kernel_ms, batch, graph = self.spec.stand_in or (1.0, 1, False)
            for who in ("A", "B"):  # it cannot leave a settle out of its count: it runs in the measured part alone
                spans = [w.measure for w in windows if who in w.who]
                s.workers[who] = CWorker(f"{self.name}-{s.mode}-{who}", proof.job, self.prefix(s.mode, who, s.names),
                                         self.env_for(s.mode, who, mps), spans, kernel_ms, batch, graph)
                s.info[who] = s.workers[who].info
        else:
            for who, w in s.workers.items():
                w.go(plan_of(who, windows))
        events.run()  # returns at once where no events are planned (time-slicing, MPS): wait from the windows' end
        end_s = windows[-1].run[1] / 1e9  # time.monotonic_ns and time.monotonic share CLOCK_MONOTONIC
        deadline = max(time.monotonic(), end_s) + 60 + 2 * max(step.values())
        done = {who: w.done(deadline) for who, w in s.workers.items()}
        self.rows += self.rows_of(s, windows, done, bills)
        self.figures.setdefault("start_s", {})[s.mode] = round(started, 1)
        self.figures.setdefault("windows_s", {})[s.mode] = round(length_s(windows), 1)

    def check_shim(self, s: Sitting) -> None:
        want = s.mode == "cgpu"
        wrong = [who for who, i in s.info.items() if bool(i["shim"]) != want]
        if wrong:
            raise RuntimeError(f"libcgpu.so is {'not ' * want}loaded in tenant(s) {', '.join(wrong)}")

    def policy_events(self, events: Events, windows: list[Window]) -> None:
        proof = self.proof
        pair_policy = str(proof.status()["gpus"][0]["policy"])  # what provisioning 1:2 put the GPU on
        alone_policy = str(proof.default_policy)
        last = None
        for w in windows:
            want = pair_policy if w.who == "AB" else alone_policy
            if want != last:
                events.at(w.run[0], self.put_policy(want))
                last = want

    def put_policy(self, value: str) -> Callable[[], None]:
        def put() -> None:
            self.proof.ctl_put("0/policy", value)
        return put

    # ------------------------------------------------------------- results
    def rows_of(self, s: Sitting, windows: list[Window], done: dict[str, Done], bills: Bills) -> list[dict[str, Any]]:
        rows = []
        index = {"A": 0, "B": 0}  # a CUDA job program's window number
        by: dict[tuple[str, str], tuple[int, Window]] = {}
        for k, w in enumerate(windows):
            by[(w.variant, w.who)] = (k, w)
        counts: dict[tuple[str, str, str], int] = {}
        for w in windows:
            for who in ("A", "B"):
                if who in w.who:
                    counts[(w.variant, w.who, who)] = index[who]
                    index[who] += 1

        def rate(v: str, who_w: str, who: str) -> float | None:
            _, w = by[(v, who_w)]
            return done[who].rate(v, w.measure, counts[(v, who_w, who)])

        for v in self.spec.variants:
            k, _ = by[(v, "AB")]
            a, b = rate(v, "AB", "A"), rate(v, "AB", "B")
            row: dict[str, Any] = {
                "variant": v, "mode": s.mode, "sharing": LABEL[s.mode], "unit": done["A"].unit,
                "alone_a": rate(v, "A", "A"), "alone_b": rate(v, "B", "B"), "a": a, "b": b,
                "ratio": b / a if a and b else None, "shim": all(bool(i.get("shim")) for i in s.info.values()),
                "stand_in": self.c,
            }
            if s.mode == "cgpu":
                ha, hb = bills.held(k, s.names["A"]), bills.held(k, s.names["B"])
                row["held_ratio"] = hb[0] / ha[0] if ha and hb and ha[0] > 0 else None
                row.update({k2: v2 for k2, v2 in bills.gpu_at_end(k).items() if k2 in ("slice_ms", "handover_ms")})
            if self.spec.workload == "jax" and s.info:
                row["memory"] = {who: i.get("memory") for who, i in s.info.items()}
            if self.memsize and s.mode == "cgpu" and not self.c:  # the pool it took, of the limit it was shown
                mem = [i.get("memory") or {} for i in s.info.values()]
                took = [m.get("pool_bytes") or m.get("bytes_reserved") or m.get("bytes_limit") for m in mem]
                row["prealloc_pct_of_limit"] = [round(100 * t / self.memsize, 1) if t else None for t in took]
                self.notes.append(f"{LABEL[s.mode]}: each instance's memsize {self.memsize / 2**30:.1f} GiB; the pool "
                                  f"JAX took (pool_bytes, else bytes_reserved, else bytes_limit), % of it: "
                                  f"A {row['prealloc_pct_of_limit'][0]}, B {row['prealloc_pct_of_limit'][-1]}")
            rows.append(row)
        return rows

    def aggregate(self) -> None:
        """Each row's pair against the exclusive rate: the cgpu sitting's alone rates, else the plain ones."""
        for v in self.spec.variants:
            mine = [r for r in self.rows if r["variant"] == v]
            base = None
            for mode in ("cgpu", "timeslice"):
                r = next((r for r in mine if r["mode"] == mode and r["alone_a"] and r["alone_b"]), None)
                if r is not None:
                    base = (r["alone_a"] + r["alone_b"]) / 2
                    break
            for r in mine:
                r["exclusive"] = base
                r["aggregate_pct"] = 100 * (r["a"] + r["b"]) / base if base and r["a"] and r["b"] else None
                if r["mode"] == "cgpu":
                    inside = all(p is not None and p <= 100 for p in r.get("prealloc_pct_of_limit", []))
                    r["ok"] = bool(r["shim"] and r["ratio"] and abs(r["ratio"] / 2 - 1) <= OK_BAND and inside)
        plain = {r["variant"]: r for r in self.rows if r["mode"] == "timeslice"}
        for r in self.rows:  # the shim's cost alone: the same program alone, with it and without it
            p = plain.get(r["variant"])
            if r["mode"] == "cgpu" and p and r["alone_a"] and r["alone_b"] and p["alone_a"] and p["alone_b"]:
                r["shim_cost_pct"] = 100 * ((p["alone_a"] + p["alone_b"]) / (r["alone_a"] + r["alone_b"]) - 1)
