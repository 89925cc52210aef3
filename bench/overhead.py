"""What arbitration costs: grant round trip, the gate's fast path, the interposer per operator.

    python -m bench.overhead [--json] [--seconds 3] [--only interposer|grant] ...

The grant round trip at rising numbers of clients (Python and C), the gate's
fast path, libcgpu.so's fast path per launch, the interposer's cost on an MLP
and on ResNet-50, and the floors under them (a bare socket round trip, an echo
server and an answering server on the daemon's event loop). bench/README.md
says how each is measured. The grant round trip and its floors are measured by
bench/grants.py (``--only grant`` runs only them): each level offers a fixed
load, and the daemon's *capacity* is the load at which it uses 80 % of one core.
The output ends with one line
``capacity_pairs_per_s=<n> unsaturated_clients=<n> grant_p50_us=<n> grant_p99_us=<n>``,
followed, in a full run, by ``fastpath_ns=<n> interposer_overhead_pct=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arbiterd.server.realtime import describe
from bench import results
from bench.grants import (
    grant_body,
    grant_round_trip,
    headline,
    native_grants,
    normal_priority_grants,
    print_levels,
    start_daemon,
    summary,
)
from cgpu_testing.tools import ROOT, tool
from libcgpu_client.client import Client
from libcgpu_client.gate import Gate


def fast_path(sock: str) -> float:
    client = Client(sock, "fastpath", [0])
    client.start(10)
    gate = Gate(client, 0, idle_ms=10_000)
    gate.check()
    gate._deadline = time.monotonic_ns() + 60 * 10**9  # hold the lease: only the fast path is timed
    n = 1_000_000
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            gate.check()
        best = min(best, (time.perf_counter_ns() - t) / n)
    gate.close()
    client.close()
    return best


INTERPOSER_PROBE = r"""
import contextlib, json, resource, sys, time, torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
sys.path.insert(0, sys.argv[1])
from bench.resnet import ResNet50
import libcgpu_client.torch as cg
assert cg._installed is not None, "interposer not active"
hook = cg._installed.module_gate or cg._installed.layer_gate  # the hook besides the dispatch mode, if any
torch.set_num_threads(2)
rounds = int(sys.argv[2])

@contextlib.contextmanager
def plain():
    # no interposer at all: dispatch mode off and the hook besides it removed
    if hook is not None:
        hook.remove()
    try:
        with _disable_current_modes():
            yield
    finally:
        if hook is not None:
            hook.install()

class Empty(TorchDispatchMode):
    # the floor of any per-operator interposer: a dispatch mode that does nothing
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

@contextlib.contextmanager
def empty():
    with plain(), Empty():
        yield

def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def compare(fn, rounds):
    # each variant is set up before its clock starts and taken down after it stops
    variants = (contextlib.nullcontext, plain, empty)
    times = ([], [], [])
    faults = [0, 0, 0]
    for i in range(rounds):
        for k in range(3):  # the order rotates, so drift hits every variant alike
            j = (i + k) % 3
            with variants[j]():
                f = minor_faults()
                t = time.perf_counter()
                fn()
                times[j].append(time.perf_counter() - t)
                faults[j] += minor_faults() - f
    return [sorted(ts)[len(ts) // 2] for ts in times], [round(f / rounds) for f in faults]

class Count(TorchDispatchMode):
    n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {}))

def ops_per_call(fn):
    Count.n = 0
    with plain(), Count():
        fn()
    return Count.n

results = {}
mlp = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 10)).eval()
x_mlp = torch.randn(64, 256)
resnet = ResNet50().eval()
x_res = torch.randn(16, 3, 64, 64)
with torch.inference_mode():
    for name, model, x, n in (("mlp", mlp, x_mlp, rounds * 20), ("resnet50_b16_64px", resnet, x_res, rounds)):
        fn = lambda: model(x)
        for _ in range(3):
            fn()
        (on, off, bare), faults = compare(fn, n)
        ops = ops_per_call(fn)
        results[name] = {"ops_per_batch": ops, "gated_ms": round(on * 1e3, 3), "plain_ms": round(off * 1e3, 3),
                         "overhead_pct": round(100 * (on - off) / off, 2),
                         "per_op_us": round((on - off) / ops * 1e6, 2),
                         "empty_mode_pct": round(100 * (bare - off) / off, 2), "page_faults_per_batch": faults}
