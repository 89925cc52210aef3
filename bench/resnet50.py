"""The headline benchmark: ResNet-50 images/s of two instances with weights 1:2 (SPEC §9).

    python -m bench.resnet50 [--weights 1:2] [--policy 2] [--batch 16,32,64,128] [--seconds 24]
                             [--warmup 5] [--image-size 64] [--train] [--device cpu|cuda]
                             [--admin ADDR --socket PATH] [--slice-ms MS] [--json] [--no-results]

Real daemon, real interposer, real ResNet-50 (bench/resnet.py), two separate
processes under ``cgpu-run``. For every batch size it measures, after a
warm-up, over a steady window:

* **exclusive**: one instance alone under the arbiter, before and after the
  pair (the mean of the two: this machine's speed drifts by 20 % over minutes);
* **arbitrated**: two instances with the given weights (default policy 2).
  The window is cut in two halves and the two processes swap weights between
  them (through the settings tree, while they run): process A has weight 1
  then 2, process B weight 2 then 1. "weight 1" is the mean rate of whoever
  had weight 1, and so on. Two processes running the same model on this
  machine differ in speed by up to ±5 % from run to run (while each stays
  steady within a run), whether arbitrated or not; the swap cancels that, so
  the ratio shows what the arbiter does. Both halves' raw ratios are reported
  too ("halves");
* **no arbiter**: the same two processes without cgpu (plain OS sharing).

On machines without a GPU the CPU is the simulated GPU (``--device cpu``,
``cgpu-run --device cpu``), each process may use every core, and images are
64x64 so that the run stays practical (ResNet-50 on 224x224 at batch 128 takes
several seconds per batch on two cores). ``--device cuda`` runs the same on a
GPU host.

Slices are 50 ms on the CPU (5 ms, the daemon's default, on CUDA). The
daemon's held time is 1:2 at any slice length (the "held-time ratio"
column), but every switch costs the incoming process about 1 ms of slower
work on the CPU (its caches and threads are cold; measured with a probe that
swaps weights, as above, at 20 and 60 ms slices). Both processes switch
equally often, so the weight-1 process pays that cost on half the held time:
at 20 ms slices the images/s ratio came out 2.06-2.07 with the swap, and
2.15 at 5 ms without it. At 50 ms the cost is about 1 % of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from arbiterd.tools.adminclient import AdminClient
from bench import results
from bench.common import ROOT, tool
from libcgpu_client.client import wait_for_socket

# Seed 001: two containers on one A10, compute ratio 1:2 (images/s)
REFERENCE_TF = {16: (151, 307, 2.03), 32: (204, 418, 2.05), 64: (247, 503, 2.04), 128: (257, 516, 2.01)}
SETTLE_S = 1.0  # after the weights swap, before the second half of the window

REFERENCE_TRT = {1: (568.05, 1132.08, 1.99), 8: (1586.87, 3055.66, 1.93), 32: (1989.28, 3695.88, 1.86),
                 128: (2205.25, 3901.94, 1.77)}



def rate(completions: list[int], batch: int, t0: int, t1: int) -> float:
    inside = [c for c in completions if t0 <= c <= t1]
    if len(inside) < 2:
        return float("nan")
    return (len(inside) - 1) * batch / ((inside[-1] - inside[0]) / 1e9)


def _held_now(admin: str) -> dict[str, float]:
    doc = AdminClient(admin).status()
    return {i["id"]: float(i["held_seconds"]) for g in doc["gpus"] for i in g["instances"]}


class Runner:
    def __init__(self, args: argparse.Namespace, sock: str, admin: str, tmp: Path) -> None:
        self.args = args
        self.sock = sock
        self.admin = admin
        self.tmp = tmp

    def _sample_held(self, held: list[dict[str, float]], times: list[int]) -> None:
        """The daemon's held time of every instance at each of ``times``."""
        for at in times:
            time.sleep(max(0.0, (at - time.monotonic_ns()) / 1e9))
            held.append(_held_now(self.admin))

    def run(self, batch: int, instances: list[tuple[str, int]], arbiter: bool,
            swap: bool = False) -> dict[str, dict[str, Any]]:
        """Run one worker per instance together; return completions and rates per instance.

        With ``swap`` (two instances) the window is cut in two halves: after the first the two
        swap weights (through the settings tree, while they run), and each instance's rate and
        held time are reported per half (``halves``)."""
        a = self.args
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs = {}
        for name, weight in instances:
            out = self.tmp / f"{name}.json"
            worker = [sys.executable, "-m", "bench.resnet_worker", "--batch", str(batch), "--image-size",
                      str(a.image_size), "--out", str(out), "--device", a.device, "--threads", str(a.threads)]
            worker += ["--train"] if a.train else []
            if arbiter:
                worker = [tool("cgpu-run"), "--device", a.device, "--socket", self.sock, "--instance", name,
                          "--weight", str(weight), "--", *worker]
            procs[name] = (subprocess.Popen(worker, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            text=True), out)
        for name, (proc, _) in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"worker {name} failed to start: {line!r}")
        start = time.monotonic_ns() + 200_000_000
        t0 = start + int(a.warmup * 1e9)
        if swap:  # [t0, t1) first half, settle, [t2, end) second half
            half = int(a.seconds / 2 * 1e9)
            t1 = t0 + half
            t2 = t1 + int(SETTLE_S * 1e9)
            cuts = [(t0, t1), (t2, t2 + half)]
        else:
            cuts = [(t0, t0 + int(a.seconds * 1e9))]
        end = cuts[-1][1]
        for proc, _ in procs.values():
            assert proc.stdin is not None
            proc.stdin.write(f"{start} {end}\n")
            proc.stdin.flush()
        held: list[dict[str, float]] = []
        times = [t for cut in cuts for t in cut]
        sampler = threading.Thread(target=self._sample_held, args=(held, times)) if arbiter else None
        if sampler is not None:
            sampler.start()
        if swap:
            time.sleep(max(0.0, (cuts[0][1] - time.monotonic_ns()) / 1e9) + 0.05)
            (n1, wa), (n2, wb) = instances
            for name, weight in ((n1, wb), (n2, wa)):
                subprocess.run([tool("cgpuctl"), "--admin", self.admin, "echo", str(weight), f"0/{name}/weight"],
                               check=True, capture_output=True)
        out: dict[str, dict[str, Any]] = {}
        for name, (proc, path) in procs.items():
            proc.wait(timeout=a.warmup + a.seconds + 600)
            if proc.returncode != 0:
                raise RuntimeError(f"worker {name} exited with {proc.returncode}")
            completions = json.loads(path.read_text())["completions"]
            out[name] = {"completions": completions, "window": (t0, end),
                         "images_per_s": rate(completions, batch, *cuts[0]),
                         "halves": [{"images_per_s": rate(completions, batch, c0, c1)} for c0, c1 in cuts]}
        if sampler is not None:
            sampler.join()
            for name in out:
                for k, h in enumerate(out[name]["halves"]):
                    h["held_seconds"] = held[2 * k + 1].get(name, 0.0) - held[2 * k].get(name, 0.0)
                out[name]["held_seconds"] = out[name]["halves"][0]["held_seconds"]
        if arbiter:
            for name, _ in instances:  # leave no record behind: a registered instance takes turns (policy 2)
                subprocess.run([tool("cgpuctl"), "--admin", self.admin, "echo", f"remove {name}", "inst_ctl"],
                               capture_output=True)
        return out


