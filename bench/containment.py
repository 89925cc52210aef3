"""GPU work that bypasses cgpu, seen, charged and stopped (#38), at the daemon's defaults.

    python -m bench.containment [--json] [--seconds S] [--no-results]

arbiterd runs its real NVML path on the fake ``libnvidia-ml.so.1`` (cgpu_testing/native/fakenvml.c), whose control
file lists the offender on GPU 0; the simulated GPU is the CPU. Three scenarios, each on a fresh daemon with every
setting at its default but the one the scenario is about:

- **throttle**: a managed tenant (a gate client spinning 0.5 ms operations through the interposer) beside an
  unmanaged one (three busy processes in a container, never connected: ``CGPU_DISABLE=true`` in effect), both
  pinned to one CPU, weights 1:1. Under ``unmanaged = report`` the offender takes the CPU three to one; under
  ``throttle`` its container is frozen outside its turns, and each gets its half. Shares are each side's CPU time
  over the window (``/proc/<pid>/stat``; the two in a cpu cgroup of ``cpu.shares`` 8192, so that the machine's
  other work takes little from them), as a share of the two's together (``victim_share_pct``: other users of
  the CPU take from both, more from the one that runs alone) and of the CPU.
- **kill**: ``unmanaged = kill``; from the moment the fake NVML lists a process to its death (``kill_ms``), and to
  its row in ``status`` under ``report`` (``detect_ms``, the median of several).
- **memory**: an instance with ``memsize`` 1 GiB whose two processes NVML shows at 2.4 GiB (over 1 GiB plus two
  contexts' ``memory_allowance``); ``memory_enforce = kill``: from the listing to its largest process's death
  (``memory_kill_ms``: ``memory_grace_ms``, then a poll).

Needs root (real container cgroups and the freezer), gcc (the fake NVML) and ``taskset``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiterd.core.containment import START_GRACE_NS
from arbiterd.core.settings import GPU
from arbiterd.server.config import Config
from bench import results
from bench.common import percentile
from cgpu_testing.containers import Containers, remove_cgroups
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.nvml import FakeNvml
from cgpu_testing.tools import ROOT

MIB = 1 << 20
CPU = str(max(os.sched_getaffinity(0)))  # the one CPU both tenants are pinned to
GATE = ROOT / "tests" / "workloads" / "gate_phases.py"
# three busy processes, as a GPU-hungry program that never asks: the parent is what NVML lists
SPIN = "import os, sys\nsys.stdin.read(2)\nos.fork(); os.fork()\nwhile True: pass\n"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def group_pids(containers: Containers, cid: str) -> list[int]:
    assert containers.hierarchy is not None
    text = (containers.hierarchy / "docker" / cid / "cgroup.procs").read_text()
    return [int(x) for x in text.split()]


def daemon(tmp: Path, nvml: FakeNvml, containers: Containers, *args: str) -> DaemonProc:
    """arbiterd on the fake NVML, past its first seconds (while clients would reconnect, it acts on nothing)."""
    d = DaemonProc(tmp, *containers.daemon_args(), *args, env=nvml.env()).start()
    wait_until(lambda: d.status()["uptime_seconds"] > START_GRACE_NS / 1e9, step=0.05)
    return d


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.002) -> float:
    """Seconds until ``cond()`` holds (raises past ``timeout``)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("the condition did not come")
        time.sleep(step)
    return time.monotonic() - t0


class CpuGroup:
    """A cgroup v1 cpu group with ``cpu.shares`` 8192 (8 times the default) for the two tenants, so that the rest
    of the machine's work on their CPU takes little from them: it would take more from the one that runs alone
    (the managed tenant in its turns) than from three busy processes. None where there is no v1 cpu hierarchy."""

    def __init__(self) -> None:
        base = Path("/sys/fs/cgroup/cpu")
        self.path: Path | None = base / f"cgpu-bench-{os.getpid()}" if (base / "cpu.shares").exists() else None
        if self.path is not None:
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.shares").write_text("8192")

    def join(self, pid: int) -> None:
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        if self.path is not None:
            remove_cgroups(self.path)


