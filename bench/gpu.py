"""The whole proof on a real GPU, in one command: discovery, memory isolation, real frameworks at 1:2 beside
time-slicing and MPS, a limited tenant, a job across GPUs, containment, hand-overs and the shim's cost, a CUDA
program at 1:2.

    python -m bench.gpu [--out DIR] [--budget-s 540] [--only PART[,PART]] [--fake]

It builds libcgpu.so (where ``cgpu-run`` finds it) and the C job program there (gcc), starts arbiterd on NVML (no
``--sim-gpus``) at its defaults and prints them, then runs each part in order of value, timed, within the budget
(9 minutes), each skipped with its reason where what it needs is missing:

1. **discovery**: arbiterd's GPUs, UUIDs and memory against ``nvidia-smi -q`` (with ``--fake``: against the fake
   NVML's own configuration);
2. **memory**: a limit of 2 GiB through the shim (1 GiB fits beside the context it charges), for a CUDA C program
   (the limit seen as the total, an allocation past it refused with ``CUDA_ERROR_OUT_OF_MEMORY``, the ledger back
   to 0 after kill -9) and for PyTorch (``torch.cuda.mem_get_info`` and ``torch.cuda.OutOfMemoryError``);
3. the framework parts (bench.gpu_frameworks; workers: bench.fw_worker), each a workload's two tenants at 1:2
   under ``cgpu-run`` (which preloads libcgpu.so for every program), beside each one alone, then the same pair
   under the driver's own time-slicing (no shim, no arbiter) and under MPS at 33 % and 67 % of the GPU's threads
   (where ``nvidia-cuda-mps-control -d`` works): work ratio, held-time ratio and the pair's sum against exclusive,
   one table per workload: **resnet50** (torchvision's ResNet-50: inference at batch 16, 64 and 128, training at
   64), **cuda_graph** (a small transformer's decode step replayed as a ``torch.cuda.CUDAGraph``; on the fake
   driver the CUDA job program's ``cuGraphLaunch`` stands in), **jax** (default preallocation, inside the limit it
   is shown), **cupy** (a RawKernel loop), **compile** (``torch.compile``, mode default);
4. **limit**: a tenant at a limit of 30 % alone and beside an unlimited one (bench.gpu_limit);
5. **gang**: a two-GPU NCCL all-reduce job beside single-GPU tenants, where there are two GPUs (bench.gpu_gang);
6. **containment**: a CUDA program without the shim, seen, killed, and killed over its memory (gpu_contain.py);
7. **handover**: the hand-over arbiterd measures while two CUDA programs contend, the slice ``auto`` chose, and the
   shim's overhead on exclusive ResNet-50 (with and without ``LD_PRELOAD``; without PyTorch on a GPU, ns per
   launch of an empty kernel);
8. **cuda_ratio**: a CUDA program at 1:2 through the shim, its kernels' work counted.

A framework part's time-slicing and MPS sittings run only where the budget, less what the later framework parts
and the limit part need to start, has room for them; each sitting skipped says so in one line under its table.

Instances are provisioned for this user (``inst_ctl create NAME uid=N``), as an operator would for host processes.
Where the proof itself runs in a container, every process of it would be that one container, so arbiterd runs with
``--identity declared`` instead, and says so.

It writes ``gpu.json`` and ``gpu.md`` to ``--out`` and ends with ``gpu=<name> driver=<ver> nvml_ok=<0|1>
oom_ok=<0|1> resnet_ratio_min=<x> resnet_ratio_max=<x> aggregate_min_pct=<x> handover_ms=<x>
shim_overhead_pct=<x> frameworks_ok=<N>/<M> worst_ratio=<x>`` (``na`` where a part did not run; a framework row
is ok where both tenants had the shim loaded and its work ratio is within 10 % of 2, and worst_ratio is the one
farthest from 2); it exits 1 if a part failed. With no GPU it says so in one line and exits 0. ``--fake`` runs it
on the fake CUDA driver and NVML (cgpu_testing/native), where the parts that need a framework on a GPU skip, each
in one line, and the CUDA job program stands in where a part has a stand-in. It needs no network: what a GPU host
has (the driver, PyTorch with CUDA, torchvision, JAX, CuPy, gcc) and this package, installed with ``python3 -m pip
install --no-deps --no-build-isolation -e .`` by the ``python3`` that holds PyTorch (its ``bin`` first on
``PATH``, where ``arbiterd`` and ``cgpu-run`` land).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiterd.server.config import Config
from arbiterd.tools.adminclient import AdminClient
from bench import results
from bench.common import has_gpu
from bench.gpu_contain import run as run_containment
from bench.gpu_frameworks import SPECS, FrameworkPart, estimate_s
from bench.gpu_gang import run as run_gang
from bench.gpu_host import (
    RESNET50_RATE,
    TORCH_MEMORY,
    by_name,
    identity_needs_declaring,
    rows,
    run_group,
    smi_query,
    torch_cuda,
)
from bench.gpu_limit import run as run_limit
from bench.gpu_part import Part, Skip
from bench.gpu_report import frameworks_table, record, render, summary_frameworks
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import tool

# in order of value: what people share GPUs for (each framework at 1:2 beside time-slicing and MPS), then the
# limit, the gang, and the parts that prove the shim's own mechanics
PARTS = ("discovery", "memory", "resnet50", "cuda_graph", "limit", "jax", "cupy", "compile", "gang", "containment",
         "handover", "cuda_ratio")
FRAMEWORKS = tuple(SPECS)  # the parts bench.gpu_frameworks runs
# what each part may take (s): a part starts only if this much of the budget is left (a framework part: its cgpu
# sitting; its time-slicing and MPS sittings run only where the budget, less what the later framework parts and
# the limit need, has room for them)
NEEDS = {"discovery": 10, "memory": 30, **{n: round(estimate_s(s, False)) for n, s in SPECS.items()}, "limit": 40,
         "gang": 5, "containment": 20, "handover": 60, "cuda_ratio": 40}
GIB = 1 << 30
MIB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


class Proof:
    def __init__(self, out: Path, fake: bool, budget_s: float) -> None:
        self.out, self.fake, self.budget_s = out, fake, budget_s
        self.started = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix="cgpu-gpu-", dir="/tmp"))
        os.chmod(self.tmp, 0o755)
        self.env: dict[str, str] = {}  # what every child gets: the fakes' directory, with --fake
        self.parts: dict[str, Part] = {}
        self.info: dict[str, Any] = {}
        self.daemon: DaemonProc | None = None
        self.uid = os.geteuid()
        self.provisioned: set[str] = set()
        self.selected: list[str] = list(PARTS)  # the parts this run was asked for, in order
        self.mps_unavailable = ""  # why MPS could not run, once a part found it: later parts do not try again

    # ------------------------------------------------------------------ set-up
    def build(self) -> None:
        """libcgpu.so where ``cgpu-run --native`` looks for it (this checkout's libcgpu_client/native, built again
        where its sources are newer than the one there), and the CUDA job program."""
        from cgpu_testing.native.build import build_fakes, build_job
        from libcgpu_client.native import HERE
        from libcgpu_client.native import build as nb

        t0, self.shim = time.monotonic(), nb.build_shim(HERE)  # built again where its sources are newer
        self.job = build_job(self.tmp / "build" / "cuda_job")
        if self.fake:
            fakes = build_fakes(self.tmp / "fakes")
            # FAKENVML_CONTROL: what the fake NVML lists (containment); FAKECUDA_CTX_MB: a context's footprint, as a
            # real one's (the shim charges it: the memory part must hold with it)
            self.env = {"LD_LIBRARY_PATH": str(fakes), "FAKECUDA_DEVICES": "1", "FAKECUDA_MEM_MB": "16384",
                        "FAKENVML_CONTROL": str(self.tmp / "nvml.ctl"), "FAKECUDA_CTX_MB": "300"}
        print(f"libcgpu.so ({self.shim}) and the CUDA job program ready in {time.monotonic() - t0:.1f} s", flush=True)

    def start_daemon(self) -> None:
        cfg = Config()
        self.default_policy = cfg.gpu.policy
        print(f"arbiterd at its defaults, on NVML (no --sim-gpus): policy {cfg.gpu.policy}, slice_ms auto "
              f"({cfg.gpu.slice_min_ms}..{cfg.gpu.slice_max_ms} ms, handover_target_pct "
              f"{cfg.gpu.handover_target_pct}), overrun_ms {cfg.gpu.overrun_ms}, identity {cfg.identity}, "
              f"trust_client_env {'on' if cfg.trust_client_env else 'off'}, overcommit {cfg.overcommit}", flush=True)
        args = []
        if why := identity_needs_declaring():
            args = ["--identity", "declared"]
            print(f"  except identity declared: {why}", flush=True)
            self.info["identity"] = f"declared ({why})"
        self.daemon = DaemonProc(self.tmp / "d", *args, env=self.env).start()
        gpus = self.status()["gpus"]
        self.info["gpus"] = [{k: g[k] for k in ("index", "uuid", "name", "total_mem", "simulated")} for g in gpus]
        print(f"arbiterd sees {len(gpus)} GPU(s): " + "; ".join(
            f"{g['index']} {g['name']} {g['uuid']} {g['total_mem'] / GIB:.1f} GiB" + (" SIMULATED" * g["simulated"])
            for g in gpus))

    # ------------------------------------------------------------------- helpers
    def ctl(self, *args: str) -> str:
        assert self.daemon is not None
        r = self.daemon.ctl(*args)
        if r.returncode != 0:
            raise RuntimeError(f"cgpuctl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def status(self) -> dict[str, Any]:
        assert self.daemon is not None
        return AdminClient(self.daemon.admin).status()

    def ctl_put(self, path: str, value: str) -> None:
        """A tree write through the admin API at once (no cgpuctl to start: a timeline's events are on time)."""
        assert self.daemon is not None
        AdminClient(self.daemon.admin).put(path, value)

    def instance(self, name: str) -> dict[str, Any]:
        for g in self.status()["gpus"]:
            for i in g["instances"]:
                if i["id"] == name:
                    return dict(i)
        raise KeyError(name)

    def provision(self, name: str, gpu: str = "0", **settings: Any) -> None:
        """An instance for this user's host processes (arbiterd at its defaults takes a host process's word only
        for what an operator provisioned for its uid)."""
        opts = " ".join(f"{k}={v}" for k, v in settings.items())
        self.ctl("echo", f"create {name} uid={self.uid} gpu={gpu} {opts}".strip(), "inst_ctl")
        self.provisioned.add(name)

    def unprovision(self) -> None:
        """Remove what this part provisioned: a record left behind would take turns in the parts after it."""
        for name in sorted(self.provisioned):
            if any(r.split()[0] == name for r in self.ctl("cat", "inst_ctl").splitlines() if r.strip()):
                self.ctl("echo", f"remove {name}", "inst_ctl")
        self.provisioned.clear()

    def restore_policy(self) -> None:
        """GPU 0 back on the daemon's default policy: a part that moved it (provisioning 1:2 puts it on 2, where
        every registered instance takes its turn, idle or not) must not shape the parts after it."""
        if self.status()["gpus"][0]["policy"] != self.default_policy:
            self.ctl("echo", str(self.default_policy), "0/policy")

    def log(self, name: str, text: str) -> Path:
        """``text`` (a failed child's whole stderr) kept beside gpu.json, in workers.log under a header naming it:
        one file for all, since a GPU host's run sends back only a few files."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "workers.log"
        with path.open("a") as f:
            f.write(f"===== {name}\n{text.rstrip()}\n")
        return path

    def job_env(self, instance: str) -> dict[str, str]:
        assert self.daemon is not None
        return {**os.environ, **self.env, "LD_PRELOAD": str(self.shim), "CGPU_NATIVE": "1",
                "CGPU_SOCKET": self.daemon.sock, "CGPU_INSTANCE": instance}

    def under_shim(self, instance: str, cmd: list[str]) -> list[str]:
        """``cmd`` under ``cgpu-run --native`` (libcgpu.so preloaded) as ``instance``, on the GPU."""
        assert self.daemon is not None
        return [tool("cgpu-run"), "--device", "cuda", "--native", "--socket", self.daemon.sock, "--instance",
                instance, "--", *cmd]

    def run_job(self, instance: str, *actions: str, timeout: float = 60) -> list[dict[str, str]]:
        """The CUDA job program under the shim; each action's line, in order."""
        r = subprocess.run([str(self.job), *actions], env=self.job_env(instance), capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"cuda_job {' '.join(actions)}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
        return rows(r.stdout)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def reserve_after(self, name: str) -> float:
        """What the framework parts and the limit part after ``name`` (of those asked for) need to start."""
        later = self.selected[self.selected.index(name) + 1:] if name in self.selected else []
        return float(sum(NEEDS[n] for n in later if n in (*FRAMEWORKS, "limit")))

    def part(self, name: str, fn: Callable[[Part], None]) -> None:
        p = self.parts[name] = Part(name)
        if self.left_s() < NEEDS[name]:
            p.status, p.why = "skipped", f"{self.left_s():.0f} s of the budget left, it may need {NEEDS[name]} s"
        else:
            t0 = time.monotonic()
            try:
                fn(p)
                p.status = p.status if p.status != "not run" else "ok"
            except Skip as exc:
                p.status, p.why = "skipped", str(exc)
            except Exception as exc:  # a part that breaks is reported, and the next one runs
                p.status, p.why = "failed", f"{exc.__class__.__name__}: {exc}"[:400]
            finally:
                with contextlib.suppress(Exception):  # the daemon is gone (Unreachable too): the next part says so
                    self.unprovision()
                    self.restore_policy()
            p.seconds = time.monotonic() - t0
        shown = {k: v for k, v in p.figures.items() if k not in ("rows", "notes")} if "rows" in p.figures else p.figures
        print(f"[{p.status:7s}] {name} ({p.seconds:.1f} s)" + (f": {p.why}" if p.why else "")
              + (f" {json.dumps(shown, default=str)}" if shown else ""), flush=True)
        for line in frameworks_table(name, p.figures)[1:]:  # a framework part's table, and the limit part's
            print(line, flush=True)

    # --------------------------------------------------------------------- parts
    def discovery(self, p: Part) -> None:
        mine = self.info["gpus"]
        if any(g["simulated"] for g in mine):
            raise RuntimeError("arbiterd fell back to simulated GPUs: NVML is not working here")
        smi = shutil.which("nvidia-smi")
        if smi is not None and not self.fake:
            ref, self.info["driver"] = smi_query(subprocess.run([smi, "-q", "-x"], capture_output=True, text=True,
                                                                timeout=60, check=True).stdout)
            source = "nvidia-smi -q"
        elif self.fake:
            n, mib = int(self.env["FAKECUDA_DEVICES"]), int(self.env["FAKECUDA_MEM_MB"])
            ref = [{"index": i, "uuid": f"GPU-fa4e0000-0000-0000-0000-{i:012d}", "name": f"cgpu fake GPU {i}",
                    "total_mib": mib} for i in range(n)]
            self.info["driver"] = "fake"
            source = "the fake NVML's configuration"
        else:
            raise Skip("nvidia-smi is not here to compare with")
        wrong = [(m, r) for m, r in zip(mine, ref, strict=False)
                 if (m["index"], m["uuid"], m["name"]) != (r["index"], r["uuid"], r["name"])
                 or abs(m["total_mem"] / MIB - r["total_mib"]) > 1]
        p.figures = {"gpus": len(mine), "against": source, "matches": not wrong and len(mine) == len(ref)}
        if wrong or len(mine) != len(ref):
            raise RuntimeError(f"arbiterd and {source} disagree: {wrong or (len(mine), len(ref))}")

    def memory(self, p: Part) -> None:
        """A 2 GiB limit: the shim charges each process's context too (0.3-0.6 GiB on a real GPU, behaviour §5),
        so 1 GiB fits beside it and a second GiB does not."""
        self.provision("proof-mem", memsize="2GiB")
        got = by_name(self.run_job("proof-mem", "info", "total", "alloc=1G"))
        checks = {
            "total_is_the_limit": int(got["info"]["total"]) == 2 * GIB and int(got["total"]["bytes"]) == 2 * GIB,
            "within_the_limit": got["alloc"]["rc"] == "0",
        }
        lines = self.run_job("proof-mem", "alloc=1G", "alloc=1200M")  # past 2 GiB with or without a context
        refused = ["0", str(CUDA_ERROR_OUT_OF_MEMORY)]
        checks["past_the_limit_refused"] = [x["rc"] for x in lines if x["name"] == "alloc"] == refused
        holder = subprocess.Popen([str(self.job), "alloc=512M", "ready", "sleep=60000"],
                                  env=self.job_env("proof-mem"), stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        holder.stdout.readline()  # alloc
        holder.stdout.readline()  # ready
        held = self.instance("proof-mem")["mem_used"]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + 10
        while self.instance("proof-mem")["mem_used"] and time.monotonic() < deadline:
            time.sleep(0.1)
        checks["held_while_running"] = 512 * MIB <= held < 512 * MIB + GIB  # the 512 MiB and its context
        checks["back_to_0_after_kill_9"] = self.instance("proof-mem")["mem_used"] == 0
        p.figures["context_charged_mib"] = round((held - 512 * MIB) / MIB, 1)
        if self.fake or not torch_cuda():
            p.figures.update({**checks, "pytorch": "skipped: no PyTorch with CUDA here"})
        else:
            self.provision("proof-mem-torch", memsize="2GiB")
            checks.update(self.torch_memory())
            p.figures.update(checks)
        self.info["oom_ok"] = int(all(v is True for v in checks.values()))
        if not self.info["oom_ok"]:
            raise RuntimeError(f"memory isolation did not hold: {checks}")

    def torch_memory(self) -> dict[str, bool]:
        assert self.daemon is not None
        r = run_group(self.under_shim("proof-mem-torch", [sys.executable, "-c", TORCH_MEMORY]),
                      env={**os.environ, **self.env}, timeout=min(180, max(30, self.left_s())))
        if r.returncode != 0:
            raise RuntimeError(f"the PyTorch memory check failed: {r.stderr.strip()[-300:]}")
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        return {"torch_total_is_the_limit": doc["total"] == 2 * GIB, "torch_out_of_memory_error": doc["oom"]}

    def framework(self, p: Part) -> None:
        """A framework part (bench.gpu_frameworks): its workload at 1:2 through cgpu, time-slicing and MPS."""
        FrameworkPart(self, p.name, SPECS[p.name], p.figures).run()
        failed = p.figures.get("failed_sittings", [])
        if p.name == "resnet50":
            self.info["resnet"] = [
                {"batch": int(re.sub(r"\D", "", r["variant"])), "mode": "training" if r["variant"].startswith("train")
                 else "inference", "exclusive": _round(r["exclusive"], 1), "weight1": _round(r["a"], 1),
                 "weight2": _round(r["b"], 1), "ratio": _round(r["ratio"], 3),
                 "aggregate_pct": _round(r["aggregate_pct"], 1), "slice_ms": r.get("slice_ms"),
                 "handover_ms": _round(r.get("handover_ms"), 3)}
                for r in p.figures["rows"] if r["mode"] == "cgpu" and r["ratio"] is not None]
            cost = next((r.get("shim_cost_pct") for r in p.figures["rows"] if r["mode"] == "cgpu"
                         and r["variant"] == "inf64" and r.get("shim_cost_pct") is not None), None)
            if cost is not None:  # until the handover part measures it over longer windows
                self.info["shim_overhead_pct"] = cost
                self.info["shim_overhead_from"] = "resnet50 inf64: alone through the shim against alone without it"
        if "cgpu" in failed:
            raise RuntimeError(next(n for n in p.figures["notes"] if n.startswith("cgpu")))

    resnet50 = cuda_graph = jax = cupy = compile = framework

    def limit(self, p: Part) -> None:
        run_limit(self, p.figures)  # a tenant at a limit of 30 % alone and beside an unlimited one

    def gang(self, p: Part) -> None:
        run_gang(self, p.figures)  # a two-GPU all-reduce job beside single-GPU tenants

    def handover(self, p: Part) -> None:
        self.provision("proof-ho-a")
        self.provision("proof-ho-b")
        seen: dict[str, Any] = {}

        def sample() -> None:  # while the two contend, as the hand-overs go
            gpu = self.status()["gpus"][0]
            seen.update({"handover_ms": gpu["handover_ms"], "transit_ms": gpu["handover_transit_ms"],
                         "warmup_ms": gpu["handover_warmup_ms"], "slice_ms": gpu["slice_effective_ms"]})

        self.contend({"proof-ho-a": 1, "proof-ho-b": 1}, seconds=4.0, kernel_ms=1.0, batch=2, at=sample)
        p.figures = dict(seen)
        self.info["handover_ms"] = seen["handover_ms"]
        if self.fake or not torch_cuda():
            self.provision("proof-nulls")
            with_shim = float(by_name(self.run_job("proof-nulls", "nulls=20000"))["nulls"]["ns_per_launch"])
            r = subprocess.run([str(self.job), "nulls=20000"], env={**os.environ, **self.env}, capture_output=True,
                               text=True, timeout=120, check=True)
            without = float(by_name(rows(r.stdout))["nulls"]["ns_per_launch"])
            p.figures.update({"launch_ns_with_shim": with_shim, "launch_ns_without": without,
                              "shim_overhead": "per empty launch (no PyTorch with CUDA here)"})
            return
        self.unprovision()  # the overhead is the shim's alone: no other instance takes turns
        self.provision("proof-overhead")
        without, with_shim = self.torch_rate(shim=False), self.torch_rate(shim=True)
        pct = 100 * (without / with_shim - 1)
        p.figures.update({"resnet50_img_s_without_shim": without, "resnet50_img_s_with_shim": with_shim,
                          "shim_overhead_pct": round(pct, 2)})
        self.info["shim_overhead_pct"] = pct
        self.info["shim_overhead_from"] = "handover: exclusive ResNet-50, batch 64, 10 s with and without the shim"

    def torch_rate(self, shim: bool) -> float:
        """Exclusive ResNet-50 inference, images/s (torchvision's model, batch 64, 224x224)."""
        assert self.daemon is not None
        cmd = [sys.executable, "-c", RESNET50_RATE]
        if shim:
            cmd = self.under_shim("proof-overhead", cmd)
        r = run_group(cmd, env={**os.environ, **self.env}, timeout=min(180, max(30, self.left_s())))
        if r.returncode != 0:
            raise RuntimeError(f"ResNet-50 {'with' if shim else 'without'} the shim: {r.stderr.strip()[-300:]}")
        return float(r.stdout.strip().splitlines()[-1])

    def contend(self, weights: dict[str, int], seconds: float, kernel_ms: float, batch: int,
                at: Callable[[], None] | None = None) -> dict[str, int]:
        """The CUDA job program under the shim, once per instance (provisioned at ``weights``), spinning batches of
        ``batch`` kernels of ``kernel_ms`` over the same ``seconds``; each one's kernel work (ns). ``at`` is
        called three quarters of the way in."""
        for name, weight in weights.items():
            self.provision(name, weight=weight)
        start = time.monotonic_ns() + 2_000_000_000  # all have their contexts by then
        end = start + int(seconds * 1e9)
        procs = {name: subprocess.Popen([str(self.job), f"spin={kernel_ms},{batch},{start},{end}"],
                                        env=self.job_env(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True) for name in weights}
        try:
            if at is not None:
                time.sleep(max(0.0, (start + (end - start) * 3 // 4 - time.monotonic_ns()) / 1e9))
                at()
            work = {}
            for name, proc in procs.items():
                out, err = proc.communicate(timeout=seconds + 60)
                if proc.returncode != 0:
                    raise RuntimeError(f"cuda_job {name}: exit {proc.returncode}: {err.strip()[-300:]}")
                work[name] = int(by_name(rows(out))["spin"]["kernel_ns"])
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return work

    def cuda_ratio(self, p: Part) -> None:
        seconds, ms = (6.0, 2.0) if self.fake else (15.0, 2.0)
        work = self.contend({"proof-cuda-a": 1, "proof-cuda-b": 2}, seconds=seconds, kernel_ms=ms, batch=4)
        ratio = work["proof-cuda-b"] / max(1, work["proof-cuda-a"])
        p.figures = {"policy": self.status()["gpus"][0]["policy"], "kernel_ms": ms, "batch": 4, "window_s": seconds,
                     "work_a_ms": work["proof-cuda-a"] / 1e6, "work_b_ms": work["proof-cuda-b"] / 1e6,
                     "ratio": round(ratio, 3)}
        self.info["cuda_ratio"] = ratio
        # on the fake driver the kernels spin on the host's CPU, which the test suite's other workers share (it
        # has read 2.38 there): with --fake the path is what is checked, and the bound is wide
        low, high = (1.5, 2.7) if self.fake else (1.8, 2.2)
        if not low <= ratio <= high:
            raise RuntimeError(f"the CUDA program at 1:2 got {ratio:.3f} (bound {low}..{high})")

    def containment(self, p: Part) -> None:
        run_containment(self, p.figures)  # a CUDA program around the shim: seen, killed, and over its memory

    # ------------------------------------------------------------------- report
    def summary(self) -> str:
        gpus = self.info.get("gpus") or [{}]
        rows = self.info.get("resnet") or []

        def num(v: Any, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, int | float) else "na"

        def known(key: str) -> list[float]:
            return [r[key] for r in rows if isinstance(r.get(key), int | float)]

        return (f"gpu={str(gpus[0].get('name', 'na')).replace(' ', '_')} driver={self.info.get('driver', 'na')} "
                f"nvml_ok={int(self.parts.get('discovery', Part('')).status == 'ok')} "
                f"oom_ok={self.info.get('oom_ok', 0)} "
                f"resnet_ratio_min={num(min(known('ratio'), default=None), '.3f')} "
                f"resnet_ratio_max={num(max(known('ratio'), default=None), '.3f')} "
                f"aggregate_min_pct={num(min(known('aggregate_pct'), default=None), '.1f')} "
                f"handover_ms={num(self.info.get('handover_ms'), '.3f')} "
                f"shim_overhead_pct={num(self.info.get('shim_overhead_pct'), '.2f')} "
                + summary_frameworks([p.figures.get("rows", []) for n, p in self.parts.items() if n in FRAMEWORKS]))

    def report(self, command: str, final: bool = True) -> str:
        """Write gpu.json and gpu.md to ``--out`` (and, ``final`` on a real GPU, this run's section of
        bench/RESULTS.md); the summary line. Written after every part too, so a run cut off by its host's limit
        leaves what it measured."""
        self.out.mkdir(parents=True, exist_ok=True)
        gpus = self.info.get("gpus") or []
        machine = (results.machine().removesuffix(", no GPU") + ", GPU: "
                   + ("; ".join(f"{g['name']} ({g['total_mem'] / GIB:.1f} GiB)" for g in gpus) or "none found")
                   + f", driver {self.info.get('driver', '?')}" + (" (FAKE: cgpu_testing/native)" * self.fake))
        doc = {"command": command, "fake": self.fake, "machine": machine, "budget_s": self.budget_s,
               "seconds": round(time.monotonic() - self.started, 1), "info": self.info,
               "parts": {n: p.__dict__ for n, p in self.parts.items()}, "summary": self.summary()}
        (self.out / "gpu.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        (self.out / "gpu.md").write_text(render(doc))
        if final and not self.fake:
            record(doc)
        return str(doc["summary"])

    def close(self) -> None:
        if self.daemon is not None and self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _round(v: Any, n: int) -> Any:
    return round(v, n) if isinstance(v, int | float) else v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-proof", help="where gpu.json and gpu.md go (default ./gpu-proof)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run's budget (default 540: 9 min)")
    ap.add_argument("--only", help=f"a comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--fake", action="store_true", help="run on the fake CUDA driver and NVML (no GPU needed)")
    ap.add_argument("--record", metavar="GPU_JSON", help="write the section of bench/RESULTS.md from the gpu.json "
                    "of a run on another host (a GPU host's tree does not come back), and run nothing")
    args = ap.parse_args(argv)
    if args.record:
        try:
            record(json.loads(Path(args.record).read_text()))
        except (OSError, ValueError, KeyError) as exc:
            print(f"bench.gpu: --record {args.record}: {exc}", file=sys.stderr)
            return 1
        print(f"bench.gpu: wrote the gpu section of {results.RESULTS}")
        return 0
    only = args.only.split(",") if args.only else list(PARTS)
    if unknown := [x for x in only if x not in PARTS]:
        ap.error(f"--only: no part {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    if not args.fake and not has_gpu():
        print("bench.gpu: no NVIDIA GPU here (libcuda.so.1 finds no device): nothing to prove; --fake runs the "
              "proof on the fake driver")
        return 0
    if shutil.which("gcc") is None:
        print("bench.gpu: gcc is needed to build libcgpu.so and the CUDA job program")
        return 1
    proof = Proof(Path(args.out), args.fake, args.budget_s)
    proof.selected = [n for n in PARTS if n in only]
    try:
        command = "python -m bench.gpu " + shlex.join(argv if argv is not None else sys.argv[1:])
        proof.build()
        proof.start_daemon()
        for name in PARTS:
            if name in only:
                proof.part(name, getattr(proof, name))
                proof.report(command, final=False)
        line = proof.report(command)
    finally:
        proof.close()
    print(line)
    return 1 if any(p.status == "failed" for p in proof.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
