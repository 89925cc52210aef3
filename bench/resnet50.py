"""The headline benchmark: ResNet-50 images/s of two instances with weights 1:2 (behaviour §9).

    python -m bench.resnet50 [--weights 1:2] [--policy 2] [--batch 16,32,64,128] [--seconds 48]
                             [--warmup 5] [--image-size 64] [--train] [--device cpu|cuda]
                             [--admin ADDR --socket PATH] [--slice-ms MS] [--json] [--no-results]

Real daemon, real interposer, real ResNet-50 (bench/resnet.py), two processes
under ``cgpu-run``: for every batch size, arbitrated segments in which the two
swap weights (ABBA ABBA), each alone four times for the exclusive rate, and a
no-arbiter contrast. bench/README.md says how it measures.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiterd.tools.adminclient import AdminClient
from bench import results
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT, tool

# cGPU's reference (behaviour §9): two containers on one A10, compute ratio 1:2 (images/s)
REFERENCE_TF = {16: (151, 307, 2.03), 32: (204, 418, 2.05), 64: (247, 503, 2.04), 128: (257, 516, 2.01)}
# The arbitrated window is cut in 8 segments; in segment i process A has the first weight when
# ORDER[i] is 0 and the second when it is 1 (B the other). ABBA ABBA: a speed drift of either
# process that is linear in time weighs on both weights alike.
ORDER = (0, 1, 1, 0, 0, 1, 1, 0)
SEGMENTS = len(ORDER)
# Before these segments each process runs alone (the first named first): exclusive is measured
# four times across the run, so that the VM's speed drift weighs on it as on the pair.
EXCLUSIVE_BEFORE = {1: ("A", "B"), 3: ("B", "A"), 5: ("A", "B"), 7: ("B", "A")}
# On the CPU, host work between two operators counts as idle for the slice gate, and freeing a
# 33 MB activation at batch 128 (munmap) takes several ms of it: with the default 3 ms idle
# threshold the gate gave its lease back mid-turn about once per 100 ms turn, and got the rest
# of the turn back a round trip later (held 98.7 % of the time instead of 99.6 %).
CPU_IDLE_MS = 20
SWAP_SETTLE_NS = 500_000_000  # after the weights swap (the turn in progress ends first)
STOP_SETTLE_NS = 1_500_000_000  # after one process stops starting batches (the window waits for its last)
RESTART_SETTLE_NS = 1_000_000_000  # after both run again

REFERENCE_TRT = {1: (568.05, 1132.08, 1.99), 8: (1586.87, 3055.66, 1.93), 32: (1989.28, 3695.88, 1.86),
                 128: (2205.25, 3901.94, 1.77)}



Span = tuple[int, int]


class Progress:
    """Images one worker had done at any time ``t`` (ns), from its batch completions.

    Between two completions the batch in flight is counted fractionally, by how much of the
    time between them the worker held the GPU (its slices, from the slice gate; without an
    arbiter every instant counts). A worker makes progress only while it holds a slice, so this
    is exact up to variations within one batch, however short the window and however few
    batches fall in it (weight 1 at batch 128 finishes about one batch in two seconds).
    """

    def __init__(self, completions: list[int], leases: list[list[int]], batch: int) -> None:
        self.completions = completions
        self.batch = batch
        self.starts = [g for g, _ in leases]
        self.ends = [e for _, e in leases]
        self.before = [0]  # held time before each lease
        for g, e in leases:
            self.before.append(self.before[-1] + e - g)

    def held(self, t: int) -> int:
        """Held time (ns) up to ``t``; ``t`` itself without leases (no arbiter)."""
        if not self.starts:
            return t
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return 0
        return self.before[i] + min(t, self.ends[i]) - self.starts[i]

    def images(self, t: int) -> float:
        c = self.completions
        k = bisect.bisect_right(c, t)
        if k == 0 or k == len(c):
            return float("nan")
        span = self.held(c[k]) - self.held(c[k - 1])
        frac = (self.held(t) - self.held(c[k - 1])) / span if span > 0 else 0.0
        return self.batch * (k + frac)

    def held_in(self, span: Span) -> int:
        """Held time (ns) within ``span``."""
        return self.held(span[1]) - self.held(span[0])

    def whole_turns(self, span: Span) -> Span:
        """``span`` trimmed to run from one of this worker's grants to a later one.

        Turns come round every w1 + w2 slices, so a window that is not a whole number of
        rounds gives one instance a partial turn more or less than its share; and the phase
        of the window is the same in every run. Between two grants of the same instance lie
        whole rounds only."""
        t0, t1 = span
        inside = self.starts[bisect.bisect_left(self.starts, t0):bisect.bisect_right(self.starts, t1)]
        return (inside[0], inside[-1]) if len(inside) >= 2 else span

    def rate(self, span: Span) -> float:
        """Images/s over ``span``."""
        t0, t1 = span
        return (self.images(t1) - self.images(t0)) / ((t1 - t0) / 1e9)


class Runner:
    def __init__(self, args: argparse.Namespace, sock: str, admin: str, tmp: Path) -> None:
        self.args = args
        self.sock = sock
        self.admin = admin
        self.tmp = tmp

    def _start(self, batch: int, instances: list[tuple[str, int]], arbiter: bool) -> dict[str, tuple[Any, Path]]:
        """Start one warmed-up worker per instance (under cgpu-run with ``arbiter``)."""
        a = self.args
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if a.device == "cpu":
            env.setdefault("CGPU_IDLE_MS", str(CPU_IDLE_MS))
        procs = {}
        for name, weight in instances:
            out = self.tmp / f"{name}.json"
            worker = [sys.executable, "-m", "bench.resnet_worker", "--batch", str(batch), "--image-size",
                      str(a.image_size), "--out", str(out), "--device", a.device, "--threads", str(a.threads)]
            worker += ["--train"] if a.train else []
            worker += ["--torchvision"] if a.torchvision else []
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
        return procs

    def _go(self, procs: dict[str, tuple[Any, Path]], plan: dict[str, list[Span]],
            events: list[tuple[int, Callable[[], None]]]) -> dict[str, dict[str, Any]]:
        """Give each worker its run intervals, carry out ``events`` at their times, return completions."""
        for name, (proc, _) in procs.items():
            proc.stdin.write(" ".join(str(t) for span in plan[name] for t in span) + "\n")
            proc.stdin.flush()
        for at, action in sorted(events, key=lambda e: e[0]):
            time.sleep(max(0.0, (at - time.monotonic_ns()) / 1e9))
            action()
        out = {}
        last = max(t for spans in plan.values() for _, t in spans)
        for name, (proc, path) in procs.items():
            proc.wait(timeout=max(0.0, (last - time.monotonic_ns()) / 1e9) + 600)
            if proc.returncode != 0:
                raise RuntimeError(f"worker {name} exited with {proc.returncode}")
            out[name] = json.loads(path.read_text())
        return out

    def pair(self, batch: int, inst_a: tuple[str, int], inst_b: tuple[str, int]) -> dict[str, Any]:
        """Two arbitrated instances A and B on one timeline, ``a.seconds`` of it measured in segments:

        warm-up | 1 | A, B alone | 2 3 | B, A alone | 4 5 | A, B alone | 6 7 | B, A alone | 8

        The two swap weights between segments as ORDER says (through the settings tree, while
        they run), so each weight is measured on both processes, spread over the whole window.
        For "A alone" and "B alone" the GPU is put on a work-conserving policy (1, or 4 if that
        is the policy under test) and the other process stops starting batches (the window
        opens when its last batch is done): exclusive is measured on the same two processes,
        four times across the run."""
        a = self.args
        (na, wa), (nb, wb) = inst_a, inst_b
        names = {"A": na, "B": nb}
        admin = AdminClient(self.admin)
        excl_policy = a.policy if a.policy in (1, 4) else 1
        procs = self._start(batch, [inst_a, inst_b], arbiter=True)
        seg, ex = int(a.seconds / SEGMENTS * 1e9), int(a.seconds / 12 * 1e9)
        start = time.monotonic_ns() + 200_000_000
        t = start + int(a.warmup * 1e9)
        segs: list[Span] = []
        excl: dict[str, list[Span]] = {"A": [], "B": []}
        toggles: dict[str, list[int]] = {na: [start], nb: [start]}  # run from, stop at, run from, ...
        events: list[tuple[int, Callable[[], None]]] = []
        weights = {na: wa, nb: wb}

        def swap() -> None:
            weights[na], weights[nb] = weights[nb], weights[na]
            admin.put(f"0/{na}/weight", str(weights[na]))
            admin.put(f"0/{nb}/weight", str(weights[nb]))

        def set_policy(policy: int) -> Callable[[], None]:
            def put() -> None:
                admin.put("0/policy", str(policy))
            return put

        for i in range(SEGMENTS):
            if i in EXCLUSIVE_BEFORE:  # q stops: p alone; p stops, q starts: q alone; both again
                p, q = EXCLUSIVE_BEFORE[i]
                events.append((t, set_policy(excl_policy)))
                toggles[names[q]].append(t)
                excl[p].append((t + STOP_SETTLE_NS, t + STOP_SETTLE_NS + ex))
                t = excl[p][-1][1]
                toggles[names[p]].append(t)
                toggles[names[q]].append(t)
                excl[q].append((t + STOP_SETTLE_NS, t + STOP_SETTLE_NS + ex))
                t = excl[q][-1][1]
                events.append((t, set_policy(a.policy)))
                if ORDER[i] != ORDER[i - 1]:
                    events.append((t + 1, swap))
                toggles[names[p]].append(t)
                t += RESTART_SETTLE_NS
            elif i > 0 and ORDER[i] != ORDER[i - 1]:
                events.append((t + 1, swap))
                t += SWAP_SETTLE_NS
            segs.append((t, t + seg))
            t += seg
        plan = {n: list(zip(ts[::2], [*ts[1::2], t], strict=True)) for n, ts in toggles.items()}
        done = self._go(procs, plan, events)
        for p, q in (("A", "B"), ("B", "A")):  # open each window once the other's last batch is done
            others = done[names[q]]["completions"]
            excl[p] = [(max(t0, max((c for c in others if c < t1), default=t0) + 100_000_000), t1)
                       for t0, t1 in excl[p]]
        for name in (na, nb):  # leave no record behind: a registered instance takes turns (policy 2)
            admin.put("inst_ctl", f"remove {name}")
        return {"segments": segs, "exclusive": excl, "start": start, "end": t,
                "progress": {n: Progress(d["completions"], d["leases"], batch) for n, d in done.items()}}

    def plain(self, batch: int, names: tuple[str, str]) -> dict[str, float]:
        """Two fresh workers with no arbiter (plain OS sharing), over ``a.seconds / 2``."""
        a = self.args
        procs = self._start(batch, [(names[0], 0), (names[1], 0)], arbiter=False)
        start = time.monotonic_ns() + 200_000_000
        span = (start + int(a.warmup * 1e9), start + int((a.warmup + a.seconds / 2) * 1e9))
        done = self._go(procs, {n: [(start, span[1])] for n in names}, [])
        return {n: Progress(d["completions"], [], batch).rate(span) for n, d in done.items()}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["results"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 2.6 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows, strict=True):
        for label, series in row["series"].items():
            ax.plot(series["t"], series["images_per_s"], label=label, drawstyle="steps-post")
        for k, (s0, s1) in enumerate(row["exclusive_spans"]):
            ax.axvspan(s0, s1, color="0.9", zorder=0, label="exclusive (one alone)" if k == 0 else None)
        ax.set_title(f"batch {row['batch']}: ratio {row['ratio']:.2f}, "
                     f"sum {100 * row['aggregate_vs_exclusive']:.0f} % of exclusive")
        ax.set_ylabel("images/s")
        ax.legend(fontsize="small", loc="lower right")
    axes[-1, 0].set_xlabel("seconds into the measuring window (1 s bins)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def series(prog: Progress, span: Span, bin_s: float = 1.0) -> dict[str, list[float]]:
    """Images/s of one worker in bins of ``bin_s`` over ``span``."""
    t0, t1 = span
    step = int(bin_s * 1e9)
    edges = list(range(t0, t1 - step + 1, step))
    return {"t": [(e - t0) / 1e9 for e in edges], "images_per_s": [prog.rate((e, e + step)) for e in edges]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.resnet50", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default="1:2", help="weights of the two instances (default 1:2)")
    p.add_argument("--policy", type=int, default=2, help="GPU policy for the arbitrated run (default 2)")
    p.add_argument("--batch", default="16,32,64,128", help="batch sizes (default 16,32,64,128)")
    p.add_argument("--seconds", type=float, default=48.0,
                   help="arbitrated window per batch size (default 48, in 8 segments); each exclusive "
                        "segment is an eighth of it (two per process), the no-arbiter window half")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds run before the window (default 5)")
    p.add_argument("--image-size", type=int, default=64, help="square image side (default 64)")
    p.add_argument("--train", action="store_true", help="training steps instead of inference")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: the CPU is the simulated GPU")
    p.add_argument("--torchvision", action="store_true",
                   help="torchvision's ResNet-50 (where it imports: a GPU host) instead of bench/resnet.py's")
    p.add_argument("--doc", metavar="PATH", help="also write the results document (JSON) to PATH")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="intra-op threads of each instance (default: every core)")
    p.add_argument("--slice-ms", type=int, default=None,
                   help="pin the slice of the daemon this starts (default: the daemon's own, slice_ms auto)")
    p.add_argument("--admin", help="use a running daemon's admin API instead of starting one")
    p.add_argument("--socket", help="with --admin: that daemon's arbiter.sock")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md and the plot")
    args = p.parse_args(argv)
    w1, w2 = (int(w) for w in args.weights.split(":"))
    batches = [int(b) for b in args.batch.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-rn50-"))
    daemon: DaemonProc | None = None
    if args.admin:
        admin = args.admin
        sock = args.socket or str(Path(admin).with_name("arbiter.sock"))
    else:
        flags = ["--identity", "declared", "--log-level", "warning"]
        if args.slice_ms is not None:
            flags += ["--slice-ms", str(args.slice_ms)]
        if args.device == "cpu":
            flags += ["--sim-gpus", "1x16GiB"]
        daemon = DaemonProc(tmp / "d", *flags)
        try:
            daemon.start()
        except RuntimeError as exc:
            print(f"resnet50: {exc}", file=sys.stderr)
            return 1
        sock, admin = daemon.sock, daemon.admin
    ctl = [tool("cgpuctl"), "--admin", admin]
    try:
        subprocess.run([*ctl, "echo", str(args.policy), "0/policy"], check=True)
        runner = Runner(args, sock, admin, tmp)
        rows = []
        for batch in batches:
            na, nb = f"rn50-b{batch}-A", f"rn50-b{batch}-B"
            pair = runner.pair(batch, (na, w1), (nb, w2))
            gpu = AdminClient(admin).status()["gpus"][0]
            in_force = (gpu["slice_effective_ms"], gpu["handover_ms"])  # what the contended run settled at
            plain = runner.plain(batch, (na + "-plain", nb + "-plain"))
            pa_, pb_ = pair["progress"][na], pair["progress"][nb]
            # per segment, (images/s, held ns) of A and of B
            segments = [pa_.whole_turns(span) for span in pair["segments"]]
            seg_a = [(pa_.rate(s), pa_.held_in(s)) for s in segments]
            seg_b = [(pb_.rate(s), pb_.held_in(s)) for s in segments]
            # in segment i A has weight w1 if ORDER[i] == 0 (B has w2), and the other way round
            first = [ma if o == 0 else mb for ma, mb, o in zip(seg_a, seg_b, ORDER, strict=True)]  # weight w1's
            second = [mb if o == 0 else ma for ma, mb, o in zip(seg_a, seg_b, ORDER, strict=True)]  # w2's
            a = statistics.fmean(r for r, _ in first)
            b = statistics.fmean(r for r, _ in second)
            held_ratio = sum(h for _, h in second) / sum(h for _, h in first)

            def mean_rate(of: list[tuple[float, int]], order: int) -> float:
                return statistics.fmean(r for (r, _), o in zip(of, ORDER, strict=True) if o == order)

            # the ratio by process: A as weight w1 (B w2), and B as weight w1 (A w2)
            per_process = [mean_rate(seg_b, 0) / mean_rate(seg_a, 0), mean_rate(seg_a, 1) / mean_rate(seg_b, 1)]
            ex_a = statistics.fmean(pa_.rate(span) for span in pair["exclusive"]["A"])
            ex_b = statistics.fmean(pb_.rate(span) for span in pair["exclusive"]["B"])
            ex = (ex_a + ex_b) / 2
            pa, pb = plain[na + "-plain"], plain[nb + "-plain"]
            t0 = pair["segments"][0][0]
            span = (t0, pair["end"])
            row = {
                "batch": batch, "exclusive": ex, "exclusive_ab": [ex_a, ex_b],
                "inst1": a, "inst2": b, "ratio": b / a, "per_process": per_process, "held_ratio": held_ratio,
                "aggregate_vs_exclusive": (a + b) / ex, "no_arbiter1": pa, "no_arbiter2": pb,
                "no_arbiter_ratio": pb / pa, "slice_in_force_ms": in_force[0], "handover_ms": in_force[1],
                "exclusive_spans": [[(t - t0) / 1e9 for t in sp] for k in ("A", "B") for sp in pair["exclusive"][k]],
                "series": {"process A": series(pa_, span), "process B": series(pb_, span)},
            }
            rows.append(row)
            print(f"batch {batch}: exclusive {ex:.1f} (A {ex_a:.1f}, B {ex_b:.1f}), "
                  f"weight {w1} {a:.1f}, weight {w2} {b:.1f} img/s, "
                  f"ratio {b / a:.3f} (A as weight {w1}: {per_process[0]:.3f}, B as weight {w1}: "
                  f"{per_process[1]:.3f}; held {held_ratio:.3f}), "
                  f"sum {100 * (a + b) / ex:.1f} % of exclusive; no arbiter "
                  f"{pa:.1f} / {pb:.1f} (ratio {pb / pa:.2f})", file=sys.stderr, flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"weights": [w1, w2], "policy": args.policy,
           "slice_ms": "auto (default)" if args.slice_ms is None else args.slice_ms, "image_size": args.image_size,
           "train": args.train, "threads": args.threads,
           "device": args.device, "seconds": args.seconds, "warmup": args.warmup, "results": rows}
    table = render(doc)
    ratios = [r["ratio"] for r in rows]
    agg = min(r["aggregate_vs_exclusive"] for r in rows)
    summary = f"min_ratio={min(ratios):.3f} max_ratio={max(ratios):.3f} aggregate_vs_exclusive={agg:.3f}"
    if args.json:
        print(json.dumps({k: v for k, v in doc.items()}, indent=2, default=float))
    if args.doc:
        bare: dict[str, Any] = {**doc, "results": [{k: v for k, v in r.items() if k != "series"} for r in rows]}
        Path(args.doc).write_text(json.dumps(bare, default=float))
    print(table)
    if not args.no_results:
        png = ROOT / "bench" / "resnet50.png"
        try:
            plot(doc, png)
            figure = "\n![images/s over time](resnet50.png)\n"
        except ImportError:
            print("resnet50: matplotlib is not installed (the bench extra): no plot", file=sys.stderr)
            figure = ""
        command = "python -m bench.resnet50 " + " ".join(shlex.quote(x) for x in (argv if argv is not None
                                                                                   else sys.argv[1:]))
        results.update("resnet50", command.strip(), table + f"\n{summary}\n{figure}")
    print(summary)
    return 0


def render(doc: dict[str, Any]) -> str:
    w1, w2 = doc["weights"]
    mode = "training" if doc["train"] else "inference"
    lines = [
        f"ResNet-50 {mode}, {doc['image_size']}x{doc['image_size']} images, device {doc['device']} "
        f"({doc['threads']} threads per instance), policy {doc['policy']}, slice_ms {doc['slice_ms']}, "
        f"weights {w1}:{w2}, {doc['seconds']:.0f} s window after {doc['warmup']:.0f} s warm-up "
        f"(8 segments; the processes swap weights between them, ABBA ABBA; each alone four times)",
        "",
        "| batch | reference TF (A10) w1 / w2 / ratio | cgpu exclusive | cgpu weight "
        f"{w1} | cgpu weight {w2} | **cgpu ratio** | A / B as weight {w1} | held-time ratio | sum / exclusive | "
        "no arbiter 1 / 2 / ratio | slice in force / hand-over |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for r in doc["results"]:
        ref = REFERENCE_TF.get(r["batch"])
        ref_s = f"{ref[0]} / {ref[1]} / {ref[2]:.2f}" if ref else "-"
        lines.append(
            f"| {r['batch']} | {ref_s} | {r['exclusive']:.1f} | {r['inst1']:.1f} | {r['inst2']:.1f} | "
            f"**{r['ratio']:.3f}** | {r['per_process'][0]:.3f} / {r['per_process'][1]:.3f} | "
            f"{r['held_ratio']:.3f} | {100 * r['aggregate_vs_exclusive']:.1f} % | "
            f"{r['no_arbiter1']:.1f} / {r['no_arbiter2']:.1f} / {r['no_arbiter_ratio']:.2f} | "
            f"{r['slice_in_force_ms']:g} / {r['handover_ms']:.2f} ms |")
    lines.append("")
    lines.append("Reference TensorRT (A10) ratio: " + ", ".join(
        f"batch {b}: {v[2]:.2f}" for b, v in REFERENCE_TRT.items()) + " (it drifts to 1.77).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