def shares(tmp: Path, mode: str, seconds: float) -> dict[str, float]:
    """One 1:1 run beside an offender under ``unmanaged = mode``: each side's CPU share (%) over ``seconds``."""
    containers = Containers(tmp, freezer=True)
    nvml = FakeNvml(tmp / "nvml.ctl")
    d = daemon(tmp / "d", nvml, containers, "--unmanaged", mode, "--log-level", "warning")
    cid = containers.new_id()
    procs: list[subprocess.Popen[bytes]] = []
    shares_group = CpuGroup()
    try:
        victim = subprocess.Popen(["taskset", "-c", CPU, sys.executable, str(GATE), d.sock, f"uid-{os.geteuid()}",
                                   "1", f"busy:{seconds + 10}"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(victim)
        shares_group.join(victim.pid)
        offender = start_offender(containers, cid, shares_group)
        procs.append(offender)
        nvml.run(offender.pid, 300 * MIB, sm="cpu")  # its SM% is the CPU it used: what runs while frozen
        t_listed = time.monotonic()

        def throttled() -> bool:
            return any(u["throttled"] for u in d.status()["gpus"][0]["unmanaged_processes"])

        reacted = 1000 * wait_until(throttled) if mode == "throttle" else 0.0
        time.sleep(max(0.0, t_listed + 3.0 - time.monotonic()))  # both running, the throttle in force
        group = group_pids(containers, cid)
        v0, o0, t0 = cpu_seconds([victim.pid]), cpu_seconds(group), time.monotonic()
        time.sleep(seconds)
        v1, o1, t1 = cpu_seconds([victim.pid]), cpu_seconds(group), time.monotonic()
        status = d.status()["gpus"][0]
        if os.environ.get("CGPU_BENCH_DEBUG"):
            print(json.dumps({k: status[k] for k in ("slice_effective_ms", "round_ms", "handover_ms", "busy_pct")}),
                  [(i["id"], i["delivered_pct"], i["weight"], i["grants"]) for i in status["instances"]])
        v, o = 100 * (v1 - v0) / (t1 - t0), 100 * (o1 - o0) / (t1 - t0)
        return {"victim_pct": v, "offender_pct": o, "victim_pair_pct": 100 * v / (v + o),
                "offender_pair_pct": 100 * o / (v + o), "throttle_ms": reacted,
                "throttled": float(any(u["throttled"] for u in status["unmanaged_processes"]))}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        d.stop()
        containers.cleanup()
        shares_group.remove()


def start_offender(containers: Containers, cid: str, group: CpuGroup | None = None) -> subprocess.Popen[bytes]:
    """The offender, pinned to the CPU, in container ``cid`` (and ``group``) before it forks and spins."""
    proc = subprocess.Popen(["taskset", "-c", CPU, sys.executable, "-c", SPIN], stdin=subprocess.PIPE)
    containers.place(proc.pid, cid)
    if group is not None:
        group.join(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go")
    proc.stdin.close()
    return proc


def kills(tmp: Path, rounds: int) -> dict[str, float]:
    """detect_ms (p50 of ``rounds`` under report) and kill_ms (p50 under kill)."""
    containers = Containers(tmp, freezer=False)
    nvml = FakeNvml(tmp / "nvml.ctl")
    d = daemon(tmp / "d", nvml, containers, "--log-level", "warning")
    detect, kill = [], []
    rng = random.Random(38)
    try:
        for mode in ("report", "kill"):
            d.echo(mode, "0/unmanaged")
            for _ in range(rounds):
                p = subprocess.Popen(["sleep", "60"])

                def listed(pid: int = p.pid) -> bool:
                    return any(u["pid"] == pid for u in d.status()["gpus"][0]["unmanaged_processes"])

                def dead(proc: subprocess.Popen[bytes] = p) -> bool:
                    return proc.poll() is not None

                try:
                    nvml.run(p.pid, 100 * MIB)
                    if mode == "report":
                        detect.append(1000 * wait_until(listed))
                    else:
                        kill.append(1000 * wait_until(dead))
                finally:
                    p.kill()
                    p.wait()
                    nvml.gone(p.pid)
                time.sleep(rng.uniform(0.3, 0.8))  # at a random phase of the poll
    finally:
        d.stop()
    return {"detect_ms": percentile(detect, 0.5), "kill_ms": percentile(kill, 0.5), "kill_max_ms": max(kill)}


def memory(tmp: Path) -> dict[str, float]:
    """memory_kill_ms: an instance at 2.4 GiB of NVML memory against 1 GiB and two contexts' allowance."""
    containers = Containers(tmp)
    nvml = FakeNvml(tmp / "nvml.ctl")
    d = daemon(tmp / "d", nvml, containers, "--memory-enforce", "kill", "--unmanaged", "allow",
               "--log-level", "warning")
    me = f"uid-{os.geteuid()}"
    small, big = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        d.echo(f"create {me} gpu=0 memsize=1GiB uid={os.geteuid()}", "inst_ctl")
        nvml.run(small.pid, 400 * MIB)
        nvml.run(big.pid, 2000 * MIB)
        took = wait_until(lambda: big.poll() is not None)
        return {"memory_kill_ms": 1000 * took, "memory_small_alive": float(small.poll() is None)}
    finally:
        for p in (small, big):
            p.kill()
            p.wait()
        d.stop()


def defaults() -> str:
    g = GPU
    return (f"nvml_poll_ms {Config().nvml_poll_ms}, unmanaged {g['unmanaged'].format(g['unmanaged'].default)}, "
            f"memory_enforce {g['memory_enforce'].format(g['memory_enforce'].default)}, memory_grace_ms "
            f"{g['memory_grace_ms'].default}, memory_allowance {g['memory_allowance'].default // MIB} MiB, "
            f"slice_ms auto, policy {g['policy'].default}")


def run(seconds: float, rounds: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-contain-", dir="/tmp"))
    doc: dict[str, Any] = {"settings": defaults(), "seconds": seconds}
    for mode in ("report", "throttle"):
        got = shares(tmp / mode, mode, seconds)
        doc[mode] = got
    doc.update(kills(tmp / "kill", rounds))
    doc.update(memory(tmp / "memory"))
    return doc


def table(doc: dict[str, Any]) -> str:
    r, t = doc["report"], doc["throttle"]
    return "\n".join([
        f"Defaults: {doc['settings']}. A managed tenant and an unmanaged one (three busy processes in a "
        f"container) pinned to one CPU, in a cpu cgroup of cpu.shares 8192 (the machine's other work takes little "
        f"from them), weights 1:1, {doc['seconds']:.0f} s each.",
        "",
        "| unmanaged | managed tenant's share of the two's CPU time | offender's | target | managed tenant's share "
        "of the CPU | offender's |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
        f"| report | {r['victim_pair_pct']:.1f} % | {r['offender_pair_pct']:.1f} % | (reported only) | "
        f"{r['victim_pct']:.1f} % | {r['offender_pct']:.1f} % |",
        f"| throttle | {t['victim_pair_pct']:.1f} % | {t['offender_pair_pct']:.1f} % | 50 ± 5 % | "
        f"{t['victim_pct']:.1f} % | {t['offender_pct']:.1f} % |",
        "",
        "The share of the two's CPU time is what the 1:1 entitlement is about; the share of the CPU also counts what "
        "other users of that CPU took from each (more from the one running alone: the managed tenant in its turns).",
        "",
        "| detection p50 | throttle in force | kill p50 (max) | memory kill (grace + poll) | targets |",
        "| ---: | ---: | ---: | ---: | --- |",
        f"| {doc['detect_ms']:.0f} ms | {t['throttle_ms']:.0f} ms | {doc['kill_ms']:.0f} ms "
        f"({doc['kill_max_ms']:.0f}) | {doc['memory_kill_ms']:.0f} ms | "
        "detection and kill within two polls (1000 ms) |",
    ])


def line(doc: dict[str, Any]) -> str:
    return (f"detect_ms={doc['detect_ms']:.0f} victim_share_pct={doc['throttle']['victim_pair_pct']:.1f} "
            f"offender_share_pct={doc['throttle']['offender_pair_pct']:.1f} kill_ms={doc['kill_ms']:.0f} "
            f"memory_kill_ms={doc['memory_kill_ms']:.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.containment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--seconds", type=float, default=20.0, help="the window each share is measured over")
    p.add_argument("--rounds", type=int, default=7, help="detections and kills timed")
    p.add_argument("--no-results", action="store_true")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.containment needs root: real container cgroups and the freezer", file=sys.stderr)
        return 2
    doc = run(args.seconds, args.rounds)
    print(f"settings: {doc['settings']}")
    if args.json:
        print(json.dumps(doc, indent=2))
    print(table(doc))
    if not args.no_results:
        cmd = "python -m bench.containment " + " ".join(argv if argv is not None else sys.argv[1:])
        results.update("containment", cmd.strip(), table(doc) + "\n\n" + line(doc) + "\n")
    print(line(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
