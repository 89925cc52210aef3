"""The whole proof on a real GPU, in one command: discovery, memory isolation, ResNet-50 at 1:2, hand-overs and the
shim's cost, a CUDA program at 1:2.

    python -m bench.gpu [--out DIR] [--budget-s 480] [--only PART[,PART]] [--fake]

It builds libcgpu.so (where ``cgpu-run --native`` finds it) and the C job program there (gcc), starts arbiterd on
NVML (no ``--sim-gpus``) at its defaults and prints them, then runs each part in order of value, timed, within the
budget (8 minutes), each skipped with its reason where what it needs is missing:

1. **discovery**: arbiterd's GPUs, UUIDs and memory against ``nvidia-smi -q`` (with ``--fake``: against the fake
   NVML's own configuration);
2. **memory**: a limit of 1 GiB through the shim, for a CUDA C program (the limit seen as the total, an
   allocation past it refused with ``CUDA_ERROR_OUT_OF_MEMORY``, the ledger back to 0 after kill -9) and for
   PyTorch (``torch.cuda.mem_get_info`` and ``torch.cuda.OutOfMemoryError``);
3. **resnet50**: torchvision's ResNet-50 at 1:2 on the GPU under ``cgpu-run`` (bench.resnet50 against this
   daemon; batch 16/64/128 with 16 s measured each within the 8-minute budget, 16/32/64/128 with 24 s from a
   budget of 10 minutes up; a GPU worker takes about 40 s to start and warm up), images/s and the ratio per
   batch size beside cGPU's published table (behaviour §9), and the aggregate against exclusive;
4. **handover**: the hand-over arbiterd measures while two CUDA programs contend, the slice ``auto`` chose, and the
   shim's overhead on exclusive ResNet-50 (with and without ``LD_PRELOAD``; without PyTorch on a GPU, ns per
   launch of an empty kernel);
5. **cuda_ratio**: a CUDA program at 1:2 through the shim, its kernels' work counted;
6. **containment**: a CUDA program without the shim, seen, killed, and killed over its memory (gpu_contain.py).

Instances are provisioned for this user (``inst_ctl create NAME uid=N``), as an operator would for host processes.
Where the proof itself runs in a container, every process of it would be that one container, so arbiterd runs with
``--identity declared`` instead, and says so.

It writes ``gpu.json`` and ``gpu.md`` to ``--out`` and ends with ``gpu=<name> driver=<ver> nvml_ok=<0|1>
oom_ok=<0|1> resnet_ratio_min=<x> resnet_ratio_max=<x> aggregate_min_pct=<x> handover_ms=<x>
shim_overhead_pct=<x>`` (``na`` where a part did not run); it exits 1 if a part failed. With no GPU it says so in
one line and exits 0. ``--fake`` runs it on the fake CUDA driver and NVML (cgpu_testing/native), where the
parts that need PyTorch on a GPU skip. It needs no network: what a GPU host has (the driver, PyTorch with CUDA,
torchvision, gcc) and this package, installed with ``python3 -m pip install --no-deps --no-build-isolation -e .``
by the ``python3`` that holds PyTorch (its ``bin`` first on ``PATH``, where ``arbiterd`` and ``cgpu-run`` land).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiterd.server.config import Config
from bench import results
from bench.common import has_gpu
from bench.gpu_contain import run as run_containment
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
from bench.gpu_report import record, render
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT, tool

PARTS = ("discovery", "memory", "resnet50", "handover", "cuda_ratio", "containment")
# what each part may take (s): a part starts only if this much of the budget is left
NEEDS = {"discovery": 10, "memory": 30, "resnet50": 300, "handover": 60, "cuda_ratio": 40, "containment": 20}
GIB = 1 << 30
MIB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


class Skip(Exception):
    """A part cannot run here: the one-line reason."""


@dataclass
class Part:
    name: str
    status: str = "not run"  # ok | failed | skipped
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


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

    # ------------------------------------------------------------------ set-up
    def build(self) -> None:
        """libcgpu.so where ``cgpu-run --native`` looks for it (this checkout's libcgpu_client/native, unless an
        install built it already), and the CUDA job program."""
        from cgpu_testing.native.build import build_fakes, build_job
        from libcgpu_client.native import HERE, shim_path
        from libcgpu_client.native import build as nb

        t0, self.shim = time.monotonic(), shim_path() or nb.build_shim(HERE)
        self.job = build_job(self.tmp / "build" / "cuda_job")
        if self.fake:
            fakes = build_fakes(self.tmp / "fakes")
            self.env = {"LD_LIBRARY_PATH": str(fakes), "FAKECUDA_DEVICES": "1", "FAKECUDA_MEM_MB": "16384",
                        "FAKENVML_CONTROL": str(self.tmp / "nvml.ctl")}  # what the fake NVML lists: containment
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
        doc: dict[str, Any] = json.loads(self.ctl("status"))
        return doc

    def instance(self, name: str) -> dict[str, Any]:
        for g in self.status()["gpus"]:
            for i in g["instances"]:
                if i["id"] == name:
                    return dict(i)
        raise KeyError(name)

    def provision(self, name: str, **settings: Any) -> None:
        """An instance for this user's host processes (arbiterd at its defaults takes a host process's word only
        for what an operator provisioned for its uid)."""
        opts = " ".join(f"{k}={v}" for k, v in settings.items())
        self.ctl("echo", f"create {name} uid={self.uid} gpu=0 {opts}".strip(), "inst_ctl")
        self.provisioned.add(name)

    def unprovision(self) -> None:
        """Remove what this part provisioned: a record left behind would take turns in the parts after it."""
        for name in sorted(self.provisioned):
            if any(r.split()[0] == name for r in self.ctl("cat", "inst_ctl").splitlines() if r.strip()):
                self.ctl("echo", f"remove {name}", "inst_ctl")
        self.provisioned.clear()

    def restore_policy(self) -> None:
        """GPU 0 back on the daemon's default policy: a part that moved it (bench.resnet50 puts it on 2, where
        every registered instance takes its turn, idle or not) must not shape the parts after it."""
        if self.status()["gpus"][0]["policy"] != self.default_policy:
            self.ctl("echo", str(self.default_policy), "0/policy")

    def log(self, name: str, text: str) -> Path:
        """``text`` (a failed child's whole stderr) kept beside gpu.json as NAME.log."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{name}.log"
        path.write_text(text)
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
                with contextlib.suppress(RuntimeError):  # the daemon is gone: the next part says so
                    self.unprovision()
                    self.restore_policy()
            p.seconds = time.monotonic() - t0
        print(f"[{p.status:7s}] {name} ({p.seconds:.1f} s)" + (f": {p.why}" if p.why else "")
              + (f" {json.dumps(p.figures)}" if p.figures else ""), flush=True)

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
        self.provision("proof-mem", memsize="1GiB")
        got = by_name(self.run_job("proof-mem", "info", "total", "alloc=768M"))
        checks = {
            "total_is_the_limit": int(got["info"]["total"]) == GIB and int(got["total"]["bytes"]) == GIB,
            "within_the_limit": got["alloc"]["rc"] == "0",
        }
        lines = self.run_job("proof-mem", "alloc=768M", "alloc=512M")
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
        checks["held_while_running"] = held == 512 * MIB
        checks["back_to_0_after_kill_9"] = self.instance("proof-mem")["mem_used"] == 0
        if self.fake or not torch_cuda():
            p.figures = {**checks, "pytorch": "skipped: no PyTorch with CUDA here"}
        else:
            self.provision("proof-mem-torch", memsize="1GiB")
            checks.update(self.torch_memory())
            p.figures = dict(checks)
        self.info["oom_ok"] = int(all(v is True for v in checks.values()))
        if not self.info["oom_ok"]:
            raise RuntimeError(f"memory isolation did not hold: {checks}")

    def torch_memory(self) -> dict[str, bool]:
        assert self.daemon is not None
        r = run_group(self.under_shim("proof-mem-torch", [sys.executable, "-c", TORCH_MEMORY]),
                      env={**os.environ, **self.env}, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"the PyTorch memory check failed: {r.stderr.strip()[-300:]}")
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        return {"torch_total_is_the_limit": doc["total"] == GIB, "torch_out_of_memory_error": doc["oom"]}

    def resnet50(self, p: Part) -> None:
        if self.fake or not torch_cuda():
            raise Skip("needs PyTorch with CUDA on a GPU")
        if subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True).returncode != 0:
            raise Skip("torchvision does not import here")
        assert self.daemon is not None
        long = self.budget_s >= 600
        batches = (16, 32, 64, 128) if long else (16, 64, 128)
        for b in batches:  # the names bench.resnet50 gives its instances, for this user, at 1:2
            self.provision(f"rn50-b{b}-A", weight=1)
            self.provision(f"rn50-b{b}-B", weight=2)
        doc_path = self.tmp / "resnet50.json"
        seconds = 24.0 if long else 16.0  # the measured window per batch size (2 or 3 s segments)
        try:
            r = run_group([sys.executable, "-m", "bench.resnet50", "--device", "cuda", "--torchvision", "--image-size",
                       "224", "--batch", ",".join(map(str, batches)), "--seconds", str(seconds), "--warmup", "3",
                       "--threads", "1", "--admin", self.daemon.admin, "--socket", self.daemon.sock, "--no-results",
                       "--doc", str(doc_path)],
                          cwd=ROOT, env={**os.environ, **self.env}, timeout=max(60.0, self.left_s() - 90))
        except subprocess.TimeoutExpired as exc:
            path = self.log("resnet50", str(exc.stderr or ""))
            raise RuntimeError(f"bench.resnet50 ran past {exc.timeout:.0f} s (its stderr: {path.name})") from None
        if r.returncode != 0:
            path = self.log("resnet50", r.stderr)
            raise RuntimeError(f"bench.resnet50 exited with {r.returncode} (its stderr: {path.name}): "
                               f"{r.stderr.strip()[-200:]}")
        doc = json.loads(doc_path.read_text())
        rows = [{"batch": x["batch"], "exclusive": round(x["exclusive"], 1), "weight1": round(x["inst1"], 1),
                 "weight2": round(x["inst2"], 1), "ratio": round(x["ratio"], 3),
                 "aggregate_pct": round(100 * x["aggregate_vs_exclusive"], 1), "slice_ms": x["slice_in_force_ms"],
                 "handover_ms": round(x["handover_ms"], 3)} for x in doc["results"]]
        p.figures = {"rows": rows, "window_s": seconds}
        self.info["resnet"] = rows

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

    def torch_rate(self, shim: bool) -> float:
        """Exclusive ResNet-50 inference, images/s (torchvision's model, batch 64, 224x224)."""
        assert self.daemon is not None
        cmd = [sys.executable, "-c", RESNET50_RATE]
        if shim:
            cmd = self.under_shim("proof-overhead", cmd)
        r = run_group(cmd, env={**os.environ, **self.env}, timeout=180)
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

        return (f"gpu={str(gpus[0].get('name', 'na')).replace(' ', '_')} driver={self.info.get('driver', 'na')} "
                f"nvml_ok={int(self.parts.get('discovery', Part('')).status == 'ok')} "
                f"oom_ok={self.info.get('oom_ok', 0)} "
                f"resnet_ratio_min={num(min((r['ratio'] for r in rows), default=None), '.3f')} "
                f"resnet_ratio_max={num(max((r['ratio'] for r in rows), default=None), '.3f')} "
                f"aggregate_min_pct={num(min((r['aggregate_pct'] for r in rows), default=None), '.1f')} "
                f"handover_ms={num(self.info.get('handover_ms'), '.3f')} "
                f"shim_overhead_pct={num(self.info.get('shim_overhead_pct'), '.2f')}")

    def report(self, command: str) -> str:
        """Write gpu.json and gpu.md to ``--out`` (and, on a real GPU, this run's section of bench/RESULTS.md);
        the summary line."""
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
        if not self.fake:
            record(doc)
        return str(doc["summary"])

    def close(self) -> None:
        if self.daemon is not None and self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-proof", help="where gpu.json and gpu.md go (default ./gpu-proof)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole run's budget (default 480: 8 min)")
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
    try:
        proof.build()
        proof.start_daemon()
        for name in PARTS:
            if name in only:
                proof.part(name, getattr(proof, name))
        line = proof.report("python -m bench.gpu " + shlex.join(argv if argv is not None else sys.argv[1:]))
    finally:
        proof.close()
    print(line)
    return 1 if any(p.status == "failed" for p in proof.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