def plot(doc: dict[str, Any], path: Path, start_ns: dict[str, int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["results"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 2.6 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows, strict=True):
        for label, series in row["series"].items():
            ax.plot(series["t"], series["images_per_s"], label=label, drawstyle="steps-post")
        ax.set_title(f"batch {row['batch']}: ratio {row['ratio']:.2f}, "
                     f"sum {100 * row['aggregate_vs_exclusive']:.0f} % of exclusive")
        ax.set_ylabel("images/s")
        ax.legend(fontsize="small", loc="lower right")
    axes[-1, 0].set_xlabel("seconds into the measuring window (2 s bins)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def series(completions: list[int], batch: int, window: tuple[int, int], bin_s: float = 2.0) -> dict[str, list[float]]:
    t0, t1 = window
    n = max(1, int((t1 - t0) / 1e9 // bin_s))
    counts = [0] * n
    for c in completions:
        if t0 <= c < t1:
            counts[min(n - 1, int((c - t0) / 1e9 // bin_s))] += 1
    return {"t": [i * bin_s for i in range(n)], "images_per_s": [k * batch / bin_s for k in counts]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.resnet50", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default="1:2", help="weights of the two instances (default 1:2)")
    p.add_argument("--policy", type=int, default=2, help="GPU policy for the arbitrated run (default 2)")
    p.add_argument("--batch", default="16,32,64,128", help="batch sizes (default 16,32,64,128)")
    p.add_argument("--seconds", type=float, default=24.0,
                   help="measuring window per run (default 24; the arbitrated run's is cut in two halves)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds run before the window (default 5)")
    p.add_argument("--image-size", type=int, default=64, help="square image side (default 64)")
    p.add_argument("--train", action="store_true", help="training steps instead of inference")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: the CPU is the simulated GPU")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="intra-op threads of each instance (default: every core)")
    p.add_argument("--slice-ms", type=int, default=None,
                   help="slice length of the daemon this starts (default 50 on cpu, 5 on cuda; see above)")
    p.add_argument("--admin", help="use a running daemon's admin API instead of starting one")
    p.add_argument("--socket", help="with --admin: that daemon's arbiter.sock")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md and the plot")
    args = p.parse_args(argv)
    if args.slice_ms is None:
        args.slice_ms = 50 if args.device == "cpu" else 5
    w1, w2 = (int(w) for w in args.weights.split(":"))
    batches = [int(b) for b in args.batch.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-rn50-"))
    daemon = None
    if args.admin:
        admin = args.admin
        sock = args.socket or str(Path(admin).with_name("arbiter.sock"))
    else:
        run_dir = tmp / "run"
        sock, admin = str(run_dir / "arbiter.sock"), str(run_dir / "admin.sock")
        cmd = [tool("arbiterd"), "--run-dir", str(run_dir), "--state-dir", str(tmp / "state"),
               "--identity", "declared", "--slice-ms", str(args.slice_ms), "--log-level", "warning"]
        if args.device == "cpu":
            cmd += ["--sim-gpus", "1x16GiB"]
        daemon = subprocess.Popen(cmd)
        if not wait_for_socket(sock, 20) or not wait_for_socket(admin, 20):
            print("resnet50: arbiterd did not start", file=sys.stderr)
            return 1
    ctl = [tool("cgpuctl"), "--admin", admin]
    try:
        subprocess.run([*ctl, "echo", str(args.policy), "0/policy"], check=True)
        runner = Runner(args, sock, admin, tmp)
        rows = []
        for batch in batches:
            # exclusive is measured before and after the pair and averaged: this machine's speed drifts
            solo = runner.run(batch, [(f"rn50-b{batch}-solo", 1)], arbiter=True)[f"rn50-b{batch}-solo"]
            subprocess.run([*ctl, "echo", str(args.policy), "0/policy"], check=True)  # in case weight>1 switched it
            names = (f"rn50-b{batch}-A", f"rn50-b{batch}-B")
            pair = runner.run(batch, [(names[0], w1), (names[1], w2)], arbiter=True, swap=True)
            solo2 = runner.run(batch, [(f"rn50-b{batch}-solo", 1)], arbiter=True)[f"rn50-b{batch}-solo"]
            subprocess.run([*ctl, "echo", str(args.policy), "0/policy"], check=True)
            plain = runner.run(batch, [(names[0] + "-plain", 0), (names[1] + "-plain", 0)], arbiter=False)
            ex = (solo["images_per_s"] + solo2["images_per_s"]) / 2
            ha, hb = pair[names[0]]["halves"], pair[names[1]]["halves"]
            # weight w1 is A's in the first half and B's in the second; weight w2 the other way round
            a = (ha[0]["images_per_s"] + hb[1]["images_per_s"]) / 2
            b = (hb[0]["images_per_s"] + ha[1]["images_per_s"]) / 2
            h1 = ha[0]["held_seconds"] + hb[1]["held_seconds"]
            h2 = hb[0]["held_seconds"] + ha[1]["held_seconds"]
            halves = [hb[0]["images_per_s"] / ha[0]["images_per_s"], ha[1]["images_per_s"] / hb[1]["images_per_s"]]
            pa, pb = plain[names[0] + "-plain"]["images_per_s"], plain[names[1] + "-plain"]["images_per_s"]
            row = {
                "batch": batch, "exclusive": ex, "inst1": a, "inst2": b, "ratio": b / a,
                "half_ratios": halves, "held_ratio": h2 / h1 if h1 else float("nan"),
                "aggregate_vs_exclusive": (a + b) / ex, "no_arbiter1": pa, "no_arbiter2": pb,
                "no_arbiter_ratio": pb / pa,
                "series": {
                    f"A (weight {w1}, then {w2})": series(pair[names[0]]["completions"], batch,
                                                           pair[names[0]]["window"]),
                    f"B (weight {w2}, then {w1})": series(pair[names[1]]["completions"], batch,
                                                           pair[names[1]]["window"]),
                    "exclusive": series(solo["completions"], batch, solo["window"]),
                },
            }
            rows.append(row)
            print(f"batch {batch}: exclusive {ex:.1f}, weight {w1} {a:.1f}, weight {w2} {b:.1f} img/s, "
                  f"ratio {b / a:.3f} (halves {halves[0]:.3f} / {halves[1]:.3f}; "
                  f"held {h2 / h1 if h1 else float('nan'):.3f}), "
                  f"sum {100 * (a + b) / ex:.1f} % of exclusive; no arbiter "
                  f"{pa:.1f} / {pb:.1f} (ratio {pb / pa:.2f})", file=sys.stderr, flush=True)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
    doc = {"weights": [w1, w2], "policy": args.policy, "slice_ms": args.slice_ms, "image_size": args.image_size,
           "train": args.train, "threads": args.threads,
           "device": args.device, "seconds": args.seconds, "warmup": args.warmup, "results": rows}
    table = render(doc)
    ratios = [r["ratio"] for r in rows]
    agg = min(r["aggregate_vs_exclusive"] for r in rows)
    summary = f"min_ratio={min(ratios):.3f} max_ratio={max(ratios):.3f} aggregate_vs_exclusive={agg:.3f}"
    if args.json:
        print(json.dumps({k: v for k, v in doc.items()}, indent=2, default=float))
    print(table)
    if not args.no_results:
        png = ROOT / "bench" / "resnet50.png"
        plot(doc, png, {})
        command = "python -m bench.resnet50 " + " ".join(shlex.quote(x) for x in (argv if argv is not None
                                                                                   else sys.argv[1:]))
        results.update("resnet50", command.strip(), table + f"\n{summary}\n\n![images/s over time](resnet50.png)\n")
    print(summary)
    return 0


def render(doc: dict[str, Any]) -> str:
    w1, w2 = doc["weights"]
    mode = "training" if doc["train"] else "inference"
    lines = [
        f"ResNet-50 {mode}, {doc['image_size']}x{doc['image_size']} images, device {doc['device']} "
        f"({doc['threads']} threads per instance), policy {doc['policy']}, slice {doc['slice_ms']} ms, "
        f"weights {w1}:{w2}, {doc['seconds']:.0f} s window after {doc['warmup']:.0f} s warm-up "
        f"(two halves; the processes swap weights between them)",
        "",
        "| batch | reference TF (A10) w1 / w2 / ratio | cgpu exclusive | cgpu weight "
        f"{w1} | cgpu weight {w2} | **cgpu ratio** | halves | held-time ratio | sum / exclusive | "
        "no arbiter 1 / 2 / ratio |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in doc["results"]:
        ref = REFERENCE_TF.get(r["batch"])
        ref_s = f"{ref[0]} / {ref[1]} / {ref[2]:.2f}" if ref else "-"
        lines.append(
            f"| {r['batch']} | {ref_s} | {r['exclusive']:.1f} | {r['inst1']:.1f} | {r['inst2']:.1f} | "
            f"**{r['ratio']:.3f}** | {r['half_ratios'][0]:.3f} / {r['half_ratios'][1]:.3f} | "
            f"{r['held_ratio']:.3f} | {100 * r['aggregate_vs_exclusive']:.1f} % | "
            f"{r['no_arbiter1']:.1f} / {r['no_arbiter2']:.1f} / {r['no_arbiter_ratio']:.2f} |")
    lines.append("")
    lines.append("Reference TensorRT (A10) ratio: " + ", ".join(
        f"batch {b}: {v[2]:.2f}" for b, v in REFERENCE_TRT.items()) + " (it drifts to 1.77).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