print(json.dumps(results))
"""


# glibc malloc with fixed thresholds: freed tensor memory stays in the heap instead of going back to
# the kernel and faulting in again at the next allocation (see interposer_overhead)
STEADY_MALLOC = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=268435456"


def interposer_overhead(sock: str, rounds: int, torch_hook: str = "dispatch", processes: int = 5,
                        steady_malloc: bool = True) -> dict[str, Any]:
    """The probe in ``processes`` fresh processes, one after another; per model, the process with the
    median overhead, and every process's overhead, so one process is one sample.

    With ``steady_malloc`` the probe runs with glibc's malloc thresholds fixed (``STEADY_MALLOC``).
    With its default, self-adjusting thresholds, ResNet-50's freed activations go back to the kernel
    and fault in again at the next batch in some processes (about 4,000-6,600 page faults a batch,
    5-10 % of its time), in others not at all, and how many each variant takes depends on the
    process's heap layout: the same code read -1.9 % to 9.8 % across five processes. Fixed thresholds
    take that out of both variants alike; the table reports the faults per batch, and the figure
    with glibc's defaults beside it."""
    # cgpu-run --device cpu sets OMP_WAIT_POLICY=PASSIVE, as it does for any program (README), so
    # the probe measures the interposer as shipped; both variants run in the same process
    env = {**os.environ, "CGPU_SOCKET": sock, "CGPU_TORCH_HOOK": torch_hook}
    if steady_malloc:
        env["GLIBC_TUNABLES"] = STEADY_MALLOC
    runs: list[dict[str, Any]] = []
    for _ in range(processes):
        proc = subprocess.run([tool("cgpu-run"), "--device", "cpu", "--instance", "overhead", "--gpus", "1", "--",
                               sys.executable, "-c", INTERPOSER_PROBE, str(ROOT), str(rounds)],
                              capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result: dict[str, Any] = {}
    for name in runs[0]:
        ordered = sorted((r[name] for r in runs), key=lambda r: r["overhead_pct"])
        result[name] = {**ordered[len(ordered) // 2], "processes_pct": [r[name]["overhead_pct"] for r in runs],
                        "empty_mode_processes_pct": [r[name]["empty_mode_pct"] for r in runs],
                        "glibc_tunables": env.get("GLIBC_TUNABLES", "")}
    return result


def native_overhead(sock: str, pid: int, seconds: float, runs: int = 3, realtime_priority: int = 0
                    ) -> dict[str, Any] | None:
    """libcgpu.so's fast path per launch and the grant round trip from C; None without gcc."""
    from cgpu_testing.native.build import build_fakes, build_job
    from libcgpu_client.native import build as nb

    if shutil.which("gcc") is None:
        return None
    out = Path(tempfile.mkdtemp(prefix="cgpu-native-"))
    fakes = build_fakes(out)
    shim = nb.current_shim(out)
    job = build_job(out / "cuda_job", link_cuda=fakes, defines=("DIRECT",))
    base = {**os.environ, "LD_LIBRARY_PATH": str(fakes)}
    shimmed = {**base, "LD_PRELOAD": str(shim), "CGPU_SOCKET": sock, "CGPU_INSTANCE": "shim-fastpath",
               "CGPU_IDLE_MS": "10000"}

    def per_launch(env: dict[str, str]) -> float:
        best = float("inf")
        for _ in range(3):
            res = subprocess.run([str(job), "nulls=2000000"], env=env, capture_output=True, text=True,
                                 timeout=120, check=True)
            best = min(best, float(res.stdout.split("ns_per_launch=")[1]))
        return best

    plain, gated = per_launch(base), per_launch(shimmed)
    shutil.rmtree(out, ignore_errors=True)
    return {"launch_ns_plain": plain, "launch_ns_shim": gated, "fastpath_ns": round(gated - plain, 1),
            **native_grants(sock, pid, seconds, runs, realtime_priority)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per grant level (default 3)")
    p.add_argument("--rounds", type=int, default=80, help="ResNet-50 batches per side and process (default 80)")
    p.add_argument("--processes", type=int, default=5,
                   help="fresh processes per interposer figure, the median reported (default 5)")
    p.add_argument("--runs", type=int, default=3,
                   help="runs of the 64-client C level, the median reported (default 3)")
    p.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    p.add_argument("--torch-hook", choices=["dispatch", "operator", "module"], default="dispatch",
                   help="with --only interposer: the interposer's torch hook (default dispatch)")
    p.add_argument("--malloc", choices=["steady", "default"], default="steady",
                   help="with --only interposer: glibc malloc's thresholds fixed (default) or glibc's defaults")
    p.add_argument("--only", choices=["interposer", "grant"],
                   help="run only this part; grant writes its own RESULTS.md section (overhead-grant)")
    p.add_argument("--section", default=None, metavar="NAME",
                   help="the RESULTS.md section to write (default overhead, or overhead-grant with --only grant)")
    p.add_argument("--realtime-priority", type=int, default=10, metavar="N",
                   help="the daemon's realtime_priority, as the shipped config sets it (default 10; 0: normal)")
    args = p.parse_args(argv)
    cmd = ("python -m bench.overhead " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-ovh-"))
    daemon = start_daemon(tmp / "d", args.realtime_priority)
    sock, sched = daemon.sock, describe(daemon.pid)
    try:
        if args.only == "interposer":
            print(json.dumps(interposer_overhead(sock, args.rounds, args.torch_hook, args.processes,
                                                 args.malloc == "steady"), indent=2))
            return 0
        grants = grant_round_trip(sock, daemon.pid, args.seconds)
        if args.only == "grant":
            native = native_grants(sock, daemon.pid, args.seconds, args.runs, args.realtime_priority) \
                if shutil.which("gcc") else None
        else:
            fast = fast_path(sock)
            interp = interposer_overhead(sock, args.rounds, "dispatch", args.processes)
            interp_operator = interposer_overhead(sock, args.rounds, "operator", args.processes)
            interp_module = interposer_overhead(sock, args.rounds, "module", args.processes)
            interp_untuned = interposer_overhead(sock, args.rounds, "dispatch", args.processes, steady_malloc=False)
            native = native_overhead(sock, daemon.pid, args.seconds, args.runs, args.realtime_priority)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    normal = normal_priority_grants(args.seconds) if native is not None and sched != "normal" else None
    # one thread per client, as 64 containers would be; the Python figure is bounded by the two load
    # processes' own event loops (32 clients each), and stays in the tables
    head = native["headline"] if native is not None else headline(grants)
    line = summary(head)
    if args.only == "grant":
        doc: dict[str, Any] = {"daemon_scheduling": sched, "python": grants, "c": native,
                               "c_64_normal_priority": normal, "headline": head}
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(f"daemon scheduling: {sched}")
            print_levels("grant round trip, Python clients", grants)
            if native is not None:
                print_levels("grant round trip, C clients", native["grant_round_trip_c"])
        if not args.no_results:
            results.update(args.section or "overhead-grant", cmd,
                           "\n".join(grant_body(sched, args.realtime_priority, args.seconds, grants, native, normal))
                           + f"\n\n{line}\n")
        print(line)
        return 0
    doc = {"daemon_scheduling": sched, "grant_round_trip": grants, "fastpath_ns": round(fast, 1),
           "interposer": interp, "interposer_per_operator": interp_operator,
           "interposer_module_hooks": interp_module,
           "interposer_glibc_default_malloc": interp_untuned, "native": native,
           "grant_round_trip_c_64_normal_priority": normal, "headline": head}
    # (hook, malloc, results): the stdout summary and the RESULTS.md table list the same rows
    interposer_rows = (("dispatch (default)", "steady", interp), ("operator", "steady", interp_operator),
                       ("module (opt-in)", "steady", interp_module),
                       ("dispatch (default)", "glibc defaults", interp_untuned))
    line += f" fastpath_ns={fast:.0f} interposer_overhead_pct={interp['resnet50_b16_64px']['overhead_pct']}"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"daemon scheduling: {sched}")
        print_levels("grant round trip, Python clients", grants)
        print(f"gate fast path: {fast:.1f} ns per check")
        for hook, malloc, res in interposer_rows:
            for name, r in res.items():
                print(f"interposer ({hook}, {malloc} malloc) on {name}: {r['gated_ms']} ms vs {r['plain_ms']} ms "
                      f"per batch, {r['overhead_pct']} % ({r['ops_per_batch']} ops, {r['per_op_us']} us per op; "
                      f"processes {', '.join(map(str, r['processes_pct']))} %; an empty dispatch mode "
                      f"{', '.join(map(str, r['empty_mode_processes_pct']))} %; page faults per batch "
                      f"on/off/empty {'/'.join(map(str, r['page_faults_per_batch']))})")
        if native is not None:
            print(f"libcgpu.so fast path: {native['fastpath_ns']} ns per launch "
                  f"({native['launch_ns_shim']} with the shim, {native['launch_ns_plain']} without)")
            print_levels("grant round trip, C clients", native["grant_round_trip_c"])
            f, e = native["socket_round_trip_floor"], native["event_loop_floor"]
            a = native["protocol_floor_64"]
            print(f"floor, a bare socket round trip between two C processes: p50 {f['p50_us']} us, "
                  f"p99 {f['p99_us']} us; to an echo server on Python's event loop: p50 {e['p50_us']} us, "
                  f"p99 {e['p99_us']} us; 64 C clients against a server that grants at once and does "
                  f"nothing else: p50 {a['p50_us']} us, p99 {a['p99_us']} us, "
                  f"{a['daemon_cpu_us_per_pair']} us of its CPU per pair")
    if not args.no_results:
        body = grant_body(sched, args.realtime_priority, args.seconds, grants, native, normal)
        body += ["", f"Gate fast path: {fast:.1f} ns per check (target 1 us).", "",
                 "| interposer hook | malloc | on | ops/batch | gated ms | plain ms | overhead (median) | per op "
                 "| each process | empty dispatch mode, each process | page faults per batch, on / off / empty |",
                 "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
        body += [f"| {hook} | {malloc} | {name} | {r['ops_per_batch']} | {r['gated_ms']} | {r['plain_ms']} | "
                 f"{r['overhead_pct']} % | {r['per_op_us']} us | {', '.join(map(str, r['processes_pct']))} % | "
                 f"{', '.join(map(str, r['empty_mode_processes_pct']))} % | "
                 f"{' / '.join(map(str, r['page_faults_per_batch']))} |"
                 for hook, malloc, res in interposer_rows
                 for name, r in res.items()]
        body += ["", f"Each figure is the median of {args.processes} fresh processes under `cgpu-run --device cpu` "
                 "(which sets `OMP_WAIT_POLICY=PASSIVE`), 2 torch threads, inference; per process the median "
                 f"of {args.rounds} ResNet-50 batches per variant, the variants interleaved. \"steady\": glibc "
                 f"malloc's thresholds fixed (`GLIBC_TUNABLES={STEADY_MALLOC}`), so freed activations stay in "
                 "the heap; with glibc's self-adjusting defaults some processes hand them back to the kernel "
                 "and fault them in again every batch, which moves a process's figure by several per cent "
                 "either way (the last row; page faults of the median process). Hooks: \"dispatch\" (the "
                 "default) is the `TorchDispatchMode` with built-in single-operator layers (ResNet-50's "
                 "convolutions, batch norms, ReLUs, pools and classifier) gated at their call and their "
                 "operators kept out of Python, the rest through the mode; \"operator\" "
                 "(`CGPU_TORCH_HOOK=operator`) sends every operator through the mode; \"module\" gates at "
                 "module calls. The summary line gives the steady default-hook figure."]
        if native is not None:
            body += ["", f"libcgpu.so fast path: {native['fastpath_ns']} ns per launch (target 100 ns): "
                     f"{native['launch_ns_shim']} ns per empty-kernel launch with the shim holding a lease, "
                     f"{native['launch_ns_plain']} ns without it (fake CUDA driver)."]
        results.update(args.section or "overhead", cmd, "\n".join(body) + f"\n\n{line}\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
